"""Spark -> reflow: the bridge actor, its Spark-side client and the reflow ``SparkSource``.

One **bridge actor** per ``SparkSource`` (a Ray async actor named ``spark-bridge/<name>`` in
namespace ``reflow``, created on the driver, ``num_cpus=0``) holds one bounded **lane** of
Arrow IPC chunks per partition of the source (a source task reads the lanes of its
partitions):

* **Spark side** (``BridgeClient.push``: the driver in ``foreachBatch``, or an executor in
  the ``"reflow"`` Data Source stream writer) re-cuts a partition's rows into chunks of
  ``chunk_rows`` rows, conforms each to the declared schema (bad rows go to the dead-letter
  directory and are counted), and puts the chunks, numbered per (stream, Spark batch id,
  partition). ``put`` awaits room in a lane (backpressure); afterwards the client awaits
  ``drained``: the call, and so the Spark batch, completes only once reflow's source tasks
  have taken every chunk of it.
* **Dedupe**: a stream is one Spark query (its id survives restarts from a checkpoint).
  Chunk k of (batch b, partition p) is accepted once; a replay of it is acknowledged and
  dropped. Spark plans batch b+1 only after committing b, so a put for a newer batch
  retires the older ones: any put for a batch below the newest seen is a replay and
  dropped. A replay must give the same rows in the same order per partition (Spark's
  replayable sources do, for plans without a shuffle before the bridge); a batch taken
  whole is dropped whole whatever its order.
* **reflow side**: each lane's reader keeps one ``get`` outstanding and checks its future
  in ``poll()``, so it never blocks the task's event loop. Records are tuples of the
  declared columns (the bare value for one column); timestamps are the
  ``timestamp_column`` (ms) or the time the chunk was handed to the bridge. A lane keeps
  a chunk until its reader has emitted it (the reader says so in its next ``get``) or, in
  a job that checkpoints, until a complete checkpoint covers it (a recovery reopens the
  lane at that checkpoint's state while the Spark query goes on), so a lane moved to
  another task by a source rescale or a restore is read on exactly from the resume state
  ``{seq, rows, batch, taken}``: the lane position of the last chunk emitted, the rows
  emitted of the next, the newest Spark batch id emitted and, per Spark (batch,
  partition, chunk) of the newest batch, the rows emitted.
* **Resume across a restore onto a new bridge** (the driver and the Spark query restarted
  too): a lane nobody read yet continues its first reader's numbering, and the ``taken``
  of every lane's resume state tells the bridge which chunks of the replayed micro-batch
  reflow had emitted (dropped as duplicates) or emitted in part (the rest is delivered).
  Puts wait until every lane has had its reader, so no replayed chunk slips in before the
  states are known. Rows of micro-batches Spark committed (it commits one once reflow's
  readers took all of it) and reflow emitted only after the checkpoint it restores from
  are not replayed by Spark: in a job that checkpoints every chunk is in the **spool**
  (``engine.spark.spool``) before a reader can take it, until a complete checkpoint covers
  it, and the new bridge of a restored job loads the spool into its lanes with their lane
  numbering (a replay of a spooled chunk is a duplicate). A restore onto a bridge that
  already dropped chunks after a resume state fails the reader saying so, rather than
  skip them.

Everything crossing the actor boundary is bytes, ints and strings; values are msgpack
(``engine.wire.codec``) and row data Arrow IPC. Nothing is unpickled from user-supplied bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Iterable
from typing import Any

from engine.errors import BridgeError, SparkQueryFailed
from engine.io.sources import (
    Source,
    SourceBatch,
    SourceReader,
    indexed_partitions,
    parse_indexed,
)
from engine.spark.schema import ColumnSchema, parse_schema
from engine.spark.spool import ChunkSpool
from engine.time.clock import Clock
from engine.wire.codec import pack_exact, unpack_exact

NAMESPACE = "reflow"
log = logging.getLogger(__name__)


# ====================================================================== the actor


class _Stream:
    __slots__ = ("newest", "accepted", "ingested", "partial")

    def __init__(self) -> None:
        self.newest = -1  # newest Spark batch id seen
        self.accepted: dict[tuple[int, int], int] = {}  # (batch, partition) -> chunks taken
        # from resume states (a restore onto a new bridge): chunks of the newest batch that
        # reflow had emitted whole, and rows it had emitted of others
        self.ingested: set[tuple[int, int, int]] = set()  # (batch, partition, chunk)
        self.partial: dict[tuple[int, int, int], int] = {}


class _Lane:
    """One partition of the source: chunks in lane order, kept until emitted.

    Entries are ``[seq, stream, batch, part, chunk, rows, skip, put_ms, ipc, handed]``;
    ``seq`` numbers a lane's chunks 1, 2, ...; every chunk with ``seq <= trimmed`` was
    emitted by reflow and is gone; ``sent`` is the newest seq handed to a reader (the
    chunks after it count against the lane's room)."""

    __slots__ = ("chunks", "next_seq", "trimmed", "sent", "read", "spooled")

    def __init__(self) -> None:
        self.chunks: deque[list[Any]] = deque()
        self.next_seq = 1
        self.trimmed = 0
        self.sent = 0
        self.read = False  # a reader has asked for it (it may adopt a resume state's seq)
        self.spooled = False  # its chunks were loaded from the spool: their seqs are kept

    def waiting(self) -> int:
        return sum(1 for c in self.chunks if c[0] > self.sent)


class BridgeActor:
    """The bounded, deduplicating hand-over point between Spark and reflow's source tasks:
    one lane per partition of the ``SparkSource``."""

    def __init__(self, config: bytes) -> None:
        cfg = unpack_exact(config)
        self.cfg = cfg
        self.queue_chunks: int = cfg["queue_chunks"]
        self.lanes: list[_Lane] = []
        self.next_lane = 0
        self.streams: dict[str, _Stream] = {}
        self.outstanding: dict[tuple[str, int, int], int] = {}
        self.ended = False
        self.failed: str | None = None
        self.cond: asyncio.Condition | None = None
        # the spool (engine.spark.spool): on when the job checkpoints (its readers say so)
        self.spool = ChunkSpool(cfg["spool_dir"]) if cfg.get("spool_dir") else None
        self.spooling = False
        self.stats = {"rows_in": 0, "chunks_in": 0, "rows_taken": 0, "dead_letters": 0,
                      "duplicate_chunks": 0, "duplicate_rows": 0, "batches": 0,
                      "readers": 0, "last_batch_id": -1, "chunks_taken": 0,
                      "wait_ms_sum": 0, "wait_ms_max": 0, "spool_chunks_loaded": 0}

    def _cond(self) -> asyncio.Condition:
        if self.cond is None:
            self.cond = asyncio.Condition()
        return self.cond

    def config(self) -> bytes:
        return pack_exact(self.cfg)

    def _check(self) -> None:
        if self.failed is not None:
            raise BridgeError(self.failed)

    def _connected(self) -> bool:
        """Every lane has had its reader (so every resume state is known)."""
        return bool(self.lanes) and all(lane.read for lane in self.lanes)

    async def put(self, stream: str, batch: int, part: int, seq: int, rows: int, bad: int,
                  put_ms: int, ipc: bytes) -> str:
        """Chunk ``seq`` of (stream, batch, partition): 'ok' once queued, 'dup' if it was
        taken before (a replay). Waits for every lane's reader, for room in a lane and for
        the chunk before it."""
        cond = self._cond()
        deadline = time.monotonic() + self.cfg["connect_timeout_s"]
        async with cond:
            while True:
                self._check()
                st = self.streams.setdefault(stream, _Stream())
                if batch < st.newest:
                    return self._dup(rows)
                if batch > st.newest:
                    self.stats["batches"] += 1
                    st.newest = batch
                    st.accepted = {}  # Spark committed every older batch of the stream
                    st.ingested = {k for k in st.ingested if k[0] == batch}
                    st.partial = {k: v for k, v in st.partial.items() if k[0] == batch}
                taken = st.accepted.get((batch, part), 0)
                if seq < taken:
                    return self._dup(rows)
                if self.ended:
                    raise BridgeError(f"bridge {self.cfg['name']}: input was ended; "
                                      f"no more data is taken")
                if seq == taken and (batch, part, seq) in st.ingested:
                    st.accepted[(batch, part)] = taken + 1  # reflow had it before a restore
                    cond.notify_all()
                    return self._dup(rows)
                if not self._connected():
                    if time.monotonic() > deadline:
                        raise BridgeError(
                            f"bridge {self.cfg['name']}: not every reflow source task connected "
                            f"within {self.cfg['connect_timeout_s']} s; is the reflow job "
                            "running?")
                elif seq == taken and (rows == 0 or self._room() is not None):
                    break
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(cond.wait(), 1.0)
            if rows:
                index = self._room()
                assert index is not None
                lane = self.lanes[index]
                skip = st.partial.get((batch, part, seq), 0)
                entry = [lane.next_seq, stream, batch, part, seq, rows, skip, put_ms, ipc]
                if self.spooling:  # durable before a reader can have it (or Spark commits)
                    assert self.spool is not None
                    try:
                        self.spool.write(index, len(self.lanes), entry)
                    except OSError as exc:
                        raise BridgeError(f"bridge {self.cfg['name']}: cannot write chunk to "
                                          f"the spool {self.spool.directory!r}: {exc}; give "
                                          "the SparkSource a writable spool_dir") from None
                st.partial.pop((batch, part, seq), None)
                lane.chunks.append([*entry, False])
                lane.next_seq += 1
                key = (stream, batch, part)
                self.outstanding[key] = self.outstanding.get(key, 0) + 1
                self.stats["rows_in"] += rows
            st.accepted[(batch, part)] = taken + 1
            self.stats["dead_letters"] += bad
            self.stats["chunks_in"] += 1
            self.stats["last_batch_id"] = max(self.stats["last_batch_id"], batch)
            cond.notify_all()
            return "ok"

    def _dup(self, rows: int) -> str:
        self.stats["duplicate_chunks"] += 1
        self.stats["duplicate_rows"] += rows
        return "dup"

    def _room(self) -> int | None:
        """The lane with the most room (ties: round robin), or None when all are full."""
        best, best_len = None, self.queue_chunks
        n = len(self.lanes)
        for k in range(n):
            i = (self.next_lane + k) % n
            waiting = self.lanes[i].waiting()
            if waiting < best_len:
                best, best_len = i, waiting
        if best is not None:
            self.next_lane = (best + 1) % n
        return best

    async def drained(self, stream: str, batch: int, part: int) -> None:
        """Returns once every chunk put for (stream, batch, partition) was taken by reflow."""
        cond = self._cond()
        async with cond:
            while self.outstanding.get((stream, batch, part), 0) > 0:
                self._check()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(cond.wait(), 1.0)

    def _adopt(self, lane: _Lane, after: int, taken: Any) -> None:
        """A lane's first reader: a lane nobody read yet continues the numbering of the
        reader's resume state (a restore onto a new bridge), and that state's record of
        what reflow had emitted of the newest Spark batches is where dedupe starts."""
        lane.read = True
        self.stats["readers"] += 1
        if after > lane.trimmed and not lane.spooled:
            shift = after - lane.trimmed
            for c in lane.chunks:
                c[0] += shift
            lane.next_seq += shift
            lane.trimmed = after
            lane.sent = max(lane.sent + shift, after)
        for stream, batch, part, chunk, done, rows in taken or ():
            st = self._newest(stream, batch)
            if st is None:
                continue
            if done >= rows:
                st.ingested.add((batch, part, chunk))
            elif done > 0:
                st.partial[(batch, part, chunk)] = done

    def _newest(self, stream: str, batch: int) -> _Stream | None:
        """The stream's dedupe state after seeing Spark batch ``batch`` outside a put (a
        resume state, the spool); None when ``batch`` is older than its newest."""
        st = self.streams.setdefault(stream, _Stream())
        if batch < st.newest:
            return None
        if batch > st.newest:
            st.newest, st.accepted = batch, {}
            st.ingested = {k for k in st.ingested if k[0] == batch}
            st.partial = {k: v for k, v in st.partial.items() if k[0] == batch}
        return st

    def _open_lanes(self, lanes: int, resumed: bool, spool: bool) -> None:
        """The first reader connected: make the lanes. In a job that checkpoints
        (``spool``) the spool is on; a restore (``resumed``) reloads it (what Spark
        committed after the restored checkpoint), a fresh start clears it."""
        self.lanes = [_Lane() for _ in range(lanes)]
        self.spooling = self.spool is not None and spool
        if not self.spooling:
            return
        assert self.spool is not None
        if not resumed:
            self.spool.clear()
            return
        for i, lane in enumerate(self.lanes):
            for seq, stream, batch, part, chunk, rows, skip, put_ms, ipc in self.spool.load(
                    i, lanes):
                if lane.chunks and seq != lane.next_seq:
                    raise BridgeError(f"bridge {self.cfg['name']}: the spool "
                                      f"{self.spool.directory!r} misses chunks of lane {i} "
                                      f"before {seq}; it was changed by hand")
                if not lane.chunks:
                    lane.trimmed = lane.sent = seq - 1
                lane.chunks.append([seq, stream, batch, part, chunk, rows, skip, put_ms, ipc,
                                    False])
                lane.next_seq = seq + 1
                lane.spooled = True
                st = self._newest(stream, batch)
                if st is not None:  # a replay of it is a duplicate
                    st.accepted[(batch, part)] = max(st.accepted.get((batch, part), 0),
                                                     chunk + 1)
                self.stats["spool_chunks_loaded"] += 1

    async def get(self, lane_index: int, lanes: int, after: int, consumed: int,
                  max_chunks: int, taken: Any = None, resumed: bool = False,
                  spool: bool = False) -> bytes:
        """Chunks of lane ``lane_index`` (of ``lanes``) after lane seq ``after``, once the
        reader has emitted every chunk up to ``consumed`` (those go):
        ``["data", [[seq, stream, batch, part, chunk, rows, skip, put_ms, ipc], ...]]``,
        ``["end"]`` once input ended and nothing is left after ``after``, ``["failed",
        msg]``, or ``["gone", msg]`` when chunks after ``after`` were dropped already.
        Chunks stay in the lane until emitted, so a lane moved to another reader (a source
        rescale) is read on from where its last reader's resume state says. ``resumed``:
        the reader starts from a resume state; ``spool``: the job checkpoints (the first
        reader's say decides, see ``_open_lanes``)."""
        cond = self._cond()
        async with cond:
            if not self.lanes:
                try:
                    self._open_lanes(lanes, resumed, spool)
                except (OSError, ValueError) as exc:
                    return pack_exact(["failed", f"bridge {self.cfg['name']}: cannot read "
                                                 f"its spool: {exc}"])
                except BridgeError as exc:
                    return pack_exact(["failed", str(exc)])
                cond.notify_all()
            elif lanes != len(self.lanes) or not 0 <= lane_index < lanes:
                return pack_exact(["failed", (
                    f"bridge {self.cfg['name']} serves {len(self.lanes)} partitions; a reader of "
                    f"partition {lane_index} of {lanes} connected (one bridge feeds one source)")])
            lane = self.lanes[lane_index]
            if not lane.read:
                self._adopt(lane, after, taken)
                cond.notify_all()
            if after < lane.trimmed:
                return pack_exact(["gone", (
                    f"bridge {self.cfg['name']}: partition {lane_index} cannot resume after chunk "
                    f"{after}: chunks up to {lane.trimmed} were emitted and dropped; the bridge "
                    "keeps chunks until emitted, so a reflow restore onto a running Spark query "
                    "needs that query restarted from its checkpoint too")])
            while lane.chunks and lane.chunks[0][0] <= consumed:
                gone = lane.chunks.popleft()
                if self.spooling and self.spool is not None:
                    self.spool.drop(lane_index, lanes, gone[0])
            lane.trimmed = max(lane.trimmed, min(consumed, after))
            while not any(c[0] > after for c in lane.chunks) and self.failed is None \
                    and not self.ended:
                await cond.wait()
            if self.failed is not None:
                return pack_exact(["failed", self.failed])
            out: list[list[Any]] = []
            now = int(time.time() * 1000)
            st = self.stats
            for c in lane.chunks:
                if c[0] <= after:
                    continue
                if len(out) >= max_chunks:
                    break
                seq, stream, batch, part, chunk, rows, skip, put_ms, ipc, handed = c
                if not handed:  # first hand-over: it counts as taken (a re-read does not)
                    c[9] = True
                    wait = max(0, now - put_ms)
                    st["chunks_taken"] += 1
                    st["wait_ms_sum"] += wait
                    st["wait_ms_max"] = max(st["wait_ms_max"], wait)
                    st["rows_taken"] += rows
                    key = (stream, batch, part)
                    left = self.outstanding.get(key, 0) - 1  # none: loaded from the spool
                    if left > 0:
                        self.outstanding[key] = left
                    else:
                        self.outstanding.pop(key, None)
                out.append([seq, stream, batch, part, chunk, rows, skip, put_ms, ipc])
                lane.sent = max(lane.sent, seq)
            cond.notify_all()
            if not out:
                return pack_exact(["end"])
            return pack_exact(["data", out])

    async def end_input(self) -> None:
        """No more input: readers end once their lanes are read."""
        cond = self._cond()
        async with cond:
            self.ended = True
            cond.notify_all()

    async def fail(self, message: str) -> None:
        """Fail both sides: puts raise and readers raise ``SparkQueryFailed(message)``."""
        cond = self._cond()
        async with cond:
            if self.failed is None:
                self.failed = message
            cond.notify_all()

    def get_stats(self) -> bytes:
        s: dict[str, Any] = dict(self.stats)
        s["queued_chunks"] = sum(lane.waiting() for lane in self.lanes)
        s["ended"] = self.ended
        s["failed"] = self.failed or ""
        s["wait_ms_mean"] = (round(s["wait_ms_sum"] / s["chunks_taken"], 1)
                             if s["chunks_taken"] else None)
        s["spooling"] = self.spooling
        s["spool_chunks"], s["spool_bytes"] = (self.spool.size() if self.spooling and self.spool
                                               is not None else (0, 0))
        return pack_exact(s)


# ====================================================================== Spark-side client


def ensure_ray(address: str | None, auth_mode: str | None = None) -> None:
    """Connect this process to Ray (a Spark executor's Python worker) if it is not yet.

    ``auth_mode``: the cluster's ``RAY_AUTH_MODE`` (``"token"`` on Ray's default local
    clusters). Ray enables token auth for an explicit address only when the environment
    says so; the token itself is found the way Ray finds it (``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token`` on the executor's machine)."""
    import ray

    if ray.is_initialized():
        return
    if auth_mode and "RAY_AUTH_MODE" not in os.environ:
        os.environ["RAY_AUTH_MODE"] = auth_mode
        with contextlib.suppress(Exception):  # refresh Ray's cached config (as ray.init does)
            from ray._raylet import Config  # type: ignore[attr-defined]  # not in ray's stub

            Config.initialize("")
    ray.init(address=address or "auto", namespace=NAMESPACE, configure_logging=False,
             log_to_driver=False, include_dashboard=False)


def _cause(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        return str(cause)
    return str(exc)


class BridgeClient:
    """Pushes Spark rows into a bridge actor (used by foreachBatch and the Data Source
    writer). ``address``: the Ray cluster (None: this process is already connected)."""

    _cache: dict[tuple[str, str | None, str | None], BridgeClient] = {}

    def __init__(self, bridge_name: str, address: str | None = None,
                 auth_mode: str | None = None, window: int = 4) -> None:
        import ray

        ensure_ray(address, auth_mode)
        try:
            self.actor = ray.get_actor(bridge_name, namespace=NAMESPACE)
        except ValueError:
            raise BridgeError(
                f"no reflow bridge named {bridge_name!r} in namespace {NAMESPACE!r}; start it "
                "with SparkSource.start() (SparkLink.feed does) before the Spark query") from None
        cfg = unpack_exact(ray.get(self.actor.config.remote()))
        self.name = bridge_name
        self.source = cfg["source"]
        self.schema = parse_schema(cfg["schema"])
        self.chunk_rows: int = cfg["chunk_rows"]
        self.dead_letter_dir: str = cfg["dead_letter_dir"]
        self.window = window

    @classmethod
    def cached(cls, bridge_name: str, address: str | None,
               auth_mode: str | None = None) -> BridgeClient:
        """A client per (bridge, cluster) and process, renewed when the named actor is a
        different one than before (a bridge of the same name was started again)."""
        import ray

        key = (bridge_name, address, auth_mode)
        client = cls._cache.get(key)
        if client is not None:
            try:
                current = ray.get_actor(bridge_name, namespace=NAMESPACE)
            except ValueError:
                current = None
            if current is None or current._actor_id != client.actor._actor_id:
                client = None
        if client is None:
            client = cls._cache[key] = cls(bridge_name, address, auth_mode)
        return client

    def push(self, stream: str, batch_id: int, partition: int,
             batches: Iterable[Any]) -> dict[str, int]:
        """Push one partition of Spark batch ``batch_id`` (Arrow record batches or tables);
        returns once reflow has taken all of it. Counts: rows, dead_letters, duplicates."""
        import ray

        from engine.spark.schema import conform, rechunk, to_ipc, write_dead_letters

        pending: deque[tuple[Any, int]] = deque()
        counts = {"rows": 0, "dead_letters": 0, "duplicate_rows": 0, "chunks": 0}

        def settle(ref: Any, rows: int) -> None:
            if ray.get(ref) == "dup":
                counts["duplicate_rows"] += rows

        try:
            for seq, chunk in enumerate(rechunk(batches, self.chunk_rows)):
                good, bad = conform(chunk, self.schema)
                if bad:
                    write_dead_letters(
                        self.dead_letter_dir,
                        f"{_safe(stream)}-b{batch_id:010d}-p{partition:05d}-c{seq:06d}.parquet",
                        self.source, stream, batch_id, partition, bad)
                ipc = to_ipc(good) if good.num_rows else b""
                ref = self.actor.put.remote(stream, batch_id, partition, seq, good.num_rows,
                                            len(bad), int(time.time() * 1000), ipc)
                pending.append((ref, good.num_rows))
                counts["rows"] += good.num_rows
                counts["dead_letters"] += len(bad)
                counts["chunks"] += 1
                if len(pending) >= self.window:
                    settle(*pending.popleft())
            while pending:
                settle(*pending.popleft())
            ray.get(self.actor.drained.remote(stream, batch_id, partition))
        except ray.exceptions.RayError as exc:
            raise BridgeError(f"reflow bridge {self.name}: {_cause(exc)}") from None
        return counts


def _safe(stream: str) -> str:
    """A file-name-safe stream name that never starts with '_' or '.' (Spark and pyarrow
    skip such files when they read a directory)."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in stream)[-48:]
    return safe.lstrip("_-") or "stream"


def foreach_batch_writer(bridge_name: str, stream: str, address: str | None = None) -> Any:
    """A ``foreachBatch`` function pushing each micro-batch (``df.toArrow()``, on the Spark
    driver) into the bridge as partition 0 of that batch id."""

    def write_batch(df: Any, batch_id: int) -> None:
        client = BridgeClient.cached(bridge_name, address)
        table = df.toArrow()
        client.push(stream, int(batch_id), 0, table.to_batches())

    return write_batch


# ====================================================================== reflow source


class SparkSource(Source):
    """A reflow source fed by Spark Structured Streaming (see the module docstring).

    * ``schema``: the declared columns (DDL string, pyspark ``StructType`` or
      ``pyarrow.Schema``); rows that do not fit go to ``dead_letter_dir`` (Parquet; a temp
      directory when None) and are counted in ``stats()["dead_letters"]``.
    * ``timestamp_column``: a TIMESTAMP or BIGINT (ms) column giving record timestamps;
      otherwise a record's timestamp is when Spark handed it to the bridge.
    * ``partitions``: lanes of the bridge, the source's partitions (None: one per initial
      source task), so the source can be rescaled up to that many tasks.
    * ``chunk_rows`` rows per chunk; each lane holds at most ``queue_chunks`` chunks not
      yet handed to its reader, plus those handed and not yet emitted (so the bridge
      buffers about ``partitions * (queue_chunks + 10) * chunk_rows`` rows at most), and
      in a job that checkpoints those emitted since the last complete checkpoint.
    * ``spool_dir``: in a job that checkpoints, every chunk is written here (one file per
      chunk, ``engine.spark.spool``) before a reader can take it, and deleted once a
      complete checkpoint covers it; a restore in a new process (new bridge, the Spark
      query restarted from its checkpoint) reads from it what Spark committed after the
      restored checkpoint. None: ``<temp dir>/reflow-spark-spool/<name>``, so give the
      source a ``name`` that stays the same across restarts. A fresh (not restored) start
      clears it.
    * ``columnar=True``: the Arrow batches Spark handed over go on as column batches
      (``engine.columnar.batches``; no per-row conversion), timestamps as int64 ms and dates as
      int32 days as on the rows path; per-record operators after it get dict rows
      ``{column: value}`` instead of tuples.

    Driver side: ``start()`` creates the bridge actor (``SparkLink.feed`` calls it),
    ``foreach_batch(stream)`` gives a ``foreachBatch`` function, ``writer_options()`` the
    options for ``df.writeStream.format("reflow")``, ``end_input()`` ends the source once
    its queues are empty, ``stats()`` and ``close()`` (kills the actor).
    """

    def __init__(
        self,
        schema: Any,
        name: str | None = None,
        *,
        timestamp_column: str | None = None,
        dead_letter_dir: str | None = None,
        chunk_rows: int = 4096,
        queue_chunks: int = 2,
        connect_timeout_s: float = 300.0,
        columnar: bool = False,
        partitions: int | None = None,
        spool_dir: str | None = None,
    ) -> None:
        self.schema: ColumnSchema = parse_schema(schema)
        self.columnar = bool(columnar)
        if partitions is not None and (isinstance(partitions, bool)
                                       or not isinstance(partitions, int) or partitions < 1):
            raise ValueError(f"SparkSource partitions must be an int >= 1 or None (one per "
                             f"initial source task); got {partitions!r}")
        self.num_partitions = partitions
        if timestamp_column is not None and timestamp_column not in self.schema.names:
            raise ValueError(f"SparkSource timestamp_column {timestamp_column!r} is not a "
                             f"declared column ({self.schema.names})")
        if chunk_rows < 1 or queue_chunks < 1:
            raise ValueError("SparkSource chunk_rows and queue_chunks must be >= 1")
        self.name = name or f"spark-{uuid.uuid4().hex[:8]}"
        self.bridge_name = f"spark-bridge/{self.name}"
        self.timestamp_column = timestamp_column
        self.dead_letter_dir = os.path.abspath(
            dead_letter_dir or tempfile.mkdtemp(prefix="reflow-dead-letters-"))
        self.chunk_rows = int(chunk_rows)
        self.queue_chunks = int(queue_chunks)
        self.connect_timeout_s = float(connect_timeout_s)
        self.spool_dir = os.path.abspath(spool_dir or os.path.join(
            tempfile.gettempdir(), "reflow-spark-spool", _safe(self.name)))
        self._actor: Any = None
        self._closed_stats: dict[str, Any] | None = None

    # -- driver side
    def _config(self) -> bytes:
        return pack_exact({
            "name": self.bridge_name, "source": self.name, "schema": self.schema.ddl(),
            "chunk_rows": self.chunk_rows, "queue_chunks": self.queue_chunks,
            "dead_letter_dir": self.dead_letter_dir, "connect_timeout_s": self.connect_timeout_s,
            "spool_dir": self.spool_dir,
        })

    def start(self) -> Any:
        """Create the bridge actor (idempotent; the driver must be connected to Ray). It is
        owned by this driver, so it never outlives it."""
        import ray

        if self._actor is None:
            if not ray.is_initialized():
                raise BridgeError("SparkSource.start(): connect to Ray first (job.run() does)")
            self._closed_stats = None
            from engine.runtime.spark_bridge import RemoteBridge

            self._actor = RemoteBridge.options(
                name=self.bridge_name, namespace=NAMESPACE, num_cpus=0,
                max_concurrency=1000, get_if_exists=True,
            ).remote(self._config())
            ray.get(self._actor.config.remote())
        return self._actor

    def foreach_batch(self, stream: str) -> Any:
        """A function for ``df.writeStream.foreachBatch(...)``; ``stream`` names the query
        for dedupe (it must stay the same across restarts, e.g. the checkpoint path)."""
        self.start()
        return foreach_batch_writer(self.bridge_name, stream)

    def writer_options(self, stream: str | None = None) -> dict[str, str]:
        """Options for ``df.writeStream.format("reflow")``: the bridge and the Ray address
        the executors connect to. Without ``stream`` the Spark query id is used."""
        import ray

        self.start()
        opts = {"bridge": self.bridge_name,
                "address": ray.get_runtime_context().gcs_address}
        if os.environ.get("RAY_AUTH_MODE"):
            opts["rayAuthMode"] = os.environ["RAY_AUTH_MODE"]
        if stream is not None:
            opts["stream"] = stream
        return opts

    def end_input(self) -> None:
        import ray

        ray.get(self.start().end_input.remote())

    def fail(self, message: str) -> None:
        import ray

        ray.get(self.start().fail.remote(message))

    def stats(self) -> dict[str, Any]:
        """rows_in, rows_taken, dead_letters, duplicate_chunks/rows, queued_chunks, ...;
        after ``close()`` (and before a new ``start()``) the figures the bridge had when it
        was closed, instead of starting a new, empty bridge to ask."""
        import ray

        if self._actor is None and self._closed_stats is not None:
            return dict(self._closed_stats)
        return unpack_exact(ray.get(self.start().get_stats.remote()))

    def close(self) -> None:
        """Kill the bridge actor, keeping its last figures for ``stats()`` (safe to call
        twice)."""
        import ray

        actor, self._actor = self._actor, None
        if actor is not None:
            with contextlib.suppress(Exception):
                self._closed_stats = unpack_exact(ray.get(actor.get_stats.remote(),
                                                          timeout=30))
            with contextlib.suppress(Exception):
                ray.kill(actor)

    def __getstate__(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["_actor"] = None  # tasks look the actor up by name
        d["_closed_stats"] = None
        return d

    # -- task side
    def partitions(self, parallelism: int) -> list[str]:
        return indexed_partitions(self.num_partitions or parallelism)

    def open_partition(self, partition: str, resume: Any, clock: Clock) -> SourceReader:
        index, count = parse_indexed(partition, "SparkSource")
        if resume is not None and not (isinstance(resume, dict)
                                       and {"seq", "rows", "taken"} <= set(resume)):
            raise ValueError(f"SparkSource resume state must be {{'seq', 'rows', 'batch', "
                             f"'taken'}} (from a reader's offset()); got {resume!r:.200}")
        return _BridgeReader(self, index, count, resume, clock)


class _BridgeReader(SourceReader):
    """Reads one lane. Keeps one ``get`` outstanding and checks its future in ``poll``, so
    it never blocks the task's loop; hands out one chunk's rows per poll at most.

    Resume state (``offset()``): ``{"seq": lane seq of the last chunk emitted whole,
    "head": [stream, batch, partition, chunk] of the next one if emitted in part, "rows":
    rows emitted of it, "batch": newest Spark batch id emitted,
    "taken": [[stream, batch, partition, chunk, rows emitted, rows], ...]}``, the last for
    the chunks of each stream's newest batch this lane emitted (how a new bridge, after a
    restore, knows which chunks of a replayed micro-batch reflow has had)."""

    MAX_CHUNKS = 8
    MAX_IDLE_HINT_S = 0.005

    def __init__(self, src: SparkSource, index: int, count: int, resume: Any,
                 clock: Clock) -> None:
        self._name = src.bridge_name
        self._ts_col = src.timestamp_column
        self._columnar = getattr(src, "columnar", False)
        self._lane = index
        self._lanes = count
        self._clock = clock
        self._actor: Any = None
        self._next_lookup = 0.0
        self._fut: Any = None
        self._ended = False
        self._hint = 0.0005
        state = resume or {"seq": 0, "rows": 0, "head": None, "batch": -1, "taken": []}
        self._done = int(state["seq"])  # lane seq of the last chunk emitted whole
        # the chunk after it, emitted in part: its Spark identity and rows emitted of it
        # (counted in the chunk as Spark put it, so a bridge that skips rows of a replay
        # and one that does not agree)
        self._head = None if state.get("head") is None else tuple(state["head"])
        self._rows = int(state["rows"])
        self._batch = int(state.get("batch", -1))
        self._taken: dict[tuple[str, int, int, int], list[int]] = {
            (t[0], int(t[1]), int(t[2]), int(t[3])): [int(t[4]), int(t[5])]
            for t in state["taken"]}
        self._register: Any = list(state["taken"])  # sent with the first get only
        self._resumed = resume is not None
        self._after = self._done  # newest lane seq fetched
        # the job checkpoints: the lane keeps chunks up to the last complete checkpoint's
        # seq (a recovery reopens the lane there), not only up to what was emitted
        self._retain = False
        self._committed = self._done
        # fetched chunks: [seq, stream, batch, part, chunk, rows, skip, values, ts, pos]
        self._buffer: deque[list[Any]] = deque()

    def _request(self) -> None:
        if self._actor is None:
            import ray

            now = self._clock.monotonic()
            if now < self._next_lookup:
                return
            try:
                self._actor = ray.get_actor(self._name, namespace=NAMESPACE)
            except ValueError:
                self._next_lookup = now + 0.2  # not created yet: look again soon
                return
        consumed = self._committed if self._retain else self._done
        self._fut = self._actor.get.remote(self._lane, self._lanes, self._after, consumed,
                                           self.MAX_CHUNKS, self._register, self._resumed,
                                           self._retain).future()
        self._register = None

    def _take(self) -> None:
        fut, self._fut = self._fut, None
        try:
            reply = unpack_exact(fut.result())
        except Exception as exc:
            raise SparkQueryFailed(f"bridge {self._name} is gone: {_cause(exc)}") from None
        kind = reply[0]
        if kind in ("failed", "gone"):
            raise SparkQueryFailed(reply[1])
        if kind == "end":
            self._ended = True
            return
        for seq, stream, batch, part, chunk, rows, skip, put_ms, ipc in reply[1]:
            if seq <= self._after:
                continue
            values, ts = self._decode(ipc, put_ms, skip)
            pos = 0
            if self._head == (stream, batch, part, chunk):  # emitted in part before
                pos = max(0, self._rows - skip)
            self._buffer.append([seq, stream, batch, part, chunk, rows, skip, values, ts, pos])
            self._after = seq
        self._request()  # prefetch the next chunks while these are processed

    def _decode(self, ipc: bytes, put_ms: int, skip: int) -> tuple[Any, Any]:
        """A chunk's records (tuples, or a column batch) and timestamps, less ``skip`` rows
        that reflow had emitted before a restore."""
        from engine.spark.schema import column_ms, from_ipc

        table = from_ipc(ipc)
        if skip:
            table = table.slice(skip)
        if self._ts_col is None:
            stamps: Any = [put_ms] * table.num_rows
        else:
            stamps = [put_ms if t is None else t for t in column_ms(table, self._ts_col)]
        if self._columnar:
            import numpy as np

            from engine.columnar.batches import ColumnBatch
            from engine.spark.schema import plain_columns

            return ColumnBatch.of(plain_columns(table)), np.asarray(stamps, dtype=np.int64)
        from engine.spark.schema import to_records

        return to_records(table), stamps

    def poll(self, max_records: int) -> SourceBatch | None:
        if not self._buffer and not self._ended:
            if self._fut is None:
                self._request()
            if self._fut is not None and self._fut.done():
                self._take()
        elif self._fut is not None and self._fut.done() and len(self._buffer) < 2:
            self._take()
        if self._buffer:
            head = self._buffer[0]
            seq, stream, batch, part, chunk, rows, skip, values, ts, pos = head
            end = min(len(values), pos + max(1, max_records))
            out = SourceBatch(values[pos:end] if isinstance(values, list)
                              else values.slice(pos, end), ts[pos:end])
            head[9] = end
            self._note(stream, batch, part, chunk, skip + end, rows)
            if end >= len(values):
                self._buffer.popleft()
                self._done, self._head, self._rows = seq, None, 0
            else:
                self._head, self._rows = (stream, batch, part, chunk), skip + end
            self._hint = 0.0005
            return out
        if self._ended:
            return None
        self._hint = min(self.MAX_IDLE_HINT_S, self._hint * 2)
        return SourceBatch()

    def _note(self, stream: str, batch: int, part: int, chunk: int, done: int,
              rows: int) -> None:
        """Rows emitted of a chunk; only each stream's newest batch is kept (Spark commits
        a batch before it plans the next)."""
        self._batch = max(self._batch, batch)
        newest = max((k[1] for k in self._taken if k[0] == stream), default=-1)
        if batch > newest:
            self._taken = {k: v for k, v in self._taken.items() if k[0] != stream}
        elif batch < newest:
            return
        self._taken[(stream, batch, part, chunk)] = [done, rows]

    def retain_until_committed(self) -> None:
        self._retain = True

    def committed(self, state: Any) -> None:
        self._committed = max(self._committed, int(state["seq"]))

    def offset(self) -> Any:
        return {"seq": self._done, "head": None if self._head is None else list(self._head),
                "rows": self._rows, "batch": self._batch,
                "taken": [[s, b, p, c, d, r] for (s, b, p, c), (d, r) in self._taken.items()]}

    def seconds_until_ready(self) -> float:
        if self._buffer or (self._fut is not None and self._fut.done()):
            return 0.0
        return self._hint

    def close(self) -> None:
        self._fut = None
        self._buffer.clear()
