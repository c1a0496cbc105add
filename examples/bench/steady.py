"""Steady-state benchmark of the keyed count job: throughput, latency at half load, memory.

    python examples/bench/steady.py             # parallelism 1 2 4, 2M records, 20 s half load
    python examples/bench/steady.py --quick     # smoke run: 200k records, 8 s, parallelism 1 2

Job: GeneratorSource(num_keys=100_000, zipf 1.2) -> map (key, seq) -> (key, 1) (chained into
the source task) -> key_by(key) -> reduce summing the counts (emits every update, like
Flink's reduce) -> LatencySink (chained into the count tasks).

For every parallelism p of the count operator, two phases:

1. Full speed (rate=None, ``--records`` records). The driver polls only the JobMaster's
   status (every ``--poll`` s; asking tasks for metrics would make them pack state samples)
     * job throughput  = records / (``job.run()`` returned -> first status poll that sees the
       job finished). ``run()`` returns once every task is deployed and started (sources
       last), so this span covers all processing plus end-of-stream drain and the finish
       reports; it excludes Ray/actor start-up.
     * sink throughput = records counted at the sink / (wall time of the sink's first
       ``write()`` -> its last ``write()``, over all sink writers; noted by a thin wrapper
       around the ``LatencySink`` writer, exact to one batch).
     * interior rate   = records at the sink in the whole wall-clock seconds strictly between
       the first and the last second with any record (``LatencySink.timeline()``), per second.
   Run ``--repeats`` times; the run with the median job throughput is reported.
2. Half load: an open-loop source at 50 % of that p's (median) job throughput for ``--duration`` s.
   Latency = sink arrival time - scheduled emission time of the record (so queueing counts),
   percentiles merged from the sink's per-second histograms of every second at least
   ``--warmup`` s after ``run()`` returned. RSS of all the job's Ray worker processes (task
   actors + JobMaster), summed, sampled every second.

Also the per-core ceiling: a plain Python loop over the same records (pre-generated list)
doing ``counts[k] = counts.get(k, 0) + 1`` and appending every update to a list.

Writes ``examples/bench/out/steady/results.json`` and ``steady.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import ray  # noqa: E402

from engine import JobConfig, StreamJob  # noqa: E402
from engine.clock import SystemClock  # noqa: E402
from engine.latency import LatencyHistogram  # noqa: E402
from engine.sinks import LatencySink  # noqa: E402
from engine.sources import GeneratorSource  # noqa: E402
from examples.bench.provenance import code_state  # noqa: E402

NUM_KEYS = 100_000
SKEW = "zipf"
ZIPF_EXPONENT = 1.2
SEED = 0
OUT_DIR = os.path.join(ROOT, "examples", "bench", "out", "steady")


# ------------------------------------------------------------------------------ the job


def to_pair(record: Any) -> tuple[Any, int]:
    return (record[0], 1)


def key_of(record: Any) -> Any:
    return record[0]


def add_counts(a: Any, b: Any) -> tuple[Any, int]:
    return (a[0], a[1] + b[1])


def build(parallelism: int, source_parallelism: int, rate: float | None,
          num_records: int | None, duration_s: float | None, sink: LatencySink,
          config: JobConfig) -> StreamJob:
    job = StreamJob("steady", parallelism=parallelism, config=config)
    src = GeneratorSource(rate=rate, num_records=num_records, duration_s=duration_s,
                          num_keys=NUM_KEYS, skew=SKEW, zipf_exponent=ZIPF_EXPONENT, seed=SEED)
    (
        job.source(src, name="gen", parallelism=source_parallelism)
        .map(to_pair, name="pair")
        .key_by(key_of)
        .reduce(add_counts, name="count", parallelism=parallelism)
        .sink(sink, name="latency")
    )
    return job


class SpanLatencySink(LatencySink):
    """A ``LatencySink`` whose writers also note the wall time of their first and last
    ``write()`` (one ``clock.now()`` per batch) and save it on ``flush()`` to
    ``span-*.json`` beside the latency files (which ``LatencySink`` ignores). Gives the exact
    first/last-record-at-sink times without polling the tasks."""

    def open(self, task_index: int, parallelism: int, clock: Any) -> Any:
        return _SpanWriter(super().open(task_index, parallelism, clock), clock,
                           os.path.join(self.directory, f"span-{task_index}-{os.getpid()}.json"))

    def span(self) -> dict[str, Any] | None:
        """{first, last, count} over every writer (epoch seconds), None when nothing came."""
        rows = []
        for name in os.listdir(self.directory):
            if name.startswith("span-") and name.endswith(".json"):
                with open(os.path.join(self.directory, name)) as f:
                    rows.append(json.load(f))
        rows = [r for r in rows if r["first"] is not None]
        if not rows:
            return None
        return {"first": min(r["first"] for r in rows), "last": max(r["last"] for r in rows),
                "count": sum(r["count"] for r in rows), "writers": len(rows)}


class _SpanWriter:
    def __init__(self, inner: Any, clock: Any, path: str) -> None:
        self.inner, self.clock, self.path = inner, clock, path
        self.first: float | None = None
        self.last: float | None = None
        self.count = 0

    def write(self, values: Any, timestamps: Any) -> None:
        if values:
            now = self.clock.now()
            if self.first is None:
                self.first = now
            self.last = now
            self.count += len(values)
        self.inner.write(values, timestamps)

    def flush(self) -> None:
        self.inner.flush()
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"first": self.first, "last": self.last, "count": self.count}, f)
        os.replace(tmp, self.path)

    def close(self) -> None:
        self.flush()


# ------------------------------------------------------------------------------ processes


def _rss_bytes(pid: int) -> int | None:
    try:
        import psutil  # type: ignore[import-not-found]

        return int(psutil.Process(pid).memory_info().rss) or None
    except ImportError:
        pass
    except Exception:
        return None
    try:
        with open(f"/proc/{pid}/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return rss or None  # a zombie (killed actor not yet reaped) reports 0

    except (OSError, ValueError, IndexError):
        return None


def job_actor_pids(job_id: str) -> dict[str, int]:
    """Actor name -> pid of every ALIVE actor of this job (task actors and JobMaster)."""
    from ray.util.state import list_actors

    out: dict[str, int] = {}
    # the GCS address of the cluster this driver is connected to (other Ray instances may
    # run on the same machine, so auto-discovery would be ambiguous)
    address = ray.get_runtime_context().gcs_address
    for a in list_actors(address=address, filters=[("state", "=", "ALIVE")], limit=10_000,
                         raise_on_missing_output=False):
        name = getattr(a, "name", None) or ""
        pid = getattr(a, "pid", None)
        if name.startswith(job_id + "/") and pid:
            out[name] = int(pid)
    return out


def wait_for_pids(job_id: str, expected: int, timeout: float = 10.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    pids: dict[str, int] = {}
    while time.monotonic() < deadline:
        try:
            pids = job_actor_pids(job_id)
        except Exception as exc:  # state API unavailable
            print(f"  (could not list actors: {exc})")
            return {}
        if len(pids) >= expected:
            break
        time.sleep(0.2)
    return pids


def _cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (Linux /proc), None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _machine_busy_seconds() -> float | None:
    """CPU seconds all cores spent not idle since boot (/proc/stat)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # minus idle, iowait
    except (OSError, ValueError, IndexError):
        return None


class RssSampler(threading.Thread):
    """Sums the RSS of the given pids every ``interval`` s until stopped; also notes the
    CPU time of those pids and of the whole machine, to tell how much CPU other processes
    (Ray daemons, the driver, anything else running) took meanwhile."""

    def __init__(self, pids: dict[str, int], t0: float, interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.t0 = t0
        self.interval = interval
        self.samples: list[dict[str, Any]] = []
        self._halt = threading.Event()
        self._cpu0 = {n: _cpu_seconds(p) for n, p in pids.items()}
        self._cpu_last = dict(self._cpu0)
        self._busy0 = _machine_busy_seconds()
        self._busy_last = self._busy0
        self._wall0 = time.monotonic()
        self._wall_last = self._wall0

    def run(self) -> None:
        while not self._halt.is_set():
            per = {n: _rss_bytes(p) for n, p in self.pids.items()}
            alive = {n: v for n, v in per.items() if v is not None}
            if alive:
                self.samples.append({
                    "t": round(time.monotonic() - self.t0, 3),
                    "rss_bytes": sum(alive.values()),
                    "processes": len(alive),
                    "per_actor": alive,
                })
                # CPU counters only while every actor lives (a killed one loses its count)
                if len(alive) == len(self.pids):
                    self._cpu_last = {n: _cpu_seconds(p) for n, p in self.pids.items()}
                    self._busy_last = _machine_busy_seconds()
                    self._wall_last = time.monotonic()
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)

    def cpu(self) -> dict[str, Any]:
        """Average cores used over the sampled span: by each actor, by the job, by the
        whole machine, and by everything else."""
        wall = self._wall_last - self._wall0
        if wall <= 0 or self._busy0 is None or self._busy_last is None:
            return {}
        per = {n: (self._cpu_last[n] - self._cpu0[n]) / wall for n in self.pids
               if self._cpu_last.get(n) is not None and self._cpu0.get(n) is not None}
        job = sum(per.values())
        machine = (self._busy_last - self._busy0) / wall
        return {"span_s": wall, "job_cores": job, "machine_cores": machine,
                "other_cores": machine - job, "per_actor_cores": per}


def memory_summary(samples: list[dict[str, Any]], full_processes: int,
                   warmup_s: float | None = None) -> dict[str, Any]:
    """start/end/max/min of the summed RSS (MB); with ``warmup_s``, also the growth from the
    first sample after the warm-up to the end, over the second half of the run, and a
    least-squares slope after the warm-up."""
    # only samples in which every process of the job was still alive (the tail of a run,
    # while actors are being killed, would look like a drop)
    s = [x for x in samples if x["processes"] == full_processes] or samples
    if not s:
        return {"samples": 0}
    mb = [x["rss_bytes"] / 2**20 for x in s]
    out: dict[str, Any] = {"samples": len(s), "start_mb": mb[0], "end_mb": mb[-1],
                           "max_mb": max(mb), "min_mb": min(mb), "growth_mb": mb[-1] - mb[0]}
    if warmup_s is None:
        return out
    post = [(x["t"], m) for x, m in zip(s, mb, strict=True) if x["t"] >= warmup_s]
    if len(post) >= 2:
        n = len(post)
        mt = sum(t for t, _ in post) / n
        mm = sum(m for _, m in post) / n
        var = sum((t - mt) ** 2 for t, _ in post)
        slope = sum((t - mt) * (m - mm) for t, m in post) / var if var else 0.0
        half = [(t, m) for t, m in post if t >= s[-1]["t"] / 2]
        out.update({
            "after_warmup_start_mb": post[0][1],
            "after_warmup_growth_mb": post[-1][1] - post[0][1],
            "after_warmup_slope_mb_per_min": slope * 60.0,
            "second_half_growth_mb": half[-1][1] - half[0][1] if len(half) >= 2 else None,
            "second_half_seconds": half[-1][0] - half[0][0] if len(half) >= 2 else None,
        })
    return out


# ------------------------------------------------------------------------------ py-spy


def profile_pids(targets: dict[str, int], seconds: float, out_dir: str,
                 gil: bool = False) -> dict[str, Any]:
    """Start ``py-spy record --format raw`` on each pid (``--gil``: only the thread holding
    the GIL, i.e. on-CPU Python); returns {label: (Popen, path)}."""
    procs: dict[str, Any] = {}
    for label, pid in targets.items():
        path = os.path.join(out_dir, f"profile-{label}{'-gil' if gil else ''}.txt")
        cmd = ["py-spy", "record", "--pid", str(pid), "--duration", str(int(seconds)),
               "--format", "raw", "-o", path] + (["--gil"] if gil else [])
        procs[label] = (subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), path)
    return procs


def _function_of(frame: str) -> str:
    """'f (path/x.py:12)' -> 'f (path/x.py)'."""
    head, sep, tail = frame.rpartition(":")
    return f"{head})" if sep and tail.rstrip(")").isdigit() else frame


# Leaf frames where a thread waits rather than runs (py-spy's idle filter does not catch
# them inside Ray workers): the asyncio loop's epoll, Ray's main thread in the C++ core
# worker, the GC thread's and the sync-call threads' condition waits.
_WAITING_LEAVES = ("EpollSelector.select", "Worker.main_loop", "Condition.wait", "Future.result")

# Where busy samples go, first match wins (substring of any frame of the stack).
_CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("TaskActor.metrics (JobMaster poll, packs state samples)", ("TaskActor.metrics",)),
    ("actor call submit: ActorMethod.remote", ("ActorMethod.remote",)),
    ("actor call receive: TaskActor.push + Ray deserialise", ("TaskActor.push", "_private/serialization.py")),
    ("frame encode: encode_frame/pack_fast", ("encode_frame",)),
    ("frame decode: decode_frame/unpack_fast", ("decode_frame",)),
    ("source: GeneratorReader.poll", ("_GeneratorReader.poll",)),
    ("key_by + key groups: _emit_keyed", ("_emit_keyed",)),
    ("latency sink: _LatencyWriter.write", ("_LatencyWriter",)),
    ("map to_pair: StatelessRunner", ("StatelessRunner",)),
    ("reduce: KeyedRunner (incl. user fn)", ("KeyedRunner",)),
    ("acks/credits: _ack_consumed/_await_ack/_send_outbox", ("_ack_consumed", "_await_ack", "_send_outbox")),
    ("rest of TaskActor._loop/TaskCore", ("engine/runtime.py", "engine/task.py")),
    ("asyncio event loop itself", ("asyncio/",)),
]


def _function_of(frame: str) -> str:
    """'f (path/x.py:12)' -> 'f (path/x.py)'."""
    head, sep, tail = frame.rpartition(":")
    return f"{head})" if sep and tail.rstrip(")").isdigit() else frame


def summarise_raw_profile(path: str, top: int = 15) -> dict[str, Any]:
    """Sample shares from a py-spy raw (collapsed-stack) file.

    ``total_samples`` counts every thread sample; ``waiting`` those in a known waiting leaf
    or with no Python frame; the rest are ``busy``. Self time by line and by function, and
    inclusive time by function, are shares of busy samples; ``categories`` splits busy
    samples by what the engine was doing."""
    self_line: dict[str, int] = {}
    self_fn: dict[str, int] = {}
    incl_fn: dict[str, int] = {}
    cats: dict[str, int] = {}
    total = waiting = 0
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if not n.strip().isdigit():
                continue
            count = int(n)
            total += count
            stack = stack.strip()
            frames = stack.split(";") if stack else []
            if not frames or frames[-1].split(" (")[0] in _WAITING_LEAVES:
                waiting += count
                continue
            self_line[frames[-1]] = self_line.get(frames[-1], 0) + count
            leaf = _function_of(frames[-1])
            self_fn[leaf] = self_fn.get(leaf, 0) + count
            for fn in {_function_of(fr) for fr in frames}:
                incl_fn[fn] = incl_fn.get(fn, 0) + count
            for name, needles in _CATEGORIES:
                if any(nd in fr for fr in frames for nd in needles):
                    cats[name] = cats.get(name, 0) + count
                    break
            else:
                cats["other"] = cats.get("other", 0) + count
    busy = total - waiting

    def rows(c: dict[str, int], k: int = top) -> list[dict[str, Any]]:
        return [{"frame": key, "samples": v, "pct": 100.0 * v / busy if busy else 0.0}
                for key, v in sorted(c.items(), key=lambda kv: -kv[1])[:k]]

    return {"total_samples": total, "waiting_samples": waiting, "busy_samples": busy,
            "busy_pct": 100.0 * busy / total if total else 0.0,
            "categories": rows(cats, len(cats)), "self_by_line": rows(self_line),
            "self_by_function": rows(self_fn), "inclusive_by_function": rows(incl_fn)}


# ------------------------------------------------------------------------------ phases


def poll_until_finished(handle: Any, poll: float, timeout: float, t0: float) -> tuple[float | None, str]:
    """Poll the JobMaster's status (cheap: no task is asked) until the job leaves running;
    returns (time since t0 of the first poll that saw it ended, state)."""
    deadline = t0 + timeout
    state = "running"
    while time.monotonic() < deadline:
        state = handle.status().state
        now = time.monotonic()
        if state not in ("created", "running"):
            return now - t0, state
        time.sleep(poll)
    return None, state


def interior_rate(timeline: list[dict[str, Any]]) -> tuple[float | None, int]:
    """Records/s over the whole wall seconds strictly between the first and the last second
    with any record at the sink (the partial first and last seconds are left out)."""
    inner = timeline[1:-1]
    if not inner:
        return None, 0
    seconds = inner[-1]["second"] - inner[0]["second"] + 1
    return sum(r["count"] for r in inner) / seconds, seconds


def run_full_speed(p: int, args: argparse.Namespace, config: JobConfig,
                   profile: bool) -> dict[str, Any]:
    sink = SpanLatencySink()
    job = build(p, args.source_parallelism, None, args.records, None, sink, config)
    t0 = time.monotonic()
    handle = job.run()
    t_started = time.monotonic()
    wall_started = time.time()
    try:
        pids = wait_for_pids(handle.job_id, args.source_parallelism + p + 1)
        sampler = RssSampler(pids, t_started)
        sampler.start()
        profs: dict[str, Any] = {}
        if profile:
            targets = {}
            for name, pid in pids.items():
                if "/gen/0/" in name:
                    targets["source"] = pid
                elif "/count/0/" in name:
                    targets["count"] = pid
            print(f"  py-spy on {targets} for {args.profile_seconds:.0f} s")
            profs = profile_pids(targets, args.profile_seconds, args.out, args.profile_gil)
        t_fin, state = poll_until_finished(handle, args.poll, args.timeout, t_started)
        sampler.stop()
        if state != "finished":
            raise RuntimeError(f"full-speed run p={p} ended in state {state!r}")
        profiles = {}
        for label, (proc, path) in profs.items():
            _, err = proc.communicate(timeout=args.profile_seconds + 30)
            if os.path.exists(path):
                profiles[label] = summarise_raw_profile(path)
                profiles[label]["file"] = os.path.relpath(path, ROOT)
            else:
                profiles[label] = {"error": err.decode(errors="replace")[-500:]}
    finally:
        handle.stop()
    assert t_fin is not None
    n_sink = sink.summary()["count"]
    span = sink.span()
    timeline = sink.timeline()
    for row in timeline:
        row["t"] = row["second"] + 0.5 - wall_started
    steady, steady_seconds = interior_rate(timeline)
    sink_span = (span["last"] - span["first"]) if span else None
    return {
        "parallelism": p,
        "records": args.records,
        "records_at_sink": n_sink,
        "deploy_s": t_started - t0,
        "job_span_s": t_fin,
        "job_throughput": args.records / t_fin,
        "sink_first_s": span["first"] - wall_started if span else None,
        "sink_last_s": span["last"] - wall_started if span else None,
        "sink_span_s": sink_span,
        "sink_throughput": (n_sink / sink_span) if sink_span else None,
        "interior_seconds_throughput": steady,
        "interior_seconds": steady_seconds,
        "status_poll_interval_s": args.poll,
        "sink_timeline": timeline,
        "memory": memory_summary(sampler.samples, len(pids)),
        "memory_samples": [{k: v for k, v in s.items() if k != "per_actor"} for s in sampler.samples],
        "cpu": sampler.cpu(),
        "loadavg_at_end": os.getloadavg(),
        "actors": pids,
        "profiles": profiles,
    }


def merged_histogram(sink: LatencySink, from_second: int) -> LatencyHistogram:
    """The sink's latency histogram over every wall second >= ``from_second``.

    Uses ``LatencySink._load()`` (per-second histograms); the public ``summary()`` covers the
    whole run and ``clear()`` cannot drop the writers' in-memory totals."""
    _, per_second = sink._load()
    h = LatencyHistogram()
    for s, hs in per_second.items():
        if s >= from_second:
            h.merge(hs)
    return h


def run_half_load(p: int, rate: float, args: argparse.Namespace, config: JobConfig) -> dict[str, Any]:
    sink = LatencySink()  # the plain one: what a user measures latency with
    job = build(p, args.source_parallelism, rate, None, args.duration, sink, config)
    handle = job.run()
    t_started = time.monotonic()
    wall_started = time.time()
    try:
        pids = wait_for_pids(handle.job_id, args.source_parallelism + p + 1)
        sampler = RssSampler(pids, t_started)
        sampler.start()
        t_fin, state = poll_until_finished(handle, 0.5, args.duration + args.timeout, t_started)
        sampler.stop()
        if state != "finished":
            raise RuntimeError(f"half-load run p={p} ended in state {state!r}")
    finally:
        handle.stop()
    warm_second = math.ceil(wall_started + args.warmup)
    h = merged_histogram(sink, warm_second)
    whole = sink.summary()
    timeline = sink.timeline()
    for row in timeline:
        row["t"] = row["second"] + 0.5 - wall_started  # middle of that wall second
    expected = GeneratorSource(rate=rate, duration_s=args.duration).task_records(0, 1)
    return {
        "parallelism": p,
        "rate": rate,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "records_expected": expected if args.source_parallelism == 1 else None,
        "records_at_sink": whole["count"],
        "job_span_s": t_fin,
        "latency_after_warmup": {
            "count": h.count, "mean_ms": h.mean, "p50_ms": h.quantile(0.5),
            "p99_ms": h.quantile(0.99), "p999_ms": h.quantile(0.999), "max_ms": h.max,
            "from_epoch_second": warm_second,
        },
        "latency_whole_run": whole,
        "sink_timeline": timeline,
        "memory": memory_summary(sampler.samples, len(pids), args.warmup),
        "memory_samples": sampler.samples,
        "cpu": sampler.cpu(),
        "loadavg_at_end": os.getloadavg(),
        "actors": pids,
    }


def measure_ceiling(records: int, repeats: int = 3) -> dict[str, Any]:
    """Single-process loop over the same records; best of ``repeats``."""
    reader = GeneratorSource(rate=None, num_records=records, num_keys=NUM_KEYS, skew=SKEW,
                             zipf_exponent=ZIPF_EXPONENT, seed=SEED).open(0, 1, None, SystemClock())
    data: list[Any] = []
    while True:
        b = reader.poll(65536)
        if b is None:
            break
        data.extend(b.values)
    times = []
    for _ in range(repeats):
        counts: dict[Any, int] = {}
        out: list[Any] = []
        t = time.perf_counter()
        for k, _seq in data:
            c = counts[k] = counts.get(k, 0) + 1
            out.append((k, c))
        times.append(time.perf_counter() - t)
        del out
    best = min(times)
    seen: set[Any] = set()
    growth = []  # distinct keys (= keyed state entries) after n records: state grows with them
    marks = {len(data) * i // 8 for i in range(1, 9)}
    for i, (k, _seq) in enumerate(data, 1):
        seen.add(k)
        if i in marks:
            growth.append([i, len(seen)])
    return {"records": len(data), "distinct_keys": len(counts), "distinct_keys_after": growth,
            "seconds": times,
            "throughput": len(data) / best,
            "loop": "for k, _ in records: c = counts[k] = counts.get(k, 0) + 1; out.append((k, c))",
            "best_of": repeats}


# ------------------------------------------------------------------------------ output


def fmt(x: float | None, spec: str = ",.0f") -> str:
    return "-" if x is None else format(x, spec)


def _cores(r: dict[str, Any]) -> str:
    c = r.get("cpu") or {}
    if not c:
        return "-"
    return f"{c['job_cores']:.2f}/{c['other_cores']:.2f}"


def print_table(results: dict[str, Any]) -> None:
    ceil = results["ceiling"]["throughput"]
    print()
    print(f"per-core ceiling (plain Python loop, same {results['ceiling']['records']:,} records): "
          f"{ceil:,.0f} records/s")
    print()
    print("full speed (records/s)")
    hdr = (f"{'p':>3} {'job':>10} {'sink':>10} {'interior':>10} {'job span s':>11} "
           f"{'sink span s':>12} {'job/ceil':>9} {'sink/ceil':>9} {'cores job/other':>16}")
    print(hdr)
    for r in results["full_speed"]:
        print(f"{r['parallelism']:>3} {fmt(r['job_throughput']):>10} {fmt(r['sink_throughput']):>10} "
              f"{fmt(r['interior_seconds_throughput']):>10} {r['job_span_s']:>11.2f} "
              f"{fmt(r['sink_span_s'], '.2f'):>12} "
              f"{r['job_throughput'] / ceil:>9.3f} {fmt(r['sink_throughput'] and r['sink_throughput'] / ceil, '.3f'):>9} "
              f"{_cores(r):>16}")
    print()
    print(f"half load (open loop, 50% of job throughput; latency excludes first {results['config']['warmup_s']:g} s)")
    print(f"{'p':>3} {'rate/s':>9} {'at sink':>9} {'p50 ms':>8} {'p99 ms':>8} {'p999 ms':>8} {'max ms':>8} "
          f"{'RSS start':>10} {'RSS end':>8} {'RSS max':>8} {'+warm':>7} {'+2nd half':>9} "
          f"{'cores job/other':>16}")
    for r in results["half_load"]:
        lat, mem = r["latency_after_warmup"], r["memory"]
        print(f"{r['parallelism']:>3} {r['rate']:>9,.0f} {r['records_at_sink']:>9,} {lat['p50_ms']:>8.1f} "
              f"{lat['p99_ms']:>8.1f} {lat['p999_ms']:>8.1f} {lat['max_ms']:>8.1f} "
              f"{fmt(mem.get('start_mb'), '.1f'):>10} {fmt(mem.get('end_mb'), '.1f'):>8} "
              f"{fmt(mem.get('max_mb'), '.1f'):>8} {fmt(mem.get('after_warmup_growth_mb'), '+.1f'):>7} "
              f"{fmt(mem.get('second_half_growth_mb'), '+.1f'):>9} {_cores(r):>16}")
    print(f"RSS: MB summed over the job's actor processes (task actors + JobMaster), sampled every "
          f"1 s; +warm = end - first sample after {results['config']['warmup_s']:g} s, "
          f"+2nd half = growth over the second half of the run")
    print("cores job/other: average CPU cores used by the job's actor processes / by every "
          "other process on the machine (Ray daemons, driver, other users) during the run")
    print()


def plot(results: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 6))
    full = results["full_speed"]
    ps = [str(r["parallelism"]) for r in full]
    x = range(len(ps))
    w = 0.38
    job = [r["job_throughput"] for r in full]
    lo = [r["job_throughput"] - min(x["job_throughput"] for x in r.get("runs", [r])) for r in full]
    hi = [max(x["job_throughput"] for x in r.get("runs", [r])) - r["job_throughput"] for r in full]
    ax1.bar([i - w / 2 for i in x], job, w, yerr=[lo, hi], capsize=3,
            label=f"job (run() → finished); median of {results['config']['repeats']}, bars = range")
    ax1.bar([i + w / 2 for i in x], [r["sink_throughput"] or 0 for r in full], w,
            label="sink, first → last record")
    ceil = results["ceiling"]["throughput"]
    ax1.axhline(ceil, color="k", ls="--", label=f"per-core ceiling {ceil / 1e6:.1f}M/s")
    ax1.set_xticks(list(x), ps)
    ax1.set_xlabel("count operator parallelism")
    ax1.set_ylabel("records/s")
    ax1.set_title(f"full speed, {results['config']['records']:,} records")
    for i, r in enumerate(full):
        ax1.annotate(f"{r['job_throughput'] / 1e3:,.0f}k\n({r['job_throughput'] / ceil:.1%})",
                     (i - w / 2, r["job_throughput"]), ha="center", va="bottom", fontsize=8)
    ax1.set_ylim(0, ceil * 1.1)
    ax1.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1e6:g}M"))
    ax1.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12))

    for r in results["half_load"]:
        tl = r["sink_timeline"]
        t = [row["t"] for row in tl]
        line, = ax2.plot(t, [row["p99_ms"] for row in tl], marker=".",
                         label=f"p={r['parallelism']} p99 ({r['rate']:,.0f}/s)")
        ax2.plot(t, [row["p50_ms"] for row in tl], ls="--", color=line.get_color(),
                 label=f"p={r['parallelism']} p50")
    ax2.axvspan(0, results["config"]["warmup_s"], color="0.9", label="warm-up (excluded)")
    ax2.set_yscale("log")
    ax2.set_xlabel("seconds since job started")
    ax2.set_ylabel("end-to-end latency per second, ms (log)")
    ax2.set_title("half load (50% of full-speed job throughput)")
    ax2.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    la = results["machine"]
    fig.suptitle(f"reflow keyed count, zipf {ZIPF_EXPONENT} over {NUM_KEYS:,} keys — "
                 f"{la['cpus']} CPUs, load avg {la['loadavg_at_start'][0]:.1f} at start, "
                 f"{la.get('loadavg_at_end', [0])[0]:.1f} at end")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------ main


def profile_only(args: argparse.Namespace, config: JobConfig, results: dict[str, Any]) -> int:
    p = args.parallelism[0]
    ray.init(namespace="reflow", log_to_driver=True, configure_logging=False)
    try:
        print(f"p={p}: full speed, {args.records:,} records, profiled ...")
        full = run_full_speed(p, args, config, profile=True)
    finally:
        ray.shutdown()
    print(f"  job {full['job_throughput']:,.0f}/s over {full['job_span_s']:.2f} s (with py-spy attached)")
    results["full_speed_profiled"] = {k: v for k, v in full.items() if k != "profiles"}
    results["code_at_end"] = code_state(ROOT, files_hash=True)
    results["profiles"] = full["profiles"]
    with open(os.path.join(args.out, f"profile{'-gil' if args.profile_gil else ''}.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    for label, prof in full["profiles"].items():
        print(f"\n{label}: {prof.get('total_samples')} thread samples, "
              f"{prof.get('busy_samples')} busy ({prof.get('busy_pct', 0):.0f}%); shares below are "
              f"of busy samples ({prof.get('file')})")
        for kind in ("categories", "self_by_line", "self_by_function", "inclusive_by_function"):
            print(f"  top {kind}:")
            for row in prof.get(kind, [])[:15]:
                print(f"    {row['pct']:5.1f}%  {row['frame']}")
    return 0



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parallelism", type=int, nargs="+", default=None,
                    help="count operator parallelisms (default 1 2 4; --quick: 1 2)")
    ap.add_argument("--source-parallelism", type=int, default=1)
    ap.add_argument("--records", type=int, default=None, help="full-speed records (default 2,000,000)")
    ap.add_argument("--duration", type=float, default=None, help="half-load seconds (default 20)")
    ap.add_argument("--warmup", type=float, default=3.0, help="half-load seconds excluded from latency")
    ap.add_argument("--repeats", type=int, default=None,
                    help="full-speed runs per parallelism; the median (by job throughput) is "
                         "reported and drives the half-load rate (default 3; --quick: 1)")
    ap.add_argument("--poll", type=float, default=0.05,
                    help="full-speed job-status poll interval, s (asks only the JobMaster)")
    ap.add_argument("--timeout", type=float, default=300.0, help="per-run timeout, s")
    ap.add_argument("--batch-size", type=int, default=JobConfig().batch_size)
    ap.add_argument("--linger-ms", type=float, default=JobConfig().linger_ms)
    ap.add_argument("--profile", action="store_true",
                    help="py-spy the source and count task during the p=1 full-speed run")
    ap.add_argument("--profile-seconds", type=float, default=10.0)
    ap.add_argument("--profile-gil", action="store_true",
                    help="py-spy --gil: sample only the thread holding the GIL")
    ap.add_argument("--profile-only", action="store_true",
                    help="only the profiled full-speed run at the first parallelism; writes "
                         "profile.json (not results.json)")
    ap.add_argument("--quick", action="store_true", help="200k records, 8 s half load, p 1 2")
    ap.add_argument("--out", default=OUT_DIR)
    args = ap.parse_args(argv)
    args.parallelism = args.parallelism or ([1, 2] if args.quick else [1, 2, 4])
    args.records = args.records or (200_000 if args.quick else 2_000_000)
    args.duration = args.duration or (8.0 if args.quick else 20.0)
    args.repeats = args.repeats or (1 if args.quick else 3)
    os.makedirs(args.out, exist_ok=True)
    if args.profile_only:
        args.profile = True
    config = JobConfig(batch_size=args.batch_size, linger_ms=args.linger_ms)

    t_all = time.monotonic()
    results: dict[str, Any] = {
        "command": "python " + " ".join([os.path.relpath(os.path.abspath(__file__), ROOT)]
                                        + (sys.argv[1:] if argv is None else argv)),
        "config": {
            "parallelism": args.parallelism, "source_parallelism": args.source_parallelism,
            "records": args.records, "duration_s": args.duration, "warmup_s": args.warmup,
            "num_keys": NUM_KEYS, "skew": SKEW, "zipf_exponent": ZIPF_EXPONENT, "seed": SEED,
            "poll_interval_s": args.poll, "quick": args.quick, "repeats": args.repeats,
            "job_config": {k: getattr(config, k) for k in config.__dataclass_fields__},
            "pipeline": "GeneratorSource -> map (k,seq)->(k,1) [chained] -> key_by k -> "
                        "reduce (a,b)->(a0,a1+b1) -> LatencySink [chained]",
        },
        "code": code_state(ROOT, files_hash=True),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "ray": ray.__version__, "loadavg_at_start": os.getloadavg()},
        "definitions": {
            "job_throughput": "records / (job.run() returned -> first JobMaster status poll "
                              "seeing the job finished); includes end-of-stream drain, excludes "
                              "actor start-up",
            "sink_throughput": "records at the sink / (wall time of the first sink write() -> "
                               "the last sink write(), over all sink writers); exact to one batch",
            "interior_seconds_throughput": "records at the sink in the whole wall seconds strictly "
                                           "between the first and last second with records, per s",
            "half_load_rate": "50% of that parallelism's job_throughput, open loop",
            "latency": "sink arrival - scheduled emission time of each record (ms), merged "
                       "per-second sink histograms from ceil(start + warmup) on; within ~2%",
            "rss": "sum of RSS of the job's ALIVE actor processes (task actors + JobMaster), "
                   "every 1 s; start/end/max over samples where all were alive",
        },
    }
    if args.profile_only:
        return profile_only(args, config, results)
    print(f"ceiling: plain loop over {args.records:,} pre-generated records ...")
    results["ceiling"] = measure_ceiling(args.records)
    print(f"  {results['ceiling']['throughput']:,.0f} records/s")

    ray.init(namespace="reflow", log_to_driver=True, configure_logging=False)
    results["full_speed"], results["half_load"] = [], []
    try:
        for p in args.parallelism:
            print(f"p={p}: full speed, {args.records:,} records ...")
            runs = []
            for i in range(args.repeats):
                runs.append(run_full_speed(p, args, config,
                                           profile=args.profile and p == args.parallelism[0] and i == 0))
                if args.repeats > 1:
                    print(f"    run {i + 1}/{args.repeats}: job {runs[-1]['job_throughput']:,.0f}/s")
            # the run with the median job throughput stands for p; every run is kept
            full = sorted(runs, key=lambda r: r["job_throughput"])[(len(runs) - 1) // 2]
            full["runs"] = [{k: r[k] for k in ("job_throughput", "sink_throughput",
                                                "interior_seconds_throughput", "job_span_s",
                                                "sink_span_s", "cpu")} for r in runs]
            full["profiles"] = next((r["profiles"] for r in runs if r["profiles"]), {})
            results["full_speed"].append(full)
            print(f"  job {full['job_throughput']:,.0f}/s over {full['job_span_s']:.2f} s; "
                  f"sink {fmt(full['sink_throughput'])}/s over {fmt(full['sink_span_s'], '.2f')} s; "
                  f"interior seconds {fmt(full['interior_seconds_throughput'])}/s")
            for label, prof in full["profiles"].items():
                print(f"  profile {label}: {prof.get('total_samples')} samples -> {prof.get('file')}")
            rate = 0.5 * full["job_throughput"]
            print(f"p={p}: half load, {rate:,.0f} records/s for {args.duration:g} s ...")
            half = run_half_load(p, rate, args, config)
            results["half_load"].append(half)
            lat = half["latency_after_warmup"]
            print(f"  p50 {lat['p50_ms']:.1f} ms  p99 {lat['p99_ms']:.1f} ms  max {lat['max_ms']:.1f} ms; "
                  f"RSS {fmt(half['memory'].get('start_mb'), '.0f')} -> "
                  f"{fmt(half['memory'].get('end_mb'), '.0f')} MB")
    finally:
        ray.shutdown()
    results["total_seconds"] = time.monotonic() - t_all
    results["code_at_end"] = code_state(ROOT, files_hash=True)
    if results["code_at_end"]["engine_sha256"] != results["code"]["engine_sha256"]:
        print("WARNING: engine/ or migration/ changed during the run; figures mix versions")
    results["machine"]["loadavg_at_end"] = os.getloadavg()
    ceil = results["ceiling"]["throughput"]
    results["ratios"] = [{"parallelism": r["parallelism"],
                          "job_over_ceiling": r["job_throughput"] / ceil,
                          "sink_over_ceiling": (r["sink_throughput"] or 0) / ceil,
                          "interior_over_ceiling": (r["interior_seconds_throughput"] or 0) / ceil}
                         for r in results["full_speed"]]
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    plot(results, os.path.join(args.out, "steady.png"))
    print_table(results)
    print(f"total {results['total_seconds']:.0f} s; wrote {os.path.relpath(args.out, ROOT)}/results.json "
          f"and steady.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
