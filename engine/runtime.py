"""The Ray shells: the task actor, the JobMaster actor, and the driver's ``JobHandle``.

This is the only module that applies Ray. Logic lives in pure classes (``TaskCore``,
``Deployment``, the migration plans); the shells move bytes and wait.

Data frames are msgpack bytes sent over a direct socket between task actors
(``engine.transport``; ``JobConfig(transport="ray")``: as actor-call arguments); control
messages are declared wire dataclasses encoded with msgpack (``engine.messages``) and travel
as actor calls. Task specs and the job
graph hold user code and travel once, at deployment, through Ray's own serialisation.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections import deque
from collections.abc import Sequence
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from engine import graph as g
from engine.channel import CreditGate
from engine.clock import SystemClock
from engine.config import JobConfig
from engine.deployment import (
    ChannelIds,
    Deployment,
    connect_messages,
    initial_deployment,
    task_name,
)
from engine.errors import (
    DataChannelError,
    JobFailedError,
    RescaleRefused,
    UserFunctionError,
)
from engine.keygroups import moved_key_groups, uniform_assignment, validate_assignment
from engine.messages import (
    AddInputs,
    AddOutputChannels,
    DescribeTask,
    Drained,
    DropReplicas,
    ExpectIncoming,
    ExpectOutgoing,
    GroupStatsRequest,
    HoldFinish,
    InjectSubscale,
    InstallKeyGroups,
    JobStatus,
    KeyGroupSnapshot,
    OutputChannel,
    PauseSource,
    PriorityBatch,
    RefreshReplicas,
    RemoveOutputChannels,
    ReplicasRefreshed,
    ReplicaUpdate,
    Resume,
    SnapshotKeyGroups,
    SourcePaused,
    Start,
    StopTask,
    SubscaleDone,
    TaskFailed,
    TaskFinished,
    TaskState,
    decode_message,
    encode_message,
)
from engine.metrics import JobCollector, JobMetrics, MetricsEndpoint, RescaleProgress, TaskMetrics
from engine.physical import PhysicalPlan, plan_physical
from engine.task import FAILED, RUNNING, TaskCore, TaskSpec
from engine.transport import DataClient, DataServer, ServerConnection
from migration.planning import (
    Planning,
    adaptive_planning,
    profiles_from_metrics,
    workload_from_profiles,
)
from migration.protocols import LIVE, PROTOCOLS, plan_live
from migration.protocols.drrs import REROUTE_PORT, SubscaleScheduler
from migration.protocols.live import LivePlan, LiveProtocol, StepScheduler
from migration.protocols.stop_restart import plan_stop_restart
from migration.replication import choose_replicated_groups, place_replicas
from migration.report import RescaleReport

NAMESPACE = "reflow"
_ACTIVE = ("created", "running")


# ====================================================================== task actor


class TaskActor:
    """Shell around one ``TaskCore``: receives frames, runs the loop, sends with credits."""

    def __init__(self, spec: TaskSpec | None, master: Any) -> None:
        """``spec`` None: a warm standby actor, made a task later by ``configure``."""
        self.master = master
        self.handles: dict[str, Any] = {}
        if spec is not None:
            self.configure(spec)
        self.in_flight: dict[int, deque[Any]] = {}
        # frame (channel, seq) -> how to acknowledge it once taken for processing: the
        # pending actor call's future (transport "ray") or the data connection ("tcp")
        self.acks: dict[tuple[int, int], asyncio.Future[None] | ServerConnection] = {}
        self._server: DataServer | None = None
        self._clients: dict[str, DataClient] = {}
        self._connecting: dict[str, asyncio.Future[DataClient]] = {}
        self.core: TaskCore
        self._wake: asyncio.Event | None = None
        self._send_lock: asyncio.Lock | None = None
        self._kick: asyncio.Event | None = None
        self._loop_task: asyncio.Task[None] | None = None

    def configure(self, spec: TaskSpec) -> None:
        self.core = TaskCore(spec, SystemClock())
        self.clock = self.core.clock
        self.gate = CreditGate(spec.config.credits)

    def _event(self) -> asyncio.Event:
        if self._wake is None:
            self._wake = asyncio.Event()
            self._send_lock = asyncio.Lock()
            self._kick = asyncio.Event()
        return self._wake

    async def data_address(self) -> tuple[str, int, bytes]:
        """Where and with which token to open a data connection to this task (its server
        starts on the first ask)."""
        cfg = self.core.spec.config
        if self._server is None:
            self._server = DataServer(self._on_frame)
        port = await self._server.start(cfg.data_host)
        host = cfg.data_host
        if host in ("0.0.0.0", "::"):
            host = ray.util.get_node_ip_address()
        return host, port, self._server.token

    def _on_frame(self, channel_id: int, seq: int, payload: bytes, conn: ServerConnection) -> None:
        """A data frame from the socket: as ``push``, acknowledged through ``conn``."""
        core = self.core
        if core.status not in _ACTIVE:
            conn.ack(channel_id, seq)
            return
        try:
            core.receive(channel_id, seq, payload)
        except Exception as exc:  # the sender fails the job naming this task
            conn.nack(channel_id, seq, f"{type(exc).__name__}: {exc}")
            return
        self.acks[(channel_id, seq)] = conn
        self._event().set()

    def _connected(self, target: str) -> DataClient | None:
        """The data connection to ``target`` if one is open."""
        client = self._clients.get(target)
        return client if client is not None and not client.closed else None

    async def _client(self, target: str) -> DataClient:
        """The data connection to ``target``, opened on first use (one at a time)."""
        client = self._connected(target)
        if client is not None:
            return client
        pending = self._connecting.get(target)
        if pending is None:
            pending = asyncio.ensure_future(self._open_client(target))
            self._connecting[target] = pending
            pending.add_done_callback(lambda _f: self._connecting.pop(target, None))
        return await asyncio.shield(pending)

    async def _open_client(self, target: str) -> DataClient:
        handle = self.handles[target]
        try:
            host, port, token = await handle.data_address.remote()
            client = await DataClient.connect(host, port, token, target)
        except (RayActorError, OSError) as exc:
            if self.handles.get(target) is not handle:  # replaced meanwhile: try the new one
                return await self._open_client(target)
            raise _DownstreamDied(f"cannot open a data connection to task {target}: "
                                  f"{type(exc).__name__}: {exc}") from exc
        if self.handles.get(target) is not handle:  # the name now stands for a new actor
            client.close()
            return await self._open_client(target)
        old = self._clients.get(target)
        if old is not None:
            old.close()
        self._clients[target] = client
        return client

    def _new_handles(self, handles: dict[str, Any]) -> None:
        """Take the handles a control call brings. A name that now stands for another
        actor (a task removed, a new one made under its name) drops the old connection;
        connections to new receivers open in the background, ahead of the first frame."""
        for name, h in handles.items():
            old = self.handles.get(name)
            if old is not None and old._actor_id != h._actor_id:
                client = self._clients.pop(name, None)
                if client is not None:
                    client.close()
            self.handles[name] = h
        if self.core.spec.config.transport == "tcp":
            for name in handles:
                if name not in self._clients and name not in self._connecting:
                    asyncio.ensure_future(self._client(name)).add_done_callback(_quiet)

    async def push(self, channel_id: int, seq: int, payload: bytes) -> None:
        """A data frame (transport "ray"); returns once the task has taken it for
        processing (the ack)."""
        core = self.core
        if core.status not in _ACTIVE:
            return
        core.receive(channel_id, seq, payload)
        fut = asyncio.get_running_loop().create_future()
        self.acks[(channel_id, seq)] = fut
        self._event().set()
        await fut

    async def control(self, payload: bytes, handles: dict[str, Any] | None = None) -> bytes:
        msg = decode_message(payload)
        wake = self._event()
        if handles:
            self._new_handles(handles)
        reply = self.core.handle(msg)
        if isinstance(msg, RefreshReplicas):
            reply = await self._send_replicas(reply)
        if isinstance(msg, Start) and self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._loop())
        self._send_priority()
        # a task no longer running (finished: e.g. a source whose input ended, while a rescale
        # injects barriers) has a loop that is gone or past its last send: what this call
        # queued would never leave, so send everything now, waiting for credits if need be
        loop_ended = self._loop_task is not None and self._loop_task.done()
        blocking = (loop_ended or self.core.status != RUNNING
                    or isinstance(msg, (StopTask, RemoveOutputChannels, PauseSource)))
        await self._send_outbox(block=blocking)
        if isinstance(msg, RemoveOutputChannels):
            await self._settle_in_flight(set(msg.channel_ids))
        if isinstance(msg, StopTask):
            await self._settle_in_flight()
        self._send_reports()
        self._ack_consumed()
        wake.set()
        return encode_message(reply)

    async def _send_replicas(self, reply: ReplicasRefreshed) -> ReplicasRefreshed:
        """Send the replica refreshes and wait for the holders: a refresh is complete (and
        a migration may rely on it) once the holder has applied it."""
        out = self.core.priority_out
        updates = [(t, m) for t, m in out if isinstance(m, ReplicaUpdate)]
        out[:] = [(t, m) for t, m in out if not isinstance(m, ReplicaUpdate)]
        acks = await asyncio.gather(*(self.handles[t].control.remote(encode_message(m))
                                      for t, m in updates))
        dropped = tuple(a.key_group for a in map(decode_message, acks) if not a.kept)
        return dataclasses.replace(reply, dropped=dropped)

    def _send_priority(self) -> None:
        """Priority messages (DRRS triggers, state) jump every data queue: control calls,
        one per receiver, several messages batched in order."""
        out = self.core.priority_out
        if not out:
            return
        by_target: dict[str, list[Any]] = {}
        for target, msg in out:
            by_target.setdefault(target, []).append(msg)
        out.clear()
        for target, msgs in by_target.items():
            msg = msgs[0] if len(msgs) == 1 else PriorityBatch(tuple(msgs))
            self.handles[target].control.remote(encode_message(msg))

    async def metrics(self) -> bytes:
        return encode_message(self.core.metrics())

    def _ack_consumed(self) -> None:
        consumed = self.core.consumed
        if not consumed:
            return
        acks = self.acks
        for key in consumed:
            ack = acks.pop(key, None)
            if ack is not None:
                _acknowledge(key, ack)
        consumed.clear()

    def _release_all_acks(self) -> None:
        for key, ack in self.acks.items():
            _acknowledge(key, ack)
        self.acks.clear()

    def _send_reports(self) -> None:
        reports = self.core.reports
        while reports:
            self.master.report.remote(encode_message(reports.pop(0)))

    async def _send_outbox(self, block: bool = True) -> None:
        """Push outbox frames, each channel in order and within its credits. A channel out
        of credit holds back only its own frames (no head-of-line blocking across channels:
        DRRS needs a confirm barrier to pass while another channel is back-pressured). With
        ``block`` it waits until everything is sent; otherwise it sends what it can."""
        assert self._send_lock is not None and self._kick is not None
        if not block and self._send_lock.locked():
            self._kick.set()  # the loop is sending: it re-scans the outbox
            return
        tcp = self.core.spec.config.transport == "tcp"
        async with self._send_lock:
            outbox = self.core.router.outbox
            gate = self.gate
            while outbox:
                # connect first: the loop below must not await (a control call may add
                # frames to the outbox meanwhile, and the loop rewrites it)
                while tcp:
                    missing = {f.target for f in outbox if self._connected(f.target) is None}
                    if not missing:
                        break
                    for target in missing:
                        await self._client(target)
                self._kick.clear()
                self._reap_acks()
                blocked: set[int] = set()
                keep = []
                for f in outbox:
                    cid = f.channel_id
                    if cid in blocked or not gate.can_send(cid):
                        blocked.add(cid)
                        keep.append(f)
                        continue
                    if tcp:
                        fut = self._clients[f.target].send(cid, f.seq, f.payload)
                    else:
                        fut = asyncio.ensure_future(
                            self.handles[f.target].push.remote(cid, f.seq, f.payload))
                    self.in_flight.setdefault(cid, deque()).append(fut)
                    gate.on_send(cid)
                outbox.clear()
                outbox.extend(keep)
                if not outbox or not block:
                    return
                waits = [self.in_flight[c][0] for c in blocked]
                kick = asyncio.ensure_future(self._kick.wait())
                t0 = self.clock.monotonic()
                await asyncio.wait([*waits, kick], return_when=asyncio.FIRST_COMPLETED)
                kick.cancel()
                self.core.backpressured_s += self.clock.monotonic() - t0

    async def _await_ack(self, fut: Any) -> None:
        try:
            await fut
        except (RayActorError, DataChannelError) as exc:
            raise _DownstreamDied(str(exc)) from exc

    def _reap_acks(self) -> None:
        """Count acknowledged frames (oldest first per channel); a failed push means the
        receiver died."""
        for cid, q in self.in_flight.items():
            while q and q[0].done():
                fut = q.popleft()
                self.gate.on_ack(cid)
                exc = fut.exception()
                if exc is not None:
                    raise _DownstreamDied(str(exc))

    async def _settle_in_flight(self, channel_ids: set[int] | None = None) -> None:
        for cid, q in list(self.in_flight.items()):  # a control call may add channels meanwhile
            if channel_ids is not None and cid not in channel_ids:
                continue
            while q:
                await self._await_ack(q.popleft())
                self.gate.on_ack(cid)
                if not q:
                    break

    async def _loop(self) -> None:
        core, clock = self.core, self.clock
        cfg = core.spec.config
        marker_every = cfg.latency_marker_interval_ms / 1000.0
        timer_every = cfg.timer_check_interval_ms / 1000.0
        next_marker = clock.monotonic() + marker_every
        next_timer_check = 0.0
        strategy = core.wm_strategy
        wm_every = None if strategy is None else strategy.interval_ms / 1000.0
        next_wm = clock.monotonic()
        wake = self._event()
        try:
            while core.status == RUNNING:
                t0 = clock.monotonic()
                did = False
                if core.is_source:
                    did = core.poll_source(cfg.source_poll_records)
                else:
                    for _ in range(8):
                        if not core.step():
                            break
                        did = True
                if core.keyed is not None and t0 >= next_timer_check:
                    did = core.fire_timers() or did
                    next_timer_check = t0 + timer_every
                t1 = clock.monotonic()
                if did:
                    core.busy_s += t1 - t0
                self._ack_consumed()
                if core.priority_out:
                    self._send_priority()
                if core.is_source and t1 >= next_marker:
                    core.emit_latency_marker()
                    next_marker = t1 + marker_every
                if wm_every is not None and t1 >= next_wm:
                    core.emit_watermark()
                    next_wm = t1 + wm_every
                core.router.flush_due()
                await self._send_outbox()
                self._send_reports()
                if did:
                    await asyncio.sleep(0)
                    continue
                timeout = self._idle_timeout(t1, next_marker, timer_every)
                if not core.has_work():
                    wake.clear()
                    t2 = clock.monotonic()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wake.wait(), timeout)
                    core.idle_s += clock.monotonic() - t2
            await self._send_outbox()
            await self._settle_in_flight()
        except _DownstreamDied as exc:
            core.status = FAILED
            core.reports.append(TaskFailed(core.name, core.spec.vertex, core.spec.task_index, "",
                                           f"a downstream task died: {exc}"))
        except Exception as exc:  # an engine bug: fail loudly with the task named
            core.status = FAILED
            core.reports.append(TaskFailed(core.name, core.spec.vertex, core.spec.task_index, "",
                                           f"internal error {type(exc).__name__}: {exc}"))
        finally:
            self._ack_consumed()
            self._send_reports()
            if core.status != RUNNING:
                self._release_all_acks()

    def _idle_timeout(self, now: float, next_marker: float, timer_every: float) -> float:
        core = self.core
        candidates = [0.05]
        deadline = core.router.next_deadline()
        if deadline is not None:
            candidates.append(deadline - now)
        if core.is_source:
            candidates.append(core.seconds_until_source_ready())
            candidates.append(next_marker - now)
        if core.keyed is not None and core.next_timer_ms() is not None:
            candidates.append(timer_every)
        return max(0.0, min(candidates))


class _DownstreamDied(Exception):
    pass


def _acknowledge(key: tuple[int, int], ack: asyncio.Future[None] | ServerConnection) -> None:
    if isinstance(ack, ServerConnection):
        ack.ack(*key)
    elif not ack.done():
        ack.set_result(None)


def _quiet(fut: asyncio.Future[Any]) -> None:
    """A background connection attempt that failed: the next send tries again and fails
    the task with the reason."""
    if not fut.cancelled():
        fut.exception()


RemoteTask = ray.remote(max_restarts=0, max_task_retries=0)(TaskActor)


# ====================================================================== JobMaster


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
        self.handles: dict[str, Any] = {}
        self.state = "created"
        self.failure: TaskFailed | None = None
        self.error = ""
        self.finished: set[str] = set()
        self.drained: dict[int, set[str]] = {}
        self.paused_offsets: dict[str, Any] = {}
        self.epoch = 0
        self.collector = JobCollector(job_id)
        self.endpoint: MetricsEndpoint | None = None
        self._changed: asyncio.Event | None = None
        self._rescale_lock: asyncio.Lock | None = None
        self._vertex_locks: dict[str, asyncio.Lock] = {}
        self._standby: list[Any] = []
        self._configuring: dict[str, Any] = {}
        self._superseded: dict[str, int] = {}
        self._stop_restart_running = False
        self._drrs_running = 0
        self._next_subscale = 0
        self._subscale_reports: dict[int, dict[str, SubscaleDone]] = {}
        # replication: vertex -> (policy, period s, hot fraction); vertex -> kg -> (holder, version)
        self._replication: dict[str, tuple[str, float, float]] = {
            v.name: (config.replication, config.replication_period_s,
                     config.replication_hot_fraction)
            for v in self.plan.vertices if v.keyed and config.replication != "none"}
        self._replicas: dict[str, dict[int, tuple[str, int]]] = {}
        self._replicas_to_drop: dict[str, set[int]] = {}  # holder -> key groups
        self._replicator: asyncio.Task[None] | None = None
        self._poller: asyncio.Task[None] | None = None

    # -- plumbing
    def _ev(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
            self._rescale_lock = asyncio.Lock()
        return self._changed

    def _notify(self) -> None:
        ev = self._ev()
        ev.set()
        ev.clear()

    async def _until(self, cond: Any, timeout: float | None, what: str) -> None:
        ev = self._ev()
        deadline = None if timeout is None else self.clock.monotonic() + timeout
        while not cond():
            if self.state == "failed":
                raise JobFailedError(self.error)
            remaining = None if deadline is None else deadline - self.clock.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(what)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ev.wait(), min(0.5, remaining) if remaining else 0.5)

    async def _call(self, task: str, msg: Any, handles: dict[str, Any] | None = None) -> Any:
        pending = self._configuring.pop(task, None)
        if pending is not None:
            await pending
        return decode_message(await self.handles[task].control.remote(encode_message(msg), handles))

    def _spec(self, vertex_name: str, index: int, name: str, dep: Deployment) -> TaskSpec:
        v = dep.plan.vertex(vertex_name)
        key_fns = {e.edge_id: e.key_fn for e in dep.plan.outputs_of(v.name) if e.key_fn is not None}
        return TaskSpec(self.job_id, v.name, name, index, v.parallelism, v.operators,
                        dep.plan.num_key_groups, self.config, key_fns, dep.key_groups_of(v.name, index))

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
        if self.state not in _ACTIVE:
            return
        me = ray.get_runtime_context().current_actor
        while len(self._standby) < self.config.warm_standby_tasks:
            self._standby.append(RemoteTask.options(
                namespace=NAMESPACE, num_cpus=self.config.task_num_cpus, max_concurrency=10_000,
            ).remote(None, me))

    def _targets(self, connect: Any) -> dict[str, Any]:
        return {c.target: self.handles[c.target] for e in connect.outputs for c in e.channels}

    async def _connect(self, names: list[str]) -> None:
        msgs = connect_messages(self.dep, self.ids)
        # receivers first, so a channel exists before anything is sent on it
        order = [t for v in reversed(self.dep.plan.vertices) for t in self.dep.tasks[v.name] if t in names]
        await asyncio.gather(*(self._call(t, msgs[t], self._targets(msgs[t])) for t in order))

    # -- lifecycle
    async def start(self) -> str:
        self._ev()
        for v in self.plan.vertices:
            for i, name in enumerate(self.dep.tasks[v.name]):
                self._create(name, self._spec(v.name, i, name, self.dep))
        await self._connect(self.dep.task_names())
        self.state = "running"
        try:
            for v in reversed(self.plan.vertices):  # sources last
                await asyncio.gather(*(self._call(t, Start()) for t in self.dep.tasks[v.name]))
        except RayActorError:
            if self.state != "failed":  # a task failing at once tears the job down: not an error here
                raise
        if self.config.metrics_port is not None:
            self.endpoint = MetricsEndpoint(self.collector, self.config.metrics_host, self.config.metrics_port)
        self._poller = asyncio.get_running_loop().create_task(self._poll_metrics())
        self._replicator = asyncio.get_running_loop().create_task(self._replicate_loop())
        self._fill_standby()
        return self.endpoint.url if self.endpoint else ""

    async def report(self, payload: bytes) -> None:
        msg = decode_message(payload)
        match msg:
            case TaskFinished(task=t):
                self.finished.add(t)
                await self._maybe_finish()
            case TaskFailed():
                if self.state in ("running", "created"):
                    self.failure = msg
                    self.error = (f"task {msg.task} of operator {msg.operator!r} failed: "
                                  f"{msg.cause}" + (f" on record {msg.record}" if msg.record else ""))
                    await self._fail()
            case Drained(task=t, epoch=e):
                self.drained.setdefault(e, set()).add(t)
            case SourcePaused(task=t, offset=o):
                self.paused_offsets[t] = o
            case SubscaleDone(subscale=sid, role=role):
                self._subscale_reports.setdefault(sid, {})[role] = msg
            case _:
                raise ValueError(f"unknown report {msg!r}")
        self._notify()

    # -- replication (Spacker): replicas refreshed in steady state, used by migrations
    async def set_replication(self, operator: str, policy: str, period_s: float | None,
                              hot_fraction: float | None) -> None:
        vertex = self.dep.plan.vertex_of(operator)
        if vertex.name != operator or not vertex.keyed:
            raise RescaleRefused(f"operator {operator!r} is not a keyed operator with its own "
                                 "tasks; only those hold key groups to replicate")
        if policy not in ("none", "hot", "all"):
            raise RescaleRefused(f"replication policy {policy!r}: use 'none', 'hot' or 'all'")
        cfg = self.config
        period = cfg.replication_period_s if period_s is None else period_s
        frac = cfg.replication_hot_fraction if hot_fraction is None else hot_fraction
        if period <= 0 or not 0 < frac <= 1:
            raise RescaleRefused("replication period must be > 0 and hot fraction in (0, 1]")
        if policy == "none":
            self._replication.pop(operator, None)
            self._forget_replicas(operator, tuple(self._replicas.get(operator, {})))
            await self._drop_forgotten_replicas()
        else:
            self._replication[operator] = (policy, period, frac)

    async def _replicate_loop(self) -> None:
        last: dict[str, float] = {}
        while self.state in _ACTIVE:
            await asyncio.sleep(0.25)
            now = self.clock.monotonic()
            for vertex, (_, period, _) in list(self._replication.items()):
                lock = self._vertex_locks.setdefault(vertex, asyncio.Lock())
                if now - last.get(vertex, -1e18) < period or lock.locked() or self.finished:
                    continue
                last[vertex] = now
                try:
                    async with lock:
                        await self._refresh_replicas(vertex)
                except Exception:  # noqa: BLE001 - a task may be going away; next period
                    if self.state not in _ACTIVE:
                        return

    async def _refresh_replicas(self, vertex: str) -> None:
        """One refresh round: choose the groups, place their holders, refresh each replica
        from its owner (a delta when the holder is current)."""
        if vertex not in self._replication or self.state != "running":
            return
        policy, _, frac = self._replication[vertex]
        names = list(self.dep.tasks[vertex])
        assignment = self.dep.assignments[vertex]
        loads = {p.key_group: p.load for p in (await self._group_profiles(vertex)).values()}
        groups = choose_replicated_groups(policy, loads, frac, len(assignment))
        holders = place_replicas(assignment, groups, len(names))
        held = self._replicas.setdefault(vertex, {})
        moved_away = [kg for kg, (h, _) in held.items()
                      if kg not in holders or names[holders[kg]] != h]
        self._forget_replicas(vertex, tuple(moved_away))
        await self._drop_forgotten_replicas()
        targets: dict[str, list[tuple[int, str, int]]] = {}
        for kg, h in holders.items():
            version = held[kg][1] if kg in held else -1
            targets.setdefault(names[assignment[kg]], []).append((kg, names[h], version))
        owners = list(targets)
        replies = await asyncio.gather(*(
            self._call(o, RefreshReplicas(tuple(targets[o])),
                       {t[1]: self.handles[t[1]] for t in targets[o]}) for o in owners))
        for o, r in zip(owners, replies, strict=True):
            holder_of = {kg: h for kg, h, _ in targets[o]}
            for kg, version in r.versions:
                held[kg] = (holder_of[kg], version)
            for kg in r.dropped:
                held.pop(kg, None)
            c = self.collector
            c.replication_bytes[vertex] = c.replication_bytes.get(vertex, 0) + r.bytes
            c.replication_cpu_s[vertex] = c.replication_cpu_s.get(vertex, 0.0) + r.cpu_s
        self.collector.replicas[vertex] = len(held)

    def _forget_replicas(self, vertex: str, key_groups: Sequence[int],
                         keep_at: str | None = None) -> None:
        """The replicas of these groups are out of date (the group moved, or its holder
        changed): forget them, and drop them at their holders (except ``keep_at``, the new
        owner, which consumed its replica when the state arrived)."""
        held = self._replicas.get(vertex, {})
        for kg in key_groups:
            entry = held.pop(kg, None)
            if entry is not None and entry[0] != keep_at:
                self._replicas_to_drop.setdefault(entry[0], set()).add(kg)
        if vertex in self.collector.replicas:
            self.collector.replicas[vertex] = len(held)

    async def _drop_forgotten_replicas(self) -> None:
        drops, self._replicas_to_drop = self._replicas_to_drop, {}
        calls = [self._call(h, DropReplicas(tuple(sorted(kgs))))
                 for h, kgs in drops.items() if h in self.handles]
        await asyncio.gather(*calls)

    async def _maybe_finish(self) -> None:
        """The job is finished when every task is; a running rescale defers the teardown."""
        if self._stop_restart_running or self._drrs_running:
            return
        if self.state == "running" and all(n in self.finished for n in self.dep.task_names()):
            self.state = "finished"
            await self._teardown()

    async def _fail(self, error: str | None = None) -> None:
        if error is not None:
            self.error = error
        self.state = "failed"
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
        misses: dict[str, int] = {}
        while self.state in _ACTIVE:
            await asyncio.sleep(self.config.metrics_poll_interval_s)
            names = [n for n in self.dep.task_names() if n in self.handles and n not in self.finished]
            refs = {n: self.handles[n].metrics.remote() for n in names}
            for n, ref in refs.items():
                try:
                    tm = decode_message(await asyncio.wait_for(ref, 10.0))
                    self.collector.tasks[n] = tm
                    misses.pop(n, None)
                except RayActorError as exc:
                    if self.state == "running" and n in self.dep.task_names():
                        await self._fail(f"task {n} died: {exc}")
                        return
                except (TimeoutError, GetTimeoutError):
                    misses[n] = misses.get(n, 0) + 1
            self.collector.tasks = {k: v for k, v in self.collector.tasks.items()
                                    if k in self.dep.task_names()}

    # -- driver API
    def status(self) -> bytes:
        f = self.failure
        return encode_message(JobStatus(
            self.job_id, self.state, self.error,
            f.operator if f else "", f.task_index if f else -1, f.record if f else "",
            f.cause if f else "", self.endpoint.url if self.endpoint else "",
            len(self._standby),
        ))

    async def wait(self, timeout: float | None) -> bytes:
        with contextlib.suppress(TimeoutError, JobFailedError):
            await self._until(lambda: self.state not in _ACTIVE, timeout, "wait")
        return self.status()

    async def metrics(self) -> bytes:
        names = [n for n in self.dep.task_names() if n in self.handles]
        snaps: list[TaskMetrics] = []
        for n in names:
            h = self.handles.get(n)
            if h is None:  # torn down meanwhile
                continue
            try:
                snaps.append(decode_message(await h.metrics.remote()))
            except RayActorError:
                continue
        for s in snaps:
            self.collector.tasks[s.task] = s
        from engine.codec import pack_exact

        return pack_exact([
            self.state, [encode_message(s) for s in snaps],
            [encode_message(r) for r in self.collector.rescales.values()],
            self.endpoint.url if self.endpoint else "",
        ])

    async def stop(self) -> None:
        if self.state in _ACTIVE:
            for n in list(self.handles):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._call(n, StopTask()), 10.0)
            self.state = "stopped"
        await self._teardown()
        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None
        self._notify()

    # -- rescale
    def _validate_rescale(self, operator: str, parallelism: int, protocol: str) -> str:
        if self.state != "running":
            raise RescaleRefused(f"job {self.job_id} is {self.state}, not running; nothing to rescale")
        if self.finished:
            raise RescaleRefused(
                f"job {self.job_id} is finishing (some of its tasks have reached the end of "
                "their input); rescaling a finishing job is not supported")
        if protocol not in PROTOCOLS:
            raise RescaleRefused(
                f"unknown protocol {protocol!r}; available: {', '.join(PROTOCOLS)}")
        if protocol != "stop-restart" and not self.config.live_rescaling:
            raise RescaleRefused(
                f"protocol {protocol!r} needs live rescaling, which this job's config switches "
                "off (JobConfig(live_rescaling=False)); use protocol='stop-restart' or enable it")
        try:
            op = self.graph.operator(operator)
        except Exception as exc:
            raise RescaleRefused(str(exc)) from None
        v = self.dep.plan.vertex_of(operator)
        if v.name != operator:
            raise RescaleRefused(
                f"operator {operator!r} is chained behind {v.name!r} and runs in its tasks; "
                f"rescale {v.name!r}")
        if op.kind == g.SOURCE:
            raise RescaleRefused(f"operator {operator!r} is a source; sources cannot be rescaled")
        if not isinstance(parallelism, int) or parallelism < 1:
            raise RescaleRefused(f"parallelism {parallelism!r} for {operator!r} must be an integer >= 1")
        if v.keyed and parallelism > self.dep.plan.num_key_groups:
            raise RescaleRefused(
                f"parallelism {parallelism} for keyed operator {operator!r} exceeds the number "
                f"of key groups ({self.dep.plan.num_key_groups})")
        return v.name

    async def rescale(self, operator: str, parallelism: int, protocol: str,
                      assignment: tuple[int, ...] | None = None, planning: Any = None) -> bytes:
        vertex = self._validate_rescale(operator, parallelism, protocol)
        if assignment is not None:
            self._validate_assignment(vertex, assignment, parallelism)
        if planning is not None and not isinstance(planning, Planning):
            raise RescaleRefused(f"planning must be a migration.planning.Planning, not "
                                 f"{type(planning).__name__}")
        self._ev()
        assert self._rescale_lock is not None
        if protocol in LIVE and not self.dep.plan.vertex(vertex).keyed:
            protocol = "stop-restart"  # a stateless operator has no key groups to move live
        if protocol in LIVE:
            self._superseded[vertex] = self._superseded.get(vertex, 0) + 1
            my_turn = self._superseded[vertex]
            lock = self._vertex_locks.setdefault(vertex, asyncio.Lock())
            async with lock:
                if self._stop_restart_running:
                    raise RescaleRefused("a stop-restart rescale is running; try again after it")
                self._drrs_running += 1
                try:
                    vertex = self._validate_rescale(operator, parallelism, protocol)
                    report = await self._guard_rescale(
                        operator, parallelism, protocol,
                        self._live(vertex, parallelism, assignment, my_turn, LIVE[protocol],
                                   planning))
                finally:
                    self._drrs_running -= 1
                    self._refill_standby_later()
                    await self._maybe_finish()
                return encode_message(report)
        async with self._rescale_lock:
            if self._drrs_running:
                raise RescaleRefused("a drrs rescale is running; try again after it")
            self._stop_restart_running = True
            try:
                vertex = self._validate_rescale(operator, parallelism, protocol)
                report = await self._guard_rescale(
                    operator, parallelism, protocol,
                    self._stop_restart(vertex, parallelism, assignment))
            finally:
                self._stop_restart_running = False
                self._refill_standby_later()
                await self._maybe_finish()
            return encode_message(report)

    def _validate_assignment(self, vertex: str, assignment: tuple[int, ...], parallelism: int) -> None:
        v = self.dep.plan.vertex(vertex)
        if not v.keyed:
            raise RescaleRefused(f"operator {vertex!r} is not keyed; it has no key groups to assign")
        try:
            validate_assignment(tuple(assignment), self.dep.plan.num_key_groups, parallelism)
        except ValueError as exc:
            raise RescaleRefused(f"assignment for {vertex!r} refused: {exc}") from None

    async def _guard_rescale(self, operator: str, parallelism: int, protocol: str, work: Any) -> RescaleReport:
        try:
            return await work
        except RescaleRefused:
            raise
        except Exception as exc:
            progress = self.collector.rescales.get(operator)
            name = progress.phase if progress else "?"
            msg = (f"rescale of {operator!r} to parallelism {parallelism} ({protocol}) failed in "
                   f"phase {name}: {type(exc).__name__}: {exc}")
            if self.state != "failed":
                await self._fail(msg)
            elif "rescale of" not in self.error:  # e.g. a task died: name the rescale too
                self.error = (f"{self.error} (during the rescale of {operator!r} to parallelism "
                              f"{parallelism}, {protocol}, phase {name})")
            raise JobFailedError(self.error or msg) from exc

    async def _live(self, vertex: str, final_p: int, assignment: tuple[int, ...] | None,
                    turn: int, proto: LiveProtocol, planning: Planning | None) -> RescaleReport:
        """Live rescale; the operator's tasks do not finish while it runs (their input may
        end meanwhile: they must still give away and take key groups)."""
        try:
            states = await asyncio.gather(*(self._call(t, HoldFinish(True))
                                            for t in self.dep.tasks[vertex]))
            ended = [st.task for st in states if st.input_ended]
            if ended:
                raise RescaleRefused(
                    f"job {self.job_id} is finishing: the input of {ended[0]} has ended; "
                    "rescaling a finishing job is not supported")
            return await self._live_held(vertex, final_p, assignment, turn, proto, planning)
        finally:
            if self.state == "running":
                await asyncio.gather(*(self._call(t, HoldFinish(False))
                                       for t in self.dep.tasks[vertex]))

    async def _plan(self, proto: LiveProtocol, vertex: str, old_assign: tuple[int, ...],
                    new_assign: tuple[int, ...], old_p: int, final_p: int,
                    planning: Planning | None) -> LivePlan:
        """The plan; per-group load and state size are asked from the tasks when the
        planning needs them (non-disruptive's adaptive default, load or state orders)."""
        cfg = self.config
        profiles: dict[int, Any] = {}
        if (planning is not None or proto.name == "non-disruptive"
                or (proto.name == "drrs" and cfg.drrs_subscale_bytes is not None)):
            profiles = await self._group_profiles(vertex)
        if planning is None and proto.name == "non-disruptive":
            moved = moved_key_groups(old_assign, new_assign)
            rate = sum(p.load for p in profiles.values())
            decision = adaptive_planning(workload_from_profiles(profiles, moved, rate))
            planning = decision.planning
            adaptive = decision.reason
        else:
            adaptive = ""
        plan = plan_live(proto.name, vertex, old_assign, new_assign, old_p, final_p,
                         subscale_size=cfg.drrs_subscale_size,
                         subscale_bytes=cfg.drrs_subscale_bytes, batch=cfg.batched_step_size,
                         matching=cfg.batched_matching, planning=planning, profiles=profiles,
                         first_id=self._next_subscale)
        if adaptive:
            assert planning is not None
            if planning.replication != "none" and vertex not in self._replication:
                # replicas serve the next migrations of this operator
                self._replication[vertex] = (planning.replication, cfg.replication_period_s,
                                             planning.replication_hot_fraction)
                adaptive += f"; replication '{planning.replication}' on from now"
            plan = dataclasses.replace(plan, reason=f"adaptive: {adaptive}; {plan.reason}")
        return plan

    async def _group_profiles(self, vertex: str) -> dict[int, Any]:
        replies = await asyncio.gather(*(self._call(t, GroupStatsRequest())
                                         for t in self.dep.tasks[vertex]))
        loads: dict[int, float] = {}
        sizes: dict[int, int] = {}
        for r in replies:
            for kg, records, size in r.groups:
                loads[kg] = records / r.seconds if r.seconds > 0 else 0.0
                sizes[kg] = size
        return profiles_from_metrics(loads, sizes)

    async def _live_held(self, vertex: str, final_p: int, assignment: tuple[int, ...] | None,
                         turn: int, proto: LiveProtocol, planning: Planning | None) -> RescaleReport:
        """New tasks first, then the plan's subscales, then removals."""
        clock, cfg = self.clock, self.config
        requested = clock.now()
        dep = self.dep
        v = dep.plan.vertex(vertex)
        old_p = v.parallelism
        old_assign = dep.assignments[vertex]
        new_assign = tuple(assignment) if assignment is not None else uniform_assignment(
            dep.plan.num_key_groups, final_p)
        plan = await self._plan(proto, vertex, old_assign, new_assign, old_p, final_p, planning)
        self._next_subscale += len(plan.subscales)
        work_p = max(old_p, final_p)
        stats = {"moved": 0, "bytes": 0}

        live = {"done": 0, "rerouted": 0, "suspended": 0.0, "delay": 0.0}

        def enter(phase: str, running: bool = True) -> None:
            self.collector.rescales[vertex] = RescaleProgress(
                vertex, proto.name, phase, len(plan.moved), stats["moved"], stats["bytes"], running,
                len(plan.subscales), live["done"], live["rerouted"], live["suspended"],
                live["delay"])

        # 1. new tasks before the first subscale
        enter("deploy")
        gen = dep.generation + 1
        names = list(dep.tasks[vertex])
        new_names = [task_name(self.job_id, vertex, i, gen) for i in range(old_p, work_p)]
        tasks = {**dep.tasks, vertex: tuple(names + new_names)}
        work_dep = Deployment(dep.plan.rescaled(vertex, work_p), self.job_id, tasks,
                              dict(dep.assignments), gen)
        if new_names:
            await self._add_tasks(work_dep, vertex, new_names)
        self.dep = work_dep
        self.plan = work_dep.plan
        names = list(tasks[vertex])

        # 2. subscales
        in_edges = work_dep.plan.inputs_of(vertex)
        current = list(old_assign)
        owned = {i: current.count(i) for i in range(work_p)}
        reason = plan.reason
        sched: SubscaleScheduler | StepScheduler
        if proto.concurrent:
            at_once = self._max_subscales()
            sched = SubscaleScheduler(plan, owned, cfg.drrs_max_subscales_per_task, at_once)
            reason += (f"; at most {at_once} at once and {cfg.drrs_max_subscales_per_task} "
                       "per task")
        else:
            sched = StepScheduler(plan.steps)
        timings: list[tuple[int, float, float]] = []
        first_start: float | None = None
        started_at: dict[int, float] = {}
        injected_at: dict[int, float] = {}
        rerouted = 0
        suspended = 0.0
        delays: list[float] = []
        superseded = False
        enter("subscales")
        while not sched.finished:
            if self._superseded.get(vertex, turn) != turn and not superseded:
                superseded = True
                sched.pending.clear()
            if self.finished and sched.pending:
                # input ended meanwhile: finish the running subscales, start no more
                sched.pending.clear()
                superseded = True
            batch = sched.next_batch()
            if batch and not proto.concurrent and cfg.step_gap_ms > 0 and sched.done:
                await asyncio.sleep(cfg.step_gap_ms / 1000.0)
            now = clock.now()
            for sub in batch:
                first_start = first_start if first_start is not None else now
                started_at[sub.subscale_id] = now
            # a batch's subscales are independent: start them together (one at a time, each
            # start's three calls would delay the last by the whole batch's round trips)
            injected = await asyncio.gather(*(
                self._start_subscale(sub, names, in_edges, work_dep, proto, vertex)
                for sub in batch))
            for sub, at in zip(batch, injected, strict=True):
                injected_at[sub.subscale_id] = at
            if not sched.running:
                break
            try:
                await self._until(
                    lambda: any(len(self._subscale_reports.get(sid, {})) == 2
                                for sid in sched.running),
                    cfg.rescale_timeout_s, "subscale")
            except TimeoutError:
                stuck = [f"{sid} ({names[sub.old]} -> {names[sub.new]}, groups {sub.key_groups}, "
                         f"done: {sorted(self._subscale_reports.get(sid, {}))})"
                         for sid, sub in sched.running.items()]
                where = await self._describe_tasks(
                    {names[x] for sub in sched.running.values() for x in (sub.old, sub.new)}
                    | {u for e in in_edges for u in work_dep.tasks[e.src]})
                raise TimeoutError(f"subscales not finished after {cfg.rescale_timeout_s} s: "
                                   + "; ".join(stuck) + f". Tasks: {where}") from None
            for sid in [sid for sid in sched.running if len(self._subscale_reports.get(sid, {})) == 2]:
                rep = self._subscale_reports.pop(sid)
                sub = sched.running[sid]
                sched.complete(sid)
                for kg in sub.key_groups:
                    current[kg] = sub.new
                stats["moved"] += len(sub.key_groups)
                stats["bytes"] += rep["new"].bytes
                rerouted += rep["old"].rerouted
                suspended = max(suspended, rep["new"].suspended_s)
                if rep["old"].trigger_at:
                    delays.append(max(0.0, rep["old"].trigger_at - injected_at[sid]))
                timings.append((sid, started_at[sid] - requested, clock.now() - started_at[sid]))
                self.collector.subscale_seconds.setdefault(vertex, []).append(timings[-1][2])
                live.update(done=len(timings), rerouted=rerouted, suspended=suspended,
                            delay=(sum(delays) / len(delays)) if delays else 0.0)
                self._forget_replicas(vertex, sub.key_groups, keep_at=names[sub.new])
                self.dep = Deployment(self.dep.plan, self.job_id, self.dep.tasks,
                                      {**self.dep.assignments, vertex: tuple(current)}, gen)
                enter("subscales")

        # 3. remove tasks left without key groups (scale-in)
        enter("remove")
        await self._drop_forgotten_replicas()
        keep = final_p if not superseded else work_p
        if keep < work_p and max(current) < keep:
            await self._remove_tasks(vertex, keep)
            gone = set(names[keep:])
            held = self._replicas.get(vertex, {})
            for kg in [kg for kg, (h, _) in held.items() if h in gone]:
                del held[kg]
        enter("done", running=False)
        self.collector.rescales_total[vertex] = self.collector.rescales_total.get(vertex, 0) + 1
        done = clock.now()
        return RescaleReport(
            vertex, proto.name, old_p, len(self.dep.tasks[vertex]), requested, done, done - requested,
            stats["moved"], stats["bytes"], (), (), first_start or done,
            rerouted, suspended, (sum(delays) / len(delays)) if delays else 0.0,
            tuple(timings), superseded, reason, len(plan.steps) if not proto.concurrent else 1)

    def _max_subscales(self) -> int:
        """Subscales of one operator at once: the configured number, else as many as the
        cluster's CPUs."""
        if self.config.drrs_max_subscales is not None:
            return self.config.drrs_max_subscales
        return max(1, int(ray.cluster_resources().get("CPU", 1)))

    async def _describe_tasks(self, names: set[str]) -> str:
        """Each task's own account of its migrations (a stuck rescale's error message)."""
        out = []
        for n in sorted(names):
            try:
                st: TaskState = decode_message(await asyncio.wait_for(
                    self.handles[n].control.remote(encode_message(DescribeTask())), 10.0))
                out.append(f"{n} [{st.status}{', input ended' if st.input_ended else ''}] "
                           f"{st.detail}")
            except Exception as exc:  # a dead or hung task: say so, the error is the point
                out.append(f"{n} [no answer: {type(exc).__name__}]")
        return " | ".join(out)

    async def _add_tasks(self, work_dep: Deployment, vertex: str, new_names: list[str]) -> None:
        """Create, wire and start new tasks of ``vertex`` while the job runs."""
        for name in new_names:
            i = work_dep.tasks[vertex].index(name)
            self._create(name, self._spec(vertex, i, name, work_dep))
        msgs = connect_messages(work_dep, self.ids)
        await asyncio.gather(*(self._call(n, HoldFinish(True)) for n in new_names))
        # the new tasks read from every predecessor and write to the operator's receivers
        await asyncio.gather(*(self._call(n, msgs[n], self._targets(msgs[n])) for n in new_names))
        adds: dict[str, list[tuple[int, int]]] = {}
        for n in new_names:
            for e in msgs[n].outputs:
                for c in e.channels:
                    adds.setdefault(c.target, []).append((c.channel_id, c.port))
        await asyncio.gather(*(self._call(t, AddInputs(tuple(ins))) for t, ins in adds.items()))
        await asyncio.gather(*(self._call(n, Start()) for n in new_names))
        calls = []
        for e in work_dep.plan.inputs_of(vertex):
            for u in work_dep.tasks[e.src]:
                chans = tuple(OutputChannel(self.ids.get(e.edge_id, u, n), n, e.port)
                              for n in new_names)
                calls.append(self._call(u, AddOutputChannels(e.edge_id, chans),
                                        {n: self.handles[n] for n in new_names}))
        await asyncio.gather(*calls)

    async def _start_subscale(self, sub: Any, names: list[str], in_edges: list[Any],
                              dep: Deployment, proto: LiveProtocol, vertex: str) -> float:
        s_name, d_name = names[sub.old], names[sub.new]
        rcid = self.ids.get(-1 - sub.subscale_id, s_name, d_name)
        direct = tuple(self.ids.get(e.edge_id, u, d_name) for e in in_edges for u in dep.tasks[e.src])
        held = self._replicas.get(vertex, {})
        replicas = tuple((kg, held[kg][1]) for kg in sub.key_groups
                         if kg in held and held[kg][0] == d_name)
        # both owners know the subscale before any predecessor acts on it; neither needs
        # the other's expectation first (the old owner only talks to the new one once
        # triggered), so the two calls go out together
        await asyncio.gather(
            self._call(d_name, ExpectIncoming(sub.subscale_id, sub.key_groups, direct, rcid,
                                              proto.trigger, s_name),
                       {s_name: self.handles[s_name]}),
            self._call(s_name, ExpectOutgoing(sub.subscale_id, sub.key_groups,
                                              OutputChannel(rcid, d_name, REROUTE_PORT),
                                              len(direct), proto.aligned, proto.block_aligned,
                                              replicas),
                       {d_name: self.handles[d_name]}))
        at = self.clock.now()
        await asyncio.gather(*(
            self._call(u, InjectSubscale(sub.subscale_id, e.edge_id, sub.key_groups, sub.new,
                                         proto.trigger, proto.pause_new_owner))
            for e in in_edges for u in dep.tasks[e.src]))
        return at

    async def _remove_tasks(self, vertex: str, keep: int) -> None:
        """Scale-in: drop the operator's tasks from index ``keep`` on (they hold no groups)."""
        dep = self.dep
        names = list(dep.tasks[vertex])
        gone = names[keep:]
        calls = []
        for e in dep.plan.inputs_of(vertex):
            for u in dep.tasks[e.src]:
                ids = tuple(self.ids.get(e.edge_id, u, n) for n in gone)
                calls.append(self._call(u, RemoveOutputChannels(ids)))
        await asyncio.gather(*calls)
        await asyncio.gather(*(self._call(n, StopTask(end_outputs=True)) for n in gone))
        for n in gone:
            ray.kill(self.handles.pop(n))
            self.collector.tasks.pop(n, None)
        tasks = {**dep.tasks, vertex: tuple(names[:keep])}
        self.dep = Deployment(dep.plan.rescaled(vertex, keep), self.job_id, tasks,
                              dict(dep.assignments), dep.generation)
        self.plan = self.dep.plan

    async def _stop_restart(self, vertex: str, parallelism: int,
                            assignment: tuple[int, ...] | None = None) -> RescaleReport:
        clock = self.clock
        requested = clock.now()
        self._replicas.pop(vertex, None)  # every task restarts: the replicas go with them
        v = self.dep.plan.vertex(vertex)
        sr = plan_stop_restart(vertex, v.parallelism, self.dep.assignments.get(vertex),
                               parallelism, self.dep.plan.num_key_groups, assignment)
        phases: list[tuple[str, float]] = []
        progress = {"moved": 0, "bytes": 0}

        def enter(name: str) -> None:
            self.collector.rescales[vertex] = RescaleProgress(
                vertex, "stop-restart", name, len(sr.moved), progress["moved"], progress["bytes"],
                name != "done")

        t = clock.monotonic()

        def mark(name: str) -> None:
            nonlocal t
            now = clock.monotonic()
            phases.append((name, now - t))
            t = now

        timeout = 300.0
        # pause + drain
        enter("pause")
        self.epoch += 1
        epoch = self.epoch
        live = [n for n in self.dep.task_names() if n not in self.finished]
        sources = [n for vv in self.dep.plan.vertices if vv.is_source for n in self.dep.tasks[vv.name]
                   if n in live]
        self.paused_offsets = {}
        await asyncio.gather(*(self._call(n, PauseSource(epoch)) for n in sources))
        mark("pause")
        enter("drain")
        await self._until(
            lambda: all(n in self.drained.get(epoch, set()) or n in self.finished
                        for n in self.dep.task_names()),
            timeout, "drain")
        mark("drain")
        # snapshot
        enter("snapshot")
        old_tasks = list(self.dep.tasks[vertex])
        snaps: list[KeyGroupSnapshot] = await asyncio.gather(
            *(self._call(n, SnapshotKeyGroups()) for n in old_tasks))
        groups = {kg: data for s in snaps for kg, data in s.groups}
        mark("snapshot")
        # stop old tasks
        enter("stop")
        await asyncio.gather(*(self._call(n, StopTask()) for n in old_tasks))
        for n in old_tasks:
            ray.kill(self.handles.pop(n))
            self.collector.tasks.pop(n, None)
            self.finished.discard(n)
        mark("stop")
        # deploy new tasks
        enter("deploy")
        gen = self.dep.generation + 1
        plan = self.dep.plan.rescaled(vertex, parallelism)
        tasks = dict(self.dep.tasks)
        tasks[vertex] = tuple(task_name(self.job_id, vertex, i, gen) for i in range(parallelism))
        assignments = dict(self.dep.assignments)
        if sr.new_assignment:
            assignments[vertex] = sr.new_assignment
        self.dep = Deployment(plan, self.job_id, tasks, assignments, gen)
        self.plan = plan
        for i, name in enumerate(tasks[vertex]):
            self._create(name, self._spec(vertex, i, name, self.dep))
        mark("deploy")
        # install key groups
        enter("install")
        per_task: dict[int, list[tuple[int, bytes]]] = {}
        for kg, data in groups.items():
            per_task.setdefault(sr.new_assignment[kg], []).append((kg, data))
        await asyncio.gather(*(
            self._call(tasks[vertex][i], InstallKeyGroups(tuple(items)))
            for i, items in per_task.items()))
        progress["moved"] = len(sr.moved)
        progress["bytes"] = sum(len(d) for d in groups.values())
        bytes_moved = progress["bytes"]
        mark("install")
        # reconnect everything that touches the vertex, start the new tasks, resume
        enter("connect")
        await self._connect(self.dep.task_names())
        await asyncio.gather(*(self._call(n, Start()) for n in tasks[vertex]))
        mark("connect")
        enter("resume")
        await asyncio.gather(*(self._call(n, Resume()) for n in self.dep.task_names()
                               if n not in self.finished))
        mark("resume")
        enter("done")
        self.collector.rescales_total[vertex] = self.collector.rescales_total.get(vertex, 0) + 1
        done = clock.now()
        return RescaleReport(
            vertex, "stop-restart", sr.old_parallelism, parallelism, requested, done,
            done - requested, len(sr.moved), bytes_moved, tuple(phases),
            tuple(sorted(self.paused_offsets.items())),
        )


RemoteJobMaster = ray.remote(max_restarts=0, max_task_retries=0)(JobMaster)


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
