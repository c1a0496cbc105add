"""Whether Ray's GCS answers now, asked off the JobMaster's event loop within a deadline.

Why: with GCS fault tolerance (docs/guide/high-availability.md) the head's GCS may restart
while a job runs. The job needs no GCS to run, but Ray's calls that do (creating a named
actor, ``ray.nodes()``, ``ray.cluster_resources()``, ``ray.get_actor``) block their caller
until the GCS is back (measured on Ray 2.60). The JobMaster runs on one event loop, so one
such call there freezes it: ``status()`` times out and no checkpoint completes for as
long as the GCS is away. Before what would wait (a rescale or a placement, which creates
named task actors), the JobMaster asks here, and refuses the request when the GCS is away.

Guarantees: ``GcsProbe.answers(seconds)`` returns within ``seconds`` (plus scheduling)
and never raises: True when the probe call came back, False when it did not in time or
raised. At most one probe call is outstanding: a probe still waiting for a GCS that is away
is awaited again by the next ``answers`` instead of starting another thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


def _nodes() -> Any:
    import ray

    return ray.nodes()


class GcsProbe:
    """Asks the GCS with ``call`` (default ``ray.nodes``) in a thread (see the module doc)."""

    def __init__(self, call: Callable[[], Any] = _nodes) -> None:
        self._call = call
        self._pending: asyncio.Future[Any] | None = None

    async def answers(self, seconds: float) -> bool:
        if self._pending is None or self._pending.done():
            self._pending = asyncio.ensure_future(asyncio.to_thread(self._call))
            self._pending.add_done_callback(_consume)
        try:
            await asyncio.wait_for(asyncio.shield(self._pending), seconds)
            return True
        except Exception:  # noqa: BLE001 - timed out, or the call failed: not answering
            return False


def _consume(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


__all__ = ["GcsProbe"]
