"""SST-level incremental checkpoints of the RocksDB backend (engine.state.sst_checkpoints),
without Ray: the task's record of its uploads, the backend's DB checkpoint read back as
key-group blobs, and a chain of checkpoints through ``persist``, the coordinator, the
store's retention and ``read_chains`` on real RocksDB files in a temporary directory.

Why: a checkpoint that links an SST file of an earlier one is only as good as three
promises: the record links only files a complete checkpoint of the same job uploaded;
the DB checkpoint is a consistent cut that reads back as the groups were; retention
deletes exactly the files no retained checkpoint names. Each test breaks one of them
when the code does (the oracle, ``test_incremental_jobs``, covers the participant).
"""

from __future__ import annotations

import dataclasses
import os
import random
import zlib
from pathlib import Path
from typing import Any

import pytest

from engine.checkpoints import coordinator as cc
from engine.checkpoints import snapshot as snapshot_module
from engine.checkpoints.metadata import (
    _HEADER,
    MAGIC,
    CheckpointMetadata,
    TaskState,
    VertexState,
)
from engine.checkpoints.restore import plan_restore
from engine.checkpoints.shared import files_of
from engine.checkpoints.snapshot import TaskSnapshot, persist, read_chains
from engine.checkpoints.store import (
    complete_checkpoints,
    directory_name,
    discard,
    discard_files,
    link_uri,
    parent_location,
    part_file_name,
    read_metadata,
    write_metadata,
)
from engine.dataflow.config import JobConfig
from engine.dataflow.deployment import initial_deployment
from engine.errors import RestoreError
from engine.state.backends import RESTORE_PREFIX
from engine.state.keyed import (
    EVENT_TIME,
    PROCESSING_TIME,
    ListState,
    MapState,
    ValueState,
    decode_snapshot,
)
from engine.state.rocksdb import RocksDBKeyedStateBackend, groups_from_checkpoint
from engine.state.sst_checkpoints import DbCheckpoint, SstRecord, db_folder, index_name
from engine.time.clock import ManualClock
from engine.wire.codec import pack_exact
from engine.wire.messages import CheckpointAck, CheckpointDeclined
from tests.unit.test_checkpoints import N, job

JOB = "/store/j-1"
PART = part_file_name("sum", 0)
FOLDER = db_folder(PART, "inst-1")
EMPTY: Any = ({}, set())


# ------------------------------------------------------------------ SstRecord (pure)

def _plan(rec: SstRecord, cid: int, files: dict[str, int], job_dir: str = JOB) -> dict[str, Any]:
    """``name -> link`` (uploaded: ``<folder>/<name>``; linked: ``../chk-<n>/...``)."""
    db = DbCheckpoint(f"/local/chk-{cid}", files, {0: ("v",)}, "inst-1")
    plan = rec.plan(cid, job_dir, f"chk-{cid}", PART, N, db)
    out = {}
    for link, size, upload in plan.files:
        assert size == files[link.rsplit("/", 1)[-1]]
        assert upload == (not link.startswith("../")), link
        out[link.rsplit("/", 1)[-1]] = link
    assert plan.groups == ((0, ("v",)),) and plan.folder == FOLDER
    return out


META = {"MANIFEST-000005": 250, "CURRENT": 16, "OPTIONS-000007": 7579, "000004.log": 0,
        "rocksdict-config.json": 40}


def test_the_first_plan_uploads_every_file_into_the_tasks_folder():
    got = _plan(SstRecord(), 1, {**META, "000008.sst": 100})
    assert got == {n: f"{FOLDER}/{n}" for n in {**META, "000008.sst": 0}}


def test_after_completion_same_size_ssts_are_linked_and_new_ones_and_other_files_uploaded():
    rec = SstRecord()
    _plan(rec, 1, {**META, "000008.sst": 100, "000009.sst": 50})
    rec.completed(1)
    got = _plan(rec, 2, {**META, "000008.sst": 100, "000009.sst": 51, "000012.sst": 7})
    assert got["000008.sst"] == f"../chk-1/{FOLDER}/000008.sst"
    assert got["000009.sst"] == f"{FOLDER}/000009.sst"  # another size: not that file
    assert got["000012.sst"] == f"{FOLDER}/000012.sst"
    assert all(got[n] == f"{FOLDER}/{n}" for n in META), "non-SST files are never shared"
    rec.completed(2)
    got = _plan(rec, 3, {**META, "000008.sst": 100, "000012.sst": 7})
    assert got["000008.sst"] == f"../chk-1/{FOLDER}/000008.sst"  # where it was uploaded
    assert got["000012.sst"] == f"../chk-2/{FOLDER}/000012.sst"


def test_a_checkpoint_in_another_job_directory_links_nothing():
    rec = SstRecord()
    _plan(rec, 1, {"000008.sst": 100})
    rec.completed(1)
    assert _plan(rec, 2, {"000008.sst": 100}, job_dir="/store/j-2") == {
        "000008.sst": f"{FOLDER}/000008.sst"}


def test_after_an_abort_the_next_plan_uploads_every_file():
    rec = SstRecord()
    _plan(rec, 1, {"000008.sst": 100})
    rec.completed(1)
    _plan(rec, 2, {"000008.sst": 100, "000009.sst": 5})
    rec.aborted(2)
    got = _plan(rec, 3, {"000008.sst": 100, "000009.sst": 5})
    assert not any(link.startswith("../") for link in got.values())


def test_a_timeout_keeps_what_complete_checkpoints_hold_and_drops_only_its_own_uploads():
    """Review finding 5: a failure other than a refused link leaves the retained
    checkpoints as they were, so the next checkpoint still names their files (not the
    whole DB again); the failed one's uploads (its directory is deleted) never are."""
    rec = SstRecord()
    _plan(rec, 1, {"000008.sst": 100})
    rec.completed(1)
    _plan(rec, 2, {"000008.sst": 100, "000009.sst": 5})
    rec.aborted(2, forget_uploads=False)
    assert _plan(rec, 3, {"000008.sst": 100, "000009.sst": 5}) == {
        "000008.sst": f"../chk-1/{FOLDER}/000008.sst", "000009.sst": f"{FOLDER}/000009.sst"}


def test_uploads_of_a_checkpoint_never_heard_complete_are_never_linked():
    rec = SstRecord()
    _plan(rec, 1, {"000008.sst": 100})
    rec.completed(7)  # a savepoint's id, say: checkpoint 1 is not confirmed by it
    assert _plan(rec, 2, {"000008.sst": 100}) == {"000008.sst": f"{FOLDER}/000008.sst"}
    _plan(rec, 3, {"000008.sst": 100, "000009.sst": 5})
    rec.completed(4)
    rec.completed(3)  # heard late, after a later one: it failed, its files may be gone
    assert _plan(rec, 5, {"000008.sst": 100, "000009.sst": 5}) == {
        "000008.sst": f"{FOLDER}/000008.sst", "000009.sst": f"{FOLDER}/000009.sst"}


def test_a_completion_heard_after_the_next_plan_names_the_newer_upload():
    """Review finding 3: checkpoint 2 was planned before the task heard 1 complete, so it
    uploaded 000008.sst again; once 2 completes too, retention deletes 1's copy, so the
    late completion of 1 must not make a later plan name it."""
    rec = SstRecord()
    _plan(rec, 1, {"000008.sst": 100})
    _plan(rec, 2, {"000008.sst": 100})  # before CheckpointComplete(1): uploads it again
    rec.completed(1)  # late
    assert _plan(rec, 3, {"000008.sst": 100}) == {"000008.sst": f"{FOLDER}/000008.sst"}
    rec.completed(3)
    assert _plan(rec, 4, {"000008.sst": 100}) == {
        "000008.sst": f"../chk-3/{FOLDER}/000008.sst"}


def test_files_no_longer_live_are_forgotten():
    rec = SstRecord()
    _plan(rec, 1, {"000008.sst": 100, "000009.sst": 5})
    rec.completed(1)
    assert _plan(rec, 2, {"000009.sst": 5}) == {"000009.sst": f"../chk-1/{FOLDER}/000009.sst"}
    assert set(rec.confirmed) == {"000009.sst"}
    rec.completed(2)
    assert _plan(rec, 3, {"000008.sst": 100})["000008.sst"] == f"{FOLDER}/000008.sst"


# ------------------------------------------------------------------ the backend's files

def _backend(path: Path, task: str = "t-0") -> RocksDBKeyedStateBackend:
    return RocksDBKeyedStateBackend(N, str(path), task=task, block_cache_bytes=1 << 20,
                                    write_buffer_bytes=1 << 20)


def _write(b: RocksDBKeyedStateBackend, rng: random.Random, keys: list[int],
           size: int = 100) -> None:
    """Each key (group ``key % N``) gets a value, a list element, a map entry and, for a
    third of them, a timer in either domain; incompressible values."""
    for k in keys:
        b.set_current(k, k % N)
        ValueState(b, "v").update(rng.randbytes(size))
        ListState(b, "l").add(rng.randrange(1000))
        MapState(b, "m").put(rng.randrange(5), str(k))
        if k % 3 == 0:
            b.add_timer(k % N, rng.randrange(10**6), k, (PROCESSING_TIME, EVENT_TIME)[k % 2])


def _state(b: RocksDBKeyedStateBackend) -> dict[int, Any]:
    return {kg: decode_snapshot(b.snapshot(kg)) for kg in b.owned()}


def test_a_db_checkpoint_reads_back_as_the_groups_were_when_it_was_taken(tmp_path):
    """The checkpoint is a cut: writes after it (new values, a removed key, a new timer, a
    group owned anew) are not in it; a group it does not hold reads back empty."""
    rng = random.Random(1)
    b = _backend(tmp_path / "db")
    for kg in range(6):
        b.own(kg)
    _write(b, rng, [k for k in range(600) if k % N < 6])
    want = _state(b)
    db = b.checkpoint_files("chk-1")
    assert db is not None and any(n.endswith(".sst") for n in db.files)
    assert {kg: sorted(names) for kg, names in db.groups.items()} == {
        kg: ["l", "m", "v"] for kg in range(6)}
    b.own(6)
    _write(b, rng, [k for k in range(0, 700, 7) if k % N < 7])
    b.set_current(8, 0)
    ValueState(b, "v").clear()
    b.add_timer(1, 5, "late", EVENT_TIME)
    assert _state(b)[0] != want[0] and _state(b)[1] != want[1]
    got = dict(groups_from_checkpoint(db.directory, N, db.groups, range(N)))
    assert {kg: decode_snapshot(data) for kg, data in got.items() if kg < 6} == want
    assert decode_snapshot(got[6]) == decode_snapshot(got[7]) == EMPTY
    assert any(timers for _, timers in want.values())
    b.close()


def test_parked_timers_make_checkpoint_files_decline_until_pushed_back(tmp_path):
    b = _backend(tmp_path / "db")
    b.own(0)
    b.set_current("k", 0)
    ValueState(b, "v").update(1)
    b.timers[0].add((10, "k", EVENT_TIME))  # the DRRS hold parks it: held in memory
    assert b.checkpoint_files("chk-1") is None
    b._push_timer(10, 0, "k", EVENT_TIME)
    db = b.checkpoint_files("chk-2")
    assert db is not None
    got = dict(groups_from_checkpoint(db.directory, N, db.groups, [0]))
    assert decode_snapshot(got[0]) == ({"v": {"k": 1}}, {(10, "k", EVENT_TIME)})
    b.close()


# ------------------------------------------------------------------ a chain of checkpoints

def _config(retained: int) -> JobConfig:
    return JobConfig(metrics_port=None, checkpoint_interval_s=10.0,
                     checkpoints_retained=retained, tolerable_checkpoint_failures=100,
                     incremental_checkpoints=True)


class _Job:
    """The vertex "sum" (2 tasks, each a RocksDB backend and an ``SstRecord``) checkpointed
    through ``persist`` and the coordinator into ``<tmp>/chk/j-1``; ``states[cid]``: every
    group's state when checkpoint ``cid`` was taken."""

    KEYS = 4000

    def __init__(self, tmp: Path, retained: int) -> None:
        self.dep = initial_deployment(job(), "j-1")
        self.root = tmp / "chk" / "j-1"
        self.co = cc.CheckpointCoordinator("j-1", "j", N, _config(retained), ManualClock(),
                                           str(self.root))
        self.names = self.dep.tasks["sum"]
        self.backends = [_backend(tmp / f"state-{i}", t) for i, t in enumerate(self.names)]
        for kg, i in enumerate(self.dep.assignments["sum"]):
            self.backends[i].own(kg)
        self.records = [SstRecord() for _ in self.names]
        self.rng = random.Random(5)
        self.states: dict[int, dict[int, Any]] = {}
        self.acks: dict[int, list[CheckpointAck]] = {}
        self.change(range(self.KEYS))

    def change(self, keys: Any) -> None:
        for i, b in enumerate(self.backends):
            _write(b, self.rng, [k for k in keys if self.dep.assignments["sum"][k % N] == i])

    def checkpoint(self, tamper: Any = None) -> list[cc.Command]:
        """One checkpoint; ``tamper(ack)``: what task sum/0 sends instead of its ack."""
        [trigger] = self.co.trigger(self.dep)
        cid, loc = trigger.checkpoint_id, trigger.location
        self.states[cid] = {kg: s for b in self.backends for kg, s in _state(b).items()}
        self.acks[cid] = []
        out: list[cc.Command] = []
        for task in self.dep.task_names():
            ack: Any = CheckpointAck(task, cid, "", (), None, (), 0, 0.0, 0.0, 0.0)
            if task in self.names:
                i = self.names.index(task)
                db = self.backends[i].checkpoint_files(f"chk-{cid}")
                assert db is not None
                plan = self.records[i].plan(cid, parent_location(loc), directory_name(loc),
                                            part_file_name("sum", i), N, db)
                ack = persist(TaskSnapshot(task, "sum", i, cid, loc, db=plan), ManualClock())
                assert isinstance(ack, CheckpointAck), ack
                assert not os.path.exists(db.directory), "persist deletes the local folder"
                ack = tamper(ack) if tamper and i == 0 else ack
                self.acks[cid].append(ack)
            out += self.execute(self.co.on_report(ack))
        return out

    def execute(self, cmds: list[cc.Command]) -> list[cc.Command]:
        done = list(cmds)
        for cmd in cmds:
            match cmd:
                case cc.WriteMetadata(metadata=meta):
                    write_metadata(meta)
                    done += self.execute(self.co.on_written(meta.checkpoint_id))
                case cc.NotifyComplete(checkpoint_id=cid):
                    for r in self.records:
                        r.completed(cid)
                case cc.NotifyAborted(checkpoint_id=cid, forget_uploads=forget):
                    for r in self.records:
                        r.aborted(cid, forget)
                case cc.Discard(locations=locations):
                    for loc in locations:
                        discard(loc)
                case cc.DiscardFiles(locations=locations, files=files):
                    discard_files(locations, files)
        return done

    def restore(self, meta: CheckpointMetadata, parallelism: int = 2) -> dict[int, Any]:
        plan = plan_restore(read_metadata(meta.location), job(sum_p=parallelism), "j-1", 2)
        out: dict[int, Any] = {}
        for r in plan.tasks.values():
            for kg, data in read_chains(r.groups):
                assert kg not in out
                out[kg] = decode_snapshot(data)
        return out

    def close(self) -> None:
        for b in self.backends:
            b.close()


def _uploaded(acks: list[CheckpointAck]) -> int:
    return sum(a.bytes for a in acks)


def _check_retention(j: _Job) -> None:
    """On disk: exactly the retained checkpoints' files and ``_metadata``, no empty folder."""
    retained = j.co.retained
    wanted = set().union(*(files_of(m) for m in retained))
    wanted |= {f"{m.location}/_metadata" for m in retained}
    on_disk = {str(p) for p in j.root.rglob("*") if p.is_file()}
    assert not wanted - on_disk, f"deleted, but a retained checkpoint needs: {wanted - on_disk}"
    assert not on_disk - wanted, f"left, but no retained checkpoint needs: {on_disk - wanted}"
    assert complete_checkpoints(str(j.root)) == [m.location for m in retained]
    assert all(any(d.iterdir()) for d in j.root.rglob("*") if d.is_dir()), "empty dirs left"


@pytest.fixture
def chain(tmp_path):
    """Four checkpoints, 1 % of the keys changed before each after the first; one retained."""
    j = _Job(tmp_path, retained=1)
    for step in range(4):
        if step:
            j.change(j.rng.sample(range(j.KEYS), j.KEYS // 100))
        j.checkpoint()
        assert j.co.latest is not None and j.co.latest.checkpoint_id == step + 1
        _check_retention(j)
    yield j
    j.close()


def test_the_second_checkpoint_uploads_less_than_half_and_links_the_firsts_ssts(chain):
    first, second = _uploaded(chain.acks[1]), _uploaded(chain.acks[2])
    assert second < first / 2, (first, second)
    links = [f for a in chain.acks[2] for f, _ in a.db_files if f.startswith("../chk-1/")]
    assert links and all(f.endswith(".sst") for f in links)
    assert chain.co.retained[-1].checkpoint_id == 4 and len(chain.co.retained) == 1


def test_the_latest_checkpoint_restores_every_group_exactly_at_any_parallelism(chain):
    latest = chain.co.retained[-1]
    assert any(f.startswith("../") for t in latest.tasks for f, _ in t.db_files)
    assert chain.restore(latest) == chain.states[4] != chain.states[3]
    assert chain.restore(latest, parallelism=3) == chain.states[4]
    assert chain.restore(latest, parallelism=1) == chain.states[4]


def test_a_link_no_retained_checkpoint_holds_fails_the_checkpoint_and_the_next_uploads_all(
        chain):
    gone = f"../chk-1/{db_folder(PART, 'x')}/000001.sst"
    out = chain.checkpoint(lambda a: dataclasses.replace(a, db_files=(*a.db_files, (gone, 9))))
    assert any(isinstance(c, cc.NotifyAborted) for c in out)
    assert gone in chain.co.last_failure and chain.co.latest.checkpoint_id == 4
    _check_retention(chain)  # the failed checkpoint's uploads went, chk-4's files stayed
    chain.checkpoint()
    assert chain.co.latest.checkpoint_id == 6
    assert not any(f.startswith("../") for a in chain.acks[6] for f, _ in a.db_files)
    _check_retention(chain)
    assert chain.restore(chain.co.latest) == chain.states[6]


def test_after_a_compaction_the_retired_checkpoints_files_and_folders_all_go(chain):
    """The SST files of chk-1..3 are compacted away; once chk-4, the last checkpoint
    naming them, retires, they go, and so do their (then empty) ``chk-<n>/`` folders."""
    for b in chain.backends:
        b.db.compact_range(None, None)
    chain.checkpoint()
    assert not any(f.startswith("../") for a in chain.acks[5] for f, _ in a.db_files)
    _check_retention(chain)


# ------------------------------------------------------------------ corruption, format

def _store_file(j: _Job, shared: bool) -> str:
    """An SST file the latest checkpoint reads: one an earlier checkpoint wrote (shared)
    or its own."""
    latest = j.co.retained[-1]
    files = sorted(f for t in latest.tasks for f, _ in t.db_files
                   if f.endswith(".sst") and f.startswith("../") == shared)
    assert files, "no such file: the test proves nothing"
    return link_uri(latest.location, files[0])


def test_a_truncated_sst_file_is_a_corrupt_restore_error_naming_it(chain):
    victim = _store_file(chain, shared=True)
    os.truncate(victim, os.path.getsize(victim) - 1)
    with pytest.raises(RestoreError, match=os.path.basename(victim)) as err:
        chain.restore(chain.co.retained[-1])
    assert err.value.reason == "corrupt" and err.value.path == victim


def test_an_altered_sst_file_of_the_same_size_is_a_corrupt_restore_error(chain):
    victim = _store_file(chain, shared=False)
    data = bytearray(Path(victim).read_bytes())
    data[20] ^= 0xFF  # in the first data block, which RocksDB checks when it reads it
    Path(victim).write_bytes(bytes(data))
    with pytest.raises(RestoreError) as err:
        chain.restore(chain.co.retained[-1])
    assert err.value.reason == "corrupt"


def test_an_altered_index_is_a_corrupt_restore_error_naming_it(chain):
    latest = chain.co.retained[-1]
    victim = f"{latest.location}/{index_name(PART)}"
    data = bytearray(Path(victim).read_bytes())
    data[len(data) // 2] ^= 0xFF
    Path(victim).write_bytes(bytes(data))
    with pytest.raises(RestoreError, match=index_name(PART)) as err:
        chain.restore(latest)
    assert err.value.reason == "corrupt" and err.value.path == victim


def test_a_restore_writes_nothing_into_the_store(chain):
    """A restore opens the DB checkpoint read-only, on links to the store's files: the
    store's files must stay as they were (several tasks restore from one at once)."""
    def files() -> dict[str, tuple[int, int, bytes]]:
        return {str(p): (p.stat().st_mtime_ns, p.stat().st_size, p.read_bytes())
                for p in chain.root.rglob("*") if p.is_file()}

    before = files()
    chain.restore(chain.co.retained[-1], parallelism=3)
    after = files()
    assert [f for f in before if before[f] != after.get(f)] == []


def test_metadata_v4_keeps_db_files_and_a_v3_body_still_decodes():
    meta = CheckpointMetadata(
        3, "checkpoint", "j-1", "j", 0.0, N, (VertexState("v", ("v",), 1, True, False,
                                                          (0,) * N),),
        (TaskState("t", "v", 0, "v-0.dbindex", ((0, -1, 10, 7),),
                   db_files=(("v-0-x.db/000010.sst", 99), ("../chk-1/v-0-x.db/8.sst", 5))),),
        location="/s/chk-3")
    back = CheckpointMetadata.decode(meta.encode(), "/s/chk-3")
    assert back == meta and back.files() >= {"../chk-1/v-0-x.db/8.sst", "v-0.dbindex"}
    wire = meta.to_wire()
    wire[7] = [t[:-1] for t in wire[7]]  # version 3: tasks without db_files
    body = pack_exact(wire)
    old = CheckpointMetadata.decode(MAGIC + _HEADER.pack(3, zlib.crc32(body)) + body, "/s")
    assert old.tasks[0].db_files == () and old.tasks[0].groups == meta.tasks[0].groups


def test_a_part_written_after_its_checkpoint_failed_is_deleted_when_its_ack_comes(chain):
    """Review finding 6: a task's writer thread may finish a part after the checkpoint
    failed and its directory was discarded (a timeout, another task's decline); the late
    part recreates the directory, and its ack must delete it again (SST files there would
    be hard links keeping a DB's worth of disk)."""
    [trigger] = chain.co.trigger(chain.dep)
    cid, loc = trigger.checkpoint_id, trigger.location
    out = chain.execute(chain.co.on_report(CheckpointDeclined(chain.names[1], cid, "no")))
    assert any(isinstance(c, cc.NotifyAborted) for c in out)
    assert not os.path.exists(loc)
    db = chain.backends[0].checkpoint_files(f"chk-{cid}")
    assert db is not None
    plan = chain.records[0].plan(cid, parent_location(loc), directory_name(loc),
                                 part_file_name("sum", 0), N, db)
    late = persist(TaskSnapshot(chain.names[0], "sum", 0, cid, loc, db=plan), ManualClock())
    assert isinstance(late, CheckpointAck) and os.path.exists(loc)
    chain.execute(chain.co.on_report(late))
    assert not os.path.exists(loc), "the late part was left behind"
    _check_retention(chain)


def test_a_restore_unpacks_under_the_scratch_folder_it_is_given_and_cleans_up(chain,
                                                                              tmp_path):
    """Review finding 2: the files are linked or copied into a folder under ``scratch``
    (the task's state root, the disk meant for state) rather than the system's temporary
    directory (often a small tmpfs: copies there are memory), and the folder goes after."""
    scratch = tmp_path / "state-root" / "restore"
    seen: list[str] = []
    real = snapshot_module.groups_from_checkpoint

    def spy(folder: str, *args: Any) -> Any:
        seen.append(folder)
        return real(folder, *args)

    plan = plan_restore(read_metadata(chain.co.latest.location), job(sum_p=2), "j-1", 2)
    refs = next(r.groups for r in plan.tasks.values() if r.groups)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(snapshot_module, "groups_from_checkpoint", spy)
        assert read_chains(refs, None, str(scratch))
    assert seen and all(Path(f).parent == scratch for f in seen)
    assert scratch.is_dir() and not any(scratch.iterdir())


def test_a_restore_removes_the_folders_restores_of_gone_processes_left(chain, tmp_path):
    """A process killed during a restore leaves its folder (links, or a remote store's
    files copied); the next restore under that scratch folder deletes it, and leaves a
    live process's (this one's) alone."""
    import subprocess
    import sys

    scratch = tmp_path / "restore"
    scratch.mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    orphan = scratch / f"{RESTORE_PREFIX}{gone}-abc"
    mine = scratch / f"{RESTORE_PREFIX}{os.getpid()}-def"
    for d in (orphan, mine):
        d.mkdir()
        (d / "000008.sst").write_bytes(b"x" * 10)
    plan = plan_restore(read_metadata(chain.co.latest.location), job(sum_p=2), "j-1", 2)
    refs = next(r.groups for r in plan.tasks.values() if r.groups)
    assert read_chains(refs, None, str(scratch))
    assert not orphan.exists() and (mine / "000008.sst").exists()
