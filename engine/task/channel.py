"""Channels: ordered input queues, credit accounting and output batching/routing (pure).

* ``InputChannel`` restores the sender's order from per-channel sequence numbers (Ray does
  not order calls of async actors) and queues encoded frames.
* ``CreditGate`` bounds the unacknowledged frames per output channel.
* ``OutputRouter`` partitions records over a task's output edges (forward, rebalance,
  keyed by key group), batches them per channel and emits encoded frames into an outbox.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from typing import Any

import numpy as np

from engine.columnar.batches import ColumnBatch, ColumnKey, as_rows, column_key_groups, stable_order
from engine.dataflow.keygroups import KeyGroupCache
from engine.errors import CodecError, KeyFunctionError, OutputCodecError
from engine.wire.messages import (
    ChannelEvent,
    Frame,
    LatencyMarker,
    OutputChannel,
    OutputEdge,
    encode_frame,
)

# The input port of a re-route channel (old owner -> new owner during a live migration): its
# frames carry each record's original port, and it is no input for watermarks or the end of
# input. A constant of the engine core because the core tells these channels apart.
REROUTE_PORT = -1

# Keyed records split over several channels by numpy from this many records per emit
# (``OutputRouter._split_keyed``); fewer go one by one.
_SPLIT_VECTOR_MIN = 32


class InputChannel:
    """One input channel: a reorder buffer in front of a FIFO of encoded frames.

    Bounded: a sender has at most ``credits`` frames unacknowledged, so no frame it sends
    is ``max_ahead`` or more beyond the next one expected; such a frame (a sender that
    left, a forged one) is refused rather than kept."""

    __slots__ = ("channel_id", "port", "next_seq", "pending", "queue", "ended", "max_ahead")

    def __init__(self, channel_id: int, port: int = 0, max_ahead: int = 1024) -> None:
        self.channel_id = channel_id
        self.port = port
        self.next_seq = 0
        self.pending: dict[int, bytes] = {}
        self.queue: deque[tuple[int, bytes]] = deque()
        self.ended = False
        self.max_ahead = max_ahead

    def offer(self, seq: int, payload: bytes) -> int:
        """Accept frame ``seq``; returns how many frames became ready (in order).
        ``ValueError`` for a frame delivered twice or ``max_ahead`` beyond the next."""
        if seq < self.next_seq or seq in self.pending:
            raise ValueError(f"channel {self.channel_id}: frame {seq} delivered twice")
        if seq - self.next_seq >= self.max_ahead:
            raise ValueError(f"channel {self.channel_id}: frame {seq} is {seq - self.next_seq} "
                             f"ahead of the next expected ({self.next_seq}), more than a "
                             f"sender's credits allow ({self.max_ahead}); refused")
        self.pending[seq] = payload
        ready = 0
        while self.next_seq in self.pending:
            self.queue.append((self.next_seq, self.pending.pop(self.next_seq)))
            self.next_seq += 1
            ready += 1
        return ready

    def __len__(self) -> int:
        return len(self.queue) + len(self.pending)


class CreditGate:
    """At most ``credits`` unacknowledged frames per channel."""

    def __init__(self, credits: int) -> None:
        if credits < 1:
            raise ValueError("credits must be >= 1")
        self.credits = credits
        self._in_flight: dict[int, int] = {}

    def can_send(self, channel_id: int) -> bool:
        return self._in_flight.get(channel_id, 0) < self.credits

    def on_send(self, channel_id: int) -> None:
        n = self._in_flight.get(channel_id, 0)
        if n >= self.credits:
            raise RuntimeError(f"channel {channel_id}: sent without credit")
        self._in_flight[channel_id] = n + 1

    def on_ack(self, channel_id: int) -> None:
        n = self._in_flight.get(channel_id, 0)
        if n <= 0:
            raise RuntimeError(f"channel {channel_id}: acknowledgement without a frame in flight")
        self._in_flight[channel_id] = n - 1

    def in_flight(self, channel_id: int) -> int:
        return self._in_flight.get(channel_id, 0)

    def total_in_flight(self) -> int:
        return sum(self._in_flight.values())


@dataclass(frozen=True, slots=True)
class OutFrame:
    """An encoded frame ready to push: ``target`` task name, channel and sequence number."""

    channel_id: int
    target: str
    seq: int
    payload: bytes
    records: int


class _ChannelBuffer:
    """Records waiting for one channel's next frame: rows (``values`` ...) or column
    batches (``cols``: (batch, timestamps, key groups), ``ncols`` records), never both at
    once (switching kind flushes what is there first, which keeps the order)."""

    __slots__ = ("channel", "seq", "values", "timestamps", "keys", "kgs", "ports", "since",
                 "cols", "ncols", "key_column")

    def __init__(self, channel: OutputChannel, seq: int, keyed: bool, ports: bool = False,
                 key_column: str | None = None) -> None:
        self.channel = channel
        self.seq = seq
        self.values: list[Any] = []
        self.timestamps: list[int] = []
        self.keys: list[Any] | None = [] if keyed else None
        self.kgs: list[int] | None = [] if keyed else None
        self.ports: list[int] | None = [] if ports else None
        self.since = 0.0
        self.cols: list[tuple[ColumnBatch, np.ndarray, np.ndarray | None]] = []
        self.ncols = 0
        self.key_column = key_column


def _output_codec_error(frame: Frame, exc: CodecError) -> OutputCodecError:
    """The frame (of rows) did not encode: find the first record (value or key) that does
    not."""
    assert isinstance(frame.values, list | tuple), "column frames encode with Arrow"
    for i, value in enumerate(frame.values):
        key = None if frame.keys is None else frame.keys[i]
        try:
            encode_frame(Frame([value], [0], None if key is None else [key],
                               None if frame.key_groups is None else [0], None, None))
        except CodecError as one:
            return OutputCodecError(f"an output record cannot be sent to the next task: {one}",
                                    value)
    return OutputCodecError(f"an output frame cannot be sent to the next task: {exc}")


class OutputRouter:
    """Partitions, batches and encodes a task's output.

    ``key_fns`` gives the key function of every keyed edge (by edge id). Frames go to
    ``outbox`` in per-channel order; ``now()`` (monotonic seconds) timestamps buffers for
    the linger deadline.
    """

    def __init__(
        self,
        batch_size: int,
        linger_s: float,
        num_key_groups: int,
        key_fns: dict[int, Callable[[Any], Any]],
        now: Callable[[], float],
    ) -> None:
        self.batch_size = batch_size
        self.linger_s = linger_s
        self.key_fns = key_fns
        self.now = now
        self.cache = KeyGroupCache(num_key_groups)
        self.edges: list[OutputEdge] = []
        self._buffers: dict[int, list[_ChannelBuffer]] = {}
        self._rr: dict[int, int] = {}
        self.outbox: deque[OutFrame] = deque()
        self._reroute: dict[int, _ChannelBuffer] = {}
        self.rerouted = 0
        self.rerouted_by: dict[int, int] = {}  # per re-route channel
        self.records_out = 0
        self.bytes_out = 0
        self._dirty: set[_ChannelBuffer] = set()
        self._col_buffers = 0  # buffers holding column batches
        # per keyed edge: its routing tuple and the same as an array (_split_keyed)
        self._routing_arrays: dict[int, tuple[tuple[int, ...], np.ndarray]] = {}

    def connect(self, edges: Sequence[OutputEdge]) -> None:
        """Use these edges from now on; channels kept by id keep their sequence numbers.

        Buffered records must have been flushed before (the task is drained)."""
        old = {b.channel.channel_id: b for bufs in self._buffers.values() for b in bufs}
        if any(b.values or b.ncols for b in old.values()):
            raise RuntimeError("reconnecting outputs with unflushed records")
        self.edges = list(edges)
        self._buffers = {
            e.edge_id: [
                _ChannelBuffer(c, old[c.channel_id].seq if c.channel_id in old else 0,
                               e.partitioning == "keyed", key_column=self._key_column(e))
                for c in e.channels
            ]
            for e in self.edges
        }
        self._dirty = set()
        self._col_buffers = 0
        self._rr = {}

    def _key_column(self, e: OutputEdge) -> str | None:
        fn = self.key_fns.get(e.edge_id) if e.partitioning == "keyed" else None
        return fn.column if isinstance(fn, ColumnKey) else None

    def _edge_index(self, edge_id: int) -> int:
        for i, e in enumerate(self.edges):
            if e.edge_id == edge_id:
                return i
        raise KeyError(f"no output edge {edge_id}")

    def update_routing(self, edge_id: int, routing: Sequence[int]) -> None:
        i = self._edge_index(edge_id)
        e = self.edges[i]
        self.edges[i] = OutputEdge(e.edge_id, e.partitioning, e.channels, tuple(routing))

    # -- live changes (DRRS)
    def add_channels(self, edge_id: int, channels: Sequence[OutputChannel]) -> None:
        """Append channels to a live edge; existing routing indices keep their meaning."""
        i = self._edge_index(edge_id)
        e = self.edges[i]
        self.edges[i] = OutputEdge(e.edge_id, e.partitioning, (*e.channels, *channels), e.routing)
        self._buffers[edge_id].extend(
            _ChannelBuffer(c, 0, e.partitioning == "keyed", key_column=self._key_column(e))
            for c in channels)

    def remove_channels(self, channel_ids: set[int]) -> None:
        """Drop trailing channels of live edges; nothing may route to them any more."""
        for i, e in enumerate(self.edges):
            keep = [c for c in e.channels if c.channel_id not in channel_ids]
            if len(keep) == len(e.channels):
                continue
            if [c.channel_id for c in e.channels[:len(keep)]] != [c.channel_id for c in keep]:
                raise ValueError("only the last channels of an edge can be removed")
            if e.partitioning == "keyed" and any(r >= len(keep) for r in e.routing):
                raise ValueError("routing still points at a channel being removed")
            for b in self._buffers[e.edge_id][len(keep):]:
                self._flush(b)
            self._buffers[e.edge_id] = self._buffers[e.edge_id][:len(keep)]
            self.edges[i] = OutputEdge(e.edge_id, e.partitioning, tuple(keep), e.routing)
            self._rr.pop(e.edge_id, None)
            self._rr.pop(-1 - e.edge_id, None)

    def replace_channel(self, retired: int, replacement: int) -> None:
        """Channel ``replacement`` (the last of its edge) takes ``retired``'s index: the
        routing to it follows, ``retired`` is dropped (nothing may route to it any more)."""
        for i, e in enumerate(self.edges):
            ids = [c.channel_id for c in e.channels]
            if retired not in ids and replacement not in ids:
                continue
            if retired not in ids or replacement not in ids:
                raise ValueError(f"channels {retired} and {replacement} are not on one edge")
            a, b = ids.index(retired), ids.index(replacement)
            if b != len(ids) - 1:
                raise ValueError("only the last channel of an edge can replace another")
            keyed = e.partitioning == "keyed"
            if keyed and any(r == a for r in e.routing):
                raise ValueError("routing still points at the channel being retired")
            bufs = self._buffers[e.edge_id]
            self._flush(bufs[a])
            self._dirty.discard(bufs[a])
            bufs[a] = bufs.pop()
            chans = list(e.channels)
            chans[a] = chans.pop()
            routing = tuple(a if r == b else r for r in e.routing) if keyed else e.routing
            self.edges[i] = OutputEdge(e.edge_id, e.partitioning, tuple(chans), routing)
            self._rr.pop(e.edge_id, None)
            self._rr.pop(-1 - e.edge_id, None)
            return
        raise ValueError(f"no output edge has channels {retired} and {replacement}")

    def redirect(self, edge_id: int, key_groups: Sequence[int], new_index: int) -> list[OutputChannel]:
        """Route ``key_groups`` of a keyed edge to channel ``new_index`` from now on; their
        records not yet sent move, in order, to that channel's buffer. Returns the channels
        that owned them before (each needs a confirm barrier)."""
        i = self._edge_index(edge_id)
        e = self.edges[i]
        if e.partitioning != "keyed":
            raise ValueError(f"edge {edge_id} is not keyed")
        moving = set(key_groups)
        routing = list(e.routing)
        old = sorted({routing[kg] for kg in moving if routing[kg] != new_index})
        for kg in moving:
            routing[kg] = new_index
        self.edges[i] = OutputEdge(e.edge_id, e.partitioning, e.channels, tuple(routing))
        bufs = self._buffers[edge_id]
        for b in bufs:  # moving single records: column batches waiting become rows
            self._cols_to_rows(b)
        dst = bufs[new_index]
        assert dst.keys is not None and dst.kgs is not None  # a keyed edge's buffer
        for oi in old:
            b = bufs[oi]
            if not b.values:
                continue
            keys, kgs = b.keys, b.kgs
            assert keys is not None and kgs is not None
            stay = [j for j, kg in enumerate(kgs) if kg not in moving]
            move = [j for j, kg in enumerate(kgs) if kg in moving]
            if not move:
                continue
            if not dst.values:
                dst.since = b.since
                self._dirty.add(dst)
            for j in move:
                dst.values.append(b.values[j])
                dst.timestamps.append(b.timestamps[j])
                dst.keys.append(keys[j])
                dst.kgs.append(kgs[j])
            b.values = [b.values[j] for j in stay]
            b.timestamps = [b.timestamps[j] for j in stay]
            b.keys = [keys[j] for j in stay]
            b.kgs = [kgs[j] for j in stay]
            if not b.values:
                self._dirty.discard(b)
        return [e.channels[oi] for oi in old]

    def open_reroute(self, channel: OutputChannel) -> None:
        if channel.channel_id not in self._reroute:
            self._reroute[channel.channel_id] = _ChannelBuffer(channel, 0, True, ports=True)

    def reroute(self, channel_id: int, value: Any, timestamp: int, key: Any, kg: int, port: int) -> None:
        b = self._reroute[channel_id]
        if not b.values:
            b.since = self.now()
            self._dirty.add(b)
        b.values.append(value)
        b.timestamps.append(timestamp)
        b.keys.append(key)  # type: ignore[union-attr]
        b.kgs.append(kg)  # type: ignore[union-attr]
        b.ports.append(port)  # type: ignore[union-attr]
        self.rerouted += 1
        self.rerouted_by[channel_id] = self.rerouted_by.get(channel_id, 0) + 1
        if len(b.values) >= self.batch_size:
            self._flush(b)

    def reroute_event(self, channel_id: int, event: ChannelEvent) -> None:
        self._flush(self._reroute[channel_id], event)

    def close_reroute(self, channel_id: int) -> None:
        b = self._reroute.pop(channel_id)
        self._flush(b)

    # -- records
    def emit(self, values: Sequence[Any] | ColumnBatch, timestamps: Any) -> None:
        """Route records (rows, or a ``ColumnBatch`` with its timestamps as a numpy array)
        to every output edge."""
        if not len(values):
            return
        if isinstance(values, ColumnBatch):
            self._emit_columns(values, np.asarray(timestamps, dtype=np.int64))
            return
        if self._col_buffers:  # rows must not overtake column batches waiting
            self._flush_cols_all()
        for edge in self.edges:
            bufs = self._buffers[edge.edge_id]
            if edge.partitioning == "keyed":
                self._emit_keyed(edge, bufs, values, timestamps)
            else:
                buf = self._unkeyed_buffer(edge, bufs)
                if not buf.values:
                    buf.since = self.now()
                    self._dirty.add(buf)
                buf.values.extend(values)
                buf.timestamps.extend(timestamps)
                if len(buf.values) >= self.batch_size:
                    self._flush(buf)

    def _unkeyed_buffer(self, edge: OutputEdge, bufs: list[_ChannelBuffer]) -> _ChannelBuffer:
        """The buffer a forward edge's records go to, or a rebalance edge's next (round
        robin per emitted batch)."""
        if edge.partitioning == "forward" or len(bufs) == 1:
            return bufs[0]
        i = self._rr.get(edge.edge_id, 0) % len(bufs)
        self._rr[edge.edge_id] = (i + 1) % len(bufs)
        return bufs[i]

    def _emit_columns(self, batch: ColumnBatch, ts: np.ndarray) -> None:
        if self._row_buffers():  # column batches must not overtake rows waiting
            for bufs in self._buffers.values():
                for b in bufs:
                    if b.values:
                        self._flush(b)
        for edge in self.edges:
            bufs = self._buffers[edge.edge_id]
            if edge.partitioning != "keyed":
                self._append_cols(self._unkeyed_buffer(edge, bufs), batch, ts, None)
                continue
            key_fn = self.key_fns[edge.edge_id]
            if not isinstance(key_fn, ColumnKey):  # a key function of rows: rows it is
                rows, stamps = as_rows(batch, ts)
                self._emit_keyed(edge, bufs, rows, stamps)
                continue
            try:
                kgs = column_key_groups(key_fn.keys_of(batch), self.cache.num_key_groups)
            except Exception as exc:
                raise KeyFunctionError(batch.rows()[0], exc) from exc
            if len(bufs) == 1:
                self._append_cols(bufs[0], batch, ts, kgs)
                continue
            targets = np.asarray(edge.routing, dtype=np.int32)[kgs]
            order = stable_order(targets, len(bufs))
            counts = np.bincount(targets, minlength=len(bufs))
            taken = batch.take(order)
            ts_o, kgs_o = ts[order], kgs[order]
            start = 0
            for ci in np.flatnonzero(counts).tolist():
                end = start + int(counts[ci])
                self._append_cols(bufs[ci], taken.slice(start, end), ts_o[start:end],
                                  kgs_o[start:end])
                start = end

    def _append_cols(self, buf: _ChannelBuffer, batch: ColumnBatch, ts: np.ndarray,
                     kgs: np.ndarray | None) -> None:
        if buf.values:
            self._flush(buf)
        if not buf.ncols:
            if buf not in self._dirty:
                buf.since = self.now()
                self._dirty.add(buf)
            self._col_buffers += 1
        buf.cols.append((batch, ts, kgs))
        buf.ncols += len(batch)
        if buf.ncols >= self.batch_size:
            self._flush(buf)

    def _row_buffers(self) -> bool:
        return any(b.values for b in self._dirty)

    def _flush_cols_all(self) -> None:
        for b in list(self._dirty):
            if b.ncols:
                self._flush(b)

    def _cols_to_rows(self, buf: _ChannelBuffer) -> None:
        """Turn the column batches waiting in ``buf`` into rows (for per-record moves)."""
        if not buf.ncols:
            return
        batch, ts, kgs = self._take_cols(buf)
        rows, stamps = as_rows(batch, ts)
        buf.values, buf.timestamps = rows, stamps
        if buf.kgs is not None:
            buf.kgs = kgs.tolist() if kgs is not None else []
            key = buf.key_column
            buf.keys = [r[key] for r in rows] if key is not None else []

    def _take_cols(self, buf: _ChannelBuffer
                   ) -> tuple[ColumnBatch, np.ndarray, np.ndarray | None]:
        cols = buf.cols
        batch = ColumnBatch.concat([c[0] for c in cols])
        ts = cols[0][1] if len(cols) == 1 else np.concatenate([c[1] for c in cols])
        kgs = None if cols[0][2] is None else (
            cols[0][2] if len(cols) == 1 else np.concatenate([c[2] for c in cols]))
        buf.cols, buf.ncols = [], 0
        self._col_buffers -= 1
        return batch, ts, kgs

    def _flush_cols(self, buf: _ChannelBuffer, event: ChannelEvent | None) -> None:
        batch, ts, kgs = self._take_cols(buf)
        n, size = len(batch), self.batch_size
        for start in range(0, n, size):
            end = min(n, start + size)
            whole = start == 0 and end == n
            frame = Frame(batch if whole else batch.slice(start, end),
                          ts if whole else ts[start:end], buf.key_column,
                          None if kgs is None else (kgs if whole else kgs[start:end]),
                          event if end >= n else None)
            try:
                payload = encode_frame(frame)
            except Exception as exc:
                raise OutputCodecError(f"an output batch cannot be sent to the next task as "
                                       f"columns: {type(exc).__name__}: {exc}") from exc
            self.outbox.append(OutFrame(buf.channel.channel_id, buf.channel.target, buf.seq,
                                        payload, end - start))
            buf.seq += 1
            self.bytes_out += len(payload)
        self.records_out += n
        self._dirty.discard(buf)

    def _emit_keyed(
        self, edge: OutputEdge, bufs: list[_ChannelBuffer], values: Sequence[Any],
        timestamps: Sequence[int],
    ) -> None:
        key_fn = self.key_fns[edge.edge_id]
        try:
            keys = list(map(key_fn, values))
            kgs = self.cache.key_groups(keys)
        except Exception:
            for v in values:  # find the record, for the error report
                try:
                    self.cache.key_groups([key_fn(v)])
                except Exception as exc:
                    raise KeyFunctionError(v, exc) from exc
            raise
        now = None
        if len(bufs) == 1:
            touched = [bufs[0]]
            b = bufs[0]
            b.values.extend(values)
            b.timestamps.extend(timestamps)
            b.keys.extend(keys)  # type: ignore[union-attr]
            b.kgs.extend(kgs)  # type: ignore[union-attr]
        else:
            touched = self._split_keyed(edge, bufs, values, timestamps, keys, kgs)
        for b in touched:
            if b not in self._dirty:
                if now is None:
                    now = self.now()
                b.since = now
                self._dirty.add(b)
            if len(b.values) >= self.batch_size:
                self._flush_whole_frames(b)

    def _split_keyed(self, edge: OutputEdge, bufs: list[_ChannelBuffer], values: Sequence[Any],
                     timestamps: Sequence[int], keys: list[Any], kgs: list[int],
                     ) -> list[_ChannelBuffer]:
        """Append each record to its channel's buffer (order kept per channel); returns the
        buffers that got records.

        Why not a loop appending each record: four appends per record were 0.1 µs of the
        source task's CPU per record at p = 2 (issue 32, item 9); here the records' channels
        are sorted stably once (numpy) and each list is gathered in one C-level call
        (``itemgetter``) and sliced per channel."""
        n = len(values)
        if len(timestamps) != n:
            raise ValueError(f"{n} records with {len(timestamps)} timestamps")
        routing = edge.routing
        if n < _SPLIT_VECTOR_MIN:  # numpy's fixed costs exceed a few appends
            hit: dict[int, _ChannelBuffer] = {}
            for v, ts, k, kg in zip(values, timestamps, keys, kgs):  # noqa: B905 - checked
                ci = routing[kg]
                b = bufs[ci]
                b.values.append(v)
                b.timestamps.append(ts)
                b.keys.append(k)  # type: ignore[union-attr]
                b.kgs.append(kg)  # type: ignore[union-attr]
                hit[ci] = b
            return list(hit.values())
        cached = self._routing_arrays.get(edge.edge_id)
        if cached is None or cached[0] is not routing:
            cached = self._routing_arrays[edge.edge_id] = (
                routing, np.asarray(routing, dtype=np.intp))
        groups = np.fromiter(kgs, np.intp, n)
        targets = cached[1][groups]
        counts = np.bincount(targets, minlength=len(bufs)).tolist()
        order = np.argsort(targets, kind="stable")
        pick = itemgetter(*order.tolist())
        vals, ks, gs = pick(values), pick(keys), groups[order].tolist()
        first = timestamps[0]
        # a source's batch has one timestamp for all: repeated, not gathered
        one_ts = type(timestamps) in (list, tuple) and timestamps.count(first) == n
        stamps = None if one_ts else pick(timestamps)
        touched = []
        start = 0
        for ci, c in enumerate(counts):
            if not c:
                continue
            end = start + c
            b = bufs[ci]
            b.values.extend(vals[start:end])
            b.timestamps.extend(repeat(first, c) if stamps is None else stamps[start:end])
            b.keys.extend(ks[start:end])  # type: ignore[union-attr]
            b.kgs.extend(gs[start:end])  # type: ignore[union-attr]
            touched.append(b)
            start = end
        return touched

    def _flush_whole_frames(self, buf: _ChannelBuffer) -> None:
        """Send the records of ``buf`` that fill whole frames; keep the rest for the next.

        Flushing everything would send a short frame after each full one: with records
        spread over p channels each buffer crosses ``batch_size`` by a fraction of a batch,
        so p = 2 sent about half again as many frames as needed (issue 32, item 9). The
        records kept all arrived in this emit (the buffer held fewer than ``batch_size``
        before it), so they start their linger now."""
        n = len(buf.values)
        keep = n % self.batch_size
        if not keep:
            self._flush(buf)
            return
        cut = n - keep
        assert buf.keys is not None and buf.kgs is not None and buf.ports is None
        rest = (buf.values[cut:], buf.timestamps[cut:], buf.keys[cut:], buf.kgs[cut:])
        del buf.values[cut:], buf.timestamps[cut:], buf.keys[cut:], buf.kgs[cut:]
        self._flush(buf)
        buf.values, buf.timestamps, buf.keys, buf.kgs = rest  # new lists (slices)
        buf.since = self.now()
        self._dirty.add(buf)

    def _flush(self, buf: _ChannelBuffer, event: ChannelEvent | None = None) -> None:
        """Send the buffer as frames of at most ``batch_size`` records, ``event`` last."""
        if buf.ncols:
            self._flush_cols(buf, event)
            return
        n = len(buf.values)
        if n == 0 and event is None:
            return
        size = self.batch_size
        for start in range(0, max(n, 1), size):
            end = min(n, start + size)
            last = end >= n
            keys = None if buf.keys is None else buf.keys[start:end]
            kgs = None if buf.kgs is None else buf.kgs[start:end]
            ports = None if buf.ports is None else buf.ports[start:end]
            frame = (Frame(buf.values, buf.timestamps, buf.keys, buf.kgs, event, buf.ports)
                     if n <= size else
                     Frame(buf.values[start:end], buf.timestamps[start:end], keys, kgs,
                           event if last else None, ports))
            try:
                payload = encode_frame(frame)
            except CodecError as exc:
                raise _output_codec_error(frame, exc) from exc
            self.outbox.append(OutFrame(buf.channel.channel_id, buf.channel.target, buf.seq,
                                        payload, end - start))
            buf.seq += 1
            self.bytes_out += len(payload)
        self.records_out += n
        buf.values = []
        buf.timestamps = []
        if buf.keys is not None:
            buf.keys = []
            buf.kgs = []
        if buf.ports is not None:
            buf.ports = []
        self._dirty.discard(buf)

    def flush_due(self) -> None:
        """Flush every channel whose oldest record waited ``linger_s`` or longer."""
        if not self._dirty:
            return
        deadline = self.now() - self.linger_s
        for b in [b for b in self._dirty if b.since <= deadline]:
            self._flush(b)

    def next_deadline(self) -> float | None:
        if not self._dirty:
            return None
        return min(b.since for b in self._dirty) + self.linger_s

    def flush_all(self) -> None:
        for b in list(self._dirty):
            self._flush(b)

    # -- events
    def broadcast(self, event: ChannelEvent) -> None:
        """Flush every channel, then send ``event`` on each."""
        for bufs in self._buffers.values():
            for b in bufs:
                self._flush(b, event)

    def send_event_to(self, channel_ids: set[int], event: ChannelEvent) -> None:
        """Flush the given channels, then send ``event`` on each of them only."""
        for bufs in self._buffers.values():
            for b in bufs:
                if b.channel.channel_id in channel_ids:
                    self._flush(b, event)

    def channel_ids(self) -> set[int]:
        return {b.channel.channel_id for bufs in self._buffers.values() for b in bufs}

    def send_marker(self, marker: LatencyMarker) -> None:
        """A latency marker goes to one channel per edge, round robin, behind its records."""
        for edge in self.edges:
            bufs = self._buffers[edge.edge_id]
            i = self._rr.get(-1 - edge.edge_id, 0) % len(bufs)
            self._rr[-1 - edge.edge_id] = (i + 1) % len(bufs)
            self._flush(bufs[i], marker)

    def buffered_records(self) -> int:
        return sum(len(b.values) + b.ncols for b in self._dirty)
