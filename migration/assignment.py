"""Assignments: which task owns which key group after a rescale (pure functions).

An assignment is a tuple with one task index per key group (``engine.keygroups``). Each
function here returns the target assignment of a rescale; the protocols then plan how to
reach it (``migration.protocols``). ``uniform`` is Flink's default contiguous ranges;
``balanced`` evens a measured per-group load while moving few groups (for skew). The
optimal single-step and sequence assignments (SSM, OMS, MTM-aware) will join them here.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.errors import ReflowError
from engine.keygroups import uniform_assignment


class AssignmentError(ReflowError, ValueError):
    """The inputs of an assignment function do not fit together; the message says how."""


def uniform(num_key_groups: int, parallelism: int) -> tuple[int, ...]:
    """Contiguous ranges of (nearly) equal size, as Flink assigns key groups."""
    return uniform_assignment(num_key_groups, parallelism)


def rescale_target(old: Sequence[int], num_key_groups: int, parallelism: int,
                   given: Sequence[int] | None = None) -> tuple[int, ...]:
    """The assignment a rescale to ``parallelism`` goes to: ``given`` (a rebalance), else
    ``uniform``; empty for an operator without key groups (``old`` empty)."""
    if not old:
        return ()
    if given is not None:
        return tuple(given)
    return uniform(num_key_groups, parallelism)


def task_loads(loads: Sequence[float], assignment: Sequence[int], parallelism: int
               ) -> list[float]:
    out = [0.0] * parallelism
    for g, t in enumerate(assignment):
        out[t] += loads[g]
    return out


def imbalance(loads: Sequence[float], assignment: Sequence[int], parallelism: int
              ) -> float | None:
    """Highest task load over the mean task load (1.0 is perfectly even)."""
    t = task_loads(loads, assignment, parallelism)
    mean = sum(t) / parallelism
    return None if mean == 0 else max(t) / mean


def balanced(loads: Sequence[float], current: Sequence[int], parallelism: int,
                        theta: float = 0.05) -> tuple[int, ...]:
    """An assignment of key groups to ``parallelism`` tasks that evens the load while moving
    few groups. Groups of tasks that no longer exist go first, heaviest first, to the
    least-loaded task. Then, while the most-loaded task T carries more than
    ``(1 + theta)`` times the mean, the best single step between T and the least-loaded task
    U is taken: moving one group of T to U, or swapping a group of T with a lighter one of
    U, whichever brings the pair closest to even (a move wins a tie); it stops when no step
    lowers T's load. Finally a task left without groups takes the lightest group of the task
    holding the most (the parallelism is ``max(assignment) + 1``). Deterministic."""
    if len(loads) != len(current):
        raise AssignmentError(f"loads ({len(loads)}) and the current assignment "
                              f"({len(current)}) differ in length; pass one load per key group")
    if parallelism < 1:
        raise AssignmentError(f"parallelism must be >= 1; got {parallelism}")
    w = [float(x) for x in loads]
    new = [t if 0 <= t < parallelism else -1 for t in current]
    load = [0.0] * parallelism
    for g, t in enumerate(new):
        if t >= 0:
            load[t] += w[g]
    for g in sorted((g for g, t in enumerate(new) if t < 0), key=lambda g: (-w[g], g)):
        t = min(range(parallelism), key=lambda i: (load[i], i))
        new[g] = t
        load[t] += w[g]
    target = (1.0 + theta) * sum(w) / parallelism
    for _ in range(4 * len(w) + 16):
        hi = max(range(parallelism), key=lambda i: (load[i], -i))
        lo = min(range(parallelism), key=lambda i: (load[i], i))
        gap = load[hi] - load[lo]
        if load[hi] <= target or gap <= 0:
            break
        mine = [g for g, t in enumerate(new) if t == hi]
        theirs = [g for g, t in enumerate(new) if t == lo]
        best: tuple[float, int, int, int | None] | None = None  # (distance, kind, g, h)
        for g in mine:
            if 0 < w[g] < gap:
                cand = (abs(gap / 2 - w[g]), 0, g, None)
                best = cand if best is None or cand[:3] < best[:3] else best
            for h in theirs:
                d = w[g] - w[h]
                if 0 < d < gap:
                    cand2 = (abs(gap / 2 - d), 1, g, h)
                    if best is None or cand2[:3] < best[:3]:
                        best = cand2
        if best is None:
            break
        _, _, g, h = best
        new[g] = lo
        load[hi] -= w[g]
        load[lo] += w[g]
        if h is not None:
            new[h] = hi
            load[lo] -= w[h]
            load[hi] += w[h]
    counts = [0] * parallelism
    for t in new:
        counts[t] += 1
    for t in range(parallelism):
        if counts[t] == 0:
            donor = max(range(parallelism), key=lambda i: (counts[i], -i))
            if counts[donor] < 2:
                break  # fewer groups than tasks
            g = min((g for g, o in enumerate(new) if o == donor), key=lambda g: (w[g], g))
            new[g] = t
            counts[donor] -= 1
            counts[t] += 1
    return tuple(new)
