"""The task core's participants, each stepped against a small fake host, and the core's
dispatch by table with replies that carry their effects (``engine.task``):

* ``CheckpointParticipant`` (``engine.task.checkpointing``): declines before the task
  started or while key groups move, snapshots once aligned, forwards the barrier, commits
  a checkpoint's transactions (and earlier ones) only once it completed, hands over what no
  checkpoint committed, fails the task when a commit raises;
* ``LogicSwitch`` (``engine.task.logic``): switches at the aligned barrier, only to a
  staged function, forgets a discarded one;
* ``SourceHandover`` (``engine.task.handover``): new channels wait until the old ones end;
* ``Reply``/``Effects`` (``engine.task.reply``): what the shell does for each message;
* the shell (``engine.runtime.task_actor``) neither type-tests replies nor writes the
  core's fields (checked on its source).
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from engine.api import StreamJob
from engine.dataflow import graph as g
from engine.dataflow.config import JobConfig
from engine.dataflow.deployment import (
    ChannelIds,
    connect_messages,
    initial_deployment,
    start_messages,
)
from engine.dataflow.physical import plan_physical
from engine.errors import InternalError, TaskControlError
from engine.io.testing import TestingSink, TestingSource
from engine.state.keyed import KeyedStateBackend
from engine.task.checkpointing import CheckpointParticipant
from engine.task.core import CREATED, FAILED, RUNNING, TaskCore
from engine.task.handover import STOPPED_EFFECTS, SourceHandover
from engine.task.logic import LogicSwitch
from engine.task.reply import NO_EFFECTS, Effects, dispatch_table
from engine.time.clock import ManualClock
from engine.wire.messages import (
    Ack,
    AdoptTransactions,
    CheckpointAborted,
    CheckpointBarrier,
    CheckpointComplete,
    DiscardLogic,
    InjectLogicBarrier,
    LogicBarrier,
    LogicChanged,
    RefreshReplicas,
    ReleaseSource,
    RemoveOutputChannels,
    ReplaceOutputChannel,
    ReplicaAck,
    RestoreState,
    SourceReleased,
    StopTask,
    SwitchLogic,
    TriggerCheckpoint,
)
from migration.participant import new_task_core
from tests.harness import make_spec, wire

N = 8
ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------- fakes


class FakeChain:
    """The operator chain as the participants use it: transactions, commit, switch."""

    def __init__(self, backend: KeyedStateBackend | None = None, fail_commit: bool = False):
        self.backend = backend
        self.fail_commit = fail_commit
        self.began = self.closed = False
        self.flushes = 0
        self.committed: list[tuple[str, list[Any]]] = []
        self.prepared: list[tuple[str, Any]] = []
        self.switched: list[tuple[str, Any]] = []

    def begin_transactions(self) -> None:
        self.began = True

    def pre_commit(self, cid: int) -> list[tuple[str, Any]]:
        return [("w", f"t{cid}")]

    def flush(self) -> None:
        self.flushes += 1

    def commit(self, writer: str, txns: list[Any]) -> None:
        if self.fail_commit:
            raise OSError("disk full")
        self.committed.append((writer, txns))

    def close(self) -> None:
        self.closed = True

    def prepare(self, operator: str, fn: Any) -> None:
        if operator != "op":
            raise ValueError(f"no operator {operator!r} here")
        self.prepared.append((operator, fn))

    def switch(self, operator: str, fn: Any) -> None:
        self.switched.append((operator, fn))


class FakeRouter:
    def __init__(self) -> None:
        self.sent: list[tuple[Any, Any]] = []  # (channel ids or "all", event)

    def broadcast(self, event: Any) -> None:
        self.sent.append(("all", event))

    def send_event_to(self, ids: set[int], event: Any) -> None:
        self.sent.append((frozenset(ids), event))


class FakeHost:
    """``CheckpointHost``, ``LogicHost`` and ``HandoverHost`` at once, recording calls."""

    def __init__(self, status: Any = RUNNING) -> None:
        self.name = "t"
        self.status = status
        self.reader: Any = None
        self.migrating = False
        self.failed: list[tuple[str, str]] = []
        self.quiesced = self.paused = self.writers_closed = False
        self.reports: list[Any] = []
        self.replaced: list[tuple[str, Any]] = []
        self.blocked: dict[int, set[int]] = {}
        self.stopped_with: bool | None = None

    def fail(self, operator: str, record: str, cause: str, permanent: bool = False) -> None:
        self.status = FAILED
        self.failed.append((operator, cause))

    def quiesce(self) -> None:
        self.quiesced = True

    def report(self, msg: Any) -> None:
        self.reports.append(msg)

    def function_replaced(self, operator: str, fn: Any) -> None:
        self.replaced.append((operator, fn))

    def source_offsets(self) -> dict[str, Any]:
        return {"p0": 7}

    def pause(self) -> None:
        self.paused = True

    def stop(self, end_outputs: bool) -> tuple[tuple[str, Any], ...]:
        self.stopped_with = end_outputs
        return (("w", "handed"),)

    def close_writers(self) -> None:
        self.writers_closed = True

    def block_channel(self, channel_id: int, token: int) -> None:
        self.blocked.setdefault(channel_id, set()).add(token)

    def unblock_channels(self, token: int) -> None:
        for cid in [c for c, ts in self.blocked.items() if token in ts]:
            self.blocked[cid].discard(token)
            if not self.blocked[cid]:
                del self.blocked[cid]


def spec(checkpointing: bool = True, kind: str = g.REDUCE) -> Any:
    op = SimpleNamespace(name="op", kind=kind)
    return SimpleNamespace(task_name="t", vertex="v", task_index=0, operators=(op,),
                           config=JobConfig(checkpoint_interval_s=60.0 if checkpointing else None))


def checkpoints(host: FakeHost, chain: FakeChain | None = None, router: FakeRouter | None
                = None, **kw: Any) -> tuple[CheckpointParticipant, FakeChain, FakeRouter]:
    chain = chain or FakeChain()
    router = router or FakeRouter()
    p = CheckpointParticipant(host, spec(**kw), chain, router, ManualClock())  # type: ignore[arg-type]
    return p, chain, router


# ---------------------------------------------------------------------- checkpoints


def test_a_task_not_started_declines_and_a_migrating_one_declines_naming_why():
    p, _, _ = checkpoints(FakeHost(CREATED))
    p.handlers()[TriggerCheckpoint](TriggerCheckpoint(1, "loc"))
    [snap] = p.snapshots
    assert snap.declined == "the task has not started"
    host = FakeHost()
    host.migrating = True
    p, _, router = checkpoints(host)
    p.set_channels([1])
    p.on_barrier(1, CheckpointBarrier(2, "loc"))
    [snap] = p.snapshots
    assert "key groups are moving" in snap.declined and router.sent == []


def test_the_snapshot_waits_for_every_input_then_forwards_the_barrier():
    backend = KeyedStateBackend(N)
    backend.own(3)
    host = FakeHost()
    p, chain, router = checkpoints(host, FakeChain(backend))
    assert chain.began, "exactly-once sinks begin a transaction at once"
    p.set_channels([1, 2])
    p.on_barrier(1, CheckpointBarrier(5, "loc"))
    assert p.snapshots == [] and p.is_blocked(1) and not p.is_blocked(2)
    p.on_barrier(2, CheckpointBarrier(5, "loc"))
    [snap] = p.snapshots
    assert [kg for kg, _ in snap.groups] == [3] and snap.transactions == (("w", "t5"),)
    assert router.sent == [("all", CheckpointBarrier(5, "loc", False))]
    assert not p.is_blocked(1)


def test_an_input_that_ends_counts_as_aligned_and_a_stop_barrier_quiesces():
    host = FakeHost()
    p, _, _ = checkpoints(host)
    p.set_channels([1, 2])
    p.on_barrier(1, CheckpointBarrier(5, "loc", stop=True))
    p.on_end(2)
    assert len(p.snapshots) == 1 and host.quiesced


def test_transactions_are_committed_only_when_their_checkpoint_or_a_later_one_completes():
    host = FakeHost()
    p, chain, _ = checkpoints(host)
    h = p.handlers()
    p.handlers()[AdoptTransactions](AdoptTransactions((("w", "peer"),)))
    for cid in (1, 2, 3):
        p.set_channels([1])
        p.on_barrier(1, CheckpointBarrier(cid, "loc"))
    assert p.snapshots[0].transactions == (("w", "peer"), ("w", "t1"))
    assert chain.committed == []
    h[CheckpointAborted](CheckpointAborted(2))
    assert h[CheckpointComplete](CheckpointComplete(2)).message == Ack()
    assert chain.committed == [("w", ["peer", "t1", "t2"])]
    assert p.hand_over() == (("w", "t3"), ("w", "t3")), "pending, then pre-committed now"
    assert p.hand_over() == (("w", "t3"),)


def test_a_commit_that_raises_fails_the_task_and_a_failed_task_commits_nothing():
    host = FakeHost()
    p, chain, _ = checkpoints(host, FakeChain(fail_commit=True))
    p.set_channels([1])
    p.on_barrier(1, CheckpointBarrier(1, "loc"))
    p.handlers()[CheckpointComplete](CheckpointComplete(1))
    assert host.status == FAILED and host.failed == [("w", "commit of a checkpoint's output "
                                                      "raised OSError: disk full")]


def test_without_checkpoints_written_output_is_flushed_at_the_cut_and_nothing_handed_over():
    p, chain, _ = checkpoints(FakeHost(), checkpointing=False)
    p.set_channels([])
    p.handlers()[TriggerCheckpoint](TriggerCheckpoint(1, "loc"))
    [snap] = p.snapshots
    assert snap.transactions == () and chain.flushes == 1 and not chain.began
    assert p.hand_over() == ()
    p.close_writers()
    p.close_writers()
    assert chain.closed


# ---------------------------------------------------------------------- change of logic


def test_the_logic_switches_at_the_aligned_barrier_to_the_staged_function():
    host, chain, router = FakeHost(), FakeChain(), FakeRouter()
    s = LogicSwitch(host, chain, router, ManualClock())  # type: ignore[arg-type]
    fn = object()
    s.stage(3, "op", fn)
    with pytest.raises(ValueError, match="no operator"):
        s.stage(4, "other", fn)
    s.set_channels([1, 2])
    s.on_barrier(1, LogicBarrier(3))
    assert s.is_blocked(1) and chain.switched == []
    s.on_barrier(2, LogicBarrier(3))
    assert chain.switched == [("op", fn)] and host.replaced == [("op", fn)]
    [report] = host.reports
    assert isinstance(report, LogicChanged) and report.version == 3
    s.handlers()[InjectLogicBarrier](InjectLogicBarrier(5, (7, 8)))
    assert router.sent == [(frozenset({7, 8}), LogicBarrier(5))]


def test_a_discarded_or_never_staged_function_is_never_switched_to():
    host, chain = FakeHost(), FakeChain()
    s = LogicSwitch(host, chain, FakeRouter(), ManualClock())  # type: ignore[arg-type]
    s.stage(1, "op", "f1")
    s.handlers()[DiscardLogic](DiscardLogic(1))
    s.set_channels([])
    with pytest.raises(TaskControlError, match="no function was staged"):
        s.handlers()[SwitchLogic](SwitchLogic(1))
    assert chain.switched == []


# ---------------------------------------------------------------------- source handover


def test_new_channels_are_read_once_every_old_channel_they_follow_ended():
    host = FakeHost()
    h = SourceHandover(host)
    h.hold([10], {1, 2})
    h.hold([11], {2})
    assert set(host.blocked) == {10, 11} and host.blocked[10] != host.blocked[11]
    h.on_end(2)
    assert set(host.blocked) == {10}
    h.on_end(1)
    assert host.blocked == {}


def test_a_released_source_stops_ending_its_outputs_and_says_where_it_was():
    host = FakeHost()
    reply = SourceHandover(host).handlers()[ReleaseSource](ReleaseSource())
    assert reply.message == SourceReleased("t", {"p0": 7}, (("w", "handed"),))
    assert reply.effects == STOPPED_EFFECTS and host.paused and host.stopped_with is True
    idle = FakeHost(CREATED)
    reply = SourceHandover(idle).handlers()[ReleaseSource](ReleaseSource())
    assert reply.message.transactions == () and idle.writers_closed and idle.stopped_with is None


# ---------------------------------------------------------------------- the core's replies


def test_effects_that_settle_channels_must_send_everything_first():
    with pytest.raises(InternalError, match="flush"):
        Effects(settle=frozenset({1}))
    with pytest.raises(InternalError, match="flush"):
        Effects(settle_all=True)
    assert Effects(flush_all=True, settle_all=True).settle == frozenset()


def cores(participant: bool = False) -> dict[str, TaskCore]:
    cfg = JobConfig(batch_size=5, linger_ms=0, metrics_port=None, checkpoint_interval_s=60.0)
    j = StreamJob("j", num_key_groups=N, config=cfg)
    (j.source(TestingSource([(1, 1), (2, 2)]), name="src", parallelism=1)
     .key_by(lambda r: r[0]).reduce(lambda a, b: a, name="sum", parallelism=2)
     .sink(TestingSink(), name="out", parallelism=1))
    dep = initial_deployment(plan_physical(j.graph()), "j")
    clock = ManualClock()
    out: dict[str, TaskCore] = {}
    for v in dep.plan.vertices:
        for i, name in enumerate(dep.tasks[v.name]):
            sp = make_spec(dep, v.name, i, name, cfg)
            out[v.name + str(i)] = new_task_core(sp, clock) if participant else TaskCore(sp, clock)
    names = {n: k for k, n in zip(out, (n for v in dep.plan.vertices for n in dep.tasks[v.name]),
                                  strict=True)}
    for name, msg in connect_messages(dep, ChannelIds()).items():
        out[names[name]].handle(wire(msg))
    for name, msg in start_messages(dep).items():
        out[names[name]].handle(wire(msg))
    return out


def test_each_reply_says_what_the_shell_must_do_before_answering():
    c = cores()
    src, s0 = c["src0"], c["sum0"]
    # what the router does with them is test_channel's business: here, what the shell does
    s0.router.remove_channels = lambda ids: None  # type: ignore[method-assign]
    s0.router.replace_channel = lambda retired, new: None  # type: ignore[method-assign]
    assert s0.control(wire(RemoveOutputChannels((7, 8)))).effects == Effects(
        flush_all=True, settle=frozenset({7, 8}))
    assert s0.control(wire(ReplaceOutputChannel(99, 100))).effects == Effects(
        flush_all=True, settle=frozenset({99}))
    restore = RestoreState(transactions=(("w", ("x",)),))
    assert s0.control(wire(restore)).effects == Effects(restore=restore), "the shell reads"
    reply = s0.control(wire(StopTask(end_outputs=True)))
    assert reply.effects == STOPPED_EFFECTS and reply.message == Ack()  # nothing to hand over
    assert s0.status == "stopped"
    released = src.control(wire(ReleaseSource()))
    assert isinstance(released.message, SourceReleased) and released.effects == STOPPED_EFFECTS
    assert c["out0"].control(wire(TriggerCheckpoint(1, "loc"))).effects == NO_EFFECTS


def test_a_replica_refresh_completes_with_what_the_holders_dropped():
    c = cores(participant=True)
    s0 = c["sum0"]
    [kg, *_] = s0.backend.owned()
    reply = s0.control(wire(RefreshReplicas(((kg, "holder", -1),))))
    [(target, _update)] = s0.priority_out
    assert target == "holder" and reply.then is not None
    assert reply.then([ReplicaAck(kg, False)]).dropped == (kg,)
    assert reply.then([ReplicaAck(kg, True)]).dropped == ()


def test_unknown_messages_are_refused_naming_the_task():
    core = cores()["sum0"]
    with pytest.raises(TaskControlError, match="unknown control message"):
        core.handle(LogicChanged("t", "op", 1, 0.0))


def test_the_shell_measures_time_through_callbacks_into_the_metrics():
    core = cores()["sum0"]
    core.counters.on_busy(1.5)
    core.counters.on_idle(2.0)
    core.counters.on_backpressured(0.25)
    m = core.metrics()
    assert (m.useful_seconds, m.idle_seconds, m.backpressured_seconds) == (1.5, 2.0, 0.25)


def test_the_shell_neither_type_tests_replies_nor_writes_the_cores_fields():
    tree = ast.parse((ROOT / "engine/runtime/task_actor.py").read_text())
    control = next(n for n in ast.walk(tree)
                   if isinstance(n, ast.AsyncFunctionDef) and n.name == "control")
    assert not [n for n in ast.walk(control) if isinstance(n, ast.Name) and n.id == "isinstance"]

    def core_field(t: ast.AST) -> bool:
        return (isinstance(t, ast.Attribute) and (
            isinstance(t.value, ast.Name) and t.value.id == "core"
            or isinstance(t.value, ast.Attribute) and t.value.attr == "core"))

    writes = [ast.unparse(t) for n in ast.walk(tree)
              if isinstance(n, ast.Assign | ast.AugAssign)
              for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if core_field(t)]
    assert writes == []


def test_a_message_type_two_parts_register_is_refused():
    def handler(msg: Any) -> Any:
        return msg

    assert dispatch_table("t", {Ack: handler}, {StopTask: handler}) == {Ack: handler,
                                                                         StopTask: handler}
    with pytest.raises(TaskControlError, match="two parts of the task take StopTask"):
        dispatch_table("t", {StopTask: handler}, {StopTask: handler})
    cores()  # a core builds its table from its own and its participants': none overlap
