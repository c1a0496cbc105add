"""Unit tests for engine.dataflow.physical (chaining, rescaled plans), engine.dataflow.deployment (task names,
assignments, Connect wiring, stable channel ids) and migration.protocols.stop_restart."""

from __future__ import annotations

from collections import Counter

import pytest

from engine.api import StreamJob
from engine.dataflow.deployment import (
    ChannelIds,
    Deployment,
    connect_messages,
    initial_deployment,
    task_name,
)
from engine.dataflow.keygroups import key_groups_of_task, uniform_assignment
from engine.dataflow.physical import FORWARD, KEYED, REBALANCE, PhysicalPlan, plan_physical
from engine.errors import RescaleRefused
from engine.io.testing import TestingSink, TestingSource
from engine.wire.messages import Connect, decode_message, encode_message
from migration.protocols.stop_restart import PHASES, plan_stop_restart

SRC = TestingSource([])


def key(r):
    return r[0]


def chains(plan: PhysicalPlan) -> dict[str, tuple[list[str], int]]:
    return {v.name: ([op.name for op in v.operators], v.parallelism) for v in plan.vertices}


def edges(plan: PhysicalPlan) -> list[tuple[str, str, str]]:
    return [(e.src, e.dst, e.partitioning) for e in plan.edges]


def running_sum_plan(src_p=2, sum_p=2, out_p=1, num_key_groups=16) -> PhysicalPlan:
    job = StreamJob("rs", num_key_groups=num_key_groups)
    (job.source(SRC, name="src", parallelism=src_p)
        .map(lambda r: r, name="parse")
        .key_by(key)
        .reduce(lambda a, b: (a[0], a[1] + b[1]), name="sum", parallelism=sum_p)
        .map(lambda r: r, name="fmt")
        .sink(TestingSink(), name="out", parallelism=out_p))
    return plan_physical(job.graph())


# ---------------------------------------------------------------- chaining


def test_source_map_filter_chain_into_one_vertex():
    job = StreamJob("j", parallelism=3)
    (job.source(SRC, name="src").map(str, name="m").filter(bool, name="f")
        .sink(TestingSink(), name="out"))
    plan = plan_physical(job.graph())
    assert chains(plan) == {"src": (["src", "m", "f", "out"], 3)}
    assert plan.edges == ()
    v = plan.vertex("src")
    assert v.is_source and v.has_sink and not v.keyed
    assert plan.vertex_of("f").name == "src"


def test_key_by_breaks_the_chain_and_keyed_vertex_chains_its_followers():
    plan = running_sum_plan(src_p=2, sum_p=2, out_p=2)
    assert chains(plan) == {"src": (["src", "parse"], 2), "sum": (["sum", "fmt", "out"], 2)}
    assert edges(plan) == [("src", "sum", KEYED)]
    e = plan.edges[0]
    assert e.key_fn is key and e.edge_id == 0 and e.port == 0
    assert plan.vertex("sum").keyed and plan.vertex("sum").has_sink
    assert plan.num_key_groups == 16


def test_different_parallelism_breaks_the_chain_with_a_rebalance_edge():
    job = StreamJob("j")
    (job.source(SRC, name="src", parallelism=1).map(str, name="m", parallelism=3)
        .filter(bool, name="f").sink(TestingSink(), name="out", parallelism=2))
    plan = plan_physical(job.graph())
    assert chains(plan) == {"src": (["src"], 1), "m": (["m", "f"], 3), "out": (["out"], 2)}
    assert edges(plan) == [("src", "m", REBALANCE), ("m", "out", REBALANCE)]
    assert [e.key_fn for e in plan.edges] == [None, None]


def test_upstream_with_two_consumers_does_not_chain():
    job = StreamJob("j", parallelism=2)
    s = job.source(SRC, name="src")
    s.map(str, name="a").sink(TestingSink(), name="out-a")
    s.map(repr, name="b").sink(TestingSink(), name="out-b")
    plan = plan_physical(job.graph())
    assert chains(plan) == {
        "src": (["src"], 2), "a": (["a", "out-a"], 2), "b": (["b", "out-b"], 2)}
    assert edges(plan) == [("src", "a", FORWARD), ("src", "b", FORWARD)]
    assert [e.edge_id for e in plan.edges] == [0, 1]
    assert [e.dst for e in plan.outputs_of("src")] == ["a", "b"]
    assert [e.src for e in plan.inputs_of("a")] == ["src"]


def test_union_inputs_make_a_new_vertex():
    job = StreamJob("j", parallelism=2)
    a = job.source(SRC, name="a").map(str, name="ma")
    b = job.source(SRC, name="b")
    a.union(b).map(str, name="u").sink(TestingSink(), name="out")
    plan = plan_physical(job.graph())
    assert chains(plan) == {
        "a": (["a", "ma"], 2), "b": (["b"], 2), "u": (["u", "out"], 2)}
    assert edges(plan) == [("a", "u", FORWARD), ("b", "u", FORWARD)]


def test_keyed_union_gives_one_keyed_edge_per_input():
    job = StreamJob("j", num_key_groups=8, parallelism=2)
    a = job.source(SRC, name="a")
    b = job.source(SRC, name="b", parallelism=1)
    a.union(b).key_by(key).reduce(lambda x, y: x, name="r").sink(TestingSink(), name="out")
    plan = plan_physical(job.graph())
    assert chains(plan) == {"a": (["a"], 2), "b": (["b"], 1), "r": (["r", "out"], 2)}
    assert edges(plan) == [("a", "r", KEYED), ("b", "r", KEYED)]
    assert all(e.key_fn is key for e in plan.edges)


# ---------------------------------------------------------------- rescaled


def test_rescaled_refuses_to_turn_a_forward_edge_into_rebalance_and_keeps_chains():
    """A forward edge keeps its meaning: a change of parallelism on one side is refused
    naming the edge (it never silently becomes a rebalance edge); both sides together, or a
    vertex on rebalance edges, rescale with their chains."""
    job = StreamJob("j", num_key_groups=8, parallelism=2)
    s = job.source(SRC, name="src")
    s.map(str, name="a").filter(bool, name="fa").sink(TestingSink(), name="out-a")
    s.map(repr, name="b").sink(TestingSink(), name="out-b")
    plan = plan_physical(job.graph())
    assert edges(plan) == [("src", "a", FORWARD), ("src", "b", FORWARD)]
    with pytest.raises(RescaleRefused, match="'src' -> 'a' is a forward edge"):
        plan.rescaled("a", 5)
    with pytest.raises(RescaleRefused, match="'src' -> 'a' is a forward edge"):
        plan.check_rescale("a", 5)
    with pytest.raises(RescaleRefused, match="is a forward edge"):
        plan.rescaled("src", 3)
    plan.check_rescale("a", 2)  # the same parallelism: nothing changes
    r = plan.with_parallelism({"src": 5, "a": 5, "b": 5})
    assert chains(r) == {
        "src": (["src"], 5), "a": (["a", "fa", "out-a"], 5), "b": (["b", "out-b"], 5)}
    assert all(op.parallelism == 5 for op in r.vertex("a").operators)
    assert edges(r) == [("src", "a", FORWARD), ("src", "b", FORWARD)]
    assert [e.edge_id for e in r.edges] == [0, 1]
    # the original plan is a value: untouched
    assert edges(plan) == [("src", "a", FORWARD), ("src", "b", FORWARD)]
    assert plan.vertex("a").parallelism == 2
    assert plan.forward_edges_of("b") == [plan.edges[1]]


def test_rescaled_keeps_a_rebalance_edge_at_any_parallelism():
    job = StreamJob("j", num_key_groups=8, parallelism=2)
    (job.source(SRC, name="src", parallelism=1).map(str, name="a", parallelism=2)
        .sink(TestingSink(), name="o"))
    plan = plan_physical(job.graph())
    assert edges(plan) == [("src", "a", REBALANCE)]
    for p in (1, 3):  # equal parallelism too: the edge stays a rebalance edge
        assert edges(plan.rescaled("a", p)) == [("src", "a", REBALANCE)]


def test_rescaled_keyed_vertex_keeps_keyed_edge_and_key_groups():
    plan = running_sum_plan(src_p=2, sum_p=2, out_p=2)
    r = plan.rescaled("sum", 3)
    assert chains(r) == {"src": (["src", "parse"], 2), "sum": (["sum", "fmt", "out"], 3)}
    assert edges(r) == [("src", "sum", KEYED)]
    assert r.edges[0].key_fn is key
    assert r.num_key_groups == 16


# ---------------------------------------------------------------- deployment


def test_initial_deployment_names_tasks_and_assigns_key_groups_uniformly():
    plan = running_sum_plan(src_p=2, sum_p=3, out_p=1)
    dep = initial_deployment(plan, "job-1")
    assert dep.tasks == {
        "src": ("job-1/src/0/g0", "job-1/src/1/g0"),
        "sum": ("job-1/sum/0/g0", "job-1/sum/1/g0", "job-1/sum/2/g0"),
        "out": ("job-1/out/0/g0",),
    }
    assert dep.assignments == {"sum": uniform_assignment(16, 3)}
    assert dep.task_names() == ["job-1/src/0/g0", "job-1/src/1/g0", "job-1/sum/0/g0",
                                "job-1/sum/1/g0", "job-1/sum/2/g0", "job-1/out/0/g0"]
    assert dep.key_groups_of("sum", 1) == tuple(key_groups_of_task(uniform_assignment(16, 3), 1))
    assert dep.key_groups_of("sum", 0) == (0, 1, 2, 3, 4, 5)
    assert dep.key_groups_of("src", 0) == ()
    assert task_name("j", "v", 4, 7) == "j/v/4/g7"


def test_a_rescale_that_started_earlier_never_sets_the_generation_back():
    """Two vertices rescale at once, each coordinator from the deployment it started with.
    The source's started at generation 0; meanwhile 'sum' scaled out (g1), in, and out
    again (g2), then in. The source's update (generation 1) must not set the job back to
    1, or the next scale-out of 'sum' would name its new task 'sum/2/g2' again: the name
    of a task that existed and was removed (a KeyError on that name in the JobMaster)."""
    plan = running_sum_plan(src_p=1, sum_p=2, out_p=1)
    start = initial_deployment(plan, "j")
    dep = start
    seen: set[str] = set(dep.task_names())
    for step, p in enumerate((3, 2, 3, 2)):
        tasks = dep.tasks["sum"]
        gen = dep.generation + 1 if p > len(tasks) else None
        if gen is not None:
            tasks = (*tasks, *(task_name("j", "sum", i, gen) for i in range(len(tasks), p)))
        else:
            tasks = tasks[:p]
        dep = dep.with_vertex("sum", tasks, uniform_assignment(16, p), gen)
        seen.update(dep.task_names())
        assert dep.generation == (1 if step < 2 else 2)
    # the source's coordinator, started from ``start``, deploys its new task at g1
    src_gen = start.generation + 1
    dep = dep.with_vertex("src", (*start.tasks["src"], task_name("j", "src", 1, src_gen)),
                          None, src_gen)
    assert dep.generation == 2
    new = task_name("j", "sum", 2, dep.generation + 1)
    assert new not in seen


def test_deployment_validates_task_counts_and_assignments():
    plan = running_sum_plan(src_p=1, sum_p=2, out_p=1)
    dep = initial_deployment(plan, "j")
    with pytest.raises(ValueError, match="'sum' needs 2 tasks"):
        Deployment(plan, "j", {**dep.tasks, "sum": ("only-one",)}, dep.assignments)
    with pytest.raises(ValueError, match="no valid assignment"):
        Deployment(plan, "j", dep.tasks, {"sum": (0, 2) * 8})
    with pytest.raises(ValueError, match="no valid assignment"):
        Deployment(plan, "j", dep.tasks, {"sum": (0, 1) * 4})
    with pytest.raises(ValueError, match="no valid assignment"):
        Deployment(plan, "j", dep.tasks, {})


def _check_wiring(dep: Deployment, msgs: dict[str, Connect]) -> None:
    """Every channel is an output of exactly one task and an input of exactly one task, and
    the receiver is the channel's target."""
    assert set(msgs) == set(dep.task_names())
    senders = Counter(c.channel_id for m in msgs.values() for e in m.outputs for c in e.channels)
    receivers = Counter(cid for m in msgs.values() for cid, _ in m.inputs)
    assert set(senders) == set(receivers)
    assert all(n == 1 for n in senders.values())
    assert all(n == 1 for n in receivers.values())
    for m in msgs.values():
        for e in m.outputs:
            for c in e.channels:
                assert (c.channel_id, c.port) in msgs[c.target].inputs


def test_connect_messages_wire_every_channel_once():
    plan = running_sum_plan(src_p=2, sum_p=3, out_p=1)
    dep = initial_deployment(plan, "j")
    msgs = connect_messages(dep, ChannelIds())
    _check_wiring(dep, msgs)
    src0, sum0, out0 = "j/src/0/g0", "j/sum/0/g0", "j/out/0/g0"
    # keyed: every source task reaches every sum task, routing equals the assignment
    [e] = msgs[src0].outputs
    assert e.partitioning == KEYED and e.edge_id == 0
    assert [c.target for c in e.channels] == list(dep.tasks["sum"])
    assert e.routing == dep.assignments["sum"] == uniform_assignment(16, 3)
    # rebalance: every sum task reaches the one sink task
    [e] = msgs[sum0].outputs
    assert e.partitioning == REBALANCE and [c.target for c in e.channels] == [out0]
    assert e.routing == ()
    assert msgs[src0].inputs == ()
    assert len(msgs[sum0].inputs) == 2 and len(msgs[out0].inputs) == 3
    assert msgs[out0].outputs == ()
    assert sum(len(m.inputs) for m in msgs.values()) == 2 * 3 + 3 * 1
    # sorted inputs, and they survive the wire
    for m in msgs.values():
        assert list(m.inputs) == sorted(m.inputs)
        assert decode_message(encode_message(m)) == m


def test_connect_messages_forward_edge_pairs_tasks_by_index():
    job = StreamJob("j", parallelism=3)
    s = job.source(SRC, name="src")
    s.map(str, name="a").sink(TestingSink(), name="oa")
    s.map(str, name="b").sink(TestingSink(), name="ob")
    dep = initial_deployment(plan_physical(job.graph()), "j")
    msgs = connect_messages(dep, ChannelIds())
    _check_wiring(dep, msgs)
    for i in range(3):
        outs = msgs[f"j/src/{i}/g0"].outputs
        assert [(e.partitioning, [c.target for c in e.channels]) for e in outs] == [
            (FORWARD, [f"j/a/{i}/g0"]), (FORWARD, [f"j/b/{i}/g0"])]


def test_channel_ids_are_stable_for_surviving_pairs():
    ids = ChannelIds()
    a = ids.get(0, "s", "d")
    b = ids.get(0, "s", "e")
    c = ids.get(1, "s", "d")
    assert len({a, b, c}) == 3
    assert ids.get(0, "s", "d") == a and ids.get(1, "s", "d") == c


def test_channel_ids_stable_across_a_rescaled_deployment():
    plan = running_sum_plan(src_p=2, sum_p=2, out_p=1)
    dep = initial_deployment(plan, "j")
    ids = ChannelIds()
    before = connect_messages(dep, ids)

    def by_pair(msgs: dict[str, Connect]) -> dict[tuple[int, str, str], int]:
        return {(e.edge_id, src, c.target): c.channel_id
                for src, m in msgs.items() for e in m.outputs for c in e.channels}

    old = by_pair(before)
    # sum 2 -> 3 keeping tasks 0 and 1 (a protocol that keeps surviving tasks) and a
    # stop-restart style one (all sum tasks new)
    new_plan = plan.rescaled("sum", 3)
    kept = dict(dep.tasks, sum=(*dep.tasks["sum"], task_name("j", "sum", 2, 1)))
    dep_kept = Deployment(new_plan, "j", kept, {"sum": uniform_assignment(16, 3)}, 1)
    after = connect_messages(dep_kept, ids)
    _check_wiring(dep_kept, after)
    new = by_pair(after)
    survivors = set(old) & set(new)
    assert len(survivors) == 2 * 2 + 2 * 1  # src x old sum, old sum -> out
    assert all(old[p] == new[p] for p in survivors)
    fresh = {new[p] for p in set(new) - set(old)}
    assert len(fresh) == 2 + 1 and not fresh & set(old.values())
    # the keyed routing follows the new assignment
    for s in dep.tasks["src"]:
        assert after[s].outputs[0].routing == uniform_assignment(16, 3)

    gen = {**dep.tasks, "sum": tuple(task_name("j", "sum", i, 2) for i in range(3))}
    dep_sr = Deployment(new_plan, "j", gen, {"sum": uniform_assignment(16, 3)}, 2)
    sr = by_pair(connect_messages(dep_sr, ids))
    assert not set(sr) & set(old)  # every pair touches a new task: all ids are new
    assert not set(sr.values()) & (set(old.values()) | set(new.values()))


# ---------------------------------------------------------------- stop-restart plan


def test_plan_stop_restart_scale_out_moves_groups_whose_owner_changes():
    old = uniform_assignment(8, 2)
    assert old == (0, 0, 0, 0, 1, 1, 1, 1)
    p = plan_stop_restart("sum", 2, old, 4, 8)
    assert p.new_assignment == (0, 0, 1, 1, 2, 2, 3, 3)
    assert p.moved == (2, 3, 4, 5, 6, 7)
    assert (p.operator, p.old_parallelism, p.new_parallelism) == ("sum", 2, 4)
    assert p.old_assignment == old


def test_plan_stop_restart_scale_in_and_same_parallelism():
    p = plan_stop_restart("sum", 3, uniform_assignment(6, 3), 2, 6)
    assert p.old_assignment == (0, 0, 1, 1, 2, 2)
    assert p.new_assignment == (0, 0, 0, 1, 1, 1)
    assert p.moved == (2, 4, 5)
    same = plan_stop_restart("sum", 2, uniform_assignment(6, 2), 2, 6)
    assert same.moved == ()


def test_plan_stop_restart_takes_a_given_assignment():
    p = plan_stop_restart("sum", 2, uniform_assignment(6, 2), 3, 6, (2, 2, 2, 0, 1, 1))
    assert p.new_assignment == (2, 2, 2, 0, 1, 1)
    assert p.moved == (0, 1, 2, 3)


def test_plan_stop_restart_non_keyed_vertex_moves_nothing():
    p = plan_stop_restart("m", 2, None, 5, 128)
    assert p.old_assignment == () and p.new_assignment == () and p.moved == ()
    assert p.new_parallelism == 5
    assert PHASES == ("savepoint", "restore")
