"""Unit tests for ``migration.planning`` (Spacker's planning): pure, no Ray."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.dataflow.keygroups import moved_key_groups, uniform_assignment
from migration.plan import MigrationPlan, Subscale
from migration.planning import (
    AdaptiveThresholds,
    GroupProfile,
    Planning,
    PlanningDecision,
    WorkloadProfile,
    adaptive_from_measures,
    adaptive_planning,
    arrival_ranks,
    matching_steps,
    measure_groups,
    order_groups,
    plan_steps,
    profiles_from_metrics,
    progressive_chunks,
    workload_from_profiles,
)
from migration.protocols.drrs import plan_subscales

MB = 1_000_000


def profs(*rows: tuple[int, float, int, int]) -> dict[int, GroupProfile]:
    return {kg: GroupProfile(kg, load, size, arr) for kg, load, size, arr in rows}


def lower_bound(moves: dict[int, tuple[int, int]]) -> int:
    out: dict[int, int] = {}
    inc: dict[int, int] = {}
    for o, n in moves.values():
        out[o] = out.get(o, 0) + 1
        inc[n] = inc.get(n, 0) + 1
    return max([0, *out.values(), *inc.values()])


def check_matching(moves: dict[int, tuple[int, int]], steps) -> None:
    flat = [kg for s in steps for kg in s]
    assert sorted(flat) == sorted(moves)
    for step in steps:
        assert step
        senders = [moves[kg][0] for kg in step]
        receivers = [moves[kg][1] for kg in step]
        assert len(set(senders)) == len(senders)
        assert len(set(receivers)) == len(receivers)
    assert len(steps) == lower_bound(moves)


def check_plan(plan: MigrationPlan, old, new, first_id: int = 0) -> None:
    moved = moved_key_groups(old, new)
    subs = plan.subscales
    flat = [kg for s in subs for kg in s.key_groups]
    assert sorted(flat) == sorted(moved)  # each moved group exactly once, nothing else
    assert len(flat) == len(set(flat))
    assert sorted(plan.order) == sorted(moved)
    assert [s.subscale_id for s in subs] == list(range(first_id, first_id + len(subs)))
    for s in subs:
        assert isinstance(s, Subscale) and s.key_groups
        assert s.old != s.new
        for kg in s.key_groups:
            assert (old[kg], new[kg]) == (s.old, s.new)
    for step in plan.steps:
        assert step
        pairs = [(s.old, s.new) for s in step]
        assert len(set(pairs)) == len(pairs)  # one subscale per pair per step


def assert_steps_follow_order(plan: MigrationPlan) -> None:
    """Step i holds exactly the next slice of ``plan.order`` (pairs may regroup within it)."""
    at = 0
    for step in plan.steps:
        groups = [kg for s in step for kg in s.key_groups]
        assert set(groups) == set(plan.order[at:at + len(groups)])
        for s in step:  # inside a subscale, priority order
            assert list(s.key_groups) == sorted(s.key_groups, key=plan.order.index)
        at += len(groups)
    assert at == len(plan.order)


# ---------------------------------------------------------------------- values


def test_group_profile_validation():
    assert GroupProfile(3, 1.5, 10).arrival == 0
    with pytest.raises(ValueError, match="load"):
        GroupProfile(1, -1.0, 0)
    with pytest.raises(ValueError, match="load"):
        GroupProfile(1, float("nan"), 0)
    with pytest.raises(ValueError, match="state_bytes"):
        GroupProfile(1, 0.0, -5)
    with pytest.raises(ValueError, match="key_group"):
        GroupProfile(-1, 0.0, 0)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"prioritisation": "coldest"}, "prioritisation.*use one of"),
    ({"progressiveness": "slowly"}, "progressiveness.*use one of"),
    ({"chunk_size": 0}, "chunk_size"),
    ({"chunk_size": 2.5}, "chunk_size"),
    ({"chunk_size": True}, "chunk_size"),
    ({"chunk_seconds": 0}, "chunk_seconds"),
    ({"chunk_seconds": math.inf}, "chunk_seconds"),
    ({"bandwidth_bytes_per_s": -1}, "bandwidth"),
    ({"replication": "some"}, "replication.*use one of"),
    ({"replication_period_s": 0}, "replication_period_s"),
    ({"replication_hot_fraction": 0}, "replication_hot_fraction"),
    ({"replication_hot_fraction": 1.5}, "replication_hot_fraction"),
    ({"seed": "x"}, "seed"),
])
def test_planning_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Planning(**kwargs)


def test_planning_defaults_and_callable():
    p = Planning()
    assert (p.prioritisation, p.progressiveness, p.replication) == ("random", "all-at-once", "none")
    assert Planning(prioritisation=lambda ps: [g.key_group for g in ps]).prioritisation
    assert "chunks of 3" in Planning(progressiveness="chunks", chunk_size=3).describe()


# ---------------------------------------------------------------------- ordering


P = profs((1, 5.0, 300, 2), (2, 9.0, 100, 0), (3, 5.0, 200, 1), (4, 0.5, 100, 3))


def test_hot_first_ties_by_key_group():
    assert order_groups([4, 3, 2, 1], P, Planning(prioritisation="hot-first")) == (2, 1, 3, 4)


def test_arrival_order():
    assert order_groups([1, 2, 3, 4], P, Planning(prioritisation="arrival-order")) == (2, 3, 1, 4)


def test_smallest_state_first_ties_by_key_group():
    ordered = order_groups([4, 3, 2, 1], P, Planning(prioritisation="smallest-state-first"))
    assert ordered == (2, 4, 3, 1)


def test_missing_profiles_are_zero_with_arrival_position():
    groups = [7, 1, 2]  # 7 and 2 have no profile
    p = profs((1, 3.0, 50, 5))
    assert order_groups(groups, p, Planning(prioritisation="hot-first")) == (1, 2, 7)
    assert order_groups(groups, p, Planning(prioritisation="smallest-state-first")) == (2, 7, 1)
    # arrival: 7 -> position 0, 2 -> position 2, 1 -> profile says 5
    assert order_groups(groups, p, Planning(prioritisation="arrival-order")) == (7, 2, 1)
    assert order_groups(groups, None, Planning(prioritisation="arrival-order")) == (7, 1, 2)


def test_random_is_seeded_permutation_independent_of_input_order():
    groups = list(range(40))
    a = order_groups(groups, {}, Planning(seed=1))
    assert sorted(a) == groups and a != tuple(groups)
    assert order_groups(list(reversed(groups)), {}, Planning(seed=1)) == a
    assert order_groups(groups, {}, Planning(seed=2)) != a


def test_callable_prioritisation():
    seen = []

    def biggest_first(ps):
        seen.extend(ps)
        return [g.key_group for g in sorted(ps, key=lambda g: -g.state_bytes)]

    assert order_groups([1, 2, 3, 9], P, Planning(prioritisation=biggest_first)) == (1, 3, 2, 9)
    assert [g.key_group for g in seen] == [1, 2, 3, 9]
    assert seen[-1] == GroupProfile(9, 0.0, 0, 3)  # filled in for the missing profile


@pytest.mark.parametrize("bad", [
    lambda ps: [g.key_group for g in ps][:-1],
    lambda ps: [g.key_group for g in ps] + [99],
    lambda ps: [ps[0].key_group] * len(ps),
])
def test_callable_must_return_permutation(bad):
    with pytest.raises(ValueError, match="permutation"):
        order_groups([1, 2, 3], P, Planning(prioritisation=bad))


def test_order_rejects_duplicates_and_mismatched_profiles():
    with pytest.raises(ValueError, match="duplicates"):
        order_groups([1, 1], P, Planning())
    with pytest.raises(ValueError, match="key_group"):
        order_groups([5], {5: GroupProfile(6, 0.0, 0)}, Planning())


# ---------------------------------------------------------------------- chunking


def test_all_at_once_chunks_and_one_by_one():
    ordered = (5, 3, 8, 1, 9, 2, 7, 4, 6, 0)
    assert progressive_chunks(ordered, {}, Planning()) == (ordered,)
    chunks = progressive_chunks(ordered, {}, Planning(progressiveness="chunks", chunk_size=3))
    assert [len(c) for c in chunks] == [3, 3, 3, 1]
    assert sum(chunks, ()) == ordered
    assert progressive_chunks(ordered, {}, Planning(progressiveness="one-by-one")) == tuple(
        (kg,) for kg in ordered)
    for mode in ("all-at-once", "chunks", "one-by-one", "equal-transfer-time"):
        assert progressive_chunks((), {}, Planning(progressiveness=mode)) == ()


def test_equal_transfer_time_uniform_sizes():
    p = {kg: GroupProfile(kg, 1.0, 10 * MB) for kg in range(10)}
    plan = Planning(progressiveness="equal-transfer-time", chunk_seconds=0.5,
                    bandwidth_bytes_per_s=100 * MB)  # 50 MB per chunk
    chunks = progressive_chunks(tuple(range(10)), p, plan)
    assert chunks == (tuple(range(5)), tuple(range(5, 10)))


def test_equal_transfer_time_balances_bytes():
    rng = random.Random(7)
    sizes = {kg: rng.randint(1, 8) * MB for kg in range(60)}
    p = {kg: GroupProfile(kg, 0.0, b) for kg, b in sizes.items()}
    plan = Planning(progressiveness="equal-transfer-time", chunk_seconds=0.2,
                    bandwidth_bytes_per_s=100 * MB)  # 20 MB target
    ordered = tuple(rng.sample(range(60), 60))
    chunks = progressive_chunks(ordered, p, plan)
    assert sum(chunks, ()) == ordered
    total = sum(sizes.values())
    n = math.ceil(total / (20 * MB))
    assert len(chunks) == n
    width = total / n
    biggest = max(sizes.values())
    for c in chunks:
        b = sum(sizes[kg] for kg in c)
        assert abs(b - width) <= biggest
        assert b <= 20 * MB + biggest


def test_equal_transfer_time_oversized_and_zero_bytes():
    plan = Planning(progressiveness="equal-transfer-time", chunk_seconds=0.1,
                    bandwidth_bytes_per_s=100 * MB)  # 10 MB target
    p = {0: GroupProfile(0, 0, 1 * MB), 1: GroupProfile(1, 0, 100 * MB),
         2: GroupProfile(2, 0, 1 * MB)}
    chunks = progressive_chunks((0, 1, 2), p, plan)
    assert (1,) in chunks and sum(chunks, ()) == (0, 1, 2)
    assert all(c for c in chunks)
    # no state anywhere (or no profiles): nothing to pace, one step
    assert progressive_chunks((4, 5, 6), {}, plan) == ((4, 5, 6),)


# ---------------------------------------------------------------------- matching


def test_matching_simple_cases_reach_lower_bound():
    # a permutation of tasks: one step
    perm = {0: (0, 1), 1: (1, 2), 2: (2, 0)}
    assert matching_steps(perm) == ((0, 1, 2),)
    # one sender, three receivers: three steps, priority order kept
    fan_out = {10: (0, 1), 11: (0, 2), 12: (0, 3)}
    assert matching_steps(fan_out) == ((10,), (11,), (12,))
    # fan-in
    fan_in = {5: (1, 0), 6: (2, 0)}
    assert matching_steps(fan_in) == ((5,), (6,))
    # a task may send one and receive one in the same step
    swap = {0: (0, 1), 1: (1, 0)}
    assert matching_steps(swap) == ((0, 1),)
    assert matching_steps({}) == ()


def test_matching_scale_out_uniform():
    old, new = uniform_assignment(128, 2), uniform_assignment(128, 5)
    moves = {kg: (old[kg], new[kg]) for kg in moved_key_groups(old, new)}
    steps = matching_steps(moves)
    check_matching(moves, steps)


def test_matching_needs_recolouring():
    # first-fit in this order would need a third colour; Kempe recolouring keeps it at 2
    # (0->12: 0, 1->11: 0, 2->11: 1, then 2->12 finds 0 and 1 taken)
    moves = {0: (0, 12), 1: (1, 11), 2: (2, 11), 3: (2, 12)}
    steps = matching_steps(moves)
    check_matching(moves, steps)
    assert steps == ((0, 2), (1, 3))
    # a harder, denser one
    rng = random.Random(3)
    moves = {kg: (rng.randrange(6), 10 + rng.randrange(6)) for kg in range(120)}
    check_matching(moves, matching_steps(moves))


def test_matching_priority_first_group_first_and_order_inside_steps():
    moves = {kg: (kg % 3, 3 + (kg * 7) % 4) for kg in range(24)}
    order = list(reversed(range(24)))
    steps = matching_steps({kg: moves[kg] for kg in order})
    assert steps[0][0] == order[0]
    rank = {kg: i for i, kg in enumerate(order)}
    for step in steps:
        assert [rank[kg] for kg in step] == sorted(rank[kg] for kg in step)
    firsts = [rank[s[0]] for s in steps]
    assert firsts == sorted(firsts)


def test_matching_rejects_non_moves():
    with pytest.raises(ValueError, match="does not move"):
        matching_steps({1: (2, 2)})


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.integers(0, 200), st.tuples(st.integers(0, 5), st.integers(0, 5))
                       .filter(lambda t: t[0] != t[1]), max_size=80))
def test_matching_property(moves):
    check_matching(moves, matching_steps(moves))


# ---------------------------------------------------------------------- plans


def test_plan_steps_scale_out_chunks():
    old, new = uniform_assignment(32, 2), uniform_assignment(32, 4)
    loads = {kg: float(kg) for kg in range(32)}
    plan = plan_steps("count", old, new,
                      Planning(prioritisation="hot-first", progressiveness="chunks", chunk_size=4),
                      profiles_from_metrics(loads, {}), first_id=7)
    check_plan(plan, old, new, first_id=7)
    moved = moved_key_groups(old, new)
    assert plan.order == tuple(sorted(moved, reverse=True))  # hot-first = highest kg
    assert_steps_follow_order(plan)  # chunking never reorders
    assert all(sum(len(s.key_groups) for s in step) <= 4 for step in plan.steps)
    assert len(plan.steps) == math.ceil(len(moved) / 4)
    assert plan.reason.startswith("count:") and "hot-first" in plan.reason
    # same groups as DRRS's own planner
    assert sorted(plan.moved) == sorted(plan_subscales("count", old, new, 2, 4).moved)


def test_plan_steps_all_at_once_one_subscale_per_pair():
    old = (0, 0, 1, 1, 0, 1)
    new = (2, 0, 2, 1, 3, 3)
    plan = plan_steps("op", old, new, Planning(prioritisation="arrival-order"), None)
    assert plan.steps == ((Subscale(0, 0, 2, (0,)), Subscale(1, 1, 2, (2,)),
                           Subscale(2, 0, 3, (4,)), Subscale(3, 1, 3, (5,))),)
    assert plan.subscales == plan.steps[0]


def test_plan_steps_matching():
    old, new = uniform_assignment(64, 3), uniform_assignment(64, 7)
    plan = plan_steps("op", old, new, Planning(prioritisation="hot-first"),
                      {kg: GroupProfile(kg, float(64 - kg), 0) for kg in range(64)},
                      matching=True)
    check_plan(plan, old, new)
    moves = {kg: (old[kg], new[kg]) for kg in plan.order}
    assert len(plan.steps) == lower_bound(moves)
    for step in plan.steps:
        assert all(len(s.key_groups) == 1 for s in step)
        assert len({s.old for s in step}) == len(step) == len({s.new for s in step})
    assert plan.steps[0][0].key_groups[0] == plan.order[0]
    assert "matching" in plan.reason


def test_plan_steps_nothing_moves_and_bad_lengths():
    plan = plan_steps("op", (0, 1, 2), (0, 1, 2), Planning(), None)
    assert plan.steps == () and plan.order == () and plan.subscales == ()
    with pytest.raises(ValueError, match="one task per key group"):
        plan_steps("op", (0, 1), (0, 1, 2), Planning(), None)


_modes = st.sampled_from(["all-at-once", "chunks", "one-by-one", "equal-transfer-time"])
_prios = st.sampled_from(["random", "hot-first", "arrival-order", "smallest-state-first"])


@settings(max_examples=50, deadline=None)
@given(data=st.data(), n=st.integers(1, 64), p_old=st.integers(1, 6), p_new=st.integers(1, 6),
       prio=_prios, mode=_modes, chunk=st.integers(1, 9), first_id=st.integers(0, 50),
       matching=st.booleans(), seed=st.integers(0, 2**31))
def test_plan_invariants(data, n, p_old, p_new, prio, mode, chunk, first_id, matching, seed):
    old = data.draw(st.lists(st.integers(0, p_old - 1), min_size=n, max_size=n))
    new = data.draw(st.one_of(
        st.just(list(uniform_assignment(n, min(n, p_new)))),
        st.lists(st.integers(0, p_new - 1), min_size=n, max_size=n)))
    profiles = {kg: GroupProfile(kg, data.draw(st.floats(0, 1e4)), data.draw(st.integers(0, 10**8)),
                                 data.draw(st.integers(0, 1000)))
                for kg in data.draw(st.sets(st.integers(0, n - 1)))}
    planning = Planning(prioritisation=prio, progressiveness=mode, chunk_size=chunk,
                        chunk_seconds=0.1, seed=seed)
    plan = plan_steps("op", old, new, planning, profiles, first_id=first_id, matching=matching)
    check_plan(plan, old, new, first_id)
    if not matching:
        assert_steps_follow_order(plan)
    else:
        moves = {kg: (old[kg], new[kg]) for kg in plan.order}
        assert len(plan.steps) == lower_bound(moves)


# ---------------------------------------------------------------------- adaptive strategy


def wp(**kw) -> WorkloadProfile:
    base = dict(input_rate=1000.0, skew=1.1, state_bytes_per_group=2000.0, groups_to_move=64,
                state_access_ratio=0.5)
    base.update(kw)
    return WorkloadProfile(**base)


def test_adaptive_small_state_all_at_once_no_replication():
    d = adaptive_planning(wp(state_bytes_per_group=2000.0))
    assert isinstance(d, PlanningDecision)
    assert d.planning.progressiveness == "all-at-once"
    assert d.planning.replication == "none"
    assert d.planning.prioritisation == "random"
    assert "small state" in d.reason and "all-at-once" in d.reason
    assert "2 KB/group" in d.reason and "low skew" in d.reason


def test_adaptive_large_state_few_groups_more_progressive():
    d = adaptive_planning(wp(state_bytes_per_group=4 * MB, groups_to_move=4))
    assert d.planning.progressiveness == "one-by-one"
    assert "large state" in d.reason and "few groups" in d.reason
    assert "more progressive" in d.reason


def test_adaptive_large_state_many_groups_less_progressive():
    d = adaptive_planning(wp(state_bytes_per_group=4 * MB, groups_to_move=64,
                             bandwidth_bytes_per_s=50 * MB))
    assert d.planning.progressiveness == "equal-transfer-time"
    assert d.planning.bandwidth_bytes_per_s == 50 * MB
    assert "many groups" in d.reason and "less progressive" in d.reason
    # the chosen chunks are neither one step nor one group per step
    p = {kg: GroupProfile(kg, 0, 4 * MB) for kg in range(64)}
    chunks = progressive_chunks(tuple(range(64)), p, d.planning)
    assert 1 < len(chunks) < 64


def test_adaptive_many_small_groups_count_as_large_state():
    # small per group but a long total transfer (paper's phase 2: same key size, more keys)
    d = adaptive_planning(wp(state_bytes_per_group=500_000.0, groups_to_move=1000))
    assert d.planning.progressiveness == "equal-transfer-time"
    assert "large state" in d.reason


def test_adaptive_replication_depends_on_state_access():
    low = adaptive_planning(wp(state_bytes_per_group=4 * MB, state_access_ratio=0.02))
    assert low.planning.replication == "hot"
    assert low.planning.replication_hot_fraction == 0.5
    assert "low state access" in low.reason and "replicate" in low.reason
    high = adaptive_planning(wp(state_bytes_per_group=4 * MB, state_access_ratio=0.8))
    assert high.planning.replication == "none" and "high state access" in high.reason
    small = adaptive_planning(wp(state_bytes_per_group=1000.0, state_access_ratio=0.01))
    assert small.planning.replication == "none"


def test_adaptive_skew_and_rate():
    big = 2 * MB  # large state: a progressive plan, where the order of the steps matters
    hot = adaptive_planning(wp(input_rate=50_000.0, skew=5.0, state_bytes_per_group=big))
    assert hot.planning.prioritisation == "hot-first"
    assert "high input rate" in hot.reason and "high skew" in hot.reason
    slow = adaptive_planning(wp(input_rate=500.0, skew=5.0, state_bytes_per_group=big))
    assert slow.planning.prioritisation == "random" and "skewed" in slow.reason
    assert "low input rate" in slow.reason
    flat = adaptive_planning(wp(input_rate=50_000.0, skew=1.2, state_bytes_per_group=big))
    assert flat.planning.prioritisation == "random" and "low skew" in flat.reason


def test_adaptive_one_step_has_nothing_to_prioritise():
    d = adaptive_planning(wp(input_rate=50_000.0, skew=5.0, state_bytes_per_group=2000.0))
    assert d.planning.progressiveness == "all-at-once"
    assert d.planning.prioritisation == "random"
    assert "high skew" in d.reason and "one step: random" in d.reason


def test_adaptive_rate_relative_to_capacity():
    # 4000 rec/s is low in absolute terms but 80% of a 5000 rec/s operator
    d = adaptive_planning(wp(input_rate=4000.0, skew=3.0, capacity_rate=5000.0,
                             state_bytes_per_group=2 * MB))
    assert d.planning.prioritisation == "hot-first" and "of capacity" in d.reason
    d = adaptive_planning(wp(input_rate=40_000.0, skew=3.0, capacity_rate=100_000.0,
                             state_bytes_per_group=2 * MB))
    assert d.planning.prioritisation == "random"


def test_adaptive_paper_scenarios():
    # §V-B1 stock exchange: large state, many keys, low access, low rate
    stock = adaptive_planning(wp(input_rate=5000.0, skew=1.3, state_bytes_per_group=2 * MB,
                                 groups_to_move=500, state_access_ratio=0.027))
    assert (stock.planning.prioritisation, stock.planning.progressiveness,
            stock.planning.replication) == ("random", "equal-transfer-time", "hot")
    # §V-B2 phase 1: a quarter of the groups, small state -> all-at-once, nothing replicated
    p1 = adaptive_planning(wp(state_bytes_per_group=50_000.0, groups_to_move=32,
                              state_access_ratio=0.02))
    assert (p1.planning.progressiveness, p1.planning.replication) == ("all-at-once", "none")
    # phase 3: highly skewed at a high rate -> hot-first
    p3 = adaptive_planning(wp(input_rate=40_000.0, skew=8.0, state_bytes_per_group=2 * MB,
                              groups_to_move=128, state_access_ratio=0.02))
    assert p3.planning.prioritisation == "hot-first"


def test_adaptive_thresholds_are_tunable():
    t = AdaptiveThresholds(large_state_bytes_per_group=1000.0)
    d = adaptive_planning(wp(state_bytes_per_group=2000.0, groups_to_move=3), t)
    assert d.planning.progressiveness == "one-by-one" and d.thresholds is t


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"input_rate": -1.0}, "input_rate"),
    ({"skew": -1.0}, "skew"),
    ({"state_bytes_per_group": -1.0}, "state_bytes_per_group"),
    ({"groups_to_move": -1}, "groups_to_move"),
    ({"state_access_ratio": 1.5}, "state_access_ratio"),
    ({"bandwidth_bytes_per_s": 0.0}, "bandwidth"),
    ({"capacity_rate": 0.0}, "capacity_rate"),
])
def test_workload_profile_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        wp(**kwargs)


def test_profiles_and_workload_from_metrics():
    loads = {0: 10.0, 1: 30.0, 2: 20.0}
    sizes = {1: 4000, 2: 2000, 3: 100}
    p = profiles_from_metrics(loads, sizes)
    # arrival: by measured rate, the busiest first (issue 32: it was key-group order)
    assert p == {0: GroupProfile(0, 10.0, 0, 2), 1: GroupProfile(1, 30.0, 4000, 0),
                 2: GroupProfile(2, 20.0, 2000, 1), 3: GroupProfile(3, 0.0, 100, 3)}
    assert profiles_from_metrics(loads, sizes, arrivals={0: 9})[0].arrival == 9
    w = workload_from_profiles(p, [1, 2, 7], 60.0, state_access_ratio=0.3)
    assert w.skew == pytest.approx(30.0 / 15.0)
    assert w.state_bytes_per_group == pytest.approx(2000.0)  # (4000 + 2000 + 0) / 3
    assert w.groups_to_move == 3 and w.input_rate == 60.0 and w.state_access_ratio == 0.3
    empty = workload_from_profiles({}, [], 0.0)
    assert empty.skew == 1.0 and empty.state_bytes_per_group == 0.0
    assert adaptive_planning(empty).planning.progressiveness == "all-at-once"


# ---------------------------------------------------------------------- measured inputs (issue 32)


class Stats:
    """A task's ``GroupStats`` reply: ``(key group, records, state bytes[, keys])``, and the
    distinct keys its records touched over ``touched_seconds`` (-1: not counted)."""

    def __init__(self, groups, seconds, keys_touched=-1, touched_seconds=0.0):
        self.groups, self.seconds = tuple(groups), seconds
        self.keys_touched, self.touched_seconds = keys_touched, touched_seconds


def test_arrival_order_follows_the_measured_arrival_rates():
    """Issue 32: "arrival order" was key-group order. A group whose records arrive at λ/s
    is next due in 1/λ s: the busiest goes first, groups without records last."""
    assert arrival_ranks({0: 1.0, 1: 50.0, 2: 0.0, 3: 7.0}) == {1: 0, 3: 1, 0: 2, 2: 3}
    measured = measure_groups([Stats([(0, 10, 0), (1, 500, 0)], 10.0),
                               Stats([(2, 0, 0), (3, 70, 0)], 10.0)])
    order = order_groups([0, 1, 2, 3], measured.profiles(),
                         Planning(prioritisation="arrival-order"))
    assert order == (1, 3, 0, 2)


def test_the_state_access_ratio_is_measured_from_keys_per_group():
    # 64 groups of 512 keys (32,768 keys, 512 KB each: 256 MB per group), 655 records/s
    # over them: Spacker's micro-benchmark, 2 % of the keys touched per second
    rows = [(kg, 10 * 655 // 64, 512 * 512 * 1024, 512) for kg in range(64)]
    measured = measure_groups([Stats(rows[:32], 10.0), Stats(rows[32:], 10.0)])
    assert measured.input_rate == pytest.approx(650, rel=0.01)
    assert measured.state_access_ratio == pytest.approx(0.0198, rel=0.01)
    # a group cannot touch more keys in a second than it has
    hot = measure_groups([Stats([(0, 1_000, 10, 5), (1, 0, 10, 95)], 1.0)])
    assert hot.state_access_ratio == pytest.approx(5 / 100)
    # no keys reported (today's GroupStats): not measured
    assert measure_groups([Stats([(0, 10, 10)], 1.0)]).state_access_ratio is None
    assert measure_groups([Stats([(0, 10, 10)], 0.0)]).loads == {0: 0.0}


def test_the_adaptive_default_replicates_when_the_measures_say_so():
    """Issue 32: the adaptive default never turned replication on, the state access ratio
    and the capacity never being measured (1.0 and None were passed)."""
    rows = [(kg, 10 * 655 // 64, 4 * MB, 512) for kg in range(64)]
    measured = measure_groups([Stats(rows, 10.0)])
    moved = list(range(32))
    d = adaptive_from_measures(measured, moved, capacity_rate=800.0)
    assert d.planning.replication == "hot", d.reason
    assert "state access 2%" in d.reason
    # 650 rec/s is 81 % of an 800 rec/s capacity: high, though far below 10,000/s
    skewed = [(kg, (5_000 if kg == 0 else 10), 4 * MB, 512) for kg in range(64)]
    d = adaptive_from_measures(measure_groups([Stats(skewed, 10.0)]), moved,
                               capacity_rate=800.0)
    assert d.planning.prioritisation == "hot-first" and "of capacity" in d.reason, d.reason
    d = adaptive_from_measures(measure_groups([Stats(skewed, 10.0)]), moved)
    assert d.planning.prioritisation == "random" and "capacity not measured" in d.reason
    # without key counts: no replication, and the reason says why
    plain = adaptive_from_measures(measure_groups([Stats([r[:3] for r in rows], 10.0)]), moved)
    assert plain.planning.replication == "none"
    assert "state access not measured" in plain.reason


def test_a_non_disruptive_rescale_plans_from_the_measured_workload():
    """The coordinator (``LiveRescale._steps``) reads the state access ratio from the keys
    per group the tasks report and the capacity from its context: with 4 MB groups of 512
    keys touched 10 times a second (2 %), the adaptive default turns replication on."""
    import dataclasses

    from engine.time.clock import ManualClock
    from engine.wire.messages import GroupStats
    from migration.coordinator import (
        EnableReplication,
        LiveRescale,
        Phase,
        RescaleRequest,
        SendControl,
    )
    from tests.unit.test_coordinator import Driver, N, context, finish_running

    def run(keys: bool, capacity: float | None) -> tuple[Any, list[Any]]:
        ctx = dataclasses.replace(context(), capacity_rate=capacity)
        coord = LiveRescale(RescaleRequest("sum", 3, "non-disruptive"), ctx, ManualClock())
        d = Driver(coord, finish_running)
        cmd = d.run(until=lambda c: isinstance(c, SendControl) and c.phase == Phase.PLAN)
        replies = [GroupStats(c.task, tuple((kg, 100, 4 * MB, *((512,) if keys else ()))
                                            for kg in range(N)), 10.0) for c in cmd.calls]
        d.queue.extend(coord.on_result(cmd, replies))
        d.run()
        assert coord.done
        return coord, [c for c in d.log if isinstance(c, EnableReplication)]

    coord, enabled = run(keys=True, capacity=1_000.0)
    assert enabled and enabled[0].policy == "hot", coord.plan.reason
    assert "state access 2%" in coord.plan.reason
    coord, enabled = run(keys=False, capacity=None)
    assert not enabled and "state access not measured" in coord.plan.reason


def test_the_state_access_ratio_counts_distinct_keys_touched_not_records():
    """Spacker's ratio is the share of the keys accessed per second: records that repeat a
    key touch it once (what a replica has to catch up on is one entry per key). 64 groups
    of 512 keys at 6,400 records/s: the bound min(rate, keys) says 100 rec/s of 512 keys per
    group, ~20 %; the tasks counted 328 distinct keys a second (1 %): 1 %."""
    rows = [(kg, 10 * 100, 4 * MB, 512) for kg in range(64)]
    bounded = measure_groups([Stats(rows[:32], 10.0), Stats(rows[32:], 10.0)])
    assert bounded.state_access_ratio == pytest.approx(100 / 512)
    assert not bounded.access_counted
    counted = measure_groups([Stats(rows[:32], 10.0, 164, 1.0),
                              Stats(rows[32:], 10.0, 328, 2.0)])
    assert counted.touched == pytest.approx(328.0)
    assert counted.state_access_ratio == pytest.approx(328 / 32_768)
    assert counted.access_counted
    # one task counted, the other did not: its groups keep the bound
    mixed = measure_groups([Stats(rows[:32], 10.0, 164, 1.0), Stats(rows[32:], 10.0)])
    assert mixed.state_access_ratio == pytest.approx((164 + 32 * 100) / 32_768)
    assert not mixed.access_counted
    # a task whose groups do not all say their keys cannot set its count against them
    unknown = [(kg, 1000, 4 * MB, None) for kg in range(32)]
    part = measure_groups([Stats(unknown, 10.0, 164, 1.0), Stats(rows[32:], 10.0, 164, 1.0)])
    assert part.touched == pytest.approx(164.0) and part.touched_groups == frozenset(range(32, 64))
    assert part.state_access_ratio == pytest.approx(164 / (32 * 512))
    # an empty window (0 keys) is a measure; a task with no groups adds nothing
    idle = measure_groups([Stats(rows, 10.0, 0, 1.5), Stats([], 10.0, 7, 1.0)])
    assert idle.state_access_ratio == 0.0 and idle.access_counted


def test_the_adaptive_default_replicates_from_counted_access_and_says_how_it_measured():
    """With the bound, records repeating keys read as high access (no replication); the
    counted distinct keys say 1 %: replication, and the reason carries no caveat."""
    rows = [(kg, 10 * 100, 4 * MB, 512) for kg in range(64)]
    moved = list(range(32))
    bounded = adaptive_from_measures(measure_groups([Stats(rows, 10.0)]), moved,
                                     capacity_rate=20_000.0)
    assert bounded.planning.replication == "none"
    assert "bounded by the records per second" in bounded.reason
    counted = adaptive_from_measures(measure_groups([Stats(rows, 10.0, 328, 1.0)]), moved,
                                     capacity_rate=20_000.0)
    assert counted.planning.replication == "hot", counted.reason
    assert "state access 1%" in counted.reason and "(" not in counted.reason.split(";")[-1]


def test_a_non_disruptive_rescale_replicates_when_the_tasks_counted_low_access():
    """The coordinator reads the tasks' distinct key counts (``GroupStats.keys_touched``):
    16 groups of 512 keys, 1,000 records/s per group repeating 20 keys a second: the bound
    says 100 % (no replication), the count 4 % (replication on from this rescale)."""
    import dataclasses

    from engine.time.clock import ManualClock
    from engine.wire.messages import GroupStats
    from migration.coordinator import EnableReplication, LiveRescale, Phase, RescaleRequest
    from migration.coordinator import SendControl as Send
    from tests.unit.test_coordinator import Driver, N, context, finish_running

    def run(counted: bool) -> tuple[Any, list[Any]]:
        ctx = dataclasses.replace(context(), capacity_rate=100_000.0)
        coord = LiveRescale(RescaleRequest("sum", 3, "non-disruptive"), ctx, ManualClock())
        d = Driver(coord, finish_running)
        cmd = d.run(until=lambda c: isinstance(c, Send) and c.phase == Phase.PLAN)
        mine = {c.task: [kg for kg in range(N) if ctx.deployment.assignments["sum"][kg] == i]
                for i, c in enumerate(cmd.calls)}
        replies = [GroupStats(c.task, tuple((kg, 10_000, 4 * MB, 512) for kg in mine[c.task]),
                              10.0, *((20 * len(mine[c.task]) * 2, 2.0) if counted else ()))
                   for c in cmd.calls]
        d.queue.extend(coord.on_result(cmd, replies))
        d.run()
        assert coord.done
        return coord, [c for c in d.log if isinstance(c, EnableReplication)]

    coord, enabled = run(counted=False)
    assert not enabled and "high state access 100%" in coord.plan.reason, coord.plan.reason
    coord, enabled = run(counted=True)
    assert enabled and enabled[0].policy == "hot", coord.plan.reason
    assert "state access 4%" in coord.plan.reason
    assert "replication 'hot' on from now" in coord.plan.reason
    assert "of capacity" in coord.plan.reason  # the capacity came with the context
