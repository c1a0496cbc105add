"""The task actor: the Ray shell around one ``TaskCore``.

Why a shell: the task's logic (``engine.task.core.TaskCore`` with its migration participant) is
pure and stepped by tests by hand; this class only moves bytes and waits. It receives data
frames (``engine.wire.transport``: a direct socket per pair of tasks; ``JobConfig(transport=
"ray")``: actor-call arguments) and control messages (msgpack wire dataclasses of
``engine.wire.messages``, as actor calls), runs the core's loop, and sends what the core
produced: frames within their channel's credits, priority messages as control calls,
reports to the JobMaster.

Guarantees: a frame is acknowledged only once the core took it for processing (credits);
a receiver that goes away fails this task naming it; a control call returns the core's
reply after what it queued was sent (and, for a stop or a channel removal, acknowledged);
a task whose operators' ``open()`` raised (at creation, or a source's at ``Start``) raises
a ``UserFunctionError`` naming the operator from every call, instead of dying unexplained;
``ping`` answers at once while the actor's loop is free (standby health checks). Data
connections are in ``engine.runtime.connections``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import gc
import os
import threading
from collections import deque
from typing import Any

import ray
from ray.exceptions import RayActorError

from engine.checkpoints.local import LocalCopies, local_root
from engine.checkpoints.snapshot import TaskSnapshot, persist, restore_messages
from engine.errors import (
    DataChannelError,
    DownstreamDied,
    FailurePhase,
    JobFailedError,
    OutputCodecError,
    ReflowError,
    StaleJobMaster,
)
from engine.names import StateBackend
from engine.observability.metrics import process_cpu
from engine.runtime.connections import DataConnections, ack_failure
from engine.runtime.failures import open_failure
from engine.state.backends import RESTORE_FOLDER, state_root
from engine.state.incremental import MAX_DELTA_CHAIN
from engine.task.channel import CreditGate
from engine.task.core import RUNNING, TaskCore, TaskSpec
from engine.time.clock import SystemClock
from engine.wire.messages import (
    PriorityBatch,
    decode_message,
    encode_message,
)
from engine.wire.transport import DataClient, DataServer, ServerConnection, tls_contexts

_ACTIVE = ("created", "running")

# At most this long of input per pass of the loop (a whole frame at least) before it takes
# control calls and acknowledges frames.
_PASS_BUDGET_S = 0.05


def freeze_startup_heap() -> None:
    """Move every object the worker holds now (Ray's, pyarrow's and numpy's modules, the
    task's spec and operators) to the cyclic collector's permanent generation.

    Why: a full (generation 2) collection walks every tracked object, and in a task worker
    one took 90 ms (steady.py's count task, timed with ``gc.callbacks``: about 90 k objects
    besides the state). The task stops for that long, which alone set the half-load p99.
    Frozen objects are skipped; they live as long as the worker anyway. Objects made later
    (state, records) are collected as before."""
    gc.freeze()


def new_core(spec: TaskSpec) -> TaskCore:
    """The task core with its migration participant attached."""
    from migration.participant import new_task_core

    return new_task_core(spec, SystemClock())


class TaskActor(DataConnections):
    """Shell around one ``TaskCore``: receives frames, runs the loop, sends with credits."""

    def __init__(self, spec: TaskSpec | None, master: Any) -> None:
        """``spec`` None: a warm standby actor, made a task later by ``configure``. A task
        that cannot start (an ``open()`` raised) stays alive to say why: its every call
        raises that error (an actor whose constructor raised would only say it died)."""
        self.master = master
        self.master_epoch = 0  # raised by adopt(): older JobMasters are refused
        self._generation = 0  # one more per recycle(): callbacks of an older task drop out
        # local recovery copies (JobConfig.local_recovery) of this process's tasks
        self._local: LocalCopies | None = None
        self._local_root: str | None = None
        self._scratch: str | None = None  # where a restore unpacks DB checkpoints
        self._persist_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="reflow-persist")
        self.handles: dict[str, Any] = {}
        self._broken: ReflowError | None = None
        # the process's CPU counters when its current task first answered for its metrics
        self._cpu_task = ""
        self._cpu_base: tuple[float, float | None] = (0.0, None)
        self._cpu_waited = 0.0
        if spec is not None:
            with contextlib.suppress(ReflowError):
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
        """Become the task of ``spec`` (its operators' ``open()`` run here); raises a
        ``UserFunctionError`` naming the operator when one raised."""
        try:
            self.core = new_core(spec)
            tls = spec.config.tls
            self.tls = tls_contexts(tls) if tls is not None else None
        except Exception as exc:
            cause = f"{type(exc).__name__}: {exc}"
            opened = open_failure(exc, spec.operators, spec.task_name, spec.task_index)
            self._broken = opened or JobFailedError(
                f"task {spec.task_name} of operator {spec.vertex!r} could not start: {cause}",
                operator=spec.vertex, task_index=spec.task_index, task=spec.task_name,
                phase=FailurePhase.DEPLOY, cause=cause)
            raise self._broken from exc
        self.clock = self.core.clock
        self.gate = CreditGate(spec.config.credits)
        cfg = spec.config
        self._scratch = os.path.join(state_root(cfg), RESTORE_FOLDER)
        if cfg.local_recovery and self._local is None:  # kept across recycle()
            self._local_root = local_root(cfg, spec.job_id)
            # a delta chain's links are in up to MAX_DELTA_CHAIN + 1 checkpoints; an SST
            # checkpoint's files are all named by the last one (older copies would only
            # keep files RocksDB compacted away)
            chained = cfg.incremental_checkpoints and cfg.state_backend != StateBackend.ROCKSDB
            self._local = LocalCopies(self._local_root,
                                      keep=MAX_DELTA_CHAIN + 2 if chained else 2)
        freeze_startup_heap()

    def _event(self) -> asyncio.Event:
        if self._wake is None:
            self._wake = asyncio.Event()
            self._send_lock = asyncio.Lock()
            self._kick = asyncio.Event()
        return self._wake

    async def push(self, channel_id: int, seq: int, payload: bytes) -> None:
        """A data frame (transport "ray"); returns once the task has taken it for
        processing (the ack)."""
        core = getattr(self, "core", None)
        if core is None or core.status not in _ACTIVE:  # a standby, recycled: dropped
            return
        core.receive(channel_id, seq, payload)
        fut = asyncio.get_running_loop().create_future()
        self.acks[(channel_id, seq)] = fut
        self._event().set()
        await fut

    async def ping(self) -> None:
        """A cheap call: answers at once unless the actor is dead or its loop is blocked."""

    async def task_name(self) -> str:
        """The name of the task this actor runs ("(standby)" for none): a recycled or
        standby actor's Ray name is not its task's (``engine.runtime.failover.ask_tasks``)."""
        return self._task_name()

    async def recycle(self) -> None:
        """Stop being a task, as if killed, and become a warm standby actor that
        ``configure`` makes a task again (a restart reuses the process instead of starting
        one: ``JobConfig.recovery_reuses_processes``).

        As if killed: nothing more is sent, reported, committed or written by the task's
        sinks (their writers are not closed: a restart drops their uncommitted output);
        its loop is cancelled, its data connections and server closed, frames and pushes
        still arriving are acknowledged and dropped, its state backend closed (a RocksDB
        one's files removed), and a checkpoint part still being written is not reported.
        Idempotent; a standby actor has nothing to do."""
        core = getattr(self, "core", None)
        if core is None:
            return
        self._generation += 1
        core.host.discard()  # nothing of the task runs from here on (no writer is closed)
        loop_task, self._loop_task = self._loop_task, None
        if loop_task is not None:
            loop_task.cancel()
            with contextlib.suppress(BaseException):
                await loop_task
        server, self._server = self._server, None
        if server is not None:
            server.on_frame = _drop_frame
            server.close()
        await self.close_connections()
        for pending in list(self._connecting.values()):
            pending.cancel()
        self._connecting.clear()
        self._release_all_acks()
        for q in self.in_flight.values():
            for fut in q:
                if isinstance(fut, asyncio.Future):
                    fut.cancel()
        self.in_flight.clear()
        self.handles.clear()
        del self.core
        self._broken = None
        self._wake = self._send_lock = self._kick = None
        gc.collect()  # the old task's objects go now, before a restore reads its output

    async def adopt(self, master: Any, epoch: int) -> None:
        """Report to ``master`` from now on: the JobMaster of ``epoch`` took the job over
        (reports to the lost one are lost; the new one asked this task how it is first).
        Control calls of an older epoch are refused from now on (``StaleJobMaster``)."""
        if epoch < self.master_epoch:
            raise StaleJobMaster(f"task {self._task_name()}: JobMaster epoch {epoch} "
                                 f"is older than {self.master_epoch}, which owns the job",
                                 epoch=epoch, newer_epoch=self.master_epoch)
        self.master, self.master_epoch = master, epoch

    async def stage_logic(self, version: int, operator: str, fn: Any) -> None:
        """Keep ``fn`` (deserialised here by Ray, opened on this task's state) to replace
        ``operator``'s function at logic barrier ``version``; raises when it cannot."""
        if self._broken is not None:
            raise self._broken
        self.core.stage_logic(version, operator, fn)

    def _task_name(self) -> str:
        core = getattr(self, "core", None)
        return core.spec.task_name if core is not None else "(standby)"

    async def node_id(self) -> str:
        """The id of the Ray node this task runs on (placement)."""
        return str(ray.get_runtime_context().get_node_id())

    async def control(self, payload: bytes, handles: dict[str, Any] | None = None,
                      epoch: int = 0) -> bytes:
        """Carry out a control message on the core, then what its reply's effects ask for
        (``engine.task.reply``), and answer once what the call queued was sent. ``epoch``:
        the calling JobMaster's (a detached job's; 0 from peer tasks); an older one than
        the task's owner is refused with ``StaleJobMaster``, so a fenced JobMaster cannot
        act on the job."""
        if self._broken is not None:
            raise self._broken
        if 0 < epoch < self.master_epoch:  # 0: a peer task, or an undetached job's master
            raise StaleJobMaster(f"task {self._task_name()}: a JobMaster of epoch {epoch} "
                                 f"called, but epoch {self.master_epoch} owns the job now",
                                 epoch=epoch, newer_epoch=self.master_epoch)
        msg = decode_message(payload)
        wake = self._event()
        if handles:
            self._new_handles(handles)
        core = self.core
        asked = len(core.priority_out)
        try:
            reply = core.control(msg)
        except Exception as exc:  # a source's open() runs at Start: name its operator
            spec = core.spec
            err = open_failure(exc, spec.operators, spec.task_name, spec.task_index)
            if err is None or err is exc:
                raise
            raise err from exc
        fx = reply.effects
        if fx.restore is not None:  # read the groups here, in a thread; the core installs
            for inner in await asyncio.to_thread(restore_messages, fx.restore,
                                                 self._local_root, self._scratch):
                core.handle(inner)
            self._send_reports()
            return encode_message(reply.message)
        answer = reply.message if reply.then is None else reply.then(await self._ask(asked))
        if fx.start_loop and self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._loop())
        self._send_priority()
        # a task no longer running (finished: e.g. a source whose input ended, while a rescale
        # injects barriers) has a loop that is gone or past its last send: what this call
        # queued would never leave, so send everything now, waiting for credits if need be
        loop_ended = self._loop_task is not None and self._loop_task.done()
        await self._send_outbox(block=loop_ended or core.status != RUNNING or fx.flush_all)
        if fx.settle_all:
            await self._settle_in_flight()
        elif fx.settle:
            await self._settle_in_flight(set(fx.settle))
        self._persist_snapshots()
        self._send_reports()
        self._ack_consumed()
        wake.set()
        if fx.close_outputs:  # it sends nothing more (its frames were settled)
            await self.close_connections()
        return encode_message(answer)

    def _persist_snapshots(self) -> None:
        """Write the core's checkpoint parts to the store in a thread (the task goes on
        processing meanwhile: the snapshot is already taken) and report each when written."""
        snaps = self.core.snapshots
        while snaps:
            snap = snaps.pop(0)
            if not snap.groups and snap.db is None:  # nothing to write: say so at once
                self._report_snapshot(snap)
                continue
            # one writer thread per actor: parts are written in checkpoint order, and the
            # local copies (not thread-safe) are kept by one thread at a time
            fut = asyncio.get_running_loop().run_in_executor(self._persist_pool, persist, snap,
                                                             self.clock, self._local)
            fut.add_done_callback(functools.partial(self._written, snap, self._generation))

    def _report_snapshot(self, snap: TaskSnapshot) -> None:
        self.core.report(persist(snap, self.clock))
        self._send_reports()

    def _written(self, snap: TaskSnapshot, generation: int, fut: asyncio.Future[Any]) -> None:
        if generation != self._generation:  # recycled meanwhile: the task is gone
            return
        self.core.report(fut.result())  # persist never raises
        self._send_reports()

    async def _ask(self, start: int) -> list[Any]:
        """Send the priority messages the call queued (``priority_out[start:]``), one call
        each, and wait for every answer (e.g. replica holders: a refresh is complete, and a
        migration may rely on it, once the holder applied it)."""
        out = self.core.priority_out
        asks = out[start:]
        del out[start:]
        answers = await asyncio.gather(*(self.handles[t].control.remote(encode_message(m))
                                         for t, m in asks))
        return [decode_message(a) for a in answers]

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
        if self._broken is not None:
            raise self._broken
        m = self.core.metrics()
        cpu, wait = process_cpu(threading.get_native_id())  # the loop's thread: the task's
        if self._cpu_task != m.task:  # a new task in this process: count from here
            self._cpu_task, self._cpu_base, self._cpu_waited = m.task, (cpu, wait), 0.0
        base_cpu, base_wait = self._cpu_base
        waited = None if wait is None or base_wait is None else max(0.0, wait - base_wait)
        if waited is not None:  # threads that ended take their wait with them: never back
            waited = self._cpu_waited = max(self._cpu_waited, waited)
        return encode_message(dataclasses.replace(
            m, cpu_seconds=max(0.0, cpu - base_cpu), cpu_wait_seconds=waited,
            at=self.clock.monotonic()))

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
                try:
                    await asyncio.wait([*waits, kick], return_when=asyncio.FIRST_COMPLETED)
                finally:  # also when cancelled (a recycle): no waiter left pending
                    kick.cancel()
                self.core.counters.on_backpressured(self.clock.monotonic() - t0)

    def _running(self) -> bool:
        core = getattr(self, "core", None)  # none once recycled
        return core is not None and core.status in _ACTIVE

    async def _await_ack(self, fut: Any) -> None:
        try:
            await fut
        except (RayActorError, DataChannelError) as exc:
            died = ack_failure(exc, self._running())
            if died is not None:
                raise died from exc

    def _reap_acks(self) -> None:
        """Count acknowledged frames (oldest first per channel); a failed push means the
        receiver died (``ack_failure``)."""
        for cid, q in self.in_flight.items():
            while q and q[0].done():
                fut = q.popleft()
                self.gate.on_ack(cid)
                exc = fut.exception()
                died = None if exc is None else ack_failure(exc, self._running())
                if died is not None:
                    raise died

    async def _settle_in_flight(self, channel_ids: set[int] | None = None) -> None:
        """Wait until every frame sent so far (on ``channel_ids``, default every channel)
        was acknowledged. A frame leaves its channel's queue only once acknowledged, so two
        settles at once (a stop's control call while the loop ends) both wait for every
        frame: one that took a frame off the queue before its ack let the other return
        early, and the stop closed the connection under it, which its waiter read as the
        receiver's death."""
        for cid, q in list(self.in_flight.items()):  # a control call may add channels meanwhile
            if channel_ids is not None and cid not in channel_ids:
                continue
            while q:
                fut = q[0]
                await self._await_ack(fut)
                if q and q[0] is fut:  # else the other settle (or _reap_acks) counted it
                    q.popleft()
                    self.gate.on_ack(cid)

    async def _loop(self) -> None:
        core, clock = self.core, self.clock
        counters = core.counters
        cfg = core.spec.config
        marker_every = cfg.latency_marker_interval_ms / 1000.0
        timer_every = cfg.timer_check_interval_ms / 1000.0
        next_marker = clock.monotonic() + marker_every
        next_timer_check = 0.0
        strategy = None if core.source is None else core.source.strategy
        wm_every = None if strategy is None else strategy.interval_ms / 1000.0
        next_wm = clock.monotonic()
        outbox = core.router.outbox
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
                        # slow records: control messages (a rescale's) wait one pass at most
                        if clock.monotonic() - t0 >= _PASS_BUDGET_S:
                            break
                if core.keyed is not None and t0 >= next_timer_check:
                    did = core.fire_timers() or did
                    next_timer_check = t0 + timer_every
                # useful time (DS2): operator work with its decoding and the encoding of
                # its output, lingering frames included; waits for input (idle) and for
                # credits (backpressured) are counted apart. Two clock reads per pass.
                framed = len(outbox)
                core.flush_due()
                t1 = clock.monotonic()
                if did or len(outbox) != framed:
                    counters.on_busy(t1 - t0)
                self._ack_consumed()
                if core.priority_out:
                    self._send_priority()
                if core.is_source and t1 >= next_marker:
                    core.emit_latency_marker()
                    next_marker = t1 + marker_every
                if wm_every is not None and t1 >= next_wm:
                    core.emit_watermark()
                    next_wm = t1 + wm_every
                await self._send_outbox()
                if core.snapshots:
                    self._persist_snapshots()
                self._send_reports()
                # a source that read all that was due waits for its next poll below
                # (SourceDriver.seconds_until_ready) instead of polling again at once
                if did and not (core.is_source and core.source.caught_up):  # type: ignore[union-attr]
                    await asyncio.sleep(0)
                    continue
                timeout = self._idle_timeout(t1, next_marker, timer_every)
                if not core.has_work():
                    wake.clear()
                    t2 = clock.monotonic()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wake.wait(), timeout)
                    counters.on_idle(clock.monotonic() - t2)
            await self._send_outbox()
            await self._settle_in_flight()
        except DownstreamDied as exc:
            core.fail_internal(f"a downstream task died: {exc}", downstream=True)
        except OutputCodecError as exc:  # flushed outside an operator call: same report
            core.fail_output(exc)
        except Exception as exc:  # an engine bug: fail loudly with the task named
            core.fail_internal(f"internal error {type(exc).__name__}: {exc}")
        finally:
            self._ack_consumed()
            self._persist_snapshots()
            self._send_reports()
            if core.status != RUNNING:
                self._release_all_acks()

    def _idle_timeout(self, now: float, next_marker: float, timer_every: float) -> float:
        core = self.core
        candidates = [0.05]
        deadline = core.router.next_deadline()
        if deadline is not None:
            candidates.append(deadline - now)
        if core.source is not None:
            candidates.append(1.0 if core.paused else core.source.seconds_until_ready())
            candidates.append(next_marker - now)
        if core.keyed is not None and core.next_timer_ms() is not None:
            candidates.append(timer_every)
        return max(0.0, min(candidates))


def _drop_frame(channel_id: int, seq: int, payload: bytes, conn: ServerConnection) -> None:
    """A frame for a task this actor no longer runs (recycled): acknowledged, dropped."""
    conn.ack(channel_id, seq)


def _acknowledge(key: tuple[int, int], ack: asyncio.Future[None] | ServerConnection) -> None:
    if isinstance(ack, ServerConnection):
        ack.ack(*key)
    elif not ack.done():
        ack.set_result(None)


RemoteTask = ray.remote(max_restarts=0, max_task_retries=0)(TaskActor)

