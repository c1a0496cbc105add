"""Change of logic on task cores stepped by hand: the function switches exactly at the
barrier aligned over the task's inputs, keyed state stays, a refusal leaves the old
function; and what a new function may be for each kind of operator."""

from __future__ import annotations

import random
import tempfile
from typing import Any

import pytest

from engine.dataflow import graph as g
from engine.dataflow.config import JobConfig
from engine.errors import JobDefinitionError
from engine.io.testing import TestingSink
from engine.operators.builtin import with_function
from engine.operators.functions import ReduceFunction
from engine.operators.windows import AggregateFunction, WindowOperator
from engine.time.clock import ManualClock
from engine.time.event_time import tumbling_event_time
from engine.wire.messages import Ack, DiscardLogic, InjectLogicBarrier, LogicChanged, SwitchLogic
from tests.harness import wire
from tests.jobs import Tag
from tests.unit.test_drrs_core import DNet, drrs_job

CFG = JobConfig(batch_size=3, linger_ms=0, metrics_port=None)


def _net(records: list[tuple[int, int]], src_p: int, sum_p: int) -> tuple[DNet, TestingSink]:
    sink = TestingSink(tempfile.mkdtemp(prefix="reflow-logic-"))
    return DNet(drrs_job(records, sink, sum_p=sum_p, src_p=src_p, fn=Tag("v1"), config=CFG),
                ManualClock()), sink


def _stage(net: DNet, version: int, tag: str) -> None:
    for name in net.dep.tasks["sum"]:
        net.cores[name].stage_logic(version, "sum", Tag(tag))


def _inject(net: DNet, version: int) -> dict[str, int]:
    """Each source sends the barrier now; returns how many records each had read."""
    read = {}
    for u in net.dep.tasks["src"]:
        ids = tuple(net.ids.get(0, u, t) for t in net.dep.tasks["sum"])
        assert net.cores[u].handle(wire(InjectLogicBarrier(version, ids))) == Ack()
        read[u] = sum(net.cores[u].source_offsets().values())  # one partition per task
    return read


@pytest.mark.parametrize("seed", range(6))
def test_the_function_switches_exactly_at_the_barrier_and_keeps_the_state(seed):
    rng = random.Random(seed)
    src_p, sum_p = rng.choice([1, 2]), rng.choice([1, 2, 3])
    records = [(rng.randrange(12), i) for i in range(240)]
    net, sink = _net(records, src_p, sum_p)
    for _ in range(rng.randint(2, 20)):  # some records before, some still in flight
        for u in net.sources():
            u.poll_source(rng.randint(1, 5))
        net._random_round(rng, 10**9)
    _stage(net, 1, "v2")
    read = _inject(net, 1)
    while any(c.status == "running" for c in net.sources()):
        for u in net.sources():
            u.poll_source(rng.randint(1, 5))
        net._random_round(rng, 10**9)
    net.pump()
    out = sink.results()
    assert len(out) == len(records)
    # which source task read record i: TestingSource splits records i::p
    for _, i, _, tag in out:
        src = net.dep.tasks["src"][i % src_p]
        before = (i // src_p) < read[src]  # read by its source before the barrier left it
        assert tag == ("v1" if before else "v2"), (i, tag, read)
    counts: dict[int, list[int]] = {}
    for key, _, count, _ in out:
        counts.setdefault(key, []).append(count)
    for key, seen in counts.items():  # the count state survived the switch
        assert sorted(seen) == list(range(1, len(seen) + 1)), key
    reports = [r for c in net.cores.values() for r in c.reports if isinstance(r, LogicChanged)]
    assert sorted(r.task for r in reports) == sorted(net.dep.tasks["sum"])
    assert all(r.version == 1 and r.operator == "sum" for r in reports)


def test_a_channel_that_delivered_the_barrier_waits_for_the_others():
    records = [(1, i) for i in range(40)]
    net, sink = _net(records, 2, 1)
    _stage(net, 1, "v2")
    s0, s1 = net.sources()
    s0.poll_source(4)
    ids0 = (net.ids.get(0, net.dep.tasks["src"][0], net.dep.tasks["sum"][0]),)
    s0.handle(wire(InjectLogicBarrier(1, ids0)))
    s0.poll_source(4)  # records after the barrier on channel 0
    net.pump()
    tags = {r[1]: r[3] for r in sink.results()}
    # s0's first 4 records (0, 2, 4, 6) are in; its next 4 wait behind the barrier
    assert tags == {0: "v1", 2: "v1", 4: "v1", 6: "v1"}
    s1.poll_source(3)  # 1, 3, 5: still before s1's barrier
    net.pump()
    assert {i: t for i, t in ((r[1], r[3]) for r in sink.results())}.get(1) == "v1"
    ids1 = (net.ids.get(0, net.dep.tasks["src"][1], net.dep.tasks["sum"][0]),)
    s1.handle(wire(InjectLogicBarrier(1, ids1)))
    s1.poll_source(3)
    net.pump()
    tags = {r[1]: r[3] for r in sink.results()}
    assert [tags[i] for i in (8, 10, 12, 14)] == ["v2"] * 4
    assert [tags[i] for i in (1, 3, 5)] == ["v1"] * 3 and tags[7] == "v2"


def test_a_discarded_function_is_never_used_and_a_source_switches_on_its_own():
    records = [(1, i) for i in range(10)]
    net, sink = _net(records, 1, 1)
    _stage(net, 1, "v2")
    for n in net.dep.tasks["sum"]:
        assert net.cores[n].handle(wire(DiscardLogic(1))) == Ack()
    net.run_sources()
    assert {r[3] for r in sink.results()} == {"v1"}
    # a task without inputs (a source's chain) switches at the control message itself
    src = net.sources()[0]
    src.chain.runners = []  # nothing after the source head here: stage needs the operator
    with pytest.raises(ValueError, match="not in this task's chain"):
        src.stage_logic(2, "sum", Tag("v3"))
    with pytest.raises(Exception, match="no function was staged"):
        net.cores[net.dep.tasks["sum"][0]].handle(wire(SwitchLogic(7)))


class Explodes(Tag):
    def open(self, ctx: Any) -> None:
        raise RuntimeError("cannot open")


def test_a_function_whose_open_raises_is_refused_at_staging():
    net, _ = _net([(1, 1)], 1, 1)
    with pytest.raises(RuntimeError, match="cannot open"):
        net.cores[net.dep.tasks["sum"][0]].stage_logic(1, "sum", Explodes("x"))


class Sum(AggregateFunction):
    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, acc: int) -> int:
        return acc + value


def test_what_a_new_function_may_be_for_each_kind():
    def op(kind: str, fn: Any) -> g.OperatorDef:
        inputs = () if kind == g.SOURCE else (g.InputDef("u", (lambda r: r) if kind in (
            g.PROCESS, g.REDUCE) else None),)
        return g.OperatorDef("x", kind, fn, 1, inputs)

    assert with_function(op(g.MAP, str), len).fn is len
    reduced = with_function(op(g.REDUCE, ReduceFunction(max)), min).fn
    assert isinstance(reduced, ReduceFunction) and reduced.fn is min
    new = Tag("v2")
    assert with_function(op(g.PROCESS, Tag("v1")), new).fn is new
    win = WindowOperator(tumbling_event_time(10), "aggregate", Sum(), None, 5)
    swapped = with_function(op(g.PROCESS, win), Sum()).fn
    assert isinstance(swapped, WindowOperator) and swapped.assigner is win.assigner
    assert swapped.lateness == 5 and swapped.kind == "aggregate"
    for bad, match in [
        (lambda: with_function(op(g.MAP, str), 3), "must be a function"),
        (lambda: with_function(op(g.REDUCE, ReduceFunction(max)), Tag("v")), "two values"),
        (lambda: with_function(op(g.PROCESS, Tag("v1")), len), "KeyedProcessFunction"),
        (lambda: with_function(op(g.PROCESS, win), len), "AggregateFunction"),
        (lambda: with_function(op(g.SOURCE, None), len), "sources and sinks"),
    ]:
        with pytest.raises(JobDefinitionError, match=match):
            bad()
