"""A driver for ``tests/integration/test_detached_jobs.py``, run as a script (its own
process, a Ray job of its own on the test's cluster, ``RAY_ADDRESS``; or submitted with
Ray's job submission, its working directory the checkout):

    python tests/detached_job.py --name NAME --gate DIR --out DIR --checkpoints DIR

Starts a checkpointing running sum per key (``build``) whose source holds at record
``HOLD`` until the gate in DIR is opened (``SourceGate`` works across processes), prints
``job <id> detached=<bool>`` and exits without stopping it: ``job.run()`` reads
``REFLOW_DETACHED`` (``reflow run --detached`` sets it), so a detached job runs on and an
attached one ends with this process. The sink is a ``TestingSink`` in ``--out``, which the
test reads back.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from engine import JobConfig, StreamJob  # noqa: E402
from engine.io.testing import SourceGate, TestingSink, TestingSource  # noqa: E402
from engine.spark.jobs import key_of, sum_second  # noqa: E402

RECORDS = [(f"k{i % 37}", i % 5) for i in range(3000)]
HOLD = 1000  # the source holds here until the gate opens
RATE = 2000.0


def build(name: str, gate: SourceGate, sink: TestingSink, checkpoints: str) -> StreamJob:
    """The job: ``RECORDS`` held at ``gate``, summed per key, into ``sink``; a checkpoint
    every 0.3 s into ``checkpoints``."""
    job = StreamJob(name, num_key_groups=32, parallelism=2,
                    config=JobConfig(batch_size=50, linger_ms=2, metrics_port=None,
                                     checkpoint_interval_s=0.3, checkpoint_dir=checkpoints))
    (job.source(TestingSource(RECORDS, rate=RATE, gate=gate), name="src", parallelism=1)
        .key_by(key_of)
        .reduce(sum_second, name="sum")
        .sink(sink, name="out"))
    return job


def main() -> int:
    import ray

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--gate", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--checkpoints", required=True)
    args = ap.parse_args()
    if "RAY_JOB_CONFIG_JSON_ENV_VAR" not in os.environ:  # not submitted with ray job submit:
        # this driver's workers import engine from the checkout (it is not installed)
        ray.init(address=os.environ["RAY_ADDRESS"], namespace="reflow", log_to_driver=False,
                 configure_logging=False, runtime_env={"env_vars": {"PYTHONPATH": ROOT}})
    handle = build(args.name, SourceGate(HOLD, args.gate), TestingSink(args.out),
                   args.checkpoints).run()
    print(f"job {handle.job_id} detached={handle.status().detached}", flush=True)
    return 0  # without stop(): an attached job ends with this process, a detached one not


if __name__ == "__main__":
    sys.exit(main())
