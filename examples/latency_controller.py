"""A controller written outside the engine: keep the end-to-end latency under an SLO.

    python examples/latency_controller.py                      # 1,500 records/s, SLO 500 ms
    python examples/latency_controller.py --rate 3000 --slo-ms 200 --duration 60

Trisk's latency-aware controller in a few lines (``LatencySLO`` below): every
``--interval`` seconds it estimates the end-to-end latency of the last window as the p99
of the latency markers that reached the sinks (the time records queue inside the job)
plus the source's lag (the records due at the open-loop source and not read yet, divided
by the rate it reads them: the time a record due now waits before it enters the job); it
adds a task to the keyed operator when that is over the SLO, its busiest task is busy
and the lag is not draining fast, and removes one when the latency has stayed under a
quarter of the SLO with the operator mostly idle for ``--calm`` seconds. It knows nothing
of the engine's insides: it returns ``Scale``/``NoChange`` decisions and the JobMaster
carries them out (live, drrs).

Why the source's lag: a source behind its schedule holds back what it cannot send, so the
markers (stamped when a record is read) only see the queue inside the job, which credits
bound; an SLO controller on markers alone saw ~1 s while records waited 30 s at the
source, and scaled once, after 70 s.

The job: an open-loop generator (``--rate`` records/s, ``--keys`` keys) -> a keyed count
whose every record costs ``--service-us`` microseconds (so one task serves 1e6 /
service-us records/s and parallelism matters) -> a latency sink and an output sink. It
starts at ``--parallelism`` tasks, runs ``--duration`` seconds of input and prints the
controller's decisions and the latency before and after its last rescale. The verdict:
``result: OK`` when the controller rescaled the operator and the output is exact (every
key's counts 1, 2, ..., n in order, n its records in the generator's input, computed
apart); ``result: MISMATCH`` (exit 1) otherwise, saying what differs, and also when no
rescale ran (the example shows a controller at work).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from controllers import Controller, NoChange, Scale  # noqa: E402
from engine import JobConfig, LatencySink, StreamJob, TestingSink  # noqa: E402
from examples.bench.harness.jobs import (  # noqa: E402
    PaddedCount,
    generator,
    generator_keys,
    key_of,
)
from examples.bench.harness.run import init_ray  # noqa: E402


class LatencySLO(Controller):
    """One task more when the estimated end-to-end p99 latency (markers' p99 + the source's
    lag) exceeds ``slo_ms``, ``operator``'s busiest task works more than ``busy`` of the
    time and the lag does not drain within a window; one task less after ``calm_s``
    seconds with the latency under a quarter of the SLO and the busiest task under
    ``idle``. ``source``: the operator whose backlog is the lag."""

    def __init__(self, operator: str, source: str, slo_ms: float, max_parallelism: int,
                 calm_s: float = 10.0, busy: float = 0.8, idle: float = 0.4,
                 interval_s: float = 2.0, window_s: float = 4.0) -> None:
        self.operator, self.source = operator, source
        self.slo_ms, self.max_parallelism = slo_ms, max_parallelism
        self.calm_s, self.busy, self.idle = calm_s, busy, idle
        self.interval_s, self.window_s = interval_s, window_s
        self.name = "latency-slo"
        self.calm_since: float | None = None

    def lag(self, metrics: Any) -> tuple[float, float | None]:
        """(the source's lag in ms: its backlog over the rate it reads, 0 without one;
        seconds until the backlog is gone at the rate it shrinks, None when it does not)."""
        src = metrics.operator(self.source)
        backlog = (src.source_backlog or 0) if src is not None else 0
        if not backlog:
            return 0.0, None
        read, growth = src.observed_output_rate, src.backlog_growth
        drain = backlog / -growth if growth is not None and growth < 0 else None
        return (1000.0 * backlog / read if read > 0 else float("inf")), drain

    def decide(self, metrics: Any, view: Any) -> Any:
        if view.rescaling or view.finishing:
            return NoChange("a rescale runs, or the input ends")
        rates = metrics.operator(self.operator)
        if rates is None or (metrics.latency.count == 0 and rates.records_in == 0):
            return NoChange("nothing measured yet")
        p = view.operator(self.operator).parallelism
        markers = metrics.latency.quantile(0.99) if metrics.latency.count else 0.0
        lag, drain_s = self.lag(metrics)
        latency, busiest = markers + lag, rates.max_utilisation
        seen = (f"latency {latency:,.0f} ms (markers' p99 {markers:,.0f} + source lag "
                f"{lag:,.0f}), busiest task {busiest:.0%} busy at p={p}")
        if latency > self.slo_ms and busiest > self.busy and p < self.max_parallelism:
            self.calm_since = None
            if drain_s is not None and drain_s <= self.window_s:
                return NoChange(f"over the SLO but the lag drains within {drain_s:.1f} s: "
                                f"{seen}")
            return Scale(self.operator, p + 1,
                         reason=f"over the SLO of {self.slo_ms:g} ms: {seen}")
        if latency < self.slo_ms / 4 and busiest < self.idle and p > 1:
            self.calm_since = self.calm_since if self.calm_since is not None else view.now
            if view.now - self.calm_since >= self.calm_s:
                self.calm_since = None
                return Scale(self.operator, p - 1, reason=f"calm for {self.calm_s:g} s: {seen}")
            return NoChange(f"calm for {view.now - self.calm_since:.0f} s: {seen}")
        self.calm_since = None
        return NoChange(seen)


def expected_counts(num_records: int, keys: int) -> dict[int, int]:
    """Records per key in the generator's input, computed apart from the job (the
    generator's own key sequence, read on a manual clock)."""
    return dict(Counter(int(k) for k in generator_keys(num_records, keys=keys, zipf=None)))


def verdict(outputs: list[Any], expected: dict[int, int]) -> list[str]:
    """What differs from the exact output (empty: exact): every key's counts are 1, 2,
    ..., n in order, n its records in the input."""
    seqs: dict[Any, list[int]] = {}
    for key, count in outputs:
        seqs.setdefault(key, []).append(count)
    bad = sorted((k for k in set(seqs) | set(expected)
                  if seqs.get(k, []) != list(range(1, expected.get(k, 0) + 1))), key=repr)
    if not bad:
        return []
    shown = "; ".join(f"key {k}: {len(seqs.get(k, []))} outputs, want {expected.get(k, 0)}"
                      f"{'' if len(seqs.get(k, [])) != expected.get(k, 0) else ' (out of order)'}"
                      for k in bad[:3])
    return [f"{len(bad)} of {len(expected)} keys differ (e.g. {shown}); "
            f"{len(outputs):,} outputs for {sum(expected.values()):,} records"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=1500.0, help="records/s (default 1500)")
    ap.add_argument("--keys", type=int, default=1000, help="distinct keys (default 1000)")
    ap.add_argument("--service-us", type=float, default=1000.0,
                    help="cost of a record in the count, microseconds (default 1000)")
    ap.add_argument("--parallelism", type=int, default=1, help="tasks at the start (default 1)")
    ap.add_argument("--max-parallelism", type=int, default=6, help="at most (default 6)")
    ap.add_argument("--slo-ms", type=float, default=500.0, help="p99 latency SLO (default 500)")
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between decisions")
    ap.add_argument("--calm", type=float, default=10.0,
                    help="seconds of low latency and load before a task is removed")
    ap.add_argument("--duration", type=float, default=40.0,
                    help="seconds of input at --rate (default 40)")
    ap.add_argument("--key-groups", type=int, default=64, help="key groups (default 64)")
    args = ap.parse_args(argv)

    init_ray()
    num_records = int(args.rate * args.duration)
    latency, out = LatencySink(), TestingSink()
    source = generator(rate=args.rate, keys=args.keys, zipf=None, state_bytes=64,
                       num_records=num_records)
    # batches of 100: a task's input queue (credits x batch) holds 0.4 s of work at 1 ms a
    # record, not 4 s, so a live rescale's barriers pass it quickly; a warm standby
    # actor: a scale-out takes it instead of starting a worker process
    job = StreamJob("latency-slo", num_key_groups=args.key_groups,
                    parallelism=args.parallelism,
                    config=JobConfig(batch_size=100, warm_standby_tasks=1))
    counts = (job.source(source, name="gen").key_by(key_of)
              .process(PaddedCount(args.service_us), name="agg"))
    counts.sink(latency, name="sink")
    counts.sink(out, name="out")
    controller = LatencySLO("agg", "gen", args.slo_ms, args.max_parallelism, args.calm,
                            interval_s=args.interval, window_s=2 * args.interval)
    asked = time.time()
    with job.run(controllers=[controller]) as handle:
        started = time.time()
        print(f"job {handle.job_id} running (deployed in {started - asked:.1f} s); metrics at "
              f"{handle.metrics_url}")
        handle.wait()
        decisions = [d for d in handle.decisions() if d.outcome != "no-change"]
    print(f"decisions of {controller.name} (no-change ones left out; seconds since the job "
          "runs, when decided, and how long carrying it out took):")
    for d in decisions:
        print(f"  {d.at - d.seconds - started:6.1f} s  {d.decision}: {d.outcome} in "
              f"{d.seconds:.1f} s ({d.reason})")
    executed = [d for d in decisions if d.outcome == "executed"]
    timeline = latency.timeline()
    if timeline:
        last = max((d.at for d in executed), default=started)
        after = [row for row in timeline if row["second"] >= last]
        before = [row for row in timeline if row["second"] < last]
        for what, rows in (("before its last rescale", before), ("after it", after)):
            if rows:
                worst = max(r["p99_ms"] for r in rows)
                print(f"latency {what}: worst per-second p99 {worst:,.0f} ms over {len(rows)} s")
    problems = verdict(out.results(), expected_counts(num_records, args.keys))
    if not executed:
        problems.append(f"the controller rescaled nothing ({len(decisions)} decisions other "
                        "than no-change): this example shows a rescale, and none ran")
    for p in problems:
        print(f"  {p}")
    print(f"result: OK (rescaled {len(executed)} time{'s' if len(executed) != 1 else ''}; "
          f"{num_records:,} records, every key's counts exact)" if not problems
          else "result: MISMATCH")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
