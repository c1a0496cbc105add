"""Stop-restart rescaling (Flink's default), the baseline every other protocol is measured
against: pause sources at a recorded offset, drain, snapshot every key group of the operator,
stop its tasks, start the new set, install key groups by the new assignment, reconnect, resume.

``plan_stop_restart`` is pure and returns the plan as a value; the JobMaster executes it
phase by phase (``PHASES``).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.keygroups import moved_key_groups, uniform_assignment

PHASES = ("pause", "drain", "snapshot", "stop", "deploy", "install", "connect", "resume")


@dataclass(frozen=True)
class StopRestartPlan:
    """Rescale ``operator`` from ``old_assignment`` to ``new_assignment``.

    Invariant: both assignments cover every key group; ``moved`` lists the key groups whose
    owner index changes (all groups are restored, since every task restarts).
    """

    operator: str
    old_parallelism: int
    new_parallelism: int
    old_assignment: tuple[int, ...]
    new_assignment: tuple[int, ...]
    moved: tuple[int, ...]


def plan_stop_restart(
    operator: str, old_parallelism: int, old_assignment: tuple[int, ...] | None,
    new_parallelism: int, num_key_groups: int, assignment: tuple[int, ...] | None = None,
) -> StopRestartPlan:
    """``assignment`` (a rebalance) replaces the uniform one; validated by the caller."""
    old = old_assignment or ()
    if not old:
        new: tuple[int, ...] = ()
    elif assignment is not None:
        new = tuple(assignment)
    else:
        new = uniform_assignment(num_key_groups, new_parallelism)
    moved = tuple(moved_key_groups(old, new)) if old else ()
    return StopRestartPlan(operator, old_parallelism, new_parallelism, tuple(old), new, moved)
