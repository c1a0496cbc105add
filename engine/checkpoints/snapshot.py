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
from dataclasses import dataclass
from typing import Any

from engine.checkpoints.local import LocalCopies, read_refs
from engine.checkpoints.store import join, part_file_name, write_task_part
from engine.errors import CodecError, RestoreError
from engine.state.incremental import merge_chain
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
    the checkpoint whose chains they build on (``ChainRecord.base_checkpoint``)."""

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


def persist(snap: TaskSnapshot, clock: Clock, local: LocalCopies | None = None
            ) -> CheckpointAck | CheckpointDeclined:
    """Write the snapshot's key groups to the store and say so; a store that refuses
    declines the checkpoint (naming the error), it never raises. ``local``: also keep a
    local copy (``engine.checkpoints.local``; a local disk that refuses is logged, the
    checkpoint stands without it)."""
    if snap.declined:
        return CheckpointDeclined(snap.task, snap.checkpoint_id, snap.declined)
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


def read_chains(refs: tuple[tuple[int, str, int, int, int], ...],
                local_root: str | None = None) -> list[tuple[int, bytes]]:
    """Key groups read from the store and checked, a group given several links (an
    incremental checkpoint's chain, base first) merged into one full blob
    (``engine.state.incremental.merge_chain``); ``RestoreError`` naming the file when one
    is missing, short or corrupt, or a chain does not hold together. ``local_root``: the
    job's local recovery folder on this node, whose copies are read first
    (``engine.checkpoints.local.read_refs``)."""
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


def restore_messages(msg: RestoreState, local_root: str | None = None) -> list[Any]:
    """The core's messages for a ``RestoreState``: its key groups read from the store (or
    local copies under ``local_root``) and checked, chains merged (``read_chains``;
    ``RestoreError`` when one is missing or corrupt), then its transactions."""
    out: list[Any] = []
    if msg.groups:
        out.append(InstallKeyGroups(tuple(read_chains(msg.groups, local_root))))
    if msg.transactions:
        out.append(CommitTransactions(msg.transactions))
    return out


__all__ = ["TaskSnapshot", "persist", "read_chains", "restore_messages"]
