"""The durable job record's file format: ``DurableRecord``, a value, and its bytes.

Why a durable record: a JobMaster keeps its job's state (``engine.control.job_state.
JobRecord``) in memory; when its process dies, a restarted JobMaster must find that state
again to carry the job on (issue 30: reconcile with the tasks still alive, or restart from
the last complete checkpoint). This module is the state as plain values with a stable
encoding; ``engine.control.durable`` converts a ``JobRecord`` to and from it, and
``engine.checkpoints.job_store`` keeps it in the job's checkpoint directory (``_job``).
It lives here, below ``engine.control``, because the store (a checkpoint-layer module)
reads and writes it and may not import upward (tests/unit/test_layers.py).

Format of ``_job``: one msgpack array ``[FORMAT, crc32(body), body]`` (plain msgpack:
any msgpack reader reads it), where ``body`` is the exact msgpack encoding
(``engine.wire.codec.pack_exact``) of a map from field name to plain values::

    job_id, name, master_epoch, status, error, error_suffix, epoch, restarts,
    last_failure, checkpoint ([id, kind, location] or nil), next_checkpoint_id,
    generation, parallelism {vertex: int}, tasks {vertex: [task name]},
    assignments {vertex: [task index per key group]}, partitions {vertex: [partition]},
    actions [[ticket, kind, [vertex], stop_restart, exclusive, label]],
    rescales [encode_message(RescaleRecord)], decisions [encode_message(DecisionRecord)],
    user_code {codec: "cloudpickle-user-code", logic: {operator: bytes},
               controllers: [bytes]},
    channels [[edge id, sender task, receiver task, channel id]], next_channel_id,
    next_subscale_id

``channels`` and the two counters are the JobMaster's allocators (``ChannelIds``,
``SubscaleIds``): the live tasks know their channels by these ids, so a JobMaster that
keeps them (a reconciled takeover) must allocate on from where the lost one stopped.

``user_code`` is the one part that is not data: cloudpickle bytes of the operators whose
logic changed while the job ran and of the job's controllers. Nothing here unpickles them;
``engine.control.durable.load_user_code`` does, for the job's own JobMaster reading its
own store (see its docstring for the trust boundary).

Guarantees: a ``DurableRecord`` is internally consistent (``__post_init__``: counters in
range, every vertex's task list as long as its parallelism, assignments within it);
``decode`` returns one or raises ``JobRecordUnreadable`` naming the path, the job and the
reason (``RecordProblem``): foreign bytes, another format number, a checksum that does not
hold, a missing or ill-typed field. ``encode`` raises ``CodecError`` for a value msgpack
cannot carry (nothing is written then).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from engine.checkpoints.metadata import CheckpointKind
from engine.errors import CodecError, JobRecordUnreadable
from engine.names import JobState, NameEnum
from engine.wire.codec import pack_exact, unpack_exact

FORMAT = 1
USER_CODE_CODEC = "cloudpickle-user-code"  # the declared codec of ``user_code``'s bytes

#: one granted action of the arbiter: (ticket, kind, vertices, stop_restart, exclusive,
#: label), ``engine.control.arbiter.Running`` as plain values
ActionTuple = tuple[int, str, tuple[str, ...], bool, bool, str]
#: the last complete checkpoint: (checkpoint id, kind, location)
PointerTuple = tuple[int, str, str]


class RecordProblem(NameEnum):
    """Why a job record cannot be read (``JobRecordUnreadable.reason``)."""

    UNREADABLE = "unreadable"  # the store refused to read the file
    FOREIGN = "foreign"        # not a reflow job record, or another job's
    VERSION = "version"        # a format number this reflow does not read
    CORRUPT = "corrupt"        # the checksum or a field's value does not hold
    INCOMPLETE = "incomplete"  # a field is missing
    MISMATCH = "mismatch"      # it does not fit the job's graph
    USER_CODE = "user-code"    # a changed operator or a controller does not unpickle


def unreadable(path: str, job: str, reason: RecordProblem, what: str) -> JobRecordUnreadable:
    """The error for a record at ``path`` of ``job`` that cannot be used, saying ``what``
    and what to do."""
    return JobRecordUnreadable(
        f"the job record {path} of job {job or '?'} cannot be read: {what}. The job is not "
        f"started from nothing in its place: restore it from its checkpoints "
        f"(job.run(restore_from=<its checkpoint directory>)), or move the record away to "
        f"start it anew", path=path, reason=str(reason), job=job)


def _int(value: Any, what: str, least: int) -> int:
    if type(value) is not int or value < least:
        raise ValueError(f"{what} is an int >= {least}; got {value!r:.80}")
    return value


def _str(value: Any, what: str) -> str:
    if type(value) is not str:
        raise ValueError(f"{what} is a string; got {value!r:.80}")
    return value


def _bytes(value: Any, what: str) -> bytes:
    if type(value) is not bytes:
        raise ValueError(f"{what} is bytes; got {type(value).__name__}")
    return value


def _strs(values: Any, what: str) -> tuple[str, ...]:
    if not isinstance(values, (list, tuple)):
        raise ValueError(f"{what} is a list; got {values!r:.80}")
    return tuple(_str(v, what) for v in values)


def _ints(values: Any, what: str) -> tuple[int, ...]:
    if not isinstance(values, (list, tuple)):
        raise ValueError(f"{what} is a list; got {values!r:.80}")
    return tuple(_int(v, what, 0) for v in values)


def _by_name(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} maps names to values; got {value!r:.80}")
    return {_str(k, f"a name in {what}"): v for k, v in value.items()}


def _pointer(value: Any) -> PointerTuple | None:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise ValueError(f"checkpoint is (id, kind, location) or None; got {value!r:.80}")
    cid, kind, location = value
    return (_int(cid, "checkpoint id", 0),
            str(CheckpointKind.parse(kind, "checkpoint kind")), _str(location, "location"))


def _channel(value: Any) -> tuple[int, str, str, int]:
    if not isinstance(value, (list, tuple)) or len(value) != 4:
        raise ValueError(f"a channel is [edge id, sender, receiver, channel id]; got {value!r}")
    edge, src, dst, cid = value
    return (_int(edge, "an edge id", 0), _str(src, "a sender task"),
            _str(dst, "a receiver task"), _int(cid, "a channel id", 0))


def _action(value: Any) -> ActionTuple:
    if not isinstance(value, (list, tuple)) or len(value) != 6:
        raise ValueError("an action is (ticket, kind, vertices, stop_restart, exclusive, "
                         f"label); got {value!r:.80}")
    ticket, kind, vertices, stop_restart, exclusive, label = value
    if type(stop_restart) is not bool or type(exclusive) is not bool:
        raise ValueError(f"an action's stop_restart and exclusive are bools; got {value!r:.80}")
    return (_int(ticket, "an action's ticket", 0), _str(kind, "an action's kind"),
            _strs(vertices, "an action's vertices"), stop_restart, exclusive,
            _str(label, "an action's label"))


@dataclass(frozen=True)
class DurableRecord:
    """One job's state as the store keeps it (the module doc; field by field the
    ``JobRecord``'s, plus ``master_epoch``: the epoch of the JobMaster that wrote it,
    ``name``: the job's name, ``next_checkpoint_id``: the checkpoint counter, and
    ``logic``/``controllers``: ``user_code``'s bytes). Plain values only: what the
    deployment's plan is, is said by ``parallelism`` (a vertex's current parallelism) and
    ``logic`` (the operators whose function changed), against the job's graph."""

    job_id: str
    name: str
    master_epoch: int
    status: JobState
    error: str = ""
    error_suffix: str = ""
    epoch: int = 0
    restarts: int = 0
    last_failure: str = ""
    checkpoint: PointerTuple | None = None
    next_checkpoint_id: int = 1
    generation: int = 0
    parallelism: Mapping[str, int] = field(default_factory=dict)
    tasks: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    assignments: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    partitions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    actions: tuple[ActionTuple, ...] = ()
    rescales: tuple[bytes, ...] = ()
    decisions: tuple[bytes, ...] = ()
    logic: Mapping[str, bytes] = field(default_factory=dict)
    controllers: tuple[bytes, ...] = ()
    channels: tuple[tuple[int, str, str, int], ...] = ()
    next_channel_id: int = 0
    next_subscale_id: int = 0

    def __post_init__(self) -> None:
        put = object.__setattr__
        if not _str(self.job_id, "job_id"):
            raise ValueError("a job record needs its job's id")
        _str(self.name, "name")
        for what in ("error", "error_suffix", "last_failure"):
            _str(getattr(self, what), what)
        put(self, "status", JobState.parse(self.status, "job state"))
        _int(self.master_epoch, "master_epoch", 0)
        _int(self.restarts, "restarts", 0)
        if _int(self.epoch, "epoch", 0) < self.restarts:
            raise ValueError(f"restarts ({self.restarts}) are at most the restarts begun "
                             f"({self.epoch})")
        _int(self.next_checkpoint_id, "next_checkpoint_id", 1)
        _int(self.generation, "generation", 0)
        put(self, "checkpoint", _pointer(self.checkpoint))
        self._check_deployment()
        put(self, "actions", tuple(_action(a) for a in self.actions))
        put(self, "rescales", tuple(_bytes(b, "a rescale record") for b in self.rescales))
        put(self, "decisions", tuple(_bytes(b, "a decision record") for b in self.decisions))
        put(self, "logic", {_str(k, "an operator name"): _bytes(b, f"the logic of {k!r}")
                            for k, b in _by_name(self.logic, "logic").items()})
        put(self, "controllers", tuple(_bytes(b, "a controller") for b in self.controllers))
        _int(self.next_subscale_id, "next_subscale_id", 0)
        channels = tuple(_channel(c) for c in self.channels)
        if channels and max(c[3] for c in channels) >= _int(self.next_channel_id,
                                                              "next_channel_id", 0):
            raise ValueError("a channel id is not below next_channel_id")
        put(self, "channels", channels)

    def _check_deployment(self) -> None:
        """Every vertex has a parallelism >= 1 and as many tasks; assignments index those
        tasks; partitions and assignments name known vertices."""
        put = object.__setattr__
        par = {v: _int(p, f"the parallelism of {v!r}", 1)
               for v, p in _by_name(self.parallelism, "parallelism").items()}
        tasks = {v: _strs(t, f"the tasks of {v!r}")
                 for v, t in _by_name(self.tasks, "tasks").items()}
        if set(tasks) != set(par):
            raise ValueError(f"tasks name vertices {sorted(tasks)}, parallelism "
                             f"{sorted(par)}: the same vertices are needed")
        for v, p in par.items():
            if len(tasks[v]) != p:
                raise ValueError(f"vertex {v!r} runs {p} tasks; {len(tasks[v])} are named")
        assignments: dict[str, tuple[int, ...]] = {}
        for v, a in _by_name(self.assignments, "assignments").items():
            if v not in par:
                raise ValueError(f"an assignment names vertex {v!r}, which is not deployed")
            assignments[v] = _ints(a, f"the assignment of {v!r}")
            if not assignments[v] or max(assignments[v]) >= par[v]:
                raise ValueError(f"the assignment of {v!r} is not within its {par[v]} tasks")
        partitions = {v: _strs(p, f"the partitions of {v!r}")
                      for v, p in _by_name(self.partitions, "partitions").items()}
        if not set(partitions) <= set(par):
            raise ValueError(f"partitions name vertices {sorted(set(partitions) - set(par))}, "
                             "which are not deployed")
        put(self, "parallelism", par)
        put(self, "tasks", tasks)
        put(self, "assignments", assignments)
        put(self, "partitions", partitions)

    @property
    def user_code(self) -> Mapping[str, Any]:
        """``{"codec", "logic", "controllers"}`` as in the file."""
        return {"codec": USER_CODE_CODEC, "logic": dict(self.logic),
                "controllers": list(self.controllers)}

    # ---------------------------------------------------------------- the file
    def to_wire(self) -> dict[str, Any]:
        """The body's map of plain values (lists, not tuples)."""
        return {
            "job_id": self.job_id, "name": self.name, "master_epoch": self.master_epoch,
            "status": str(self.status), "error": self.error,
            "error_suffix": self.error_suffix, "epoch": self.epoch,
            "restarts": self.restarts, "last_failure": self.last_failure,
            "checkpoint": None if self.checkpoint is None else list(self.checkpoint),
            "next_checkpoint_id": self.next_checkpoint_id, "generation": self.generation,
            "parallelism": dict(self.parallelism),
            "tasks": {v: list(t) for v, t in self.tasks.items()},
            "assignments": {v: list(a) for v, a in self.assignments.items()},
            "partitions": {v: list(p) for v, p in self.partitions.items()},
            "actions": [[t, k, list(vs), s, e, label]
                        for t, k, vs, s, e, label in self.actions],
            "rescales": list(self.rescales), "decisions": list(self.decisions),
            "user_code": self.user_code,
            "channels": [list(c) for c in self.channels],
            "next_channel_id": self.next_channel_id,
            "next_subscale_id": self.next_subscale_id,
        }

    def encode(self) -> bytes:
        """The file's bytes; ``CodecError`` when a value cannot be encoded."""
        body = pack_exact(self.to_wire())
        return pack_exact([FORMAT, zlib.crc32(body), body])

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> DurableRecord:
        """The record of a body map; ``KeyError`` naming a missing field, ``ValueError``
        (or ``TypeError``) for a value that does not hold."""
        code = body["user_code"]
        if not isinstance(code, Mapping) or code.get("codec") != USER_CODE_CODEC:
            raise ValueError(f"user_code is not of codec {USER_CODE_CODEC!r}")
        plain = {f.name: body[f.name] for f in fields(cls)
                 if f.name not in ("logic", "controllers")}
        return cls(**{**plain, "actions": tuple(body["actions"]),
                      "rescales": tuple(body["rescales"]),
                      "decisions": tuple(body["decisions"]),
                      "logic": code["logic"], "controllers": tuple(code["controllers"])})

    @classmethod
    def decode(cls, data: bytes, path: str, job: str = "") -> DurableRecord:
        """The record in ``data`` (read from ``path``, the record of ``job`` when known),
        or ``JobRecordUnreadable`` naming the path, the job and the reason."""
        try:
            outer = unpack_exact(data)
        except CodecError as exc:
            raise unreadable(path, job, RecordProblem.FOREIGN,
                             f"it is not a reflow job record ({exc})") from exc
        if not (isinstance(outer, list) and len(outer) == 3 and type(outer[0]) is int
                and type(outer[1]) is int and type(outer[2]) is bytes):
            raise unreadable(path, job, RecordProblem.FOREIGN,
                             "it is not a reflow job record ([format, crc, body] expected)")
        version, crc, body = outer
        if version != FORMAT:
            raise unreadable(path, job, RecordProblem.VERSION,
                             f"it is in job record format {version}; this reflow reads "
                             f"format {FORMAT} (use the reflow that wrote it)")
        if zlib.crc32(body) != crc:
            raise unreadable(path, job, RecordProblem.CORRUPT,
                             "its checksum does not match (a truncated or altered file)")
        try:
            fields_ = unpack_exact(body)
            if not isinstance(fields_, Mapping):
                raise ValueError("its body is not a map of fields")
            named = fields_.get("job_id")
            job = named if isinstance(named, str) and named else job
            return cls.from_wire(fields_)
        except KeyError as exc:
            raise unreadable(path, job, RecordProblem.INCOMPLETE,
                             f"field {exc.args[0]!r} is missing") from exc
        except (CodecError, ValueError, TypeError, AttributeError) as exc:
            raise unreadable(path, job, RecordProblem.CORRUPT,
                             f"a field does not hold: {exc}") from exc


__all__ = ["FORMAT", "USER_CODE_CODEC", "ActionTuple", "DurableRecord", "PointerTuple",
           "RecordProblem", "unreadable"]
