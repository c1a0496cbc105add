"""Every element and control message, as frozen dataclasses, and their msgpack wire codec.

Two families:

* **Channel events** travel on a data channel, in order with the records (a frame carries
  records followed by at most one event): ``Watermark``, ``CheckpointBarrier``,
  ``LatencyMarker``, ``EndOfStream`` (and the migration barriers below).
* **Control messages** go between the JobMaster and a task outside the data path:
  commands (JobMaster → task) and reports (task → JobMaster).

On the wire a message is ``[tag, field, ...]`` encoded with the exact msgpack codec; only
the classes declared here decode. Every invariant is in the class docstring and checked in
``__post_init__`` where cheap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from engine.errors import CodecError
from engine.wire.codec import (
    Runs,
    pack_exact,
    pack_fast,
    register_wire_hooks,
    runs_of,
    unpack_exact,
    unpack_fast,
)

if TYPE_CHECKING:
    import numpy as np

M = TypeVar("M")
_REGISTRY: dict[str, type] = {}
_WIRE_TYPES: set[type] = set()


def wire(cls: type[M]) -> type[M]:
    """Declare a frozen dataclass as a wire message (its class name is its tag)."""
    # ``__dataclass_params__`` is set on every dataclass but typeshed does not declare it
    if not dataclasses.is_dataclass(cls) or not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__name__} must be a frozen dataclass to travel on the wire")
    _REGISTRY[cls.__name__] = cls
    _WIRE_TYPES.add(cls)
    return cls


def _to_list(msg: Any) -> list[Any]:
    kind = type(msg)
    tag = kind.__name__
    if _REGISTRY.get(tag) is not kind:
        raise CodecError(f"{tag} is not a declared wire message")
    return [tag, *(getattr(msg, f.name) for f in dataclasses.fields(msg))]


def _from_list(items: Any) -> Any:
    try:
        tag, *fields = items
        cls = _REGISTRY[tag]
    except (TypeError, ValueError, KeyError) as exc:
        raise CodecError(f"not a declared wire message: {items!r:.200}") from exc
    try:
        return cls(*fields)
    except (TypeError, ValueError) as exc:
        raise CodecError(f"{tag} does not accept fields {fields!r:.200}: {exc}") from exc


register_wire_hooks(_WIRE_TYPES, lambda m: _to_list(m), lambda items: _from_list(items))


def encode_message(msg: Any) -> bytes:
    """Encode a control message (exact codec: tuples stay tuples)."""
    return pack_exact(_to_list(msg))


def decode_message(data: bytes) -> Any:
    return _from_list(unpack_exact(data))


# ---------------------------------------------------------------- channel events


@wire
@dataclass(frozen=True, slots=True)
class Watermark:
    """No record with event time <= ``timestamp`` (ms) follows on this channel."""

    timestamp: int


@wire
@dataclass(frozen=True, slots=True)
class CheckpointBarrier:
    """Aligned checkpoint barrier (``engine.task.alignment``): records before it on every channel
    are in checkpoint ``checkpoint_id`` (ids grow), records after it are not. ``location``:
    the directory or URI each task writes its part to; ``stop``: a stop-with-savepoint, after
    which every task stays quiet (sources read nothing more, no timer fires); ``savepoint``:
    a savepoint (written whole and self-contained, even with incremental checkpoints)."""

    checkpoint_id: int
    location: str = ""
    stop: bool = False
    savepoint: bool = False


@wire
@dataclass(frozen=True, slots=True)
class LatencyMarker:
    """Created at a source task at wall-clock ``created_at`` (s); flows like a record to sinks."""

    created_at: float
    source_task: int


@wire
@dataclass(frozen=True, slots=True)
class EndOfStream:
    """The sending task will send nothing more on this channel."""


@wire
@dataclass(frozen=True, slots=True)
class ConfirmBarrier:
    """DRRS: on predecessor u's data channel to the old owner, after the last record of the
    subscale's key groups it sent there; the old owner forwards it to the new owner on the
    re-route channel. ``direct_channel`` is u's channel to the new owner."""

    subscale: int
    direct_channel: int


@wire
@dataclass(frozen=True, slots=True)
class PauseBarrier:
    """pause-resume: on predecessor u's data channel to the new owner, after u switched its
    routing; the new owner reads nothing more from the channel until the subscale's state
    is installed."""

    subscale: int


@wire
@dataclass(frozen=True, slots=True)
class ChannelIdle:
    """The sender has no data for now: its watermark stops holding the receiver back until
    its next watermark."""


@wire
@dataclass(frozen=True, slots=True)
class LogicBarrier:
    """A change of logic's cut, sent by every predecessor of the operator's tasks on its
    channels to them: a task switches to function version ``version`` once every live
    input delivered it (channels that did are not read meanwhile); records before it on a
    channel saw the old function, records after it the new one."""

    version: int


@wire
@dataclass(frozen=True, slots=True)
class WatermarkHold:
    """A live rescale: the old owner of a subscale's key groups, on every output channel when
    the groups freeze there, at its watermark then. Until the matching ``WatermarkRelease``
    the receiver's watermark does not pass ``watermark``: records of the groups may still be
    on their way to the new owner (re-routed, set aside, waiting for their state), and their
    outputs must not come after a watermark that passed them (``engine.time.event_time.WatermarkTracker``).
    ``token``: the subscale's id, unique within the job."""

    token: int
    watermark: int


@wire
@dataclass(frozen=True, slots=True)
class WatermarkRelease:
    """The new owner of the subscale ``token``'s key groups, on every output channel, behind
    the outputs of everything of the subscale it processed: the hold is lifted. It may reach
    a receiver before the hold (another channel); the hold then never takes effect."""

    token: int


@wire
@dataclass(frozen=True, slots=True)
class GroupLeft:
    """A live rescale: the old owner of ``key_group``, on every output channel when it gives
    the group away, behind all its outputs of it (``engine.task.group_order``)."""

    subscale: int
    key_group: int


@wire
@dataclass(frozen=True, slots=True)
class GroupArrived:
    """A live rescale: the new owner of ``key_group``, on every output channel when the
    group's state is in, ahead of all its outputs of it; a receiver reads nothing more of
    the channel until it has met the matching ``GroupLeft`` (``engine.task.group_order``)."""

    subscale: int
    key_group: int


ChannelEvent = (Watermark | CheckpointBarrier | LatencyMarker | EndOfStream | ChannelIdle
                | ConfirmBarrier | PauseBarrier | LogicBarrier | WatermarkHold | WatermarkRelease
                | GroupLeft | GroupArrived)


class ColumnarValues(Protocol):
    """The shape of a columnar ``Frame.values``: an ``engine.columnar.batches.ColumnBatch``
    (that layer sits above the wire, see ``ColumnarFrameCodec``), named by what a frame
    needs of it."""

    def __len__(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Frame:
    """What one push on a channel carries: records (in order) then at most one event.

    ``keys`` and ``key_groups`` are set on keyed channels (one per record), else None.
    ``timestamps`` has one entry (ms) per record.
    """

    values: tuple[Any, ...] | list[Any] | ColumnarValues
    timestamps: tuple[int, ...] | list[int] | np.ndarray
    keys: tuple[Any, ...] | list[Any] | str | None = None  # columnar: the key column's name
    key_groups: tuple[int, ...] | list[int] | np.ndarray | None = None
    event: ChannelEvent | None = None
    ports: tuple[int, ...] | list[int] | None = None  # re-routed records: their input port


@dataclass(frozen=True)
class ColumnarFrameCodec:
    """How columnar frames are written and read: ``engine.columnar.batches`` registers its
    Arrow IPC encoder and decoder here when it is imported (``register_columnar_frames``).

    Why a registration: the columnar path sits above the wire format (it hashes keys into
    key groups with ``engine.dataflow.keygroups``, which builds messages), so the wire may
    not import it. A process can only hold a ``ColumnBatch`` to send after importing the
    columnar path, and every task actor imports it (the task core's operators do)."""

    encode: Callable[..., bytes]
    decode: Callable[[bytes, Callable[[bytes], Any]], tuple[Any, Any, Any, Any, Any]]


_COLUMNAR_FRAMES: list[ColumnarFrameCodec] = []


def register_columnar_frames(codec: ColumnarFrameCodec) -> None:
    """Install the columnar frame codec (``engine.columnar.batches`` does, once)."""
    _COLUMNAR_FRAMES[:] = [codec]


def _columnar_frames() -> ColumnarFrameCodec:
    if not _COLUMNAR_FRAMES:
        raise CodecError("a columnar frame, but the columnar path is not loaded in this "
                         "process: import engine.columnar.batches before sending or reading "
                         "columnar frames")
    return _COLUMNAR_FRAMES[0]


_MIN_RUNS_STAMPS = 16  # fewer timestamps go as they are


def encode_frame(frame: Frame) -> bytes:
    """A frame's bytes: msgpack ``[values, timestamps, keys, key_groups, event, ports]``
    (``timestamps`` one int when every record has the same, their runs
    (``engine.wire.codec.Runs``) when they are a few runs of equal ints), or Arrow IPC when its
    ``values`` is a ``engine.columnar.batches.ColumnBatch`` (``timestamps`` and ``key_groups`` then
    numpy arrays, ``keys`` the name of the key column or None; see ``engine.columnar.batches``)."""
    event = None if frame.event is None else _to_list(frame.event)
    if type(frame.values).__name__ == "ColumnBatch":
        return _columnar_frames().encode(frame.values, frame.timestamps, frame.key_groups,
                                         event, frame.keys, pack_exact)
    ts = frame.timestamps
    # one stamp for all (a source batch read at full speed): sent once
    same = (isinstance(ts, list | tuple) and len(ts) > 1 and ts[0] == ts[-1]
            and ts.count(ts[0]) == len(ts))
    stamps: Any = ts[0] if same else ts
    if not same and len(ts) >= _MIN_RUNS_STAMPS and isinstance(ts, list | tuple):
        # a frame holding a few source batches (a keyed channel at p > 1): their runs
        runs = runs_of(ts)
        if runs is not None and all(type(t) is int for t, _ in runs):
            stamps = Runs(runs)
    return pack_fast((frame.values, stamps, frame.keys, frame.key_groups, event,
                      frame.ports))


def decode_frame(data: bytes) -> Frame:
    """A frame from its bytes (msgpack, or a columnar frame: ``engine.columnar.batches``)."""
    if data[:4] == b"\xff\xff\xff\xff":
        batch, ts, keys, kgs, ev = _columnar_frames().decode(data, unpack_exact)
        return Frame(batch, ts, keys, kgs, None if ev is None else _from_list(ev))
    items = unpack_fast(data)
    if not isinstance(items, tuple) or len(items) not in (5, 6):
        raise CodecError(f"not a reflow data frame: {items!r:.100}")
    values, timestamps, keys, kgs, event = items[:5]
    if type(timestamps) is int:
        timestamps = (timestamps,) * len(values)
    ports = items[5] if len(items) == 6 else None
    return Frame(values, timestamps, keys, kgs, None if event is None else _from_list(event),
                 ports)


# ---------------------------------------------------------------- JobMaster → task


@wire
@dataclass(frozen=True, slots=True)
class OutputChannel:
    """One channel from this task to ``target`` (a task actor name), input ``port`` there."""

    channel_id: int
    target: str
    port: int


@wire
@dataclass(frozen=True, slots=True)
class OutputEdge:
    """All channels of one logical edge leaving this task.

    ``partitioning`` is ``forward`` (exactly one channel), ``rebalance`` (round robin) or
    ``keyed`` (``routing[key_group]`` is an index into ``channels``).
    """

    edge_id: int
    partitioning: str
    channels: tuple[OutputChannel, ...]
    routing: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.partitioning not in ("forward", "rebalance", "keyed"):
            raise ValueError(f"unknown partitioning {self.partitioning!r}")
        if self.partitioning == "forward" and len(self.channels) != 1:
            raise ValueError("a forward edge has exactly one channel")
        if self.partitioning == "keyed" and any(
            not 0 <= r < len(self.channels) for r in self.routing
        ):
            raise ValueError("keyed routing points outside the edge's channels")


@wire
@dataclass(frozen=True, slots=True)
class Connect:
    """Replace the task's inputs and outputs. Only sent before start or while drained.

    ``inputs`` are ``(channel_id, port)`` pairs this task reads; channels kept by id keep
    their sequence numbers, removed ones must be empty.
    """

    inputs: tuple[tuple[int, int], ...]
    outputs: tuple[OutputEdge, ...]


@wire
@dataclass(frozen=True, slots=True)
class Start:
    """Begin processing. A source task reads ``partitions``: ``(partition id, resume state)``
    pairs (resume state None: the partition's start), positions j of the source's
    partition list with ``j % parallelism == task index`` (``engine.io.sources``); other tasks
    get none."""

    partitions: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        for entry in self.partitions:
            if (not isinstance(entry, tuple) or len(entry) != 2
                    or not isinstance(entry[0], str)):
                raise CodecError(f"Start.partitions holds (partition id, resume state) pairs; "
                                 f"got {entry!r:.200}")


@wire
@dataclass(frozen=True, slots=True)
class ReleaseSource:
    """Source rescale, to an old source task: stop reading for good, close the partitions,
    end the outputs (``EndOfStream`` behind everything emitted) and stop; replied to with
    ``SourceReleased``."""


@wire
@dataclass(frozen=True, slots=True)
class Resume:
    """After a stop-with-savepoint that failed: sources read again from where they stopped;
    timers fire again."""


@wire
@dataclass(frozen=True, slots=True)
class InstallKeyGroups:
    """Install these key groups (``(key_group, encoded_state)`` pairs) and own them."""

    groups: tuple[tuple[int, bytes], ...]


@wire
@dataclass(frozen=True, slots=True)
class StopTask:
    """Stop processing and flush sinks; the actor will be killed afterwards. With
    ``end_outputs`` the task first sends EndOfStream on its outputs (a task removed by a
    live scale-in, whose receivers go on)."""

    end_outputs: bool = False


@wire
@dataclass(frozen=True, slots=True)
class AddOutputChannels:
    """Live: append ``channels`` to output edge ``edge_id`` (routing indices stay valid);
    the task's current watermark is sent on them."""

    edge_id: int
    channels: tuple[OutputChannel, ...]


@wire
@dataclass(frozen=True, slots=True)
class RemoveOutputChannels:
    """Live: drop these output channels (nothing routes to them any more)."""

    channel_ids: tuple[int, ...]


@wire
@dataclass(frozen=True, slots=True)
class ReplaceOutputChannel:
    """Live (placement): output channel ``replacement``, the last of its edge, takes the
    place of ``retired`` (its index in the edge and in the routing); ``retired`` is dropped
    (nothing routes to it any more). The replacement keeps its sequence numbers."""

    retired: int
    replacement: int


@wire
@dataclass(frozen=True, slots=True)
class AddInputs:
    """Live: read these ``(channel_id, port)`` channels too. With ``after`` (a source
    rescale), the new channels are read only once every channel in ``after`` has ended
    (their senders' records come first: a partition moved from an old source task to a new
    one keeps its order at this task)."""

    inputs: tuple[tuple[int, int], ...]
    after: tuple[int, ...] = ()


@wire
@dataclass(frozen=True, slots=True)
class HoldFinish:
    """Live rescale: while ``hold``, a task whose input has ended stays running instead of
    finishing, so it can still give away and take key groups; releasing (``hold`` False)
    finishes it if its input ended meanwhile. Replied to with ``TaskState``."""

    hold: bool


@wire
@dataclass(frozen=True, slots=True)
class TaskState:
    """Reply to ``HoldFinish`` and ``DescribeTask``: the task's status (created, running,
    finished, failed, stopped) and whether its input has ended; ``detail`` (DescribeTask
    only) says where its migrations and input channels stand, for error messages."""

    task: str
    status: str
    input_ended: bool
    detail: str = ""


@wire
@dataclass(frozen=True, slots=True)
class DescribeTask:
    """JobMaster → task, when a rescale is stuck: reply ``TaskState`` with ``detail``.
    Changes nothing."""


@wire
@dataclass(frozen=True, slots=True)
class GroupStatsRequest:
    """Per key group: records processed since the last request, state bytes and keys; and
    the distinct keys the task's records touched per second. Replied to with ``GroupStats``
    (the record counters restart). The records are estimated from a sample of frames scaled
    to the exact total, the distinct keys counted in windows
    (``engine.observability.groupstats``), the bytes from a sample of each table's entries
    (the keys: ``KeyedStateBackend.group_stats``). ``keys`` False: no keys (None in their
    place): counting them scans every key of the task's state (on RocksDB every value is
    read back), which a plan that needs only the bytes (drrs's) must not pay."""

    keys: bool = True


@wire
@dataclass(frozen=True, slots=True)
class GroupStats:
    """``groups``: ``(key_group, records, state_bytes[, keys])`` for every group the task
    holds (``keys``: the distinct keys holding state, None where the backend cannot say);
    ``seconds`` the records were counted over; ``keys_touched`` distinct keys the task's
    records touched over ``touched_seconds`` (its latest measuring window; -1: not measured
    yet)."""

    task: str
    groups: tuple[tuple[Any, ...], ...]
    seconds: float
    keys_touched: int = -1
    touched_seconds: float = 0.0


@wire
@dataclass(frozen=True, slots=True)
class RefreshReplicas:
    """To an owner: refresh the replica of each ``(key group, holder task, version the
    holder has or -1)``: a delta when the holder is at the group's last replicated
    version, else the full group. Sent to the holders (awaited) before the reply,
    ``ReplicasRefreshed``."""

    targets: tuple[tuple[int, str, int], ...]


@wire
@dataclass(frozen=True, slots=True)
class ReplicaUpdate:
    """Owner → holder: the replica of ``key_group`` at ``version`` (a full snapshot, or a
    delta from ``version`` - 1 when ``is_delta``). Replied to with ``ReplicaAck``."""

    key_group: int
    version: int
    data: bytes
    is_delta: bool


@wire
@dataclass(frozen=True, slots=True)
class ReplicaAck:
    """Holder's reply: ``kept`` False when a delta did not apply (the replica is dropped;
    the next refresh must be full)."""

    key_group: int
    kept: bool


@wire
@dataclass(frozen=True, slots=True)
class ReplicasRefreshed:
    """Owner's reply to ``RefreshReplicas``: ``(key group, version)`` now held by each
    holder, the groups whose holder dropped them, bytes sent and encoding CPU seconds."""

    versions: tuple[tuple[int, int], ...]
    dropped: tuple[int, ...]
    bytes: int
    cpu_s: float


@wire
@dataclass(frozen=True, slots=True)
class DropReplicas:
    """To a holder: forget the replicas of these key groups."""

    key_groups: tuple[int, ...]


@wire
@dataclass(frozen=True, slots=True)
class InjectSubscale:
    """To every predecessor: route ``key_groups`` of ``edge_id`` to task index
    ``new_index`` from now on; put ``ConfirmBarrier`` on the data channel to the old owner
    behind the records of those groups already sent; with ``trigger`` (DRRS) also send the
    old owner ``TriggerBarrier`` (priority); with ``pause_new`` (pause-resume) put
    ``PauseBarrier`` on the channel to the new owner."""

    subscale: int
    edge_id: int
    key_groups: tuple[int, ...]
    new_index: int
    trigger: bool = True
    pause_new: bool = False


@wire
@dataclass(frozen=True, slots=True)
class TriggerBarrier:
    """DRRS, priority, predecessor → old owner: start migrating the subscale now."""

    subscale: int


@wire
@dataclass(frozen=True, slots=True)
class ExpectOutgoing:
    """To the old owner: ``key_groups`` will go to ``reroute.target``; ``predecessors``
    confirms will arrive. DRRS (``aligned`` False): migrate on the first barrier and
    re-route later records of the groups on ``reroute``. Otherwise ship the state once every
    confirm is in (no record is ever re-routed); with ``block`` a channel that delivered its
    confirm is not read until then (Megaphone/Trisk alignment)."""

    subscale: int
    key_groups: tuple[int, ...]
    reroute: OutputChannel
    predecessors: int
    aligned: bool = False
    block: bool = False
    replicas: tuple[tuple[int, int], ...] = ()  # (key group, version the new owner holds)
    coupled: bool = False  # drrs without decoupled barriers: migrate once every confirm is in
    # drrs: a confirm queued behind other groups' records may be taken ahead of them
    schedule_records: bool = True


@wire
@dataclass(frozen=True, slots=True)
class ExpectIncoming:
    """To the new owner: ``key_groups`` are coming. With ``confirm_needed`` (DRRS) confirms
    for ``direct_channels`` come back on ``reroute_channel`` (added as an input) and a
    direct record waits for its channel's confirm; otherwise a record of a group is ready
    once the group's state is in. With ``fetch_on_demand`` (Meces) a record of a group whose
    state is not here and not asked for yet makes the new owner fetch it (``PullState``) at
    once, before the old owner was triggered and beside the pull in flight."""

    subscale: int
    key_groups: tuple[int, ...]
    direct_channels: tuple[int, ...]
    reroute_channel: int
    confirm_needed: bool = True
    old_owner: str = ""  # drrs: where to pull the groups from
    chunk_bytes: int = 0  # drrs: state that may be in flight beyond one group (0: one at a time)
    fetch_on_demand: bool = False
    schedule_records: bool = True  # False: a record that must wait stops its channel


@wire
@dataclass(frozen=True, slots=True)
class SubscaleTriggered:
    """DRRS, priority, old owner → new owner: the subscale's first barrier arrived; pull
    its groups (``sizes``: estimated state bytes per group) one at a time. ``pushed``: a
    group the old owner sends at once, unasked (its ``MigrateState`` follows this message;
    -1: none), so the first group costs no pull round trip."""

    subscale: int
    sizes: tuple[tuple[int, int], ...]
    pushed: int = -1


@wire
@dataclass(frozen=True, slots=True)
class PriorityBatch:
    """Priority, task → task: the priority messages one task has for another at one time,
    in one actor call (each costs ~1 ms of CPU); handled in order, each as if it came alone.
    Holds no ``PriorityBatch``."""

    messages: tuple[Any, ...]


@wire
@dataclass(frozen=True, slots=True)
class PullState:
    """DRRS, priority, new owner → old owner: send ``key_group`` of the subscale now. Meces:
    also a fetch on demand, which may come before the subscale's first barrier and then
    starts the migration at the old owner."""

    subscale: int
    key_group: int


@wire
@dataclass(frozen=True, slots=True)
class MigrateState:
    """Live rescale, priority, old owner → new owner: one key group's state (and timers);
    ``watermark`` is the old owner's watermark when the subscale's first barrier reached it
    (records of the group behind that barrier are at the new owner, after it)."""

    subscale: int
    key_group: int
    state: bytes
    watermark: int
    kind: str = "full"  # "delta": ``state`` applies to the replica the new owner holds


@wire
@dataclass(frozen=True, slots=True)
class TriggerCheckpoint:
    """JobMaster → source task (and a task whose input has ended): take part in checkpoint
    ``checkpoint_id`` now. A source snapshots its offsets, sends ``CheckpointBarrier`` on
    every output and, with ``stop``, reads nothing more; another task waits for the barrier
    on each live input (the trigger blocks none) and snapshots at once when none is left.
    ``savepoint``: as ``CheckpointBarrier``'s."""

    checkpoint_id: int
    location: str
    stop: bool = False
    savepoint: bool = False


@wire
@dataclass(frozen=True, slots=True)
class CheckpointComplete:
    """JobMaster → every task: checkpoint ``checkpoint_id`` is complete; sinks commit the
    transactions pre-committed for it and for earlier checkpoints (Flink's
    ``notifyCheckpointComplete``)."""

    checkpoint_id: int


@wire
@dataclass(frozen=True, slots=True)
class CheckpointAborted:
    """JobMaster → every task: checkpoint ``checkpoint_id`` failed; a task still aligning it
    reads its inputs again. Its sink transactions stay pending: the next complete
    checkpoint commits them. ``forget_uploads``: the task's record of the files complete
    checkpoints hold may be wrong (the JobMaster refused a part naming one, or took the job
    over), so its next checkpoint uploads every file again (``engine.state.sst_checkpoints``);
    False when the failure left the retained checkpoints as they were (a timeout, a
    decline, a store error)."""

    checkpoint_id: int
    forget_uploads: bool = True


@wire
@dataclass(frozen=True, slots=True)
class RestoreState:
    """JobMaster → task before ``Start``: install key groups from a checkpoint, each
    ``(key_group, file URI, offset, length, crc32)`` (the task reads and checks them), and
    commit the restored sink ``transactions``, ``(writer, (transaction, ...))`` (a commit is
    idempotent: those already visible stay as they are)."""

    groups: tuple[tuple[int, str, int, int, int], ...] = ()
    transactions: tuple[tuple[str, tuple[Any, ...]], ...] = ()


@wire
@dataclass(frozen=True, slots=True)
class AdoptTransactions:
    """To a task that stays, from a task of its operator removed by a scale-in: the
    removed task's sink output not yet committed, pre-committed ``(writer, transaction)``;
    this task carries them into its next checkpoint, which commits them."""

    transactions: tuple[tuple[str, Any], ...]


@wire
@dataclass(frozen=True, slots=True)
class CommitTransactions:
    """Commit these pre-committed sink transactions, ``(writer, (transaction, ...))``."""

    transactions: tuple[tuple[str, tuple[Any, ...]], ...]


# ---------------------------------------------------------------- task → JobMaster


@wire
@dataclass(frozen=True, slots=True)
class CheckpointAck:
    """``task`` wrote its part of checkpoint ``checkpoint_id``: key groups in ``file``
    (relative to the checkpoint's location; '' when it holds none) as ``(key_group, offset,
    length, crc32)``, its source's resume states ``{partition: state}`` (None for other
    tasks), its sinks' pre-committed ``transactions`` ``(writer, transaction)``, the ``bytes`` written, and how
    long it aligned, snapshotted (synchronously, processing stopped) and wrote (while it
    went on processing). Incremental checkpoints (``JobConfig.incremental_checkpoints``):
    the groups in ``deltas`` hold a delta blob on the group's chain in the job's previous
    complete checkpoint, those in ``unchanged`` nothing new (that chain as it is);
    ``base_checkpoint``: the newest checkpoint the task knows complete, whose chains its
    deltas hold every change since (-1: none). The coordinator refuses deltas on a base
    newer than the job's last complete checkpoint (they would miss the changes between).
    ``db_files``: an SST-level incremental checkpoint's files of the task's DB, ``(file,
    size)`` relative to the checkpoint's location (``engine.state.sst_checkpoints``);
    ``file`` is then the DB's index and each group in ``groups`` is located at it."""

    task: str
    checkpoint_id: int
    file: str
    groups: tuple[tuple[int, int, int, int], ...]
    source_state: Any
    transactions: tuple[tuple[str, Any], ...]
    bytes: int
    alignment_s: float
    sync_s: float
    async_s: float
    deltas: tuple[int, ...] = ()
    unchanged: tuple[int, ...] = ()
    base_checkpoint: int = -1
    db_files: tuple[tuple[str, int], ...] = ()


@wire
@dataclass(frozen=True, slots=True)
class SourceReleased:
    """Reply to ``ReleaseSource``: ``offsets``, ``{partition: resume state}`` of every
    partition the task read (``TaskCore.source_offsets``), after the last record it
    emitted; ``transactions``: as ``HandOver``'s, what its chained sinks wrote and no
    checkpoint committed yet, for a task that stays to adopt."""

    task: str
    offsets: dict[str, Any]
    transactions: tuple[tuple[str, Any], ...] = ()


@wire
@dataclass(frozen=True, slots=True)
class HandOver:
    """Reply to ``StopTask(end_outputs=True)`` with checkpoints on: what the task's sinks
    wrote and no checkpoint committed yet, pre-committed ``(writer, transaction)``, for a
    task that stays to adopt (``AdoptTransactions``)."""

    task: str
    transactions: tuple[tuple[str, Any], ...]


@wire
@dataclass(frozen=True, slots=True)
class InjectLogicBarrier:
    """Change of logic: send ``LogicBarrier(version)`` on these output channels now (behind
    every record already sent or buffered on them)."""

    version: int
    channel_ids: tuple[int, ...]


@wire
@dataclass(frozen=True, slots=True)
class SwitchLogic:
    """Change of logic at a task without inputs (a source's chain): switch to the staged
    function ``version`` now, between two reads."""

    version: int


@wire
@dataclass(frozen=True, slots=True)
class DiscardLogic:
    """A change of logic was refused: forget the function staged as ``version``."""

    version: int


@wire
@dataclass(frozen=True, slots=True)
class LogicChanged:
    """``task`` switched ``operator`` to function ``version`` after aligning its inputs for
    ``alignment_s`` seconds."""

    task: str
    operator: str
    version: int
    alignment_s: float


@wire
@dataclass(frozen=True, slots=True)
class CheckpointDeclined:
    """``task`` could not take part in checkpoint ``checkpoint_id`` (e.g. its part could not
    be written); the checkpoint fails."""

    task: str
    checkpoint_id: int
    reason: str


@wire
@dataclass(frozen=True, slots=True)
class TaskFinished:
    """``task`` saw EndOfStream on every input (or its source ended) and flushed everything."""

    task: str


@wire
@dataclass(frozen=True, slots=True)
class TaskFailed:
    """``task`` failed; ``record`` is the repr of the offending record, or '' when none.
    ``permanent``: the job's own definition makes it fail again whatever a restart does
    (e.g. keyed state no codec can encode): the job fails without restarting.
    ``downstream``: it failed because a task it sends to could not be reached (it died,
    most likely: the JobMaster then names the task that died, not this one)."""

    task: str
    operator: str
    task_index: int
    record: str
    cause: str
    permanent: bool = False
    downstream: bool = False


@wire
@dataclass(frozen=True, slots=True)
class SubscaleDone:
    """DRRS: ``task`` finished its ``role`` (old or new owner) in ``subscale``.

    Old owner: ``rerouted`` records, ``bytes`` of state sent, ``trigger_at`` when the first
    barrier arrived (wall clock). New owner: ``bytes`` installed, ``suspended_s`` with
    records waiting and nothing processable."""

    task: str
    subscale: int
    role: str
    bytes: int
    rerouted: int
    trigger_at: float
    suspended_s: float


@wire
@dataclass(frozen=True, slots=True)
class Ack:
    """A command was carried out."""


# ---------------------------------------------------------------- JobMaster → driver


@wire
@dataclass(frozen=True, slots=True)
class CheckpointStats:
    """A job's checkpoints so far (``JobStatus.checkpoints``): how many completed and
    failed, the latest complete one (id, path, duration from trigger to complete, bytes),
    each task's alignment time in it (``(task, seconds)``), the last failure's reason and
    the checkpoint or savepoint the job was restored from ('' when none)."""

    completed: int = 0
    failed: int = 0
    last_id: int = -1
    last_path: str = ""
    last_duration_s: float = 0.0
    last_bytes: int = 0
    alignment: tuple[tuple[str, float], ...] = ()
    last_failure: str = ""
    restored_from: str = ""


@wire
@dataclass(frozen=True, slots=True)
class SinkGuarantee:
    """One sink of a job and what a restart does to it (``engine.dataflow.guarantees``):
    ``operator`` the operator it belongs to, ``role`` "sink", "dead_letter" or
    "late_sink", ``sink`` its class name, ``guarantee`` "exactly-once", "at-least-once" or
    "none", ``reason`` why."""

    operator: str
    role: str
    sink: str
    guarantee: str
    reason: str


@wire
@dataclass(frozen=True, slots=True)
class JobStatus:
    """``state`` is one of created, running, finished, failed, stopped. On failure,
    ``error`` says what failed; ``operator``/``task_index``/``record`` are set when a user
    function raised on a record. ``standby``: warm standby task actors ready now (not known
    dead). ``unresponsive``: ``(task, seconds)`` for each task that did not answer the
    JobMaster's latest metrics poll, with the seconds since it last answered (a task stuck
    in user code, e.g. processing the same batch for that long); sorted by task.
    ``restarts``: how often a restart of the job began after a failure (each attempt, as
    Flink's ``numRestarts``: one that is still running or failed and was tried again
    counts), the last of which ``last_failure`` names; ``restarts_completed``: how many of
    them got the job running again; ``checkpoints``: ``CheckpointStats``; ``sinks``:
    each sink's delivery guarantee (``SinkGuarantee``); ``detached``: the job outlives its
    driver and Ray restarts its JobMaster; ``master_epoch``: how many JobMasters have owned
    the job (1 for the first; each failover adds one; 0 for an undetached job). New fields
    go at the end: the wire form is positional."""

    job: str
    state: str
    error: str = ""
    operator: str = ""
    task_index: int = -1
    record: str = ""
    cause: str = ""
    metrics_url: str = ""
    standby: int = 0
    unresponsive: tuple[tuple[str, float], ...] = ()
    restarts: int = 0
    last_failure: str = ""
    checkpoints: CheckpointStats = CheckpointStats()
    sinks: tuple[SinkGuarantee, ...] = ()
    detached: bool = False
    master_epoch: int = 0
    restarts_completed: int = 0

    def __post_init__(self) -> None:
        for entry in self.unresponsive:
            if (not isinstance(entry, tuple) or len(entry) != 2 or not isinstance(entry[0], str)
                    or not isinstance(entry[1], (int, float)) or entry[1] < 0):
                raise CodecError(f"JobStatus.unresponsive holds (task, seconds >= 0) pairs; "
                                 f"got {entry!r:.200}")
