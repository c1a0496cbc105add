"""Unit tests for ``migration.participant``: the participant stepped against a fake host.

``FakeHost`` is a task as the participant sees it: the members of ``TaskHost`` and nothing
else, plus what a test reads back (``seen_*``). Each test plays one role of a subscale
(predecessor, old owner, new owner, replica holder) by handing the participant control
messages, channel events and frames, and checks what it did to its host. ``Recorder``
checks that the participant reaches its task only through ``TaskHost``. The last tests
check the core side of the boundary: ``TaskCore`` is a ``TaskHost``, a core without a
participant refuses migration, and its status travels as a plain string.
"""

from __future__ import annotations

from typing import Any

import pytest

from engine.api import StreamJob
from engine.dataflow.config import JobConfig
from engine.dataflow.deployment import initial_deployment
from engine.dataflow.physical import plan_physical
from engine.io.testing import TestingSink, TestingSource
from engine.state.keyed import KeyedStateBackend, delta_base_version
from engine.task.channel import REROUTE_PORT, InputChannel, OutputRouter
from engine.task.core import (
    RUNNING,
    MigrationHooks,
    NoMigration,
    PartialFrame,
    Record,
    TaskControlError,
    TaskCore,
    TaskSpec,
    TaskStatus,
)
from engine.task.host import CoreHost
from engine.task.inputs import InputSet
from engine.time.clock import ManualClock
from engine.time.event_time import MIN_WATERMARK
from engine.wire.messages import (
    Ack,
    ConfirmBarrier,
    DescribeTask,
    DropReplicas,
    ExpectIncoming,
    ExpectOutgoing,
    Frame,
    InjectSubscale,
    MigrateState,
    OutputChannel,
    OutputEdge,
    PauseBarrier,
    PullState,
    RefreshReplicas,
    ReplicaAck,
    ReplicasRefreshed,
    ReplicaUpdate,
    Start,
    SubscaleDone,
    SubscaleTriggered,
    TaskState,
    TriggerBarrier,
    Watermark,
    decode_frame,
    decode_message,
    encode_message,
)
from migration.participant import (
    MigrationParticipant,
    TaskHost,
    UnknownSubscaleError,
    new_task_core,
)
from tests.harness import make_spec

N = 8  # key groups
A, B, C = 3, 5, 6  # A and B move in the tests; C never does
RC = 90  # the re-route channel old owner "s" -> new owner "d"
RC_OUT = OutputChannel(RC, "d", REROUTE_PORT)


def _members(proto: type) -> set[str]:
    """The members a Protocol declares (methods, properties, annotated attributes)."""
    names = {n for n in vars(proto) if not n.startswith("_")}
    return names | set(getattr(proto, "__annotations__", {}))


TASK_HOST = _members(TaskHost)
HOOKS = _members(MigrationHooks)


class FakeHost:
    """The members of ``TaskHost`` and what the tests read back (``seen_*``)."""

    def __init__(self, name: str, *, cap: int = 200, live: bool = True,
                 groups: dict[int, dict[Any, int]] | None = None) -> None:
        self.name = name
        self.config = JobConfig(drrs_set_aside_cap=cap, live_rescaling=live, metrics_port=None)
        self.clock = ManualClock()
        self.router = OutputRouter(100, 0.0, N, {}, self.clock.monotonic)
        self.backend: KeyedStateBackend | None = KeyedStateBackend(N)
        for kg, table in (groups or {}).items():
            self.backend.own(kg)
            for key, value in table.items():
                self.backend.set_current(key, kg)
                self.backend.table("sum")[key] = value
        self.watermark = MIN_WATERMARK
        self.suspended_s = 0.0
        self.seen_inputs: dict[int, int] = {}
        self.seen_blocked: dict[int, set[int]] = {}
        self.seen_processed: list[Record] = []
        self.seen_reports: list[Any] = []
        self.seen_sent: list[tuple[str, Any]] = []
        self.seen_hold: Any = None
        self.seen_released: list[int] = []
        self.seen_dropped: list[int] = []
        self.seen_fired = 0
        self.seen_finish_checks = 0
        # no channels: the old owner finds no confirm queued ahead (tests/unit/test_drrs_ahead.py)
        self.inputs = InputSet(name, 64, lambda cid: cid in self.seen_blocked,
                               lambda cid, head: True)

    def add_input(self, channel_id: int, port: int) -> None:
        self.seen_inputs.setdefault(channel_id, port)

    def remove_input_if_idle(self, channel_id: int) -> bool:
        return self.seen_inputs.pop(channel_id, None) is not None

    def block_channel(self, channel_id: int, token: int) -> None:
        self.seen_blocked.setdefault(channel_id, set()).add(token)

    def unblock_channels(self, token: int) -> None:
        for cid in list(self.seen_blocked):
            self.seen_blocked[cid].discard(token)
            if not self.seen_blocked[cid]:
                del self.seen_blocked[cid]

    def run_records(self, records: list[Record]) -> None:
        self.seen_processed.extend(records)

    def guarded(self, fn: Any, *args: Any) -> None:
        fn(*args)

    def report(self, msg: Any) -> None:
        self.seen_reports.append(msg)

    def send_priority(self, target: str, msg: Any) -> None:
        self.seen_sent.append((target, msg))

    def check_finish(self) -> None:
        self.seen_finish_checks += 1

    def hold_timers(self, held: Any) -> None:
        self.seen_hold = held

    def release_timers(self, key_group: int) -> None:
        self.seen_released.append(key_group)

    def drop_held_timers(self, key_group: int) -> None:
        self.seen_dropped.append(key_group)

    def fire_event_timers(self) -> None:
        self.seen_fired += 1


class Recorder:
    """Passes every attribute through to the host and records its name."""

    def __init__(self, host: FakeHost) -> None:
        object.__setattr__(self, "_host", host)
        object.__setattr__(self, "used", set())

    def __getattr__(self, name: str) -> Any:
        self.used.add(name)
        return getattr(self._host, name)


def frame(kgs: list[int], *, event: Any = None, ports: list[int] | None = None,
          tag: str = "r") -> PartialFrame:
    """A keyed frame with one record per key group in ``kgs`` (value ``(tag, i)``)."""
    values = [(tag, i) for i in range(len(kgs))]
    return PartialFrame(Frame(values, [10 * i for i in range(len(kgs))],
                              [f"k{kg}" for kg in kgs], kgs, event, ports))


def sent(host: FakeHost, kind: type) -> list[Any]:
    return [m for _, m in host.seen_sent if isinstance(m, kind)]


def outbox(host: FakeHost, channel_id: int) -> list[Frame]:
    host.router.flush_all()
    return [decode_frame(f.payload) for f in host.router.outbox if f.channel_id == channel_id]


def group_of(state: bytes) -> dict[Any, Any]:
    b = KeyedStateBackend(N)
    b.install(0, state)
    return dict(b.groups[0].get("sum", {}))


# ====================================================================== old owner


def old_owner(**kw: Any) -> tuple[MigrationParticipant, FakeHost]:
    """Old owner "s" of A (3 keys) and B (1 key), expecting subscale 0 of both, drrs."""
    host = FakeHost("s", groups={A: {"a1": 1, "a2": 2, "a3": 3}, B: {"b1": 10}, C: {"c": 0}},
                    **kw)
    p = MigrationParticipant(host)
    assert p.handle(ExpectOutgoing(0, (A, B), RC_OUT, predecessors=1)) == Ack()
    return p, host


def test_trigger_sends_the_notice_and_the_smallest_group_unasked():
    p, host = old_owner()
    host.watermark = 7
    assert p.active
    assert p.handle(TriggerBarrier(0)) == Ack()
    [(to1, notice), (to2, state)] = host.seen_sent
    assert (to1, to2) == ("d", "d")
    assert isinstance(notice, SubscaleTriggered) and notice.pushed == B
    assert dict(notice.sizes)[A] > dict(notice.sizes)[B] > 0
    assert isinstance(state, MigrateState) and (state.subscale, state.key_group) == (0, B)
    assert group_of(state.state) == {"b1": 10} and state.watermark == 7
    assert B not in host.backend.groups and A in host.backend.groups
    assert host.seen_dropped == [B]
    # a second trigger of the same subscale does nothing
    p.handle(TriggerBarrier(0))
    assert len(host.seen_sent) == 2


def test_timers_of_leaving_groups_are_held_from_the_first_barrier():
    p, host = old_owner()
    held = host.seen_hold
    assert held is not None and not held(A) and not held(C)
    p.handle(TriggerBarrier(0))
    assert held(A) and not held(C)      # A leaves but is not pulled yet
    assert not held(B)                  # B left with its timers


def test_records_of_a_pulled_group_are_rerouted_and_the_rest_processed_here():
    p, host = old_owner()
    p.handle(TriggerBarrier(0))         # B is pushed at once
    ch = InputChannel(1, port=0)
    f = frame([B, A, C, B])
    assert p.step_frame(ch, f) is True and f.pos == 4
    assert [(r[0], r[3]) for r in host.seen_processed] == [(("r", 1), A), (("r", 2), C)]
    [rerouted] = outbox(host, RC)
    assert list(rerouted.values) == [("r", 0), ("r", 3)] and list(rerouted.ports) == [0, 0]


def test_rerouted_records_follow_the_old_owners_watermark_when_it_advanced():
    p, host = old_owner()
    p.handle(TriggerBarrier(0))         # B is pushed at once
    ch = InputChannel(1, port=0)
    host.watermark = 40
    p.step_frame(ch, frame([B, B], tag="x"))
    host.watermark = 50
    p.step_frame(ch, frame([B], tag="y"))
    out = outbox(host, RC)
    # the watermark ahead of the records re-routed under it, once per advance
    assert [(list(f.values), f.event) for f in out] == [
        ([], Watermark(40)), ([("x", 0), ("x", 1)], Watermark(50)), ([("y", 0)], None)]


def test_confirm_goes_behind_the_rerouted_records_and_the_last_pull_finishes():
    p, host = old_owner()
    p.handle(TriggerBarrier(0))
    ch = InputChannel(1, port=0)
    p.step_frame(ch, frame([B]))
    p.on_event(ch, ConfirmBarrier(0, 11))
    [fwd] = outbox(host, RC)
    assert list(fwd.values) == [("r", 0)] and fwd.event == ConfirmBarrier(0, 11)
    assert host.seen_reports == [] and p.active    # A not pulled yet
    p.handle(PullState(0, A))
    state = sent(host, MigrateState)[-1]
    assert state.key_group == A and group_of(state.state) == {"a1": 1, "a2": 2, "a3": 3}
    [done] = host.seen_reports
    assert isinstance(done, SubscaleDone) and (done.subscale, done.role) == (0, "old")
    assert done.rerouted == 1
    assert done.bytes == sum(len(m.state) for m in sent(host, MigrateState))
    assert host.seen_finish_checks == 1 and not p.active
    assert p.handle(TriggerBarrier(0)) == Ack() and len(host.seen_reports) == 1  # late: ignored


def test_a_barrier_of_an_unknown_subscale_is_an_error_naming_it():
    p, _ = old_owner()
    with pytest.raises(UnknownSubscaleError, match="unknown subscale 4"):
        p.handle(TriggerBarrier(4))


def test_aligned_ships_once_every_confirm_is_in_and_blocks_confirmed_channels():
    p, host = old_owner()
    p.handle(ExpectOutgoing(1, (C,), OutputChannel(91, "d", REROUTE_PORT), predecessors=2,
                            aligned=True, block=True))
    p.on_event(InputChannel(1), ConfirmBarrier(1, 11))
    assert host.seen_blocked == {1: {1}} and host.seen_sent == []
    p.on_event(InputChannel(2), ConfirmBarrier(1, 12))
    [state] = sent(host, MigrateState)
    assert (state.subscale, state.key_group) == (1, C) and C not in host.backend.groups
    assert host.seen_blocked == {} and host.router.rerouted == 0
    [done] = host.seen_reports
    assert (done.subscale, done.role, done.rerouted) == (1, "old", 0)


def test_a_fresh_replica_at_the_new_owner_gets_only_the_changes():
    p, host = old_owner()
    b = host.backend
    b.track_changes(A)
    version = b.mark_replicated(A)
    b.set_current("a1", A)
    b.table("sum")["a1"] = 100          # one key changed since the replica
    p.handle(ExpectOutgoing(2, (A,), OutputChannel(92, "d", REROUTE_PORT), predecessors=1,
                            aligned=True, replicas=((A, version),)))
    p.on_event(InputChannel(1), ConfirmBarrier(2, 11))
    [state] = sent(host, MigrateState)
    assert state.kind == "delta" and delta_base_version(state.state) == version


# ====================================================================== new owner


def new_owner(*, confirm_needed: bool = True, **kw: Any) -> tuple[MigrationParticipant, FakeHost]:
    """New owner "d" of A (subscale 0 from "s"), direct channel 1 from the predecessor."""
    host = FakeHost("d", **kw)
    p = MigrationParticipant(host)
    assert p.handle(ExpectIncoming(0, (A,), (1,), RC, confirm_needed, "s")) == Ack()
    return p, host


def test_expect_incoming_opens_the_reroute_input_and_holds_the_groups_timers():
    p, host = new_owner()
    assert host.seen_inputs == {RC: REROUTE_PORT}
    assert host.seen_hold(A) and not host.seen_hold(C)
    _, host2 = new_owner(confirm_needed=False)
    assert host2.seen_inputs == {}


def test_records_wait_for_the_state_and_the_confirm_through_the_old_owner():
    p, host = new_owner()
    direct, reroute = InputChannel(1, port=0), InputChannel(RC, port=REROUTE_PORT)
    f = frame([A, C, A], event=Watermark(5), tag="d")
    assert p.step_frame(direct, f) is False       # the watermark waits behind set-aside records
    assert [r[0] for r in host.seen_processed] == [("d", 1)]
    assert not p.can_progress(1, f)
    g = frame([A], ports=[0], tag="x")
    assert p.step_frame(reroute, g) is True
    state = KeyedStateBackend(N)
    state.own(A)
    state.set_current("k", A)
    state.table("sum")["k"] = 1
    p.handle(MigrateState(0, A, state.snapshot(A), watermark=3))
    assert host.backend.groups[A] == {"sum": {"k": 1}}
    # the re-routed record is ready at once; the direct ones wait for the confirm
    assert [r[0] for r in host.seen_processed] == [("d", 1), ("x", 0)]
    host.backend.set_current("k", A)
    # outside a record's run: the old owner's watermark when the group left it
    assert p.user_watermark(10) == 3 and p.user_watermark(2) == 3
    assert host.seen_reports == [] and host.seen_released == []
    p.on_event(reroute, ConfirmBarrier(0, 1))
    assert [r[0] for r in host.seen_processed] == [("d", 1), ("x", 0), ("d", 0), ("d", 2)]
    assert host.seen_released == [A] and host.seen_fired == 1
    assert p.can_progress(1, f) and p.user_watermark(10) == 10
    [done] = host.seen_reports
    assert (done.subscale, done.role, done.bytes) == (0, "new", len(state.snapshot(A)))
    assert host.seen_inputs == {} and not p.active and host.seen_finish_checks == 1


def test_records_of_an_arriving_group_are_judged_at_their_arrival_watermark():
    """A record of a group still arriving runs with the later of the old owner's watermark
    when the group left (3) and its arrival watermark: this task's when it came direct (7,
    though the task is at 20 by the time it runs), the old owner's stamped on the re-route
    channel (9). A task whose own watermark is behind (a new task) still finds a record
    late that was late everywhere."""
    p, host = new_owner()
    seen: list[tuple[Any, int]] = []

    def run_records(records: list[Record]) -> None:
        for r in records:
            host.backend.set_current(r[2], r[3])
            seen.append((r[0], p.user_watermark(host.watermark)))
    host.run_records = run_records  # type: ignore[method-assign]
    direct, reroute = InputChannel(1, port=0), InputChannel(RC, port=REROUTE_PORT)
    host.watermark = 7
    assert p.step_frame(direct, frame([A], tag="d")) is True          # set aside
    p.on_event(reroute, Watermark(9))
    assert p.step_frame(reroute, frame([A], ports=[0], tag="x")) is True  # set aside too
    host.watermark = 20
    state = KeyedStateBackend(N)
    state.own(A)
    p.handle(MigrateState(0, A, state.snapshot(A), watermark=3))
    assert seen == [(("x", 0), 9)]
    p.on_event(reroute, ConfirmBarrier(0, 1))
    assert seen == [(("x", 0), 9), (("d", 0), 7)]
    # active: the task's own watermark
    host.backend.set_current("k", A)
    assert p.user_watermark(20) == 20


def test_a_new_task_behind_the_old_owner_judges_at_the_old_owners_watermark():
    p, host = new_owner(confirm_needed=False)
    seen: list[int] = []

    def run_records(records: list[Record]) -> None:
        for r in records:
            host.backend.set_current(r[2], r[3])
            seen.append(p.user_watermark(host.watermark))
    host.run_records = run_records  # type: ignore[method-assign]
    state = KeyedStateBackend(N)
    state.own(A)
    p.handle(MigrateState(0, A, state.snapshot(A), watermark=30))
    assert host.watermark == MIN_WATERMARK        # nothing reached this task yet
    p.step_frame(InputChannel(1, port=0), frame([A]))
    assert seen == [30]


def test_the_set_aside_cap_stops_a_channel_and_other_groups_go_on():
    p, host = new_owner(cap=2)
    f = frame([A, A, A, C])
    assert p.step_frame(InputChannel(1), f) is False
    assert f.pos == 2 and p.new_role.aside_count == 2
    assert not p.can_progress(1, f)
    assert p.step_frame(InputChannel(2), frame([C, C], tag="o")) is True
    assert [r[0] for r in host.seen_processed] == [("o", 0), ("o", 1)]


def test_new_owner_pulls_the_group_with_most_waiting_records_first():
    host = FakeHost("d")
    p = MigrationParticipant(host)
    p.handle(ExpectIncoming(0, (A, B, C), (1,), RC, True, "s"))
    p.step_frame(InputChannel(1), frame([C, C, B]))
    p.handle(SubscaleTriggered(0, ((A, 1), (B, 1), (C, 1)), pushed=A))
    assert sent(host, PullState) == []            # one pull at a time: A is on its way
    empty = KeyedStateBackend(N)
    empty.own(A)
    p.handle(MigrateState(0, A, empty.snapshot(A), watermark=0))
    assert host.seen_sent[-1] == ("s", PullState(0, C))


def test_a_pause_barrier_stops_the_channel_until_the_state_is_in():
    p, host = new_owner(confirm_needed=False)
    p.on_event(InputChannel(1), PauseBarrier(0))
    assert host.seen_blocked == {1: {0}}
    p.on_event(InputChannel(2), PauseBarrier(7))  # not a subscale of this task: no pause
    assert host.seen_blocked == {1: {0}}
    empty = KeyedStateBackend(N)
    empty.own(A)
    p.handle(MigrateState(0, A, empty.snapshot(A), watermark=0))
    assert host.seen_blocked == {} and [d.role for d in host.seen_reports] == ["new"]


# ====================================================================== predecessor


def test_inject_redirects_confirms_on_the_old_channel_and_triggers_the_old_owner():
    host = FakeHost("u")
    channels = (OutputChannel(10, "s", 0), OutputChannel(11, "d", 0))
    host.router.connect([OutputEdge(0, "keyed", channels, (0,) * N)])
    p = MigrationParticipant(host)
    assert p.handle(InjectSubscale(0, 0, (A,), 1, trigger=True, pause_new=True)) == Ack()
    assert host.seen_sent == [("s", TriggerBarrier(0))]
    assert [f.event for f in outbox(host, 10)] == [ConfirmBarrier(0, 11)]
    assert [f.event for f in outbox(host, 11)] == [PauseBarrier(0)]
    assert not p.active                 # a predecessor takes part in no subscale itself


# ====================================================================== replicas


def test_holder_keeps_full_replicas_and_refuses_a_delta_it_cannot_apply():
    host = FakeHost("h")
    p = MigrationParticipant(host)
    owner = KeyedStateBackend(N)
    owner.own(A)
    assert p.handle(ReplicaUpdate(A, 1, owner.snapshot(A), False)) == ReplicaAck(A, True)
    assert p.replicas.version(A) == 1
    owner.track_changes(A)
    owner.mark_replicated(A)
    owner.set_current("k", A)
    owner.table("sum")["k"] = 5
    bad = owner.snapshot_delta(A)       # based on the owner's version, not on 1
    assert p.handle(ReplicaUpdate(A, 9, bad, True)) == ReplicaAck(A, False)
    assert p.replicas.version(A) is None
    p.handle(ReplicaUpdate(B, 1, owner.snapshot(A), False))
    assert p.handle(DropReplicas((B,))) == Ack() and len(p.replicas) == 0


def test_owner_refreshes_replicas_on_the_priority_path():
    p, host = old_owner()
    reply = p.handle(RefreshReplicas(((A, "h", -1), (7, "h", -1))))   # 7: not owned here
    assert isinstance(reply, ReplicasRefreshed) and reply.bytes > 0
    [(holder, update)] = host.seen_sent
    assert holder == "h" and update.key_group == A and not update.is_delta
    assert reply.versions == ((A, update.version),)


# ====================================================================== the boundary


def test_unknown_messages_and_events_are_refused_naming_the_task():
    p, _ = old_owner()
    with pytest.raises(TaskControlError, match="task s: unknown control message"):
        p.handle(Start())
    with pytest.raises(TaskControlError, match="task s: unsupported channel event"):
        p.on_event(InputChannel(1), Watermark(3))


def test_timers_are_not_held_when_live_rescaling_is_off():
    _, host = old_owner(live=False)
    assert host.seen_hold is None


def test_the_participant_reaches_its_task_only_through_task_host():
    used: set[str] = set()
    for role in ("old", "new", "predecessor"):
        host = FakeHost("t", groups={A: {"a": 1}, B: {"b": 2}})
        host.router.connect([OutputEdge(0, "keyed", (OutputChannel(10, "s", 0),
                                                     OutputChannel(11, "d", 0)), (0,) * N)])
        rec = Recorder(host)
        p = MigrationParticipant(rec)   # type: ignore[arg-type]
        if role == "old":
            p.handle(ExpectOutgoing(0, (A, B), RC_OUT, predecessors=1))
            p.handle(TriggerBarrier(0))
            p.step_frame(InputChannel(1), frame([A, B, C]))
            p.on_event(InputChannel(1), ConfirmBarrier(0, 11))
            p.handle(PullState(0, A))
            p.handle(PullState(0, B))   # one of the two was pushed: its pull does nothing
            p.handle(RefreshReplicas(((C, "h", -1),)))
        elif role == "new":
            host.backend.remove(A)
            p.handle(ExpectIncoming(0, (A,), (1,), RC, True, "s"))
            p.step_frame(InputChannel(1), frame([A, C]))
            empty = KeyedStateBackend(N)
            empty.own(A)
            p.handle(MigrateState(0, A, empty.snapshot(A), watermark=0))
            p.on_event(InputChannel(RC, REROUTE_PORT), ConfirmBarrier(0, 1))
            p.user_watermark(5)
        else:
            p.handle(InjectSubscale(0, 0, (A,), 1))
        assert not p.active
        used |= rec.used
    assert used <= TASK_HOST, used - TASK_HOST
    assert len(used) >= 15, used        # the scenarios reach most of the interface


def test_task_core_is_a_task_host_and_both_hooks_implement_migration_hooks():
    assert len(TASK_HOST) >= 15 and len(HOOKS) >= 7
    missing = {n for n in TASK_HOST if not hasattr(CoreHost, n)} - {  # the core's host
        "name", "clock", "router", "backend", "watermark", "suspended_s"}  # set in __init__
    assert missing == set()
    for hooks in (MigrationParticipant, NoMigration):
        assert {n for n in HOOKS if not hasattr(hooks, n)} == set(), hooks


def _spec(tmp_path: Any) -> TaskSpec:
    job = StreamJob("p", num_key_groups=N, config=JobConfig(metrics_port=None))
    (job.source(TestingSource([("a", 1)]), name="src").key_by(lambda r: r[0])
        .reduce(lambda x, y: x, name="sum").sink(TestingSink(str(tmp_path)), name="out"))
    dep = initial_deployment(plan_physical(job.graph()), "j")
    return make_spec(dep, "sum", 0, dep.tasks["sum"][0], job.config)


def test_a_core_without_participant_takes_stop_restart_only(tmp_path):
    core = TaskCore(_spec(tmp_path), ManualClock())
    assert isinstance(core.migration, NoMigration)
    with pytest.raises(TaskControlError, match="new_task_core"):
        core.handle(ExpectIncoming(0, (A,), (1,), RC, True, "s"))
    assert not hasattr(core, "new_role")  # the core knows no migration roles


def test_new_task_core_attaches_a_participant_once(tmp_path):
    core = new_task_core(_spec(tmp_path), ManualClock())
    assert isinstance(core.migration, MigrationParticipant)
    assert core.migration.host.core is core  # through the core's host
    with pytest.raises(TaskControlError, match="attached once"):
        core.attach(MigrationParticipant(core.host))
    assert core.handle(ExpectIncoming(0, (A,), (1,), RC, True, "s")) == Ack()
    assert core.inputs[RC].port == REROUTE_PORT


def test_task_status_is_a_str_enum_and_travels_as_its_string(tmp_path):
    core = new_task_core(_spec(tmp_path), ManualClock())
    core.handle(Start())
    assert core.status is TaskStatus.RUNNING and RUNNING is TaskStatus.RUNNING
    assert core.status == "running"
    reply = decode_message(encode_message(core.handle(DescribeTask())))
    assert isinstance(reply, TaskState) and reply.status == "running"
    assert type(reply.status) is str
