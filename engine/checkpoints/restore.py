"""Planning a restore: which task of a job gets which state of a checkpoint (pure).

Why one planner: recovery after a failure, ``job.run(restore_from=...)`` and the
stop-restart rescale all deploy a job from a checkpoint; only what they ask differs (the
checkpoint's own layout, the new job's parallelism, one operator's new assignment). So
there is one plan, and one path that executes it (``engine.runtime.restore``).

Mapping (Flink's): state belongs to operators by name. A keyed operator's key groups go to
the new tasks by the new assignment (the checkpoint's own when the parallelism is
unchanged, uniform ranges otherwise, or the one given); a source's resume states by
partition, at any parallelism: the source keeps the partition list the checkpoint recorded,
and task i of p gets the states of its partitions ``j % p == i``; each sink's pre-committed transactions to the task
``old index % new parallelism`` of the operator that owns that writer, which commits them
before it starts (idempotent). An operator of the job that the checkpoint does not know
starts empty. State the job cannot take (an operator it does not have, a keyed state of
another ``num_key_groups``) refuses the restore with
``RestoreError``, unless ``allow_non_restored_state`` drops it (Flink's
``--allowNonRestoredState``); the plan's ``dropped`` says what was dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.checkpoints.metadata import CheckpointMetadata, VertexState
from engine.checkpoints.store import join, link_uri
from engine.dataflow.deployment import Deployment, task_name
from engine.dataflow.keygroups import uniform_assignment
from engine.dataflow.physical import PhysicalPlan
from engine.errors import RestoreError
from engine.operators.chain import writer_names

# (key group, file URI, offset, length, crc32): where one key group is, for RestoreState;
# a group of an incremental checkpoint has several, its chain's links in order, base first
GroupRef = tuple[int, str, int, int, int]


@dataclass(frozen=True)
class TaskRestore:
    """What one new task restores: key groups, its source's resume states ``{partition:
    state}`` (a partition missing: from its start) and its writers' transactions to
    commit, ``(writer, (transaction, ...))``."""

    groups: tuple[GroupRef, ...] = ()
    source_state: Mapping[str, Any] | None = None
    transactions: tuple[tuple[str, tuple[Any, ...]], ...] = ()


@dataclass(frozen=True)
class RestorePlan:
    """A deployment of the job and each of its tasks' state; ``dropped``: state of the
    checkpoint left out (``allow_non_restored_state``); ``reason``: what was decided."""

    checkpoint: CheckpointMetadata
    deployment: Deployment
    tasks: Mapping[str, TaskRestore]
    dropped: tuple[str, ...] = ()
    reason: str = ""


def checkpoint_layout(plan: PhysicalPlan, meta: CheckpointMetadata) -> PhysicalPlan:
    """``plan`` with each vertex at its parallelism in the checkpoint (recovery restores
    the job as it was, a rescale in progress included)."""
    changed: dict[str, int] = {}
    for v in plan.vertices:
        old = meta.vertex(v.name)
        if old is not None and old.parallelism != v.parallelism:
            changed[v.name] = old.parallelism
    return plan.with_parallelism(changed) if changed else plan


def fresh_deployment(plan: PhysicalPlan, job_id: str, generation: int,
                     partitions: Mapping[str, tuple[str, ...]]) -> Deployment:
    """``plan`` deployed with no state: new task names at ``generation``, uniform
    assignments, the sources' ``partitions`` (a restart when no checkpoint completed yet:
    the job's own lists)."""
    tasks = {v.name: tuple(task_name(job_id, v.name, i, generation)
                           for i in range(v.parallelism)) for v in plan.vertices}
    assignments = {v.name: uniform_assignment(plan.num_key_groups, v.parallelism)
                   for v in plan.vertices if v.keyed}
    sources = {v.name for v in plan.vertices if v.is_source}
    return Deployment(plan, job_id, tasks, assignments, generation,
                      {k: tuple(p) for k, p in partitions.items() if k in sources})


def _refuse(meta: CheckpointMetadata, what: str) -> RestoreError:
    return RestoreError(
        f"cannot restore {meta.location or 'the checkpoint'}: {what}; change the job, or "
        "pass allow_non_restored_state=True to drop that state", path=meta.location,
        reason="unmapped")


def plan_restore(meta: CheckpointMetadata, plan: PhysicalPlan, job_id: str, generation: int,
                 allow_non_restored_state: bool = False,
                 assignments: Mapping[str, tuple[int, ...]] | None = None,
                 partitions: Mapping[str, tuple[str, ...]] | None = None) -> RestorePlan:
    """Deploy ``plan`` (its parallelisms) as ``job_id`` at ``generation`` with ``meta``'s
    state. ``assignments``: a keyed vertex's assignment to use (e.g. a rescale's target);
    otherwise the checkpoint's at an unchanged parallelism, uniform ranges at another.
    ``partitions``: the partition list of a source the checkpoint does not record (a
    source new to the job); a recorded list is always the one used."""
    given = dict(assignments or {})
    dropped: list[str] = []

    def drop(what: str) -> None:
        if not allow_non_restored_state:
            raise _refuse(meta, what)
        dropped.append(what)

    new = {v.name: v for v in plan.vertices}
    chosen: dict[str, tuple[int, ...]] = {}
    for v in plan.vertices:
        if not v.keyed:
            continue
        old = meta.vertex(v.name)
        if v.name in given:
            chosen[v.name] = tuple(given[v.name])
        elif (old is not None and old.keyed and old.parallelism == v.parallelism
              and len(old.assignment) == plan.num_key_groups):
            chosen[v.name] = old.assignment
        else:
            chosen[v.name] = uniform_assignment(plan.num_key_groups, v.parallelism)
    recorded = {v.name: v.partitions for v in meta.vertices if v.source and v.partitions}
    lists = {**(partitions or {}), **{k: p for k, p in recorded.items() if k in new
                                      and new[k].is_source}}
    dep = fresh_deployment(plan, job_id, generation, lists)
    dep = Deployment(plan, job_id, dep.tasks, chosen, generation, dep.partitions)
    tasks = dep.tasks

    groups: dict[str, list[GroupRef]] = {t: [] for ts in tasks.values() for t in ts}
    sources: dict[str, dict[str, Any]] = {}
    for old in meta.vertices:
        _map_keyed(meta, old, new, dep, groups, drop)
        _map_source(meta, old, new, dep, sources, drop)
    txns = _map_transactions(meta, plan, tasks, drop)
    out = {t: TaskRestore(tuple(groups[t]), sources.get(t),
                          tuple((w, tuple(x)) for w, x in txns.get(t, {}).items()))
           for ts in tasks.values() for t in ts}
    reason = (f"restored {meta.kind} {meta.checkpoint_id} of job {meta.job_id} "
              f"({meta.bytes} bytes) into {len(out)} tasks")
    if dropped:
        reason += f"; dropped (allow_non_restored_state): {'; '.join(dropped)}"
    return RestorePlan(meta, dep, out, tuple(dropped), reason)


def _map_keyed(meta: CheckpointMetadata, old: VertexState, new: dict[str, Any],
               dep: Deployment, groups: dict[str, list[GroupRef]], drop: Any) -> None:
    held = [(t, g) for t in meta.tasks_of(old.name) for g in t.groups]
    chained = [(kg, links) for t in meta.tasks_of(old.name) for kg, links in t.chains]
    if not held and not chained:
        return
    target = new.get(old.name)
    if target is None or not target.keyed:
        drop(f"keyed state of operator {old.name!r}, which the job "
             f"{'does not have' if target is None else 'has as an operator without keys'}")
        return
    if dep.plan.num_key_groups != meta.num_key_groups:
        drop(f"keyed state of operator {old.name!r} in {meta.num_key_groups} key groups; "
             f"the job has num_key_groups={dep.plan.num_key_groups} (it is fixed for the "
             "life of the state)")
        return
    names, assignment = dep.tasks[old.name], dep.assignments[old.name]
    for t, (kg, offset, length, crc) in held:
        if t.chains:
            continue  # read by its chain below
        groups[names[assignment[kg]]].append((kg, join(meta.location, t.file), offset,
                                              length, crc))
    for kg, links in chained:
        groups[names[assignment[kg]]].extend(
            (kg, link_uri(meta.location, f), offset, length, crc)
            for f, offset, length, crc in links)


def _map_source(meta: CheckpointMetadata, old: VertexState, new: dict[str, Any],
                dep: Deployment, sources: dict[str, dict[str, Any]], drop: Any) -> None:
    """Each partition's state to the new task that reads it (any parallelism)."""
    parts = [t for t in meta.tasks_of(old.name) if t.source_state is not None]
    if not old.source or not parts:
        return
    target = new.get(old.name)
    if target is None or not target.is_source:
        drop(f"the read positions of source {old.name!r}, which the job does not have")
        return
    states: dict[str, Any] = {}
    for t in parts:
        if not isinstance(t.source_state, dict):
            raise RestoreError(
                f"cannot restore {meta.location or 'the checkpoint'}: source {old.name!r} "
                f"has a resume state {t.source_state!r:.80} that is not by partition",
                path=meta.location, reason="corrupt")
        states.update(t.source_state)
    for i, name in enumerate(dep.tasks[old.name]):
        mine = {p: states[p] for p in dep.partitions_of(old.name, i) if p in states}
        if mine:
            sources[name] = mine


def _map_transactions(meta: CheckpointMetadata, plan: PhysicalPlan,
                      tasks: dict[str, tuple[str, ...]],
                      drop: Any) -> dict[str, dict[str, list[Any]]]:
    owner = {w: v for v in plan.vertices for w in writer_names(v.operators)}
    out: dict[str, dict[str, list[Any]]] = {}
    lost: set[str] = set()
    for t in sorted(meta.tasks, key=lambda t: (t.vertex, t.index)):
        for writer, txn in t.transactions:
            v = owner.get(writer)
            if v is None:
                lost.add(writer)
                continue
            name = tasks[v.name][t.index % v.parallelism]
            out.setdefault(name, {}).setdefault(writer, []).append(txn)
    for writer in sorted(lost):
        drop(f"pre-committed output of sink {writer!r}, which the job does not have")
    return out


__all__ = ["RestorePlan", "TaskRestore", "checkpoint_layout", "fresh_deployment",
           "plan_restore"]
