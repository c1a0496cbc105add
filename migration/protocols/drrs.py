"""DRRS: fine-grained live rescaling with decoupled trigger/confirm barriers (planning).

For one *subscale* S (key groups K moving from old owner s to new owner d):

1. Every predecessor u switches its routing for K to d, moves its unsent records of K to its
   buffer for d, puts ``ConfirmBarrier(S, c_ud)`` on its data channel to s (``c_ud`` is u's
   channel to d), and sends ``TriggerBarrier(S)`` to s on the priority path.
2. s, on the first trigger (or confirm) of S, tells d (``SubscaleTriggered``) and sends it
   the group with the smallest state at once; d pulls the rest of K one at a time
   (``PullState``), those its waiting records need first; per sent group s snapshots,
   removes, marks it *migrated out* and sends ``MigrateState`` (priority path). Records
   of migrated-out groups that s still finds in its input are re-routed to d, in order,
   on the re-route channel s->d; each confirm barrier s meets is forwarded on the same
   path after them. A group not pulled yet is still s's: s processes its records.
3. d installs arriving state. For a group g of S: re-routed records are processable once g's
   state is in; records straight from u once, in addition, u's confirm came back through s.
   Records that cannot be processed yet are set aside per (channel, key group), up to a
   task-wide cap. g is *active* once its state is in and every predecessor's confirm has
   arrived.
4. Event time: s puts ``WatermarkHold(S, w)`` on its output channels when it is first
   triggered (``w`` its watermark then); d puts ``WatermarkRelease(S)`` on its own once
   every group of S is active there, behind their outputs. Between the two the receivers'
   watermark stays at or below ``w``, so no window downstream fires before the records of
   K still on their way (re-routed, set aside, held timers) have been processed
   (docs/architecture.md, "the event-time invariant of a live rescale").

The per-task side of this lives in ``migration.participant``; the scheduling of subscales
(at once, bounded per task and per operator) in ``migration.scheduling``; this module plans.

The ablation (the paper's Fig. 14): ``RescaleRequest.without`` switches mechanisms off,
each a ``DrrsMechanism``; ``drrs_without`` is the spec they run as (never in ``PROTOCOLS``):

* ``decoupled-barriers``: no trigger; the old owner starts migrating once the confirm of
  every predecessor is in (the alignment of a coupled barrier, without blocking its
  channels), then forwards the confirms and the new owner pulls as above. Nothing is
  re-routed (every predecessor had switched), and the propagation delay is the alignment's.
* ``record-scheduling``: a record of an incoming group that cannot be processed yet stops
  its channel (nothing set aside; the task core still reads its other channels), and the
  new owner pulls in the subscale's order (smallest state first), not the groups its
  waiting records need first; and the old owner reaches a subscale's confirm barrier in
  its input order, behind every record of other groups queued in front of it (with record
  scheduling it takes the confirm ahead of them, with the subscale's records in front of
  it re-routed: ``migration.participant``).
* ``subscale-division``: one subscale per (old owner, new owner) pair holding all the
  pair's groups (a subscale has one old and one new owner), every one started at once,
  without the per-task and per-operator limits or the pacing: one scaling operation.

Without decoupled barriers or record scheduling a channel may wait on a migration; so
that no two subscales wait on each other (A's channel for B's, B's for A's), the scheduler
then never runs subscales whose (old, new) pairs form a cycle (``SubscaleScheduler``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from functools import cache

from engine.dataflow.keygroups import moved_key_groups
from engine.names import NameEnum
from migration.plan import MigrationPlan, subscales_by_pair
from migration.protocols.base import PlanRequest, ProtocolSpec, RescaleProtocol


def plan_drrs(req: PlanRequest) -> MigrationPlan:
    """Subscales by (old owner, new owner) pair of at most ``subscale_size`` groups and,
    given the groups' state sizes, ``subscale_bytes`` bytes (a larger group travels alone);
    pairs sorted, or in the planning's priority order when a planning is given. DRRS groups
    by pair; small subscales let new tasks start early, and a byte budget bounds how long the
    records of a subscale's last group wait at the new owner (its groups go one at a time)."""
    if req.subscale_size < 1:
        raise ValueError("subscale_size must be >= 1")
    if req.subscale_bytes is not None and req.subscale_bytes < 1:
        raise ValueError("subscale_bytes must be >= 1 or None")
    old, new = req.old_assignment, req.new_assignment
    sizes = {kg: p.state_bytes for kg, p in req.profiles.items()}
    budget = req.subscale_bytes if sizes else None
    moved = moved_key_groups(old, new)
    order: tuple[int, ...] = ()
    if req.planning is not None:
        from migration.planning import order_groups

        order = tuple(order_groups(moved, req.profiles, req.planning))
        subs = subscales_by_pair(order, old, new, req.first_id, req.subscale_size, sizes,
                                 budget)
        how = "subscales by (old, new) pair in planning order"
    else:
        subs = subscales_by_pair(moved, old, new, req.first_id, req.subscale_size, sizes,
                                 budget, sort_pairs=True)
        how = "subscales by (old, new) pair"
    limit = f"{req.subscale_size} groups" + (
        f" and {budget / 1e6:g} MB of state" if budget is not None else "")
    return MigrationPlan(req.operator, RescaleProtocol.DRRS, req.old_parallelism,
                         req.new_parallelism, old, new, (subs,) if subs else (),
                         f"{how}, at most {limit} each (a larger group alone): "
                         f"{len(subs)} subscales", order)


DRRS = ProtocolSpec(RescaleProtocol.DRRS, live=True, trigger=True, aligned=False,
                    block_aligned=False, pause_new_owner=False, concurrent=True,
                    planner=plan_drrs)


class DrrsMechanism(NameEnum):
    """A mechanism of DRRS that ``RescaleRequest.without`` can switch off (the ablation)."""

    DECOUPLED_BARRIERS = "decoupled-barriers"
    RECORD_SCHEDULING = "record-scheduling"
    SUBSCALE_DIVISION = "subscale-division"


def parse_without(without: Iterable[str] | str | None) -> frozenset[DrrsMechanism]:
    """The mechanisms named by ``without`` (names or ``DrrsMechanism``; one name alone is
    taken as one, not as letters); ``ValueError`` naming the choices otherwise."""
    if without is None:
        return frozenset()
    if isinstance(without, str):
        without = (without,)
    return frozenset(DrrsMechanism.parse(m, "DRRS mechanism") for m in without)


def describe_without(without: Iterable[str]) -> str:
    """"without decoupled barriers, record scheduling" (sorted), or "" for none."""
    names = sorted(str(m).replace("-", " ") for m in without)
    return f"without {', '.join(names)}" if names else ""


def plan_undivided(req: PlanRequest) -> MigrationPlan:
    """DRRS without subscale division: one subscale per (old owner, new owner) pair with
    every group the pair moves, whatever the size limits say."""
    moved = moved_key_groups(req.old_assignment, req.new_assignment)
    plan = plan_drrs(dataclasses.replace(req, subscale_size=max(1, len(moved)),
                                         subscale_bytes=None, profiles={}))
    n = len(plan.subscales)
    return dataclasses.replace(
        plan, reason=f"one subscale per (old, new) pair with all its groups, every one at "
                     f"once: {n} subscale{'' if n == 1 else 's'}")


@cache
def drrs_without(without: frozenset[DrrsMechanism]) -> ProtocolSpec:
    """The spec DRRS runs as with the mechanisms ``without`` switched off (module doc);
    ``DRRS`` itself for none."""
    if not without:
        return DRRS
    coupled = DrrsMechanism.DECOUPLED_BARRIERS in without
    undivided = DrrsMechanism.SUBSCALE_DIVISION in without
    return dataclasses.replace(
        DRRS, trigger=not coupled, coupled=coupled,
        schedule_records=DrrsMechanism.RECORD_SCHEDULING not in without,
        divided=not undivided, planner=plan_undivided if undivided else plan_drrs,
        without=frozenset(str(m) for m in without))


def plan_subscales(operator: str, old_assignment: Sequence[int], new_assignment: Sequence[int],
                   old_parallelism: int, new_parallelism: int, subscale_size: int = 4,
                   first_id: int = 0, sizes: Mapping[int, int] | None = None,
                   subscale_bytes: int | None = None) -> MigrationPlan:
    """``plan_drrs`` for groups of known state ``sizes`` (bytes), without a planning."""
    from migration.planning import GroupProfile

    profiles = {kg: GroupProfile(kg, 0.0, b) for kg, b in (sizes or {}).items()}
    return plan_drrs(PlanRequest(operator, tuple(old_assignment), tuple(new_assignment),
                                 old_parallelism, new_parallelism, first_id, profiles, None,
                                 subscale_size, subscale_bytes))
