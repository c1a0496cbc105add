"""What a task is: its spec (``TaskSpec``, shipped to its actor at creation), where it is in
its life (``TaskStatus``), and the record tuple a participant hands back to it (``Record``).

Why apart from the core: the core's participants (``engine.task.checkpointing``,
``engine.task.logic``, ``engine.task.handover``, ``migration.participant``) need these
names without importing the core; ``engine.task.core`` re-exports them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.dataflow import graph as g
from engine.dataflow.config import JobConfig
from engine.dataflow.deployment import Deployment
from engine.dataflow.physical import FORWARD
from engine.errors import TaskControlError
from engine.names import NameEnum


class TaskStatus(NameEnum):
    """Where a task is in its life (``TaskState.status``, ``TaskMetrics.status``)."""

    CREATED = "created"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"


CREATED, RUNNING, FINISHED, FAILED, STOPPED = (
    TaskStatus.CREATED, TaskStatus.RUNNING, TaskStatus.FINISHED, TaskStatus.FAILED,
    TaskStatus.STOPPED)

# (value, timestamp, key, key group, input port); key None and key group -1 when not keyed
Record = tuple[Any, int, Any, int, int]


@dataclass(frozen=True)
class TaskSpec:
    """Everything one task needs; shipped to its actor at creation (it holds user code).

    ``key_fns``: key function per keyed output edge id. ``key_groups``: key groups this task
    owns from the start (keyed vertices only).
    """

    job_id: str
    vertex: str
    task_name: str
    task_index: int
    parallelism: int
    operators: tuple[g.OperatorDef, ...]
    num_key_groups: int
    config: JobConfig
    key_fns: dict[int, Callable[[Any], Any]] = field(default_factory=dict)
    key_groups: tuple[int, ...] = ()
    #: every input edge is a forward edge (the task reads one upstream task, its partner)
    forward_input: bool = False

    def __post_init__(self) -> None:
        where = f"task spec {self.task_name!r}"
        if not self.operators:
            raise TaskControlError(f"{where} has no operators; a task runs at least one")
        if not 0 <= self.task_index < self.parallelism:
            raise TaskControlError(f"{where}: task index {self.task_index} is outside "
                                   f"0..{self.parallelism - 1} (its vertex's parallelism)")
        if any(not 0 <= kg < self.num_key_groups for kg in self.key_groups):
            raise TaskControlError(f"{where}: its key groups {self.key_groups} must lie in "
                                   f"0..{self.num_key_groups - 1}")

    @classmethod
    def of(cls, dep: Deployment, vertex: str, index: int, name: str,
           config: JobConfig) -> TaskSpec:
        """The spec of task ``name`` (index ``index``) of ``vertex`` in deployment ``dep``:
        its operators, the key functions of its keyed outputs, the key groups it owns."""
        v = dep.plan.vertex(vertex)
        key_fns = {e.edge_id: e.key_fn for e in dep.plan.outputs_of(v.name)
                   if e.key_fn is not None}
        inputs = dep.plan.inputs_of(v.name)
        forward = bool(inputs) and all(e.partitioning == FORWARD for e in inputs)
        return cls(dep.job_id, v.name, name, index, v.parallelism, v.operators,
                   dep.plan.num_key_groups, config, key_fns, dep.key_groups_of(v.name, index),
                   forward)
