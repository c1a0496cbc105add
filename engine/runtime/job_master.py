"""The JobMaster actor: deploys a job, watches its tasks, serves the handle, runs rescales.

Why an actor: one place owns the job's deployment (which task runs what, which key groups
each owns) and its life; the driver's ``JobHandle`` and the tasks' reports talk to it.

Rescales are decided and sequenced by a sans-IO coordinator (``migration.coordinator``);
this class only executes its commands (control calls, creating and removing task actors,
deployment updates, waits with the config's ``rescale_timeout_s``) and feeds it the tasks'
reports. Guarantees: a request refused before anything changed (validation, planning, a
timeout before the first change) leaves the job untouched and raises ``RescaleRefused``;
a failure after that fails the job with the phase named; a newer request for the same
operator supersedes the running one; a stop-restart excludes every other rescale.

The job's state is one value, ``engine.control.job_state.JobRecord``, which this class
alone writes; its helpers (rescales, recovery, checkpoints, controllers, changes of logic,
replicas, the watch) hold a narrow port (``engine.runtime.ports.JobPort`` and each
helper's extension of it, all implemented here) instead of the JobMaster, and what may run
together is decided by the job's arbiter (``engine.control.arbiter``, its futures in
``engine.runtime.arbitration``).

The driver's calls never wait for a task without a deadline (``engine.runtime.deadlines``):
a task that does not answer a metrics poll in time is reported as unresponsive
(``engine.runtime.health``), with the seconds since it last answered, in ``status``,
``metrics`` and the ``reflow_task_unresponsive_seconds`` gauge; warm standby actors are
pinged at every poll and before one is handed out, and dead ones replaced. Deploying waits
at most ``Deadlines.deploy_s``; a task that cannot start fails ``start`` with its error
(``UserFunctionError`` naming the operator for an ``open()`` that raised).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import warnings
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from engine.checkpoints.job_store import JobRecordStore
from engine.checkpoints.metadata import CheckpointKind, CheckpointMetadata
from engine.checkpoints.store import complete_checkpoints, read_metadata
from engine.control.arbiter import Action, ActionKind, Arbiter, Verdict
from engine.control.durable import (
    changed_logic,
    controllers_of,
    dump_user_code,
    durable_of,
    job_record_of,
    running_of,
)
from engine.control.failover import (
    RESTART_ACTIONS,
    FailoverDecision,
    FailoverPath,
    decide_failover,
)
from engine.control.job_state import JobRecord
from engine.control.reconfiguration import DecisionRecord, RescaleRecord
from engine.dataflow import graph as g
from engine.dataflow.config import JobConfig
from engine.dataflow.deployment import (
    ChannelIds,
    Deployment,
    source_partitions,
)
from engine.dataflow.guarantees import sink_guarantees
from engine.dataflow.physical import PhysicalPlan
from engine.errors import (
    CheckpointFailed,
    ControllerError,
    FailurePhase,
    JobFailedError,
    JobNotRunningError,
    JobRecordUnreadable,
    RescaleRefused,
    RestoreError,
    StaleJobMaster,
)
from engine.names import JobState
from engine.observability.metrics import JobCollector, MetricsEndpoint
from engine.observability.rates import MetricsWindow
from engine.runtime.arbitration import Arbitration
from engine.runtime.checkpointing import Checkpointing
from engine.runtime.controller_runner import ControllerRunner
from engine.runtime.deadlines import Deadlines
from engine.runtime.failover import RecordKeeper, ask_tasks, describe, kill_leftovers
from engine.runtime.failures import actor_death, reflow_error_in
from engine.runtime.health import StandbyPool
from engine.runtime.logic import LogicChanger
from engine.runtime.recovery import Recovery
from engine.runtime.replicas import ReplicaKeeper
from engine.runtime.rescaling import Rescaler
from engine.runtime.task_actor import RemoteTask
from engine.runtime.watch import Watch
from engine.task.core import TaskSpec
from engine.time.clock import SystemClock
from engine.wire.codec import pack_exact
from engine.wire.messages import (
    CheckpointAborted,
    DropReplicas,
    JobStatus,
    Resume,
    StopTask,
    TaskFailed,
    TaskFinished,
    decode_message,
    encode_message,
)
from migration.assignment import AssignmentSpec
from migration.coordinator import SubscaleIds
from migration.report import RescaleReport

NAMESPACE = "reflow"
EARLY_REPORTS = 10_000  # reports kept while a takeover runs

log = logging.getLogger(__name__)


def _restarted_by_ray() -> bool:
    """Whether Ray restarted this actor (its process died); Ray's property reads a
    deprecated attribute of its own, whose warning says nothing to a user."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)


class JobMaster:
    """Deploys the job, runs rescales, watches tasks, serves metrics; the one writer of
    the job's ``JobRecord`` and the implementation of its helpers' ports."""

    def __init__(self, graph: g.JobGraph, config: JobConfig, job_id: str,
                 restore_from: str | None = None,
                 allow_non_restored_state: bool = False, detached: bool = False,
                 takeover: bool = False) -> None:
        """``detached``: the job outlives its driver; its record is kept durable and a
        JobMaster that Ray restarted (or one created with ``takeover``, which fences the
        JobMaster before it) takes the job over (``engine.runtime.failover``)."""
        self.config = config
        self.detached = detached
        self.job_id = job_id
        self.restore_from = restore_from
        self.allow_non_restored_state = allow_non_restored_state
        self.sink_guarantees = sink_guarantees(graph, config, restoring=restore_from is not None)
        self.clock = SystemClock()
        self.deadlines = Deadlines.of(config)
        self.pool = StandbyPool(f"{job_id}/standby", config.warm_standby_tasks,
                                self._new_standby, lambda a: a.ping.remote(), ray.kill,
                                self.deadlines.task_poll_s)
        self.record = JobRecord.initial(job_id, graph)  # written by this class alone
        self.arbitration = Arbitration(Arbiter(), self._actions_changed)
        self.ids = ChannelIds()
        self.subscale_ids = SubscaleIds()
        self.handles: dict[str, Any] = {}
        self.failure: TaskFailed | None = None
        # a task that failed while the job was being deployed or restarted (the deploy
        # takes it up once the tasks run: dropping it left a job 'running' for ever)
        self.deferred_failure: TaskFailed | None = None
        self.finished: set[str] = set()
        self.collector = JobCollector(job_id, self.clock.monotonic)
        self.collector.rescale_timeout_s = config.rescale_timeout_s
        # counters start at 0 for every operator, so increase()/changes() see the first one
        self.collector.rescales_total = {v.name: 0 for v in self.record.plan.vertices}
        self.endpoint: MetricsEndpoint | None = None
        self.nodes: dict[str, str] = {}  # task name -> the Ray node it runs on, where known
        # a restart's recycled task actors ((vertex, task index) they ran, handle), and
        # whether a restart takes standby actors for the rest (recycle_tasks, create_task)
        self._recycled: list[tuple[tuple[str, int], Any]] = []
        self._reusing = False
        self.checkpointing = Checkpointing(self, self.arbitration)
        self.recovery = Recovery(self, self.arbitration, self.checkpointing)
        self.replicas = ReplicaKeeper(self, self.arbitration)
        self.rescaler = Rescaler(self, self.arbitration, self.recovery, self.replicas,
                                 self.checkpointing)
        self.controllers = ControllerRunner(self)
        self.logic = LogicChanger(self, self.arbitration)
        self.watch = Watch(self)
        self.health = self.watch.health
        self._changed = asyncio.Event()
        self._configuring: dict[str, Any] = {}
        self._background: list[asyncio.Task[None]] = []
        self._restart_task: asyncio.Future[None] | None = None
        self.store = JobRecordStore(self.checkpointing.root)
        self.keeper: RecordKeeper | None = (
            RecordKeeper(self.store, self._durable, self._on_fenced) if detached else None)
        self.built_graph = graph  # as Ray restarts this actor with: changes go on record
        self._logic_bytes: tuple[g.JobGraph | None, dict[str, bytes]] = (None, {})
        self._takeover: asyncio.Task[None] | None = None
        self.fenced: StaleJobMaster | None = None
        # reports that arrive while a takeover runs, handled once it ended (bounded: a
        # takeover takes seconds; beyond the bound the oldest go, as they did before)
        self._early_reports: list[bytes] | None = [] if self.keeper is not None else None
        if detached and (takeover or _restarted_by_ray()):
            # an async actor's constructor runs on its loop: the takeover starts at once
            self._takeover = asyncio.get_running_loop().create_task(self._take_over())

    # -- the job's record (every write goes through here)
    @property
    def dep(self) -> Deployment:
        return self.record.deployment

    @property
    def plan(self) -> PhysicalPlan:
        return self.record.plan

    @property
    def graph(self) -> g.JobGraph:
        return self.record.graph

    @property
    def state(self) -> JobState:
        return self.record.status

    @property
    def error(self) -> str:
        return self.record.error

    def _write(self, record: JobRecord) -> None:
        """The job's state is ``record`` from now on; the arbiter hears whether it runs,
        the durable record (a detached job's) is written soon."""
        was, self.record = self.record.status, record
        running = record.status == JobState.RUNNING
        if running != (was == JobState.RUNNING):
            self.arbitration.event(lambda a: a.job_running(running))
        self._persist()

    def _persist(self) -> None:
        if self.keeper is not None:
            self.keeper.changed()

    def _set_state(self, state: JobState, error: str | None = None) -> None:
        self._write(self.record.with_status(state, error))

    def _actions_changed(self) -> None:
        before = {r.action.kind for r in self.record.actions}
        self.record = self.record.with_actions(self.arbitration.core.running)
        granted = {r.action.kind for r in self.record.actions} - before
        if self.keeper is not None and granted & RESTART_ACTIONS:
            # written ahead: a takeover must see the rescale (or change of logic) running
            # before any task hears of it, or it would reconcile with tasks left half-way
            self.keeper.write_now()
        else:
            self._persist()

    # -- the helpers' ports: requests that change the job's record
    def deploying(self, dep: Deployment) -> None:
        self._write(self.record.deployed(dep))
        self.finished.clear()

    def update_deployment(self, dep: Deployment) -> None:
        self._write(self.record.deployed(dep))

    def logic_changed(self, op: g.OperatorDef, plan: PhysicalPlan) -> None:
        self._write(self.record.logic_changed(op, plan))

    def checkpoint_completed(self, meta: CheckpointMetadata) -> None:
        self._write(self.record.checkpoint_completed(meta))

    def restart_began(self, cause: str) -> None:
        self._write(self.record.restart_began(cause))
        self.collector.restarts = self.record.epoch  # restarts begun, as status() says

    def restart_retried(self) -> None:
        self._write(self.record.restart_retried())
        self.collector.restarts = self.record.epoch

    def restarted(self) -> None:
        self._write(self.record.restarted())
        self._notify()

    def restart_gave_up(self, suffix: str) -> None:
        self._write(self.record.gave_up(suffix))

    def restart_abandoned(self) -> None:
        self._set_state(JobState.RUNNING)

    def note_failure(self, note: str) -> None:
        self._write(self.record.noted(note))

    def name_in_error(self, error: str) -> None:
        self._write(self.record.with_status(self.record.status, error))

    def rescale_measured(self, record: RescaleRecord) -> None:
        self._write(self.record.rescale_measured(record))

    def decided(self, records: tuple[DecisionRecord, ...]) -> None:
        self._write(self.record.with_decisions(records))

    # -- the helpers' ports: the task actors and the rest of the runtime
    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def notify(self) -> None:
        """Wake whoever waits on ``changed()``."""
        self._notify()

    def changed(self) -> asyncio.Event:
        """Set at the next change of the job (a report, a failure, a stop)."""
        return self._changed

    async def create_task(self, name: str, spec: TaskSpec) -> None:
        """A task actor for ``spec`` (a deploy or a restart): an actor of the same vertex
        that ``recycle_tasks`` kept (the one that ran the same task index first: its
        process holds that task's local copies; its Ray name stays the first task's,
        ``<job>/<vertex>/<index>/g<n>``), else a warm standby actor that answers its ping
        when this replaces recycled ones, else a new actor. A reused actor's
        ``configure`` is awaited before any other call reaches it."""
        handle = self._take_recycled(spec.vertex, spec.task_index)
        if handle is None and self._reusing and len(self.pool):
            handle = await self.pool.take()
        if handle is None:
            self._create(name, spec)
            return
        self._check_owner()
        self._configuring[name] = handle.configure.remote(spec)
        self.handles[name] = handle
        self.health.created(name)

    def _take_recycled(self, vertex: str, index: int) -> Any:
        for i, (key, _) in enumerate(self._recycled):
            if key == (vertex, index):
                return self._recycled.pop(i)[1]
        for i, (key, _) in enumerate(self._recycled):
            if key[0] == vertex:
                return self._recycled.pop(i)[1]
        return None  # never another vertex's: an actor's name keeps saying what it runs

    async def recycle_tasks(self) -> None:
        """A restart (or a stop-restart rescale): every task actor stops as if killed;
        with ``JobConfig.recovery_reuses_processes`` those alive become standby actors that
        ``create_task`` makes the restarted tasks (``TaskActor.recycle``, within
        ``Deadlines.task_poll_s``), and the others are killed; every task is forgotten as
        by ``kill_tasks``. ``release_recycled`` kills the ones no task took."""
        if (not self.config.recovery_reuses_processes or self.fenced is not None
                or not self.handles):
            self.kill_tasks()
            return
        tasks = list(self.handles.items())
        where = {t: (v, i) for v, names in self.dep.tasks.items() for i, t in enumerate(names)}

        async def recycle(handle: Any) -> bool:
            try:
                await asyncio.wait_for(handle.recycle.remote(), self.deadlines.task_poll_s)
            except Exception:  # noqa: BLE001 - dead, or stuck: killed instead
                return False
            return True

        alive = await asyncio.gather(*(recycle(h) for _, h in tasks))
        for (name, handle), ok in zip(tasks, alive, strict=True):
            if ok and name in where:
                self._recycled.append((where[name], handle))
            else:
                with contextlib.suppress(Exception):
                    ray.kill(handle)
            self.watch.forget(name)
        self._reusing = True
        self.handles.clear()
        self._configuring.clear()
        self.finished.clear()

    def release_recycled(self) -> None:
        """The restart's tasks exist: recycled actors no task took are killed."""
        left, self._recycled = self._recycled, []
        self._reusing = False
        for _, handle in left:
            with contextlib.suppress(Exception):
                ray.kill(handle)

    async def each(self, tasks: list[str], call: Any, deadline: float) -> None:
        await self._each(tasks, call, deadline)

    def kill_tasks(self) -> None:
        """Kill every task actor (a restart: none may write on); standby actors stay. A
        fenced JobMaster kills nothing (the tasks are the newer one's)."""
        if self.fenced is not None:
            self.handles.clear()
            return
        for name, h in list(self.handles.items()):
            with contextlib.suppress(Exception):
                ray.kill(h)
            self.watch.forget(name)
        self.handles.clear()
        self._configuring.clear()
        self.finished.clear()

    async def forget_tasks(self) -> None:
        """A restart: every task is stopped (``recycle_tasks``), the failures they
        reported are void, running rescales give up what they did, and no replica exists
        any more."""
        await self.recycle_tasks()
        self.deferred_failure = None
        self.rescaler.restarted()
        self.replicas.reset()

    def remove_task(self, name: str) -> None:
        """Task ``name`` is removed (a rescale): its actor killed, no more metrics or
        health."""
        h = self.handles.pop(name, None)
        if h is not None:
            ray.kill(h)
        self.watch.forget(name)
        self.finished.discard(name)
        self.nodes.pop(name, None)

    async def create_task_actor(self, vertex: str, name: str, dep: Deployment,
                                node: str | None = None, index: int | None = None) -> None:
        """Task ``name`` of ``vertex``: a warm standby actor that answers its ping (its
        ``configure`` call is awaited before any other call reaches it), else a new one.
        ``node``: a new actor on that Ray node (placement); ``index``: the task index its
        spec carries (default: its position in ``dep``)."""
        position = dep.tasks[vertex].index(name)
        spec = TaskSpec.of(dep, vertex, position if index is None else index, name, self.config)
        handle = await self.pool.take() if len(self.pool) and node is None else None
        if handle is None:
            self._create(name, spec, node)
            return
        self._configuring[name] = handle.configure.remote(spec)
        self.handles[name] = handle
        self.health.created(name)

    async def stage_logic(self, task: str, version: int, operator: str, fn: Any) -> None:
        """Task ``task`` keeps ``fn`` (after its configuration, for a standby actor)."""
        pending = self._configuring.get(task)
        if pending is not None:
            await pending
        await self.handles[task].stage_logic.remote(version, operator, fn)

    def refill_standby_later(self) -> None:
        self._refill_standby_later()

    async def check_standby(self) -> bool:
        return bool(len(self.pool)) and bool(await self.pool.check())

    def last_answered(self, task: str) -> float:
        return self.health.since(task)

    def metrics_polled(self) -> None:
        self.controllers.observe()

    def metrics_window(self, seconds: float) -> MetricsWindow | None:
        return self.controllers.window(seconds)

    async def maybe_finish(self) -> None:
        await self._maybe_finish()

    @property
    def rescaling(self) -> bool:
        return self.rescaler.running

    @property
    def rescaling_operators(self) -> frozenset[str]:
        return self.rescaler.running_operators

    async def run_rescale(self, operator: str, parallelism: int | None, protocol: str,
                          assignment: Any, planning: Any, by: str,
                          strategy: AssignmentSpec | None) -> RescaleReport:
        return await self.rescaler.rescale(operator, parallelism, protocol, assignment,
                                           planning, by=by, strategy=strategy)

    async def run_placement(self, operator: str, task_index: int, node: str, protocol: str,
                            by: str) -> RescaleReport:
        return await self.rescaler.place(operator, task_index, node, protocol, by)

    async def run_change_logic(self, operator: str, fn: Any) -> Any:
        return await self.logic.change(operator, fn)

    def rescale_finished(self, report: RescaleReport, started: float, ended: float,
                         by: str) -> None:
        self.controllers.rescale_finished(report, started, ended, by)

    async def call(self, task: str, msg: Any, introduce: Any = ()) -> Any:
        """Send a control message to ``task`` (after its configuration, for a standby
        actor) and return its decoded reply; ``introduce``: tasks whose handles go along."""
        pending = self._configuring.get(task)
        if pending is not None:  # popped only once awaited: a cancelled caller leaves it
            await pending
            if self._configuring.get(task) is pending:
                del self._configuring[task]
        handles = {n: self.handles[n] for n in introduce} or None
        epoch = self.keeper.epoch if self.keeper is not None else 0
        try:
            return decode_message(await self.handles[task].control.remote(
                encode_message(msg), handles, epoch))
        except Exception as exc:
            err = reflow_error_in(exc)
            if isinstance(err, StaleJobMaster) and self.fenced is None:
                self._on_fenced(err)  # a newer JobMaster adopted the task
            raise

    def _create(self, name: str, spec: TaskSpec, node: str | None = None) -> None:
        """A new task actor for ``spec`` (on Ray node ``node`` when given)."""
        self._check_owner()  # a fenced JobMaster starts no task under the newer one
        me = ray.get_runtime_context().current_actor
        where: dict[str, Any] = {}
        if node is not None:
            where["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
            self.nodes[name] = node
        if self.detached:  # outlives this JobMaster's process: a takeover may keep it
            where["lifetime"] = "detached"
        self.handles[name] = RemoteTask.options(
            name=name, namespace=NAMESPACE, num_cpus=self.config.task_num_cpus,
            max_concurrency=10_000, **where,
        ).remote(spec, me)
        self.health.created(name)

    def _new_standby(self, name: str) -> Any:
        """An idle task actor for the pool, named ``<job>/standby-<n>`` (findable by name)."""
        return RemoteTask.options(
            name=name, namespace=NAMESPACE, num_cpus=self.config.task_num_cpus,
            max_concurrency=10_000, lifetime="detached" if self.detached else None,
        ).remote(None, ray.get_runtime_context().current_actor)

    def _refill_standby_later(self) -> None:
        """After a rescale (or a dead standby dropped): top the pool up
        ``warm_standby_refill_s`` later. Starting an actor costs a few CPU-seconds; doing it
        during the rescale that drew on the pool would slow the very migration the pool is
        there to speed up."""
        if len(self.pool) < self.pool.size:
            asyncio.get_running_loop().call_later(self.config.warm_standby_refill_s,
                                                  self._fill_standby)

    def _fill_standby(self) -> None:
        if self.state.active and self.fenced is None:
            self.pool.fill()

    # -- lifecycle
    async def start(self) -> str:
        """Deploy and start the tasks; returns the metrics URL. A task that cannot start
        (or does not answer within ``Deadlines.deploy_s``) fails the job, which is torn
        down, and ``start`` raises why: the ``UserFunctionError`` of an ``open()`` that
        raised, else ``JobFailedError`` naming the tasks."""
        try:
            if self.keeper is not None and self.keeper.epoch == 0:
                await self.keeper.claim()
            if self.restore_from is not None:
                plan = await self.recovery.plan_from(self.restore_from,
                                                     self.allow_non_restored_state)
                await self.recovery.deploy(plan.deployment, plan.tasks)
                self.checkpointing.coord.restored(plan.checkpoint)
                self.checkpoint_completed(plan.checkpoint)
                self._set_state(JobState.RUNNING)
            else:
                await self._deploy()
            failed = self.take_deferred_failure()
            if failed is not None:  # e.g. a restored sink transaction could not commit
                await self.task_failed(failed)
        except RestoreError:
            await self._fail("restore refused")
            raise
        except Exception as exc:
            if self.state == JobState.FAILED and self.failure is not None:
                pass  # a task failed at once and reported it: wait() tells the driver
            else:
                err = reflow_error_in(exc) or JobFailedError(
                    f"deploying job {self.job_id} failed: {type(exc).__name__}: {exc}",
                    phase=FailurePhase.DEPLOY)
                if isinstance(err, JobFailedError) and err.task:
                    self.failure = TaskFailed(err.task, err.operator, err.task_index,
                                              err.record, err.cause)
                await self._fail(str(err))
                raise err from None
        self._start_services()
        return self.endpoint.url if self.endpoint else ""

    def _start_services(self) -> None:
        """The metrics endpoint, the watch, replica and checkpoint loops, the standby pool."""
        if self.config.metrics_port is not None and self.endpoint is None:
            self.endpoint = MetricsEndpoint(self.collector, self.config.metrics_host,
                                            self.config.metrics_port)
        loop = asyncio.get_running_loop()
        self._background = [loop.create_task(self.watch.loop()),
                            loop.create_task(self.replicas.loop())]
        if self.config.checkpointing:
            self._background.append(loop.create_task(self.checkpointing.loop()))
        if self.keeper is not None:
            self._background.append(loop.create_task(
                self.keeper.lease(self.deadlines.task_poll_s, self.job_id)))
        self._fill_standby()

    # -- a detached job: its durable record and the takeover after a loss
    def _durable(self, epoch: int) -> Any:
        """The durable form of the job's record now (``RecordKeeper``'s snapshot)."""
        graph = self.record.graph
        if self._logic_bytes[0] is not graph:  # pickled once per change of logic
            self._logic_bytes = (graph, changed_logic(self.record, self.built_graph))
        return durable_of(self.record, epoch, self.checkpointing.coord.next_id,
                          self._logic_bytes[1],
                          [dump_user_code(c) for c in self.controllers.controllers()],
                          self.ids.live(set(self.dep.task_names())), self.ids.next_id,
                          self.subscale_ids.next_id)

    def _on_fenced(self, exc: StaleJobMaster) -> None:
        """A newer JobMaster owns the job: stop acting (its tasks are the new one's: this
        one kills, creates and restarts nothing from now on), and answer every call with
        ``exc``."""
        log.error("job %s: %s; this JobMaster stops acting", self.job_id, exc)
        self.fenced = exc
        me = asyncio.current_task()
        for t in [*self._background, self._restart_task, self._takeover]:
            if t is not None and t is not me:
                t.cancel()
        self.controllers.stop()
        self.handles.clear()
        self._notify()

    def _check_owner(self) -> None:
        if self.fenced is not None:
            raise self.fenced

    async def _owner(self) -> None:
        """Before a call that changes the job: a takeover in progress ends first (within
        ``Deadlines.failover_s``); a fenced JobMaster raises ``StaleJobMaster``."""
        t = self._takeover
        if t is not None and not t.done() and t is not asyncio.current_task():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(t), self.deadlines.failover_s)
        self._check_owner()

    async def _take_over(self) -> None:
        """Take the job over after a loss of its JobMaster (``engine.runtime.failover``);
        reports the tasks send meanwhile are kept and handled after it."""
        try:
            await self._take_over_steps()
        except Exception as exc:  # noqa: BLE001 - the job fails, saying why
            err = reflow_error_in(exc)
            msg = str(err) if err is not None else f"{type(exc).__name__}: {exc}"
            log.error("job %s: the takeover failed: %s", self.job_id, msg)
            if self.state.active and self.fenced is None:
                await self._fail(f"the JobMaster's takeover failed: {msg}")
        finally:
            early, self._early_reports = self._early_reports, None
            for payload in early or ():
                with contextlib.suppress(Exception):
                    await self.report(payload)

    async def _take_over_steps(self) -> None:
        assert self.keeper is not None
        epoch = await self.keeper.claim()
        self.pool.prefix = f"{self.job_id}/standby-e{epoch}"  # the lost one's may linger
        try:
            durable = await asyncio.to_thread(self.store.read)
        except JobRecordUnreadable as exc:
            await kill_leftovers(self.job_id, {}, self.deadlines.control_s)
            self._set_state(JobState.FAILED, str(exc))
            self._notify()
            return
        if durable is None:  # lost before its first record: deploy as at first
            await kill_leftovers(self.job_id, {}, self.deadlines.control_s)
            found = await asyncio.to_thread(complete_checkpoints, self.checkpointing.root)
            self.restore_from = found[-1] if found else self.restore_from
            await self.start()
            return
        path = self.store.path
        self._write(job_record_of(durable, self.built_graph, path=path))
        running = [r.action.kind for r in running_of(durable, path=path)]
        for r in self.record.decisions:
            self.controllers.decision_log.add(r)
        metas, whole = await asyncio.to_thread(self._retained_checkpoints)
        handles, answers = await ask_tasks(self.dep.task_names(), self.deadlines.control_s,
                                           self.job_id)
        decision = decide_failover(
            self.state, running, answers, metas[-1].checkpoint_id if metas else 0,
            durable.next_checkpoint_id, whole)
        coord = self.checkpointing.coord
        coord.retained = [m for m in metas if m.kind == CheckpointKind.CHECKPOINT]
        if metas:
            coord.restored(metas[-1])
        coord.next_id = decision.next_checkpoint_id
        note = describe(decision, epoch)
        log.warning("job %s: %s", self.job_id, note)
        self.collector.restarts = self.record.epoch
        if decision.path == FailoverPath.ENDED:
            await kill_leftovers(self.job_id, {}, self.deadlines.control_s)
            self._notify()
            return
        self.note_failure(note)
        reconcile = decision.path == FailoverPath.RECONCILE
        await kill_leftovers(self.job_id, handles if reconcile else {},
                             self.deadlines.control_s)
        if reconcile:
            reconcile = await self._reconcile(decision, handles, durable)
            if not reconcile:
                note = f"{note}; reconciling failed: restarting from the latest checkpoint"
                self.note_failure(note)
        for c in controllers_of(durable, path=path):
            with contextlib.suppress(ControllerError):  # one a driver added back already
                self.controllers.add(c)
        self._start_services()
        if not reconcile:
            await self.fail(note, force=True)
        else:
            await self._maybe_finish()
        self._notify()

    def _retained_checkpoints(self) -> tuple[list[CheckpointMetadata], bool]:
        """The job's complete checkpoints that read back, oldest first (the newest
        ``checkpoints_retained`` of its directory, and the record's last one: a savepoint
        the job was restored from counts until a checkpoint completes), and whether the
        newest of them read back. ``RestoreError`` when the record names a checkpoint and
        none reads back: the job is never started from nothing in its place."""
        found = complete_checkpoints(self.checkpointing.root)
        pointer = self.record.checkpoint
        if pointer is not None and pointer.location not in found:
            found = [pointer.location, *found]  # a savepoint, or a listing that failed
        candidates = found[-(max(1, self.config.checkpoints_retained) + 1):]
        out: list[CheckpointMetadata] = []
        whole = True
        for loc in candidates:
            try:
                out.append(read_metadata(loc))
            except RestoreError:
                whole = whole and loc != candidates[-1]
        if pointer is not None and not out:
            raise RestoreError(
                f"job {self.job_id}: its record names checkpoint {pointer.location}, and "
                f"no complete checkpoint in {self.checkpointing.root} reads back: restore it "
                "by hand from a savepoint (job.run(restore_from=...))",
                path=pointer.location, reason="unreadable")
        return sorted({m.checkpoint_id: m for m in out}.values(),
                      key=lambda m: m.checkpoint_id), whole

    async def _reconcile(self, decision: FailoverDecision, handles: dict[str, Any],
                         durable: Any) -> bool:
        """Keep the live tasks: they report to this JobMaster from now on, stop aligning
        checkpoints the old one started, drop replicas it placed (this one does not know
        them) and read on if a stop-with-savepoint held their sources. False (nothing
        kept: every task killed) when a task did not take part in time."""
        self.handles.update(handles)
        for name in handles:
            self.health.created(name)
        # the live tasks know their channels by the lost JobMaster's ids
        self.ids.restore(durable.channels, durable.next_channel_id)
        self.subscale_ids.next_id = durable.next_subscale_id
        self.finished |= decision.finished
        me = ray.get_runtime_context().current_actor
        deadline = self.clock.monotonic() + self.deadlines.control_s
        tasks = list(handles)
        epoch = self.keeper.epoch if self.keeper is not None else 0
        keyed = [t for v in self.plan.vertices if v.keyed for t in self.dep.tasks[v.name]]
        everything = tuple(range(self.plan.num_key_groups))
        try:
            await self._each(tasks, lambda t: self.handles[t].adopt.remote(me, epoch),
                             deadline)
            for cid in decision.abort:
                await self._each(tasks, lambda t, c=cid: self.call(t, CheckpointAborted(c)),
                                 deadline)
            await self._each(keyed, lambda t: self.call(t, DropReplicas(everything)),
                             deadline)
            await self._each(tasks, lambda t: self.call(t, Resume()), deadline)
        except Exception as exc:  # noqa: BLE001 - a task that cannot take part: restart
            log.warning("job %s: reconciling failed (%s: %s)", self.job_id,
                        type(exc).__name__, exc)
            self.kill_tasks()
            return False
        return True

    async def _deploy(self) -> None:
        """The first deploy (``engine.control.steps.DeploySteps``, run by ``Recovery``):
        the job runs from the moment its first task is started."""
        dep = self.dep.with_partitions(source_partitions(self.plan))
        await self.recovery.deploy(dep, {}, on_start=lambda: self._set_state(JobState.RUNNING))

    async def _each(self, tasks: list[str], call: Any, deadline: float) -> None:
        """``call(task)`` for every task at once, all answered by ``deadline``; else raise
        the first task's reflow error, or ``JobFailedError`` naming the tasks that died or
        did not answer."""
        futs = {t: asyncio.ensure_future(call(t)) for t in tasks}
        _, pending = await asyncio.wait(futs.values(), return_when=asyncio.FIRST_EXCEPTION,
                                        timeout=max(0.0, deadline - self.clock.monotonic()))
        for f in pending:
            f.cancel()
        failed = {t: f.exception() for t, f in futs.items() if f not in pending
                  and f.exception() is not None}
        for exc in failed.values():
            mine = reflow_error_in(exc)
            if mine is not None:
                raise mine
        # after a failure the others were not waited for: only a timeout names them
        silent = [] if failed else [t for t, f in futs.items() if f in pending]
        if failed or silent:
            what = [f"{t} died ({type(e).__name__})" for t, e in failed.items()]
            what += [f"{t} did not answer within {self.deadlines.deploy_s:g} s" for t in silent]
            first = next(iter(failed), None) or silent[0]
            raise JobFailedError(
                f"deploying job {self.job_id}: task {'; task '.join(what)}. A task that "
                "does not answer may be stuck in an open() or short of CPUs (task_num_cpus)",
                task=first, phase=FailurePhase.DEPLOY)

    async def report(self, payload: bytes) -> None:
        """A task's report: job-level bookkeeping, then every running rescale sees it."""
        msg = decode_message(payload)
        if getattr(msg, "task", None) not in self.handles:
            early = self._early_reports
            if early is not None and self._takeover is not None and not self._takeover.done():
                early.append(payload)
                del early[:-EARLY_REPORTS]
            return  # a task killed by a restart (or removed) said something late
        if isinstance(msg, TaskFinished):
            self.finished.add(msg.task)
        elif isinstance(msg, TaskFailed) and self.state == JobState.RUNNING:
            await self.task_failed(msg)
        elif isinstance(msg, TaskFailed) and self.state.active and self.deferred_failure is None:
            self.deferred_failure = msg
        self.rescaler.on_report(msg)
        self.logic.on_report(msg)
        await self.checkpointing.on_report(msg)
        if isinstance(msg, TaskFinished):
            await self._maybe_finish()
        self._notify()

    async def set_replication(self, operator: str, policy: str, period_s: float | None,
                              hot_fraction: float | None) -> None:
        await self._owner()
        await self.replicas.set_policy(operator, policy, period_s, hot_fraction)

    async def _maybe_finish(self) -> None:
        """The job is finished when every task is; a running rescale defers the teardown
        (the arbiter refuses the finish while one runs, or while it runs already). With
        checkpoints on, a final checkpoint commits the sinks' last output first (Flink's
        final checkpoint); then the tasks close their writers."""
        if self.rescaling or self.arbitration.core.finishing:
            return
        if self.state != JobState.RUNNING or not all(n in self.finished
                                                     for n in self.dep.task_names()):
            return
        if self.config.checkpointing:
            d = await self.arbitration.acquire(Action(ActionKind.FINISH))
            if d.verdict is not Verdict.RUN:
                return
            try:
                if not await self.checkpointing.final():
                    return
            finally:
                self.arbitration.release(d.ticket)
        # every task closes its writers and its state backend (a RocksDB one's files go)
        await self._stop_tasks()
        if self.state != JobState.RUNNING:
            return
        self._set_state(JobState.FINISHED)
        await self._teardown()

    async def task_failed(self, msg: TaskFailed) -> None:
        """Task ``msg.task`` failed: the job fails (and restarts, if its strategy says so).
        A task that failed because a task it sends to could not be reached names the task
        that died when the watch finds one dead: that is the failure, not its sender."""
        if msg.downstream:
            # the sender saw its socket close before Ray declares the actor dead: ask the
            # tasks until one is (or for up to control_timeout_s: then the sender's report)
            end = self.clock.monotonic() + self.deadlines.control_s
            while True:
                died = await self.watch.poll()
                if self.state != JobState.RUNNING:  # failed meanwhile (the watch saw it too)
                    return
                if died or self.clock.monotonic() >= end:
                    break
                await asyncio.sleep(0.1)
            if died:
                task, exc = died[0]
                vertex, index = next(((v, ts.index(task)) for v, ts in self.dep.tasks.items()
                                      if task in ts), ("", -1))
                self.failure = TaskFailed(task, vertex, index, "", actor_death(exc))
                await self.fail(f"{self.watch.death(task, exc)} (task {msg.task} lost its "
                                "data connection to it)")
                return
            if msg.task not in self.handles:  # removed meanwhile (a scale-in, once its stop
                return  # settled every frame): as void as a report that came after that
        error = (f"task {msg.task} of operator {msg.operator!r} failed: "
                 f"{msg.cause}" + (f" on record {msg.record}" if msg.record else ""))
        self.failure = msg
        if msg.permanent:  # the job's own definition: a restart would fail the same way
            await self.fail_for_good(error + " (not restarted: a restart would fail the "
                                             "same way)")
            return
        await self.fail(error)

    def take_deferred_failure(self) -> TaskFailed | None:
        """The failure a task of the current deployment reported while it was being
        deployed, once (None if none; one of tasks killed since is forgotten)."""
        msg, self.deferred_failure = self.deferred_failure, None
        return msg if msg is not None and msg.task in self.handles else None

    async def fail(self, error: str, force: bool = False) -> None:
        """The job failed with ``error``: the restart strategy restarts it from the last
        checkpoint (in the background: the job is ``restarting`` when this returns), or it
        fails for good. ``force``: restart without asking the strategy (a takeover)."""
        if self.fenced is not None:
            return  # the job is a newer JobMaster's: it must not restart its tasks
        if self.recovery.begin(error, force):
            self.failure = None  # the job goes on: a later failure says its own
            self._notify()
            if self.state == JobState.RESTARTING and not self._restart_running():
                self._restart_task = asyncio.ensure_future(self.recovery.run(error))
            return
        await self.fail_for_good(error)

    def _restart_running(self) -> bool:
        t = self._restart_task
        return t is not None and not t.done()

    async def fail_for_good(self, error: str) -> None:
        if self.state.active:
            await self._fail(error + self.record.error_suffix)

    async def _fail(self, error: str | None = None) -> None:
        self._set_state(JobState.FAILED, error)
        self._notify()
        await self._teardown()

    async def _teardown(self) -> None:
        # a checkpoint or savepoint still pending can no longer complete: its caller hears
        # so now, not after checkpoint_timeout_s
        await self.checkpointing.abort(f"the job is {self.state}")
        self.collector.running = 0
        for h in [*self.handles.values(), *self.pool.clear()]:
            with contextlib.suppress(Exception):
                ray.kill(h)
        self.handles.clear()

    # -- driver API
    def status(self) -> bytes:
        self._check_owner()
        f = self.failure if self.state == JobState.FAILED else None
        return encode_message(JobStatus(
            self.job_id, str(self.state), self.error,
            f.operator if f else "", f.task_index if f else -1, f.record if f else "",
            f.cause if f else "", self.endpoint.url if self.endpoint else "",
            len(self.pool), self.watch.unresponsive(), self.record.epoch,
            self.record.last_failure, self.checkpointing.coord.stats(),
            self.sink_guarantees, self.detached,
            self.keeper.epoch if self.keeper is not None else 0, self.record.restarts,
        ))

    def rescale_ticks(self) -> int:
        """Steps run by this job's rescales so far: the driver's sign that a long rescale
        still advances (see ``Deadlines.rescale_window_s``)."""
        return self.rescaler.ticks

    async def wait(self, timeout: float | None) -> bytes:
        deadline = None if timeout is None else self.clock.monotonic() + timeout
        while self.state.active:
            left = None if deadline is None else deadline - self.clock.monotonic()
            if left is not None and left <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), 0.5 if left is None else min(0.5, left))
        return self.status()

    async def metrics(self) -> bytes:
        """Every live task's latest snapshot (an unresponsive task's last one) within
        ``Deadlines.task_poll_s``, the rescales' progress, the endpoint and the
        unresponsive tasks."""
        self._check_owner()
        if self.state.active:
            await self.watch.poll()  # a dead task: the background poll fails the job
        live = [n for n in self.dep.task_names() if n in self.handles]
        snaps = [self.collector.tasks[n] for n in live if n in self.collector.tasks]
        return pack_exact([
            str(self.state), [encode_message(s) for s in snaps],
            [encode_message(r) for r in self.collector.rescales.values()],
            self.endpoint.url if self.endpoint else "",
            [list(e) for e in self.watch.unresponsive()],
            self.clock.monotonic(),
        ])

    async def savepoint(self, location: str | None, stop: bool = False) -> str:
        """Take a savepoint into ``location`` (None: ``savepoint-<n>`` in the job's
        checkpoint directory) and return where it is; with ``stop``, sources read nothing
        after it and the job stops once it is complete (its sinks committed). Raises
        ``CheckpointFailed`` (the job goes on: with ``stop``, its sources resume)."""
        from engine.checkpoints.store import join

        await self._owner()
        if self.state != JobState.RUNNING:
            raise CheckpointFailed(f"job {self.job_id} is {self.state}; a savepoint needs a "
                                   "running job", reason=f"job {self.state}")
        loc = location or join(self.checkpointing.root,
                               f"savepoint-{self.checkpointing.coord.next_id}")
        try:
            meta = await self.checkpointing.take(CheckpointKind.SAVEPOINT, loc, stop)
        except CheckpointFailed:
            if stop and self.state == JobState.RUNNING:  # go on as before
                await self._each(list(self.handles), lambda t: self.call(t, Resume()),
                                 self.clock.monotonic() + self.deadlines.control_s)
            raise
        if stop:
            await self.stop()
        return meta.location

    async def _stop_tasks(self) -> None:
        """Ask each task to stop (flushing and closing its sinks), one at a time in
        deployment order, each within ``control_timeout_s`` and all within
        ``Deadlines.stop_budget_s`` (unresponsive tasks are not asked)."""
        end = self.clock.monotonic() + self.deadlines.stop_budget_s
        for n in list(self.handles):
            left = min(self.deadlines.control_s, end - self.clock.monotonic())
            if left <= 0:
                break
            if self.health.is_silent(n):
                continue
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.call(n, StopTask()), left)

    async def stop(self) -> None:
        """Ask each task to stop (flushing its sinks, see ``_stop_tasks``); then kill every
        actor. A detached job's record says it stopped before this returns (a JobMaster
        restarted later keeps it stopped)."""
        await self._owner()  # a takeover ends first; a fenced JobMaster stops nothing
        if self.state.active:
            await self._stop_tasks()
            self._set_state(JobState.STOPPED)
        await self._teardown()
        if self.keeper is not None:
            await self.keeper.flush()
            await kill_leftovers(self.job_id, {}, self.deadlines.control_s)
        await self._stop_background()
        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None
        self._notify()

    async def _stop_background(self) -> None:
        """Cancel the watch, replica and checkpoint loops (not the caller, if it is one):
        an actor killed while one sleeps would print "Task was destroyed but it is
        pending" for it."""
        me = asyncio.current_task()
        others = [t for t in self._background if t is not me and not t.done()]
        for t in others:
            t.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    # -- rescale (``engine.runtime.rescaling`` runs the coordinator's commands)
    async def rescale(self, operator: str, parallelism: int | None, protocol: str,
                      assignment: tuple[int, ...] | None = None, planning: Any = None,
                      strategy: Any = None, without: Any = ()) -> bytes:
        await self._owner()
        return encode_message(await self.rescaler.rescale(operator, parallelism, protocol,
                                                          assignment, planning,
                                                          strategy=strategy,
                                                          without=tuple(without)))

    # -- controllers (``engine.runtime.controller_runner``)
    async def add_controller(self, controller: Any) -> str:
        """Run ``controller`` on this job; returns the name it runs under."""
        await self._owner()
        if not self.state.active:
            raise JobNotRunningError(f"job {self.job_id} is {self.state}; controllers run "
                                     "only while it runs")
        return self.controllers.add(controller)

    async def remove_controller(self, name: str) -> None:
        self.controllers.remove(name)

    def decisions(self, controller: str | None) -> bytes:
        return pack_exact([encode_message(r) for r in self.controllers.decisions(controller)])

    def rescale_history(self) -> bytes:
        return pack_exact([encode_message(r) for r in self.record.rescales])

    def alive_nodes(self) -> list[str]:
        """The ids of the Ray nodes alive now."""
        return [n["NodeID"] for n in ray.nodes() if n.get("Alive")]

    # -- change of logic (``engine.runtime.logic``)
    async def change_logic(self, operator: str, fn: Any) -> bytes:
        await self._owner()
        return encode_message(await self.logic.change(operator, fn))

    # -- placement
    async def placement(self, operator: str) -> list[str]:
        """The Ray node of each task of ``operator`` (a vertex), by task index; "" for a
        task that did not say within ``Deadlines.task_poll_s``. Asked once per task."""
        if operator not in self.dep.tasks:
            raise RescaleRefused(f"job {self.job_id} has no operator (vertex) {operator!r}; "
                                 f"vertices: {', '.join(self.dep.tasks)}")
        tasks = self.dep.tasks[operator]
        unknown = [t for t in tasks if t not in self.nodes and t in self.handles]
        if unknown:
            asks = [asyncio.ensure_future(self._node_of(t)) for t in unknown]
            await asyncio.wait(asks, timeout=self.deadlines.task_poll_s)
            for t, f in zip(unknown, asks, strict=True):
                if f.done() and not f.cancelled() and f.exception() is None:
                    self.nodes[t] = f.result()
                else:
                    f.cancel()
        return [self.nodes.get(t, "") for t in tasks]

    async def _node_of(self, task: str) -> str:
        pending = self._configuring.get(task)
        if pending is not None:
            await pending
        return str(await self.handles[task].node_id.remote())

    async def place(self, operator: str, task_index: int, node: str, protocol: str = "drrs",
                    by: str = "handle") -> bytes:
        await self._owner()
        return encode_message(await self.rescaler.place(operator, task_index, node, protocol,
                                                        by))


RemoteJobMaster = ray.remote(max_restarts=0, max_task_retries=0)(JobMaster)

__all__ = ["NAMESPACE", "JobMaster", "RemoteJobMaster"]
