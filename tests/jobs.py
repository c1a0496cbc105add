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
