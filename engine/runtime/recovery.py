"""The JobMaster's recovery: a failed job restarts from its last complete checkpoint, and the
one path that deploys a job from a checkpoint (recovery, ``restore_from``, stop-restart).

Why one path: restarting after a failure, restoring a savepoint into a new job, and the
stop-restart rescale all do the same thing: plan which task gets which state
(``engine.checkpoints.restore.plan_restore``), start the task actors, give each its state
(``RestoreState``: key groups read from the store, sink transactions committed again), wire
them, start them with their sources' partitions at their positions. Only the plan's
inputs differ.

Recovery (Flink's full restart): the restart strategy (``engine.dataflow.restart``) decides; if it
restarts, the job is ``restarting``: the pending checkpoint is aborted, every task actor is
killed (a task stuck or half-dead must not write on), running rescales learn it
(``JobRestarted``: they try again once the job runs), and after the strategy's delay the
job is deployed from ``latest`` (the last complete checkpoint or savepoint; from the start
of the input with no state when there is none), as it was: each operator at its
parallelism and assignment in the checkpoint. Sources rewind to the checkpoint's positions;
sinks commit its transactions and drop what was written after it (exactly-once sinks).
A failure while restarting counts as another failure.

Guarantees: ``epoch`` grows by one per restart begun (a rescale or a wait that saw another
epoch knows the job restarted under it); ``restarting`` is set before the first await, so a
caller of ``JobMaster.fail`` sees the job restarting at once; ``wait_running`` returns once
the job runs again or raises the job's failure.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from engine.checkpoints.metadata import CheckpointMetadata
from engine.checkpoints.restore import (
    RestorePlan,
    TaskRestore,
    checkpoint_layout,
    fresh_deployment,
    plan_restore,
)
from engine.checkpoints.store import read_metadata, resolve
from engine.dataflow.deployment import connect_messages, source_partitions, start_message
from engine.dataflow.restart import RestartStrategy
from engine.errors import JobFailedError, RestoreError
from engine.names import JobState
from engine.runtime.failures import reflow_error_in
from engine.task.core import TaskSpec
from engine.wire.messages import RestoreState

if TYPE_CHECKING:
    from engine.runtime.job_master import JobMaster


class JobRestarted(Exception):  # noqa: N818 - a signal inside the JobMaster, never raised to users
    """The job restarted from a checkpoint under a running rescale or wait: what it did is
    gone; the rescale tries again once the job runs (``Recovery.wait_running``)."""


class Recovery:
    """Restarts of one job (see the module doc)."""

    def __init__(self, master: JobMaster) -> None:
        self.m = master
        self.strategy = RestartStrategy(master.config)
        self.epoch = 0
        self.restarts = 0
        self.last_failure = ""
        self.restarting = False

    # -- failures
    def begin(self, cause: str) -> bool:
        """The job failed with ``cause``: True when the strategy restarts it (the job is
        ``restarting`` from now on and ``run`` must be awaited), False when the job fails."""
        m = self.m
        if self.restarting:
            return True  # a failure of what we are killing, or during the restart
        if m.state != JobState.RUNNING:
            return False
        decision = self.strategy.on_failure(cause)
        if not decision.restart:
            if self.restarts:
                m.error_suffix = f" (after {self.restarts} restarts: {decision.reason})"
            return False
        self.restarting = True
        self.epoch += 1
        self.last_failure = cause
        m.state = JobState.RESTARTING
        return True

    async def run(self, cause: str) -> None:
        """Restart the job (``begin`` said so); a failure while restarting asks the strategy
        again, and fails the job when it gives up."""
        m = self.m
        first, failed = cause, 0
        while True:
            try:
                await self._restart(cause)
                return
            except Exception as exc:  # noqa: BLE001 - the restart failed: ask the strategy
                # one readable message: the first failure and the last restart's, not a
                # nest of every restart's
                failed += 1
                cause = (f"{first}; restarting failed {failed} time(s), the last with "
                         f"{type(exc).__name__}: {exc}")
                decision = self.strategy.on_failure(cause)
                if not decision.restart:
                    self.restarting = False
                    m.state = JobState.RUNNING  # so that the failure is recorded as such
                    await m.fail_for_good(f"{cause} ({decision.reason})")
                    return
                self.epoch += 1

    async def _restart(self, cause: str) -> None:
        m = self.m
        await m.checkpointing.abort(f"the job restarts after a failure: {cause}")
        m.kill_tasks()
        m.deferred_failure = None
        m.rescaler.restarted()
        m.replicas.reset()
        await asyncio.sleep(self.strategy.delay_s)
        latest = m.checkpointing.coord.latest
        if latest is None:  # from the start of the input, with no state
            await self.deploy(fresh_deployment(m.graph_plan, m.job_id, m.next_generation(),
                                               m.dep.partitions), {})
        else:
            await self._deploy_newest_readable(latest)
        failed = m.take_deferred_failure()
        if failed is not None:  # a task of the new deployment failed while it was deployed
            raise JobFailedError(f"task {failed.task} of operator {failed.operator!r} failed "
                                 f"as it was restored: {failed.cause}",
                                 operator=failed.operator, task=failed.task)
        self.restarts += 1
        m.collector.restarts = self.restarts
        self.restarting = False
        m.state = JobState.RUNNING
        m.notify()

    async def _deploy_newest_readable(self, latest: CheckpointMetadata) -> None:
        """Restore from ``latest``; when its files do not read back whole (missing, short,
        corrupt: ``RestoreError``), from the newest older retained checkpoint that does,
        saying so in the job's ``last_failure`` and in the checkpoint stats. Raises the
        last ``RestoreError`` when none reads back."""
        m = self.m
        coord = m.checkpointing.coord
        candidates = [latest, *(c for c in reversed(coord.retained)
                                if c.checkpoint_id < latest.checkpoint_id)]
        skipped: list[str] = []
        for i, meta in enumerate(candidates):
            plan = plan_restore(meta, checkpoint_layout(m.graph_plan, meta), m.job_id,
                                m.next_generation(), allow_non_restored_state=True,
                                partitions=m.dep.partitions)
            try:
                await self.deploy(plan.deployment, plan.tasks)
            except Exception as exc:  # noqa: BLE001 - only an unreadable checkpoint falls back
                err = reflow_error_in(exc)
                if not isinstance(err, RestoreError) or i == len(candidates) - 1:
                    raise
                skipped.append(f"checkpoint {meta.checkpoint_id} ({err})")
                m.kill_tasks()
                continue
            if skipped:
                coord.latest = meta  # the one a next failure goes back to
                coord.retained = [c for c in coord.retained
                                  if c.checkpoint_id <= meta.checkpoint_id]
                note = (f"restored from checkpoint {meta.checkpoint_id}: "
                        + "; ".join(skipped) + " did not read back whole")
                coord.last_failure = note
                self.last_failure = f"{self.last_failure}; {note}" if self.last_failure else note
            return

    async def wait_running(self, epoch: int) -> None:
        """Until the job runs again after the restart that ended ``epoch`` (or raise the
        job's failure)."""
        m = self.m
        while self.restarting or m.state == JobState.RESTARTING:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(m.changed().wait(), 0.5)
        if m.state != JobState.RUNNING:
            raise JobFailedError(m.error or f"job {m.job_id} is {m.state}")

    # -- restores
    async def plan_from(self, location: str, allow_non_restored_state: bool) -> RestorePlan:
        """The restore of the savepoint or checkpoint at ``location`` (a job's checkpoint
        directory: its latest complete checkpoint) into this job; ``RestoreError`` says why
        not."""
        m = self.m
        path = await asyncio.to_thread(resolve, location)
        meta: CheckpointMetadata = await asyncio.to_thread(read_metadata, path)
        # a source the checkpoint does not know gets its own list (asked of it, once)
        known = {v.name for v in meta.vertices if v.source and v.partitions}
        fresh = {k: p for k, p in source_partitions(m.graph_plan).items() if k not in known} \
            if any(v.is_source and v.name not in known for v in m.graph_plan.vertices) else {}
        return plan_restore(meta, m.graph_plan, m.job_id, m.next_generation(),
                            allow_non_restored_state, partitions={**m.dep.partitions, **fresh})

    async def deploy(self, dep: Any, restore: Mapping[str, TaskRestore]) -> None:
        """Deploy ``dep`` (new task actors), each task with its ``restore``: create, wire
        (receivers first), restore state, start (sources last). Within ``deploy_s``."""
        m = self.m
        m.dep = dep
        m.plan = dep.plan
        m.finished.clear()
        for v in dep.plan.vertices:
            for i, name in enumerate(dep.tasks[v.name]):
                m.create_task(name, TaskSpec.of(dep, v.name, i, name, m.config))
        msgs = connect_messages(dep, m.ids)
        deadline = m.clock.monotonic() + m.deadlines.deploy_s
        order = [t for v in reversed(dep.plan.vertices) for t in dep.tasks[v.name]]
        await m.each(order, lambda t: m.call(
            t, msgs[t], [c.target for e in msgs[t].outputs for c in e.channels]), deadline)
        restoring = [t for t, r in restore.items() if r.groups or r.transactions]
        if restoring:
            await m.each(restoring, lambda t: m.call(
                t, RestoreState(restore[t].groups, restore[t].transactions)), deadline)
        resume = {t: r.source_state for t, r in restore.items() if r.source_state}
        for v in reversed(dep.plan.vertices):  # sources last
            await m.each(list(dep.tasks[v.name]), lambda t, v=v: m.call(
                t, start_message(dep, v.name, dep.tasks[v.name].index(t), resume.get(t))),
                deadline)


__all__ = ["JobRestarted", "Recovery"]
