"""Deploy, recovery, change of logic and replica refresh as sans-IO steps, in the rescale
coordinator's command vocabulary.

Why: "create the tasks, connect receivers first, restore, start sources last" was written
three times (the JobMaster's deploy, recovery's deploy, the unit-test harness), and change
of logic and replica refresh were async code in the Ray shell, testable only on Ray. Here
each is a plain object that takes events and returns commands, the commands the rescale
coordinator (``migration.coordinator``) emits; the JobMaster (``engine.runtime``) executes
them with Ray and ``tests/harness.py`` on task cores in this process. There is one copy.

Machines (each a ``StepMachine``):

* ``DeploySteps(dep, ids, restore, remove)``: deploy ``dep`` with new tasks, each with its
  ``restore`` (an ``engine.checkpoints.restore`` plan's ``tasks``; empty: no state), after
  removing the tasks ``remove``. Steps: ``RemoveTasks(remove)``; ``ReplaceDeployment(dep)``;
  one ``CreateTasks`` per vertex (topological order); one ``SendControl`` (phase deploy)
  with every task's ``Connect``, receivers first, each introducing the tasks it sends to;
  one ``SendControl`` (phase restore) with the ``RestoreState`` of the tasks that have
  state; then per vertex in reverse topological order (sources last) one ``SendControl``
  (phase start) with its tasks' ``Start`` (a source's partitions at their resume states).
  Report: the deployment. The job's first deploy, ``run(restore_from=...)`` (with the
  ``plan_restore`` of the savepoint) and the stop-restart's ``RestoreJob`` (with
  ``restore_plan``, ``remove`` = every task) are this machine.
* ``RecoverySteps``: a restart after a failure: remove every task, wait the restart
  strategy's delay (``Sleep``), then ``DeploySteps`` from the newest candidate checkpoint
  (``recovery_candidates``; planned with ``checkpoint_layout`` and ``plan_restore``, so
  every operator at its parallelism and assignment in the checkpoint), falling back to the
  next older one when one does not read back whole (a ``RestoreError`` fed to
  ``on_error``: its new tasks are removed and the next is deployed at the next
  generation); with no checkpoint, the job from the start of its input without state.
  Report: ``RecoveryOutcome``.
* ``ChangeLogicSteps``: a change of logic (``engine.runtime.logic`` has the semantics):
  ``StageLogic`` at every task of the vertex; a refusal by one (the result names it)
  raises ``ChangeLogicRefused`` and ``release_commands()`` discards every staged copy;
  then (committed) the barriers: ``InjectLogicBarrier`` at every predecessor task, or
  ``SwitchLogic`` at a source's tasks; ``AwaitReports`` until every task reported
  ``LogicChanged``; ``ReplaceOperator`` so that tasks created later run the new function.
  Report: ``LogicChangeReport``. ``check_change_logic`` validates a request first.
* ``ReplicaRefreshSteps``: one refresh of a keyed vertex's replicas
  (``engine.runtime.replicas``): ``GroupStatsRequest`` at its tasks; the groups chosen by
  the policy and their holders placed (``migration.replication``); replicas whose holder
  changed are forgotten (``ForgetReplicas``) and dropped (``ReleaseReplicas``); each owner
  refreshes its groups' replicas (``RefreshReplicas``, introducing the holders). Report:
  ``ReplicaRefreshOutcome``, the replicas that exist now.

Interface (the rescale coordinator's): ``start()`` returns the first commands; the executor
runs returned commands in order and hands each one's outcome to ``on_result(command,
result)`` (a ``SendControl``'s replies in call order, a ``StageLogic``'s refusals, None for
the others), which returns the next ones. ``AwaitReports``: feed every task report to
``on_report`` until it returns commands; ``on_timeout()`` after ``timeout_s`` (it raises).
New here: ``on_error(command, error)``: the command failed with ``error`` (a task's own
``ReflowError`` where it raised one): the machine goes on where it can (recovery's
fallback) and raises ``error`` otherwise. ``done``/``report()`` give the outcome;
``committed`` is False until the job was changed (a failure before that: run
``release_commands()``, best effort, as after a refused rescale).

How a Ray executor (the JobMaster) applies each step:

* ``SendControl``: every call at once (``JobMaster.call(task, message, introduce)``), the
  replies in call order (deploy and recovery read none: ``JobMaster._each``'s None will
  do). Bounded by ``rescale_timeout_s`` in a change of logic and a
  replica refresh (a silent task: ``RescaleTimeout`` naming it), by ``Deadlines.deploy_s``
  from the first command in ``DeploySteps``/``RecoverySteps`` (as ``JobMaster._each``: the
  first task's reflow error, else ``JobFailedError`` naming the tasks that died or were
  silent). The job is ``running`` from the first phase-start ``SendControl`` of a first
  deploy on (a task's failure while starting is then handled as a failure). A
  ``RestoreState`` reaches the task actor's ``control`` as any message (the shell reads the
  groups).
* ``CreateTasks``: in a deploy, a new actor per name (``JobMaster.create_task``, never a
  standby: the deploy paths never took one); in a rescale as before
  (``create_task_actor``).
* ``RemoveTasks``: kill those actors and forget them (in a recovery: ``kill_tasks``, which
  also forgets what the job knew of finishing tasks).
* ``ReplaceDeployment``: ``m.dep = dep; m.plan = dep.plan``; finished tasks forgotten.
* ``Sleep``: ``asyncio.sleep``.
* ``StageLogic``: ``handle.stage_logic.remote(version, operator, fn)`` at every task at
  once (after a standby's configure), within ``rescale_timeout_s``; the result is
  ``((task, cause), ...)`` for each that raised (``cause``: the innermost error, one line)
  or did not answer; ``()`` when all took it.
* ``AwaitReports``: wait on the job's reports (``JobMaster.report`` feeds ``on_report``)
  until the machine returns commands or ``timeout_s`` passed (``on_timeout()``); a job that
  stops running meanwhile ends the wait with its failure.
* ``ReplaceOperator``: ``m.graph = cmd.apply_to_graph(m.graph)``, ``m.dep =
  cmd.apply(m.dep)``, ``m.plan = m.dep.plan``.
* ``ForgetReplicas``: ``ReplicaKeeper.forget(vertex, key_groups)``; ``ReleaseReplicas``: as
  in a rescale (``ReplicaKeeper.release``: drops the forgotten replicas at their holders).
* Reports: a ``RecoveryOutcome`` with ``skipped`` moves the checkpoint coordinator's
  ``latest`` to the restored checkpoint (newer retained ones dropped) and notes the
  skipped ones in ``last_failure``; a ``ReplicaRefreshOutcome`` replaces the keeper's
  replicas of its vertex and adds its bytes and CPU seconds to the collector.

After a failure of a committed change of logic the job fails (some tasks may run the new
function); a failure of a deploy or recovery fails the deploy as before.

Guarantees: commands are frozen values; no I/O, no Ray, no clock but the injected one;
control messages are the wire messages of ``engine.wire.messages``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from engine.checkpoints.metadata import CheckpointMetadata
from engine.checkpoints.restore import (
    RestorePlan,
    TaskRestore,
    checkpoint_layout,
    fresh_deployment,
    plan_restore,
)
from engine.control.reconfiguration import LogicChangeReport
from engine.dataflow import graph as g
from engine.dataflow.config import JobConfig
from engine.dataflow.deployment import (
    ChannelIds,
    Deployment,
    connect_messages,
    start_message,
)
from engine.dataflow.physical import PhysicalPlan
from engine.errors import ChangeLogicRefused, JobDefinitionError, RescaleTimeout, RestoreError
from engine.names import JobState
from engine.operators.builtin import with_function
from engine.time.clock import Clock
from engine.wire.messages import (
    Connect,
    DiscardLogic,
    GroupStatsRequest,
    InjectLogicBarrier,
    LogicChanged,
    RefreshReplicas,
    RestoreState,
    SwitchLogic,
)
from migration.coordinator import (
    AwaitReports,
    Call,
    Command,
    CreateTasks,
    Phase,
    ReleaseReplicas,
    RemoveTasks,
    SendControl,
    Sleep,
)
from migration.planning import profiles_from_metrics
from migration.replication import choose_replicated_groups, place_replicas

# ---------------------------------------------------------------------- commands


@dataclass(frozen=True)
class ReplaceDeployment:
    """The job's deployment is now ``deployment``, every task of it new (a deploy, a
    restart, a restore): recorded before its tasks are created; what was known of tasks
    not in it (their input ended) is forgotten."""

    deployment: Deployment


@dataclass(frozen=True)
class StageLogic:
    """Give each of ``tasks`` its own copy of ``fn`` to replace ``operator``'s function at
    logic barrier ``version`` (the task opens it: a keyed function on its state). The
    result: ``(task, cause)`` of each task that could not take it or did not answer in time
    (empty: every task took it)."""

    operator: str
    version: int
    fn: Any
    tasks: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.version < 1:
            raise ValueError(f"logic version must be >= 1; got {self.version}")
        if not self.tasks:
            raise ValueError(f"staging the logic of {self.operator!r}: no tasks")


@dataclass(frozen=True)
class ReplaceOperator:
    """From now on the job runs operator ``definition.name`` as ``definition``: the job's
    graph and its deployment's plan carry it, so tasks created later run the new function."""

    definition: g.OperatorDef

    def apply(self, dep: Deployment) -> Deployment:
        """``dep`` whose plan runs the new definition (what an executor does with it)."""
        return dataclasses.replace(dep, plan=with_operator(dep.plan, self.definition))

    def apply_to_graph(self, graph: g.JobGraph) -> g.JobGraph:
        """``graph`` with the new definition."""
        op = self.definition
        return g.JobGraph(graph.name, graph.num_key_groups, tuple(
            op if o.name == op.name else o for o in graph.operators))


@dataclass(frozen=True)
class ForgetReplicas:
    """The replicas of ``key_groups`` of ``vertex`` are out of date (their holder changed):
    forget them; the next ``ReleaseReplicas`` drops them at their holders."""

    vertex: str
    key_groups: tuple[int, ...]

    def __post_init__(self) -> None:
        if any(kg < 0 for kg in self.key_groups):
            raise ValueError(f"key groups of {self.vertex!r} must be >= 0")


#: every command a step machine emits: the rescale coordinator's and the four above
StepCommand = Command | ReplaceDeployment | StageLogic | ReplaceOperator | ForgetReplicas


def with_operator(plan: PhysicalPlan, op: g.OperatorDef) -> PhysicalPlan:
    """``plan`` with the vertex running ``op.name`` running ``op`` instead."""
    vertices = tuple(
        dataclasses.replace(v, operators=tuple(op if o.name == op.name else o
                                               for o in v.operators))
        for v in plan.vertices)
    return dataclasses.replace(plan, vertices=vertices)


# ---------------------------------------------------------------------- outcomes


@dataclass(frozen=True)
class RecoveryOutcome:
    """A finished recovery: the job runs ``deployment``, restored by ``restored`` (None:
    from the start of its input, no checkpoint completed); ``skipped``: the newer
    checkpoints that did not read back whole, ``"checkpoint <id> (<error>)"``."""

    deployment: Deployment
    restored: RestorePlan | None
    skipped: tuple[str, ...] = ()

    @property
    def note(self) -> str:
        """What the job's ``last_failure`` says of the fallback ('' without one)."""
        if not self.skipped or self.restored is None:
            return ""
        return (f"restored from checkpoint {self.restored.checkpoint.checkpoint_id}: "
                + "; ".join(self.skipped) + " did not read back whole")


@dataclass(frozen=True)
class ReplicaRefreshOutcome:
    """A finished refresh of ``vertex``'s replicas: ``held``, key group -> (holder task,
    version), is every replica of the vertex now; ``bytes`` sent and encoding ``cpu_s``."""

    vertex: str
    held: Mapping[int, tuple[str, int]]
    bytes: int
    cpu_s: float


# ---------------------------------------------------------------------- the machine


class Machine(Protocol):
    """What an executor drives: a ``StepMachine`` or a rescale coordinator."""

    phase: Phase
    committed: bool

    @property
    def done(self) -> bool: ...

    def start(self) -> list[Any]: ...

    def on_result(self, command: Any, result: Any) -> list[Any]: ...

    def on_report(self, report: Any) -> list[Any]: ...

    def on_timeout(self) -> list[Any]: ...

    def release_commands(self) -> list[Any]: ...

    def report(self) -> Any: ...


_Steps = Generator[StepCommand, Any, Any]


class StepMachine:
    """Drives one choreography; subclasses write it as a generator of commands (each
    ``yield`` returns the command's result; an error fed to ``on_error`` is raised at the
    ``yield``), this base turns it into the event interface (see the module doc)."""

    def __init__(self, clock: Clock, phase: Phase) -> None:
        self.clock = clock
        self.phase = phase
        self.committed = False
        self._gen: _Steps | None = None
        self._pending: StepCommand | None = None
        self._waiting: Callable[[], bool] | None = None
        self._done = False
        self._report: Any = None
        self._release: list[StepCommand] = []

    # -- the event interface
    def start(self) -> list[StepCommand]:
        if self._gen is not None:
            raise RuntimeError(f"{type(self).__name__} was started already")
        self._gen = self._steps()
        return self._advance(lambda gen: next(gen))

    def on_result(self, command: StepCommand, result: Any) -> list[StepCommand]:
        self._check(command)
        return self._advance(lambda gen: gen.send(result))

    def on_error(self, command: StepCommand, error: BaseException) -> list[StepCommand]:
        """``command`` failed with ``error``: the next commands where the machine goes on,
        else ``error`` raised again."""
        self._check(command)
        return self._advance(lambda gen: gen.throw(error))

    def on_report(self, report: Any) -> list[StepCommand]:
        """Take one task report; the next commands when it ended a wait."""
        self._observe(report)
        if self._waiting is not None and self._waiting():
            self._waiting = None
            return self._advance(lambda gen: gen.send(None))
        return []

    def on_timeout(self) -> list[StepCommand]:
        """The ``AwaitReports`` wait ran out: raises ``RescaleTimeout`` naming the tasks."""
        cmd = self._pending
        if not isinstance(cmd, AwaitReports):
            raise RuntimeError("on_timeout outside a wait")
        raise RescaleTimeout(
            f"{self.describe()}: phase {cmd.phase} not finished after {cmd.timeout_s:g} s; "
            f"waiting for {', '.join(self.waiting_for()) or 'nothing'}. Raise "
            "JobConfig.rescale_timeout_s if the job needs longer, or look at the tasks named",
            str(cmd.phase), self.waiting_for())

    @property
    def done(self) -> bool:
        return self._done

    def report(self) -> Any:
        if not self._done:
            raise RuntimeError(f"{self.describe()} has not finished")
        return self._report

    def release_commands(self) -> list[StepCommand]:
        """After a failure before ``committed``: what undoes what was done (best effort)."""
        return [] if self.committed else list(self._release)

    def describe(self) -> str:
        return type(self).__name__

    def waiting_for(self) -> tuple[str, ...]:
        """The tasks the current wait waits for."""
        cmd = self._pending
        return cmd.tasks if isinstance(cmd, AwaitReports) else ()

    # -- machinery
    def _check(self, command: StepCommand) -> None:
        if command is not self._pending:
            raise RuntimeError(f"result for {type(command).__name__}, which is not the "
                               f"command {self.describe()} waits on")

    def _advance(self, step: Callable[[_Steps], StepCommand]) -> list[StepCommand]:
        assert self._gen is not None
        try:
            cmd = step(self._gen)
        except StopIteration as stop:
            self._report = stop.value
            self._done = True
            self._pending = None
            self.phase = Phase.DONE
            return []
        self._pending = cmd
        return [cmd]

    def _wait(self, until: Callable[[], bool], phase: Phase, timeout_s: float,
              tasks: Iterable[str]) -> Generator[StepCommand, Any, None]:
        """Yield an ``AwaitReports`` unless ``until()`` already holds."""
        if until():
            return
        self._waiting = until
        yield AwaitReports(phase, timeout_s, tuple(sorted(tasks)))

    def _observe(self, report: Any) -> None:
        """A task report (subclasses keep what they wait for)."""

    def _steps(self) -> _Steps:
        raise NotImplementedError
        yield  # pragma: no cover


def _send(phase: Phase, calls: Iterable[Call]) -> Generator[StepCommand, Any, tuple[Any, ...]]:
    """One ``SendControl`` of ``calls`` (none when empty); its replies (a deploy reads
    none: its executor may hand back None)."""
    calls = tuple(calls)
    if not calls:
        return ()
    replies = yield SendControl(calls, phase)
    return tuple(replies or ())


def _targets(msg: Connect) -> tuple[str, ...]:
    """The tasks a task's ``Connect`` sends to (their handles travel with it)."""
    return tuple(c.target for e in msg.outputs for c in e.channels)


# ---------------------------------------------------------------------- deploy


def deploy_steps(dep: Deployment, ids: ChannelIds,
                 restore: Mapping[str, TaskRestore] | None = None,
                 remove: Sequence[str] = ()) -> Generator[StepCommand, Any, Deployment]:
    """The deploy choreography (the module doc, ``DeploySteps``); returns ``dep``."""
    if remove:
        yield RemoveTasks(tuple(remove))
    yield ReplaceDeployment(dep)
    vertices = dep.plan.vertices
    for v in vertices:
        yield CreateTasks(v.name, tuple(dep.tasks[v.name]), dep)
    msgs = connect_messages(dep, ids)
    # receivers first, so a channel exists before anything is sent on it
    order = [t for v in reversed(vertices) for t in dep.tasks[v.name]]
    yield from _send(Phase.DEPLOY, (Call(t, msgs[t], _targets(msgs[t])) for t in order))
    states = restore or {}
    yield from _send(Phase.RESTORE, (Call(t, RestoreState(r.groups, r.transactions))
                                     for t, r in states.items() if r.groups or r.transactions))
    for v in reversed(vertices):  # sources last
        yield from _send(Phase.START, (
            Call(t, start_message(dep, v.name, i, (states[t].source_state if t in states
                                                   else None)))
            for i, t in enumerate(dep.tasks[v.name])))
    return dep


class DeploySteps(StepMachine):
    """Deploy ``dep`` with new tasks, each with its ``restore``, after removing ``remove``
    (the module doc). Committed from the start: the job changes with the first command."""

    def __init__(self, dep: Deployment, ids: ChannelIds, clock: Clock,
                 restore: Mapping[str, TaskRestore] | None = None,
                 remove: Sequence[str] = ()) -> None:
        super().__init__(clock, Phase.DEPLOY)
        unknown = sorted(set(restore or {}) - set(dep.task_names()))
        if unknown:
            raise ValueError(f"restore names tasks the deployment does not have: {unknown}")
        self.dep = dep
        self.ids = ids
        self.restore = dict(restore or {})
        self.remove = tuple(remove)
        self.committed = True

    def describe(self) -> str:
        return f"deploy of job {self.dep.job_id} (generation {self.dep.generation})"

    def _steps(self) -> _Steps:
        return (yield from deploy_steps(self.dep, self.ids, self.restore, self.remove))


def restore_plan(meta: CheckpointMetadata, plan: PhysicalPlan, job_id: str, generation: int,
                 partitions: Mapping[str, tuple[str, ...]],
                 parallelism: Mapping[str, int] | None = None,
                 assignments: Mapping[str, tuple[int, ...]] | None = None,
                 allow_non_restored_state: bool = False) -> RestorePlan:
    """The job ``plan`` restored from ``meta`` at the checkpoint's layout
    (``checkpoint_layout``), with ``parallelism`` and ``assignments`` overriding it for
    these vertices (forward partners change with their operator): what a stop-restart's
    ``RestoreJob`` deploys."""
    layout = checkpoint_layout(plan, meta)
    if parallelism:
        layout = layout.with_parallelism(dict(parallelism))
    return plan_restore(meta, layout, job_id, generation, allow_non_restored_state,
                        assignments, partitions)


# ---------------------------------------------------------------------- recovery


def recovery_candidates(latest: CheckpointMetadata | None,
                        retained: Sequence[CheckpointMetadata]) -> tuple[CheckpointMetadata, ...]:
    """The checkpoints a recovery tries, newest first: ``latest``, then the retained older
    ones (none without a ``latest``)."""
    if latest is None:
        return ()
    return (latest, *(c for c in reversed(retained) if c.checkpoint_id < latest.checkpoint_id))


class RecoverySteps(StepMachine):
    """A restart after a failure (the module doc): remove ``old_tasks``, wait ``delay_s``,
    deploy the job ``graph_plan`` as ``job_id`` from the newest of ``candidates`` that reads
    back (state it cannot take dropped: ``allow_non_restored_state``), from ``generation``
    on; with no candidate, from the start of the input (sources' ``partitions``)."""

    def __init__(self, graph_plan: PhysicalPlan, job_id: str, generation: int,
                 partitions: Mapping[str, tuple[str, ...]], ids: ChannelIds, clock: Clock,
                 candidates: Sequence[CheckpointMetadata] = (),
                 old_tasks: Collection[str] = (), delay_s: float = 0.0) -> None:
        super().__init__(clock, Phase.RESTORE)
        if delay_s < 0:
            raise ValueError(f"restart delay must be >= 0; got {delay_s}")
        self.graph_plan = graph_plan
        self.job_id = job_id
        self.generation = generation
        self.partitions = dict(partitions)
        self.ids = ids
        self.candidates = tuple(candidates)
        self.old_tasks = tuple(old_tasks)
        self.delay_s = delay_s
        self.committed = True

    def describe(self) -> str:
        return f"recovery of job {self.job_id}"

    def _steps(self) -> _Steps:
        if self.old_tasks:
            yield RemoveTasks(self.old_tasks)
        if self.delay_s:
            yield Sleep(self.delay_s)
        if not self.candidates:
            dep = fresh_deployment(self.graph_plan, self.job_id, self.generation,
                                   self.partitions)
            yield from deploy_steps(dep, self.ids)
            return RecoveryOutcome(dep, None)
        skipped: list[str] = []
        generation = self.generation
        for i, meta in enumerate(self.candidates):
            plan = plan_restore(meta, checkpoint_layout(self.graph_plan, meta), self.job_id,
                                generation, allow_non_restored_state=True,
                                partitions=self.partitions)
            try:
                dep = yield from deploy_steps(plan.deployment, self.ids, plan.tasks)
            except RestoreError as exc:  # only an unreadable checkpoint falls back
                if i == len(self.candidates) - 1:
                    raise
                skipped.append(f"checkpoint {meta.checkpoint_id} ({exc})")
                yield RemoveTasks(tuple(plan.deployment.task_names()))
                generation = plan.deployment.generation + 1  # names not reused
                continue
            return RecoveryOutcome(dep, plan, tuple(skipped))
        raise AssertionError("unreachable: the last candidate returns or raises")


# ---------------------------------------------------------------------- change of logic


def check_change_logic(plan: PhysicalPlan, operator: str, fn: Any, *, job_id: str,
                       state: JobState, finishing: bool) -> tuple[g.OperatorDef, str]:
    """The operator's new definition running ``fn`` and its vertex in ``plan`` (the job's
    current plan: it carries every earlier change), or ``ChangeLogicRefused`` saying why
    not: the job is not running or is finishing (some of its input ended), the operator
    does not exist or cannot change, ``fn`` does not fit it
    (``engine.operators.builtin.with_function``)."""
    if state != JobState.RUNNING:
        raise ChangeLogicRefused(f"job {job_id} is {state}, not running")
    if finishing:
        raise ChangeLogicRefused(f"job {job_id} is finishing (some of its input ended); "
                                 "its logic no longer changes", operator=operator)
    ops = {o.name: (o, v.name) for v in plan.vertices for o in v.operators}
    if operator not in ops:
        raise ChangeLogicRefused(f"job {job_id} has no operator {operator!r}; operators: "
                                 f"{', '.join(ops)}", operator=operator)
    op, vertex = ops[operator]
    try:
        new = with_function(op, fn)
    except JobDefinitionError as exc:
        raise ChangeLogicRefused(str(exc), operator=operator) from None
    return new, vertex


class ChangeLogicSteps(StepMachine):
    """Change ``new.name``'s function to ``new.fn`` as logic ``version`` in every task of
    its vertex in ``dep`` (the module doc; the semantics are ``engine.runtime.logic``'s).
    ``ids``: the job's channel ids (the barriers go on the vertex's input channels)."""

    def __init__(self, new: g.OperatorDef, version: int, dep: Deployment, ids: ChannelIds,
                 config: JobConfig, clock: Clock) -> None:
        super().__init__(clock, Phase.STAGE)
        self.operator = new.name
        self.new = new
        self.version = version
        self.dep = dep
        self.ids = ids
        self.config = config
        self.vertex = dep.plan.vertex_of(new.name).name
        self.tasks: tuple[str, ...] = tuple(dep.tasks[self.vertex])
        self.changed: dict[str, LogicChanged] = {}
        self.requested_at = clock.now()
        self._release = [SendControl(tuple(Call(t, DiscardLogic(version)) for t in self.tasks),
                                     Phase.STAGE)]

    def describe(self) -> str:
        return f"change of logic of {self.operator!r} to version {self.version}"

    def waiting_for(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.tasks) - set(self.changed)))

    def _observe(self, report: Any) -> None:
        if (isinstance(report, LogicChanged) and report.version == self.version
                and report.task in self.tasks):
            self.changed[report.task] = report

    def _barriers(self) -> list[Call]:
        """A source's tasks switch at a control message; other tasks at the barrier every
        predecessor task sends on its channels to them."""
        plan, dep = self.dep.plan, self.dep
        if plan.vertex(self.vertex).is_source:
            return [Call(t, SwitchLogic(self.version)) for t in self.tasks]
        return [Call(u, InjectLogicBarrier(self.version, tuple(
            self.ids.get(e.edge_id, u, t) for t in self.tasks)))
            for e in plan.inputs_of(self.vertex) for u in dep.tasks[e.src]]

    def _steps(self) -> _Steps:
        refused = yield StageLogic(self.operator, self.version, self.new.fn, self.tasks)
        if refused:
            why = "; ".join(f"{t}: {cause}" for t, cause in refused)
            raise ChangeLogicRefused(
                f"change of logic of {self.operator!r} refused before any task switched; the "
                f"job runs on with the old function. The new function could not be taken by "
                f"{why}", operator=self.operator, phase=str(Phase.STAGE),
                tasks=tuple(t for t, _ in refused))
        self.committed = True  # from here on some task may switch
        self.phase = Phase.SWITCH
        yield from _send(Phase.SWITCH, self._barriers())
        yield from self._wait(lambda: set(self.tasks) <= set(self.changed), Phase.SWITCH,
                              self.config.rescale_timeout_s, self.tasks)
        yield ReplaceOperator(self.new)
        return LogicChangeReport(self.operator, self.version, len(self.tasks),
                                 self.requested_at, self.clock.now(),
                                 max((r.alignment_s for r in self.changed.values()),
                                     default=0.0))


# ---------------------------------------------------------------------- replica refresh


class ReplicaRefreshSteps(StepMachine):
    """One refresh of keyed ``vertex``'s replicas in ``dep`` by ``policy`` ("hot": the
    busiest ``hot_fraction`` of its groups, "all"), given the replicas ``held`` now (key
    group -> (holder, version)); the module doc has the steps."""

    def __init__(self, vertex: str, dep: Deployment, policy: str, hot_fraction: float,
                 held: Mapping[int, tuple[str, int]], clock: Clock) -> None:
        super().__init__(clock, Phase.REFRESH)
        if not dep.plan.vertex(vertex).keyed:
            raise ValueError(f"vertex {vertex!r} holds no key groups to replicate")
        self.vertex = vertex
        self.dep = dep
        self.policy = policy
        self.hot_fraction = hot_fraction
        self.held = dict(held)
        self.committed = True  # nothing to undo: a replica is a copy

    def describe(self) -> str:
        return f"replica refresh of {self.vertex!r}"

    def _steps(self) -> _Steps:
        vertex = self.vertex
        names = self.dep.tasks[vertex]
        assignment = self.dep.assignments[vertex]
        replies = yield from _send(Phase.REFRESH, (Call(t, GroupStatsRequest()) for t in names))
        # (key group, records, state bytes, ...): later fields are not needed here
        loads = {g[0]: (g[1] / r.seconds if r.seconds > 0 else 0.0)
                 for r in replies for g in r.groups}
        sizes = {g[0]: g[2] for r in replies for g in r.groups}
        profiles = profiles_from_metrics(loads, sizes)
        groups = choose_replicated_groups(self.policy, {kg: p.load for kg, p in profiles.items()},
                                          self.hot_fraction, len(assignment))
        holders = place_replicas(assignment, groups, len(names))
        held = dict(self.held)
        moved_away = tuple(kg for kg, (h, _) in held.items()
                           if kg not in holders or names[holders[kg]] != h)
        if moved_away:
            for kg in moved_away:
                del held[kg]
            yield ForgetReplicas(vertex, moved_away)
            yield ReleaseReplicas(vertex)
        targets: dict[str, list[tuple[int, str, int]]] = {}
        for kg, h in holders.items():
            version = held[kg][1] if kg in held else -1
            targets.setdefault(names[assignment[kg]], []).append((kg, names[h], version))
        owners = list(targets)
        replies = yield from _send(Phase.REFRESH, (
            Call(o, RefreshReplicas(tuple(targets[o])), tuple(t[1] for t in targets[o]))
            for o in owners))
        sent, cpu = 0, 0.0
        for o, r in zip(owners, replies, strict=True):
            holder_of = {kg: h for kg, h, _ in targets[o]}
            for kg, version in r.versions:
                held[kg] = (holder_of[kg], version)
            for kg in r.dropped:
                held.pop(kg, None)
            sent += r.bytes
            cpu += r.cpu_s
        return ReplicaRefreshOutcome(vertex, held, sent, cpu)


__all__ = ["ChangeLogicSteps", "DeploySteps", "ForgetReplicas", "Machine", "RecoveryOutcome",
           "RecoverySteps", "ReplaceDeployment", "ReplaceOperator", "ReplicaRefreshOutcome",
           "ReplicaRefreshSteps", "StageLogic", "StepCommand", "StepMachine",
           "check_change_logic", "deploy_steps", "recovery_candidates", "restore_plan",
           "with_operator"]
