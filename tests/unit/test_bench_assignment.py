"""The assignment benchmark's comparison with the paper's scale-in model
(examples/bench/assignment.py): any old tasks may go, against reflow's highest-numbered."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from examples.bench import assignment
from migration.assignment import BalanceInfeasible, GroupWorkload, migration_bytes, ssm, uniform


def brute_any_tasks_go(old: tuple[int, ...], n: int, wl: GroupWorkload, theta: float) -> int:
    """Every contiguous partition into ``n`` ranges within θ, every choice of distinct old
    tasks to keep them: the least bytes moved."""
    m = len(old)
    cap = (1 + theta) * sum(wl.loads) / n * (1 + 1e-9)
    tasks = sorted(set(old))
    best = None
    for cuts in itertools.combinations(range(1, m), n - 1):
        ends = (*cuts, m)
        starts = (0, *cuts)
        if any(sum(wl.loads[a:b]) > cap for a, b in zip(starts, ends, strict=True)):
            continue
        for owners in itertools.permutations(tasks, n):
            new = [t for t, a, b in zip(owners, starts, ends, strict=True) for _ in range(b - a)]
            cost = migration_bytes(old, new, wl.sizes)
            best = cost if best is None else min(best, cost)
    assert best is not None
    return best


def test_removing_a_middle_task_is_cheaper_when_it_holds_less_state():
    # tasks 0, 1, 2 hold 4 groups each; task 1's state is light, task 2's heavy
    old = uniform(12, 3)
    wl = GroupWorkload.even(12)
    wl = GroupWorkload(wl.loads, (10,) * 4 + (1,) * 4 + (100,) * 4)
    reflow = ssm(old, 2, wl, 1.0).predicted_bytes
    paper = assignment.ssm_any_tasks_go(old, 2, wl, 1.0).predicted_bytes
    assert paper == 4 < reflow  # only task 1's light groups move, against task 2's


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 4).flatmap(lambda n: st.tuples(
    st.just(n), st.integers(1, n - 1), st.integers(n, 7),
    st.lists(st.integers(1, 5), min_size=7, max_size=7),
    st.lists(st.integers(0, 9), min_size=7, max_size=7))),
    st.sampled_from([0.5, 1.0, 3.0]))
def test_the_paper_model_equals_brute_force_and_never_costs_more(case, theta):
    n, n2, m, loads, sizes = case
    wl = GroupWorkload(tuple(float(x) for x in loads[:m]), tuple(sizes[:m]))
    old = uniform(m, n)
    try:
        reflow = ssm(old, n2, wl, theta).predicted_bytes
    except BalanceInfeasible:
        return
    paper = assignment.ssm_any_tasks_go(old, n2, wl, theta).predicted_bytes
    assert paper <= reflow
    assert paper == brute_any_tasks_go(old, n2, wl, theta)
