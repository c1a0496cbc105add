"""The durable job record (issue 30): ``DurableRecord`` and its file format
(``engine.checkpoints.durable_record``), its conversion from and to a ``JobRecord``
(``engine.control.durable``) and its fenced store (``engine.checkpoints.job_store``). No Ray."""

from __future__ import annotations

import dataclasses
import os
import pickle
import threading
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from engine.api import StreamJob
from engine.checkpoints.durable_record import FORMAT, DurableRecord
from engine.checkpoints.job_store import LEADER_DIR, RECORD_FILE, JobRecordStore, marker_name
from engine.checkpoints.metadata import CheckpointKind, CheckpointMetadata
from engine.control.arbiter import Action, ActionKind, Running
from engine.control.durable import (
    changed_logic,
    controllers_of,
    dump_user_code,
    durable_of,
    job_record_of,
)
from engine.control.job_state import JobRecord
from engine.control.reconfiguration import DecisionRecord, RescaleRecord
from engine.control.steps import ReplaceOperator
from engine.dataflow import graph as g
from engine.dataflow.deployment import task_name
from engine.dataflow.keygroups import uniform_assignment
from engine.errors import (
    CodecError,
    ControlPlaneError,
    JobRecordUnreadable,
    RestoreError,
    StaleJobMaster,
)
from engine.io.testing import TestingSink, TestingSource
from engine.names import JobState
from engine.operators.builtin import with_function
from engine.wire.codec import pack_exact, unpack_exact

HYPOTHESIS_SEED = 3030
JOB = "job-7"


# ---------------------------------------------------------------------- a real job record


def graph() -> g.JobGraph:
    job = StreamJob("durable", num_key_groups=8)
    (job.source(TestingSource([(1, 1), (2, 5)]), name="src", parallelism=1)
        .map(lambda r: r, name="pre", parallelism=2)
        .key_by(lambda r: r[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]), name="sum", parallelism=2)
        .map(lambda r: r, name="post")
        .sink(TestingSink(), name="out"))
    return job.graph()


def _scaled(k: int) -> Callable[[Any], Any]:
    # a closure: cloudpickle stores it by value, so the record carries the code itself
    def scaled(r: Any) -> Any:
        return (r[0], r[1] * k)
    return scaled


def _changed(r: JobRecord, operator: str, fn: Any) -> JobRecord:
    """``r`` after a change of logic of ``operator`` to ``fn``, as the runtime does it."""
    op = next(o for v in r.plan.vertices for o in v.operators if o.name == operator)
    new = with_function(op, fn)
    return r.logic_changed(new, ReplaceOperator(new).apply(r.deployment).plan)


def _rescaled(r: JobRecord, vertex: str, p: int) -> JobRecord:
    """``r`` after a rescale of ``vertex`` to ``p`` tasks, as the runtime does it."""
    gen = r.next_generation
    keyed = r.plan.vertex(vertex).keyed
    dep = r.deployment.with_vertex(
        vertex, tuple(task_name(JOB, vertex, i, gen) for i in range(p)),
        uniform_assignment(r.plan.num_key_groups, p) if keyed else None, generation=gen)
    rec = RescaleRecord(vertex, "drrs", r.plan.vertex(vertex).parallelism, p, 1.0, 2.0, 3,
                        1000, False, 50.0, 7, 1.5, 9.0, 0.25, by="handle")
    return r.deployed(dep).rescale_measured(rec)


def lived(gr: g.JobGraph) -> JobRecord:
    """A record that lived: deployed with partitions, a change of logic before and one
    after a rescale, a restart, a checkpoint, an action running, decisions."""
    r = JobRecord.initial(JOB, gr)
    r = r.deployed(r.deployment.with_partitions({"src": ("p0", "p1", "p2")}))
    r = r.with_status(JobState.RUNNING)
    r = _changed(r, "post", _scaled(10))      # then its vertex rescales: 2 -> 3
    r = _rescaled(r, "sum", 3)
    r = _rescaled(r, "pre", 4)                 # then its logic changes at 4 tasks
    r = _changed(r, "pre", _scaled(2))
    r = r.restart_began("task x died").restarted().noted("checkpoint 3 skipped")
    meta = CheckpointMetadata(4, CheckpointKind.CHECKPOINT, JOB, "durable", 0.0, 8, (), (),
                              location="/tmp/chk/job-7/chk-4")
    r = r.checkpoint_completed(meta)
    r = r.with_actions([Running(5, Action(ActionKind.RESCALE, frozenset({"sum", "pre"}))),
                        Running(6, Action(ActionKind.CHECKPOINT, exclusive=True,
                                          label="stop-restart"))])
    return r.with_decisions([DecisionRecord(1.0, "ds2", "scale", "sum", "scale sum to 3",
                                            "busy", "executed", "ok", 2.0, 1, 1.0)])


def _plain_op(op: g.OperatorDef) -> tuple[Any, ...]:
    """An operator without its functions (they compare by identity)."""
    return (op.name, op.kind, op.parallelism, op.dead_letter,
            tuple((i.upstream, i.port, i.key_fn is None) for i in op.inputs))


def _plain_plan(plan: Any) -> tuple[Any, ...]:
    return (tuple((v.name, v.parallelism, tuple(_plain_op(o) for o in v.operators))
                  for v in plan.vertices),
            tuple((e.edge_id, e.src, e.dst, e.partitioning, e.port) for e in plan.edges),
            plan.num_key_groups)


def assert_same(a: JobRecord, b: JobRecord, changed: frozenset[str]) -> None:
    """``a`` and ``b`` are equal on every field; operators in ``changed`` (unpickled
    copies) are equal but for their functions' identity, everything else is ``==``."""
    assert dataclasses.replace(a, graph=b.graph, deployment=b.deployment,
                               graph_plan=b.graph_plan) == b
    # the user's plan carries the changed functions too (a restart runs them)
    assert _plain_plan(a.graph_plan) == _plain_plan(b.graph_plan)
    for va, vb in zip(a.graph_plan.vertices, b.graph_plan.vertices, strict=True):
        for x, y in zip(va.operators, vb.operators, strict=True):
            assert (x is not y) if x.name in changed else (x == y)
    for x, y in zip(a.graph.operators, b.graph.operators, strict=True):
        if x.name in changed:
            assert x is not y and _plain_op(x) == _plain_op(y)
        else:
            assert x == y
    da, db = a.deployment, b.deployment
    assert (da.job_id, da.tasks, da.assignments, da.generation, da.partitions) == \
        (db.job_id, db.tasks, db.assignments, db.generation, db.partitions)
    assert _plain_plan(da.plan) == _plain_plan(db.plan)
    if not changed:
        assert da == db


# ---------------------------------------------------------------------- JobRecord <-> record


def test_a_fresh_record_round_trips_exactly() -> None:
    gr = graph()
    r = JobRecord.initial(JOB, gr)
    d = durable_of(r, 1, 1, changed_logic(r, gr), [])
    assert d.logic == {} and d.parallelism == {"src": 1, "pre": 2, "sum": 2}
    back = job_record_of(DurableRecord.decode(d.encode(), "/x/_job"), gr)
    assert back == r
    assert back.plan is back.graph_plan  # no rescale: the graph's plan itself


def test_a_record_that_lived_rebuilds_after_rescales_and_changes_of_logic() -> None:
    gr = graph()
    r = lived(gr)
    # what the scenario did, so the round trip below is not vacuous
    assert {v.name: v.parallelism for v in r.plan.vertices} == {"src": 1, "pre": 4, "sum": 3}
    assert r.graph.operator("post").parallelism == 2 and \
        r.plan.vertex_of("post").parallelism == 3
    logic = changed_logic(r, gr)
    assert set(logic) == {"post", "pre"}
    d = durable_of(r, 3, 9, logic, [dump_user_code({"controller": "ds2", "n": 1})])
    data = d.encode()
    back_d = DurableRecord.decode(data, "/x/_job")
    assert back_d == d and (back_d.master_epoch, back_d.next_checkpoint_id) == (3, 9)
    back = job_record_of(back_d, gr, path="/x/_job")
    assert_same(back, r, frozenset({"post", "pre"}))
    # the rebuilt plan runs at the recorded parallelisms, the new functions in it
    assert {v.name: v.parallelism for v in back.plan.vertices} == \
        {"src": 1, "pre": 4, "sum": 3}
    post = back.plan.vertex_of("post")
    assert [o.name for o in post.operators] == ["sum", "post", "out"]
    assert next(o for o in post.operators if o.name == "post").fn((1, 4)) == (1, 40)
    assert back.graph.operator("post").fn((1, 4)) == (1, 40)
    assert back.plan.vertex("pre").head.fn((2, 3)) == (2, 6)
    assert back.graph.operator("post").fn is not r.graph.operator("post").fn
    assert gr.operator("post").fn((1, 4)) == (1, 4)  # the user's graph is untouched
    assert controllers_of(back_d) == [{"controller": "ds2", "n": 1}]
    # and once more through the rebuilt record: a fixed point
    again = durable_of(back, 3, 9, changed_logic(back, gr), back_d.controllers)
    assert dataclasses.replace(again, logic={}) == dataclasses.replace(d, logic={})


def test_a_record_of_another_graph_or_with_bad_user_code_is_refused_naming_the_path() -> None:
    gr = graph()
    d = durable_of(lived(gr), 1, 1, changed_logic(lived(gr), gr), [b"\x80\x04junk"])
    other = StreamJob("other", num_key_groups=8)
    other.source(TestingSource([1]), name="src").sink(TestingSink(), name="out")
    with pytest.raises(JobRecordUnreadable, match="/r/_job") as exc:
        job_record_of(d, other.graph(), path="/r/_job")
    assert (exc.value.reason, exc.value.job, exc.value.path) == ("mismatch", JOB, "/r/_job")
    with pytest.raises(JobRecordUnreadable, match="controller 0") as exc:
        controllers_of(d, path="/r/_job")
    assert exc.value.reason == "user-code"
    bad = dataclasses.replace(d, logic={"pre": dump_user_code(gr.operator("sum"))})
    with pytest.raises(JobRecordUnreadable, match="'pre'") as exc:
        job_record_of(bad, gr, path="/r/_job")
    assert exc.value.reason == "mismatch"
    short = dataclasses.replace(d, assignments={**d.assignments, "sum": (0, 1, 2)})
    with pytest.raises(JobRecordUnreadable, match="does not fit"):
        job_record_of(short, gr, path="/r/_job")  # 3 key groups assigned of the graph's 8


# ---------------------------------------------------------------------- the format


def _record(**changes: Any) -> DurableRecord:
    base = DurableRecord(JOB, "durable", 2, JobState.RUNNING, parallelism={"a": 2},
                         tasks={"a": ("t0", "t1")}, assignments={"a": (0, 1, 1, 0)})
    return dataclasses.replace(base, **changes)


@st.composite
def records(draw: st.DrawFn) -> DurableRecord:
    text = st.text(max_size=12)
    names = draw(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=4,
                          unique=True))
    par = {v: draw(st.integers(1, 4)) for v in names}
    tasks = {v: tuple(draw(st.lists(text, min_size=p, max_size=p))) for v, p in par.items()}
    keyed = draw(st.lists(st.sampled_from(names), unique=True))
    assignments = {v: tuple(draw(st.lists(st.integers(0, par[v] - 1), min_size=1,
                                          max_size=8))) for v in keyed}
    sources = draw(st.lists(st.sampled_from(names), unique=True))
    partitions = {v: tuple(draw(st.lists(text, max_size=3))) for v in sources}
    restarts = draw(st.integers(0, 5))
    action = st.tuples(st.integers(0, 99), text, st.lists(text, max_size=2).map(tuple),
                       st.booleans(), st.booleans(), text)
    return DurableRecord(
        job_id=draw(st.text(min_size=1, max_size=10)), name=draw(text),
        master_epoch=draw(st.integers(0, 2**40)),
        status=draw(st.sampled_from(list(JobState))), error=draw(text),
        error_suffix=draw(text), epoch=restarts + draw(st.integers(0, 3)), restarts=restarts,
        last_failure=draw(text),
        checkpoint=draw(st.none() | st.tuples(st.integers(0, 2**31), st.sampled_from(
            ["checkpoint", "savepoint"]), text)),
        next_checkpoint_id=draw(st.integers(1, 2**40)), generation=draw(st.integers(0, 99)),
        parallelism=par, tasks=tasks, assignments=assignments, partitions=partitions,
        actions=tuple(draw(st.lists(action, max_size=3))),
        rescales=tuple(draw(st.lists(st.binary(max_size=20), max_size=3))),
        decisions=tuple(draw(st.lists(st.binary(max_size=20), max_size=3))),
        logic=draw(st.dictionaries(text, st.binary(max_size=20), max_size=3)),
        controllers=tuple(draw(st.lists(st.binary(max_size=20), max_size=2))))


def test_random_records_round_trip_through_their_bytes() -> None:
    print(f"hypothesis seed={HYPOTHESIS_SEED}")
    seen: list[DurableRecord] = []

    @seed(HYPOTHESIS_SEED)
    @settings(max_examples=150, deadline=None, print_blob=True)
    @given(records())
    def round_trip(rec: DurableRecord) -> None:
        assert DurableRecord.decode(rec.encode(), "/p/_job") == rec
        seen.append(rec)

    round_trip()
    assert len(seen) >= 100 and any(r.checkpoint for r in seen) and any(r.actions for r in seen)


@pytest.mark.parametrize("bad", [
    {"epoch": 1, "restarts": 2}, {"master_epoch": -1}, {"next_checkpoint_id": 0},
    {"tasks": {"a": ("t0",)}}, {"assignments": {"a": (0, 2)}}, {"assignments": {"b": (0,)}},
    {"partitions": {"b": ()}}, {"status": "dancing"}, {"generation": True},
    {"checkpoint": (1, "snapshot", "/x")}, {"actions": ((1, "rescale", ("a",), 0, False, ""),)},
    {"rescales": ("text",)}, {"job_id": ""},
])
def test_an_inconsistent_record_is_refused_at_construction(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        _record(**bad)


def _reframed(rec: DurableRecord, body: Any, version: int = FORMAT) -> bytes:
    raw = pack_exact(body)
    return pack_exact([version, zlib.crc32(raw), raw])


def _without(rec: DurableRecord, name: str) -> bytes:
    body = rec.to_wire()
    del body[name]
    return _reframed(rec, body)


@pytest.mark.parametrize(("mangle", "reason", "says"), [
    (lambda rec: b"", "foreign", "not a reflow job record"),
    (lambda rec: b"\xc1garbage", "foreign", "not a reflow job record"),
    (lambda rec: pack_exact({"job_id": JOB}), "foreign", "not a reflow job record"),
    (lambda rec: rec.encode()[:-7], "foreign", "not a reflow job record"),
    (lambda rec: _reframed(rec, rec.to_wire(), FORMAT + 1), "version", "format 2"),
    (lambda rec: rec.encode()[:-3] + b"zzz", "corrupt", "checksum"),
    (lambda rec: _without(rec, "generation"), "incomplete", "'generation' is missing"),
    (lambda rec: _reframed(rec, {**rec.to_wire(), "epoch": "two"}), "corrupt", "epoch"),
    (lambda rec: _reframed(rec, [1, 2]), "corrupt", "not a map"),
])
def test_bytes_that_are_no_record_raise_naming_the_path_and_the_job(
        mangle: Callable[[DurableRecord], bytes], reason: str, says: str) -> None:
    rec = _record()
    with pytest.raises(JobRecordUnreadable, match=says) as exc:
        DurableRecord.decode(mangle(rec), "s3://b/chk/job-7/_job", JOB)
    err = exc.value
    assert isinstance(err, RestoreError)
    assert (err.path, err.job, err.reason) == ("s3://b/chk/job-7/_job", JOB, reason)
    assert "s3://b/chk/job-7/_job" in str(err) and JOB in str(err)
    again = pickle.loads(pickle.dumps(err))  # it crosses actor boundaries
    assert (again.path, again.job, again.reason) == (err.path, err.job, err.reason)


def test_the_file_is_plain_msgpack_with_the_format_first() -> None:
    outer = unpack_exact(_record().encode())
    assert outer[0] == FORMAT and unpack_exact(outer[2])["job_id"] == JOB
    assert unpack_exact(outer[2])["user_code"]["codec"] == "cloudpickle-user-code"


# ---------------------------------------------------------------------- the store


def test_claims_give_increasing_epochs_across_stores(tmp_path: Path) -> None:
    job_dir = str(tmp_path / JOB)
    a, b = JobRecordStore(job_dir), JobRecordStore(job_dir)
    assert a.job_id == JOB and a.path == f"{job_dir}/_job"
    assert (a.fenced(0), a.epochs()) == (None, [])
    assert [a.claim(), b.claim(), a.claim()] == [1, 2, 3]
    assert sorted(os.listdir(tmp_path / JOB / LEADER_DIR)) == \
        [".lock", marker_name(1), marker_name(2), marker_name(3)]
    assert (a.fenced(1), a.fenced(2), a.fenced(3)) == (3, 3, None)


def test_concurrent_claims_never_get_the_same_epoch(tmp_path: Path) -> None:
    job_dir = str(tmp_path / JOB)
    stores = [JobRecordStore(job_dir) for _ in range(8)]
    start = threading.Barrier(len(stores))

    def claims(store: JobRecordStore) -> list[int]:
        start.wait()
        return [store.claim() for _ in range(6)]

    with ThreadPoolExecutor(len(stores)) as pool:
        got = [e for es in pool.map(claims, stores) for e in es]
    assert sorted(got) == list(range(1, 49))


def test_a_local_claim_skips_a_marker_it_finds_taken(tmp_path: Path) -> None:
    store = JobRecordStore(str(tmp_path / JOB))
    assert store.claim() == 1
    # a claim that listed before another's marker appeared: O_EXCL makes it take the next
    (tmp_path / JOB / LEADER_DIR / marker_name(2)).touch()
    assert store._claim_local(2) == 3


def test_a_stale_jobmaster_cannot_write_and_the_record_stays(tmp_path: Path) -> None:
    job_dir = str(tmp_path / JOB)
    old, new = JobRecordStore(job_dir), JobRecordStore(job_dir)
    e_old = old.claim()
    old.write(_record(master_epoch=e_old, last_failure="old"))
    e_new = new.claim()
    before = (tmp_path / JOB / RECORD_FILE).read_bytes()
    with pytest.raises(StaleJobMaster, match=f"epoch {e_old} is stale.*epoch {e_new}") as exc:
        old.write(_record(master_epoch=e_old, last_failure="late"))
    err = exc.value
    assert isinstance(err, ControlPlaneError)
    assert (err.job, err.epoch, err.newer_epoch) == (JOB, e_old, e_new)
    again = pickle.loads(pickle.dumps(err))
    assert (again.epoch, again.newer_epoch) == (e_old, e_new)
    assert (tmp_path / JOB / RECORD_FILE).read_bytes() == before
    assert sorted(os.listdir(tmp_path / JOB)) == [RECORD_FILE, LEADER_DIR]  # no tmp left
    new.write(_record(master_epoch=e_new, last_failure="new"))
    got = old.read()
    assert got is not None and got.last_failure == "new"


def test_reading_no_record_gives_none_and_a_half_written_one_is_never_read(
        tmp_path: Path) -> None:
    store = JobRecordStore(str(tmp_path / "nowhere" / JOB))
    assert store.read() is None
    store = JobRecordStore(str(tmp_path / JOB))
    store.claim()
    (tmp_path / JOB / f"{RECORD_FILE}.tmp-1").write_bytes(_record().encode()[:20])
    assert store.read() is None
    store.write(_record(master_epoch=1, generation=4))
    (tmp_path / JOB / f"{RECORD_FILE}.tmp-2").write_bytes(b"half")
    got = store.read()
    assert got is not None and got.generation == 4


def test_a_failed_write_leaves_the_previous_record(tmp_path: Path) -> None:
    store = JobRecordStore(str(tmp_path / JOB))
    epoch = store.claim()
    store.write(_record(master_epoch=epoch, generation=1))
    with pytest.raises(CodecError):  # a lone surrogate has no UTF-8
        store.write(_record(master_epoch=epoch, generation=2, error="\ud800"))
    assert store.read() == _record(master_epoch=epoch, generation=1)
    # the store refuses the temporary file: nothing replaces the record either
    (tmp_path / JOB / f"{RECORD_FILE}.tmp-{epoch}").mkdir()
    with pytest.raises(OSError):
        store.write(_record(master_epoch=epoch, generation=3))
    assert store.read() == _record(master_epoch=epoch, generation=1)


def test_a_corrupt_or_foreign_record_file_raises_naming_path_and_job(tmp_path: Path) -> None:
    store = JobRecordStore(str(tmp_path / JOB))
    (tmp_path / JOB).mkdir()
    (tmp_path / JOB / RECORD_FILE).write_bytes(b"\x93\x01")
    with pytest.raises(JobRecordUnreadable) as exc:
        store.read()
    assert (exc.value.path, exc.value.job) == (store.path, JOB)
    assert store.path in str(exc.value) and JOB in str(exc.value)
    (tmp_path / JOB / RECORD_FILE).write_bytes(_record(job_id="job-8").encode())
    with pytest.raises(JobRecordUnreadable, match="record of job job-8") as exc:
        store.read()
    assert exc.value.reason == "foreign"


def test_a_store_that_is_no_local_directory_claims_writes_and_fences() -> None:
    # pyarrow's in-memory filesystem takes the check-then-write path of object stores
    store = JobRecordStore(f"mock:///chk/{JOB}")
    assert store.read() is None and store.job_id == JOB
    assert [store.claim(), store.claim()] == [1, 2]
    store.write(_record(master_epoch=2, generation=5))
    got = store.read()
    assert got is not None and got.generation == 5
    with pytest.raises(StaleJobMaster):
        store.write(_record(master_epoch=1))
    assert store.fenced(1) == 2 and store.fenced(2) is None


def test_a_claim_removes_the_temporary_records_older_epochs_left(tmp_path: Path) -> None:
    store = JobRecordStore(str(tmp_path / JOB))
    assert store.claim() == 1
    (tmp_path / JOB / f"{RECORD_FILE}.tmp-1").write_bytes(b"died before its move")
    assert store.claim() == 2
    assert sorted(os.listdir(tmp_path / JOB)) == [LEADER_DIR]



class _ClaimMidWrite(JobRecordStore):
    """A store whose next write meets a newer claim right after its first check for one,
    before its move: the race a stale JobMaster's write runs against a new JobMaster."""

    def __init__(self, job_dir: str, rival: JobRecordStore) -> None:
        super().__init__(job_dir)
        self.rival = rival
        self.armed = False
        self.claimed: list[int] = []

    def _stale(self, rec: DurableRecord) -> StaleJobMaster | None:
        found = super()._stale(rec)
        if self.armed:
            self.armed = False
            self.claimed.append(self.rival.claim())
        return found


def test_no_write_of_an_older_epoch_lands_once_a_newer_claim_returned(tmp_path: Path) -> None:
    job_dir = str(tmp_path / JOB)
    old = _ClaimMidWrite(job_dir, JobRecordStore(job_dir))
    epoch = old.claim()
    old.write(_record(master_epoch=epoch, generation=1))
    before = (tmp_path / JOB / RECORD_FILE).read_bytes()
    old.armed = True
    with pytest.raises(StaleJobMaster) as exc:
        old.write(_record(master_epoch=epoch, generation=2))
    assert old.claimed == [epoch + 1] and exc.value.newer_epoch == epoch + 1
    assert (tmp_path / JOB / RECORD_FILE).read_bytes() == before
    assert sorted(os.listdir(tmp_path / JOB)) == [RECORD_FILE, LEADER_DIR]


def test_the_allocators_of_a_jobmaster_survive_its_record():
    from engine.dataflow.deployment import ChannelIds

    ids = ChannelIds()
    a, b = ids.get(0, "j/src/0/g0", "j/sum/0/g0"), ids.get(1, "j/sum/0/g0", "j/out/0/g0")
    ids.get(0, "j/src/0/g0", "j/gone/0/g0")  # a task no longer deployed: not kept
    live = ids.live({"j/src/0/g0", "j/sum/0/g0", "j/out/0/g0"})
    rec = _record(channels=live, next_channel_id=ids.next_id,
                  next_subscale_id=7)
    back = DurableRecord.decode(rec.encode(), "/x/_job")
    assert back.channels == ((0, "j/src/0/g0", "j/sum/0/g0", a),
                             (1, "j/sum/0/g0", "j/out/0/g0", b))
    again = ChannelIds()
    again.restore(back.channels, back.next_channel_id)
    assert again.get(0, "j/src/0/g0", "j/sum/0/g0") == a  # the live tasks' ids
    assert again.get(2, "j/sum/0/g0", "j/out/0/g0") == 3  # new ones after every old one
    assert back.next_subscale_id == 7
    with pytest.raises(ValueError):
        dataclasses.replace(rec, channels=((0, "a", "b", 9),), next_channel_id=3)
