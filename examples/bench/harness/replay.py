"""Replaying a timestamped data set open-loop at a compressed pace, and measuring latency in
wall time against that pace.

Why: a job on a data set's own event times (the Twitch job: 10-minute units, half-hour
session gaps, hourly and daily windows) runs its windows and sessions on those times; a
benchmark wants it at a steady input rate, with latency measured as for the generator's
records (arrival minus the time the input was due), and with a backlog when the job falls
behind (open loop, as a Kafka topic read by a consumer that lags). The DRRS paper does the
same with its Twitch workload: "compress the event timestamps into a 1,000-second window".

* ``ReplaySource(records, timestamp_fn, speedup)``: one partition; record i is due at wall
  time ``origin + (due_i - first) / speedup``, ``due_i`` the largest event time among records
  0..i (the data set's order, with its bounded disorder), ``origin`` the wall time the first
  reader opened (kept in a file of ``directory`` so a reopened partition, after stop-restart
  or a restore, keeps the schedule and sees its backlog). Records keep their event
  timestamps, so the job's event-time semantics are the data set's. The records go to the
  source task through a file of ``directory``, not inside the job.
* ``ReplayLatencySink``: a ``WriteLogLatencySink`` whose writers map a record's event
  timestamp ``ts`` to the wall time it stands for, ``origin + (ts - first) / speedup``,
  before measuring ``arrival - that``: for a window or session result (timestamped at its
  end) the time from when the input closing it was due.

Guarantees: single machine (the origin file lives in a local directory shared by the
source and sink tasks, like ``LatencySink``'s files); nothing here starts Ray; both classes
are importable by Ray workers as ``examples.bench.harness.replay``.
"""

from __future__ import annotations

import bisect
import os
import pickle
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from engine import ConfigError, SinkWriter
from engine.io.sources import Source, SourceBatch, SourceReader, parse_indexed
from engine.time import Clock
from examples.bench.harness.jobs import WriteLogLatencySink

ORIGIN_FILE = "origin"
RECORDS_FILE = "records.pickle"


def _origin(directory: str, now: float) -> float:
    """The schedule's origin (epoch seconds): written once by the first caller (``now``),
    read by every later one."""
    path = os.path.join(directory, ORIGIN_FILE)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        with open(path) as f:
            return float(f.read())
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(repr(now))
    os.replace(tmp, path)  # the O_EXCL file is replaced by the full content at once
    os.close(fd)
    return now


def read_origin(directory: str) -> float | None:
    """The origin if a reader opened already, else None."""
    try:
        with open(os.path.join(directory, ORIGIN_FILE)) as f:
            text = f.read()
        return float(text) if text else None
    except (FileNotFoundError, ValueError):
        return None


class ReplaySource(Source):
    """``records`` (in the data set's order) replayed ``speedup`` x faster than their event
    times (``timestamp_fn(record)`` ms), open-loop, as one partition (module docstring).
    ``directory``: where the origin and the records are kept (None: a new temporary
    directory, made where the source is built; the sink must be given the same). The records
    travel through that file, not with the job (a job of a few hundred thousand lines
    would take a minute to deploy on a loaded machine); each reader loads them once."""

    def __init__(self, records: Sequence[Any], timestamp_fn: Callable[[Any], int],
                 speedup: float, directory: str | None = None) -> None:
        if not records:
            raise ConfigError("ReplaySource needs records")
        if not speedup > 0:
            raise ConfigError(f"ReplaySource speedup must be > 0; got {speedup!r}")
        timestamps = [int(timestamp_fn(r)) for r in records]
        due, top = [], timestamps[0]
        for t in timestamps:
            top = max(top, t)
            due.append(top)
        self.first, self.last, self.count = due[0], due[-1], len(due)
        self.speedup = float(speedup)
        self.directory = directory or tempfile.mkdtemp(prefix="reflow-replay-")
        os.makedirs(self.directory, exist_ok=True)
        with open(os.path.join(self.directory, RECORDS_FILE), "wb") as f:
            pickle.dump((list(records), timestamps, due), f, protocol=pickle.HIGHEST_PROTOCOL)

    @property
    def rate(self) -> float:
        """Mean records per wall second of the replay."""
        span_s = self.duration_s()
        return self.count / span_s if span_s > 0 else float("inf")

    def duration_s(self) -> float:
        """Wall seconds from the first record to the last."""
        return (self.last - self.first) / 1000.0 / self.speedup

    def partitions(self, parallelism: int) -> list[str]:
        return ["0-of-1"]

    def open_partition(self, partition: str, resume: Any, clock: Clock) -> SourceReader:
        parse_indexed(partition, "ReplaySource")
        origin = _origin(self.directory, clock.now())
        path = os.path.join(self.directory, RECORDS_FILE)
        if path not in _LOADED:
            with open(path, "rb") as f:
                _LOADED[path] = pickle.load(f)
        return _ReplayReader(self, _LOADED[path], 0 if resume is None else int(resume),
                             origin, clock)


#: records file -> (records, timestamps, due), once per process
_LOADED: dict[str, tuple[list[Any], list[int], list[int]]] = {}


class _ReplayReader(SourceReader):
    def __init__(self, src: ReplaySource, data: tuple[list[Any], list[int], list[int]],
                 pos: int, origin: float, clock: Clock) -> None:
        self.records, self.timestamps, self.due = data
        self.first, self.speedup = src.first, src.speedup
        self.pos, self.origin, self.clock = pos, origin, clock

    def _due_count(self) -> int:
        """Records due now (an index: records [0, n) are due)."""
        horizon = self.first + (self.clock.now() - self.origin) * 1000.0 * self.speedup
        return bisect.bisect_right(self.due, horizon)

    def poll(self, max_records: int) -> SourceBatch | None:
        if self.pos >= len(self.records):
            return None
        end = min(self._due_count(), self.pos + max_records)
        if end <= self.pos:
            return SourceBatch()
        values = self.records[self.pos:end]
        ts = self.timestamps[self.pos:end]
        self.pos = end
        return SourceBatch(values, ts)

    def offset(self) -> Any:
        return self.pos

    def seconds_until_ready(self) -> float:
        if self.pos >= len(self.records):
            return 0.0
        wall = self.origin + (self.due[self.pos] - self.first) / 1000.0 / self.speedup
        return min(0.05, max(0.0, wall - self.clock.now()))

    def backlog(self) -> int | None:
        return max(0, self._due_count() - self.pos)


class ReplayLatencySink(WriteLogLatencySink):
    """Latency against ``source``'s schedule (module docstring); writes where
    ``directory`` says (a ``WriteLogLatencySink``'s directory, to read it through that)."""

    def __init__(self, source: ReplaySource, directory: str | None = None) -> None:
        super().__init__(directory)
        self.origin_dir, self.first, self.speedup = source.directory, source.first, source.speedup

    def open(self, task_index: int, parallelism: int, clock: Any) -> Any:
        inner = super().open(task_index, parallelism, clock)
        return _WallTimeWriter(inner, self.origin_dir, self.first, self.speedup)


class _WallTimeWriter(SinkWriter):
    """Maps event timestamps to the wall times they stand for, then writes through."""

    accepts_columns = True

    def __init__(self, inner: Any, origin_dir: str, first: int, speedup: float) -> None:
        self.inner, self.origin_dir, self.first, self.speedup = inner, origin_dir, first, speedup
        self.origin_ms: float | None = None

    def write(self, values: Any, timestamps: Any) -> None:
        if not len(values):
            return
        if self.origin_ms is None:
            origin = read_origin(self.origin_dir)
            if origin is None:  # the source writes it before its first record
                raise ConfigError(f"ReplayLatencySink: no origin in {self.origin_dir}: is "
                                  "the sink given the ReplaySource of its job?")
            self.origin_ms = origin * 1000.0
        o, f, k = self.origin_ms, self.first, self.speedup
        self.inner.write(values, [int(o + (int(t) - f) / k) for t in timestamps])

    def flush(self) -> None:
        self.inner.flush()

    def close(self) -> None:
        self.inner.close()
