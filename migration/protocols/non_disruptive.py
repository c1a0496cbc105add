"""non-disruptive (Spacker): per step (a chunk of key groups chosen by the planning
strategy), the predecessors switch the routing and send a barrier down their channel to the
old owner; the old owner keeps processing everything and ships the chunk's state once every
channel delivered its barrier; the new owner sets aside records of the chunk until the state
is installed. Steps run in sequence. Without a planning the coordinator asks the adaptive
strategy (``migration.planning.adaptive_planning``) for one."""

from __future__ import annotations

from migration.plan import MigrationPlan
from migration.protocols.base import PlanRequest, ProtocolSpec, RescaleProtocol


def plan_non_disruptive(req: PlanRequest) -> MigrationPlan:
    """Steps from the request's ``migration.planning.Planning`` over its profiles."""
    from migration.planning import plan_steps

    if req.planning is None:
        raise ValueError("non-disruptive needs a planning strategy")
    return plan_steps(req.operator, req.old_assignment, req.new_assignment, req.planning,
                      req.profiles, first_id=req.first_id, matching=req.matching,
                      old_parallelism=req.old_parallelism,
                      new_parallelism=req.new_parallelism)


NON_DISRUPTIVE = ProtocolSpec(RescaleProtocol.NON_DISRUPTIVE, live=True, trigger=False,
                              aligned=True, block_aligned=False, pause_new_owner=False,
                              concurrent=False, planner=plan_non_disruptive)
