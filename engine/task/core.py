"""The task core: input queues, scheduling, operator calls, watermarks and the task's life
(pure).

Why a core apart from its actor: ``TaskCore`` is stepped by its actor shell
(``engine.runtime.task_actor``) and, in tests, by hand. ``receive`` frames, ``step``/
``poll_source``/``fire_timers`` to do work, ``control`` (or ``handle``) control messages. No
Ray, no threads, no sleeping.

Why the protocols are not in here: each per-task protocol is a *participant* with its own
state, behind a narrow host interface that ``engine.task.host.CoreHost`` implements over the
core (as Flink's ``BarrierHandlerState`` acts on its handler only through a ``Controller``):

* checkpoints and two-phase commit: ``engine.task.checkpointing.CheckpointParticipant``
  (``CheckpointHost``);
* change of logic: ``engine.task.logic.LogicSwitch`` (``LogicHost``);
* source rescale and inputs added live: ``engine.task.handover.SourceHandover``
  (``HandoverHost``);
* the task's channels as deployed and rewired: ``engine.task.wiring.Wiring``
  (``WiringHost``);
* order markers and watermark holds of a migration upstream:
  ``engine.task.group_order.OrderMarkers`` (``MarkersHost``);
* live migration: ``migration.participant`` through ``engine.task.migration_hooks.
  MigrationHooks`` (``TaskHost`` there). The core never imports ``migration``: the layering
  is engine core -> ``engine.task`` -> ``migration`` -> runtime. A core with no migration
  participant attached (``NoMigration``) supports stop-restart only;
  ``migration.participant.new_task_core`` builds a core with its participant.

Which input channel is read next is ``engine.task.inputs.InputSet``'s; a source's reading
and event-time watermarks are ``engine.task.source.SourceDriver``'s.

Control messages (and channel events) are dispatched by type through one table: the
core's own handlers and those each participant registers (``handlers()``, ``events()``;
``engine.task.reply.dispatch_table`` refuses a type two parts register); a type no one
registered goes to the migration participant. Every handler returns a ``Reply`` (``engine.task.reply``): the answer
with what the shell must do before sending it.

Format of what a core produces, waiting to be taken by its shell: ``router.outbox``
(encoded frames), ``reports`` (messages for the JobMaster), ``priority_out`` ((target task,
message) for the priority path), ``consumed`` ((channel, seq) of frames taken, to
acknowledge) and ``snapshots`` (its parts of checkpoints, ``TaskSnapshot``, for the shell
to write: ``engine.checkpoints.snapshot.persist``). The shell adds the time it measured to
``counters`` through its callbacks.

Guarantees: each channel's frames are processed in sequence order; a frame the participant
could not finish (``PartialFrame``: records that must wait, or an event behind them) is
continued before anything else of its channel; a channel an aligner blocks (a checkpoint or
logic barrier arrived on it) is not read until the barrier is aligned. While no migration
runs, a frame without per-record ports costs one check (``migration.active``) on top of its
processing.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from engine.columnar.batches import ColumnBatch
from engine.dataflow import graph as g
from engine.errors import (
    CodecError,
    KeyFunctionError,
    OutputCodecError,
    RestoreError,
    TaskControlError,
    UnknownKeyGroupError,
    UserFunctionError,
)
from engine.io.sources import PartitionedReader
from engine.observability.groupstats import GroupCounters
from engine.observability.latency import LatencyHistogram
from engine.observability.metrics import TaskMetrics
from engine.operators.builtin import Records, Stamps, describe
from engine.operators.chain import OperatorChain
from engine.state.keyed import EVENT_TIME, PROCESSING_TIME, KeyedStateBackend
from engine.task.channel import REROUTE_PORT, InputChannel, OutputRouter
from engine.task.checkpointing import CheckpointParticipant, unencodable_state
from engine.task.group_order import GroupOrder, OrderMarkers
from engine.task.handover import STOPPED_EFFECTS, SourceHandover
from engine.task.host import CoreHost
from engine.task.inputs import InputSet
from engine.task.logic import LogicSwitch
from engine.task.migration_hooks import MigrationHooks, NoMigration, PartialFrame
from engine.task.reply import ACK, Effects, Reply, dispatch_table
from engine.task.source import SourceDriver, poll_interval
from engine.task.spec import (
    CREATED,
    FAILED,
    FINISHED,
    RUNNING,
    STOPPED,
    Record,
    TaskSpec,
    TaskStatus,
)
from engine.task.wiring import Wiring
from engine.time.clock import Clock, now_ms
from engine.time.event_time import MAX_WATERMARK, MIN_WATERMARK, WatermarkTracker
from engine.wire.messages import (
    ChannelIdle,
    CheckpointBarrier,
    DescribeTask,
    EndOfStream,
    GroupStatsRequest,
    HandOver,
    HoldFinish,
    InstallKeyGroups,
    LatencyMarker,
    LogicBarrier,
    PriorityBatch,
    RestoreState,
    Resume,
    Start,
    StopTask,
    TaskFailed,
    TaskFinished,
    TaskState,
    Watermark,
    decode_frame,
)

__all__ = [
    "CREATED", "FAILED", "FINISHED", "RUNNING", "STOPPED", "MigrationHooks", "NoMigration",
    "PartialFrame", "Record", "Reply", "TaskControlError", "TaskCore", "TaskCounters",
    "TaskSpec", "TaskStatus", "unencodable_state",
]


def install_groups(backend: KeyedStateBackend, task: str,
                   groups: tuple[tuple[int, bytes], ...]) -> None:
    """Install restored key-group blobs; one that passed the store's checksum but does not
    decode is a ``RestoreError`` naming the task and the group (the checkpoint is unusable:
    recovery falls back to an older one)."""
    for kg, data in groups:
        try:
            backend.install(kg, data)
        except (CodecError, ValueError, TypeError, IndexError) as exc:
            raise RestoreError(
                f"task {task}: key group {kg} of the checkpoint does not decode "
                f"({type(exc).__name__}: {exc}); restore an earlier checkpoint",
                reason="corrupt") from exc


@dataclass
class TaskCounters:
    """Where a task's time went (``TaskMetrics``), measured by its shell, which adds it
    through the ``on_*`` callbacks only."""

    useful_s: float = 0.0  # operator work: decode, process, encode
    idle_s: float = 0.0  # waiting for input
    backpressured_s: float = 0.0  # waiting for credits

    def on_busy(self, seconds: float) -> None:
        self.useful_s += seconds

    def on_idle(self, seconds: float) -> None:
        self.idle_s += seconds

    def on_backpressured(self, seconds: float) -> None:
        self.backpressured_s += seconds


class TaskCore:
    """One task's processing. Its host methods (section "host") are what its participants
    may use of it (``TaskHost``, ``CheckpointHost``, ``LogicHost``, ``HandoverHost``)."""

    def __init__(self, spec: TaskSpec, clock: Clock) -> None:
        self.spec = spec
        self.clock = clock
        self.name = spec.task_name
        cfg = spec.config
        self.router = OutputRouter(
            cfg.batch_size, cfg.linger_ms / 1000.0, spec.num_key_groups, spec.key_fns, clock.monotonic
        )
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
                                   self._current_watermark, cfg, spec.job_id, spec.task_name)
        self.backend, self.keyed = self.chain.backend, self.chain.keyed
        self.source = (SourceDriver(head, clock, poll_interval(cfg.linger_ms))
                       if self.is_source else None)
        self.paused = False
        self.quiet = False  # after a stop-with-savepoint's barrier: no timers until Resume

        self.host = CoreHost(self)  # what the participants may use of this core
        self.checkpoints = CheckpointParticipant(self.host, spec, self.chain, self.router, clock)
        self.snapshots = self.checkpoints.snapshots
        self.logic = LogicSwitch(self.host, self.chain, self.router, clock)
        self.handover = SourceHandover(self.host)
        self.tracker = WatermarkTracker()
        self.watermark = MIN_WATERMARK

        # a frame further ahead than a sender's credits allow is refused (InputChannel)
        self.input_set = InputSet(self.name, max(64, 4 * cfg.credits), self._aligning,
                                  self._head_can_progress)
        self.inputs = self.input_set.channels
        self._heads = self.input_set.heads  # frames a participant left unfinished
        self._step_blocked = self.input_set.blocked  # channel -> tokens (alignments, order)
        self.group_order = GroupOrder()  # per-key order across migrations upstream
        self._suspended_since: float | None = None
        self.suspended_s = 0.0  # parked frames or blocked channels, and nothing processable
        self._end_pending = False  # input ended; finishing waits for a rescale
        self.hold_finish = False
        self._live = cfg.live_rescaling
        # records per key group, keys touched per second (planning)
        self.group_counters = GroupCounters(cfg.group_load_sample_every, clock.monotonic())
        self.records_in = 0
        self.bytes_in = 0
        self.counters = TaskCounters()
        self.latency = LatencyHistogram()

        self._handlers: dict[type, Callable[[Any], Reply]] = dispatch_table(self.name, {
            Start: self._start, Resume: self._resume, RestoreState: self._restore,
            InstallKeyGroups: self._install, StopTask: self._stop_task,
            DescribeTask: self._describe_task, HoldFinish: self._hold_finish,
            GroupStatsRequest: self._group_stats, PriorityBatch: self._priority_batch},
            Wiring(self.host).handlers(), self.checkpoints.handlers(),
            self.logic.handlers(), self.handover.handlers())
        self._events: dict[type, Callable[[InputChannel, Any], None]] = {
            LatencyMarker: self._on_marker, Watermark: self._on_channel_watermark,
            ChannelIdle: self._on_idle, EndOfStream: self._on_end,
            CheckpointBarrier: lambda ch, b: self.checkpoints.on_barrier(ch.channel_id, b),
            LogicBarrier: lambda ch, b: self.logic.on_barrier(ch.channel_id, b),
            **OrderMarkers(self.host, self.group_order, spec.forward_input,
                           self.keyed is not None).events()}

    def attach(self, migration: MigrationHooks) -> None:
        """Attach the migration participant: once, before the task starts."""
        if not isinstance(self.migration, NoMigration) or self.status != CREATED:
            raise TaskControlError(f"task {self.name}: a migration participant is attached "
                                   "once, before Start; build a new core instead")
        self.migration = migration

    # ------------------------------------------------------------ data in
    def receive(self, channel_id: int, seq: int, payload: bytes) -> None:
        self.input_set.receive(channel_id, seq, payload)
        self.bytes_in += len(payload)

    def queued_frames(self) -> int:
        return self.input_set.queued_frames()

    def has_work(self) -> bool:
        return self.status == RUNNING and self.input_set.next(peek=True) is not None

    def _head_can_progress(self, cid: int, head: PartialFrame) -> bool:
        return self.migration.can_progress(cid, head)

    def _aligning(self, cid: int) -> bool:
        """A checkpoint or logic barrier arrived on ``cid`` and waits for the others."""
        return self.checkpoints.is_blocked(cid) or self.logic.is_blocked(cid)

    def step(self) -> bool:
        """Process one frame (or what can be processed of it) from the next channel that can
        go on; False when nothing is processable."""
        if self.status != RUNNING:
            return False
        ch = self.input_set.next()
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
                        self.guarded(self.run, values, frame.timestamps, frame.keys,
                                     frame.key_groups, ch.port)
                elif values:
                    assert isinstance(values, list | tuple)  # rows
                    self.guarded(self.run, list(values), list(frame.timestamps),
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
            self.fail(exc.operator, exc.record, exc.cause)
        except KeyFunctionError as exc:
            self.fail(f"key_by after {self.spec.operators[-1].name}", describe(exc.record),
                      f"key_by function raised {exc}")
        except UnknownKeyGroupError as exc:
            self.fail(self.spec.vertex, "", str(exc))
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
        self.fail(self.spec.operators[-1].name, describe(exc.record) if exc.record is not None
                   else "", str(exc))

    def run(self, values: Records, timestamps: Stamps, keys: Any = None, kgs: Any = None,
             port: int = 0) -> None:
        if self._live and kgs is not None and self.keyed is not None:
            self.group_counters.observe(kgs, keys, self.clock.monotonic(), values)
        self.router.emit(*self.chain.process(values, timestamps, keys, kgs, port))

    def run_rest(self, values: Records, timestamps: Stamps) -> None:
        self.router.emit(*self.chain.process_rest(values, timestamps))

    # ------------------------------------------------------------ for the host and shell
    def add_input(self, channel_id: int, port: int) -> None:
        """Open an input channel (nothing if it is open); no input for watermarks when
        ``port`` is ``REROUTE_PORT``."""
        if self.input_set.add(channel_id, port):
            self.inputs_changed()

    def block_channel(self, channel_id: int, token: Hashable) -> None:
        """Stop reading ``channel_id`` until ``token`` (e.g. a subscale) is lifted."""
        self.input_set.block(channel_id, token)

    def unblock_channels(self, token: Hashable) -> None:
        """Lift ``token`` from every channel; a channel is read again once none is left."""
        self.input_set.unblock(token)

    def report(self, msg: Any) -> None:
        """Send ``msg`` to the JobMaster."""
        self.reports.append(msg)

    def fail(self, operator: str, record: str, cause: str, permanent: bool = False,
             downstream: bool = False) -> None:
        """Fail the task naming ``operator`` (and the ``record``) and report why."""
        self.status = FAILED
        self.failure = TaskFailed(self.name, operator, self.spec.task_index, record, cause,
                                  permanent, downstream)
        self.reports.append(self.failure)

    def stop(self, end_outputs: bool) -> tuple[tuple[str, Any], ...]:
        """Stop a task not finished or failed: flush its outputs and, with ``end_outputs``,
        end them and take its uncommitted sink output to hand over (returned); then close
        its writers unless it failed, and its state backend (a RocksDB one's files go: only
        a killed task leaves them, to the node's next task: ``backends.remove_abandoned``)."""
        handed: tuple[tuple[str, Any], ...] = ()
        if self.status not in (FINISHED, FAILED):
            self.router.flush_all()
            if end_outputs:
                self.router.broadcast(EndOfStream())
                handed = self.checkpoints.hand_over()
            self.status = STOPPED
        if self.status != FAILED:
            self.checkpoints.close_writers()
        self.chain.close_state()
        return handed

    # ------------------------------------------------------------ events
    def _live_inputs(self) -> list[int]:
        return [cid for cid, c in self.inputs.items() if not c.ended and c.port != REROUTE_PORT]

    def _on_event(self, ch: InputChannel, event: Any) -> None:
        handler = self._events.get(type(event))
        if handler is None:
            self.migration.on_event(ch, event)
        else:
            handler(ch, event)

    def _on_marker(self, ch: InputChannel, marker: LatencyMarker) -> None:
        if self.chain.has_sink:
            self.latency.observe(max(0.0, (self.clock.now() - marker.created_at) * 1000.0))
        self.router.send_marker(marker)

    def _on_channel_watermark(self, ch: InputChannel, wm: Watermark) -> None:
        if ch.port == REROUTE_PORT:  # the old owner's, for the records it re-routes
            self.migration.on_event(ch, wm)
            return
        self.advance_watermark(self.tracker.update(ch.channel_id, wm.timestamp))

    def _on_idle(self, ch: InputChannel, event: ChannelIdle) -> None:
        self.advance_watermark(self.tracker.mark_idle(ch.channel_id))

    def _on_end(self, ch: InputChannel, event: EndOfStream) -> None:
        ch.ended = True
        self.handover.on_end(ch.channel_id)
        advanced = self.tracker.end(ch.channel_id)
        # an input that ended counts as aligned: a pending checkpoint may complete
        self.checkpoints.on_end(ch.channel_id)
        self.logic.on_end(ch.channel_id)
        if not self._live_inputs():
            self._end_pending = True
            self.finish_if_ended()
        else:
            self.advance_watermark(advanced)

    def advance_watermark(self, wm: int | None) -> None:
        """The task's watermark advanced to ``wm``: fire event-time timers up to it, then
        forward it (outputs of the timers go ahead of the watermark)."""
        if wm is None or wm <= self.watermark:
            return
        self.watermark = wm
        if self.keyed is not None:
            self.run_rest(*self.keyed.fire_timers(wm, EVENT_TIME))
        self.router.broadcast(Watermark(wm))

    def watermark_may_advance(self) -> None:
        """The live inputs changed: the watermark is theirs again (it may advance)."""
        self.advance_watermark(self.tracker.set_channels(self._live_inputs()))

    def _current_watermark(self) -> int:
        """The watermark user code sees (capped per group while a migration runs)."""
        return self.migration.user_watermark(self.watermark)

    def inputs_changed(self) -> None:
        """The live inputs changed (connected, added, removed): the aligners follow."""
        self.checkpoints.set_channels(self._live_inputs())
        self.logic.set_channels(self._live_inputs())

    def stage_logic(self, version: int, operator: str, fn: Any) -> None:
        """Stage ``fn`` for ``operator`` at logic barrier ``version`` (``LogicSwitch.stage``)."""
        self.logic.stage(version, operator, fn)

    # ------------------------------------------------------------ the task's life
    def finish_if_ended(self) -> None:
        """Finish once the input has ended, unless a rescale holds the task or key groups
        are still on their way in or out (their barriers must still be processed)."""
        if (self._end_pending and self.status == RUNNING and not self.hold_finish
                and not self.migration.active and not self._live_inputs()):
            self._end_pending = False
            self._finish()

    def _finish(self) -> None:
        if self.keyed is not None:
            # end of input: pending processing-time timers fire too, so no window is lost
            self.run_rest(*self.keyed.fire_timers(MAX_WATERMARK, PROCESSING_TIME))
        self.router.flush_all()
        self.router.broadcast(EndOfStream())
        if not self.checkpoints.two_phase:  # else the final checkpoint commits, then StopTask
            self.checkpoints.close_writers()
        self.status = FINISHED
        self.reports.append(TaskFinished(self.name))

    def fail_internal(self, cause: str, downstream: bool = False) -> None:
        """The shell met an error outside an operator call (a receiver died:
        ``downstream``; an engine bug): fail naming the task's vertex."""
        self.fail(self.spec.vertex, "", cause, downstream=downstream)

    def _describe(self) -> str:
        """Where this task's migrations and inputs stand (a stuck rescale's error)."""
        parts = self.migration.describe() + self.group_order.describe()
        parts.append("inputs " + self.input_set.describe(self.checkpoints.is_blocked))
        return "; ".join(parts)

    # ------------------------------------------------------------ sources and timers
    def poll_source(self, max_records: int) -> bool:
        """Read one batch from the source; False when nothing was due (or paused/ended)."""
        if self.status != RUNNING or self.paused or self.reader is None:
            return False
        batch = self.source.poll(max_records)  # type: ignore[union-attr]
        if batch is None:  # end of input: every event-time window downstream may fire
            self.watermark = MAX_WATERMARK
            self.router.broadcast(Watermark(MAX_WATERMARK))
            self._finish()
            return True
        if not len(batch.values):
            return False
        self.records_in += len(batch.values)
        self.guarded(self.run_rest, batch.values, batch.timestamps)
        return True

    def emit_watermark(self) -> None:
        """Sources: send the watermark of the records read so far (called periodically);
        after ``idle_timeout_ms`` without records, mark the channels idle."""
        if self.source is None or self.status != RUNNING or self.paused:
            return
        event = self.source.due(self.watermark)
        if type(event) is Watermark:
            self.watermark = event.timestamp
        if event is not None:
            self.router.broadcast(event)

    @property
    def reader(self) -> PartitionedReader | None:
        """A source task's reader (None before ``Start`` and for other tasks)."""
        return None if self.source is None else self.source.reader

    def source_offsets(self) -> dict[str, Any]:
        """A source task's ``{partition: resume state}`` after the last record it emitted
        (what a checkpoint stores for it); empty for other tasks."""
        return {} if self.reader is None else self.reader.offsets()

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
        self.guarded(lambda: self.run_rest(*self.keyed.fire_timers(now)))  # type: ignore[union-attr]
        return True

    # ------------------------------------------------------------ control
    def control(self, msg: Any) -> Reply:
        """Carry out one control message; returns the reply with what the shell must do
        before sending it. A type the core and its participants did not register goes to
        the migration participant (``TaskControlError`` when it does not take it either)."""
        handler = self._handlers.get(type(msg))
        return self.migration.control(msg) if handler is None else handler(msg)

    def handle(self, msg: Any) -> Any:
        """``control``'s reply message, for callers that carry out no effects (tests, and
        the messages of a ``PriorityBatch``)."""
        return self.control(msg).message

    def _start(self, msg: Start) -> Reply:
        if self.source is not None:
            self.source.start(msg.partitions, retain=self.checkpoints.two_phase)
        if self.status == CREATED:
            self.status = RUNNING
        return Reply(ACK.message, Effects(start_loop=True))

    def _resume(self, msg: Resume) -> Reply:
        self.paused = self.quiet = False
        return ACK

    def _restore(self, msg: RestoreState) -> Reply:
        # the shell reads the groups off its loop and hands the core what they make
        return Reply(ACK.message, Effects(restore=msg))

    def _install(self, msg: InstallKeyGroups) -> Reply:
        if self.backend is None:
            raise TaskControlError(f"task {self.name} is not keyed; it holds no key "
                                   "groups (install them at the keyed vertex's tasks)")
        install_groups(self.backend, self.name, msg.groups)
        return ACK

    def _stop_task(self, msg: StopTask) -> Reply:
        handed = self.stop(msg.end_outputs)
        return Reply(HandOver(self.name, handed) if handed else ACK.message, STOPPED_EFFECTS)

    def _describe_task(self, msg: DescribeTask) -> Reply:
        return Reply(TaskState(self.name, self.status.value,
                               self._end_pending or self.status == FINISHED, self._describe()))

    def _hold_finish(self, msg: HoldFinish) -> Reply:
        self.hold_finish = msg.hold
        if not msg.hold:
            self.finish_if_ended()
        return Reply(TaskState(self.name, self.status.value,
                               self._end_pending or self.status == FINISHED))

    def _group_stats(self, msg: GroupStatsRequest) -> Reply:
        return Reply(self.group_counters.reply(self.name, self.backend,
                                               self.clock.monotonic(), msg.keys))

    def _priority_batch(self, msg: PriorityBatch) -> Reply:
        for m in msg.messages:
            if isinstance(m, PriorityBatch):
                raise TaskControlError(f"task {self.name}: a PriorityBatch inside a "
                                       "PriorityBatch; the sender must flatten them")
            self.handle(m)
        return ACK

    # ------------------------------------------------------------ metrics
    def metrics(self) -> TaskMetrics:
        """What the task counted so far (``TaskMetrics``)."""
        b, c, r = self.backend, self.counters, self.router
        return TaskMetrics(
            task=self.name, vertex=self.spec.vertex, task_index=self.spec.task_index,
            status=self.status.value, records_in=self.records_in, records_out=r.records_out,
            bytes_in=self.bytes_in, bytes_out=r.bytes_out, useful_seconds=c.useful_s,
            idle_seconds=c.idle_s, backpressured_seconds=c.backpressured_s,
            queued_frames=self.queued_frames(),
            state_bytes=0 if b is None else b.estimated_bytes(),
            key_groups=0 if b is None else len(b.groups), dead_letters=self.chain.dead_letters,
            latency=self.latency.to_wire(), watermark=self.watermark,
            late_records=0 if self.keyed is None else self.keyed.late_records,
            source_backlog=(None if self.reader is None or self.status != RUNNING
                            else self.reader.backlog()))
