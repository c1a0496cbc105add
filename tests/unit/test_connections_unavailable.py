"""A receiver Ray cannot reach for now is not a dead one (``engine.runtime.connections``).

Why: Ray raises ``ActorUnavailableError`` while it cannot reach an actor (its node's
connection broken, the actor restarting); the call may succeed again. The JobMaster's watch
reads such a task as silent, not dead (``engine.runtime.failures.actor_gone``), but a
sender opening a data connection to it failed at once with ``DownstreamDied``, so a
transient network fault failed the sending task and restarted the job. The sender now
asks again, backing off, for ``unreachable_budget_s``; a receiver that died still fails it
at once. Pure logic with stand-ins for the actor handle (no Ray cluster): the backoff is
counted, not slept.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from ray.exceptions import ActorDiedError, ActorUnavailableError

from engine.dataflow.config import JobConfig
from engine.errors import DownstreamDied
from engine.runtime.connections import UNREACHABLE_MAX_S, DataConnections


class _Handle:
    """An actor handle whose ``data_address.remote()`` raises the errors given, in turn."""

    def __init__(self, errors: list[BaseException]) -> None:
        self.errors = errors
        self.calls = 0
        self.data_address = SimpleNamespace(remote=self._remote)

    async def _remote(self) -> Any:
        self.calls += 1
        raise self.errors.pop(0) if len(self.errors) > 1 else self.errors[0]


class _Sender(DataConnections):
    def __init__(self, handle: _Handle, budget_s: float = 30.0) -> None:
        self.core = SimpleNamespace(spec=SimpleNamespace(config=JobConfig()))  # type: ignore[assignment]
        self.handles = {"t": handle}
        self.tls = None
        self._clients, self._connecting = {}, {}
        self.unreachable_budget_s = budget_s
        self.waits: list[float] = []

    async def _backoff(self, seconds: float) -> None:
        self.waits.append(seconds)


def _unavailable() -> ActorUnavailableError:
    return ActorUnavailableError("the actor's node cannot be reached", b"\x00" * 16)


def test_an_unavailable_receiver_is_asked_again_until_ray_says_it_died() -> None:
    h = _Handle([_unavailable(), _unavailable(), ActorDiedError()])
    s = _Sender(h)
    with pytest.raises(DownstreamDied, match="unreachable for"):
        asyncio.run(s._open_client("t"))
    assert h.calls == 3 and len(s.waits) == 2


def test_a_dead_receiver_fails_the_sender_at_once() -> None:
    h = _Handle([ActorDiedError()])
    s = _Sender(h)
    with pytest.raises(DownstreamDied) as err:
        asyncio.run(s._open_client("t"))
    assert h.calls == 1 and s.waits == [] and "unreachable" not in str(err.value)


def test_a_receiver_unavailable_for_the_whole_budget_fails_the_sender() -> None:
    h = _Handle([_unavailable()])
    s = _Sender(h, budget_s=10.0)
    with pytest.raises(DownstreamDied, match="unreachable for 1[0-9]"):
        asyncio.run(s._open_client("t"))
    assert sum(s.waits[:-1]) < 10.0 <= sum(s.waits)  # asked until the budget was spent
    assert max(s.waits) <= UNREACHABLE_MAX_S and s.waits == sorted(s.waits)
