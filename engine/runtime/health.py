"""The JobMaster's view of its actors' health: which tasks answer, which standby actors live.

Why: a task runs user code on its actor's event loop, so a user function that blocks (a
sleep, a hung request) blocks every call to that task. The JobMaster must then answer the
driver anyway, with the task reported as unresponsive and for how long, instead of waiting
with it. And warm standby actors (``JobConfig.warm_standby_tasks``) sit idle for a long
time: one can die unnoticed (its node, a kill), and a rescale handed a dead one would fail
in its deploy phase.

Guarantees. ``TaskHealth``: a task is unresponsive from the first poll it did not answer
in time until it answers one; its seconds count from the last time it answered (or from its
creation). ``StandbyPool``: ``take`` never returns an actor whose ping failed or did not
come back within the deadline (those are killed and dropped); ``check`` drops every actor
whose ping failed, but never one ``take`` handed out while its ping was on the way (that
actor is a task now: the pool kills only what it holds); ``len`` counts the actors not
known dead. Both are driven by the JobMaster (``engine.runtime.job_master``) and take
their I/O as functions, so they are tested without Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from engine.time.clock import Clock


class TaskHealth:
    """When each task last answered the JobMaster, and which missed their latest poll."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._last: dict[str, float] = {}
        self._silent: set[str] = set()

    def created(self, task: str) -> None:
        """``task`` exists from now on (a task that never answers counts from here)."""
        self._last.setdefault(task, self.clock.monotonic())

    def answered(self, task: str) -> None:
        self._last[task] = self.clock.monotonic()
        self._silent.discard(task)

    def missed(self, task: str) -> None:
        """``task`` did not answer a poll within its deadline."""
        self._last.setdefault(task, self.clock.monotonic())
        self._silent.add(task)

    def forget(self, task: str) -> None:
        self._last.pop(task, None)
        self._silent.discard(task)

    def since(self, task: str) -> float:
        """The monotonic time ``task`` last answered (or was created); now when unknown."""
        return self._last.get(task, self.clock.monotonic())

    def is_silent(self, task: str) -> bool:
        return task in self._silent

    def unresponsive(self) -> tuple[tuple[str, float], ...]:
        """``(task, seconds since it last answered)`` of each silent task, sorted by task."""
        now = self.clock.monotonic()
        return tuple((t, round(max(0.0, now - self._last[t]), 3)) for t in sorted(self._silent))


class StandbyPool:
    """Idle task actors ready to become tasks, health-checked by pings.

    ``make(name)`` starts an actor named ``name`` (``<prefix>-<n>``, n counting from 0 over
    the job's life, so an actor can be found by name); ``ping(actor)`` awaits a cheap call
    on it; ``kill(actor)`` ends it. ``deadline_s``: how long a ping may take.
    """

    def __init__(self, prefix: str, size: int, make: Callable[[str], Any],
                 ping: Callable[[Any], Awaitable[Any]], kill: Callable[[Any], None],
                 deadline_s: float) -> None:
        if size < 0 or deadline_s <= 0:
            raise ValueError(f"StandbyPool needs size >= 0 and deadline_s > 0; got {size}, "
                             f"{deadline_s}")
        self.prefix = prefix
        self.size = size
        self._make, self._ping, self._kill = make, ping, kill
        self.deadline_s = deadline_s
        self._actors: list[tuple[str, Any]] = []  # oldest first
        self._made = 0
        self.dropped: list[str] = []  # names of actors found dead or silent, for the record

    def __len__(self) -> int:
        return len(self._actors)

    def names(self) -> list[str]:
        return [n for n, _ in self._actors]

    def fill(self) -> int:
        """Start actors until the pool holds ``size``; returns how many were started."""
        started = 0
        while len(self._actors) < self.size:
            name = f"{self.prefix}-{self._made}"
            self._made += 1
            self._actors.append((name, self._make(name)))
            started += 1
        return started

    async def _alive(self, actor: Any) -> bool | None:
        """True when the ping came back, False when it failed (dead), None on timeout."""
        try:
            await asyncio.wait_for(self._ping(actor), self.deadline_s)
            return True
        except TimeoutError:
            return None
        except Exception:  # noqa: BLE001 - any failed ping (ActorDiedError, ...) means dead
            return False

    def _drop(self, name: str, actor: Any) -> None:
        self.dropped.append(name)
        with contextlib.suppress(Exception):
            self._kill(actor)

    async def take(self) -> Any | None:
        """The oldest actor that answers a ping within the deadline, or None when none
        does. Actors that fail or miss the ping are killed and dropped (a silent one may be
        dead on a lost node; a new actor is cheaper than a rescale failed at deploy)."""
        while self._actors:
            name, actor = self._actors.pop(0)
            if await self._alive(actor):
                return actor
            self._drop(name, actor)
        return None

    async def check(self) -> int:
        """Ping every actor at once; drop those whose ping failed (a ping that only timed
        out may be an actor still starting: kept, and ``take`` pings it again) and that are
        still in the pool: one ``take`` handed out meanwhile answered its ping there and
        runs a task now, which a kill would fail. Returns how many were dropped."""
        actors = list(self._actors)
        results = await asyncio.gather(*(self._alive(a) for _, a in actors))
        held = {n for n, _ in self._actors}
        dead = {n for (n, _), ok in zip(actors, results, strict=True)
                if ok is False and n in held}
        for n, a in actors:
            if n in dead:
                self._drop(n, a)
        self._actors = [(n, a) for n, a in self._actors if n not in dead]
        return len(dead)

    def clear(self) -> list[Any]:
        """Empty the pool; returns its actors (for the caller to kill)."""
        out = [a for _, a in self._actors]
        self._actors.clear()
        return out


__all__ = ["StandbyPool", "TaskHealth"]
