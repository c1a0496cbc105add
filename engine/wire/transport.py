"""Direct TCP data channels between task actors: the data plane's fast path.

A data frame sent as a Ray actor call costs about 1.3 ms of CPU over both ends on a small
machine (task submission, the callee's scheduling, the returned ack), and a job sends one
frame per channel per linger, so with 8-12 tasks the calls alone keep most of two cores
busy. Over a socket a frame costs a write and a read. Actor calls stay for everything
else: control messages, state transfer, reports.

Each task actor runs one ``DataServer``; a sender opens one ``DataClient`` per receiving
actor and multiplexes all its channels to that actor over it. The receiver restores each
channel's order by sequence number, as with actor calls, so nothing here orders frames.

Wire (all integers big-endian; payloads are the engine's msgpack frames, never pickled):

* client -> server, first: the server's token (``TOKEN_BYTES``), which the client learnt
  through a Ray call to the receiving actor; a connection that opens with anything else is
  closed. Then frames: ``!IQI`` (channel id, sequence number, payload length) + payload.
* server -> client: acknowledgements ``!BIQ`` (``ACK`` or ``NACK``, channel id, sequence
  number); a ``NACK`` is followed by ``!I`` + a UTF-8 reason (the receiver refused the
  frame, e.g. an unknown channel) and makes the frame's future fail with ``FrameRefused``.

An acknowledgement means what an actor call's return means on the Ray path: the receiver
took the frame for processing (credit-based backpressure). A connection that closes fails
every unacknowledged frame's future: with ``ConnectionLost`` when the other end went away
(the receiver died), with ``ConnectionClosed`` when this end closed it (``close``: the sender
gave up on those frames; the receiver is alive), so a sender never reads its own close as
its receiver's death.

Bounds: a connection must present its token within ``TOKEN_TIMEOUT_S`` and at most
``MAX_UNAUTHENTICATED`` connections may be waiting to do so at once (more are closed at
once), so idle or stray connections cannot pile up on the port. A length field is checked
before anything is allocated for it. A server closes a
connection whose frame header announces more than ``max_frame_bytes`` (its unacknowledged
frames then fail at the sender with ``ConnectionLost``); a client never sends such a frame
(its future fails with ``FrameTooLarge`` naming the limit) and closes a connection whose
refusal reason is longer than ``MAX_REASON_BYTES``.

TLS (``JobConfig(tls=TLS(...))``): both ends wrap the socket in TLS 1.2+ and authenticate
each other (the server requires a client certificate; each side verifies the other's
chain against the configured CA); the token still opens the connection, inside TLS.
Without TLS frames travel in clear text, fit for one machine or a private network.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import ssl
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.errors import ConfigError, ConnectionClosed, ConnectionLost, FrameRefused, FrameTooLarge

log = logging.getLogger(__name__)

TOKEN_BYTES = 16
#: seconds a new connection has to present its token; it is closed after that
TOKEN_TIMEOUT_S = 10.0
#: connections that have not presented their token yet, at most, per server
MAX_UNAUTHENTICATED = 32
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
MAX_REASON_BYTES = 64 * 1024
ACK = 1
NACK = 2
_FRAME = struct.Struct("!IQI")
_ACK = struct.Struct("!BIQ")
_LEN = struct.Struct("!I")


@dataclass(frozen=True)
class TLS:
    """TLS for the data transport's connections (``JobConfig(tls=TLS(...))``): PEM files,
    read by each task actor when it opens its data server or a connection, so the paths
    must exist on every node (e.g. a Kubernetes secret mounted at the same path).

    Both ends authenticate: a task's server presents ``cert_file`` and requires the
    connecting task's certificate, and each side verifies the other's chain against
    ``ca_file`` (default: ``cert_file`` itself, so one self-signed pair shared by the job's
    tasks is enough). ``check_hostname``: also check that the address a task connects to is
    in the server certificate's subject alternative names (off by default: tasks connect by
    IP address, and the chain check against a job-private CA already authenticates them).
    Wrong types or empty paths raise ``ConfigError``; an unreadable file or a bad key fails
    the task at deployment with ``ConfigError`` naming the file."""

    cert_file: str
    key_file: str
    ca_file: str | None = None
    check_hostname: bool = False

    def __post_init__(self) -> None:
        for name in ("cert_file", "key_file", "ca_file"):
            value = getattr(self, name)
            if value is None and name == "ca_file":
                continue
            if not isinstance(value, str) or not value:
                raise ConfigError(f"TLS: {name} must be the path of a PEM file; got {value!r}")
        if not isinstance(self.check_hostname, bool):
            raise ConfigError(f"TLS: check_hostname must be True or False; got "
                              f"{self.check_hostname!r}")

    @property
    def ca(self) -> str:
        """The file of certificate authorities peers are verified against."""
        return self.ca_file or self.cert_file


FrameHandler = Callable[[int, int, bytes, "ServerConnection"], None]


class ServerConnection:
    """The receiving end of one client's connection: acknowledges frames, batching the
    acknowledgements of one event-loop turn into one write."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._buf = bytearray()
        self._scheduled = False

    def ack(self, channel_id: int, seq: int) -> None:
        self._buf += _ACK.pack(ACK, channel_id, seq)
        self._schedule()

    def nack(self, channel_id: int, seq: int, reason: str) -> None:
        text = reason.encode()
        self._buf += _ACK.pack(NACK, channel_id, seq) + _LEN.pack(len(text)) + text
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        if self._buf and not self._writer.is_closing():
            self._writer.write(bytes(self._buf))
        self._buf.clear()


class DataServer:
    """Accepts data connections for one task; ``on_frame(channel_id, seq, payload, conn)``
    is called for every frame, in arrival order, and must answer through ``conn.ack`` /
    ``conn.nack`` (now or later). Bound to ``host`` (127.0.0.1 unless configured)."""

    def __init__(self, on_frame: FrameHandler, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 tls: ssl.SSLContext | None = None) -> None:
        self.on_frame = on_frame
        self.token = secrets.token_bytes(TOKEN_BYTES)
        self.max_frame_bytes = max_frame_bytes
        self.tls = tls
        self._server: asyncio.base_events.Server | None = None
        self.port = 0
        self.unauthenticated = 0  # connections still to present their token

    async def start(self, host: str) -> int:
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, host, 0, ssl=self.tls)
            self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.unauthenticated >= MAX_UNAUTHENTICATED:
            writer.close()
            return
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, ssl.SSLError,
                                 TimeoutError):
            self.unauthenticated += 1
            try:
                token = await asyncio.wait_for(reader.readexactly(TOKEN_BYTES),
                                               TOKEN_TIMEOUT_S)
            except TimeoutError:
                writer.close()
                raise
            finally:
                self.unauthenticated -= 1
            if not secrets.compare_digest(token, self.token):
                writer.close()
                return
            _set_nodelay(writer)
            conn = ServerConnection(writer)
            while True:
                header = await reader.readexactly(_FRAME.size)
                cid, seq, n = _FRAME.unpack(header)
                if n > self.max_frame_bytes:
                    log.warning("closing a data connection from %s: frame %d of channel %d "
                                "announces %d bytes, more than max_frame_bytes=%d",
                                writer.get_extra_info("peername"), seq, cid, n,
                                self.max_frame_bytes)
                    break
                payload = await reader.readexactly(n)
                self.on_frame(cid, seq, payload, conn)
        writer.close()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


class DataClient:
    """The sending end towards one receiving task. ``send`` returns a future resolved by
    the receiver's acknowledgement; frames of every channel to that task share the socket."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 peer: str, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.peer = peer
        self.max_frame_bytes = max_frame_bytes
        self._writer = writer
        self._pending: dict[tuple[int, int], asyncio.Future[None]] = {}
        self._closed: BaseException | None = None
        self._reader_task = asyncio.get_running_loop().create_task(self._read_acks(reader))
        # a task actor whose process exits (its JobMaster gone, Ray stopping) leaves its
        # readers waiting for acknowledgements that cannot matter any more: asyncio's
        # "Task was destroyed but it is pending!" for them (one per connection, at every
        # such exit) is noise; ``aclose`` ends them in order when a task stops
        self._reader_task._log_destroy_pending = False  # type: ignore[attr-defined]

    @classmethod
    async def connect(cls, host: str, port: int, token: bytes, peer: str,
                      max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                      tls: ssl.SSLContext | None = None) -> DataClient:
        """Open a connection to a task's server (TLS when ``tls`` is given: the server's
        certificate is verified, and this side's presented)."""
        reader, writer = await asyncio.open_connection(
            host, port, ssl=tls, server_hostname=host if tls is not None else None)
        _set_nodelay(writer)
        writer.write(token)
        return cls(reader, writer, peer, max_frame_bytes)

    @property
    def closed(self) -> bool:
        return self._closed is not None

    def send(self, channel_id: int, seq: int, payload: bytes) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._closed is not None:
            kind = ConnectionClosed if isinstance(self._closed, ConnectionClosed) else ConnectionLost
            fut.set_exception(kind(f"connection to task {self.peer} is closed: {self._closed}"))
            return fut
        if len(payload) > self.max_frame_bytes:
            fut.set_exception(FrameTooLarge(
                f"a frame of {len(payload):,} bytes for task {self.peer} exceeds "
                f"max_frame_bytes={self.max_frame_bytes:,}; lower JobConfig.batch_size or "
                "raise JobConfig.max_frame_bytes"))
            return fut
        self._pending[(channel_id, seq)] = fut
        self._writer.writelines((_FRAME.pack(channel_id, seq, len(payload)), payload))
        return fut

    async def _read_acks(self, reader: asyncio.StreamReader) -> None:
        reason: ConnectionLost | ConnectionClosed
        try:
            while True:
                kind, cid, seq = _ACK.unpack(await reader.readexactly(_ACK.size))
                exc: BaseException | None = None
                if kind == NACK:
                    (n,) = _LEN.unpack(await reader.readexactly(_LEN.size))
                    if n > MAX_REASON_BYTES:
                        raise ConnectionError(f"a refusal reason of {n} bytes (more than "
                                              f"{MAX_REASON_BYTES})")
                    text = (await reader.readexactly(n)).decode(errors="replace")
                    exc = FrameRefused(f"task {self.peer} refused frame {seq} of channel "
                                       f"{cid}: {text}")
                fut = self._pending.pop((cid, seq), None)
                if fut is not None and not fut.done():
                    if exc is None:
                        fut.set_result(None)
                    else:
                        fut.set_exception(exc)
        except (ConnectionError, asyncio.IncompleteReadError, OSError) as exc:  # SSLError too
            reason = ConnectionLost(f"data connection to task {self.peer} lost: "
                                    f"{type(exc).__name__}: {exc}")
        except asyncio.CancelledError:  # close() (which failed the frames first), or the
            # loop ending: either way this end closed the connection, nobody else
            reason = ConnectionClosed(f"data connection to task {self.peer} was closed by "
                                      "this task")
        self._fail_pending(reason)

    def _fail_pending(self, reason: BaseException) -> None:
        """Fail every unacknowledged frame with ``reason`` (the first reason stays the
        connection's: a close that came first is not turned into a loss)."""
        if self._closed is None:
            self._closed = reason
        reason = self._closed
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(reason)
                fut.exception()  # retrieved here: a sender that stopped waiting logs nothing

    def close(self) -> None:
        """Close the connection: frames not acknowledged yet fail at once with
        ``ConnectionClosed`` (the receiver did not die; this end gave up on them), and the
        reader ends at the loop's next turn (``aclose`` waits for that)."""
        self._fail_pending(ConnectionClosed(
            f"data connection to task {self.peer} was closed by this task"))
        self._reader_task.cancel()
        self._writer.close()

    async def aclose(self) -> None:
        """Close the connection and wait until its reader has ended (a task that stops
        closes its connections so: nothing of them is left when its process exits)."""
        self.close()
        await asyncio.gather(self._reader_task, return_exceptions=True)


def tls_contexts(tls: TLS) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The (server, client) contexts of ``tls``: TLS 1.2 or newer, each end presenting
    ``cert_file``/``key_file`` and requiring the other's certificate, verified against
    ``tls.ca``. ``ConfigError`` naming the files when they cannot be read or do not match."""
    try:
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=tls.ca)
        client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.ca)
        for ctx in (server, client):
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ctx.load_cert_chain(tls.cert_file, tls.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"JobConfig.tls: cannot load certificate {tls.cert_file!r}, key {tls.key_file!r} "
            f"or CA {tls.ca!r}: {type(exc).__name__}: {exc}; each must be a readable PEM file "
            "on every node, and the key must match the certificate") from None
    server.verify_mode = ssl.CERT_REQUIRED
    client.check_hostname = tls.check_hostname
    client.verify_mode = ssl.CERT_REQUIRED
    return server, client


def _set_nodelay(writer: asyncio.StreamWriter) -> None:
    """Frames are already batched: Nagle's algorithm would only add latency."""
    sock: Any = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
