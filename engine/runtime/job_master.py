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
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from engine import graph as g
from engine.clock import SystemClock
from engine.codec import pack_exact
from engine.config import JobConfig
from engine.deployment import ChannelIds, Deployment, connect_messages, initial_deployment
from engine.messages import (
    JobStatus,
    Start,
    StopTask,
    TaskFailed,
    TaskFinished,
    decode_message,
    encode_message,
)
from engine.metrics import JobCollector, MetricsEndpoint, TaskMetrics
from engine.names import JobState
from engine.physical import PhysicalPlan, plan_physical
from engine.runtime.replicas import ReplicaKeeper
from engine.runtime.rescaling import Rescaler
from engine.runtime.task_actor import RemoteTask
from engine.task import TaskSpec
from migration.coordinator import (
    SubscaleIds,
)

NAMESPACE = "reflow"


class JobMaster:
    """Deploys the job, runs rescales, watches tasks, serves metrics."""

    def __init__(self, graph: g.JobGraph, config: JobConfig, job_id: str) -> None:
        self.graph = graph
        self.config = config
        self.job_id = job_id
        self.clock = SystemClock()
        self.plan: PhysicalPlan = plan_physical(graph)
        self.dep: Deployment = initial_deployment(self.plan, job_id)
        self.ids = ChannelIds()
        self.subscale_ids = SubscaleIds()
        self.handles: dict[str, Any] = {}
        self.state = JobState.CREATED
        self.failure: TaskFailed | None = None
        self.error = ""
        self.finished: set[str] = set()
        self.epoch = 0
        self.collector = JobCollector(job_id)
        self.endpoint: MetricsEndpoint | None = None
        self.replicas = ReplicaKeeper(self)
        self.rescaler = Rescaler(self)
        self._changed = asyncio.Event()
        self._vertex_locks: dict[str, asyncio.Lock] = {}
        self._standby: list[Any] = []
        self._configuring: dict[str, Any] = {}
        self._background: list[asyncio.Task[None]] = []

    # -- plumbing
    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def vertex_lock(self, vertex: str) -> asyncio.Lock:
        return self._vertex_locks.setdefault(vertex, asyncio.Lock())

    def changed(self) -> asyncio.Event:
        """Set at the next change of the job (a report, a failure, a stop)."""
        return self._changed

    def create_task_actor(self, vertex: str, name: str, dep: Deployment) -> None:
        self._create(name, self._spec(vertex, dep.tasks[vertex].index(name), name, dep))

    def refill_standby_later(self) -> None:
        self._refill_standby_later()

    async def maybe_finish(self) -> None:
        await self._maybe_finish()

    async def fail(self, error: str) -> None:
        await self._fail(error)

    async def call(self, task: str, msg: Any, introduce: Any = ()) -> Any:
        """Send a control message to ``task`` (after its configuration, for a standby
        actor) and return its decoded reply; ``introduce``: tasks whose handles go along."""
        pending = self._configuring.pop(task, None)
        if pending is not None:
            await pending
        handles = {n: self.handles[n] for n in introduce} or None
        return decode_message(await self.handles[task].control.remote(encode_message(msg),
                                                                       handles))

    def _spec(self, vertex_name: str, index: int, name: str, dep: Deployment) -> TaskSpec:
        v = dep.plan.vertex(vertex_name)
        key_fns = {e.edge_id: e.key_fn for e in dep.plan.outputs_of(v.name)
                   if e.key_fn is not None}
        return TaskSpec(self.job_id, v.name, name, index, v.parallelism, v.operators,
                        dep.plan.num_key_groups, self.config, key_fns,
                        dep.key_groups_of(v.name, index))

    def _create(self, name: str, spec: TaskSpec) -> None:
        """A task actor for ``spec``: a warm standby one when the pool has one (its
        ``configure`` call is awaited before any other call reaches it), else a new actor."""
        if self._standby:
            handle = self._standby.pop()
            self._configuring[name] = handle.configure.remote(spec)
            self.handles[name] = handle
            return
        me = ray.get_runtime_context().current_actor
        self.handles[name] = RemoteTask.options(
            name=name, namespace=NAMESPACE, num_cpus=self.config.task_num_cpus,
            max_concurrency=10_000,
        ).remote(spec, me)

    def _refill_standby_later(self) -> None:
        """After a rescale: top the pool up ``warm_standby_refill_s`` later. Starting an
        actor costs a few CPU-seconds; doing it during the rescale that drew on the pool
        would slow the very migration the pool is there to speed up."""
        if len(self._standby) < self.config.warm_standby_tasks:
            asyncio.get_running_loop().call_later(self.config.warm_standby_refill_s,
                                                  self._fill_standby)

    def _fill_standby(self) -> None:
        if not self.state.active:
            return
        me = ray.get_runtime_context().current_actor
        while len(self._standby) < self.config.warm_standby_tasks:
            self._standby.append(RemoteTask.options(
                namespace=NAMESPACE, num_cpus=self.config.task_num_cpus, max_concurrency=10_000,
            ).remote(None, me))

    # -- lifecycle
    async def start(self) -> str:
        for v in self.plan.vertices:
            for i, name in enumerate(self.dep.tasks[v.name]):
                self._create(name, self._spec(v.name, i, name, self.dep))
        msgs = connect_messages(self.dep, self.ids)
        # receivers first, so a channel exists before anything is sent on it
        order = [t for v in reversed(self.dep.plan.vertices) for t in self.dep.tasks[v.name]]
        await asyncio.gather(*(self.call(t, msgs[t], [c.target for e in msgs[t].outputs
                                                      for c in e.channels]) for t in order))
        self.state = JobState.RUNNING
        try:
            for v in reversed(self.plan.vertices):  # sources last
                await asyncio.gather(*(self.call(t, Start()) for t in self.dep.tasks[v.name]))
        except RayActorError:
            if self.state != JobState.FAILED:  # a task failing at once tears the job down
                raise
        if self.config.metrics_port is not None:
            self.endpoint = MetricsEndpoint(self.collector, self.config.metrics_host,
                                            self.config.metrics_port)
        loop = asyncio.get_running_loop()
        self._background = [loop.create_task(self._poll_metrics()),
                            loop.create_task(self.replicas.loop())]
        self._fill_standby()
        return self.endpoint.url if self.endpoint else ""

    async def report(self, payload: bytes) -> None:
        """A task's report: job-level bookkeeping, then every running rescale sees it."""
        msg = decode_message(payload)
        if isinstance(msg, TaskFinished):
            self.finished.add(msg.task)
        elif isinstance(msg, TaskFailed) and self.state.active:
            self.failure = msg
            self.error = (f"task {msg.task} of operator {msg.operator!r} failed: "
                          f"{msg.cause}" + (f" on record {msg.record}" if msg.record else ""))
            await self._fail()
        self.rescaler.on_report(msg)
        if isinstance(msg, TaskFinished):
            await self._maybe_finish()
        self._notify()

    async def set_replication(self, operator: str, policy: str, period_s: float | None,
                              hot_fraction: float | None) -> None:
        await self.replicas.set_policy(operator, policy, period_s, hot_fraction)

    async def _maybe_finish(self) -> None:
        """The job is finished when every task is; a running rescale defers the teardown."""
        if self.rescaling:
            return
        if self.state == JobState.RUNNING and all(n in self.finished
                                                  for n in self.dep.task_names()):
            self.state = JobState.FINISHED
            await self._teardown()

    async def _fail(self, error: str | None = None) -> None:
        if error is not None:
            self.error = error
        self.state = JobState.FAILED
        self._notify()
        await self._teardown()

    async def _teardown(self) -> None:
        self.collector.running = 0
        for h in [*self.handles.values(), *self._standby]:
            with contextlib.suppress(Exception):
                ray.kill(h)
        self.handles.clear()
        self._standby.clear()

    async def _poll_metrics(self) -> None:
        while self.state.active:
            await asyncio.sleep(self.config.metrics_poll_interval_s)
            names = [n for n in self.dep.task_names()
                     if n in self.handles and n not in self.finished]
            refs = {n: self.handles[n].metrics.remote() for n in names}
            for n, ref in refs.items():
                try:
                    self.collector.tasks[n] = decode_message(await asyncio.wait_for(ref, 10.0))
                except RayActorError as exc:
                    if self.state == JobState.RUNNING and n in self.dep.task_names():
                        await self._fail(f"task {n} died: {exc}")
                        return
                except (TimeoutError, GetTimeoutError):
                    continue
            live = set(self.dep.task_names())
            self.collector.tasks = {k: v for k, v in self.collector.tasks.items() if k in live}

    # -- driver API
    def status(self) -> bytes:
        f = self.failure
        return encode_message(JobStatus(
            self.job_id, str(self.state), self.error,
            f.operator if f else "", f.task_index if f else -1, f.record if f else "",
            f.cause if f else "", self.endpoint.url if self.endpoint else "",
            len(self._standby),
        ))

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
        snaps: list[TaskMetrics] = []
        for n in [n for n in self.dep.task_names() if n in self.handles]:
            h = self.handles.get(n)
            if h is None:  # torn down meanwhile
                continue
            try:
                snaps.append(decode_message(await h.metrics.remote()))
            except RayActorError:
                continue
        for s in snaps:
            self.collector.tasks[s.task] = s
        return pack_exact([
            str(self.state), [encode_message(s) for s in snaps],
            [encode_message(r) for r in self.collector.rescales.values()],
            self.endpoint.url if self.endpoint else "",
        ])

    async def stop(self) -> None:
        if self.state.active:
            for n in list(self.handles):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.call(n, StopTask()), 10.0)
            self.state = JobState.STOPPED
        await self._teardown()
        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None
        self._notify()

    # -- rescale (``engine.runtime.rescaling`` runs the coordinator's commands)
    async def rescale(self, operator: str, parallelism: int, protocol: str,
                      assignment: tuple[int, ...] | None = None, planning: Any = None) -> bytes:
        return encode_message(await self.rescaler.rescale(operator, parallelism, protocol,
                                                          assignment, planning))

    @property
    def rescaling(self) -> bool:
        return self.rescaler.running


RemoteJobMaster = ray.remote(max_restarts=0, max_task_retries=0)(JobMaster)

__all__ = ["NAMESPACE", "JobMaster", "RemoteJobMaster"]
