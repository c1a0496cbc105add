"""A sender's own close is never read as its receiver's death (real loopback sockets, no
Ray): frames this end gave up on fail with ``ConnectionClosed``, frames whose receiver went
away with ``ConnectionLost``, and the first reason stays the connection's.

Why: a retiring task (a scale-in's ``StopTask``) closes its connections once its frames
were settled; a frame that still failed then read "data connection to task out1/1 was
closed", a ``ConnectionLost`` like a dead receiver's, and the task failed the job
(``engine.runtime.connections.ack_failure`` now tells the two apart)."""

from __future__ import annotations

import asyncio

import pytest

from engine.errors import ConnectionClosed, ConnectionLost
from tests.integration.test_transport import Receiver, connected, run, until


def test_frames_a_sender_gives_up_on_fail_as_closed_here_and_the_receiver_lives_on() -> None:
    async def go() -> None:
        rx = Receiver()
        client = await connected(rx)
        held = [client.send(7, seq, b"x") for seq in range(3)]
        await until(lambda: len(rx.frames) == 3)
        rx.take(1)
        await held[0]
        client.close()
        for fut in held[1:]:
            with pytest.raises(ConnectionClosed, match="closed by this task"):
                await fut
        assert client.closed
        with pytest.raises(ConnectionClosed):
            await client.send(7, 3, b"y")
        rx.take()  # acknowledgements after the close change nothing
        await client.aclose()
        other = await connected(rx)  # the receiver still takes connections and frames
        fut = other.send(8, 0, b"z")
        await until(lambda: len(rx.frames) == 4)
        rx.take()
        await fut
        other.close()
        rx.server.close()

    run(go())


def test_a_receiver_gone_first_stays_a_loss_when_the_sender_closes_after() -> None:
    async def go() -> None:
        rx = Receiver()
        client = await connected(rx)
        fut = client.send(7, 0, b"x")
        await until(lambda: len(rx.frames) == 1)
        rx.held[0][2]._writer.close()  # the receiving process goes away
        with pytest.raises(ConnectionLost, match="rx"):
            await fut
        client.close()
        with pytest.raises(ConnectionLost):
            await client.send(7, 1, b"y")
        await asyncio.sleep(0)
        rx.server.close()

    run(go())
