"""Incremental checkpoints at the coordinator and the store (no Ray): chains in the
metadata, the shared-file registry and retention on a real directory, restore plans that
read chains, and a corrupt link refused by name.

Why a property test for retention: which file a checkpoint may delete depends on every
chain of every retained checkpoint; a random sequence of checkpoints (each key group
written full, as a delta, or unchanged; some checkpoints failing) with the store's real
deletes checks after every step that each file a retained checkpoint refers to exists
and that nothing else is left.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.checkpoints import coordinator as cc
from engine.checkpoints.metadata import CheckpointMetadata
from engine.checkpoints.restore import plan_restore
from engine.checkpoints.shared import SharedFiles, files_of
from engine.checkpoints.snapshot import read_chains
from engine.checkpoints.store import (
    complete_checkpoints,
    discard,
    discard_files,
    link_uri,
    part_file_name,
    read_metadata,
    write_metadata,
    write_task_part,
)
from engine.dataflow.config import JobConfig
from engine.dataflow.deployment import Deployment, initial_deployment
from engine.errors import ConfigError, RestoreError
from engine.state.incremental import encode_delta, merge_chain
from engine.state.keyed import decode_snapshot, encode_group
from engine.time.clock import ManualClock
from engine.wire.messages import CheckpointAck, CheckpointDeclined
from tests.unit.test_checkpoints import N, job


def _config(retained: int) -> JobConfig:
    return JobConfig(metrics_port=None, checkpoint_interval_s=10.0,
                     checkpoints_retained=retained, tolerable_checkpoint_failures=100,
                     incremental_checkpoints=True)


def _execute(co: cc.CheckpointCoordinator, cmds: list[cc.Command]) -> None:
    for cmd in cmds:
        match cmd:
            case cc.WriteMetadata(metadata=meta):
                write_metadata(meta)
                _execute(co, co.on_written(meta.checkpoint_id))
            case cc.Discard(locations=locations):
                for loc in locations:
                    discard(loc)
            case cc.DiscardFiles(locations=locations, files=files):
                discard_files(locations, files)


class _Job:
    """One keyed vertex's tasks acknowledging checkpoints with full, delta or unchanged
    groups; ``state[kg]``: each group's blobs as the chain should read back."""

    def __init__(self, root: str, retained: int) -> None:
        self.dep: Deployment = initial_deployment(job(), "j-1")
        self.co = cc.CheckpointCoordinator("j-1", "j", N, _config(retained), ManualClock(),
                                           root)
        self.blobs: dict[int, list[bytes]] = {}  # the chain of the last complete checkpoint
        self.base = -1  # the last checkpoint the tasks heard complete
        self.root = root
        self.settled = True  # no retained list changed behind the coordinator's back

    def recovery_drops_the_newest(self) -> None:
        """Recovery fell back past the newest checkpoint (``engine.runtime.recovery``
        cuts the retained list); every task restarts, so the next checkpoint is whole."""
        if len(self.co.retained) > 1:
            self.co.retained = self.co.retained[:-1]
            self.co.latest = self.co.retained[-1]
            self.blobs = {}
            self.settled = False

    def takeover(self, retained: int) -> None:
        """A new JobMaster: a new coordinator whose retained list is read from the store
        (``engine.runtime.job_master``); the tasks live on with their chains."""
        old = self.co
        self.co = cc.CheckpointCoordinator("j-1", "j", N, _config(retained), ManualClock(),
                                           self.root)
        self.co.retained = [read_metadata(loc) for loc in complete_checkpoints(self.root)]
        if self.co.retained:
            self.co.restored(self.co.retained[-1])
        self.co.next_id = old.next_id
        self.settled = False

    def checkpoint(self, rng: random.Random, fail: bool) -> None:
        co, dep = self.co, self.dep
        [trigger] = co.trigger(dep)
        assert isinstance(trigger, cc.TriggerTasks) and not trigger.savepoint
        cid, loc = trigger.checkpoint_id, trigger.location
        names = dep.tasks["sum"]
        assignment = dep.assignments["sum"]
        chains = {kg: list(c) for kg, c in self.blobs.items()}
        for task in dep.task_names():
            if task not in names:
                _execute(co, co.on_report(CheckpointAck(task, cid, "", (), None, (), 0, 0.0,
                                                        0.0, 0.0)))
                continue
            i = names.index(task)
            written, deltas, unchanged = [], [], []
            for kg in (g for g in range(N) if assignment[g] == i):
                how = rng.choice(["full", "delta", "unchanged"]) if kg in chains else "full"
                if how == "unchanged":
                    unchanged.append(kg)
                    continue
                v = rng.randrange(10**6)
                if how == "full":
                    blob = encode_group({"v": {kg: v}}, [])
                    chains[kg] = [blob]
                else:
                    blob = encode_delta([kg], {"v": {kg: v}}, [], [])
                    chains[kg] = chains[kg] + [blob]
                    deltas.append(kg)
                written.append((kg, blob))
            file = part_file_name("sum", i) if written else ""
            index = write_task_part(loc, file, written) if written else ()
            if fail and i == 0:
                _execute(co, co.on_report(CheckpointDeclined(task, cid, "the test says so")))
                return
            _execute(co, co.on_report(CheckpointAck(
                task, cid, file, index, None, (), sum(n for _, _, n, _ in index), 0.0, 0.0,
                0.0, tuple(deltas), tuple(unchanged), self.base)))
        assert co.latest is not None and co.latest.checkpoint_id == cid
        self.blobs = chains
        self.base = cid
        self.settled = True


def _files_on_disk(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*") if p.is_file()}


def _check(j: _Job, root: Path) -> None:
    retained = j.co.retained
    wanted = set().union(*(files_of(m) for m in retained)) if retained else set()
    on_disk = _files_on_disk(root)
    missing = wanted - on_disk
    assert not missing, f"files a retained checkpoint refers to were deleted: {missing}"
    left = on_disk - wanted - {f"{m.location}/_metadata" for m in retained}
    assert not left, f"files no retained checkpoint refers to were left: {left}"
    assert complete_checkpoints(str(root)) == [m.location for m in retained]
    dirs = {str(p) for p in root.iterdir()}
    assert all(any(f.startswith(d + "/") for f in on_disk) for d in dirs), "empty dirs left"


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), retained=st.integers(1, 3),
       steps=st.integers(1, 14))
def test_retention_deletes_exactly_the_files_no_retained_checkpoint_refers_to(
        tmp_path_factory: pytest.TempPathFactory, seed: int, retained: int,
        steps: int) -> None:
    print(f"incremental retention seed={seed} retained={retained} steps={steps}")
    rng = random.Random(seed)
    root = tmp_path_factory.mktemp("chk")
    j = _Job(str(root), retained)
    for _ in range(steps):
        event = rng.random()
        if event < 0.1:
            j.recovery_drops_the_newest()
        elif event < 0.2:
            j.takeover(retained)
        j.checkpoint(rng, fail=rng.random() < 0.2)
        if not j.settled:
            continue  # until a checkpoint completes: blobs and retained list disagree
        _check(j, root)
        if j.co.retained:
            latest = read_metadata(j.co.retained[-1].location)
            got = dict(read_chains(plan_restore(latest, j.dep.plan, "j-1", 2)
                                   .tasks["j-1/sum/0/g2"].groups))
            for kg, data in got.items():
                assert decode_snapshot(data) == decode_snapshot(merge_chain(j.blobs[kg]))
    # the job goes on with full checkpoints only: every earlier file goes
    for _ in range(retained + 1):
        rng_full = random.Random(0)
        j.blobs = {}
        j.checkpoint(rng_full, fail=False)
    _check(j, root)
    assert all(not any(f.startswith("../") for f in m.files()) for m in j.co.retained)


def test_the_registry_counts_each_checkpoint_once_and_frees_with_the_last(tmp_path: Path):
    def meta(cid: int, files: list[str]) -> CheckpointMetadata:
        from engine.checkpoints.metadata import TaskState, VertexState

        return CheckpointMetadata(
            cid, "checkpoint", "j", "j", 0.0, 2,
            (VertexState("v", ("v",), 1, True, False, (0, 0)),),
            (TaskState("t", "v", 0, f"own-{cid}", ((0, 0, 1, 0),),
                       chains=((0, tuple((f, 0, 1, 0) for f in files)),)),),
            location=f"{tmp_path}/chk-{cid}")

    reg = SharedFiles()
    one = meta(1, ["own-1"])
    two = meta(2, ["../chk-1/own-1", "own-2"])
    reg.register(one)
    reg.register(one)  # twice: counted once
    reg.register(two)
    assert reg.count(f"{tmp_path}/chk-1/own-1") == 2
    assert reg.release(one) == []
    assert reg.release(one) == []  # not registered any more
    assert reg.release(two) == [f"{tmp_path}/chk-1/own-1", f"{tmp_path}/chk-2/own-2"]
    assert reg.files() == set()


def test_a_delta_on_a_chain_the_coordinator_does_not_hold_fails_the_checkpoint(tmp_path):
    j = _Job(str(tmp_path), 2)
    co, dep = j.co, j.dep
    [trigger] = co.trigger(dep)
    names = dep.task_names()
    out: list[cc.Command] = []
    for n in names:
        out = co.on_report(CheckpointAck(n, 1, "", (), None, (), 0, 0.0, 0.0, 0.0, (),
                                         (0,) if n == dep.tasks["sum"][0] else ()))
    assert isinstance(out[0], cc.NotifyAborted)
    assert co.latest is None and "last complete checkpoint is -1" in co.last_failure


def test_deltas_on_a_checkpoint_newer_than_the_jobs_last_fail_the_checkpoint(tmp_path):
    """Review finding 9: a task that heard checkpoint 2 complete while the JobMaster (one
    that took over, say) knows only checkpoint 1 writes deltas holding the changes since
    2; put on 1's chains they would lose the changes between. The checkpoint fails (the
    tasks then write every group whole); on the right base it completes."""
    j = _Job(str(tmp_path), 2)
    j.checkpoint(random.Random(0), fail=False)
    co, dep = j.co, j.dep
    sum0 = dep.tasks["sum"][0]
    mine = next(kg for kg in range(N) if dep.assignments["sum"][kg] == 0)

    def ack_all(base: int) -> list[cc.Command]:
        [trigger] = co.trigger(dep)
        out: list[cc.Command] = []
        for n in dep.task_names():
            out = co.on_report(CheckpointAck(n, trigger.checkpoint_id, "", (), None, (), 0,
                                             0.0, 0.0, 0.0, (), (mine,) if n == sum0 else (),
                                             base))
        return out

    out = ack_all(base=2)
    assert isinstance(out[0], cc.NotifyAborted) and co.latest.checkpoint_id == 1
    assert (f"task {sum0} wrote key groups as changes to checkpoint 2, but the job's last "
            "complete checkpoint is 1") in co.last_failure
    out = ack_all(base=1)
    assert isinstance(out[0], cc.WriteMetadata)


def test_the_task_records_the_checkpoint_its_chains_build_on():
    from engine.state.incremental import Chain, ChainRecord

    rec = ChainRecord()
    assert rec.base_checkpoint == -1
    rec.taken(3, {0: Chain(0, 10, 0)}, {}, {})
    rec.completed(7)  # a savepoint or a checkpoint the task took no part in: no base
    assert rec.base_checkpoint == -1
    rec.completed(3)
    assert rec.base_checkpoint == 3 and rec.base(0) == Chain(0, 10, 0)
    rec.taken(4, {0: Chain(1, 10, 5)}, {}, {})
    rec.aborted(4)
    assert rec.base_checkpoint == -1 and rec.base(0) is None


def test_a_savepoint_is_triggered_as_one_and_never_registered(tmp_path):
    j = _Job(str(tmp_path), 2)
    [trigger] = j.co.trigger(j.dep, cc.CheckpointKind.SAVEPOINT, str(tmp_path / "sp"))
    assert isinstance(trigger, cc.TriggerTasks) and trigger.savepoint
    for n in j.dep.task_names():
        _execute(j.co, j.co.on_report(CheckpointAck(n, 1, "", (), None, (), 0, 0.0, 0.0,
                                                    0.0)))
    assert j.co.shared.files() == set() and not j.co.retained


def test_a_corrupt_or_missing_link_is_a_restore_error_naming_the_file(tmp_path):
    rng = random.Random(3)
    j = _Job(str(tmp_path / "chk"), 3)
    for _ in range(4):
        j.checkpoint(rng, fail=False)
    latest = j.co.retained[-1]
    links = sorted((f, o) for t in latest.tasks for _, chain in t.chains
                   for f, o, _, _ in chain if f.startswith("../"))
    assert links, "the last checkpoint refers to no earlier file: the test proves nothing"
    victim = link_uri(latest.location, links[0][0])
    data = bytearray(Path(victim).read_bytes())
    data[links[0][1]] ^= 0xFF
    Path(victim).write_bytes(bytes(data))
    plan = plan_restore(read_metadata(latest.location), j.dep.plan, "j-1", 2)
    with pytest.raises(RestoreError, match=os.path.basename(victim)) as err:
        for r in plan.tasks.values():
            read_chains(r.groups)
    assert err.value.path == victim
    os.remove(victim)
    with pytest.raises(RestoreError, match="cannot read"):
        for r in plan.tasks.values():
            read_chains(r.groups)


def test_incremental_checkpoints_is_a_validated_job_option() -> None:
    assert JobConfig().incremental_checkpoints is False
    with pytest.raises(ConfigError, match="incremental_checkpoints"):
        JobConfig(incremental_checkpoints="yes")  # type: ignore[arg-type]


def test_the_participant_writes_deltas_savepoints_whole_and_all_whole_after_an_abort():
    from types import SimpleNamespace

    from engine.state.incremental import is_delta
    from engine.state.keyed import KeyedStateBackend, ValueState
    from engine.task.checkpointing import CheckpointParticipant
    from engine.time.clock import ManualClock
    from engine.wire.messages import CheckpointAborted, CheckpointBarrier, CheckpointComplete
    from tests.unit.test_task_participants import FakeChain, FakeHost, FakeRouter

    b = KeyedStateBackend(4)
    for kg in range(4):
        b.own(kg)
        b.set_current(f"k{kg}", kg)
        ValueState(b, "v").update(kg)
    b.set_current("k0", 0)  # the current key stays recorded at a snapshot: keep it in kg 0
    spec = SimpleNamespace(task_name="t", vertex="v", task_index=0,
                           operators=(SimpleNamespace(name="op", kind="reduce"),),
                           config=JobConfig(checkpoint_interval_s=60.0,
                                            incremental_checkpoints=True))
    router = FakeRouter()
    p = CheckpointParticipant(FakeHost(), spec, FakeChain(b), router,  # type: ignore[arg-type]
                              ManualClock())
    p.set_channels([1])
    h = p.handlers()

    def take(cid: int, savepoint: bool = False) -> Any:
        p.on_barrier(1, CheckpointBarrier(cid, "loc", False, savepoint))
        snap = p.snapshots.pop()
        assert router.sent[-1] == ("all", CheckpointBarrier(cid, "loc", False, savepoint))
        return snap

    first = take(1)
    assert (first.deltas, first.unchanged, len(first.groups)) == ((), (), 4)
    h[CheckpointComplete](CheckpointComplete(1))
    b.set_current("k0", 0)
    ValueState(b, "v").update(100)
    sp = take(2, savepoint=True)
    assert (sp.deltas, sp.unchanged, len(sp.groups)) == ((), (), 4)
    assert not any(is_delta(data) for _, data in sp.groups)
    h[CheckpointComplete](CheckpointComplete(2))
    third = take(3)  # relative to checkpoint 1: the savepoint reset nothing
    assert third.deltas == (0,) and third.unchanged == (1, 2, 3)
    assert is_delta(dict(third.groups)[0])
    h[CheckpointAborted](CheckpointAborted(3))
    fourth = take(4)
    assert (fourth.deltas, fourth.unchanged, len(fourth.groups)) == ((), (), 4)
