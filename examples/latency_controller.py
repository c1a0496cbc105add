"""A controller written outside the engine: keep the end-to-end latency under an SLO.

    python examples/latency_controller.py                      # 1,500 records/s, SLO 500 ms
    python examples/latency_controller.py --rate 3000 --slo-ms 200 --duration 60

Trisk's latency-aware controller in a few lines (``LatencySLO`` below): every
``--interval`` seconds it reads the p99 latency of the markers that reached the sinks in
the last window and the busiest task's utilisation of the keyed operator; it adds a task
when the latency is over the SLO and the operator is busy, and removes one when the latency
has stayed under a quarter of the SLO with the operator mostly idle for ``--calm`` seconds.
It knows nothing of the engine's insides: it returns ``Scale``/``NoChange`` decisions and
the JobMaster carries them out (live, drrs).

The job: an open-loop generator (``--rate`` records/s, ``--keys`` keys) -> a keyed count
whose every record costs ``--service-us`` microseconds (so one task serves 1e6 /
service-us records/s and parallelism matters) -> a latency sink. It starts at
``--parallelism`` tasks, runs ``--duration`` seconds and prints the controller's decisions
and the latency before and after its last rescale.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from controllers import Controller, NoChange, Scale  # noqa: E402
from engine import JobConfig, LatencySink  # noqa: E402
from examples.bench.harness.jobs import PaddedCount, generator, keyed_count_job  # noqa: E402
from examples.bench.harness.run import init_ray  # noqa: E402


class LatencySLO(Controller):
    """One task more when the sinks' p99 latency exceeds ``slo_ms`` and ``operator``'s
    busiest task works more than ``busy`` of the time; one task less after ``calm_s``
    seconds with the p99 under a quarter of the SLO and the busiest task under ``idle``."""

    def __init__(self, operator: str, slo_ms: float, max_parallelism: int, calm_s: float = 10.0,
                 busy: float = 0.8, idle: float = 0.4, interval_s: float = 2.0,
                 window_s: float = 4.0) -> None:
        self.operator, self.slo_ms, self.max_parallelism = operator, slo_ms, max_parallelism
        self.calm_s, self.busy, self.idle = calm_s, busy, idle
        self.interval_s, self.window_s = interval_s, window_s
        self.name = "latency-slo"
        self.calm_since: float | None = None

    def decide(self, metrics: Any, view: Any) -> Any:
        if view.rescaling or view.finishing:
            return NoChange("a rescale runs, or the input ends")
        rates = metrics.operator(self.operator)
        if rates is None or metrics.latency.count == 0:
            return NoChange("nothing measured yet")
        p = view.operator(self.operator).parallelism
        p99, busiest = metrics.latency.quantile(0.99), rates.max_utilisation
        seen = f"p99 {p99:,.0f} ms, busiest task {busiest:.0%} busy at p={p}"
        if p99 > self.slo_ms and busiest > self.busy and p < self.max_parallelism:
            self.calm_since = None
            return Scale(self.operator, p + 1, reason=f"over the SLO of {self.slo_ms:g} ms: {seen}")
        if p99 < self.slo_ms / 4 and busiest < self.idle and p > 1:
            self.calm_since = self.calm_since if self.calm_since is not None else view.now
            if view.now - self.calm_since >= self.calm_s:
                self.calm_since = None
                return Scale(self.operator, p - 1, reason=f"calm for {self.calm_s:g} s: {seen}")
            return NoChange(f"calm for {view.now - self.calm_since:.0f} s: {seen}")
        self.calm_since = None
        return NoChange(seen)


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
    ap.add_argument("--duration", type=float, default=40.0, help="seconds to run (default 40)")
    ap.add_argument("--key-groups", type=int, default=64, help="key groups (default 64)")
    args = ap.parse_args(argv)

    init_ray()
    sink = LatencySink()
    source = generator(rate=args.rate, keys=args.keys, zipf=None, state_bytes=64,
                       num_records=int(args.rate * args.duration))
    job = keyed_count_job("latency-slo", source, sink, parallelism=args.parallelism,
                          key_groups=args.key_groups, config=JobConfig(),
                          function=PaddedCount(args.service_us))
    controller = LatencySLO("agg", args.slo_ms, args.max_parallelism, args.calm,
                            interval_s=args.interval, window_s=2 * args.interval)
    started = time.time()
    with job.run(controllers=[controller]) as handle:
        print(f"job {handle.job_id} running; metrics at {handle.metrics_url}")
        handle.wait()
        decisions = [d for d in handle.decisions() if d.outcome != "no-change"]
    print(f"decisions of {controller.name} (no-change ones left out):")
    for d in decisions:
        print(f"  {d.at - started:6.1f} s  {d.decision}: {d.outcome} ({d.reason})")
    timeline = sink.timeline()
    if timeline:
        last = max((d.at + d.seconds for d in decisions if d.outcome == "executed"),
                   default=started)
        after = [row for row in timeline if row["second"] >= last]
        before = [row for row in timeline if row["second"] < last]
        for what, rows in (("before its last rescale", before), ("after it", after)):
            if rows:
                worst = max(r["p99_ms"] for r in rows)
                print(f"latency {what}: worst per-second p99 {worst:,.0f} ms over {len(rows)} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
