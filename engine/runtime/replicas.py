"""Replication (Spacker) on the JobMaster's side: which key groups keep a replica where.

Why: a migration to a task that holds a fresh replica of a group ships only the changes
since the replica's version. The JobMaster refreshes replicas in steady state (every
``replication_period_s`` per operator, the busiest ``hot_fraction`` or all groups) and a
rescale's coordinator reads which replicas exist (``held``) and reports which became stale
(``forget``, ``release``).

Guarantees: a replica is listed only once its holder applied it (the owner's shell awaits
the holders' acks); a refresh never runs while the operator rescales (both take the
operator's lock) and gives up after ``rescale_timeout_s`` (a stuck task must not hold the
lock a rescale waits for); a replica of a group that moved, or of a holder that went
away, is forgotten and dropped at its holder (a holder that does not answer within
``control_timeout_s / 2`` is asked again at the next drop).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from engine.errors import RescaleRefused
from engine.wire.messages import DropReplicas, GroupStatsRequest, RefreshReplicas
from migration.planning import profiles_from_metrics
from migration.replication import choose_replicated_groups, place_replicas

if TYPE_CHECKING:
    from engine.runtime.job_master import JobMaster

POLICIES = ("none", "hot", "all")


class ReplicaKeeper:
    """Replication policies and the replicas that exist, for one job."""

    def __init__(self, master: JobMaster) -> None:
        self.master = master
        cfg = master.config
        # vertex -> (policy, period s, hot fraction)
        self.policies: dict[str, tuple[str, float, float]] = {
            v.name: (cfg.replication, cfg.replication_period_s, cfg.replication_hot_fraction)
            for v in master.plan.vertices if v.keyed and cfg.replication != "none"}
        self.held: dict[str, dict[int, tuple[str, int]]] = {}  # vertex -> kg -> (holder, version)
        self._to_drop: dict[str, set[int]] = {}  # holder -> key groups

    def of(self, vertex: str) -> dict[int, tuple[str, int]]:
        """A copy of ``vertex``'s replicas: key group -> (holder, version)."""
        return dict(self.held.get(vertex, {}))

    async def set_policy(self, operator: str, policy: str, period_s: float | None,
                         hot_fraction: float | None) -> None:
        m = self.master
        vertex = m.dep.plan.vertex_of(operator)
        if vertex.name != operator or not vertex.keyed:
            raise RescaleRefused(f"operator {operator!r} is not a keyed operator with its own "
                                 "tasks; only those hold key groups to replicate")
        if policy not in POLICIES:
            raise RescaleRefused(f"replication policy {policy!r}: use 'none', 'hot' or 'all'")
        cfg = m.config
        period = cfg.replication_period_s if period_s is None else period_s
        frac = cfg.replication_hot_fraction if hot_fraction is None else hot_fraction
        if period <= 0 or not 0 < frac <= 1:
            raise RescaleRefused("replication period must be > 0 and hot fraction in (0, 1]")
        if policy == "none":
            self.policies.pop(operator, None)
            self.forget(operator, tuple(self.held.get(operator, {})))
            await self.drop_forgotten()
        else:
            self.policies[operator] = (policy, period, frac)

    def enable(self, vertex: str, policy: str, hot_fraction: float) -> None:
        if vertex not in self.policies:
            self.policies[vertex] = (policy, self.master.config.replication_period_s,
                                     hot_fraction)

    async def loop(self) -> None:
        """Refresh each operator's replicas every period, skipping operators that rescale."""
        m = self.master
        last: dict[str, float] = {}
        while m.state.active:
            await asyncio.sleep(0.25)
            now = m.clock.monotonic()
            for vertex, (_, period, _) in list(self.policies.items()):
                lock = m.vertex_lock(vertex)
                if now - last.get(vertex, -1e18) < period or lock.locked() or m.finished:
                    continue
                last[vertex] = now
                try:
                    async with lock:
                        await self.refresh(vertex)
                except Exception:  # noqa: BLE001 - a task may be going away; next period
                    if not m.state.active:
                        return

    async def refresh(self, vertex: str) -> None:
        """One round: choose the groups, place their holders, refresh each replica from its
        owner (a delta when the holder is current)."""
        m = self.master
        if vertex not in self.policies or m.state != "running":
            return
        policy, _, frac = self.policies[vertex]
        names = list(m.dep.tasks[vertex])
        assignment = m.dep.assignments[vertex]
        limit = m.deadlines.rescale_s
        replies = await asyncio.wait_for(
            asyncio.gather(*(m.call(t, GroupStatsRequest()) for t in names)), limit)
        loads = {kg: (records / r.seconds if r.seconds > 0 else 0.0)
                 for r in replies for kg, records, _ in r.groups}
        sizes = {kg: size for r in replies for kg, _, size in r.groups}
        profiles = profiles_from_metrics(loads, sizes)
        groups = choose_replicated_groups(policy, {kg: p.load for kg, p in profiles.items()},
                                          frac, len(assignment))
        holders = place_replicas(assignment, groups, len(names))
        held = self.held.setdefault(vertex, {})
        moved_away = [kg for kg, (h, _) in held.items()
                      if kg not in holders or names[holders[kg]] != h]
        self.forget(vertex, tuple(moved_away))
        await self.drop_forgotten()
        targets: dict[str, list[tuple[int, str, int]]] = {}
        for kg, h in holders.items():
            version = held[kg][1] if kg in held else -1
            targets.setdefault(names[assignment[kg]], []).append((kg, names[h], version))
        owners = list(targets)
        replies = await asyncio.wait_for(asyncio.gather(*(
            m.call(o, RefreshReplicas(tuple(targets[o])), [t[1] for t in targets[o]])
            for o in owners)), limit)
        c = m.collector
        for o, r in zip(owners, replies, strict=True):
            holder_of = {kg: h for kg, h, _ in targets[o]}
            for kg, version in r.versions:
                held[kg] = (holder_of[kg], version)
            for kg in r.dropped:
                held.pop(kg, None)
            c.replication_bytes[vertex] = c.replication_bytes.get(vertex, 0) + r.bytes
            c.replication_cpu_s[vertex] = c.replication_cpu_s.get(vertex, 0.0) + r.cpu_s
        c.replicas[vertex] = len(held)

    def forget(self, vertex: str, key_groups: Sequence[int], keep_at: str | None = None) -> None:
        """The replicas of these groups are out of date (the group moved, or its holder
        changed): forget them, and drop them at their holders (except ``keep_at``, the new
        owner, which consumed its replica when the state arrived)."""
        held = self.held.get(vertex, {})
        for kg in key_groups:
            entry = held.pop(kg, None)
            if entry is not None and entry[0] != keep_at:
                self._to_drop.setdefault(entry[0], set()).add(kg)
        if vertex in self.master.collector.replicas:
            self.master.collector.replicas[vertex] = len(held)

    async def drop_forgotten(self) -> None:
        """Drop the forgotten replicas at their holders; one that does not answer in time
        keeps its list for the next drop (a stale replica is never read: it is forgotten)."""
        m = self.master
        drops, self._to_drop = self._to_drop, {}
        holders = [h for h in drops if h in m.handles]
        results = await asyncio.gather(*(
            asyncio.wait_for(m.call(h, DropReplicas(tuple(sorted(drops[h])))),
                             m.deadlines.task_poll_s) for h in holders), return_exceptions=True)
        for h, r in zip(holders, results, strict=True):
            if isinstance(r, BaseException):
                self._to_drop.setdefault(h, set()).update(drops[h])

    async def release(self, vertex: str, gone: Sequence[str] = (), clear: bool = False) -> None:
        """After a rescale: drop what was forgotten; forget replicas held by ``gone`` tasks
        (or all of ``vertex``'s with ``clear``)."""
        if clear:
            self.held.pop(vertex, None)
        await self.drop_forgotten()
        held = self.held.get(vertex, {})
        for kg in [kg for kg, (h, _) in held.items() if h in set(gone)]:
            del held[kg]

    def reset(self) -> None:
        """Every task was replaced (a restart, a stop-restart): no replica exists any more
        (the policies stay: the next period refreshes from the new owners)."""
        self.held.clear()
        self._to_drop.clear()
        for vertex in self.master.collector.replicas:
            self.master.collector.replicas[vertex] = 0

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"ReplicaKeeper({sorted(self.policies)})"


__all__: list[Any] = ["ReplicaKeeper"]
