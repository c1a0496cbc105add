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
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from engine.checkpoints.metadata import CheckpointMetadata
from engine.checkpoints.restore import (
    RestorePlan,
    TaskRestore,
    plan_restore,
)
from engine.checkpoints.store import read_metadata, resolve
from engine.control.arbiter import Action, ActionKind, Verdict
from engine.control.steps import (
    DeploySteps,
    RecoveryOutcome,
    RecoverySteps,
    ReplaceDeployment,
    StepMachine,
)
from engine.dataflow.deployment import ChannelIds, Deployment, source_partitions
from engine.dataflow.restart import RestartStrategy
from engine.errors import JobFailedError, JobRestarted
from engine.names import JobState
from engine.runtime.arbitration import Arbitration
from engine.runtime.checkpointing import Checkpointing
from engine.runtime.failures import reflow_error_in
from engine.runtime.ports import JobPort
from engine.task.core import TaskSpec
from engine.wire.messages import TaskFailed
from migration.coordinator import CreateTasks, Phase, RemoveTasks, SendControl, Sleep


class RecoveryPort(JobPort, Protocol):
    """What recovery asks of the JobMaster beyond ``JobPort``: the record's restart
    transitions, the task actors, and the rest of the job forgetting its tasks."""

    @property
    def ids(self) -> ChannelIds: ...

    async def create_task(self, name: str, spec: TaskSpec) -> None: ...

    def kill_tasks(self) -> None: ...

    def release_recycled(self) -> None:
        """Recycled task actors that no new task took are killed."""
        ...

    def deploying(self, dep: Deployment) -> None:
        """The job runs ``dep`` from now on (its tasks are being created)."""
        ...

    async def forget_tasks(self) -> None:
        """Every task is stopped for a restart (killed, or recycled when the job reuses
        its processes): their failures, the rescales' work and the replicas go with
        them."""
        ...

    def take_deferred_failure(self) -> TaskFailed | None: ...

    def restart_began(self, cause: str) -> None: ...

    def restart_retried(self) -> None: ...

    def restarted(self) -> None: ...

    def restart_gave_up(self, suffix: str) -> None: ...

    def restart_abandoned(self) -> None:
        """Restarting failed for good: the job is running again, for its failure to be
        recorded as that of a running job."""
        ...

    def note_failure(self, note: str) -> None: ...

    def checkpoint_completed(self, meta: CheckpointMetadata) -> None: ...

    async def fail_for_good(self, error: str) -> None: ...


class Recovery:
    """Restarts of one job (see the module doc)."""

    def __init__(self, port: RecoveryPort, arbitration: Arbitration,
                 checkpoints: Checkpointing) -> None:
        self.port = port
        self.arbitration = arbitration
        self.checkpoints = checkpoints
        self.strategy = RestartStrategy(port.config)
        self._ticket: int | None = None  # the arbiter's grant of the running restart

    # -- reads (the job's record keeps them)
    @property
    def epoch(self) -> int:
        return self.port.record.epoch

    @property
    def restarts(self) -> int:
        return self.port.record.restarts

    @property
    def last_failure(self) -> str:
        return self.port.record.last_failure

    @property
    def restarting(self) -> bool:
        return self.arbitration.core.restarting

    # -- failures
    def begin(self, cause: str, force: bool = False) -> bool:
        """The job failed with ``cause``: True when the strategy restarts it (the job is
        ``restarting`` from now on and ``run`` must be awaited), False when the job fails.
        ``force``: restart without asking the strategy (a JobMaster's takeover: the loss
        of a JobMaster is not the job's failure)."""
        p = self.port
        if self.restarting:
            return True  # a failure of what we are killing, or during the restart
        if p.record.status != JobState.RUNNING and not (force and p.record.status.active):
            return False  # (a takeover restarts a job lost while deploying or restarting)
        decision = None if force else self.strategy.on_failure(cause)
        if decision is not None and not decision.restart:
            if p.record.restarts:
                p.restart_gave_up(f" (after {p.record.restarts} restarts: {decision.reason})")
            return False
        d = self.arbitration.core.request(Action(ActionKind.RECOVERY))
        assert d.verdict is Verdict.RUN, d
        self._ticket = d.ticket
        p.restart_began(cause)
        self.arbitration.deliver()
        return True

    def _end(self) -> None:
        if self._ticket is not None:
            ticket, self._ticket = self._ticket, None
            self.arbitration.release(ticket)

    async def run(self, cause: str) -> None:
        """Restart the job (``begin`` said so); a failure while restarting asks the strategy
        again, and fails the job when it gives up."""
        p = self.port
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
                    self._end()
                    p.restart_abandoned()
                    await p.fail_for_good(f"{cause} ({decision.reason})")
                    return
                p.restart_retried()

    async def _restart(self, cause: str) -> None:
        p = self.port
        await self.checkpoints.abort(f"the job restarts after a failure: {cause}")
        await p.forget_tasks()
        await asyncio.sleep(self.strategy.delay_s)
        coord = self.checkpoints.coord
        latest = coord.latest
        # the newest first: a checkpoint that does not read back whole falls back to the
        # newest older retained one that does (RecoverySteps)
        candidates = () if latest is None else (latest, *(
            c for c in reversed(coord.retained) if c.checkpoint_id < latest.checkpoint_id))
        record = p.record
        outcome: RecoveryOutcome = await self.run_steps(RecoverySteps(
            record.graph_plan, p.job_id, record.next_generation, p.dep.partitions, p.ids,
            p.clock, candidates))
        if outcome.skipped and outcome.restored is not None:
            meta = outcome.restored.checkpoint
            coord.latest = meta  # the one a next failure goes back to
            coord.retained = [c for c in coord.retained
                              if c.checkpoint_id <= meta.checkpoint_id]
            p.checkpoint_completed(meta)
            coord.last_failure = outcome.note
            last = p.record.last_failure
            p.note_failure(f"{last}; {outcome.note}" if last else outcome.note)
        failed = p.take_deferred_failure()
        if failed is not None:  # a task of the new deployment failed while it was deployed
            raise JobFailedError(f"task {failed.task} of operator {failed.operator!r} failed "
                                 f"as it was restored: {failed.cause}",
                                 operator=failed.operator, task=failed.task)
        self._end()
        p.restarted()

    async def wait_running(self, epoch: int) -> None:
        """Until the job runs again after the restart that ended ``epoch`` (or raise the
        job's failure)."""
        p = self.port
        while self.restarting or p.record.status == JobState.RESTARTING:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(p.changed().wait(), 0.5)
        if p.record.status != JobState.RUNNING:
            raise JobFailedError(p.record.error or f"job {p.job_id} is {p.record.status}")

    # -- restores
    async def plan_from(self, location: str, allow_non_restored_state: bool) -> RestorePlan:
        """The restore of the savepoint or checkpoint at ``location`` (a job's checkpoint
        directory: its latest complete checkpoint) into this job; ``RestoreError`` says why
        not."""
        record = self.port.record
        path = await asyncio.to_thread(resolve, location)
        meta: CheckpointMetadata = await asyncio.to_thread(read_metadata, path)
        # a source the checkpoint does not know gets its own list (asked of it, once)
        known = {v.name for v in meta.vertices if v.source and v.partitions}
        graph_plan = record.graph_plan
        fresh = {k: p for k, p in source_partitions(graph_plan).items() if k not in known} \
            if any(v.is_source and v.name not in known for v in graph_plan.vertices) else {}
        return plan_restore(meta, graph_plan, record.job_id, record.next_generation,
                            allow_non_restored_state,
                            partitions={**record.deployment.partitions, **fresh})

    async def deploy(self, dep: Any, restore: Mapping[str, TaskRestore],
                     on_start: Callable[[], None] | None = None) -> None:
        """Deploy ``dep`` (new task actors), each task with its ``restore``: create, wire
        (receivers first), restore state, start (sources last), as
        ``engine.control.steps.DeploySteps`` says (the one copy of that choreography,
        which the in-process test harness runs too). Within ``deploy_s``. ``on_start``:
        called once before the first task is started (a first deploy: the job runs)."""
        await self.run_steps(DeploySteps(dep, self.port.ids, self.port.clock, restore),
                             on_start)

    async def run_steps(self, machine: StepMachine,
                        on_start: Callable[[], None] | None = None) -> Any:
        """Execute a deploy-like step machine's commands (``engine.control.steps``, the
        module doc says how each applies) within ``Deadlines.deploy_s``; its report. A
        task's own error goes to the machine (``on_error``), which raises it unless it
        goes on."""
        p = self.port
        deadline = p.clock.monotonic() + p.deadlines.deploy_s
        queue: deque[Any] = deque(machine.start())
        started = on_start is None
        try:
            while not machine.done:
                cmd = queue.popleft()
                if not started and isinstance(cmd, SendControl) and cmd.phase == Phase.START:
                    started = True
                    assert on_start is not None
                    on_start()
                try:
                    result = await self._apply(cmd, deadline)
                except Exception as exc:
                    err = reflow_error_in(exc)
                    if err is None:
                        raise
                    queue.extend(machine.on_error(cmd, err))
                    continue
                queue.extend(machine.on_result(cmd, result))
        finally:
            p.release_recycled()  # the tasks exist (or the deploy failed)
        return machine.report()

    async def _apply(self, cmd: Any, deadline: float) -> Any:
        """One command of a deploy-like machine, on the job's task actors."""
        p = self.port
        match cmd:
            case SendControl(calls=calls):
                by_task = {c.task: c for c in calls}
                await p.each(list(by_task), lambda t: p.call(
                    t, by_task[t].message, by_task[t].introduce), deadline)
            case CreateTasks(vertex=vertex, names=names, deployment=dep):
                for name in names:
                    await p.create_task(name, TaskSpec.of(
                        dep, vertex, dep.tasks[vertex].index(name), name, p.config))
            case RemoveTasks():
                p.kill_tasks()
            case ReplaceDeployment(deployment=dep):
                p.deploying(dep)
            case Sleep(seconds=seconds):
                await asyncio.sleep(seconds)
            case _:
                raise TypeError(f"unknown deploy step {cmd!r}")
        return None


__all__ = ["JobRestarted", "Recovery"]
