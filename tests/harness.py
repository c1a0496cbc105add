"""Runs the engine's own rescale and checkpoint coordinators, and its deploy and
change-of-logic steps, against task cores in this process.

The JobMaster executes ``migration.coordinator`` commands with Ray (engine/runtime/
rescaling.py) and ``engine.checkpoints.coordinator`` commands (engine/runtime/
checkpointing.py); this module executes the same commands on ``TaskCore`` objects that a
test steps by hand, so the seeded interleaving tests exercise the coordinators as the
engine runs them, not copies. The test supplies ``progress`` (one round of stepping cores
and moving frames, at random or not) that runs while a coordinator waits for reports.

The step machines of ``engine.control.steps`` run through the same executor
(``InProcessExecutor.run`` takes any of them): ``deploy`` wires and starts a net's cores
with the engine's deploy choreography (``DeploySteps``: create, connect receivers first,
restore, start sources last), ``Checkpoints.restore`` deploys from a checkpoint with it,
and ``change_logic`` changes an operator's function mid-stream (``ChangeLogicSteps``).

Checkpoints (``Checkpoints``) are written to a real directory with the engine's store;
``restore`` replaces every core by a new one restored from a checkpoint, as recovery,
``restore_from`` and the stop-restart rescale do (``engine.checkpoints.restore``). A
rescale may be given ``before_change``: called where the JobMaster's executor would wait
for a checkpoint (before a command that changes the dataflow), once nothing of the rescale
is in flight, so a test can take a checkpoint in the middle of a rescale exactly where the
engine could.
"""

from __future__ import annotations

import copy
import dataclasses
import tempfile
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from engine.checkpoints import coordinator as cc
from engine.checkpoints.metadata import CheckpointKind, CheckpointMetadata
from engine.checkpoints.restore import RestorePlan
from engine.checkpoints.snapshot import persist, restore_messages
from engine.checkpoints.store import discard, discard_files, write_metadata
from engine.control.reconfiguration import LogicChangeReport
from engine.control.steps import (
    ChangeLogicSteps,
    DeploySteps,
    ForgetReplicas,
    Machine,
    ReplaceDeployment,
    ReplaceOperator,
    StageLogic,
    StepCommand,
    check_change_logic,
    restore_plan,
)
from engine.dataflow.config import JobConfig
from engine.dataflow.deployment import ChannelIds, Deployment
from engine.errors import ChangeLogicRefused, ReflowError
from engine.names import JobState
from engine.task.core import TaskCore, TaskSpec
from engine.time.clock import Clock
from engine.wire.messages import (
    Ack,
    CheckpointAborted,
    CheckpointComplete,
    RestoreState,
    SubscaleDone,
    TriggerCheckpoint,
    decode_message,
    encode_message,
)
from migration.coordinator import (
    AwaitReports,
    CreateTasks,
    DataflowChanges,
    EnableReplication,
    ReleaseReplicas,
    RemoveTasks,
    RescaleContext,
    RescaleCoordinator,
    RescaleRequest,
    RestoreJob,
    SendControl,
    Sleep,
    SubscaleCompleted,
    SubscaleIds,
    TakeSavepoint,
    UpdateVertex,
    coordinator_for,
)
from migration.report import RescaleReport


def _aligner(core: TaskCore) -> Any:
    """The core's checkpoint barrier aligner (inside its checkpoint participant, where it
    has one), for a stuck checkpoint's message."""
    return getattr(core.checkpoints, "aligner", core.checkpoints)


def make_spec(dep: Deployment, vertex: str, index: int, name: str,
              config: JobConfig) -> TaskSpec:
    """The spec the JobMaster builds (``TaskSpec.of``). Each Ray actor gets its own copy of
    the spec (and so of the user function objects, which keep state handles): copy it."""
    return copy.deepcopy(TaskSpec.of(dep, vertex, index, name, config))


def records_left(core: TaskCore) -> int:
    """Records a ``TestingSource`` task has not emitted yet, over the partitions it reads."""
    from engine.io.sources import parse_indexed

    assert core.reader is not None, f"{core.name} is not a started source task"
    records = core.spec.operators[0].fn.records
    left = 0
    for pid, emitted in core.reader.offsets().items():
        j, n = parse_indexed(pid)
        left += len(records[j::n]) - (emitted or 0)
    return left


def wire(msg: Any) -> Any:
    """Control messages go over the wire in the runtime: do the same here."""
    return decode_message(encode_message(msg))


def control(core: TaskCore, msg: Any) -> Any:
    """A control message to ``core`` as the task actor's shell gives it: over the wire; a
    ``RestoreState`` read from the store first (the core installs what was read)."""
    msg = wire(msg)
    if isinstance(msg, RestoreState):
        for inner in restore_messages(msg):
            core.handle(wire(inner))
        return Ack()
    return core.handle(msg)


def stage_logic(net: Cores, operator: str, version: int, fn: Any,
                tasks: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``StageLogic`` on ``net``: each task takes its own copy of ``fn`` (a Ray actor
    deserialises its own); the tasks that refused it, with why."""
    refused = []
    for t in tasks:
        try:
            net.cores[t].stage_logic(version, operator, copy.deepcopy(fn))
        except Exception as exc:  # noqa: BLE001 - the task refuses: the machine says why
            refused.append((t, f"{type(exc).__name__}: {exc}"))
    return tuple(refused)


class Cores(Protocol):
    """What the executor needs of a test's network of cores."""

    cores: dict[str, TaskCore]
    dep: Deployment
    config: JobConfig
    clock: Clock
    ids: ChannelIds

    def new_core(self, dep: Deployment, vertex: str, index: int, name: str) -> TaskCore: ...


@dataclasses.dataclass
class Executed:
    """What a run did besides the report: every command, the subscale reports by id."""

    commands: list[StepCommand] = dataclasses.field(default_factory=list)
    subscales: dict[int, dict[str, SubscaleDone]] = dataclasses.field(default_factory=dict)
    completed: list[SubscaleCompleted] = dataclasses.field(default_factory=list)


class Checkpoints:
    """The JobMaster's checkpoint side on ``net``'s cores: the engine's checkpoint
    coordinator, written to ``root`` with the engine's store, the tasks' snapshots persisted
    as the task actor does; ``progress`` runs while it waits for acknowledgements."""

    def __init__(self, net: Cores, root: str, progress: Callable[[], None],
                 max_rounds: int = 5000) -> None:
        self.net = net
        self.progress = progress
        self.max_rounds = max_rounds
        self.coord = cc.CheckpointCoordinator("j", "job", net.dep.plan.num_key_groups,
                                              net.config, net.clock, root)
        self.taken: list[CheckpointMetadata] = []

    def take(self, kind: CheckpointKind = CheckpointKind.CHECKPOINT,
             location: str | None = None, stop: bool = False) -> CheckpointMetadata:
        """Trigger, step the net until every task acknowledged, write: the metadata (an
        ``AssertionError`` naming the reason when it failed)."""
        cmds = self.coord.trigger(self.net.dep, kind, location, stop)
        cid = cmds[0].checkpoint_id  # type: ignore[union-attr]
        self.run(cmds)
        for _ in range(self.max_rounds):
            self.collect()
            for out in self.coord.take_outcomes():
                if out.checkpoint_id == cid:
                    assert out.metadata is not None, f"checkpoint {cid} failed: {out.reason}"
                    self.taken.append(out.metadata)
                    return out.metadata
            self.progress()
        waiting = [f"{n}: {c.status}, aligning {al.pending}, blocked "
                   f"{sorted(al.blocked)} of {sorted(al.channels)}; {c._describe()}"
                   for n, c in self.net.cores.items()
                   for al in [_aligner(c)]
                   if self.coord.pending is not None and n not in self.coord.pending.acks]
        raise AssertionError(f"checkpoint {cid} did not complete in {self.max_rounds} rounds; "
                             f"waiting for {waiting}")

    def collect(self) -> None:
        """Persist what the cores snapshotted (the shell's part) and acknowledge it."""
        for core in list(self.net.cores.values()):
            while core.snapshots:
                ack = wire(persist(core.snapshots.pop(0), self.net.clock))
                self.run(self.coord.on_report(ack))

    def run(self, cmds: list[cc.Command]) -> None:
        cores = self.net.cores
        for cmd in cmds:
            match cmd:
                case cc.TriggerTasks(checkpoint_id=cid, location=loc, stop=stop, tasks=tasks,
                                     savepoint=savepoint):
                    for t in tasks:
                        cores[t].handle(wire(TriggerCheckpoint(cid, loc, stop, savepoint)))
                case cc.WriteMetadata(metadata=meta):
                    write_metadata(meta)
                    self.run(self.coord.on_written(meta.checkpoint_id))
                case cc.NotifyComplete(checkpoint_id=cid, tasks=tasks):
                    for t in tasks:
                        if t in cores:
                            cores[t].handle(wire(CheckpointComplete(cid)))
                case cc.NotifyAborted(checkpoint_id=cid, tasks=tasks):
                    for t in tasks:
                        if t in cores:
                            cores[t].handle(wire(CheckpointAborted(cid)))
                case cc.Discard(locations=locations):
                    for loc in locations:
                        discard(loc)
                case cc.DiscardFiles(locations=locations, files=files):
                    discard_files(locations, files)
                case cc.FailJob(reason=reason):
                    raise AssertionError(f"the job would fail: {reason}")

    def restore(self, meta: CheckpointMetadata, parallelism: Mapping[str, int] | None = None,
                assignments: Mapping[str, tuple[int, ...]] | None = None,
                allow_non_restored_state: bool = False) -> RestorePlan:
        """Replace every core by a new one restored from ``meta`` (at its layout, with
        ``parallelism`` and ``assignments`` overriding it), wired and started by the
        engine's deploy steps (``engine.control.steps.DeploySteps``, every old task
        removed first), as the JobMaster deploys a job from a checkpoint."""
        net = self.net
        rp = restore_plan(meta, net.dep.plan, "j", net.dep.generation + 1, net.dep.partitions,
                          parallelism, assignments, allow_non_restored_state)
        forget = getattr(net, "forget_in_flight", None)
        if forget is not None:
            forget()  # frames and messages of the old tasks are gone with them
        deploy(net, rp.deployment, rp.tasks, remove=tuple(net.cores))
        self.coord.restored(meta)
        return rp


class InProcessExecutor:
    """Executes a coordinator's or a step machine's commands on ``net``'s cores (the
    JobMaster's part). ``checkpoints``: where a stop-restart's savepoint goes and how the
    job is restored from it; ``before_change``: see the module doc."""

    def __init__(self, net: Cores, progress: Callable[[], None],
                 after_send: Callable[[SendControl], None] | None = None,
                 max_rounds: int = 5000, checkpoints: Checkpoints | None = None,
                 before_change: Callable[[], None] | None = None) -> None:
        self.net = net
        self.progress = progress
        self.after_send = after_send
        self.max_rounds = max_rounds
        self.checkpoints = checkpoints
        self.before_change = before_change
        self.changes = DataflowChanges()
        # reports made before the rescale are not its business
        self._seen: dict[str, int] = {n: len(c.reports) for n, c in net.cores.items()}
        self.executed = Executed()

    def run(self, coord: Machine) -> Any:
        """Run ``coord`` to its end; its report. A command that raises a ``ReflowError``
        goes to the machine's ``on_error`` where it has one (a step machine), which goes
        on or raises it again."""
        queue: deque[StepCommand] = deque(coord.start())
        while not coord.done:
            assert queue, "the coordinator gave no command and is not done"
            cmd = queue.popleft()
            self.executed.commands.append(cmd)
            if isinstance(cmd, AwaitReports):
                queue.extend(self._await(coord))
                continue
            if self.before_change is not None and self.changes.gates(cmd):  # type: ignore[arg-type]
                self._settle(coord)  # where the runtime waits for a checkpoint
                self.before_change()
            self.changes.on_command(cmd)  # type: ignore[arg-type]
            on_error = getattr(coord, "on_error", None)
            try:
                result = self.execute(cmd)
            except ReflowError as exc:
                if on_error is None:
                    raise
                queue.extend(on_error(cmd, exc))
                continue
            queue.extend(coord.on_result(cmd, result))
        return coord.report()

    def _settle(self, coord: Machine) -> None:
        """Step the net until none of the rescale's subscales is in flight (the runtime's
        checkpoint waits for that before it starts)."""
        for _ in range(self.max_rounds):
            assert not self.feed(coord), "a wait ended outside an AwaitReports"
            if not self.changes.subscales:
                return
            self.progress()
        raise AssertionError(f"subscales {sorted(self.changes.subscales)} never finished")

    def _await(self, coord: Machine) -> list[StepCommand]:
        for _ in range(self.max_rounds):
            more = self.feed(coord)
            if more or coord.done:
                return more
            self.progress()
        coord.on_timeout()  # raises, naming what it waited for
        raise AssertionError("on_timeout returned")

    def feed(self, coord: Machine) -> list[StepCommand]:
        """Give the coordinator every report the cores made since the last call."""
        out: list[StepCommand] = []
        for name, core in list(self.net.cores.items()):
            start = self._seen.get(name, 0)
            for report in core.reports[start:]:
                if isinstance(report, SubscaleDone):
                    self.executed.subscales.setdefault(report.subscale, {})[report.role] = report
                self.changes.on_report(report)
                out.extend(coord.on_report(wire(report)))
            self._seen[name] = len(core.reports)
        return out

    def execute(self, cmd: StepCommand) -> Any:
        net = self.net
        match cmd:
            case SendControl(calls=calls):
                replies = [control(net.cores[c.task], c.message) for c in calls]
                if self.after_send is not None:
                    self.after_send(cmd)
                return [wire(r) for r in replies]
            case ReplaceDeployment(deployment=dep):
                net.dep = dep
            case StageLogic(operator=operator, version=version, fn=fn, tasks=tasks):
                return stage_logic(net, operator, version, fn, tasks)
            case ReplaceOperator():
                net.dep = cmd.apply(net.dep)
            case ForgetReplicas():
                pass  # no replicas are kept here
            case CreateTasks(vertex=vertex, names=names, deployment=dep, indices=indices):
                index = dict(indices)  # a placed task carries the index it replaces
                for name in names:
                    net.cores[name] = net.new_core(
                        dep, vertex, index.get(name, dep.tasks[vertex].index(name)), name)
            case RemoveTasks(names=names):
                for n in names:
                    self._seen.pop(n, None)
                    del net.cores[n]
            case UpdateVertex():
                net.dep = cmd.apply(net.dep)
            case SubscaleCompleted():
                self.executed.completed.append(cmd)
            case Sleep() | ReleaseReplicas() | EnableReplication():
                pass
            case TakeSavepoint(stop=stop):
                assert self.checkpoints is not None, "a savepoint needs harness.Checkpoints"
                return self.checkpoints.take(CheckpointKind.CHECKPOINT, stop=stop)
            case RestoreJob(checkpoint=meta, parallelism=parallelism, assignments=a):
                assert self.checkpoints is not None, "a restore needs harness.Checkpoints"
                self._seen.clear()
                return self.checkpoints.restore(meta, parallelism, a).deployment
            case _:
                raise TypeError(f"unknown command {cmd!r}")
        return None


def rescale(net: Cores, request: RescaleRequest, progress: Callable[[], None], *,
            config: JobConfig | None = None, after_send: Callable[[SendControl], None] | None
            = None, max_subscales: int = 2,
            replicas: dict[int, tuple[str, int]] | None = None,
            max_rounds: int = 5000, checkpoints: Checkpoints | None = None,
            before_change: Callable[[], None] | None = None,
            ) -> tuple[RescaleCoordinator, RescaleReport, Executed]:
    """Run ``request`` on ``net`` with the engine's coordinator; ``config`` overrides the
    job's for the coordinator (its limits and sizes), the cores keep theirs. A stop-restart
    without ``checkpoints`` writes its savepoint to a new temporary directory."""
    ids = getattr(net, "subscale_ids", None)
    if ids is None:
        ids = SubscaleIds()
        net.subscale_ids = ids  # type: ignore[attr-defined]
    finished = frozenset(n for n, c in net.cores.items() if c.status == "finished")
    ctx = RescaleContext("j", net.dep, config or net.config, net.ids, ids, replicas or {},
                         False, max_subscales, finished)
    coord = coordinator_for(request, ctx, net.clock)
    if checkpoints is None and request.protocol == "stop-restart":
        checkpoints = Checkpoints(net, tempfile.mkdtemp(prefix="reflow-harness-"), progress,
                                  max_rounds)
    ex = InProcessExecutor(net, progress, after_send, max_rounds, checkpoints, before_change)
    report = ex.run(coord)
    return coord, report, ex.executed


def run_steps(net: Cores, steps: Any, progress: Callable[[], None] = lambda: None,
              after_send: Callable[[SendControl], None] | None = None) -> None:
    """Execute a bare generator of coordinator commands (``add_tasks_steps``,
    ``remove_tasks_steps``) on ``net``, feeding each result back."""
    ex = InProcessExecutor(net, progress, after_send)
    result = None
    while True:
        try:
            cmd = steps.send(result)
        except StopIteration:
            return
        result = ex.execute(cmd)


def deploy(net: Cores, dep: Deployment | None = None,
           restore: Mapping[str, Any] | None = None, remove: tuple[str, ...] = ()
           ) -> Deployment:
    """Deploy ``dep`` (default ``net.dep``) on ``net`` with the engine's deploy steps
    (``engine.control.steps.DeploySteps``): the cores ``remove`` go, a core per task is
    created (``net.new_core``), connected receivers first, given its ``restore`` (an
    ``engine.checkpoints.restore`` plan's ``tasks``) and started, sources last."""
    steps = DeploySteps(dep or net.dep, net.ids, net.clock, restore, remove)
    dep_run: Deployment = InProcessExecutor(net, lambda: None).run(steps)
    return dep_run


def change_logic(net: Cores, operator: str, fn: Any, progress: Callable[[], None], *,
                 config: JobConfig | None = None,
                 after_send: Callable[[SendControl], None] | None = None,
                 max_rounds: int = 5000,
                 ) -> tuple[ChangeLogicSteps, LogicChangeReport, Executed]:
    """Change ``operator``'s function to ``fn`` on ``net`` with the engine's steps
    (``engine.control.steps.ChangeLogicSteps``), ``progress`` running while it waits for
    the tasks' switch. Validated as the JobMaster does (a job whose input ended somewhere
    is finishing); a refusal (``ChangeLogicRefused``) discards every staged copy first.
    Each attempt takes the next version, as in the JobMaster."""
    finishing = any(c.status == "finished" for c in net.cores.values())
    new, _ = check_change_logic(net.dep.plan, operator, fn, job_id="j",
                                state=JobState.RUNNING, finishing=finishing)
    version = getattr(net, "logic_version", 0) + 1
    net.logic_version = version  # type: ignore[attr-defined]
    steps = ChangeLogicSteps(new, version, net.dep, net.ids, config or net.config, net.clock)
    ex = InProcessExecutor(net, progress, after_send, max_rounds)
    try:
        report = ex.run(steps)
    except ChangeLogicRefused:
        for cmd in steps.release_commands():
            ex.execute(cmd)
        raise
    return steps, report, ex.executed
