"""The driver's side: ``deploy`` starts a job's JobMaster; ``JobHandle`` talks to it.

Why separate: this is the code that runs in the user's process. Every call goes to the
JobMaster actor and comes back as msgpack wire values (``engine.wire.messages``).

Guarantees: every call has a deadline (``engine.runtime.deadlines``: ``control_timeout_s``
for status and metrics, windows derived from ``rescale_timeout_s`` for rescales); no call
raises one of Ray's exceptions: a reflow error raised in the JobMaster (or in a task
behind it) is raised as itself, a JobMaster that does not answer in time raises
``ControlTimeout``, a dead one ``JobMasterLost`` (Ray's error as the ``__cause__``),
anything else ``InternalError`` (``engine.runtime.failures.translate``).
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any, NoReturn

import ray
from ray.actor import ActorHandle
from ray.exceptions import RayActorError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from engine.control.reconfiguration import DecisionRecord, LogicChangeReport, RescaleRecord
from engine.dataflow import graph as g
from engine.dataflow.config import JobConfig, check_count
from engine.dataflow.guarantees import at_least_once_warnings, sink_guarantees
from engine.errors import (
    ChangeLogicRefused,
    ControlTimeout,
    JobFailedError,
    JobMasterFailedOver,
    JobNotFound,
    ReflowError,
    RescaleRefused,
    StaleJobMaster,
    UserFunctionError,
    WaitTimeout,
)
from engine.observability.metrics import JobMetrics
from engine.runtime import local_ray, registry
from engine.runtime.deadlines import Deadlines
from engine.runtime.failover import kill_job_actors
from engine.runtime.failures import reflow_error_in, translate
from engine.runtime.job_master import NAMESPACE, RemoteJobMaster
from engine.wire.messages import JobStatus, decode_message
from migration.assignment import AssignmentSpec, requested_strategy
from migration.report import RescaleReport

log = logging.getLogger(__name__)

_ACTIVE = ("created", "running", "restarting")


class JobHandle:
    """The driver's handle on a running job. Every method has a deadline (see each) and
    raises only reflow's errors (``engine.errors``)."""

    def __init__(self, master: Any, job_id: str, metrics_url: str,
                 config: JobConfig | None = None, detached: bool = False) -> None:
        self._master = master
        self.job_id = job_id
        self.metrics_url = metrics_url
        self.deadlines = Deadlines.of(config) if config is not None else Deadlines.defaults()
        self.detached = detached

    def _get(self, ref: Any, call: str, seconds: float) -> Any:
        """``ray.get(ref)`` within ``seconds``, Ray's errors translated (a detached job's
        JobMaster that died under the call: ``JobMasterFailedOver``)."""
        try:
            return ray.get(ref, timeout=Deadlines.for_ray(seconds))
        except RayActorError as exc:
            if self.detached and self._restartable():
                raise JobMasterFailedOver(
                    f"job {self.job_id}: the JobMaster died during {call}() and Ray restarts "
                    "it; the new one takes the job over (status().last_failure says how). "
                    f"Whether the {call} happened: look at status() and metrics(), then ask "
                    "again", job=self.job_id, call=call) from exc
            _raise(exc, self.job_id, call, seconds)
        except RayError as exc:
            _raise(exc, self.job_id, call, seconds)

    def _ask(self, call: str, seconds: float, *args: Any) -> Any:
        """The JobMaster's answer to ``call(*args)`` within ``seconds``. A detached job's
        JobMaster that is being restarted by Ray (its process died) is asked again until
        it answers, for at most ``Deadlines.failover_s``: a failover that succeeds is not
        the caller's error. Only for calls that change nothing (status, wait, metrics)."""
        end = time.monotonic() + self.deadlines.failover_s
        while True:
            try:
                return ray.get(getattr(self._master, call).remote(*args),
                               timeout=Deadlines.for_ray(seconds))
            except RayActorError as exc:
                if not self.detached or time.monotonic() >= end or not self._restartable():
                    _raise(exc, self.job_id, call, seconds)
                time.sleep(0.1)  # Ray restarts the actor: ask it again shortly
            except RayError as exc:
                _raise(exc, self.job_id, call, seconds)

    def _restartable(self) -> bool:
        """The JobMaster is still known by name (alive or being restarted by Ray)."""
        return registry.master_exists(self.job_id)

    def status(self) -> JobStatus:
        """The job's state, error, standby pool and unresponsive tasks; within
        ``control_timeout_s`` (``ControlTimeout`` otherwise)."""
        return decode_message(self._ask("status", self.deadlines.control_s))

    def wait(self, timeout: float | None = None) -> JobStatus:
        """Block until the job ends (``timeout`` None: as long as it runs). Raises
        ``UserFunctionError``/``JobFailedError`` when it failed and ``WaitTimeout`` (a
        ``TimeoutError``) when it still runs after ``timeout`` seconds. The JobMaster is
        asked in slices (``Deadlines.wait_slice_s``), each answered within
        ``control_timeout_s`` more, so a lost or frozen JobMaster ends the wait with
        ``JobMasterLost`` or ``ControlTimeout``."""
        d = self.deadlines
        clock = time.monotonic
        end = None if timeout is None else clock() + timeout
        while True:
            left = None if end is None else max(0.0, end - clock())
            chunk = d.wait_slice_s if left is None else min(left, d.wait_slice_s)
            st: JobStatus = decode_message(self._ask("wait", chunk + d.control_s, chunk))
            if st.state not in _ACTIVE or (end is not None and clock() >= end):
                break
        if st.state == "failed":
            if st.record:
                raise UserFunctionError(st.operator, st.task_index, st.record, st.cause)
            raise JobFailedError(st.error, operator=st.operator, task_index=st.task_index,
                                 record=st.record, cause=st.cause)
        if st.state in _ACTIVE:
            raise WaitTimeout(f"job {self.job_id} still {st.state} after {timeout} s; wait "
                              "again or stop it", job=self.job_id, state=st.state,
                              seconds=timeout)
        return st

    def savepoint(self, location: str | None = None) -> str:
        """Take a savepoint (a checkpoint kept until you delete it) into ``location`` (a
        directory or URI; None: ``savepoint-<n>`` in the job's checkpoint directory) and
        return where it is; ``job.run(restore_from=...)`` starts a job from it, at any
        parallelism. Raises ``CheckpointFailed`` (the job goes on) when it failed. Waits
        at most ``checkpoint_timeout_s`` plus ``rescale_window_s`` (it may wait for a
        running subscale of a rescale to finish first)."""
        d = self.deadlines
        if location is not None:
            location = _location(location, "savepoint")
        return self._get(self._master.savepoint.remote(location),
                         "savepoint", d.savepoint_s)

    def stop(self, savepoint: str | None = None) -> str | None:
        """Stop the job (sinks are flushed) and release its actors. The JobMaster stops the
        tasks within ``Deadlines.stop_budget_s``; it is killed in any case. A JobMaster
        already gone is not an error; one that does not answer in time raises
        ``ControlTimeout`` (after it was killed: sinks may not have been flushed).

        ``savepoint``: Flink's stop-with-savepoint: the sources read nothing after the
        savepoint's barrier, the savepoint is written to ``savepoint`` (a directory or URI)
        and its sinks' output committed, then the job stops; returns the savepoint's path.
        If the savepoint fails, ``CheckpointFailed`` is raised and the job goes on."""
        if savepoint is not None:
            savepoint = _location(savepoint, "stop")
            path: str = self._get(self._master.savepoint.remote(savepoint, True), "stop",
                                  self.deadlines.savepoint_s)
            self.stop()
            return path
        failed: ReflowError | None = None
        end = time.monotonic() + self.deadlines.failover_s
        while True:
            try:
                ray.get(self._master.stop.remote(), timeout=self.deadlines.stop_s)
            except RayActorError:
                # a detached job's JobMaster that Ray restarts is asked again: its tasks
                # outlive it, and only a JobMaster stops them with their sinks flushed
                if self.detached and time.monotonic() < end and self._restartable():
                    time.sleep(0.1)
                    continue
            except RayError as exc:
                failed = translate(exc, job=self.job_id, call="stop",
                                   seconds=self.deadlines.stop_s)
                failed.__cause__ = exc
            break
        with contextlib.suppress(Exception):
            ray.kill(self._master)
        if self.detached and not isinstance(failed, StaleJobMaster):
            with contextlib.suppress(Exception):  # whatever no JobMaster stopped
                kill_job_actors(self.job_id, masters=True)
        registry.forget(self.job_id)
        if failed is not None:
            raise failed
        return None

    def metrics(self) -> JobMetrics:
        """Every live task's latest snapshot, the rescales' progress and the tasks that did
        not answer (with seconds since they last did); within ``control_timeout_s``."""
        from engine.wire.codec import unpack_exact

        state, tasks, rescales, url, silent, taken_at = unpack_exact(self._ask(
            "metrics", self.deadlines.control_s))
        return JobMetrics(self.job_id, state, tuple(decode_message(t) for t in tasks),
                          tuple(decode_message(r) for r in rescales), url or None,
                          tuple((t, float(s)) for t, s in silent), float(taken_at))

    def rescale(self, operator: str, parallelism: int, protocol: str = "drrs",
                planning: Any = None, assignment: str | None = None,
                balance: float | None = None, projected_costs: Any = None,
                without: Any = ()) -> RescaleReport:
        """Change ``operator``'s parallelism while the job runs; returns the report.

        ``protocol``: one of ``migration.protocols.PROTOCOLS``. ``planning``: a
        ``migration.planning.Planning`` ordering (and, for non-disruptive, chunking) the
        moving key groups; None uses the protocol's default (the adaptive strategy for
        non-disruptive). ``assignment``: how to choose the target assignment (a
        ``migration.assignment.AssignmentStrategy`` name: "uniform", the default,
        "consistent-hashing", "ssm" or "mtm"); ``balance``: θ, every task's load within
        ``(1 + θ)`` x the mean (ssm, mtm); ``projected_costs``: mtm's table (a directory
        written by ``python -m migration.pmc`` or a ``ProjectedCosts``). When no assignment
        meets θ the request is refused naming the smallest θ that would. ``without``: DRRS
        mechanisms to switch off, for an ablation (``migration.protocols.drrs.DrrsMechanism``
        names: "decoupled-barriers", "record-scheduling", "subscale-division"; drrs only).
        Raises ``RescaleRefused`` (job untouched) for an invalid request
        or one that failed before anything changed (e.g. a task did not answer within
        ``rescale_timeout_s``: the error names it), ``JobFailedError`` when it failed after.

        Deadline: the JobMaster bounds each step of a rescale by ``rescale_timeout_s``, but
        a rescale has as many steps as it needs; so this waits as long as the JobMaster
        runs new steps, and raises ``ControlTimeout`` when it ran none for
        ``Deadlines.rescale_window_s`` (2 × (rescale_timeout_s + control_timeout_s)) or
        did not answer within ``control_timeout_s`` when asked."""
        if isinstance(parallelism, bool) or not isinstance(parallelism, int):
            raise RescaleRefused(
                f"rescale of {operator!r}: parallelism must be a number of tasks (an int), "
                f"got {parallelism!r}; to move key groups at the same parallelism use "
                "rebalance()", operator=operator)
        return self._rescale(operator, parallelism, protocol, None, planning,
                             requested_strategy(assignment, balance, projected_costs),
                             without)

    def set_replication(self, operator: str, policy: str, period_s: float | None = None,
                        hot_fraction: float | None = None) -> None:
        """Keep replicas of ``operator``'s key groups on other tasks ("hot": the busiest
        ``hot_fraction``, "all", or "none"), refreshed every ``period_s`` with the changes
        since the last refresh; a later migration to a replica's holder ships only the
        changes. Defaults come from ``JobConfig``. Within ``control_timeout_s``."""
        self._get(self._master.set_replication.remote(operator, policy, period_s, hot_fraction),
                  "set_replication", self.deadlines.control_s)

    def rebalance(self, operator: str, assignment: Sequence[int] | str, protocol: str = "drrs",
                  planning: Any = None, balance: float | None = None,
                  projected_costs: Any = None) -> RescaleReport:
        """Move key groups so that key group ``kg`` is held by task ``assignment[kg]``; the
        parallelism becomes ``max(assignment) + 1``. Or, with a strategy name (e.g.
        ``"ssm"``, with ``balance``), the target it chooses at the current parallelism.
        Errors and deadline as ``rescale``."""
        if isinstance(assignment, str):
            return self._rescale(operator, None, protocol, None, planning,
                                 requested_strategy(assignment, balance, projected_costs))
        if balance is not None or projected_costs is not None:
            raise RescaleRefused("balance and projected_costs go with an assignment strategy "
                                 "(e.g. rebalance(op, 'ssm', balance=0.2)), not an explicit "
                                 "assignment")
        a = tuple(check_count(f"assignment for {operator!r}: the task index of key group {kg}",
                              t, 0, RescaleRefused) for kg, t in enumerate(assignment))
        if not a:
            raise RescaleRefused("the assignment is empty; give one task index per key group")
        return self._rescale(operator, max(a) + 1, protocol, a, planning)

    def place(self, operator: str, task_index: int, node: str, protocol: str = "drrs"
              ) -> RescaleReport:
        """Move task ``task_index`` of keyed ``operator`` to Ray node ``node`` (an id, as in
        ``ray.nodes()`` or ``placement()``) while the job runs: its replacement starts on that
        node and the task's key groups migrate to it with ``protocol`` (live); the
        parallelism and the assignment stay. Returns the report. ``RescaleRefused`` (job
        untouched) for an operator that is not keyed, an unknown task or node, a task
        already there, or while the operator rescales; deadline as ``rescale``."""
        return self._await_rescale(
            self._master.place.remote(operator, task_index, node, protocol), operator)

    def change_logic(self, operator: str, fn: Any) -> LogicChangeReport:
        """Replace ``operator``'s function by ``fn`` in every task while the job runs, at a
        barrier aligned over the operator's inputs: each record before the barrier saw the
        old function, each one after it the new one; keyed state stays. ``fn``: a function
        for map/flat_map/filter, a function of two values for reduce, a
        ``KeyedProcessFunction`` for process (for a window operator also the new window
        function of the same kind). Returns the report once every task switched.
        ``ChangeLogicRefused`` (every task keeps the old function) when the operator cannot
        change (a source or sink), ``fn`` does not fit, cannot be serialised here or be
        deserialised and opened on a task, or the job is finishing. Waits at most twice
        ``rescale_timeout_s`` (staging, switching) plus ``control_timeout_s``."""
        d = self.deadlines
        try:
            ref = self._master.change_logic.remote(operator, fn)
        except Exception as exc:  # pickling on this side: nothing was sent
            raise ChangeLogicRefused(
                f"change of logic of {operator!r} refused: the new function cannot be "
                f"serialised to ship it ({type(exc).__name__}: {exc}); define it at module "
                "level and keep what it holds picklable", operator=operator) from exc
        return decode_message(self._get(ref, "change_logic",
                                        2 * d.rescale_s + d.control_s))

    def placement(self, operator: str) -> list[str]:
        """The Ray node id of each task of ``operator``, by task index ("" for a task that
        did not answer within ``control_timeout_s / 2``)."""
        return list(self._ask("placement", self.deadlines.control_s, operator))

    def _rescale(self, operator: str, parallelism: int | None, protocol: str,
                 assignment: tuple[int, ...] | None, planning: Any = None,
                 strategy: AssignmentSpec | None = None, without: Any = ()) -> RescaleReport:
        without = (without,) if isinstance(without, str) else tuple(str(m) for m in without)
        return self._await_rescale(
            self._master.rescale.remote(operator, parallelism, protocol, assignment, planning,
                                        strategy, without), operator)

    def _await_rescale(self, ref: Any, operator: str) -> RescaleReport:
        """The report of a rescale (or placement) call ``ref``, waiting as long as the
        JobMaster runs new steps (see ``rescale``)."""
        d = self.deadlines
        ticks = -1
        while True:
            ready, _ = ray.wait([ref], timeout=d.for_ray(d.rescale_window_s))
            if ready:
                return decode_message(self._get(ref, "rescale", d.control_s))
            now = self._get(self._master.rescale_ticks.remote(), "rescale", d.control_s)
            if now == ticks:
                raise ControlTimeout(
                    f"job {self.job_id}: the rescale of {operator!r} ran no step for "
                    f"{d.rescale_window_s:g} s although the JobMaster bounds each by "
                    "rescale_timeout_s; the JobMaster is stuck: look at its log, then stop "
                    "the job", job=self.job_id, call="rescale", seconds=d.rescale_window_s)
            ticks = now

    # -- controllers
    def add_controller(self, controller: Any) -> str:
        """Run ``controller`` (a ``controllers.base.Controller``) on the job from now on:
        the JobMaster calls its ``decide`` every ``interval_s`` and carries out what it
        decides. Returns the name it runs under. ``ControllerError`` when it is no
        controller (or its name is taken); within ``control_timeout_s``."""
        return self._add_controller(controller, self.deadlines.control_s)

    def _add_controller(self, controller: Any, seconds: float) -> str:
        from engine.control.reconfiguration import check_controller

        check_controller(controller)
        return str(self._get(self._master.add_controller.remote(controller), "add_controller",
                             seconds))

    def remove_controller(self, name: str) -> None:
        """Stop running the controller ``name`` (its decisions stay in ``decisions()``)."""
        self._get(self._master.remove_controller.remote(name), "remove_controller",
                  self.deadlines.control_s)

    def decisions(self, controller: str | None = None) -> tuple[DecisionRecord, ...]:
        """Every recent decision of the job's controllers (or of ``controller``), executed
        or not, oldest first: the latest 1000, identical consecutive no-change decisions
        folded (``repeats``). Within ``control_timeout_s``."""
        from engine.wire.codec import unpack_exact

        raw = unpack_exact(self._ask("decisions", self.deadlines.control_s, controller))
        return tuple(decode_message(r) for r in raw)

    def rescale_history(self) -> tuple[RescaleRecord, ...]:
        """The job's recent finished rescales (whoever asked) with what each cost, measured
        a few metrics polls after it ended: backlog built, peak latency, seconds of input
        held up (``RescaleRecord``). Within ``control_timeout_s``."""
        from engine.wire.codec import unpack_exact

        raw = unpack_exact(self._ask("rescale_history", self.deadlines.control_s))
        return tuple(decode_message(r) for r in raw)

    def __enter__(self) -> JobHandle:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.stop()
            return
        with contextlib.suppress(ReflowError):  # keep the error that ended the block
            self.stop()


def _raise(exc: RayError, job: str, call: str, seconds: float) -> NoReturn:
    """Raise ``exc`` translated: a reflow error raised remotely as itself (its message is
    the point; Ray's wrapping is noise), any other with Ray's error as the cause."""
    err = translate(exc, job=job, call=call, seconds=seconds)
    if err is reflow_error_in(exc):
        raise err from None
    raise err from exc


def _sinks_of(graph: g.JobGraph) -> list[Any]:
    out = [op.fn for op in graph.operators if op.kind == g.SINK]
    out += [op.dead_letter for op in graph.operators if op.dead_letter is not None]
    return out


def deploy(graph: g.JobGraph, config: JobConfig, address: str | None = None,
           controllers: Sequence[Any] = (), restore_from: str | None = None,
           allow_non_restored_state: bool = False, detached: bool = False) -> JobHandle:
    """Start ``graph`` on Ray: one JobMaster actor, which deploys the task actors (from the
    checkpoint or savepoint at ``restore_from`` when given: see ``StreamJob.run``), then
    runs ``controllers``. Raises ``UserFunctionError`` when an operator's ``open()`` raised
    (naming operator and task), ``JobFailedError`` when a task could not start,
    ``RestoreError`` when the checkpoint cannot be restored, ``ControlTimeout`` when the
    JobMaster did not finish deploying within ``Deadlines.start_s``; the job is torn down.
    ``ControllerError`` (before anything is deployed) when one of ``controllers`` is no
    controller or two share a name. ``RayUnavailable`` when no Ray is connected and none
    could be started or reached.

    ``detached``: the JobMaster and the tasks are detached actors: the job outlives this
    process (the driver may exit; ``engine.attach`` reaches it from another), Ray restarts
    its JobMaster when its process dies, and the new JobMaster takes the job over from its
    durable record (``engine.runtime.failover``). Otherwise the job ends with its
    driver, as in Flink's attached mode."""
    from engine.control.reconfiguration import check_controller

    names: list[str] = []
    for c in controllers:
        names.append(check_controller(c, names))
    if not ray.is_initialized():
        local_ray.connect(address, namespace=NAMESPACE, log_to_driver=True,
                          configure_logging=False)
    if detached and local_ray.started_here():
        log.warning("job %r runs detached on a Ray instance this process started: it ends "
                    "when this process exits all the same (Ray stops with it). Start Ray "
                    "apart (`ray start --head`, a KubeRay cluster) and connect to it "
                    "(RAY_ADDRESS, job.run(address=...)), or submit the script with "
                    "`ray job submit`", graph.name)
    for sink in _sinks_of(graph):
        sink.prepare()
    for warning in at_least_once_warnings(sink_guarantees(graph, config,
                                                          restoring=restore_from is not None)):
        log.warning("job %r: %s", graph.name, warning)
    job_id = f"{graph.name}-{uuid.uuid4().hex[:8]}"
    # on the driver's node when it can be (soft): the metrics endpoint is then where the
    # job was started (the head pod under ray job submit, which deploy/k8s scrapes)
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    lifetime: dict[str, Any] = dict(lifetime="detached", max_restarts=-1) if detached else {}
    master = RemoteJobMaster.options(
        name=f"{job_id}/master", namespace=NAMESPACE, num_cpus=0, max_concurrency=10_000,
        scheduling_strategy=here, **lifetime,
    ).remote(graph, config, job_id, restore_from, allow_non_restored_state, detached)
    assert isinstance(master, ActorHandle)  # ray's annotation of .remote() allows the class too
    d = Deadlines.of(config)
    try:
        url = ray.get(master.start.remote(), timeout=d.for_ray(d.start_s))
    except RayError as exc:
        with contextlib.suppress(Exception):
            ray.kill(master)
        if detached:  # its tasks are detached: nothing else would end them
            with contextlib.suppress(Exception):
                kill_job_actors(job_id, masters=True)
        _raise(exc, job_id, "start", d.start_s)
    registry.record(job_id, url, detached)  # reachable by name from other processes
    handle = JobHandle(master, job_id, url, config, detached)
    try:
        # part of the start: the JobMaster's process may first import the controllers'
        # modules (unpickling them), seconds on a loaded machine, so the start's deadline
        for c in controllers:
            handle._add_controller(c, d.start_s)
    except BaseException:
        with contextlib.suppress(Exception):
            handle.stop()
        raise
    return handle


def find(job: str, address: str | None = None, config: JobConfig | None = None) -> JobHandle:
    """A ``JobHandle`` on the running job ``job`` (``registry.resolve`` finds it by name or
    id, on this machine or on the cluster at ``address``); ``JobNotFound`` says why not.
    ``config`` gives the handle's deadlines (default ``JobConfig()``'s)."""
    job_id, ray_address = registry.resolve(job, address)
    try:
        master = ray.get_actor(f"{job_id}{registry.MASTER_SUFFIX}", namespace=NAMESPACE)
    except ValueError:
        raise JobNotFound(f"job {job_id} is no longer running on {ray_address}") from None
    handle = JobHandle(master, job_id, "", config)
    status = handle.status()
    handle.metrics_url, handle.detached = status.metrics_url, status.detached
    return handle


def attach(job: str, address: str | None = None, config: JobConfig | None = None
           ) -> JobHandle:
    """A ``JobHandle`` on the running job ``job`` (its name, when one running job has it,
    or its id) from any process: one connected to the job's Ray cluster, one given its
    ``address`` (GCS ``host:port`` or ``ray://host:10001``; default ``RAY_ADDRESS``), or
    one on the machine where its driver wrote its address file (``reflow list`` shows
    them). ``JobNotFound`` for a name no running job has, listing those it knows (names
    and ids) and what to pass; ``JobNotRunningError`` for a known job that has ended;
    ``RayUnavailable`` when its cluster does not answer. ``config``: the handle's deadlines
    (default ``JobConfig()``'s). Stopping the handle stops the job; dropping it does not."""
    return find(job, address, config)


def _location(location: Any, call: str) -> str:
    """A savepoint location from the user: a non-empty path or URI, a relative path made
    absolute here (the JobMaster writes it from another working directory)."""
    from engine.checkpoints.store import absolute_location
    from engine.errors import ConfigError

    if not isinstance(location, str) or not location.strip():
        raise ConfigError(f"{call}: savepoint location {location!r} names no directory or "
                          "URI; give one, or None for the job's checkpoint directory")
    return absolute_location(location)
