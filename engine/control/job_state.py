"""``JobRecord``: the state of one job that its JobMaster owns, as one value.

Why one value: what a JobMaster must know to carry a job on (its graph and the physical
plan as the user built it, the deployment and its generation, what runs, the last complete
checkpoint, the restarts, the history of rescales and decisions) used to be spread over
the JobMaster and seven helpers that wrote each other's fields. As one frozen value with
named transitions it has one writer (``engine.runtime.job_master.JobMaster``: every helper
asks it through its port) and can be kept elsewhere as it is (issue 30: a durable job
record).

Format: a frozen dataclass; every transition returns a new record (``dataclasses.replace``
underneath), so an old record is never changed under whoever holds it. Not msgpack-
encodable as a whole: ``graph`` and the plans carry the user's functions (cloudpickled
when shipped to tasks); everything else is plain values and ``engine.wire`` records
(``RescaleRecord``, ``DecisionRecord``).

Guarantees (checked in ``__post_init__``): the deployment is this job's; ``epoch`` (restarts
begun, retries included) is never below ``restarts`` (restarts completed); the histories are
bounded (``RESCALE_RECORDS``, ``DECISION_RECORDS``: oldest dropped first).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from engine.checkpoints.metadata import CheckpointMetadata
from engine.control.arbiter import Running
from engine.control.reconfiguration import DecisionRecord, RescaleRecord
from engine.dataflow import graph as g
from engine.dataflow.deployment import Deployment, initial_deployment
from engine.dataflow.physical import PhysicalPlan, plan_physical
from engine.names import JobState

RESCALE_RECORDS = 100   # measured rescales kept (the controllers' views read them)
DECISION_RECORDS = 1000  # controller decisions kept (``DecisionLog``'s capacity)


def plan_with_operator(plan: PhysicalPlan, op: g.OperatorDef) -> PhysicalPlan:
    """``plan`` with the operator named ``op.name`` replaced by ``op``, at the parallelism
    ``plan`` gives its vertex."""
    vertex = plan.vertex_of(op.name)
    op = replace(op, parallelism=vertex.parallelism)
    return replace(plan, vertices=tuple(
        replace(v, operators=tuple(op if o.name == op.name else o for o in v.operators))
        for v in plan.vertices))


@dataclass(frozen=True)
class CheckpointPointer:
    """Where the last complete checkpoint (or savepoint) of the job is."""

    checkpoint_id: int
    kind: str
    location: str

    def __post_init__(self) -> None:
        if self.checkpoint_id < 0:
            raise ValueError(f"a checkpoint id is >= 0; got {self.checkpoint_id}")


@dataclass(frozen=True)
class JobRecord:
    """One job's state, written by its JobMaster alone (see the module doc).

    ``graph``: the job as it runs now (changes of logic included); ``graph_plan``: the
    physical plan as the user built it, with the changed functions (what a restart
    deploys, at the checkpoint's parallelisms);
    ``deployment``: which task runs what now (its ``plan``, its ``generation``);
    ``status``/``error``: the job's life; ``error_suffix``: why the restart strategy gave
    up, once it did; ``epoch``: restarts begun; ``restarts``: restarts completed;
    ``last_failure``: the cause of the latest restart; ``checkpoint``: the last complete
    checkpoint; ``actions``: what the arbiter granted and is running;
    ``rescales``/``decisions``: the history of rescales (measured) and of the controllers'
    decisions."""

    job_id: str
    graph: g.JobGraph
    graph_plan: PhysicalPlan
    deployment: Deployment
    status: JobState = JobState.CREATED
    error: str = ""
    error_suffix: str = ""
    epoch: int = 0
    restarts: int = 0
    last_failure: str = ""
    checkpoint: CheckpointPointer | None = None
    actions: tuple[Running, ...] = ()
    rescales: tuple[RescaleRecord, ...] = ()
    decisions: tuple[DecisionRecord, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", JobState.parse(self.status, "job state"))
        if self.deployment.job_id != self.job_id:
            raise ValueError(f"job {self.job_id!r} got the deployment of job "
                             f"{self.deployment.job_id!r}")
        if not 0 <= self.restarts <= self.epoch:
            raise ValueError(f"restarts ({self.restarts}) are between 0 and the restarts "
                             f"begun ({self.epoch})")
        if len(self.rescales) > RESCALE_RECORDS or len(self.decisions) > DECISION_RECORDS:
            raise ValueError("a job record's histories are bounded")

    @classmethod
    def initial(cls, job_id: str, graph: g.JobGraph) -> JobRecord:
        """A job not deployed yet (its sources' partitions are asked when deploying)."""
        plan = plan_physical(graph)
        return cls(job_id, graph, plan, initial_deployment(plan, job_id, partitions={}))

    # ---------------------------------------------------------------- reads
    @property
    def plan(self) -> PhysicalPlan:
        """The physical plan running now."""
        return self.deployment.plan

    @property
    def generation(self) -> int:
        return self.deployment.generation

    @property
    def next_generation(self) -> int:
        """The generation of the next set of task names (a rescale's or a restart's)."""
        return self.deployment.generation + 1

    # ---------------------------------------------------------------- transitions
    def deployed(self, deployment: Deployment) -> JobRecord:
        """The job runs ``deployment`` from now on (a deploy, a restore, a rescale step)."""
        return replace(self, deployment=deployment)

    def with_status(self, status: JobState, error: str | None = None) -> JobRecord:
        """The job is ``status`` (with ``error``, when given)."""
        return replace(self, status=status, error=self.error if error is None else error)

    def gave_up(self, suffix: str) -> JobRecord:
        """The restart strategy gave up: failures say so with ``suffix``."""
        return replace(self, error_suffix=suffix)

    def logic_changed(self, op: g.OperatorDef, plan: PhysicalPlan) -> JobRecord:
        """Operator ``op.name`` runs ``op`` from now on, in ``plan`` (the running plan
        with it); a restart from no checkpoint or from an older one runs it too
        (``graph_plan`` gets it, at that plan's parallelism)."""
        graph = g.JobGraph(self.graph.name, self.graph.num_key_groups, tuple(
            op if o.name == op.name else o for o in self.graph.operators))
        return replace(self, graph=graph, graph_plan=plan_with_operator(self.graph_plan, op),
                       deployment=replace(self.deployment, plan=plan))

    def restart_began(self, cause: str) -> JobRecord:
        """A restart begins after ``cause``: the job is restarting, in a new epoch."""
        return replace(self, status=JobState.RESTARTING, epoch=self.epoch + 1,
                       last_failure=cause)

    def restart_retried(self) -> JobRecord:
        """The restart failed and runs again (a new epoch)."""
        return replace(self, epoch=self.epoch + 1)

    def restarted(self) -> JobRecord:
        """The restart completed: the job runs again."""
        return replace(self, status=JobState.RUNNING, restarts=self.restarts + 1)

    def noted(self, failure: str) -> JobRecord:
        """``last_failure`` says ``failure`` (e.g. a checkpoint skipped as unreadable)."""
        return replace(self, last_failure=failure)

    def checkpoint_completed(self, meta: CheckpointMetadata) -> JobRecord:
        """``meta`` is the last complete checkpoint from now on."""
        return replace(self, checkpoint=CheckpointPointer(meta.checkpoint_id,
                                                          str(meta.kind), meta.location))

    def with_actions(self, running: Sequence[Running]) -> JobRecord:
        return replace(self, actions=tuple(running))

    def rescale_measured(self, record: RescaleRecord) -> JobRecord:
        return replace(self, rescales=(*self.rescales, record)[-RESCALE_RECORDS:])

    def with_decisions(self, records: Sequence[DecisionRecord]) -> JobRecord:
        """The controllers' decisions (the ``DecisionLog``'s records, folded)."""
        return replace(self, decisions=tuple(records)[-DECISION_RECORDS:])

    def summary(self) -> Mapping[str, object]:
        """The record's plain parts (no user functions), e.g. for a log line."""
        return {"job_id": self.job_id, "status": str(self.status),
                "generation": self.generation, "epoch": self.epoch,
                "restarts": self.restarts, "checkpoint": self.checkpoint,
                "actions": [f"{r.action.kind}:{','.join(sorted(r.action.vertices))}"
                            for r in self.actions],
                "rescales": len(self.rescales), "decisions": len(self.decisions)}


__all__ = ["DECISION_RECORDS", "RESCALE_RECORDS", "CheckpointPointer", "JobRecord"]
