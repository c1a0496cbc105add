"""fluid and batched (Megaphone): the migration as a sequence of steps. Each step is
aligned at the old owner, which stops reading a channel once its barrier arrived until every
channel's did, then ships the step's state; the new owner sets aside records of the incoming
groups until their state is in; the next step starts after the previous one completed (with
an optional gap). ``fluid`` moves one key group per step; ``batched`` k per step, or, with
matching, steps in which every task sends and receives at most one group."""

from __future__ import annotations

from collections.abc import Sequence

from engine.keygroups import moved_key_groups
from migration.protocols.live import LivePlan, LiveProtocol, steps_from_chunks

FLUID = LiveProtocol("fluid", trigger=False, aligned=True, block_aligned=True,
                     pause_new_owner=False, concurrent=False)
BATCHED = LiveProtocol("batched", trigger=False, aligned=True, block_aligned=True,
                       pause_new_owner=False, concurrent=False)


def plan_fluid(operator: str, old: Sequence[int], new: Sequence[int], old_p: int, new_p: int,
               order: Sequence[int] | None = None, first_id: int = 0) -> LivePlan:
    """One key group per step, in ``order`` (default: key group order)."""
    moved = list(order) if order is not None else moved_key_groups(old, new)
    steps = steps_from_chunks([[kg] for kg in moved], old, new, first_id)
    return LivePlan(operator, FLUID.name, old_p, new_p, tuple(old), tuple(new), steps,
                    f"{len(moved)} steps of one key group")


def plan_batched(operator: str, old: Sequence[int], new: Sequence[int], old_p: int, new_p: int,
                 batch: int = 4, matching: bool = False, order: Sequence[int] | None = None,
                 first_id: int = 0) -> LivePlan:
    """Steps of ``batch`` key groups in ``order``; with ``matching``, steps in which no task
    sends or receives more than one group."""
    if batch < 1:
        raise ValueError("batch must be >= 1 key group")
    moved = list(order) if order is not None else moved_key_groups(old, new)
    if matching:
        from migration.planning import matching_steps

        chunks = matching_steps({kg: (old[kg], new[kg]) for kg in moved})
        reason = f"{len(chunks)} matching steps (every task sends and receives <= 1 group)"
    else:
        chunks = tuple(tuple(moved[i:i + batch]) for i in range(0, len(moved), batch))
        reason = f"{len(chunks)} steps of up to {batch} key groups"
    return LivePlan(operator, BATCHED.name, old_p, new_p, tuple(old), tuple(new),
                    steps_from_chunks(chunks, old, new, first_id), reason)
