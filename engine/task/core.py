"""The task core: input queues, scheduling, operator calls and control handling (pure).

Why a core apart from its actor: ``TaskCore`` is stepped by its actor shell
(``engine.runtime``) and, in tests, by hand. ``receive`` frames, ``step``/``poll_source``/
``fire_timers`` to do work, ``handle`` control messages. No Ray, no threads, no sleeping.

Why migration is not in here: the per-task actions of the live rescaling protocols (old and
new owner, alignment, set-aside, re-route, replicas) are a *participant*
(``migration.participant``) the core calls through ``MigrationHooks``; it acts on the core
only through the core's host methods (``TaskHost`` there). The core never imports
``migration``: the layering is engine core -> ``engine.task.core`` -> ``migration`` -> runtime.
A core with no participant attached (``NoMigration``) supports stop-restart only;
``migration.participant.new_task_core`` builds a core with its participant.

Format of what a core produces, waiting to be taken by its shell: ``router.outbox``
(encoded frames), ``reports`` (messages for the JobMaster), ``priority_out`` ((target task,
message) for the priority path), ``consumed`` ((channel, seq) of frames taken, to
acknowledge) and ``snapshots`` (its parts of checkpoints, ``TaskSnapshot``, for the shell
to write: ``engine.checkpoints.snapshot.persist``).

Checkpoints (Flink's aligned barriers, ``engine.task.alignment``): a source snapshots at
``TriggerCheckpoint`` and sends the barrier; another task snapshots once every live input
delivered it (or ended): its key groups with their timers, its sinks' ``pre_commit``
transactions (kept until ``CheckpointComplete`` commits them), then forwards the barrier.
With checkpoints on, a task at the end of its input keeps its writers open: what they wrote
since the last checkpoint is committed by the job's final checkpoint, not at close.

Guarantees: each channel's frames are processed in sequence order; a frame the participant
could not finish (``PartialFrame``: records that must wait, or an event behind them) is
continued before anything else of its channel. While no migration runs, a frame without
per-record ports costs one check (``migration.active``) on top of its processing.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.checkpoints.snapshot import TaskSnapshot
from engine.columnar.batches import ColumnBatch, as_rows
from engine.dataflow import graph as g
from engine.dataflow.config import JobConfig
from engine.dataflow.deployment import Deployment
from engine.dataflow.physical import FORWARD
from engine.errors import CodecError, OutputCodecError, ReflowError, UserFunctionError
from engine.io.sources import PartitionedReader
from engine.names import NameEnum
from engine.observability.groupstats import GroupLoad
from engine.observability.latency import LatencyHistogram
from engine.observability.metrics import TaskMetrics
from engine.operators.builtin import (
    UnknownKeyGroupError,
    describe,
)
from engine.operators.chain import OperatorChain
from engine.state.keyed import EVENT_TIME, PROCESSING_TIME, KeyedStateBackend
from engine.task.alignment import Aligned, BarrierAligner
from engine.task.channel import REROUTE_PORT, InputChannel, KeyFunctionError, OutputRouter
from engine.task.group_order import GroupOrder
from engine.time.clock import Clock, now_ms
from engine.time.event_time import MAX_WATERMARK, MIN_WATERMARK, WatermarkTracker
from engine.wire.codec import pack_exact
from engine.wire.messages import (
    Ack,
    AddInputs,
    AddOutputChannels,
    AdoptTransactions,
    ChannelIdle,
    CheckpointAborted,
    CheckpointBarrier,
    CheckpointComplete,
    CommitTransactions,
    Connect,
    DescribeTask,
    DiscardLogic,
    EndOfStream,
    GroupArrived,
    GroupLeft,
    GroupStats,
    GroupStatsRequest,
    HandOver,
    HoldFinish,
    InjectLogicBarrier,
    InstallKeyGroups,
    LatencyMarker,
    LogicBarrier,
    LogicChanged,
    PriorityBatch,
    ReleaseSource,
    RemoveOutputChannels,
    ReplaceOutputChannel,
    Resume,
    SourceReleased,
    Start,
    StopTask,
    SwitchLogic,
    TaskFailed,
    TaskFinished,
    TaskState,
    TriggerCheckpoint,
    Watermark,
    WatermarkHold,
    WatermarkRelease,
    decode_frame,
)


class TaskStatus(NameEnum):
    """Where a task is in its life (``TaskState.status``, ``TaskMetrics.status``)."""

    CREATED = "created"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"


CREATED, RUNNING, FINISHED, FAILED, STOPPED = (
    TaskStatus.CREATED, TaskStatus.RUNNING, TaskStatus.FINISHED, TaskStatus.FAILED,
    TaskStatus.STOPPED)

# (value, timestamp, key, key group, input port); key None and key group -1 when not keyed
Record = tuple[Any, int, Any, int, int]


class TaskControlError(ReflowError, ValueError):
    """A task was given a spec, message, frame or channel event it cannot take (unknown, or
    not for a task of its kind). An engine bug or a mis-wired job: the message names the
    task."""


@dataclass(frozen=True)
class TaskSpec:
    """Everything one task needs; shipped to its actor at creation (it holds user code).

    ``key_fns``: key function per keyed output edge id. ``key_groups``: key groups this task
    owns from the start (keyed vertices only).
    """

    job_id: str
    vertex: str
    task_name: str
    task_index: int
    parallelism: int
    operators: tuple[g.OperatorDef, ...]
    num_key_groups: int
    config: JobConfig
    key_fns: dict[int, Callable[[Any], Any]] = field(default_factory=dict)
    key_groups: tuple[int, ...] = ()
    #: every input edge is a forward edge (the task reads one upstream task, its partner)
    forward_input: bool = False

    def __post_init__(self) -> None:
        where = f"task spec {self.task_name!r}"
        if not self.operators:
            raise TaskControlError(f"{where} has no operators; a task runs at least one")
        if not 0 <= self.task_index < self.parallelism:
            raise TaskControlError(f"{where}: task index {self.task_index} is outside "
                                   f"0..{self.parallelism - 1} (its vertex's parallelism)")
        if any(not 0 <= kg < self.num_key_groups for kg in self.key_groups):
            raise TaskControlError(f"{where}: its key groups {self.key_groups} must lie in "
                                   f"0..{self.num_key_groups - 1}")

    @classmethod
    def of(cls, dep: Deployment, vertex: str, index: int, name: str,
           config: JobConfig) -> TaskSpec:
        """The spec of task ``name`` (index ``index``) of ``vertex`` in deployment ``dep``:
        its operators, the key functions of its keyed outputs, the key groups it owns."""
        v = dep.plan.vertex(vertex)
        key_fns = {e.edge_id: e.key_fn for e in dep.plan.outputs_of(v.name)
                   if e.key_fn is not None}
        inputs = dep.plan.inputs_of(v.name)
        forward = bool(inputs) and all(e.partitioning == FORWARD for e in inputs)
        return cls(dep.job_id, v.name, name, index, v.parallelism, v.operators,
                   dep.plan.num_key_groups, config, key_fns, dep.key_groups_of(v.name, index),
                   forward)


def estimated_group_bytes(b: KeyedStateBackend, key_group: int) -> int:
    """Cheap estimate of a key group's encoded size (a sample of each table stands for
    the rest), for planning; a migration ships and counts the exact bytes."""
    total = 0
    for t in b.groups.get(key_group, {}).values():
        if t:
            sample = list(itertools.islice(t.items(), 32))
            total += len(pack_exact(sample)) * len(t) // len(sample)
    return total


def unencodable_state(backend: KeyedStateBackend, operator: str, exc: CodecError) -> str:
    """What a checkpoint of ``operator``'s keyed state could not encode, and what to do."""
    from engine.wire.codec import pack_exact

    for kg in backend.owned():
        for name, table in backend.groups.get(kg, {}).items():
            for key, value in table.items():
                try:
                    pack_exact([key, value])
                except CodecError as err:
                    return (f"keyed state {name!r} of operator {operator!r} holds a value "
                            f"that cannot be encoded for a checkpoint (key {key!r:.60}, "
                            f"{type(value).__name__}: {err}); keep msgpack types (int, "
                            "float, str, bytes, bool, None, list, tuple, dict) in state, or "
                            "declare a codec for the type (engine.wire.codec.register_codec / "
                            "register_dataclass)")
    return (f"keyed state of operator {operator!r} cannot be encoded for a checkpoint: {exc}; "
            "declare a codec for its types (engine.wire.codec.register_codec)")


class PartialFrame:
    """A frame taken from a channel but not fully processed (records waiting for their
    group's state, or an event waiting behind set-aside records); ``pos``: the next record."""

    __slots__ = ("values", "timestamps", "keys", "kgs", "ports", "event", "pos")

    def __init__(self, frame: Any) -> None:
        if type(frame.values) is ColumnBatch:  # a migration handles records one by one
            self.values, self.timestamps = as_rows(frame.values, frame.timestamps)
            self.keys = None if frame.keys is None else frame.keys.to_pylist()
            self.kgs = None if frame.key_groups is None else frame.key_groups.tolist()
        else:
            self.values = frame.values
            self.timestamps = frame.timestamps
            self.keys = frame.keys
            self.kgs = frame.key_groups
        self.ports = frame.ports
        self.event = frame.event
        self.pos = 0


class MigrationHooks(Protocol):
    """What the core asks of its migration participant, and all it asks. ``step_frame`` is
    called only while ``active`` or for a frame with per-record ports, ``can_progress`` only
    for a frame ``step_frame`` left waiting, ``handle``/``on_event`` only for messages and
    events the core does not know itself."""

    @property
    def active(self) -> bool:
        """A migration runs through the task: frames take ``step_frame``; it may not finish."""

    def handle(self, msg: Any) -> Any:
        """Carry out a control message, return the reply (``TaskControlError`` if unknown)."""

    def on_event(self, ch: InputChannel, event: Any) -> None:
        """A channel event the core does not know (migration barriers)."""

    def step_frame(self, ch: InputChannel, frame: PartialFrame) -> bool:
        """Process what may be processed of the frame now (advancing ``frame.pos``); True
        when its event may follow at once, False when it must wait (the core parks it)."""

    def can_progress(self, channel_id: int, frame: PartialFrame) -> bool:
        """Whether a parked frame of ``channel_id`` can go on now."""

    def user_watermark(self, watermark: int) -> int:
        """The watermark user code sees for the current key group, given the task's."""

    def describe(self) -> list[str]:
        """Where this task's migrations stand, for a stuck rescale's error."""


class NoMigration:
    """The hooks of a core with no participant: no migration ever runs through it, so it
    takes stop-restart only and refuses every migration message."""

    active = False

    def __init__(self, task_name: str) -> None:
        self.task_name = task_name

    def _refuse(self, what: str) -> TaskControlError:
        return TaskControlError(
            f"task {self.task_name}: {what}; this task has no migration participant and "
            "supports stop-restart only (build it with migration.participant.new_task_core)")

    def handle(self, msg: Any) -> Any:
        raise self._refuse(f"unknown control message {msg!r}")

    def on_event(self, ch: InputChannel, event: Any) -> None:
        raise self._refuse(f"unsupported channel event {event!r} on channel {ch.channel_id}")

    def step_frame(self, ch: InputChannel, frame: PartialFrame) -> bool:
        raise self._refuse(f"a re-routed frame (per-record ports) on channel {ch.channel_id}")

    def can_progress(self, channel_id: int, frame: PartialFrame) -> bool:
        return True

    def user_watermark(self, watermark: int) -> int:
        return watermark

    def describe(self) -> list[str]:
        return []


class TaskCore:
    """One task's processing. Its host methods (section "host", ``migration.participant.
    TaskHost``) are what a migration participant may use of it."""

    def __init__(self, spec: TaskSpec, clock: Clock) -> None:
        self.spec = spec
        self.clock = clock
        self.name = spec.task_name
        cfg = spec.config
        self.router = OutputRouter(
            cfg.batch_size, cfg.linger_ms / 1000.0, spec.num_key_groups, spec.key_fns, clock.monotonic
        )
        self.inputs: dict[int, InputChannel] = {}
        # a frame further ahead than a sender's credits allow is refused (InputChannel)
        self._max_ahead = max(64, 4 * cfg.credits)
        self._order: list[int] = []
        self._rr = 0
        self.consumed: list[tuple[int, int]] = []
        self.reports: list[Any] = []
        self.priority_out: list[tuple[str, Any]] = []  # (target task, message), priority path
        self.status = CREATED
        self.failure: TaskFailed | None = None
        self.migration: MigrationHooks = NoMigration(spec.task_name)

        head = spec.operators[0]
        self.is_source = head.kind == g.SOURCE
        self.chain = OperatorChain(spec.operators, spec.task_index, spec.parallelism,
                                   spec.num_key_groups, spec.key_groups, clock,
                                   self._current_watermark)
        self.backend, self.keyed = self.chain.backend, self.chain.keyed
        self.reader: PartitionedReader | None = None
        self.paused = False
        self.quiet = False  # after a stop-with-savepoint's barrier: no timers until Resume

        # alignment of checkpoint barriers (engine.task.alignment), watermarks
        self.checkpoints = BarrierAligner(clock.monotonic)
        self._barriers: dict[int, CheckpointBarrier] = {}  # pending: location, stop
        self.snapshots: list[TaskSnapshot] = []
        self._pending_txns: dict[int, tuple[tuple[str, Any], ...]] = {}
        self._pending_sources: dict[int, dict[str, Any]] = {}  # until CheckpointComplete
        self._adopted: list[tuple[str, Any]] = []  # a removed peer's, for the next checkpoint
        self._two_phase = cfg.checkpointing
        self._writers_open = True
        if self._two_phase:  # exactly-once sinks keep output invisible until a commit
            self.chain.begin_transactions()
        # change of logic: barriers aligned like checkpoints; functions staged by version
        self.logic = BarrierAligner(clock.monotonic)
        self._staged: dict[int, tuple[str, Any]] = {}
        self.tracker = WatermarkTracker()
        self.watermark = MIN_WATERMARK
        # sources: event-time watermark generation
        self.wm_strategy = head.watermarks if self.is_source else None
        self._max_ts = MIN_WATERMARK
        self._last_emit = clock.monotonic()
        self._idle = False

        self._heads: dict[int, PartialFrame] = {}
        # channels not read until every token blocking them is lifted (migration alignment)
        self._step_blocked: dict[int, set[Hashable]] = {}
        self.group_order = GroupOrder()  # per-key order across migrations upstream
        # source rescale: token -> old channels that must end before its new ones are read
        self._handovers: dict[int, set[int]] = {}
        self._suspended_since: float | None = None
        self.suspended_s = 0.0  # parked frames or blocked channels, and nothing processable
        self._end_pending = False  # input ended; finishing waits for a rescale
        self.hold_finish = False
        self._live = cfg.live_rescaling
        self.group_load = GroupLoad(cfg.group_load_sample_every)  # per key group (planning)
        self._stats_since = clock.monotonic()

        # metrics
        self.records_in = 0
        self.bytes_in = 0
        self.useful_s = 0.0  # operator work: decode, process, encode (the actor times it)
        self.idle_s = 0.0
        self.backpressured_s = 0.0
        self.latency = LatencyHistogram()

    def attach(self, migration: MigrationHooks) -> None:
        """Attach the migration participant: once, before the task starts."""
        if not isinstance(self.migration, NoMigration) or self.status != CREATED:
            raise TaskControlError(f"task {self.name}: a migration participant is attached "
                                   "once, before Start; build a new core instead")
        self.migration = migration

    # ------------------------------------------------------------ data in
    def receive(self, channel_id: int, seq: int, payload: bytes) -> None:
        ch = self.inputs.get(channel_id)
        if ch is None:
            raise TaskControlError(f"task {self.name} has no input channel {channel_id}; the "
                                   "sender's outputs and this task's inputs disagree")
        ch.offer(seq, payload)
        self.bytes_in += len(payload)

    def queued_frames(self) -> int:
        return sum(len(c.queue) for c in self.inputs.values()) + len(self._heads)

    def has_work(self) -> bool:
        if self.status != RUNNING:
            return False
        return self._next_channel(peek=True) is not None

    def _head_can_progress(self, cid: int, head: PartialFrame) -> bool:
        return self.migration.can_progress(cid, head)

    def _next_channel(self, peek: bool = False) -> InputChannel | None:
        order = self._order
        n = len(order)
        for i in range(n):
            cid = order[(self._rr + i) % n]
            if (cid in self._step_blocked or self.checkpoints.is_blocked(cid)
                    or self.logic.is_blocked(cid)):
                continue
            ch = self.inputs[cid]
            head = self._heads.get(cid)
            if (head is not None and self._head_can_progress(cid, head)) or (
                head is None and ch.queue
            ):
                if not peek:
                    self._rr = (self._rr + i + 1) % n
                return ch
        return None

    def step(self) -> bool:
        """Process one frame (or what can be processed of it) from the next channel that can
        go on; False when nothing is processable."""
        if self.status != RUNNING:
            return False
        ch = self._next_channel()
        if ch is None:
            if self._suspended_since is None and (self._heads or self._step_blocked):
                self._suspended_since = self.clock.monotonic()
            return False
        if self._suspended_since is not None:
            self.suspended_s += self.clock.monotonic() - self._suspended_since
            self._suspended_since = None
        cid = ch.channel_id
        head = self._heads.pop(cid, None)
        if head is None:
            seq, payload = ch.queue.popleft()
            self.consumed.append((cid, seq))
            frame = decode_frame(payload)
            self.records_in += len(frame.values)
            if frame.ports is None and not self.migration.active:
                values = frame.values
                if type(values) is ColumnBatch:
                    if len(values):
                        self.guarded(self._run, values, frame.timestamps, frame.keys,
                                     frame.key_groups, ch.port)
                elif values:
                    self.guarded(self._run, list(values), list(frame.timestamps),
                                 frame.keys, frame.key_groups, ch.port)
                if frame.event is not None and self.status == RUNNING:
                    self.guarded(self._on_event, ch, frame.event)
                return True
            head = PartialFrame(frame)
        self.guarded(self._step_partial, ch, head)
        return True

    def _step_partial(self, ch: InputChannel, head: PartialFrame) -> None:
        if not self.migration.step_frame(ch, head):
            self._heads[ch.channel_id] = head
        elif head.event is not None and self.status == RUNNING:
            self._on_event(ch, head.event)

    def guarded(self, fn: Callable[..., None], *args: Any) -> None:
        """Call ``fn``; a user function's or key function's error fails the task."""
        try:
            fn(*args)
        except UserFunctionError as exc:
            self._fail(exc.operator, exc.record, exc.cause)
        except KeyFunctionError as exc:
            op = self._keyed_consumer_name()
            self._fail(op, describe(exc.record), f"key_by function raised {exc}")
        except UnknownKeyGroupError as exc:
            self._fail(self.spec.vertex, "", str(exc))
        except OutputCodecError as exc:
            self.fail_output(exc)

    def flush_due(self) -> None:
        """Send the output buffers that waited ``linger_ms`` (an output that cannot be
        encoded fails the task, as in an operator call)."""
        if self.status != FAILED:
            self.guarded(self.router.flush_due)

    def fail_output(self, exc: OutputCodecError) -> None:
        """An output record has no codec: fail naming the operator that produced it (the
        chain's last) and the record; a failed task reports once."""
        if self.status == FAILED:
            return
        self._fail(self.spec.operators[-1].name, describe(exc.record) if exc.record is not None
                   else "", str(exc))

    def _keyed_consumer_name(self) -> str:
        return f"key_by after {self.spec.operators[-1].name}"

    def _run(self, values: list[Any], timestamps: list[int], keys: Any = None, kgs: Any = None,
             port: int = 0) -> None:
        if self._live and kgs is not None and self.keyed is not None:
            self.group_load.observe(kgs)
        self.router.emit(*self.chain.process(values, timestamps, keys, kgs, port))

    def _run_rest(self, values: list[Any], timestamps: list[int]) -> None:
        self.router.emit(*self.chain.process_rest(values, timestamps))

    # ------------------------------------------------------------ host (for a participant)
    @property
    def config(self) -> JobConfig:
        return self.spec.config

    def run_records(self, records: list[Record]) -> None:
        """Process records in order, in runs of the same port."""
        i, n = 0, len(records)
        while i < n:
            port = records[i][4]
            j = i
            while j < n and records[j][4] == port:
                j += 1
            run = records[i:j]
            keyed = run[0][3] >= 0
            self._run([r[0] for r in run], [r[1] for r in run],
                      [r[2] for r in run] if keyed else None,
                      [r[3] for r in run] if keyed else None, port)
            i = j

    def add_input(self, channel_id: int, port: int) -> None:
        """Open an input channel (nothing if it is open); no input for watermarks when
        ``port`` is ``REROUTE_PORT``."""
        if channel_id not in self.inputs:
            self.inputs[channel_id] = InputChannel(channel_id, port, self._max_ahead)
            self._order = sorted(self.inputs)
            self._inputs_changed()

    def remove_input_if_idle(self, channel_id: int) -> bool:
        """Close an input channel with nothing queued, pending or parked; False otherwise."""
        ch = self.inputs.get(channel_id)
        if ch is None or ch.queue or ch.pending or channel_id in self._heads:
            return False
        del self.inputs[channel_id]
        self._order = sorted(self.inputs)
        self._rr = 0
        self._inputs_changed()
        return True

    def block_channel(self, channel_id: int, token: Hashable) -> None:
        """Stop reading ``channel_id`` until ``token`` (e.g. a subscale) is lifted."""
        self._step_blocked.setdefault(channel_id, set()).add(token)

    def unblock_channels(self, token: Hashable) -> None:
        """Lift ``token`` from every channel; a channel is read again once none is left."""
        for cid in [c for c, tokens in self._step_blocked.items() if token in tokens]:
            tokens = self._step_blocked[cid]
            tokens.discard(token)
            if not tokens:
                del self._step_blocked[cid]

    def report(self, msg: Any) -> None:
        self.reports.append(msg)

    def send_priority(self, target: str, msg: Any) -> None:
        """Send ``msg`` to task ``target`` on the priority path (in order per target)."""
        self.priority_out.append((target, msg))

    def check_finish(self) -> None:
        """A migration ended: finish if the input ended meanwhile (``_finish_if_ended``)."""
        self._finish_if_ended()

    def hold_timers(self, held: Callable[[int], bool]) -> None:
        """Timers of key groups for which ``held`` is true wait instead of firing."""
        if self.keyed is not None:
            self.keyed.hold = held

    def release_timers(self, key_group: int) -> None:
        """The group's held timers may fire again."""
        if self.keyed is not None:
            self.keyed.release_held(key_group)

    def drop_held_timers(self, key_group: int) -> None:
        """Forget the group's held timers (they left with its state)."""
        if self.keyed is not None:
            self.keyed.held.pop(key_group, None)

    def fire_event_timers(self) -> None:
        """Fire the event-time timers due at the task's watermark and process their output."""
        if self.keyed is not None:
            values, timestamps = self.keyed.fire_timers(self.watermark, EVENT_TIME)
            self._run_rest(values, timestamps)

    # ------------------------------------------------------------ events
    def _live_inputs(self) -> list[int]:
        return [cid for cid, c in self.inputs.items() if not c.ended and c.port != REROUTE_PORT]

    def _on_event(self, ch: InputChannel, event: Any) -> None:
        match event:
            case LatencyMarker():
                if self.chain.has_sink:
                    self.latency.observe(max(0.0, (self.clock.now() - event.created_at) * 1000.0))
                self.router.send_marker(event)
            case Watermark(timestamp=ts):
                self._on_watermark(self.tracker.update(ch.channel_id, ts))
            case ChannelIdle():
                self._on_watermark(self.tracker.mark_idle(ch.channel_id))
            case WatermarkHold(token=token, watermark=wm):
                if self.keyed is None:  # nothing here fires on time: the receivers hold
                    self.router.broadcast(event)
                else:
                    self._on_watermark(self.tracker.hold(token, wm))
            case WatermarkRelease(token=token):
                if self.keyed is None:
                    self.router.broadcast(event)
                else:
                    self._on_watermark(self.tracker.release(token))
            case GroupLeft(subscale=sid, key_group=kg):
                if self.spec.forward_input:  # one path: the receivers keep the order
                    self.router.broadcast(event)
                else:
                    waiting = self.group_order.on_left((sid, kg))
                    if waiting is not None:
                        self.unblock_channels(("order", sid, kg, waiting))
            case GroupArrived(subscale=sid, key_group=kg):
                if self.spec.forward_input:
                    self.router.broadcast(event)
                elif self.group_order.on_arrived((sid, kg), ch.channel_id):
                    self.block_channel(ch.channel_id, ("order", sid, kg, ch.channel_id))
            case CheckpointBarrier(checkpoint_id=cid):
                self._barriers.setdefault(cid, event)
                self._on_checkpoint_aligned(self.checkpoints.on_barrier(ch.channel_id, cid))
            case LogicBarrier(version=version):
                self._on_logic(self.logic.on_barrier(ch.channel_id, version))
            case EndOfStream():
                ch.ended = True
                self._handover_ended(ch.channel_id)
                advanced = self.tracker.end(ch.channel_id)
                # an input that ended counts as aligned: a pending checkpoint may complete
                self._on_checkpoint_aligned(self.checkpoints.on_end(ch.channel_id))
                self._on_logic(self.logic.on_end(ch.channel_id))
                if not self._live_inputs():
                    self._end_pending = True
                    self._finish_if_ended()
                else:
                    self._on_watermark(advanced)
            case _:
                self.migration.on_event(ch, event)

    def _handover_ended(self, channel_id: int) -> None:
        """An old channel of a source rescale ended: the new channels waiting for it (and
        no other) are read from now on."""
        for token in [t for t, old in self._handovers.items() if channel_id in old]:
            old = self._handovers[token]
            old.discard(channel_id)
            if not old:
                del self._handovers[token]
                self.unblock_channels(token)

    def _on_watermark(self, wm: int | None) -> None:
        """The task's watermark advanced to ``wm``: fire event-time timers up to it, then
        forward it (outputs of the timers go ahead of the watermark)."""
        if wm is None or wm <= self.watermark:
            return
        self.watermark = wm
        if self.keyed is not None:
            values, timestamps = self.keyed.fire_timers(wm, EVENT_TIME)
            self._run_rest(values, timestamps)
        self.router.broadcast(Watermark(wm))

    def _current_watermark(self) -> int:
        """The watermark user code sees (capped per group while a migration runs)."""
        return self.migration.user_watermark(self.watermark)

    def _inputs_changed(self) -> None:
        """The live inputs changed (connected, added, removed): the aligners follow."""
        self._on_checkpoint_aligned(self.checkpoints.set_channels(self._live_inputs()))
        self._on_logic(self.logic.set_channels(self._live_inputs()))

    # ------------------------------------------------------------ change of logic
    def stage_logic(self, version: int, operator: str, fn: Any) -> None:
        """Keep ``fn`` to replace ``operator``'s function at logic barrier ``version``; a
        keyed function is opened now, on this task's state. Raises when the operator is not
        in this task or the function cannot be opened (nothing switched yet)."""
        self.chain.prepare(operator, fn)
        self._staged[version] = (operator, fn)

    def _on_logic(self, aligned: Aligned | None) -> None:
        """Every live input delivered logic barrier ``version`` (or the task has none):
        switch to the staged function and report; the barrier goes no further."""
        if aligned is None:
            return
        staged = self._staged.pop(aligned.barrier_id, None)
        if staged is None:
            raise TaskControlError(f"task {self.name}: logic barrier {aligned.barrier_id} "
                                   "aligned, but no function was staged for it")
        operator, fn = staged
        self.chain.switch(operator, fn)
        self.spec = dataclasses.replace(self.spec, operators=tuple(
            dataclasses.replace(op, fn=fn) if op.name == operator else op
            for op in self.spec.operators))
        self.reports.append(LogicChanged(self.name, operator, aligned.barrier_id,
                                         aligned.alignment_s))

    # ------------------------------------------------------------ checkpoints
    def _on_checkpoint_aligned(self, aligned: Aligned | None) -> None:
        """Every live input delivered the barrier (or ended): take the snapshot."""
        if aligned is None:
            return
        for gone in aligned.aborted:
            self._barriers.pop(gone, None)
        barrier = self._barriers.pop(aligned.barrier_id)
        self._snapshot(barrier, aligned.alignment_s)

    def _snapshot(self, barrier: CheckpointBarrier, alignment_s: float) -> None:
        """This task's part of the checkpoint, at the cut: key groups and timers, the
        source's position, the sinks' transactions; then the barrier goes downstream (a
        finished task's outputs have ended: nothing follows there)."""
        cid, started = barrier.checkpoint_id, self.clock.monotonic()
        spec = self.spec

        def declined(reason: str) -> TaskSnapshot:
            return TaskSnapshot(self.name, spec.vertex, spec.task_index, cid,
                                barrier.location, declined=reason)

        if self.migration.active:  # the JobMaster never lets the two overlap: a bug
            self.snapshots.append(declined("key groups are moving through this task (a "
                                           "rescale's subscale is running)"))
            return
        b = self.backend
        try:
            groups = () if b is None else tuple((kg, b.snapshot(kg)) for kg in b.owned())
        except CodecError as exc:  # the user's state: a restart would fail the same way
            assert b is not None
            self._fail(spec.operators[0].name, "", unencodable_state(b, spec.operators[0].name,
                                                                       exc), permanent=True)
            return
        source = self.source_offsets() if self.reader is not None else None
        try:
            if self._two_phase and self._writers_open:
                txns = (*self._adopted, *self.chain.pre_commit(cid))
                self._adopted = []
            else:  # no checkpoints (a savepoint of such a job): written means visible
                self.chain.flush()
                txns = ()
        except Exception as exc:  # a sink's pre_commit raised: the checkpoint fails
            self.snapshots.append(declined(f"a sink's pre_commit raised "
                                           f"{type(exc).__name__}: {exc}"))
            return
        if txns:
            self._pending_txns[cid] = txns
        if source and self._two_phase:
            self._pending_sources[cid] = source
        if self.status == RUNNING:
            self.router.broadcast(CheckpointBarrier(cid, barrier.location, barrier.stop))
        if barrier.stop:  # stop-with-savepoint: nothing more after the barrier
            self.paused = self.quiet = True
        self.snapshots.append(TaskSnapshot(
            self.name, spec.vertex, spec.task_index, cid, barrier.location, groups, source,
            txns, alignment_s, self.clock.monotonic() - started))

    def _trigger_checkpoint(self, msg: TriggerCheckpoint) -> None:
        barrier = CheckpointBarrier(msg.checkpoint_id, msg.location, msg.stop)
        if self.status not in (RUNNING, FINISHED):
            if self.status == CREATED:
                self.snapshots.append(TaskSnapshot(
                    self.name, self.spec.vertex, self.spec.task_index, msg.checkpoint_id,
                    msg.location, declined="the task has not started"))
            return
        if self.is_source:
            if self.checkpoints.trigger(msg.checkpoint_id) is not None:
                self._snapshot(barrier, 0.0)
            return
        self._barriers.setdefault(msg.checkpoint_id, barrier)
        self._on_checkpoint_aligned(self.checkpoints.trigger(msg.checkpoint_id))

    def _commit(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is complete: commit its transactions and those of
        earlier ones (a failed checkpoint's transactions wait for the next complete one);
        the source's readers learn the newest positions it holds."""
        done = sorted(c for c in self._pending_sources if c <= checkpoint_id)
        if done and self.reader is not None:
            self.reader.committed(self._pending_sources[done[-1]])
        for c in done:
            del self._pending_sources[c]
        due = sorted(c for c in self._pending_txns if c <= checkpoint_id)
        if not due:
            return
        by_writer: dict[str, list[Any]] = {}
        for c in due:
            for writer, txn in self._pending_txns.pop(c):
                by_writer.setdefault(writer, []).append(txn)
        self._commit_transactions(by_writer.items())

    def _hand_over(self) -> tuple[tuple[str, Any], ...]:
        """A scale-in removes this task: its sinks' output that no checkpoint committed yet
        (pending, adopted, and written since the last barrier, pre-committed now) goes to a
        task that stays, whose next checkpoint commits it."""
        if not (self._two_phase and self._writers_open):
            return ()
        out = [t for c in sorted(self._pending_txns) for t in self._pending_txns[c]]
        self._pending_txns.clear()
        out += self._adopted
        self._adopted = []
        out += self.chain.pre_commit(self.checkpoints.last_seen or 0)
        return tuple(out)

    def _commit_transactions(self, items: Any) -> None:
        for writer, txns in items:
            try:
                self.chain.commit(writer, list(txns))
            except Exception as exc:  # the output would never become visible: fail
                self._fail(writer, "", f"commit of a checkpoint's output raised "
                           f"{type(exc).__name__}: {exc}")
                return

    def _finish_if_ended(self) -> None:
        """Finish once the input has ended, unless a rescale holds the task or key groups
        are still on their way in or out (their barriers must still be processed)."""
        if (self._end_pending and self.status == RUNNING and not self.hold_finish
                and not self.migration.active and not self._live_inputs()):
            self._end_pending = False
            self._finish()

    def _finish(self) -> None:
        if self.keyed is not None:
            # end of input: pending processing-time timers fire too, so no window is lost
            values, timestamps = self.keyed.fire_timers(MAX_WATERMARK, PROCESSING_TIME)
            self._run_rest(values, timestamps)
        self.router.flush_all()
        self.router.broadcast(EndOfStream())
        if not self._two_phase:  # else the final checkpoint commits, then StopTask closes
            self._close_writers()
        self.status = FINISHED
        self.reports.append(TaskFinished(self.name))

    def _close_writers(self) -> None:
        if self._writers_open:
            self._writers_open = False
            self.chain.close()

    def _fail(self, operator: str, record: str, cause: str, permanent: bool = False) -> None:
        self.status = FAILED
        self.failure = TaskFailed(self.name, operator, self.spec.task_index, record, cause,
                                  permanent)
        self.reports.append(self.failure)

    def _describe(self) -> str:
        """Where this task's migrations and inputs stand (a stuck rescale's error)."""
        parts = self.migration.describe() + self.group_order.describe()
        chans = [f"{cid}:{len(c.queue)}q{'/ended' if c.ended else ''}"
                 f"{'/blocked' if cid in self._step_blocked or self.checkpoints.is_blocked(cid) else ''}"
                 f"{'/head' if cid in self._heads else ''}" for cid, c in self.inputs.items()]
        parts.append("inputs " + " ".join(chans))
        return "; ".join(parts)

    # ------------------------------------------------------------ sources and timers
    def poll_source(self, max_records: int) -> bool:
        """Read one batch from the source; False when nothing was due (or paused/ended)."""
        if self.status != RUNNING or self.paused or self.reader is None:
            return False
        batch = self.reader.poll(max_records)
        if batch is None:
            self.reader.close()
            # end of input: every event-time window downstream may fire (as Flink does)
            self.watermark = MAX_WATERMARK
            self.router.broadcast(Watermark(MAX_WATERMARK))
            self._finish()
            return True
        if not len(batch.values):
            return False
        self.records_in += len(batch.values)
        if self.wm_strategy is not None:
            m = self.reader.frontier()  # per partition: a lagging one holds the watermark
            if m > self._max_ts:
                self._max_ts = m
            self._last_emit = self.clock.monotonic()
            self._idle = False
        self.guarded(self._run_rest, batch.values, batch.timestamps)
        return True

    def emit_watermark(self) -> None:
        """Sources: send the watermark of the records read so far (called periodically);
        after ``idle_timeout_ms`` without records, mark the channels idle."""
        st = self.wm_strategy
        if st is None or self.status != RUNNING or self.paused:
            return
        wm = st.watermark_for(self._max_ts)
        if wm > self.watermark:
            self.watermark = wm
            self.router.broadcast(Watermark(wm))
        elif (st.idle_timeout_ms is not None and not self._idle
              and (self.clock.monotonic() - self._last_emit) * 1000 >= st.idle_timeout_ms):
            self._idle = True
            self.router.broadcast(ChannelIdle())

    def source_offsets(self) -> dict[str, Any]:
        """A source task's ``{partition: resume state}`` after the last record it emitted
        (what a checkpoint stores for it); empty for other tasks."""
        return {} if self.reader is None else self.reader.offsets()

    def seconds_until_source_ready(self) -> float:
        if self.reader is None or self.paused:
            return 1.0
        return self.reader.seconds_until_ready()

    def emit_latency_marker(self) -> None:
        if self.status == RUNNING and not self.paused:
            self.router.send_marker(LatencyMarker(self.clock.now(), self.spec.task_index))

    def next_timer_ms(self) -> int | None:
        return None if self.backend is None else self.backend.next_timer()

    def fire_timers(self) -> bool:
        if self.keyed is None or self.status != RUNNING or self.quiet:
            return False
        nxt = self.backend.next_timer()  # type: ignore[union-attr]
        now = now_ms(self.clock)
        if nxt is None or nxt > now:
            return False

        def run() -> None:
            values, timestamps = self.keyed.fire_timers(now)  # type: ignore[union-attr]
            self._run_rest(values, timestamps)

        self.guarded(run)
        return True

    # ------------------------------------------------------------ control
    def handle(self, msg: Any) -> Any:
        """Carry out one control message; returns the reply message. Messages the core does
        not know go to its migration participant."""
        match msg:
            case Connect(inputs=inputs, outputs=outputs):
                self._connect(inputs, outputs)
                return Ack()
            case Start(partitions=partitions):
                if self.is_source and self.reader is None:
                    self.reader = PartitionedReader(self.spec.operators[0].fn, partitions,
                                                    self.clock, retain=self._two_phase)
                if self.status == CREATED:
                    self.status = RUNNING
                return Ack()
            case ReleaseSource():
                offsets = self.source_offsets()
                handed: tuple[tuple[str, Any], ...] = ()
                if self.reader is not None:
                    self.reader.close()
                if self.status == RUNNING:
                    self.paused = True
                    self.router.flush_all()
                    self.router.broadcast(EndOfStream())
                    handed = self._hand_over()
                    self.status = STOPPED
                if self.status != FAILED:
                    self._close_writers()
                return SourceReleased(self.name, offsets, handed)
            case Resume():
                self.paused = False
                self.quiet = False
                return Ack()
            case InstallKeyGroups(groups=groups):
                if self.backend is None:
                    raise TaskControlError(f"task {self.name} is not keyed; it holds no key "
                                           "groups (install them at the keyed vertex's tasks)")
                for kg, data in groups:
                    self.backend.install(kg, data)
                return Ack()
            case StopTask(end_outputs=end):
                handed: tuple[tuple[str, Any], ...] = ()
                if self.status not in (FINISHED, FAILED):
                    self.router.flush_all()
                    if end:
                        self.router.broadcast(EndOfStream())
                        handed = self._hand_over()
                    self.status = STOPPED
                if self.status != FAILED:
                    self._close_writers()
                return HandOver(self.name, handed) if handed else Ack()
            case AdoptTransactions(transactions=txns):
                self._adopted.extend(txns)
                return Ack()
            case TriggerCheckpoint():
                self._trigger_checkpoint(msg)
                return Ack()
            case CheckpointComplete(checkpoint_id=cid):
                if self.status != FAILED:
                    self._commit(cid)
                return Ack()
            case CheckpointAborted(checkpoint_id=cid):
                if self.checkpoints.pending == cid:
                    self.checkpoints.abort()
                self._barriers.pop(cid, None)
                return Ack()
            case CommitTransactions(transactions=txns):
                self._commit_transactions(txns)
                return Ack()
            case AddOutputChannels(edge_id=edge_id, channels=channels):
                self.router.add_channels(edge_id, channels)
                if self.watermark > MIN_WATERMARK:
                    self.router.send_event_to({c.channel_id for c in channels},
                                              Watermark(self.watermark))
                if self.status == FINISHED:
                    self.router.send_event_to({c.channel_id for c in channels}, EndOfStream())
                return Ack()
            case RemoveOutputChannels(channel_ids=ids):
                self.router.remove_channels(set(ids))
                return Ack()
            case ReplaceOutputChannel(retired=retired, replacement=replacement):
                self.router.replace_channel(retired, replacement)
                return Ack()
            case InjectLogicBarrier(version=version, channel_ids=ids):
                self.router.send_event_to(set(ids), LogicBarrier(version))
                return Ack()
            case SwitchLogic(version=version):
                self._on_logic(self.logic.trigger(version))
                return Ack()
            case DiscardLogic(version=version):
                self._staged.pop(version, None)
                if self.logic.pending == version:
                    self.logic.abort()
                return Ack()
            case AddInputs(inputs=inputs, after=after):
                for cid, port in inputs:
                    self.add_input(cid, port)
                waiting = {c for c in after if c in self.inputs and not self.inputs[c].ended}
                if waiting and inputs:
                    # negative tokens: migration blocks channels with subscale ids (>= 0)
                    token = min(self._handovers, default=0) - 1
                    self._handovers[token] = waiting
                    for cid, _ in inputs:
                        self.block_channel(cid, token)
                self._order = sorted(self.inputs)
                self._inputs_changed()
                self._on_watermark(self.tracker.set_channels(self._live_inputs()))
                return Ack()
            case DescribeTask():
                return TaskState(self.name, self.status.value,
                                 self._end_pending or self.status == FINISHED, self._describe())
            case HoldFinish(hold=hold):
                self.hold_finish = hold
                if not hold:
                    self._finish_if_ended()
                return TaskState(self.name, self.status.value,
                                 self._end_pending or self.status == FINISHED)
            case GroupStatsRequest():
                now, b, counts = self.clock.monotonic(), self.backend, self.group_load.take()
                groups = () if b is None else tuple(
                    (kg, counts.get(kg, 0), estimated_group_bytes(b, kg)) for kg in b.owned())
                reply = GroupStats(self.name, groups, now - self._stats_since)
                self._stats_since = now
                return reply
            case PriorityBatch(messages=msgs):
                for m in msgs:
                    if isinstance(m, PriorityBatch):
                        raise TaskControlError(f"task {self.name}: a PriorityBatch inside a "
                                               "PriorityBatch; the sender must flatten them")
                    self.handle(m)
                return Ack()
            case _:
                return self.migration.handle(msg)

    def _connect(self, inputs: tuple[tuple[int, int], ...] | tuple[int, ...], outputs: Any) -> None:
        wanted: dict[int, int] = {}
        for item in inputs:
            cid, port = (item, 0) if isinstance(item, int) else item
            wanted[cid] = port
        for cid in list(self.inputs):
            if cid not in wanted:
                if self.inputs[cid].queue or self.inputs[cid].pending:
                    raise TaskControlError(f"task {self.name}: removing input {cid} with queued "
                                           "frames; drain the channel before reconnecting")
                del self.inputs[cid]
        for cid, port in wanted.items():
            if cid not in self.inputs:
                self.inputs[cid] = InputChannel(cid, port, self._max_ahead)
        self._order = sorted(self.inputs)
        self._rr = 0
        self._inputs_changed()
        before = self.router.channel_ids()
        self.router.connect(outputs)
        if self.status == FINISHED:  # new receivers must learn that nothing more comes
            self.router.send_event_to(self.router.channel_ids() - before, EndOfStream())
            return
        self._on_watermark(self.tracker.set_channels(self._live_inputs()))
        if self.watermark > MIN_WATERMARK:  # new channels learn the current watermark
            self.router.broadcast(Watermark(self.watermark))

    # ------------------------------------------------------------ metrics
    def metrics(self) -> TaskMetrics:
        b = self.backend
        return TaskMetrics(
            task=self.name,
            vertex=self.spec.vertex,
            task_index=self.spec.task_index,
            status=self.status.value,
            records_in=self.records_in,
            records_out=self.router.records_out,
            bytes_in=self.bytes_in,
            bytes_out=self.router.bytes_out,
            useful_seconds=self.useful_s,
            idle_seconds=self.idle_s,
            backpressured_seconds=self.backpressured_s,
            queued_frames=self.queued_frames(),
            state_bytes=0 if b is None else b.estimated_bytes(),
            key_groups=0 if b is None else len(b.groups),
            dead_letters=self.chain.dead_letters,
            latency=self.latency.to_wire(),
            watermark=self.watermark,
            late_records=0 if self.keyed is None else self.keyed.late_records,
            source_backlog=(None if self.reader is None or self.status != RUNNING
                            else self.reader.backlog()),
        )
