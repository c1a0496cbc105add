"""The direct TCP data channel (engine.wire.transport) on real loopback sockets, no Ray: order,
acknowledgements, refusals, the maximum frame length, and TLS with pairs the tests make."""

from __future__ import annotations

import asyncio
import contextlib
import ssl

import pytest

from engine.dataflow.config import JobConfig
from engine.errors import ConfigError, ConnectionLost, FrameRefused, FrameTooLarge
from engine.wire.transport import (
    _FRAME,
    TLS,
    DataClient,
    DataServer,
    ServerConnection,
    tls_contexts,
)
from tests.tls import self_signed


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


# ---------------------------------------------------------------- bounds and TLS

def test_a_length_field_over_the_maximum_closes_the_connection() -> None:
    async def go() -> None:
        frames: list[bytes] = []
        server = DataServer(lambda c, s, p, conn: frames.append(p), max_frame_bytes=4096)
        port = await server.start("127.0.0.1")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # a frame announcing ~4 GB and never sending it: a server that allocated or waited
        # for the payload would keep the connection open; this one closes it at the header
        writer.write(server.token + _FRAME.pack(1, 1, 2**32 - 1))
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
        assert frames == []
        # frames up to the maximum still pass on a new connection
        client = await DataClient.connect("127.0.0.1", port, server.token, "rx",
                                          max_frame_bytes=4096)
        ok = client.send(1, 1, b"x" * 4096)
        await until(lambda: frames == [b"x" * 4096])
        assert not ok.done()
        client.close()
        server.close()

    run(go())


def test_a_sender_never_sends_a_frame_over_the_maximum() -> None:
    async def go() -> None:
        rx = Receiver()
        port = await rx.server.start("127.0.0.1")
        client = await DataClient.connect("127.0.0.1", port, rx.server.token, "rx",
                                          max_frame_bytes=1024)
        with pytest.raises(FrameTooLarge, match=r"1,025 bytes for task rx exceeds "
                                                r"max_frame_bytes=1,024; lower "
                                                r"JobConfig.batch_size"):
            await client.send(1, 1, b"y" * 1025)
        small = client.send(1, 2, b"z")
        await until(lambda: len(rx.frames) == 1)
        rx.take()
        await small
        assert not client.closed
        client.close()

    run(go())


def test_tls_carries_frames_and_both_ends_are_verified(tmp_path) -> None:
    server_ctx, client_ctx = tls_contexts(self_signed(tmp_path / "a"))

    async def go() -> None:
        rx = Receiver()
        rx.server = DataServer(rx.on_frame, tls=server_ctx)
        port = await rx.server.start("127.0.0.1")
        client = await DataClient.connect("127.0.0.1", port, rx.server.token, "rx",
                                          tls=client_ctx)
        assert client._writer.get_extra_info("ssl_object").version() in ("TLSv1.2", "TLSv1.3")
        futs = [client.send(1, i, bytes([i]) * 5000) for i in range(5)]
        await until(lambda: len(rx.frames) == 5)
        assert [f[2] for f in rx.frames] == [bytes([i]) * 5000 for i in range(5)]
        rx.take()
        await asyncio.gather(*futs)
        client.close()
        rx.server.close()

    run(go())


def test_tls_server_refuses_plain_and_untrusted_clients(tmp_path) -> None:
    server_ctx, _ = tls_contexts(self_signed(tmp_path / "a"))
    _, stranger_ctx = tls_contexts(self_signed(tmp_path / "b", "stranger"))

    async def go() -> None:
        rx = Receiver()
        rx.server = DataServer(rx.on_frame, tls=server_ctx)
        port = await rx.server.start("127.0.0.1")
        plain = await DataClient.connect("127.0.0.1", port, rx.server.token, "rx")
        with pytest.raises(ConnectionLost):
            await plain.send(1, 1, b"clear text")
        # a client whose certificate the server's CA did not sign, and which does not trust
        # the server's: the handshake fails on one side or the other
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            stranger = await DataClient.connect("127.0.0.1", port, rx.server.token, "rx",
                                                tls=stranger_ctx)
            with pytest.raises(ConnectionLost):
                await stranger.send(1, 2, b"forged")
        assert rx.frames == []
        rx.server.close()

    run(go())


def test_tls_files_that_cannot_load_are_a_config_error(tmp_path) -> None:
    good = self_signed(tmp_path)
    with pytest.raises(ConfigError, match=r"JobConfig.tls: cannot load certificate .*missing"
                                          r".*readable PEM file on every node"):
        tls_contexts(TLS(str(tmp_path / "missing.crt"), good.key_file))
    other = self_signed(tmp_path / "other", "other")
    with pytest.raises(ConfigError, match="the key must match the certificate"):
        tls_contexts(TLS(good.cert_file, other.key_file))
    with pytest.raises(ConfigError, match="TLS: key_file must be the path of a PEM file"):
        TLS(good.cert_file, "")
    with pytest.raises(ConfigError, match="JobConfig: tls must be None with transport='ray'"):
        JobConfig(tls=good, transport="ray")


def test_idle_unauthenticated_connections_are_capped_and_timed_out(monkeypatch) -> None:
    """Issue 32 item 11: a connection that never presents its token is closed after
    TOKEN_TIMEOUT_S, and at most MAX_UNAUTHENTICATED wait at once (more are closed at
    once); a client with the token still gets through afterwards."""
    import engine.wire.transport as tr

    monkeypatch.setattr(tr, "TOKEN_TIMEOUT_S", 0.5)
    monkeypatch.setattr(tr, "MAX_UNAUTHENTICATED", 4)

    async def go() -> None:
        rx = Receiver()
        port = await rx.server.start("127.0.0.1")
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(6)]
        await until(lambda: rx.server.unauthenticated == 4)
        closed = 0
        for reader, _ in idle:  # two closed at once, the other four after the timeout
            with contextlib.suppress(ConnectionError):
                if await asyncio.wait_for(reader.read(1), 3) == b"":
                    closed += 1
        assert closed == 6 and rx.server.unauthenticated == 0
        for _, writer in idle:
            writer.close()
        client = await connected(rx)
        fut = client.send(1, 1, b"x")
        await until(lambda: rx.frames)
        rx.take()
        await fut
        client.close()

    run(go())
