"""The parts the benchmark jobs are built from, and reading what their sinks saw.

Why one module: the rescale, planning and steady benchmarks run variants of one keyed
pipeline (a generator, ``key_by``, a keyed count with padded state, a latency sink), and the
skewed scenarios must predict the generator's keys exactly; a second copy of either would
drift from the first.

* ``ServiceTime``: a per-record cost paid by sleeping, load-robust (see its docstring).
* ``PaddedCount``: per key a count and ``record[2]`` bytes of padding; optionally a
  per-record service time. ``key_of``: a record's key (``record[0]``).
* ``keyed_count_job``: ``GeneratorSource -> key_by -> PaddedCount ("agg") -> sink``.
* ``generator_keys``: the first ``n`` keys of a ``GeneratorSource`` task 0 of 1, read from
  the source itself (its sequence depends only on the seed and the task).
* ``WriteLogLatencySink``: a ``LatencySink`` whose writers also log when they wrote;
  ``NullSink``: drops everything.
* ``latency_seconds``: a ``LatencySink``'s per-second histograms.

Guarantees: nothing here starts Ray; every class a job carries is importable by Ray workers
as ``examples.bench.harness.jobs`` (the repository root is on their path, see
``harness.run.init_ray``).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any

from engine import (
    GeneratorSource,
    JobConfig,
    KeyedProcessFunction,
    LatencySink,
    Sink,
    SinkWriter,
    StreamJob,
)
from engine.observability import LatencyHistogram
from engine.time import ManualClock
from engine.wire.codec import runs_of
from examples.bench.harness import analysis

#: every benchmark's generator seed, so that runs of one benchmark see the same keys
SEED = 0


class ServiceTime:
    """A per-record cost of ``service_us`` microseconds, spent sleeping (one sleep once a
    millisecond is owed), so a task serves 1e6 / ``service_us`` records/s at most without
    using a core: the papers' one core per task, on a machine whose two cores all the
    tasks share. A sleep that overruns (the process woke late: 0.15-0.5 ms per 1 ms sleep
    on this machine, more the busier it is) is credited to the next records, up to
    ``MAX_CREDIT_S``; otherwise the service time would grow with the machine's load, and a
    migration's CPU work would slow every task, as it would not with a core each."""

    MAX_CREDIT_S = 0.01

    def __init__(self, service_us: float = 0.0) -> None:
        self.service_s = service_us / 1e6
        self.owed = 0.0  # seconds of service not slept yet (< 0: credit from an overrun)

    def spend(self) -> None:
        """One record's service."""
        if not self.service_s:
            return
        self.owed += self.service_s
        if self.owed >= 0.001:
            t0 = time.monotonic()
            time.sleep(self.owed)
            self.owed = max(-self.MAX_CREDIT_S, self.owed - (time.monotonic() - t0))


class PaddedCount(KeyedProcessFunction):
    """Per key: a count and ``record[2]`` bytes of padding (made on the key's first record;
    none for the generator's ``(key, seq)`` records without ``state_bytes_per_key``);
    emits ``(key, count)``. ``service_us``: each record also costs this much time
    (``ServiceTime``). ``random_padding``: the padding is random bytes, which RocksDB
    cannot compress (zeros, the default, shrink to almost nothing on its disk)."""

    MAX_CREDIT_S = ServiceTime.MAX_CREDIT_S

    def __init__(self, service_us: float = 0.0, random_padding: bool = False) -> None:
        self.service_us = service_us
        self.random_padding = random_padding

    def open(self, ctx: Any) -> None:
        self.pad = ctx.value_state("pad", None)
        self.n = ctx.value_state("n", 0)
        self.service = ServiceTime(self.service_us)

    def process_element(self, value: Any, ctx: Any) -> Any:
        if self.pad.value() is None:
            size = value[2] if len(value) > 2 else 0
            self.pad.update(os.urandom(size) if self.random_padding else bytes(size))
        n = self.n.value() + 1
        self.n.update(n)
        self.service.spend()
        yield (ctx.key, n)


def key_of(record: Any) -> Any:
    return record[0]


def generator(*, rate: float | None, keys: int, zipf: float | None, state_bytes: int = 0,
              num_records: int | None = None, partitions: int | None = None,
              ) -> GeneratorSource:
    """The benchmarks' generator: ``zipf`` None for uniform keys, else the Zipf exponent;
    ``partitions`` None: one per initial source task."""
    return GeneratorSource(rate=rate, num_records=num_records, num_keys=keys,
                           skew="uniform" if zipf is None else "zipf",
                           zipf_exponent=zipf or 1.0, state_bytes_per_key=state_bytes,
                           seed=SEED, partitions=partitions)


def keyed_count_job(name: str, source: GeneratorSource, sink: Sink, *, parallelism: int,
                    key_groups: int, config: JobConfig,
                    function: KeyedProcessFunction | None = None,
                    source_parallelism: int = 1) -> StreamJob:
    """``source`` (``source_parallelism`` tasks, operator ``"gen"``) -> key_by(``key_of``)
    -> ``function`` (default ``PaddedCount()``) as operator ``"agg"`` at ``parallelism``
    -> ``sink`` (chained into the aggregator's tasks)."""
    job = StreamJob(name, num_key_groups=key_groups, parallelism=parallelism, config=config)
    (job.source(source, name="gen", parallelism=source_parallelism)
        .key_by(key_of)
        .process(function or PaddedCount(), name="agg", parallelism=parallelism)
        .sink(sink, name="sink"))
    return job


def generator_keys(n: int, *, keys: int, zipf: float | None) -> Any:
    """The first ``n`` keys (a numpy int64 array) that ``generator(keys=keys, zipf=zipf)``
    emits as its only partition, read at full speed on a manual clock."""
    import numpy as np

    reader = generator(rate=None, keys=keys, zipf=zipf, num_records=n).open_partition(
        "0-of-1", None, ManualClock())
    out = np.empty(n, dtype=np.int64)
    i = 0
    while (batch := reader.poll(1 << 16)) is not None:
        vals = batch.values
        out[i:i + len(vals)] = [v[0] for v in vals]
        i += len(vals)
    return out[:i]


def latency_seconds(sink: LatencySink) -> dict[int, LatencyHistogram]:
    """Wall second -> the sink's merged latency histogram of that second.

    ``LatencySink.timeline()`` gives per-second quantiles, which cannot be merged over a
    span; the benchmarks need the histograms themselves, so this is the one place that
    reads them through ``LatencySink._load()``."""
    return sink._load()[1]


class WriteLogLatencySink(LatencySink):
    """A ``LatencySink`` whose writers also log when they wrote: ``[first, last]`` wall-time
    segments of writes less than ``JOIN_S`` apart and the number of records, saved beside
    the latency files as ``writes-*.json`` (which ``LatencySink`` ignores) on ``flush()``
    and at most every ``SAVE_INTERVAL_S`` during ``write()``. One ``clock.now()`` per batch."""

    JOIN_S = 0.05

    def open(self, task_index: int, parallelism: int, clock: Any) -> SinkWriter:
        path = os.path.join(self.directory, f"writes-{task_index}-{uuid.uuid4().hex}.json")
        return _WriteLogWriter(super().open(task_index, parallelism, clock), clock, path,
                               self.JOIN_S, self.SAVE_INTERVAL_S)

    def _logs(self) -> list[dict[str, Any]]:
        out = []
        for name in sorted(os.listdir(self.directory)):
            if name.startswith("writes-") and name.endswith(".json"):
                with open(os.path.join(self.directory, name)) as f:
                    out.append(json.load(f))
        return out

    def segments(self) -> list[list[float]]:
        """Every writer's write segments (unmerged; ``analysis.merge_segments`` joins them)."""
        return [seg for log in self._logs() for seg in log["segments"]]

    def span(self) -> dict[str, Any] | None:
        """``{first, last, count, writers}``: the first and last write (epoch seconds) over
        every writer and the records written; None when nothing was written."""
        logs = [log for log in self._logs() if log["segments"]]
        if not logs:
            return None
        firsts = [log["first_ts_ms"] for log in logs if log.get("first_ts_ms") is not None]
        return {"first": min(log["segments"][0][0] for log in logs),
                "last": max(log["segments"][-1][1] for log in logs),
                "count": sum(log["count"] for log in logs), "writers": len(logs),
                "first_record_ts": min(firsts) / 1000.0 if firsts else None}


class _WriteLogWriter(SinkWriter):
    def __init__(self, inner: SinkWriter, clock: Any, path: str, join_s: float,
                 every_s: float) -> None:
        self.inner, self.clock, self.path = inner, clock, path
        self.join_s, self.every_s = join_s, every_s
        self.segments: list[list[float]] = []
        self.count = 0
        self.first_ts: int | None = None  # the earliest record timestamp (ms) written
        self.saved_at = 0.0
        self.dirty = False

    accepts_columns = True

    def write(self, values: Any, timestamps: Any) -> None:
        self.inner.write(values, timestamps)
        if len(values):
            first = timestamps[0]
            runs = None
            if type(timestamps) in (list, tuple):  # one stamp per source batch: no min
                runs = ([(first, 1)] if timestamps.count(first) == len(timestamps)
                        else runs_of(timestamps))
            if runs is not None:
                low = int(min(t for t, _ in runs))
            else:
                low = int(min(timestamps)) if not hasattr(timestamps, "min") else int(
                    timestamps.min())
            self.first_ts = low if self.first_ts is None else min(self.first_ts, low)
            now = self.clock.now()
            analysis.add_write(self.segments, now, self.join_s)
            self.count += len(values)
            self.dirty = True
            if now - self.saved_at >= self.every_s:
                self._save(now)

    def _save(self, now: float) -> None:
        tmp = os.path.join(os.path.dirname(self.path), "." + os.path.basename(self.path) + ".tmp")
        with open(tmp, "w") as f:
            json.dump({"segments": self.segments, "count": self.count,
                       "first_ts_ms": self.first_ts}, f)
        os.replace(tmp, self.path)
        self.saved_at, self.dirty = now, False

    def flush(self) -> None:
        self.inner.flush()
        if self.dirty:
            self._save(self.clock.now())

    def close(self) -> None:
        self.flush()


class NullSink(Sink):
    """Takes records and drops them (what a job costs without any output work)."""

    def open(self, task_index: int, parallelism: int, clock: Any) -> SinkWriter:
        return _NullWriter()


class _NullWriter(SinkWriter):
    accepts_columns = True

    def write(self, values: Any, timestamps: Any) -> None:
        pass
