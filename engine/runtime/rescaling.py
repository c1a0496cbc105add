"""Rescales on the JobMaster: validation, exclusion, and the executor of coordinator commands.

Why here: the coordinator (``migration.coordinator``) decides every step of a rescale as
commands; this is the only code that applies them to Ray actors. It runs commands in the
order given, hands each result back, forwards every task report to the running
coordinators, and enforces the timeouts.

Guarantees: every control call and every wait of a rescale is bounded by
``JobConfig.rescale_timeout_s``; a request refused or failing before the job changed
raises ``RescaleRefused`` with the job untouched (holds released), naming the phase and
the tasks that did not answer, at most ``control_timeout_s / 2`` (asking the tasks named
what they were doing) plus ``control_timeout_s / 2`` (releasing the holds: a silent task
gets its release when it wakes up) after the step timed out, so a rescale held up by a
stuck task is refused within about ``rescale_timeout_s + control_timeout_s``; ``ticks`` counts the commands run, the
driver's sign that a long rescale advances; a failure after that
fails the job naming the rescale and its phase; a newer live request for an operator
supersedes the running one (which finishes its running subscales and starts no more);
live rescales of different operators may run at once unless they exchange records (one
feeds the other: each coordinator wires its new tasks to the deployment it started from,
so a neighbour's new or removed tasks would be missed; the later request is refused); a
rescale that takes forward partners along (``PhysicalPlan.check_rescale``) occupies them
too (their neighbours count, their locks are taken, ``running_operators`` names them); a
stop-restart, and a rescale of a source (its partitions handed over), exclude all others.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections import deque
from typing import Any, Protocol

import ray

from engine.checkpoints.metadata import CheckpointKind
from engine.checkpoints.restore import plan_restore
from engine.control.arbiter import Action, ActionKind, Verdict
from engine.control.reconfiguration import without_cpu_wait
from engine.dataflow.config import check_count
from engine.dataflow.deployment import ChannelIds, Deployment
from engine.errors import (
    CheckpointFailed,
    JobFailedError,
    ReflowError,
    RescaleRefused,
    RescaleTimeout,
)
from engine.names import JobState
from engine.observability.rates import MetricsWindow
from engine.runtime.arbitration import Arbitration
from engine.runtime.checkpointing import Checkpointing
from engine.runtime.failures import reflow_error_in, unwrap
from engine.runtime.gcs import GcsProbe
from engine.runtime.headroom import CpuHeadroom
from engine.runtime.ports import JobPort
from engine.runtime.recovery import JobRestarted, Recovery
from engine.runtime.replicas import ReplicaKeeper
from engine.wire.messages import (
    DescribeTask,
    TaskState,
    decode_message,
    encode_message,
)
from migration.assignment import AssignmentSpec
from migration.coordinator import (
    AwaitReports,
    Command,
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
from migration.protocols import PROTOCOLS, RescaleProtocol
from migration.report import RescaleReport
from migration.requests import validate_request

log = logging.getLogger(__name__)

#: seconds of metrics a rescale's capacity is measured over (DS2's default window)
CAPACITY_WINDOW_S = 10.0


def operator_capacity(window: MetricsWindow | None, vertex: str) -> float | None:
    """Records/s ``vertex`` sustains at its parallelism over ``window``: DS2's
    ``OperatorRates.capacity`` (the observed input rate over the busiest task's utilisation)
    with the tasks' CPU wait taken out of their useful time (``without_cpu_wait``, as DS2
    reads it); None without a window, or without input or work in it.

    The wait is the whole process's (its other threads' too) over the window: where it
    leaves a busiest task no useful time, most of it fell outside the operator's work (a
    lightly loaded task on a busy machine waits more than it works), and the undiscounted
    capacity stands."""
    rates = None if window is None else window.operator(vertex)
    if rates is None:
        return None
    discounted = without_cpu_wait(rates).capacity
    return rates.capacity if discounted is None else discounted


def what_needs_the_job(req: RescaleRequest) -> str:
    """How a rescale that runs alone is called in a refusal."""
    if req.protocol == RescaleProtocol.STOP_RESTART:
        return "stop-restart"
    return f"rescale of source {req.operator!r}"


class RescalePort(JobPort, Protocol):
    """What rescales ask of the JobMaster beyond ``JobPort``."""

    @property
    def ids(self) -> ChannelIds: ...

    @property
    def subscale_ids(self) -> SubscaleIds: ...

    async def create_task_actor(self, vertex: str, name: str, dep: Deployment,
                                node: str | None = None, index: int | None = None) -> None: ...

    def remove_task(self, name: str) -> None:
        """Kill task ``name``'s actor and forget it."""
        ...

    def update_deployment(self, dep: Deployment) -> None:
        """The job runs ``dep`` from now on (a rescale step recorded it)."""
        ...

    def kill_tasks(self) -> None: ...

    async def recycle_tasks(self) -> None:
        """Stop every task for a redeploy (its process reused when the job says so)."""
        ...

    def refill_standby_later(self) -> None: ...

    async def maybe_finish(self) -> None: ...

    def alive_nodes(self) -> list[str]: ...

    async def placement(self, operator: str) -> list[str]: ...

    def last_answered(self, task: str) -> float:
        """When ``task`` last answered anything (monotonic seconds)."""
        ...

    def name_in_error(self, error: str) -> None:
        """The job's error says ``error`` (it failed already; a rescale adds its name)."""
        ...

    def rescale_finished(self, report: RescaleReport, started: float, ended: float,
                         by: str) -> None:
        """A rescale ended: the controllers measure what it cost."""
        ...

    def metrics_window(self, seconds: float) -> MetricsWindow | None:
        """The job's latest metrics window of up to ``seconds`` since its last rescale ended
        (None before two metrics polls)."""
        ...


class Rescaler:
    """The JobMaster's rescales: at most one per operator, a stop-restart alone (as the
    job's arbiter decides: ``engine.control.arbiter``)."""

    def __init__(self, port: RescalePort, arbitration: Arbitration, recovery: Recovery,
                 replicas: ReplicaKeeper, checkpoints: Checkpointing) -> None:
        self.port = port
        self.arbitration = arbitration
        self.recovery = recovery
        self.replicas = replicas
        self.checkpoints = checkpoints
        self._coordinators: dict[str, RescaleCoordinator] = {}  # vertex -> its rescale
        self._headroom: dict[str, CpuHeadroom] = {}  # vertex -> its rescale's CPU meter
        self._inbox: dict[str, deque[Command]] = {}
        self._broken: dict[str, Exception] = {}  # vertex -> what its coordinator raised
        self.ticks = 0  # commands run, over all rescales of the job
        self.gcs = GcsProbe()
        # checkpoints and rescales exclude each other: the arbiter hears what is in flight
        self._changes: dict[str, DataflowChanges] = {}  # vertex -> what it has in flight
        self._epochs: dict[str, int] = {}  # vertex -> the restart epoch its rescale began in

    @property
    def running(self) -> bool:
        """A rescale, a placement or a change of logic runs."""
        return self.arbitration.core.rescaling

    def _sync(self, vertex: str) -> None:
        """Tell the arbiter whether the rescale of ``vertex`` has a change in flight."""
        coord, changes = self._coordinators.get(vertex), self._changes.get(vertex)
        quiet = True if coord is None or changes is None else changes.quiet(coord.phase)
        self.arbitration.event(lambda a: a.rescale_changes(vertex, quiet))

    def restarted(self) -> None:
        """The job restarts (its tasks were killed): every running rescale gives up what it
        was doing and tries again once the job runs (``JobRestarted``)."""
        for vertex in self._coordinators:
            self._broken[vertex] = JobRestarted(f"the job restarted during the rescale of "
                                                f"{vertex!r}")
        self._changes.clear()

    def _still(self, vertex: str) -> None:
        """Raise when the rescale of ``vertex`` must give up: the job restarted under it
        (``JobRestarted``) or is no longer running."""
        record = self.port.record
        if record.epoch != self._epochs.get(vertex, record.epoch):
            raise JobRestarted(f"the job restarted during the rescale of {vertex!r}")
        if record.status == JobState.RESTARTING:
            raise JobRestarted(f"the job restarts during the rescale of {vertex!r}")
        if not record.status.active:
            raise JobFailedError(record.error or f"job {self.port.job_id} is {record.status}")

    def busy_neighbour(self, vertex: str) -> str | None:
        """A vertex that exchanges records with ``vertex`` or its forward partners (an
        input or output edge, through stateless operators: ``PhysicalPlan.neighbours``)
        and has a rescale running, else None."""
        near = self.port.dep.plan.neighbours(vertex)
        return next((v for v in sorted(near) if v in self._coordinators), None)

    def _refuse_beside_neighbour(self, vertex: str) -> None:
        busy = self.busy_neighbour(vertex)
        if busy is not None:
            raise RescaleRefused(
                f"a rescale of {busy!r}, which exchanges records with {vertex!r}, is running; "
                f"operators that feed each other rescale one at a time: try again after it",
                operator=vertex)

    @property
    def running_operators(self) -> frozenset[str]:
        """The vertices with a rescale running now, the forward partners a running rescale
        takes along included."""
        return frozenset(v for vertex, coord in self._coordinators.items()
                         for v in (vertex, *coord.partners))

    def on_report(self, msg: Any) -> None:
        """Every running coordinator sees every task report."""
        for changes in self._changes.values():
            changes.on_report(msg)
        for vertex, coord in list(self._coordinators.items()):
            try:
                self._inbox[vertex].extend(coord.on_report(msg))
            except Exception as exc:  # its executor raises it
                self._broken[vertex] = exc
            self._sync(vertex)

    # -- validation
    def validate(self, operator: str, parallelism: int | None, protocol: str,
                 assignment: tuple[int, ...] | None, planning: Any,
                 strategy: AssignmentSpec | None = None, without: Any = ()) -> RescaleRequest:
        """The request as a value, or ``RescaleRefused`` saying what to change.
        ``parallelism`` None: the operator's current one (a rebalance by ``strategy``).
        What depends on the running job is checked here, the rest by the pure
        ``migration.requests.validate_request`` (forward edges kept included)."""
        p = self.port
        status = p.record.status
        if status != JobState.RUNNING:
            raise RescaleRefused(f"job {p.job_id} is {status}, not running; nothing to rescale")
        if self.arbitration.core.finishing:
            raise RescaleRefused(f"job {p.job_id} is finishing (its input ended everywhere); "
                                 "there is nothing left to rescale")
        return validate_request(p.dep.plan, operator, parallelism, protocol, assignment,
                                planning, strategy, live_rescaling=p.config.live_rescaling,
                                without=without)

    # -- entry
    async def rescale(self, operator: str, parallelism: int | None, protocol: str,
                      assignment: tuple[int, ...] | None, planning: Any,
                      by: str = "handle", strategy: AssignmentSpec | None = None,
                      without: Any = ()) -> RescaleReport:
        """Run the rescale (see the module doc); ``by``: who asked, for the records of what
        rescales cost (``engine.runtime.controller_runner``); ``strategy``: how to choose the
        target assignment (``parallelism`` None: the current one)."""
        started = self.port.clock.monotonic()
        report = await self._rescale_retried(operator, parallelism, protocol, assignment,
                                             planning, strategy, without)
        self.port.rescale_finished(report, started, self.port.clock.monotonic(), by)
        return report

    async def _rescale_retried(self, operator: str, parallelism: int | None, protocol: str,
                               assignment: tuple[int, ...] | None, planning: Any,
                               strategy: AssignmentSpec | None, without: Any = ()
                               ) -> RescaleReport:
        """Run the request; when the job restarts from a checkpoint during it (a task
        died), what it did is gone with the tasks, so it runs again, planned from the
        restored assignment, once the job runs: it returns when the operator runs as asked
        (or raises the job's failure when the restart strategy gave up). The report of a
        request the job restarted under says so (``restarts``) and keeps the parallelism
        the request began from and its time (like Flink, whose rescale by restart reports
        the job running at the new parallelism, not an error): the last attempt alone
        could read "4 -> 4" for a 2 -> 4 request the restart had half done."""
        vertex = next((v for v in self.port.dep.plan.vertices if v.name == operator), None)
        before = vertex.parallelism if vertex is not None else None
        requested_at, restarts = self.port.clock.now(), 0
        while True:
            if self.port.record.status == JobState.RESTARTING:
                await self.recovery.wait_running(self.recovery.epoch)
            epoch = self.recovery.epoch
            try:
                report = await self._rescale(operator, parallelism, protocol, assignment,
                                             planning, strategy, without)
            except JobRestarted:
                restarts += 1
                await self.recovery.wait_running(epoch)
                continue
            if not restarts:
                return report
            return dataclasses.replace(
                report, restarts=restarts, requested_at=requested_at,
                duration_s=report.completed_at - requested_at,
                old_parallelism=report.old_parallelism if before is None else before)

    async def _rescale(self, operator: str, parallelism: int | None, protocol: str,
                       assignment: tuple[int, ...] | None, planning: Any,
                       strategy: AssignmentSpec | None = None, without: Any = ()
                       ) -> RescaleReport:
        p = self.port
        await self._refuse_without_gcs(operator)
        req = self.validate(operator, parallelism, protocol, assignment, planning, strategy,
                            without)
        if PROTOCOLS[req.protocol].live and not p.dep.plan.vertex(req.operator).is_source:
            self._refuse_beside_neighbour(req.operator)  # before superseding anything
            running = self._coordinators.get(req.operator)
            if running is not None:
                running.supersede()
            # the vertex and its forward partners (a rescale may take them along: no change
            # of logic or replica refresh runs on them meanwhile)
            group = frozenset(p.dep.plan.forward_group(req.operator)) or {req.operator}
            action = Action(ActionKind.RESCALE, frozenset(group))
        else:  # stop-restart, and a source's rescale: the job to itself
            action = Action(ActionKind.EXCLUSIVE_RESCALE,
                            stop_restart=req.protocol == RescaleProtocol.STOP_RESTART,
                            label=what_needs_the_job(req))
        d = await self.arbitration.acquire(action)
        if d.verdict is not Verdict.RUN:
            raise RescaleRefused(d.reason)
        try:
            req = self.validate(operator, parallelism, protocol, assignment, planning,
                                strategy, without)
            return await self._execute(req)
        finally:
            self.arbitration.release(d.ticket)
            p.refill_standby_later()
            await p.maybe_finish()

    async def place(self, operator: str, task_index: int, node: str, protocol: str,
                    by: str = "handle") -> RescaleReport:
        """Move task ``task_index`` of keyed ``operator`` to Ray node ``node`` live
        (``migration.coordinator.Placement``). Refused (job untouched) when the operator is
        not keyed, the task or node does not exist, the task runs there already, or a
        rescale of the operator runs (a placement never supersedes one)."""
        p = self.port
        started = p.clock.monotonic()
        req = await self._placement(operator, task_index, node, protocol)
        d = await self.arbitration.acquire(Action(ActionKind.PLACEMENT,
                                                  frozenset({req.operator})))
        if d.verdict is not Verdict.RUN:
            raise RescaleRefused(d.reason)
        try:
            req = await self._placement(operator, task_index, node, protocol)  # still valid
            report = await self._execute(req)
        finally:
            self.arbitration.release(d.ticket)
            await p.maybe_finish()
        p.rescale_finished(report, started, p.clock.monotonic(), by)
        return report

    async def _placement(self, operator: str, task_index: int, node: str,
                         protocol: str) -> RescaleRequest:
        p = self.port
        await self._refuse_without_gcs(operator)
        n = len(p.dep.tasks.get(operator, ())) or 1  # validate names what is wrong
        req = self.validate(operator, n, protocol, None, None)
        v = p.dep.plan.vertex(req.operator)
        if not v.keyed or not PROTOCOLS[req.protocol].live:
            raise RescaleRefused(f"operator {operator!r} is not keyed, or {protocol!r} is not "
                                 "a live protocol: placement moves a task with its key groups, "
                                 "live (a stateless operator holds none: rescale it instead)",
                                 operator=operator)
        index = check_count(f"placement of {operator!r}: task_index", task_index, 0,
                            error=RescaleRefused)
        # the replacement runs beside the task it replaces until its groups moved: refused
        # when forward partners would need one more task too
        p.dep.plan.check_placement(req.operator)
        if index >= n:
            raise RescaleRefused(f"operator {operator!r} has no task {index}; its tasks are "
                                 f"0..{n - 1}", operator=operator)
        if not isinstance(node, str) or node not in p.alive_nodes():
            raise RescaleRefused(f"no alive Ray node {node!r}; alive: "
                                 f"{', '.join(p.alive_nodes())}", operator=operator)
        if operator in self._coordinators:
            raise RescaleRefused(f"a rescale of {operator!r} is running; a placement does not "
                                 "supersede it: try again after it", operator=operator)
        where = (await p.placement(operator))[index]
        if where == node:
            raise RescaleRefused(f"task {index} of {operator!r} runs on node {node} already",
                                 operator=operator)
        return dataclasses.replace(req, place=(index, node),
                                   reason=f"place task {index} on node {node}")

    async def _refuse_without_gcs(self, operator: str) -> None:
        """Refused (job untouched) while Ray's GCS does not answer: a rescale creates named
        task actors and reads the cluster's nodes and CPUs, calls that would wait for the
        GCS on this event loop and freeze the JobMaster (``engine.runtime.gcs``)."""
        seconds = self.port.deadlines.task_poll_s
        if not await self.gcs.answers(seconds):
            raise RescaleRefused(
                f"rescale of {operator!r}: Ray's GCS did not answer within {seconds} s (the "
                "head is restarting, or overloaded); a rescale creates actors, which needs "
                "it: retry when the GCS is back", operator=operator)

    def _max_subscales(self) -> int:
        """Subscales of one operator at once: the configured number, else as many as the
        cluster's CPUs."""
        if self.port.config.drrs_max_subscales is not None:
            return self.port.config.drrs_max_subscales
        return max(1, int(ray.cluster_resources().get("CPU", 1)))

    # -- the executor
    async def _execute(self, req: RescaleRequest) -> RescaleReport:
        p, vertex = self.port, req.operator
        self._refuse_beside_neighbour(vertex)
        ctx = RescaleContext(
            p.job_id, p.dep, p.config, p.ids, p.subscale_ids, self.replicas.of(vertex),
            vertex in self.replicas.policies, self._max_subscales(), frozenset(p.finished),
            operator_capacity(p.metrics_window(CAPACITY_WINDOW_S), vertex))
        coord = coordinator_for(req, ctx, p.clock)
        self._coordinators[vertex] = coord
        self._epochs[vertex] = self.recovery.epoch
        changes = self._changes[vertex] = DataflowChanges()
        self._headroom[vertex] = CpuHeadroom()
        p.collector.rescale_started[vertex] = p.clock.monotonic()
        inbox: deque[Command] = deque()
        self._inbox[vertex] = inbox
        try:
            inbox.extend(coord.start())
            self._sync(vertex)
            while not coord.done:
                p.collector.rescales[vertex] = coord.progress()
                if vertex in self._broken:
                    raise self._broken.pop(vertex)
                if not inbox:
                    raise RuntimeError("the coordinator gave no command and is not done")
                cmd = inbox.popleft()
                self.ticks += 1
                self._pace(coord)
                if isinstance(cmd, AwaitReports):
                    await self._await_reports(coord, cmd)
                    continue
                if changes.gates(cmd):  # not while a checkpoint is pending or due
                    await self._gate(vertex)
                changes.on_command(cmd)
                self._sync(vertex)
                inbox.extend(coord.on_result(cmd, await self._run(cmd)))
                self._sync(vertex)
        except (RescaleRefused, JobRestarted):
            raise
        except Exception as exc:
            await self._failed(coord, exc)
        finally:
            self._coordinators.pop(vertex, None)
            self._headroom.pop(vertex, None)
            self._inbox.pop(vertex, None)
            self._broken.pop(vertex, None)
            self._changes.pop(vertex, None)
            self._epochs.pop(vertex, None)
            self.arbitration.event(lambda a: a.rescale_changes(vertex, None))
        p.collector.rescales[vertex] = coord.progress()
        p.collector.rescales_total[vertex] = p.collector.rescales_total.get(vertex, 0) + 1
        return coord.report()

    async def _gate(self, vertex: str) -> None:
        """Wait until the arbiter lets the rescale of ``vertex`` start a change (no
        checkpoint pending or due); raise when it must give up instead (``_still``)."""
        self._still(vertex)
        d = await self.arbitration.gate(vertex)
        self._still(vertex)
        if d.verdict is not Verdict.RUN:
            raise JobRestarted(f"the rescale of {vertex!r} may not go on: {d.reason}")

    def _pace(self, coord: RescaleCoordinator) -> None:
        """Hand the coordinator the machine's idle cores about every half second."""
        meter = self._headroom.get(coord.vertex)
        idle = None if meter is None else meter.sample()
        if idle is not None:
            coord.on_headroom(idle)

    async def _await_reports(self, coord: RescaleCoordinator, cmd: AwaitReports) -> None:
        """Until a report gave the coordinator its next command (``on_report`` puts it in
        the inbox), the job failed, or ``cmd.timeout_s`` passed (``on_timeout`` raises)."""
        p = self.port
        inbox = self._inbox[coord.vertex]
        deadline = p.clock.monotonic() + cmd.timeout_s
        while not inbox and not coord.done:
            broken = self._broken.pop(coord.vertex, None)
            if broken is not None:
                raise broken
            self._still(coord.vertex)
            left = deadline - p.clock.monotonic()
            if left <= 0:
                coord.on_timeout()
            self._pace(coord)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(p.changed().wait(), max(0.0, min(0.5, left)))

    async def _run(self, cmd: Command, timeout: float | None = None) -> Any:
        """Execute one coordinator command; its result goes back to the coordinator.
        ``timeout``: the bound of a ``SendControl`` (default ``rescale_timeout_s``)."""
        p = self.port
        match cmd:
            case SendControl(calls=calls, phase=phase):
                limit = p.config.rescale_timeout_s if timeout is None else timeout
                futs = [asyncio.ensure_future(p.call(c.task, c.message, c.introduce))
                        for c in calls]
                _, pending = await asyncio.wait(futs, timeout=limit)
                if pending:
                    for f in pending:
                        f.cancel()
                    silent = tuple(c.task for c, f in zip(calls, futs, strict=True)
                                   if f in pending)
                    raise RescaleTimeout(
                        f"no answer within {limit:g} s in phase {phase} from "
                        f"{', '.join(silent)} (a task stuck in a user function, or overloaded: "
                        "see JobHandle.status().unresponsive; retry once it answers, or "
                        "raise JobConfig.rescale_timeout_s)", str(phase), silent)
                for f in futs:  # a task's own error (e.g. an open() raised) as itself
                    exc = f.exception()
                    mine = None if exc is None else reflow_error_in(exc)
                    if mine is not None:
                        raise mine from exc
                return [f.result() for f in futs]
            case CreateTasks(vertex=vertex, names=names, deployment=dep, nodes=nodes,
                             indices=indices):
                at, index = dict(nodes), dict(indices)
                for name in names:
                    await p.create_task_actor(vertex, name, dep, at.get(name), index.get(name))
            case RemoveTasks(names=names):
                for n in names:
                    p.remove_task(n)
            case UpdateVertex():
                p.update_deployment(cmd.apply(p.dep))
            case Sleep(seconds=s):
                await asyncio.sleep(s)
            case SubscaleCompleted(vertex=vertex, key_groups=kgs, new_owner=owner, seconds=s):
                p.collector.subscale_seconds.setdefault(vertex, []).append(s)
                self.replicas.forget(vertex, kgs, keep_at=owner)
            case ReleaseReplicas(vertex=vertex, gone=gone, clear=clear):
                await self.replicas.release(vertex, gone, clear)
            case EnableReplication(vertex=vertex, policy=policy, hot_fraction=frac):
                self.replicas.enable(vertex, policy, frac)
            case TakeSavepoint(stop=stop):
                return await self.checkpoints.take(CheckpointKind.CHECKPOINT, stop=stop,
                                                   exclusive=True)
            case RestoreJob(checkpoint=meta, parallelism=parallelism, assignments=assignments):
                plan = p.record.graph_plan
                changed: dict[str, int] = {}
                for v in plan.vertices:
                    wanted = parallelism.get(v.name) or meta.vertex(v.name).parallelism
                    if wanted != v.parallelism:
                        changed[v.name] = wanted
                plan = plan.with_parallelism(changed)  # forward edges keep equal sides
                restore = plan_restore(meta, plan, p.job_id, p.record.next_generation,
                                       assignments=assignments, partitions=p.dep.partitions)
                await p.recycle_tasks()
                self.replicas.reset()
                await self.recovery.deploy(restore.deployment, restore.tasks)
                return restore.deployment
            case _:
                raise TypeError(f"unknown coordinator command {cmd!r}")
        return None

    async def _failed(self, coord: RescaleCoordinator, exc: Exception) -> None:
        """Refuse the rescale when nothing changed yet (the job goes on); otherwise fail the
        job naming the rescale and its phase. Always raises."""
        p, req = self.port, coord.request
        if _died(exc) and p.record.status == JobState.RUNNING:  # a task died: the strategy decides
            await p.fail(f"a task died during the rescale of {req.operator!r}: "
                         f"{type(unwrap(exc)).__name__}: {unwrap(exc)}")
        epoch = p.record.epoch
        if (p.record.status == JobState.RESTARTING
                or epoch != self._epochs.get(req.operator, epoch)):
            raise JobRestarted(f"the job restarted during the rescale of {req.operator!r}")
        what = f"rescale of {req.operator!r} to parallelism {req.parallelism} ({req.protocol})"
        tasks: tuple[str, ...] = ()
        if isinstance(exc, RescaleTimeout) and exc.tasks:
            tasks = exc.tasks
            exc = RescaleTimeout(f"{exc}. Tasks: {await self._describe(set(exc.tasks))}",
                                 exc.phase, exc.tasks)
        elif isinstance(exc, JobFailedError) and exc.task:  # e.g. a new task's open() raised
            tasks = (exc.task,)
        if not isinstance(exc, ReflowError):  # reflow's own bug: keep where it happened
            log.error("job %s: %s failed in phase %s", p.job_id, what, coord.phase,
                      exc_info=exc)
        cause = (f"{type(exc).__name__}: {exc}" if isinstance(exc, ReflowError)
                 else f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        if not coord.committed and p.record.status == JobState.RUNNING:
            for cmd in coord.release_commands():
                with contextlib.suppress(Exception):
                    await self._run(cmd, timeout=p.deadlines.task_poll_s)
            raise RescaleRefused(f"{what} refused in phase {coord.phase} before anything "
                                 f"changed; the job goes on unchanged: {cause}",
                                 operator=req.operator, phase=str(coord.phase),
                                 tasks=tasks) from exc
        msg = f"{what} failed in phase {coord.phase}: {cause}"
        if p.record.status != JobState.FAILED:
            await p.fail(msg)
        elif "rescale of" not in p.record.error:  # e.g. a task died: name the rescale too
            p.name_in_error(f"{p.record.error} (during the {what}, phase {coord.phase})")
        raise JobFailedError(p.record.error or msg, operator=req.operator, phase=str(coord.phase),
                             cause=cause) from exc

    async def _describe(self, names: set[str]) -> str:
        """Each task's own account of its migrations (a stuck rescale's error message),
        all asked at once within ``Deadlines.task_poll_s``; a task that does not answer is
        named with the seconds since it last answered anything."""
        p = self.port
        order = sorted(n for n in names if n in p.handles)

        async def ask(n: str) -> TaskState:
            return decode_message(
                await p.handles[n].control.remote(encode_message(DescribeTask())))

        replies = await asyncio.gather(
            *(asyncio.wait_for(ask(n), p.deadlines.task_poll_s) for n in order),
            return_exceptions=True)
        out = []
        for n, st in zip(order, replies, strict=True):
            if isinstance(st, BaseException):  # a dead or hung task: the error is the point
                silent = p.clock.monotonic() - p.last_answered(n)
                out.append(f"{n} [no answer ({type(st).__name__}); last answered "
                           f"{silent:.1f} s ago: stuck in user code, overloaded or dead]")
            else:
                out.append(f"{n} [{st.status}{', input ended' if st.input_ended else ''}] "
                           f"{st.detail}")
        return " | ".join(out)


def _died(exc: BaseException) -> bool:
    """Whether a rescale step failed because a task actor died (or a savepoint failed for
    the job's failure)."""
    from ray.exceptions import RayActorError

    inner = unwrap(exc)
    return isinstance(inner, RayActorError) or isinstance(exc, CheckpointFailed)
