"""The task core: input queues, scheduling, operator calls and control handling (pure).

``TaskCore`` is stepped by its actor shell (``engine.runtime``): ``receive`` frames,
``step``/``poll_source``/``fire_timers`` to do work, ``handle`` control messages. What it
produces waits in ``router.outbox`` (frames), ``reports`` (messages for the JobMaster) and
``consumed`` (frames taken for processing, to acknowledge). No Ray, no threads, no sleeping:
tests step it by hand.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine import graph as g
from engine.channel import InputChannel, KeyFunctionError, OutputRouter
from engine.clock import Clock, now_ms
from engine.codec import pack_exact
from engine.config import JobConfig
from engine.errors import UserFunctionError
from engine.latency import LatencyHistogram
from engine.messages import (
    Ack,
    AddInputs,
    AddOutputChannels,
    ChannelIdle,
    ConfirmBarrier,
    Connect,
    DescribeTask,
    DrainBarrier,
    Drained,
    DropReplicas,
    EndOfStream,
    ExpectIncoming,
    ExpectOutgoing,
    GroupStats,
    GroupStatsRequest,
    HoldFinish,
    InjectSubscale,
    InstallKeyGroups,
    KeyGroupSnapshot,
    LatencyMarker,
    MigrateState,
    OutputChannel,
    PauseBarrier,
    PauseSource,
    PriorityBatch,
    PullState,
    RefreshReplicas,
    RemoveOutputChannels,
    ReplicaAck,
    ReplicasRefreshed,
    ReplicaUpdate,
    Resume,
    SnapshotKeyGroups,
    SourcePaused,
    Start,
    StopTask,
    SubscaleDone,
    SubscaleTriggered,
    TaskFailed,
    TaskFinished,
    TaskState,
    TriggerBarrier,
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
from engine.state import EVENT_TIME, PROCESSING_TIME, KeyedStateBackend
from engine.time import MAX_WATERMARK, MIN_WATERMARK, WatermarkTracker
from migration.protocols.drrs import REROUTE_PORT, NewOwnerRole, OldOwnerRole
from migration.replication import (
    ReplicaStore,
    ReplicationStats,
    StaleReplicaError,
    migration_payload,
    refresh_replica,
)

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


def _estimated_group_bytes(b: KeyedStateBackend, key_group: int) -> int:
    """Cheap estimate of a key group's encoded size (a sample of each table stands for
    the rest), for planning; a migration ships and counts the exact bytes."""
    total = 0
    for t in b.groups.get(key_group, {}).values():
        if t:
            sample = list(itertools.islice(t.items(), 32))
            total += len(pack_exact(sample)) * len(t) // len(sample)
    return total


def _waits_for_aside(event: Any) -> bool:
    """Whether a channel's event must wait until the records the channel had set aside
    before it are processed. Watermarks, barriers and end of input must (they order what
    follows them); a latency marker carries no obligation and passes: otherwise a marker
    (every 100 ms by default) would stop the channel for as long as an incoming group
    waits for its state and confirm, the sender would run out of credit on it, and every
    key the sender feeds would wait."""
    return event is not None and not isinstance(event, LatencyMarker)


class _Head:
    """A frame taken from a channel but not fully processed (records waiting for their
    group's state, or an event waiting behind set-aside records)."""

    __slots__ = ("values", "timestamps", "keys", "kgs", "ports", "event", "pos")

    def __init__(self, frame: Any) -> None:
        self.values = frame.values
        self.timestamps = frame.timestamps
        self.keys = frame.keys
        self.kgs = frame.key_groups
        self.ports = frame.ports
        self.event = frame.event
        self.pos = 0


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
                                     clock, self._current_watermark, late)
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

        # DRRS roles and bookkeeping
        self.old_role = OldOwnerRole()
        self.new_role = NewOwnerRole(cfg.drrs_set_aside_cap)
        self.priority_out: list[tuple[str, Any]] = []  # (target task, message), priority path
        self._heads: dict[int, _Head] = {}
        # channels not read until the subscales holding them finish (alignment, pause)
        self._step_blocked: dict[int, set[int]] = {}
        self._reroute_channels: dict[int, OutputChannel] = {}
        self._state_sent: dict[int, int] = {}
        self._replicas_at_new: dict[int, dict[int, int]] = {}  # subscale -> kg -> version
        self.replicas = ReplicaStore()  # replicas this task holds for other owners
        self.replication_stats = ReplicationStats()  # replicas of this task's groups
        self._trigger_at: dict[int, float] = {}
        self._suspended_since: float | None = None
        self._end_pending = False  # input ended; finishing waits for a rescale
        self.hold_finish = False
        self.suspended_s = 0.0
        self._live = cfg.live_rescaling
        self.group_records: Counter[int] = Counter()  # records per key group (planning)
        self._stats_since = clock.monotonic()
        # old owner: groups of a triggered subscale -> the watermark at its first barrier
        self._leaving: dict[int, int] = {}
        if self.keyed is not None and self._live:
            self.keyed.hold = self._holds_timers

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
        return sum(len(c.queue) for c in self.inputs.values()) + len(self._heads)

    def has_work(self) -> bool:
        if self.status != RUNNING:
            return False
        return self._next_channel(peek=True) is not None

    def _migrating(self) -> bool:
        return self.old_role.active or self.new_role.active

    def _head_can_progress(self, cid: int, head: _Head) -> bool:
        """A partly processed frame can go on unless its next record must wait and cannot be
        set aside, or only its event is left, it must wait for the channel's records set
        aside, and the channel has some."""
        nr = self.new_role
        if head.pos < len(head.values):
            kg = head.kgs[head.pos] if head.kgs is not None else -1
            return not (nr.incoming(kg) and not nr.ready(cid, kg) and not nr.can_set_aside())
        return not (_waits_for_aside(head.event) and nr.has_aside(cid))

    def _next_channel(self, peek: bool = False) -> InputChannel | None:
        order = self._order
        n = len(order)
        for i in range(n):
            cid = order[(self._rr + i) % n]
            if cid in self._blocked or cid in self._step_blocked:
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
            if not self._live or (not self._migrating() and frame.ports is None):
                if frame.values:
                    self._guarded(self._run, list(frame.values), list(frame.timestamps),
                                  frame.keys, frame.key_groups, ch.port)
                if frame.event is not None and self.status == RUNNING:
                    self._guarded(self._on_event, ch, frame.event)
                return True
            head = _Head(frame)
        self._guarded(self._step_head, ch, head)
        return True

    def _step_head(self, ch: InputChannel, head: _Head) -> None:
        """Migration-aware processing of a frame: re-route records of migrated-out groups,
        set aside records of incoming groups that are not ready, process the rest."""
        cid = ch.channel_id
        old, nr = self.old_role, self.new_role
        values, tss, keys, kgs, ports = head.values, head.timestamps, head.keys, head.kgs, head.ports
        n = len(values)
        ready: list[tuple[Any, int, Any, int, int]] = []
        pos = head.pos
        while pos < n:
            if kgs is None:  # not a keyed input: nothing migrates
                ready.extend((values[j], tss[j], None, -1, ch.port) for j in range(pos, n))
                pos = n
                break
            kg = kgs[pos]
            port = ports[pos] if ports is not None else ch.port
            rc = old.migrated_out.get(kg)
            if rc is not None:
                self.router.reroute(rc, values[pos], tss[pos], keys[pos], kg, port)
            elif nr.incoming(kg) and not nr.ready(cid, kg):
                if not nr.can_set_aside():
                    break
                nr.set_aside(cid, kg, values[pos], tss[pos], keys[pos], port)
            else:
                ready.append((values[pos], tss[pos], keys[pos], kg, port))
            pos += 1
        head.pos = pos
        self._run_records(ready)
        if pos < n or (_waits_for_aside(head.event) and nr.has_aside(cid)):
            self._heads[cid] = head
            return
        if head.event is not None and self.status == RUNNING:
            self._on_event(ch, head.event)

    def _run_records(self, records: list[tuple[Any, int, Any, int, int]]) -> None:
        """Process (value, timestamp, key, key group, port) records, in order, in runs of
        the same port."""
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
            if self._live and kgs is not None:
                self.group_records.update(kgs)
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
        return [cid for cid, c in self.inputs.items() if not c.ended and c.port != REROUTE_PORT]

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
            case ConfirmBarrier(subscale=sid, direct_channel=dc):
                if ch.port == REROUTE_PORT:
                    self._confirm_at_new_owner(sid, dc)
                else:
                    self._confirm_at_old_owner(sid, dc, ch.channel_id)
            case PauseBarrier(subscale=sid):
                if sid in self.new_role.subscales:  # not yet installed: pause the channel
                    self._step_blocked.setdefault(ch.channel_id, set()).add(sid)
            case DrainBarrier(epoch=epoch):
                self._drain_epoch = epoch
                self._blocked.add(ch.channel_id)
                self._check_drained()
            case EndOfStream():
                ch.ended = True
                advanced = self.tracker.end(ch.channel_id)
                if not self._live_inputs():
                    self._end_pending = True
                    self._finish_if_ended()
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

    def _finish_if_ended(self) -> None:
        """Finish once the input has ended, unless a rescale holds the task or key groups
        are still on their way in or out (their barriers must still be processed)."""
        if (self._end_pending and self.status == RUNNING and not self.hold_finish
                and not self._migrating() and not self._live_inputs()):
            self._end_pending = False
            self._finish()

    def _finish(self) -> None:
        if self.keyed is not None:
            # end of input: pending processing-time timers fire too, so no window is lost
            values, timestamps = self.keyed.fire_timers(MAX_WATERMARK, PROCESSING_TIME)
            self._run_rest(values, timestamps)
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

    # ------------------------------------------------------------ DRRS
    def _current_watermark(self) -> int:
        """The watermark user code sees: for a group still arriving, no later than the old
        owner's watermark when the group left it."""
        b = self.backend
        if b is not None and self.new_role.group_watermark:
            wm = self.new_role.group_watermark.get(b.current_group)
            if wm is not None:
                return min(wm, self.watermark)
        return self.watermark

    def _holds_timers(self, kg: int) -> bool:
        """Timers of a group on its way in wait for it to become active; those of a group on
        its way out never fire here: records of it behind the subscale's barrier went to the
        new owner, so a timer firing here would miss them. Held timers travel with the state."""
        return kg in self._leaving or self.new_role.incoming(kg)

    def _freeze_leaving(self, sid: int) -> None:
        for kg in self.old_role.subscales[sid].key_groups:
            self._leaving.setdefault(kg, self.watermark)

    def _describe(self) -> str:
        """Where this task's migrations and inputs stand (a stuck rescale's error)."""
        parts = []
        for sid, out in self.old_role.subscales.items():
            parts.append(f"out {sid} groups {list(out.key_groups)} confirms "
                         f"{len(out.confirms)}/{out.predecessors} triggered {out.migrated} "
                         f"pulled {sorted(out.pulled)}")
        for sid, inc in self.new_role.subscales.items():
            parts.append(f"in {sid} groups {list(inc.key_groups)} state in {sorted(inc.state_in)} "
                         f"confirms {len(inc.confirms)}/{len(inc.direct_channels)}"
                         f"{'' if inc.confirm_needed else ' (not needed)'}")
        if self.new_role.aside_count:
            parts.append(f"{self.new_role.aside_count} records set aside")
        chans = [f"{cid}:{len(c.queue)}q{'/ended' if c.ended else ''}"
                 f"{'/blocked' if cid in self._step_blocked or cid in self._blocked else ''}"
                 f"{'/head' if cid in self._heads else ''}" for cid, c in self.inputs.items()]
        parts.append("inputs " + " ".join(chans))
        return "; ".join(parts)

    def _inject(self, msg: InjectSubscale) -> None:
        """Predecessor: re-route the subscale's groups, confirm on the old channels, trigger."""
        edge = next(e for e in self.router.edges if e.edge_id == msg.edge_id)
        direct = edge.channels[msg.new_index]
        for oc in self.router.redirect(msg.edge_id, msg.key_groups, msg.new_index):
            self.router.send_event_to({oc.channel_id}, ConfirmBarrier(msg.subscale, direct.channel_id))
            if msg.trigger:
                self.priority_out.append((oc.target, TriggerBarrier(msg.subscale)))
        if msg.pause_new:
            self.router.send_event_to({direct.channel_id}, PauseBarrier(msg.subscale))

    def _migrate_out(self, sid: int) -> None:
        """Old owner, first barrier of the subscale: the new owner may pull the groups."""
        out = self.old_role.subscales[sid]
        self._trigger_at[sid] = self.clock.now()
        self._freeze_leaving(sid)
        self.router.open_reroute(self._reroute_channels[sid])
        b = self.backend
        assert b is not None
        sizes = tuple((kg, _estimated_group_bytes(b, kg)) for kg in out.key_groups)
        first = self.old_role.first_push(sid, dict(sizes))
        self.priority_out.append((out.new_owner, SubscaleTriggered(sid, sizes, first)))
        self._state_sent[sid] = 0
        self._on_pull(sid, first)  # two hops sooner than a pull; the priority path keeps order

    def _on_pull(self, sid: int, kg: int) -> None:
        """Old owner: the new owner pulls one group; from now on its records found in the
        input are re-routed."""
        if not self.old_role.can_pull(sid, kg):
            return
        out = self.old_role.subscales[sid]
        self.router.flush_all()  # this task's earlier outputs of the group go first
        msg = self._take_group(sid, kg)
        out.pulled.add(kg)
        self.old_role.mark_migrated(sid, kg)
        self.priority_out.append((out.new_owner, msg))
        self._state_sent[sid] += len(msg.state)
        self._finish_outgoing(sid)

    def _finish_outgoing(self, sid: int) -> None:
        """Old owner (drrs): every confirm forwarded and every group pulled."""
        if not self.old_role.done(sid):
            return
        out = self.old_role.subscales[sid]
        self.router.close_reroute(out.reroute_channel)
        self.old_role.finish(sid)
        self._reroute_channels.pop(sid, None)
        self._replicas_at_new.pop(sid, None)
        self.reports.append(SubscaleDone(
            self.name, sid, "old", self._state_sent.pop(sid, 0),
            self.router.rerouted_by.pop(out.reroute_channel, 0),
            self._trigger_at.pop(sid, 0.0), self.suspended_s))
        self._finish_if_ended()

    def _pull_next(self, sid: int) -> None:
        """New owner: ask for the next group of the subscale (one at a time)."""
        kg = self.new_role.next_pull(sid)
        if kg is not None:
            self.priority_out.append((self.new_role.subscales[sid].old_owner, PullState(sid, kg)))

    def _unblock(self, sid: int) -> None:
        for cid in [c for c, sids in self._step_blocked.items() if sid in sids]:
            sids = self._step_blocked[cid]
            sids.discard(sid)
            if not sids:
                del self._step_blocked[cid]

    def _ship_aligned(self, sid: int) -> None:
        """Old owner, every confirm of the subscale in (no record of its groups can arrive
        any more): ship the groups' state, finish, read the held channels again."""
        self.router.flush_all()  # this task's earlier outputs of the groups go first
        out = self.old_role.finish(sid)
        b = self.backend
        assert b is not None
        sent = 0
        for kg in out.key_groups:
            msg = self._take_group(sid, kg)
            self.priority_out.append((out.new_owner, msg))
            sent += len(msg.state)
        self._reroute_channels.pop(sid, None)
        self._replicas_at_new.pop(sid, None)
        self._unblock(sid)
        self.reports.append(SubscaleDone(self.name, sid, "old", sent, 0,
                                         self._trigger_at.pop(sid, 0.0), self.suspended_s))
        self._finish_if_ended()

    def _take_group(self, sid: int, kg: int) -> MigrateState:
        """Snapshot and remove a group for its new owner: only the changes since the
        replica there when it holds one at the group's last replicated version."""
        b = self.backend
        assert b is not None
        kind, data = migration_payload(b, kg, self._replicas_at_new.get(sid, {}).get(kg))
        b.remove(kg)
        b.untrack(kg)
        if self.keyed is not None:
            self.keyed.held.pop(kg, None)  # they are in the state just taken
        # the new owner shows records set aside there no later watermark than the one
        # they followed: the watermark here when the subscale's first barrier came
        wm = self._leaving.pop(kg, self.watermark)
        return MigrateState(sid, kg, data, wm, kind)

    def _confirm_at_old_owner(self, sid: int, direct_channel: int, channel: int) -> None:
        out = self.old_role.subscales.get(sid)
        if out is not None and out.aligned:
            if sid not in self._trigger_at:  # the subscale's first barrier here
                self._trigger_at[sid] = self.clock.now()
                self._freeze_leaving(sid)
            if self.old_role.on_confirm(sid, direct_channel):
                self._ship_aligned(sid)
            elif out.block:
                self._step_blocked.setdefault(channel, set()).add(sid)
            return
        if self.old_role.should_migrate(sid):
            self._migrate_out(sid)
        out = self.old_role.subscales[sid]
        self.router.reroute_event(out.reroute_channel, ConfirmBarrier(sid, direct_channel))
        self.old_role.on_confirm(sid, direct_channel)
        self._finish_outgoing(sid)

    def _confirm_at_new_owner(self, sid: int, direct_channel: int) -> None:
        self.new_role.on_confirm(sid, direct_channel)
        self._release_and_activate(sid)

    def _install_incoming(self, msg: MigrateState) -> None:
        assert self.backend is not None
        if msg.kind == "delta":
            data = self.replicas.reload(msg.key_group, "delta", msg.state)
        else:
            self.replicas.drop(msg.key_group)
            data = msg.state
        self.backend.install(msg.key_group, data)
        self.new_role.on_state(msg.subscale, msg.key_group, len(msg.state), msg.watermark)
        self._guarded(self._release_and_activate, msg.subscale)
        self._pull_next(msg.subscale)

    def _release_and_activate(self, sid: int) -> None:
        nr = self.new_role
        for c, kg in nr.releasable():
            self._run_records([(v, ts, k, kg, port) for v, ts, k, port in nr.release(c, kg)])
        activated = nr.activatable(sid)
        for kg in activated:
            nr.activate(kg)
            if self.keyed is not None:
                self.keyed.release_held(kg)
        if activated and self.keyed is not None:
            values, timestamps = self.keyed.fire_timers(self.watermark, EVENT_TIME)
            self._run_rest(values, timestamps)
        if nr.subscale_done(sid):
            inc = nr.finish(sid)
            self._unblock(sid)
            ch = self.inputs.get(inc.reroute_channel)
            if ch is not None and not ch.queue and not ch.pending and inc.reroute_channel not in self._heads:
                del self.inputs[inc.reroute_channel]
                self._order = sorted(self.inputs)
                self._rr = 0
            self.reports.append(SubscaleDone(self.name, sid, "new", inc.bytes_in, 0, 0.0,
                                             self.suspended_s))
            self._finish_if_ended()

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
            case StopTask(end_outputs=end):
                if self.status not in (FINISHED, FAILED):
                    self.router.flush_all()
                    if end:
                        self.router.broadcast(EndOfStream())
                    self._close_writers()
                    self.status = STOPPED
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
            case AddInputs(inputs=inputs):
                for cid, port in inputs:
                    if cid not in self.inputs:
                        self.inputs[cid] = InputChannel(cid, port)
                self._order = sorted(self.inputs)
                self._on_watermark(self.tracker.set_channels(self._live_inputs()))
                return Ack()
            case DescribeTask():
                return TaskState(self.name, self.status,
                                 self._end_pending or self.status == FINISHED, self._describe())
            case HoldFinish(hold=hold):
                self.hold_finish = hold
                if not hold:
                    self._finish_if_ended()
                return TaskState(self.name, self.status,
                                 self._end_pending or self.status == FINISHED)
            case GroupStatsRequest():
                now, b, counts = self.clock.monotonic(), self.backend, self.group_records
                groups = () if b is None else tuple(
                    (kg, counts.get(kg, 0), _estimated_group_bytes(b, kg)) for kg in b.owned())
                reply = GroupStats(self.name, groups, now - self._stats_since)
                self.group_records, self._stats_since = Counter(), now
                return reply
            case RefreshReplicas(targets=targets):
                return self._refresh_replicas(targets)
            case ReplicaUpdate(key_group=kg, version=v, data=data, is_delta=is_delta):
                try:
                    self.replicas.update(kg, v, data, is_delta, self.clock.now())
                except StaleReplicaError:
                    self.replicas.drop(kg)
                    return ReplicaAck(kg, False)
                return ReplicaAck(kg, True)
            case DropReplicas(key_groups=kgs):
                for kg in kgs:
                    self.replicas.drop(kg)
                return Ack()
            case InjectSubscale():
                self._inject(msg)
                return Ack()
            case ExpectOutgoing(subscale=sid, key_groups=kgs, reroute=rc, predecessors=n,
                                aligned=aligned, block=block, replicas=replicas):
                self.old_role.expect(sid, kgs, rc.target, rc.channel_id, n, aligned, block)
                if replicas:
                    self._replicas_at_new[sid] = dict(replicas)
                self._reroute_channels[sid] = rc
                return Ack()
            case ExpectIncoming(subscale=sid, key_groups=kgs, direct_channels=dcs,
                                reroute_channel=rcid, confirm_needed=confirm_needed,
                                old_owner=old_owner):
                self.new_role.expect(sid, kgs, dcs, rcid, confirm_needed, old_owner)
                if confirm_needed and rcid not in self.inputs:
                    self.inputs[rcid] = InputChannel(rcid, REROUTE_PORT)
                    self._order = sorted(self.inputs)
                return Ack()
            case TriggerBarrier(subscale=sid):
                if self.old_role.should_migrate(sid):
                    self._migrate_out(sid)
                return Ack()
            case MigrateState():
                self._install_incoming(msg)
                return Ack()
            case SubscaleTriggered(subscale=sid, sizes=sizes, pushed=pushed):
                if sid in self.new_role.subscales:
                    self.new_role.on_triggered(sid, dict(sizes), pushed)
                    self._pull_next(sid)
                return Ack()
            case PullState(subscale=sid, key_group=kg):
                self._on_pull(sid, kg)
                return Ack()
            case PriorityBatch(messages=msgs):
                for m in msgs:
                    if isinstance(m, PriorityBatch):
                        raise ValueError(f"task {self.name}: a PriorityBatch inside a PriorityBatch")
                    self.handle(m)
                return Ack()
            case _:
                raise ValueError(f"task {self.name}: unknown control message {msg!r}")

    def _refresh_replicas(self, targets: tuple[tuple[int, str, int], ...]) -> ReplicasRefreshed:
        """Owner: the next refresh of each replicated group goes to its holder (priority
        path; the shell awaits the holders' acks before replying)."""
        b = self.backend
        stats = self.replication_stats
        before_bytes, before_cpu = stats.bytes_copied, stats.encode_cpu_s
        versions = []
        for kg, holder, held in targets:
            if b is None or kg not in b.groups:
                continue
            full = not (held >= 0 and b.is_tracked(kg) and held == b.version(kg))
            r = refresh_replica(b, kg, self.clock.monotonic, stats, full=full)
            self.priority_out.append((holder, ReplicaUpdate(kg, r.version, r.data, r.is_delta)))
            versions.append((kg, r.version))
        return ReplicasRefreshed(tuple(versions), (), stats.bytes_copied - before_bytes,
                                 stats.encode_cpu_s - before_cpu)

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
