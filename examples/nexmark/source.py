"""``NexmarkSource``: the seeded NEXMark generator as a replayable, parallel reflow source.

    from examples.nexmark.generator import NexmarkConfig
    from examples.nexmark.source import NexmarkSource

    # bounded, full speed, record timestamps = the events' date_time (use with watermarks)
    src = NexmarkSource(NexmarkConfig(seed=42), event_time=True, num_events=100_000,
                        kinds=("bids",))
    # open loop at 20,000 events/s with event time == scheduled emission time (wall clock)
    src = NexmarkSource.realtime(NexmarkConfig(seed=42), rate=20_000, kinds=("bids",))

Records are plain tuples of the standard snake_case fields, in this order:

* person:  ``(id, name, email_address, credit_card, city, state, date_time, extra)``
* auction: ``(id, item_name, description, initial_bid, reserve, date_time, expires, seller,
  category, extra)``
* bid:     ``(auction, bidder, price, channel, url, date_time, extra)``

The kinds have different lengths (8, 10, 7 fields), so :func:`kind_of_record` tells them
apart in a source that emits several kinds. ``date_time`` and ``expires`` are int ms.

Partitions: event numbers are cut into blocks of ``split_events`` consecutive events
(default 4096, the generator's randomness chunk) and partition ``j`` of ``n`` (id
``"j-of-n"``; ``partitions=n``, or one per initial source task) takes blocks
``j, j + n, j + 2n, ...``; within a partition events come in event-number (= event-time)
order, whichever task reads it. A partition's resume state is the next event number it will
read (an int), so opening at it resumes exactly. With the default split a partition
generates only its own chunks; a smaller split interleaves the partitions more finely
(useful for small inputs and for open-loop runs at n > 1, where a partition otherwise sits
idle for ``(n - 1) * split_events / rate`` seconds between its blocks and holds back the
downstream watermark meanwhile) at the cost of every partition generating every chunk it
touches.

Timestamps (explicit, ``event_time`` has no default):

* ``event_time=True``: a record's timestamp is the event's ``date_time`` (event time; build
  the job with a ``WatermarkStrategy``; events of a task are in timestamp order, so
  ``max_out_of_orderness_ms=0`` is exact).
* ``event_time=False``: the scheduled emission time (open loop, like
  ``engine.io.sources.GeneratorSource``, so waiting for a slow engine counts as latency), or the
  poll time at full speed.

Pacing: ``rate`` (events/s over all tasks, counting every event number, including the kinds
filtered out) makes the source open loop: event ``n`` is due at
``start_time_ms + n * 1000 / rate`` and is emitted as soon as possible after that (a lagging
source catches up, never drops). ``rate`` may also be a list of ``(seconds, events/s)`` steps
(a rate ladder for benchmarks; the last rate continues). ``start_time_ms`` is a wall-clock
epoch ms; by default it is set when the reader opens so that the first event it reads is due
at once (each task anchors its own schedule). ``rate=None``: full speed. :meth:`NexmarkSource.realtime` makes event time and the schedule coincide
(``first_event_rate = rate``, ``base_time_ms = start_time_ms``), so the latency of a windowed
result (sink arrival - window end) is its real delay.
"""

from __future__ import annotations

import copy
import gc
import math
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from engine import Source, SourceBatch, SourceReader
from engine.io import indexed_partitions, parse_indexed
from engine.io.sources import scheduled_resume
from engine.time import Clock, now_ms
from examples.nexmark.generator import (
    AUCTION,
    AUCTION_FIELDS,
    BID,
    BID_FIELDS,
    CHUNK_SIZE,
    PERSON,
    PERSON_FIELDS,
    NexmarkConfig,
    NexmarkGenerator,
)

KINDS = ("persons", "auctions", "bids")
_KIND_INDEX = {"persons": PERSON, "auctions": AUCTION, "bids": BID}
_FIELDS = (PERSON_FIELDS, AUCTION_FIELDS, BID_FIELDS)
_LENGTH_KIND = {len(PERSON_FIELDS): "persons", len(AUCTION_FIELDS): "auctions",
                len(BID_FIELDS): "bids"}
#: events one poll may scan at most (bounds a poll's duration when the kinds are sparse)
MAX_EVENTS_PER_POLL = 65_536


def kind_of_record(record: Sequence[Any]) -> str:
    """``"persons"``, ``"auctions"`` or ``"bids"``: a record's kind, from its length."""
    return _LENGTH_KIND[len(record)]


def is_person(record: Sequence[Any]) -> bool:
    return len(record) == len(PERSON_FIELDS)


def is_auction(record: Sequence[Any]) -> bool:
    return len(record) == len(AUCTION_FIELDS)


def is_bid(record: Sequence[Any]) -> bool:
    return len(record) == len(BID_FIELDS)


def _normalise_kinds(kinds: str | Iterable[str]) -> tuple[str, ...]:
    if isinstance(kinds, str):
        kinds = (kinds,)
    kinds = tuple(kinds)
    bad = [k for k in kinds if k not in _KIND_INDEX]
    if bad or not kinds:
        raise ValueError(f"NexmarkSource kinds must be a non-empty subset of {KINDS}; got {kinds!r}")
    return tuple(k for k in KINDS if k in kinds)  # canonical order, no duplicates


class NexmarkSource(Source):
    """The NEXMark event stream of ``config`` (see the module docstring).

    * ``event_time`` (required): record timestamps are the events' ``date_time`` (True) or the
      scheduled emission / poll time (False).
    * ``num_events``: events ``[0, num_events)`` over all tasks (None: unbounded).
    * ``kinds``: which of ``"persons"``, ``"auctions"``, ``"bids"`` to emit (the others are
      generated and skipped; event numbers, ids and times do not change).
    * ``rate``: events/s over all tasks, open loop, or ``[(seconds, events/s), ...]`` steps
      (:class:`RateSchedule`); None = full speed.
    * ``start_time_ms``: wall-clock ms at which event 0 is due (rate only); None = when the
      first reader opens. A reader reopened from its resume state (a restore, a
      stop-restart rescale, a moved partition) keeps that time, so events that fell due
      while no task read them are due at once and the outage shows in their latency.
    * Resume state: the next event number (an int) at full speed; with a rate ``[event
      number, event 0's due time in epoch ms]`` (a bare int restarts the schedule then).
    * ``split_events``: the block size of the partitions.
    * ``partitions``: how many partitions (None: one per initial source task).
    """

    def __init__(
        self,
        config: NexmarkConfig | None = None,
        *,
        event_time: bool,
        num_events: int | None = None,
        kinds: str | Iterable[str] = KINDS,
        rate: float | Sequence[tuple[float, float]] | None = None,
        start_time_ms: float | None = None,
        split_events: int = CHUNK_SIZE,
        partitions: int | None = None,
    ) -> None:
        if not isinstance(event_time, bool):
            raise ValueError("NexmarkSource event_time must be True (date_time) or False "
                             "(scheduled emission time)")
        if num_events is not None and (isinstance(num_events, bool) or not isinstance(num_events, int)
                                       or num_events < 0):
            raise ValueError(f"NexmarkSource num_events must be an int >= 0 or None; got {num_events!r}")
        schedule = None if rate is None else RateSchedule.of(rate)  # validates
        if start_time_ms is not None and rate is None:
            raise ValueError("NexmarkSource start_time_ms needs a rate")
        if isinstance(split_events, bool) or not isinstance(split_events, int) or split_events < 1:
            raise ValueError(f"NexmarkSource split_events must be an int >= 1; got {split_events!r}")
        if partitions is not None and (isinstance(partitions, bool)
                                       or not isinstance(partitions, int) or partitions < 1):
            raise ValueError(f"NexmarkSource partitions must be an int >= 1 or None (one per "
                             f"initial source task); got {partitions!r}")
        self.num_partitions = partitions
        self.config = config or NexmarkConfig()
        self.event_time = event_time
        self.num_events = num_events
        self.kinds = _normalise_kinds(kinds)
        # a number for a constant rate, else the steps
        self.rate = None if schedule is None else (
            schedule.rates[0] if schedule.constant else schedule.steps)
        self.start_time_ms = None if start_time_ms is None else float(start_time_ms)
        self.split_events = split_events

    @classmethod
    def realtime(cls, config: NexmarkConfig | None = None, *, rate: float,
                 start_time_ms: float | None = None, lead_s: float = 3.0,
                 **kwargs: Any) -> NexmarkSource:
        """An open-loop source whose event time is wall-clock time: ``first_event_rate`` is
        ``rate`` and ``base_time_ms`` is ``start_time_ms`` (default: now + ``lead_s``, so that
        the job is deployed before event 0 is due), and timestamps are ``date_time``."""
        if start_time_ms is None:
            start_time_ms = int((time.time() + lead_s) * 1000)
        cfg = (config or NexmarkConfig()).replace(first_event_rate=float(rate),
                                                   base_time_ms=int(start_time_ms))
        return cls(cfg, event_time=True, rate=rate, start_time_ms=int(start_time_ms), **kwargs)

    def with_kinds(self, kinds: str | Iterable[str]) -> NexmarkSource:
        """The same stream (config, bounds, pacing, timestamps) with other kinds."""
        out = copy.copy(self)
        out.kinds = _normalise_kinds(kinds)
        return out

    # -- sizes
    def partition_events(self, index: int, count: int) -> int | None:
        """Events (of every kind) in partition ``index`` of ``count``; None when unbounded."""
        if self.num_events is None:
            return None
        s = self.split_events
        full, rest = divmod(self.num_events, s)
        mine = len(range(index, full, count)) * s
        if rest and full % count == index:
            mine += rest
        return mine

    def count(self) -> dict[str, int]:
        """How many records of each selected kind ``[0, num_events)`` holds (bounded only)."""
        if self.num_events is None:
            raise ValueError("an unbounded source has no count")
        persons, auctions, bids = self.config.count_before(self.num_events)
        counts = {"persons": persons, "auctions": auctions, "bids": bids}
        return {k: counts[k] for k in self.kinds}

    def partitions(self, parallelism: int) -> list[str]:
        return indexed_partitions(self.num_partitions or parallelism)

    def open_partition(self, partition: str, resume: Any, clock: Clock) -> SourceReader:
        index, count = parse_indexed(partition, "NexmarkSource")
        if isinstance(resume, np.integer):
            resume = int(resume)
        pos, origin_ms = scheduled_resume(resume, "NexmarkSource")
        return NexmarkReader(self, index, count, pos, clock, origin_ms)


class NexmarkReader(SourceReader):
    """One partition of a :class:`NexmarkSource`."""

    def __init__(self, src: NexmarkSource, index: int, count: int, pos: int,
                 clock: Clock, origin_ms: float | None = None) -> None:
        self._src = src
        self._task = index
        self._p = count
        self._split = src.split_events
        self._end = src.num_events  # global bound (None: unbounded)
        self._kinds = [_KIND_INDEX[k] for k in src.kinds]
        self._gen = NexmarkGenerator(src.config)
        self._clock = clock
        self._pos = self._mine(pos)
        self._schedule = None if src.rate is None else RateSchedule.of(src.rate)
        if self._schedule is None:
            self._start_ms = 0.0
        elif src.start_time_ms is not None:
            self._start_ms = src.start_time_ms
        elif origin_ms is not None:  # reopened: the schedule goes on
            self._start_ms = origin_ms
        else:  # the event at the offset is due now
            self._start_ms = clock.now() * 1000.0 - self._schedule.time_of(self._pos)

    # -- positions
    def _mine(self, n: int) -> int:
        """The first event number >= n in this task's blocks."""
        block = n // self._split
        ahead = (self._task - block) % self._p
        return n if ahead == 0 else (block + ahead) * self._split

    def _due(self) -> int:
        """One past the last event number due now (all tasks)."""
        if self._schedule is None:
            return 1 << 62
        elapsed = now_ms_float(self._clock) - self._start_ms
        if elapsed < 0:
            return 0
        return int(self._schedule.events_by(elapsed) + 1e-9) + 1

    def _exhausted(self) -> bool:
        return self._end is not None and self._pos >= self._end

    # -- SourceReader
    def poll(self, max_records: int) -> SourceBatch | None:
        if self._exhausted():
            return None
        limit = self._due()
        if self._end is not None:
            limit = min(limit, self._end)
        want = max(0, max_records)
        scanned = 0
        parts: list[tuple[list, np.ndarray, np.ndarray]] = []  # (records, event numbers, times)
        got = 0
        enabled = gc.isenabled()
        gc.disable()  # building many tuples triggers the cyclic GC over and over
        try:
            while got < want and self._pos < limit and scanned < MAX_EVENTS_PER_POLL:
                lo = self._pos
                hi = min(limit, (lo // self._split + 1) * self._split, lo + MAX_EVENTS_PER_POLL)
                batch = self._gen.events(lo, hi - lo)
                cols = [batch.by_kind(k) for k in self._kinds]
                numbers = [c.data["event_number"] for c in cols]
                if len(cols) == 1:
                    merged = numbers[0]
                else:
                    merged = np.sort(np.concatenate(numbers), kind="stable")
                if len(merged) > want - got:  # cut the range after the last record we take
                    hi = int(merged[want - got - 1]) + 1
                    cut = [int(np.searchsorted(n, hi)) for n in numbers]
                    cols = [c.slice(0, j) for c, j in zip(cols, cut, strict=True)]
                    numbers = [n[:j] for n, j in zip(numbers, cut, strict=True)]
                for c, n in zip(cols, numbers, strict=True):
                    if len(n):
                        recs = list(zip(*(c.column_list(f) for f in _FIELDS[c.kind]), strict=True))
                        parts.append((recs, n, c.data["date_time"]))
                        got += len(recs)
                scanned += hi - lo
                self._pos = self._mine(hi)
        finally:
            if enabled:
                gc.enable()
        if not parts:
            return None if self._exhausted() else SourceBatch()
        return self._assemble(parts)

    def _assemble(self, parts: list[tuple[list, np.ndarray, np.ndarray]]) -> SourceBatch:
        if len(parts) == 1:
            values = parts[0][0]
            numbers, times = parts[0][1], parts[0][2]
        else:
            values = [r for p in parts for r in p[0]]
            numbers = np.concatenate([p[1] for p in parts])
            times = np.concatenate([p[2] for p in parts])
            if len(self._kinds) > 1:  # restore event-number order across kinds
                order = np.argsort(numbers, kind="stable")
                values = [values[i] for i in order.tolist()]
                numbers, times = numbers[order], times[order]
        if self._src.event_time:
            timestamps = times.tolist()
        elif self._schedule is None:
            timestamps = [now_ms(self._clock)] * len(values)
        else:
            sched = self._schedule.times_of(numbers) + self._start_ms
            timestamps = np.floor(sched).astype(np.int64).tolist()
        return SourceBatch(values, timestamps)

    def offset(self) -> Any:
        return self._pos if self._schedule is None else [self._pos, self._start_ms]

    def seconds_until_ready(self) -> float:
        if self._schedule is None or self._exhausted():
            return 0.0
        due_ms = self._start_ms + self._schedule.time_of(self._pos)
        return max(0.0, (due_ms - now_ms_float(self._clock)) / 1000.0)

    def backlog(self) -> int | None:
        """Events of this task due by the schedule and not read yet (about 1/p of the
        job's events due past this task's position; None at full speed)."""
        if self._schedule is None:
            return None
        due = self._due() if self._end is None else min(self._due(), self._end)
        return max(0, due - self._pos) // self._p


def now_ms_float(clock: Clock) -> float:
    return clock.now() * 1000.0


class RateSchedule:
    """Open-loop pacing: ``steps`` of ``(seconds, events/s)``, the last rate continuing for
    ever (a constant rate is one step). ``events_by(ms)``: how many events are due ``ms`` after
    the start (a float); ``time_of(n)``: when event ``n`` is due (ms after the start)."""

    def __init__(self, steps: Sequence[tuple[float, float]]) -> None:
        steps = [(float(d), float(r)) for d, r in steps]
        if not steps:
            raise ValueError("a rate schedule needs at least one step")
        for d, r in steps:
            if not (math.isfinite(r) and r > 0) or not d > 0:
                raise ValueError(f"rate steps must be (seconds > 0, events/s > 0); got {steps!r}")
        self.steps = tuple(steps)
        self.rates = tuple(r for _, r in steps)
        self.constant = len(steps) == 1
        self._per_ms = np.array([r / 1000.0 for r in self.rates])
        self._t = np.zeros(len(steps))  # start of each step (ms)
        self._n = np.zeros(len(steps))  # events due before each step
        for k in range(1, len(steps)):
            d = steps[k - 1][0] * 1000.0
            self._t[k] = self._t[k - 1] + d
            self._n[k] = self._n[k - 1] + d * self._per_ms[k - 1]

    @staticmethod
    def of(rate: float | Sequence[tuple[float, float]]) -> RateSchedule:
        if isinstance(rate, RateSchedule):
            return rate
        if isinstance(rate, (int, float)) and not isinstance(rate, bool):
            if not (math.isfinite(rate) and rate > 0):
                raise ValueError(f"NexmarkSource rate must be a finite number > 0 events/s, a "
                                 f"list of (seconds, events/s) steps or None; got {rate!r}")
            return RateSchedule([(math.inf, float(rate))])
        try:
            steps = [(d, r) for d, r in rate]
        except (TypeError, ValueError):
            raise ValueError(f"NexmarkSource rate must be a number, a list of (seconds, events/s) "
                             f"steps or None; got {rate!r}") from None
        return RateSchedule(steps)

    def events_by(self, ms: float) -> float:
        k = int(np.searchsorted(self._t, ms, side="right")) - 1
        return float(self._n[k] + (ms - self._t[k]) * self._per_ms[k])

    def time_of(self, n: float) -> float:
        k = int(np.searchsorted(self._n, n, side="right")) - 1
        return float(self._t[k] + (n - self._n[k]) / self._per_ms[k])

    def times_of(self, n: np.ndarray) -> np.ndarray:
        k = np.searchsorted(self._n, n, side="right") - 1
        return self._t[k] + (n - self._n[k]) / self._per_ms[k]

    def total_events(self) -> int:
        """Events due by the end of the last step (the schedule's size; finite steps only)."""
        d = self.steps[-1][0] * 1000.0
        if not math.isfinite(d):
            raise ValueError("the last step is endless")
        return int(self._n[-1] + d * self._per_ms[-1])
