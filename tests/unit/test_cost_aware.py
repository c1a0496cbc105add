"""The migration-cost-aware DS2 on synthetic histories (tests/unit/pipeline_model.py)."""

from __future__ import annotations

import pytest

from controllers.cost_aware import CostAwareDS2, fit_cost
from controllers.ds2 import DS2
from engine.control.reconfiguration import NoChange, Scale
from tests.unit.pipeline_model import Pipeline, Stage, record


def job(rate: float, p: int = 2, state_mb: float = 64.0) -> Pipeline:
    return Pipeline([Stage("agg", 500, 1.0, parallelism=p, state_bytes=int(state_mb * 1e6)),
                     Stage("sink", 5_000, 0.0, keyed=False)], rate)


def scales(decisions) -> dict[str, Scale]:
    return {d.operator: d for d in decisions if isinstance(d, Scale)}


def test_the_cost_model_fits_the_history_per_protocol():
    hist = [record("agg", "drrs", mb, 0.1 + 0.02 * mb, at=100 * i)
            for i, mb in enumerate((5, 10, 20, 40))]
    hist.append(record("agg", "stop-restart", 10, 8.0, at=900))
    m = fit_cost(hist, "drrs", prior=(0.5, 0.2))
    assert m.observations == 4
    assert m.fixed_s == pytest.approx(0.1) and m.per_mb_s == pytest.approx(0.02)
    assert m.predict(50) == pytest.approx(1.1)
    sr = fit_cost(hist, "stop-restart", prior=(5.0, 0.2))
    assert sr.observations == 1 and sr.per_mb_s == 0.2 and sr.fixed_s == pytest.approx(6.0)
    none = fit_cost(hist, "fluid", prior=(0.5, 0.2))
    assert (none.fixed_s, none.per_mb_s, none.observations) == (0.5, 0.2, 0)
    assert "prior" in str(none) and "fitted on 4" in str(m)


def test_a_negative_intercept_is_fitted_through_the_origin():
    hist = [record("agg", "drrs", mb, d, at=10 * i)
            for i, (mb, d) in enumerate(((10, 0.1), (20, 1.5), (30, 2.9)))]
    m = fit_cost(hist, "drrs", prior=(0.5, 0.2))
    assert m.fixed_s == 0.0 and m.per_mb_s > 0


def test_measured_cheap_migrations_ask_for_less_capacity_than_a_fixed_restart_time():
    j = job(3_000)
    j.history = [record("agg", "drrs", 32, 0.3, at=0.0)]
    flink = DS2(restart_time_s=60, catch_up_s=120).decide(j.window(), j.view())
    cost = CostAwareDS2(catch_up_s=120).decide(j.window(), j.view())
    assert scales(flink)["agg"].parallelism > scales(cost)["agg"].parallelism
    d = scales(cost)["agg"]
    assert "predicted to hold up" in d.reason and "fitted on 1 rescales" in d.reason


def test_a_scale_down_that_does_not_pay_for_its_disruption_is_skipped():
    j = job(600, p=8)
    j.history = [record("agg", "drrs", 64, 20.0, at=j.now - 500)]  # expensive migrations
    ctl = CostAwareDS2(scale_down_delay_s=0, horizon_s=60, payback=5)
    out = ctl.decide(j.window(), j.view())
    assert not scales(out), out
    (skip,) = [d for d in out if isinstance(d, NoChange)]
    assert "skip agg 8 -> 3" in skip.reason and "task-seconds" in skip.reason
    # plain DS2 scales down all the same
    assert scales(DS2(scale_down_delay_s=0).decide(j.window(), j.view()))["agg"].parallelism == 2


def test_a_cheap_scale_down_runs_and_picks_the_assignment_that_moves_least():
    j = job(600, p=8)
    j.history = [record("agg", "drrs", 64, 0.2, at=j.now - 500)]
    out = CostAwareDS2(scale_down_delay_s=0).decide(j.window(), j.view())
    d = scales(out)["agg"]
    assert d.parallelism == 2
    # uniform 8 -> 2 moves 112 of 128 groups; balanced keeps tasks 0 and 1's: 96 move
    assert d.assignment is not None and "balanced" in d.reason
    moved = sum(1 for kg, t in enumerate(d.assignment) if t != kg // 16)
    assert moved == 96
    assert "moves 48.00 MB" in d.reason


def test_the_cheapest_protocol_by_history_is_chosen():
    j = job(3_000)
    j.history = [record("agg", "drrs", 32, 2.0, at=0.0),
                 record("agg", "pause-resume", 32, 0.4, at=100.0)]
    out = CostAwareDS2(protocols=("drrs", "pause-resume")).decide(j.window(), j.view())
    assert scales(out)["agg"].protocol == "pause-resume"


def test_a_scale_up_whose_deficit_is_smaller_than_its_disruption_is_skipped():
    j = job(1_050, p=2)  # 5 % over capacity
    j.history = [record("agg", "stop-restart", 64, 60.0, at=j.now - 200),
                 record("agg", "stop-restart", 64, 60.0, at=j.now - 180)]
    ctl = CostAwareDS2(protocols=("stop-restart",), horizon_s=600)
    out = ctl.decide(j.window(), j.view())
    assert not scales(out), out
    assert "piles up" in out[0].reason
    # the horizon came from the history: the median gap between its rescales (20 s)
    assert ctl.horizon("agg", j.view()) == pytest.approx(20.0)


def test_without_history_the_priors_decide():
    j = job(3_000)
    out = CostAwareDS2().decide(j.window(), j.view())
    assert "prior, no rescale measured yet" in scales(out)["agg"].reason


def test_it_chooses_the_assignment_itself_so_it_takes_no_assignment_argument():
    from engine.errors import ControllerError

    with pytest.raises(ControllerError, match="assignments="):
        CostAwareDS2(assignment="ssm")


def test_a_stateless_operator_is_predicted_and_told_as_the_stateless_rescale_it_runs():
    """A live request for an operator without key groups runs 'stateless': its cost model
    is fitted on the measured stateless rescales, never on the protocol it names."""
    j = Pipeline([Stage("parse", 1_000, keyed=False), Stage("sink", 50_000, 0.0, keyed=False)],
                 3_000)
    j.history = [record("parse", "stateless", 0, 0.05, at=0.0),
                 record("agg", "drrs", 32, 9.0, at=10.0)]
    ctl = CostAwareDS2()
    op = j.view().operators["parse"]
    assert ctl.runs_as("drrs", op) == "stateless"
    assert ctl.runs_as("stop-restart", op) == "stop-restart"
    (best, *_) = ctl.options(op, 5, j.view(), j.window())
    assert best.protocol == "drrs" and best.used == "stateless"
    assert best.disruption_s == pytest.approx(0.05)
    d = scales(ctl.decide(j.window(), j.view()))["parse"]
    assert d.protocol == "drrs"
    assert "drrs (runs as stateless)" in d.reason and "stateless: " in d.reason
    assert "fitted on 1 rescales" in d.reason
