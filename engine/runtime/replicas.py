"""Replication (Spacker) on the JobMaster's side: which key groups keep a replica where.

Why: a migration to a task that holds a fresh replica of a group ships only the changes
since the replica's version. The JobMaster refreshes replicas in steady state (every
``replication_period_s`` per operator, the busiest ``hot_fraction`` or all groups) and a
rescale's coordinator reads which replicas exist (``held``) and reports which became stale
(``forget``, ``release``).

The round's steps are ``engine.control.steps.ReplicaRefreshSteps`` (sans-IO); this module
executes them on the task actors.

Guarantees: a replica is listed only once its holder applied it (the owner's shell awaits
the holders' acks); a refresh never runs while the operator rescales or changes its logic
(the job's arbiter, ``engine.control.arbiter``, grants the operator to one of them; a
refresh never waits for it: the next period tries again) and gives up after ``rescale_timeout_s`` (a stuck task must not hold the
lock a rescale waits for); a replica of a group that moved, or of a holder that went
away, is forgotten and dropped at its holder (a holder that does not answer within
``control_timeout_s / 2`` is asked again at the next drop).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import Any

from engine.control.arbiter import Action, ActionKind, Verdict
from engine.control.steps import ForgetReplicas, ReplicaRefreshOutcome, ReplicaRefreshSteps
from engine.errors import RescaleRefused
from engine.names import JobState
from engine.runtime.arbitration import Arbitration
from engine.runtime.ports import JobPort
from engine.wire.messages import DropReplicas
from migration.coordinator import ReleaseReplicas, SendControl

POLICIES = ("none", "hot", "all")


class ReplicaKeeper:
    """Replication policies and the replicas that exist, for one job."""

    def __init__(self, port: JobPort, arbitration: Arbitration) -> None:
        self.port = port
        self.arbitration = arbitration
        cfg = port.config
        # vertex -> (policy, period s, hot fraction)
        self.policies: dict[str, tuple[str, float, float]] = {
            v.name: (cfg.replication, cfg.replication_period_s, cfg.replication_hot_fraction)
            for v in port.dep.plan.vertices if v.keyed and cfg.replication != "none"}
        self.held: dict[str, dict[int, tuple[str, int]]] = {}  # vertex -> kg -> (holder, version)
        self._to_drop: dict[str, set[int]] = {}  # holder -> key groups

    def of(self, vertex: str) -> dict[int, tuple[str, int]]:
        """A copy of ``vertex``'s replicas: key group -> (holder, version)."""
        return dict(self.held.get(vertex, {}))

    async def set_policy(self, operator: str, policy: str, period_s: float | None,
                         hot_fraction: float | None) -> None:
        p = self.port
        vertex = p.dep.plan.vertex_of(operator)
        if vertex.name != operator or not vertex.keyed:
            raise RescaleRefused(f"operator {operator!r} is not a keyed operator with its own "
                                 "tasks; only those hold key groups to replicate")
        if policy not in POLICIES:
            raise RescaleRefused(f"replication policy {policy!r}: use 'none', 'hot' or 'all'")
        cfg = p.config
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
            self.policies[vertex] = (policy, self.port.config.replication_period_s,
                                     hot_fraction)

    async def loop(self) -> None:
        """Refresh each operator's replicas every period, skipping operators that rescale."""
        p = self.port
        last: dict[str, float] = {}
        while p.record.status.active:
            await asyncio.sleep(0.25)
            now = p.clock.monotonic()
            for vertex, (_, period, _) in list(self.policies.items()):
                if now - last.get(vertex, -1e18) < period or p.finished:
                    continue
                # never waits: refused while the operator rescales or changes its logic
                d = await self.arbitration.acquire(Action(ActionKind.REPLICA_REFRESH,
                                                          frozenset({vertex})))
                if d.verdict is not Verdict.RUN:
                    continue
                last[vertex] = now
                try:
                    await self.refresh(vertex)
                except Exception:  # noqa: BLE001 - a task may be going away; next period
                    if not p.record.status.active:
                        return
                finally:
                    self.arbitration.release(d.ticket)

    async def refresh(self, vertex: str) -> None:
        """One round (``engine.control.steps.ReplicaRefreshSteps``): choose the groups,
        place their holders, refresh each replica from its owner (a delta when the holder
        is current); each step within ``Deadlines.rescale_s``."""
        p = self.port
        if vertex not in self.policies or p.record.status != JobState.RUNNING:
            return
        policy, _, frac = self.policies[vertex]
        machine = ReplicaRefreshSteps(vertex, p.dep, policy, frac, self.held.get(vertex, {}),
                                      p.clock)
        limit = p.deadlines.rescale_s
        queue: deque[Any] = deque(machine.start())
        while not machine.done:
            cmd = queue.popleft()
            result: Any = None
            match cmd:
                case SendControl(calls=calls):
                    result = list(await asyncio.wait_for(asyncio.gather(*(
                        p.call(c.task, c.message, c.introduce) for c in calls)), limit))
                case ForgetReplicas(vertex=v, key_groups=kgs):
                    self.forget(v, kgs)
                case ReleaseReplicas(vertex=v, gone=gone, clear=clear):
                    await self.release(v, gone, clear)
                case _:
                    raise TypeError(f"unknown replica refresh step {cmd!r}")
            queue.extend(machine.on_result(cmd, result))
        outcome: ReplicaRefreshOutcome = machine.report()
        self.held[vertex] = dict(outcome.held)
        c = p.collector
        c.replication_bytes[vertex] = c.replication_bytes.get(vertex, 0) + outcome.bytes
        c.replication_cpu_s[vertex] = c.replication_cpu_s.get(vertex, 0.0) + outcome.cpu_s
        c.replicas[vertex] = len(outcome.held)

    def forget(self, vertex: str, key_groups: Sequence[int], keep_at: str | None = None) -> None:
        """The replicas of these groups are out of date (the group moved, or its holder
        changed): forget them, and drop them at their holders (except ``keep_at``, the new
        owner, which consumed its replica when the state arrived)."""
        held = self.held.get(vertex, {})
        for kg in key_groups:
            entry = held.pop(kg, None)
            if entry is not None and entry[0] != keep_at:
                self._to_drop.setdefault(entry[0], set()).add(kg)
        if vertex in self.port.collector.replicas:
            self.port.collector.replicas[vertex] = len(held)

    async def drop_forgotten(self) -> None:
        """Drop the forgotten replicas at their holders; one that does not answer in time
        keeps its list for the next drop (a stale replica is never read: it is forgotten)."""
        p = self.port
        drops, self._to_drop = self._to_drop, {}
        holders = [h for h in drops if h in p.handles]
        results = await asyncio.gather(*(
            asyncio.wait_for(p.call(h, DropReplicas(tuple(sorted(drops[h])))),
                             p.deadlines.task_poll_s) for h in holders), return_exceptions=True)
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
        for vertex in self.port.collector.replicas:
            self.port.collector.replicas[vertex] = 0

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"ReplicaKeeper({sorted(self.policies)})"


__all__: list[Any] = ["ReplicaKeeper"]
