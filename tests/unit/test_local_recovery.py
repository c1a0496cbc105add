"""Local recovery copies (engine.checkpoints.local): kept beside the store, read first,
never trusted over a checksum, pruned, and cleaned once their process is gone."""

from __future__ import annotations

import os
import zlib

import pytest

from engine.checkpoints.local import LocalCopies, copy_name, find_copy, read_refs
from engine.checkpoints.snapshot import TaskSnapshot, persist, read_chains
from engine.checkpoints.store import join, write_task_part
from engine.errors import RestoreError
from engine.time.clock import ManualClock

GROUPS = ((3, b"three" * 100), (7, b"seven" * 50), (9, b""))


def _refs(uri: str, index: tuple[tuple[int, int, int, int], ...]) -> tuple:
    return tuple((kg, uri, off, n, crc) for kg, off, n, crc in index)


def _stored(tmp_path: os.PathLike, checkpoint: int = 1) -> tuple[str, tuple]:
    location = os.path.join(str(tmp_path), "store", f"chk-{checkpoint}")
    index = write_task_part(location, "agg-0.state", GROUPS)
    uri = join(location, "agg-0.state")
    return uri, _refs(uri, index)


def test_a_copy_of_a_local_store_is_a_hard_link_and_is_read_instead_of_the_store(tmp_path):
    uri, refs = _stored(tmp_path)
    copies = LocalCopies(str(tmp_path / "local" / "job"), keep=2)
    path = copies.keep_copy(1, uri, GROUPS)
    assert os.stat(path).st_ino == os.stat(uri).st_ino  # linked, not written again
    os.remove(uri)  # only the copy is left: the read must come from it
    read, local_bytes = read_refs(refs, copies.root)
    assert read == [(kg, data) for kg, data in GROUPS]
    assert local_bytes == sum(len(d) for _, d in GROUPS)


def test_a_copy_of_a_remote_part_is_written_and_found_without_the_store(tmp_path):
    uri = "s3://bucket/job/chk-4/agg-0.state?endpoint_override=127.0.0.1:1"
    offset, index = 0, []
    for kg, data in GROUPS:
        index.append((kg, offset, len(data), zlib.crc32(data)))
        offset += len(data)
    copies = LocalCopies(str(tmp_path / "local" / "job"), keep=1)
    copies.keep_copy(4, uri, GROUPS)
    assert find_copy(copies.root, uri).endswith(copy_name(uri))
    # the store is unreachable (port 1): every group must come from the copy
    read, local_bytes = read_refs(_refs(uri, tuple(index)), copies.root)
    assert read == list(GROUPS) and local_bytes == offset


def test_a_corrupt_copy_is_not_trusted_the_store_is_read(tmp_path):
    uri, refs = _stored(tmp_path)
    copies = LocalCopies(str(tmp_path / "local" / "job"), keep=2)
    uri_copy = copies.keep_copy(1, uri, GROUPS)
    os.remove(uri_copy)  # break the link, then write a copy with one byte flipped
    blob = bytearray(b"".join(d for _, d in GROUPS))
    blob[5] ^= 0xFF
    with open(uri_copy, "wb") as f:
        f.write(blob)
    read, local_bytes = read_refs(refs, copies.root)
    assert read == list(GROUPS) and local_bytes == 0


def test_corrupt_everywhere_is_a_restore_error_naming_the_store_file(tmp_path):
    uri, refs = _stored(tmp_path)
    copies = LocalCopies(str(tmp_path / "local" / "job"), keep=2)
    copy = copies.keep_copy(1, uri, GROUPS)  # a hard link: one file for both
    with open(copy, "r+b") as f:
        f.seek(2)
        f.write(b"XX")
    with pytest.raises(RestoreError) as err:
        read_refs(refs, copies.root)
    assert err.value.path == uri


def test_only_the_last_checkpoints_copies_are_kept(tmp_path):
    copies = LocalCopies(str(tmp_path / "local" / "job"), keep=2)
    paths = []
    for n in (1, 2, 3):
        uri, _ = _stored(tmp_path, n)
        paths.append(copies.keep_copy(n, uri, GROUPS))
    assert [os.path.exists(p) for p in paths] == [False, True, True]
    copies.close()
    assert not any(os.path.exists(p) for p in paths)


def test_copies_of_a_gone_process_are_readable_until_a_new_process_keeps_copies(tmp_path):
    uri, refs = _stored(tmp_path)
    root = str(tmp_path / "local" / "job")
    gone = os.path.join(root, "copies", "999999999-deadbeef0000")  # no such pid
    os.makedirs(gone)
    open(os.path.join(gone, "reflow.lock"), "wb").close()
    with open(os.path.join(gone, copy_name(uri)), "wb") as f:
        f.write(b"".join(d for _, d in GROUPS))
    os.remove(uri)
    assert read_refs(refs, root)[0] == list(GROUPS)  # the replacement task reads it
    LocalCopies(root, keep=1).keep_copy(2, _stored(tmp_path, 2)[0], GROUPS)
    assert not os.path.exists(gone)  # cleaned by the next process that keeps copies


def test_persist_keeps_a_copy_and_a_refusing_local_disk_does_not_fail_the_checkpoint(
        tmp_path):
    location = str(tmp_path / "store" / "chk-5")
    snap = TaskSnapshot("job/agg/0/g0", "agg", 0, 5, location, groups=GROUPS)
    copies = LocalCopies(str(tmp_path / "local" / "job"), keep=2)
    ack = persist(snap, ManualClock(), copies)
    assert ack.file and find_copy(copies.root, join(location, ack.file)) is not None
    refs = tuple((kg, join(location, ack.file), off, n, crc) for kg, off, n, crc in ack.groups)
    assert read_chains(refs, copies.root) == list(GROUPS)
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the local folder should be")
    ack2 = persist(snap, ManualClock(), LocalCopies(str(blocked / "job"), keep=2))
    assert ack2.file and ack2.groups == ack.groups  # stored; only the copy is missing


def test_keep_must_be_positive(tmp_path):
    with pytest.raises(ValueError):
        LocalCopies(str(tmp_path), keep=0)


# ------------------------------------------------------------ SST-level checkpoints


def _db_checkpoints(tmp_path: os.PathLike, copies: LocalCopies) -> tuple[list[tuple], dict]:
    """Two SST-level checkpoints of one RocksDB task (the second links the first's SSTs),
    persisted with local copies; returns each checkpoint's refs and the state at the
    second."""
    from engine.state.keyed import ValueState
    from engine.state.rocksdb import RocksDBKeyedStateBackend
    from engine.state.sst_checkpoints import SstRecord
    from engine.wire.messages import CheckpointAck

    root = os.path.join(str(tmp_path), "store")
    b = RocksDBKeyedStateBackend(8, os.path.join(str(tmp_path), "task"))
    rec, refs = SstRecord(), []
    for kg in range(8):
        b.own(kg)
    try:
        for cid in (1, 2):
            for k in range(cid * 50):
                b.set_current(k, k % 8)
                ValueState(b, "v").update((cid, k))
            location = os.path.join(root, f"chk-{cid}")
            db = b.checkpoint_files(f"chk-{cid}")
            assert db is not None
            plan = rec.plan(cid, root, f"chk-{cid}", "agg-0.state", 8, db)
            ack = persist(TaskSnapshot("t", "agg", 0, cid, location, db=plan),
                          ManualClock(), copies)
            assert isinstance(ack, CheckpointAck), ack
            rec.completed(cid)
            refs.append(tuple((kg, join(location, ack.file), off, n, crc)
                              for kg, off, n, crc in ack.groups))
        return refs, {kg: b.snapshot(kg) for kg in range(8)}
    finally:
        b.close()


def test_sst_checkpoint_files_are_kept_as_links_and_a_restore_needs_no_store_file(tmp_path):
    """Local recovery of SST-level checkpoints: every file of the DB checkpoint is kept on
    the node (hard links), a file shared by both checkpoints once, as long as the newer
    one; a restore with every store file but the index gone reads the copies."""
    from engine.state.keyed import decode_snapshot

    copies = LocalCopies(str(tmp_path / "local" / "job"), keep=1)
    refs, state = _db_checkpoints(tmp_path, copies)
    store = os.path.join(str(tmp_path), "store")
    shared = [f for f in os.listdir(os.path.join(store, "chk-1"))
              if f.endswith(".db")]
    [folder] = shared
    for name in os.listdir(os.path.join(store, "chk-1", folder)):
        if name.endswith(".sst"):  # linked by chk-2: its copy outlives chk-1's pruning
            assert find_copy(copies.root, os.path.join(store, "chk-1", folder, name))
    for cid in (1, 2):  # every stored file but the indexes goes
        for dirpath, _, names in os.walk(os.path.join(store, f"chk-{cid}")):
            for name in names:
                if not name.endswith(".dbindex"):
                    os.remove(os.path.join(dirpath, name))
    with pytest.raises(RestoreError):
        read_chains(refs[-1])  # the store alone no longer holds the checkpoint
    got = dict(read_chains(refs[-1], copies.root))
    assert {kg: decode_snapshot(v) for kg, v in got.items()} == {
        kg: decode_snapshot(v) for kg, v in state.items()}
