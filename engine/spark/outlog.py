"""reflow -> Spark: a durable output log of Parquet segments with offsets.

``OutputLogSink(directory, schema)`` is a reflow sink. Each sink writer (one per sink task
incarnation, id ``<open time ns>-t<task>-<uuid8>``) appends **segments**
``seg-<writer>-<n:010d>.parquet``, n = 0, 1, 2, ... A segment is written when
``rows_per_segment`` rows are buffered, when the oldest buffered row waited ``linger_s``
(a background thread, so an idle job still publishes its last rows), and on ``flush()``
(drain, rescale, end of stream). Segments appear atomically (temp name, then rename).

**Exactly-once** in a job that checkpoints (two-phase commit, ``engine.io.sinks``): segments
are written to ``.pending/`` and renamed into the log when the checkpoint that covers them
completes, in segment order, so Spark's reader, which lists only the log's own segments,
sees committed segments only. Without checkpointing a segment is visible once written.

The log's **offset** is ``{writer id: number of segments}``, counting for each writer the
contiguous prefix 0..k of its visible segments: a writer writes its segments in order, so
offsets only grow, and a segment a directory listing has not seen yet is never skipped.
Rows of one writer keep their order (so per key, as reflow routes a key to one task at a
time; across a rescale, old writers' ids sort before new writers').

Side files: ``_schema.json`` (the declared schema, written by ``prepare()`` on the driver),
``_SEALED`` (the final offset, once the job that writes the log has ended), ``_FAILED``
(the job's error: readers fail with it), ``_committed-<reader>.json`` (what a Spark reader
last committed), ``_dead_letters/`` (records that do not fit the schema, counted).

The Spark side is ``spark.readStream.format("reflow").load(directory)``
(``engine.spark.datasource``).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from engine.io.sinks import PendingFiles, Sink, SinkWriter, _atomic_write
from engine.spark.schema import ColumnSchema, parse_schema
from engine.time.clock import Clock

SCHEMA_FILE = "_schema.json"
SEALED_FILE = "_SEALED"
FAILED_FILE = "_FAILED"
DEAD_LETTERS = "_dead_letters"
_SEGMENT = re.compile(r"^seg-(?P<w>\d{19}-t\d{4}-[0-9a-f]{8})-(?P<n>\d{10})\.parquet$")


# ----------------------------------------------------------------- the log on disk (pure)


def segment_name(writer: str, n: int) -> str:
    return f"seg-{writer}-{n:010d}.parquet"


def latest_offset(directory: str) -> dict[str, int]:
    """``{writer: segments}``: per writer, how many of its segments 0..k are all visible."""
    seen: dict[str, set[int]] = {}
    for name in os.listdir(directory):
        m = _SEGMENT.match(name)
        if m:
            seen.setdefault(m.group("w"), set()).add(int(m.group("n")))
    out = {}
    for w, ns in seen.items():
        k = 0
        while k in ns:
            k += 1
        if k:
            out[w] = k
    return out


def segments_between(directory: str, start: dict[str, int], end: dict[str, int],
                     ) -> list[tuple[str, list[str]]]:
    """Per writer (in id order), the segment paths in ``[start, end)``."""
    out = []
    for w in sorted(end):
        lo, hi = int(start.get(w, 0)), int(end[w])
        if hi > lo:
            out.append((w, [os.path.join(directory, segment_name(w, n)) for n in range(lo, hi)]))
    return out


def offset_rows(directory: str, start: dict[str, int], end: dict[str, int]) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(p).metadata.num_rows
               for _, paths in segments_between(directory, start, end) for p in paths)


def read_log_schema(directory: str) -> ColumnSchema:
    path = os.path.join(directory, SCHEMA_FILE)
    try:
        with open(path) as f:
            return ColumnSchema.from_json(f.read())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{directory} is not a reflow output log (no {SCHEMA_FILE}); the OutputLogSink "
            "writes it when the job is deployed") from None


def _write_text(path: str, text: str) -> None:
    def put(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(text)

    _atomic_write(path, put)


def _write_json(path: str, obj: Any) -> None:
    _write_text(path, json.dumps(obj, sort_keys=True))


def seal(directory: str) -> dict[str, int]:
    """Record the final offset (call once no writer will write again); returns it."""
    off = latest_offset(directory)
    _write_json(os.path.join(directory, SEALED_FILE), {"offset": off, "time": time.time()})
    return off


def sealed_offset(directory: str) -> dict[str, int] | None:
    try:
        with open(os.path.join(directory, SEALED_FILE)) as f:
            return json.load(f)["offset"]
    except FileNotFoundError:
        return None


def mark_failed(directory: str, message: str) -> None:
    """Make every reader of the log fail with ``message`` (the writing job failed)."""
    _write_json(os.path.join(directory, FAILED_FILE), {"error": message, "time": time.time()})


def failure(directory: str) -> str | None:
    try:
        with open(os.path.join(directory, FAILED_FILE)) as f:
            return json.load(f)["error"]
    except FileNotFoundError:
        return None


def record_commit(directory: str, reader: str, offset: dict[str, int]) -> None:
    _write_json(os.path.join(directory, f"_committed-{reader}.json"),
                {"offset": offset, "time": time.time()})


def committed_offset(directory: str, reader: str = "default") -> dict[str, int] | None:
    try:
        with open(os.path.join(directory, f"_committed-{reader}.json")) as f:
            return json.load(f)["offset"]
    except FileNotFoundError:
        return None


# ----------------------------------------------------------------- the sink


class OutputLogSink(Sink):
    """A reflow sink writing the durable output log in ``directory`` (module docstring).

    ``schema``: the columns (DDL string, pyspark ``StructType`` or ``pyarrow.Schema``);
    records are tuples/lists in column order, dicts by name, or bare values for one column.
    A record that does not fit is written to ``dead_letter_dir`` (default
    ``<directory>/_dead_letters``) with the reason, and counted (``dead_letters()``); it
    never fails the job. ``timestamp_column``: also store each record's timestamp (ms) as a
    TIMESTAMP column of that name. Exactly-once (module docstring).
    """

    exactly_once = True

    def __init__(
        self,
        directory: str,
        schema: Any,
        *,
        rows_per_segment: int = 65_536,
        linger_s: float = 0.25,
        timestamp_column: str | None = None,
        dead_letter_dir: str | None = None,
    ) -> None:
        if rows_per_segment < 1:
            raise ValueError("OutputLogSink rows_per_segment must be >= 1")
        if linger_s <= 0:
            raise ValueError("OutputLogSink linger_s must be > 0")
        self.directory = os.path.abspath(os.fspath(directory))
        self.schema = parse_schema(schema)
        if timestamp_column is not None and timestamp_column in self.schema.names:
            raise ValueError(f"OutputLogSink timestamp_column {timestamp_column!r} clashes "
                             f"with a declared column")
        self.timestamp_column = timestamp_column
        self.rows_per_segment = int(rows_per_segment)
        self.linger_s = float(linger_s)
        self.dead_letter_dir = os.path.abspath(
            dead_letter_dir or os.path.join(self.directory, DEAD_LETTERS))

    def stored_schema(self) -> ColumnSchema:
        """The schema of the segments (declared columns, then the timestamp column)."""
        if self.timestamp_column is None:
            return self.schema
        import pyarrow as pa

        return parse_schema(self.schema.arrow.append(
            pa.field(self.timestamp_column, pa.timestamp("us", tz="UTC"), nullable=False)))

    def prepare(self) -> None:
        """Driver side: create the directory and record the schema; a log written before
        with a different schema is refused; a previous run's seal/failure is cleared."""
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, SCHEMA_FILE)
        stored = self.stored_schema()
        if os.path.exists(path):
            have = read_log_schema(self.directory)
            if have.ddl() != stored.ddl():
                raise ValueError(f"output log {self.directory} holds schema {have.ddl()!r}, "
                                 f"not {stored.ddl()!r}; use another directory")
        else:
            _write_text(path, stored.to_json())
        for marker in (SEALED_FILE, FAILED_FILE):
            p = os.path.join(self.directory, marker)
            if os.path.exists(p):
                os.remove(p)
        PendingFiles.clean(self.directory)

    def open(self, task_index: int, parallelism: int, clock: Clock) -> SinkWriter:
        os.makedirs(self.directory, exist_ok=True)
        return _LogWriter(self, task_index, clock)

    # -- driver-side helpers
    def latest_offset(self) -> dict[str, int]:
        return latest_offset(self.directory)

    def rows(self) -> int:
        """Rows in the log now."""
        return offset_rows(self.directory, {}, self.latest_offset())

    def dead_letters(self) -> int:
        from engine.spark.schema import count_dead_letters

        return count_dead_letters(self.dead_letter_dir)

    def seal(self) -> dict[str, int]:
        return seal(self.directory)

    def mark_failed(self, message: str) -> None:
        mark_failed(self.directory, message)


class _LogWriter(SinkWriter):
    def __init__(self, sink: OutputLogSink, task_index: int, clock: Clock) -> None:
        self._sink = sink
        self._schema = sink.schema
        self._clock = clock
        self._id = f"{time.time_ns():019d}-t{task_index:04d}-{uuid.uuid4().hex[:8]}"
        self._n = 0
        self._values: list[Any] = []
        self._ts: list[int] = []
        self._first: float | None = None
        self._lock = threading.Lock()  # the buffer
        self._io = threading.RLock()  # segment order (pre_commit holds it around a write)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._pending: PendingFiles | None = None

    def write(self, values: Sequence[Any], timestamps: Sequence[int]) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        if not values:
            return
        with self._lock:
            if self._first is None:
                self._first = self._clock.monotonic()
            self._values.extend(values)
            self._ts.extend(timestamps)
            full = len(self._values) >= self._sink.rows_per_segment
        if self._thread is None:
            self._thread = threading.Thread(target=self._linger, daemon=True,
                                            name=f"reflow-outlog-{self._id}")
            self._thread.start()
        if full:
            self._write_segment()

    def _linger(self) -> None:
        linger = self._sink.linger_s
        while not self._stop.wait(min(0.05, linger / 2)):
            with self._lock:
                due = self._first is not None and self._clock.monotonic() - self._first >= linger
            if due:
                try:
                    self._write_segment()
                except BaseException as exc:  # surfaced at the next write()
                    self._error = exc
                    return

    def _write_segment(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from engine.spark.schema import records_to_table

        with self._io:
            with self._lock:
                values, ts = self._values, self._ts
                self._values, self._ts, self._first = [], [], None
            if not values:
                return
            table, bad = records_to_table(values, self._schema)
            if bad:
                self._dead_letters(bad)
            if self._sink.timestamp_column is not None and table.num_rows:
                dropped = {i for i, _, _ in bad}
                good_ts = [t for i, t in enumerate(ts) if i not in dropped]
                table = table.append_column(
                    pa.field(self._sink.timestamp_column, pa.timestamp("us", tz="UTC"), False),
                    pa.array([t * 1000 for t in good_ts], type=pa.timestamp("us", tz="UTC")))
            if not table.num_rows:
                return
            name = segment_name(self._id, self._n)
            path = (os.path.join(self._sink.directory, name) if self._pending is None
                    else self._pending.path(name))
            _atomic_write(path, lambda tmp: pq.write_table(table, tmp))
            self._n += 1

    def _dead_letters(self, bad: list[tuple[int, Any, str]]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        d = self._sink.dead_letter_dir
        os.makedirs(d, exist_ok=True)
        table = pa.table({"reason": [why for _, _, why in bad],
                          "record": [repr(v) for _, v, _ in bad]})
        path = os.path.join(d, f"{self._id}-{self._n:010d}.parquet")
        _atomic_write(path, lambda tmp: pq.write_table(table, tmp))

    def flush(self) -> None:
        self._write_segment()

    def begin_transactions(self) -> None:
        self._pending = PendingFiles(self._sink.directory, f"outlog-{self._id}")

    def pre_commit(self, checkpoint_id: int) -> Any:
        with self._io:  # no segment half-way between written and sealed
            self._write_segment()
            return None if self._pending is None else self._pending.seal(checkpoint_id)

    def commit(self, transactions: Sequence[Any]) -> None:
        PendingFiles.commit(self._sink.directory, transactions,
                            f"OutputLogSink({self._sink.directory!r})")

    def close(self) -> None:
        """Writes what is buffered; with transactions on it stays pending (published only
        by a ``pre_commit`` and ``commit`` before the close)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        self._write_segment()
        if self._pending is not None:
            self._pending.close()

