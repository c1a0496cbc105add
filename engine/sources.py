"""Sources: the ``Source``/``SourceReader`` contract and the built-in sources.

A ``Source`` is built on the driver and shipped to each source task, where
``open(task_index, parallelism, offset, clock)`` returns a reader. Every source is
replayable: ``reader.offset()`` is a msgpack-able position, and opening with it resumes
right after the last record polled before it was taken.

The built-in sources check their parameters when built, on the driver, so a wrong one fails
where it is written: ``ConfigError`` (a ``ValueError`` too) naming the parameter and the
value; counts and rates are numbers, never bools.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

from engine.clock import Clock
from engine.errors import ConfigError


@dataclass
class SourceBatch:
    """Records polled from a source, with one timestamp (ms) each: lists, or an
    ``engine.columnar.ColumnBatch`` with a numpy int64 array of timestamps (a columnar
    source)."""

    values: list[Any] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.values)


class SourceReader(abc.ABC):
    """The per-task side of a source. Runs inside the task; must not block for long."""

    @abc.abstractmethod
    def poll(self, max_records: int) -> SourceBatch | None:
        """Up to ``max_records`` records that are due now; an empty batch when none is due
        yet; None once the source is exhausted (for good)."""

    @abc.abstractmethod
    def offset(self) -> Any:
        """Position after the last record returned by ``poll`` (msgpack-able)."""

    def seconds_until_ready(self) -> float:
        """After an empty poll: how long until the next record is due (a hint)."""
        return 0.001

    def backlog(self) -> int | None:
        """Records due or available now and not read yet (the source's lag, e.g. an
        open-loop generator behind its schedule or a consumer behind its log); None when
        the source cannot tell. Autoscalers read it to tell demand from throughput."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""


class Source(abc.ABC):
    """A replayable source of records."""

    @abc.abstractmethod
    def open(self, task_index: int, parallelism: int, offset: Any, clock: Clock) -> SourceReader:
        """A reader for this task's share of the source, positioned at ``offset`` (None: start)."""


# --- built-in sources ---------------------------------------------------------------------
# Imports are local to functions so the contract above stays untouched and importing this
# module stays cheap (numpy/pyarrow load only when a built-in source is used).

_GEN_CHUNK = 65536  # records per deterministic random chunk; resuming costs O(one chunk)
_EPS = 1e-9


def _is_int(x: Any) -> bool:
    import numbers

    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_positive_number(x: Any) -> bool:
    import math
    import numbers

    return (
        isinstance(x, numbers.Real) and not isinstance(x, bool)
        and math.isfinite(x) and x > 0
    )


class GeneratorSource(Source):
    """Open-loop, rate-controlled generator of ``(key, seq)`` records (or
    ``(key, seq, state_bytes_per_key)`` when ``state_bytes_per_key > 0``).

    * ``rate``: records/s over all tasks (each of p tasks emits ``rate / p``); None = full
      speed. ``num_records`` is split evenly over tasks (task i gets ``n // p`` plus one if
      ``i < n % p``); ``duration_s`` caps each task at ``ceil(duration_s * rate / p)``
      records, or at full speed at ``duration_s`` seconds after the reader was opened.
      Neither limit set: the source never ends.
    * Keys are ints in ``[0, num_keys)``, ``"uniform"`` or bounded ``"zipf"`` (key k has
      weight ``1 / (k + 1) ** zipf_exponent``, so key 0 is the hottest).
    * ``seq`` is the record's index in its task's sequence. The sequence depends only on
      ``(seed, task_index)`` (random chunks of 65,536 records are seeded by
      ``(seed, task_index, chunk_no)``), so opening at an offset resumes it exactly.
    * Open loop: record n of a task is due at ``t0 + (n - offset) / (rate / p)`` where t0 is
      ``clock.now()`` when the reader is opened at ``offset``, and its timestamp is that
      scheduled time in ms, so time spent waiting for a slow engine counts as latency. At
      full speed, timestamps are the poll time.
    * Offset: the number of records this task has emitted (an int).
    * ``columnar=True``: batches of columns ``key`` and ``seq`` (int64; an
      ``engine.columnar.ColumnBatch``, whose records are dict rows ``{"key": k, "seq": s}``)
      instead of tuples; the same keys in the same order. Not with ``state_bytes_per_key``.
    """

    def __init__(
        self,
        rate: float | None,
        num_records: int | None = None,
        duration_s: float | None = None,
        num_keys: int = 1000,
        skew: str = "uniform",
        zipf_exponent: float = 1.2,
        state_bytes_per_key: int = 0,
        seed: int = 0,
        columnar: bool = False,
    ) -> None:
        if rate is not None and not _is_positive_number(rate):
            raise ConfigError(
                f"GeneratorSource rate must be a finite number > 0 records/s, or None for "
                f"full speed; got {rate!r}"
            )
        if num_records is not None and (not _is_int(num_records) or num_records < 0):
            raise ConfigError(
                f"GeneratorSource num_records must be an int >= 0 or None; got {num_records!r}"
            )
        if duration_s is not None and not _is_positive_number(duration_s):
            raise ConfigError(
                f"GeneratorSource duration_s must be a finite number > 0 or None; "
                f"got {duration_s!r}"
            )
        if not _is_int(num_keys) or num_keys < 1:
            raise ConfigError(f"GeneratorSource num_keys must be an int >= 1; got {num_keys!r}")
        if skew not in ("uniform", "zipf"):
            raise ConfigError(f"GeneratorSource skew must be 'uniform' or 'zipf'; got {skew!r}")
        if not _is_positive_number(zipf_exponent):
            raise ConfigError(
                f"GeneratorSource zipf_exponent must be a finite number > 0; "
                f"got {zipf_exponent!r}"
            )
        if not _is_int(state_bytes_per_key) or state_bytes_per_key < 0:
            raise ConfigError(
                f"GeneratorSource state_bytes_per_key must be an int >= 0; "
                f"got {state_bytes_per_key!r}"
            )
        if not _is_int(seed) or seed < 0:
            raise ConfigError(f"GeneratorSource seed must be an int >= 0; got {seed!r}")
        if not isinstance(columnar, bool) or (columnar and state_bytes_per_key):
            raise ConfigError("GeneratorSource columnar must be a bool, and columnar batches "
                              f"carry no padding (state_bytes_per_key 0); got {columnar!r} "
                              f"with state_bytes_per_key {state_bytes_per_key!r}")
        self.columnar = columnar
        self.rate = None if rate is None else float(rate)
        self.num_records = None if num_records is None else int(num_records)
        self.duration_s = None if duration_s is None else float(duration_s)
        self.num_keys = int(num_keys)
        self.skew = skew
        self.zipf_exponent = float(zipf_exponent)
        self.state_bytes_per_key = int(state_bytes_per_key)
        self.seed = int(seed)

    def task_records(self, task_index: int, parallelism: int) -> int | None:
        """How many records task ``task_index`` of ``parallelism`` emits (None: unbounded)."""
        import math

        limit: int | None = None
        if self.num_records is not None:
            base, extra = divmod(self.num_records, parallelism)
            limit = base + (1 if task_index < extra else 0)
        if self.duration_s is not None and self.rate is not None:
            by_time = math.ceil(self.duration_s * self.rate / parallelism - _EPS)
            limit = by_time if limit is None else min(limit, by_time)
        return limit

    def open(self, task_index: int, parallelism: int, offset: Any, clock: Clock) -> SourceReader:
        if parallelism < 1 or not 0 <= task_index < parallelism:
            raise ValueError(f"bad task_index {task_index} for parallelism {parallelism}")
        pos = 0 if offset is None else offset
        if not _is_int(pos) or pos < 0:
            raise ValueError(f"GeneratorSource offset must be an int >= 0; got {offset!r}")
        return _GeneratorReader(self, task_index, parallelism, int(pos), clock)


class _GeneratorReader(SourceReader):
    def __init__(
        self, src: GeneratorSource, task_index: int, parallelism: int, pos: int, clock: Clock
    ) -> None:
        import numpy as np

        self._seed = src.seed
        self._task = task_index
        self._num_keys = src.num_keys
        self._extra = src.state_bytes_per_key
        self._limit = src.task_records(task_index, parallelism)
        self._rate = None if src.rate is None else src.rate / parallelism
        self._clock = clock
        self._pos = pos
        self._start_pos = pos
        self._start_mono = clock.monotonic()
        self._start_ms = clock.now() * 1000.0
        self._deadline = (
            self._start_mono + src.duration_s
            if src.rate is None and src.duration_s is not None else None
        )
        self._done = False
        self._cdf: Any = None  # numpy CDF over key ranks for zipf
        if src.skew == "zipf":
            weights = np.arange(1, src.num_keys + 1, dtype=np.float64) ** -src.zipf_exponent
            cdf = np.cumsum(weights)
            self._cdf = cdf / cdf[-1]
        self._chunk_no = -1
        self._chunk_keys: list[int] = []
        self._chunk_array: Any = None
        self._columnar = src.columnar

    def _keys(self, chunk_no: int) -> Any:
        """The chunk's keys: a list, or a numpy array for a columnar reader."""
        if chunk_no != self._chunk_no:
            import numpy as np

            rng = np.random.default_rng([self._seed, self._task, chunk_no])
            if self._cdf is None:
                keys = rng.integers(0, self._num_keys, size=_GEN_CHUNK, dtype=np.int64)
            else:
                keys = np.searchsorted(self._cdf, rng.random(_GEN_CHUNK), side="right")
                np.minimum(keys, self._num_keys - 1, out=keys)
            self._chunk_array = keys.astype(np.int64)
            self._chunk_keys = [] if self._columnar else keys.tolist()
            self._chunk_no = chunk_no
        return self._chunk_array if self._columnar else self._chunk_keys

    def _due(self) -> int:
        """Index one past the last record due now (ignoring the limit)."""
        if self._rate is None:
            return self._pos + (1 << 62)
        elapsed = self._clock.monotonic() - self._start_mono
        if elapsed < 0:
            return self._start_pos
        return self._start_pos + int(elapsed * self._rate + _EPS) + 1

    def poll(self, max_records: int) -> SourceBatch | None:
        from itertools import repeat

        from engine.clock import now_ms

        if self._done or (self._limit is not None and self._pos >= self._limit):
            self._done = True
            return None
        if self._deadline is not None and self._clock.monotonic() >= self._deadline:
            self._done = True
            return None
        end = min(self._due(), self._pos + max(0, max_records))
        if self._limit is not None:
            end = min(end, self._limit)
        if end <= self._pos:
            return SourceBatch()
        start = self._pos
        if self._columnar:
            return self._columns(start, end)
        values: list[Any] = []
        pos = start
        while pos < end:
            chunk_no = pos // _GEN_CHUNK
            base = chunk_no * _GEN_CHUNK
            hi = min(end, base + _GEN_CHUNK)
            keys = self._keys(chunk_no)[pos - base:hi - base]
            if self._extra:
                values.extend(zip(keys, range(pos, hi), repeat(self._extra, hi - pos), strict=True))
            else:
                values.extend(zip(keys, range(pos, hi), strict=True))
            pos = hi
        self._pos = end
        if self._rate is None:
            timestamps = [now_ms(self._clock)] * (end - start)
        else:
            import numpy as np

            sched = np.arange(start - self._start_pos, end - self._start_pos, dtype=np.float64)
            sched *= 1000.0
            sched /= self._rate
            sched += self._start_ms
            timestamps = np.floor(sched).astype(np.int64).tolist()
        return SourceBatch(values, timestamps)

    def _columns(self, start: int, end: int) -> SourceBatch:
        import numpy as np
        import pyarrow as pa

        from engine.clock import now_ms
        from engine.columnar import ColumnBatch

        parts = []
        pos = start
        while pos < end:
            chunk_no = pos // _GEN_CHUNK
            base = chunk_no * _GEN_CHUNK
            hi = min(end, base + _GEN_CHUNK)
            parts.append(self._keys(chunk_no)[pos - base:hi - base])
            pos = hi
        keys = parts[0] if len(parts) == 1 else np.concatenate(parts)
        self._pos = end
        if self._rate is None:
            ts = np.full(end - start, now_ms(self._clock), dtype=np.int64)
        else:
            sched = np.arange(start - self._start_pos, end - self._start_pos, dtype=np.float64)
            sched *= 1000.0  # the same arithmetic as the rows path: the same timestamps
            sched /= self._rate
            sched += self._start_ms
            ts = np.floor(sched).astype(np.int64)
        batch = pa.RecordBatch.from_arrays(
            [pa.array(keys), pa.array(np.arange(start, end, dtype=np.int64))],
            names=["key", "seq"])
        return SourceBatch(ColumnBatch(batch), ts)  # type: ignore[arg-type]

    def offset(self) -> Any:
        return self._pos

    def seconds_until_ready(self) -> float:
        if self._rate is None or self._done:
            return 0.0
        due_at = self._start_mono + (self._pos - self._start_pos) / self._rate
        return max(0.0, due_at - self._clock.monotonic())

    def backlog(self) -> int | None:
        """Records due by the schedule and not emitted yet (None at full speed)."""
        if self._rate is None:
            return None
        due = self._due()
        if self._limit is not None:
            due = min(due, self._limit)
        return max(0, due - self._pos)


class ParquetSource(Source):
    """Records from Parquet files: a file, or every ``*.parquet`` file of a directory (by
    name; names starting with ``.`` or ``_`` are skipped). The file list is fixed when the
    source is built.

    * Records are tuples of ``columns`` in that order, or the bare value when one column
      is selected. ``columns=None``: every column except ``timestamp_column``.
    * Task i of p reads files i, i+p, ...; a single file has its row groups split that way.
    * Timestamps: ``timestamp_column`` (integer ms, or an Arrow timestamp converted to ms;
      nulls get ingestion time), else ingestion time (``now_ms(clock)`` at poll).
    * Offset: ``[unit, row]``: index into this task's file list and rows of it already
      emitted; resuming skips exactly those rows.
    """

    def __init__(
        self,
        path: str,
        columns: list[str] | None = None,
        timestamp_column: str | None = None,
        batch_rows: int = 1000,
    ) -> None:
        if not _is_int(batch_rows) or batch_rows < 1:
            raise ConfigError(f"ParquetSource batch_rows must be an int >= 1; got {batch_rows!r}")
        if columns is not None:
            if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
                raise ConfigError("ParquetSource columns must be a list of column names")
            if not columns:
                raise ConfigError("ParquetSource columns must not be empty (None = all)")
        import os

        path = os.fspath(path)
        if os.path.isdir(path):
            files = [
                os.path.join(path, n) for n in sorted(os.listdir(path))
                if n.endswith(".parquet") and not n.startswith((".", "_"))
                and os.path.isfile(os.path.join(path, n))
            ]
        elif os.path.isfile(path):
            files = [path]
        else:
            raise ConfigError(f"ParquetSource path {path!r} is neither a file nor a directory")
        self.path = path
        self.files = files
        self.columns = None if columns is None else list(columns)
        self.timestamp_column = timestamp_column
        self.batch_rows = int(batch_rows)

    def task_units(self, task_index: int, parallelism: int) -> list[tuple[str, list[int] | None]]:
        """This task's share: ``(file, row groups or None for all)`` in reading order."""
        if len(self.files) == 1:
            import pyarrow.parquet as pq

            with pq.ParquetFile(self.files[0]) as f:
                groups = list(range(f.metadata.num_row_groups))[task_index::parallelism]
            return [(self.files[0], groups)] if groups else []
        return [(f, None) for f in self.files[task_index::parallelism]]

    def open(self, task_index: int, parallelism: int, offset: Any, clock: Clock) -> SourceReader:
        if parallelism < 1 or not 0 <= task_index < parallelism:
            raise ValueError(f"bad task_index {task_index} for parallelism {parallelism}")
        if offset is None:
            unit, row = 0, 0
        elif (
            isinstance(offset, (list, tuple)) and len(offset) == 2
            and all(_is_int(x) and x >= 0 for x in offset)
        ):
            unit, row = int(offset[0]), int(offset[1])
        else:
            raise ValueError(f"ParquetSource offset must be [file_index, row]; got {offset!r}")
        return _ParquetReader(self, self.task_units(task_index, parallelism), unit, row, clock)


class _ParquetReader(SourceReader):
    def __init__(
        self, src: ParquetSource, units: list[tuple[str, list[int] | None]],
        unit: int, row: int, clock: Clock,
    ) -> None:
        self._src = src
        self._units = units
        self._clock = clock
        self._unit = unit  # unit being read
        self._row = row  # rows of that unit already returned
        self._file: Any = None
        self._batches: Any = None
        self._names: list[str] = []
        self._values: list[Any] = []  # decoded rows not yet returned
        self._ts: list[int | None] | None = None
        self._i = 0

    def _open_unit(self) -> bool:
        """Open the current unit, skipping ``self._row`` rows; False when none is left."""
        import pyarrow.parquet as pq

        if self._unit >= len(self._units):
            return False
        path, groups = self._units[self._unit]
        self._file = pq.ParquetFile(path)
        meta = self._file.metadata
        if groups is None:
            groups = list(range(meta.num_row_groups))
        skip = self._row
        while groups and meta.row_group(groups[0]).num_rows <= skip:
            skip -= meta.row_group(groups[0]).num_rows
            groups = groups[1:]
        file_cols = self._file.schema_arrow.names
        tcol = self._src.timestamp_column
        if tcol is not None and tcol not in file_cols:
            raise ValueError(f"ParquetSource: {path} has no timestamp column {tcol!r}")
        names = self._src.columns or [c for c in file_cols if c != tcol]
        missing = [c for c in names if c not in file_cols]
        if missing:
            raise ValueError(f"ParquetSource: {path} has no column(s) {missing}")
        self._names = names
        read = names + ([tcol] if tcol is not None and tcol not in names else [])
        self._batches = (
            self._file.iter_batches(
                batch_size=self._src.batch_rows, row_groups=groups, columns=read
            ) if groups else iter(())
        )
        self._pending_skip = skip
        return True

    def _decode(self, batch: Any) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        if self._pending_skip:
            take = min(self._pending_skip, batch.num_rows)
            self._pending_skip -= take
            batch = batch.slice(take)
        cols = [batch.column(batch.schema.get_field_index(n)).to_pylist() for n in self._names]
        self._values = cols[0] if len(cols) == 1 else list(zip(*cols, strict=True))
        self._i = 0
        tcol = self._src.timestamp_column
        if tcol is None:
            self._ts = None
            return
        col = batch.column(batch.schema.get_field_index(tcol))
        if pa.types.is_timestamp(col.type):
            col = pc.cast(col, pa.timestamp("ms", col.type.tz), safe=False).cast(pa.int64())
        elif pa.types.is_integer(col.type):
            col = col.cast(pa.int64())
        else:
            raise ValueError(
                f"ParquetSource timestamp column {tcol!r} has type {col.type}; it must be "
                "an integer (ms) or a timestamp"
            )
        self._ts = col.to_pylist()

    def poll(self, max_records: int) -> SourceBatch | None:
        from engine.clock import now_ms

        out = SourceBatch()
        want = max(0, max_records)
        while len(out) < want:
            if self._i >= len(self._values):
                if self._batches is None and not self._open_unit():
                    break
                batch = next(self._batches, None)
                if batch is None:
                    self._close_file()
                    self._unit += 1
                    self._row = 0
                    continue
                self._decode(batch)
                continue
            take = min(want - len(out), len(self._values) - self._i)
            j = self._i
            out.values.extend(self._values[j:j + take])
            if self._ts is None:
                out.timestamps.extend([now_ms(self._clock)] * take)
            else:
                now = None
                for t in self._ts[j:j + take]:
                    if t is None:
                        now = now_ms(self._clock) if now is None else now
                        t = now
                    out.timestamps.append(t)
            self._i += take
            self._row += take
        if not out.values and self._unit >= len(self._units):
            return None
        return out

    def offset(self) -> Any:
        return [self._unit, self._row]

    def seconds_until_ready(self) -> float:
        return 0.0

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None
        self._batches = None
        self._values = []
        self._i = 0

    def close(self) -> None:
        self._close_file()
