"""pause-resume (Trisk): the predecessors switch the routing of every moving key group at
once and send a barrier down every channel to the affected tasks; an old owner pauses each
channel that delivered its barrier until all did, then ships the groups' state; a new owner
pauses each channel after its barrier until the state is installed. Only affected tasks
pause; everything moves in one step."""

from __future__ import annotations

from engine.dataflow.keygroups import moved_key_groups
from migration.plan import MigrationPlan, subscales_by_pair
from migration.protocols.base import PlanRequest, ProtocolSpec, RescaleProtocol


def plan_pause_resume(req: PlanRequest) -> MigrationPlan:
    moved = moved_key_groups(req.old_assignment, req.new_assignment)
    step = subscales_by_pair(moved, req.old_assignment, req.new_assignment, req.first_id)
    return MigrationPlan(req.operator, RescaleProtocol.PAUSE_RESUME, req.old_parallelism,
                         req.new_parallelism, req.old_assignment, req.new_assignment,
                         (step,) if step else (),
                         f"all {len(moved)} moving key groups in one step")


PAUSE_RESUME = ProtocolSpec(RescaleProtocol.PAUSE_RESUME, live=True, trigger=False,
                            aligned=True, block_aligned=True, pause_new_owner=True,
                            concurrent=False, planner=plan_pause_resume)
