"""Replicas of key groups (Spacker's replication knob), the pure mechanics.

During normal processing the owner of a replicated key group sends its holder a full
snapshot once, then per checkpoint or period a delta (``refresh_replica``); the holder keeps
a full snapshot per group (``ReplicaStore``). When a group migrates to the task holding its
replica, the owner sends only what changed since the replica's version
(``migration_payload``), or the full group when the replica is not at exactly the owner's
last replicated version. A stale replica is never used without the matching delta.

Versions: the owner's ``KeyedStateBackend.version(kg)``; a delta carries its base version
(the version it applies to) and a refresh produces base + 1. No Ray here.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from engine.errors import ConfigError, StaleReplicaError
from engine.state.keyed import KeyedStateBackend, apply_delta, delta_base_version

POLICIES = ("none", "hot", "all")
PayloadKind = Literal["delta", "full"]


# ---------------------------------------------------------------- which groups, where


def choose_replicated_groups(
    policy: str, loads: Mapping[int, float], hot_fraction: float, num_key_groups: int
) -> tuple[int, ...]:
    """Key groups to replicate, ascending.

    ``"none"``: none; ``"all"``: every group; ``"hot"``: the ``ceil(hot_fraction * n)``
    groups with the highest load (records/s; missing groups count 0; ties by lower id).
    """
    if policy == "none":
        return ()
    if policy == "all":
        return tuple(range(num_key_groups))
    if policy == "hot":
        if not 0.0 <= hot_fraction <= 1.0:
            raise ConfigError(f"replication_hot_fraction must be in [0, 1], got {hot_fraction}")
        count = min(num_key_groups, math.ceil(hot_fraction * num_key_groups))
        ranked = sorted(range(num_key_groups), key=lambda kg: (-loads.get(kg, 0.0), kg))
        return tuple(sorted(ranked[:count]))
    raise ConfigError(f"unknown replication policy {policy!r}; use one of {POLICIES}")


def place_replicas(
    assignment: Sequence[int], groups: Iterable[int], parallelism: int
) -> dict[int, int]:
    """A holder task for each group in ``groups``: never its owner (``assignment[kg]``),
    replica counts per task as even as the owners allow (max - min <= 1 whenever some
    placement achieves it). Deterministic. Empty when ``parallelism < 2`` (no other task).
    """
    chosen = sorted(set(groups))
    if parallelism < 2 or not chosen:
        return {}
    for kg in chosen:
        if not 0 <= kg < len(assignment):
            raise ValueError(f"key group {kg} has no owner in the assignment")
        if not 0 <= assignment[kg] < parallelism:
            raise ValueError(
                f"key group {kg} is owned by task {assignment[kg]}, outside 0..{parallelism - 1}"
            )
    count = [0] * parallelism
    holder: dict[int, int] = {}
    # greedy: the least loaded other task, ties to the next task after the owner
    for kg in chosen:
        owner = assignment[kg]
        *_, best = min(
            (count[t], (t - owner) % parallelism, t) for t in range(parallelism) if t != owner
        )
        holder[kg] = best
        count[best] += 1
    _balance(holder, assignment, count, parallelism)
    return holder


def _balance(
    holder: dict[int, int], assignment: Sequence[int], count: list[int], parallelism: int
) -> None:
    """Move replicas along augmenting paths from a fullest to an emptiest task until the
    counts differ by at most one or no path exists (then the counts are as even as the
    owners allow)."""
    while True:
        hi, lo = max(count), min(count)
        if hi - lo <= 1:
            return
        on: list[list[int]] = [[] for _ in range(parallelism)]
        for kg in sorted(holder):
            on[holder[kg]].append(kg)
        sources = [t for t in range(parallelism) if count[t] == hi]
        targets = {t for t in range(parallelism) if count[t] <= hi - 2}
        # BFS over tasks: x -> y when some replica on x may move to y (owner != y)
        prev: dict[int, tuple[int, int]] = {}
        seen = set(sources)
        queue = deque(sources)
        end = None
        while queue and end is None:
            x = queue.popleft()
            for y in range(parallelism):
                if y in seen:
                    continue
                movable = next((g for g in on[x] if assignment[g] != y), None)
                if movable is None:
                    continue
                prev[y] = (x, movable)
                seen.add(y)
                if y in targets:
                    end = y
                    break
                queue.append(y)
        if end is None:
            return
        y = end
        count[y] += 1
        while y in prev:
            x, kg = prev[y]
            holder[kg] = y
            y = x
        count[y] -= 1


# ---------------------------------------------------------------- owner side


class Refresh(NamedTuple):
    """One refresh from owner to holder: the group's ``version`` after it, and either the
    full snapshot or a delta from ``version - 1``."""

    key_group: int
    version: int
    data: bytes
    is_delta: bool


@dataclass
class ReplicationStats:
    """Steady-state cost of keeping replicas (owner side)."""

    bytes_copied: int = 0
    refreshes: int = 0
    full_refreshes: int = 0
    encode_cpu_s: float = 0.0

    def record(self, nbytes: int, seconds: float, full: bool) -> None:
        self.bytes_copied += nbytes
        self.refreshes += 1
        self.full_refreshes += int(full)
        self.encode_cpu_s += seconds


def refresh_replica(
    backend: KeyedStateBackend,
    key_group: int,
    clock: Callable[[], float],
    stats: ReplicationStats | None = None,
    full: bool = False,
) -> Refresh:
    """Encode the next refresh of ``key_group`` for its holder and mark it replicated.

    The first refresh of an untracked group starts tracking and is full; later ones are
    deltas unless ``full`` (e.g. after the holder refused a delta or lost its replica).
    ``clock`` (e.g. ``time.thread_time``) times the encoding into ``stats``."""
    t0 = clock()
    if not backend.is_tracked(key_group):
        backend.track_changes(key_group)
        full = True
    data = backend.snapshot(key_group) if full else backend.snapshot_delta(key_group)
    version = backend.mark_replicated(key_group)
    if stats is not None:
        stats.record(len(data), clock() - t0, full)
    return Refresh(key_group, version, data, not full)


def migration_payload(
    owner_backend: KeyedStateBackend, key_group: int, replica_version: int | None
) -> tuple[PayloadKind, bytes]:
    """What the owner ships when ``key_group`` migrates to a task holding its replica at
    ``replica_version`` (None: no replica there).

    ``("delta", bytes)`` only when the group is tracked and the replica is at exactly the
    owner's last replicated version: applied to it, the delta gives the group as it is now.
    Otherwise ``("full", snapshot)``: a stale (or unknown) replica is never used.
    """
    if (
        replica_version is not None
        and owner_backend.is_tracked(key_group)
        and replica_version == owner_backend.version(key_group)
    ):
        return "delta", owner_backend.snapshot_delta(key_group)
    return "full", owner_backend.snapshot(key_group)


# ---------------------------------------------------------------- holder side


class ReplicaStore:
    """The replicas one holder task keeps: ``kg -> (version, full snapshot, taken_at)``."""

    def __init__(self) -> None:
        self._held: dict[int, tuple[int, bytes, float]] = {}

    def update(
        self, key_group: int, version: int, data: bytes, is_delta: bool, now: float
    ) -> None:
        """Store a refresh: a full snapshot replaces what is held; a delta applies only to
        the replica at its base version (else ``StaleReplicaError``; ask for a full one)."""
        if not is_delta:
            self._held[key_group] = (version, data, now)
            return
        base = delta_base_version(data)
        held = self._held.get(key_group)
        if held is None or held[0] != base:
            have = "no replica" if held is None else f"version {held[0]}"
            raise StaleReplicaError(
                f"delta for key group {key_group} applies to version {base}, but this holder "
                f"has {have}; the owner must send a full snapshot"
            )
        if version <= base:
            raise StaleReplicaError(
                f"delta for key group {key_group} from version {base} claims version {version}"
            )
        self._held[key_group] = (version, apply_delta(held[1], data), now)

    def version(self, key_group: int) -> int | None:
        held = self._held.get(key_group)
        return None if held is None else held[0]

    def versions(self) -> dict[int, int]:
        """Held groups and their versions (what the migration planner asks about)."""
        return {kg: v for kg, (v, _, _) in self._held.items()}

    def fresh(self, key_group: int, version: int, now: float, max_age_s: float) -> bool:
        """Held at exactly ``version`` and refreshed at most ``max_age_s`` ago."""
        held = self._held.get(key_group)
        return held is not None and held[0] == version and now - held[2] <= max_age_s

    def take(self, key_group: int) -> bytes:
        """Remove the replica and return its snapshot bytes (the holder reloads it)."""
        try:
            return self._held.pop(key_group)[1]
        except KeyError:
            raise KeyError(f"no replica of key group {key_group} held here") from None

    def reload(self, key_group: int, kind: PayloadKind, payload: bytes) -> bytes:
        """Destination of a migration: the group's full snapshot from a
        ``migration_payload``; the replica is consumed (a delta must match its version,
        else ``StaleReplicaError``)."""
        if kind == "full":
            self.drop(key_group)
            return payload
        if kind != "delta":
            raise ValueError(f"unknown payload kind {kind!r}")
        base = delta_base_version(payload)
        held = self._held.get(key_group)
        if held is None or held[0] != base:
            have = "no replica" if held is None else f"version {held[0]}"
            raise StaleReplicaError(
                f"migration delta for key group {key_group} applies to version {base}, but "
                f"this holder has {have}"
            )
        return apply_delta(self.take(key_group), payload)

    def drop(self, key_group: int) -> None:
        self._held.pop(key_group, None)

    def bytes_held(self) -> int:
        return sum(len(data) for _, data, _ in self._held.values())

    def __len__(self) -> int:
        return len(self._held)
