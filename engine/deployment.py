"""Which tasks exist and how they are wired: a value the JobMaster updates on rescale (pure).

``Deployment`` maps every vertex of the physical plan to its task names (index order) and
every keyed vertex to its assignment (key group -> task index). ``connect_messages`` derives
each task's ``Connect`` message; ``ChannelIds`` keeps channel ids stable for channels that
survive a change, so their sequence numbers continue.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.keygroups import key_groups_of_task, uniform_assignment
from engine.messages import Connect, OutputChannel, OutputEdge
from engine.physical import FORWARD, KEYED, PhysicalPlan


class ChannelIds:
    """Allocates one id per (edge, sender task, receiver task), stable while both live."""

    def __init__(self) -> None:
        self._ids: dict[tuple[int, str, str], int] = {}
        self._next = 0

    def get(self, edge_id: int, src: str, dst: str) -> int:
        key = (edge_id, src, dst)
        cid = self._ids.get(key)
        if cid is None:
            cid = self._ids[key] = self._next
            self._next += 1
        return cid


@dataclass(frozen=True)
class Deployment:
    """Invariant: ``len(tasks[v]) == plan.vertex(v).parallelism`` for every vertex, and every
    keyed vertex has an assignment whose indices are below its parallelism."""

    plan: PhysicalPlan
    job_id: str
    tasks: dict[str, tuple[str, ...]]
    assignments: dict[str, tuple[int, ...]]
    generation: int = 0
    _: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for v in self.plan.vertices:
            if len(self.tasks.get(v.name, ())) != v.parallelism:
                raise ValueError(f"vertex {v.name!r} needs {v.parallelism} tasks")
            if v.keyed:
                a = self.assignments.get(v.name)
                if a is None or len(a) != self.plan.num_key_groups or max(a) >= v.parallelism:
                    raise ValueError(f"vertex {v.name!r} has no valid assignment")

    def task_names(self) -> list[str]:
        return [t for v in self.plan.vertices for t in self.tasks[v.name]]

    def key_groups_of(self, vertex: str, index: int) -> tuple[int, ...]:
        a = self.assignments.get(vertex)
        return () if a is None else tuple(key_groups_of_task(a, index))

    def with_vertex(self, vertex: str, tasks: tuple[str, ...],
                    assignment: tuple[int, ...] | None = None,
                    generation: int | None = None) -> Deployment:
        """This deployment with ``vertex`` run by ``tasks`` (its parallelism follows) and,
        for a keyed vertex, owning key groups by ``assignment`` (unchanged when None)."""
        plan = self.plan
        if plan.vertex(vertex).parallelism != len(tasks):
            plan = plan.rescaled(vertex, len(tasks))
        assignments = dict(self.assignments)
        if assignment is not None:
            assignments[vertex] = tuple(assignment)
        return Deployment(plan, self.job_id, {**self.tasks, vertex: tuple(tasks)}, assignments,
                          self.generation if generation is None else generation)


def task_name(job_id: str, vertex: str, index: int, generation: int) -> str:
    return f"{job_id}/{vertex}/{index}/g{generation}"


def initial_deployment(plan: PhysicalPlan, job_id: str) -> Deployment:
    tasks = {v.name: tuple(task_name(job_id, v.name, i, 0) for i in range(v.parallelism))
             for v in plan.vertices}
    assignments = {v.name: uniform_assignment(plan.num_key_groups, v.parallelism)
                   for v in plan.vertices if v.keyed}
    return Deployment(plan, job_id, tasks, assignments, 0)


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
