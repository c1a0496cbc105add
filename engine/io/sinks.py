"""Sinks: the ``Sink``/``SinkWriter`` contract, two-phase commit, and the built-in sinks.

A ``Sink`` is built on the driver; ``prepare()`` runs there once before deployment (it may
create directories or Ray actors, and clean up what an earlier run left uncommitted);
``open(task_index, parallelism, clock)`` runs in each sink task and returns a writer.
``flush()`` is called when the job drains (rescale, end of stream); after it returns,
everything written is durable/visible.

A batch is handed to ``write`` exactly once: a write that raises is never retried, record by
record or otherwise, because the records before the failing one may already be written and
a non-idempotent sink would hold them twice. The whole batch then goes to the sink
operator's dead-letter sink (or the job fails naming its first record), so a writer should
write a batch all or nothing; the built-in writers do.

**Exactly-once by two-phase commit** (as Flink's ``TwoPhaseCommitSinkFunction``). A sink
whose class says ``exactly_once = True`` keeps what it writes invisible until a checkpoint
that covers it completes:

* ``begin_transactions()``: called once, right after ``open`` and before any write, in a
  job that checkpoints; from then on nothing written is visible before ``commit``. Never
  called in a job without checkpointing, which then behaves as a sink without 2PC
  (visible at ``flush()``/``close()``, or at once).
* ``pre_commit(checkpoint_id) -> transaction``: at a checkpoint barrier, after every record
  before it was written: make what was written since the last ``pre_commit`` durable but
  invisible; return a msgpack-able transaction (kept in the checkpoint; None: nothing).
* ``commit(transactions)``: make those pre-committed transactions visible. Idempotent: a
  transaction already visible is a no-op (after a recovery the restored checkpoint's
  transactions are committed again). Transactions are self-describing, so any writer of
  the same sink (another task, a restarted one) can commit them.
* Data written and never pre-committed (a failure came first) never becomes visible; the
  built-in file sinks delete such files of writers that are gone (their process died or
  they were closed) in ``prepare()`` and in every ``commit``.

A sink with ``exactly_once = False`` is at-least-once after a recovery: the records between
the restored checkpoint and the failure are written again. The file sinks' pending files
live in ``<directory>/.pending/`` (``PendingFiles``), which readers skip (a leading '.').
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from engine.errors import ConfigError, SinkCommitError
from engine.time.clock import Clock


class SinkWriter(abc.ABC):
    #: True when ``write`` also takes an ``engine.columnar.batches.ColumnBatch`` (with a numpy
    #: array of timestamps); otherwise a column batch reaches ``write`` as dict rows
    accepts_columns = False

    @abc.abstractmethod
    def write(self, values: Sequence[Any], timestamps: Sequence[int]) -> None:
        """Take records (in order) with their timestamps (ms).

        Called once per batch, never again for a batch that raised (see the module doc):
        write all of it or, when raising, none of it."""

    def flush(self) -> None:  # noqa: B027 - optional hook
        """Make everything written so far durable (and visible, unless transactions are on:
        then ``pre_commit`` and ``commit`` publish it)."""

    def close(self) -> None:
        self.flush()

    def begin_transactions(self) -> None:  # noqa: B027 - optional hook
        """Called once, right after ``open`` and before any write, in a job that
        checkpoints: from now on what is written stays invisible until ``commit``. Default:
        nothing (a sink that is not exactly-once keeps writing visibly)."""

    def pre_commit(self, checkpoint_id: int) -> Any:
        """At checkpoint ``checkpoint_id``'s barrier, after every record before it was
        written: make what was written since the last ``pre_commit`` durable but invisible,
        and return it as a msgpack-able transaction (None: nothing to commit). Default:
        ``flush()`` (at-least-once) and None."""
        self.flush()
        return None

    def commit(self, transactions: Sequence[Any]) -> None:  # noqa: B027 - optional hook
        """Make ``transactions`` (from ``pre_commit`` of this or any writer of the same sink,
        their checkpoint completed) visible. Idempotent: after a recovery the restored
        checkpoint's transactions are committed again, and one already visible stays as it
        is. None entries are skipped. Default: nothing."""


class Sink(abc.ABC):
    #: True when the writers implement two-phase commit (exactly-once after a recovery);
    #: False: at-least-once (records after the restored checkpoint are written again).
    exactly_once: bool = False

    def prepare(self) -> None:  # noqa: B027 - optional hook
        """Driver-side set-up before the job is deployed."""

    @abc.abstractmethod
    def open(self, task_index: int, parallelism: int, clock: Clock) -> SinkWriter:
        """A writer for one sink task."""


class PendingFiles:
    """Two-phase commit for a sink that writes whole files into ``directory``: files are
    written invisibly under ``directory/.pending/<writer>/`` and published by a rename.

    Format: ``open/<name>`` holds the files written since the last ``seal``;
    ``seal(checkpoint_id)`` moves them to ``cp-<id:012d>/<name>`` and returns the
    transaction ``[[<pending path>, <name>, <directory>], ...]`` (paths relative to the
    absolute ``directory`` they were written in); ``commit`` renames each pending path to
    ``<directory>/<name>``, in the directory of the transaction (a job restored from a
    savepoint into another directory publishes the savepoint's output where it was
    written, as Flink's file sink does). ``lock`` is held (an
    exclusive ``flock``) while the writer lives, so ``clean`` can tell the files of a writer
    that died or was closed: their ``open/`` files were never pre-committed and are deleted.

    Guarantees: a file becomes visible only through ``commit`` and atomically (one rename
    on one filesystem); committing twice is a no-op; a transaction whose files are neither
    pending nor visible raises ``SinkCommitError``. Pre-committed files that no completed
    checkpoint references stay invisible in ``.pending`` (they may still be committed by
    a recovery).
    """

    ROOT = ".pending"

    def __init__(self, directory: str, writer: str) -> None:
        import fcntl
        import os

        self.directory = directory
        self.writer = writer
        self.base = os.path.join(directory, self.ROOT, writer)
        self.open_dir = os.path.join(self.base, "open")
        os.makedirs(self.open_dir, exist_ok=True)
        self._lock = open(os.path.join(self.base, "lock"), "a")  # noqa: SIM115 - held for life
        fcntl.flock(self._lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)

    def path(self, name: str) -> str:
        """Where to write a file that will be published as ``name``."""
        import os

        return os.path.join(self.open_dir, name)

    def seal(self, checkpoint_id: int) -> list[list[str]] | None:
        """Pre-commit every file written since the last seal (None when there is none)."""
        import os

        names = sorted(n for n in os.listdir(self.open_dir) if not n.startswith("."))
        if not names:
            return None
        rel = os.path.join(self.ROOT, self.writer, f"cp-{checkpoint_id:012d}")
        os.makedirs(os.path.join(self.directory, rel), exist_ok=True)
        for n in names:
            os.replace(os.path.join(self.open_dir, n), os.path.join(self.directory, rel, n))
        home = os.path.abspath(self.directory)  # a restored job may write elsewhere
        return [[os.path.join(rel, n), n, home] for n in names]

    @staticmethod
    def commit(directory: str, transactions: Sequence[Any], sink: str) -> None:
        """Publish the files of ``transactions`` (``seal``'s results; None skipped)."""
        import os

        homes = {directory}
        for txn in transactions:
            if txn is None:
                continue
            for entry in txn:
                # [pending, name, directory it was written in] (older checkpoints: no
                # directory): a transaction is published where it was written, as Flink's
                # file sink commits to its committable's own path, even when the job
                # restored from it writes into another directory
                pending, name = entry[0], entry[1]
                home = entry[2] if len(entry) > 2 else directory
                homes.add(home)
                src, dst = os.path.join(home, pending), os.path.join(home, name)
                if os.path.exists(src):
                    os.replace(src, dst)
                elif not os.path.exists(dst):
                    raise SinkCommitError(
                        f"{sink}: cannot commit {name!r}: its pre-committed file {pending!r} "
                        f"is gone and it is not in {directory!r} either; every task must "
                        "see the same directory, and nothing may delete .pending by hand")
        for home in sorted(homes):
            PendingFiles.clean(home)

    @staticmethod
    def clean(directory: str) -> int:
        """Delete the never-pre-committed files of writers that are gone (their ``lock`` is
        free), and empty pending directories; returns how many files went."""
        import contextlib
        import fcntl
        import os
        import shutil

        root = os.path.join(directory, PendingFiles.ROOT)
        if not os.path.isdir(root):
            return 0
        removed = 0
        for writer in os.listdir(root):
            base = os.path.join(root, writer)
            lock = os.path.join(base, "lock")
            with contextlib.suppress(FileNotFoundError), open(lock, "a") as f:
                try:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # the writer lives
                open_dir = os.path.join(base, "open")
                if os.path.isdir(open_dir):
                    removed += len(os.listdir(open_dir))
                    shutil.rmtree(open_dir, ignore_errors=True)
                for entry in os.listdir(base):
                    sub = os.path.join(base, entry)
                    if entry.startswith("cp-") and os.path.isdir(sub) and not os.listdir(sub):
                        os.rmdir(sub)
                if os.listdir(base) == ["lock"]:
                    os.remove(lock)
                    with contextlib.suppress(OSError):
                        os.rmdir(base)
        return removed

    def close(self) -> None:
        """Release the lock: files still in ``open/`` are abandoned (never published)."""
        if not self._lock.closed:
            self._lock.close()


# --- built-in sinks -----------------------------------------------------------------------
# Imports are local to functions so the contract above stays untouched and importing this
# module stays cheap (numpy/pyarrow load only when a built-in sink is used).


def _atomic_write(path: str, write: Any) -> None:
    """Call ``write(tmp_path)``, then rename the result onto ``path`` (never half-visible).
    The temp name starts with '.' and ends with '.tmp', so readers listing the directory
    skip it."""
    import os

    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".{name}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


class ParquetSink(Sink):
    """Writes records to Parquet files ``part-{task}-{uuid8}-{n:05d}.parquet`` in
    ``directory`` (made by ``prepare()``). Exactly-once in a job that checkpoints: files
    are written to ``directory/.pending/`` and renamed into ``directory`` when the
    checkpoint that covers them completes (``PendingFiles``); a reader of the directory
    (``ParquetSource``, ``pyarrow.dataset``, Spark) skips ``.pending``.

    Columns: ``schema`` names the fields of tuple/list records (a scalar record fills a
    one-column schema; dict records are looked up by name, missing keys are null). Without
    a schema the first record decides: scalars go to one column ``value``, dicts use their
    keys, tuples become ``f0, f1, ...``. ``include_timestamps`` adds an int64 ``timestamp``
    column (ms). A writer buffers rows and writes a file of ``rows_per_file`` rows whenever
    that many are buffered, and the rest on ``flush()``/``close()``. Files appear
    atomically (temp name, then ``os.replace``).
    """

    exactly_once = True

    def __init__(
        self,
        directory: str,
        schema: list[str] | None = None,
        rows_per_file: int = 100_000,
        include_timestamps: bool = False,
    ) -> None:
        if isinstance(rows_per_file, bool) or not isinstance(rows_per_file, int) or (
            rows_per_file < 1
        ):
            raise ConfigError(
                f"ParquetSink rows_per_file must be an int >= 1; got {rows_per_file!r}"
            )
        if schema is not None:
            if isinstance(schema, str) or not all(isinstance(c, str) for c in schema):
                raise ConfigError("ParquetSink schema must be a list of column names")
            if not schema or len(set(schema)) != len(schema):
                raise ConfigError(f"ParquetSink schema must be non-empty and unique; got {schema}")
            if include_timestamps and "timestamp" in schema:
                raise ConfigError(
                    "ParquetSink: schema has a 'timestamp' column; it clashes with "
                    "include_timestamps=True"
                )
        self.directory = str(directory)
        self.schema = None if schema is None else list(schema)
        self.rows_per_file = rows_per_file
        self.include_timestamps = bool(include_timestamps)

    def prepare(self) -> None:
        """Make the directory; delete files an earlier run wrote and never pre-committed."""
        import os

        os.makedirs(self.directory, exist_ok=True)
        PendingFiles.clean(self.directory)

    def open(self, task_index: int, parallelism: int, clock: Clock) -> SinkWriter:
        import os

        os.makedirs(self.directory, exist_ok=True)
        return _ParquetWriter(self, task_index)


class _ParquetWriter(SinkWriter):
    def __init__(self, sink: ParquetSink, task_index: int) -> None:
        import uuid

        self._sink = sink
        self._id = uuid.uuid4().hex[:8]
        self._prefix = f"part-{task_index}-{self._id}"
        self._pending: PendingFiles | None = None
        self._n = 0
        self._names: list[str] | None = sink.schema
        self._kind: str | None = None  # how records map to columns: seq, scalar or dict
        self._cols: list[list[Any]] = []
        self._ts: list[int] = []

    def _start(self, record: Any) -> None:
        """Decide the column layout from the first record (nothing is set when it raises)."""
        names = self._names
        if isinstance(record, dict):
            kind = "dict"
            if names is None:
                names = [str(k) for k in record]
        elif isinstance(record, (tuple, list)):
            kind = "seq"
            if names is None:
                names = [f"f{i}" for i in range(len(record))]
        else:
            kind = "scalar"
            if names is None:
                names = ["value"]
            elif len(names) != 1:
                raise ValueError(
                    f"ParquetSink: scalar record {record!r} does not fit schema {names}"
                )
        if self._sink.include_timestamps and "timestamp" in names:
            raise ValueError("ParquetSink: records have a 'timestamp' field; it clashes with "
                             "include_timestamps=True")
        self._names, self._kind = names, kind
        self._cols = [[] for _ in names]

    def write(self, values: Sequence[Any], timestamps: Sequence[int]) -> None:
        """All or nothing: every record is checked against the columns before any is
        buffered, and a file write that fails drops the batch's rows still buffered."""
        if not values:
            return
        if self._names is None or self._kind is None:
            self._start(values[0])
        names = self._names
        assert names is not None
        new: list[list[Any]] = [[] for _ in names]
        width = len(names)
        for v in values:
            if self._kind == "seq" and isinstance(v, (tuple, list)) and len(v) == width:
                for col, x in zip(new, v, strict=True):
                    col.append(x)
            elif self._kind == "dict" and isinstance(v, dict):
                extra = v.keys() - set(names)
                if extra:
                    raise ValueError(f"ParquetSink: record has fields {sorted(extra)} not in "
                                     f"the columns {names}")
                for col, name in zip(new, names, strict=True):
                    col.append(v.get(name))
            elif self._kind == "scalar" and not isinstance(v, (tuple, list, dict)):
                new[0].append(v)
            else:
                raise ValueError(f"ParquetSink: record {v!r} does not fit the columns {names}")
        ts = [int(t) for t in timestamps] if self._sink.include_timestamps else []
        cols = self._cols
        for col, add in zip(cols, new, strict=True):
            col.extend(add)
        self._ts.extend(ts)
        try:
            while len(cols[0]) >= self._sink.rows_per_file:
                self._write_file(self._sink.rows_per_file)
        except BaseException:
            # rows of this batch not yet in a file must not reach a later one: the batch
            # failed and goes to the dead-letter sink as a whole
            keep = max(0, len(cols[0]) - len(values))
            for col in cols:
                del col[keep:]
            if self._sink.include_timestamps:
                del self._ts[keep:]
            raise

    def _write_file(self, rows: int) -> None:
        import os

        import pyarrow as pa
        import pyarrow.parquet as pq

        assert self._names is not None
        data = {name: col[:rows] for name, col in zip(self._names, self._cols, strict=True)}
        table = pa.table(data)
        if self._sink.include_timestamps:
            table = table.append_column("timestamp", pa.array(self._ts[:rows], type=pa.int64()))
        name = f"{self._prefix}-{self._n:05d}.parquet"
        path = (os.path.join(self._sink.directory, name) if self._pending is None
                else self._pending.path(name))
        _atomic_write(path, lambda tmp: pq.write_table(table, tmp))
        # only once the file is there: a failed write keeps the rows buffered
        self._n += 1
        del self._ts[:rows]
        for col in self._cols:
            del col[:rows]

    def flush(self) -> None:
        if self._cols and self._cols[0]:
            self._write_file(len(self._cols[0]))

    def begin_transactions(self) -> None:
        self._pending = PendingFiles(self._sink.directory, f"parquet-{self._prefix}")

    def pre_commit(self, checkpoint_id: int) -> Any:
        self.flush()
        return None if self._pending is None else self._pending.seal(checkpoint_id)

    def commit(self, transactions: Sequence[Any]) -> None:
        PendingFiles.commit(self._sink.directory, transactions,
                            f"ParquetSink({self._sink.directory!r})")

    def close(self) -> None:
        """Writes what is buffered; with transactions on it stays pending (published only
        by a ``pre_commit`` and ``commit`` before the close)."""
        self.flush()
        if self._pending is not None:
            self._pending.close()


_LATENCY_FILE_VERSION = 1


class LatencySink(Sink):
    """Records end-to-end latency, ``now_ms(clock) - record timestamp``, of every record.
    At-least-once: after a recovery the records replayed from the restored checkpoint are
    measured again (``exactly_once`` is False).

    Each writer keeps a ``LatencyHistogram`` of all its latencies and one per wall-clock
    second (the second the record arrived), and saves them to
    ``<directory>/<task>-<uuid>.msgpack`` (atomically, ``engine.wire.codec.pack_exact``) on
    ``flush()`` and at most every 0.5 s during ``write()``. On the driver, ``summary()`` and
    ``timeline()`` merge every writer's last saved state. ``directory=None``: a temp dir
    made on the driver (shared by the writers on this machine, like ``TestingSink``).
    """

    SAVE_INTERVAL_S = 0.5

    def __init__(self, directory: str | None = None) -> None:
        import os
        import tempfile

        self.directory = directory or tempfile.mkdtemp(prefix="reflow-latency-sink-")
        os.makedirs(self.directory, exist_ok=True)

    def prepare(self) -> None:
        import os

        os.makedirs(self.directory, exist_ok=True)

    def open(self, task_index: int, parallelism: int, clock: Clock) -> SinkWriter:
        import os
        import uuid

        self.prepare()
        path = os.path.join(self.directory, f"{task_index}-{uuid.uuid4().hex}.msgpack")
        return _LatencyWriter(path, clock, self.SAVE_INTERVAL_S)

    def _load(self) -> tuple[Any, dict[int, Any]]:
        import os

        from engine.observability.latency import LatencyHistogram
        from engine.wire.codec import unpack_exact

        total = LatencyHistogram()
        per_second: dict[int, LatencyHistogram] = {}
        for name in sorted(os.listdir(self.directory)):
            if not name.endswith(".msgpack") or name.startswith("."):
                continue
            with open(os.path.join(self.directory, name), "rb") as f:
                version, wire, seconds = unpack_exact(f.read())
            if version != _LATENCY_FILE_VERSION:
                raise ValueError(f"LatencySink: {name} has unknown format version {version}")
            total.merge(LatencyHistogram.from_wire(wire))
            for second, blob in seconds:
                h = LatencyHistogram.from_wire(unpack_exact(blob))
                if second in per_second:
                    per_second[second].merge(h)
                else:
                    per_second[second] = h
        return total, per_second

    def histogram(self) -> Any:
        """The merged ``LatencyHistogram`` of every writer's last saved state."""
        return self._load()[0]

    def summary(self) -> dict[str, Any]:
        """count, mean_ms, p50_ms, p90_ms, p99_ms, p999_ms, max_ms over all writers (the
        percentiles within ~2%; mean and max exact). The ms values are None when empty."""
        h = self.histogram()
        if h.count == 0:
            return {"count": 0, "mean_ms": None, "p50_ms": None, "p90_ms": None,
                    "p99_ms": None, "p999_ms": None, "max_ms": None}
        return {
            "count": h.count, "mean_ms": h.mean, "p50_ms": h.quantile(0.5),
            "p90_ms": h.quantile(0.9), "p99_ms": h.quantile(0.99),
            "p999_ms": h.quantile(0.999), "max_ms": h.max,
        }

    def timeline(self) -> list[dict[str, Any]]:
        """Per wall-clock second (int epoch seconds, ascending) with any record:
        {second, count, mean_ms, max_ms, p50_ms, p99_ms}, merged over all writers."""
        _, per_second = self._load()
        return [
            {"second": s, "count": h.count, "mean_ms": h.mean, "max_ms": h.max,
             "p50_ms": h.quantile(0.5), "p99_ms": h.quantile(0.99)}
            for s, h in sorted(per_second.items())
        ]

    def clear(self) -> None:
        """Delete every writer's saved state (e.g. between benchmark phases)."""
        import os

        for name in os.listdir(self.directory):
            if name.endswith(".msgpack"):
                os.remove(os.path.join(self.directory, name))


class _LatencyWriter(SinkWriter):
    """It reads only the timestamps, so it takes column batches as they are. Past seconds are kept as packed bytes (they no longer change), so a save costs
    O(seconds) memcpy plus packing the current second and the total. A batch is observed
    once, into the current second; the total is the sealed seconds' sum (added to once per
    second) plus the current second, made at a save."""

    accepts_columns = True

    def __init__(self, path: str, clock: Clock, save_interval_s: float) -> None:
        from engine.observability.latency import LatencyHistogram

        self._path = path
        self._clock = clock
        self._interval = save_interval_s
        self._sealed_total = LatencyHistogram()  # every second but the current one
        self._second: int | None = None
        self._current = LatencyHistogram()
        self._sealed: dict[int, bytes] = {}
        self._last_save = clock.monotonic()
        self._dirty = False

    def write(self, values: Sequence[Any], timestamps: Sequence[int]) -> None:
        if len(timestamps):
            import numpy as np

            now = self._clock.now()
            second = int(now // 1)
            if second != self._second:
                self._switch_second(second)
            from engine.wire.codec import runs_of

            now_ms = int(now * 1000)
            first = timestamps[0]
            runs = None
            if type(timestamps) in (list, tuple):
                # a batch of one source batch (or a few): one latency per timestamp, not an
                # array of equal ones (issue 32, item 9)
                runs = ([(first, len(timestamps))] if timestamps.count(first) == len(timestamps)
                        else runs_of(timestamps))
            if runs is not None and all(type(t) is int for t, _ in runs):
                for t, n in runs:
                    self._current.observe_repeated(now_ms - t, n)
            else:
                self._current.observe_many(now_ms - np.asarray(timestamps, dtype=np.int64))
            self._dirty = True
        if self._dirty and self._clock.monotonic() - self._last_save >= self._interval:
            self._save()

    def _switch_second(self, second: int) -> None:
        from engine.observability.latency import LatencyHistogram
        from engine.wire.codec import pack_exact, unpack_exact

        if self._second is not None and self._current.count:
            self._sealed[self._second] = pack_exact(self._current.to_wire())
            self._sealed_total.merge(self._current)
        blob = self._sealed.pop(second, None)  # the clock went back: reopen it
        if blob is None:
            self._current = LatencyHistogram()
        else:
            self._current = LatencyHistogram.from_wire(unpack_exact(blob))
            self._sealed_total = LatencyHistogram()  # rebuilt without the reopened second
            for b in self._sealed.values():
                self._sealed_total.merge(LatencyHistogram.from_wire(unpack_exact(b)))
        self._second = second

    def _save(self) -> None:
        from engine.wire.codec import pack_exact

        seconds = [[s, b] for s, b in self._sealed.items()]
        if self._second is not None and self._current.count:
            seconds.append([self._second, pack_exact(self._current.to_wire())])
        total = self._sealed_total.copy().merge(self._current)
        blob = pack_exact([_LATENCY_FILE_VERSION, total.to_wire(), seconds])

        def put(tmp: str) -> None:
            with open(tmp, "wb") as f:
                f.write(blob)

        _atomic_write(self._path, put)
        self._last_save = self._clock.monotonic()
        self._dirty = False

    def flush(self) -> None:
        self._save()
