"""Sinks: the ``Sink``/``SinkWriter`` contract and the built-in sinks.

A ``Sink`` is built on the driver; ``prepare()`` runs there once before deployment (it may
create directories or Ray actors); ``open(task_index, parallelism, clock)`` runs in each sink
task and returns a writer. ``flush()`` is called when the job drains (rescale, end of
stream); after it returns, everything written is durable/visible.

A batch is handed to ``write`` exactly once: a write that raises is never retried, record by
record or otherwise, because the records before the failing one may already be written and
a non-idempotent sink would hold them twice. The whole batch then goes to the sink
operator's dead-letter sink (or the job fails naming its first record), so a writer should
write a batch all or nothing; the built-in writers do.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from engine.clock import Clock
from engine.errors import ConfigError


class SinkWriter(abc.ABC):
    #: True when ``write`` also takes an ``engine.columnar.ColumnBatch`` (with a numpy
    #: array of timestamps); otherwise a column batch reaches ``write`` as dict rows
    accepts_columns = False

    @abc.abstractmethod
    def write(self, values: Sequence[Any], timestamps: Sequence[int]) -> None:
        """Take records (in order) with their timestamps (ms).

        Called once per batch, never again for a batch that raised (see the module doc):
        write all of it or, when raising, none of it."""

    def flush(self) -> None:  # noqa: B027 - optional hook
        """Make everything written so far durable/visible."""

    def pre_commit(self, checkpoint_id: int) -> Any:
        """At a checkpoint barrier, after every record before it was written: make what was
        written since the last ``pre_commit`` durable but not yet visible, and return the
        transaction (msgpack-able) the checkpoint keeps. Default: ``flush()`` (visible at
        once: at-least-once after a recovery), no transaction."""
        self.flush()
        return None

    def commit(self, transactions: Sequence[Any]) -> None:  # noqa: B027 - optional hook
        """Make these pre-committed transactions visible (their checkpoint completed).
        Idempotent: after a recovery the restored checkpoint's transactions are committed
        again, and one already visible stays as it is. Default: nothing."""

    def close(self) -> None:
        self.flush()


class Sink(abc.ABC):
    def prepare(self) -> None:  # noqa: B027 - optional hook
        """Driver-side set-up before the job is deployed."""

    @abc.abstractmethod
    def open(self, task_index: int, parallelism: int, clock: Clock) -> SinkWriter:
        """A writer for one sink task."""


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
    ``directory`` (made by ``prepare()``).

    Columns: ``schema`` names the fields of tuple/list records (a scalar record fills a
    one-column schema; dict records are looked up by name, missing keys are null). Without
    a schema the first record decides: scalars go to one column ``value``, dicts use their
    keys, tuples become ``f0, f1, ...``. ``include_timestamps`` adds an int64 ``timestamp``
    column (ms). A writer buffers rows and writes a file of ``rows_per_file`` rows whenever
    that many are buffered, and the rest on ``flush()``/``close()``. Files appear
    atomically (temp name, then ``os.replace``).
    """

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
        import os

        os.makedirs(self.directory, exist_ok=True)

    def open(self, task_index: int, parallelism: int, clock: Clock) -> SinkWriter:
        self.prepare()
        return _ParquetWriter(self, task_index)


class _ParquetWriter(SinkWriter):
    def __init__(self, sink: ParquetSink, task_index: int) -> None:
        import uuid

        self._sink = sink
        self._prefix = f"part-{task_index}-{uuid.uuid4().hex[:8]}"
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
        path = os.path.join(self._sink.directory, f"{self._prefix}-{self._n:05d}.parquet")
        _atomic_write(path, lambda tmp: pq.write_table(table, tmp))
        # only once the file is there: a failed write keeps the rows buffered
        self._n += 1
        del self._ts[:rows]
        for col in self._cols:
            del col[:rows]

    def flush(self) -> None:
        if self._cols and self._cols[0]:
            self._write_file(len(self._cols[0]))


_LATENCY_FILE_VERSION = 1


class LatencySink(Sink):
    """Records end-to-end latency, ``now_ms(clock) - record timestamp``, of every record.

    Each writer keeps a ``LatencyHistogram`` of all its latencies and one per wall-clock
    second (the second the record arrived), and saves them to
    ``<directory>/<task>-<uuid>.msgpack`` (atomically, ``engine.codec.pack_exact``) on
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

        from engine.codec import unpack_exact
        from engine.latency import LatencyHistogram

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
        from engine.latency import LatencyHistogram

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
            lat = int(now * 1000) - np.asarray(timestamps, dtype=np.int64)
            self._current.observe_many(lat)
            self._dirty = True
        if self._dirty and self._clock.monotonic() - self._last_save >= self._interval:
            self._save()

    def _switch_second(self, second: int) -> None:
        from engine.codec import pack_exact, unpack_exact
        from engine.latency import LatencyHistogram

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
        from engine.codec import pack_exact

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
