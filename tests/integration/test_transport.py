"""The direct TCP data channel (engine.transport) on real loopback sockets, no Ray."""

from __future__ import annotations

import asyncio

import pytest

from engine.errors import ConnectionLost, FrameRefused
from engine.transport import DataClient, DataServer, ServerConnection


def run(coro):  # noqa: ANN001, ANN201
    return asyncio.run(asyncio.wait_for(coro, 10))


class Receiver:
    """Holds frames like a task: acknowledges only when told (taken for processing)."""

    def __init__(self, refuse: set[int] | None = None) -> None:
        self.frames: list[tuple[int, int, bytes]] = []
        self.held: list[tuple[int, int, ServerConnection]] = []
        self.refuse = refuse or set()
        self.server = DataServer(self.on_frame)

    def on_frame(self, cid: int, seq: int, payload: bytes, conn: ServerConnection) -> None:
        if cid in self.refuse:
            conn.nack(cid, seq, f"task has no input channel {cid}")
            return
        self.frames.append((cid, seq, payload))
        self.held.append((cid, seq, conn))

    def take(self, n: int | None = None) -> None:
        n = len(self.held) if n is None else n
        for cid, seq, conn in self.held[:n]:
            conn.ack(cid, seq)
        del self.held[:n]


async def until(cond, timeout: float = 5.0) -> None:  # noqa: ANN001
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.005)


async def connected(rx: Receiver) -> DataClient:
    port = await rx.server.start("127.0.0.1")
    return await DataClient.connect("127.0.0.1", port, rx.server.token, "rx")


def test_frames_arrive_in_order_and_ack_only_when_taken() -> None:
    async def go() -> None:
        rx = Receiver()
        client = await connected(rx)
        payloads = [bytes([i]) * (i * 1000 + 1) for i in range(20)]
        futs = [client.send(i % 3, i, p) for i, p in enumerate(payloads)]
        await until(lambda: len(rx.frames) == 20)
        assert [f[2] for f in rx.frames] == payloads
        assert [(f[0], f[1]) for f in rx.frames] == [(i % 3, i) for i in range(20)]
        await asyncio.sleep(0.05)
        assert not any(f.done() for f in futs)  # nothing taken yet: no credit back
        rx.take(5)
        await asyncio.wait_for(asyncio.gather(*futs[:5]), 2)
        assert not any(f.done() for f in futs[5:])
        rx.take()
        await asyncio.wait_for(asyncio.gather(*futs), 2)
        client.close()
        rx.server.close()

    run(go())


def test_large_and_empty_payloads() -> None:
    async def go() -> None:
        rx = Receiver()
        client = await connected(rx)
        big = bytes(range(256)) * 40_000  # ~10 MB, larger than any socket buffer
        f1 = client.send(7, 1, big)
        f2 = client.send(7, 2, b"")
        await until(lambda: len(rx.frames) == 2)
        assert rx.frames[0][2] == big and rx.frames[1][2] == b""
        rx.take()
        await asyncio.gather(f1, f2)
        client.close()

    run(go())


def test_refused_frame_fails_its_future_with_the_reason() -> None:
    async def go() -> None:
        rx = Receiver(refuse={9})
        client = await connected(rx)
        ok = client.send(1, 1, b"x")
        bad = client.send(9, 1, b"y")
        with pytest.raises(FrameRefused, match="no input channel 9"):
            await bad
        rx.take()
        await ok
        client.close()

    run(go())


def test_receiver_gone_fails_unacknowledged_frames() -> None:
    async def go() -> None:
        rx = Receiver()
        client = await connected(rx)
        fut = client.send(1, 1, b"x")
        await until(lambda: len(rx.frames) == 1)
        rx.held[0][2]._writer.close()  # the receiving process goes away
        with pytest.raises(ConnectionLost, match="rx"):
            await fut
        assert client.closed
        later = client.send(1, 2, b"y")
        with pytest.raises(ConnectionLost):
            await later

    run(go())


def test_wrong_token_is_refused_and_delivers_nothing() -> None:
    async def go() -> None:
        rx = Receiver()
        port = await rx.server.start("127.0.0.1")
        client = await DataClient.connect("127.0.0.1", port, b"\0" * 16, "rx")
        fut = client.send(1, 1, b"forged")
        with pytest.raises(ConnectionLost):
            await fut
        assert rx.frames == []

    run(go())


def test_server_binds_loopback_by_default_address_given() -> None:
    async def go() -> None:
        rx = Receiver()
        await rx.server.start("127.0.0.1")
        assert rx.server._server is not None
        host = rx.server._server.sockets[0].getsockname()[0]
        assert host == "127.0.0.1"
        rx.server.close()

    run(go())


def test_many_senders_share_one_server() -> None:
    async def go() -> None:
        rx = Receiver()
        clients = [await connected(rx) for _ in range(4)]
        futs = [c.send(ci, s, f"{ci}:{s}".encode()) for s in range(10)
                for ci, c in enumerate(clients)]
        await until(lambda: len(rx.frames) == 40)
        for ci in range(4):
            assert [f[1] for f in rx.frames if f[0] == ci] == list(range(10))
        rx.take()
        await asyncio.gather(*futs)
        for c in clients:
            c.close()

    run(go())
