"""Rescaling protocols, registered in one table.

``PROTOCOLS`` maps each ``RescaleProtocol`` to its ``ProtocolSpec`` (data-plane flags,
scheduling and planner); ``LIVE`` is the live subset. ``make_plan`` returns a protocol's
plan as a value (no I/O). The table in ``migration.protocols.base`` says how they differ;
``protocol_used`` says what a request runs as (``LiveMechanism`` for operators without key
groups).
"""

from __future__ import annotations

from migration.plan import MigrationPlan
from migration.protocols.base import (
    LiveMechanism,
    PlanRequest,
    ProtocolSpec,
    RescaleProtocol,
    protocol_used,
)
from migration.protocols.drrs import DRRS
from migration.protocols.meces import MECES
from migration.protocols.megaphone import BATCHED, FLUID
from migration.protocols.non_disruptive import NON_DISRUPTIVE
from migration.protocols.pause_resume import PAUSE_RESUME
from migration.protocols.stop_restart import STOP_RESTART

PROTOCOLS: dict[RescaleProtocol, ProtocolSpec] = {
    p.name: p for p in (DRRS, STOP_RESTART, PAUSE_RESUME, FLUID, BATCHED, NON_DISRUPTIVE,
                        MECES)}
LIVE: dict[RescaleProtocol, ProtocolSpec] = {n: p for n, p in PROTOCOLS.items() if p.live}


def protocol_spec(name: str) -> ProtocolSpec:
    """The spec of protocol ``name``; ``ValueError`` naming the choices otherwise."""
    return PROTOCOLS[RescaleProtocol.parse(name, "protocol")]


def make_plan(protocol: str, request: PlanRequest) -> MigrationPlan:
    """The plan of ``protocol`` for ``request``."""
    return protocol_spec(protocol).planner(request)


__all__ = ["LIVE", "PROTOCOLS", "LiveMechanism", "MigrationPlan", "PlanRequest", "ProtocolSpec",
           "RescaleProtocol", "make_plan", "protocol_spec", "protocol_used"]
