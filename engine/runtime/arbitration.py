"""The arbiter's shell on the JobMaster: a future per waiting ticket, resolved by the
decisions the sans-IO ``engine.control.arbiter.Arbiter`` makes, so nothing polls.

Why a shell: the arbiter decides from events and never waits; a waiter here awaits the
future of its ticket and wakes when an event (a checkpoint finished, a rescale went quiet,
a lock was released, the job stopped running) decided it. A waiter that is cancelled gives
its ticket back (``withdraw``), so a cancelled caller never keeps what it waited for.

Guarantees: after every call into the arbiter the decisions it made are delivered (and
``on_change`` called, which the JobMaster uses to keep its record's ``actions`` current);
``hold`` releases what it was granted however its body ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from engine.control.arbiter import Action, Arbiter, Decision, Verdict


class Arbitration:
    """Tickets and their futures for one job."""

    def __init__(self, arbiter: Arbiter, on_change: Callable[[], None] = lambda: None) -> None:
        self.core = arbiter
        self._on_change = on_change
        self._waiting: dict[int, asyncio.Future[Decision]] = {}

    def deliver(self) -> None:
        """Hand the arbiter's new decisions to their waiters."""
        for d in self.core.take_decisions():
            fut = self._waiting.pop(d.ticket, None)
            if fut is not None and not fut.done():
                fut.set_result(d)
            elif d.verdict is Verdict.RUN:  # nobody waits any more: give it back
                self.core.withdraw(d.ticket)
        self._on_change()

    def event(self, apply: Callable[[Arbiter], object]) -> None:
        """Feed the arbiter one event (``apply(core)``) and deliver what it decided."""
        apply(self.core)
        self.deliver()

    async def _await(self, first: Decision) -> Decision:
        if first.verdict is not Verdict.QUEUE:
            self.deliver()
            return first
        fut: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self._waiting[first.ticket] = fut
        self.deliver()
        try:
            return await fut
        except asyncio.CancelledError:
            self._waiting.pop(first.ticket, None)
            self.core.withdraw(first.ticket)  # granted or still queued: given back
            self.deliver()
            raise

    async def acquire(self, action: Action) -> Decision:
        """The decision on ``action`` once it is RUN or REFUSE (waiting while queued)."""
        return await self._await(self.core.request(action))

    async def gate(self, vertex: str) -> Decision:
        """The rescale of ``vertex`` may start a change (RUN) or must give up (REFUSE)."""
        return await self._await(self.core.gate(vertex))

    def release(self, ticket: int) -> None:
        self.core.finished(ticket)
        self.deliver()

    @contextlib.asynccontextmanager
    async def hold(self, action: Action, refused: Callable[[str], Exception]
                   ) -> AsyncIterator[Decision]:
        """Run the body holding ``action``'s grant; ``refused(reason)`` is raised when the
        arbiter refuses it."""
        d = await self.acquire(action)
        if d.verdict is not Verdict.RUN:
            raise refused(d.reason)
        try:
            yield d
        finally:
            self.release(d.ticket)


__all__ = ["Arbitration"]
