"""Run as a script by ``tests/test_multinode_on_ray.py`` (a second Ray cluster cannot share
the test session's process): a running sum on a two-node ``ray.cluster_utils.Cluster``
whose tasks take a whole CPU each, so they must spread over both nodes, rescaled live
(drrs) from 2 to 3 tasks while the source holds at record 1,500 (so input is left);
frames cross the nodes over the TCP transport. Argument: the ``JobConfig.data_host`` to
use. Prints ``OK`` when the output equals the plain-Python reference."""

from __future__ import annotations

import dataclasses
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from engine.testing import TestingSink  # noqa: E402
from tests.jobs import (  # noqa: E402
    SMALL,
    Moment,
    check_reports,
    per_key,
    running_sum_job,
    running_sum_reference,
)


def main(data_host: str) -> int:
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, namespace="reflow", configure_logging=False,
             log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": ROOT}})
    try:
        rng = random.Random(3)
        records = [(rng.randrange(40), rng.randrange(10)) for _ in range(6000)]
        sink = TestingSink()
        cfg = dataclasses.replace(SMALL, task_num_cpus=1, data_host=data_host)
        moment = Moment.at(1500, 1500, len(records))
        h = running_sum_job(records, 2, sink, rate=3000, config=cfg, gates=moment.gates).run()

        def rescale() -> None:
            report = h.rescale("sum", 3)
            assert report.new_parallelism == 3
            check_reports([report])
            # source + 3 sum tasks at 1 CPU each take all 4 CPUs: both 2-CPU nodes hold tasks
            free = ray.available_resources().get("CPU", 0.0)
            assert free < 1.0, f"{free} CPUs free: the tasks did not fill both nodes"

        moment.run(h, rescale, job_timeout=120)
        assert per_key(sink.results()) == per_key(running_sum_reference(records)), "wrong output"
        print(f"OK {len(ray.nodes())} nodes", flush=True)
        return 0
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1"))
