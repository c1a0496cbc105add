"""The keyed running count in Bytewax, for ``steady.py``'s side-by-side figure.

Why a module of its own: Bytewax is not a dependency of reflow (``pip install bytewax``
for this comparison only); it runs in a child process (``python -m
examples.bench.harness.bytewax_count N KEYS ZIPF``) so its CPU time is measured alone and a
missing Bytewax costs nothing but a message.

What it runs: the same keys as ``steady.py``'s generator (``jobs.generator_keys``),
pre-generated in memory (not timed), through ``input -> key_on -> stateful_map (running
count) -> output`` on one Bytewax worker (``run_main``, epochs of 1 s: its default 10 s kept a 200k-record
run waiting for the epoch to close, 12.5 s of wall time for 1.4 s of CPU), batches of 1,000; the output
operator only counts. It prints one JSON line: records, wall seconds, CPU seconds of the
process over the run, records/s and records per CPU-second.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from datetime import timedelta
from typing import Any


def available() -> str | None:
    """None when Bytewax imports, else the reason it does not."""
    try:
        import bytewax  # noqa: F401
    except ImportError as exc:
        return f"bytewax is not installed ({exc}); pip install bytewax to compare"
    return None


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run(records: int, keys: int, zipf: float) -> dict[str, Any]:
    import bytewax.operators as op
    from bytewax.dataflow import Dataflow
    from bytewax.outputs import DynamicSink, StatelessSinkPartition
    from bytewax.testing import TestingSource, run_main

    from examples.bench.harness import jobs

    data = [(str(k), 1) for k in jobs.generator_keys(records, keys=keys, zipf=zipf).tolist()]
    seen = [0]

    class _Part(StatelessSinkPartition):
        def write_batch(self, items: list[Any]) -> None:
            seen[0] += len(items)

    class _Count(DynamicSink):
        def build(self, step_id: str, worker_index: int, worker_count: int) -> _Part:
            return _Part()

    def count(state: Any, _value: Any) -> tuple[int, int]:
        n = (state or 0) + 1
        return n, n

    flow = Dataflow("keyed-count")
    s = op.input("in", flow, TestingSource(data, batch_size=1000))
    keyed = op.key_on("key", s, lambda r: r[0])
    counted = op.stateful_map("count", keyed, count)
    op.output("out", counted, _Count())
    c0, t0 = _cpu(), time.perf_counter()
    run_main(flow, epoch_interval=timedelta(seconds=1))
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    return {"records": len(data), "records_out": seen[0], "wall_s": wall, "cpu_s": cpu,
            "records_per_s": len(data) / wall, "records_per_cpu_s": len(data) / cpu}


if __name__ == "__main__":
    print(json.dumps(run(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))))
