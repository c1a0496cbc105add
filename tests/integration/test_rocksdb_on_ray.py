"""A keyed job on the RocksDB state backend on a real local Ray cluster: rescaled live with
drrs, then a task killed and the job recovered from a checkpoint; the exactly-once sink's
output equals the reference per key.

It runs the checkpoint oracle's own example runner (``test_checkpoints_on_ray._check``: gates
hold the input at each action's moment, a checkpoint completes before each action, every
wait acts on an event) with the job's configuration given ``state_backend="rocksdb"`` and a
state directory of the test's own, and checks that the tasks kept their state there.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from engine import JobConfig
from tests.integration import test_checkpoints_on_ray as checkpoints_on_ray

pytestmark = pytest.mark.ray


def test_a_rocksdb_job_rescaled_live_and_recovered_from_a_kill_is_exact(
        ray_cluster: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    state_dir = tmp_path / "state"
    plain = checkpoints_on_ray.checkpointed

    def on_rocksdb(root: str, **extra: Any) -> JobConfig:
        cfg = plain(root, state_backend="rocksdb", state_dir=str(state_dir),
                    state_memory_bytes=16 << 20, **extra)
        assert cfg.state_backend == "rocksdb"
        return cfg

    monkeypatch.setattr(checkpoints_on_ray, "checkpointed", on_rocksdb)
    monkeypatch.setattr(checkpoints_on_ray, "note", print)  # outside hypothesis here
    # "sum": a running sum per key (keyed state in every task of "sum"); drrs 2 -> 3, then
    # a task of "sum" killed: the job restarts from the last checkpoint
    checkpoints_on_ray._check("sum", "drrs", 2, [("rescale", 0.2, 3), ("kill", 0.2, "sum")],
                              data_seed=29, hypothesis_seed=0)
    # the tasks of "sum" kept their state in RocksDB under the job's folder of state_dir
    jobs = os.listdir(state_dir)
    assert len(jobs) == 1, jobs
    tasks = os.listdir(state_dir / jobs[0])
    assert tasks and all("_sum_" in t for t in tasks), tasks  # <job>_sum[i]_g<generation>
    print(f"rocksdb-on-ray: task state folders {sorted(tasks)}")
