"""Checkpoints without Ray: the coordinator stepped by hand, the store on a real directory,
the metadata format, the restore planner and the restart strategy."""

from __future__ import annotations

import os

import pytest

from engine.api import StreamJob
from engine.checkpoints import coordinator as cc
from engine.checkpoints.metadata import (
    MAGIC,
    CheckpointKind,
    CheckpointMetadata,
    TaskState,
)
from engine.checkpoints.restore import checkpoint_layout, fresh_deployment, plan_restore
from engine.checkpoints.snapshot import TaskSnapshot, persist, restore_messages
from engine.checkpoints.store import (
    complete_checkpoints,
    part_file_name,
    read_groups,
    read_metadata,
    resolve,
    write_metadata,
    write_task_part,
)
from engine.dataflow.config import JobConfig
from engine.dataflow.deployment import initial_deployment
from engine.dataflow.keygroups import uniform_assignment
from engine.dataflow.physical import plan_physical
from engine.dataflow.restart import RestartStrategy
from engine.errors import RestoreError
from engine.io.testing import TestingSink, TestingSource
from engine.time.clock import ManualClock
from engine.wire.messages import (
    CheckpointAck,
    CheckpointDeclined,
    CommitTransactions,
    InstallKeyGroups,
    RestoreState,
)

N = 8
CFG = JobConfig(metrics_port=None, checkpoint_interval_s=10.0, checkpoints_retained=2,
                tolerable_checkpoint_failures=1, checkpoint_timeout_s=30.0)


def job(sum_p: int = 2, src_p: int = 1, name: str = "sum", dead_letter: bool = False):
    j = StreamJob("j", num_key_groups=N, config=CFG)
    (j.source(TestingSource([(1, 1)]), name="src", parallelism=src_p)
        .key_by(lambda r: r[0])
        .reduce(lambda a, b: a, name=name, parallelism=sum_p,
                dead_letter=TestingSink() if dead_letter else None)
        .sink(TestingSink(), name="out", parallelism=1))
    return plan_physical(j.graph())


def ack(task: str, cid: int, groups=(), source=None, txns=(), file="") -> CheckpointAck:
    return CheckpointAck(task, cid, file, tuple(groups), source, tuple(txns), 10, 0.1, 0.01,
                         0.02)


def coordinator(clock: ManualClock, root: str, config: JobConfig = CFG) -> cc.CheckpointCoordinator:
    return cc.CheckpointCoordinator("j-1", "j", N, config, clock, root)


# ------------------------------------------------------------------ the coordinator


def test_a_checkpoint_completes_when_every_task_acknowledged_and_its_metadata_is_written(
        clock, tmp_path):
    dep = initial_deployment(job(), "j-1")
    co = coordinator(clock, str(tmp_path))
    [trigger] = co.trigger(dep)
    assert trigger == cc.TriggerTasks(1, f"{tmp_path}/chk-1", False, tuple(dep.task_names()))
    with pytest.raises(RuntimeError, match="pending"):
        co.trigger(dep)
    names = dep.task_names()
    assert co.on_report(ack(names[0], 2)) == []            # another checkpoint: ignored
    assert co.on_report(ack("j-1/other/0/g0", 1)) == []    # not a task of it: ignored
    for n in names[:-1]:
        assert co.on_report(ack(n, 1)) == []
    clock.advance(0.5)
    [write] = co.on_report(ack(names[-1], 1, source=7))
    assert isinstance(write, cc.WriteMetadata)
    meta = write.metadata
    assert [t.task for t in meta.tasks] == names and meta.duration_s == 0.5
    assert co.latest is None  # not before its metadata is written
    assert co.on_report(ack(names[0], 1)) == []  # while writing: nothing more
    assert co.on_written(1) == [cc.NotifyComplete(1, tuple(names))]
    assert co.latest == meta and co.completed == 1
    [out] = co.take_outcomes()
    assert out.completed and out.metadata == meta
    stats = co.stats()
    assert (stats.completed, stats.last_id, stats.last_bytes) == (1, 1, 10 * len(names))


def test_old_checkpoints_beyond_the_retained_ones_are_discarded(clock, tmp_path):
    dep = initial_deployment(job(), "j-1")
    co = coordinator(clock, str(tmp_path))
    discarded = []
    for cid in (1, 2, 3):
        co.trigger(dep)
        for n in dep.task_names():
            co.on_report(ack(n, cid))
        out = co.on_written(cid)
        discarded += [c.locations for c in out if isinstance(c, cc.Discard)]
    assert discarded == [(f"{tmp_path}/chk-1",)]
    assert [m.checkpoint_id for m in co.retained] == [2, 3]
    # a savepoint is never discarded, and does not push a checkpoint out
    co.trigger(dep, CheckpointKind.SAVEPOINT, "/sp")
    for n in dep.task_names():
        co.on_report(ack(n, 4))
    assert co.on_written(4) == [cc.NotifyComplete(4, tuple(dep.task_names()))]
    assert co.latest.checkpoint_id == 4 and co.latest.kind == "savepoint"


def test_failures_are_counted_and_too_many_in_a_row_fail_the_job(clock, tmp_path):
    dep = initial_deployment(job(), "j-1")
    co = coordinator(clock, str(tmp_path))
    names = tuple(dep.task_names())
    co.trigger(dep)
    out = co.on_report(CheckpointDeclined(names[1], 1, "disk full"))
    assert out == [cc.NotifyAborted(1, names), cc.Discard((f"{tmp_path}/chk-1",))]
    assert co.pending is None and co.failed == 1 and "disk full" in co.last_failure
    # the metadata write fails: the second in a row, over tolerable_checkpoint_failures=1
    co.trigger(dep)
    for n in names:
        co.on_report(ack(n, 2))
    out = co.on_written(2, "OSError: read-only")
    assert isinstance(out[-1], cc.FailJob) and "2 checkpoints failed in a row" in out[-1].reason
    assert co.latest is None
    # a timeout fails it too; a completed one resets the count
    co.trigger(dep)
    clock.advance(29.0)
    assert co.check() == []
    clock.advance(1.0)
    out = co.check()
    assert isinstance(out[0], cc.NotifyAborted) and "checkpoint_timeout_s=30" in co.last_failure
    co.trigger(dep)
    for n in names:
        co.on_report(ack(n, 4))
    co.on_written(4)
    assert co.consecutive_failures == 0
    # a savepoint's failure does not count towards the job's
    co.trigger(dep, CheckpointKind.SAVEPOINT, "/sp")
    out = co.on_report(CheckpointDeclined(names[0], 5, "no"))
    assert out == [cc.NotifyAborted(5, names)] and co.consecutive_failures == 0
    assert [o.completed for o in co.take_outcomes()] == [False, False, False, True, False]


def test_due_follows_the_interval_and_abort_and_restore_keep_the_ids_growing(clock, tmp_path):
    dep = initial_deployment(job(), "j-1")
    co = coordinator(clock, str(tmp_path))
    assert not co.due()
    clock.advance(9.9)
    assert not co.due()
    clock.advance(0.1)
    assert co.due()
    co.trigger(dep)
    clock.advance(20)
    assert not co.due()  # one pending
    assert co.abort("the job restarts") == [cc.Discard((f"{tmp_path}/chk-1",))]
    assert co.consecutive_failures == 0 and co.failed == 1
    meta = CheckpointMetadata(41, "savepoint", "old", "j", 0.0, N, (), (), location="/sp")
    co.restored(meta)
    assert co.latest is meta and co.next_id == 42 and co.stats().restored_from == "/sp"
    assert not coordinator(clock, str(tmp_path), JobConfig(metrics_port=None)).due()


# ------------------------------------------------------------------ store and metadata


def _meta(location: str, groups=((0, 0, 1, 0),)) -> CheckpointMetadata:
    plan = job()
    dep = initial_deployment(plan, "j-1")
    tasks = tuple(TaskState(t, v.name, i) for v in plan.vertices
                  for i, t in enumerate(dep.tasks[v.name]))
    return CheckpointMetadata(3, "checkpoint", "j-1", "j", 1.0, N, cc.vertices_of(dep), tasks,
                              0.25, location)


def test_parts_and_metadata_round_trip_and_a_torn_checkpoint_is_never_used(tmp_path):
    root = str(tmp_path / "j-1")
    groups = [(3, b"abc"), (5, b""), (6, b"x" * 1000)]
    index = write_task_part(f"{root}/chk-3", part_file_name("a b/c", 1), groups)
    assert [(kg, off, ln) for kg, off, ln, _ in index] == [(3, 0, 3), (5, 3, 0), (6, 3, 1000)]
    assert part_file_name("a b/c", 1).startswith("a_b_c-") and part_file_name("a b/c", 1) != \
        part_file_name("a b_c", 1)
    refs = [(kg, f"{root}/chk-3/{part_file_name('a b/c', 1)}", off, ln, crc)
            for kg, off, ln, crc in index]
    assert sorted(read_groups(refs)) == sorted(groups)
    meta = _meta(f"{root}/chk-3")
    write_metadata(meta)
    assert read_metadata(f"{root}/chk-3") == meta
    # chk-4 was torn: parts written, no metadata
    write_task_part(f"{root}/chk-4", "x.state", groups)
    assert complete_checkpoints(root) == [f"{root}/chk-3"]
    assert resolve(root) == f"{root}/chk-3" and resolve(f"{root}/chk-3/") == f"{root}/chk-3"
    with pytest.raises(RestoreError, match="no complete checkpoint") as err:
        read_metadata(f"{root}/chk-4")
    assert err.value.reason == "incomplete"
    with pytest.raises(RestoreError, match="no complete checkpoint"):
        resolve(str(tmp_path / "nothing"))
    assert complete_checkpoints(str(tmp_path / "nothing")) == []


def test_foreign_and_corrupt_checkpoints_are_refused_with_the_reason(tmp_path):
    loc = str(tmp_path / "chk-1")
    write_metadata(_meta(loc))
    path = os.path.join(loc, "_metadata")
    with open(path, "rb") as f:
        data = f.read()
    cases = {
        "foreign": b"PK\x03\x04 a zip file",
        "version": MAGIC + b"\x00\x63" + data[len(MAGIC) + 2:],
        "corrupt": data[:-3] + b"zzz",
    }
    for reason, bad in cases.items():
        with open(path, "wb") as f:
            f.write(bad)
        with pytest.raises(RestoreError) as err:
            read_metadata(loc)
        assert err.value.reason == reason and err.value.path == loc, reason
    # a key group altered on disk fails its checksum
    [(kg, off, ln, crc)] = write_task_part(loc, "p.state", [(2, b"state")])
    with open(os.path.join(loc, "p.state"), "r+b") as f:
        f.write(b"X")
    with pytest.raises(RestoreError, match="key group 2 does not match its checksum"):
        read_groups([(kg, f"{loc}/p.state", off, ln, crc)])
    with pytest.raises(RestoreError, match="cannot read"):
        read_groups([(kg, f"{loc}/gone.state", off, ln, crc)])


def test_a_store_that_cannot_be_written_declines_and_restores_read_the_groups(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    snap = TaskSnapshot("t", "sum", 0, 7, str(blocker / "chk-7"), ((1, b"ab"),))
    out = persist(snap, ManualClock())
    assert isinstance(out, CheckpointDeclined) and "could not be written" in out.reason
    ok = persist(TaskSnapshot("t", "sum", 0, 7, str(tmp_path / "chk-7"), ((1, b"ab"),),
                              None, (("out", "txn"),), 0.5, 0.1), ManualClock())
    assert isinstance(ok, CheckpointAck) and ok.bytes == 2 and ok.transactions == (
        ("out", "txn"),)
    [(kg, off, ln, crc)] = ok.groups
    msgs = restore_messages(RestoreState(((kg, f"{tmp_path}/chk-7/{ok.file}", off, ln, crc),),
                                         (("out", ("txn",)),)))
    assert msgs == [InstallKeyGroups(((1, b"ab"),)), CommitTransactions((("out", ("txn",)),))]
    assert persist(TaskSnapshot("t", "v", 0, 7, "/x", declined="no"), ManualClock()) == \
        CheckpointDeclined("t", 7, "no")


# ------------------------------------------------------------------ restore planning


def checkpoint_of(plan, job_id: str = "old", sum_groups: bool = True) -> CheckpointMetadata:
    dep = initial_deployment(plan, job_id)
    tasks = []
    for v in plan.vertices:
        for i, t in enumerate(dep.tasks[v.name]):
            groups = tuple((kg, kg * 10, 10, kg) for kg in dep.key_groups_of(v.name, i)) \
                if v.keyed and sum_groups else ()
            txns = tuple((w, f"{w}-{i}") for w in ("out",) if v.has_sink)
            states = ({p: 100 + i for p in dep.partitions_of(v.name, i)} if v.is_source
                      else None)
            tasks.append(TaskState(t, v.name, i, f"{v.name}-{i}.state" if groups else "",
                                   groups, states, txns))
    return CheckpointMetadata(5, "savepoint", job_id, "j", 0.0, plan.num_key_groups,
                              cc.vertices_of(dep), tuple(tasks), location="/sp")


def test_a_restore_at_the_same_layout_gives_each_task_what_it_had():
    plan = job(sum_p=2)
    meta = checkpoint_of(plan)
    rp = plan_restore(meta, checkpoint_layout(job(sum_p=3), meta), "new", 4)
    dep = rp.deployment
    assert dep.tasks["sum"] == ("new/sum/0/g4", "new/sum/1/g4")
    assert dep.assignments["sum"] == uniform_assignment(N, 2)
    for i, name in enumerate(dep.tasks["sum"]):
        assert tuple(sorted(g[0] for g in rp.tasks[name].groups)) == dep.key_groups_of("sum", i)
        assert all(g[1] == f"/sp/sum-{i}.state" for g in rp.tasks[name].groups)
    [src] = dep.tasks["src"]
    assert rp.tasks[src].source_state == {"0-of-1": 100}
    assert dep.partitions == {"src": ("0-of-1",)}, "the list the checkpoint recorded"
    [out] = dep.tasks["out"]
    assert rp.tasks[out].transactions == (("out", ("out-0",)),)
    assert "restored savepoint 5" in rp.reason and rp.dropped == ()


def test_a_restore_at_another_parallelism_reassigns_key_groups_and_spreads_transactions():
    meta = checkpoint_of(job(sum_p=2))
    rp = plan_restore(meta, job(sum_p=3), "new", 1)
    assert rp.deployment.assignments["sum"] == uniform_assignment(N, 3)
    got = {kg for t in rp.deployment.tasks["sum"] for kg, *_ in rp.tasks[t].groups}
    assert got == set(range(N))
    # a given assignment (a stop-restart's target) wins
    target = tuple(kg % 3 for kg in range(N))
    rp = plan_restore(meta, job(sum_p=3), "new", 1, assignments={"sum": target})
    for i, t in enumerate(rp.deployment.tasks["sum"]):
        assert sorted(kg for kg, *_ in rp.tasks[t].groups) == [
            kg for kg in range(N) if target[kg] == i]


def test_state_the_job_cannot_take_is_refused_unless_dropped():
    meta = checkpoint_of(job(sum_p=2))
    renamed = job(sum_p=2, name="total")
    with pytest.raises(RestoreError, match="keyed state of operator 'sum'") as err:
        plan_restore(meta, renamed, "new", 1)
    assert err.value.reason == "unmapped" and "allow_non_restored_state" in str(err.value)
    rp = plan_restore(meta, renamed, "new", 1, allow_non_restored_state=True)
    assert all(not r.groups for r in rp.tasks.values()) and len(rp.dropped) == 1
    other = StreamJob("j", num_key_groups=2 * N, config=CFG)
    (other.source(TestingSource([]), name="src").key_by(lambda r: r)
        .reduce(lambda a, b: a, name="sum").sink(TestingSink(), name="out"))
    with pytest.raises(RestoreError, match=f"in {N} key groups"):
        plan_restore(meta, plan_physical(other.graph()), "new", 1)
    # an operator the checkpoint does not know starts empty
    rp = plan_restore(checkpoint_of(job(sum_p=2), sum_groups=False), job(dead_letter=True),
                      "new", 1)
    assert rp.dropped == ()


def test_a_fresh_deployment_names_a_new_generation():
    dep = fresh_deployment(job(sum_p=3), "j", 7, {"src": ("0-of-1",)})
    assert dep.tasks["sum"] == ("j/sum/0/g7", "j/sum/1/g7", "j/sum/2/g7")
    assert dep.generation == 7 and dep.assignments["sum"] == uniform_assignment(N, 3)
    assert dep.partitions == {"src": ("0-of-1",)}


def test_a_source_is_restored_at_any_parallelism_by_its_recorded_partitions():
    """The partition list is the checkpoint's, whatever the source says now; each new
    task gets the states of the partitions j % p == i."""
    old = job(src_p=3)
    dep = initial_deployment(old, "old")
    states = {p: 10 * j for j, p in enumerate(dep.partitions["src"])}
    tasks = [TaskState(t, v.name, i, "", (), {p: states[p] for p in dep.partitions_of(
        v.name, i)} if v.is_source else None) for v in old.vertices
        for i, t in enumerate(dep.tasks[v.name])]
    meta = CheckpointMetadata(5, "savepoint", "old", "j", 0.0, N, cc.vertices_of(dep),
                              tuple(tasks), location="/sp")
    for p in (1, 2, 3, 5):
        rp = plan_restore(meta, job(src_p=p), "new", 1, partitions={"src": ("x",)})
        got = rp.deployment
        assert got.partitions["src"] == ("0-of-3", "1-of-3", "2-of-3")
        merged = {}
        for i, t in enumerate(got.tasks["src"]):
            mine = rp.tasks[t].source_state or {}
            assert set(mine) <= set(got.partitions_of("src", i))
            merged.update(mine)
        assert merged == states, p
    # a checkpoint of an older format (a state that is not by partition) is refused
    bad = CheckpointMetadata(5, "savepoint", "old", "j", 0.0, N, cc.vertices_of(dep),
                             (TaskState(dep.tasks["src"][0], "src", 0, "", (), 42),),
                             location="/sp")
    with pytest.raises(RestoreError, match="not by partition"):
        plan_restore(bad, job(src_p=3), "new", 1)


# ------------------------------------------------------------------ restart strategy


def test_fixed_delay_restarts_a_bounded_number_of_times_and_none_never():
    s = RestartStrategy(JobConfig(checkpoint_interval_s=1.0, restart_attempts=2,
                                  restart_delay_s=0.5))
    assert s.name == "fixed-delay"
    first, second, third = (s.on_failure("x") for _ in range(3))
    assert (first.restart, first.delay_s) == (True, 0.5) and "restart 1 of 2" in first.reason
    assert second.restart and not third.restart and "gave up after 2 restarts" in third.reason
    assert s.restarts == 2
    off = RestartStrategy(JobConfig())
    assert off.name == "none" and not off.on_failure("x").restart
    forced = RestartStrategy(JobConfig(restart_strategy="fixed-delay"))
    assert forced.on_failure("x").restart  # from the start of the input


def test_join_keeps_a_uri_query_string_at_the_end():
    from engine.checkpoints.store import join

    uri = "s3://b/sp?endpoint_override=h:9&scheme=http"
    assert join(uri, "chk-3", "x.state") == "s3://b/sp/chk-3/x.state?endpoint_override=h:9&scheme=http"
    assert join("s3://b/sp/", "x") == "s3://b/sp/x"
    assert join("/tmp/a?b", "x") == "/tmp/a?b/x"  # a local path may hold a '?'



class _NoCodec:
    """A value type with no declared codec."""


def test_keyed_state_no_codec_encodes_fails_the_task_for_good_naming_state_and_operator(tmp_path):
    """Issue 32 item 4: a checkpoint of keyed state holding a type without a codec is the
    user's error: the task fails with a message naming the state and the operator, marked
    permanent (the JobMaster does not restart the job on it); before, it was an 'internal
    error CodecError' the restart strategy looped on."""
    import random

    from engine.api import StreamJob
    from engine.dataflow.config import JobConfig
    from engine.io.testing import TestingSink, TestingSource
    from engine.operators.functions import KeyedProcessFunction
    from engine.time.clock import ManualClock
    from engine.wire.messages import TaskFailed, TriggerCheckpoint
    from tests.harness import wire
    from tests.unit.test_drrs_core import DNet

    class Keep(KeyedProcessFunction):
        def open(self, ctx):
            self.last = ctx.value_state("last_seen", None)

        def process_element(self, value, ctx):
            self.last.update(_NoCodec())
            yield value

    job = StreamJob("nocodec", num_key_groups=16,
                    config=JobConfig(batch_size=4, linger_ms=0, metrics_port=None,
                                     checkpoint_interval_s=60))
    (job.source(TestingSource([(1, 1), (2, 2)]), name="src").key_by(lambda r: r[0])
        .process(Keep(), name="keep").sink(TestingSink(str(tmp_path / "o")), name="out"))
    net = DNet(job, ManualClock())
    net["src/0"].poll_source(2)
    net._random_round(random.Random(1), 0)
    net.pump()
    net["src/0"].handle(wire(TriggerCheckpoint(1, str(tmp_path / "chk-1"))))
    net.pump()
    core = net["keep/0"]
    [failed] = [r for r in core.reports if isinstance(r, TaskFailed)]
    assert core.status == "failed" and failed.permanent and failed.operator == "keep"
    assert "keyed state 'last_seen' of operator 'keep'" in failed.cause
    assert "_NoCodec" in failed.cause and "register_codec" in failed.cause
