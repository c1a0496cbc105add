"""DRRS: fine-grained live rescaling with decoupled trigger/confirm barriers (pure parts).

For one *subscale* S (key groups K moving from old owner s to new owner d):

1. Every predecessor u switches its routing for K to d, moves its unsent records of K to its
   buffer for d, puts ``ConfirmBarrier(S, c_ud)`` on its data channel to s (``c_ud`` is u's
   channel to d), and sends ``TriggerBarrier(S)`` to s on the priority path.
2. s, on the first trigger (or confirm) of S, tells d (``SubscaleTriggered``) and sends it
   the group with the smallest state at once; d pulls the rest of K one at a time
   (``PullState``), those its waiting records need first; per sent group s snapshots,
   removes, marks it *migrated out* and sends ``MigrateState`` (priority path). Records
   of migrated-out groups that s still finds in its input are re-routed to d, in order,
   on the re-route channel s→d; each confirm barrier s meets is forwarded on the same
   path after them. A group not pulled yet is still s's: s processes its records.
3. d installs arriving state. For a group g of S: re-routed records are processable once g's
   state is in; records straight from u once, in addition, u's confirm came back through s.
   Records that cannot be processed yet are set aside per (channel, key group), up to a
   task-wide cap; a channel whose next record cannot be set aside, or whose next element is
   an event while it has records set aside, waits. g is *active* once its state is in and
   every predecessor's confirm has arrived.

This module holds the bookkeeping of both roles (``OldOwnerRole``, ``NewOwnerRole``) and the
planning of subscales (``plan_subscales``, ``SubscaleScheduler``) as plain classes; the task
core (``engine.task``) drives them and the JobMaster executes the plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.keygroups import moved_key_groups

REROUTE_PORT = -1  # the input port of re-route channels at a new owner


# ---------------------------------------------------------------------- planning


@dataclass(frozen=True)
class Subscale:
    """Key groups ``key_groups`` move from task index ``old`` to task index ``new``."""

    subscale_id: int
    old: int
    new: int
    key_groups: tuple[int, ...]


@dataclass(frozen=True)
class DrrsPlan:
    """A rescale as a value: the new assignment and the subscales that reach it.

    Invariant: every key group whose owner changes is in exactly one subscale.
    """

    operator: str
    old_parallelism: int
    new_parallelism: int
    old_assignment: tuple[int, ...]
    new_assignment: tuple[int, ...]
    subscales: tuple[Subscale, ...]

    @property
    def moved(self) -> tuple[int, ...]:
        return tuple(kg for s in self.subscales for kg in s.key_groups)


def chunk_groups(key_groups: Sequence[int], max_groups: int | None = None,
                 sizes: Mapping[int, int] | None = None,
                 max_bytes: int | None = None) -> list[tuple[int, ...]]:
    """Consecutive chunks of ``key_groups`` in their order: a chunk closes at ``max_groups``
    groups, or before a group that would take its ``sizes`` total past ``max_bytes`` (a
    group larger than that travels alone). Unknown sizes count as 0."""
    chunks: list[tuple[int, ...]] = []
    cur: list[int] = []
    total = 0
    for kg in key_groups:
        size = (sizes or {}).get(kg, 0)
        full = (max_groups is not None and len(cur) >= max_groups) or (
            max_bytes is not None and cur and total + size > max_bytes)
        if full:
            chunks.append(tuple(cur))
            cur, total = [], 0
        cur.append(kg)
        total += size
    if cur:
        chunks.append(tuple(cur))
    return chunks


def plan_subscales(
    operator: str, old_assignment: Sequence[int], new_assignment: Sequence[int],
    old_parallelism: int, new_parallelism: int, subscale_size: int = 4, first_id: int = 0,
    sizes: Mapping[int, int] | None = None, subscale_bytes: int | None = None,
) -> DrrsPlan:
    """Group the moving key groups by (old owner, new owner) into subscales of at most
    ``subscale_size`` groups and, given the groups' state ``sizes``, at most
    ``subscale_bytes`` bytes (a larger group travels alone). DRRS groups by pair; small
    subscales let new tasks start early, and a byte budget bounds how long the records of
    a subscale's last group wait at the new owner (its groups are sent one at a time)."""
    if subscale_size < 1:
        raise ValueError("subscale_size must be >= 1")
    if subscale_bytes is not None and subscale_bytes < 1:
        raise ValueError("subscale_bytes must be >= 1 or None")
    pairs: dict[tuple[int, int], list[int]] = {}
    for kg in moved_key_groups(old_assignment, new_assignment):
        pairs.setdefault((old_assignment[kg], new_assignment[kg]), []).append(kg)
    subs: list[Subscale] = []
    for (o, n), kgs in sorted(pairs.items()):
        for chunk in chunk_groups(kgs, subscale_size, sizes, subscale_bytes):
            subs.append(Subscale(first_id + len(subs), o, n, chunk))
    return DrrsPlan(operator, old_parallelism, new_parallelism, tuple(old_assignment),
                    tuple(new_assignment), tuple(subs))


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
    the load of both for a while."""

    def __init__(self, plan: Any, owned: dict[int, int], max_per_task: int = 2,
                 max_running: int | None = None) -> None:
        """``plan``: anything with ``subscales`` (a ``DrrsPlan`` or a ``LivePlan``), in
        priority order."""
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
        final = dict(owned)
        for sub in self.pending:
            final[sub.old] = final.get(sub.old, 0) - len(sub.key_groups)
            final[sub.new] = final.get(sub.new, 0) + len(sub.key_groups)
        self.bound = {t: max(owned.get(t, 0), final.get(t, 0)) for t in set(owned) | set(final)}

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
            fits = [s for s in ok if self.owned.get(s.new, 0) + self._arriving(s.new)
                    + len(s.key_groups) <= self.bound.get(s.new, 0)]
            if fits or self.running:
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

    @property
    def finished(self) -> bool:
        return not self.pending and not self.running


# ---------------------------------------------------------------------- old owner


@dataclass
class _Outgoing:
    subscale_id: int
    key_groups: tuple[int, ...]
    new_owner: str
    reroute_channel: int
    predecessors: int  # how many confirms to expect
    aligned: bool = False  # ship once every confirm is in (no re-routing)
    block: bool = False  # and do not read a channel after its confirm until then
    confirms: set[int] = field(default_factory=set)
    migrated: bool = False  # triggered (drrs): its groups may be pulled
    pulled: set[int] = field(default_factory=set)
    rerouted: int = 0


class OldOwnerRole:
    """The old owner's side of every subscale it gives groups away in.

    ``migrated_out[kg]`` is the re-route channel of a group whose state has left; records of
    it found in the input go there.
    """

    def __init__(self) -> None:
        self.subscales: dict[int, _Outgoing] = {}
        self.migrated_out: dict[int, int] = {}
        self.finished: set[int] = set()

    def expect(self, subscale_id: int, key_groups: tuple[int, ...], new_owner: str,
               reroute_channel: int, predecessors: int, aligned: bool = False,
               block: bool = False) -> None:
        if subscale_id not in self.subscales:
            self.subscales[subscale_id] = _Outgoing(
                subscale_id, tuple(key_groups), new_owner, reroute_channel, predecessors,
                aligned, block)

    def should_migrate(self, subscale_id: int) -> bool:
        """True exactly once per subscale: on its first trigger or confirm barrier. A trigger
        that arrives after the subscale finished (its confirms came first) is ignored."""
        if subscale_id in self.finished:
            return False
        out = self.subscales.get(subscale_id)
        if out is None:
            raise KeyError(f"barrier of unknown subscale {subscale_id}")
        if out.migrated:
            return False
        out.migrated = True
        return True

    def mark_migrated(self, subscale_id: int, key_group: int) -> None:
        self.migrated_out[key_group] = self.subscales[subscale_id].reroute_channel

    def on_confirm(self, subscale_id: int, direct_channel: int) -> bool:
        """Record a predecessor's confirm; True when it was the last one of the subscale."""
        out = self.subscales[subscale_id]
        out.confirms.add(direct_channel)
        return len(out.confirms) >= out.predecessors

    def first_push(self, subscale_id: int, sizes: dict[int, int]) -> int:
        """The group to send unasked on the trigger: the smallest state, then the subscale's
        order (the new owner's own order when no records wait yet)."""
        kgs = self.subscales[subscale_id].key_groups
        return min(kgs, key=lambda kg: (sizes.get(kg, 0), kgs.index(kg)))

    def can_pull(self, subscale_id: int, key_group: int) -> bool:
        out = self.subscales.get(subscale_id)
        return (out is not None and out.migrated and key_group in out.key_groups
                and key_group not in out.pulled)

    def done(self, subscale_id: int) -> bool:
        """Every confirm in and (drrs) every group pulled."""
        out = self.subscales[subscale_id]
        return (len(out.confirms) >= out.predecessors
                and (out.aligned or len(out.pulled) == len(out.key_groups)))

    def finish(self, subscale_id: int) -> _Outgoing:
        out = self.subscales.pop(subscale_id)
        self.finished.add(subscale_id)
        for kg in out.key_groups:
            self.migrated_out.pop(kg, None)
        return out

    @property
    def active(self) -> bool:
        return bool(self.subscales)


# ---------------------------------------------------------------------- new owner


@dataclass
class _Incoming:
    subscale_id: int
    key_groups: tuple[int, ...]
    direct_channels: frozenset[int]
    reroute_channel: int
    confirm_needed: bool = True
    old_owner: str = ""
    confirms: set[int] = field(default_factory=set)
    state_in: set[int] = field(default_factory=set)
    sizes: dict[int, int] = field(default_factory=dict)
    requested: set[int] | None = None  # None until the old owner was triggered
    bytes_in: int = 0


class NewOwnerRole:
    """The new owner's side: which incoming groups may be processed from which channel, and
    the set-aside buffers of records that may not yet.

    A record of incoming group g arriving on channel c is *ready* when g's state is in and,
    unless c is g's re-route channel, c's predecessor confirmed (its confirm came back
    through the old owner).
    """

    def __init__(self, cap: int = 200) -> None:
        if cap < 1:
            raise ValueError("the set-aside cap must be >= 1 record")
        self.cap = cap
        self.subscales: dict[int, _Incoming] = {}
        self.group_subscale: dict[int, int] = {}
        self.group_watermark: dict[int, int] = {}
        self.aside: dict[tuple[int, int], list[tuple[Any, int, Any, int]]] = {}
        self.aside_count = 0

    def expect(self, subscale_id: int, key_groups: tuple[int, ...],
               direct_channels: tuple[int, ...], reroute_channel: int,
               confirm_needed: bool = True, old_owner: str = "") -> None:
        if subscale_id in self.subscales:
            return
        self.subscales[subscale_id] = _Incoming(
            subscale_id, tuple(key_groups), frozenset(direct_channels), reroute_channel,
            confirm_needed, old_owner)
        for kg in key_groups:
            self.group_subscale[kg] = subscale_id

    def on_triggered(self, subscale_id: int, sizes: dict[int, int], pushed: int = -1) -> None:
        """The old owner was triggered; ``pushed``: a group it sends unasked (counts as
        pulled, so the next pull waits for it)."""
        inc = self.subscales[subscale_id]
        if inc.requested is None:
            inc.requested = {pushed} if pushed in inc.key_groups else set()
            inc.sizes = dict(sizes)

    def next_pull(self, subscale_id: int) -> int | None:
        """The group to pull next, or None (not triggered yet, one pull still on its way,
        or all pulled): the one with the most records set aside, then the smallest state,
        then the subscale's order. One pull at a time, so the order can follow the records
        as they arrive."""
        inc = self.subscales.get(subscale_id)
        if inc is None or inc.requested is None or len(inc.requested) > len(inc.state_in):
            return None
        left = [kg for kg in inc.key_groups if kg not in inc.requested]
        if not left:
            return None
        waiting = {kg: 0 for kg in left}
        for (_, kg), recs in self.aside.items():
            if kg in waiting:
                waiting[kg] += len(recs)
        best = min(left, key=lambda kg: (-waiting[kg], inc.sizes.get(kg, 0),
                                         inc.key_groups.index(kg)))
        inc.requested.add(best)
        return best

    def incoming(self, key_group: int) -> bool:
        return key_group in self.group_subscale

    def ready(self, channel: int, key_group: int) -> bool:
        sid = self.group_subscale.get(key_group)
        if sid is None:
            return True
        inc = self.subscales[sid]
        if key_group not in inc.state_in:
            return False
        return (not inc.confirm_needed or channel == inc.reroute_channel
                or channel in inc.confirms)

    def on_state(self, subscale_id: int, key_group: int, size: int, watermark: int) -> None:
        inc = self.subscales[subscale_id]
        inc.state_in.add(key_group)
        inc.bytes_in += size
        self.group_watermark[key_group] = watermark

    def on_confirm(self, subscale_id: int, direct_channel: int) -> None:
        self.subscales[subscale_id].confirms.add(direct_channel)

    def activatable(self, subscale_id: int) -> list[int]:
        """Groups of the subscale that are now active (state in, every confirm arrived)."""
        inc = self.subscales[subscale_id]
        if inc.confirm_needed and not inc.direct_channels <= inc.confirms:
            return []
        return [kg for kg in inc.key_groups
                if kg in inc.state_in and self.group_subscale.get(kg) == subscale_id]

    def activate(self, key_group: int) -> None:
        self.group_subscale.pop(key_group, None)
        self.group_watermark.pop(key_group, None)

    def subscale_done(self, subscale_id: int) -> bool:
        inc = self.subscales[subscale_id]
        return all(kg not in self.group_subscale for kg in inc.key_groups)

    def finish(self, subscale_id: int) -> _Incoming:
        return self.subscales.pop(subscale_id)

    # -- set-aside buffers
    def can_set_aside(self) -> bool:
        return self.aside_count < self.cap

    def set_aside(self, channel: int, key_group: int, value: Any, timestamp: int, key: Any,
                  port: int = 0) -> None:
        self.aside.setdefault((channel, key_group), []).append((value, timestamp, key, port))
        self.aside_count += 1

    def has_aside(self, channel: int) -> bool:
        return any(c == channel for c, _ in self.aside)

    def has_aside_for(self, channel: int, key_group: int) -> bool:
        return (channel, key_group) in self.aside

    def releasable(self) -> list[tuple[int, int]]:
        """Set-aside units whose records are ready now."""
        return [(c, kg) for (c, kg) in self.aside if self.ready(c, kg)]

    def release(self, channel: int, key_group: int) -> list[tuple[Any, int, Any, int]]:
        records = self.aside.pop((channel, key_group), [])
        self.aside_count -= len(records)
        return records

    @property
    def active(self) -> bool:
        return bool(self.subscales)
