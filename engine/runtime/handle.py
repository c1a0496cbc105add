"""The driver's side: ``deploy`` starts a job's JobMaster; ``JobHandle`` talks to it.

Why separate: this is the code that runs in the user's process. Every call goes to the
JobMaster actor and comes back as msgpack wire values (``engine.messages``); the errors a
user sees are reflow's (``engine.errors``), with Ray's as their cause.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from typing import Any

import ray
from ray.exceptions import RayActorError

from engine import graph as g
from engine.config import JobConfig
from engine.errors import JobFailedError, RescaleRefused, UserFunctionError
from engine.messages import JobStatus, decode_message
from engine.metrics import JobMetrics
from engine.runtime.job_master import NAMESPACE, RemoteJobMaster
from migration.report import RescaleReport

_ACTIVE = ("created", "running")
# ====================================================================== driver side


class JobHandle:
    """The driver's handle on a running job."""

    def __init__(self, master: Any, job_id: str, metrics_url: str) -> None:
        self._master = master
        self.job_id = job_id
        self.metrics_url = metrics_url

    def status(self) -> JobStatus:
        return decode_message(ray.get(self._master.status.remote()))

    def wait(self, timeout: float | None = None) -> JobStatus:
        """Block until the job ends. Raises ``UserFunctionError``/``JobFailedError`` when it
        failed and ``TimeoutError`` when it still runs after ``timeout`` seconds."""
        st: JobStatus = decode_message(ray.get(self._master.wait.remote(timeout)))
        if st.state == "failed":
            if st.record:
                raise UserFunctionError(st.operator, st.task_index, st.record, st.cause)
            raise JobFailedError(st.error)
        if st.state in _ACTIVE:
            raise TimeoutError(f"job {self.job_id} still {st.state} after {timeout} s")
        return st

    def stop(self) -> None:
        """Stop the job (sinks are flushed) and release its actors."""
        with contextlib.suppress(RayActorError):
            ray.get(self._master.stop.remote())
        with contextlib.suppress(Exception):
            ray.kill(self._master)

    def metrics(self) -> JobMetrics:
        from engine.codec import unpack_exact

        state, tasks, rescales, url = unpack_exact(ray.get(self._master.metrics.remote()))
        return JobMetrics(self.job_id, state, tuple(decode_message(t) for t in tasks),
                          tuple(decode_message(r) for r in rescales), url or None)

    def rescale(self, operator: str, parallelism: int, protocol: str = "drrs",
                planning: Any = None) -> RescaleReport:
        """Change ``operator``'s parallelism while the job runs; returns the report.

        ``protocol``: one of ``migration.protocols.PROTOCOLS``. ``planning``: a
        ``migration.planning.Planning`` ordering (and, for non-disruptive, chunking) the
        moving key groups; None uses the protocol's default (the adaptive strategy for
        non-disruptive). Raises ``RescaleRefused`` (job untouched) for an invalid request."""
        return self._rescale(operator, parallelism, protocol, None, planning)

    def set_replication(self, operator: str, policy: str, period_s: float | None = None,
                        hot_fraction: float | None = None) -> None:
        """Keep replicas of ``operator``'s key groups on other tasks ("hot": the busiest
        ``hot_fraction``, "all", or "none"), refreshed every ``period_s`` with the changes
        since the last refresh; a later migration to a replica's holder ships only the
        changes. Defaults come from ``JobConfig``."""
        try:
            ray.get(self._master.set_replication.remote(operator, policy, period_s, hot_fraction))
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if hasattr(exc, "cause") else None
            if isinstance(cause, RescaleRefused):
                raise cause from None
            raise

    def rebalance(self, operator: str, assignment: Sequence[int], protocol: str = "drrs",
                  planning: Any = None) -> RescaleReport:
        """Move key groups so that key group ``kg`` is held by task ``assignment[kg]``; the
        parallelism becomes ``max(assignment) + 1``."""
        a = tuple(int(t) for t in assignment)
        if not a:
            raise RescaleRefused("the assignment is empty; give one task index per key group")
        return self._rescale(operator, max(a) + 1, protocol, a, planning)

    def _rescale(self, operator: str, parallelism: int, protocol: str,
                 assignment: tuple[int, ...] | None, planning: Any = None) -> RescaleReport:
        try:
            return decode_message(ray.get(self._master.rescale.remote(
                operator, parallelism, protocol, assignment, planning)))
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if hasattr(exc, "cause") else None
            if isinstance(cause, (RescaleRefused, JobFailedError)):
                raise cause from None
            raise

    def __enter__(self) -> JobHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _sinks_of(graph: g.JobGraph) -> list[Any]:
    out = [op.fn for op in graph.operators if op.kind == g.SINK]
    out += [op.dead_letter for op in graph.operators if op.dead_letter is not None]
    return out


def deploy(graph: g.JobGraph, config: JobConfig, address: str | None = None) -> JobHandle:
    """Start ``graph`` on Ray: one JobMaster actor, which deploys the task actors."""
    if not ray.is_initialized():
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=True,
                 configure_logging=False)
    for sink in _sinks_of(graph):
        sink.prepare()
    job_id = f"{graph.name}-{uuid.uuid4().hex[:8]}"
    master = RemoteJobMaster.options(
        name=f"{job_id}/master", namespace=NAMESPACE, num_cpus=0, max_concurrency=10_000,
    ).remote(graph, config, job_id)
    try:
        url = ray.get(master.start.remote())
    except Exception:
        with contextlib.suppress(Exception):
            ray.kill(master)
        raise
    return JobHandle(master, job_id, url)

