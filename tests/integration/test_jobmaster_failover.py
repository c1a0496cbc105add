"""A detached job survives the loss of its JobMaster, on a real local Ray cluster.

The JobMaster's process is killed the way a crash would (``ray.kill(..., no_restart=False)``:
Ray restarts the actor, as after a SIGKILL or a node's loss). The restarted JobMaster takes
the job over from its durable record (``engine.runtime.failover``): with every task alive
and nothing half-done it reconciles (no task restarts, output goes on), during a rescale it
restarts every task from the latest complete checkpoint. Either way the exactly-once
sink's output equals the run without failure, per key. A second JobMaster that takes the
job over fences the first: the first's calls raise ``StaleJobMaster`` and the tasks refuse
it. Every wait acts on an event (a gate reached, a status).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import ray

from controllers.base import Controller, NoChange
from engine.errors import JobMasterFailedOver, ReflowError, StaleJobMaster
from engine.io.testing import TestingSink
from engine.runtime.handle import JobHandle
from engine.runtime.job_master import NAMESPACE, RemoteJobMaster
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

RECORDS = [(i % 40, i % 7) for i in range(6000)]


class Counting(Controller):
    """Decides no change, counting its calls: its history must outlive a takeover."""

    interval_s = 0.3
    window_s = 30.0

    def __init__(self) -> None:
        self.calls = 0

    def decide(self, metrics: Any, view: Any) -> Any:
        self.calls += 1
        return NoChange(f"call {self.calls}")


def _crash(handle: Any) -> None:
    """Kill the JobMaster's process; Ray restarts the actor (a crash, not a stop)."""
    ray.kill(handle._master, no_restart=False)


def _checkpoint_after(handle: Any) -> None:
    done = handle.status().checkpoints.completed
    wait_until(lambda: handle.status().checkpoints.completed > done, "a checkpoint", handle)


def _all_tasks(handle: Any) -> list[str]:
    return sorted(t for v in ("src", "sum", "out") for t in task_actors(handle, v))


def test_a_crashed_jobmaster_reconciles_with_its_live_tasks(ray_cluster, tmp_path):
    sink = TestingSink(str(tmp_path / "out"))
    moment = Moment.at(2500, 500, len(RECORDS))
    cfg = checkpointed(str(tmp_path / "chk"), restart_attempts=0,
                       metrics_poll_interval_s=0.2)
    h = running_sum_job(RECORDS, 2, sink, rate=3000, gates=moment.gates,
                        config=cfg).run(detached=True, controllers=[Counting()])
    try:
        assert h.status().detached and h.status().master_epoch == 1
        moment.wait(h)
        _checkpoint_after(h)
        wait_until(lambda: len(h.decisions("Counting")) > 0, "a controller's decision", h)
        before = _all_tasks(h)
        decided = h.decisions("Counting")
        moment.start.open()
        _crash(h)
        # the handle asks again while Ray restarts the JobMaster: no error for a failover
        st = h.status()
        wait_until(lambda: h.status().master_epoch == 2, "the takeover", h)
        assert _all_tasks(h) == before  # the same task actors: none was restarted
        # the controller runs on with its history
        assert h.decisions("Counting")[:len(decided)] == decided
        wait_until(lambda: len(h.decisions("Counting")) > len(decided), "a new decision", h)
        moment.end.open()
        _checkpoint_after(h)  # the new JobMaster checkpoints, the tasks answer it
        st = h.wait(240)
        assert st.state == "finished", st
        assert st.restarts == 0, f"a task restarted: {st.last_failure}"
        assert "reconcile" in st.last_failure, st.last_failure
    finally:
        moment.release()
        h.stop()
    assert per_key(sink.results()) == per_key(running_sum_reference(RECORDS))


def test_a_jobmaster_crashed_after_a_restart_reconciles_with_the_recycled_task_actors(
        ray_cluster, tmp_path):
    """A task killed, the job restarted with the live tasks' processes reused (each keeps
    its first task's Ray name while it runs the next generation's task), then the
    JobMaster crashes: the new one finds those tasks by asking the job's actors which task
    they run, and reconciles (no second restart). Before, it looked them up by task name
    only, found them missing, and restarted the job."""
    sink = TestingSink(str(tmp_path / "out"))
    moment = Moment.at(2500, 500, len(RECORDS))
    cfg = checkpointed(str(tmp_path / "chk"), restart_attempts=3)
    h = running_sum_job(RECORDS, 2, sink, rate=3000, gates=moment.gates,
                        config=cfg).run(detached=True)
    try:
        moment.wait(h)
        _checkpoint_after(h)
        ray.kill(ray.get_actor(task_actors(h, "sum")[0], namespace=NAMESPACE))
        wait_until(lambda: h.status().restarts_completed >= 1
                   and h.status().state == "running", "the restart", h)
        _checkpoint_after(h)
        renamed = [t for t in _all_tasks(h) if t.endswith("/g0")]
        assert renamed, f"no task actor was reused: {_all_tasks(h)}"
        _crash(h)
        wait_until(lambda: h.status().master_epoch == 2, "the takeover", h)
        moment.start.open()
        moment.end.open()
        st = h.wait(240)
        assert st.state == "finished", st
        assert st.restarts == 1, f"the takeover restarted the job: {st.last_failure}"
        assert "reconcile" in st.last_failure, st.last_failure
    finally:
        moment.release()
        h.stop()
    assert per_key(sink.results()) == per_key(running_sum_reference(RECORDS))


def test_a_jobmaster_crashed_during_a_rescale_restarts_the_job_from_its_checkpoint(
        ray_cluster, tmp_path):
    sink = TestingSink(str(tmp_path / "out"))
    moment = Moment.at(2000, 1500, len(RECORDS))
    cfg = checkpointed(str(tmp_path / "chk"), restart_attempts=0)
    h = running_sum_job(RECORDS, 2, sink, rate=3000, gates=moment.gates,
                        config=cfg).run(detached=True)
    outcome: list[Any] = []
    try:
        moment.wait(h)
        _checkpoint_after(h)
        moment.start.open()

        def rescale() -> None:
            try:
                outcome.append(h.rescale("sum", 4))
            except ReflowError as exc:
                outcome.append(exc)

        t = threading.Thread(target=rescale)
        t.start()
        wait_until(lambda: not t.is_alive() or any(r.operator == "sum" and r.running
                                                   for r in h.metrics().rescales),
                   "the rescale to run", h)
        rescaling = t.is_alive()
        _crash(h)
        t.join(300)
        assert not t.is_alive()
        wait_until(lambda: h.status().master_epoch == 2, "the takeover", h)
        moment.end.open()
        st = h.wait(240)
        print(f"rescaling when crashed: {rescaling}; outcome {outcome}; {st.last_failure}")
        assert st.state == "finished", st
        if rescaling:  # the usual case: the rescale was cut short and the job restarted
            assert isinstance(outcome[0], JobMasterFailedOver), outcome
            assert st.restarts == 1 and "restart" in st.last_failure, st
    finally:
        moment.release()
        h.stop()
    assert per_key(sink.results()) == per_key(running_sum_reference(RECORDS))


def test_a_second_jobmaster_fences_the_first(ray_cluster, tmp_path):
    sink = TestingSink(str(tmp_path / "out"))
    moment = Moment.at(2500, 500, len(RECORDS))
    cfg = checkpointed(str(tmp_path / "chk"), restart_attempts=0)
    job = running_sum_job(RECORDS, 2, sink, rate=3000, gates=moment.gates, config=cfg)
    h = job.run(detached=True)
    second = None
    try:
        moment.wait(h)
        _checkpoint_after(h)
        # the takeover a JobMaster restarted by Ray does, by a second actor beside the first
        second = RemoteJobMaster.options(
            name=f"{h.job_id}/master-2", namespace=NAMESPACE, num_cpus=0,
            max_concurrency=10_000, lifetime="detached",
        ).remote(job.graph(), cfg, h.job_id, None, False, True, True)
        h2 = JobHandle(second, h.job_id, "", cfg, detached=True)
        wait_until(lambda: h2.status().master_epoch == 2, "the second JobMaster's takeover")
        with pytest.raises(StaleJobMaster):
            wait_until(lambda: h.status() is None, "the first JobMaster to be fenced")
        moment.release()
        st = h2.wait(240)
        assert st.state == "finished", st
        assert st.restarts == 0, st.last_failure
    finally:
        moment.release()
        if second is not None:
            JobHandle(second, h.job_id, "", cfg, detached=True).stop()
        ray.kill(h._master)
    assert per_key(sink.results()) == per_key(running_sum_reference(RECORDS))


def test_an_unreadable_job_record_fails_the_takeover_naming_it(ray_cluster, tmp_path):
    """A record that does not read back fails the job with ``JobRecordUnreadable`` naming
    the path and the job; nothing is started from nothing in its place."""
    import os

    sink = TestingSink(str(tmp_path / "out"))
    moment = Moment.at(1000, 500, len(RECORDS))
    cfg = checkpointed(str(tmp_path / "chk"), restart_attempts=0)
    h = running_sum_job(RECORDS, 2, sink, rate=3000, gates=moment.gates,
                        config=cfg).run(detached=True)
    try:
        moment.wait(h)
        _checkpoint_after(h)
        record = os.path.join(str(tmp_path / "chk"), h.job_id, "_job")
        assert os.path.exists(record)
        h.stop()  # a stopped job's record says so: the corrupt one below must be refused
        with open(record, "r+b") as f:
            f.seek(10)
            f.write(b"\xff\xff\xff\xff")
        # a JobMaster that takes the job over from the corrupt record
        master = RemoteJobMaster.options(
            name=f"{h.job_id}/master", namespace=NAMESPACE, num_cpus=0,
            max_concurrency=10_000, lifetime="detached",
        ).remote(running_sum_job(RECORDS, 2, sink, config=cfg).graph(), cfg, h.job_id,
                 None, False, True, True)
        h2 = JobHandle(master, h.job_id, "", cfg, detached=True)
        wait_until(lambda: h2.status().state == "failed", "the takeover to fail")
        st = h2.status()
        assert "_job" in st.error and h.job_id in st.error and "cannot be read" in st.error, st
        assert not _all_tasks(h), "tasks were started from nothing"
        h2.stop()
    finally:
        moment.release()


def test_a_jobmaster_crashed_while_the_job_restarts_restarts_it(ray_cluster, tmp_path):
    """The record says ``restarting`` (a task died, the JobMaster waits out the restart
    delay): the new JobMaster restarts the job from its checkpoint. Before, it failed the
    job for good (the restart strategy's check saw a job that was not running)."""
    sink = TestingSink(str(tmp_path / "out"))
    moment = Moment.at(2000, 500, len(RECORDS))
    cfg = checkpointed(str(tmp_path / "chk"), restart_attempts=3, restart_delay_s=30.0)
    h = running_sum_job(RECORDS, 2, sink, rate=3000, gates=moment.gates,
                        config=cfg).run(detached=True)
    try:
        moment.wait(h)
        _checkpoint_after(h)
        ray.kill(ray.get_actor(task_actors(h, "sum")[0], namespace=NAMESPACE))
        wait_until(lambda: h.status().state == "restarting", "the restart to begin", h)
        moment.release()
        _crash(h)
        wait_until(lambda: h.status().master_epoch == 2, "the takeover", h)
        st = h.wait(240)
        assert st.state == "finished", st
        assert "restart" in st.last_failure or st.restarts >= 1, st
    finally:
        moment.release()
        h.stop()
    assert per_key(sink.results()) == per_key(running_sum_reference(RECORDS))


def test_a_takeover_before_the_first_checkpoint_keeps_the_savepoint_it_was_restored_from(
        ray_cluster, tmp_path):
    """A job restored from a savepoint has no checkpoint of its own yet: after a takeover,
    a task's failure restarts it from that savepoint, not from nothing."""
    sink = TestingSink(str(tmp_path / "out"))
    first = Moment.at(2000, 0, len(RECORDS))
    cfg = checkpointed(str(tmp_path / "chk"), restart_attempts=3)
    h = running_sum_job(RECORDS, 2, sink, rate=3000, gates=first.gates, config=cfg).run()
    try:
        first.wait(h)
        first.start.open()
        savepoint = h.stop(savepoint=str(tmp_path / "sp"))
    finally:
        first.release()
    assert savepoint is not None
    later = Moment.at(4000, 500, len(RECORDS))
    quiet = checkpointed(str(tmp_path / "chk"), restart_attempts=3,
                         checkpoint_interval_s=600.0)  # no checkpoint of its own
    h2 = running_sum_job(RECORDS, 2, sink, rate=3000, gates=later.gates,
                         config=quiet).run(restore_from=savepoint, detached=True)
    try:
        later.wait(h2)
        _crash(h2)
        wait_until(lambda: h2.status().master_epoch == 2, "the takeover", h2)
        later.start.open()
        ray.kill(ray.get_actor(task_actors(h2, "sum")[0], namespace=NAMESPACE))
        wait_until(lambda: h2.status().restarts >= 1, "the restart", h2)
        later.end.open()
        st = h2.wait(240)
        assert st.state == "finished", st
        assert st.checkpoints.restored_from.rstrip("/").endswith("sp"), st.checkpoints
    finally:
        later.release()
        h2.stop()
    assert per_key(sink.results()) == per_key(running_sum_reference(RECORDS))
