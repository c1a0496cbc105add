"""The rescale coordinator as sans-IO state machines: one per running rescale.

Why: the coordination of a rescale (hold the operator's tasks, plan, create tasks, run the
plan's subscales or steps, remove tasks; or stop-restart's eight phases) is the protocol
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
of ``engine.messages``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.channel import REROUTE_PORT
from engine.clock import Clock
from engine.config import JobConfig, check_count
from engine.deployment import (
    ChannelIds,
    Deployment,
    connect_messages,
    start_message,
    task_name,
)
from engine.errors import RescaleRefused, RescaleTimeout
from engine.keygroups import moved_key_groups
from engine.messages import (
    AddInputs,
    AddOutputChannels,
    Drained,
    ExpectIncoming,
    ExpectOutgoing,
    GroupStatsRequest,
    HoldFinish,
    InjectSubscale,
    InstallKeyGroups,
    OutputChannel,
    PauseSource,
    ReleaseSource,
    RemoveOutputChannels,
    Resume,
    SnapshotKeyGroups,
    SourcePaused,
    Start,
    StopTask,
    SubscaleDone,
    TaskFinished,
)
from engine.metrics import RescaleProgress
from engine.names import NameEnum, SubscaleRole
from migration.assignment import rescale_target
from migration.pacing import HeadroomPacer
from migration.plan import MigrationPlan, Subscale
from migration.planning import (
    Planning,
    adaptive_planning,
    profiles_from_metrics,
    workload_from_profiles,
)
from migration.protocols import PROTOCOLS, PlanRequest, ProtocolSpec, RescaleProtocol
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
    PAUSE = "pause"
    DRAIN = "drain"
    SNAPSHOT = "snapshot"
    STOP = "stop"
    INSTALL = "install"
    CONNECT = "connect"
    RESUME = "resume"
    DONE = "done"


# ---------------------------------------------------------------------- requests and context


@dataclass(frozen=True)
class RescaleRequest:
    """What was asked: ``operator`` (a vertex) to ``parallelism`` tasks with ``protocol``;
    ``assignment``: the target assignment (a rebalance; None: uniform ranges);
    ``planning``: a ``migration.planning.Planning`` or None for the protocol's default;
    ``reason``: who asked and why (a user call, a controller's decision)."""

    operator: str
    parallelism: int
    protocol: RescaleProtocol
    assignment: tuple[int, ...] | None = None
    planning: Planning | None = None
    reason: str = "requested"

    def __post_init__(self) -> None:
        check_count(f"rescale of {self.operator!r}: parallelism", self.parallelism)
        object.__setattr__(self, "protocol", RescaleProtocol.parse(self.protocol, "protocol"))


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
    ``max_subscales``: subscales of the operator at once (drrs); ``epoch``: the drain epoch
    a stop-restart uses; ``finished``: tasks whose input ended."""

    job_id: str
    deployment: Deployment
    config: JobConfig
    channel_ids: ChannelIds
    subscale_ids: SubscaleIds
    replicas: Mapping[int, tuple[str, int]] = field(default_factory=dict)
    replication_on: bool = False
    max_subscales: int = 1
    epoch: int = 0
    finished: frozenset[str] = frozenset()


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
    actor where the pool has one). Calls to them wait until they exist."""

    vertex: str
    names: tuple[str, ...]
    deployment: Deployment


@dataclass(frozen=True)
class RemoveTasks:
    """Stop and release these task actors (they hold no state any more)."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class UpdateVertex:
    """The job's deployment of ``vertex`` is now ``tasks`` owning key groups by
    ``assignment`` (None: unchanged), at ``generation`` (None: unchanged)."""

    vertex: str
    tasks: tuple[str, ...]
    assignment: tuple[int, ...] | None = None
    generation: int | None = None


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


Command = (SendControl | CreateTasks | RemoveTasks | UpdateVertex | AwaitReports | Sleep
           | SubscaleCompleted | ReleaseReplicas | EnableReplication)


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
        self.spec: ProtocolSpec = PROTOCOLS[request.protocol]
        self.dep = ctx.deployment
        self.phase = Phase.HOLD
        self.committed = False
        self.superseded = False
        self.input_ended = bool(ctx.finished)
        self.finished_tasks: set[str] = set(ctx.finished)
        self.plan: MigrationPlan | None = None
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
        return [SendControl(tuple(Call(t, HoldFinish(False)) for t in self._held),
                            Phase.RELEASE)]

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
        if isinstance(report, TaskFinished):
            self.finished_tasks.add(report.task)
            self.input_ended = True

    def _steps(self) -> _Steps:
        raise NotImplementedError
        yield  # pragma: no cover

    def _send(self, phase: Phase, calls: Iterable[Call]) -> Generator[Command, Any, tuple]:
        calls = tuple(calls)
        if not calls:
            return ()
        self.phase = phase
        replies = yield SendControl(calls, phase)
        return tuple(replies)

    def _tasks(self, vertex: str | None = None) -> tuple[str, ...]:
        return self.dep.tasks[vertex or self.vertex]


    def _target(self, old: tuple[int, ...]) -> tuple[int, ...]:
        req = self.request
        return rescale_target(old, self.dep.plan.num_key_groups, req.parallelism,
                              req.assignment)

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
    """A live rescale (drrs, pause-resume, fluid, batched, non-disruptive): hold the
    operator's tasks (they must not finish while groups move), plan, create new tasks,
    run the plan's subscales (at once within limits, or step by step), remove tasks left
    without groups, release."""

    def __init__(self, request: RescaleRequest, ctx: RescaleContext, clock: Clock) -> None:
        super().__init__(request, ctx, clock)
        if not self.spec.live:
            raise ValueError(f"{request.protocol} is not a live protocol")
        self.stats = _LiveStats()
        self._reports: dict[int, dict[str, SubscaleDone]] = {}
        self._sched: SubscaleScheduler | StepScheduler | None = None
        self._names: list[str] = []
        # drrs: subscales at once follow the machine's idle cores (migration.pacing)
        self.pacer = (HeadroomPacer(ctx.max_subscales)
                      if self.spec.concurrent and ctx.config.drrs_pacing else None)

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
        # 1. hold: the operator's tasks do not finish while groups move
        tasks = self._tasks()
        self._held = tasks
        states = yield from self._send(Phase.HOLD, (Call(t, HoldFinish(True)) for t in tasks))
        ended = [st.task for st in states if st.input_ended]
        if ended or self.input_ended:
            yield from self._send(Phase.RELEASE, self.release_commands()[0].calls)
            who = ended[0] if ended else sorted(self.finished_tasks)[0]
            raise RescaleRefused(
                f"job {self.ctx.job_id} is finishing: the input of {who} has ended; "
                "rescaling a finishing job is not supported")
        # 2. plan (per-group load and size asked from the tasks when the planning needs them)
        old = self.dep.assignments[vertex]
        new = self._target(old)
        planning = self.request.planning
        profiles: dict[int, Any] = {}
        if self.spec.needs_profiles(planning, cfg.drrs_subscale_bytes):
            replies = yield from self._send(Phase.PLAN, (Call(t, GroupStatsRequest())
                                                         for t in tasks))
            profiles = _profiles(replies)
        adaptive = ""
        if planning is None and self.spec.name == RescaleProtocol.NON_DISRUPTIVE:
            moved = moved_key_groups(old, new)
            rate = sum(p.load for p in profiles.values())
            decision = adaptive_planning(workload_from_profiles(profiles, moved, rate))
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
            self.dep = self.dep.with_vertex(vertex, tuple(self._names), generation=gen)
            yield from add_tasks_steps(self.dep, vertex, new_names, self.ctx.channel_ids)
            yield UpdateVertex(vertex, tuple(self._names), None, gen)
        # 4. subscales
        yield from self._run_subscales(plan)
        # 5. remove tasks left without key groups (scale-in), then release the hold
        self.phase = Phase.REMOVE
        current = self.dep.assignments[vertex]
        keep = final_p if not self.superseded else work_p
        gone: tuple[str, ...] = ()
        if keep < work_p and max(current) < keep:
            gone = tuple(self._names[keep:])
            yield from remove_tasks_steps(self.dep, vertex, gone, self.ctx.channel_ids)
            self._names = self._names[:keep]
            self.dep = self.dep.with_vertex(vertex, tuple(self._names))
            yield UpdateVertex(vertex, tuple(self._names))
        yield ReleaseReplicas(vertex, gone)
        self._held = tuple(self._names)
        yield from self._send(Phase.RELEASE, (Call(t, HoldFinish(False)) for t in self._held))
        done = clock.now()
        s = self.stats
        return RescaleReport(
            vertex, str(self.request.protocol), old_p, len(self._names), self.requested_at,
            done, done - self.requested_at, s.moved, s.bytes, (), (),
            s.first_start if s.first_start is not None else done, s.rerouted, s.suspended,
            s.delay, tuple(s.timings), self.superseded, self._reason(plan),
            len(plan.steps) if not self.spec.concurrent else 1, len(plan.moved))

    def _reason(self, plan: MigrationPlan) -> str:
        if not self.spec.concurrent:
            return plan.reason
        paced = "" if self.pacer is None else f"; {self.pacer.describe()}"
        return (f"{plan.reason}; at most {self.ctx.max_subscales} at once and "
                f"{self.config.drrs_max_subscales_per_task} per task{paced}")

    def _run_subscales(self, plan: MigrationPlan) -> Generator[Command, Any, None]:
        cfg, clock, vertex = self.config, self.clock, self.vertex
        current = list(self.dep.assignments[vertex])
        work_p = plan.work_parallelism
        owned = {i: current.count(i) for i in range(work_p)}
        sched: SubscaleScheduler | StepScheduler
        if self.spec.concurrent:
            sched = SubscaleScheduler(plan, owned, cfg.drrs_max_subscales_per_task,
                                      self.ctx.max_subscales if self.pacer is None
                                      else self.pacer.limit)
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
                calls = [subscale_calls(sub, self._names, self.dep, vertex,
                                        self.ctx.channel_ids, self.spec, self.ctx.replicas)
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
                   replicas: Mapping[int, tuple[str, int]]) -> tuple[list[Call], list[Call]]:
    """The calls that start subscale ``sub`` of ``vertex`` (whose tasks are ``names``):
    first both owners' expectations, then the injection at every predecessor."""
    s_name, d_name = names[sub.old], names[sub.new]
    rcid = ids.get(-1 - sub.subscale_id, s_name, d_name)
    preds = _predecessors(dep, vertex)
    direct = tuple(ids.get(e.edge_id, u, d_name) for e, u in preds)
    with_replica = tuple((kg, replicas[kg][1]) for kg in sub.key_groups
                         if kg in replicas and replicas[kg][0] == d_name)
    expect = [
        Call(d_name, ExpectIncoming(sub.subscale_id, sub.key_groups, direct, rcid,
                                    spec.trigger, s_name), (s_name,)),
        Call(s_name, ExpectOutgoing(sub.subscale_id, sub.key_groups,
                                    OutputChannel(rcid, d_name, REROUTE_PORT), len(direct),
                                    spec.aligned, spec.block_aligned, with_replica), (d_name,)),
    ]
    inject = [Call(u, InjectSubscale(sub.subscale_id, e.edge_id, sub.key_groups, sub.new,
                                     spec.trigger, spec.pause_new_owner)) for e, u in preds]
    return expect, inject


def add_tasks_steps(dep: Deployment, vertex: str, new_names: tuple[str, ...],
                    ids: ChannelIds, hold: bool = True) -> Generator[Command, Any, None]:
    """Create, wire and start new tasks of ``vertex`` (already in ``dep``) while the job
    runs: they read from every predecessor and write to the operator's receivers; with
    ``hold`` they do not finish before the rescale releases them."""
    yield CreateTasks(vertex, new_names, dep)
    msgs = connect_messages(dep, ids)
    if hold:
        yield SendControl(tuple(Call(n, HoldFinish(True)) for n in new_names), Phase.DEPLOY)
    yield SendControl(tuple(
        Call(n, msgs[n], tuple(c.target for e in msgs[n].outputs for c in e.channels))
        for n in new_names), Phase.DEPLOY)
    adds: dict[str, list[tuple[int, int]]] = {}
    for n in new_names:
        for e in msgs[n].outputs:
            for c in e.channels:
                adds.setdefault(c.target, []).append((c.channel_id, c.port))
    if adds:
        yield SendControl(tuple(Call(t, AddInputs(tuple(ins))) for t, ins in adds.items()),
                          Phase.DEPLOY)
    yield SendControl(tuple(Call(n, Start()) for n in new_names), Phase.DEPLOY)
    preds = _predecessors(dep, vertex)
    if preds:
        yield SendControl(tuple(
            Call(u, AddOutputChannels(e.edge_id, tuple(
                OutputChannel(ids.get(e.edge_id, u, n), n, e.port) for n in new_names)),
                new_names)
            for e, u in preds), Phase.DEPLOY)


def remove_tasks_steps(dep: Deployment, vertex: str, gone: tuple[str, ...],
                       ids: ChannelIds) -> Generator[Command, Any, None]:
    """Scale-in: the predecessors stop sending to ``gone`` (which hold no key groups),
    then ``gone`` end their outputs and go."""
    preds = _predecessors(dep, vertex)
    if preds:
        yield SendControl(tuple(
            Call(u, RemoveOutputChannels(tuple(ids.get(e.edge_id, u, n) for n in gone)))
            for e, u in preds), Phase.REMOVE)
    yield SendControl(tuple(Call(n, StopTask(end_outputs=True)) for n in gone), Phase.REMOVE)
    yield RemoveTasks(gone)


def _profiles(replies: Sequence[Any]) -> dict[int, Any]:
    """Per-group profiles (load, state size) from the tasks' ``GroupStats`` replies."""
    loads: dict[int, float] = {}
    sizes: dict[int, int] = {}
    for r in replies:
        for kg, records, size in r.groups:
            loads[kg] = records / r.seconds if r.seconds > 0 else 0.0
            sizes[kg] = size
    return profiles_from_metrics(loads, sizes)


# ---------------------------------------------------------------------- stop-restart


class StopRestartRescale(RescaleCoordinator):
    """Flink's default: pause the sources at an offset and drain the job, snapshot every
    key group of the operator, stop its tasks, start the new set, install the groups by the
    new assignment, reconnect, resume. The job processes nothing meanwhile."""

    def __init__(self, request: RescaleRequest, ctx: RescaleContext, clock: Clock) -> None:
        super().__init__(request, ctx, clock)
        self.drained: set[str] = set()
        self.offsets: dict[str, Any] = {}
        self.bytes_moved = 0
        self.moved = 0

    def _observe(self, report: Any) -> None:
        if isinstance(report, TaskFinished):
            self.finished_tasks.add(report.task)  # a finished task needs no drain
        elif isinstance(report, Drained) and report.epoch == self.ctx.epoch:
            self.drained.add(report.task)
        elif isinstance(report, SourcePaused):
            self.offsets[report.task] = report.offsets

    def progress(self) -> RescaleProgress:
        planned = len(self.plan.moved) if self.plan else 0
        return RescaleProgress(self.vertex, str(RescaleProtocol.STOP_RESTART), str(self.phase),
                               planned, self.moved, self.bytes_moved, not self.done)

    def describe_wait(self) -> str:
        left = [t for t in self.dep.task_names()
                if t not in self.drained and t not in self.finished_tasks]
        return f"not drained yet: {', '.join(left)}" if left else ""

    def _steps(self) -> _Steps:
        vertex, clock, ctx = self.vertex, self.clock, self.ctx
        timer = PhaseTimer(clock)
        mark, phases = timer.mark, timer.phases

        old = self.dep.assignments.get(vertex, ())
        self.plan = self._plan({}, None, old, self._target(old))
        # pause the sources at an offset, then drain every task
        live = [n for n in self.dep.task_names() if n not in self.finished_tasks]
        sources = [n for v in self.dep.plan.vertices if v.is_source
                   for n in self.dep.tasks[v.name]
                   if n in live or v.name == vertex]  # a rescaled source: every offset
        self.committed = True
        yield from self._send(Phase.PAUSE, (Call(n, PauseSource(ctx.epoch)) for n in sources))
        mark(Phase.PAUSE)
        self.phase = Phase.DRAIN
        yield from self._wait(
            lambda: all(n in self.drained or n in self.finished_tasks
                        for n in self.dep.task_names()),
            Phase.DRAIN, [n for n in self.dep.task_names() if n not in self.finished_tasks])
        mark(Phase.DRAIN)
        old_tasks = self._tasks()
        snaps = yield from self._send(Phase.SNAPSHOT, (Call(n, SnapshotKeyGroups())
                                                       for n in old_tasks))
        groups = {kg: data for snap in snaps for kg, data in snap.groups}
        mark(Phase.SNAPSHOT)
        yield from self._send(Phase.STOP, (Call(n, StopTask()) for n in old_tasks))
        self.phase = Phase.STOP
        yield RemoveTasks(old_tasks)
        yield ReleaseReplicas(vertex, clear=True)  # every task restarts: replicas go too
        self.finished_tasks.difference_update(old_tasks)
        mark(Phase.STOP)
        self.phase = Phase.DEPLOY
        gen = self.dep.generation + 1
        names = tuple(task_name(ctx.job_id, vertex, i, gen)
                      for i in range(self.request.parallelism))
        new_assignment = self.plan.new_assignment or None
        self.dep = self.dep.with_vertex(vertex, names, new_assignment, gen)
        yield UpdateVertex(vertex, names, new_assignment, gen)
        yield CreateTasks(vertex, names, self.dep)
        mark(Phase.DEPLOY)
        per_task: dict[int, list[tuple[int, bytes]]] = {}
        for kg, data in groups.items():
            per_task.setdefault(self.plan.new_assignment[kg], []).append((kg, data))
        yield from self._send(Phase.INSTALL, (Call(names[i], InstallKeyGroups(tuple(items)))
                                              for i, items in per_task.items()))
        self.moved = len(self.plan.moved)
        self.bytes_moved = sum(len(d) for d in groups.values())
        mark(Phase.INSTALL)
        msgs = connect_messages(self.dep, ctx.channel_ids)
        # receivers first, so a channel exists before anything is sent on it
        order = [t for v in reversed(self.dep.plan.vertices) for t in self.dep.tasks[v.name]]
        yield from self._send(Phase.CONNECT, (
            Call(t, msgs[t], tuple(c.target for e in msgs[t].outputs for c in e.channels))
            for t in order))
        resume = {p: st for t in old_tasks for p, st in self.offsets.get(t, {}).items()}
        yield from self._send(Phase.CONNECT, (Call(n, start_message(self.dep, vertex, i, resume))
                                              for i, n in enumerate(names)))
        mark(Phase.CONNECT)
        yield from self._send(Phase.RESUME, (Call(n, Resume()) for n in self.dep.task_names()
                                             if n not in self.finished_tasks))
        mark(Phase.RESUME)
        done = clock.now()
        return RescaleReport(
            vertex, str(RescaleProtocol.STOP_RESTART), self.plan.old_parallelism,
            self.request.parallelism, self.requested_at, done, done - self.requested_at,
            self.moved, self.bytes_moved, tuple(phases), tuple(sorted(self.offsets.items())),
            key_groups_planned=self.moved)


# ---------------------------------------------------------------------- source rescale

#: ``RescaleReport.protocol`` of a live source rescale
HANDOVER = "handover"


class SourceRescale(RescaleCoordinator):
    """A live rescale of a source: its partitions are handed over to a new set of source
    tasks with their resume states, while every other task runs on.

    1. *deploy*: the new tasks (generation + 1, ``parallelism`` of them) are created and
       connected; every receiver of the source adds their channels, to be read only once
       all of the old tasks' channels to it have ended (``AddInputs.after``);
    2. *release*: each old task stops reading, ends its outputs behind everything it
       emitted and replies with its partitions' resume states (``ReleaseSource``);
    3. *start*: the new tasks start with the partitions ``j % parallelism == i`` at those
       states; the old tasks go.

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
        # 2. the old tasks stop where they are and say where that is
        replies = yield from self._send(Phase.RELEASE, (Call(t, ReleaseSource())
                                                        for t in old_tasks))
        offsets = {r.task: r.offsets for r in replies}
        resume = {p: st for states in offsets.values() for p, st in states.items()}
        mark(Phase.RELEASE)
        # 3. the new tasks take over
        self.dep = new_dep
        yield UpdateVertex(vertex, names, None, gen)
        yield from self._send(Phase.RESUME, (Call(n, start_message(new_dep, vertex, i, resume))
                                             for i, n in enumerate(names)))
        mark(Phase.RESUME)
        yield RemoveTasks(old_tasks)
        self.finished_tasks.difference_update(old_tasks)
        mark(Phase.REMOVE)
        done = clock.now()
        return RescaleReport(
            vertex, HANDOVER, len(old_tasks), len(names), self.requested_at, done,
            done - self.requested_at, 0, 0, tuple(phases), tuple(sorted(offsets.items())))


def coordinator_for(request: RescaleRequest, ctx: RescaleContext,
                    clock: Clock) -> RescaleCoordinator:
    """The coordinator that runs ``request``'s protocol: a source's live rescale hands
    its partitions over (``SourceRescale``) whatever live protocol was named."""
    if PROTOCOLS[request.protocol].live:
        if ctx.deployment.plan.vertex(request.operator).is_source:
            return SourceRescale(request, ctx, clock)
        return LiveRescale(request, ctx, clock)
    return StopRestartRescale(request, ctx, clock)
