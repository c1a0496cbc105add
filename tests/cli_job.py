"""A small keyed job for the CLI and cluster tests, run as a script (its own driver):

    python tests/cli_job.py [--records N] [--gate DIR] [--name NAME]

Running sums per key over a ``TestingSource``; with ``--gate DIR`` the source holds after a
quarter of its records until the gate in DIR is opened (``engine.io.testing.SourceGate``
works across processes), so a test can act on the running job from another process. Prints
the job id, then ``result: OK`` when every key's final sum equals the plain-Python one, and
exits 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import JobConfig, StreamJob  # noqa: E402
from engine.io.testing import SourceGate, TestingSink, TestingSource  # noqa: E402
from engine.spark.jobs import key_of, sum_second  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=4000)
    ap.add_argument("--gate", default=None, help="SourceGate directory (held at records/4)")
    ap.add_argument("--name", default="cli-job")
    args = ap.parse_args()
    records = [(f"k{i % 37}", i % 5) for i in range(args.records)]
    gate = SourceGate(args.records // 4, args.gate) if args.gate else None
    sink = TestingSink()
    job = StreamJob(args.name, num_key_groups=32, parallelism=2,
                    config=JobConfig(batch_size=50, linger_ms=2))
    (job.source(TestingSource(records, rate=2000, gate=gate), name="src", parallelism=1)
        .key_by(key_of)
        .reduce(sum_second, name="sum")
        .sink(sink, name="out"))
    with job.run() as handle:
        print(f"job {handle.job_id} running; metrics at {handle.metrics_url}", flush=True)
        handle.wait()
    expected: dict[str, int] = {}
    for k, v in records:
        expected[k] = expected.get(k, 0) + v
    got: dict[str, int] = {}
    for k, v in sink.results():  # running sums never decrease: the largest is the total
        got[k] = max(got.get(k, 0), v)
    ok = got == expected
    print(f"records: {len(records)}; keys: {len(got)}")
    print("result: OK" if ok else "result: MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
