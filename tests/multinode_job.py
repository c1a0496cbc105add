"""Run as a script by ``tests/test_multinode_on_ray.py`` (a second Ray cluster cannot share
the test session's process), on a two-node ``ray.cluster_utils.Cluster``:

* ``rescale`` (default): a running sum whose tasks take a whole CPU each, so they must
  spread over both nodes, rescaled live (drrs) from 2 to 3 tasks while the source holds at
  record 1,500 (so input is left); frames cross the nodes over the TCP transport;
* ``place``: a running sum with 2 tasks; task 0 is moved live to the node it does not run
  on (``handle.place``), then task 1 by a controller's ``Place`` decision, each while the
  source holds with input left.

Arguments: the ``JobConfig.data_host`` to use, then the mode. Prints ``OK`` when the output
equals the plain-Python reference."""

from __future__ import annotations

import dataclasses
import os
import random
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from controllers.base import Controller, NoChange, Place  # noqa: E402
from engine.io.testing import TestingSink  # noqa: E402
from tests.jobs import (  # noqa: E402
    SMALL,
    Moment,
    check_reports,
    gates_of,
    moments,
    per_key,
    running_sum_job,
    running_sum_reference,
    wait_until,
)


class PlaceOnce(Controller):
    """Moves task ``index`` of ``operator`` to ``node`` once."""

    interval_s = 0.2
    window_s = 1.0

    def __init__(self, operator: str, index: int, node: str) -> None:
        self.operator, self.index, self.node, self.done = operator, index, node, False

    def decide(self, metrics: Any, view: Any) -> Any:
        if self.done:
            return NoChange("placed")
        self.done = True
        return Place(self.operator, self.index, self.node, reason="the test asks")


def place(h: Any, moments: list[Moment]) -> None:
    """Task 0 to the other node by the handle, then task 1 by a controller."""
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == 2, nodes

    def by_handle() -> None:
        before = h.placement("sum")
        other = next(n for n in nodes if n != before[0])
        report = h.place("sum", 0, other)
        assert (report.old_parallelism, report.new_parallelism) == (2, 2), report
        assert report.key_groups_moved == report.key_groups_planned == 16, report
        after = h.placement("sum")
        assert after == [other, before[1]], (before, after)

    def by_controller() -> None:
        before = h.placement("sum")
        other = next(n for n in nodes if n != before[1])
        h.add_controller(PlaceOnce("sum", 1, other))
        wait_until(lambda: any(d.kind == "place" and d.outcome == "executed"
                               for d in h.decisions()), "the controller's placement", h)
        assert h.placement("sum") == [before[0], other]
        assert [d.outcome for d in h.decisions() if d.kind == "place"] == ["executed"]

    moments[0].act(h, by_handle)
    moments[1].act(h, by_controller)


def main(data_host: str, mode: str = "rescale") -> int:
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, namespace="reflow", configure_logging=False,
             log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": ROOT}})
    try:
        rng = random.Random(3)
        records = [(rng.randrange(40), rng.randrange(10)) for _ in range(6000)]
        sink = TestingSink()
        if mode == "place":
            cfg = dataclasses.replace(SMALL, data_host=data_host, metrics_poll_interval_s=0.25)
            plan = moments(len(records), [0.25, 0.25], 1000)
            h = running_sum_job(records, 2, sink, rate=2000, config=cfg,
                                gates=gates_of(plan)).run()
            try:
                place(h, plan)
                h.wait(120)
            finally:
                for m in plan:
                    m.release()
                h.stop()
            assert per_key(sink.results()) == per_key(running_sum_reference(records)), \
                "wrong output"
            print(f"OK {len(ray.nodes())} nodes", flush=True)
            return 0
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
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1",
                  sys.argv[2] if len(sys.argv) > 2 else "rescale"))
