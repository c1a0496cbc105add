"""The JobMaster's watch over its actors: metrics polls with deadlines, task health, and
the warm standby pool's health checks.

Why apart from the JobMaster: this is the part that must never wait for a task. A task
runs user code on its actor's event loop, so one stuck in a user function answers nothing;
the poll waits ``Deadlines.task_poll_s`` and reports it as unresponsive instead
(``engine.runtime.health.TaskHealth``).

Guarantees: a poll returns within ``Deadlines.task_poll_s``; at most one metrics call per
task is outstanding (a stuck task is asked once, the next polls wait on the same call);
the collector holds every live task's latest snapshot (a silent task's last one) and the
silent tasks for the ``reflow_task_unresponsive_seconds`` gauge (a task Ray cannot reach
for now, ``ActorUnavailableError``, is silent, not dead); a task whose actor died
is returned to the caller (the background loop fails the job); a dead standby actor is
dropped at the next poll and the pool topped up ``warm_standby_refill_s`` later.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Protocol

from engine.names import JobState
from engine.observability.metrics import TaskMetrics
from engine.runtime.failures import actor_death, actor_gone
from engine.runtime.health import TaskHealth
from engine.runtime.ports import JobPort
from engine.wire.messages import decode_message


class WatchPort(JobPort, Protocol):
    """What the watch asks of the JobMaster beyond ``JobPort``."""

    @property
    def rescaling(self) -> bool: ...

    async def check_standby(self) -> bool:
        """Ping the standby pool's actors: True when a dead one was dropped."""
        ...

    def refill_standby_later(self) -> None: ...

    def metrics_polled(self) -> None:
        """A metrics poll ended (the controllers keep its snapshot)."""
        ...


class Watch:
    """Metrics polls and health of one job's tasks (and its standby pool)."""

    def __init__(self, port: WatchPort) -> None:
        self.port = port
        self.health = TaskHealth(port.clock)
        self._polls: dict[str, tuple[Any, asyncio.Future[TaskMetrics]]] = {}

    def forget(self, task: str) -> None:
        """``task`` was removed: no more polls, metrics or health."""
        c = self.port.collector
        c.tasks.pop(task, None)
        c.unresponsive.pop(task, None)
        self.health.forget(task)
        self._polls.pop(task, None)

    async def loop(self) -> None:
        """Every ``metrics_poll_interval_s``: poll the tasks (a task that died fails the
        job: the restart strategy may restart it) and check the standby pool (a dead actor
        is dropped and replaced)."""
        p = self.port
        while p.record.status.active:
            await asyncio.sleep(p.config.metrics_poll_interval_s)
            for n, exc in await self.poll():
                if p.record.status == JobState.RUNNING:
                    await p.fail(self.death(n, exc))
                    break
            p.metrics_polled()  # the controllers' metrics history
            if await p.check_standby() and not p.rescaling:
                p.refill_standby_later()

    def death(self, task: str, exc: BaseException) -> str:
        """The job's error when ``task``'s actor died with ``exc``: the task and its
        operator first, then why in a line (``failures.actor_death``)."""
        vertex = next((v for v, ts in self.port.dep.tasks.items() if task in ts), None)
        op = f" of operator {vertex!r}" if vertex is not None else ""
        return f"task {task}{op} died: {type(exc).__name__}: {actor_death(exc)}"

    async def poll(self) -> list[tuple[str, BaseException]]:
        """Ask every live task for its metrics and wait ``Deadlines.task_poll_s``. Returns
        the tasks whose actor died."""
        p = self.port
        # finished tasks are asked too: for their final figures (one that finished before
        # its first poll would otherwise never show in the metrics), and because a finished
        # task that dies must be noticed like any other (checkpoints wait for its ack and
        # would time out, one after the other, while the job said "running")
        names = [n for n in p.dep.task_names() if n in p.handles]
        futs: dict[str, tuple[Any, asyncio.Future[TaskMetrics]]] = {}
        for n in names:
            h = p.handles[n]
            if n not in self._polls or self._polls[n][0] is not h:
                fut = asyncio.ensure_future(_ask_metrics(h))
                # a poll of an actor killed meanwhile (stop-restart, removal) is dropped
                # unread: its error is expected, not "never retrieved"
                fut.add_done_callback(_consume)
                self._polls[n] = (h, fut)
            futs[n] = self._polls[n]
        if futs:
            await asyncio.wait([f for _, f in futs.values()], timeout=p.deadlines.task_poll_s)
        where = {t: (v, i) for v, ts in p.dep.tasks.items() for i, t in enumerate(ts)}
        died: list[tuple[str, BaseException]] = []
        for n, (h, f) in futs.items():
            if not f.done():
                self.health.missed(n)
                continue
            if self._polls.get(n, (None, None))[1] is f:
                del self._polls[n]
            if p.handles.get(n) is not h:  # replaced or removed meanwhile
                continue
            exc = f.exception()
            if exc is not None and actor_gone(exc) and n in p.dep.task_names():
                died.append((n, exc))
            elif exc is not None and not actor_gone(exc):
                self.health.missed(n)  # unreachable for now (ActorUnavailableError): silent
            elif exc is None:
                self.health.answered(n)
                snap = f.result()
                if n in where and snap.task_index != where[n][1]:
                    # labelled by its place in the deployment: a task replacing another
                    # (placement) carries the other's index in its spec meanwhile
                    snap = dataclasses.replace(snap, task_index=where[n][1])
                p.collector.tasks[n] = snap
        p.collector.tasks = {k: v for k, v in p.collector.tasks.items() if k in where}
        p.collector.unresponsive = {t: (*where[t], self.health.since(t))
                                    for t, _ in self.health.unresponsive() if t in where}
        return died

    def unresponsive(self) -> tuple[tuple[str, float], ...]:
        """``(task, seconds since it last answered)`` of the live tasks that did not answer
        the latest poll; none once the job ended."""
        p = self.port
        if not p.record.status.active:
            return ()
        live = set(p.dep.task_names())
        return tuple(e for e in self.health.unresponsive() if e[0] in live)


def _consume(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


async def _ask_metrics(handle: Any) -> TaskMetrics:
    return decode_message(await handle.metrics.remote())


__all__ = ["Watch"]
