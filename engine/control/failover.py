"""What a JobMaster that takes a job over does with it: reconcile with the live tasks, or
restart them from the latest complete checkpoint.

Why: a detached job's JobMaster is restarted by Ray when its process dies (or another
JobMaster takes the job over, fencing the old one). The new one reads the job's durable
record (``engine.control.durable``) and must decide, from that record and from what the
task actors it can still reach say, whether the job can go on as it is (every task alive
and keeping its state: no output is lost or repeated, nothing restarts) or must restart
every task from the latest complete checkpoint (Flink's JobManager failover always does
the latter). The decision is a value with its reason; ``engine.runtime.failover`` asks
the tasks and carries it out.

When the job reconciles (all of these hold):

* the record says the job was running (not created, restarting, or ended);
* no action that changes the deployment or the tasks' logic was running when the old
  JobMaster was lost: a rescale, a placement, a change of logic, a replica refresh, the
  final checkpoint or a recovery leave tasks half-way through a protocol whose other half
  only the old JobMaster knew (its coordinator's state is not durable), so those restart;
  a running checkpoint is aborted instead (its barriers are dropped by
  ``CheckpointAborted``, its sink transactions are committed by the next checkpoint);
* every task of the recorded deployment was found by name and answered, and none says
  it failed;
* the newest complete checkpoint reads back (the tasks' incremental checkpoints build on
  the last one they saw complete).

Otherwise the job restarts from its latest complete checkpoint (from the start of its
input without one), exactly as after a task's failure, but without asking the restart
strategy: the loss of a JobMaster is not the job's failure.

Checkpoint ids go on after the record's counter with a margin (``ID_MARGIN``): the old
JobMaster may have triggered a checkpoint whose id it had not yet written; every id in
the margin is aborted on the tasks.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from engine.control.arbiter import ActionKind
from engine.names import JobState, NameEnum

ID_MARGIN = 3  # checkpoint ids the old JobMaster may have triggered unrecorded

#: actions the old JobMaster could have left half-done on the tasks
RESTART_ACTIONS = frozenset({
    ActionKind.RESCALE, ActionKind.EXCLUSIVE_RESCALE, ActionKind.PLACEMENT,
    ActionKind.CHANGE_LOGIC, ActionKind.REPLICA_REFRESH, ActionKind.FINISH,
    ActionKind.RECOVERY,
})


class FailoverPath(NameEnum):
    """What a JobMaster taking a job over does."""

    RECONCILE = "reconcile"  # keep the live tasks and their state
    RESTART = "restart"      # every task from the latest complete checkpoint
    ENDED = "ended"          # the job had ended: keep its final status, stop leftovers


class TaskAnswer(NameEnum):
    """What a task of the recorded deployment said when the new JobMaster asked."""

    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    MISSING = "missing"  # no actor by that name, or it did not answer in time


@dataclass(frozen=True)
class FailoverDecision:
    """``path`` and why; ``finished``: tasks that finished already (a reconciled job's
    end is noticed from them); ``next_checkpoint_id``: where checkpoint ids go on;
    ``abort``: ids to abort on the tasks (a reconciled job)."""

    path: FailoverPath
    reason: str
    next_checkpoint_id: int
    finished: frozenset[str] = frozenset()
    abort: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.next_checkpoint_id < 1:
            raise ValueError(f"checkpoint ids start at 1; got {self.next_checkpoint_id}")
        if self.path is not FailoverPath.RECONCILE and (self.finished or self.abort):
            raise ValueError("only a reconciled job keeps finished tasks or aborts ids")


def decide_failover(status: JobState, running: Collection[ActionKind],
                    answers: Mapping[str, TaskAnswer], latest_checkpoint: int,
                    next_checkpoint_id: int, checkpoints_whole: bool = True
                    ) -> FailoverDecision:
    """The path for a job whose durable record says ``status`` with ``running`` actions,
    whose recorded tasks answered ``answers`` (every task of the recorded deployment),
    whose latest complete checkpoint is ``latest_checkpoint`` (0: none) and whose record
    counts checkpoint ids up to ``next_checkpoint_id``. ``checkpoints_whole``: False when
    a newer complete checkpoint than ``latest_checkpoint`` did not read back (the tasks'
    incremental chains may build on it: they restart from the one that reads)."""
    if not status.active:
        return FailoverDecision(FailoverPath.ENDED, f"the job had ended ({status})",
                                max(1, next_checkpoint_id))
    next_id = max(next_checkpoint_id, latest_checkpoint + 1) + ID_MARGIN

    def restart(reason: str) -> FailoverDecision:
        return FailoverDecision(FailoverPath.RESTART, reason, next_id)

    if status != JobState.RUNNING:
        return restart(f"the job was {status} when its JobMaster was lost")
    if not checkpoints_whole:
        return restart("the newest complete checkpoint does not read back: the tasks' "
                       "incremental checkpoints may build on it")
    unfinished = sorted(str(a) for a in set(running) & RESTART_ACTIONS)
    if unfinished:
        return restart(f"a {', '.join(unfinished)} was running when the JobMaster was lost "
                       "and only that JobMaster knew its progress")
    if not answers:
        return restart("the record lists no task")
    missing = sorted(t for t, a in answers.items() if a == TaskAnswer.MISSING)
    if missing:
        return restart(f"{len(missing)} of {len(answers)} tasks are gone or silent "
                       f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
    failed = sorted(t for t, a in answers.items() if a == TaskAnswer.FAILED)
    if failed:
        return restart(f"task {failed[0]} had failed")
    abort = tuple(range(latest_checkpoint + 1, next_id))
    return FailoverDecision(
        FailoverPath.RECONCILE, f"all {len(answers)} tasks are alive and no rescale or "
        "change of logic was running", next_id,
        frozenset(t for t, a in answers.items() if a == TaskAnswer.FINISHED), abort)


__all__ = ["ID_MARGIN", "RESTART_ACTIONS", "FailoverDecision", "FailoverPath", "TaskAnswer",
           "decide_failover"]
