"""Public test helpers: a scripted ordered source and a collecting sink that work across
actor processes (Bytewax ``testing.py``, Beam ``TestStream`` in spirit)."""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from engine.clock import Clock, now_ms
from engine.codec import pack_exact, unpack_exact
from engine.sinks import Sink, SinkWriter
from engine.sources import Source, SourceBatch, SourceReader


class TestingSource(Source):
    """Emits ``records`` in order. With parallelism p, task i emits records i, i+p, i+2p, ...

    ``rate`` (records/s over all tasks) throttles it so a test can act mid-stream.
    ``timestamp_fn(record) -> ms`` gives event timestamps; by default a record's timestamp is
    the time it was emitted.
    """

    __test__ = False  # not a pytest class

    def __init__(
        self,
        records: Iterable[Any],
        rate: float | None = None,
        timestamp_fn: Callable[[Any], int] | None = None,
    ) -> None:
        self.records = list(records)
        if rate is not None and rate <= 0:
            raise ValueError("TestingSource rate must be > 0 records/s (or None for full speed)")
        self.rate = rate
        self.timestamp_fn = timestamp_fn

    def open(self, task_index: int, parallelism: int, offset: Any, clock: Clock) -> SourceReader:
        mine = self.records[task_index::parallelism]
        rate = None if self.rate is None else self.rate / parallelism
        return _TestingReader(mine, int(offset or 0), rate, self.timestamp_fn, clock)


class _TestingReader(SourceReader):
    def __init__(
        self, records: list[Any], pos: int, rate: float | None,
        timestamp_fn: Callable[[Any], int] | None, clock: Clock,
    ) -> None:
        self._records = records
        self._pos = pos
        self._rate = rate
        self._ts = timestamp_fn
        self._clock = clock
        # a token bucket: at most `rate` records/s, bursts of at most 50 ms worth, and no
        # catching up after a pause (a throttle, unlike the open-loop GeneratorSource)
        self._tokens = 1.0
        self._last = clock.monotonic()
        self._burst = 1.0 if rate is None else max(1.0, rate * 0.05)

    def _due(self) -> int:
        if self._rate is None:
            return len(self._records)
        now = self._clock.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
        self._last = now
        return min(len(self._records), self._pos + int(self._tokens))

    def poll(self, max_records: int) -> SourceBatch | None:
        if self._pos >= len(self._records):
            return None
        end = min(self._due(), self._pos + max_records)
        if self._rate is not None:
            self._tokens -= end - self._pos
        values = self._records[self._pos:end]
        self._pos = end
        if self._ts is None:
            ts = now_ms(self._clock)
            return SourceBatch(values, [ts] * len(values))
        return SourceBatch(values, [int(self._ts(v)) for v in values])

    def offset(self) -> Any:
        return self._pos

    def seconds_until_ready(self) -> float:
        if self._rate is None:
            return 0.0
        return max(0.0, (1.0 - self._tokens) / self._rate)


class TestingSink(Sink):
    """Collects every record it receives, readable from the driver with ``results()``.

    Writers in any actor process on this machine append to files in one directory (made on
    the driver); ``results()`` merges them in the order they were written (writes of one key
    are causally ordered, so per-key order is exact). Types survive exactly (tuples stay
    tuples).
    """

    __test__ = False

    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory or tempfile.mkdtemp(prefix="reflow-testing-sink-")
        os.makedirs(self.directory, exist_ok=True)

    def open(self, task_index: int, parallelism: int, clock: Clock) -> SinkWriter:
        return _TestingWriter(os.path.join(self.directory, f"{task_index}-{uuid.uuid4().hex}.bin"))

    def _entries(self) -> list[tuple[int, str, int, Any, int]]:
        entries = []
        for name in os.listdir(self.directory):
            if not name.endswith(".bin"):
                continue
            with open(os.path.join(self.directory, name), "rb") as f:
                data = f.read()
            pos = 0
            while pos + 4 <= len(data):
                n = int.from_bytes(data[pos:pos + 4], "little")
                if pos + 4 + n > len(data):
                    break  # a write in progress
                stamp, values, timestamps = unpack_exact(data[pos + 4:pos + 4 + n])
                pos += 4 + n
                for i, (v, ts) in enumerate(zip(values, timestamps, strict=True)):
                    entries.append((stamp, name, i, v, ts))
        entries.sort(key=lambda e: (e[0], e[1], e[2]))
        return entries

    def results(self) -> list[Any]:
        """Every record received so far, in write order."""
        return [e[3] for e in self._entries()]

    def results_with_timestamps(self) -> list[tuple[Any, int]]:
        return [(e[3], e[4]) for e in self._entries()]

    def clear(self) -> None:
        for name in os.listdir(self.directory):
            os.remove(os.path.join(self.directory, name))


class _TestingWriter(SinkWriter):
    def __init__(self, path: str) -> None:
        self._f = open(path, "ab")  # noqa: SIM115 - kept open for the writer's life

    def write(self, values: Sequence[Any], timestamps: Sequence[int]) -> None:
        # monotonic_ns is one system-wide clock on Linux: it orders writes of all processes.
        blob = pack_exact([time.monotonic_ns(), list(values), list(timestamps)])
        self._f.write(len(blob).to_bytes(4, "little") + blob)
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def per_key(records: Iterable[Any], key_fn: Callable[[Any], Any]) -> dict[Any, list[Any]]:
    """Group records by key keeping their order: the oracle's per-key sequences."""
    out: dict[Any, list[Any]] = {}
    for r in records:
        out.setdefault(key_fn(r), []).append(r)
    return out
