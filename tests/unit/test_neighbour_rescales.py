"""Live rescales of operators that exchange records run one at a time.

Each rescale's coordinator wires its new tasks to the deployment it started from, so two
neighbours rescaling at once would each miss the other's new or removed tasks (a new
upstream task sending by a stale assignment, or a channel to a task that is gone). The
rescaler refuses the later of two such requests; a controller's round runs the decisions
of neighbouring operators one after the other (``neighbourhoods``)."""

from __future__ import annotations

from engine.api import StreamJob
from engine.dataflow.physical import plan_physical
from engine.io.testing import TestingSink, TestingSource
from engine.runtime.controller_runner import neighbourhoods


def two_stage_plan():
    """src -> a (keyed) -> b (keyed) -> out; c is keyed beside them, on its own branch."""
    job = StreamJob("n", num_key_groups=8)
    s = job.source(TestingSource([(1, 1)]), name="src")
    (s.key_by(lambda r: r[0]).reduce(lambda x, y: x, name="a")
        .key_by(lambda r: r[0]).reduce(lambda x, y: x, name="b")
        .sink(TestingSink(), name="out"))
    s.key_by(lambda r: r[0]).reduce(lambda x, y: x, name="c").sink(TestingSink(), name="o2")
    return plan_physical(job.graph())


def test_neighbours_are_the_vertices_on_either_side_of_an_edge():
    plan = two_stage_plan()
    assert plan.neighbours("a") == {"src", "b"}
    assert plan.neighbours("b") == {"a"}  # its sink is chained into it
    assert plan.neighbours("c") == {"src"}
    assert "a" not in plan.neighbours("c")


def test_a_round_runs_neighbours_in_turn_and_the_others_at_once():
    plan = two_stage_plan()
    groups = neighbourhoods(plan, {"a": ["scale a"], "c": ["scale c"], "b": ["scale b"]})
    assert sorted(groups) == [["scale a", "scale b"], ["scale c"]]
    # an operator the plan does not know is its own group (refused when carried out)
    groups = neighbourhoods(plan, {"nope": ["x"], "a": ["y"]})
    assert sorted(groups) == [["x"], ["y"]]
    assert neighbourhoods(plan, {}) == []


def test_neighbours_reach_through_stateless_operators():
    """src -> a (keyed) -> m (map, another parallelism: a rebalance edge) -> b (keyed): m
    passes a's watermark holds and order markers on to b, so a and b are neighbours."""
    job = StreamJob("n", num_key_groups=8)
    (job.source(TestingSource([(1, 1)]), name="src")
        .key_by(lambda r: r[0]).reduce(lambda x, y: x, name="a", parallelism=2)
        .map(lambda r: r, name="m", parallelism=3)
        .key_by(lambda r: r[0]).reduce(lambda x, y: x, name="b")
        .sink(TestingSink(), name="out"))
    plan = plan_physical(job.graph())
    assert plan.neighbours("a") == {"src", "m", "b"}
    assert plan.neighbours("b") == {"m", "a"}
    assert plan.neighbours("m") == {"a", "b"}
    assert plan.neighbours("src") == {"a"}
