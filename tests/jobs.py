"""Jobs and plain-Python references shared by the integration and oracle tests."""

from __future__ import annotations

from typing import Any

from engine import KeyedProcessFunction, StreamJob
from engine.config import JobConfig
from engine.testing import TestingSink, TestingSource

SMALL = JobConfig(batch_size=50, linger_ms=2, metrics_port=None)


def running_sum_job(records: list[tuple[int, int]], parallelism: int, sink: TestingSink,
                    rate: float | None = None, config: JobConfig = SMALL) -> StreamJob:
    job = StreamJob("running-sum", num_key_groups=32, parallelism=parallelism, config=config)
    (job.source(TestingSource(records, rate=rate), name="src", parallelism=1)
        .key_by(lambda r: r[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]), name="sum")
        .sink(sink, name="out"))
    return job


def running_sum_reference(records: list[tuple[int, int]]) -> list[tuple[int, int]]:
    acc: dict[int, int] = {}
    out = []
    for k, v in records:
        acc[k] = acc.get(k, 0) + v
        out.append((k, acc[k]))
    return out


class Profile(KeyedProcessFunction):
    """Uses value, list, map and reducing state; emits a deterministic summary per record."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.value_state("count", 0)
        self.last = ctx.list_state("last")
        self.seen = ctx.map_state("seen")
        self.total = ctx.reducing_state("total", lambda a, b: a + b)

    def process_element(self, value: Any, ctx: Any) -> Any:
        key, v = value
        self.count.update(self.count.value() + 1)
        self.last.add(v)
        if len(self.last.get()) > 3:
            self.last.update(self.last.get()[-3:])
        self.seen.put(v % 5, self.seen.get(v % 5, 0) + 1)
        self.total.add(v)
        yield (key, self.count.value(), tuple(self.last.get()), len(self.seen.keys()),
               self.total.get())


def profile_job(records: list[tuple[int, int]], parallelism: int, sink: TestingSink,
                rate: float | None = None) -> StreamJob:
    job = StreamJob("profile", num_key_groups=32, parallelism=parallelism, config=SMALL)
    (job.source(TestingSource(records, rate=rate), name="src", parallelism=1)
        .key_by(lambda r: r[0])
        .process(Profile(), name="profile")
        .sink(sink, name="out"))
    return job


def profile_reference(records: list[tuple[int, int]]) -> list[tuple]:
    state: dict[int, dict[str, Any]] = {}
    out = []
    for k, v in records:
        s = state.setdefault(k, {"count": 0, "last": [], "seen": {}, "total": 0})
        s["count"] += 1
        s["last"] = (s["last"] + [v])[-3:]
        s["seen"][v % 5] = s["seen"].get(v % 5, 0) + 1
        s["total"] += v
        out.append((k, s["count"], tuple(s["last"]), len(s["seen"]), s["total"]))
    return out


def per_key(records: list[tuple]) -> dict[Any, list[tuple]]:
    out: dict[Any, list[tuple]] = {}
    for r in records:
        out.setdefault(r[0], []).append(r)
    return out


def windowed_sum_job(records: list[tuple[int, int, int]], parallelism: int, sink: TestingSink,
                     rate: float | None = None, bound_ms: int = 40) -> StreamJob:
    """Event-time sliding windows (400 ms, slide 100 ms) summing values per key."""
    from engine.time import WatermarkStrategy, sliding_event_time

    job = StreamJob("windowed", num_key_groups=32, parallelism=parallelism, config=SMALL)
    (job.source(TestingSource(records, rate=rate, timestamp_fn=lambda r: r[2]), name="src",
                parallelism=1, watermarks=WatermarkStrategy(bound_ms, interval_ms=10))
        .key_by(lambda r: r[0])
        .window(sliding_event_time(400, 100))
        .reduce(lambda a, b: (a[0], a[1] + b[1], 0),
                window_fn=lambda k, w, r: [(k, w.start, w.end, r[1])], name="win")
        .sink(sink, name="out"))
    return job


def sliding_sums_reference(records: list[tuple[int, int, int]], size: int = 400,
                           slide: int = 100) -> dict[tuple[int, int, int], int]:
    acc: dict[tuple[int, int, int], int] = {}
    for k, v, ts in records:
        start = ts - ts % slide
        while start > ts - size:
            acc[(k, start, start + size)] = acc.get((k, start, start + size), 0) + v
            start -= slide
    return acc


def disordered(n: int, seed: int, keys: int = 30, bound_ms: int = 40,
               max_step_ms: int = 4) -> list[tuple[int, int, int]]:
    """(key, value, timestamp) with timestamps out of order by less than ``bound_ms``; the
    stream's time advances by 0..``max_step_ms - 1`` ms per record."""
    import random

    rng = random.Random(seed)
    out, t = [], 0
    for _ in range(n):
        t += rng.randrange(0, max_step_ms)
        out.append((rng.randrange(keys), rng.randrange(10), t + rng.randrange(-bound_ms + 1, 1)))
    return out


def processing_window_job(records: list[tuple[int, int]], parallelism: int, sink: TestingSink,
                          rate: float | None = None) -> StreamJob:
    """Processing-time tumbling windows counting records per key."""
    from engine.time import tumbling_processing_time

    job = StreamJob("ptwin", num_key_groups=32, parallelism=parallelism, config=SMALL)
    (job.source(TestingSource(records, rate=rate), name="src", parallelism=1)
        .key_by(lambda r: r[0])
        .window(tumbling_processing_time(200))
        .aggregate(CountAgg(), window_fn=lambda k, w, n: [(k, w.start, n)], name="ptwin")
        .sink(sink, name="out"))
    return job


class CountAgg:
    pass


def _count_agg():
    from engine.windows import AggregateFunction

    class _Count(AggregateFunction):
        def create_accumulator(self):
            return 0

        def add(self, value, acc):
            return acc + 1

    return _Count


CountAgg = _count_agg()  # noqa: F811 - a module-level class so Ray workers can import it
