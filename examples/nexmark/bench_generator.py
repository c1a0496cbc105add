"""Measure the NEXMark generator's single-core speed.

    python examples/nexmark/bench_generator.py [--events 1000000] [--batch 65536]

Reports events/s (wall and process CPU time) for columnar generation (``events``), for
generation plus conversion to Python tuples (``to_records``), and for generation plus
conversion to Arrow tables.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from examples.nexmark.generator import NexmarkConfig, NexmarkGenerator  # noqa: E402


def _measure(label: str, events: int, run) -> None:
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"{label:<28} {wall:7.3f}s wall {events / wall:>12,.0f} ev/s   "
          f"{cpu:7.3f}s cpu {events / cpu:>12,.0f} ev/s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=65_536)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    n = args.events

    def run(convert) -> None:
        generator = NexmarkGenerator(NexmarkConfig(seed=args.seed))
        for batch in generator.batches(args.batch, 0, n):
            convert(batch)

    _measure("events (numpy columns)", n, lambda: run(lambda b: None))
    _measure("events + to_records", n, lambda: run(lambda b: b.to_records()))
    _measure("events + to_events", n, lambda: run(lambda b: b.to_events()))
    _measure("events + to_arrow", n,
             lambda: run(lambda b: [b.by_kind(k).to_arrow() for k in range(3)]))
    generator = NexmarkGenerator(NexmarkConfig(seed=args.seed))
    _measure("one events(0, n) call", n, lambda: generator.events(0, n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
