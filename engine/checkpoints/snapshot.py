"""A task's part of a checkpoint, between its core and the store (the shell's I/O, pure of Ray).

Why apart from the task core: the core (``engine.task.core``) takes the snapshot synchronously
at the barrier (state is encoded while nothing else runs: that is the consistent cut) and
hands it over as a ``TaskSnapshot``; writing it is I/O, which the task actor does in a
thread while the task goes on processing (Flink's asynchronous part), and the unit harness
does inline. Both call ``persist`` and send what it returns to the JobMaster; both turn a
``RestoreState`` into the core's messages with ``restore_messages``.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from engine.checkpoints.local import LocalCopies, find_copy, read_refs
from engine.checkpoints.store import (
    fetch_file,
    join,
    link_uri,
    parent_location,
    part_file_name,
    read_file,
    write_db_part,
    write_file,
    write_task_part,
)
from engine.errors import CodecError, RestoreError, StateBackendError
from engine.state.backends import RESTORE_PREFIX, remove_orphaned_restores
from engine.state.incremental import merge_chain
from engine.state.rocksdb import groups_from_checkpoint
from engine.state.sst_checkpoints import DB_PART, DbIndex, DbPlan, index_name, index_ref
from engine.time.clock import Clock
from engine.wire.messages import (
    CheckpointAck,
    CheckpointDeclined,
    CommitTransactions,
    InstallKeyGroups,
    RestoreState,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskSnapshot:
    """What a task took at checkpoint ``checkpoint_id``: its key groups (encoded), its
    source's resume state, its sinks' transactions, and how long it aligned and took the
    snapshot. ``declined``: why it could not take part ('' when it could). An incremental
    checkpoint's ``groups`` hold a delta blob for the groups in ``deltas``; those in
    ``unchanged`` are not in ``groups`` (``engine.state.incremental``); ``base_checkpoint``:
    the checkpoint whose chains they build on (``ChainRecord.base_checkpoint``). ``db``: the
    task's state as its backend's own files instead (an SST-level incremental checkpoint:
    ``engine.state.sst_checkpoints``), checkpointed in a local folder that ``persist``
    uploads from and deletes."""

    task: str
    vertex: str
    index: int
    checkpoint_id: int
    location: str
    groups: tuple[tuple[int, bytes], ...] = ()
    source_state: Any = None
    transactions: tuple[tuple[str, Any], ...] = ()
    alignment_s: float = 0.0
    sync_s: float = 0.0
    declined: str = ""
    deltas: tuple[int, ...] = ()
    unchanged: tuple[int, ...] = ()
    base_checkpoint: int = -1
    db: DbPlan | None = None


def persist(snap: TaskSnapshot, clock: Clock, local: LocalCopies | None = None
            ) -> CheckpointAck | CheckpointDeclined:
    """Write the snapshot's key groups to the store and say so; a store that refuses
    declines the checkpoint (naming the error), it never raises. ``local``: also keep a
    local copy (``engine.checkpoints.local``; a local disk that refuses is logged, the
    checkpoint stands without it)."""
    if snap.declined:
        if snap.db is not None:  # taken before the task declined: nothing else keeps it
            shutil.rmtree(snap.db.local_dir, ignore_errors=True)
        return CheckpointDeclined(snap.task, snap.checkpoint_id, snap.declined)
    if snap.db is not None:
        return _persist_db(snap, snap.db, clock, local)
    start = clock.monotonic()
    file = ""
    index: tuple[tuple[int, int, int, int], ...] = ()
    if snap.groups:
        file = part_file_name(snap.vertex, snap.index)
        try:
            index = write_task_part(snap.location, file, snap.groups)
        except (OSError, ValueError) as exc:
            return CheckpointDeclined(snap.task, snap.checkpoint_id,
                                      f"its state could not be written to {snap.location}: "
                                      f"{type(exc).__name__}: {exc}")
        if local is not None:
            try:
                local.keep_copy(snap.checkpoint_id, join(snap.location, file), snap.groups)
            except OSError as exc:
                log.warning("task %s: no local copy of checkpoint %d (%s: %s); recovery "
                            "reads the store", snap.task, snap.checkpoint_id,
                            type(exc).__name__, exc)
    written = sum(length for _, _, length, _ in index)
    return CheckpointAck(snap.task, snap.checkpoint_id, file, index, snap.source_state,
                         snap.transactions, written, snap.alignment_s, snap.sync_s,
                         clock.monotonic() - start, snap.deltas, snap.unchanged,
                         snap.base_checkpoint)


def _persist_db(snap: TaskSnapshot, plan: DbPlan, clock: Clock, local: LocalCopies | None
                ) -> CheckpointAck | CheckpointDeclined:
    """Upload a DB checkpoint's new files and write its index; with ``local``, keep
    every file of it as a local copy (hard links); the local folder goes either way."""
    start = clock.monotonic()
    try:
        written = write_db_part(snap.location, plan)
        index = plan.index().encode()
        name = index_name(part_file_name(snap.vertex, snap.index))
        write_file(join(snap.location, name), index)
        if local is not None:
            try:
                for link, _, _ in plan.files:
                    local.keep_file(snap.checkpoint_id, link_uri(snap.location, link),
                                    os.path.join(plan.local_dir, link.rsplit("/", 1)[-1]))
            except OSError as exc:
                log.warning("task %s: no local copy of checkpoint %d (%s: %s); recovery "
                            "reads the store", snap.task, snap.checkpoint_id,
                            type(exc).__name__, exc)
    except (OSError, ValueError) as exc:
        return CheckpointDeclined(snap.task, snap.checkpoint_id,
                                  f"its state could not be written to {snap.location}: "
                                  f"{type(exc).__name__}: {exc}")
    finally:
        shutil.rmtree(plan.local_dir, ignore_errors=True)
    ref = index_ref(index)
    return CheckpointAck(snap.task, snap.checkpoint_id, name,
                         tuple((kg, *ref) for kg, _ in plan.groups), snap.source_state,
                         snap.transactions, written + len(index), snap.alignment_s,
                         snap.sync_s, clock.monotonic() - start,
                         db_files=tuple((f, n) for f, n, _ in plan.files))


def read_chains(refs: tuple[tuple[int, str, int, int, int], ...],
                local_root: str | None = None, scratch: str | None = None
                ) -> list[tuple[int, bytes]]:
    """Key groups read from the store and checked, a group given several links (an
    incremental checkpoint's chain, base first) merged into one full blob
    (``engine.state.incremental.merge_chain``); ``RestoreError`` naming the file when one
    is missing, short or corrupt, or a chain does not hold together. ``local_root``: the
    job's local recovery folder on this node, whose copies are read first
    (``engine.checkpoints.local.read_refs``). ``scratch``: where DB checkpoints are
    unpacked (``read_db_groups``)."""
    if any(r[2] == DB_PART for r in refs):
        return (read_chains(tuple(r for r in refs if r[2] != DB_PART), local_root)
                + read_db_groups((r for r in refs if r[2] == DB_PART), local_root, scratch))
    read, _ = read_refs(refs, local_root)
    chains: dict[int, list[bytes]] = {}
    for kg, data in read:
        chains.setdefault(kg, []).append(data)
    if all(len(c) == 1 for c in chains.values()):
        return read
    files: dict[int, list[str]] = {}
    for kg, uri, *_ in refs:
        files.setdefault(kg, []).append(uri)
    out = []
    for kg, blobs in chains.items():
        try:
            out.append((kg, merge_chain(blobs)))
        except CodecError as exc:
            raise RestoreError(
                f"key group {kg}'s chain of incremental checkpoint files "
                f"({', '.join(files[kg])}) does not hold together: {exc}; restore an earlier "
                "checkpoint", path=files[kg][-1], reason="corrupt") from exc
    return out


def read_db_groups(refs: Iterable[tuple[int, str, int, int, int]],
                   local_root: str | None = None, scratch: str | None = None
                   ) -> list[tuple[int, bytes]]:
    """Key groups located at DB checkpoints' indexes (``(key_group, index URI, DB_PART,
    length, crc32)``: SST-level incremental checkpoints, ``engine.state.sst_checkpoints``)
    as key-group blobs: per index, its files linked (a local copy under ``local_root`` of
    the right size, or a store on this machine) or copied into a local folder, opened
    read-only, the groups cut out. The folder is made under ``scratch`` (the task's state
    root: the disk the state is meant for, and the filesystem of the local copies; the
    system's temporary directory when None) and deleted after. ``RestoreError`` naming
    the file when the index or a file is missing, short or corrupt."""
    by_index: dict[str, list[tuple[int, str, int, int, int]]] = {}
    for r in refs:
        by_index.setdefault(r[1], []).append(r)
    out: list[tuple[int, bytes]] = []
    for uri, rs in by_index.items():
        data = read_file(uri)
        if len(data) != rs[0][3] or zlib.crc32(data) != rs[0][4]:
            raise RestoreError(f"{uri} is corrupt: it does not match its checksum (a truncated "
                               "or altered file); restore an earlier checkpoint", path=uri,
                               reason="corrupt")
        try:
            index = DbIndex.decode(data)
        except CodecError as exc:
            raise RestoreError(f"{uri} is corrupt: {exc}; restore an earlier checkpoint",
                               path=uri, reason="corrupt") from exc
        location = parent_location(uri)
        if scratch is not None:
            os.makedirs(scratch, exist_ok=True)
            remove_orphaned_restores(scratch)
        folder = tempfile.mkdtemp(prefix=f"{RESTORE_PREFIX}{os.getpid()}-", dir=scratch)
        try:
            for link, size in index.files:
                file_uri = link_uri(location.rstrip("/"), link)
                copy = find_copy(local_root, file_uri) if local_root else None
                if copy is not None and os.path.getsize(copy) != size:
                    copy = None  # not the file the checkpoint names: the store has it
                fetch_file(copy or file_uri, os.path.join(folder, link.rsplit("/", 1)[-1]),
                           size)
            out += groups_from_checkpoint(folder, index.num_key_groups, index.names(),
                                          [r[0] for r in rs])
        except StateBackendError as exc:
            raise RestoreError(f"the DB checkpoint at {uri} does not read back: {exc}; "
                               "restore an earlier checkpoint", path=uri,
                               reason="corrupt") from exc
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return out


def restore_messages(msg: RestoreState, local_root: str | None = None,
                     scratch: str | None = None) -> list[Any]:
    """The core's messages for a ``RestoreState``: its key groups read from the store (or
    local copies under ``local_root``) and checked, chains merged (``read_chains``;
    ``RestoreError`` when one is missing or corrupt), then its transactions."""
    out: list[Any] = []
    if msg.groups:
        out.append(InstallKeyGroups(tuple(read_chains(msg.groups, local_root, scratch))))
    if msg.transactions:
        out.append(CommitTransactions(msg.transactions))
    return out


__all__ = ["TaskSnapshot", "persist", "read_chains", "read_db_groups", "restore_messages"]
