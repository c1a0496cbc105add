"""The skew balancer on synthetic metrics (tests/unit/pipeline_model.py)."""

from __future__ import annotations

from controllers.balancer import SkewBalancer
from engine.control.reconfiguration import NoChange, Rebalance
from migration.assignment import imbalance
from tests.unit.pipeline_model import Pipeline, Stage


def skewed(weights: list[float]) -> Pipeline:
    j = Pipeline([Stage("agg", 10_000, parallelism=len(weights), weights=weights)], 2_000)
    per_task = 128 // len(weights)
    total = sum(weights)
    j.group_load = {"agg": tuple(2_000 * weights[kg // per_task] / total / per_task
                                 for kg in range(128))}
    return j


def test_a_hot_task_gets_its_key_groups_spread():
    j = skewed([4, 1, 1, 1])
    (d,) = SkewBalancer().decide(j.window(), j.view())
    assert isinstance(d, Rebalance) and d.operator == "agg" and d.parallelism == 4
    loads = j.group_load["agg"]
    before = imbalance(loads, j.view().operator("agg").assignment, 4)
    assert before is not None and imbalance(loads, d.assignment, 4) < before - 0.5
    assert "task 0 of agg" in d.reason and "+300%" in d.reason


def test_below_the_threshold_nothing_moves():
    j = skewed([1.2, 1, 1, 1])
    (d,) = SkewBalancer(threshold=0.3).decide(j.window(), j.view())
    assert isinstance(d, NoChange) and "no skew above the threshold" in d.reason


def test_skew_without_group_loads_is_reported_not_guessed():
    j = skewed([4, 1, 1, 1])
    j.group_load = {}
    (d,) = SkewBalancer().decide(j.window(), j.view())
    assert isinstance(d, NoChange) and "no key group loads" in d.reason


def test_one_hot_key_group_cannot_be_split():
    j = skewed([4, 1, 1, 1])
    loads = [0.0] * 128
    loads[0] = 2_000.0  # all the load in one group: no assignment evens it
    j.group_load = {"agg": tuple(loads)}
    (d,) = SkewBalancer().decide(j.window(), j.view())
    assert isinstance(d, NoChange) and "no assignment lowers" in d.reason


def test_the_balancer_waits_for_rescales_and_cools_down():
    j = skewed([4, 1, 1, 1])
    (d,) = SkewBalancer().decide(j.window(), j.view(rescaling=frozenset({"agg"})))
    assert isinstance(d, NoChange) and "running" in d.reason
    j.last_rescale_end = j.now - 1
    (d,) = SkewBalancer(cooldown_s=10).decide(j.window(), j.view())
    assert isinstance(d, NoChange) and "cooling down" in d.reason
