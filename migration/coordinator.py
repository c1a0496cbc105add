"""The rescale coordinator as sans-IO state machines: one per running rescale.

Why: the coordination of a rescale (hold the operator's tasks, plan, create tasks, run the
plan's subscales or steps, remove tasks; or stop-restart's savepoint and restore) is the protocol
itself. Written as async Ray code it could only be tested through Ray, and the unit tests
grew copies of it. Here it is a plain object that takes events and returns commands; the
JobMaster (``engine.runtime``) executes the commands with Ray, and the unit-test harness
executes the same commands on task cores stepped by hand. There is one copy.

Interface. ``start()`` returns the first commands. The executor runs returned commands in
order; a command's outcome goes back through ``on_result(command, result)`` (the replies of
a ``SendControl``, in call order; None for the others), which returns the next commands.
``AwaitReports`` means "nothing to do until reports arrive": the executor feeds every task
report of the job to ``on_report(report)``, which returns the next commands once the wait
is over (an empty list otherwise), and calls ``on_timeout()`` when ``timeout_s`` passed
first (it raises ``RescaleTimeout``). ``supersede()`` asks a running rescale to start no
more subscales. ``done`` / ``report()`` / ``progress()`` say where it stands;
``committed`` is False until the job was changed (before that, a failure refuses the
rescale and leaves the job untouched: ``release_commands()`` undoes the hold).

Guarantees. Commands are frozen values; no I/O, no clock but the injected one, no Ray.
Every wait has the config's ``rescale_timeout_s``. Control messages are the wire messages
of ``engine.wire.messages``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.dataflow.config import JobConfig, check_count
from engine.dataflow.deployment import (
    ChannelIds,
    Deployment,
    connect_messages,
    start_message,
    task_name,
)
from engine.dataflow.keygroups import moved_key_groups
from engine.dataflow.physical import FORWARD
from engine.errors import AssignmentError, RescaleRefused, RescaleTimeout
from engine.names import NameEnum, SubscaleRole
from engine.observability.metrics import RescaleProgress
from engine.task.channel import REROUTE_PORT
from engine.time.clock import Clock
from engine.wire.messages import (
    AddInputs,
    AddOutputChannels,
    AdoptTransactions,
    ExpectIncoming,
    ExpectOutgoing,
    GroupStatsRequest,
    HandOver,
    HoldFinish,
    InjectSubscale,
    OutputChannel,
    ReleaseSource,
    RemoveOutputChannels,
    ReplaceOutputChannel,
    Start,
    StopTask,
    SubscaleDone,
    TaskFinished,
)
from migration.assignment import (
    AssignmentPlan,
    AssignmentSpec,
    GroupWorkload,
    rescale_target,
)
from migration.pacing import HeadroomPacer
from migration.plan import MigrationPlan, Subscale
from migration.planning import (
    MeasuredGroups,
    Planning,
    adaptive_from_measures,
    measure_groups,
    profiles_from_metrics,
)
from migration.protocols import (
    PROTOCOLS,
    LiveMechanism,
    PlanRequest,
    ProtocolSpec,
    RescaleProtocol,
)
from migration.protocols.drrs import (
    DrrsMechanism,
    describe_without,
    drrs_without,
    parse_without,
)
from migration.report import RescaleReport
from migration.scheduling import StepScheduler, SubscaleScheduler


class Phase(NameEnum):
    """Where a rescale stands (``RescaleProgress.phase``)."""

    HOLD = "hold"
    PLAN = "plan"
    DEPLOY = "deploy"
    SUBSCALES = "subscales"
    REMOVE = "remove"
    RELEASE = "release"
    HANDOVER = "handover"  # a source's partitions go from its old tasks to its new ones
    SAVEPOINT = "savepoint"
    RESTORE = "restore"
    DONE = "done"
    # the steps of engine.control.steps (deploy, change of logic, replica refresh)
    START = "start"      # a deploy's ``Start`` calls, sources last
    STAGE = "stage"      # a change of logic stages its function at every task
    SWITCH = "switch"    # ... and sends its barriers, waiting for every task's switch
    REFRESH = "refresh"  # a replica refresh asks group stats and refreshes replicas


# ---------------------------------------------------------------------- requests and context


@dataclass(frozen=True)
class RescaleRequest:
    """What was asked: ``operator`` (a vertex) to ``parallelism`` tasks with ``protocol``;
    ``assignment``: the target assignment (a rebalance; None: uniform ranges);
    ``planning``: a ``migration.planning.Planning`` or None for the protocol's default;
    ``reason``: who asked and why (a user call, a controller's decision); ``place``:
    ``(task index, node id)`` for a placement (``Placement``: the task moves to that Ray
    node, ``parallelism`` stays); ``strategy``: how to choose the target assignment
    (``migration.assignment.AssignmentSpec``; None with no ``assignment``: uniform ranges);
    ``without``: DRRS mechanisms switched off (``migration.protocols.drrs.DrrsMechanism``,
    the ablation; only with protocol drrs, ``ValueError`` otherwise)."""

    operator: str
    parallelism: int
    protocol: RescaleProtocol
    assignment: tuple[int, ...] | None = None
    planning: Planning | None = None
    reason: str = "requested"
    place: tuple[int, str] | None = None
    strategy: AssignmentSpec | None = None
    without: frozenset[DrrsMechanism] = frozenset()

    def __post_init__(self) -> None:
        check_count(f"rescale of {self.operator!r}: parallelism", self.parallelism)
        object.__setattr__(self, "without", parse_without(self.without))
        if self.assignment is not None and self.strategy is not None:
            raise ValueError(f"rescale of {self.operator!r}: give an assignment or a strategy, "
                             "not both")
        object.__setattr__(self, "protocol", RescaleProtocol.parse(self.protocol, "protocol"))
        if self.without and self.protocol != RescaleProtocol.DRRS:
            raise ValueError(f"rescale of {self.operator!r}: without= switches off mechanisms "
                             f"of drrs ({', '.join(sorted(self.without))}); protocol "
                             f"'{self.protocol}' has none of them")
        if self.place is not None:
            check_count(f"placement of {self.operator!r}: task index", self.place[0], 0)
            if self.place[0] >= self.parallelism:
                raise ValueError(f"placement of {self.operator!r}: no task {self.place[0]} "
                                 f"among {self.parallelism}")


@dataclass
class SubscaleIds:
    """Allocates subscale ids, unique within a job (re-route channel ids derive from them)."""

    next_id: int = 0

    def take(self, n: int) -> int:
        first = self.next_id
        self.next_id += n
        return first


@dataclass
class RescaleContext:
    """What the job shares with a coordinator: values as of the start and the job's pure
    allocators. ``replicas``: this operator's replicas, key group -> (holder, version);
    ``max_subscales``: subscales of the operator at once (drrs); ``finished``: tasks whose
    input ended; ``capacity_rate``: records/s the operator sustains at its parallelism,
    measured over the latest metrics window (Spacker's adaptive planning; None: unknown)."""

    job_id: str
    deployment: Deployment
    config: JobConfig
    channel_ids: ChannelIds
    subscale_ids: SubscaleIds
    replicas: Mapping[int, tuple[str, int]] = field(default_factory=dict)
    replication_on: bool = False
    max_subscales: int = 1
    finished: frozenset[str] = frozenset()
    capacity_rate: float | None = None


# ---------------------------------------------------------------------- commands


@dataclass(frozen=True)
class Call:
    """One control message to one task; ``introduce``: tasks whose handles travel with it
    (the receiver will talk to them)."""

    task: str
    message: Any
    introduce: tuple[str, ...] = ()


@dataclass(frozen=True)
class SendControl:
    """Send every call at once and return the replies in call order."""

    calls: tuple[Call, ...]
    phase: Phase


@dataclass(frozen=True)
class CreateTasks:
    """Create task actors ``names`` of ``vertex`` (spec from ``deployment``; a warm standby
    actor where the pool has one). Calls to them wait until they exist. ``nodes``: (name,
    Ray node id) of tasks that must start on that node (never a standby actor);
    ``indices``: (name, task index) of tasks whose spec (what their functions see as their
    index) differs from their position, e.g. a placed task replacing another."""

    vertex: str
    names: tuple[str, ...]
    deployment: Deployment
    nodes: tuple[tuple[str, str], ...] = ()
    indices: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class RemoveTasks:
    """Stop and release these task actors (they hold no state any more)."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class UpdateVertex:
    """The job's deployment of ``vertex`` is now ``tasks`` owning key groups by
    ``assignment`` (None: unchanged), at ``generation`` (None: unchanged); ``partners``:
    (vertex, tasks) of its forward partners, changed in the same step
    (``Deployment.with_vertex``)."""

    vertex: str
    tasks: tuple[str, ...]
    assignment: tuple[int, ...] | None = None
    generation: int | None = None
    partners: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def apply(self, dep: Deployment) -> Deployment:
        """``dep`` with this update (what an executor does with it)."""
        return dep.with_vertex(self.vertex, self.tasks, self.assignment, self.generation,
                               dict(self.partners))


@dataclass(frozen=True)
class AwaitReports:
    """Wait for task reports (fed to ``on_report``) for at most ``timeout_s``; ``tasks``
    are the ones being waited for (named if it times out)."""

    phase: Phase
    timeout_s: float
    tasks: tuple[str, ...]


@dataclass(frozen=True)
class Sleep:
    """Wait ``seconds`` (the gap between steps, ``JobConfig.step_gap_ms``)."""

    seconds: float


@dataclass(frozen=True)
class SubscaleCompleted:
    """A subscale finished: ``key_groups`` are now owned by ``new_owner``; their replicas
    elsewhere are out of date (the new owner consumed its own)."""

    vertex: str
    subscale_id: int
    key_groups: tuple[int, ...]
    new_owner: str
    seconds: float


@dataclass(frozen=True)
class ReleaseReplicas:
    """Drop replicas that were forgotten, and those held by ``gone`` tasks; ``clear``: the
    operator's replicas are void (stop-restart restarts every task)."""

    vertex: str
    gone: tuple[str, ...] = ()
    clear: bool = False


@dataclass(frozen=True)
class EnableReplication:
    """Keep replicas of ``vertex`` from now on (the adaptive planning chose to)."""

    vertex: str
    policy: str
    hot_fraction: float


@dataclass(frozen=True)
class TakeSavepoint:
    """Take a savepoint of the whole job (``stop``: sources read nothing after its barrier
    and every task stays quiet); the result is its ``CheckpointMetadata``."""

    stop: bool = True


@dataclass(frozen=True)
class RestoreJob:
    """Replace every task of the job by a new one restored from ``checkpoint`` (the
    ``engine.checkpoints.restore`` plan), with ``parallelism`` and ``assignments`` overriding
    the checkpoint's for these vertices; the result is the new ``Deployment``."""

    checkpoint: Any
    parallelism: Mapping[str, int]
    assignments: Mapping[str, tuple[int, ...]]


Command = (SendControl | CreateTasks | RemoveTasks | UpdateVertex | AwaitReports | Sleep
           | SubscaleCompleted | ReleaseReplicas | EnableReplication | TakeSavepoint
           | RestoreJob)


# ---------------------------------------------------------------------- checkpoints


class DataflowChanges:
    """Which changes of the dataflow one rescale has in flight, for the exclusion of
    checkpoints and rescales (docs/architecture.md, "the life of a checkpoint"): a
    checkpoint starts only when no subscale is in flight (injected, and not yet reported
    done by both owners) and no task is being added or removed; a rescale waits before a
    command that ``starts`` a change while a checkpoint is pending (``gates``: the first
    command of a change only). Fed by the executor
    (the JobMaster's, the unit harness's) with the commands it runs and every report."""

    def __init__(self) -> None:
        self.subscales: set[int] = set()
        self._done: dict[int, set[str]] = {}
        # a change started and its deployment not yet recorded (the next UpdateVertex)
        self._changing = False

    @staticmethod
    def starts(cmd: Command) -> bool:
        """Whether ``cmd`` is the first of a change: creating tasks, starting subscales
        (their owners' expectations), removing tasks (the predecessors drop their channels
        to them first; from then on those tasks' inputs carry no barrier)."""
        if isinstance(cmd, CreateTasks):
            return True
        if isinstance(cmd, SendControl):
            return any(isinstance(c.message, (ExpectIncoming, RemoveOutputChannels))
                       for c in cmd.calls)
        return False

    def gates(self, cmd: Command) -> bool:
        """Whether the executor waits for a pending checkpoint before ``cmd``: it
        ``starts`` a change and none is under way. A change runs from its first command to
        the ``UpdateVertex`` that records it, and may start more than once meanwhile (a
        rescale with forward partners creates or removes each vertex's tasks in turn):
        only its first command waits, since a checkpoint starting in its middle could not
        align (e.g. a partner's new task reads a channel whose sender does not exist yet)."""
        return self.starts(cmd) and not self._changing

    def on_command(self, cmd: Command) -> None:
        """``cmd`` is being run: the subscales it starts are in flight; a change it starts
        is under way until the next ``UpdateVertex``."""
        if self.starts(cmd):
            self._changing = True
        elif isinstance(cmd, UpdateVertex):
            self._changing = False
        if isinstance(cmd, SendControl):
            for c in cmd.calls:
                if isinstance(c.message, ExpectIncoming):
                    self.subscales.add(c.message.subscale)

    def on_report(self, report: Any) -> None:
        """A task's report: a subscale both owners reported done is no longer in flight."""
        if isinstance(report, SubscaleDone) and report.subscale in self.subscales:
            done = self._done.setdefault(report.subscale, set())
            done.add(str(report.role))
            if len(done) == 2:
                self.subscales.discard(report.subscale)
                del self._done[report.subscale]

    def quiet(self, phase: Phase) -> bool:
        """Nothing in flight for a rescale now in ``phase`` (adding or removing tasks is a
        change from its first command to its last)."""
        return not self.subscales and phase not in (Phase.DEPLOY, Phase.HANDOVER,
                                                    Phase.REMOVE)


# ---------------------------------------------------------------------- the machine


_Steps = Generator[Command, Any, RescaleReport]


class RescaleCoordinator:
    """Drives one rescale; subclasses write the protocol as a generator of commands (each
    ``yield`` returns the command's result), this base turns it into the event interface."""

    def __init__(self, request: RescaleRequest, ctx: RescaleContext, clock: Clock) -> None:
        self.request = request
        self.ctx = ctx
        self.config = ctx.config
        self.clock = clock
        self.vertex = request.operator
        self.spec: ProtocolSpec = (drrs_without(request.without) if request.without
                                   else PROTOCOLS[request.protocol])
        self.dep = ctx.deployment
        self.phase = Phase.HOLD
        self.committed = False
        self.superseded = False
        # forward partners go to the new parallelism with the operator (RescaleRefused
        # when its forward group cannot rescale as one: PhysicalPlan.check_rescale)
        self.partners: tuple[str, ...] = (
            () if request.place is not None else self.dep.plan.check_rescale(
                self.vertex, request.parallelism, live=self.spec.live))
        #: the operator and its partners, in topological order
        self.group: tuple[str, ...] = tuple(
            v.name for v in self.dep.plan.vertices if v.name in {self.vertex, *self.partners})
        # the operator's own input ended (a finished task elsewhere, e.g. a bounded source
        # beside an unbounded one, does not stop a rescale: FLIP-147)
        self.finished_tasks: set[str] = set(ctx.finished) & set(self._group_tasks())
        self.input_ended = bool(self.finished_tasks)
        self.plan: MigrationPlan | None = None
        self.assignment_plan: AssignmentPlan | None = None
        self.requested_at = clock.now()
        self._report: RescaleReport | None = None
        self._gen: _Steps | None = None
        self._waiting: Callable[[], bool] | None = None
        self._pending: Command | None = None
        self._held: tuple[str, ...] = ()

    # -- the event interface
    def start(self) -> list[Command]:
        if self._gen is not None:
            raise RuntimeError("the coordinator was started already")
        self._gen = self._steps()
        return self._advance(None)

    def on_result(self, command: Command, result: Any) -> list[Command]:
        if command is not self._pending:
            raise RuntimeError(f"result for {type(command).__name__}, which is not the "
                               "command the coordinator waits on")
        return self._advance(result)

    def on_report(self, report: Any) -> list[Command]:
        """Take one task report; the next commands when it ended a wait."""
        self._observe(report)
        if self._waiting is not None and self._waiting():
            self._waiting = None
            return self._advance(None)
        return []

    def on_headroom(self, idle_cores: float) -> None:
        """A measurement of the machine's idle cores while the rescale runs; only a paced
        drrs rescale uses it (``LiveRescale.on_headroom``)."""

    def on_timeout(self) -> list[Command]:
        """The ``AwaitReports`` wait ran out: raises ``RescaleTimeout``."""
        cmd = self._pending
        assert isinstance(cmd, AwaitReports), "on_timeout outside a wait"
        raise RescaleTimeout(
            f"rescale of {self.vertex!r} ({self.request.protocol}): phase {cmd.phase} not "
            f"finished after {cmd.timeout_s:g} s; {self.describe_wait()}. Raise "
            "JobConfig.rescale_timeout_s if the job needs longer, or look at the tasks named",
            str(cmd.phase), cmd.tasks)

    def supersede(self) -> None:
        """A newer request for this operator came: start nothing more, finish what runs."""
        self.superseded = True

    @property
    def done(self) -> bool:
        return self._report is not None

    def report(self) -> RescaleReport:
        if self._report is None:
            raise RuntimeError("the rescale has not finished")
        return self._report

    def release_commands(self) -> list[Command]:
        """After a failure before ``committed``: what undoes the hold (best effort)."""
        if not self._held:
            return []
        return [SendControl(self._release_calls(), Phase.RELEASE)]

    def _release_calls(self) -> tuple[Call, ...]:
        """The calls that release the hold of every held task."""
        return tuple(Call(t, HoldFinish(False)) for t in self._held)

    def progress(self) -> RescaleProgress:
        raise NotImplementedError

    def describe_wait(self) -> str:
        return ""

    # -- machinery
    def _advance(self, value: Any) -> list[Command]:
        assert self._gen is not None
        try:
            cmd = self._gen.send(value)
        except StopIteration as stop:
            self._report = stop.value
            self._pending = None
            self.phase = Phase.DONE
            return []
        self._pending = cmd
        return [cmd]

    def _wait(self, until: Callable[[], bool], phase: Phase,
              tasks: Iterable[str]) -> Generator[Command, Any, None]:
        """Yield an ``AwaitReports`` unless ``until()`` already holds."""
        if until():
            return
        self._waiting = until
        yield AwaitReports(phase, self.config.rescale_timeout_s, tuple(sorted(tasks)))

    def _observe(self, report: Any) -> None:
        if isinstance(report, TaskFinished) and report.task in self._group_tasks():
            self.finished_tasks.add(report.task)
            self.input_ended = True

    def _steps(self) -> _Steps:
        raise NotImplementedError
        yield  # pragma: no cover

    def _send(self, phase: Phase, calls: Iterable[Call]
              ) -> Generator[Command, Any, tuple[Any, ...]]:
        calls = tuple(calls)
        if not calls:
            return ()
        self.phase = phase
        replies = yield SendControl(calls, phase)
        return tuple(replies)

    def _tasks(self, vertex: str | None = None) -> tuple[str, ...]:
        return self.dep.tasks[vertex or self.vertex]

    def _hold_group(self) -> Generator[Command, Any, None]:
        """Hold: the tasks of the operator and its partners do not finish while groups move
        and tasks come and go; ``RescaleRefused`` (the hold released, nothing changed) when
        the operator's input has ended."""
        vertex = self.vertex
        self._held = self._group_tasks()
        states = yield from self._send(Phase.HOLD, (Call(t, HoldFinish(True))
                                                    for t in self._held))
        ended = [st.task for st in states if st.input_ended]
        if ended or self.input_ended:
            yield from self._send(Phase.RELEASE, self._release_calls())
            who = ended[0] if ended else sorted(self.finished_tasks)[0]
            raise RescaleRefused(
                f"the input of operator {vertex!r} has ended (task {who}): it processes "
                "nothing more, so there is nothing to rescale", operator=vertex)

    def _group_tasks(self) -> tuple[str, ...]:
        """The tasks of the operator and of its forward partners."""
        return tuple(t for v in (self.vertex, *self.partners) for t in self.dep.tasks[v])

    def _partner_tasks(self, keep: int | None = None) -> dict[str, tuple[str, ...]]:
        """Each partner's tasks (its first ``keep`` of them)."""
        return {p: self.dep.tasks[p][:keep] for p in self.partners}

    def _grow_partners(self, old_p: int, work_p: int, gen: int) -> dict[str, tuple[str, ...]]:
        """Each partner's tasks with new ones at indices ``old_p..work_p - 1``
        (generation ``gen``)."""
        out: dict[str, tuple[str, ...]] = {}
        for p in self.partners:
            tasks = self.dep.tasks[p]
            if len(tasks) != old_p:  # a forward edge keeps equal parallelisms
                raise RuntimeError(f"forward partner {p!r} of {self.vertex!r} runs "
                                   f"{len(tasks)} tasks, not {old_p}")
            out[p] = (*tasks, *(task_name(self.ctx.job_id, p, i, gen)
                                for i in range(old_p, work_p)))
        return out

    def _with_partners(self, resized: bool) -> tuple[str, ...]:
        """``RescaleReport.with_partners``: the partners when their task count changed."""
        return self.partners if resized else ()


    def _wants_workload(self) -> bool:
        """Whether the target needs per-group loads and sizes from the tasks."""
        return self.request.strategy is not None and bool(self.dep.assignments.get(self.vertex))

    def _target(self, old: tuple[int, ...],
                profiles: Mapping[int, Any] | None = None) -> tuple[int, ...]:
        """The target assignment: the request's, its strategy's plan (from ``profiles``),
        else uniform. ``RescaleRefused`` when the strategy finds none (e.g. θ cannot hold:
        the message names the smallest θ that would)."""
        req = self.request
        nkg = self.dep.plan.num_key_groups
        if req.strategy is None or not old:
            return rescale_target(old, nkg, req.parallelism, req.assignment)
        try:
            self.assignment_plan = req.strategy.plan(
                old, req.parallelism, GroupWorkload.from_profiles(profiles or {}, nkg))
        except AssignmentError as exc:
            raise RescaleRefused(f"rescale of {self.vertex!r} to {req.parallelism} tasks "
                                 f"refused, the job goes on unchanged: {exc}",
                                 operator=self.vertex, phase=str(Phase.PLAN)) from None
        return self.assignment_plan.assignment

    def _with_assignment(self, report: RescaleReport) -> RescaleReport:
        """``report`` with the assignment strategy, its predicted bytes and its reason."""
        p = self.assignment_plan
        if p is None:
            return dataclasses.replace(
                report, assignment="given" if self.request.assignment is not None else "uniform")
        return dataclasses.replace(report, assignment=p.strategy, predicted_bytes=p.predicted_bytes,
                                   assignment_reason=p.reason, load_ratio=p.load_ratio)

    def _plan(self, profiles: Mapping[int, Any], planning: Planning | None, old: tuple[int, ...],
              new: tuple[int, ...]) -> MigrationPlan:
        cfg = self.config
        old_p = len(self._tasks())
        first = self.ctx.subscale_ids.next_id
        plan = self.spec.planner(PlanRequest(
            self.vertex, old, new, old_p, self.request.parallelism, first, profiles, planning,
            cfg.drrs_subscale_size, cfg.drrs_subscale_bytes, cfg.batched_step_size,
            cfg.batched_matching))
        self.ctx.subscale_ids.take(len(plan.subscales))
        if self.spec.without:
            plan = dataclasses.replace(
                plan, reason=f"drrs {describe_without(self.spec.without)}; {plan.reason}")
        return plan


class PhaseTimer:
    """Seconds spent in each phase, in order (``RescaleReport.phases``): ``mark(phase)``
    closes the phase that just ended."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.phases: list[tuple[str, float]] = []
        self._since = clock.monotonic()

    def mark(self, phase: Phase) -> None:
        now = self.clock.monotonic()
        self.phases.append((str(phase), now - self._since))
        self._since = now


# ---------------------------------------------------------------------- live rescale


@dataclass
class _LiveStats:
    moved: int = 0
    bytes: int = 0
    rerouted: int = 0
    suspended: float = 0.0
    delays: list[float] = field(default_factory=list)
    timings: list[tuple[int, float, float]] = field(default_factory=list)
    first_start: float | None = None

    @property
    def delay(self) -> float:
        return sum(self.delays) / len(self.delays) if self.delays else 0.0


class LiveRescale(RescaleCoordinator):
    """A live rescale (drrs, meces, pause-resume, fluid, batched, non-disruptive): hold the
    operator's tasks (they must not finish while groups move), plan, create new tasks,
    run the plan's subscales (at once within limits, or step by step), remove tasks left
    without groups, release.

    With forward partners (``partners``: stateless vertices joined to the operator by
    forward edges, ``PhysicalPlan.check_rescale``) the group goes to the new parallelism
    as one: the partners' tasks are held and released with the operator's; their new
    tasks are created before the operator's, downstream first, from a deployment where
    every vertex of the group has its new task names (so the operator's new task j is
    connected to each partner's new task j); on a scale-in their last tasks go after the
    operator's, upstream first. The partners' tasks relay the migration's watermark holds
    and order markers (each has the one forward input), so event time and per-key order
    downstream of them stay exact."""

    def __init__(self, request: RescaleRequest, ctx: RescaleContext, clock: Clock) -> None:
        super().__init__(request, ctx, clock)
        if not self.spec.live:
            raise ValueError(f"{request.protocol} is not a live protocol")
        self.stats = _LiveStats()
        self._reports: dict[int, dict[str, SubscaleDone]] = {}
        self._sched: SubscaleScheduler | StepScheduler | None = None
        self._names: list[str] = []
        # drrs: subscales at once follow the machine's idle cores (migration.pacing)
        self.pacer = (HeadroomPacer(ctx.max_subscales,
                                    max_chunk_bytes=ctx.config.drrs_max_chunk_bytes)
                      if self.spec.concurrent and self.spec.divided and ctx.config.drrs_pacing
                      else None)

    def on_headroom(self, idle_cores: float) -> None:
        """A measurement of the idle cores the migration could use (the runtime sends one
        about every half second): a paced drrs rescale starts at most the pacer's limit
        of subscales at once from its next start on. Nothing else changes."""
        if self.pacer is None:
            return
        limit = self.pacer.observe(idle_cores)
        if isinstance(self._sched, SubscaleScheduler):
            self._sched.max_running = limit

    def _observe(self, report: Any) -> None:
        super()._observe(report)
        if isinstance(report, SubscaleDone):
            self._reports.setdefault(report.subscale, {})[str(report.role)] = report

    def _complete(self) -> list[int]:
        assert self._sched is not None
        return [sid for sid in self._sched.running if len(self._reports.get(sid, {})) == 2]

    def describe_wait(self) -> str:
        if self._sched is None:
            return ""
        names = self._names
        stuck = [f"subscale {sid} ({names[s.old]} -> {names[s.new]}, groups "
                 f"{list(s.key_groups)}, reported by: "
                 f"{sorted(self._reports.get(sid, {})) or 'nobody'})"
                 for sid, s in self._sched.running.items()]
        return "waiting for " + "; ".join(stuck)

    def progress(self) -> RescaleProgress:
        plan = self.plan
        s = self.stats
        return RescaleProgress(
            self.vertex, str(self.request.protocol), str(self.phase),
            len(plan.moved) if plan else 0, s.moved, s.bytes, not self.done,
            len(plan.subscales) if plan else 0, len(s.timings), s.rerouted, s.suspended,
            s.delay)

    def _steps(self) -> _Steps:
        cfg, clock, vertex = self.config, self.clock, self.vertex
        # 1. hold: the operator's tasks (and its forward partners') do not finish while
        # groups move and tasks come and go
        tasks = self._tasks()
        yield from self._hold_group()
        # 2. plan (per-group load and size asked from the tasks when the planning or the
        # assignment strategy needs them)
        old = self.dep.assignments[vertex]
        planning = self.request.planning
        profiles: dict[int, Any] = {}
        measured = MeasuredGroups({}, {}, {}, 0.0)
        if self.spec.needs_profiles(planning, cfg.drrs_subscale_bytes) or self._wants_workload():
            # the keys per group only for the adaptive planning below (a scan of all state)
            keys = planning is None and self.spec.name == RescaleProtocol.NON_DISRUPTIVE
            replies = yield from self._send(Phase.PLAN, (Call(t, GroupStatsRequest(keys))
                                                         for t in tasks))
            profiles = _profiles(replies)
            measured = measure_groups(replies)
        try:
            new = self._target(old, profiles)
        except RescaleRefused:
            yield from self._send(Phase.RELEASE, self._release_calls())
            raise
        adaptive = ""
        if planning is None and self.spec.name == RescaleProtocol.NON_DISRUPTIVE:
            # input rate, skew, sizes, state access (keys per group) and arrival order from
            # the tasks' group counters; the capacity from the job's metrics window
            decision = adaptive_from_measures(measured, moved_key_groups(old, new),
                                              capacity_rate=self.ctx.capacity_rate)
            planning, adaptive = decision.planning, decision.reason
        plan = self._plan(profiles, planning, old, new)
        if adaptive:
            assert planning is not None
            if planning.replication != "none" and not self.ctx.replication_on:
                yield EnableReplication(vertex, planning.replication,
                                        planning.replication_hot_fraction)
                adaptive += f"; replication '{planning.replication}' on from now"
            plan = dataclasses.replace(plan, reason=f"adaptive: {adaptive}; {plan.reason}")
        self.plan = plan
        # 3. new tasks before the first subscale
        self.committed = True
        old_p, final_p = plan.old_parallelism, plan.new_parallelism
        work_p = plan.work_parallelism
        gen = self.dep.generation + 1
        new_names = tuple(task_name(self.ctx.job_id, vertex, i, gen)
                          for i in range(old_p, work_p))
        self._names = [*tasks, *new_names]
        if new_names:
            self.phase = Phase.DEPLOY
            grown = self._grow_partners(old_p, work_p, gen)
            self.dep = self.dep.with_vertex(vertex, tuple(self._names), generation=gen,
                                            partners=grown)
            # receivers before senders: the partners' new tasks (downstream first), then
            # the operator's, whose Connect gives new task j its forward channel to each
            # partner's new task j
            for p in reversed(self.partners):
                yield from add_tasks_steps(self.dep, p, grown[p][old_p:], self.ctx.channel_ids,
                                           scaled=self.group)
            nodes, indices = self._creation(new_names)
            yield from add_tasks_steps(self.dep, vertex, new_names, self.ctx.channel_ids,
                                       nodes=nodes, indices=indices, scaled=self.group)
            yield UpdateVertex(vertex, tuple(self._names), None, gen, tuple(grown.items()))
        # 4. subscales
        yield from self._run_subscales(plan)
        # 5. remove tasks left without key groups, then release the hold
        self.phase = Phase.REMOVE
        gone = yield from self._remove(final_p, work_p)
        yield ReleaseReplicas(vertex, gone)
        self._held = self._group_tasks()
        yield from self._send(Phase.RELEASE, (Call(t, HoldFinish(False)) for t in self._held))
        done = clock.now()
        s = self.stats
        return self._with_assignment(RescaleReport(
            vertex, str(self.request.protocol), old_p, len(self._names), self.requested_at,
            done, done - self.requested_at, s.moved, s.bytes, (), (),
            s.first_start if s.first_start is not None else done, s.rerouted, s.suspended,
            s.delay, tuple(s.timings), self.superseded, self._reason(plan),
            len(plan.steps) if not self.spec.concurrent else 1, len(plan.moved),
            with_partners=self._with_partners(old_p != len(self._names)),
            without=tuple(sorted(self.spec.without))))

    def _creation(self, new_names: tuple[str, ...]
                  ) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, int], ...]]:
        """Where the new tasks start and the index their specs carry (``CreateTasks``):
        anywhere, at their position."""
        return (), ()

    def _remove(self, final_p: int, work_p: int) -> Generator[Command, Any, tuple[str, ...]]:
        """Scale-in: remove the tasks at ``final_p`` and above once they hold no key group
        (not after a supersede: the next request starts from every task), then the forward
        partners' tasks at the same indices, upstream first (their one input, the forward
        channel from a task removed before, has ended). Returns the operator's."""
        vertex = self.vertex
        current = self.dep.assignments[vertex]
        keep = final_p if not self.superseded else work_p
        if not (keep < work_p and max(current) < keep):
            return ()
        gone = tuple(self._names[keep:])
        yield from remove_tasks_steps(self.dep, vertex, gone, self.ctx.channel_ids,
                                      scaled=self.group)
        for p in self.partners:
            yield from remove_tasks_steps(self.dep, p, self.dep.tasks[p][keep:],
                                          self.ctx.channel_ids, scaled=self.group)
        self._names = self._names[:keep]
        kept = self._partner_tasks(keep)
        self.dep = self.dep.with_vertex(vertex, tuple(self._names), partners=kept)
        yield UpdateVertex(vertex, tuple(self._names), partners=tuple(kept.items()))
        return gone

    def _reason(self, plan: MigrationPlan) -> str:
        spec = self.spec
        if not spec.concurrent:
            return plan.reason
        acyclic = ("; no two running subscales in a cycle of (old, new) pairs"
                   if spec.coupled or not spec.schedule_records else "")
        if not spec.divided:
            return f"{plan.reason}{acyclic}"
        paced = "" if self.pacer is None else f"; {self.pacer.describe()}"
        return (f"{plan.reason}; at most {self.ctx.max_subscales} at once and "
                f"{self.config.drrs_max_subscales_per_task} per task{paced}{acyclic}")

    def _run_subscales(self, plan: MigrationPlan) -> Generator[Command, Any, None]:
        cfg, clock, vertex = self.config, self.clock, self.vertex
        current = list(self.dep.assignments[vertex])
        work_p = plan.work_parallelism
        owned = {i: current.count(i) for i in range(work_p)}
        sched: SubscaleScheduler | StepScheduler
        if self.spec.concurrent:
            spec = self.spec
            # channels may wait on a migration: no cycle of running subscales
            acyclic = spec.coupled or not spec.schedule_records
            if spec.divided:
                sched = SubscaleScheduler(plan, owned, cfg.drrs_max_subscales_per_task,
                                          self.ctx.max_subscales if self.pacer is None
                                          else self.pacer.limit, acyclic=acyclic)
            else:
                sched = SubscaleScheduler(plan, owned, max(1, len(plan.subscales)), None,
                                          acyclic=acyclic, bounded=False)
        else:
            sched = StepScheduler(plan.steps)
        self._sched = sched
        self.phase = Phase.SUBSCALES
        started_at: dict[int, float] = {}
        injected_at: dict[int, float] = {}
        s = self.stats
        while not sched.finished:
            if (self.superseded or self.input_ended) and sched.pending:
                # a newer request, or the input ended meanwhile: finish what runs, start no more
                sched.cancel_pending()
                self.superseded = True
            batch = sched.next_batch()
            if batch and not self.spec.concurrent and cfg.step_gap_ms > 0 and sched.done:
                yield Sleep(cfg.step_gap_ms / 1000.0)
            if batch:
                now = clock.now()
                for sub in batch:
                    s.first_start = s.first_start if s.first_start is not None else now
                    started_at[sub.subscale_id] = now
                chunk = (self.pacer.chunk_bytes if self.pacer is not None
                         else cfg.drrs_max_chunk_bytes if self.spec.concurrent else 0)
                calls = [subscale_calls(sub, self._names, self.dep, vertex,
                                        self.ctx.channel_ids, self.spec, self.ctx.replicas,
                                        chunk)
                         for sub in batch]
                # both owners know a subscale before any predecessor acts on it
                yield from self._send(Phase.SUBSCALES, (c for ex, _ in calls for c in ex))
                at = clock.now()
                for sub in batch:
                    injected_at[sub.subscale_id] = at
                yield from self._send(Phase.SUBSCALES, (c for _, inj in calls for c in inj))
                self.phase = Phase.SUBSCALES
            if not sched.running:
                break
            involved = {self._names[x] for sub in sched.running.values()
                        for x in (sub.old, sub.new)}
            yield from self._wait(lambda: bool(self._complete()), Phase.SUBSCALES, involved)
            for sid in self._complete():
                rep = self._reports.pop(sid)
                sub = sched.running[sid]
                sched.complete(sid)
                for kg in sub.key_groups:
                    current[kg] = sub.new
                old_rep, new_rep = rep[SubscaleRole.OLD], rep[SubscaleRole.NEW]
                s.moved += len(sub.key_groups)
                s.bytes += new_rep.bytes
                s.rerouted += old_rep.rerouted
                s.suspended = max(s.suspended, new_rep.suspended_s)
                if old_rep.trigger_at:
                    s.delays.append(max(0.0, old_rep.trigger_at - injected_at[sid]))
                took = clock.now() - started_at[sid]
                s.timings.append((sid, started_at[sid] - self.requested_at, took))
                self.dep = self.dep.with_vertex(vertex, tuple(self._names), tuple(current))
                yield SubscaleCompleted(vertex, sid, sub.key_groups, self._names[sub.new], took)
                yield UpdateVertex(vertex, tuple(self._names), tuple(current))

def _predecessors(dep: Deployment, vertex: str) -> list[tuple[Any, str]]:
    """(input edge, predecessor task) of ``vertex``."""
    return [(e, u) for e in dep.plan.inputs_of(vertex) for u in dep.tasks[e.src]]


def subscale_calls(sub: Subscale, names: Sequence[str], dep: Deployment, vertex: str,
                   ids: ChannelIds, spec: ProtocolSpec,
                   replicas: Mapping[int, tuple[str, int]], chunk_bytes: int = 0
                   ) -> tuple[list[Call], list[Call]]:
    """The calls that start subscale ``sub`` of ``vertex`` (whose tasks are ``names``):
    first both owners' expectations, then the injection at every predecessor.
    ``chunk_bytes``: drrs, the state the new owner may have in flight beyond one group."""
    s_name, d_name = names[sub.old], names[sub.new]
    rcid = ids.get(-1 - sub.subscale_id, s_name, d_name)
    preds = _predecessors(dep, vertex)
    direct = tuple(ids.get(e.edge_id, u, d_name) for e, u in preds)
    with_replica = tuple((kg, replicas[kg][1]) for kg in sub.key_groups
                         if kg in replicas and replicas[kg][0] == d_name)
    expect = [
        Call(d_name, ExpectIncoming(sub.subscale_id, sub.key_groups, direct, rcid,
                                    spec.reroutes, s_name, chunk_bytes,
                                    spec.fetch_on_demand, spec.schedule_records), (s_name,)),
        Call(s_name, ExpectOutgoing(sub.subscale_id, sub.key_groups,
                                    OutputChannel(rcid, d_name, REROUTE_PORT), len(direct),
                                    spec.aligned, spec.block_aligned, with_replica,
                                    spec.coupled, spec.schedule_records), (d_name,)),
    ]
    inject = [Call(u, InjectSubscale(sub.subscale_id, e.edge_id, sub.key_groups, sub.new,
                                     spec.trigger, spec.pause_new_owner)) for e, u in preds]
    return expect, inject


def _forward_within(dep: Deployment, edge_id: int, scaled: Collection[str]) -> bool:
    """Whether edge ``edge_id`` is a forward edge between two vertices of ``scaled`` (a
    forward group rescaled as one): its channels pair task i with task i, and both tasks
    at an index come and go together, so only their own ``Connect`` carries it."""
    e = next(x for x in dep.plan.edges if x.edge_id == edge_id)
    return e.partitioning == FORWARD and e.src in scaled and e.dst in scaled


def add_tasks_steps(dep: Deployment, vertex: str, new_names: tuple[str, ...],
                    ids: ChannelIds, hold: bool = True,
                    nodes: tuple[tuple[str, str], ...] = (),
                    indices: tuple[tuple[str, int], ...] = (),
                    scaled: Collection[str] = ()) -> Generator[Command, Any, None]:
    """Create, wire and start new tasks of ``vertex`` (already in ``dep``) while the job
    runs: they read from every predecessor and write to the operator's receivers; with
    ``hold`` they do not finish before the rescale releases them. ``nodes``/``indices``:
    as in ``CreateTasks``. ``scaled``: the forward group rescaled with ``vertex`` (every
    vertex of it already at the new task names in ``dep``; receivers' new tasks created
    first): a forward edge inside it is wired by the new tasks' own ``Connect`` (the
    sender's output, the receiver's input), so no old task adds or gets a channel on it."""
    yield CreateTasks(vertex, new_names, dep, nodes, indices)
    msgs = connect_messages(dep, ids)
    if hold:
        yield SendControl(tuple(Call(n, HoldFinish(True)) for n in new_names), Phase.DEPLOY)
    yield SendControl(tuple(
        Call(n, msgs[n], tuple(c.target for e in msgs[n].outputs for c in e.channels))
        for n in new_names), Phase.DEPLOY)
    adds: dict[str, list[tuple[int, int]]] = {}
    for n in new_names:
        for e in msgs[n].outputs:
            if _forward_within(dep, e.edge_id, scaled):
                continue  # the partner's new task was connected with it
            for c in e.channels:
                adds.setdefault(c.target, []).append((c.channel_id, c.port))
    if adds:
        yield SendControl(tuple(Call(t, AddInputs(tuple(ins))) for t, ins in adds.items()),
                          Phase.DEPLOY)
    yield SendControl(tuple(Call(n, Start()) for n in new_names), Phase.DEPLOY)
    preds = [(e, u) for e, u in _predecessors(dep, vertex)
             if not _forward_within(dep, e.edge_id, scaled)]
    if preds:
        yield SendControl(tuple(
            Call(u, AddOutputChannels(e.edge_id, tuple(
                OutputChannel(ids.get(e.edge_id, u, n), n, e.port) for n in new_names)),
                new_names)
            for e, u in preds), Phase.DEPLOY)


def remove_tasks_steps(dep: Deployment, vertex: str, gone: tuple[str, ...],
                       ids: ChannelIds, scaled: Collection[str] = ()
                       ) -> Generator[Command, Any, None]:
    """Scale-in: the predecessors stop sending to ``gone`` (which hold no key groups),
    then ``gone`` end their outputs and go; the sink output they wrote and no checkpoint
    committed yet (``HandOver``) is adopted by the tasks that stay, round robin.
    ``scaled``: the forward group rescaled with ``vertex``, removed upstream first: a
    forward edge inside it reaches ``gone`` only from the sender's tasks at the same
    indices, which were removed before (their ``EndOfStream`` ended those channels), so no
    predecessor drops a channel on it."""
    if not gone:
        return
    preds = [(e, u) for e, u in _predecessors(dep, vertex)
             if not _forward_within(dep, e.edge_id, scaled)]
    if preds:
        yield SendControl(tuple(
            Call(u, RemoveOutputChannels(tuple(ids.get(e.edge_id, u, n) for n in gone)))
            for e, u in preds), Phase.REMOVE)
    replies = yield SendControl(tuple(Call(n, StopTask(end_outputs=True)) for n in gone),
                                Phase.REMOVE)
    keep = [t for t in dep.tasks[vertex] if t not in gone]
    adopt: dict[str, list[Any]] = {}
    for i, reply in enumerate(replies or ()):
        if isinstance(reply, HandOver) and reply.transactions:
            adopt.setdefault(keep[i % len(keep)], []).extend(reply.transactions)
    if adopt:
        yield SendControl(tuple(Call(t, AdoptTransactions(tuple(txns)))
                                for t, txns in adopt.items()), Phase.REMOVE)
    yield RemoveTasks(gone)


def _profiles(replies: Sequence[Any]) -> dict[int, Any]:
    """Per-group profiles (load, state size) from the tasks' ``GroupStats`` replies."""
    loads: dict[int, float] = {}
    sizes: dict[int, int] = {}
    for r in replies:
        for kg, records, size, *_ in r.groups:  # a 4th element: the group's keys
            loads[kg] = records / r.seconds if r.seconds > 0 else 0.0
            sizes[kg] = size
    return profiles_from_metrics(loads, sizes)


# ---------------------------------------------------------------------- placement


class Placement(LiveRescale):
    """Move task ``i`` of a keyed operator to another Ray node, live (Trisk's placement):
    a replacement task starts on that node (it sees ``i`` as its task index) at index
    ``p`` (the operator runs ``p + 1`` tasks meanwhile), every key group of task ``i``
    migrates to it with the request's live protocol, then the replacement takes task
    ``i``'s index: every predecessor puts its channel to the replacement in the old one's
    place (``ReplaceOutputChannel``, so the routing is unchanged), and the old task ends
    its outputs and goes. The operator ends with ``p`` tasks and the same assignment. A
    placement superseded by a newer request before every group moved keeps ``p + 1``
    tasks (the report says it was cut short)."""

    def __init__(self, request: RescaleRequest, ctx: RescaleContext, clock: Clock) -> None:
        if request.place is None:
            raise ValueError("a placement request names the task and the node (place=)")
        index, node = request.place
        ctx.deployment.plan.check_placement(request.operator)
        old = ctx.deployment.assignments.get(request.operator, ())
        p = len(ctx.deployment.tasks[request.operator])
        if not old or index not in old:
            raise RescaleRefused(f"task {index} of {request.operator!r} holds no key group; "
                                 "placement moves keyed tasks with their key groups",
                                 operator=request.operator)
        target = tuple(p if t == index else t for t in old)
        super().__init__(dataclasses.replace(request, parallelism=p + 1, assignment=target),
                         ctx, clock)
        self.index, self.node, self.final_p = index, node, p

    def _creation(self, new_names: tuple[str, ...]
                  ) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, int], ...]]:
        return tuple((n, self.node) for n in new_names), tuple((n, self.index) for n in new_names)

    def _remove(self, final_p: int, work_p: int) -> Generator[Command, Any, tuple[str, ...]]:
        vertex, i, p = self.vertex, self.index, self.final_p
        current = list(self.dep.assignments[vertex])
        if self.superseded or i in current or len(self._names) != p + 1:
            return ()  # cut short: task i still holds groups, both stay
        old_name, new_name = self._names[i], self._names[p]
        ids = self.ctx.channel_ids
        preds = _predecessors(self.dep, vertex)
        if preds:
            yield SendControl(tuple(
                Call(u, ReplaceOutputChannel(ids.get(e.edge_id, u, old_name),
                                             ids.get(e.edge_id, u, new_name)))
                for e, u in preds), Phase.REMOVE)
        yield SendControl((Call(old_name, StopTask(end_outputs=True)),), Phase.REMOVE)
        yield RemoveTasks((old_name,))
        self._names = [*self._names[:i], new_name, *self._names[i + 1:p]]
        assignment = tuple(i if t == p else t for t in current)
        self.dep = self.dep.with_vertex(vertex, tuple(self._names), assignment)
        yield UpdateVertex(vertex, tuple(self._names), assignment)
        return (old_name,)


# ---------------------------------------------------------------------- stop-restart


class StopRestartRescale(RescaleCoordinator):
    """Flink's rescale: stop the job with a savepoint (sources read nothing after its
    barrier), deploy the whole job again from it with the operator at its new parallelism
    (key groups re-assigned by the target, sinks' transactions committed, sources at the
    savepoint's positions), and let it run. The same snapshot and restore path as
    checkpoints, savepoints and recovery; the job processes nothing meanwhile."""

    def __init__(self, request: RescaleRequest, ctx: RescaleContext, clock: Clock) -> None:
        super().__init__(request, ctx, clock)
        self.bytes_moved = 0
        self.moved = 0

    def progress(self) -> RescaleProgress:
        planned = len(self.plan.moved) if self.plan else 0
        return RescaleProgress(self.vertex, str(RescaleProtocol.STOP_RESTART), str(self.phase),
                               planned, self.moved, self.bytes_moved, not self.done)

    def _steps(self) -> _Steps:
        vertex, clock = self.vertex, self.clock
        timer = PhaseTimer(clock)
        mark, phases = timer.mark, timer.phases

        old = self.dep.assignments.get(vertex, ())
        profiles: dict[int, Any] = {}
        if self._wants_workload():  # before anything changes: a refusal leaves the job as is
            replies = yield from self._send(Phase.PLAN, (
                Call(t, GroupStatsRequest()) for t in self._tasks()
                if t not in self.finished_tasks))
            profiles = _profiles(replies)
        self.plan = self._plan({}, None, old, self._target(old, profiles))
        self.committed = True
        self.phase = Phase.SAVEPOINT
        savepoint = yield TakeSavepoint(stop=True)
        mark(Phase.SAVEPOINT)
        self.phase = Phase.RESTORE
        assignments = {vertex: self.plan.new_assignment} if self.plan.new_assignment else {}
        # the forward partners at the new parallelism too, in the same plan
        self.dep = yield RestoreJob(savepoint, {v: self.request.parallelism for v in self.group},
                                    assignments)
        mark(Phase.RESTORE)
        self.moved = len(self.plan.moved)
        self.bytes_moved = sum(length for t in savepoint.tasks if t.vertex == vertex
                               for _, _, length, _ in t.groups)
        offsets = tuple(sorted((t.task, t.source_state) for t in savepoint.tasks
                               if t.source_state is not None))
        done = clock.now()
        return self._with_assignment(RescaleReport(
            vertex, str(RescaleProtocol.STOP_RESTART), self.plan.old_parallelism,
            self.request.parallelism, self.requested_at, done, done - self.requested_at,
            self.moved, self.bytes_moved, tuple(phases), offsets,
            key_groups_planned=self.moved, with_partners=self.partners))


# ---------------------------------------------------------------------- source rescale

#: ``RescaleReport.protocol`` of a live source rescale
HANDOVER = str(LiveMechanism.HANDOVER)
#: ``RescaleReport.protocol`` of a live rescale of an operator without key groups
STATELESS = str(LiveMechanism.STATELESS)


class SourceRescale(RescaleCoordinator):
    """A live rescale of a source: its partitions are handed over to a new set of source
    tasks with their resume states, while every other task runs on.

    1. *deploy*: the new tasks (generation + 1, ``parallelism`` of them) are created and
       connected; every receiver of the source adds their channels, to be read only once
       all of the old tasks' channels to it have ended (``AddInputs.after``);
    2. *handover*: each old task stops reading, ends its outputs behind everything it
       emitted and replies with its partitions' resume states (``ReleaseSource``) and what
       its chained sinks wrote and no checkpoint committed yet (adopted by the new tasks,
       round robin); the new tasks start with the partitions ``j % parallelism == i`` at
       those states;
    3. *remove*: the old tasks go.

    No checkpoint starts from the first change to the last (``DataflowChanges``: the
    phases deploy, handover and remove are not quiet).

    Exact per partition: a record read before the release reaches each receiver on an old
    channel, which the receiver finishes before it reads the new ones; nothing is read
    twice (the new readers start where the old ones stopped) or lost. A watermark never
    passes a moved partition's records: the new tasks' channels start without one. The
    source reads nothing between its release and the new tasks' start (two control round
    trips); its receivers go on with what is in flight meanwhile."""

    def progress(self) -> RescaleProgress:
        return RescaleProgress(self.vertex, HANDOVER, str(self.phase), 0, 0, 0, not self.done)

    def _steps(self) -> _Steps:
        vertex, clock, ctx = self.vertex, self.clock, self.ctx
        timer = PhaseTimer(clock)
        mark, phases = timer.mark, timer.phases

        old_dep, old_tasks = self.dep, self._tasks()
        gen = self.dep.generation + 1
        names = tuple(task_name(ctx.job_id, vertex, i, gen)
                      for i in range(self.request.parallelism))
        new_dep = self.dep.with_vertex(vertex, names, generation=gen)
        # 1. the new tasks, wired but not started; the receivers hold their channels
        self.phase = Phase.DEPLOY
        self.committed = True
        yield CreateTasks(vertex, names, new_dep)
        msgs = connect_messages(new_dep, ctx.channel_ids)
        yield from self._send(Phase.DEPLOY, (
            Call(n, msgs[n], tuple(c.target for e in msgs[n].outputs for c in e.channels))
            for n in names))
        old_in = connect_messages(old_dep, ctx.channel_ids)
        old_channels = {c.channel_id for t in old_tasks for e in old_in[t].outputs
                        for c in e.channels}
        adds: dict[str, list[tuple[int, int]]] = {}
        for n in names:
            for e in msgs[n].outputs:
                for c in e.channels:
                    adds.setdefault(c.target, []).append((c.channel_id, c.port))
        yield from self._send(Phase.DEPLOY, (
            Call(t, AddInputs(tuple(ins), tuple(sorted(
                cid for cid, _ in old_in[t].inputs if cid in old_channels)) if t in old_in
                else ()))
            for t, ins in adds.items()))
        mark(Phase.DEPLOY)
        # 2. the old tasks stop where they are and say where that is; what their chained
        # sinks wrote and no checkpoint committed yet goes to the new tasks
        replies = yield from self._send(Phase.HANDOVER, (Call(t, ReleaseSource())
                                                         for t in old_tasks))
        offsets = {r.task: r.offsets for r in replies}
        resume = {p: st for states in offsets.values() for p, st in states.items()}
        adopt: dict[str, list[Any]] = {}
        for i, r in enumerate(replies):
            if r.transactions:
                adopt.setdefault(names[i % len(names)], []).extend(r.transactions)
        if adopt:
            yield from self._send(Phase.HANDOVER, (Call(t, AdoptTransactions(tuple(txns)))
                                                   for t, txns in adopt.items()))
        # 3. the new tasks take over
        self.dep = new_dep
        yield UpdateVertex(vertex, names, None, gen)
        yield from self._send(Phase.HANDOVER, (Call(n, start_message(new_dep, vertex, i, resume))
                                               for i, n in enumerate(names)))
        mark(Phase.HANDOVER)
        self.phase = Phase.REMOVE
        yield RemoveTasks(old_tasks)
        self.finished_tasks.difference_update(old_tasks)
        mark(Phase.REMOVE)
        done = clock.now()
        return RescaleReport(
            vertex, HANDOVER, len(old_tasks), len(names), self.requested_at, done,
            done - self.requested_at, 0, 0, tuple(phases), tuple(sorted(offsets.items())),
            requested_protocol=str(self.request.protocol))


# ---------------------------------------------------------------------- stateless rescale


class StatelessRescale(RescaleCoordinator):
    """A live rescale of an operator without key groups (not a source): tasks are added or
    drained while every other task runs on; no state moves.

    1. *hold*: the operator's tasks do not finish while their number changes (refused, the
       job untouched, when the operator's input has ended);
    2. scale-out, *deploy* (``add_tasks_steps``): the new tasks (generation + 1) are
       created and connected, their receivers add the new channels, they start, and only
       then every predecessor appends its channels to them (a rebalance edge deals its
       batches round robin over all its channels, so the new tasks get records as soon as
       they are wired); scale-in, *remove* (``remove_tasks_steps``): every predecessor
       drops its channels to the last tasks, which have taken everything sent to them once
       it answers (the runtime's shell settles the channels' frames first), then those
       tasks flush, end their outputs with ``EndOfStream`` behind everything they emitted,
       and hand over what their chained sinks wrote and no checkpoint committed yet
       (adopted by the tasks that stay, round robin); then they go;
    3. *release*.

    No checkpoint starts while tasks are being added or removed (``DataflowChanges``: the
    phases deploy and remove are not quiet). Exact: every record a predecessor sends goes
    to exactly one task of the operator, which processes it before it ends; per channel
    order is kept. Event time: a new task's channel holds its receivers' watermark until it
    sends its first watermark, which it does only once every predecessor's channel to it
    carried one (its predecessors send their current watermark when they add it); a removed
    task's channel stops counting at its ``EndOfStream``, behind its last record.

    Forward partners (``PhysicalPlan.check_rescale``: all stateless, none a source) go to
    the new parallelism with the operator: their tasks are held and released with its;
    new tasks are created downstream first (a forward edge inside the group is wired by the
    new tasks' own ``Connect``, task j to task j), removed tasks go upstream first (a
    partner's task's forward input has ended by then)."""

    def progress(self) -> RescaleProgress:
        return RescaleProgress(self.vertex, STATELESS, str(self.phase), 0, 0, 0, not self.done)

    def _steps(self) -> _Steps:
        vertex, clock, ctx = self.vertex, self.clock, self.ctx
        timer = PhaseTimer(clock)
        tasks = self._tasks()
        old_p, new_p = len(tasks), self.request.parallelism
        # 1. hold: no task of the operator (or of its partners) finishes while their
        # number changes
        yield from self._hold_group()
        timer.mark(Phase.HOLD)
        self.committed = True
        names = tuple(tasks)
        if new_p > old_p:  # 2. scale-out: new tasks, wired while the job runs
            gen = self.dep.generation + 1
            new_names = tuple(task_name(ctx.job_id, vertex, i, gen) for i in range(old_p, new_p))
            names = (*names, *new_names)
            self.phase = Phase.DEPLOY
            grown = self._grow_partners(old_p, new_p, gen)
            self.dep = self.dep.with_vertex(vertex, names, generation=gen, partners=grown)
            grown[vertex] = names
            for v in reversed(self.group):  # receivers before senders
                yield from add_tasks_steps(self.dep, v, grown[v][old_p:], ctx.channel_ids,
                                           scaled=self.group)
            del grown[vertex]
            yield UpdateVertex(vertex, names, None, gen, tuple(grown.items()))
            timer.mark(Phase.DEPLOY)
        elif new_p < old_p:  # 2. scale-in: the last tasks drain, end their outputs, go
            self.phase = Phase.REMOVE
            gone: tuple[str, ...] = ()
            for v in self.group:  # upstream first
                yield from remove_tasks_steps(self.dep, v, self.dep.tasks[v][new_p:],
                                              ctx.channel_ids, scaled=self.group)
                gone += self.dep.tasks[v][new_p:]
            names = names[:new_p]
            kept = self._partner_tasks(new_p)
            self.dep = self.dep.with_vertex(vertex, names, partners=kept)
            yield UpdateVertex(vertex, names, partners=tuple(kept.items()))
            self.finished_tasks.difference_update(gone)
            timer.mark(Phase.REMOVE)
        # 3. release
        self._held = self._group_tasks()
        yield from self._send(Phase.RELEASE, (Call(t, HoldFinish(False)) for t in self._held))
        timer.mark(Phase.RELEASE)
        done = clock.now()
        return RescaleReport(
            vertex, STATELESS, old_p, len(names), self.requested_at, done,
            done - self.requested_at, 0, 0, tuple(timer.phases),
            planning_reason=(f"operator {vertex!r} holds no key groups: "
                             + ("new tasks wired live" if new_p > old_p else
                                "the last tasks drained and removed live" if new_p < old_p
                                else "its parallelism is unchanged")
                             + f" instead of {self.request.protocol}"),
            requested_protocol=str(self.request.protocol),
            with_partners=self._with_partners(new_p != old_p))


def coordinator_for(request: RescaleRequest, ctx: RescaleContext,
                    clock: Clock) -> RescaleCoordinator:
    """The coordinator that runs ``request``'s protocol (a placement: ``Placement``);
    whatever live protocol was named, a source's live rescale hands its partitions over
    (``SourceRescale``) and that of another operator without key groups adds or drains
    tasks (``StatelessRescale``): ``migration.protocols.protocol_used``."""
    if request.place is not None:
        if not PROTOCOLS[request.protocol].live:
            raise RescaleRefused(f"placement moves key groups live; protocol "
                                 f"{request.protocol!r} is not a live protocol")
        return Placement(request, ctx, clock)
    if PROTOCOLS[request.protocol].live:
        v = ctx.deployment.plan.vertex(request.operator)
        if v.is_source:
            return SourceRescale(request, ctx, clock)
        if not v.keyed:
            return StatelessRescale(request, ctx, clock)
        return LiveRescale(request, ctx, clock)
    return StopRestartRescale(request, ctx, clock)
