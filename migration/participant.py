"""The per-task side of live migration: ``MigrationParticipant`` (docs/architecture.md).

Why apart from the task core: every live protocol (drrs, meces, pause-resume, fluid,
batched, non-disruptive) runs the same per-task state machine, switched by the flags of its
``ExpectOutgoing``/``InjectSubscale`` messages; the core (``engine.task.core``) only stores,
schedules and processes. As in Flink's ``BarrierHandlerState`` + ``Controller``, the two sides
meet at two narrow interfaces: the core calls the participant only through
``engine.task.migration_hooks.MigrationHooks``, and the participant acts on its task only
through ``TaskHost`` below. So a participant can be stepped against a small fake host, and nothing
in the engine imports ``migration``.

Format (what a participant takes):

* control messages: ``InjectSubscale`` (predecessor), ``ExpectOutgoing``, ``TriggerBarrier``,
  ``PullState`` (old owner), ``ExpectIncoming``, ``SubscaleTriggered``, ``MigrateState``
  (new owner), ``RefreshReplicas`` (owner), ``ReplicaUpdate``, ``DropReplicas`` (holder);
* channel events: ``ConfirmBarrier`` (on a data channel at the old owner, on the re-route
  channel at the new owner) and ``PauseBarrier`` (new owner);
* frames, while a migration runs or when they carry per-record ports (``step_frame``).

What it sends: ``SubscaleTriggered``, ``MigrateState``, ``PullState``, ``TriggerBarrier`` and
``ReplicaUpdate`` on the priority path; ``SubscaleDone`` as a report; re-routed records and
forwarded confirm barriers on the re-route channel.

Guarantees:

* Records of a group whose state has left are re-routed to the new owner in their input
  order; a confirm barrier is forwarded behind the records that preceded it.
* A record of an incoming group is processed only once the group's state is in and, unless
  it came re-routed, its predecessor's confirm came back through the old owner. Until then it
  is set aside per (channel, group), at most ``drrs_set_aside_cap`` records per task; a
  channel whose next record cannot be set aside, or whose watermark, barrier or end must
  follow set-aside records, waits (latency markers pass).
* Timers of a group on its way in or out do not fire here (held ones travel with the state).
  A record of an incoming group is judged (late or not) against the later of the old
  owner's watermark when the group froze there and the record's arrival watermark: this
  task's when it came on a direct channel, the old owner's when it came re-routed (the old
  owner puts its watermark on the re-route channel ahead of the records it re-routes once
  it advanced); once the group is active, against no earlier watermark than the old
  owner's while this task's own is behind it. Neither passes the watermark that preceded
  the record on its way, and a record late everywhere before it was sent is late at a new
  task too.
* Receivers take a group's outputs from the old owner before those from the new one: the
  old owner puts ``GroupLeft`` behind its last outputs of a group it gives away, the new
  owner ``GroupArrived`` ahead of its first (``engine.task.group_order``).
* No watermark passes a record still on its way: the old owner puts ``WatermarkHold`` on its
  output channels when a subscale's groups freeze (at its watermark then), the new owner
  ``WatermarkRelease`` once the subscale is done there, behind the outputs of its records
  and timers; receivers stay at or below the hold in between (``engine.time.event_time``).
* A group's state is shipped once: on the first trigger or pull (drrs), on its fetch or
  background pull (meces), or once every confirm is in (aligned protocols); to a holder of a
  replica at the group's last replicated version only the changes since.
* Meces (``ExpectIncoming.fetch_on_demand``): the new owner fetches a group (``PullState``)
  the first time one of its records finds the state missing, even before the old owner was
  triggered; a fetch that reaches the old owner before the subscale's first confirm starts
  the migration there with the fetched group. The rest follow in the background, one pull at
  a time while no fetch is in flight. A group never goes back: the old owner re-routes the
  records of a shipped group it still finds (as drrs) instead of fetching the state back.
* Record scheduling at the old owner (drrs, meces): a triggered subscale's confirm barrier
  already queued here behind records of other groups is taken ahead of them once every
  group with records in front of it has been pulled: those records are re-routed, in
  their order, the confirm forwarded behind them, and the other groups' records stay
  queued in their order. So a subscale waits for its own groups' backlog, not for the
  task to work through all its queued input. Never across a checkpoint or logic barrier,
  an order marker or the end of input (``_crossable``), nor on a channel a barrier or
  token blocks.
* While a migration runs through a task it runs about ``STEP_BUDGET_S`` of records per
  step (the rest of a frame waits as its channel's head), so its shell takes the
  migration's control messages (trigger, pulls, state) between slices, not after whole
  frames of slow records.
* The DRRS ablation (``migration.protocols.drrs.drrs_without``): with
  ``ExpectOutgoing.coupled`` the old owner freezes the groups on the first confirm and
  migrates on the last (no trigger), forwarding every confirm first; with
  ``ExpectIncoming.schedule_records`` off a record that must wait stops its channel (nothing
  set aside) and pulls follow the subscale's order, and with
  ``ExpectOutgoing.schedule_records`` off the old owner reaches confirms in input order.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from engine.dataflow.config import JobConfig
from engine.errors import ConfigError, StaleReplicaError, UnknownSubscaleError
from engine.names import SubscaleRole
from engine.state.keyed import KeyedStateBackend
from engine.task.channel import REROUTE_PORT, InputChannel, OutputRouter
from engine.task.core import (
    PartialFrame,
    Record,
    TaskControlError,
    TaskCore,
    TaskSpec,
)
from engine.task.inputs import InputSet
from engine.task.reply import Reply
from engine.time.clock import Clock
from engine.time.event_time import MIN_WATERMARK
from engine.wire.messages import (
    Ack,
    ConfirmBarrier,
    DropReplicas,
    ExpectIncoming,
    ExpectOutgoing,
    Frame,
    GroupArrived,
    GroupLeft,
    InjectSubscale,
    LatencyMarker,
    MigrateState,
    OutputChannel,
    PauseBarrier,
    PullState,
    RefreshReplicas,
    ReplicaAck,
    ReplicasRefreshed,
    ReplicaUpdate,
    SubscaleDone,
    SubscaleTriggered,
    TriggerBarrier,
    Watermark,
    WatermarkHold,
    WatermarkRelease,
    decode_frame,
    encode_frame,
)
from migration.replication import (
    ReplicaStore,
    ReplicationStats,
    migration_payload,
    refresh_replica,
)


class TaskHost(Protocol):
    """What a participant may use of its task, and all it may (``engine.task.host.CoreHost``
    is one). Everything the participant sends leaves through ``router`` (data channels, the
    re-route path), ``send_priority`` or ``report``."""

    @property
    def name(self) -> str:
        """The task's name (what other tasks address it by)."""

    @property
    def config(self) -> JobConfig:
        """The job's configuration (set-aside cap, whether live rescaling is on)."""

    @property
    def clock(self) -> Clock: ...

    @property
    def router(self) -> OutputRouter:
        """The task's output router: redirects, the re-route path, events on channels."""

    @property
    def inputs(self) -> InputSet:
        """The task's input channels, their unfinished heads and what blocks them (the old
        owner looks ahead in them for its subscales' confirm barriers)."""

    @property
    def backend(self) -> KeyedStateBackend | None:
        """The task's keyed state (None: not a keyed task, it holds no groups)."""

    @property
    def watermark(self) -> int:
        """The task's current watermark."""

    @property
    def suspended_s(self) -> float:
        """Seconds so far with records waiting and nothing processable (reports)."""

    def add_input(self, channel_id: int, port: int) -> None:
        """Open an input channel (nothing if open)."""

    def remove_input_if_idle(self, channel_id: int) -> bool:
        """Close an input with nothing queued, pending or parked; False if it has some."""

    def block_channel(self, channel_id: int, token: int) -> None:
        """Stop reading the channel until ``token`` is lifted."""

    def unblock_channels(self, token: int) -> None:
        """Lift ``token`` from every channel it blocks."""

    def run_records(self, records: list[Record]) -> None:
        """Process records now, in order, through the task's operators."""

    def guarded(self, fn: Callable[..., None], *args: Any) -> None:
        """Call ``fn``; a user function's error fails the task instead of raising."""

    def report(self, msg: Any) -> None:
        """Send ``msg`` to the JobMaster."""

    def send_priority(self, target: str, msg: Any) -> None:
        """Send ``msg`` to task ``target`` on the priority path (in order per target)."""

    def check_finish(self) -> None:
        """A migration ended here: the task finishes if its input ended meanwhile."""

    def hold_timers(self, held: Callable[[int], bool]) -> None:
        """From now on, timers of key groups for which ``held`` is true wait."""

    def release_timers(self, key_group: int) -> None:
        """The group's waiting timers may fire again."""

    def drop_held_timers(self, key_group: int) -> None:
        """Forget the group's waiting timers (they left with its state)."""

    def fire_event_timers(self) -> None:
        """Fire the event-time timers due at the watermark and process their output."""


def new_task_core(spec: TaskSpec, clock: Clock) -> TaskCore:
    """A task core with its migration participant attached (what the runtime deploys)."""
    core = TaskCore(spec, clock)
    core.attach(MigrationParticipant(core.host))
    return core


def _with_dropped(reply: ReplicasRefreshed, acks: Sequence[ReplicaAck]) -> ReplicasRefreshed:
    """A replica refresh's reply once its holders answered: the groups they dropped."""
    return dataclasses.replace(reply, dropped=tuple(a.key_group for a in acks if not a.kept))


def _waits_for_aside(event: Any) -> bool:
    """Whether a channel's event must wait until the records the channel had set aside
    before it are processed. Watermarks, barriers and end of input must (they order what
    follows them); a latency marker carries no obligation and passes: otherwise a marker
    (every 100 ms by default) would stop the channel for as long as an incoming group
    waits for its state and confirm, the sender would run out of credit on it, and every
    key the sender feeds would wait."""
    return event is not None and not isinstance(event, LatencyMarker)


# A migrating task runs about this many seconds of records per step, then lets its shell
# take control messages: a frame of slow records (1,000 at 2 ms: 2 s) would otherwise hold
# every pull, trigger and state install of the migration for as long.
STEP_BUDGET_S = 0.02


class _Slicer:
    """How many records a step runs between looks at the clock: about half the step's
    budget by the cost per record measured so far (``MIN_CHUNK`` at first, at most
    ``MAX_CHUNK``), so cheap records keep whole frames and slow ones a few per step."""

    MIN_CHUNK = 8
    MAX_CHUNK = 1 << 16

    def __init__(self, now: Callable[[], float]) -> None:
        self.now = now
        self.chunk = self.MIN_CHUNK
        self._t0 = self._mark = 0.0

    def start(self) -> None:
        self._t0 = self._mark = self.now()

    def spent(self) -> bool:
        """A chunk of ``chunk`` records ran: adapt the chunk; True once the step used its
        budget."""
        now = self.now()
        per = (now - self._mark) / self.chunk
        self.chunk = (self.MAX_CHUNK if per <= 0 else
                      max(self.MIN_CHUNK, min(self.MAX_CHUNK, int(STEP_BUDGET_S / 2 / per))))
        self._mark = now
        return now - self._t0 >= STEP_BUDGET_S


def _crossable(event: Any) -> bool:
    """Whether records of a subscale's groups queued behind ``event`` at their old owner may
    be re-routed before the owner reaches it. A latency marker carries no obligation; a
    watermark concerns this task's own groups (the leaving ones froze at their first
    barrier, and their new owner judges their records against no later watermark than this
    task's when it re-routes them); another subscale's
    confirm concerns other groups. Not a checkpoint or logic barrier (records behind it
    belong to the next epoch), nor an order marker, pause or end of input."""
    return event is None or type(event) in (LatencyMarker, Watermark, ConfirmBarrier)


# ---------------------------------------------------------------------- old owner


@dataclass
class _Outgoing:
    subscale_id: int
    key_groups: tuple[int, ...]
    new_owner: str
    reroute_channel: int
    predecessors: int  # how many confirms to expect
    aligned: bool = False  # ship once every confirm is in (no re-routing)
    block: bool = False  # and do not read a channel after its confirm until then
    coupled: bool = False  # drrs without decoupled barriers: migrate on the last confirm
    schedule_records: bool = True  # drrs: its confirms may be taken ahead (_expedite)
    confirms: set[int] = field(default_factory=set)
    migrated: bool = False  # triggered (drrs): its groups may be pulled
    pulled: set[int] = field(default_factory=set)
    rerouted: int = 0


class OldOwnerRole:
    """The old owner's side of every subscale it gives groups away in.

    ``migrated_out[kg]`` is the re-route channel of a group whose state has left; records of
    it found in the input go there.
    """

    def __init__(self) -> None:
        self.subscales: dict[int, _Outgoing] = {}
        self.migrated_out: dict[int, int] = {}
        self.finished: set[int] = set()

    def expect(self, subscale_id: int, key_groups: tuple[int, ...], new_owner: str,
               reroute_channel: int, predecessors: int, aligned: bool = False,
               block: bool = False, coupled: bool = False,
               schedule_records: bool = True) -> None:
        if subscale_id not in self.subscales:
            self.subscales[subscale_id] = _Outgoing(
                subscale_id, tuple(key_groups), new_owner, reroute_channel, predecessors,
                aligned, block, coupled, schedule_records=schedule_records)

    def should_migrate(self, subscale_id: int) -> bool:
        """True exactly once per subscale: on its first trigger or confirm barrier. A trigger
        that arrives after the subscale finished (its confirms came first) is ignored."""
        if subscale_id in self.finished:
            return False
        out = self.subscales.get(subscale_id)
        if out is None:
            raise UnknownSubscaleError(
                f"barrier of unknown subscale {subscale_id}: the old owner must get its "
                "ExpectOutgoing before any predecessor is told to inject the subscale")
        if out.migrated:
            return False
        out.migrated = True
        return True

    def mark_migrated(self, subscale_id: int, key_group: int) -> None:
        self.migrated_out[key_group] = self.subscales[subscale_id].reroute_channel

    def on_confirm(self, subscale_id: int, direct_channel: int) -> bool:
        """Record a predecessor's confirm; True when it was the last one of the subscale."""
        out = self.subscales[subscale_id]
        out.confirms.add(direct_channel)
        return len(out.confirms) >= out.predecessors

    def first_push(self, subscale_id: int, sizes: dict[int, int]) -> int:
        """The group to send unasked on the trigger: the smallest state, then the subscale's
        order (the new owner's own order when no records wait yet)."""
        kgs = self.subscales[subscale_id].key_groups
        return min(kgs, key=lambda kg: (sizes.get(kg, 0), kgs.index(kg)))

    def can_pull(self, subscale_id: int, key_group: int) -> bool:
        out = self.subscales.get(subscale_id)
        return (out is not None and out.migrated and key_group in out.key_groups
                and key_group not in out.pulled)

    def done(self, subscale_id: int) -> bool:
        """Every confirm in and (drrs) every group pulled."""
        out = self.subscales[subscale_id]
        return (len(out.confirms) >= out.predecessors
                and (out.aligned or len(out.pulled) == len(out.key_groups)))

    def finish(self, subscale_id: int) -> _Outgoing:
        out = self.subscales.pop(subscale_id)
        self.finished.add(subscale_id)
        for kg in out.key_groups:
            self.migrated_out.pop(kg, None)
        return out

    @property
    def active(self) -> bool:
        return bool(self.subscales)


# ---------------------------------------------------------------------- new owner


@dataclass
class _Incoming:
    subscale_id: int
    key_groups: tuple[int, ...]
    direct_channels: frozenset[int]
    reroute_channel: int
    confirm_needed: bool = True
    old_owner: str = ""
    confirms: set[int] = field(default_factory=set)
    state_in: set[int] = field(default_factory=set)
    sizes: dict[int, int] = field(default_factory=dict)
    requested: set[int] | None = None  # None until the old owner was triggered
    fetch_on_demand: bool = False  # meces: fetch a group on its first record that must wait
    fetched: set[int] = field(default_factory=set)  # meces: asked for by a record
    schedule_records: bool = True  # False: a record that must wait stops its channel
    bytes_in: int = 0
    chunk_bytes: int = 0  # state that may be in flight beyond one group


class NewOwnerRole:
    """The new owner's side: which incoming groups may be processed from which channel, and
    the set-aside buffers of records that may not yet.

    A record of incoming group g arriving on channel c is *ready* when g's state is in and,
    unless c is g's re-route channel, c's predecessor confirmed (its confirm came back
    through the old owner).
    """

    def __init__(self, cap: int = 200) -> None:
        if cap < 1:
            raise ConfigError(f"drrs_set_aside_cap must be >= 1 record, got {cap}")
        self.cap = cap
        self.subscales: dict[int, _Incoming] = {}
        self.group_subscale: dict[int, int] = {}
        self.group_watermark: dict[int, int] = {}
        # (channel, group) -> (value, timestamp, key, port, arrival watermark) in order
        self.aside: dict[tuple[int, int], list[tuple[Any, int, Any, int, int]]] = {}
        self.aside_count = 0

    def expect(self, subscale_id: int, key_groups: tuple[int, ...],
               direct_channels: tuple[int, ...], reroute_channel: int,
               confirm_needed: bool = True, old_owner: str = "", chunk_bytes: int = 0,
               fetch_on_demand: bool = False, schedule_records: bool = True) -> None:
        if subscale_id in self.subscales:
            return
        self.subscales[subscale_id] = _Incoming(
            subscale_id, tuple(key_groups), frozenset(direct_channels), reroute_channel,
            confirm_needed, old_owner, chunk_bytes=chunk_bytes,
            fetch_on_demand=fetch_on_demand, schedule_records=schedule_records)
        for kg in key_groups:
            self.group_subscale[kg] = subscale_id

    def on_triggered(self, subscale_id: int, sizes: dict[int, int], pushed: int = -1) -> None:
        """The old owner was triggered; ``pushed``: a group it sends unasked (counts as
        pulled, so the next pull waits for it)."""
        inc = self.subscales[subscale_id]
        if inc.requested is None:
            inc.requested = {pushed} if pushed in inc.key_groups else set()
            inc.sizes = dict(sizes)

    def fetch(self, key_group: int) -> tuple[int, str] | None:
        """Meces: a record of incoming ``key_group`` must wait; the (subscale, old owner) to
        fetch the group from now, or None (not fetch-on-demand, or its state is here or
        already asked for: each group is asked for once)."""
        sid = self.group_subscale.get(key_group)
        if sid is None:
            return None
        inc = self.subscales[sid]
        if (not inc.fetch_on_demand or key_group in inc.state_in or key_group in inc.fetched
                or (inc.requested is not None and key_group in inc.requested)):
            return None
        inc.fetched.add(key_group)
        return sid, inc.old_owner

    def next_pull(self, subscale_id: int) -> int | None:
        """The group to pull next, or None (not triggered yet, all pulled, or the pulls on
        their way hold the subscale's ``chunk_bytes``): the one with the most records set
        aside, then the smallest state, then the subscale's order. With ``chunk_bytes`` 0
        one pull at a time, so the order can follow the records as they arrive; otherwise
        further groups while the state in flight (by the old owner's sizes) stays within
        ``chunk_bytes`` beyond one group (``migration.pacing``)."""
        inc = self.subscales.get(subscale_id)
        if inc is None or inc.requested is None:
            return None
        asked = inc.requested | inc.fetched
        in_flight = [kg for kg in asked if kg not in inc.state_in]
        left = [kg for kg in inc.key_groups if kg not in asked]
        if not left or (in_flight and not inc.chunk_bytes):
            return None
        waiting = {kg: 0 for kg in left}
        for (_, kg), recs in self.aside.items():
            if kg in waiting and inc.schedule_records:
                waiting[kg] += len(recs)
        best = min(left, key=lambda kg: (-waiting[kg], inc.sizes.get(kg, 0),
                                         inc.key_groups.index(kg)))
        if in_flight:
            flying = sum(inc.sizes.get(kg, 0) for kg in in_flight)
            if flying - max(inc.sizes.get(kg, 0) for kg in in_flight) \
                    + inc.sizes.get(best, 0) > inc.chunk_bytes:
                return None
        inc.requested.add(best)
        return best

    def incoming(self, key_group: int) -> bool:
        return key_group in self.group_subscale

    def ready(self, channel: int, key_group: int) -> bool:
        sid = self.group_subscale.get(key_group)
        if sid is None:
            return True
        inc = self.subscales[sid]
        if key_group not in inc.state_in:
            return False
        return (not inc.confirm_needed or channel == inc.reroute_channel
                or channel in inc.confirms)

    def on_state(self, subscale_id: int, key_group: int, size: int, watermark: int) -> None:
        inc = self.subscales[subscale_id]
        inc.state_in.add(key_group)
        inc.bytes_in += size
        self.group_watermark[key_group] = watermark

    def on_confirm(self, subscale_id: int, direct_channel: int) -> None:
        self.subscales[subscale_id].confirms.add(direct_channel)

    def activatable(self, subscale_id: int) -> list[int]:
        """Groups of the subscale that are now active (state in, every confirm arrived)."""
        inc = self.subscales[subscale_id]
        if inc.confirm_needed and not inc.direct_channels <= inc.confirms:
            return []
        return [kg for kg in inc.key_groups
                if kg in inc.state_in and self.group_subscale.get(kg) == subscale_id]

    def activate(self, key_group: int) -> None:
        self.group_subscale.pop(key_group, None)
        self.group_watermark.pop(key_group, None)

    def subscale_done(self, subscale_id: int) -> bool:
        inc = self.subscales[subscale_id]
        return all(kg not in self.group_subscale for kg in inc.key_groups)

    def finish(self, subscale_id: int) -> _Incoming:
        return self.subscales.pop(subscale_id)

    # -- set-aside buffers
    def can_set_aside(self, key_group: int = -1) -> bool:
        """Whether a record of incoming ``key_group`` that must wait may be set aside: the
        cap allows it and its subscale schedules records (-1: any group)."""
        sid = self.group_subscale.get(key_group)
        if sid is not None and not self.subscales[sid].schedule_records:
            return False
        return self.aside_count < self.cap

    def set_aside(self, channel: int, key_group: int, value: Any, timestamp: int, key: Any,
                  port: int = 0, arrival_watermark: int = MIN_WATERMARK) -> None:
        """``arrival_watermark``: the watermark the record is judged against when it runs
        (see ``MigrationParticipant.user_watermark``)."""
        self.aside.setdefault((channel, key_group), []).append(
            (value, timestamp, key, port, arrival_watermark))
        self.aside_count += 1

    def has_aside(self, channel: int) -> bool:
        return any(c == channel for c, _ in self.aside)

    def has_aside_for(self, channel: int, key_group: int) -> bool:
        return (channel, key_group) in self.aside

    def releasable(self) -> list[tuple[int, int]]:
        """Set-aside units whose records are ready now."""
        return [(c, kg) for (c, kg) in self.aside if self.ready(c, kg)]

    def release(self, channel: int, key_group: int) -> list[tuple[Any, int, Any, int, int]]:
        records = self.aside.pop((channel, key_group), [])
        self.aside_count -= len(records)
        return records

    @property
    def active(self) -> bool:
        return bool(self.subscales)


# ---------------------------------------------------------------------- the participant


class MigrationParticipant:
    """One task's migration behaviour: the ``engine.task.migration_hooks.MigrationHooks`` of
    its core, acting on it only through ``TaskHost``. ``old_role``/``new_role`` hold the subscales this task
    gives away / takes; ``replicas`` the replicas it holds for other owners;
    ``replication_stats`` the cost of replicating its own groups."""

    def __init__(self, host: TaskHost) -> None:
        self.host = host
        self.old_role = OldOwnerRole()
        self.new_role = NewOwnerRole(host.config.drrs_set_aside_cap)
        self.replicas = ReplicaStore()
        self.replication_stats = ReplicationStats()
        self._reroute_channels: dict[int, OutputChannel] = {}
        self._state_sent: dict[int, int] = {}
        self._replicas_at_new: dict[int, dict[int, int]] = {}  # subscale -> kg -> version
        self._trigger_at: dict[int, float] = {}
        # old owner: groups of a triggered subscale -> the watermark at its first barrier
        self._leaving: dict[int, int] = {}
        self._frozen: set[int] = set()  # subscales whose groups froze here (old owner)
        self._slicer = _Slicer(host.clock.monotonic)
        self.confirms_ahead = 0  # confirms taken ahead of other groups' records (old owner)
        # old owner: queued frames decoded while looking for confirms, by (channel, seq)
        self._decoded: dict[tuple[int, int], tuple[bytes, PartialFrame]] = {}
        # old owner: re-route channel -> the watermark last put on it ahead of its records
        self._stamped: dict[int, int] = {}
        # new owner: re-route input channel -> the old owner's watermark stamped on it
        self._reroute_wm: dict[int, int] = {}
        # new owner: the arrival watermark of the records running now (user_watermark)
        self._arrival_wm = MIN_WATERMARK
        # new owner: active groups -> the old owner's watermark when they left it, while
        # this task's own watermark is still behind it (a new task's, at first)
        self._floors: dict[int, int] = {}
        if host.config.live_rescaling:
            host.hold_timers(self._holds_timers)

    # ------------------------------------------------------------ MigrationHooks
    @property
    def active(self) -> bool:
        return bool(self.old_role.subscales) or bool(self.new_role.subscales)

    def handle(self, msg: Any) -> Any:
        match msg:
            case InjectSubscale():
                self._inject(msg)
                return Ack()
            case ExpectOutgoing(subscale=sid, key_groups=kgs, reroute=rc, predecessors=n,
                                aligned=aligned, block=block, replicas=replicas,
                                coupled=coupled, schedule_records=schedule):
                self.old_role.expect(sid, kgs, rc.target, rc.channel_id, n, aligned, block,
                                     coupled, schedule)
                if replicas:
                    self._replicas_at_new[sid] = dict(replicas)
                self._reroute_channels[sid] = rc
                return Ack()
            case ExpectIncoming(subscale=sid, key_groups=kgs, direct_channels=dcs,
                                reroute_channel=rcid, confirm_needed=confirm_needed,
                                old_owner=old_owner, chunk_bytes=chunk,
                                fetch_on_demand=on_demand, schedule_records=schedule):
                self.new_role.expect(sid, kgs, dcs, rcid, confirm_needed, old_owner, chunk,
                                     on_demand, schedule)
                if confirm_needed:
                    self.host.add_input(rcid, REROUTE_PORT)
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
                if sid in self.old_role.subscales and self.old_role.should_migrate(sid):
                    self._migrate_out(sid, kg)  # meces: a fetch before the first barrier
                else:
                    self._on_pull(sid, kg)
                return Ack()
            case RefreshReplicas(targets=targets):
                return self._refresh_replicas(targets)
            case ReplicaUpdate(key_group=kg, version=v, data=data, is_delta=is_delta):
                try:
                    self.replicas.update(kg, v, data, is_delta, self.host.clock.now())
                except StaleReplicaError:
                    self.replicas.drop(kg)
                    return ReplicaAck(kg, False)
                return ReplicaAck(kg, True)
            case DropReplicas(key_groups=kgs):
                for kg in kgs:
                    self.replicas.drop(kg)
                return Ack()
            case _:
                raise TaskControlError(f"task {self.host.name}: unknown control message "
                                       f"{msg!r}; neither the task core nor its migration "
                                       "participant takes it")

    def control(self, msg: Any) -> Reply:
        """``handle``'s reply with its effects: a replica refresh is complete once every
        holder answered its update (``ReplicasRefreshed.dropped``: groups a holder refused)."""
        reply = self.handle(msg)
        if type(msg) is RefreshReplicas:
            return Reply(reply, then=partial(_with_dropped, reply))
        return Reply(reply)

    def on_event(self, ch: InputChannel, event: Any) -> None:
        match event:
            case Watermark(timestamp=t) if ch.port == REROUTE_PORT:
                # the old owner's watermark when it re-routed the records that follow
                if t > self._reroute_wm.get(ch.channel_id, MIN_WATERMARK):
                    self._reroute_wm[ch.channel_id] = t
            case ConfirmBarrier(subscale=sid, direct_channel=dc):
                if ch.port == REROUTE_PORT:
                    self._confirm_at_new_owner(sid, dc)
                else:
                    self._confirm_at_old_owner(sid, dc, ch.channel_id)
            case PauseBarrier(subscale=sid):
                if sid in self.new_role.subscales:  # not yet installed: pause the channel
                    self.host.block_channel(ch.channel_id, sid)
            case _:
                raise TaskControlError(f"task {self.host.name}: unsupported channel event "
                                       f"{event!r} on channel {ch.channel_id}")

    def step_frame(self, ch: InputChannel, frame: PartialFrame) -> bool:
        """Re-route records of migrated-out groups, set aside records of incoming groups that
        are not ready (while the cap allows), process the rest; at most about
        ``STEP_BUDGET_S`` of records at a time (the rest waits as the channel's head)."""
        cid = ch.channel_id
        if self._expediting():
            self._expedite((cid, frame))
        old, nr = self.old_role, self.new_role
        values, tss, keys, kgs, ports = (frame.values, frame.timestamps, frame.keys, frame.kgs,
                                         frame.ports)
        n = len(values)
        ready: list[Record] = []
        pos = frame.pos
        arrival = (self._reroute_wm.get(cid, MIN_WATERMARK) if ch.port == REROUTE_PORT
                   else self.host.watermark)
        slicer = self._slicer
        slicer.start()
        while pos < n:
            if len(ready) >= slicer.chunk:
                frame.pos = pos
                self._run_arrived(ready, arrival)
                ready = []
                if slicer.spent():
                    break
            if kgs is None:  # not a keyed input: nothing migrates
                ready.extend((values[j], tss[j], None, -1, ch.port) for j in range(pos, n))
                pos = n
                break
            assert keys is not None  # a keyed input's frames carry keys with their groups
            kg = kgs[pos]
            port = ports[pos] if ports is not None else ch.port
            rc = old.migrated_out.get(kg)
            if rc is not None:
                self._reroute(rc, values[pos], tss[pos], keys[pos], kg, port)
            elif nr.incoming(kg) and not nr.ready(cid, kg):
                if not nr.can_set_aside(kg):
                    self._fetch(kg)
                    break
                self._fetch(kg)
                nr.set_aside(cid, kg, values[pos], tss[pos], keys[pos], port, arrival)
            else:
                ready.append((values[pos], tss[pos], keys[pos], kg, port))
            pos += 1
        frame.pos = pos
        self._run_arrived(ready, arrival)
        return not (pos < n or (_waits_for_aside(frame.event) and nr.has_aside(cid)))

    def can_progress(self, channel_id: int, frame: PartialFrame) -> bool:
        """A parked frame can go on unless its next record must wait and cannot be set
        aside, or only its event is left, it must wait for the channel's records set aside,
        and the channel has some."""
        nr = self.new_role
        if frame.pos < len(frame.values):
            kg = frame.kgs[frame.pos] if frame.kgs is not None else -1
            return not (nr.incoming(kg) and not nr.ready(channel_id, kg)
                        and not nr.can_set_aside(kg))
        return not (_waits_for_aside(frame.event) and nr.has_aside(channel_id))

    def user_watermark(self, watermark: int) -> int:
        """For a group still arriving, the watermark its record is judged against (late or
        not, a window fired already or not): the later of the old owner's watermark when
        the group left it (its first barrier there) and the record's arrival watermark
        (this task's when the record arrived on a direct channel; the old owner's stamped
        ahead of it when it came re-routed). Neither passes the watermark that preceded the
        record on its path, so a record on time stays on time; a record that was late
        everywhere before it was sent is late here too, even when this task is new and its
        own watermark has not caught up (a scale-out lost late records to windows). Once
        the group is active, no earlier than the old owner's watermark while this task's is
        behind it. Timers of an arriving group do not fire here until it is active
        (``_holds_timers``)."""
        b = self.host.backend
        if b is None:
            return watermark
        floor = self.new_role.group_watermark.get(b.current_group)
        if floor is not None:
            return max(floor, self._arrival_wm)
        if self._floors:
            floor = self._floors.get(b.current_group)
            if floor is not None:
                if watermark < floor:
                    return floor
                del self._floors[b.current_group]
        return watermark

    def _run_arrived(self, records: list[Record], arrival: int) -> None:
        """Run ``records`` that arrived at ``arrival`` (``user_watermark``)."""
        if not records:
            return
        self._arrival_wm = arrival
        try:
            self.host.run_records(records)
        finally:
            self._arrival_wm = MIN_WATERMARK

    def _reroute(self, channel_id: int, value: Any, timestamp: int, key: Any, kg: int,
                 port: int) -> None:
        """Re-route one record, behind this task's watermark when it advanced since the
        channel's last one: the new owner judges the record against it (``user_watermark``)."""
        wm = self.host.watermark
        if wm > self._stamped.get(channel_id, MIN_WATERMARK):
            self._stamped[channel_id] = wm
            self.host.router.reroute_event(channel_id, Watermark(wm))
        self.host.router.reroute(channel_id, value, timestamp, key, kg, port)

    def describe(self) -> list[str]:
        parts = []
        for sid, out in self.old_role.subscales.items():
            parts.append(f"out {sid} groups {list(out.key_groups)} confirms "
                         f"{len(out.confirms)}/{out.predecessors} triggered {out.migrated} "
                         f"pulled {sorted(out.pulled)}")
        for sid, inc in self.new_role.subscales.items():
            parts.append(f"in {sid} groups {list(inc.key_groups)} state in {sorted(inc.state_in)} "
                         f"confirms {len(inc.confirms)}/{len(inc.direct_channels)}"
                         f"{'' if inc.confirm_needed else ' (not needed)'}"
                         f"{f' fetched {sorted(inc.fetched)}' if inc.fetch_on_demand else ''}")
        if self.new_role.aside_count:
            parts.append(f"{self.new_role.aside_count} records set aside")
        return parts

    # ------------------------------------------------------------ timers
    def _holds_timers(self, kg: int) -> bool:
        """Timers of a group on its way in wait for it to become active; those of a group on
        its way out never fire here: records of it behind the subscale's barrier went to the
        new owner, so a timer firing here would miss them. Held timers travel with the state."""
        return kg in self._leaving or self.new_role.incoming(kg)

    def _freeze_leaving(self, sid: int) -> None:
        """The subscale's first barrier here: its groups' timers stop firing, and the
        receivers are held at this watermark until the new owner has processed everything
        of the subscale (it may have sent a later watermark already, and records of the
        groups may still reach it re-routed or set aside)."""
        if sid in self._frozen:
            return
        self._frozen.add(sid)
        wm = self.host.watermark
        for kg in self.old_role.subscales[sid].key_groups:
            self._leaving.setdefault(kg, wm)
        self.host.router.broadcast(WatermarkHold(sid, wm))

    def _backend(self) -> KeyedStateBackend:
        b = self.host.backend
        if b is None:
            raise TaskControlError(f"task {self.host.name} is not keyed; it holds no key "
                                   "groups to migrate (a subscale must name keyed tasks)")
        return b

    # ------------------------------------------------------------ predecessor
    def _inject(self, msg: InjectSubscale) -> None:
        """Re-route the subscale's groups, confirm on the old channels, trigger."""
        router = self.host.router
        edge = next(e for e in router.edges if e.edge_id == msg.edge_id)
        direct = edge.channels[msg.new_index]
        for oc in router.redirect(msg.edge_id, msg.key_groups, msg.new_index):
            router.send_event_to({oc.channel_id}, ConfirmBarrier(msg.subscale, direct.channel_id))
            if msg.trigger:
                self.host.send_priority(oc.target, TriggerBarrier(msg.subscale))
        if msg.pause_new:
            router.send_event_to({direct.channel_id}, PauseBarrier(msg.subscale))

    # ------------------------------------------------------------ old owner
    def _migrate_out(self, sid: int, fetched: int | None = None) -> None:
        """First barrier of the subscale (drrs, meces), or its first fetch (meces,
        ``fetched``: that group goes first): the new owner may pull the groups."""
        out = self.old_role.subscales[sid]
        self._trigger_at[sid] = self.host.clock.now()
        self._freeze_leaving(sid)
        self.host.router.open_reroute(self._reroute_channels[sid])
        b = self._backend()
        sizes = tuple((kg, b.estimated_group_bytes(kg)) for kg in out.key_groups)
        first = (fetched if fetched in out.key_groups
                 else self.old_role.first_push(sid, dict(sizes)))
        self.host.send_priority(out.new_owner, SubscaleTriggered(sid, sizes, first))
        self._state_sent[sid] = 0
        self._on_pull(sid, first)  # two hops sooner than a pull; the priority path keeps order

    def _on_pull(self, sid: int, kg: int) -> None:
        """The new owner pulls one group; from now on its records found in the input are
        re-routed."""
        if not self.old_role.can_pull(sid, kg):
            return
        out = self.old_role.subscales[sid]
        self.host.router.flush_all()  # this task's earlier outputs of the group go first
        msg = self._take_group(sid, kg)
        out.pulled.add(kg)
        self.old_role.mark_migrated(sid, kg)
        self.host.send_priority(out.new_owner, msg)
        self._state_sent[sid] += len(msg.state)
        self._finish_outgoing(sid)
        self._expedite()  # its records queued here may go now, and with them a confirm

    def _finish_outgoing(self, sid: int) -> None:
        """Drrs: every confirm forwarded and every group pulled."""
        if not self.old_role.done(sid):
            return
        out = self.old_role.subscales[sid]
        router = self.host.router
        router.close_reroute(out.reroute_channel)
        self._stamped.pop(out.reroute_channel, None)
        self.old_role.finish(sid)
        self._frozen.discard(sid)
        self._reroute_channels.pop(sid, None)
        self._replicas_at_new.pop(sid, None)
        self.host.report(SubscaleDone(
            self.host.name, sid, SubscaleRole.OLD.value, self._state_sent.pop(sid, 0),
            router.rerouted_by.pop(out.reroute_channel, 0),
            self._trigger_at.pop(sid, 0.0), self.host.suspended_s))
        self.host.check_finish()

    def _ship_aligned(self, sid: int) -> None:
        """Every confirm of the subscale in (no record of its groups can arrive any more):
        ship the groups' state, finish, read the held channels again."""
        self.host.router.flush_all()  # this task's earlier outputs of the groups go first
        out = self.old_role.finish(sid)
        self._frozen.discard(sid)
        sent = 0
        for kg in out.key_groups:
            msg = self._take_group(sid, kg)
            self.host.send_priority(out.new_owner, msg)
            sent += len(msg.state)
        self._reroute_channels.pop(sid, None)
        self._replicas_at_new.pop(sid, None)
        self.host.unblock_channels(sid)
        self.host.report(SubscaleDone(self.host.name, sid, SubscaleRole.OLD.value, sent, 0,
                                      self._trigger_at.pop(sid, 0.0), self.host.suspended_s))
        self.host.check_finish()

    def _take_group(self, sid: int, kg: int) -> MigrateState:
        """Snapshot and remove a group for its new owner: only the changes since the
        replica there when it holds one at the group's last replicated version."""
        b = self._backend()
        kind, data = migration_payload(b, kg, self._replicas_at_new.get(sid, {}).get(kg))
        # behind every output of the group sent from here (the callers flushed them)
        self.host.router.broadcast(GroupLeft(sid, kg))
        b.remove(kg)
        b.untrack(kg)
        self._floors.pop(kg, None)
        self.host.drop_held_timers(kg)  # they are in the state just taken
        # the new owner shows records set aside there no later watermark than the one
        # they followed: the watermark here when the subscale's first barrier came
        wm = self._leaving.pop(kg, self.host.watermark)
        return MigrateState(sid, kg, data, wm, kind)

    def _confirm_at_old_owner(self, sid: int, direct_channel: int, channel: int) -> None:
        out = self.old_role.subscales.get(sid)
        if out is not None and out.aligned:
            if sid not in self._trigger_at:  # the subscale's first barrier here
                self._trigger_at[sid] = self.host.clock.now()
                self._freeze_leaving(sid)
            if self.old_role.on_confirm(sid, direct_channel):
                self._ship_aligned(sid)
            elif out.block:
                self.host.block_channel(channel, sid)
            return
        if out is not None and out.coupled:
            self._confirm_coupled(sid, direct_channel)
            return
        if self.old_role.should_migrate(sid):
            self._migrate_out(sid)
        out = self.old_role.subscales[sid]
        self.host.router.reroute_event(out.reroute_channel, ConfirmBarrier(sid, direct_channel))
        self.old_role.on_confirm(sid, direct_channel)
        self._finish_outgoing(sid)

    def _confirm_coupled(self, sid: int, direct_channel: int) -> None:
        """DRRS without decoupled barriers: the first confirm freezes the groups' timers
        and holds the receivers (as a first barrier does: records of the groups behind it
        on that channel went to the new owner); the last one starts the migration, then
        every confirm goes to the new owner, which pulls as in drrs. Nothing is re-routed:
        once every predecessor confirmed, no record of the groups comes here."""
        self._freeze_leaving(sid)
        if not self.old_role.on_confirm(sid, direct_channel):
            return
        out = self.old_role.subscales[sid]
        # the confirms first: the first group's shipping may finish the subscale here
        self.host.router.open_reroute(self._reroute_channels[sid])
        for dc in sorted(out.confirms):
            self.host.router.reroute_event(out.reroute_channel, ConfirmBarrier(sid, dc))
        if self.old_role.should_migrate(sid):
            self._migrate_out(sid)

    # ------------------------------------------------------------ old owner: record scheduling
    def _expediting(self) -> bool:
        """A triggered, decoupled subscale gives groups away here (its confirms may be
        taken ahead of the queue)."""
        return any(o.migrated and o.schedule_records and not o.aligned and not o.coupled
                   for o in self.old_role.subscales.values())

    def _expedite(self, current: tuple[int, PartialFrame] | None = None) -> None:
        """Old owner: take every triggered subscale's confirm barrier already queued here
        ahead of the records of other groups in front of it: the subscale's records in
        front of it are re-routed now, in their order, and the confirm forwarded behind
        them, as if this task had reached it; the other records stay queued, in their
        order. So a subscale waits for its own groups' backlog only, not for this task to
        work through every record queued before the barrier (DRRS's record scheduling at
        the old owner). Only once every group with records in front of the confirm has
        been pulled (they are re-routed, never run here), and never across what
        ``_crossable`` refuses or on a channel a barrier or token blocks. ``current``:
        (channel, frame) being stepped, taken from the channel (its records come first)."""
        if not self._expediting():
            self._decoded.clear()
            return
        inputs = self.host.inputs
        for cid, ch in list(inputs.channels.items()):
            if ch.port == REROUTE_PORT or not inputs.readable(cid):
                continue
            head = current[1] if current is not None and current[0] == cid \
                else inputs.heads.get(cid)
            while self._expedite_channel(ch, head):
                pass

    def _queued(self, ch: InputChannel) -> Iterator[tuple[int, PartialFrame]]:
        """The channel's queued frames, decoded (once: kept until taken), with their index."""
        cid, decoded = ch.channel_id, self._decoded
        first = ch.queue[0][0] if ch.queue else ch.next_seq
        for key in [k for k in decoded if k[0] == cid and k[1] < first]:
            del decoded[key]
        for i, (seq, payload) in enumerate(ch.queue):
            hit = decoded.get((cid, seq))
            if hit is None or hit[0] is not payload:
                hit = (payload, PartialFrame(decode_frame(payload)))
                decoded[(cid, seq)] = hit
            yield i, hit[1]

    def _expedite_channel(self, ch: InputChannel, head: PartialFrame | None) -> bool:
        """Take the first confirm of a triggered subscale queued on ``ch`` (``head``: its
        unfinished frame) if possible; True when one was taken."""
        ahead: list[tuple[int, PartialFrame]] = [] if head is None else [(-1, head)]
        frames = itertools.chain(ahead, self._queued(ch))
        seen: list[tuple[int, PartialFrame]] = []
        for qi, f in frames:
            seen.append((qi, f))
            ev = f.event
            if type(ev) is ConfirmBarrier:
                out = self.old_role.subscales.get(ev.subscale)
                if out is None or out.aligned or out.coupled:
                    return False
                if out.migrated and out.schedule_records:
                    return self._take_confirm(ch, ev, out, seen)
            elif not _crossable(ev):
                return False
        return False

    def _take_confirm(self, ch: InputChannel, cb: ConfirmBarrier, out: _Outgoing,
                      frames: list[tuple[int, PartialFrame]]) -> bool:
        """Re-route the subscale's records in ``frames`` (up to its confirm, the last) and
        handle the confirm now; False (nothing done) while one of them has a group still
        here, or when no record of another group is in front of the confirm (the task
        reaches it in its next steps anyway)."""
        moving = set(out.key_groups)
        gone = self.old_role.migrated_out
        others = False  # records of other groups in front: else this task is there already
        for _, f in frames:
            if f.kgs is None:
                return False
            for kg in f.kgs[f.pos:]:
                if kg not in moving:
                    others = True
                elif kg not in gone:
                    return False
        if not others:
            return False
        last = frames[-1][1]
        for qi, f in frames:
            kgs = f.kgs
            assert kgs is not None and f.keys is not None  # a keyed input (checked above)
            n = len(f.values)
            keep = [j for j in range(f.pos, n) if kgs[j] not in moving]
            if len(keep) < n - f.pos:
                for j in range(f.pos, n):
                    if kgs[j] in moving:
                        port = f.ports[j] if f.ports is not None else ch.port
                        self._reroute(out.reroute_channel, f.values[j], f.timestamps[j],
                                      f.keys[j], kgs[j], port)
                f.values = [f.values[j] for j in keep]
                f.timestamps = [f.timestamps[j] for j in keep]
                f.keys = [f.keys[j] for j in keep]
                f.kgs = [kgs[j] for j in keep]
                if f.ports is not None:
                    f.ports = [f.ports[j] for j in keep]
                f.pos = 0
            elif f is not last:
                continue
            if f is last:
                f.event = None
            if qi >= 0:  # a queued frame: queued again as it is now
                seq = ch.queue[qi][0]
                payload = encode_frame(Frame(f.values, f.timestamps, f.keys, f.kgs, f.event,
                                             f.ports))
                ch.queue[qi] = (seq, payload)
                self._decoded[(ch.channel_id, seq)] = (payload, f)
        self.confirms_ahead += 1
        self._confirm_at_old_owner(cb.subscale, cb.direct_channel, ch.channel_id)
        return True

    # ------------------------------------------------------------ new owner
    def _confirm_at_new_owner(self, sid: int, direct_channel: int) -> None:
        self.new_role.on_confirm(sid, direct_channel)
        self._release_and_activate(sid)

    def _install_incoming(self, msg: MigrateState) -> None:
        b = self._backend()
        if msg.kind == "delta":
            data = self.replicas.reload(msg.key_group, "delta", msg.state)
        else:
            self.replicas.drop(msg.key_group)
            data = msg.state
        b.install(msg.key_group, data)
        # ahead of every output of the group from here: receivers take the old owner's first
        self.host.router.broadcast(GroupArrived(msg.subscale, msg.key_group))
        self.new_role.on_state(msg.subscale, msg.key_group, len(msg.state), msg.watermark)
        self.host.guarded(self._release_and_activate, msg.subscale)
        self._pull_next(msg.subscale)

    def _release_and_activate(self, sid: int) -> None:
        nr, host = self.new_role, self.host
        for c, kg in nr.releasable():
            recs = nr.release(c, kg)
            i = 0
            while i < len(recs):  # in runs of one arrival watermark
                j = i
                while j < len(recs) and recs[j][4] == recs[i][4]:
                    j += 1
                self._run_arrived([(v, ts, k, kg, port) for v, ts, k, port, _ in recs[i:j]],
                                  recs[i][4])
                i = j
        activated = nr.activatable(sid)
        for kg in activated:
            floor = nr.group_watermark.get(kg, MIN_WATERMARK)
            if floor > host.watermark:
                self._floors[kg] = floor
            nr.activate(kg)
            host.release_timers(kg)
        if activated:
            host.fire_event_timers()
        if nr.subscale_done(sid):
            inc = nr.finish(sid)
            # behind the outputs of every record and timer of the subscale run here
            host.router.broadcast(WatermarkRelease(sid))
            host.unblock_channels(sid)
            host.remove_input_if_idle(inc.reroute_channel)
            self._reroute_wm.pop(inc.reroute_channel, None)
            host.report(SubscaleDone(host.name, sid, SubscaleRole.NEW.value, inc.bytes_in, 0, 0.0,
                                     host.suspended_s))
            host.check_finish()

    def _fetch(self, kg: int) -> None:
        """Meces: a record of ``kg`` must wait here; fetch the group unless asked already."""
        asked = self.new_role.fetch(kg)
        if asked is not None:
            self.host.send_priority(asked[1], PullState(asked[0], kg))

    def _pull_next(self, sid: int) -> None:
        """Ask for the next groups of the subscale (one at a time, or as many as its chunk
        of state in flight allows)."""
        kg = self.new_role.next_pull(sid)
        while kg is not None:
            self.host.send_priority(self.new_role.subscales[sid].old_owner, PullState(sid, kg))
            kg = self.new_role.next_pull(sid)

    # ------------------------------------------------------------ replication
    def _refresh_replicas(self, targets: tuple[tuple[int, str, int], ...]) -> ReplicasRefreshed:
        """Owner: the next refresh of each replicated group goes to its holder (priority
        path; the shell awaits the holders' acks before replying)."""
        b = self.host.backend
        stats = self.replication_stats
        before_bytes, before_cpu = stats.bytes_copied, stats.encode_cpu_s
        versions = []
        for kg, holder, held in targets:
            if b is None or kg not in b.groups:
                continue
            full = not (held >= 0 and b.is_tracked(kg) and held == b.version(kg))
            r = refresh_replica(b, kg, self.host.clock.monotonic, stats, full=full)
            self.host.send_priority(holder, ReplicaUpdate(kg, r.version, r.data, r.is_delta))
            versions.append((kg, r.version))
        return ReplicasRefreshed(tuple(versions), (), stats.bytes_copied - before_bytes,
                                 stats.encode_cpu_s - before_cpu)
