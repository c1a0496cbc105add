"""Change of logic in the seeded interleaving harness: the engine's own steps
(``engine.control.steps.ChangeLogicSteps``, run by ``tests.harness.change_logic`` as the
JobMaster runs them) change an operator's function mid-stream on task cores delivered like
the runtime delivers them (``tests.oracle_net``), and the outputs equal the reference.

The reference (the correctness oracle for a change of logic): a record read by its source
before the barrier left it (the source's read position when ``InjectLogicBarrier`` or, for
a source's chain, ``SwitchLogic`` was handled) goes through the old function, every later
record through the new one, and keyed state carries over. Keys are aligned with source
partitions (key ``i % KEYS`` of record ``i``, partition ``i % src_p``), so each key's
outputs have one order: the reference is a sequence per key, compared exactly. Every case
checks that records after the switch exist in the reference, so a change that did not
happen fails it; a rescale after the change checks that tasks created later run the new
function (``ReplaceOperator``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from engine.api import StreamJob
from engine.control.steps import ChangeLogicSteps, ReplaceOperator, StageLogic
from engine.dataflow.config import JobConfig
from engine.errors import ChangeLogicRefused, RescaleTimeout
from engine.io.sources import parse_indexed
from engine.io.testing import TestingSource
from engine.operators.functions import KeyedProcessFunction
from engine.wire.messages import DiscardLogic, InjectLogicBarrier, LogicChanged, SwitchLogic
from migration.coordinator import AwaitReports, Call, Phase, RescaleRequest, SendControl
from tests import harness
from tests.oracle_net import MemorySink, OracleNet

CFG = JobConfig(batch_size=3, linger_ms=0, metrics_port=None)
KEYS = 6
KEEP = 6  # records each source keeps back while the change runs: there is an "after"


class Label(KeyedProcessFunction):
    """Counts per key and labels each output: ``(*record, count, label)``."""

    def __init__(self, label: str) -> None:
        self.label = label

    def open(self, ctx: Any) -> None:
        self.count = ctx.value_state("count", 0)

    def process_element(self, value: Any, ctx: Any) -> Any:
        self.count.update(self.count.value() + 1)
        yield (*value, self.count.value(), self.label)


class ExplodesOnTask1(Label):
    """Opens on every task but task 1 (where its module would be missing, say)."""

    def open(self, ctx: Any) -> None:
        if ctx.task_index == 1:
            raise RuntimeError("cannot open")
        super().open(ctx)


def mark_m1(r: tuple) -> tuple:
    return (*r, "m1")


def mark_m2(r: tuple) -> tuple:
    return (*r, "m2")


def _job(n: int, src_p: int, tag_p: int, pre: Callable[[tuple], tuple] | None = None
         ) -> tuple[StreamJob, MemorySink, list[tuple[int, int]]]:
    """``src`` (``src_p`` tasks, one partition each) -> [``pre`` map, chained] -> key_by ->
    ``tag`` (``Label("v1")``, ``tag_p`` tasks) -> sink (chained)."""
    records = [(i % KEYS, i) for i in range(n)]
    sink = MemorySink()
    job = StreamJob("logic", num_key_groups=16, config=CFG)
    stream = job.source(TestingSource(records), name="src", parallelism=src_p)
    if pre is not None:
        stream = stream.map(pre, name="pre", parallelism=src_p)  # chained into src
    (stream.key_by(lambda r: r[0]).process(Label("v1"), name="tag", parallelism=tag_p)
        .sink(sink, name="out", parallelism=tag_p))
    return job, sink, records


class SplitRecorder:
    """``after_send``: the net's own, and each source task's read positions when the
    change's barrier (or switch) was handled there."""

    def __init__(self, net: OracleNet) -> None:
        self.net = net
        self.positions: dict[str, int] = {}  # partition -> records read before the switch

    def __call__(self, cmd: SendControl) -> None:
        for c in cmd.calls:
            if isinstance(c.message, (InjectLogicBarrier, SwitchLogic)):
                core = self.net.cores[c.task]
                if core.is_source:
                    self.positions.update(core.source_offsets())
        self.net.after_send(cmd)

    def before(self, i: int, src_p: int) -> bool:
        """Whether record ``i`` was read before its source's switch."""
        for pid, read in self.positions.items():
            j, n = parse_indexed(pid)
            assert n == src_p
            if i % n == j:
                return i // n < (read or 0)
        raise AssertionError(f"no switch position for record {i}: {self.positions}")


def _same(r: tuple) -> tuple:
    return r


def _reference(records: list[tuple[int, int]], before: Callable[[int], bool], *,
               pre: tuple[Callable[[tuple], tuple], Callable[[tuple], tuple]] = (_same, _same),
               labels: tuple[str, str] = ("v1", "v2")) -> dict[int, list[tuple]]:
    """Per key, the outputs in order: a record read before its source's switch goes
    through the old ``pre`` map and the old label, every later one through the new ones;
    the count (keyed state) runs on across the switch."""
    counts: dict[int, int] = {}
    out: dict[int, list[tuple]] = {}
    for key, i in records:
        counts[key] = counts.get(key, 0) + 1
        old = before(i)
        value = pre[0 if old else 1]((key, i))
        out.setdefault(key, []).append((*value, counts[key], labels[0 if old else 1]))
    return out


def _per_key(results: list[tuple]) -> dict[int, list[tuple]]:
    out: dict[int, list[tuple]] = {}
    for r in results:
        out.setdefault(r[0], []).append(r)
    return out


@pytest.mark.parametrize("seed", range(8))
def test_the_outputs_equal_the_reference_split_at_the_barrier(seed):
    rng = random.Random(seed)
    src_p, tag_p = rng.choice([1, 2]), rng.choice([1, 2, 3])
    job, sink, records = _job(rng.randint(60, 200), src_p, tag_p)
    net = OracleNet(job)
    try:
        for _ in range(rng.randint(0, 30)):  # some records before, some in flight
            net.round(rng, KEEP)
        rec = SplitRecorder(net)
        steps, report, done = harness.change_logic(net, "tag", Label("v2"),
                                                   lambda: net.round(rng, KEEP),
                                                   after_send=rec)
        net.finish(rng)
        expected = _reference(records, lambda i: rec.before(i, src_p))
        assert any(o[-1] == "v2" for outs in expected.values() for o in outs), \
            "the switch came after every record: nothing checks the new function"
        assert _per_key(sink.results()) == expected
        assert (report.operator, report.version, report.tasks) == ("tag", 1, tag_p)
        assert steps.committed and steps.done
        assert sum(isinstance(c, ReplaceOperator) for c in done.commands) == 1
        # the job's plan carries the new function: tasks created later run it
        tag_ops = [o for o in net.dep.plan.vertex_of("tag").operators if o.name == "tag"]
        assert tag_ops[0].fn.label == "v2"
    finally:
        sink.drop()


@pytest.mark.parametrize("seed", range(4))
def test_tasks_a_later_rescale_creates_run_the_new_function(seed):
    rng = random.Random(100 + seed)
    src_p, tag_p = rng.choice([1, 2]), rng.choice([1, 2])
    job, sink, records = _job(rng.randint(120, 240), src_p, tag_p)
    net = OracleNet(job)
    try:
        for _ in range(rng.randint(0, 10)):
            net.round(rng, 4 * KEEP)
        rec = SplitRecorder(net)
        harness.change_logic(net, "tag", Label("v2"), lambda: net.round(rng, 4 * KEEP),
                             after_send=rec)
        for _ in range(rng.randint(0, 5)):
            net.round(rng, 2 * KEEP)
        old_tasks = set(net.dep.tasks["tag"])
        _, rescale, _ = harness.rescale(net, RescaleRequest("tag", tag_p + 1, "drrs"),
                                        lambda: net.round(rng, KEEP),
                                        after_send=net.after_send)
        assert rescale.key_groups_moved > 0
        new_tasks = set(net.dep.tasks["tag"]) - old_tasks
        assert new_tasks
        net.finish(rng)
        by_new = [r for c in net.all_cores if c.name in new_tasks for r in [c.records_in]]
        assert sum(by_new) > 0, "the new tasks processed records"
        expected = _reference(records, lambda i: rec.before(i, src_p))
        assert _per_key(sink.results()) == expected
    finally:
        sink.drop()


@pytest.mark.parametrize("seed", range(4))
def test_a_chained_stateless_operator_in_a_source_task_switches_between_two_reads(seed):
    rng = random.Random(200 + seed)
    src_p, tag_p = rng.choice([1, 2]), rng.choice([1, 2])
    job, sink, records = _job(rng.randint(60, 150), src_p, tag_p, pre=mark_m1)
    net = OracleNet(job)
    try:
        for _ in range(rng.randint(1, 20)):
            net.round(rng, KEEP)
        rec = SplitRecorder(net)
        _, report, done = harness.change_logic(net, "pre", mark_m2,
                                               lambda: net.round(rng, KEEP), after_send=rec)
        sends = [c for c in done.commands if isinstance(c, SendControl)]
        assert all(isinstance(call.message, SwitchLogic) for call in sends[0].calls)
        assert report.tasks == src_p
        net.finish(rng)
        expected = _reference(records, lambda i: rec.before(i, src_p),
                              pre=(mark_m1, mark_m2), labels=("v1", "v1"))
        assert any(o[2] == "m2" for outs in expected.values() for o in outs)
        assert _per_key(sink.results()) == expected
    finally:
        sink.drop()


def test_a_refused_staging_discards_every_copy_and_the_old_function_runs_on():
    """Task 1 refuses the function, task 0 took it: the change is refused naming task 1,
    every task discards the version (task 0 would otherwise switch to label "x" at the next
    change's barrier), and the next change takes the next version."""
    rng = random.Random(7)
    job, sink, records = _job(80, 2, 2)
    net = OracleNet(job)
    try:
        for _ in range(5):
            net.round(rng, KEEP)
        tags = net.dep.tasks["tag"]
        with pytest.raises(ChangeLogicRefused, match="cannot open") as err:
            harness.change_logic(net, "tag", ExplodesOnTask1("x"), lambda: net.round(rng, KEEP))
        assert err.value.phase == "stage" and err.value.tasks == (tags[1],)
        assert "refused before any task switched" in str(err.value)
        rec = SplitRecorder(net)
        _, report, _ = harness.change_logic(net, "tag", Label("v2"),
                                            lambda: net.round(rng, KEEP), after_send=rec)
        assert report.version == 2
        net.finish(rng)
        assert _per_key(sink.results()) == _reference(records, lambda i: rec.before(i, 2))
    finally:
        sink.drop()


def test_a_refusal_leaves_the_discard_of_every_staged_copy_to_run():
    job, sink, _ = _job(20, 1, 2)
    net = OracleNet(job)
    try:
        from engine.operators.builtin import with_function

        op = next(o for o in net.dep.plan.vertex_of("tag").operators if o.name == "tag")
        steps = ChangeLogicSteps(with_function(op, ExplodesOnTask1("x")), 1, net.dep, net.ids,
                                 CFG, net.clock)
        ex = harness.InProcessExecutor(net, lambda: None)
        with pytest.raises(ChangeLogicRefused):
            ex.run(steps)
        assert not steps.committed and not steps.done
        assert [type(c).__name__ for c in ex.executed.commands] == ["StageLogic"]
        assert steps.release_commands() == [SendControl(tuple(
            Call(t, DiscardLogic(1)) for t in net.dep.tasks["tag"]), Phase.STAGE)]
    finally:
        sink.drop()


def test_requests_the_engine_refuses_are_refused_before_anything_is_staged():
    job, sink, _ = _job(20, 1, 1)
    net = OracleNet(job)
    try:
        with pytest.raises(ChangeLogicRefused, match="sources and sinks"):
            harness.change_logic(net, "src", len, lambda: None)
        with pytest.raises(ChangeLogicRefused, match="KeyedProcessFunction"):
            harness.change_logic(net, "tag", len, lambda: None)
        with pytest.raises(ChangeLogicRefused, match="no operator 'nope'"):
            harness.change_logic(net, "nope", len, lambda: None)
        net.finish(random.Random(1))
        with pytest.raises(ChangeLogicRefused, match="finishing"):
            harness.change_logic(net, "tag", Label("v2"), lambda: None)
        assert {r[-1] for r in sink.results()} == {"v1"}
    finally:
        sink.drop()


def test_tasks_that_never_switch_time_out_naming_them():
    job, sink, _ = _job(40, 1, 2)
    net = OracleNet(job)
    try:
        with pytest.raises(RescaleTimeout, match="phase switch") as err:
            # nothing is delivered: the barriers never reach the tasks
            harness.change_logic(net, "tag", Label("v2"), lambda: None, max_rounds=5)
        assert err.value.phase == "switch" and set(err.value.tasks) == set(net.dep.tasks["tag"])
    finally:
        sink.drop()


def test_the_steps_as_values():
    """Stage, then the barriers at every predecessor task on its channels to the vertex,
    wait for every task's ``LogicChanged`` of this version, then the plan changes."""
    job, sink, _ = _job(10, 2, 3)
    net = OracleNet(job)
    try:
        from engine.operators.builtin import with_function

        op = next(o for o in net.dep.plan.vertex_of("tag").operators if o.name == "tag")
        new = with_function(op, Label("v2"))
        steps = ChangeLogicSteps(new, 4, net.dep, net.ids, CFG, net.clock)
        tags = net.dep.tasks["tag"]
        assert steps.release_commands() == [SendControl(tuple(
            Call(t, DiscardLogic(4)) for t in tags), Phase.STAGE)]
        (stage,) = steps.start()
        assert stage == StageLogic("tag", 4, new.fn, tags) and not steps.committed
        (send,) = steps.on_result(stage, ())
        assert steps.committed and steps.release_commands() == []
        assert [c.task for c in send.calls] == list(net.dep.tasks["src"])
        for c in send.calls:
            assert c.message == InjectLogicBarrier(4, tuple(net.ids.get(0, c.task, t)
                                                           for t in tags))
        (wait,) = steps.on_result(send, [None] * len(send.calls))
        assert isinstance(wait, AwaitReports) and wait.tasks == tuple(sorted(tags))
        assert steps.on_report(LogicChanged(tags[0], "tag", 3, 9.0)) == []  # another version
        assert steps.on_report(LogicChanged(tags[0], "tag", 4, 0.5)) == []
        assert steps.on_report(LogicChanged(tags[1], "tag", 4, 0.25)) == []
        assert steps.waiting_for() == (tags[2],)
        (replace,) = steps.on_report(LogicChanged(tags[2], "tag", 4, 0.0))
        assert replace == ReplaceOperator(new)
        assert steps.on_result(replace, None) == [] and steps.done
        assert steps.report().alignment_s == 0.5 and steps.report().version == 4
        assert replace.apply(net.dep).plan.vertex_of("tag").operators[0].fn.label == "v2"
    finally:
        sink.drop()
