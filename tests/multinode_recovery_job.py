"""Run as a script by ``tests/integration/test_multinode_on_ray.py``: a running sum with
checkpoints on a two-node ``ray.cluster_utils.Cluster`` (tasks reserve a CPU each, so with
the head's three CPUs and the worker's one some task lands on the worker); once a
checkpoint completed, the worker node is removed with its tasks. The job restarts from the
checkpoint on the surviving node and goes on. Prints ``OK`` when the exactly-once output
equals the plain-Python reference and a task was lost with the node; ``NO FAULT`` (exit 1)
when no task ran on the removed node, so nothing was tested."""

from __future__ import annotations

import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from engine import JobConfig  # noqa: E402
from engine.io.testing import TestingSink  # noqa: E402
from tests.jobs import (  # noqa: E402
    Moment,
    per_key,
    running_sum_job,
    running_sum_reference,
    wait_until,
)


def node_of(actor: str) -> str:
    handle = ray.get_actor(actor, namespace="reflow")
    return ray.get(handle.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))


def main() -> int:
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 3, "include_dashboard": False})
    worker = cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, namespace="reflow", configure_logging=False,
             log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": ROOT}})
    try:
        records = [(i % 40, i % 7) for i in range(6000)]
        cfg = JobConfig(batch_size=50, linger_ms=2, metrics_port=None, task_num_cpus=1,
                        checkpoint_interval_s=0.3, checkpoint_dir=tempfile.mkdtemp(),
                        restart_delay_s=0.1)
        # Where Ray places the tasks and the JobMaster is its choice: a run whose worker node
        # holds no task, or holds the JobMaster (whose loss is another test's), is stopped
        # and run again, at most three times.
        for attempt in range(3):
            sink = TestingSink()
            moment = Moment.at(2500, 0, len(records))
            h = running_sum_job(records, 2, sink, rate=3000, gates=moment.gates,
                                config=cfg).run()
            try:
                moment.wait(h)
                done = h.status().checkpoints.completed
                wait_until(lambda h=h, done=done: h.status().checkpoints.completed > done,
                           "a checkpoint", h)
                tasks = [n["name"] for n in ray.util.list_named_actors(all_namespaces=True)
                         if isinstance(n, dict) and n["name"].startswith(h.job_id + "/")
                         and "/standby" not in n["name"] and not n["name"].endswith("/master")]
                master_node = ray.get(h._master.__ray_call__.remote(
                    lambda self: ray.get_runtime_context().get_node_id()))
                on_worker = [t for t in tasks if node_of(t) == worker.node_id]
                if not on_worker or master_node == worker.node_id:
                    print(f"attempt {attempt}: tasks on the worker {on_worker}, JobMaster on "
                          f"the worker: {master_node == worker.node_id}; again")
                    continue
                cluster.remove_node(worker)
                wait_until(lambda h=h: h.status().restarts >= 1, "the restart", h)
                moment.release()
                st = h.wait(240)
                break
            finally:
                moment.release()
                h.stop()
        else:
            print("NO FAULT: no run had a task, and not the JobMaster, on the worker node")
            return 1
        assert st.state == "finished" and st.restarts >= 1, st
        ok = per_key(sink.results()) == per_key(running_sum_reference(records))
        print(f"lost {on_worker} with the node; restarts {st.restarts}; "
              f"{'OK' if ok else 'MISMATCH'}")
        return 0 if ok else 1
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
