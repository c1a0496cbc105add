"""The task core: input queues, scheduling, operator calls and control handling (pure).

``TaskCore`` is stepped by its actor shell (``engine.runtime``): ``receive`` frames,
``step``/``poll_source``/``fire_timers`` to do work, ``handle`` control messages. What it
produces waits in ``router.outbox`` (frames), ``reports`` (messages for the JobMaster) and
``consumed`` (frames taken for processing, to acknowledge). No Ray, no threads, no sleeping:
tests step it by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine import graph as g
from engine.channel import InputChannel, KeyFunctionError, OutputRouter
from engine.clock import Clock, now_ms
from engine.config import JobConfig
from engine.errors import UserFunctionError
from engine.latency import LatencyHistogram
from engine.messages import (
    Ack,
    ChannelIdle,
    Connect,
    DrainBarrier,
    Drained,
    EndOfStream,
    InstallKeyGroups,
    KeyGroupSnapshot,
    LatencyMarker,
    PauseSource,
    Resume,
    SnapshotKeyGroups,
    SourcePaused,
    Start,
    StopTask,
    TaskFailed,
    TaskFinished,
    Watermark,
    decode_frame,
)
from engine.metrics import TaskMetrics
from engine.operators import (
    ErrorPolicy,
    KeyedRunner,
    StatelessRunner,
    UnknownKeyGroupError,
    describe,
)
from engine.sinks import SinkWriter
from engine.sources import SourceReader
from engine.state import EVENT_TIME, KeyedStateBackend
from engine.time import MAX_WATERMARK, MIN_WATERMARK, WatermarkTracker

CREATED, RUNNING, FINISHED, FAILED, STOPPED = "created", "running", "finished", "failed", "stopped"


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


class TaskCore:
    def __init__(self, spec: TaskSpec, clock: Clock) -> None:
        self.spec = spec
        self.clock = clock
        self.name = spec.task_name
        cfg = spec.config
        self.router = OutputRouter(
            cfg.batch_size, cfg.linger_ms / 1000.0, spec.num_key_groups, spec.key_fns, clock.monotonic
        )
        self.inputs: dict[int, InputChannel] = {}
        self._order: list[int] = []
        self._rr = 0
        self.consumed: list[tuple[int, int]] = []
        self.reports: list[Any] = []
        self.status = CREATED
        self.failure: TaskFailed | None = None

        head = spec.operators[0]
        self.is_source = head.kind == g.SOURCE
        self.backend: KeyedStateBackend | None = None
        self.keyed: KeyedRunner | None = None
        self.reader: SourceReader | None = None
        self.paused = False
        self.quiet = False  # drained: no timers until Resume
        self.writers: dict[str, SinkWriter] = {}
        self.policies: list[ErrorPolicy] = []
        rest = spec.operators[1:] if (self.is_source or head.keyed) else spec.operators
        for op in spec.operators:
            if op.kind == g.SINK:
                self.writers[op.name] = op.fn.open(spec.task_index, spec.parallelism, clock)
        if head.keyed:
            self.backend = KeyedStateBackend(spec.num_key_groups)
            for kg in spec.key_groups:
                self.backend.own(kg)
            late = None
            if head.late_sink is not None:
                late = head.late_sink.open(spec.task_index, spec.parallelism, clock)
                self.writers[f"{head.name}/late"] = late
            self.keyed = KeyedRunner(head, self._policy(head), self.backend, spec.task_index,
                                     clock, lambda: self.watermark, late)
        self.runners = [StatelessRunner(op, self._policy(op), self.writers.get(op.name)) for op in rest]
        self.has_sink = any(op.kind == g.SINK for op in spec.operators)

        # alignment of drain barriers, watermarks
        self._blocked: set[int] = set()
        self._drain_epoch: int | None = None
        self.tracker = WatermarkTracker()
        self.watermark = MIN_WATERMARK
        # sources: event-time watermark generation
        self.wm_strategy = head.watermarks if self.is_source else None
        self._max_ts = MIN_WATERMARK
        self._last_emit = clock.monotonic()
        self._idle = False

        # metrics
        self.records_in = 0
        self.bytes_in = 0
        self.busy_s = 0.0
        self.idle_s = 0.0
        self.backpressured_s = 0.0
        self.latency = LatencyHistogram()

    def _policy(self, op: g.OperatorDef) -> ErrorPolicy:
        writer = None
        if op.dead_letter is not None:
            writer = op.dead_letter.open(self.spec.task_index, self.spec.parallelism, self.clock)
        pol = ErrorPolicy(op.name, self.spec.task_index, writer)
        self.policies.append(pol)
        return pol

    # ------------------------------------------------------------ data in
    def receive(self, channel_id: int, seq: int, payload: bytes) -> None:
        ch = self.inputs.get(channel_id)
        if ch is None:
            raise KeyError(f"task {self.name} has no input channel {channel_id}")
        ch.offer(seq, payload)
        self.bytes_in += len(payload)

    def queued_frames(self) -> int:
        return sum(len(c.queue) for c in self.inputs.values())

    def has_work(self) -> bool:
        if self.status != RUNNING:
            return False
        return any(c.queue for cid, c in self.inputs.items() if cid not in self._blocked)

    def _next_channel(self) -> InputChannel | None:
        order = self._order
        n = len(order)
        for i in range(n):
            cid = order[(self._rr + i) % n]
            ch = self.inputs[cid]
            if ch.queue and cid not in self._blocked:
                self._rr = (self._rr + i + 1) % n
                return ch
        return None

    def step(self) -> bool:
        """Process one frame from the next channel that has one; False when nothing to do."""
        if self.status != RUNNING:
            return False
        ch = self._next_channel()
        if ch is None:
            return False
        seq, payload = ch.queue.popleft()
        self.consumed.append((ch.channel_id, seq))
        frame = decode_frame(payload)
        values = list(frame.values)
        if values:
            self.records_in += len(values)
            self._guarded(self._run, values, list(frame.timestamps), frame.keys, frame.key_groups,
                          ch.port)
        if frame.event is not None and self.status == RUNNING:
            self._guarded(self._on_event, ch, frame.event)
        return True

    def _guarded(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except UserFunctionError as exc:
            self._fail(exc.operator, exc.record, exc.cause)
        except KeyFunctionError as exc:
            op = self._keyed_consumer_name()
            self._fail(op, describe(exc.record), f"key_by function raised {exc}")
        except UnknownKeyGroupError as exc:
            self._fail(self.spec.vertex, "", str(exc))

    def _keyed_consumer_name(self) -> str:
        return f"key_by after {self.spec.operators[-1].name}"

    def _run(self, values: list[Any], timestamps: list[int], keys: Any = None, kgs: Any = None,
             port: int = 0) -> None:
        if self.keyed is not None:
            values, timestamps = self.keyed.process(values, timestamps, keys, kgs, port)
        self._run_rest(values, timestamps)

    def _run_rest(self, values: list[Any], timestamps: list[int]) -> None:
        for r in self.runners:
            if not values:
                return
            values, timestamps = r.process(values, timestamps)
        self.router.emit(values, timestamps)

    # ------------------------------------------------------------ events
    def _live_inputs(self) -> list[int]:
        return [cid for cid, c in self.inputs.items() if not c.ended]

    def _on_event(self, ch: InputChannel, event: Any) -> None:
        match event:
            case LatencyMarker():
                if self.has_sink:
                    self.latency.observe(max(0.0, (self.clock.now() - event.created_at) * 1000.0))
                self.router.send_marker(event)
            case Watermark(timestamp=ts):
                self._on_watermark(self.tracker.update(ch.channel_id, ts))
            case ChannelIdle():
                self._on_watermark(self.tracker.mark_idle(ch.channel_id))
            case DrainBarrier(epoch=epoch):
                self._drain_epoch = epoch
                self._blocked.add(ch.channel_id)
                self._check_drained()
            case EndOfStream():
                ch.ended = True
                advanced = self.tracker.end(ch.channel_id)
                if not self._live_inputs():
                    self._finish()
                else:
                    self._check_drained()
                    self._on_watermark(advanced)
            case _:
                raise ValueError(f"task {self.name}: unsupported channel event {event!r}")

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

    def _check_drained(self) -> None:
        if self._drain_epoch is None:
            return
        if all(c in self._blocked for c in self._live_inputs()):
            epoch = self._drain_epoch
            self._drain_epoch = None
            self._blocked.clear()
            self.router.broadcast(DrainBarrier(epoch))
            self._flush_writers()
            self.quiet = True
            self.reports.append(Drained(self.name, epoch))

    def _flush_writers(self) -> None:
        for w in self.writers.values():
            w.flush()
        for p in self.policies:
            if p.dead_letter is not None:
                p.dead_letter.flush()

    def _finish(self) -> None:
        self.router.flush_all()
        self.router.broadcast(EndOfStream())
        self._close_writers()
        self.status = FINISHED
        self.reports.append(TaskFinished(self.name))

    def _close_writers(self) -> None:
        for w in self.writers.values():
            w.close()
        for p in self.policies:
            if p.dead_letter is not None:
                p.dead_letter.close()

    def _fail(self, operator: str, record: str, cause: str) -> None:
        self.status = FAILED
        self.failure = TaskFailed(self.name, operator, self.spec.task_index, record, cause)
        self.reports.append(self.failure)

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
        if not batch.values:
            return False
        self.records_in += len(batch.values)
        if self.wm_strategy is not None:
            m = max(batch.timestamps)
            if m > self._max_ts:
                self._max_ts = m
            self._last_emit = self.clock.monotonic()
            self._idle = False
        self._guarded(self._run_rest, batch.values, batch.timestamps)
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

        self._guarded(run)
        return True

    # ------------------------------------------------------------ control
    def handle(self, msg: Any) -> Any:
        """Carry out one control message; returns the reply message."""
        match msg:
            case Connect(inputs=inputs, outputs=outputs):
                self._connect(inputs, outputs)
                return Ack()
            case Start(offset=offset):
                if self.is_source and self.reader is None:
                    self.reader = self.spec.operators[0].fn.open(
                        self.spec.task_index, self.spec.parallelism, offset, self.clock
                    )
                if self.status == CREATED:
                    self.status = RUNNING
                return Ack()
            case PauseSource(epoch=epoch):
                if self.status == RUNNING and not self.paused:
                    self.paused = True
                    self.quiet = True
                    self.router.broadcast(DrainBarrier(epoch))
                    self._flush_writers()
                offset = None if self.reader is None else self.reader.offset()
                self.reports.append(SourcePaused(self.name, offset))
                self.reports.append(Drained(self.name, epoch))
                return Ack()
            case Resume():
                self.paused = False
                self.quiet = False
                return Ack()
            case SnapshotKeyGroups():
                b = self.backend
                groups = () if b is None else tuple((kg, b.snapshot(kg)) for kg in b.owned())
                return KeyGroupSnapshot(groups)
            case InstallKeyGroups(groups=groups):
                if self.backend is None:
                    raise ValueError(f"task {self.name} is not keyed; it holds no key groups")
                for kg, data in groups:
                    self.backend.install(kg, data)
                return Ack()
            case StopTask():
                if self.status not in (FINISHED, FAILED):
                    self.router.flush_all()
                    self._close_writers()
                    self.status = STOPPED
                return Ack()
            case _:
                raise ValueError(f"task {self.name}: unknown control message {msg!r}")

    def _connect(self, inputs: tuple[tuple[int, int], ...] | tuple[int, ...], outputs: Any) -> None:
        wanted: dict[int, int] = {}
        for item in inputs:
            cid, port = (item, 0) if isinstance(item, int) else item
            wanted[cid] = port
        for cid in list(self.inputs):
            if cid not in wanted:
                if self.inputs[cid].queue or self.inputs[cid].pending:
                    raise RuntimeError(f"task {self.name}: removing input {cid} with queued frames")
                del self.inputs[cid]
        for cid, port in wanted.items():
            if cid not in self.inputs:
                self.inputs[cid] = InputChannel(cid, port)
        self._order = sorted(self.inputs)
        self._rr = 0
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
            status=self.status,
            records_in=self.records_in,
            records_out=self.router.records_out,
            bytes_in=self.bytes_in,
            bytes_out=self.router.bytes_out,
            busy_seconds=self.busy_s,
            idle_seconds=self.idle_s,
            backpressured_seconds=self.backpressured_s,
            queued_frames=self.queued_frames(),
            state_bytes=0 if b is None else b.estimated_bytes(),
            key_groups=0 if b is None else len(b.groups),
            dead_letters=sum(p.dead_letters for p in self.policies),
            latency=self.latency.to_wire(),
            watermark=self.watermark,
            late_records=0 if self.keyed is None else self.keyed.late_records,
        )
