"""Unit tests for engine.task.core.TaskCore, stepped by hand without Ray.

Specs are built the way the JobMaster builds them (``plan_physical`` +
``initial_deployment`` + ``connect_messages``); frames are moved between cores by hand from
``core.router.outbox`` to the target core's ``receive`` (shuffled where order matters), time
is a ``ManualClock``, and outputs are read back from ``TestingSink``s.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from engine.api import StreamJob
from engine.checkpoints.metadata import CheckpointKind
from engine.dataflow import graph as g
from engine.dataflow.config import JobConfig
from engine.dataflow.deployment import (
    ChannelIds,
    Deployment,
    connect_messages,
    initial_deployment,
    start_message,
    start_messages,
    task_name,
)
from engine.dataflow.keygroups import key_group_of, uniform_assignment
from engine.dataflow.physical import plan_physical
from engine.errors import UserFunctionError
from engine.io.sinks import SinkWriter
from engine.io.testing import TestingSink, TestingSource
from engine.operators.builtin import (
    ErrorPolicy,
    KeyedRunner,
    StatelessRunner,
    UnknownKeyGroupError,
    describe,
)
from engine.operators.functions import KeyedProcessFunction, ReduceFunction
from engine.state.keyed import KeyedStateBackend, decode_snapshot
from engine.task.core import TaskCore
from engine.time.clock import ManualClock, now_ms
from engine.time.event_time import MAX_WATERMARK, MIN_WATERMARK
from engine.wire.messages import (
    Ack,
    ChannelIdle,
    CheckpointBarrier,
    EndOfStream,
    Frame,
    InstallKeyGroups,
    Resume,
    Start,
    StopTask,
    TaskFailed,
    TaskFinished,
    TriggerCheckpoint,
    Watermark,
    decode_frame,
    decode_message,
    encode_frame,
    encode_message,
)
from migration.coordinator import RescaleRequest
from migration.report import RescaleReport
from tests import harness
from tests.harness import make_spec, wire

N = 16  # key groups
CFG = JobConfig(batch_size=5, linger_ms=0, metrics_port=None)
T0_MS = 1_000_000  # ManualClock() starts at 1000.0 s


class Net:
    """All cores of one job, wired like JobMaster.start() does, moved by hand."""

    def __init__(self, job: StreamJob, clock: ManualClock, start: bool = True) -> None:
        self.clock = clock
        self.config = job.config
        self.dep = initial_deployment(plan_physical(job.graph()), "j")
        self.ids = ChannelIds()
        self.cores: dict[str, TaskCore] = {}
        for v in self.plan.vertices:
            for i, name in enumerate(self.dep.tasks[v.name]):
                self.cores[name] = TaskCore(make_spec(self.dep, v.name, i, name, self.config), clock)
        self.connect()
        if start:
            starts = start_messages(self.dep)
            for v in reversed(self.plan.vertices):  # sources last
                for name in self.dep.tasks[v.name]:
                    assert self.cores[name].handle(wire(starts[name])) == Ack()

    def connect(self) -> None:
        for name, msg in connect_messages(self.dep, self.ids).items():
            assert self.cores[name].handle(wire(msg)) == Ack()

    def __getitem__(self, short: str) -> TaskCore:
        """``net["sum/1"]`` is the core of task 1 of vertex sum (current generation)."""
        vertex, index = short.split("/")
        return self.cores[self.dep.tasks[vertex][int(index)]]

    def deliver(self, rng: random.Random | None = None) -> int:
        """Move every frame waiting in an outbox to its target; returns how many."""
        frames = []
        for core in self.cores.values():
            core.flush_due()
            while core.router.outbox:
                frames.append(core.router.outbox.popleft())
        if rng is not None:
            rng.shuffle(frames)
        for f in frames:
            self.cores[f.target].receive(f.channel_id, f.seq, f.payload)
        return len(frames)

    def pump(self, rng: random.Random | None = None) -> None:
        """Step every core and move frames until nothing moves (sources are not polled)."""
        while True:
            did = False
            for core in list(self.cores.values()):
                while core.step():
                    did = True
            moved = self.deliver(rng)
            if not did and not moved:
                return

    def run_sources(self, rng: random.Random | None = None, batch: int = 7) -> None:
        sources = [c for c in self.cores.values() if c.is_source]
        while any(c.status == "running" for c in sources):
            for c in sources:
                c.poll_source(batch)
                self.pump(rng)

    def new_core(self, dep: Deployment, vertex: str, index: int, name: str) -> TaskCore:
        return TaskCore(make_spec(dep, vertex, index, name, self.config), self.clock)

    def rescale(self, vertex: str, parallelism: int) -> RescaleReport:
        """Stop-restart by the engine's coordinator: stop with a savepoint, deploy a new
        generation of every task from it, the vertex at ``parallelism``."""
        request = RescaleRequest(vertex, parallelism, "stop-restart")
        _, report, _ = harness.rescale(self, request, self.pump)
        return report

    @property
    def plan(self) -> Any:
        return self.dep.plan

    def reports(self, cls: type) -> list[Any]:
        return [r for c in self.cores.values() for r in c.reports if isinstance(r, cls)]


def running_sum_reference(records):
    acc: dict[Any, int] = {}
    out = []
    for k, v in records:
        acc[k] = acc.get(k, 0) + v
        out.append((k, acc[k]))
    return out


def per_key(records) -> dict[Any, list]:
    out: dict[Any, list] = {}
    for r in records:
        out.setdefault(r[0], []).append(r)
    return out


def running_sum_job(records, sink, *, src_p=1, sum_p=2, out_p=1, reduce_fn=None,
                    config=CFG, **reduce_kw) -> StreamJob:
    job = StreamJob("rs", num_key_groups=N, config=config)
    (job.source(TestingSource(records), name="src", parallelism=src_p)
        .key_by(lambda r: r[0])
        .reduce(reduce_fn or (lambda a, b: (a[0], a[1] + b[1])), name="sum",
                parallelism=sum_p, **reduce_kw)
        .sink(sink, name="out", parallelism=out_p))
    return job


def records_for(n: int, keys: int = 10, seed: int = 0) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(rng.randrange(keys), rng.randrange(100)) for _ in range(n)]


# ---------------------------------------------------------------- end to end


@pytest.mark.parametrize("seed", [None, 1, 2])
def test_source_keyed_reduce_sink_exact_running_sums(clock, sink, seed):
    records = records_for(200)
    net = Net(running_sum_job(records, sink), clock)
    assert [v.name for v in net.plan.vertices] == ["src", "sum", "out"]
    net.run_sources(None if seed is None else random.Random(seed))
    out = sink.results()
    assert len(out) == 200
    assert per_key(out) == per_key(running_sum_reference(records))
    # every record went to the task owning its key group, and every task finished
    assert net["sum/0"].records_in + net["sum/1"].records_in == 200
    assert net["sum/0"].records_in > 0 and net["sum/1"].records_in > 0
    assert all(c.status == "finished" for c in net.cores.values())
    assert sorted(r.task for r in net.reports(TaskFinished)) == sorted(net.cores)
    assert all(ts == T0_MS for _, ts in sink.results_with_timestamps())
    owned = {kg for i in (0, 1) for kg in net[f"sum/{i}"].backend.owned()}
    assert owned == set(range(N))


def test_frames_delivered_out_of_order_are_processed_in_order(clock, sink):
    records = [("k", s) for s in "abcdefg"]
    job = running_sum_job(records, sink, sum_p=1, out_p=1)
    net = Net(job, clock)
    src, cat = net["src/0"], net["sum/0"]
    assert src.poll_source(100)
    # batch_size 5: the whole frame goes at once, the 2 left wait for more (or the linger)
    assert [(f.seq, f.records) for f in src.router.outbox] == [(0, 5)]
    src.router.flush_all()
    frames = list(src.router.outbox)
    src.router.outbox.clear()
    assert [(f.seq, f.records) for f in frames] == [(0, 5), (1, 2)]
    for f in reversed(frames):
        cat.receive(f.channel_id, f.seq, f.payload)
        if f.seq != 0:
            assert not cat.step() and not cat.has_work()
    assert cat.step() and cat.step() and not cat.step()
    assert sink.results() == [("k", "abcdefg"[:i]) for i in range(1, 8)]
    with pytest.raises(ValueError, match="delivered twice"):
        cat.receive(frames[0].channel_id, 0, frames[0].payload)


def test_latency_marker_travels_to_the_sink(clock, sink):
    net = Net(running_sum_job([(1, 1)], sink), clock)
    net["src/0"].poll_source(1)
    net["src/0"].emit_latency_marker()
    clock.advance(0.25)
    net.pump()
    assert net["out/0"].latency.count == 1
    assert net["out/0"].latency.max == pytest.approx(250.0)
    assert net["sum/0"].latency.count == 0 and net["sum/1"].latency.count == 0


# ---------------------------------------------------------------- drain and pause


class CountWithTimer(KeyedProcessFunction):
    """Counts per key, emits (key, value, count); a timer 1 s later emits ('timer', key, count)."""

    def open(self, ctx):
        self.count = ctx.value_state("count", 0)

    def process_element(self, value, ctx):
        self.count.update(self.count.value() + 1)
        ctx.timer_service.register_processing_time_timer(
            ctx.timer_service.current_processing_time() + 1000)
        yield (value[0], value[1], self.count.value())

    def on_timer(self, timestamp, ctx):
        yield ("timer", ctx.key, self.count.value(), timestamp)


def two_source_job(records, sink, fn=None, **kw) -> StreamJob:
    job = StreamJob("two", num_key_groups=N, config=CFG)
    (job.source(TestingSource(records), name="src", parallelism=2)
        .key_by(lambda r: r[0])
        .process(fn or CountWithTimer(), name="cnt", parallelism=1, **kw)
        .sink(sink, name="out", parallelism=1))
    return job


def input_channel_from(net: Net, src: str, dst: str) -> int:
    [cid] = [c.channel_id for e in connect_messages(net.dep, net.ids)[net[src].name].outputs
             for c in e.channels if c.target == net[dst].name]
    return cid


def test_a_checkpoint_barrier_waits_on_every_live_input(clock, sink):
    # src/0 gets records 0, 2, 4, 6; src/1 gets 1, 3, 5, 7
    records = [("a", 0), ("b", 1), ("a", 2), ("b", 3), ("a", 4), ("b", 5), ("a", 6), ("b", 7)]
    net = Net(two_source_job(records, sink), clock)
    cnt = net["cnt/0"]
    assert [v.name for v in net.plan.vertices] == ["src", "cnt"]
    c0 = input_channel_from(net, "src/0", "cnt/0")
    c1 = input_channel_from(net, "src/1", "cnt/0")
    net["src/0"].poll_source(2)
    net["src/1"].poll_source(2)
    net.pump()
    assert len(sink.results()) == 4
    # every task learns of the checkpoint; only the sources act on it at once
    trigger = TriggerCheckpoint(7, "/nowhere")
    assert cnt.handle(wire(trigger)) == Ack() and cnt.snapshots == []
    src0 = net["src/0"]
    assert src0.handle(wire(trigger)) == Ack()
    [snap] = src0.snapshots
    assert (snap.checkpoint_id, snap.source_state, snap.groups) == (7, {"0-of-2": 2}, ())
    barrier = [decode_frame(f.payload).event for f in src0.router.outbox]
    assert barrier == [CheckpointBarrier(7, "/nowhere")]
    net.pump()
    assert cnt.snapshots == []
    # a later frame on the blocked channel waits for alignment
    late = Frame([("late", 99)], [T0_MS], [("late")], [key_group_of("late", N)])
    cnt.receive(c0, cnt.inputs[c0].next_seq, encode_frame(late))
    assert not cnt.has_work() and not cnt.step()
    # the other channel still flows, into the checkpoint
    net["src/1"].poll_source(1)
    net.pump()
    assert sorted(r for r in sink.results()) == sorted(
        [("a", 0, 1), ("b", 1, 1), ("a", 2, 2), ("b", 3, 2), ("b", 5, 3)])
    assert len(cnt.inputs[c0].queue) == 1 and cnt.snapshots == []
    # the barrier on the last live input aligns: the snapshot, then the late frame runs
    net["src/1"].handle(wire(trigger))
    net.deliver()
    assert cnt.inputs[c1].queue
    while not cnt.snapshots and cnt.step():
        pass
    [snap] = cnt.snapshots
    state = {kg: decode_snapshot(data)[0] for kg, data in snap.groups}
    assert {k: v for t in state.values() for k, v in t.get("count", {}).items()} == {
        "a": 2, "b": 3}
    assert ("late", 99, 1) not in sink.results()
    net.pump()
    assert ("late", 99, 1) in sink.results()
    assert len(cnt.snapshots) == 1  # taken once
    # a trigger of the same checkpoint after it aligned is stale: nothing happens
    cnt.handle(wire(trigger))
    assert len(cnt.snapshots) == 1


def test_a_stop_with_savepoint_keeps_every_task_quiet_until_resume(clock, sink):
    records = [("a", 0), ("b", 1)]
    net = Net(two_source_job(records, sink), clock)
    cnt = net["cnt/0"]
    for s in ("src/0", "src/1"):
        net[s].poll_source(10)
    net.pump()
    assert cnt.next_timer_ms() == T0_MS + 1000
    for s in ("src/0", "src/1"):
        net[s].handle(wire(TriggerCheckpoint(1, "/nowhere", stop=True)))
    net.pump()
    assert [sn.checkpoint_id for sn in cnt.snapshots] == [1]
    clock.advance(5.0)
    assert not cnt.fire_timers()
    assert [r for r in sink.results() if r[0] == "timer"] == []
    for c in net.cores.values():
        assert c.handle(wire(Resume())) == Ack()
    assert cnt.fire_timers()
    assert sorted(r for r in sink.results() if r[0] == "timer") == [
        ("timer", "a", 1, T0_MS + 1000), ("timer", "b", 1, T0_MS + 1000)]
    assert not cnt.fire_timers()
    # sources read again after Resume
    assert all(net[s].status == "running" and not net[s].paused for s in ("src/0", "src/1"))


def test_a_checkpoint_barrier_travels_through_every_stage(clock, sink, tmp_path):
    records = records_for(40)
    net = Net(running_sum_job(records, sink), clock)
    src = net["src/0"]
    src.poll_source(20)
    net.pump()
    cps = harness.Checkpoints(net, str(tmp_path / "chk"), net.pump)
    meta = cps.take()
    assert [t.task for t in meta.tasks] == net.dep.task_names()
    assert [t.source_state for t in meta.tasks if t.vertex == "src"] == [{"0-of-1": 20}]
    # the sums' key groups hold the running sums of exactly the first 20 records
    groups = {kg for t in meta.tasks if t.vertex == "sum" for kg, *_ in t.groups}
    assert groups == set(range(N))
    assert (tmp_path / "chk" / "chk-1" / "_metadata").is_file()
    # nothing was lost: every record before the barrier reached the sink
    assert per_key(sink.results()) == per_key(running_sum_reference(records[:20]))


def test_a_finished_task_takes_part_in_checkpoints(clock, sink, tmp_path):
    records = records_for(30)
    net = Net(running_sum_job(records, sink, src_p=2), clock)
    src0 = net["src/0"]
    while src0.status == "running":
        src0.poll_source(100)
    net.pump()
    assert src0.status == "finished" and net["src/1"].status == "running"
    cps = harness.Checkpoints(net, str(tmp_path / "chk"), net.pump)
    meta = cps.take()
    states = {t.task: t.source_state for t in meta.tasks if t.vertex == "src"}
    assert states == {src0.name: {"0-of-2": 15}, net["src/1"].name: {"1-of-2": 0}}
    net.run_sources()
    meta = cps.take()  # the job's final checkpoint: every task has finished
    assert meta.checkpoint_id == 2
    assert all(net.cores[t.task].status == "finished" for t in meta.tasks)


# ---------------------------------------------------------------- end of stream


def test_end_of_stream_on_all_inputs_finishes_and_is_forwarded(clock, sink):
    records = records_for(30)
    net = Net(running_sum_job(records, sink, src_p=2), clock)
    src0, src1, s0 = net["src/0"], net["src/1"], net["sum/0"]
    while src0.status == "running":
        src0.poll_source(100)
    assert src0.reports == [TaskFinished(src0.name)]
    eos = [decode_frame(f.payload) for f in src0.router.outbox]
    # each of the two channels ends with EndOfStream, after the records
    assert [fr.event for fr in eos].count(EndOfStream()) == 2
    net.pump()
    assert s0.status == "running" and s0.reports == []
    assert all(c.status == "running" for n, c in net.cores.items() if "/sum/" in n)
    # src/1 ends: every sum task sees EOS on both inputs
    while src1.status == "running":
        src1.poll_source(100)
    net.deliver()
    while s0.step():
        pass
    assert s0.status == "finished" and s0.reports == [TaskFinished(s0.name)]
    sent = [decode_frame(f.payload) for f in s0.router.outbox]
    assert sent[-1].event == EndOfStream()
    # the sources' final watermark goes ahead of the end of stream
    assert sent[-2].event == Watermark(MAX_WATERMARK)
    assert all(fr.event is None for fr in sent[:-2])
    assert not s0.step()  # finished tasks do nothing more
    net.pump()
    assert net["out/0"].status == "finished"
    assert net.reports(TaskFinished) and len(net.reports(TaskFinished)) == 5
    assert per_key(sink.results()) == per_key(running_sum_reference(
        [r for i, r in enumerate(records) if i % 2 == 0]
        + [r for i, r in enumerate(records) if i % 2 == 1]))


# ---------------------------------------------------------------- watermarks


def test_watermark_is_min_over_live_inputs_and_ended_channels_stop_counting(clock, sink):
    job = StreamJob("wm", num_key_groups=N, config=CFG)
    (job.source(TestingSource([]), name="src", parallelism=2)
        .key_by(lambda r: r)
        .reduce(lambda a, b: a, name="sum", parallelism=1)
        .sink(sink, name="out", parallelism=2))
    net = Net(job, clock)
    src0, src1, s = net["src/0"], net["src/1"], net["sum/0"]

    def send(src: TaskCore, event) -> None:
        src.router.broadcast(event)
        net.deliver()
        while s.step():
            pass

    def forwarded() -> list:
        evs = [decode_frame(f.payload).event for f in s.router.outbox]
        s.router.outbox.clear()
        return evs

    start = s.watermark
    send(src0, Watermark(10))
    assert s.watermark == start and forwarded() == []  # src/1 has no watermark yet
    send(src1, Watermark(5))
    assert s.watermark == 5 and forwarded() == [Watermark(5)] * 2  # on both out channels
    send(src1, Watermark(20))
    assert s.watermark == 10 and forwarded() == [Watermark(10)] * 2
    send(src0, Watermark(15))
    assert s.watermark == 15 and forwarded() == [Watermark(15)] * 2
    send(src0, EndOfStream())
    assert s.watermark == 20 and forwarded() == [Watermark(20)] * 2
    send(src1, Watermark(18))  # a watermark never goes back
    assert s.watermark == 20 and forwarded() == []
    send(src1, Watermark(30))
    assert s.watermark == 30 and forwarded() == [Watermark(30)] * 2
    assert s.metrics().watermark == 30


def test_idle_channel_does_not_hold_the_watermark_back(clock, sink):
    job = StreamJob("idle", num_key_groups=N, config=CFG)
    (job.source(TestingSource([]), name="src", parallelism=2)
        .key_by(lambda r: r)
        .reduce(lambda a, b: a, name="sum", parallelism=1)
        .sink(sink, name="out"))
    net = Net(job, clock)
    src0, src1, s = net["src/0"], net["src/1"], net["sum/0"]
    for src, event in [(src0, Watermark(5)), (src1, Watermark(3))]:
        src.router.broadcast(event)
        net.pump()
    assert s.watermark == 3
    src1.router.broadcast(ChannelIdle())
    src0.router.broadcast(Watermark(9))
    net.pump()
    assert s.watermark == 9
    src1.router.broadcast(Watermark(4))  # active again: holds the minimum, never goes back
    net.pump()
    src0.router.broadcast(Watermark(12))
    net.pump()
    assert s.watermark == 9
    src1.router.broadcast(Watermark(11))
    net.pump()
    assert s.watermark == 11


# ---------------------------------------------------------------- state moves


def test_a_savepoint_restored_at_another_parallelism_continues_exactly(clock, sink, tmp_path):
    records = records_for(300, keys=25, seed=5)
    net = Net(running_sum_job(records, sink, sum_p=2), clock)
    src = net["src/0"]
    for _ in range(20):
        src.poll_source(7)
        net.pump(random.Random(1))
    cps = harness.Checkpoints(net, str(tmp_path / "chk"), net.pump)
    meta = cps.take(CheckpointKind.SAVEPOINT, str(tmp_path / "sp"), stop=True)
    assert [t.source_state for t in meta.tasks if t.vertex == "src"] == [{"0-of-1": 140}]
    held = {t.index: sorted(kg for kg, *_ in t.groups) for t in meta.tasks if t.vertex == "sum"}
    assert held == {0: list(range(N // 2)), 1: list(range(N // 2, N))}
    assert not src.poll_source(10)  # stopped at the barrier: reads nothing
    # a new generation of every task, sum at parallelism 3
    restored = cps.restore(meta, {"sum": 3})
    assert net.dep.tasks["sum"] == tuple(task_name("j", "sum", i, 1) for i in range(3))
    assert net.dep.assignments["sum"] == uniform_assignment(N, 3)
    for i in range(3):
        core = net[f"sum/{i}"]
        assert core.backend.owned() == list(net.dep.key_groups_of("sum", i))
        assert len(restored.tasks[core.name].groups) == len(core.backend.owned())
    # continue: the results continue exactly
    net.run_sources(random.Random(2))
    out = sink.results()
    assert len(out) == 300
    assert per_key(out) == per_key(running_sum_reference(records))
    assert all(net[f"sum/{i}"].records_in > 0 for i in range(3))
    assert all(c.status == "finished" for c in net.cores.values())


def test_repeated_rescales_of_keyed_and_stateless_vertices(clock, sink):
    records = records_for(400, keys=30, seed=9)
    job = StreamJob("multi", num_key_groups=N, config=CFG)
    (job.source(TestingSource(records), name="src", parallelism=1)
        .map(lambda r: (r[0], 1), name="one", parallelism=1)
        .filter(lambda r: True, name="keep", parallelism=2)
        .key_by(lambda r: r[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]), name="count", parallelism=2)
        .sink(sink, name="out"))
    net = Net(job, clock)
    assert [[op.name for op in v.operators] for v in net.plan.vertices] == [
        ["src", "one"], ["keep"], ["count", "out"]]
    rng = random.Random(4)
    plan = [("count", 3), ("keep", 1), ("count", 1), ("keep", 3), ("count", 4)]
    for vertex, p in plan:
        src = net["src/0"]  # every stop-restart deploys new tasks
        for _ in range(8):
            src.poll_source(7)
            net.pump(rng)
        net.rescale(vertex, p)
        assert len(net.dep.tasks[vertex]) == p
    net.run_sources(rng)
    # a rebalance edge may reorder a key's records, but counting is exact whatever the
    # order: every key emits 1..n exactly once through all the state moves
    got = {k: sorted(c for _, c in v) for k, v in per_key(sink.results()).items()}
    expected = {k: list(range(1, len(v) + 1)) for k, v in per_key(records).items()}
    assert got == expected
    assert all(c.status == "finished" for c in net.cores.values())


def test_rescale_after_one_source_finished_still_finishes(clock, sink):
    records = records_for(40)
    net = Net(running_sum_job(records, sink, src_p=2, sum_p=2), clock)
    src0, src1 = net["src/0"], net["src/1"]
    while src0.status == "running":
        src0.poll_source(100)
    src1.poll_source(5)
    net.pump()
    assert src0.status == "finished"
    net.rescale("sum", 3)
    net.run_sources()
    assert sorted(r[1] for r in per_key(sink.results())[records[0][0]])[-1] == sum(
        v for k, v in records if k == records[0][0])
    assert len(sink.results()) == 40
    assert {n: c.status for n, c in net.cores.items()} == {n: "finished" for n in net.cores}


class Timed(KeyedProcessFunction):
    """Sums per key; every record sets a timer 1 s later that emits (key, sum at fire time)."""

    def open(self, ctx):
        self.total = ctx.value_state("total", 0)

    def process_element(self, value, ctx):
        self.total.update(self.total.value() + value[1])
        ctx.timer_service.register_processing_time_timer(
            ctx.timer_service.current_processing_time() + 1000)
        return None

    def on_timer(self, timestamp, ctx):
        return [(ctx.key, self.total.value(), timestamp)]


def timed_job(records, sink, parallelism=1) -> StreamJob:
    job = StreamJob("timed", num_key_groups=N, config=CFG)
    (job.source(TestingSource(records), name="src", parallelism=1)
        .key_by(lambda r: r[0])
        .process(Timed(), name="timed", parallelism=parallelism)
        .sink(sink, name="out", parallelism=parallelism))
    return job


def test_processing_time_timers_fire_only_when_the_clock_passes_them(clock, sink):
    net = Net(timed_job([("a", 1), ("b", 2), ("a", 3)], sink), clock)
    t = net["timed/0"]
    net["src/0"].poll_source(10)
    net.pump()
    assert sink.results() == []
    assert t.next_timer_ms() == T0_MS + 1000
    clock.advance(0.5)
    assert not t.fire_timers() and sink.results() == []
    clock.advance(0.5)  # exactly at the timer
    assert t.fire_timers()
    # one timer per (key, time): 'a' registered T0+1000 twice, fires once
    assert sorted(sink.results()) == [("a", 4, T0_MS + 1000), ("b", 2, T0_MS + 1000)]
    assert sorted(sink.results_with_timestamps())[0][1] == T0_MS + 1000
    assert t.next_timer_ms() is None and not t.fire_timers()


def test_timers_travel_with_the_key_group_snapshot(clock, sink):
    net = Net(timed_job([("a", 1), ("b", 2), ("c", 3), ("a", 10)], sink, parallelism=2), clock)
    net["src/0"].poll_source(10)
    net.pump()
    clock.advance(0.5)
    old = [net["timed/0"], net["timed/1"]]
    groups = [(kg, c.backend.snapshot(kg)) for c in old for kg in c.backend.owned()]
    for c in old:
        c.handle(StopTask())
    # one new task owning every key group (a different spec: parallelism 1)
    plan = net.plan.rescaled("timed", 1)
    tasks = dict(net.dep.tasks, timed=(task_name("j", "timed", 0, 1),))
    dep = Deployment(plan, "j", tasks, {"timed": (0,) * N}, 1, net.dep.partitions)
    b = TaskCore(make_spec(dep, "timed", 0, tasks["timed"][0], CFG), clock)
    assert b.spec.parallelism == 1 and b.spec.key_groups == tuple(range(N))
    b.handle(InstallKeyGroups(tuple(groups)))
    b.handle(Start())
    assert b.next_timer_ms() == T0_MS + 1000
    assert not b.fire_timers()
    assert not any(c.fire_timers() for c in old)  # stopped tasks never fire
    clock.advance(0.5)
    assert b.fire_timers()
    assert sorted(sink.results()) == [
        ("a", 11, T0_MS + 1000), ("b", 2, T0_MS + 1000), ("c", 3, T0_MS + 1000)]


def test_install_into_a_non_keyed_task_is_refused(clock, sink):
    net = Net(running_sum_job([], sink), clock)
    with pytest.raises(ValueError, match="not keyed"):
        net["src/0"].handle(InstallKeyGroups(((0, b""),)))


# ---------------------------------------------------------------- failures


def owner_of(net: Net, vertex: str, key) -> int:
    return net.dep.assignments[vertex][key_group_of(key, N)]


class NoCodec:
    """A value with no declared codec."""


def test_an_output_without_a_codec_fails_the_task_naming_operator_and_record(clock, sink):
    records = [(k, 1) for k in range(6)]
    job = StreamJob("nocodec", num_key_groups=N, config=CFG)
    (job.source(TestingSource(records), name="src", parallelism=1)
        .map(lambda r: r if r[0] != 4 else (r[0], NoCodec()), name="make")
        .key_by(lambda r: r[0])
        .reduce(lambda a, b: a, name="sum", parallelism=2)
        .sink(sink, name="out"))
    net = Net(job, clock)
    net.run_sources()
    src = net["src/0"]
    assert src.status == "failed"
    (failed,) = [r for r in src.reports if isinstance(r, TaskFailed)]
    assert failed.operator == "make" and failed.record.startswith("(4, <")
    assert "no codec for NoCodec" in failed.cause and "register_codec" in failed.cause


def test_user_function_error_fails_the_task_naming_operator_index_and_record(clock, sink):
    records = [(k, 1) for k in range(20)] + [(7, -1), (3, 1)]
    job = StreamJob("fail", num_key_groups=N, config=CFG)
    (job.source(TestingSource(records), name="src", parallelism=1)
        .key_by(lambda r: r[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]), name="sum", parallelism=2)
        .map(lambda r: (r[0], 10 // r[1]), name="div")
        .sink(sink, name="out", parallelism=2))
    net = Net(job, clock)
    idx = owner_of(net, "sum", 7)
    net.run_sources()
    bad = net[f"sum/{idx}"]
    assert bad.status == "failed"
    assert bad.reports == [TaskFailed(bad.name, "div", idx, "(7, 0)",
                                      "ZeroDivisionError: integer division or modulo by zero")]
    assert bad.failure == bad.reports[0]
    assert not bad.step()
    out = sink.results()
    # the other task finished its keys; the failed one emitted nothing after the bad record
    other = [k for k in range(20) if owner_of(net, "sum", k) != idx]
    assert net[f"sum/{1 - idx}"].status == "finished"
    assert set(out) >= {(k, 10) for k in other}
    assert set(out) <= {(k, 10) for k in range(20)}
    assert decode_message(encode_message(bad.failure)) == bad.failure


def test_reduce_function_error_names_the_input_record(clock, sink):
    def add(a, b):
        if b[1] < 0:
            raise ValueError(f"negative {b[1]}")
        return (a[0], a[1] + b[1])

    records = [("x", 1), ("x", -5), ("x", 2)]
    net = Net(running_sum_job(records, sink, sum_p=2, reduce_fn=add), clock)
    idx = owner_of(net, "sum", "x")
    net.run_sources()
    bad = net[f"sum/{idx}"]
    assert [(r.operator, r.task_index, r.record, r.cause) for r in net.reports(TaskFailed)] == [
        ("sum", idx, "('x', -5)", "ValueError: negative -5")]
    assert bad.status == "failed"
    assert sink.results() == []  # the failed batch emits nothing


def test_dead_letter_takes_the_record_and_the_rest_continue(clock, sink, tmp_path):
    dead = TestingSink(str(tmp_path / "dead"))

    def add(a, b):
        if b[1] < 0:
            raise ValueError(f"negative {b[1]}")
        return (a[0], a[1] + b[1])

    records = [("x", 1), ("y", 2), ("x", -5), ("x", 2), ("y", -1), ("y", 3)]
    net = Net(running_sum_job(records, sink, sum_p=2, reduce_fn=add, dead_letter=dead), clock)
    net.run_sources()
    assert all(c.status == "finished" for c in net.cores.values())
    assert net.reports(TaskFailed) == []
    ix, iy = owner_of(net, "sum", "x"), owner_of(net, "sum", "y")
    assert sorted(dead.results()) == sorted([
        ("sum", ix, ("x", -5), "ValueError: negative -5"),
        ("sum", iy, ("y", -1), "ValueError: negative -1")])
    assert per_key(sink.results()) == {"x": [("x", 1), ("x", 3)], "y": [("y", 2), ("y", 5)]}
    assert sum(net[f"sum/{i}"].metrics().dead_letters for i in (0, 1)) == 2


def test_dead_letter_on_a_chained_stateless_operator(clock, sink, tmp_path):
    dead = TestingSink(str(tmp_path / "dead"))
    job = StreamJob("dl", num_key_groups=N, config=CFG)
    (job.source(TestingSource([1, 0, 2, 0, 5]), name="src", parallelism=1)
        .map(lambda v: 10 // v, name="inv", dead_letter=dead)
        .sink(sink, name="out"))
    net = Net(job, clock)
    assert [[op.name for op in v.operators] for v in net.plan.vertices] == [["src", "inv", "out"]]
    net.run_sources()
    assert sink.results() == [10, 5, 2]
    cause = "ZeroDivisionError: integer division or modulo by zero"
    assert dead.results() == [("inv", 0, 0, cause), ("inv", 0, 0, cause)]
    assert net["src/0"].status == "finished"


def test_key_function_error_fails_the_sending_task(clock, sink):
    job = StreamJob("kf", num_key_groups=N, config=CFG)
    (job.source(TestingSource([{"k": 1}, {"j": 2}]), name="src", parallelism=1)
        .key_by(lambda r: r["k"])
        .reduce(lambda a, b: a, name="sum", parallelism=1)
        .sink(sink, name="out"))
    net = Net(job, clock)
    net["src/0"].poll_source(10)
    src = net["src/0"]
    assert src.status == "failed"
    [f] = src.reports
    assert (f.operator, f.task_index, f.record) == ("key_by after src", 0, "{'j': 2}")
    assert "KeyError" in f.cause


def test_unhashable_key_fails_the_task_naming_the_record(clock, sink):
    job = StreamJob("kf", num_key_groups=N, config=CFG)
    (job.source(TestingSource([1, 2]), name="src", parallelism=1)
        .key_by(lambda r: [r])
        .reduce(lambda a, b: a, name="sum", parallelism=1)
        .sink(sink, name="out"))
    net = Net(job, clock)
    src = net["src/0"]
    src.poll_source(10)
    assert src.status == "failed"
    [f] = src.reports
    assert (f.operator, f.task_index, f.record) == ("key_by after src", 0, "1")


@pytest.mark.parametrize("kind", ["reduce", "process"])
def test_record_of_a_key_group_not_owned_fails_the_task(clock, sink, kind):
    job = StreamJob("own", num_key_groups=N, config=CFG)
    keyed = (job.source(TestingSource([]), name="src", parallelism=1)
             .key_by(lambda r: r[0]))
    s = (keyed.reduce(lambda a, b: a, name="op", parallelism=2) if kind == "reduce"
         else keyed.process(CountWithTimer(), name="op", parallelism=2))
    s.sink(sink, name="out")
    net = Net(job, clock)
    t0 = net["op/0"]
    assert t0.spec.key_groups == tuple(range(N // 2))
    key = next(k for k in range(100) if key_group_of(k, N) >= N // 2)
    kg = key_group_of(key, N)
    [cid] = list(t0.inputs)
    t0.receive(cid, 0, encode_frame(Frame([(key, 1)], [0], [key], [kg])))
    assert t0.step()
    assert t0.status == "failed"
    [f] = t0.reports
    assert (f.task, f.operator, f.task_index) == (t0.name, "op", 0)
    assert f.cause == (f"operator 'op' got a record of key group {kg}, which this task does "
                       "not own")
    assert sink.results() == []


def test_control_messages_before_and_after_start(clock, sink):
    net = Net(running_sum_job([(1, 1)], sink), clock, start=False)
    src = net["src/0"]
    assert src.status == "created"
    assert not src.poll_source(10) and not net["sum/0"].step()
    assert src.handle(start_message(net.dep, "src", 0)) == Ack() and src.status == "running"
    with pytest.raises(ValueError, match="unknown control message"):
        src.handle(Watermark(1))
    assert now_ms(clock) == T0_MS


# ---------------------------------------------------------------- operator runners


class ListWriter(SinkWriter):
    def __init__(self) -> None:
        self.rows: list[tuple[Any, int]] = []
        self.flushes = 0

    def write(self, values, timestamps) -> None:
        self.rows.extend(zip(values, timestamps, strict=True))

    def flush(self) -> None:
        self.flushes += 1


def op_def(kind: str, fn: Any, name: str = "op") -> g.OperatorDef:
    key_fn = (lambda r: r[0]) if kind in g.KEYED_KINDS else None
    return g.OperatorDef(name, kind, fn, 1, (g.InputDef("up", key_fn),))


def test_describe_truncates_long_records():
    assert describe(("a", 1)) == "('a', 1)"
    long = describe("x" * 500)
    assert len(long) == 200 and long.endswith("...") and long.startswith("'xxx")


def test_error_policy_raises_or_writes_dead_letters():
    pol = ErrorPolicy("parse", 3, None)
    with pytest.raises(UserFunctionError) as info:
        pol.on_error({"r": 1}, 7, ValueError("bad"))
    e = info.value
    assert (e.operator, e.task_index, e.record, e.cause) == ("parse", 3, "{'r': 1}", "ValueError: bad")
    assert "dead_letter" in str(e)
    w = ListWriter()
    pol = ErrorPolicy("parse", 3, w)
    pol.on_error({"r": 1}, 7, ValueError("bad"))
    assert w.rows == [(("parse", 3, {"r": 1}, "ValueError: bad"), 7)]
    assert pol.dead_letters == 1


def test_stateless_runner_kinds_and_slow_path():
    dead = ListWriter()
    pol = ErrorPolicy("op", 0, dead)
    m = StatelessRunner(op_def(g.MAP, lambda v: 10 // v), pol)
    assert m.process([1, 2, 5], [1, 2, 3]) == ([10, 5, 2], [1, 2, 3])
    assert m.process([1, 0, 5], [1, 2, 3]) == ([10, 2], [1, 3])
    assert [r for r, _ in dead.rows] == [("op", 0, 0, "ZeroDivisionError: integer division or modulo by zero")]
    f = StatelessRunner(op_def(g.FILTER, lambda v: v % 2), pol)
    assert f.process([1, 2, 3, 4], [10, 20, 30, 40]) == ([1, 3], [10, 30])

    def explode(v):
        yield v
        if v == "bad":
            raise RuntimeError("mid-way")
        yield v.upper()

    fm = StatelessRunner(op_def(g.FLAT_MAP, explode), pol)
    # a record that fails part-way emits nothing; timestamps follow their records
    assert fm.process(["a", "bad", "c"], [1, 2, 3]) == (["a", "A", "c", "C"], [1, 1, 3, 3])
    assert dead.rows[-1] == (("op", 0, "bad", "RuntimeError: mid-way"), 2)
    out = ListWriter()
    sk = StatelessRunner(op_def(g.SINK, None), pol, out)
    assert sk.process(["x", "y"], [5, 6]) == ([], [])
    assert out.rows == [("x", 5), ("y", 6)]


class Emit(KeyedProcessFunction):
    def open(self, ctx):
        self.n = ctx.value_state("n", 0)

    def process_element(self, value, ctx):
        self.n.update(self.n.value() + 1)
        yield (ctx.key, self.n.value(), ctx.timestamp)
        if value[1] == "boom":
            raise ValueError("boom")
        yield ("after", ctx.key)


def keyed_runner(fn: Any, dead: SinkWriter | None, groups=range(N)) -> KeyedRunner:
    kind = g.REDUCE if isinstance(fn, ReduceFunction) else g.PROCESS
    backend = KeyedStateBackend(N)
    for kg in groups:
        backend.own(kg)
    return KeyedRunner(op_def(kind, fn), ErrorPolicy("op", 1, dead), backend, 1,
                       ManualClock(), lambda: MIN_WATERMARK)


def test_keyed_runner_process_partial_output_of_a_failed_record_is_dropped():
    dead = ListWriter()
    r = keyed_runner(Emit(), dead)
    keys = ["a", "b", "a"]
    vals = [("a", 1), ("b", "boom"), ("a", 2)]
    out, ts = r.process(vals, [10, 20, 30], keys, [key_group_of(k, N) for k in keys])
    assert out == [("a", 1, 10), ("after", "a"), ("a", 2, 30), ("after", "a")]
    assert ts == [10, 10, 30, 30]
    assert dead.rows == [(("op", 1, ("b", "boom"), "ValueError: boom"), 20)]


def test_keyed_runner_reduce_and_unowned_group_is_never_dead_lettered():
    dead = ListWriter()
    r = keyed_runner(ReduceFunction(lambda a, b: a + b), dead, groups=[key_group_of("a", N)])
    out, _ = r.process([1, 2, 3], [0, 0, 0], ["a"] * 3, [key_group_of("a", N)] * 3)
    assert out == [1, 3, 6]
    other = next(k for k in "bcdefghijk" if key_group_of(k, N) != key_group_of("a", N))
    with pytest.raises(UnknownKeyGroupError, match="does not own"):
        r.process([1], [0], [other], [key_group_of(other, N)])
    assert dead.rows == []


def test_keyed_runner_reduce_follows_its_groups_leaving_and_arriving():
    """The reduce keeps its key groups' tables between batches; a group removed, installed
    (with other state) or re-owned empty is read afresh, and one removed is refused."""
    a = key_group_of("a", N)
    r = keyed_runner(ReduceFunction(lambda x, y: x + y), ListWriter(), groups=[a])
    assert r.process([1, 2], [0, 1], ["a"] * 2, [a] * 2)[0] == [1, 3]
    other = keyed_runner(ReduceFunction(lambda x, y: x + y), ListWriter(), groups=[a])
    other.process([100], [0], ["a"], [a])
    data = other.backend.snapshot(a)
    r.backend.remove(a)
    with pytest.raises(UnknownKeyGroupError, match="does not own"):
        r.process([1], [0], ["a"], [a])
    r.backend.install(a, data)  # the group arrives with the other task's state
    assert r.process([5], [2], ["a"], [a]) == ([105], [2])
    r.backend.remove(a)
    r.backend.own(a)  # back, empty
    assert r.process([7], [3], ["a"], [a]) == ([7], [3])


class _TellingReader:
    """A partition reader that records what the task tells it (retain, committed)."""

    def __init__(self, inner: Any, pid: str, told: list) -> None:
        self.inner, self.pid, self.told = inner, pid, told

    def poll(self, max_records: int) -> Any:
        return self.inner.poll(max_records)

    def offset(self) -> Any:
        return self.inner.offset()

    def seconds_until_ready(self) -> float:
        return self.inner.seconds_until_ready()

    def backlog(self) -> Any:
        return None

    def retain_until_committed(self) -> None:
        self.told.append(("retain", self.pid))

    def committed(self, state: Any) -> None:
        self.told.append(("committed", self.pid, state))

    def close(self) -> None:
        self.inner.close()


class _TellingSource(TestingSource):
    told: list = []

    def open_partition(self, partition: str, resume: Any, clock: Any) -> Any:
        return _TellingReader(super().open_partition(partition, resume, clock), partition,
                              _TellingSource.told)


@pytest.mark.parametrize("checkpointing", [True, False])
def test_a_source_reader_learns_which_positions_a_complete_checkpoint_holds(
        clock, sink, tmp_path, checkpointing):
    """In a job that checkpoints, each partition's reader is told to retain what it read
    until committed, and, once a checkpoint completes, the position it holds (a source
    that drops what it read, like the Spark bridge, keeps what a recovery may replay)."""
    _TellingSource.told = told = []
    cfg = JobConfig(batch_size=5, linger_ms=0, metrics_port=None,
                    checkpoint_interval_s=60.0 if checkpointing else None)
    job = StreamJob("rs", num_key_groups=N, config=cfg)
    (job.source(_TellingSource(records_for(40)), name="src", parallelism=1)
        .key_by(lambda r: r[0]).reduce(lambda a, b: (a[0], a[1] + b[1]), name="sum",
                                       parallelism=2)
        .sink(sink, name="out"))
    net = Net(job, clock)
    assert told == ([("retain", "0-of-1")] if checkpointing else [])
    net["src/0"].poll_source(15)
    net.pump()
    cps = harness.Checkpoints(net, str(tmp_path / "chk"), net.pump)
    cps.take()
    net["src/0"].poll_source(10)  # read on after the checkpoint: not committed
    net.pump()
    assert told[1:] == ([("committed", "0-of-1", 15)] if checkpointing else [])
    cps.take()
    assert told[2:] == ([("committed", "0-of-1", 25)] if checkpointing else [])
