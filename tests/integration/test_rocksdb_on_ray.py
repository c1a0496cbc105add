"""A keyed job on the RocksDB state backend on a real local Ray cluster: rescaled live with
drrs, then a task killed and the job recovered from a checkpoint; the exactly-once sink's
output equals the reference per key. Also: the tasks' state directories follow the tasks
(removed as a task stops, or at the next start after a kill), and a corrupt latest
checkpoint falls back to the previous one on RocksDB.

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
from engine.io.testing import TestingSink
from tests.integration import test_checkpoints_on_ray as checkpoints_on_ray
from tests.jobs import (
    Moment,
    per_key,
    running_sum_job,
    running_sum_reference,
    task_actors,
    wait_until,
)

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


def _instances(state_dir: Any) -> dict[str, int]:
    """The RocksDB instance directories under ``state_dir`` (``<job>/<task>/<pid>-<id>``,
    ``engine.state.backends``), with the process id each names."""
    out: dict[str, int] = {}
    root = str(state_dir)
    for job in os.listdir(root) if os.path.isdir(root) else ():
        for task in os.listdir(os.path.join(root, job)):
            for inst in os.listdir(os.path.join(root, job, task)):
                out[os.path.join(job, task, inst)] = int(inst.split("-", 1)[0])
    return out


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_rocksdb_directories_follow_the_tasks_through_a_kill_rescales_and_the_end(
        ray_cluster: Any, tmp_path: Any) -> None:
    """Issue 29: a task's RocksDB directory lives as long as the task. A killed task's is
    removed when a task next starts on the node, once its process is gone; a task whose
    process a restart reuses closes its backend and removes its directory as it stops; a task a live scale-in removes closes its backend when it
    stops (its directory goes with the rescale); at the job's end every task is stopped
    and no directory is left. The output is exact throughout."""
    state_dir = tmp_path / "state"
    records = [(i % 30, i % 5 + 1) for i in range(6000)]
    sink = TestingSink(str(tmp_path / "out"))
    first, second = Moment.at(1500, 600, len(records)), Moment.at(3600, 600, len(records))
    cfg = checkpoints_on_ray.checkpointed(str(tmp_path / "chk"), state_backend="rocksdb",
                                          state_dir=str(state_dir),
                                          state_memory_bytes=16 << 20)
    h = running_sum_job(records, 2, sink, rate=2000, gates=[*first.gates, *second.gates],
                        config=cfg).run()
    try:
        first.wait(h)
        before = _instances(state_dir)
        assert len(before) == 2, before  # one per task of "sum"
        done = h.status().checkpoints.completed
        wait_until(lambda: h.status().checkpoints.completed > done, "a checkpoint", h)
        checkpoints_on_ray.kill(task_actors(h, "sum")[0])
        wait_until(lambda: h.status().restarts_completed >= 1, "the restart", h)
        # the killed task left its directory (it goes when a task starts after its process
        # is gone); its sibling's process runs a restarted task (recovery reuses it) and
        # its old backend was closed, its directory removed, when it stopped its old task
        wait_until(lambda: any(_dead(p) for p in before.values()),
                   "the killed task's process to exit", h)
        alive = {d for d, p in before.items() if not _dead(p)}
        assert len(alive) == 1 and not alive & set(_instances(state_dir)), (before, alive)
        first.start.open()
        h.rescale("sum", 3, "drrs")
        first.end.open()
        scaled_out = _instances(state_dir)
        assert not set(before) & set(scaled_out), (before, scaled_out)
        assert len(scaled_out) == 3, scaled_out
        second.wait(h)
        second.start.open()
        h.rescale("sum", 2, "drrs")
        scaled_in = _instances(state_dir)  # the removed task closed its backend as it stopped
        assert len(scaled_in) == 2 and set(scaled_in) < set(scaled_out), (scaled_out,
                                                                           scaled_in)
        second.end.open()
        st_ = h.wait(180)
    finally:
        first.release()
        second.release()
        h.stop()
    assert st_.state == "finished" and st_.restarts >= 1, st_
    assert _instances(state_dir) == {}, "the tasks of a finished job left state directories"
    assert per_key(sink.results()) == per_key(running_sum_reference(records))
    print(f"rocksdb-on-ray directories: {len(before)} before the kill, {len(scaled_out)} "
          f"after scaling out, {len(scaled_in)} after scaling in, none at the end")


def test_a_corrupt_latest_rocksdb_checkpoint_falls_back_to_the_newest_readable_one(
        ray_cluster: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The RocksDB twin of ``test_checkpoints_on_ray``'s corruption test (run as it is, with
    the job on RocksDB): bytes flipped in the latest checkpoint's ``.state`` file, a task
    killed; recovery finds a ``RestoreError`` naming the file, restores the previous
    complete checkpoint into RocksDB, and the output is exact."""
    state_dir = tmp_path / "state"
    plain = checkpoints_on_ray.checkpointed
    made: list[JobConfig] = []

    def on_rocksdb(root: str, **extra: Any) -> JobConfig:
        cfg = plain(root, state_backend="rocksdb", state_dir=str(state_dir),
                    state_memory_bytes=16 << 20, **extra)
        made.append(cfg)
        return cfg

    monkeypatch.setattr(checkpoints_on_ray, "checkpointed", on_rocksdb)
    checkpoints_on_ray.test_a_corrupt_latest_checkpoint_falls_back_to_the_newest_readable_one(
        ray_cluster, tmp_path)
    assert made and all(c.state_backend == "rocksdb" for c in made), made
    assert os.listdir(state_dir), "no task kept its state in RocksDB"
    # stopped tasks removed theirs; only killed tasks' may remain (until a task next starts
    # on the node after their processes exited)
    left = _instances(state_dir)
    assert all(_dead(pid) for pid in left.values()), left
