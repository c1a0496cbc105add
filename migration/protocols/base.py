"""What every protocol shares: its name (``RescaleProtocol``), its data-plane flags and
planner (``ProtocolSpec``) and the planner's input (``PlanRequest``).

A *subscale* moves key groups from one old owner to one new owner (``migration.plan``). On
the data plane every live protocol runs the same per-task state machine
(``migration.participant``), switched by the protocol's flags:

=================  =======  =======  =====  ==========  ================================
protocol           trigger  aligned  block  pause new   scheduling
=================  =======  =======  =====  ==========  ================================
drrs               yes      no       no     no          subscales at once, per-task limit
meces              fetch    no       no     no          one step: a subscale per pair
pause-resume       no       yes      yes    yes         one step: every group at once
fluid              no       yes      yes    no          steps of one group, in sequence
batched            no       yes      yes    no          steps of k groups (or a matching)
non-disruptive     no       yes      no     no          steps from the planning strategy
stop-restart       (not live: pause, drain, snapshot, redeploy, install, resume)
=================  =======  =======  =====  ==========  ================================

These flags move key groups. An operator without key groups has nothing to move: asked to
rescale live with any of them, a source hands its partitions over and any other operator
adds or drains tasks (``LiveMechanism``, ``protocol_used``); ``stop-restart`` stays what
it is for every operator.

*trigger*: predecessors send a priority trigger and the old owner migrates at once,
re-routing later records (DRRS). *fetch* (``fetch_on_demand``, Meces): no trigger; the new
owner fetches a group the moment a record of it finds the state missing, and the old owner
starts on that first fetch or its first confirm barrier, then sends the rest in the
background, re-routing later records as DRRS does. *aligned*: the old owner ships a group's
state only once every predecessor's confirm barrier is in, so nothing is ever re-routed.
*block*: while
aligning, a channel that delivered its barrier is not read. *pause new*: the new owner reads
nothing from a channel after its barrier until the state is in. In every live protocol the
new owner sets aside records of a group whose state has not arrived (bounded, per channel).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.names import NameEnum
from migration.plan import MigrationPlan


class RescaleProtocol(NameEnum):
    """The protocols ``JobHandle.rescale`` accepts."""

    DRRS = "drrs"
    MECES = "meces"
    STOP_RESTART = "stop-restart"
    PAUSE_RESUME = "pause-resume"
    FLUID = "fluid"
    BATCHED = "batched"
    NON_DISRUPTIVE = "non-disruptive"


class LiveMechanism(NameEnum):
    """How a live rescale runs for an operator without key groups, in place of the key-group
    protocol that was asked for (``RescaleReport.protocol``; the request's protocol is in
    ``RescaleReport.requested_protocol``):

    * ``handover``: a source's partitions go to a new set of source tasks with their
      resume states (``migration.coordinator.SourceRescale``);
    * ``stateless``: a non-keyed operator gets new tasks, wired while the job runs, or
      drains and removes some (``migration.coordinator.StatelessRescale``); no state moves
      and no other operator stops."""

    HANDOVER = "handover"
    STATELESS = "stateless"


def protocol_used(protocol: str, *, keyed: bool, source: bool) -> str:
    """What a rescale of an operator runs as, asked with ``protocol``: ``stop-restart``
    as asked; a live protocol as itself for a keyed operator, ``handover`` for a source,
    ``stateless`` for any other operator (its tasks hold no key groups). What controllers
    compare with ``RescaleReport.protocol`` and the measured ``RescaleRecord.protocol``."""
    proto = RescaleProtocol.parse(protocol, "protocol")
    if proto == RescaleProtocol.STOP_RESTART or keyed:
        return str(proto)
    return str(LiveMechanism.HANDOVER if source else LiveMechanism.STATELESS)


@dataclass(frozen=True)
class PlanRequest:
    """Everything a planner may use. ``profiles``: per key group ``GroupProfile`` (load,
    state size), asked from the tasks when ``ProtocolSpec.needs_profiles`` says so;
    ``planning``: a ``migration.planning.Planning`` (ordering, chunking), or None for the
    protocol's default."""

    operator: str
    old_assignment: tuple[int, ...]
    new_assignment: tuple[int, ...]
    old_parallelism: int
    new_parallelism: int
    first_id: int = 0
    profiles: Mapping[int, Any] = field(default_factory=dict)
    planning: Any = None
    subscale_size: int = 4
    subscale_bytes: int | None = None
    batch: int = 4
    matching: bool = False


@dataclass(frozen=True)
class ProtocolSpec:
    """A protocol's data-plane flags (see the module table), its scheduling and its planner."""

    name: RescaleProtocol
    live: bool
    trigger: bool
    aligned: bool
    block_aligned: bool
    pause_new_owner: bool
    concurrent: bool  # True: subscales scheduled independently; False: steps in sequence
    planner: Callable[[PlanRequest], MigrationPlan]
    fetch_on_demand: bool = False  # Meces: the new owner fetches a group on its first record
    # the DRRS ablation (migration.protocols.drrs.drrs_without; never in PROTOCOLS):
    # coupled: no trigger; the old owner starts migrating once every confirm is in, then
    # the new owner pulls as in drrs (a coupled barrier's alignment, without blocking)
    coupled: bool = False
    # schedule_records False: a record of an incoming group that cannot be processed yet
    # stops its channel instead of being set aside, and pulls ignore waiting records
    schedule_records: bool = True
    # divided False: every subscale starts at once, with no per-task or operator limit
    divided: bool = True
    without: frozenset[str] = frozenset()  # the DrrsMechanism values switched off

    def __post_init__(self) -> None:
        starts = [f for f in (self.trigger, self.fetch_on_demand, self.coupled) if f]
        if self.live and (len(starts) != 1) != self.aligned:
            raise ValueError(f"protocol {self.name}: exactly one of trigger, "
                             "fetch_on_demand, coupled and aligned")
        if len(starts) > 1:
            raise ValueError(f"protocol {self.name}: exactly one of trigger, "
                             "fetch_on_demand, coupled and aligned")
        if self.block_aligned and not self.aligned:
            raise ValueError(f"protocol {self.name}: block_aligned needs aligned")

    @property
    def reroutes(self) -> bool:
        """The old owner ships groups before every confirm is in and re-routes the records
        of shipped groups it still finds (drrs, meces); the new owner waits for each
        predecessor's confirm to come back through it."""
        return self.live and not self.aligned

    def needs_profiles(self, request_planning: Any, subscale_bytes: int | None) -> bool:
        """Whether planning needs per-group load and size from the tasks."""
        return (request_planning is not None or self.name == RescaleProtocol.NON_DISRUPTIVE
                or (self.name == RescaleProtocol.DRRS and subscale_bytes is not None))
