"""Sources: the ``Source``/``SourceReader`` contract, the reader of a source task over
several partitions, and the built-in sources.

Why partitions: a source is cut into partitions independently of its tasks (as Bytewax's
partitioned inputs and Flink's splits are), so the number of source tasks is free: a source
can be rescaled while the job runs, and restored at another parallelism, by handing
partitions with their resume states to other tasks.

The contract:

* ``Source.partitions(parallelism) -> list[str]`` is called once, on the JobMaster, when
  the job is first deployed (``parallelism``: the source operator's initial parallelism,
  for sources whose natural number of partitions is "one per task"). The list is fixed for
  the job's life: the deployment keeps it and checkpoints record it; a restore uses the
  recorded list (partitions matched by id), never a new one.
* ``Source.open_partition(partition, resume, clock) -> SourceReader``: a reader of one
  partition positioned at ``resume`` (None: the partition's start); ``reader.offset()`` is
  the partition's resume state (msgpack-able) after the last record polled. Reopening at it
  resumes right after that record: a partition is replayable.
* Source task i of p reads the partitions at positions j with ``j % p == i`` of the list
  (``partitions_of_task``), through one ``PartitionedReader``: fair polling over them, ended
  when every one has ended, ``offsets()`` = ``{partition: resume state}``.

Format of partition ids: short strings, unique within a source; the built-in sources whose
partitions are "j of n" use ``"<j>-of-<n>"`` (``indexed_partitions``), so a reader knows
its share from the id alone.

The built-in sources check their parameters when built, on the driver, so a wrong one fails
where it is written: ``ConfigError`` (a ``ValueError`` too) naming the parameter and the
value; counts and rates are numbers, never bools. A resume state or partition id a source
does not recognise raises ``ValueError`` naming it.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from engine.dataflow.partitions import partitions_of_task
from engine.errors import ColumnarError, ConfigError
from engine.time.clock import Clock
from engine.time.event_time import MIN_WATERMARK

if TYPE_CHECKING:
    import numpy as np


class ColumnarValues(Protocol):
    """The shape of a columnar ``SourceBatch.values``: an ``engine.columnar.batches.ColumnBatch``
    (that layer imports this one, so it is named here by what a source batch needs of it)."""

    def __len__(self) -> int: ...


@dataclass
class SourceBatch:
    """Records polled from a source, with one timestamp (ms) each: lists, or an
    ``engine.columnar.batches.ColumnBatch`` with a numpy int64 array of timestamps (a columnar
    source)."""

    values: list[Any] | ColumnarValues = field(default_factory=list)
    timestamps: list[int] | np.ndarray = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.values)


class SourceReader(abc.ABC):
    """The reader of one partition. Runs inside a source task; must not block for long."""

    @abc.abstractmethod
    def poll(self, max_records: int) -> SourceBatch | None:
        """Up to ``max_records`` records that are due now; an empty batch when none is due
        yet; None once the partition is exhausted (for good)."""

    @abc.abstractmethod
    def offset(self) -> Any:
        """The partition's resume state after the last record returned by ``poll``
        (msgpack-able): ``open_partition(partition, offset(), clock)`` resumes right
        after that record."""

    def seconds_until_ready(self) -> float:
        """After an empty poll: how long until the next record is due (a hint)."""
        return 0.001

    def backlog(self) -> int | None:
        """Records due or available now and not read yet (the source's lag, e.g. an
        open-loop generator behind its schedule or a consumer behind its log); None when
        the source cannot tell. Autoscalers read it to tell demand from throughput."""
        return None

    def retain_until_committed(self) -> None:  # noqa: B027 - optional hook
        """The job checkpoints: a recovery may reopen this partition at the resume state of
        the last complete checkpoint, so a source that drops what it has read (a queue, a
        bridge) keeps it until ``committed`` says a checkpoint covers it. Called once,
        before the first poll."""

    def committed(self, state: Any) -> None:  # noqa: B027 - optional hook
        """A checkpoint that holds ``state`` (an ``offset()`` of this reader) completed:
        a recovery never goes back before it."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""


class Source(abc.ABC):
    """A replayable source of records, cut into partitions (module docstring)."""

    @abc.abstractmethod
    def partitions(self, parallelism: int) -> list[str]:
        """This source's partition ids (unique strings), fixed for the job's life; called
        once on the JobMaster with the source operator's initial parallelism."""

    @abc.abstractmethod
    def open_partition(self, partition: str, resume: Any, clock: Clock) -> SourceReader:
        """A reader of ``partition`` positioned at ``resume`` (None: the partition's
        start)."""


def indexed_partitions(count: int) -> list[str]:
    """Partition ids ``"0-of-n" .. "<n-1>-of-n"``: partition j of ``count``."""
    return [f"{j}-of-{count}" for j in range(count)]


def parse_indexed(partition: str, source: str = "source") -> tuple[int, int]:
    """``(j, n)`` of an ``indexed_partitions`` id; ``ValueError`` naming it otherwise."""
    try:
        j, of, n = partition.split("-")
        index, count = int(j), int(n)
    except (AttributeError, ValueError):
        index, count, of = -1, 0, ""
    if of != "of" or count < 1 or not 0 <= index < count:
        raise ValueError(f"{source}: {partition!r} is not one of its partitions (ids are "
                         "'<j>-of-<n>', 0 <= j < n)")
    return index, count


def _concat(batches: list[SourceBatch]) -> SourceBatch:
    """One batch of several partitions' batches, in order (columns stay columns)."""
    from engine.columnar.batches import ColumnBatch  # engine.columnar.batches imports this module

    if isinstance(batches[0].values, ColumnBatch):  # columns, with numpy timestamps
        import numpy as np

        columns: list[ColumnBatch] = []
        for b in batches:
            assert isinstance(b.values, ColumnBatch), "a source's partitions give rows or columns"
            columns.append(b.values)
        return SourceBatch(ColumnBatch.concat(columns),
                           np.concatenate([b.timestamps for b in batches]))
    values: list[Any] = []
    timestamps: list[int] = []
    for b in batches:
        assert isinstance(b.values, list), "a source's partitions give rows or columns, not both"
        values.extend(b.values)
        timestamps.extend(b.timestamps)
    return SourceBatch(values, timestamps)


class PartitionedReader:
    """A source task's reader over its partitions (engine core, not user code).

    * ``poll`` is fair: it polls the live partitions in turn, starting after the one it
      polled last, until ``max_records`` are taken or each was asked once; records of one
      partition stay in order. It returns None once every partition has ended (and closes
      their readers), an empty batch when none had a record due.
    * ``offsets()``: ``{partition: resume state}`` for every partition the task holds,
      ended ones included (at their final state). ``release(ids)`` closes those partitions
      and returns their states, for a hand-over to another task; ``add`` opens more.
    * ``retain``: the job checkpoints; every reader is told so
      (``SourceReader.retain_until_committed``) and, by ``committed``, of each complete
      checkpoint's states.
    * ``frontier()``: the event-time frontier for watermarks: the smallest, over the live
      partitions, of the largest timestamp each has emitted (``MIN_WATERMARK`` while a
      live partition has emitted nothing), so a partition that lags never finds its
      records late because another partition of the task ran ahead.
    """

    def __init__(self, source: Source, partitions: Sequence[tuple[str, Any]],
                 clock: Clock, retain: bool = False) -> None:
        self.source = source
        self.clock = clock
        self.retain = retain  # the job checkpoints (SourceReader.retain_until_committed)
        self._readers: dict[str, SourceReader] = {}
        self._order: list[str] = []  # live partitions, in the task's order
        self._ended: dict[str, Any] = {}  # ended partition -> its final resume state
        self._max_ts: dict[str, int] = {}
        self._next = 0
        self.add(partitions)

    @classmethod
    def for_task(cls, source: Source, task_index: int, parallelism: int, clock: Clock,
                 resume: dict[str, Any] | None = None) -> PartitionedReader:
        """The reader task ``task_index`` of ``parallelism`` would run in a job deployed at
        that parallelism (its share of ``source.partitions(parallelism)``), each partition
        at its state in ``resume`` (missing: its start). For tests and tools."""
        states = resume or {}
        mine = partitions_of_task(source.partitions(parallelism), task_index, parallelism)
        return cls(source, [(p, states.get(p)) for p in mine], clock)

    def add(self, partitions: Sequence[tuple[str, Any]]) -> None:
        """Open ``(partition, resume state)`` pairs (opening a partition held already is an
        error: it would be read twice)."""
        for pid, resume in partitions:
            if pid in self._readers or pid in self._ended:
                raise ValueError(f"partition {pid!r} is read by this task already")
            reader = self.source.open_partition(pid, resume, self.clock)
            if self.retain:
                reader.retain_until_committed()
            self._readers[pid] = reader
            self._order.append(pid)

    def committed(self, states: dict[str, Any]) -> None:
        """A checkpoint with these ``{partition: resume state}`` completed: tell the readers
        of the partitions this task still reads."""
        for pid, state in states.items():
            reader = self._readers.get(pid)
            if reader is not None:
                reader.committed(state)

    def release(self, partitions: Sequence[str]) -> dict[str, Any]:
        """Stop reading ``partitions`` (closing them); their resume states, to open them
        elsewhere. Unknown ids are an error."""
        out: dict[str, Any] = {}
        for pid in partitions:
            if pid in self._ended:
                out[pid] = self._ended.pop(pid)
                continue
            reader = self._readers.pop(pid, None)
            if reader is None:
                raise ValueError(f"partition {pid!r} is not read by this task")
            out[pid] = reader.offset()
            reader.close()
            self._order.remove(pid)
            self._max_ts.pop(pid, None)
        self._next = 0
        return out

    @property
    def partitions(self) -> tuple[str, ...]:
        """Every partition this reader holds, live or ended."""
        return (*self._order, *self._ended)

    @property
    def ended(self) -> bool:
        return not self._order

    def poll(self, max_records: int) -> SourceBatch | None:
        order = self._order
        if not order:
            return None
        budget = max(0, max_records)
        n = len(order)
        start = self._next % n
        got: list[SourceBatch] = []
        taken = 0
        gone: list[str] = []
        last = start
        for k in range(n):
            if taken >= budget:
                break
            pid = order[(start + k) % n]
            last = (start + k) % n
            batch = self._readers[pid].poll(budget - taken)
            if batch is None:
                gone.append(pid)
                continue
            if len(batch.values):
                got.append(batch)
                taken += len(batch.values)
                ts = batch.timestamps
                m = int(ts.max()) if hasattr(ts, "max") else max(ts)  # numpy when columnar
                if m > self._max_ts.get(pid, MIN_WATERMARK):
                    self._max_ts[pid] = m
        self._next = last + 1
        for pid in gone:
            reader = self._readers.pop(pid)
            self._ended[pid] = reader.offset()
            reader.close()
            order.remove(pid)
            self._max_ts.pop(pid, None)
        if gone:
            self._next = 0 if not order else self._next % len(order)
        if not got:
            return None if not order else SourceBatch()
        return got[0] if len(got) == 1 else _concat(got)

    def offsets(self) -> dict[str, Any]:
        out = {pid: self._readers[pid].offset() for pid in self._order}
        out.update(self._ended)
        return out

    def frontier(self) -> int:
        if not self._order:
            return MIN_WATERMARK
        return min(self._max_ts.get(pid, MIN_WATERMARK) for pid in self._order)

    def seconds_until_ready(self) -> float:
        if not self._order:
            return 0.0
        return min(self._readers[pid].seconds_until_ready() for pid in self._order)

    def backlog(self) -> int | None:
        """Records due and not read yet over the live partitions (``SourceReader.backlog``);
        None when a live partition cannot tell."""
        total = 0
        for pid in self._order:
            n = self._readers[pid].backlog()
            if n is None:
                return None
            total += n
        return total

    def close(self) -> None:
        for pid in list(self._order):
            self._ended[pid] = self._readers[pid].offset()
            self._readers.pop(pid).close()
        self._order.clear()


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
        # typeshed's numbers.Real declares __lt__ and __le__ but not __gt__
        and math.isfinite(x) and x > 0  # type: ignore[operator]
    )


class GeneratorSource(Source):
    """Open-loop, rate-controlled generator of ``(key, seq)`` records (or
    ``(key, seq, state_bytes_per_key)`` when ``state_bytes_per_key > 0``).

    * Partitions: ``partitions`` of them (``"j-of-n"``), or one per initial source task
      when None. Partition j's sequence depends only on ``(seed, j)`` (random chunks of
      65,536 records are seeded by ``(seed, j, chunk_no)``), so it is the same whichever
      task reads it, and opening it at a resume state continues it exactly.
    * ``rate``: records/s over all partitions (each of n emits ``rate / n``); None = full
      speed. ``num_records`` is split evenly over partitions (partition j gets ``N // n``
      plus one if ``j < N % n``); ``duration_s`` caps each partition at
      ``ceil(duration_s * rate / n)`` records, or at full speed at ``duration_s`` seconds
      after its reader was opened. Neither limit set: the source never ends.
    * Keys are ints in ``[0, num_keys)``, ``"uniform"`` or bounded ``"zipf"`` (key k has
      weight ``1 / (k + 1) ** zipf_exponent``, so key 0 is the hottest).
    * ``seq`` is the record's index in its partition's sequence.
    * Open loop: record m of a partition is due at ``t0 + m / (rate / n)`` where t0 is
      ``clock.now()`` when the partition was first opened, and its timestamp is that
      scheduled time in ms, so time spent waiting for a slow engine counts as latency. A
      partition reopened from its resume state (a restore, a stop-restart rescale, a
      partition moved to another task) keeps its t0: records that fell due while no task
      read it are due at once, as events keep arriving in a log while a job is down, so the
      outage shows in their latency. At full speed, timestamps are the poll time.
    * Resume state: at full speed the number of records the partition has emitted (an
      int); with a rate ``[records emitted, t0 in epoch ms]``. A bare int with a rate
      (written before t0 was kept) restarts the schedule at the open: record ``resume`` is
      due then.
    * ``columnar=True``: batches of columns ``key`` and ``seq`` (int64; an
      ``engine.columnar.batches.ColumnBatch``, whose records are dict rows ``{"key": k, "seq": s}``)
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
        partitions: int | None = None,
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
        if partitions is not None and (not _is_int(partitions) or partitions < 1):
            raise ConfigError(f"GeneratorSource partitions must be an int >= 1 or None (one "
                              f"per initial source task); got {partitions!r}")
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
        self.num_partitions = None if partitions is None else int(partitions)

    def partitions(self, parallelism: int) -> list[str]:
        return indexed_partitions(self.num_partitions or parallelism)

    def partition_records(self, index: int, count: int) -> int | None:
        """How many records partition ``index`` of ``count`` emits (None: unbounded)."""
        import math

        limit: int | None = None
        if self.num_records is not None:
            base, extra = divmod(self.num_records, count)
            limit = base + (1 if index < extra else 0)
        if self.duration_s is not None and self.rate is not None:
            by_time = math.ceil(self.duration_s * self.rate / count - _EPS)
            limit = by_time if limit is None else min(limit, by_time)
        return limit

    def open_partition(self, partition: str, resume: Any, clock: Clock) -> SourceReader:
        index, count = parse_indexed(partition, "GeneratorSource")
        pos, origin_ms = scheduled_resume(resume, "GeneratorSource")
        return _GeneratorReader(self, index, count, pos, origin_ms, clock)


def scheduled_resume(resume: Any, source: str) -> tuple[int, float | None]:
    """(records emitted, t0 in epoch ms or None) of an open-loop source's resume state:
    None (a fresh partition), an int (records emitted) or ``[records emitted, t0]``
    (msgpack turns the pair into a list; a tuple is accepted too). Raises ``ValueError``
    naming ``source`` for anything else."""
    import math

    if resume is None:
        return 0, None
    pos: Any = resume
    origin: Any = None
    if isinstance(resume, list | tuple) and len(resume) == 2:
        pos, origin = resume
    if (not _is_int(pos) or pos < 0 or (origin is not None and not (
            isinstance(origin, int | float) and not isinstance(origin, bool)
            and math.isfinite(origin)))):
        raise ValueError(f"{source} resume state must be an int >= 0 (records emitted) or "
                         f"[records emitted, schedule start in epoch ms]; got {resume!r:.200}")
    return int(pos), None if origin is None else float(origin)


class _GeneratorReader(SourceReader):
    def __init__(
        self, src: GeneratorSource, index: int, count: int, pos: int,
        origin_ms: float | None, clock: Clock
    ) -> None:
        import numpy as np

        self._seed = src.seed
        self._partition = index
        self._num_keys = src.num_keys
        self._extra = src.state_bytes_per_key
        self._limit = src.partition_records(index, count)
        self._rate = None if src.rate is None else src.rate / count
        self._clock = clock
        self._pos = pos
        self._start_pos = pos
        self._start_mono = clock.monotonic()
        self._start_ms = clock.now() * 1000.0
        self._origin_ms: float | None = None  # when record 0 was due (with a rate)
        if self._rate is not None:
            if origin_ms is None:
                self._origin_ms = self._start_ms - pos * 1000.0 / self._rate
            else:  # continue the schedule: record pos was due at this wall time
                self._origin_ms = origin_ms
                due_ms = origin_ms + pos * 1000.0 / self._rate
                self._start_mono -= (self._start_ms - due_ms) / 1000.0
                self._start_ms = due_ms
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
        self._chunk_draws: Any = None  # the chunk's uniform draws (zipf) or its keys
        self._columnar = src.columnar

    def _keys(self, chunk_no: int, lo: int, hi: int) -> Any:
        """Keys ``lo:hi`` of chunk ``chunk_no``: a list, or a numpy array for a columnar
        reader. A chunk's random draws are made at once (the sequence depends only on the
        seed, the partition and the chunk), but zipf draws become keys a slice at a time,
        so no poll pays for a whole chunk's ranks (~7 ms for 65,536 keys: a hiccup in the
        source every 65,536 records that an open-loop source turns into latency)."""
        import numpy as np

        if chunk_no != self._chunk_no:
            rng = np.random.default_rng([self._seed, self._partition, chunk_no])
            if self._cdf is None:
                self._chunk_draws = rng.integers(0, self._num_keys, size=_GEN_CHUNK,
                                                 dtype=np.int64)
            else:
                self._chunk_draws = rng.random(_GEN_CHUNK)
            self._chunk_no = chunk_no
        if self._cdf is None:
            keys = self._chunk_draws[lo:hi]
        else:
            keys = np.searchsorted(self._cdf, self._chunk_draws[lo:hi], side="right")
            np.minimum(keys, self._num_keys - 1, out=keys)
            keys = keys.astype(np.int64, copy=False)
        return keys if self._columnar else keys.tolist()

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

        from engine.time.clock import now_ms

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
            keys = self._keys(chunk_no, pos - base, hi - base)
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

        from engine.columnar.batches import ColumnBatch
        from engine.time.clock import now_ms

        parts = []
        pos = start
        while pos < end:
            chunk_no = pos // _GEN_CHUNK
            base = chunk_no * _GEN_CHUNK
            hi = min(end, base + _GEN_CHUNK)
            parts.append(self._keys(chunk_no, pos - base, hi - base))
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
        return SourceBatch(ColumnBatch(batch), ts)

    def offset(self) -> Any:
        return self._pos if self._origin_ms is None else [self._pos, self._origin_ms]

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
    * Partitions: one per file (its name), or, when there is a single file, one per row
      group (``"<name>#<row group>"``).
    * Timestamps: ``timestamp_column`` (integer ms, or an Arrow timestamp converted to ms;
      nulls get ingestion time), else ingestion time (``now_ms(clock)`` at poll).
    * Resume state: rows of the partition already emitted (an int); resuming skips exactly
      those rows.
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

    def partitions(self, parallelism: int) -> list[str]:
        import os

        if len(self.files) == 1:
            import pyarrow.parquet as pq

            with pq.ParquetFile(self.files[0]) as f:
                groups = f.metadata.num_row_groups
            name = os.path.basename(self.files[0])
            return [f"{name}#{k}" for k in range(groups)]
        return [os.path.basename(f) for f in self.files]

    def _unit(self, partition: str) -> tuple[str, list[int] | None]:
        """The file and row groups (None: all) of ``partition``."""
        import os

        by_name = {os.path.basename(f): f for f in self.files}
        if len(self.files) == 1 and "#" in partition:
            name, _, group = partition.rpartition("#")
            if name in by_name and group.isdigit():
                return by_name[name], [int(group)]
        elif partition in by_name and len(self.files) > 1:
            return by_name[partition], None
        raise ValueError(f"ParquetSource({self.path!r}): {partition!r} is not one of its "
                         "partitions (a file name, or '<file>#<row group>' for one file)")

    def open_partition(self, partition: str, resume: Any, clock: Clock) -> SourceReader:
        path, groups = self._unit(partition)
        row = 0 if resume is None else resume
        if not _is_int(row) or row < 0:
            raise ValueError(f"ParquetSource resume state must be an int >= 0 (rows emitted); "
                             f"got {resume!r}")
        return _ParquetReader(self, path, groups, int(row), clock)


class _ParquetReader(SourceReader):
    def __init__(
        self, src: ParquetSource, path: str, groups: list[int] | None, row: int, clock: Clock,
    ) -> None:
        self._src = src
        self._path = path
        self._groups = groups
        self._clock = clock
        self._row = row  # rows of the partition already returned
        self._done = False
        self._file: Any = None
        self._batches: Any = None
        self._names: list[str] = []
        self._values: list[Any] = []  # decoded rows not yet returned
        self._ts: list[int | None] | None = None
        self._i = 0

    def _open_unit(self) -> bool:
        """Open the partition, skipping ``self._row`` rows; False when it is done."""
        import pyarrow.parquet as pq

        if self._done:
            return False
        path, groups = self._path, self._groups
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
        from engine.time.clock import now_ms

        values: list[Any] = []
        timestamps: list[int] = []
        out = SourceBatch(values, timestamps)
        want = max(0, max_records)
        while len(out) < want:
            if self._i >= len(self._values):
                if self._batches is None and not self._open_unit():
                    break
                batch = next(self._batches, None)
                if batch is None:
                    self._close_file()
                    self._done = True
                    continue
                self._decode(batch)
                continue
            take = min(want - len(out), len(self._values) - self._i)
            j = self._i
            values.extend(self._values[j:j + take])
            if self._ts is None:
                timestamps.extend([now_ms(self._clock)] * take)
            else:
                now = None
                for t in self._ts[j:j + take]:
                    if t is None:
                        now = now_ms(self._clock) if now is None else now
                        t = now
                    timestamps.append(t)
            self._i += take
            self._row += take
        if not out.values and self._done:
            return None
        return out

    def offset(self) -> Any:
        return self._row

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


# ---------------------------------------------------------------- columnar


class ColumnarSource(Source):
    """``source``'s records, which must be dict rows, as one column batch per poll: its
    partitions, resume states, rate, gates and timestamps unchanged (e.g. ``ColumnarSource(TestingSource(
    rows))`` in tests; a source that reads columns natively skips the conversion)."""

    def __init__(self, source: Source) -> None:
        if not isinstance(source, Source):
            raise ColumnarError(f"ColumnarSource wraps an engine.io.sources.Source; got "
                                f"{type(source).__name__}")
        self.source = source

    def partitions(self, parallelism: int) -> list[str]:
        return self.source.partitions(parallelism)

    def open_partition(self, partition: str, resume: Any, clock: Any) -> SourceReader:
        return _ColumnarReader(self.source.open_partition(partition, resume, clock))


class _ColumnarReader(SourceReader):
    def __init__(self, inner: SourceReader) -> None:
        self.inner = inner

    def poll(self, max_records: int) -> SourceBatch | None:
        import numpy

        b = self.inner.poll(max_records)
        from engine.columnar.batches import ColumnBatch

        if b is None or not len(b.values) or type(b.values) is ColumnBatch:
            return b
        assert isinstance(b.values, Sequence), "rows, when not a ColumnBatch"
        return SourceBatch(ColumnBatch.from_rows(b.values),
                           numpy.asarray(b.timestamps, dtype=numpy.int64))

    def offset(self) -> Any:
        return self.inner.offset()

    def seconds_until_ready(self) -> float:
        return self.inner.seconds_until_ready()

    def close(self) -> None:
        self.inner.close()
