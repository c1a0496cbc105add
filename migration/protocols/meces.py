"""meces (Meces, ATC'22; DRRS's baseline): prioritized state migration by fetch-on-demand.

Meces switches the routing of every moving key group at once, with one synchronization
(the predecessors' in-band barrier), and then moves state two ways at once: the new owner
*fetches* a group the first time a record needs it, and the rest of the groups migrate in
the *background*. Its hierarchical state organisation (operator state -> key group -> keys,
with sub-group bins in the original) is what lets one group be cut out and shipped alone
while the others stay put; reflow's keyed backends hold state per key group already, and,
as in the DRRS paper's evaluation of Meces, the key group is the unit that moves.

For one rescale with ``protocol="meces"`` (flags in ``migration.protocols.base``):

1. Plan: every moved group in one step, one subscale per (old owner, new owner) pair
   (``plan_meces``); no subscale division and no per-task limit: every pair starts at once.
2. Every predecessor switches the routing of the pair's groups and puts a ``ConfirmBarrier``
   on its channel to the old owner; no priority trigger.
3. The new owner, meeting a record of an incoming group whose state is neither here nor
   asked for, sends ``PullState`` for that group at once (a fetch; several may be in flight)
   and sets the record aside. The old owner starts migrating on the first fetch (shipping
   the fetched group) or on the first confirm barrier (shipping the smallest group); then
   the new owner pulls the remaining groups one at a time in the background, whenever no
   fetch or pull is in flight.
4. From there on it is DRRS's data plane (``migration.participant``): the old owner
   re-routes records of a shipped group it still finds, in order, and forwards the
   confirms behind them; the new owner processes a record once the group's state is in and,
   for a record straight from a predecessor, that predecessor's confirm came back.

What differs from the paper, and why. In Meces a record at the new owner is processed as
soon as the group's state is there, and the old owner, finding a record of a group it
already gave away (sent before the routing switch), fetches the state *back*; hot groups
can travel back and forth many times (the DRRS paper counts 6.25 moves per sub-key-group on
average, up to 46, on Q7). Exactly-once holds, but a key's records may be applied out of
their order along one path: a record routed to the new owner after the switch can be
applied before an older one still in flight to the old owner. The DRRS paper names this:
Meces "fails to preserve execution semantics under its fetch-on-demand method". reflow's
oracle demands per key the outputs and final state of the run without rescaling, so reflow
runs the order-preserving variant of step 4: a group moves once, late records follow it
(re-routed) instead of the state going back, and the new owner waits for the confirms.
The back-and-forth cost of the original is therefore absent; its single synchronization,
the routing switched for every group at once, fetch-on-demand at first access and the
background migration are kept. Two smaller differences: the background order is the
smallest state first (the original streams whole key groups in parallel), and records that
wait are set aside per (channel, group) as in every reflow protocol (Meces' port in the
DRRS repository suspends the task instead; reflow's cap ``drrs_set_aside_cap`` bounds them,
and a channel whose next record cannot be set aside waits).
"""

from __future__ import annotations

from engine.dataflow.keygroups import moved_key_groups
from migration.plan import MigrationPlan, subscales_by_pair
from migration.protocols.base import PlanRequest, ProtocolSpec, RescaleProtocol


def plan_meces(req: PlanRequest) -> MigrationPlan:
    """Every moved group in one step, one subscale per (old owner, new owner) pair, pairs
    sorted, groups in key-group order (or the planning's priority order when one is given;
    it breaks ties in the background order). No size limit: Meces does not divide."""
    old, new = req.old_assignment, req.new_assignment
    moved = moved_key_groups(old, new)
    order: tuple[int, ...] = ()
    if req.planning is not None:
        from migration.planning import order_groups

        order = tuple(order_groups(moved, req.profiles, req.planning))
        step = subscales_by_pair(order, old, new, req.first_id)
    else:
        step = subscales_by_pair(moved, old, new, req.first_id, sort_pairs=True)
    return MigrationPlan(req.operator, RescaleProtocol.MECES, req.old_parallelism,
                         req.new_parallelism, old, new, (step,) if step else (),
                         f"all {len(moved)} moving key groups at once, one subscale per "
                         f"(old, new) pair: {len(step)} subscale{'' if len(step) == 1 else 's'};"
                         " each group fetched by its new owner on its first record, the rest in "
                         "the background", order)


MECES = ProtocolSpec(RescaleProtocol.MECES, live=True, trigger=False, aligned=False,
                     block_aligned=False, pause_new_owner=False, concurrent=False,
                     planner=plan_meces, fetch_on_demand=True)
