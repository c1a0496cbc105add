"""The JobMaster's checkpoints: periodic triggers, savepoints, and the execution of the
checkpoint coordinator's commands (``engine.checkpoints.coordinator``).

Why here: the coordinator decides; this is the only code that turns its commands into Ray
calls and store I/O (in threads: the JobMaster's loop never waits on a filesystem), feeds
it the tasks' acknowledgements, and tells the waiters (a savepoint call, a stop-restart,
the job's final checkpoint) how their checkpoint ended.

Checkpoints and rescales (docs/architecture.md, "the life of a checkpoint"): a checkpoint
is consistent only over a dataflow that does not change under it, so the two exclude each
other at the JobMaster, at subscale granularity, as the job's arbiter
(``engine.control.arbiter``) decides: a checkpoint is triggered only when no rescale has a
change in flight (no subscale running, no task being added or removed); while one is
pending, or due and waiting for running subscales to finish, a rescale waits at the
arbiter's gate before it starts anything new. Nothing polls: the arbiter's decisions wake
the waiters (``engine.runtime.arbitration``). So a checkpoint taken during a live rescale
holds the job between two subscales, as it is: tasks added for the rescale, the
assignment so far; recovery from it restores exactly that, and the rescale request,
retried, plans the rest.

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
from collections.abc import Sequence
from typing import Any, Protocol

from engine.checkpoints.coordinator import (
    CheckpointCoordinator,
    Command,
    Discard,
    DiscardFiles,
    FailJob,
    NotifyAborted,
    NotifyComplete,
    Outcome,
    TriggerTasks,
    WriteMetadata,
)
from engine.checkpoints.metadata import CheckpointKind, CheckpointMetadata
from engine.checkpoints.store import (
    default_root,
    discard,
    discard_files,
    join,
    write_metadata,
)
from engine.control.arbiter import Action, ActionKind, Verdict
from engine.errors import CheckpointFailed
from engine.names import JobState
from engine.runtime.arbitration import Arbitration
from engine.runtime.ports import JobPort
from engine.wire.messages import (
    CheckpointAborted,
    CheckpointAck,
    CheckpointComplete,
    CheckpointDeclined,
    TriggerCheckpoint,
)

log = logging.getLogger(__name__)


class CheckpointPort(JobPort, Protocol):
    """What checkpoints ask of the JobMaster beyond ``JobPort``."""

    def checkpoint_completed(self, meta: CheckpointMetadata) -> None:
        """``meta`` is the job's last complete checkpoint (its record says so)."""
        ...

    def notify(self) -> None: ...


class Checkpointing:
    """One job's checkpoints on the JobMaster (see the module doc)."""

    def __init__(self, port: CheckpointPort, arbitration: Arbitration) -> None:
        self.port = port
        self.arbitration = arbitration
        cfg, record = port.config, port.record
        self.root = join(cfg.checkpoint_dir or default_root(), port.job_id)
        self.coord = CheckpointCoordinator(port.job_id, record.graph.name,
                                           record.graph_plan.num_key_groups, cfg,
                                           port.clock, self.root)
        self._waiters: dict[int, asyncio.Future[Outcome]] = {}

    # -- taking checkpoints
    async def loop(self) -> None:
        """Periodic checkpoints, each when due and the rescales let it."""
        p = self.port
        interval = p.config.checkpoint_interval_s
        assert interval is not None
        tick = min(0.1, interval / 10)
        while p.record.status.active:
            await asyncio.sleep(tick)
            if (p.record.status != JobState.RUNNING or self.arbitration.core.finishing
                    or not self.coord.due()):
                continue
            with contextlib.suppress(CheckpointFailed):
                await self.take(CheckpointKind.CHECKPOINT)

    async def take(self, kind: CheckpointKind, location: str | None = None,
                   stop: bool = False, exclusive: bool = False) -> CheckpointMetadata:
        """Trigger a checkpoint (or savepoint, at ``location``) once the arbiter lets it (no
        rescale has a change in flight, no other checkpoint runs), and wait until it is
        complete: its metadata, or ``CheckpointFailed``. ``exclusive``: the caller is the
        stop-restart rescale, which runs alone (it does not wait for itself)."""
        p = self.port
        d = await self.arbitration.acquire(Action(ActionKind.CHECKPOINT, exclusive=exclusive))
        try:
            status = p.record.status
            if d.verdict is not Verdict.RUN or status != JobState.RUNNING:
                raise CheckpointFailed(f"job {p.job_id} is {status}: no {kind} taken",
                                       reason=f"job {status}")
            cmds = self.coord.trigger(p.dep, kind, location, stop)
            first = cmds[0]
            assert isinstance(first, TriggerTasks)
            cid = first.checkpoint_id
            fut: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
            self._waiters[cid] = fut
            await self.run(cmds)
            while not fut.done():  # until complete, failed, or checkpoint_timeout_s passed
                await asyncio.wait([fut], timeout=self._until_timeout())
                if not fut.done():
                    await self.run(self.coord.check())
            outcome = fut.result()
        finally:
            if d.verdict is Verdict.RUN:
                self.arbitration.release(d.ticket)
        if outcome.metadata is None:
            raise CheckpointFailed(f"{kind} {cid} of job {p.job_id} failed: {outcome.reason}",
                                   checkpoint_id=cid, task=outcome.task, reason=outcome.reason)
        return outcome.metadata

    def _until_timeout(self) -> float:
        """Seconds until the pending checkpoint times out; at least a quarter of a second
        (one writing its metadata does not time out: it is looked at again then)."""
        pending = self.coord.pending
        if pending is None:
            return 0.25
        limit = self.port.config.checkpoint_timeout_s
        return max(0.25, pending.started + limit - self.port.clock.monotonic())

    async def final(self) -> bool:
        """The job's input ended everywhere: a last checkpoint commits what the sinks wrote
        since the previous one (Flink's final checkpoint). True once one completed; False
        when the job stopped running first (failures beyond the tolerable fail it)."""
        while self.port.record.status == JobState.RUNNING:
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
        p = self.port
        for cmd in cmds:
            match cmd:
                case TriggerTasks(checkpoint_id=cid, location=loc, stop=stop, tasks=tasks,
                                  savepoint=savepoint):
                    await self._send(tasks, TriggerCheckpoint(cid, loc, stop, savepoint))
                case WriteMetadata(metadata=meta):
                    error = None
                    try:
                        await asyncio.to_thread(write_metadata, meta)
                    except (OSError, ValueError) as exc:
                        error = f"{type(exc).__name__}: {exc}"
                    await self.run(self.coord.on_written(meta.checkpoint_id, error))
                case NotifyComplete(checkpoint_id=cid, tasks=tasks):
                    await self._send(tasks, CheckpointComplete(cid))
                case NotifyAborted(checkpoint_id=cid, tasks=tasks, forget_uploads=forget):
                    await self._send(tasks, CheckpointAborted(cid, forget))
                case Discard(locations=locations):
                    for loc in locations:
                        try:
                            await asyncio.to_thread(discard, loc)
                        except Exception as exc:  # noqa: BLE001 - a leftover directory only
                            log.warning("could not delete checkpoint %s: %s", loc, exc)
                case DiscardFiles(locations=locations, files=files):
                    try:
                        await asyncio.to_thread(discard_files, locations, files)
                    except Exception as exc:  # noqa: BLE001 - leftover files only
                        log.warning("could not delete checkpoint files of %s: %s",
                                    ", ".join(locations) or "earlier checkpoints", exc)
                case FailJob(reason=reason):
                    log.error("job %s: %s", p.job_id, reason)
                    asyncio.ensure_future(p.fail(reason))
        self._resolve()

    async def _send(self, tasks: Sequence[str], msg: Any) -> None:
        """``msg`` to each live task at once, each within ``control_timeout_s``; one that
        does not answer or died is not waited for (see the module doc)."""
        p = self.port
        live = [t for t in tasks if t in p.handles]
        results = await asyncio.gather(*(
            asyncio.wait_for(p.call(t, msg), p.deadlines.control_s) for t in live),
            return_exceptions=True)
        for t, r in zip(live, results, strict=True):
            if isinstance(r, BaseException):
                log.warning("job %s: task %s did not take %s: %s", p.job_id, t,
                            type(msg).__name__, type(r).__name__)

    def _resolve(self) -> None:
        """Outcomes to their waiters, to the metrics and to the job's record."""
        c = self.port.collector
        for out in self.coord.take_outcomes():
            key = "completed" if out.completed else "failed"
            c.checkpoints_total[key] = c.checkpoints_total.get(key, 0) + 1
            if out.metadata is not None:
                meta = out.metadata
                c.checkpoint_durations.append(meta.duration_s)
                c.checkpoint_bytes = meta.bytes
                c.checkpoint_alignment = {t.task: (t.vertex, t.index, t.alignment_s)
                                          for t in meta.tasks}
                self.port.checkpoint_completed(meta)
            else:
                log.warning("job %s: %s %d failed: %s", self.port.job_id, out.kind,
                            out.checkpoint_id, out.reason)
            fut = self._waiters.pop(out.checkpoint_id, None)
            if fut is not None and not fut.done():
                fut.set_result(out)
        self.port.notify()


__all__ = ["CheckpointPort", "Checkpointing"]
