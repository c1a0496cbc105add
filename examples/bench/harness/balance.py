"""Per-key-group load and assignments that even it: the skewed scenarios' rebalance target.

Why here: the rescale benchmark's ``skew`` scenario and the planning benchmark's ``skewed``
phase both count the load per key group on the generator's deterministic key sequence and
ask for an assignment that evens it; both must compute it the same way.

An *assignment* is a sequence, one task index per key group (``engine.keygroups``' format).
Every function is pure and deterministic (ties break on the lower index).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from examples.bench.harness import BenchError


def group_loads(key_counts: Mapping[Any, float] | Sequence[float],
                key_group: Callable[[Any], int],
                num_key_groups: int) -> list[float]:
    """Per-key-group load from per-key loads (a mapping key -> load, or a sequence indexed by
    key) and a function ``key -> key group``."""
    items = key_counts.items() if isinstance(key_counts, Mapping) else enumerate(key_counts)
    out = [0.0] * num_key_groups
    for k, v in items:
        if v:
            out[key_group(k)] += float(v)
    return out


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


def balanced_assignment(loads: Sequence[float], current: Sequence[int], parallelism: int,
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
        raise BenchError(f"loads ({len(loads)}) and the current assignment ({len(current)}) "
                         "differ in length; pass one load per key group")
    if parallelism < 1:
        raise BenchError(f"parallelism must be >= 1; got {parallelism}")
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


def lpt_assignment(loads: Sequence[float], parallelism: int) -> tuple[int, ...]:
    """Longest-processing-time-first from scratch (heaviest group to the least-loaded task),
    then ``balanced_assignment``'s evening steps: Spacker's phase-3 reshuffle, which moves
    most groups."""
    return balanced_assignment(loads, [-1] * len(loads), parallelism)


def rebalance_target(keys: Any, num_keys: int, key_groups: int, from_p: int, to_p: int, *,
                     reshuffle: bool = False) -> dict[str, Any]:
    """The rebalance a skewed run requests: the load of each key group counted on ``keys``
    (the generator's key sequence up to the request), the current assignment (uniform over
    ``from_p`` tasks) and the target over ``to_p`` tasks — ``balanced_assignment`` from the
    current one (few groups move) or, with ``reshuffle``, ``lpt_assignment`` from scratch.
    Returns ``assignment`` (a tuple), ``group_loads``, ``group_skew`` (max / mean group load),
    ``imbalance_before``, ``imbalance_after`` and ``planned_groups_moved``."""
    import numpy as np

    from engine.keygroups import key_group_of, uniform_assignment

    counts = np.bincount(np.asarray(keys, dtype=np.int64), minlength=num_keys)
    loads = group_loads(counts.tolist(), lambda k: key_group_of(int(k), key_groups), key_groups)
    cur = uniform_assignment(key_groups, from_p)
    new = lpt_assignment(loads, to_p) if reshuffle else balanced_assignment(loads, cur, to_p)
    mean = sum(loads) / len(loads)
    return {"assignment": new, "group_loads": loads,
            "group_skew": max(loads) / mean if mean else None,
            "imbalance_before": imbalance(loads, cur, from_p),
            "imbalance_after": imbalance(loads, new, to_p),
            "planned_groups_moved": sum(1 for a, b in zip(cur, new, strict=True) if a != b)}
