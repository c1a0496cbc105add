"""Rescaling protocols. ``PROTOCOLS`` lists the names ``JobHandle.rescale`` accepts;
``LIVE`` maps each live protocol to its data-plane flags; ``plan_live`` returns a live
protocol's plan as a value (no I/O)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine.keygroups import moved_key_groups
from migration.protocols.drrs import plan_subscales
from migration.protocols.live import LivePlan, LiveProtocol, split_by_pair
from migration.protocols.megaphone import BATCHED, FLUID, plan_batched, plan_fluid
from migration.protocols.non_disruptive import NON_DISRUPTIVE, plan_non_disruptive
from migration.protocols.pause_resume import PAUSE_RESUME, plan_pause_resume

DRRS = LiveProtocol("drrs", trigger=True, aligned=False, block_aligned=False,
                    pause_new_owner=False, concurrent=True)
LIVE: dict[str, LiveProtocol] = {p.name: p for p in
                                 (DRRS, PAUSE_RESUME, FLUID, BATCHED, NON_DISRUPTIVE)}
PROTOCOLS = ("drrs", "stop-restart", "pause-resume", "fluid", "batched", "non-disruptive")


def plan_live(protocol: str, operator: str, old: Sequence[int], new: Sequence[int],
              old_p: int, new_p: int, *, subscale_size: int = 4,
              subscale_bytes: int | None = None, batch: int = 4,
              matching: bool = False, planning: Any = None,
              profiles: Mapping[int, Any] | None = None, first_id: int = 0) -> LivePlan:
    """The plan of a live rescale. ``planning`` (a ``migration.planning.Planning``) orders
    the moving groups for every protocol and chunks them for ``non-disruptive`` (which
    needs one); ``profiles`` are per-group ``GroupProfile`` values (their ``state_bytes``
    size drrs subscales against ``subscale_bytes``)."""
    profiles = profiles or {}
    order = None
    if planning is not None:
        from migration.planning import order_groups

        order = order_groups(moved_key_groups(old, new), profiles, planning)
    if protocol == "drrs":
        sizes = {kg: p.state_bytes for kg, p in profiles.items()}
        budget = subscale_bytes if sizes else None
        if order is None:
            p = plan_subscales(operator, old, new, old_p, new_p, subscale_size, first_id,
                               sizes, budget)
            subs, reason = p.subscales, "subscales by (old, new) pair"
        else:
            subs, reason = split_by_pair(order, old, new, first_id, subscale_size, sizes,
                                         budget), (
                "subscales by (old, new) pair in planning order")
        limit = f"{subscale_size} groups" + (
            f" and {budget / 1e6:g} MB of state" if budget is not None else "")
        return LivePlan(operator, protocol, old_p, new_p, tuple(old), tuple(new),
                        (subs,) if subs else (),
                        f"{reason}, at most {limit} each (a larger group alone): "
                        f"{len(subs)} subscales")
    if protocol == "pause-resume":
        return plan_pause_resume(operator, old, new, old_p, new_p, first_id)
    if protocol == "fluid":
        return plan_fluid(operator, old, new, old_p, new_p, order, first_id)
    if protocol == "batched":
        return plan_batched(operator, old, new, old_p, new_p, batch, matching, order, first_id)
    if protocol == "non-disruptive":
        if planning is None:
            raise ValueError("non-disruptive needs a planning strategy")
        return plan_non_disruptive(operator, old, new, old_p, new_p, planning, profiles,
                                   first_id)
    raise ValueError(f"{protocol!r} is not a live protocol; live: {', '.join(LIVE)}")
