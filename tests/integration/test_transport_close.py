"""Issue 32 item 13: a data connection's reader is never reported destroyed pending (real
loopback sockets, no Ray). A task actor whose process exited with its connections open
(Ray ends a job's task actors gracefully when their JobMaster goes) printed "Task was
destroyed but it is pending!" for every ``DataClient._read_acks``."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from engine.wire.transport import DataClient, DataServer, ServerConnection

PENDING = "Task was destroyed but it is pending"


def _ack(cid: int, seq: int, payload: bytes, conn: ServerConnection) -> None:
    conn.ack(cid, seq)


def _connect_send_and_close(wait: bool) -> DataClient:
    """Open a connection, have one frame acknowledged, close it with ``aclose`` when
    ``wait`` (else leave it open, as a stopped task did), then end the event loop at once,
    as an actor's process exit does."""
    loop = asyncio.new_event_loop()

    async def scenario() -> DataClient:
        server = DataServer(_ack)
        port = await server.start("127.0.0.1")
        client = await DataClient.connect("127.0.0.1", port, server.token, "receiver/0")
        await asyncio.wait_for(client.send(1, 0, b"frame"), 10)
        if wait:
            await client.aclose()
        server.close()
        return client

    try:
        return loop.run_until_complete(scenario())
    finally:
        loop.close()


@pytest.mark.parametrize("wait", [False, True], ids=["left-open", "aclose"])
def test_no_reader_is_destroyed_pending(caplog, wait):
    """A connection left open when the loop ends (a task actor's process exiting with its
    JobMaster gone: no stop reached it) logs nothing for its reader, and ``aclose()`` (a
    task that stops) ends the reader before returning. Before: the left-open reader was
    logged as "Task was destroyed but it is pending!", and there was no ``aclose``."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    client = _connect_send_and_close(wait)
    reader_done = client._reader_task.done()
    del client
    gc.collect()
    destroyed = [r for r in caplog.records
                 if PENDING in r.getMessage() and "_read_acks" in str(r.__dict__)]
    assert not destroyed, caplog.text
    assert reader_done == wait
