"""What a checkpoint or savepoint holds, as values, and its metadata file's format.

Why a metadata file: a checkpoint is many files written by many tasks; it exists for
recovery only once every part is written. The JobMaster writes ``_metadata`` last, so a
directory without it (a task died halfway, the store failed) is never read as a checkpoint.

Format of ``_metadata``: ``MAGIC`` (8 bytes), the format version (``!H``), the CRC-32 of
the body (``!I``), then the body: the exact msgpack encoding (``engine.wire.codec``) of
``CheckpointMetadata.to_wire()``. A task's key groups are in one file of the checkpoint
directory, concatenated, each located by ``(key_group, offset, length, crc32)``: a restore
at another parallelism reads each group where it is, and checks it. An incremental
checkpoint (``JobConfig.incremental_checkpoints``, format version 3) also gives each of a
task's groups its *chain*, ``(key_group, ((file, offset, length, crc32), ...))``, base
first (``engine.state.incremental``): ``file`` is relative to the checkpoint's location,
or ``../chk-<n>/<file>`` for a file an earlier checkpoint of the job wrote (shared: the
JobMaster's ``engine.checkpoints.shared.SharedFiles`` keeps it while a retained checkpoint
refers to it). Format version 4 adds, for a task on the RocksDB backend with incremental
checkpoints, its DB's files, ``(file, size)`` named as chain links name them: the task's
groups are then located at its DB checkpoint's index (``engine.state.sst_checkpoints``).
Versions 2 (no chains) and 3 still read.

Guarantees: ``decode`` returns a ``CheckpointMetadata`` or raises ``RestoreError`` saying
whether the bytes are foreign (not a reflow checkpoint), of another format version, or
corrupt (the checksum or the body does not hold).
"""

from __future__ import annotations

import builtins
import struct
import zlib
from dataclasses import dataclass
from typing import Any

from engine.errors import CodecError, RestoreError
from engine.names import NameEnum
from engine.wire.codec import pack_exact, unpack_exact

MAGIC = b"RFLWCHK\x00"
FORMAT_VERSION = 4  # 4: DB files (SST-level); 3: incremental chains; 2: partition lists
_READABLE = (2, 3, 4)
METADATA_FILE = "_metadata"
_HEADER = struct.Struct("!HI")


class CheckpointKind(NameEnum):
    """A periodic ``checkpoint`` (retained, discarded by reflow) or a ``savepoint`` (asked
    for by the user, never discarded by reflow)."""

    CHECKPOINT = "checkpoint"
    SAVEPOINT = "savepoint"


@dataclass(frozen=True)
class VertexState:
    """One vertex of the checkpointed job: its name (its first operator's), the operators
    fused in it, its parallelism, whether it is keyed or a source, its assignment (key
    group -> task index; keyed vertices only) and a source's partition list (fixed for the
    job's life: a restore uses it, not a new one)."""

    name: str
    operators: tuple[str, ...]
    parallelism: int
    keyed: bool
    source: bool
    assignment: tuple[int, ...] = ()
    partitions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.parallelism < 1 or not self.operators:
            raise ValueError(f"vertex {self.name!r}: parallelism >= 1 and operators needed")
        if self.keyed and (not self.assignment or max(self.assignment) >= self.parallelism):
            raise ValueError(f"keyed vertex {self.name!r} needs an assignment within its "
                             f"{self.parallelism} tasks")


# one link of a key group's chain: (file relative to the checkpoint's location, offset,
# length, crc32)
Link = tuple[str, int, int, int]


@dataclass(frozen=True)
class TaskState:
    """One task's part: key groups in ``file`` (relative to the checkpoint's location; ''
    when it holds none) as ``(key_group, offset, length, crc32)``, its source's resume
    states ``{partition: state}`` (None: not a source task), its sinks' transactions
    ``(writer, transaction)``, and what it cost. ``chains``: an incremental checkpoint's
    groups as chains of ``(file, offset, length, crc32)`` links, base first (see the module
    doc); when given, a restore reads them, and ``groups`` only says what this checkpoint
    wrote itself. ``db_files``: an SST-level incremental checkpoint's files of the task's
    DB, ``(file, size)`` as chain links name files; ``file`` is then the DB's index, at
    which ``groups`` locates each group (offset ``DB_PART``)."""

    task: str
    vertex: str
    index: int
    file: str = ""
    groups: tuple[tuple[int, int, int, int], ...] = ()
    source_state: Any = None
    transactions: tuple[tuple[str, Any], ...] = ()
    bytes: int = 0
    alignment_s: float = 0.0
    sync_s: float = 0.0
    async_s: float = 0.0
    chains: tuple[tuple[int, tuple[Link, ...]], ...] = ()
    db_files: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class CheckpointMetadata:
    """A complete checkpoint or savepoint. ``location``: where it was read from or written
    to (not stored: a savepoint may be moved). ``duration_s``: trigger to complete."""

    checkpoint_id: int
    kind: CheckpointKind
    job_id: str
    job_name: str
    created_at: float
    num_key_groups: int
    vertices: tuple[VertexState, ...]
    tasks: tuple[TaskState, ...]
    duration_s: float = 0.0
    location: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", CheckpointKind.parse(self.kind, "checkpoint kind"))
        names = [v.name for v in self.vertices]
        if len(set(names)) != len(names):
            raise ValueError("a checkpoint's vertices have unique names")
        known = set(names)
        if any(t.vertex not in known for t in self.tasks):
            raise ValueError("every task of a checkpoint belongs to one of its vertices")

    @property
    def bytes(self) -> int:
        return sum(t.bytes for t in self.tasks)

    def vertex(self, name: str) -> VertexState | None:
        return next((v for v in self.vertices if v.name == name), None)

    def tasks_of(self, vertex: str) -> list[TaskState]:
        """The tasks of ``vertex``, by index."""
        return sorted((t for t in self.tasks if t.vertex == vertex), key=lambda t: t.index)

    # -- the file
    def to_wire(self) -> list[Any]:
        return [self.checkpoint_id, str(self.kind), self.job_id, self.job_name, self.created_at,
                self.num_key_groups,
                [[v.name, list(v.operators), v.parallelism, v.keyed, v.source,
                  list(v.assignment), list(v.partitions)] for v in self.vertices],
                [[t.task, t.vertex, t.index, t.file, [list(g) for g in t.groups],
                  t.source_state, [list(x) for x in t.transactions], t.bytes, t.alignment_s,
                  t.sync_s, t.async_s, [[kg, [list(link) for link in links]]
                                        for kg, links in t.chains],
                  [list(f) for f in t.db_files]] for t in self.tasks],
                self.duration_s]

    @classmethod
    def from_wire(cls, body: list[Any], location: str) -> CheckpointMetadata:
        cid, kind, job_id, job_name, created, nkg, vertices, tasks, duration = body
        return cls(
            cid, kind, job_id, job_name, created, nkg,
            tuple(VertexState(n, tuple(ops), p, k, s, tuple(a), tuple(parts))
                  for n, ops, p, k, s, a, parts in vertices),
            tuple(_task_state(t) for t in tasks), duration, location)

    def files(self) -> set[str]:
        """Every file this checkpoint's restore reads, relative to its location (its own
        parts, and an incremental one's links into earlier checkpoints)."""
        out = {t.file for t in self.tasks if t.file and (t.groups or t.db_files)}
        out.update(link[0] for t in self.tasks for _, links in t.chains for link in links)
        out.update(f for t in self.tasks for f, _ in t.db_files)
        return out

    # ``builtins.bytes``: the ``bytes`` property above shadows the type in this class body
    def encode(self) -> builtins.bytes:
        body = pack_exact(self.to_wire())
        return MAGIC + _HEADER.pack(FORMAT_VERSION, zlib.crc32(body)) + body

    @classmethod
    def decode(cls, data: builtins.bytes, location: str) -> CheckpointMetadata:
        """The metadata in ``data`` (read from ``location``), or ``RestoreError``."""
        if not data.startswith(MAGIC) or len(data) < len(MAGIC) + _HEADER.size:
            raise RestoreError(
                f"{location} is not a reflow checkpoint or savepoint (its {METADATA_FILE} "
                "does not start with reflow's marker); give the directory reflow wrote",
                path=location, reason="foreign")
        version, crc = _HEADER.unpack_from(data, len(MAGIC))
        if version not in _READABLE:
            raise RestoreError(
                f"{location} was written in checkpoint format version {version}; this reflow "
                f"reads version {FORMAT_VERSION}: restore it with the reflow that wrote it",
                path=location, reason="version")
        body = data[len(MAGIC) + _HEADER.size:]
        if zlib.crc32(body) != crc:
            raise RestoreError(
                f"{location} is corrupt: the checksum of its {METADATA_FILE} does not match "
                "(a truncated or altered file); restore an earlier checkpoint",
                path=location, reason="corrupt")
        try:
            return cls.from_wire(unpack_exact(body), location)
        except (CodecError, ValueError, TypeError) as exc:
            raise RestoreError(f"{location} is corrupt: its {METADATA_FILE} does not hold a "
                               f"checkpoint ({exc}); restore an earlier checkpoint",
                               path=location, reason="corrupt") from exc


def _task_state(fields: list[Any]) -> TaskState:
    task, v, i, f, groups, src, txns, b, al, sy, asy, *more = fields
    chains = tuple((int(kg), tuple((str(fl), int(o), int(n), int(c)) for fl, o, n, c in links))
                   for kg, links in (more[0] if more else ()))
    db_files = tuple((str(fl), int(n)) for fl, n in (more[1] if len(more) > 1 else ()))
    return TaskState(task, v, i, f, tuple(tuple(g) for g in groups), src,
                     tuple((w, txn) for w, txn in txns), b, al, sy, asy, chains, db_files)


__all__ = ["FORMAT_VERSION", "Link", "METADATA_FILE", "CheckpointKind", "CheckpointMetadata",
           "TaskState", "VertexState"]
