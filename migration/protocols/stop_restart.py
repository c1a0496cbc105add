"""Stop-restart rescaling (Flink's), the baseline every other protocol is measured against:
stop the job with a savepoint, then deploy every task again from it with the operator at its
new parallelism (key groups re-assigned by the new assignment, sources at the savepoint's
positions): the snapshot and restore path of checkpoints and recovery, nothing of its own.

The plan is a ``MigrationPlan`` like every other (one step, by pair, for inspection: every
group is restored since every task restarts); the coordinator runs the ``PHASES``.
"""

from __future__ import annotations

from engine.dataflow.keygroups import moved_key_groups
from engine.names import NameEnum
from migration.assignment import rescale_target
from migration.plan import MigrationPlan, subscales_by_pair
from migration.protocols.base import PlanRequest, ProtocolSpec, RescaleProtocol


class StopRestartPhase(NameEnum):
    """``savepoint``: sources stop at its barrier, every task snapshots, the savepoint is
    written; ``restore``: every task is replaced by a new one restored from it, started."""

    SAVEPOINT = "savepoint"
    RESTORE = "restore"


PHASES = tuple(StopRestartPhase)


def plan(req: PlanRequest) -> MigrationPlan:
    """A stateless operator has empty assignments and no steps."""
    old, new = req.old_assignment, req.new_assignment
    moved = moved_key_groups(old, new) if old else []
    step = subscales_by_pair(moved, old, new, req.first_id) if moved else ()
    return MigrationPlan(req.operator, RescaleProtocol.STOP_RESTART, req.old_parallelism,
                         req.new_parallelism, old, new, (step,) if step else (),
                         f"every task of {req.operator!r} restarts; {len(moved)} key groups "
                         "change owner")


STOP_RESTART = ProtocolSpec(RescaleProtocol.STOP_RESTART, live=False, trigger=False,
                            aligned=False, block_aligned=False, pause_new_owner=False,
                            concurrent=False, planner=plan)


def plan_stop_restart(operator: str, old_parallelism: int,
                      old_assignment: tuple[int, ...] | None, new_parallelism: int,
                      num_key_groups: int,
                      assignment: tuple[int, ...] | None = None) -> MigrationPlan:
    """The stop-restart plan to ``assignment`` (a rebalance) or uniform ranges; a stateless
    operator (no assignment) has empty ones."""
    old = tuple(old_assignment or ())
    new = rescale_target(old, num_key_groups, new_parallelism, assignment)
    return plan(PlanRequest(operator, old, new, old_parallelism, new_parallelism))
