"""DS2 on synthetic metrics: a pipeline with known true rates (tests/unit/pipeline_model.py)."""

from __future__ import annotations

import math

import pytest

from controllers.ds2 import DS2, even_split
from engine.control.reconfiguration import NoChange, Scale
from engine.errors import ControllerError
from tests.unit.pipeline_model import Pipeline, Stage


def three_operators(source_rate: float, agg_p: int = 2) -> Pipeline:
    """parse (10,000/s per task) -> agg (500/s per task, keyed, 1 out per 10 in) -> sink
    (2,000/s per task)."""
    return Pipeline([Stage("parse", 10_000, keyed=False), Stage("agg", 500, 0.1,
                                                                parallelism=agg_p),
                     Stage("sink", 2_000, 0.0, keyed=False)], source_rate)


def scales(decisions) -> dict[str, int]:
    return {d.operator: d.parallelism for d in decisions if isinstance(d, Scale)}


def test_one_decision_reaches_the_optimal_parallelism():
    job = three_operators(3_000)
    ds2 = DS2()
    first = ds2.decide(job.window(), job.view())
    # agg must take 3,000/s at 70 %: 3000 / (500 * 0.7) = 8.6 tasks; 128 key groups over 9
    # tasks give the busiest 15 (14.2 exact): 8 tasks (16 each) are within 15 %
    assert scales(first) == {"agg": 8}, first
    (d,) = first
    assert d.protocol == "drrs" and "up 2 -> 8" in d.reason and "load" in d.reason
    job.apply(first)
    job.advance(30)
    again = ds2.decide(job.window(), job.view())
    assert len(again) == 1 and isinstance(again[0], NoChange), again
    assert "within the utilisation band" in again[0].reason
    # at 8 tasks the busiest is 75 % busy: inside 0.4 .. 1.0
    assert job.window().operator("agg").max_utilisation == pytest.approx(0.75)


def test_the_target_follows_the_output_ratios_through_the_graph():
    job = Pipeline([Stage("explode", 100_000, ratio=5.0, keyed=False),
                    Stage("agg", 1_000, parallelism=4)], 1_000)
    est = DS2().estimate(job.window(), job.view())
    assert est["explode"].target_rate == pytest.approx(1_000)
    assert est["agg"].target_rate == pytest.approx(5_000)
    # agg's capacity is 4 x 1,000; it needs 5,000 / 0.7 = 7,143: 8 tasks (16 groups each)
    assert est["agg"].optimal == 8


def test_backlog_adds_a_catch_up_rate():
    job = three_operators(1_000, agg_p=4)
    job.backlog = 30_000  # 30,000 records behind: 1,000/s more over catch_up_s = 30
    est = DS2(catch_up_s=30).estimate(job.window(), job.view())
    assert est["agg"].catch_up == pytest.approx(1_000)
    # needs 1000 / 0.7 + 1000 = 2,429 rec/s over a capacity of 2,000 at p=4: 5 tasks
    assert est["agg"].load == pytest.approx(1.0)
    assert est["agg"].optimal == 5


def test_flapping_inputs_inside_the_band_produce_no_action():
    job = three_operators(2_500, agg_p=6)  # 83 % busy
    ds2 = DS2()
    for rate in (2_500, 1_400, 2_800, 1_300, 2_900, 1_250):  # 0.42 .. 0.97 busy
        job.source_rate = rate
        job.advance(5)
        out = ds2.decide(job.window(), job.view())
        assert not scales(out), (rate, out)
        assert "within the utilisation band" in out[0].reason


def test_scale_down_is_delayed_and_goes_to_the_highest_recommendation():
    job = three_operators(3_000, agg_p=8)
    ds2 = DS2(scale_down_delay_s=30)
    job.source_rate = 600  # agg needs 600 / 350 -> 2 tasks
    first = ds2.decide(job.window(), job.view())
    assert not scales(first) and "delayed" in first[0].reason, first
    job.advance(15)
    job.source_rate = 1_000  # recommends 3 now (1000 / 350 = 2.9)
    mid = ds2.decide(job.window(), job.view())
    assert not scales(mid)
    job.advance(10)
    job.source_rate = 600
    assert not scales(ds2.decide(job.window(), job.view()))  # 25 s after the first
    job.advance(6)
    last = ds2.decide(job.window(), job.view())
    assert scales(last) == {"agg": 3}, last  # the highest recommended in the window
    assert "highest recommended" in last[0].reason


def test_a_recommendation_back_inside_the_band_cancels_a_pending_scale_down():
    job = three_operators(3_000, agg_p=8)
    ds2 = DS2(scale_down_delay_s=30)
    job.source_rate = 600
    ds2.decide(job.window(), job.view())
    assert "agg" in ds2.pending_down
    job.advance(20)
    job.source_rate = 2_500  # back within the band
    ds2.decide(job.window(), job.view())
    assert "agg" not in ds2.pending_down
    job.advance(20)
    job.source_rate = 600  # a new trigger starts a new delay
    assert not scales(ds2.decide(job.window(), job.view()))


def test_max_not_average_utilisation_under_skew():
    job = three_operators(1_200, agg_p=4)
    job.stage("agg").weights = [4, 1, 1, 1]  # one task takes 4/7 of the input
    w = job.window()
    agg = w.operator("agg")
    assert agg.max_utilisation > 1.0 - 1e-9 or agg.max_utilisation == pytest.approx(1.0)
    assert agg.mean_utilisation < 0.5  # the average would say: plenty of room
    out = DS2().decide(w, job.view())
    assert scales(out).get("agg", 0) > 4, out


def test_no_decision_while_rescaling_or_stabilising_or_finishing():
    job = three_operators(3_000)
    ds2 = DS2(stabilisation_s=10)
    out = ds2.decide(job.window(), job.view(rescaling=frozenset({"agg"})))
    assert isinstance(out[0], NoChange) and "running" in out[0].reason
    job.last_rescale_end = job.now - 4
    out = ds2.decide(job.window(), job.view())
    assert isinstance(out[0], NoChange) and "stabilising" in out[0].reason
    job.last_rescale_end = job.now - 11
    assert scales(ds2.decide(job.window(), job.view())) == {"agg": 8}


def test_short_windows_are_not_decided_on():
    job = three_operators(3_000)
    job.seconds = 2.0
    out = DS2(window_s=10).decide(job.window(), job.view())
    assert isinstance(out[0], NoChange) and "shorter" in out[0].reason


def test_parallelism_is_clamped_to_the_limits():
    job = three_operators(30_000)
    out = DS2(max_parallelism=12).decide(job.window(), job.view())
    assert scales(out)["agg"] == 11  # 12 clamped, then the even split of 128 over 12
    out = DS2(limits={"agg": (1, 4)}).decide(job.window(), job.view())
    assert scales(out)["agg"] == 4
    job = three_operators(10, agg_p=6)
    ds2 = DS2(limits={"agg": (3, 128)}, scale_down_delay_s=0)
    assert scales(ds2.decide(job.window(), job.view())) == {"agg": 3}
    everywhere = DS2(min_parallelism=3, scale_down_delay_s=0)
    assert scales(everywhere.decide(job.window(), job.view())) == {
        "parse": 3, "agg": 3, "sink": 3}


def test_an_idle_operator_goes_to_its_minimum():
    job = three_operators(0.0, agg_p=4)
    out = DS2(scale_down_delay_s=0).decide(job.window(), job.view())
    assert scales(out) == {"agg": 1}
    assert "no input" in out[0].reason


def test_a_source_without_backlog_counts_its_backpressured_time():
    job = three_operators(3_000)
    w = job.window()
    src = w.operators["src"]
    t = src.tasks[0]
    import dataclasses

    blind = dataclasses.replace(t, source_backlog=None, backlog_change=None,
                                backpressured_s=0.5 * t.seconds)
    w = dataclasses.replace(w, operators={**w.operators, "src": dataclasses.replace(
        src, tasks=(blind,))})
    est = DS2().estimate(w, job.view())
    assert est["src"].target_rate == pytest.approx(2 * src.observed_input_rate)


def test_fixed_restart_time_asks_for_more_capacity():
    job = three_operators(3_000)
    plain = DS2().estimate(job.window(), job.view())["agg"].optimal
    flink = DS2(restart_time_s=30, catch_up_s=60).estimate(job.window(), job.view())["agg"]
    # + 3,000 * 30 / 60 = 1,500 rec/s to catch up the restart's backlog
    assert flink.optimal > plain
    assert flink.optimal == 11


@pytest.mark.parametrize(("p", "groups", "tol", "want"), [
    (5, 128, 0.15, 5), (9, 128, 0.15, 8), (40, 128, 0.15, 43), (48, 128, 0.15, 43),
    (48, 128, 0.0, 64), (3, 32, 0.15, 3), (200, 128, 0.15, 128), (1, 128, 0.15, 1)])
def test_even_split(p, groups, tol, want):
    got = even_split(p, groups, tol)
    assert got == want
    assert math.ceil(groups / got) <= groups / p * (1 + tol) + 1e-9 or got == groups


def test_its_rescales_carry_the_assignment_strategy_asked_for():
    job = three_operators(3_000)
    (d,) = DS2(assignment="ssm", balance=0.3).decide(job.window(), job.view())
    assert isinstance(d, Scale) and d.parallelism == 8
    assert d.strategy == "ssm" and d.balance == 0.3
    (plain,) = DS2().decide(three_operators(3_000).window(), three_operators(3_000).view())
    assert plain.assignment is None and plain.balance is None


def test_bad_settings_are_refused():
    with pytest.raises(ControllerError, match="unknown assignment strategy"):
        DS2(assignment="best")
    with pytest.raises(ControllerError, match="balance"):
        DS2(balance=0.2)  # θ without a strategy
    with pytest.raises(ControllerError, match="target_utilisation"):
        DS2(target_utilisation=0)
    with pytest.raises(ControllerError, match="band"):
        DS2(band=(0.8, 0.9))
    with pytest.raises(ControllerError, match="max_parallelism"):
        DS2(min_parallelism=4, max_parallelism=2)


def with_forward(view, operator: str, neighbours: tuple[str, ...]):
    """``view`` with ``operator`` joined to ``neighbours`` by forward edges."""
    import dataclasses

    ops = dict(view.operators)
    ops[operator] = dataclasses.replace(ops[operator], forward=neighbours)
    return dataclasses.replace(view, operators=ops)


def test_an_operator_on_a_forward_edge_is_not_rescaled_and_the_reason_says_why():
    """An operator joined by a forward edge whose group has no root it may rescale
    (``OperatorView.forward_root`` empty): DS2 proposes no such rescale (it would be
    refused), says why, and still rescales the others."""
    job = Pipeline([Stage("parse", 1_000, keyed=False), Stage("agg", 500, 0.1, parallelism=2),
                    Stage("sink", 2_000, 0.0, keyed=False)], 3_000)
    ds2 = DS2()
    plain = scales(ds2.decide(job.window(), job.view()))
    assert set(plain) >= {"parse", "agg"}, plain
    out = DS2().decide(job.window(), with_forward(job.view(), "parse", ("agg",)))
    assert "parse" not in scales(out) and scales(out)["agg"] == plain["agg"], out
    (why,) = [d for d in out if isinstance(d, NoChange)]
    assert "parse stays at 1" in why.reason and "forward edge" in why.reason
    assert f"would go to {plain['parse']}" in why.reason


def test_only_forward_bound_operators_out_of_the_band_give_a_no_change():
    job = three_operators(3_000)
    out = DS2().decide(job.window(), with_forward(job.view(), "agg", ("sink",)))
    assert not scales(out), out
    assert any("agg stays at 2" in d.reason for d in out)
    assert any("within the utilisation band" in d.reason for d in out)


def test_a_keyed_root_of_a_forward_group_is_rescaled_and_its_partner_follows():
    """A forward group that rescales as one (``OperatorView.forward_root``): DS2 decides
    for the keyed root, whose rescale takes the partner along, and leaves the partner."""
    import dataclasses

    job = Pipeline([Stage("parse", 1_000, keyed=False), Stage("agg", 500, 0.1, parallelism=2),
                    Stage("sink", 100, 1.0, keyed=False, parallelism=2)], 3_000)
    plain = scales(DS2().decide(job.window(), job.view()))
    assert {"agg", "sink"} <= set(plain), plain
    view = with_forward(with_forward(job.view(), "agg", ("sink",)), "sink", ("agg",))
    ops = {n: dataclasses.replace(o, forward_root="agg") if n in ("agg", "sink") else o
           for n, o in view.operators.items()}
    out = DS2().decide(job.window(), dataclasses.replace(view, operators=ops))
    assert scales(out)["agg"] == plain["agg"] and "sink" not in scales(out), out
    assert any("'sink' is a forward partner of 'agg' and rescales with it" in d.reason
               for d in out if isinstance(d, NoChange)), out
