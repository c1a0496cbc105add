"""A ``JobRecord`` as the durable job record keeps it, and back (issue 30, sans-IO).

Why: a JobMaster restarted after its process died has the job's graph again (Ray passes
its constructor the same arguments) but none of what happened since: rescales, changes of
logic, the deployment and its generation, restarts, the last complete checkpoint, the
controllers' history. ``durable_of`` turns the running JobMaster's ``JobRecord`` into an
``engine.checkpoints.durable_record.DurableRecord`` (plain values; the store
``engine.checkpoints.job_store`` writes it), and ``job_record_of`` rebuilds the
``JobRecord`` from one and the graph. No I/O here, no Ray.

What is kept how: the physical plan is not stored. It is the graph's plan
(``plan_physical``) at the recorded parallelisms (``PhysicalPlan.with_parallelism``, as a
rescale changes it) with the changed operators put back (``with_operator``, as a change
of logic does); the deployment's tasks, assignments, generation and sources' partitions
are stored as they are; rescales and decisions as their wire messages; the arbiter's
granted actions as plain tuples.

User code and trust: the operators whose function changed while the job ran, and the
controllers, are stored as cloudpickle bytes (codec ``"cloudpickle-user-code"``), since
a function has no other encoding. ``load_user_code`` is the one place that unpickles them.
They are read only by the job's own JobMaster, from the job's own checkpoint directory,
which only the job writes: the same trust as the code Ray ships to run the job, whose
deployer controls that directory. Never point a job at a checkpoint directory others can
write. Everything else in the record is msgpack and is never unpickled.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from engine.checkpoints.durable_record import DurableRecord, RecordProblem, unreadable
from engine.control.arbiter import Action, ActionKind, Running
from engine.control.job_state import CheckpointPointer, JobRecord, plan_with_operator
from engine.control.reconfiguration import DecisionRecord, RescaleRecord
from engine.control.steps import ReplaceOperator, with_operator
from engine.dataflow import graph as g
from engine.dataflow.deployment import Deployment
from engine.dataflow.physical import PhysicalPlan, plan_physical
from engine.errors import CodecError, JobRecordUnreadable, RescaleRefused
from engine.wire.messages import decode_message, encode_message


def dump_user_code(obj: object) -> bytes:
    """``obj`` (a changed ``OperatorDef``, a controller) as cloudpickle bytes, the declared
    codec of the record's ``user_code``."""
    import cloudpickle

    return bytes(cloudpickle.dumps(obj))


def load_user_code(data: bytes, what: str, *, job: str, path: str) -> object:
    """The object cloudpickled in ``data`` (``what``: how errors name it), or
    ``JobRecordUnreadable`` (reason ``user-code``) when it does not unpickle (e.g. a
    module of the job's is missing here).

    The trust boundary: this runs the code the bytes name. It is called only on the
    ``user_code`` of the job's own record, read by the job's own JobMaster from the job's
    own checkpoint directory (``engine.checkpoints.job_store``), which only that job
    writes: the same trust as the code Ray ships to the job's actors. Never call it on
    bytes that came from the network or from another job's directory. cloudpickle's
    output is a plain pickle stream that names its own helpers, so ``pickle.loads``
    reads it."""
    try:
        return pickle.loads(data)  # the job's own code: see the docstring
    except Exception as exc:  # unpickling raises whatever the user's code raises
        raise unreadable(path, job, RecordProblem.USER_CODE,
                         f"{what} does not unpickle here ({type(exc).__name__}: {exc}); "
                         "run the JobMaster where the job's modules import") from exc


def changed_logic(record: JobRecord, graph: g.JobGraph) -> dict[str, bytes]:
    """The operators of ``record.graph`` that are not ``graph``'s own (their function
    changed while the job ran), as ``durable_of`` takes them: name -> cloudpickle bytes
    of the operator's current definition."""
    original = {op.name: op for op in graph.operators}
    return {op.name: dump_user_code(op) for op in record.graph.operators
            if original.get(op.name) is not op}


def durable_of(record: JobRecord, master_epoch: int, next_checkpoint_id: int,
               logic: Mapping[str, bytes], controllers: Sequence[bytes],
               channels: Sequence[tuple[int, str, str, int]] = (), next_channel_id: int = 0,
               next_subscale_id: int = 0) -> DurableRecord:
    """``record`` as the store keeps it, written by the JobMaster of ``master_epoch``;
    ``next_checkpoint_id``: the checkpoint counter; ``logic``: the changed operators
    (``changed_logic``); ``controllers``: the controllers' cloudpickle bytes
    (``dump_user_code``); ``channels``/``next_channel_id``/``next_subscale_id``: the
    JobMaster's allocators (``ChannelIds.live``, ``SubscaleIds.next_id``)."""
    dep = record.deployment
    pointer = record.checkpoint
    return DurableRecord(
        job_id=record.job_id, name=record.graph.name, master_epoch=master_epoch,
        status=record.status, error=record.error, error_suffix=record.error_suffix,
        epoch=record.epoch, restarts=record.restarts, last_failure=record.last_failure,
        checkpoint=None if pointer is None else (pointer.checkpoint_id, pointer.kind,
                                                 pointer.location),
        next_checkpoint_id=next_checkpoint_id, generation=dep.generation,
        parallelism={v.name: v.parallelism for v in dep.plan.vertices},
        tasks=dict(dep.tasks), assignments=dict(dep.assignments),
        partitions=dict(dep.partitions),
        actions=tuple((r.ticket, str(r.action.kind), tuple(sorted(r.action.vertices)),
                       r.action.stop_restart, r.action.exclusive, r.action.label)
                      for r in record.actions),
        rescales=tuple(encode_message(r) for r in record.rescales),
        decisions=tuple(encode_message(d) for d in record.decisions),
        logic=dict(logic), controllers=tuple(controllers), channels=tuple(channels),
        next_channel_id=next_channel_id, next_subscale_id=next_subscale_id)


def running_of(durable: DurableRecord, *, path: str = "") -> tuple[Running, ...]:
    """The arbiter's granted actions the record lists, as ``Running`` values."""
    try:
        return tuple(Running(ticket, Action(ActionKind.parse(kind, "action kind"),
                                            frozenset(vertices), stop_restart, exclusive,
                                            label))
                     for ticket, kind, vertices, stop_restart, exclusive, label
                     in durable.actions)
    except ValueError as exc:
        raise unreadable(path, durable.job_id, RecordProblem.CORRUPT,
                         f"an action does not hold: {exc}") from exc


def _messages(data: Sequence[bytes], kind: type, durable: DurableRecord,
              path: str) -> tuple[Any, ...]:
    out = []
    for b in data:
        try:
            msg = decode_message(b)
        except CodecError as exc:
            raise unreadable(path, durable.job_id, RecordProblem.CORRUPT,
                             f"a {kind.__name__} does not decode: {exc}") from exc
        if not isinstance(msg, kind):
            raise unreadable(path, durable.job_id, RecordProblem.CORRUPT,
                             f"a {kind.__name__} is a {type(msg).__name__}")
        out.append(msg)
    return tuple(out)


def _changed_operators(durable: DurableRecord, graph: g.JobGraph,
                       path: str) -> list[g.OperatorDef]:
    """The record's changed operators, unpickled and checked against ``graph``."""
    original = {op.name: op for op in graph.operators}
    out = []
    for name, data in durable.logic.items():
        op = load_user_code(data, f"the changed logic of operator {name!r}",
                            job=durable.job_id, path=path)
        if not isinstance(op, g.OperatorDef) or op.name != name or name not in original \
                or op.kind != original[name].kind:
            raise unreadable(path, durable.job_id, RecordProblem.MISMATCH,
                             f"its changed logic of {name!r} is not a {name!r} operator of "
                             f"job {graph.name!r} ({type(op).__name__})")
        out.append(op)
    return out


def _running_plan(graph_plan: PhysicalPlan, durable: DurableRecord,
                  changed: Sequence[g.OperatorDef]) -> PhysicalPlan:
    """The graph's plan at the recorded parallelisms with the changed operators in it
    (``KeyError``/``RescaleRefused`` when the record does not fit the plan)."""
    resized = {v: p for v, p in durable.parallelism.items()
               if graph_plan.vertex(v).parallelism != p}
    plan = graph_plan.with_parallelism(resized) if resized else graph_plan
    for op in changed:
        # a rescale after the change set its vertex's parallelism on the plan's copy
        plan = with_operator(plan, replace(op, parallelism=plan.vertex_of(op.name).parallelism))
    return plan


def job_record_of(durable: DurableRecord, graph: g.JobGraph, *, path: str = "") -> JobRecord:
    """The ``JobRecord`` that ``durable`` keeps, for the job of ``graph`` (the graph the
    job was deployed with: changes of logic are put back from the record). ``path``: where
    the record was read (errors name it). ``JobRecordUnreadable`` when the record does
    not fit the graph (another job's name, other vertices, a parallelism a forward edge
    refuses), a changed operator does not unpickle, or a history entry does not decode."""
    if durable.name != graph.name:
        raise unreadable(path, durable.job_id, RecordProblem.MISMATCH,
                         f"it is a record of job {durable.name!r}, not of {graph.name!r}")
    graph_plan = plan_physical(graph)
    names = {v.name for v in graph_plan.vertices}
    if set(durable.parallelism) != names:
        raise unreadable(path, durable.job_id, RecordProblem.MISMATCH,
                         f"its vertices {sorted(durable.parallelism)} are not the graph's "
                         f"{sorted(names)} (the job was changed since)")
    changed = _changed_operators(durable, graph, path)
    running = graph
    for op in changed:
        running = ReplaceOperator(op).apply_to_graph(running)
        graph_plan = plan_with_operator(graph_plan, op)
    try:
        plan = _running_plan(graph_plan, durable, changed)
        dep = Deployment(plan, durable.job_id, dict(durable.tasks), dict(durable.assignments),
                         durable.generation, dict(durable.partitions))
        pointer = None if durable.checkpoint is None else CheckpointPointer(*durable.checkpoint)
        return JobRecord(
            durable.job_id, running, graph_plan, dep, durable.status, durable.error,
            durable.error_suffix, durable.epoch, durable.restarts, durable.last_failure,
            pointer, running_of(durable, path=path),
            _messages(durable.rescales, RescaleRecord, durable, path),
            _messages(durable.decisions, DecisionRecord, durable, path))
    except JobRecordUnreadable:
        raise
    except (KeyError, ValueError, RescaleRefused) as exc:
        raise unreadable(path, durable.job_id, RecordProblem.MISMATCH,
                         f"it does not fit the job's graph: {exc}") from exc


def controllers_of(durable: DurableRecord, *, path: str = "") -> list[object]:
    """The job's controllers as the record keeps them (unpickled by ``load_user_code``)."""
    return [load_user_code(b, f"controller {i}", job=durable.job_id, path=path)
            for i, b in enumerate(durable.controllers)]


__all__ = ["DurableRecord", "changed_logic", "controllers_of", "dump_user_code",
           "durable_of", "job_record_of", "load_user_code", "running_of"]
