"""Public test helpers: a scripted ordered source, a gate that holds it at a record, and a
collecting sink, all working across actor processes (Bytewax ``testing.py``, Beam
``TestStream`` in spirit).

Why a gate: a test that rescales "half-way" by sleeping fails on a loaded machine (the
input may end before the sleep does) and passes vacuously when the rescale is refused. A
``SourceGate`` makes the moment an event instead: the source emits its first ``after``
records, says so, and emits nothing more until the test opens the gate, so a rescale
requested in between always finds input left.

Gate format: one directory per gate, made on the driver (source tasks are other
processes on the same machine, so a file is the signal; no Ray, no network):
``reached-<j>-of-<n>`` (empty) is created by the reader of partition j of n once it holds
at the gate, and ``open`` (empty) is created by ``SourceGate.open()``. Both files are only
ever created, never removed: a gate is reached once and opened once, and a partition
reopened from its resume state (stop-restart, a source rescale, a restore) sees the same
state, whichever task reads it.
"""

from __future__ import annotations

import math
import numbers
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.errors import ConfigError, GateError, GateTimeout
from engine.io.sinks import PendingFiles, Sink, SinkWriter
from engine.io.sources import (
    Source,
    SourceBatch,
    SourceReader,
    indexed_partitions,
    parse_indexed,
)
from engine.time.clock import Clock, now_ms
from engine.wire.codec import pack_exact, unpack_exact


class TestingSource(Source):
    """Emits ``records`` in order, cut into partitions: partition j of n emits records j,
    j+n, j+2n, ... in that order. ``partitions``: n (None: one per initial source task).

    ``rate`` (records/s over all partitions) throttles it. ``timestamp_fn(record) -> ms``
    gives event timestamps; by default a record's timestamp is the time it was emitted.
    ``gate``: one ``SourceGate`` or several; the source holds at every gate not yet open
    (see ``SourceGate``), which is how a test acts mid-stream without sleeping. A
    partition's resume state is the number of its records emitted.
    """

    __test__ = False  # not a pytest class

    def __init__(
        self,
        records: Iterable[Any],
        rate: float | None = None,
        timestamp_fn: Callable[[Any], int] | None = None,
        gate: SourceGate | Sequence[SourceGate] | None = None,
        partitions: int | None = None,
    ) -> None:
        if partitions is not None and (isinstance(partitions, bool)
                                       or not isinstance(partitions, numbers.Integral)
                                       or partitions < 1):
            raise ConfigError(f"TestingSource partitions must be an int >= 1 or None (one per "
                              f"initial source task); got {partitions!r}")
        self.num_partitions = None if partitions is None else int(partitions)
        self.records = list(records)
        self.gates = _as_gates(gate, len(self.records))
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, numbers.Real)
                                 or not math.isfinite(rate) or rate <= 0):
            raise ConfigError(
                f"TestingSource rate must be a finite number > 0 records/s, or None for full "
                f"speed; got {rate!r}"
            )
        self.rate = rate
        self.timestamp_fn = timestamp_fn

    def partitions(self, parallelism: int) -> list[str]:
        return indexed_partitions(self.num_partitions or parallelism)

    def open_partition(self, partition: str, resume: Any, clock: Clock) -> SourceReader:
        index, count = parse_indexed(partition, "TestingSource")
        pos = 0 if resume is None else resume
        if isinstance(pos, bool) or not isinstance(pos, numbers.Integral) or pos < 0:
            raise ValueError(f"TestingSource resume state must be an int >= 0 (records "
                             f"emitted); got {resume!r}")
        mine = self.records[index::count]
        rate = None if self.rate is None else self.rate / count
        gates = sorted(((g.local_limit(index, count), i, g)
                        for i, g in enumerate(self.gates)), key=lambda e: (e[0], e[1]))
        return _TestingReader(mine, int(pos), rate, self.timestamp_fn, clock,
                              [(limit, g) for limit, _, g in gates], index, count)


class _TestingReader(SourceReader):
    def __init__(
        self, records: list[Any], pos: int, rate: float | None,
        timestamp_fn: Callable[[Any], int] | None, clock: Clock,
        gates: list[tuple[int, SourceGate]] | None = None, index: int = 0,
        count: int = 1,
    ) -> None:
        self._records = records
        self._pos = pos
        self._closed_gates = list(gates or [])  # (local limit, gate), by limit; none known open
        self._index = index
        self._count = count
        self._held = False
        self._marked: set[str] = set()  # gates this reader has said it holds at
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

    def _limit(self) -> int:
        """Records emittable now: up to the first gate not open (marking it reached when
        held there), else all."""
        self._held = False
        while self._closed_gates:
            limit = self._closed_gates[0][0]
            if limit > self._pos:
                return limit
            at_limit = [g for lim, g in self._closed_gates if lim <= self._pos]
            still_closed = [g for g in at_limit if not g.is_open()]
            if still_closed:
                for g in still_closed:
                    if g.directory not in self._marked:
                        g.mark_reached(self._index, self._count)
                        self._marked.add(g.directory)
                self._held = True
                return self._pos
            self._closed_gates = [(lim, g) for lim, g in self._closed_gates if lim > self._pos]
        return len(self._records)

    def poll(self, max_records: int) -> SourceBatch | None:
        limit = self._limit()
        if self._held:
            return SourceBatch()
        if self._pos >= len(self._records):
            return None
        end = min(self._due(), self._pos + max_records, limit)
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
        if self._held:
            return _GATE_POLL_S
        if self._rate is None:
            return 0.0
        return max(0.0, (1.0 - self._tokens) / self._rate)


# ============================================================================ source gate

_GATE_POLL_S = 0.01  # how often a held reader and a waiting test look at the gate's files


def _new_gate_directory() -> str:
    return tempfile.mkdtemp(prefix="reflow-source-gate-")


@dataclass(frozen=True)
class SourceGate:
    """Holds a ``TestingSource`` after its first ``after`` records until ``open()``.

    Contract: the source's tasks together emit exactly records ``0 .. after - 1`` (the
    reader of partition j of n emits those of its records j, j+n, ... whose index is below
    ``after``, whichever task reads it), then each partition signals "reached" and polls
    empty batches (no busy loop: it asks to be polled again in 10 ms) until the gate is
    opened; it does not end while held, even when ``after`` equals the number of records.
    ``wait_reached`` returns once every partition of the source, and so every task, holds
    at the gate. Resume states are unchanged, so a partition reopened from its resume state
    (stop-restart, a source rescale, a restore) holds at the same record. A gate is single-use: once open it stays
    open. Works across processes of one machine (``directory`` must be visible to every
    source task; by default a new temporary directory made where the gate is built).
    """

    __test__ = False

    after: int
    directory: str = field(default_factory=_new_gate_directory)

    def __post_init__(self) -> None:
        if isinstance(self.after, bool) or not isinstance(self.after, int) or self.after < 0:
            raise GateError(f"SourceGate(after={self.after!r}): give the number of records "
                            "to emit before holding, an int >= 0")
        if not isinstance(self.directory, str) or not self.directory:
            raise GateError("SourceGate directory must be a non-empty path; leave it out to "
                            "get a new temporary directory")
        os.makedirs(self.directory, exist_ok=True)

    # -- the test's side
    def open(self) -> None:
        """Let the source go on past the gate (idempotent)."""
        with open(os.path.join(self.directory, "open"), "a"):
            pass

    def is_open(self) -> bool:
        return os.path.exists(os.path.join(self.directory, "open"))

    def reached(self) -> bool:
        """True once every partition of the source has held at the gate (it stays true)."""
        return self._complete_parallelism() is not None

    def wait_reached(self, timeout: float = 120.0) -> None:
        """Block until every partition of the source holds at the gate; ``GateTimeout`` after
        ``timeout`` seconds. Checks before it waits, so a reached gate costs no sleep."""
        deadline = time.monotonic() + timeout
        while not self.reached():
            if time.monotonic() >= deadline:
                held = sorted(self._reached_files()) or ["none"]
                raise GateTimeout(
                    f"the source did not reach the gate after record {self.after} within "
                    f"{timeout} s (partitions holding: {', '.join(held)}); check that the job "
                    "runs (handle.status(): it may have failed) and that the gate is given to "
                    "the source of this job, or raise the timeout on a loaded machine")
            time.sleep(_GATE_POLL_S)

    # -- the reader's side
    def local_limit(self, index: int, count: int) -> int:
        """How many of partition ``index``'s records (of ``count``) precede the gate."""
        if self.after <= index:
            return 0
        return -(-(self.after - index) // count)

    def mark_reached(self, index: int, count: int) -> None:
        name = f"reached-{index}-of-{count}"
        with open(os.path.join(self.directory, name), "a"):
            pass

    def _reached_files(self) -> list[str]:
        return [n for n in os.listdir(self.directory) if n.startswith("reached-")]

    def _complete_parallelism(self) -> int | None:
        by_p: dict[int, set[int]] = {}
        for name in self._reached_files():
            _, index, _, count = name.split("-")
            by_p.setdefault(int(count), set()).add(int(index))
        for p, tasks in by_p.items():
            if tasks >= set(range(p)):
                return p
        return None


def _as_gates(gate: SourceGate | Sequence[SourceGate] | None, n: int) -> tuple[SourceGate, ...]:
    if gate is None:
        return ()
    gates = (gate,) if isinstance(gate, SourceGate) else tuple(gate)
    for g in gates:
        if not isinstance(g, SourceGate):
            raise GateError(f"TestingSource gate must be a SourceGate or a sequence of them, "
                            f"not {type(g).__name__}")
        if g.after > n:
            raise GateError(f"SourceGate(after={g.after}) is past the end of the source's "
                            f"{n} records: the source would end before it; use after <= {n}")
    return gates


class TestingSink(Sink):
    """Collects every record it receives, readable from the driver with ``results()``.

    Writers in any actor process on this machine append to files in one directory (made on
    the driver); ``results()`` merges them in the order they were written (writes of one key
    are causally ordered, so per-key order is exact). Types survive exactly (tuples stay
    tuples).

    Exactly-once: in a job that checkpoints, a writer appends to a pending file
    (``engine.io.sinks.PendingFiles``) that its ``pre_commit`` seals and ``commit`` publishes,
    so ``results()`` shows committed records only; without checkpointing every write is
    visible at once.
    """

    __test__ = False
    exactly_once = True

    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory or tempfile.mkdtemp(prefix="reflow-testing-sink-")
        os.makedirs(self.directory, exist_ok=True)

    def prepare(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        PendingFiles.clean(self.directory)

    def open(self, task_index: int, parallelism: int, clock: Clock) -> SinkWriter:
        return _TestingWriter(self.directory, f"{task_index}-{uuid.uuid4().hex}")

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
        """Delete every record, committed or pending."""
        import shutil

        for name in os.listdir(self.directory):
            path = os.path.join(self.directory, name)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.remove(path)


class _TestingWriter(SinkWriter):
    def __init__(self, directory: str, name: str) -> None:
        self._directory = directory
        self._name = name
        self._pending: PendingFiles | None = None
        self._parts = 0  # files sealed (transactions on)
        self._f: Any = open(os.path.join(directory, f"{name}.bin"), "ab")  # noqa: SIM115

    def write(self, values: Sequence[Any], timestamps: Sequence[int]) -> None:
        if self._f is None:  # transactions on: the next pending file
            assert self._pending is not None
            path = self._pending.path(f"{self._name}-{self._parts:06d}.bin")
            self._f = open(path, "ab")  # noqa: SIM115 - closed at the next seal
        # monotonic_ns is one system-wide clock on Linux: it orders writes of all processes.
        blob = pack_exact([time.monotonic_ns(), list(values), list(timestamps)])
        self._f.write(len(blob).to_bytes(4, "little") + blob)
        self._f.flush()

    def begin_transactions(self) -> None:
        self._f.close()
        os.remove(os.path.join(self._directory, f"{self._name}.bin"))  # nothing written yet
        self._f = None
        self._pending = PendingFiles(self._directory, f"testing-{self._name}")

    def pre_commit(self, checkpoint_id: int) -> Any:
        if self._pending is None:
            return None
        if self._f is not None:
            self._f.close()
            self._f = None
            self._parts += 1
        return self._pending.seal(checkpoint_id)

    def commit(self, transactions: Sequence[Any]) -> None:
        PendingFiles.commit(self._directory, transactions,
                            f"TestingSink({self._directory!r})")

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
        if self._pending is not None:
            self._pending.close()


def per_key(records: Iterable[Any], key_fn: Callable[[Any], Any]) -> dict[Any, list[Any]]:
    """Group records by key keeping their order: the oracle's per-key sequences."""
    out: dict[Any, list[Any]] = {}
    for r in records:
        out.setdefault(key_fn(r), []).append(r)
    return out
