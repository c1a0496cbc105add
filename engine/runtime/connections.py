"""A task actor's data connections (transport "tcp"): its server, and its clients to the
tasks it sends to.

Why apart: the task actor (``engine.runtime.task_actor``) is the shell around a task core;
which socket reaches which task, and what happens when a task name comes to stand for a
new actor, is a concern of its own.

Guarantees: at most one connection is being opened per receiver at a time; a connection
opened while the receiver's name was given to a new actor is dropped and reopened to the
new one; a receiver that cannot be reached raises ``DownstreamDied`` naming it (the task
fails, and the JobMaster fails the job naming the receiver); one Ray cannot reach for now
(``ActorUnavailableError``) is asked again, backing off, for ``unreachable_budget_s``
before that, as the JobMaster's watch reads such a task as silent, not dead. A frame taken from the socket
is acknowledged only once the core took it for processing (``acks``). A connection this
task closed itself is never read as its receiver's death once the task stopped
(``ack_failure``).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import ray
from ray.exceptions import RayActorError

from engine.errors import ConnectionClosed, DownstreamDied
from engine.runtime.failures import actor_death, actor_gone
from engine.task.core import TaskCore
from engine.wire.transport import DataClient, DataServer, ServerConnection

_ACTIVE = ("created", "running")


#: a receiver Ray cannot reach for now is asked again after this long, twice as long each
#: time up to UNREACHABLE_MAX_S, for at most ``DataConnections.unreachable_budget_s``
UNREACHABLE_FIRST_S = 0.05
UNREACHABLE_MAX_S = 2.0


class DataConnections:
    """The data-connection half of ``TaskActor`` (a base class; the actor sets the
    attributes declared here)."""

    #: how long a receiver Ray reports unavailable (``ActorUnavailableError``: its node's
    #: connection broken, or the actor restarting) is asked again before the task fails
    #: with ``DownstreamDied``; one that died (``ActorDiedError``) fails it at once
    unreachable_budget_s = 30.0

    core: TaskCore
    handles: dict[str, Any]
    acks: dict[tuple[int, int], asyncio.Future[None] | ServerConnection]
    _server: DataServer | None
    _clients: dict[str, DataClient]
    _connecting: dict[str, asyncio.Future[DataClient]]
    tls: tuple[ssl.SSLContext, ssl.SSLContext] | None  # (server, client) with JobConfig.tls

    def _event(self) -> asyncio.Event:
        raise NotImplementedError

    async def _backoff(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def data_address(self) -> tuple[str, int, bytes]:
        """Where and with which token to open a data connection to this task (its server
        starts on the first ask)."""
        cfg = self.core.spec.config
        if self._server is None:
            self._server = DataServer(self._on_frame, cfg.max_frame_bytes,
                                      self.tls[0] if self.tls else None)
        port = await self._server.start(cfg.data_host)
        host = cfg.data_host
        if host in ("0.0.0.0", "::"):
            host = ray.util.get_node_ip_address()
        return host, port, self._server.token

    def _on_frame(self, channel_id: int, seq: int, payload: bytes, conn: ServerConnection) -> None:
        """A data frame from the socket: as ``push``, acknowledged through ``conn``."""
        core = self.core
        if core.status not in _ACTIVE:
            conn.ack(channel_id, seq)
            return
        try:
            core.receive(channel_id, seq, payload)
        except Exception as exc:  # the sender fails the job naming this task
            conn.nack(channel_id, seq, f"{type(exc).__name__}: {exc}")
            return
        self.acks[(channel_id, seq)] = conn
        self._event().set()

    def _connected(self, target: str) -> DataClient | None:
        """The data connection to ``target`` if one is open."""
        client = self._clients.get(target)
        return client if client is not None and not client.closed else None

    async def _client(self, target: str) -> DataClient:
        """The data connection to ``target``, opened on first use (one at a time)."""
        client = self._connected(target)
        if client is not None:
            return client
        pending = self._connecting.get(target)
        if pending is None:
            pending = asyncio.ensure_future(self._open_client(target))
            self._connecting[target] = pending
            pending.add_done_callback(lambda _f: self._connecting.pop(target, None))
        return await asyncio.shield(pending)

    async def _open_client(self, target: str, waited_s: float = 0.0) -> DataClient:
        handle = self.handles[target]
        try:
            host, port, token = await handle.data_address.remote()
            cfg = self.core.spec.config
            client = await DataClient.connect(host, port, token, target, cfg.max_frame_bytes,
                                              self.tls[1] if self.tls else None)
        except (RayActorError, OSError) as exc:  # ssl.SSLError too
            if self.handles.get(target) is not handle:  # replaced meanwhile: try the new one
                return await self._open_client(target)
            if (isinstance(exc, RayActorError) and not actor_gone(exc)
                    and waited_s < self.unreachable_budget_s):
                # Ray cannot reach the receiver for now (ActorUnavailableError): silent, not
                # dead; the JobMaster's watch decides that. Ask again, backing off.
                delay = min(max(2 * waited_s, UNREACHABLE_FIRST_S), UNREACHABLE_MAX_S)
                await self._backoff(delay)
                return await self._open_client(target, waited_s + delay)
            waited = f" (unreachable for {waited_s:.1f} s)" if waited_s else ""
            raise DownstreamDied(f"cannot open a data connection to task {target}{waited}: "
                                  f"{type(exc).__name__}: {actor_death(exc)}") from exc
        if self.handles.get(target) is not handle:  # the name now stands for a new actor
            client.close()
            return await self._open_client(target)
        old = self._clients.get(target)
        if old is not None:
            old.close()
        self._clients[target] = client
        return client

    async def close_connections(self) -> None:
        """Close every data connection this task opened and wait for their readers (a task
        that stopped sends nothing more; one that sends again opens new ones)."""
        clients, self._clients = list(self._clients.values()), {}
        await asyncio.gather(*(c.aclose() for c in clients), return_exceptions=True)

    def _new_handles(self, handles: dict[str, Any]) -> None:
        """Take the handles a control call brings. A name that now stands for another
        actor (a task removed, a new one made under its name) drops the old connection;
        connections to new receivers open in the background, ahead of the first frame."""
        for name, h in handles.items():
            old = self.handles.get(name)
            if old is not None and old._actor_id != h._actor_id:
                client = self._clients.pop(name, None)
                if client is not None:
                    client.close()
            self.handles[name] = h
        if self.core.spec.config.transport == "tcp":
            for name in handles:
                if name not in self._clients and name not in self._connecting:
                    asyncio.ensure_future(self._client(name)).add_done_callback(_quiet)



def ack_failure(exc: BaseException, running: bool) -> DownstreamDied | None:
    """What a frame whose acknowledgement failed with ``exc`` tells the task that sent it
    (``running``: the task is created or running, not stopped, finished or failed).

    ``DownstreamDied`` naming the receiver (the task fails, the JobMaster looks for the
    dead task): the receiver went away (``ConnectionLost``, a ``RayActorError``) or refused
    the frame. None when the task closed the connection itself (``ConnectionClosed``) and
    no longer runs: a task that stops closes its connections once its stop settled every
    frame it sent, so such a frame was one nobody waits for any more, and the receiver is
    alive (a retiring task's own close read as a death failed scale-ins). A running
    task that closed a connection with frames in flight (its receiver's name came to stand
    for a new actor) lost them: that is reported as before."""
    if isinstance(exc, ConnectionClosed) and not running:
        return None
    return DownstreamDied(actor_death(exc))


def _quiet(fut: asyncio.Future[Any]) -> None:
    """A background connection attempt that failed: the next send tries again and fails
    the task with the reason."""
    if not fut.cancelled():
        fut.exception()


__all__ = ["DataConnections", "DownstreamDied", "ack_failure"]
