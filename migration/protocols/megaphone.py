"""fluid and batched (Megaphone): the migration as a sequence of steps. Each step is
aligned at the old owner, which stops reading a channel once its barrier arrived until every
channel's did, then ships the step's state; the new owner sets aside records of the incoming
groups until their state is in; the next step starts after the previous one completed (with
an optional gap). ``fluid`` moves one key group per step; ``batched`` k per step, or, with
matching, steps in which every task sends and receives at most one group."""

from __future__ import annotations

from engine.dataflow.keygroups import moved_key_groups
from migration.plan import MigrationPlan, steps_from_chunks
from migration.protocols.base import PlanRequest, ProtocolSpec, RescaleProtocol


def _order(req: PlanRequest) -> tuple[list[int], tuple[int, ...]]:
    """The moved groups in the planning's priority order (key group order without one)."""
    moved = moved_key_groups(req.old_assignment, req.new_assignment)
    if req.planning is None:
        return moved, ()
    from migration.planning import order_groups

    order = tuple(order_groups(moved, req.profiles, req.planning))
    return list(order), order


def plan_fluid(req: PlanRequest) -> MigrationPlan:
    """One key group per step."""
    moved, order = _order(req)
    steps = steps_from_chunks([[kg] for kg in moved], req.old_assignment, req.new_assignment,
                              req.first_id)
    return MigrationPlan(req.operator, RescaleProtocol.FLUID, req.old_parallelism,
                         req.new_parallelism, req.old_assignment, req.new_assignment, steps,
                         f"{len(moved)} steps of one key group", order)


def plan_batched(req: PlanRequest) -> MigrationPlan:
    """Steps of ``batch`` key groups; with ``matching``, steps in which no task sends or
    receives more than one group."""
    if req.batch < 1:
        raise ValueError("batch must be >= 1 key group")
    moved, order = _order(req)
    if req.matching:
        from migration.planning import matching_steps

        chunks = matching_steps({kg: (req.old_assignment[kg], req.new_assignment[kg])
                                 for kg in moved})
        reason = f"{len(chunks)} matching steps (every task sends and receives <= 1 group)"
    else:
        chunks = tuple(tuple(moved[i:i + req.batch]) for i in range(0, len(moved), req.batch))
        reason = f"{len(chunks)} steps of up to {req.batch} key groups"
    return MigrationPlan(req.operator, RescaleProtocol.BATCHED, req.old_parallelism,
                         req.new_parallelism, req.old_assignment, req.new_assignment,
                         steps_from_chunks(chunks, req.old_assignment, req.new_assignment,
                                           req.first_id), reason, order)


FLUID = ProtocolSpec(RescaleProtocol.FLUID, live=True, trigger=False, aligned=True,
                     block_aligned=True, pause_new_owner=False, concurrent=False,
                     planner=plan_fluid)
BATCHED = ProtocolSpec(RescaleProtocol.BATCHED, live=True, trigger=False, aligned=True,
                       block_aligned=True, pause_new_owner=False, concurrent=False,
                       planner=plan_batched)
