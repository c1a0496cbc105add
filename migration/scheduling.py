"""Which subscales of a plan run when: the coordinator's schedulers (pure).

``SubscaleScheduler`` runs a concurrent plan's subscales (drrs) at once within per-task and
per-operator limits (or, for the ablation, without them, and never in a cycle);
``StepScheduler`` runs a plan's steps one after another. Both take
starts and completions from the caller, hold no clock and do no I/O; ``cancel_pending``
stops further starts (a superseding request, or the input ended) and lets running ones end.
"""

from __future__ import annotations

from collections.abc import Sequence

from migration.plan import MigrationPlan, Subscale


class SubscaleScheduler:
    """Which subscales to start next: no task in more than ``max_per_task`` running
    subscales and, with ``max_running``, no more than that many in all; no task made to
    hold more key groups than the larger of what it held at the start and what it will
    hold at the end (counting groups on their way to it), unless nothing runs and nothing
    else can start (a swap of groups between two full tasks); among the startable ones,
    prefer the destination holding the fewest groups (so new tasks start working early),
    then the lowest id. Pure: the caller reports starts and completions.

    The bound matters when ranges shift (uniform 8 -> 12 moves groups between old tasks
    too): a task that received its new groups before giving away its old ones would serve
    the load of both for a while.

    ``bounded`` False drops that bound (drrs without subscale division: everything at once).
    ``acyclic``: never run subscales whose (old, new) pairs form a directed cycle (drrs
    without decoupled barriers or record scheduling, where a task's channel may wait on a
    migration to it while its own outgoing migration waits on that channel: subscales in
    a cycle could wait on each other for ever)."""

    def __init__(self, plan: MigrationPlan, owned: dict[int, int], max_per_task: int = 2,
                 max_running: int | None = None, *, acyclic: bool = False,
                 bounded: bool = True) -> None:
        """``plan``'s subscales in priority order; ``owned``: task index -> groups held."""
        if max_per_task < 1:
            raise ValueError("max_per_task must be >= 1")
        if max_running is not None and max_running < 1:
            raise ValueError("max_running must be >= 1 or None")
        self.max_running = max_running
        self.pending = list(plan.subscales)
        self._rank = {s.subscale_id: i for i, s in enumerate(self.pending)}
        self.running: dict[int, Subscale] = {}
        self.done: list[int] = []
        self.owned = dict(owned)  # task index -> key groups it holds now
        self.max_per_task = max_per_task
        self.acyclic = acyclic
        self.bounded = bounded
        final = dict(owned)
        for sub in self.pending:
            final[sub.old] = final.get(sub.old, 0) - len(sub.key_groups)
            final[sub.new] = final.get(sub.new, 0) + len(sub.key_groups)
        self.bound = {t: max(owned.get(t, 0), final.get(t, 0)) for t in set(owned) | set(final)}

    def _closes_cycle(self, sub: Subscale) -> bool:
        """Whether running ``sub`` beside the running subscales makes a directed cycle of
        (old, new) pairs: ``sub.old`` is reachable from ``sub.new``."""
        edges: dict[int, set[int]] = {}
        for s in self.running.values():
            edges.setdefault(s.old, set()).add(s.new)
        seen, todo = set(), [sub.new]
        while todo:
            t = todo.pop()
            if t == sub.old:
                return True
            if t not in seen:
                seen.add(t)
                todo.extend(edges.get(t, ()))
        return False

    def _load(self, task: int) -> int:
        return sum(1 for s in self.running.values() if task in (s.old, s.new))

    def _arriving(self, task: int) -> int:
        return sum(len(s.key_groups) for s in self.running.values() if s.new == task)

    def next_batch(self) -> list[Subscale]:
        """Subscales to start now (possibly none); marks them running."""
        started: list[Subscale] = []
        while self.max_running is None or len(self.running) < self.max_running:
            ok = [s for s in self.pending
                  if self._load(s.old) < self.max_per_task and self._load(s.new) < self.max_per_task]
            if self.acyclic:
                ok = [s for s in ok if not self._closes_cycle(s)]
            fits = [s for s in ok if self.owned.get(s.new, 0) + self._arriving(s.new)
                    + len(s.key_groups) <= self.bound.get(s.new, 0)]
            if (fits or self.running) and self.bounded:
                ok = fits
            if not ok:
                return started
            best = min(ok, key=lambda s: (self.owned.get(s.new, 0), self._rank[s.subscale_id]))
            self.pending.remove(best)
            self.running[best.subscale_id] = best
            started.append(best)
        return started

    def complete(self, subscale_id: int) -> None:
        s = self.running.pop(subscale_id)
        self.done.append(subscale_id)
        self.owned[s.old] = self.owned.get(s.old, 0) - len(s.key_groups)
        self.owned[s.new] = self.owned.get(s.new, 0) + len(s.key_groups)

    def cancel_pending(self) -> int:
        """Start nothing more (a superseding request, or the input ended); the running
        subscales finish. Returns how many were cancelled."""
        n = len(self.pending)
        self.pending.clear()
        return n

    @property
    def finished(self) -> bool:
        return not self.pending and not self.running


class StepScheduler:
    """Steps in sequence: the next step's subscales all start once every subscale of the
    previous one completed. Same interface as ``SubscaleScheduler``."""

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

    def cancel_pending(self) -> int:
        n = sum(len(s) for s in self.pending)
        self.pending.clear()
        return n

    @property
    def finished(self) -> bool:
        return not self.pending and not self.running
