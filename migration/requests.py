"""Rescale requests checked against the job's physical plan: pure, no Ray, no job state.

Why here: what makes a request valid (an operator that heads its task, a parallelism the
key groups allow, an assignment that gives every group one task, a protocol that exists,
forward edges kept: forward partners that can rescale with it) depends only on the plan
and the request, so it is a function that
unit tests call directly; the JobMaster's ``Rescaler.validate`` adds only what depends on
the running job (its state, the end of its input) and calls ``validate_request``.

Guarantees: ``validate_request`` returns a ``RescaleRequest`` with the protocol parsed,
or raises ``RescaleRefused`` whose message says what to change; it never changes the
protocol asked for (what a request runs as is ``migration.protocols.protocol_used``) and
never lets a forward edge join unequal parallelisms: a request for an operator with forward
partners passes only when they can rescale with it, as one rescale
(``PhysicalPlan.check_rescale``: the coordinator takes them along), and is refused naming
the edge otherwise.
"""

from __future__ import annotations

from typing import Any

from engine.dataflow.config import check_count
from engine.dataflow.keygroups import validate_assignment
from engine.dataflow.physical import PhysicalPlan, Vertex
from engine.errors import AssignmentError, RescaleRefused
from migration.assignment import AssignmentSpec
from migration.coordinator import RescaleRequest
from migration.planning import Planning
from migration.protocols import PROTOCOLS, RescaleProtocol
from migration.protocols.drrs import parse_without

#: ``RescaleRequest.reason`` of a request made through the job handle
BY_HANDLE = "requested through the job handle"


def vertex_to_rescale(plan: PhysicalPlan, operator: str) -> Vertex:
    """The vertex ``operator`` heads; ``RescaleRefused`` when the plan has no such operator
    or it is chained behind another one (it runs in that one's tasks)."""
    try:
        v = plan.vertex_of(operator)
    except KeyError:
        names = ", ".join(op.name for w in plan.vertices for op in w.operators)
        raise RescaleRefused(f"the job has no operator {operator!r}; operators: {names}"
                             ) from None
    if v.name != operator:
        raise RescaleRefused(
            f"operator {operator!r} is chained behind {v.name!r} and runs in its tasks; "
            f"rescale {v.name!r}")
    return v


def check_forward_edges(plan: PhysicalPlan, operator: str, parallelism: int,
                        live: bool = True) -> tuple[str, ...]:
    """The forward partners that rescale with vertex ``operator`` to ``parallelism`` tasks
    (empty at its current parallelism, a rebalance, or without any), or ``RescaleRefused``
    naming the edge when its forward group cannot rescale as one (a source in it, a keyed
    vertex other than ``operator``, ...: ``PhysicalPlan.check_rescale``; ``live``: the
    protocol is a live one). A forward edge never becomes a rebalance edge."""
    return plan.check_rescale(operator, parallelism, live=live)


def validate_request(plan: PhysicalPlan, operator: str, parallelism: int | None,
                     protocol: str, assignment: tuple[int, ...] | None = None,
                     planning: Any = None, strategy: AssignmentSpec | None = None, *,
                     live_rescaling: bool = True, reason: str = BY_HANDLE,
                     without: Any = ()) -> RescaleRequest:
    """The request to run ``operator`` (a vertex of ``plan``, which holds every vertex's
    current parallelism) at ``parallelism`` tasks (None: its current one, a rebalance by
    ``strategy``) with ``protocol``, or ``RescaleRefused`` saying what to change.
    ``live_rescaling``: the job's ``JobConfig.live_rescaling`` (off: only stop-restart).
    ``without``: DRRS mechanisms to switch off (the ablation; protocol drrs only)."""
    try:
        proto = RescaleProtocol.parse(protocol, "protocol")
        without = parse_without(without)
    except ValueError as exc:
        raise RescaleRefused(str(exc)) from None
    if without and proto != RescaleProtocol.DRRS:
        raise RescaleRefused(f"without= switches off mechanisms of drrs "
                             f"({', '.join(sorted(without))}); protocol '{proto}' has none "
                             "of them: use protocol='drrs' or leave without= out")
    if PROTOCOLS[proto].live and not live_rescaling:
        raise RescaleRefused(
            f"protocol {proto!r} needs live rescaling, which this job's config switches "
            "off (JobConfig(live_rescaling=False)); use protocol='stop-restart' or enable it")
    v = vertex_to_rescale(plan, operator)
    if parallelism is None:
        parallelism = v.parallelism
    parallelism = check_count(f"rescale of {operator!r}: parallelism", parallelism,
                              error=RescaleRefused)
    if v.is_source:  # partitions handed over (any live protocol) or stop-restart; more
        # tasks than partitions is allowed: the surplus ones read nothing and end at once
        if assignment is not None or planning is not None or strategy is not None:
            raise RescaleRefused(f"operator {operator!r} is a source: it has partitions, not "
                                 "key groups; rescale it without an assignment, strategy or "
                                 "planning")
        check_forward_edges(plan, v.name, parallelism, PROTOCOLS[proto].live)
        return RescaleRequest(v.name, parallelism, proto, None, None, reason, without=without)
    nkg = plan.num_key_groups
    if v.keyed and parallelism > nkg:
        raise RescaleRefused(
            f"parallelism {parallelism} for keyed operator {operator!r} exceeds the number "
            f"of key groups ({nkg})")
    if assignment is not None:
        if not v.keyed:
            raise RescaleRefused(f"operator {operator!r} is not keyed; it has no key "
                                 "groups to assign")
        try:
            validate_assignment(tuple(assignment), nkg, parallelism)
        except ValueError as exc:
            raise RescaleRefused(f"assignment for {operator!r} refused: {exc}") from None
    if strategy is not None:
        if not isinstance(strategy, AssignmentSpec):
            raise RescaleRefused(f"assignment strategy must be a migration.assignment."
                                 f"AssignmentSpec, not {type(strategy).__name__}")
        if not v.keyed:
            raise RescaleRefused(f"operator {operator!r} is not keyed; an assignment "
                                 f"strategy ({strategy.strategy}) needs key groups")
        try:
            strategy.check(nkg)
        except AssignmentError as exc:
            raise RescaleRefused(str(exc)) from None
    if planning is not None and not isinstance(planning, Planning):
        raise RescaleRefused(f"planning must be a migration.planning.Planning, not "
                             f"{type(planning).__name__}")
    check_forward_edges(plan, v.name, parallelism, PROTOCOLS[proto].live)
    # a live protocol for an operator without key groups runs as 'stateless'
    # (migration.coordinator.coordinator_for); the request keeps what was asked
    return RescaleRequest(v.name, parallelism, proto,
                          tuple(assignment) if assignment is not None else None, planning,
                          reason, strategy=strategy, without=without)


__all__ = ["BY_HANDLE", "check_forward_edges", "validate_request", "vertex_to_rescale"]
