"""One rescale scenario, run once per protocol and once without rescaling: latency timeline,
scaling period, disruption figures and ratios measured within the one run.

    python examples/bench/rescale.py                          # micro, every protocol, ~10 min
    python examples/bench/rescale.py --quick                  # small smoke run, ~1-2 min
    python examples/bench/rescale.py --scenario skew --protocols drrs,stop-restart
    reflow bench rescale --scenario q7 --quick                # the same through the CLI

Scenarios (``--scenario``; one fresh job per run, every run the same job and timing):

* ``micro``: GeneratorSource (open loop, ``--rate`` records/s, ``--keys`` keys, ``--skew``
  uniform or a Zipf exponent) -> key_by -> ``PaddedCount`` (per key a count and
  ``--state-bytes`` bytes of padding: ~200 MB at the defaults) -> sink (chained into the
  aggregator); ``agg`` rescaled ``--from`` -> ``--to`` (8 -> 12), ``--key-groups`` (128).
  Every aggregator task spends ``--service-us`` (1,000; quick 300) per record, slept: a
  task serves at most 1,000 records/s without using a core, so 8 tasks run at ~60 % and
  12 at ~40 % of their capacity. That is the papers' setting, one core per task with the
  rescaled operator the bottleneck; on this machine's two cores, shared by every task, a
  CPU-bound run (``--service-us 0``) gains no capacity from a scale-out.
* ``micro-in``: the same, scaled in (12 -> 8).
* ``skew``: the same job on Zipf keys (exponent 1.0), ``agg`` *rebalanced* (same
  parallelism unless ``--to`` says otherwise) to an assignment that evens the per-key-group
  load; the loads are counted on the generator's deterministic key sequence up to the request
  (``timeline.balanced_assignment``).
* ``q7`` / ``q8``: NEXMark Q7 (highest bid) and Q8 (new users) with sliding event-time
  windows (``--size-ms``/``--slide-ms``, 2 s / 500 ms), an open-loop NexmarkSource whose
  timestamps are the scheduled emission times; the window operator (``q7-partial-max``,
  ``q8-join``) is rescaled 4 -> 6. Latency is that of the window results (arrival - window end).

Per run: deploy, build state (``--build`` s), baseline (``--baseline`` s), then the request
(``handle.rescale``/``handle.rebalance`` block until done; the ``none`` run only notes the
time), then ``--after`` s more. From the sink's per-second latency histograms and the write
times of every sink writer (``GapLatencySink``):

* baseline: the ``--baseline`` whole seconds before the request second: mean, p99,
  records/s and the *level*, the median of the per-second means (a noisy second of a shared
  machine does not move it);
* scaling period (DESIGN.md §11): from the request second until the per-second mean latency
  stays within ``--tolerance`` (1.1) x the baseline level + ``--slack-ms`` (5 ms: per-second
  means of 5-10 ms jitter by more than 10 % here; 0 gives the strict rule) for ``--stable``
  seconds, the window starting no earlier than the completion second; capped at the end of
  the run (shown with '+');
* settle: the same rule against max(baseline level, level of the last ``--stable`` s), i.e.
  until latency reaches its *new* level (12 tasks on 2 cores may be slower than 8);
* peak (max, highest per-second p99) and mean/p99 over the scaling period;
* throughput dip: lowest per-second sink records/s in the scaling period / baseline records/s;
* longest gap without any sink output from the request to the end of the period;
* from the RescaleReport: duration_s, suspended_s, propagation_delay_s, bytes and key groups
  moved, rerouted records, phases, and ``planning_reason`` when the protocol sets it.

Protocols: every name in ``migration.protocols.PROTOCOLS`` (``--protocols a,b`` to choose);
one the engine refuses (``RescaleRefused``) is recorded as skipped with the reason. A run whose
job fails is recorded as failed and the others go on. Also (``--overhead``, default on) the
steady-state cost of rescaling support: the micro job at full speed over ``--overhead-records``
records with ``JobConfig(live_rescaling=False)`` vs the default, alternated.

Frames: every run uses ``JobConfig(linger_ms=--linger-ms)``, 15 ms by default rather than
the engine's 5 ms, and ``--transport`` (the engine's default, tcp). A channel sends one frame
per linger at 5,000 records/s over 8-12 channels, so the frame rate grows with the
parallelism, not the load. With ``--transport ray`` each frame is an actor call costing
~1.3 ms of CPU over both ends on this machine: at 5 ms, 8 tasks then keep 1.8 of the 2 cores
busy and 12 tasks saturate them; at 15 ms 8 tasks use ~1.3 cores. Over the TCP transport
the same 8-task job at 15 ms uses 0.6-0.7 cores. ``--linger-ms 5`` gives the engine default.

Writes ``examples/bench/out/rescale/<scenario>/results.json``, ``summary.md`` (also printed)
and ``timeline.png``. The machine is shared and noisy: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import threading
import time
import urllib.request
import uuid
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import ray  # noqa: E402

from engine import JobConfig, KeyedProcessFunction, StreamJob  # noqa: E402
from engine.errors import JobFailedError, RescaleRefused  # noqa: E402
from engine.keygroups import key_group_of, uniform_assignment  # noqa: E402
from engine.latency import LatencyHistogram  # noqa: E402
from engine.sinks import LatencySink  # noqa: E402
from engine.sources import _GEN_CHUNK, GeneratorSource  # noqa: E402
from examples.bench import timeline as tl  # noqa: E402
from examples.bench.provenance import code_state  # noqa: E402
from migration.protocols import PROTOCOLS  # noqa: E402

SEED = 0
NONE = "none"  # the run without a rescale
SCENARIOS = ("micro", "micro-in", "skew", "q7", "q8")
OUT_ROOT = os.path.join(ROOT, "examples", "bench", "out", "rescale")
COLORS = {NONE: "0.45", "drrs": "tab:blue", "stop-restart": "tab:red",
          "pause-resume": "tab:orange", "fluid": "tab:green", "batched": "tab:olive",
          "non-disruptive": "tab:purple"}

# scenario defaults: (full, quick)
DEFAULTS: dict[str, dict[str, tuple[Any, Any]]] = {
    "micro": {"rate": (5000.0, 2000.0), "keys": (20_000, 2_000), "skew": ("uniform", "uniform"),
              "from_p": (8, 1), "to_p": (12, 2), "service_us": (1000.0, 300.0)},
    "micro-in": {"rate": (5000.0, 2000.0), "keys": (20_000, 2_000),
                 "skew": ("uniform", "uniform"), "from_p": (12, 2), "to_p": (8, 1),
                 "service_us": (1000.0, 300.0)},
    "skew": {"rate": (5000.0, 2000.0), "keys": (20_000, 2_000), "skew": ("1.0", "1.0"),
             "from_p": (8, 2), "to_p": (None, None), "service_us": (0.0, 0.0)},
    "q7": {"rate": (10_000.0, 5_000.0), "from_p": (4, 1), "to_p": (6, 2)},
    "q8": {"rate": (20_000.0, 10_000.0), "from_p": (4, 1), "to_p": (6, 2)},
}
TIMING = {"build": (12.0, 2.0), "baseline": (8.0, 3.0), "after": (12.0, 5.0),
          "stable": (5, 2), "overhead_records": (600_000, 300_000), "overhead_repeats": (2, 1),
          "replication_seconds": (15.0, 5.0)}
REPLICATION_POLICIES = ("none", "hot", "all")
RESCALE_GUESS_S = 8.0  # for the progress estimate only
# a channel sends one frame per linger when its records are few: as Ray actor calls (~1.3 ms
# of CPU over both ends here), at the engine's 5 ms 12 aggregator tasks' frames alone kept
# both cores busy (see the module docstring)
LINGER_MS = 15.0


# ------------------------------------------------------------------------------ the jobs


class PaddedCount(KeyedProcessFunction):
    """Per key: a count and ``record[2]`` bytes of padding (made on the key's first record).

    ``service_us``: each record also costs this much time, spent sleeping (one sleep once a
    millisecond is owed), so a task serves 1e6 / ``service_us`` records/s at most without
    using a core: the papers' one core per task, on a machine whose two cores all the
    tasks share. A sleep that overruns (the process woke late: 0.15-0.5 ms per 1 ms sleep
    on this machine, more the busier it is) is credited to the next records, up to
    ``MAX_CREDIT_S``; otherwise the service time would grow with the machine's load, and a
    migration's CPU work would slow every task, as it would not with a core each."""

    MAX_CREDIT_S = 0.01

    def __init__(self, service_us: float = 0.0) -> None:
        self.service_s = service_us / 1e6

    def open(self, ctx: Any) -> None:
        self.pad = ctx.value_state("pad", None)
        self.n = ctx.value_state("n", 0)
        self.owed = 0.0  # seconds of service not slept yet (< 0: credit from an overrun)

    def process_element(self, value: Any, ctx: Any) -> Any:
        if self.pad.value() is None:
            self.pad.update(bytes(value[2]))
        n = self.n.value() + 1
        self.n.update(n)
        if self.service_s:
            self.owed += self.service_s
            if self.owed >= 0.001:
                t0 = time.monotonic()
                time.sleep(self.owed)
                self.owed = max(-self.MAX_CREDIT_S, self.owed - (time.monotonic() - t0))
        yield (ctx.key, n)


def key_of(record: Any) -> Any:
    return record[0]


class GapLatencySink(LatencySink):
    """A ``LatencySink`` whose writers also note when they wrote: ``[first, last]`` wall-time
    segments of writes less than ``JOIN_S`` apart, saved beside the latency files as
    ``gaps-*.json`` (which ``LatencySink`` ignores) on ``flush()`` and every 0.5 s."""

    JOIN_S = 0.05

    def open(self, task_index: int, parallelism: int, clock: Any) -> Any:
        path = os.path.join(self.directory, f"gaps-{task_index}-{uuid.uuid4().hex}.json")
        return _GapWriter(super().open(task_index, parallelism, clock), clock, path,
                          self.JOIN_S, self.SAVE_INTERVAL_S)

    def segments(self) -> list[list[float]]:
        out: list[list[float]] = []
        for name in sorted(os.listdir(self.directory)):
            if name.startswith("gaps-") and name.endswith(".json"):
                with open(os.path.join(self.directory, name)) as f:
                    out.extend(json.load(f))
        return out


class _GapWriter:
    def __init__(self, inner: Any, clock: Any, path: str, join_s: float, every_s: float) -> None:
        self.inner, self.clock, self.path = inner, clock, path
        self.join_s, self.every_s = join_s, every_s
        self.segments: list[list[float]] = []
        self.saved_at = 0.0
        self.dirty = False

    def write(self, values: Any, timestamps: Any) -> None:
        self.inner.write(values, timestamps)
        if values:
            now = self.clock.now()
            tl.add_write(self.segments, now, self.join_s)
            self.dirty = True
            if now - self.saved_at >= self.every_s:
                self._save(now)

    def _save(self, now: float) -> None:
        tmp = os.path.join(os.path.dirname(self.path), "." + os.path.basename(self.path) + ".tmp")
        with open(tmp, "w") as f:
            json.dump(self.segments, f)
        os.replace(tmp, self.path)
        self.saved_at, self.dirty = now, False

    def flush(self) -> None:
        self.inner.flush()
        if self.dirty:
            self._save(self.clock.now())

    def close(self) -> None:
        self.flush()


def generator_keys(n: int, num_keys: int, skew: str, zipf_exponent: float) -> Any:
    """The first ``n`` keys of GeneratorSource task 0 of 1 (its deterministic sequence)."""
    import numpy as np

    cdf = None
    if skew == "zipf":
        w = np.arange(1, num_keys + 1, dtype=np.float64) ** -zipf_exponent
        cdf = np.cumsum(w)
        cdf /= cdf[-1]
    parts = []
    for chunk in range(math.ceil(n / _GEN_CHUNK)):
        rng = np.random.default_rng([SEED, 0, chunk])
        if cdf is None:
            keys = rng.integers(0, num_keys, size=_GEN_CHUNK, dtype=np.int64)
        else:
            keys = np.minimum(np.searchsorted(cdf, rng.random(_GEN_CHUNK), side="right"),
                              num_keys - 1)
        parts.append(keys)
    return np.concatenate(parts)[:n] if parts else np.zeros(0, dtype=np.int64)


def parse_skew(text: str) -> tuple[str, float]:
    if text == "uniform":
        return "uniform", 1.0
    try:
        z = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--skew is 'uniform' or a Zipf exponent; got {text!r}") from None
    return "zipf", z


class Scenario:
    """What one scenario runs: the job, the operator, the rescale request."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.name = args.scenario
        self.nexmark = self.name in ("q7", "q8")
        self.op = {"q7": "q7-partial-max", "q8": "q8-join"}.get(self.name, "agg")
        self.action = "rebalance" if self.name == "skew" else "rescale"
        self.empty_ok = self.nexmark  # window results are sparse
        self.assignment: tuple[int, ...] | None = None
        self.info: dict[str, Any] = {}
        if not self.nexmark:
            self.skew, self.zipf = parse_skew(args.skew)
            n_build = int(args.rate * args.build)
            keys = generator_keys(int(args.rate * (args.build + args.baseline)), args.keys,
                                  self.skew, self.zipf)
            import numpy as np

            distinct = int(np.unique(keys[:n_build]).size)
            self.info.update(build_records=n_build, keys_built=distinct,
                             expected_state_mb=distinct * args.state_bytes / 1e6)
            if self.action == "rebalance":
                counts = np.bincount(keys, minlength=args.keys)
                loads = tl.group_loads(counts.tolist(),
                                       lambda k: key_group_of(int(k), args.key_groups),
                                       args.key_groups)
                cur = uniform_assignment(args.key_groups, args.from_p)
                self.assignment = tl.balanced_assignment(loads, cur, args.to_p)
                self.info.update(
                    group_loads_records=loads, load_records=int(keys.size),
                    imbalance_before=tl.imbalance(loads, cur, args.from_p),
                    imbalance_after=tl.imbalance(loads, self.assignment, args.to_p),
                    planned_groups_moved=sum(1 for a, b in zip(cur, self.assignment, strict=True)
                                             if a != b),
                    assignment=list(self.assignment))

    def describe(self) -> str:
        a = self.args
        if self.nexmark:
            return (f"NEXMark {self.name.upper()} sliding {a.size_ms}/{a.slide_ms} ms, "
                    f"{a.rate:,.0f} events/s; {self.op} {a.from_p} -> {a.to_p}")
        skew = "uniform" if self.skew == "uniform" else f"Zipf {self.zipf:g}"
        what = (f"rebalance {self.op} at {a.from_p} -> {a.to_p} tasks (load imbalance "
                f"{self.info['imbalance_before']:.2f} -> {self.info['imbalance_after']:.2f}, "
                f"{self.info['planned_groups_moved']} groups planned)"
                if self.action == "rebalance" else f"{self.op} {a.from_p} -> {a.to_p}")
        service = (f", {a.service_us:,.0f} us per record per task" if a.service_us
                   else ", CPU-bound")
        return (f"{a.keys:,} keys ({skew}) x {a.state_bytes:,} B (~"
                f"{self.info['expected_state_mb']:,.0f} MB built), {a.rate:,.0f} records/s"
                f"{service}, {a.key_groups} key groups; {what}")

    def build(self, sink: LatencySink, config: JobConfig, *, full_speed: bool = False,
              num_records: int | None = None) -> StreamJob:
        a = self.args
        job = StreamJob(f"rescale-{self.name}", num_key_groups=a.key_groups,
                        parallelism=a.from_p, config=config)
        if self.nexmark:
            from examples.nexmark import queries
            from examples.nexmark.generator import NexmarkConfig
            from examples.nexmark.source import NexmarkSource

            src = NexmarkSource(NexmarkConfig(seed=42, first_event_rate=a.rate), event_time=False,
                                rate=a.rate, split_events=512)
            queries.build(self.name, job, src, sink, parallelism=a.from_p, source_parallelism=1,
                          size_ms=a.size_ms, slide_ms=a.slide_ms)
            return job
        src = GeneratorSource(rate=None if full_speed else a.rate, num_records=num_records,
                              num_keys=a.keys, skew=self.skew, zipf_exponent=self.zipf,
                              state_bytes_per_key=a.state_bytes, seed=SEED)
        # at full speed (the overhead measurement) the tasks' CPU is what is measured
        service = 0.0 if full_speed else a.service_us
        (job.source(src, name="gen", parallelism=1)
            .key_by(key_of)
            .process(PaddedCount(service), name="agg", parallelism=a.from_p)
            .sink(sink, name="sink"))
        return job

    def request(self, handle: Any, protocol: str) -> Any:
        if self.assignment is not None:
            return handle.rebalance(self.op, self.assignment, protocol=protocol)
        return handle.rescale(self.op, self.args.to_p, protocol=protocol)


# ------------------------------------------------------------------------------ progress


class Progress:
    """One status line on stderr: run k/n, phase, elapsed and an estimate of what is left
    (rewritten in place on a terminal; a line per phase otherwise)."""

    def __init__(self, planned_s: float, runs: int) -> None:
        self.planned = planned_s
        self.runs = runs
        self.t0 = time.monotonic()
        self.done_planned = 0.0  # planned seconds of finished steps
        self.step_planned = 0.0
        self.step_t0 = self.t0
        self.label = "starting"
        self.tty = sys.stderr.isatty()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def step(self, label: str, planned_s: float) -> None:
        self.done_planned += self.step_planned
        self.step_planned, self.step_t0, self.label = planned_s, time.monotonic(), label
        if not self.tty:
            print(f"[{self._fmt(time.monotonic() - self.t0)}] {label}", file=sys.stderr,
                  flush=True)
        else:
            self._draw()

    @staticmethod
    def _fmt(s: float) -> str:
        return f"{int(s) // 60}:{int(s) % 60:02d}"

    def _draw(self) -> None:
        now = time.monotonic()
        in_step = min(now - self.step_t0, self.step_planned)
        frac = min(1.0, (self.done_planned + in_step) / self.planned) if self.planned else 0.0
        left = max(0.0, self.planned - self.done_planned - in_step)
        bar = "#" * int(frac * 24) + "-" * (24 - int(frac * 24))
        line = (f"\r[{bar}] {frac:4.0%} {self._fmt(now - self.t0)} elapsed, ~{self._fmt(left)} "
                f"left | {self.label}")
        sys.stderr.write(line[:160].ljust(100))
        sys.stderr.flush()

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            if self.tty:
                self._draw()

    def close(self) -> None:
        self._stop.set()
        if self.tty:
            self.done_planned += self.step_planned
            self.step_planned = 0.0
            self._draw()
            sys.stderr.write("\n")
            sys.stderr.flush()


# ------------------------------------------------------------------------------ one run


def _rows(per_s: dict[int, LatencyHistogram]) -> dict[int, dict[str, Any]]:
    return {s: {"second": s, "count": h.count, "mean_ms": h.mean, "p99_ms": h.quantile(0.99),
                "max_ms": h.max}
            for s, h in per_s.items() if h.count}


def _merged(per_s: dict[int, LatencyHistogram], lo: int, hi: int) -> LatencyHistogram:
    h = LatencyHistogram()
    for s, hs in per_s.items():
        if lo <= s < hi:
            h.merge(hs)
    return h


def _op_metrics(handle: Any, op: str) -> dict[str, Any]:
    m = handle.metrics()
    ts = [t for t in m.tasks if t.vertex == op]
    return {"state_bytes": sum(t.state_bytes for t in ts), "tasks": len(ts),
            "key_groups": sum(t.key_groups for t in ts),
            "records_in": sum(t.records_in for t in ts)}


def _report_dict(report: Any) -> dict[str, Any]:
    fields = getattr(report, "__dataclass_fields__", None) or {}
    out: dict[str, Any] = {}
    for f in fields:
        v = getattr(report, f)
        if isinstance(v, tuple):
            v = [list(x) if isinstance(x, tuple) else x for x in v]
        out[f] = v
    out["planning_reason"] = getattr(report, "planning_reason", None)
    return out


def run_one(sc: Scenario, protocol: str, config: JobConfig, progress: Progress,
            k: int, n: int) -> dict[str, Any]:
    a = sc.args
    tag = f"run {k}/{n} {protocol}"
    out: dict[str, Any] = {"protocol": protocol, "status": "ok"}
    sink = GapLatencySink()
    job = sc.build(sink, config)
    progress.step(f"{tag}: deploy", 4.0)
    handle = job.run()
    started = time.time()
    report = None
    requested = returned = ended = started
    try:
        progress.step(f"{tag}: build state {a.build:g} s", a.build)
        time.sleep(max(0.0, started + a.build - time.time()))
        out["metrics_before"] = _op_metrics(handle, sc.op)
        progress.step(f"{tag}: baseline {a.baseline:g} s", a.baseline)
        time.sleep(a.baseline)
        requested = time.time()
        if protocol != NONE:
            progress.step(f"{tag}: {sc.action} {sc.op} ({protocol})", RESCALE_GUESS_S)
            try:
                report = sc.request(handle, protocol)
            except RescaleRefused as exc:
                out.update(status="skipped", reason=f"RescaleRefused: {exc}")
                return out
            except JobFailedError as exc:
                out.update(status="failed", reason=f"{type(exc).__name__}: {exc}")
                return out
        returned = time.time()
        progress.step(f"{tag}: after {a.after:g} s", a.after)
        time.sleep(max(0.0, returned + a.after - time.time()))
        ended = time.time()
        st = handle.status()
        if st.state != "running":
            out.update(status="failed", reason=f"job {st.state} after the request: {st.error}")
            return out
        out["metrics_after"] = _op_metrics(handle, sc.op)
    finally:
        progress.step(f"{tag}: stop", 1.0)
        handle.stop()
    out.update(job_id=handle.job_id, started_at=started, requested_at=requested,
               returned_at=returned, ended_at=ended)
    if report is not None:
        out["report"] = _report_dict(report)
        if report.protocol != protocol:
            out["note"] = f"the report names protocol {report.protocol!r}"
    out.update(analyse(sc, sink, out))
    return out


def analyse(sc: Scenario, sink: GapLatencySink, run: dict[str, Any]) -> dict[str, Any]:
    a = sc.args
    per_s = sink._load()[1]
    rows = _rows(per_s)
    requested = run["requested_at"]
    rep = run.get("report")
    completed = rep["completed_at"] if rep else requested
    req_s, done_s, end_s = int(requested), int(completed), int(run["ended_at"])
    b0 = req_s - int(a.baseline)
    base_rows = tl.window(rows, b0, req_s)
    base_mean = tl.weighted_mean(base_rows)
    base_level = tl.level(base_rows)
    base_rate = tl.rate(rows, b0, req_s)
    kw = {"tolerance": a.tolerance, "stable_s": a.stable, "slack_ms": a.slack_ms,
          "empty_ok": sc.empty_ok}
    period = tl.scaling_period(rows, req_s, done_s, base_level, end_s, **kw)
    tail_mean = tl.weighted_mean(tl.window(rows, end_s - a.stable, end_s))
    tail_level = tl.level(tl.window(rows, end_s - a.stable, end_s))
    level = max((x for x in (base_level, tail_level) if x is not None), default=None)
    settle = tl.scaling_period(rows, req_s, done_s, level, end_s, **kw)
    p_rows = tl.window(rows, period.start, period.end)
    ph = _merged(per_s, period.start, period.end)
    segments = sink.segments()
    gap_hi = max(float(period.end), completed)
    # whole seconds from the first after the job started to the last before it ended
    timeline = [{**r, "t": r["second"] + 0.5 - requested}
                for r in tl.dense(rows, int(run["started_at"]) + 1, end_s)]
    return {
        "baseline": {"from_second": b0, "to_second": req_s, "mean_ms": base_mean,
                     "level_ms": base_level,
                     "p99_ms": _merged(per_s, b0, req_s).quantile(0.99) if base_rows else None,
                     "records_per_s": base_rate,
                     "longest_gap": tl.longest_gap(segments, requested - a.baseline, requested)},
        "period": {**period.as_dict(), "mean_ms": tl.weighted_mean(p_rows),
                   "p99_ms": ph.quantile(0.99) if ph.count else None, "count": ph.count},
        "settle": settle.as_dict(),
        "tail_mean_ms": tail_mean,
        "tail_level_ms": tail_level,
        "post_request": {"mean_ms": tl.weighted_mean(tl.window(rows, req_s, end_s)),
                         "records_per_s": tl.rate(rows, req_s, end_s)},
        "peak": tl.peaks(p_rows),
        "dip": tl.throughput_dip(rows, period.start, period.end, base_rate),
        "longest_gap": tl.longest_gap(segments, requested, gap_hi),
        "timeline": timeline,
        "loadavg_at_end": os.getloadavg(),
    }


# ------------------------------------------------------------------------------ overhead


def overhead(sc: Scenario, progress: Progress) -> dict[str, Any]:
    """Full-speed throughput of the micro job with and without live-rescaling support."""
    a = sc.args
    if "live_rescaling" not in JobConfig.__dataclass_fields__:
        return {"skipped": "JobConfig has no live_rescaling field in this engine version"}
    if sc.nexmark:
        return {"skipped": "measured on the micro job only"}
    rows: list[dict[str, Any]] = []
    for rep in range(a.overhead_repeats):
        for live in (True, False):
            progress.step(f"overhead {rep + 1}/{a.overhead_repeats}: live_rescaling={live}",
                          4.0 + a.overhead_records / 150_000)
            sink = LatencySink()
            job = sc.build(sink, JobConfig(live_rescaling=live, transport=a.transport),
                           full_speed=True,
                           num_records=a.overhead_records)
            handle = job.run()
            t0 = time.time()
            try:
                while True:
                    st = handle.status()
                    if st.state not in ("created", "running"):
                        break
                    time.sleep(0.05)
                span = time.time() - t0
            finally:
                handle.stop()
            if st.state != "finished":
                return {"skipped": f"the job ended {st.state}: {st.error}"}
            count = sink.summary()["count"]
            rows.append({"live_rescaling": live, "repeat": rep, "seconds": span,
                         "records_per_s": a.overhead_records / span, "records_at_sink": count})
    on = tl.median(r["records_per_s"] for r in rows if r["live_rescaling"])
    off = tl.median(r["records_per_s"] for r in rows if not r["live_rescaling"])
    return {"records": a.overhead_records, "parallelism": a.from_p, "runs": rows,
            "records_per_s_live": on, "records_per_s_without": off,
            "ratio_live_over_without": tl.ratio(on, off),
            "overhead_pct": None if not off or on is None else 100.0 * (1.0 - on / off)}


def replication_cost(sc: Scenario, progress: Progress) -> dict[str, Any]:
    """Steady-state cost of keeping replicas (Spacker's replication knob): the micro job at
    its rate, once per ``JobConfig(replication=...)`` policy for the same time; bytes copied
    and the owners' CPU seconds spent on refreshes, read from the job's Prometheus
    endpoint, and the sink's mean latency against the run without replicas."""
    from prometheus_client.parser import text_string_to_metric_families

    a = sc.args
    if sc.nexmark:
        return {"skipped": "measured on the micro job only"}
    if a.from_p < 2:
        return {"skipped": "a replica lives on a task other than the owner: --from must be >= 2"}
    secs = a.replication_seconds
    rows: list[dict[str, Any]] = []
    for policy in REPLICATION_POLICIES:
        progress.step(f"replication cost: {policy}, {secs:g} s", secs + 5.0)
        sink = LatencySink()
        cfg = JobConfig(replication=policy, replication_period_s=a.replication_period,
                        linger_ms=a.linger_ms, transport=a.transport)
        handle = sc.build(sink, cfg).run()
        try:
            time.sleep(secs)
            text = urllib.request.urlopen(handle.metrics_url, timeout=10).read().decode()
            st = handle.status()
        finally:
            handle.stop()
        if st.state not in ("created", "running"):
            return {"skipped": f"the job ended {st.state}: {st.error}"}
        got = {"reflow_replication_bytes_total": 0.0,
               "reflow_replication_cpu_seconds_total": 0.0}
        for fam in text_string_to_metric_families(text):
            for smp in fam.samples:
                if smp.name in got:
                    got[smp.name] += smp.value
        summ = sink.summary()
        rows.append({"policy": policy, "seconds": secs,
                     "replication_bytes": got["reflow_replication_bytes_total"],
                     "replication_cpu_s": got["reflow_replication_cpu_seconds_total"],
                     "mb_per_s": got["reflow_replication_bytes_total"] / 1e6 / secs,
                     "cpu_fraction": got["reflow_replication_cpu_seconds_total"] / secs,
                     "mean_ms": summ["mean_ms"], "records_at_sink": summ["count"]})
    base = rows[0]["mean_ms"]
    for r in rows:
        r["mean_over_none"] = tl.ratio(r["mean_ms"], base)
    return {"period_s": a.replication_period, "seconds": secs, "runs": rows}


# ------------------------------------------------------------------------------ summary


def _f(x: float | None, spec: str = ",.1f") -> str:
    return "-" if x is None else format(x, spec)


def summarise(results: dict[str, Any]) -> None:
    runs = {r["protocol"]: r for r in results["runs"]}
    ok = {p: r for p, r in runs.items() if r["status"] == "ok"}
    none = ok.get(NONE)
    none_mean = none["post_request"]["mean_ms"] if none else None
    ratios: dict[str, Any] = {}
    flags: dict[str, str] = {}
    for p, r in ok.items():
        if p == NONE:
            continue
        ref = none_mean if none_mean is not None else r["baseline"]["mean_ms"]
        ratios[f"{p} scaling-period mean / no-rescale mean"] = tl.ratio(r["period"]["mean_ms"], ref)
        # the same run before its request: immune to the drift between runs on a shared
        # machine, but it compares against the old parallelism's latency
        ratios[f"{p} scaling-period mean / its own baseline mean"] = tl.ratio(
            r["period"]["mean_ms"], r["baseline"]["mean_ms"])
    d = ok.get("drrs")
    if d:
        for p, r in ok.items():
            if p in (NONE, "drrs"):
                continue
            ratios[f"drrs peak / {p} peak"] = tl.ratio(d["peak"]["max_ms"], r["peak"]["max_ms"])
            ratios[f"drrs peak p99 / {p} peak p99"] = tl.ratio(d["peak"]["p99_ms"], r["peak"]["p99_ms"])
            key = f"drrs scaling period / {p} scaling period"
            ratios[key] = tl.ratio(d["period"]["seconds"], r["period"]["seconds"])
            capped = [x for x, rr in (("drrs", d), (p, r)) if not rr["period"]["stabilized"]]
            if capped:
                flags[key] = f"{' and '.join(capped)} capped at the end of the run"
            key = f"drrs settle / {p} settle"
            ratios[key] = tl.ratio(d["settle"]["seconds"], r["settle"]["seconds"])
            capped = [x for x, rr in (("drrs", d), (p, r)) if not rr["settle"]["stabilized"]]
            if capped:
                flags[key] = f"{' and '.join(capped)} capped at the end of the run"
            ratios[f"drrs scaling-period mean / {p} scaling-period mean"] = tl.ratio(
                d["period"]["mean_ms"], r["period"]["mean_ms"])
            ratios[f"drrs migration duration / {p} migration duration"] = tl.ratio(
                d["report"]["duration_s"], r["report"]["duration_s"])
    results["ratios"] = ratios
    results["ratio_notes"] = flags
    results["no_rescale_mean_ms"] = none_mean


def markdown(results: dict[str, Any]) -> str:
    c = results["config"]
    lines = [f"### rescale benchmark: `{c['scenario']}`" + (" (quick)" if c["quick"] else ""), "",
             results["scenario"]["description"] + ".", ""]
    cols = ["run", "base ms", "peak ms", "peak p99 ms", "period mean ms", "scaling period s",
            "settle s", "migration s", "suspended s", "propagation s", "MB moved",
            "groups moved", "thrpt dip", "longest gap s", "notes"]
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|" + "|".join("---" if i == 0 or i == len(cols) - 1 else "---:"
                                for i in range(len(cols))) + "|")
    for r in results["runs"]:
        if r["status"] != "ok":
            lines.append(f"| {r['protocol']} |" + " |" * (len(cols) - 2)
                         + f" {r['status']}: {r.get('reason', '')[:160]} |")
            continue
        rep = r.get("report") or {}
        per, st = r["period"], r["settle"]
        notes = []
        if not per["stabilized"]:
            notes.append("period capped at end of run")
        if rep.get("planning_reason"):
            notes.append(f"planning: {rep['planning_reason']}")
        if r.get("note"):
            notes.append(r["note"])
        planned = results["scenario"].get("planned_groups_moved")
        if rep and planned is not None and rep["key_groups_moved"] != planned:
            notes.append(f"moved {rep['key_groups_moved']} of the {planned} groups the "
                         "assignment moves")
        if rep.get("superseded"):
            notes.append("superseded")
        cells = [
            r["protocol"], _f(r["baseline"]["level_ms"]), _f(r["peak"]["max_ms"], ",.0f"),
            _f(r["peak"]["p99_ms"], ",.0f"), _f(per["mean_ms"]),
            f"{per['seconds']}" + ("" if per["stabilized"] else "+"),
            f"{st['seconds']}" + ("" if st["stabilized"] else "+"),
            _f(rep.get("duration_s"), ".2f"), _f(rep.get("suspended_s"), ".2f"),
            _f(rep.get("propagation_delay_s"), ".3f"),
            _f(None if not rep else rep["bytes_moved"] / 1e6),
            "-" if not rep else str(rep["key_groups_moved"]),
            _f(r["dip"]["ratio"], ".2f"), _f(r["longest_gap"]["gap_s"], ".2f"), "; ".join(notes),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Ratios (this run):", ""]
    for k, v in results["ratios"].items():
        note = results["ratio_notes"].get(k)
        lines.append(f"- {k}: {_f(v, '.3f')}" + (f" ({note})" if note else ""))
    o = results.get("overhead")
    if o:
        lines.append("")
        if "skipped" in o:
            lines.append(f"Steady-state overhead of rescaling support: skipped ({o['skipped']}).")
        else:
            lines.append(
                f"Steady-state overhead of rescaling support (micro job at full speed, "
                f"{o['records']:,} records, parallelism {o['parallelism']}, median of "
                f"{len(o['runs']) // 2}): {_f(o['records_per_s_live'], ',.0f')} records/s with "
                f"live rescaling vs {_f(o['records_per_s_without'], ',.0f')} without "
                f"(`live_rescaling=False`): ratio {_f(o['ratio_live_over_without'], '.3f')}, "
                f"overhead {_f(o['overhead_pct'], '.1f')} %.")
    rc = results.get("replication_cost")
    if rc:
        lines.append("")
        if "skipped" in rc:
            lines.append(f"Replication cost: skipped ({rc['skipped']}).")
        else:
            parts = [f"`{r['policy']}` {_f(r['mb_per_s'], ',.1f')} MB/s copied, "
                     f"{_f(100.0 * r['cpu_fraction'], '.1f')} % of a core, mean latency "
                     f"{_f(r['mean_ms'])} ms ({_f(r['mean_over_none'], '.2f')}x)"
                     for r in rc["runs"]]
            lines.append(f"Replication cost in steady state (micro job at its rate, "
                         f"{rc['seconds']:g} s per policy, refreshed every "
                         f"{rc['period_s']:g} s): " + "; ".join(parts) + ".")
    lines += ["", f"Columns: latency in ms at the sink; *base*: median per-second mean before "
              f"the request; *scaling period*: until the per-second mean stays within "
              f"{c['tolerance']:g} x base + {c['slack_ms']:g} ms for {c['stable_s']} s ('+': "
              f"not reached before the end of the run, capped); *settle*: the same against "
              f"max(base, final level); *thrpt dip*: lowest per-second "
              f"sink records/s in the scaling period / baseline records/s; *longest gap*: longest "
              f"time without sink output from the request to the end of the period. Total "
              f"{results['total_seconds']:.0f} s, load average "
              f"{results['machine']['loadavg_at_start'][0]:.1f} -> "
              f"{results['machine']['loadavg_at_end'][0]:.1f} on {results['machine']['cpus']} CPUs.",
              ""]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(12, 8), sharex=True,
                                  gridspec_kw={"height_ratios": [3, 1]})
    nan = float("nan")
    runs = [r for r in results["runs"] if r["status"] == "ok"]
    for i, r in enumerate(runs):
        col = COLORS.get(r["protocol"], f"C{i}")
        tlr = r["timeline"]
        t = [x["t"] for x in tlr]
        ax.plot(t, [nan if x["p99_ms"] is None else x["p99_ms"] for x in tlr], color=col,
                marker=".", lw=1.4, label=r["protocol"])
        ax2.plot(t, [x["count"] for x in tlr], color=col, lw=1.2, label=r["protocol"])
        rep = r.get("report")
        if rep:
            done = rep["completed_at"] - r["requested_at"]
            for a_ in (ax, ax2):
                a_.axvline(done, color=col, ls=":", lw=1.5)
            ax.annotate(f"{r['protocol']} done {rep['duration_s']:.1f} s", (done, 0.97 - 0.06 * i),
                        xycoords=("data", "axes fraction"), fontsize=8, color=col, va="top")
    for a_ in (ax, ax2):
        a_.axvline(0, color="k", lw=1.5)
    ax.annotate("rescale request", (0, 0.02), xycoords=("data", "axes fraction"), fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("p99 latency per wall second, ms (log)")
    ax.legend(fontsize=8)
    ax2.set_ylabel("records at sink / s")
    ax2.set_xlabel("seconds since the rescale request (dotted: rescale completed)")
    m = results["machine"]
    fig.suptitle(f"reflow rescale — {results['config']['scenario']}: "
                 f"{results['scenario']['description']}\n{m['cpus']} CPUs, load "
                 f"{m['loadavg_at_start'][0]:.1f}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None, prog: str | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", choices=SCENARIOS, default="micro")
    ap.add_argument("--protocols", default=None,
                    help=f"comma-separated (default: every one of {','.join(PROTOCOLS)}); the "
                         f"run without rescaling ('{NONE}') is added unless --no-baseline-run")
    ap.add_argument("--no-baseline-run", action="store_true", help="skip the run without rescaling")
    ap.add_argument("--rate", type=float, help="records (NEXMark: events) per second")
    ap.add_argument("--keys", type=int, help="micro/skew: number of keys")
    ap.add_argument("--skew", help="micro/skew: 'uniform' or a Zipf exponent")
    ap.add_argument("--state-bytes", type=int, default=10_000, help="padding bytes per key")
    ap.add_argument("--key-groups", type=int, default=128)
    ap.add_argument("--linger-ms", type=float, default=LINGER_MS,
                    help="JobConfig(linger_ms=n): how long a channel holds records before "
                         f"sending a frame ({LINGER_MS:g}; the engine's default is "
                         f"{JobConfig().linger_ms:g}: see the module docstring)")
    ap.add_argument("--transport", choices=("tcp", "ray"), default=JobConfig.transport,
                    help="JobConfig(transport=...): data frames over direct sockets (tcp, "
                         "the default) or as one Ray actor call each (ray)")
    ap.add_argument("--service-us", type=float,
                    help="micro/skew: per-record service time of each aggregator task, "
                         "slept (a task serves at most 1e6/n records/s without using a "
                         "core): micro and micro-in 1000 (quick 300), skew 0; 0 makes the "
                         "run CPU-bound")
    ap.add_argument("--from", dest="from_p", type=int, help="start parallelism")
    ap.add_argument("--to", dest="to_p", type=int, help="target parallelism")
    ap.add_argument("--size-ms", type=int, default=2000, help="q7/q8 window size")
    ap.add_argument("--slide-ms", type=int, default=500, help="q7/q8 window slide")
    ap.add_argument("--build", type=float, help="seconds of state building (12; quick 2)")
    ap.add_argument("--baseline", type=float, help="baseline seconds before the request (8; quick 3)")
    ap.add_argument("--after", type=float, help="seconds after the rescale returned (12; quick 5)")
    ap.add_argument("--stable", type=int, help="stability window, s (5; quick 2)")
    ap.add_argument("--tolerance", type=float, default=1.10, help="stable: mean <= this x baseline")
    ap.add_argument("--slack-ms", type=float, default=5.0,
                    help="added to the stability limit (absorbs per-second jitter; 0: strict)")
    ap.add_argument("--warm-standby", type=int,
                    help="JobConfig(warm_standby_tasks=n): new tasks come from n idle actors "
                         "started with the job (the pool is not refilled within a run); "
                         "default: as many as the scale-out adds (0: cold actor starts)")
    ap.add_argument("--set-aside-cap", type=int, default=200,
                    help="JobConfig(drrs_set_aside_cap=n): records a task sets aside")
    ap.add_argument("--max-subscales", type=int, default=2,
                    help="JobConfig(drrs_max_subscales_per_task=n)")
    ap.add_argument("--max-subscales-total", type=int,
                    help="JobConfig(drrs_max_subscales=n): subscales of the operator at once "
                         "(default: as many as the cluster's CPUs)")
    ap.add_argument("--subscale-size", type=int, default=4,
                    help="JobConfig(drrs_subscale_size=n): key groups per subscale")
    ap.add_argument("--subscale-bytes", type=int, default=JobConfig.drrs_subscale_bytes,
                    help="JobConfig(drrs_subscale_bytes=n): state per subscale (0: no budget)")
    ap.add_argument("--overhead", dest="overhead", action="store_true", default=None,
                    help="measure the steady-state overhead (default: on)")
    ap.add_argument("--no-overhead", dest="overhead", action="store_false")
    ap.add_argument("--replication-cost", dest="replication_cost", action="store_true",
                    default=None, help="measure what keeping replicas costs in steady state "
                                       "(default: on; micro jobs only)")
    ap.add_argument("--no-replication-cost", dest="replication_cost", action="store_false")
    ap.add_argument("--replication-seconds", type=float,
                    help="seconds per replication policy (15; quick 5)")
    ap.add_argument("--replication-period", type=float, default=JobConfig.replication_period_s,
                    help="JobConfig(replication_period_s=...) for that measurement")
    ap.add_argument("--overhead-records", type=int)
    ap.add_argument("--overhead-repeats", type=int)
    ap.add_argument("--quick", action="store_true", help="small, short smoke run (~1-2 min)")
    ap.add_argument("--out", help="output directory (default examples/bench/out/rescale/<scenario>)")
    args = ap.parse_args(argv)
    q = 1 if args.quick else 0
    for k, v in DEFAULTS[args.scenario].items():
        if getattr(args, k, None) is None:
            setattr(args, k, v[q])
    for k, v in TIMING.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v[q])
    if args.service_us is None:
        args.service_us = 0.0
    if args.keys is None:
        args.keys = 20_000
    if args.skew is None:
        args.skew = "uniform"
    if args.to_p is None:
        args.to_p = args.from_p
    if args.warm_standby is None:
        args.warm_standby = max(0, args.to_p - args.from_p)
    if args.overhead is None:
        args.overhead = True
    if args.replication_cost is None:
        args.replication_cost = not args.quick
    args.protocols = ([p.strip() for p in args.protocols.split(",") if p.strip()]
                      if args.protocols else list(PROTOCOLS))
    if NONE in args.protocols:
        args.protocols.remove(NONE)
    args.out = args.out or os.path.join(OUT_ROOT, args.scenario)
    if args.scenario in ("micro", "micro-in", "skew"):
        parse_skew(args.skew)
    if not 1 <= args.from_p <= args.key_groups or not 1 <= args.to_p <= args.key_groups:
        ap.error("parallelism must be between 1 and --key-groups")
    return args


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = parse_args(argv, prog)
    t_all = time.monotonic()
    sc = Scenario(args)
    os.makedirs(args.out, exist_ok=True)
    config = JobConfig(warm_standby_tasks=args.warm_standby, warm_standby_refill_s=3600.0,
                       linger_ms=args.linger_ms, transport=args.transport,
                       drrs_set_aside_cap=args.set_aside_cap,
                       drrs_max_subscales_per_task=args.max_subscales,
                       drrs_max_subscales=args.max_subscales_total,
                       drrs_subscale_size=args.subscale_size,
                       drrs_subscale_bytes=args.subscale_bytes or None)
    names = ([] if args.no_baseline_run else [NONE]) + args.protocols
    print(f"rescale benchmark '{args.scenario}': {sc.describe()}", flush=True)
    print(f"runs: {', '.join(names)}; per run build {args.build:g} s, baseline "
          f"{args.baseline:g} s, after {args.after:g} s", flush=True)
    per_run = 5.0 + args.build + args.baseline + args.after
    planned = sum(per_run + (RESCALE_GUESS_S if p != NONE else 0.0)
                  for p in names if p == NONE or p in PROTOCOLS)
    if args.overhead and not sc.nexmark:
        planned += 2 * args.overhead_repeats * (4.0 + args.overhead_records / 150_000)
    if args.replication_cost and not sc.nexmark:
        planned += len(REPLICATION_POLICIES) * (args.replication_seconds + 5.0)
    results: dict[str, Any] = {
        "command": "python examples/bench/rescale.py " + " ".join(
            sys.argv[1:] if argv is None else argv),
        "config": {k: v for k, v in vars(args).items()} | {
            "stable_s": args.stable, "seed": SEED,
            "job_config": {k: getattr(config, k) for k in config.__dataclass_fields__}},
        "scenario": {"name": args.scenario, "operator": sc.op, "action": sc.action,
                     "description": sc.describe(), **sc.info},
        "definitions": {
            "latency": "sink arrival - record timestamp (GeneratorSource: scheduled emission "
                       "time; NEXMark window results: window end), ms, per wall second",
            "baseline": "the `baseline` whole seconds before the request second; level_ms: the "
                        "median of their per-second means",
            "scaling_period": "[request second, first second s >= completion second from which "
                              "`stable_s` seconds all have mean <= tolerance x baseline level + "
                              "slack_ms), capped at the end of the run (stabilized false)",
            "settle": "as scaling_period, against max(baseline level, level of the last "
                      "`stable_s` seconds)",
            "peak": "max_ms: highest latency of a record in the scaling period; p99_ms: "
                    "highest per-second p99 in it",
            "dip": "lowest records/s at the sink in a second of the scaling period / baseline "
                   "records/s (a second without output counts 0)",
            "longest_gap": "longest time without any sink write overlapping [request, max(end "
                           "of scaling period, completion)] (50 ms resolution)",
            "no_rescale_mean": "the `none` run's mean latency from its (virtual) request to "
                               "its end",
        },
        "code": code_state(ROOT),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "ray": ray.__version__, "loadavg_at_start": os.getloadavg()},
        "protocols_available": list(PROTOCOLS),
        "runs": [],
    }
    progress = Progress(planned, len(names))
    ray.init(namespace="reflow", log_to_driver=True, configure_logging=False)
    try:
        for k, p in enumerate(names, 1):
            if p != NONE and p not in PROTOCOLS:
                results["runs"].append({
                    "protocol": p, "status": "skipped",
                    "reason": f"not in migration.protocols.PROTOCOLS ({', '.join(PROTOCOLS)})"})
                continue
            r = run_one(sc, p, config, progress, k, len(names))
            results["runs"].append(r)
            if r["status"] != "ok":
                print(f"\n{p}: {r['status']}: {r.get('reason')}", file=sys.stderr, flush=True)
        if args.overhead:
            results["overhead"] = overhead(sc, progress)
        if args.replication_cost:
            results["replication_cost"] = replication_cost(sc, progress)
    finally:
        progress.close()
        ray.shutdown()
    results["total_seconds"] = time.monotonic() - t_all
    results["machine"]["loadavg_at_end"] = os.getloadavg()
    summarise(results)
    md = markdown(results)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(md)
    plot(results, os.path.join(args.out, "timeline.png"))
    print()
    print(md)
    rel = os.path.relpath(args.out, ROOT)
    print(f"wrote {rel}/results.json, {rel}/summary.md, {rel}/timeline.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
