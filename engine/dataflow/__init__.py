"""The job as a definition: the logical graph a user builds (``graph``), its validated
configuration (``config``, ``restart``, ``guarantees``), the physical plan derived from it
(``physical``: vertices, edges, parallelism, forward groups), the key groups and their
assignment to tasks (``keygroups``), which source partitions each source task reads
(``partitions``) and which tasks exist and how they are wired (``deployment``). Frozen values and pure functions; nothing here runs a record.

May import: ``engine.errors``, ``engine.names``, ``engine.wire``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.names import lazy_exports

if TYPE_CHECKING:
    from engine.dataflow.config import JobConfig
    from engine.dataflow.deployment import Deployment
    from engine.dataflow.graph import InputDef, JobGraph, OperatorDef
    from engine.dataflow.guarantees import DeliveryGuarantee
    from engine.dataflow.keygroups import DEFAULT_NUM_KEY_GROUPS, key_group_of, stable_hash
    from engine.dataflow.physical import Edge, PhysicalPlan, Vertex, plan_physical
    from engine.dataflow.restart import RestartDecision, RestartStrategy

# name -> its module, imported on first use: importing the package loads none of its
# modules, so it costs nothing and closes no import cycle; the imports above are the same
# names for type checkers and the layer test (tests/unit/test_public_api.py checks both agree)
_EXPORTS: dict[str, str] = {
    "JobConfig": "engine.dataflow.config",
    "Deployment": "engine.dataflow.deployment",
    "InputDef": "engine.dataflow.graph",
    "JobGraph": "engine.dataflow.graph",
    "OperatorDef": "engine.dataflow.graph",
    "DeliveryGuarantee": "engine.dataflow.guarantees",
    "DEFAULT_NUM_KEY_GROUPS": "engine.dataflow.keygroups",
    "key_group_of": "engine.dataflow.keygroups",
    "stable_hash": "engine.dataflow.keygroups",
    "Edge": "engine.dataflow.physical",
    "PhysicalPlan": "engine.dataflow.physical",
    "Vertex": "engine.dataflow.physical",
    "plan_physical": "engine.dataflow.physical",
    "RestartDecision": "engine.dataflow.restart",
    "RestartStrategy": "engine.dataflow.restart",
}

__all__ = [
    "DEFAULT_NUM_KEY_GROUPS",
    "DeliveryGuarantee",
    "Deployment",
    "Edge",
    "InputDef",
    "JobConfig",
    "JobGraph",
    "key_group_of",
    "OperatorDef",
    "PhysicalPlan",
    "plan_physical",
    "RestartDecision",
    "RestartStrategy",
    "stable_hash",
    "Vertex",
]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
