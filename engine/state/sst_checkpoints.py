"""SST-level incremental checkpoints of the RocksDB backend: which of a DB checkpoint's files
a checkpoint uploads, which it refers to in an earlier checkpoint, and the index a reader
needs (sans-IO; the upload is ``engine.checkpoints.snapshot.persist``).

Why: the RocksDB backend's SST files are immutable. With ``JobConfig.incremental_checkpoints``
a task on that backend checkpoints its DB as RocksDB does (``checkpoint_files``: loans
written back, memtables flushed, every live SST hard-linked into a local folder, a fresh
MANIFEST), and the checkpoint uploads only the SST files no earlier checkpoint of the job
uploaded; the others it names where they are. This is Flink's
``RocksIncrementalSnapshotStrategy`` with its ``SharedStateRegistry``: the JobMaster counts
every file a retained checkpoint names (``engine.checkpoints.shared``), so retention never
deletes one a retained checkpoint needs. What a checkpoint writes is what RocksDB wrote
since the last one: the flushed memtables and the compactions' output. Against the
per-key-group deltas of the in-memory backend (``engine.state.incremental``) there is no
chain to merge at restore and no periodic rewrite of every group; a restore reads each
group it needs out of the checkpoint's files (``engine.state.rocksdb.groups_from_checkpoint``).

Format. A task's part of such a checkpoint is its DB's files under
``<checkpoint>/<part>-<instance>.db/`` (``db_folder``) and an index file beside them::

    [DB_INDEX_TAG,
     num_key_groups,
     [[link, size], ...],              every file of the DB checkpoint
     [[key_group, [name, ...]], ...]]  each group the task owned, with its tables' names

(the exact msgpack encoding, ``engine.wire.codec``). A ``link`` is relative to the
index's checkpoint location: ``<folder>/<file>`` for a file this checkpoint wrote,
``../chk-<n>/<folder>/<file>`` for an SST file an earlier checkpoint of the job wrote.
The metadata locates each of the task's groups at the index (offset ``DB_PART``, the
index's length and CRC-32) and lists the files (``TaskState.db_files``).

Guarantees: ``SstRecord`` names a file of an earlier checkpoint only when that checkpoint
completed and is a sibling of the new one (the same job directory), and forgets every
upload when the JobMaster says its view may be wrong (``aborted(forget_uploads=True)``:
it refused a part naming a file no retained checkpoint holds, or took the job over; the
next checkpoint then uploads every file again), so a link never points at a file
retention may have deleted: an SST file live in the DB now was live at every checkpoint
since it was written, the last complete one included, which the JobMaster retains (and
the JobMaster refuses a part that names a file no retained checkpoint holds, should
that ever fail: ``engine.checkpoints.coordinator``). SST names are unique per DB
instance only (numbers start again in a new DB), so the folder carries the instance
(``RocksDBKeyedStateBackend.instance``).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.errors import CodecError
from engine.wire.codec import pack_exact, unpack_exact

DB_INDEX_TAG = "reflow-db-ckpt-index/1"
#: the offset that locates a key group at a DB checkpoint's index instead of in a blob file
DB_PART = -1
#: a file of a DB checkpoint: (link relative to the checkpoint's location, size in bytes)
DbFile = tuple[str, int]


def is_sst(name: str) -> bool:
    """An immutable table file, shared between checkpoints (the MANIFEST, CURRENT, OPTIONS
    and log files are written anew by every DB checkpoint)."""
    return name.endswith(".sst")


def db_folder(part_file: str, instance: str) -> str:
    """The folder of a task's DB files in a checkpoint: its part file's name (unique per
    vertex and index) and the DB instance."""
    stem = part_file.rsplit(".", 1)[0]
    return f"{stem}-{re.sub(r'[^A-Za-z0-9]', '', instance)[:16]}.db"


def index_name(part_file: str) -> str:
    """The index file of a task's DB checkpoint, beside its folder."""
    return part_file.rsplit(".", 1)[0] + ".dbindex"


@dataclass(frozen=True)
class DbIndex:
    """What a reader needs of a task's DB checkpoint (module doc)."""

    num_key_groups: int
    files: tuple[DbFile, ...]
    groups: tuple[tuple[int, tuple[str, ...]], ...]

    def encode(self) -> bytes:
        return pack_exact([DB_INDEX_TAG, self.num_key_groups,
                           [list(f) for f in self.files],
                           [[kg, list(names)] for kg, names in self.groups]])

    @classmethod
    def decode(cls, data: bytes) -> DbIndex:
        """The index in ``data``, or ``CodecError``."""
        try:
            tag, nkg, files, groups = unpack_exact(data)
            if tag != DB_INDEX_TAG:
                raise ValueError(f"tag {tag!r}")
            return cls(int(nkg), tuple((str(f), int(n)) for f, n in files),
                       tuple((int(kg), tuple(map(str, names))) for kg, names in groups))
        except (CodecError, ValueError, TypeError) as exc:
            raise CodecError(f"bytes are not a DB checkpoint's index: {exc}") from exc

    def names(self) -> dict[int, tuple[str, ...]]:
        return dict(self.groups)


@dataclass(frozen=True)
class DbCheckpoint:
    """A backend's DB checkpointed on local disk (``checkpoint_files``): the folder, its
    files (name -> size), each owned group's table names, and the DB instance."""

    directory: str
    files: Mapping[str, int]
    groups: Mapping[int, Sequence[str]]
    instance: str


def index_ref(data: bytes) -> tuple[int, int, int]:
    """``(offset, length, crc32)`` locating a group at the index ``data``."""
    return DB_PART, len(data), zlib.crc32(data)


@dataclass(frozen=True)
class DbPlan:
    """One task's DB checkpoint to write: the files of the local DB checkpoint in
    ``local_dir`` as ``(link, size, upload)`` (``upload``: copy the file to the link;
    otherwise an earlier checkpoint holds it there) and the groups' table names."""

    local_dir: str
    folder: str
    num_key_groups: int
    files: tuple[tuple[str, int, bool], ...]
    groups: tuple[tuple[int, tuple[str, ...]], ...]

    def index(self) -> DbIndex:
        return DbIndex(self.num_key_groups, tuple((f, n) for f, n, _ in self.files),
                       self.groups)


class SstRecord:
    """A task's record of the SST files its checkpoints uploaded (one per DB instance):
    ``plan`` decides what a checkpoint uploads; ``completed`` and ``aborted`` follow the
    JobMaster's outcomes (module doc: Guarantees)."""

    def __init__(self) -> None:
        # file name -> (job directory, checkpoint directory name, folder, size) of the
        # upload a complete checkpoint holds
        self.confirmed: dict[str, tuple[str, str, str, int]] = {}
        self._pending: dict[int, dict[str, tuple[str, str, str, int]]] = {}

    def plan(self, checkpoint_id: int, job_dir: str, checkpoint_dir: str, part_file: str,
             num_key_groups: int, db: DbCheckpoint) -> DbPlan:
        """Checkpoint ``checkpoint_id`` at ``job_dir``/``checkpoint_dir`` holds the DB
        checkpoint ``db`` of the task whose part file is ``part_file``: each SST file
        some complete checkpoint in the same ``job_dir`` uploaded is linked there, every
        other file uploaded into the task's folder (``db_folder``)."""
        folder = db_folder(part_file, db.instance)
        files, groups, local_dir = db.files, db.groups, db.directory
        out: list[tuple[str, int, bool]] = []
        uploads: dict[str, tuple[str, str, str, int]] = {}
        for name, size in sorted(files.items()):
            have = self.confirmed.get(name) if is_sst(name) else None
            if have is not None and have[0] == job_dir and have[3] == size:
                out.append((f"../{have[1]}/{have[2]}/{name}", size, False))
                continue
            out.append((f"{folder}/{name}", size, True))
            if is_sst(name):
                uploads[name] = (job_dir, checkpoint_dir, folder, size)
        self._pending[checkpoint_id] = uploads
        live = {n for n in files if is_sst(n)}
        for gone in [n for n in self.confirmed if n not in live]:
            del self.confirmed[gone]  # compacted away: never live again
        return DbPlan(local_dir, folder, num_key_groups, tuple(out),
                      tuple((kg, tuple(names)) for kg, names in sorted(groups.items())))

    def completed(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: its uploads may be named by the next
        ones. Those of earlier checkpoints not heard complete are dropped (the JobMaster
        runs one checkpoint at a time, so they failed, and their files may be gone)."""
        uploads = self._pending.pop(checkpoint_id, None)
        for cid in [c for c in self._pending if c < checkpoint_id]:
            del self._pending[cid]
        if uploads is not None:
            # heard late: a later checkpoint, planned meanwhile, uploaded some of these
            # again; its copy is the one to name (retention deletes this one first)
            later = {n for p in self._pending.values() for n in p}
            self.confirmed.update((n, u) for n, u in uploads.items() if n not in later)

    def aborted(self, checkpoint_id: int, forget_uploads: bool = True) -> None:
        """Checkpoint ``checkpoint_id`` failed: its uploads are never named (its directory
        is deleted). ``forget_uploads``: the JobMaster may retain other checkpoints than
        the task believes (it refused a part naming a file, or took the job over), so
        the next checkpoint uploads every file again; otherwise (a timeout, a decline)
        the retained checkpoints are as they were, and so is what the task may name."""
        self._pending.pop(checkpoint_id, None)
        if forget_uploads:
            self.confirmed.clear()
            self._pending.clear()


def plan_summary(plan: DbPlan) -> dict[str, Any]:
    """Bytes uploaded and linked of a plan (for logs and benchmarks)."""
    up = sum(n for _, n, u in plan.files if u)
    return {"uploaded_bytes": up, "linked_bytes": sum(n for _, n, u in plan.files) - up,
            "files": len(plan.files)}


__all__ = ["DB_INDEX_TAG", "DB_PART", "DbCheckpoint", "DbFile", "DbIndex", "DbPlan", "SstRecord", "db_folder",
           "index_name", "index_ref", "is_sst", "plan_summary"]
