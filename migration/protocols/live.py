"""What every live protocol shares: how a subscale runs on the data plane (``LiveProtocol``),
the plan as a value (``LivePlan``: steps of subscales) and the step scheduler.

A *subscale* moves key groups from one old owner to one new owner (``drrs.Subscale``). The
task-level mechanics are one state machine (``engine.task``, ``drrs.OldOwnerRole`` /
``NewOwnerRole``) switched by the protocol's flags:

=================  =======  =======  =====  ==========  ================================
protocol           trigger  aligned  block  pause new   scheduling
=================  =======  =======  =====  ==========  ================================
drrs               yes      no       no     no          subscales at once, per-task limit
pause-resume       no       yes      yes    yes         one step: every group at once
fluid              no       yes      yes    no          steps of one group, in sequence
batched            no       yes      yes    no          steps of k groups (or a matching)
non-disruptive     no       yes      no     no          steps from the planning strategy
=================  =======  =======  =====  ==========  ================================

*trigger*: predecessors send a priority trigger and the old owner migrates at once,
re-routing later records (DRRS). *aligned*: the old owner ships a group's state only once
every predecessor's confirm barrier is in, so nothing is ever re-routed. *block*: while
aligning, a channel that delivered its barrier is not read. *pause new*: the new owner reads
nothing from a channel after its barrier until the state is in. In every protocol the new
owner sets aside records of a group whose state has not arrived (bounded, per channel).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from migration.protocols.drrs import Subscale, chunk_groups


@dataclass(frozen=True)
class LiveProtocol:
    """A live protocol's data-plane flags and scheduling (see the module table)."""

    name: str
    trigger: bool
    aligned: bool
    block_aligned: bool
    pause_new_owner: bool
    concurrent: bool  # True: subscales scheduled independently; False: steps in sequence

    def __post_init__(self) -> None:
        if self.trigger == self.aligned:
            raise ValueError(f"protocol {self.name}: exactly one of trigger and aligned")
        if self.block_aligned and not self.aligned:
            raise ValueError(f"protocol {self.name}: block_aligned needs aligned")


@dataclass(frozen=True)
class LivePlan:
    """A live rescale as a value: the new assignment and the steps that reach it.

    Invariant: every key group whose owner changes is in exactly one subscale; a subscale's
    groups share one (old owner, new owner) pair. ``reason`` says how the steps were chosen.
    """

    operator: str
    protocol: str
    old_parallelism: int
    new_parallelism: int
    old_assignment: tuple[int, ...]
    new_assignment: tuple[int, ...]
    steps: tuple[tuple[Subscale, ...], ...]
    reason: str = ""

    def __post_init__(self) -> None:
        seen: set[int] = set()
        for sub in self.subscales:
            for kg in sub.key_groups:
                if kg in seen:
                    raise ValueError(f"key group {kg} is in two subscales")
                if self.old_assignment[kg] != sub.old or self.new_assignment[kg] != sub.new:
                    raise ValueError(f"subscale {sub.subscale_id} does not match the assignments")
                seen.add(kg)
        moved = {kg for kg, (a, b) in enumerate(zip(self.old_assignment, self.new_assignment,
                                                      strict=True)) if a != b}
        if seen != moved:
            raise ValueError("the subscales do not cover exactly the moved key groups")

    @property
    def subscales(self) -> tuple[Subscale, ...]:
        return tuple(s for step in self.steps for s in step)

    @property
    def moved(self) -> tuple[int, ...]:
        return tuple(kg for s in self.subscales for kg in s.key_groups)


def split_by_pair(groups: Sequence[int], old: Sequence[int], new: Sequence[int],
                  first_id: int, max_size: int | None = None,
                  sizes: Mapping[int, int] | None = None,
                  max_bytes: int | None = None) -> tuple[Subscale, ...]:
    """One step's groups as subscales by (old owner, new owner) pair, in the order the
    pairs first appear, at most ``max_size`` groups and ``max_bytes`` of state ``sizes``
    each (``chunk_groups``); ids from ``first_id``."""
    pairs: dict[tuple[int, int], list[int]] = {}
    for kg in groups:
        pairs.setdefault((old[kg], new[kg]), []).append(kg)
    subs: list[Subscale] = []
    for (o, n), kgs in pairs.items():
        for chunk in chunk_groups(kgs, max_size, sizes, max_bytes):
            subs.append(Subscale(first_id + len(subs), o, n, chunk))
    return tuple(subs)


def steps_from_chunks(chunks: Sequence[Sequence[int]], old: Sequence[int], new: Sequence[int],
                      first_id: int) -> tuple[tuple[Subscale, ...], ...]:
    steps: list[tuple[Subscale, ...]] = []
    next_id = first_id
    for chunk in chunks:
        step = split_by_pair(chunk, old, new, next_id)
        next_id += len(step)
        steps.append(step)
    return tuple(steps)


class StepScheduler:
    """Steps in sequence: the next step's subscales all start once every subscale of the
    previous one completed. Same interface as ``drrs.SubscaleScheduler``; clearing
    ``pending`` (a superseding request) lets the running step finish and starts no more."""

    def __init__(self, steps: Sequence[Sequence[Subscale]]) -> None:
        self.pending: list[tuple[Subscale, ...]] = [tuple(s) for s in steps if s]
        self.running: dict[int, Subscale] = {}
        self.done: list[int] = []
        self.steps_started = 0

    def next_batch(self) -> list[Subscale]:
        if self.running or not self.pending:
            return []
        step = self.pending.pop(0)
        self.steps_started += 1
        for s in step:
            self.running[s.subscale_id] = s
        return list(step)

    def complete(self, subscale_id: int) -> None:
        self.running.pop(subscale_id)
        self.done.append(subscale_id)

    @property
    def finished(self) -> bool:
        return not self.pending and not self.running
