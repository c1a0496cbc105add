"""pause-resume (Trisk): the predecessors switch the routing of every moving key group at
once and send a barrier down every channel to the affected tasks; an old owner pauses each
channel that delivered its barrier until all did, then ships the groups' state; a new owner
pauses each channel after its barrier until the state is installed. Only affected tasks
pause; everything moves in one step."""

from __future__ import annotations

from collections.abc import Sequence

from engine.keygroups import moved_key_groups
from migration.protocols.live import LivePlan, LiveProtocol, split_by_pair

PAUSE_RESUME = LiveProtocol("pause-resume", trigger=False, aligned=True, block_aligned=True,
                            pause_new_owner=True, concurrent=False)


def plan_pause_resume(operator: str, old: Sequence[int], new: Sequence[int], old_p: int,
                      new_p: int, first_id: int = 0) -> LivePlan:
    moved = moved_key_groups(old, new)
    step = split_by_pair(moved, old, new, first_id)
    return LivePlan(operator, PAUSE_RESUME.name, old_p, new_p, tuple(old), tuple(new),
                    (step,) if step else (), f"all {len(moved)} moving key groups in one step")
