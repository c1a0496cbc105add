"""The driver's side: ``deploy`` starts a job's JobMaster; ``JobHandle`` talks to it.

Why separate: this is the code that runs in the user's process. Every call goes to the
JobMaster actor and comes back as msgpack wire values (``engine.messages``).

Guarantees: every call has a deadline (``engine.runtime.deadlines``: ``control_timeout_s``
for status and metrics, windows derived from ``rescale_timeout_s`` for rescales); no call
raises one of Ray's exceptions: a reflow error raised in the JobMaster (or in a task
behind it) is raised as itself, a JobMaster that does not answer in time raises
``ControlTimeout``, a dead one ``JobMasterLost`` (Ray's error as the ``__cause__``),
anything else ``InternalError`` (``engine.runtime.failures.translate``).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Sequence
from typing import Any, NoReturn

import ray
from ray.exceptions import RayActorError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from engine import graph as g
from engine.config import JobConfig, check_count
from engine.errors import (
    ControlTimeout,
    JobFailedError,
    ReflowError,
    RescaleRefused,
    UserFunctionError,
    WaitTimeout,
)
from engine.messages import JobStatus, decode_message
from engine.metrics import JobMetrics
from engine.runtime import registry
from engine.runtime.deadlines import Deadlines
from engine.runtime.failures import reflow_error_in, translate
from engine.runtime.job_master import NAMESPACE, RemoteJobMaster
from migration.report import RescaleReport

_ACTIVE = ("created", "running")


class JobHandle:
    """The driver's handle on a running job. Every method has a deadline (see each) and
    raises only reflow's errors (``engine.errors``)."""

    def __init__(self, master: Any, job_id: str, metrics_url: str,
                 config: JobConfig | None = None) -> None:
        self._master = master
        self.job_id = job_id
        self.metrics_url = metrics_url
        self.deadlines = Deadlines.of(config or JobConfig())

    def _get(self, ref: Any, call: str, seconds: float) -> Any:
        """``ray.get(ref)`` within ``seconds``, Ray's errors translated."""
        try:
            return ray.get(ref, timeout=seconds)
        except RayError as exc:
            _raise(exc, self.job_id, call, seconds)

    def status(self) -> JobStatus:
        """The job's state, error, standby pool and unresponsive tasks; within
        ``control_timeout_s`` (``ControlTimeout`` otherwise)."""
        return decode_message(self._get(self._master.status.remote(), "status",
                                        self.deadlines.control_s))

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
            st: JobStatus = decode_message(self._get(
                self._master.wait.remote(chunk), "wait", chunk + d.control_s))
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

    def stop(self) -> None:
        """Stop the job (sinks are flushed) and release its actors. The JobMaster stops the
        tasks within ``Deadlines.stop_budget_s``; it is killed in any case. A JobMaster
        already gone is not an error; one that does not answer in time raises
        ``ControlTimeout`` (after it was killed: sinks may not have been flushed)."""
        failed: ReflowError | None = None
        try:
            ray.get(self._master.stop.remote(), timeout=self.deadlines.stop_s)
        except RayActorError:
            pass  # gone already: nothing left to stop
        except RayError as exc:
            failed = translate(exc, job=self.job_id, call="stop", seconds=self.deadlines.stop_s)
            failed.__cause__ = exc
        with contextlib.suppress(Exception):
            ray.kill(self._master)
        registry.forget(self.job_id)
        if failed is not None:
            raise failed

    def metrics(self) -> JobMetrics:
        """Every live task's latest snapshot, the rescales' progress and the tasks that did
        not answer (with seconds since they last did); within ``control_timeout_s``."""
        from engine.codec import unpack_exact

        state, tasks, rescales, url, silent = unpack_exact(self._get(
            self._master.metrics.remote(), "metrics", self.deadlines.control_s))
        return JobMetrics(self.job_id, state, tuple(decode_message(t) for t in tasks),
                          tuple(decode_message(r) for r in rescales), url or None,
                          tuple((t, float(s)) for t, s in silent))

    def rescale(self, operator: str, parallelism: int, protocol: str = "drrs",
                planning: Any = None) -> RescaleReport:
        """Change ``operator``'s parallelism while the job runs; returns the report.

        ``protocol``: one of ``migration.protocols.PROTOCOLS``. ``planning``: a
        ``migration.planning.Planning`` ordering (and, for non-disruptive, chunking) the
        moving key groups; None uses the protocol's default (the adaptive strategy for
        non-disruptive). Raises ``RescaleRefused`` (job untouched) for an invalid request
        or one that failed before anything changed (e.g. a task did not answer within
        ``rescale_timeout_s``: the error names it), ``JobFailedError`` when it failed after.

        Deadline: the JobMaster bounds each step of a rescale by ``rescale_timeout_s``, but
        a rescale has as many steps as it needs; so this waits as long as the JobMaster
        runs new steps, and raises ``ControlTimeout`` when it ran none for
        ``Deadlines.rescale_window_s`` (2 × (rescale_timeout_s + control_timeout_s)) or
        did not answer within ``control_timeout_s`` when asked."""
        return self._rescale(operator, parallelism, protocol, None, planning)

    def set_replication(self, operator: str, policy: str, period_s: float | None = None,
                        hot_fraction: float | None = None) -> None:
        """Keep replicas of ``operator``'s key groups on other tasks ("hot": the busiest
        ``hot_fraction``, "all", or "none"), refreshed every ``period_s`` with the changes
        since the last refresh; a later migration to a replica's holder ships only the
        changes. Defaults come from ``JobConfig``. Within ``control_timeout_s``."""
        self._get(self._master.set_replication.remote(operator, policy, period_s, hot_fraction),
                  "set_replication", self.deadlines.control_s)

    def rebalance(self, operator: str, assignment: Sequence[int], protocol: str = "drrs",
                  planning: Any = None) -> RescaleReport:
        """Move key groups so that key group ``kg`` is held by task ``assignment[kg]``; the
        parallelism becomes ``max(assignment) + 1``. Errors and deadline as ``rescale``."""
        a = tuple(check_count(f"assignment for {operator!r}: the task index of key group {kg}",
                              t, 0, RescaleRefused) for kg, t in enumerate(assignment))
        if not a:
            raise RescaleRefused("the assignment is empty; give one task index per key group")
        return self._rescale(operator, max(a) + 1, protocol, a, planning)

    def _rescale(self, operator: str, parallelism: int, protocol: str,
                 assignment: tuple[int, ...] | None, planning: Any = None) -> RescaleReport:
        d = self.deadlines
        ref = self._master.rescale.remote(operator, parallelism, protocol, assignment, planning)
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


def deploy(graph: g.JobGraph, config: JobConfig, address: str | None = None) -> JobHandle:
    """Start ``graph`` on Ray: one JobMaster actor, which deploys the task actors. Raises
    ``UserFunctionError`` when an operator's ``open()`` raised (naming operator and task),
    ``JobFailedError`` when a task could not start, ``ControlTimeout`` when the JobMaster
    did not finish deploying within ``Deadlines.start_s``; the job is torn down."""
    if not ray.is_initialized():
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=True,
                 configure_logging=False)
    for sink in _sinks_of(graph):
        sink.prepare()
    job_id = f"{graph.name}-{uuid.uuid4().hex[:8]}"
    # on the driver's node when it can be (soft): the metrics endpoint is then where the
    # job was started (the head pod under ray job submit, which deploy/k8s scrapes)
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    master = RemoteJobMaster.options(
        name=f"{job_id}/master", namespace=NAMESPACE, num_cpus=0, max_concurrency=10_000,
        scheduling_strategy=here,
    ).remote(graph, config, job_id)
    d = Deadlines.of(config)
    try:
        url = ray.get(master.start.remote(), timeout=d.for_ray(d.start_s))
    except RayError as exc:
        with contextlib.suppress(Exception):
            ray.kill(master)
        _raise(exc, job_id, "start", d.start_s)
    registry.record(job_id, url)  # reachable by name from other processes
    return JobHandle(master, job_id, url, config)
