"""Where a job's latency stalls come from: per-second evidence from inside its task workers
and from the kernel's scheduler, beside the sink's per-second latency.

Why: a half-load p99 of 90 ms in one run and 18 ms in the next is an intermittent stall,
and a per-second latency timeline alone cannot tell a task that stopped (a collection, a
slow metrics answer, a long step) from a task the machine did not run (other processes on
two shared cores). This module gathers both, for ``steady.py --trace``:

* In the task workers (``install``, started by ``TracedLatencySink.open`` in the count
  tasks the sink is chained into, and by ``TracedGeneratorSource.open_partition`` in the
  source tasks): every garbage collection of at least ``SLOW_MS`` (``gc.callbacks``), every
  ``TaskCore.step`` / ``poll_source`` / ``metrics`` call and latency-sink save of at least
  ``SLOW_MS`` (the sink's saves with their run-queue wait, so that the time they were
  blocked on I/O shows apart; and each second how many calls of each kind were made,
  ``<label>.<kind>_calls``: a source polled 25,000 times a second reads a few records a
  poll) (after a young collection of ``SLOW_MS`` of CPU, at most every ``YOUNG_S``,
  the young generation at the next one: its size and largest containers; this look
  itself costs the task ~1 us per young object), and a watchdog thread that sleeps
  ``WATCH_S`` at a time and notes each
  wake-up more than ``LATE_MS`` late (the main thread held the GIL that long in one C
  call, or the process was not scheduled). Saved as ``probe-<label>-<pid>.json`` in the
  trace directory every second and at the writer's flush.
* On the driver (``SchedSampler``): every ``interval`` s, each job process's CPU time and
  run-queue wait (``/proc/<pid>/schedstat``: time it was runnable but not running, the
  direct measure of CPU contention) and the machine's busy CPU time.
* ``per_second``: joins the sink's per-second rows, the sampler's and the probes' events
  into one row per wall second; ``worst``: the rows with the highest p99.

Linux only (``/proc``). Starting the probe changes nothing the job computes; its watchdog
wakes 1/``WATCH_S`` times a second (a small, constant cost). Nothing here starts Ray.
"""

from __future__ import annotations

import gc
import json
import os
import threading
import time
from typing import Any

from engine import GeneratorSource, LatencySink
from engine.io.sources import SourceReader
from engine.time.clock import Clock

SLOW_MS = 2.0
WATCH_S = 0.005
LATE_MS = 10.0
YOUNG_S = 10.0

_PROBE: _Probe | None = None


def install(directory: str, label: str) -> _Probe:
    """Start this worker process's probe (once per process) writing into ``directory``."""
    global _PROBE
    if _PROBE is None:
        _PROBE = _Probe(directory, label)
    return _PROBE


class _Probe:
    def __init__(self, directory: str, label: str) -> None:
        self.path = os.path.join(directory, f"probe-{label}-{os.getpid()}.json")
        self.label = label
        # [wall s at the end, kind, wall ms, detail, CPU ms of the thread]
        self.events: list[list[Any]] = []
        self._gc_t0: float | None = None
        self._gc_c0 = 0.0
        self._look_young = False
        self._young_at = -YOUNG_S
        self._lock = threading.Lock()
        self.calls: dict[str, int] = {}  # calls of each timed kind since the last save
        gc.callbacks.append(self._gc)
        from engine.task.core import TaskCore

        for name in ("step", "poll_source", "metrics"):
            self._time_method(TaskCore, name)
        threading.Thread(target=self._watch, name="stall-probe", daemon=True).start()

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            if self._look_young and info.get("generation") == 0:
                # costs ~1 us per young object (in the task's step): at most every YOUNG_S
                self._look_young = False
                self._young_at = time.monotonic()
                self.events.append([time.time(), "young", 0.0, _young_summary(), None])
            self._gc_t0, self._gc_c0 = time.perf_counter(), time.thread_time()
        elif self._gc_t0 is not None:
            ms = (time.perf_counter() - self._gc_t0) * 1000
            self._gc_t0 = None
            if ms >= SLOW_MS:
                cpu = (time.thread_time() - self._gc_c0) * 1000
                self.events.append([time.time(), "gc", ms,
                                    f"gen {info.get('generation')} collected "
                                    f"{info.get('collected')}", cpu])
                # a slow young collection: describe the young generation at the next one
                self._look_young = self._look_young or (
                    cpu >= SLOW_MS and info.get("generation") == 0
                    and time.monotonic() - self._young_at >= YOUNG_S)

    def timed(self, kind: str, fn: Any, queue: bool = False) -> Any:
        """``fn`` wrapped: calls of at least ``SLOW_MS`` become ``kind`` events; ``queue``:
        each also with its thread's run-queue wait during the call (two reads of
        ``/proc/thread-self/schedstat``, ~20 us: for rare calls), so that what is left of
        its wall time besides CPU and waiting for a CPU is time it was blocked (I/O, a
        lock)."""
        events, calls = self.events, self.calls
        calls[kind] = 0

        def wrapper(*a: Any, **kw: Any) -> Any:
            calls[kind] += 1
            q0 = _thread_queue_ms() if queue else None
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                ms = (time.perf_counter() - t0) * 1000
                if ms >= SLOW_MS:
                    event = [time.time(), kind, ms, None, (time.thread_time() - c0) * 1000]
                    q1 = _thread_queue_ms() if q0 is not None else None
                    if q0 is not None and q1 is not None:
                        event.append(q1 - q0)
                    events.append(event)

        return wrapper

    def _time_method(self, cls: type, name: str) -> None:
        fn = cls.__dict__.get(name)
        if fn is not None and not getattr(fn, "_stall_probe", False):
            wrapped = self.timed(name, fn)
            wrapped._stall_probe = True  # type: ignore[attr-defined]
            setattr(cls, name, wrapped)

    def _watch(self) -> None:
        saved = time.monotonic()
        while True:
            t0 = time.monotonic()
            time.sleep(WATCH_S)
            t1 = time.monotonic()
            late = (t1 - t0 - WATCH_S) * 1000
            if late >= LATE_MS:
                self.events.append([time.time(), "late", late, None, None])
            if t1 - saved >= 1.0:
                now = time.time()
                for kind, n in list(self.calls.items()):  # how often, beside how long
                    self.calls[kind] = 0
                    self.events.append([now, f"{kind}_calls", n, None, None])
                self.save()
                saved = t1

    def save(self) -> None:
        with self._lock:
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"label": self.label, "pid": os.getpid(),
                           "events": list(self.events)}, f)
            os.replace(tmp, self.path)


def _thread_queue_ms() -> float | None:
    """The calling thread's run-queue wait so far, ms (None off Linux)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e6
    except (OSError, ValueError, IndexError):
        return None


def _young_summary() -> str:
    """The young generation's size, its references and its largest containers."""
    young = gc.get_objects(generation=0)
    sizes = sorted(((len(gc.get_referents(o)), type(o).__name__) for o in young),
                   reverse=True)
    return (f"{len(young)} objects, {sum(n for n, _ in sizes)} references; largest "
            + ", ".join(f"{t} {n}" for n, t in sizes[:4]))


class TracedLatencySink(LatencySink):
    """A ``LatencySink`` whose writers start the probe of their worker (``install``) and
    time their saves; ``trace_dir``: where the probes write."""

    def __init__(self, trace_dir: str, directory: str | None = None) -> None:
        super().__init__(directory)
        self.trace_dir = trace_dir

    def open(self, task_index: int, parallelism: int, clock: Clock) -> Any:
        probe = install(self.trace_dir, f"sink{task_index}")
        writer = super().open(task_index, parallelism, clock)
        writer._save = probe.timed(  # type: ignore[attr-defined]
            "sink_save", writer._save, queue=True)
        flush = writer.flush

        def flush_and_save() -> None:
            flush()
            probe.save()

        writer.flush = flush_and_save  # type: ignore[method-assign]
        return writer


class TracedGeneratorSource(GeneratorSource):
    """A ``GeneratorSource`` whose readers start the probe of their worker (``install``)."""

    def __init__(self, trace_dir: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.trace_dir = trace_dir

    def open_partition(self, partition: str, resume: Any, clock: Clock) -> SourceReader:
        install(self.trace_dir, "source")
        return super().open_partition(partition, resume, clock)


def read_probes(trace_dir: str) -> list[dict[str, Any]]:
    """Every probe file of ``trace_dir``."""
    out = []
    for name in sorted(os.listdir(trace_dir)):
        if name.startswith("probe-") and name.endswith(".json"):
            with open(os.path.join(trace_dir, name)) as f:
                out.append(json.load(f))
    return out


def _schedstat(pid: int) -> tuple[float, float] | None:
    """(CPU seconds, run-queue wait seconds) of ``pid``, summed over its threads (a Ray
    actor's event loop is not its main thread); None when gone."""
    run = wait = 0
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                r, w, _ = f.read().split()
            run, wait = run + int(r), wait + int(w)
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
    return run / 1e9, wait / 1e9


def _machine_busy() -> float | None:
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class SchedSampler(threading.Thread):
    """Every ``interval`` s: ``[wall s, machine busy CPU s, {name: [cpu s, wait s]}]`` of
    the given processes (names: short labels), until ``stop()``."""

    def __init__(self, pids: dict[str, int], interval: float = 0.25) -> None:
        super().__init__(daemon=True, name="sched-sampler")
        self.pids, self.interval = pids, interval
        self.samples: list[list[Any]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            per = {n: _schedstat(p) for n, p in self.pids.items()}
            self.samples.append([time.time(), _machine_busy(),
                                 {n: list(v) for n, v in per.items() if v is not None}])
            self._halt.wait(self.interval)

    def stop(self) -> list[list[Any]]:
        self._halt.set()
        self.join(timeout=5)
        return self.samples


def per_second(latency_rows: list[dict[str, Any]], samples: list[list[Any]],
               probes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per wall second of ``latency_rows`` (``LatencySink.timeline()``): its count,
    p50/p99/max ms; per process of ``samples`` (``SchedSampler``) its CPU and run-queue
    wait in ms during that second, and the machine's other busy ms (busy minus the
    processes'); per probe label the events of that second: ``<label>.<kind>`` the summed
    wall ms, ``<label>.<kind>_max`` the longest and ``<label>.<kind>_cpu_max`` the most CPU
    one of them took (its own thread's: a long event with little CPU was preempted or
    waited on I/O; one with as much CPU stopped the task by itself), and for events timed
    with their run-queue wait ``<label>.<kind>_blocked_max`` the longest time one spent
    neither running nor waiting for a CPU (blocked on I/O or a lock). Samples are
    attributed to the second their interval ends in."""
    rows = {r["second"]: {"second": r["second"], "count": r["count"], "p50_ms": r["p50_ms"],
                          "p99_ms": r["p99_ms"], "max_ms": r["max_ms"]} for r in latency_rows}
    for prev, cur in zip(samples, samples[1:], strict=False):
        row = rows.get(int(cur[0]))
        if row is None:
            continue
        procs_ms = 0.0
        for name, (cpu, wait) in cur[2].items():
            if name not in prev[2]:
                continue
            dcpu = (cpu - prev[2][name][0]) * 1000
            dwait = (wait - prev[2][name][1]) * 1000
            if dcpu < 0 or dwait < 0:  # threads that ended took their counts with them
                continue
            row[f"{name}.cpu_ms"] = row.get(f"{name}.cpu_ms", 0.0) + dcpu
            row[f"{name}.wait_ms"] = row.get(f"{name}.wait_ms", 0.0) + dwait
            procs_ms += dcpu
        if cur[1] is not None and prev[1] is not None:
            row["other_ms"] = row.get("other_ms", 0.0) + (cur[1] - prev[1]) * 1000 - procs_ms
    for probe in probes:
        for wall, kind, ms, _, *more in probe["events"]:
            row = rows.get(int(wall))
            if row is None or kind == "young":  # a description, kept in the probe's file
                continue
            key = f"{probe['label']}.{kind}"
            row[key] = row.get(key, 0.0) + ms
            row[key + "_max"] = max(row.get(key + "_max", 0.0), ms)
            if more and more[0] is not None:
                row[key + "_cpu_max"] = max(row.get(key + "_cpu_max", 0.0), more[0])
                if len(more) > 1:  # [cpu ms, run-queue ms]
                    blocked = max(0.0, ms - more[0] - more[1])
                    row[key + "_blocked_max"] = max(row.get(key + "_blocked_max", 0.0),
                                                    blocked)
    return [rows[s] for s in sorted(rows)]


def worst(rows: list[dict[str, Any]], n: int = 5) -> list[dict[str, Any]]:
    """The ``n`` rows with the highest p99, highest first."""
    return sorted(rows, key=lambda r: r["p99_ms"], reverse=True)[:n]
