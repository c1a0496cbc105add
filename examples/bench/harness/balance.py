"""Per-key-group load and assignments that even it: the skewed scenarios' rebalance target.

Why here: the rescale benchmark's ``skew`` scenario and the planning benchmark's ``skewed``
phase both count the load per key group on the generator's deterministic key sequence and
ask for an assignment that evens it; both must compute it the same way.

An *assignment* is a sequence, one task index per key group (``engine.dataflow.keygroups``' format).
Every function is pure and deterministic (ties break on the lower index). The load-evening
assignment itself is the engine's (``migration.assignment.balanced``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from migration.assignment import balanced as balanced_assignment
from migration.assignment import imbalance, task_loads


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

    from engine.dataflow.keygroups import key_group_of, uniform_assignment

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


__all__ = ["balanced_assignment", "group_loads", "imbalance", "lpt_assignment", "rebalance_target", "task_loads"]
