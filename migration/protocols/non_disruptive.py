"""non-disruptive (Spacker): per step (a chunk of key groups chosen by the planning
strategy), the predecessors switch the routing and send a barrier down their channel to the
old owner; the old owner keeps processing everything and ships the chunk's state once every
channel delivered its barrier; the new owner sets aside records of the chunk until the state
is installed. Steps run in sequence."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from migration.protocols.live import LivePlan, LiveProtocol

NON_DISRUPTIVE = LiveProtocol("non-disruptive", trigger=False, aligned=True,
                              block_aligned=False, pause_new_owner=False, concurrent=False)


def plan_non_disruptive(operator: str, old: Sequence[int], new: Sequence[int], old_p: int,
                        new_p: int, planning: Any, profiles: Mapping[int, Any],
                        first_id: int = 0) -> LivePlan:
    """Steps from a ``migration.planning.Planning`` over the per-group ``profiles``."""
    from migration.planning import plan_steps

    sp = plan_steps(operator, old, new, planning, profiles, first_id=first_id)
    return LivePlan(operator, NON_DISRUPTIVE.name, old_p, new_p, tuple(old), tuple(new),
                    sp.steps, sp.reason)
