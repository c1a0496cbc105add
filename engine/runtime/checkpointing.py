"""The JobMaster's checkpoints: periodic triggers, savepoints, and the execution of the
checkpoint coordinator's commands (``engine.checkpoints.coordinator``).

Why here: the coordinator decides; this is the only code that turns its commands into Ray
calls and store I/O (in threads: the JobMaster's loop never waits on a filesystem), feeds
it the tasks' acknowledgements, and tells the waiters (a savepoint call, a stop-restart,
the job's final checkpoint) how their checkpoint ended.

Checkpoints and rescales (docs/architecture.md, "the life of a checkpoint"): a checkpoint
is consistent only over a dataflow that does not change under it, so the two exclude each
other at the JobMaster, at subscale granularity. A checkpoint is triggered only when no
rescale has a change in flight (``Rescaler.quiescent``: no subscale running, no task being
added or removed); while one is pending, or due and waiting for running subscales to
finish (``wanted``), a rescale waits at ``gate`` before it starts anything new. So a
checkpoint taken during a live rescale holds the job between two subscales, as it is:
tasks added for the rescale, the assignment so far; recovery from it restores exactly
that, and the rescale request, retried, plans the rest.

Guarantees: one checkpoint at a time; ``take`` returns the metadata of a complete
checkpoint or raises ``CheckpointFailed`` (the job goes on), within
``checkpoint_timeout_s`` once triggered; a task that does not answer a trigger or a
notification in time is not waited for (the checkpoint times out; a dead task is the
watch's to find); outcomes are counted in the metrics
(``reflow_checkpoints_total{outcome}``, duration, size, alignment per task).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from engine.checkpoints.coordinator import (
    CheckpointCoordinator,
    Command,
    Discard,
    FailJob,
    NotifyAborted,
    NotifyComplete,
    Outcome,
    TriggerTasks,
    WriteMetadata,
)
from engine.checkpoints.metadata import CheckpointKind, CheckpointMetadata
from engine.checkpoints.store import default_root, discard, join, write_metadata
from engine.errors import CheckpointFailed
from engine.names import JobState
from engine.wire.messages import (
    CheckpointAborted,
    CheckpointAck,
    CheckpointComplete,
    CheckpointDeclined,
    TriggerCheckpoint,
)

if TYPE_CHECKING:
    from engine.runtime.job_master import JobMaster

log = logging.getLogger(__name__)
_POLL_S = 0.01  # how often a waiter looks again (quiescence, settling)


class Checkpointing:
    """One job's checkpoints on the JobMaster (see the module doc)."""

    def __init__(self, master: JobMaster) -> None:
        self.m = master
        cfg = master.config
        self.root = join(cfg.checkpoint_dir or default_root(), master.job_id)
        self.coord = CheckpointCoordinator(master.job_id, master.graph.name,
                                           master.graph_plan.num_key_groups, cfg,
                                           master.clock, self.root)
        self.wanted = False  # due, waiting for running subscales to finish
        self._lock = asyncio.Lock()
        self._waiters: dict[int, asyncio.Future[Outcome]] = {}

    # -- the rescales' side
    @property
    def settled(self) -> bool:
        """No checkpoint pending or waiting to start: a rescale may change the dataflow."""
        return self.coord.pending is None and not self.wanted

    async def gate(self, still: Callable[[], None]) -> None:
        """Wait until ``settled``; ``still()`` raises when the caller must give up (the job
        restarted or failed meanwhile)."""
        while not self.settled:
            still()
            await asyncio.sleep(_POLL_S)
        still()

    # -- taking checkpoints
    async def loop(self) -> None:
        """Periodic checkpoints, each when due and the rescales let it."""
        m = self.m
        interval = m.config.checkpoint_interval_s
        assert interval is not None
        tick = min(0.1, interval / 10)
        while m.state.active:
            await asyncio.sleep(tick)
            if m.state != JobState.RUNNING or m.finishing or not self.coord.due():
                continue
            with contextlib.suppress(CheckpointFailed):
                await self.take(CheckpointKind.CHECKPOINT)

    async def take(self, kind: CheckpointKind, location: str | None = None,
                   stop: bool = False, exclusive: bool = False) -> CheckpointMetadata:
        """Trigger a checkpoint (or savepoint, at ``location``) once no rescale has a change
        in flight, and wait until it is complete: its metadata, or ``CheckpointFailed``.
        ``exclusive``: the caller is the stop-restart rescale, which runs alone (it does
        not wait for itself)."""
        m = self.m
        async with self._lock:
            self.wanted = True
            try:
                while (m.state == JobState.RUNNING and not exclusive
                       and not m.rescaler.quiescent()):
                    await asyncio.sleep(_POLL_S)
                if m.state != JobState.RUNNING:
                    raise CheckpointFailed(f"job {m.job_id} is {m.state}: no {kind} taken",
                                           reason=f"job {m.state}")
                cmds = self.coord.trigger(m.dep, kind, location, stop)
            finally:
                self.wanted = False
            first = cmds[0]
            assert isinstance(first, TriggerTasks)
            cid = first.checkpoint_id
            fut: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
            self._waiters[cid] = fut
            await self.run(cmds)
            while not fut.done():
                await asyncio.wait([fut], timeout=0.25)
                if not fut.done():
                    await self.run(self.coord.check())
            outcome = fut.result()
        if outcome.metadata is None:
            raise CheckpointFailed(f"{kind} {cid} of job {m.job_id} failed: {outcome.reason}",
                                   checkpoint_id=cid, task=outcome.task, reason=outcome.reason)
        return outcome.metadata

    async def final(self) -> bool:
        """The job's input ended everywhere: a last checkpoint commits what the sinks wrote
        since the previous one (Flink's final checkpoint). True once one completed; False
        when the job stopped running first (failures beyond the tolerable fail it)."""
        while self.m.state == JobState.RUNNING:
            with contextlib.suppress(CheckpointFailed):
                await self.take(CheckpointKind.CHECKPOINT)
                return True
        return False

    async def abort(self, reason: str) -> None:
        """The job restarts or stops: the pending checkpoint fails without counting."""
        await self.run(self.coord.abort(reason))

    # -- reports
    async def on_report(self, msg: Any) -> None:
        if isinstance(msg, (CheckpointAck, CheckpointDeclined)):
            await self.run(self.coord.on_report(msg))

    # -- commands
    async def run(self, cmds: Sequence[Command]) -> None:
        """Execute the coordinator's commands in order (each result fed back)."""
        m = self.m
        for cmd in cmds:
            match cmd:
                case TriggerTasks(checkpoint_id=cid, location=loc, stop=stop, tasks=tasks):
                    await self._send(tasks, TriggerCheckpoint(cid, loc, stop))
                case WriteMetadata(metadata=meta):
                    error = None
                    try:
                        await asyncio.to_thread(write_metadata, meta)
                    except (OSError, ValueError) as exc:
                        error = f"{type(exc).__name__}: {exc}"
                    await self.run(self.coord.on_written(meta.checkpoint_id, error))
                case NotifyComplete(checkpoint_id=cid, tasks=tasks):
                    await self._send(tasks, CheckpointComplete(cid))
                case NotifyAborted(checkpoint_id=cid, tasks=tasks):
                    await self._send(tasks, CheckpointAborted(cid))
                case Discard(locations=locations):
                    for loc in locations:
                        try:
                            await asyncio.to_thread(discard, loc)
                        except Exception as exc:  # noqa: BLE001 - a leftover directory only
                            log.warning("could not delete checkpoint %s: %s", loc, exc)
                case FailJob(reason=reason):
                    log.error("job %s: %s", m.job_id, reason)
                    asyncio.ensure_future(m.fail(reason))
        self._resolve()

    async def _send(self, tasks: Sequence[str], msg: Any) -> None:
        """``msg`` to each live task at once, each within ``control_timeout_s``; one that
        does not answer or died is not waited for (see the module doc)."""
        m = self.m
        live = [t for t in tasks if t in m.handles]
        results = await asyncio.gather(*(
            asyncio.wait_for(m.call(t, msg), m.deadlines.control_s) for t in live),
            return_exceptions=True)
        for t, r in zip(live, results, strict=True):
            if isinstance(r, BaseException):
                log.warning("job %s: task %s did not take %s: %s", m.job_id, t,
                            type(msg).__name__, type(r).__name__)

    def _resolve(self) -> None:
        """Outcomes to their waiters and to the metrics."""
        c = self.m.collector
        for out in self.coord.take_outcomes():
            key = "completed" if out.completed else "failed"
            c.checkpoints_total[key] = c.checkpoints_total.get(key, 0) + 1
            if out.metadata is not None:
                meta = out.metadata
                c.checkpoint_durations.append(meta.duration_s)
                c.checkpoint_bytes = meta.bytes
                c.checkpoint_alignment = {t.task: (t.vertex, t.index, t.alignment_s)
                                          for t in meta.tasks}
            else:
                log.warning("job %s: %s %d failed: %s", self.m.job_id, out.kind,
                            out.checkpoint_id, out.reason)
            fut = self._waiters.pop(out.checkpoint_id, None)
            if fut is not None and not fut.done():
                fut.set_result(out)
        self.m.notify()


__all__ = ["Checkpointing"]
