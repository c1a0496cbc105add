"""A restart reuses the processes of the tasks still alive
(``JobConfig.recovery_reuses_processes``) and reads the node's local copies of the
checkpoint (``JobConfig.local_recovery``), and the output stays exact, on a real local Ray
cluster. Each test kills a task actor and fails if the job did not restart."""

from __future__ import annotations

import glob
import os
from typing import Any

import pytest
import ray

from engine import JobConfig
from engine.io.testing import TestingSink
from tests.integration.test_checkpoints_on_ray import checkpointed
from tests.jobs import (
    Moment,
    per_key,
    running_sum_job,
    running_sum_reference,
    task_actors,
    wait_until,
)

pytestmark = pytest.mark.ray


def _config(tmp_path: Any, **extra: Any) -> JobConfig:
    return checkpointed(str(tmp_path / "chk"), **extra)


def _run_to_the_end(h: Any, moment: Moment) -> Any:
    """Open the moment's gates and wait for the job to finish; its final status."""
    moment.start.open()
    moment.end.open()
    return h.wait(180)


def _task_pids(job_id: str) -> dict[str, int]:
    """Ray name -> pid of the job's live task actors."""
    out = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        name = entry["name"]
        if (entry["namespace"] != "reflow" or not name.startswith(f"{job_id}/")
                or "/master" in name or "standby" in name):
            continue
        try:
            actor = ray.get_actor(name, namespace="reflow")
            out[name] = ray.get(actor.__ray_call__.remote(lambda _self: os.getpid()),
                                timeout=60)
        except (ValueError, ray.exceptions.RayError):
            continue  # gone meanwhile
    return out


@pytest.mark.parametrize("reuse", [True, False])
def test_a_restart_reuses_the_processes_of_the_tasks_alive(ray_cluster, tmp_path, reuse):
    """One task actor killed: with reuse, every other task actor's process runs a task of
    the restarted job (the same pids, alive); without, none does. Exact either way."""
    records = [(i % 30, i % 5 + 1) for i in range(4000)]
    sink = TestingSink(str(tmp_path / "out"))
    moment = Moment.at(1500, 1000, len(records))
    h = running_sum_job(records, 2, sink, rate=2000, gates=list(moment.gates),
                        config=_config(tmp_path, recovery_reuses_processes=reuse)).run()
    try:
        moment.wait(h)
        done = h.status().checkpoints.completed
        wait_until(lambda: h.status().checkpoints.completed > done, "a checkpoint", h)
        before = _task_pids(h.job_id)
        victim = task_actors(h, "sum")[0]
        ray.kill(ray.get_actor(victim, namespace="reflow"))
        wait_until(lambda: h.status().restarts >= 1 and h.status().state == "running",
                   "the restart", h)
        after = _task_pids(h.job_id)
        st_ = _run_to_the_end(h, moment)
    finally:
        moment.release()
        h.stop()
    assert st_.state == "finished" and st_.restarts == 1, st_
    survivors = {p for n, p in before.items() if n != victim}
    assert len(survivors) >= 2, before  # the source and the other sum task at least
    reused = survivors & set(after.values())
    assert reused == (survivors if reuse else set()), (before, after)
    assert before[victim] not in after.values()
    assert per_key(sink.results()) == per_key(running_sum_reference(records))


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_local_recovery_restores_from_the_nodes_copies_when_the_store_lost_the_parts(
        ray_cluster, tmp_path, backend):
    """Every part file in the checkpoint store deleted, then a task killed: the restart
    reads the tasks' local copies (the survivors' in their own processes, the killed
    task's from its process's folder on the node) and restores the latest checkpoint,
    not an older one or nothing; the output is exact. Without local recovery no
    checkpoint would read back."""
    records = [(i % 30, i % 5 + 1) for i in range(4000)]
    sink = TestingSink(str(tmp_path / "out"))
    moment = Moment.at(1500, 1000, len(records))
    state_dir = str(tmp_path / "state")
    # 3 s between checkpoints: the deletion and the kill happen right after one completed
    cfg = _config(tmp_path, checkpoint_interval_s=3.0, local_recovery=True,
                  state_dir=state_dir, state_backend=backend)
    h = running_sum_job(records, 2, sink, rate=2000, gates=list(moment.gates),
                        config=cfg).run()
    try:
        moment.wait(h)
        done = h.status().checkpoints.completed
        wait_until(lambda: h.status().checkpoints.completed >= done + 1, "a checkpoint", h)
        stored = glob.glob(os.path.join(str(tmp_path / "chk"), "**", "*.state"),
                           recursive=True)
        copies = glob.glob(os.path.join(state_dir, "local-recovery", "**", "*.state"),
                           recursive=True)
        assert stored and copies, (stored, copies)
        for path in stored:
            os.remove(path)
        ray.kill(ray.get_actor(task_actors(h, "sum")[0], namespace="reflow"))
        wait_until(lambda: h.status().restarts >= 1, "the restart", h)
        st_ = _run_to_the_end(h, moment)
    finally:
        moment.release()
        h.stop()
    assert st_.state == "finished" and st_.restarts == 1, st_
    assert "did not read back whole" not in st_.last_failure, st_.last_failure
    assert per_key(sink.results()) == per_key(running_sum_reference(records))
