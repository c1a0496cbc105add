"""Which tasks exist and how they are wired: a value the JobMaster updates on rescale (pure).

``Deployment`` maps every vertex of the physical plan to its task names (index order),
every keyed vertex to its assignment (key group -> task index) and every source vertex to
its partition list (``Source.partitions``, asked once when the job is first deployed and
fixed for its life; task i of p reads positions j with ``j % p == i``).
``connect_messages`` derives each task's ``Connect`` message and ``start_messages`` its
``Start``; ``ChannelIds`` keeps channel ids stable for channels that survive a change, so
their sequence numbers continue.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from engine.dataflow.keygroups import key_groups_of_task, uniform_assignment
from engine.dataflow.partitions import check_partitions, partitions_of_task
from engine.dataflow.physical import FORWARD, KEYED, PhysicalPlan
from engine.errors import ReflowError, UserFunctionError
from engine.wire.messages import Connect, OutputChannel, OutputEdge, Start


class ChannelIds:
    """Allocates one id per (edge, sender task, receiver task), stable while both live."""

    def __init__(self) -> None:
        self._ids: dict[tuple[int, str, str], int] = {}
        self._next = 0

    def live(self, tasks: set[str]) -> tuple[tuple[int, str, str, int], ...]:
        """``(edge, sender, receiver, id)`` of the channels between ``tasks``."""
        return tuple((e, s, d, c) for (e, s, d), c in self._ids.items()
                     if s in tasks and d in tasks)

    @property
    def next_id(self) -> int:
        return self._next

    def restore(self, channels: Iterable[tuple[int, str, str, int]], next_id: int) -> None:
        """Allocate on from ``next_id``, keeping ``channels``' ids (a JobMaster that took
        over the live tasks, which know their channels by these ids)."""
        self._ids = {(e, s, d): c for e, s, d, c in channels}
        self._next = max([next_id, *(c + 1 for c in self._ids.values())])

    def get(self, edge_id: int, src: str, dst: str) -> int:
        key = (edge_id, src, dst)
        cid = self._ids.get(key)
        if cid is None:
            cid = self._ids[key] = self._next
            self._next += 1
        return cid


@dataclass(frozen=True)
class Deployment:
    """Invariant: ``len(tasks[v]) == plan.vertex(v).parallelism`` for every vertex, every
    keyed vertex has an assignment whose indices are below its parallelism, and
    ``partitions`` names source vertices only."""

    plan: PhysicalPlan
    job_id: str
    tasks: dict[str, tuple[str, ...]]
    assignments: dict[str, tuple[int, ...]]
    generation: int = 0
    partitions: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for v in self.plan.vertices:
            if len(self.tasks.get(v.name, ())) != v.parallelism:
                raise ValueError(f"vertex {v.name!r} needs {v.parallelism} tasks")
            if v.keyed:
                a = self.assignments.get(v.name)
                if a is None or len(a) != self.plan.num_key_groups or max(a) >= v.parallelism:
                    raise ValueError(f"vertex {v.name!r} has no valid assignment")
        for name in self.partitions:
            if not self.plan.vertex(name).is_source:
                raise ValueError(f"vertex {name!r} is not a source; only sources have "
                                 "partitions")

    def partitions_of(self, vertex: str, index: int) -> tuple[str, ...]:
        """The partitions task ``index`` of source vertex ``vertex`` reads."""
        if vertex not in self.partitions:
            raise ValueError(f"source vertex {vertex!r} has no partition list in the "
                             "deployment (source_partitions gives it)")
        return partitions_of_task(self.partitions[vertex], index,
                                  self.plan.vertex(vertex).parallelism)

    def with_partitions(self, partitions: Mapping[str, tuple[str, ...]]) -> Deployment:
        """This deployment with the sources' partition lists set."""
        return replace(self, partitions={**self.partitions, **partitions})

    def task_names(self) -> list[str]:
        return [t for v in self.plan.vertices for t in self.tasks[v.name]]

    def key_groups_of(self, vertex: str, index: int) -> tuple[int, ...]:
        a = self.assignments.get(vertex)
        return () if a is None else tuple(key_groups_of_task(a, index))

    def with_vertex(self, vertex: str, tasks: tuple[str, ...],
                    assignment: tuple[int, ...] | None = None,
                    generation: int | None = None,
                    partners: Mapping[str, tuple[str, ...]] | None = None) -> Deployment:
        """This deployment with ``vertex`` run by ``tasks`` (its parallelism follows) and,
        for a keyed vertex, owning key groups by ``assignment`` (unchanged when None), at
        ``generation`` or the current one, whichever is higher; ``partners``: other vertices
        (its forward partners) run by these tasks in the same change, so a forward edge
        between them never sees unequal parallelisms (``PhysicalPlan.with_parallelism``
        raises ``RescaleRefused`` when one would). The generation never goes
        back: rescales of two vertices run at once, each from the deployment it started
        with, and one that started before the other bumped the generation twice must not
        set it back, or the next rescale would name a new task as an existing or removed
        one (seen as a ``KeyError`` on a task name in a controller-driven rescale)."""
        changes = {**(partners or {}), vertex: tuple(tasks)}
        plan = self.plan
        resized = {v: len(t) for v, t in changes.items()
                   if plan.vertex(v).parallelism != len(t)}
        if resized:
            plan = plan.with_parallelism(resized)
        assignments = dict(self.assignments)
        if assignment is not None:
            assignments[vertex] = tuple(assignment)
        return Deployment(plan, self.job_id,
                          {**self.tasks, **{v: tuple(t) for v, t in changes.items()}},
                          assignments,
                          self.generation if generation is None
                          else max(self.generation, generation),
                          self.partitions)


def task_name(job_id: str, vertex: str, index: int, generation: int) -> str:
    return f"{job_id}/{vertex}/{index}/g{generation}"


def source_partitions(plan: PhysicalPlan) -> dict[str, tuple[str, ...]]:
    """Every source vertex's partition list: ``Source.partitions(initial parallelism)``.
    A source whose ``partitions()`` raises fails as a ``UserFunctionError`` (phase open)
    naming it; a list that is not unique strings as a ``ConfigError``."""
    out: dict[str, tuple[str, ...]] = {}
    for v in plan.vertices:
        if not v.is_source:
            continue
        try:
            listed = v.head.fn.partitions(v.parallelism)
        except ReflowError:
            raise
        except Exception as exc:
            raise UserFunctionError(v.name, -1, "", f"partitions() raised "
                                    f"{type(exc).__name__}: {exc}", phase="open") from exc
        out[v.name] = check_partitions(listed, v.name)
    return out


def initial_deployment(plan: PhysicalPlan, job_id: str,
                       partitions: Mapping[str, tuple[str, ...]] | None = None) -> Deployment:
    """Generation 0: uniform assignments; ``partitions`` None asks every source
    (``source_partitions``)."""
    tasks = {v.name: tuple(task_name(job_id, v.name, i, 0) for i in range(v.parallelism))
             for v in plan.vertices}
    assignments = {v.name: uniform_assignment(plan.num_key_groups, v.parallelism)
                   for v in plan.vertices if v.keyed}
    parts = source_partitions(plan) if partitions is None else dict(partitions)
    return Deployment(plan, job_id, tasks, assignments, 0, parts)


def start_message(dep: Deployment, vertex: str, index: int,
                  resume: Mapping[str, Any] | None = None) -> Start:
    """The ``Start`` of task ``index`` of ``vertex``: for a source task its partitions, each
    at its state in ``resume`` (missing: None, the partition's start)."""
    if not dep.plan.vertex(vertex).is_source:
        return Start()
    states = resume or {}
    return Start(tuple((p, states.get(p)) for p in dep.partitions_of(vertex, index)))


def start_messages(dep: Deployment,
                   resume: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Start]:
    """The ``Start`` of every task; ``resume``: per source vertex, partition -> state."""
    states = resume or {}
    return {t: start_message(dep, v.name, i, states.get(v.name))
            for v in dep.plan.vertices for i, t in enumerate(dep.tasks[v.name])}


def connect_messages(dep: Deployment, ids: ChannelIds) -> dict[str, Connect]:
    """The ``Connect`` message of every task of the deployment."""
    inputs: dict[str, list[tuple[int, int]]] = {t: [] for t in dep.task_names()}
    outputs: dict[str, list[OutputEdge]] = {t: [] for t in dep.task_names()}
    for e in dep.plan.edges:
        srcs, dsts = dep.tasks[e.src], dep.tasks[e.dst]
        for si, s in enumerate(srcs):
            targets = [dsts[si]] if e.partitioning == FORWARD else list(dsts)
            chans = tuple(OutputChannel(ids.get(e.edge_id, s, d), d, e.port) for d in targets)
            routing = dep.assignments[e.dst] if e.partitioning == KEYED else ()
            outputs[s].append(OutputEdge(e.edge_id, e.partitioning, chans, routing))
            for c in chans:
                inputs[c.target].append((c.channel_id, c.port))
    return {t: Connect(tuple(sorted(inputs[t])), tuple(outputs[t])) for t in dep.task_names()}
