"""Jobs, plain-Python references and event helpers shared by the integration and oracle
tests (Ray workers import this module as ``tests.jobs``).

Tests act on events, never on wall time: ``Moment`` holds a job's source at a record so a
rescale always finds input left, and ``wait_until`` waits for a status or metric
condition with a generous timeout, failing early (with the job's error) when the job
ends first.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from engine import KeyedProcessFunction, StreamJob
from engine.dataflow.config import JobConfig
from engine.io.sinks import Sink
from engine.io.sources import Source, SourceBatch, SourceReader
from engine.io.testing import SourceGate, TestingSink, TestingSource
from engine.names import JobState

SMALL = JobConfig(batch_size=50, linger_ms=2, metrics_port=None)
TIMEOUT_S = 180.0  # generous: the suite must pass on a machine at load 20-30
_POLL_S = 0.02

T = TypeVar("T")
Gates = Sequence[SourceGate] | None


# ------------------------------------------------------------------------- acting on events

def task_actors(handle: Any, vertex: str) -> list[str]:
    """The job's live task actors of ``vertex`` (named ``<job>/<vertex>/<i>/g<n>``)."""
    import ray

    return sorted(n["name"] for n in ray.util.list_named_actors(all_namespaces=True)
                  if isinstance(n, dict) and n["name"].startswith(f"{handle.job_id}/{vertex}/"))


def wait_until(cond: Callable[[], bool], what: str, handle: Any = None,
               timeout: float = TIMEOUT_S) -> None:
    """Return once ``cond()`` holds. Fails (naming ``what``) when ``timeout`` passes, or,
    given a job ``handle``, as soon as the job is no longer running (with its error)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if handle is not None:
            st = handle.status()
            if not JobState(st.state).active:
                raise AssertionError(f"job {st.job} is {st.state} while waiting for {what}"
                                     f"{': ' + st.error if st.error else ''}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(_POLL_S)


@dataclass(frozen=True)
class Moment:
    """A point in a source's input where a test acts while input remains.

    The source holds at ``start`` (after record ``start.after``) until the test acts; then
    it emits up to record ``end.after`` (records flow during the action) and holds there
    until the action has returned, so the input cannot end during the action: a rescale
    is never refused as "finishing" nor cut short by the end of the input.
    """

    start: SourceGate
    end: SourceGate

    @classmethod
    def at(cls, record: int, margin: int, num_records: int) -> Moment:
        if not 0 <= record <= num_records or margin < 0:
            raise ValueError(f"a moment at record {record} with margin {margin} does not fit "
                             f"{num_records} records")
        return cls(SourceGate(record), SourceGate(min(num_records, record + margin)))

    @property
    def gates(self) -> tuple[SourceGate, SourceGate]:
        return (self.start, self.end)

    def wait(self, handle: Any, timeout: float = TIMEOUT_S) -> None:
        """Until the source holds at ``start`` (fails early when the job ends)."""
        wait_until(self.start.reached, f"the source to emit {self.start.after} records",
                   handle, timeout)

    def act(self, handle: Any, action: Callable[[], T], timeout: float = TIMEOUT_S) -> T:
        """Wait for the moment, let records flow, run ``action``, then release the source."""
        self.wait(handle, timeout)
        self.start.open()
        try:
            return action()
        finally:
            self.end.open()

    def release(self) -> None:
        """Open both gates (cleanup after a failed test, so the job can end)."""
        self.start.open()
        self.end.open()

    def run(self, handle: Any, action: Callable[[], T], job_timeout: float = TIMEOUT_S) -> T:
        """``act`` at the moment, then wait up to ``job_timeout`` for the job to end; the
        gates are released and the job stopped whatever happens. Returns what ``action``
        returned."""
        try:
            result = self.act(handle, action)
            handle.wait(job_timeout)
            return result
        finally:
            self.release()
            handle.stop()


def moments(num_records: int, fractions: Sequence[float], margin: int) -> list[Moment]:
    """One moment per fraction of the input (cumulative fractions, in order)."""
    out, at = [], 0.0
    for f in fractions:
        at += f
        out.append(Moment.at(min(num_records, int(num_records * at)), margin, num_records))
    return out


def gates_of(moments_: Sequence[Moment]) -> list[SourceGate]:
    return [g for m in moments_ for g in m.gates]


def rescale_at(handle: Any, operator: str, steps: Sequence[tuple[Moment, int]],
               protocol: str = "drrs", job_timeout: float = TIMEOUT_S,
               ) -> tuple[list[Any], list[str]]:
    """At each moment, rescale ``operator`` to the step's parallelism; then wait for the
    job (the gates are released and the job stopped whatever happens). Returns the
    reports and the refusals (recorded, never swallowed: with the source held no valid
    request may be refused)."""
    reports: list[Any] = []
    refused: list[str] = []

    def rescale(p: int) -> None:
        from engine.errors import RescaleRefused

        try:
            reports.append(handle.rescale(operator, p, protocol=protocol))
        except RescaleRefused as exc:
            refused.append(f"rescale to {p}: {exc}")

    try:
        for moment, p in steps:
            moment.act(handle, lambda p=p: rescale(p))
        handle.wait(job_timeout)
    finally:
        for moment, _ in steps:
            moment.release()
        handle.stop()
    return reports, refused


def check_reports(reports: Sequence[Any], context: str = "") -> None:
    """Every report of a rescale that changed something moved key groups (a report of an
    operator without key groups, ``stateless`` or ``handover``, is skipped): a plan that
    moves groups moved them all (unless a newer request superseded it), and a change of
    parallelism planned moves, except right after a superseded rescale (a cut-short
    scale-out keeps tasks that may hold no group; removing them moves nothing)."""
    from migration.protocols import LiveMechanism

    cut_short: set[str] = set()
    for r in reports:
        if r.protocol in (LiveMechanism.STATELESS, LiveMechanism.HANDOVER):
            continue  # an operator without key groups: nothing to move
        what = (f"{r.protocol} {r.old_parallelism}->{r.new_parallelism} of {r.operator!r} "
                f"(planned {r.key_groups_planned}, moved {r.key_groups_moved}) {context}")
        if r.old_parallelism != r.new_parallelism and r.operator not in cut_short:
            assert r.key_groups_planned > 0, f"a change of parallelism planned no move: {what}"
        if r.key_groups_planned > 0 and not r.superseded:
            assert r.key_groups_moved == r.key_groups_planned > 0, f"groups left behind: {what}"
        if r.superseded:
            cut_short.add(r.operator)
        else:
            cut_short.discard(r.operator)


# ------------------------------------------------------------------------------------ jobs

def running_sum_job(records: list[tuple[int, int]], parallelism: int, sink: Sink,
                    rate: float | None = None, config: JobConfig = SMALL,
                    gates: Gates = None) -> StreamJob:
    job = StreamJob("running-sum", num_key_groups=32, parallelism=parallelism, config=config)
    (job.source(TestingSource(records, rate=rate, gate=gates), name="src", parallelism=1)
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


def profile_job(records: list[tuple[int, int]], parallelism: int, sink: Sink,
                rate: float | None = None, gates: Gates = None,
                config: JobConfig = SMALL) -> StreamJob:
    job = StreamJob("profile", num_key_groups=32, parallelism=parallelism, config=config)
    (job.source(TestingSource(records, rate=rate, gate=gates), name="src", parallelism=1)
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


def _scaled(table: Any) -> Any:
    """map_batches' function in the columnar job: ``v`` -> ``2 v + 1`` (a pyarrow Table)."""
    import pyarrow.compute as pc

    return table.set_column(table.schema.get_field_index("v"), "v",
                            pc.add(pc.multiply(table["v"], 2), 1))


def columnar_agg_job(records: list[tuple[int, int]], parallelism: int, sink: TestingSink,
                     rate: float | None = None, gates: Gates = None,
                     config: JobConfig = SMALL) -> StreamJob:
    """The columnar path: dict rows as column batches -> ``map_batches`` -> ``key_by`` a
    column -> the vectorised Count, Sum, Min, Max and Mean (operator ``agg``)."""
    from engine.io.sources import ColumnarSource
    from engine.operators.vectorised import Count, Max, Mean, Min, Sum

    rows = [{"k": k, "v": v} for k, v in records]
    job = StreamJob("columnar", num_key_groups=32, parallelism=parallelism, config=config)
    (job.source(ColumnarSource(TestingSource(rows, rate=rate, gate=gates)), name="src",
                parallelism=1)
        .map_batches(_scaled, name="scale")
        .key_by("k")
        .aggregate(Count(), Sum("v"), Min("v"), Max("v"), Mean("v"), name="agg")
        .sink(sink, name="out"))
    return job


def columnar_agg_rows(results: list[dict[str, Any]]) -> list[tuple]:
    """The columnar job's dict rows as tuples (key first), for ``per_key``."""
    return [(r["k"], r["count()"], r["sum(v)"], r["min(v)"], r["max(v)"], r["mean(v)"])
            for r in results]


def columnar_agg_reference(records: list[tuple[int, int]]) -> list[tuple]:
    acc: dict[int, list[int]] = {}
    out = []
    for k, v in records:
        v = 2 * v + 1
        a = acc.get(k)
        a = acc[k] = [1, v, v, v] if a is None else [a[0] + 1, a[1] + v, min(a[2], v),
                                                     max(a[3], v)]
        out.append((k, a[0], a[1], a[2], a[3], a[1] / a[0]))
    return out


def per_key(records: list[tuple]) -> dict[Any, list[tuple]]:
    out: dict[Any, list[tuple]] = {}
    for r in records:
        out.setdefault(r[0], []).append(r)
    return out


def windowed_sum_job(records: list[tuple[int, int, int]], parallelism: int, sink: TestingSink,
                     rate: float | None = None, bound_ms: int = 40,
                     gates: Gates = None) -> StreamJob:
    """Event-time sliding windows (400 ms, slide 100 ms) summing values per key."""
    from engine.time.event_time import WatermarkStrategy, sliding_event_time

    job = StreamJob("windowed", num_key_groups=32, parallelism=parallelism, config=SMALL)
    (job.source(TestingSource(records, rate=rate, timestamp_fn=lambda r: r[2], gate=gates),
                name="src",
                parallelism=1, watermarks=WatermarkStrategy(bound_ms, interval_ms=10))
        .key_by(lambda r: r[0])
        .window(sliding_event_time(400, 100))
        .reduce(lambda a, b: (a[0], a[1] + b[1], 0),
                window_fn=lambda k, w, r: [(k, w.start, w.end, r[1])], name="win")
        .sink(sink, name="out"))
    return job


def columnar_window_job(records: list[tuple[int, int, int]], parallelism: int,
                        sink: TestingSink, rate: float | None = None, bound_ms: int = 40,
                        gates: Gates = None, config: JobConfig = SMALL) -> StreamJob:
    """The vectorised window aggregates: (key, value, timestamp) as column batches ->
    ``key_by("k")`` -> sliding event-time windows (400 ms, slide 100 ms, allowed lateness
    300 ms, so fired windows stay in state) with Count, Sum, Min, Max, Mean (operator
    ``cwin``)."""
    from engine.io.sources import ColumnarSource
    from engine.operators.vectorised import Count, Max, Mean, Min, Sum
    from engine.time.event_time import WatermarkStrategy, sliding_event_time

    rows = [{"k": k, "v": v, "ts": t} for k, v, t in records]
    job = StreamJob("cwindowed", num_key_groups=32, parallelism=parallelism, config=config)
    (job.source(ColumnarSource(TestingSource(rows, rate=rate, timestamp_fn=_row_ts, gate=gates)),
                name="src", parallelism=1,
                watermarks=WatermarkStrategy(bound_ms, interval_ms=10))
        .key_by("k")
        .window(sliding_event_time(400, 100), allowed_lateness_ms=300)
        .aggregate(Count(), Sum("v"), Min("v"), Max("v"), Mean("v"), name="cwin")
        .sink(sink, name="out"))
    return job


def _row_ts(row: dict[str, Any]) -> int:
    return row["ts"]


def columnar_window_rows(results: list[dict[str, Any]]) -> list[tuple]:
    """The vectorised window job's rows as tuples (key first), for ``per_key``."""
    return [(r["k"], r["window_start"], r["window_end"], r["count()"], r["sum(v)"],
             r["min(v)"], r["max(v)"], r["mean(v)"]) for r in results]


def columnar_window_reference(records: list[tuple[int, int, int]], size: int = 400,
                              slide: int = 100) -> list[tuple]:
    """Per (key, window) what the job emits, per key in firing order (window end)."""
    acc: dict[tuple[int, int], list[int]] = {}
    for k, v, ts in records:
        start = ts - ts % slide
        while start > ts - size:
            a = acc.get((k, start))
            acc[(k, start)] = [1, v, v, v] if a is None else [a[0] + 1, a[1] + v,
                                                              min(a[2], v), max(a[3], v)]
            start -= slide
    return [(k, s, s + size, a[0], a[1], a[2], a[3], a[1] / a[0])
            for (k, s), a in sorted(acc.items(), key=lambda e: (e[0][1], e[0][0]))]


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
                          rate: float | None = None, gates: Gates = None) -> StreamJob:
    """Processing-time tumbling windows counting records per key."""
    from engine.time.event_time import tumbling_processing_time

    job = StreamJob("ptwin", num_key_groups=32, parallelism=parallelism, config=SMALL)
    (job.source(TestingSource(records, rate=rate, gate=gates), name="src", parallelism=1)
        .key_by(lambda r: r[0])
        .window(tumbling_processing_time(200))
        .aggregate(CountAgg(), window_fn=lambda k, w, n: [(k, w.start, n)], name="ptwin")
        .sink(sink, name="out"))
    return job


class CountAgg:
    pass


def _count_agg():
    from engine.operators.windows import AggregateFunction

    class _Count(AggregateFunction):
        def create_accumulator(self):
            return 0

        def add(self, value, acc):
            return acc + 1

    return _Count


CountAgg = _count_agg()  # noqa: F811 - a module-level class so Ray workers can import it


# ---------------------------------------------------------------- rates that step on events

def stepped_record(i: int, keys: int = 40) -> tuple[int, int]:
    """Record ``i`` of a ``SteppedSource``: ``(key, value)``, the same in every run."""
    return ((i * 7919) % keys, i % 10)


class SteppedSource(Source):
    """An open-loop source (one task) of ``stepped_record(i)`` whose rate steps on events:
    it emits at ``rates[k]`` records/s until ``gates[k]`` is opened, then at
    ``rates[k + 1]``; once the last gate is open it emits ``tail`` more records and ends.
    A rate step keeps what was due (a backlog stays a backlog); ``backlog()`` is the
    records due and not emitted, so an autoscaler sees the demand. ``len(rates)`` is
    ``len(gates) + 1``."""

    def __init__(self, rates: Sequence[float], gates: Sequence[SourceGate], tail: int,
                 keys: int = 40) -> None:
        if len(rates) != len(gates) + 1:
            raise ValueError("SteppedSource needs one rate more than gates")
        self.rates, self.gates, self.tail, self.keys = tuple(rates), tuple(gates), tail, keys

    def partitions(self, parallelism: int) -> list[str]:
        return ["stepped"]  # one partition: the steps are one sequence

    def open_partition(self, partition: str, resume: Any, clock: Any) -> SourceReader:
        return _SteppedReader(self, int(resume or 0), clock)


class _SteppedReader(SourceReader):
    _CHECK_S = 0.02  # how often a step's gate is looked at

    def __init__(self, src: SteppedSource, pos: int, clock: Any) -> None:
        self.src, self.pos, self.clock = src, pos, clock
        self.step = 0
        self.since = clock.monotonic()  # when the current step started
        self.base = pos                 # records due when it started
        self.end: int | None = None
        self.checked = 0.0

    def _due(self, now: float) -> int:
        return self.base + int((now - self.since) * self.src.rates[self.step])

    def _advance(self, now: float) -> None:
        if self.end is not None or now - self.checked < self._CHECK_S:
            return
        self.checked = now
        while self.step < len(self.src.gates) and self.src.gates[self.step].is_open():
            self.base, self.since = self._due(now), now
            self.step += 1
        if self.step == len(self.src.gates) and self.src.gates:
            self.end = max(self.pos, self.base) + self.src.tail

    def poll(self, max_records: int) -> SourceBatch | None:
        now = self.clock.monotonic()
        self._advance(now)
        if self.end is not None and self.pos >= self.end:
            return None
        stop = min(self._due(now), self.pos + max_records)
        if self.end is not None:
            stop = min(stop, self.end)
        if stop <= self.pos:
            return SourceBatch()
        values = [stepped_record(i, self.src.keys) for i in range(self.pos, stop)]
        self.pos = stop
        return SourceBatch(values, [int(now * 1000)] * len(values))

    def offset(self) -> Any:
        return self.pos

    def seconds_until_ready(self) -> float:
        return min(self._CHECK_S, 1.0 / self.src.rates[self.step])

    def backlog(self) -> int | None:
        return max(0, self._due(self.clock.monotonic()) - self.pos)


class ServiceSum(KeyedProcessFunction):
    """A running sum per key that costs ``service_us`` per record
    (``examples.bench.harness.jobs.ServiceTime``: about 1e6 / ``service_us`` records/s per
    task whatever the machine's load), so parallelism matters."""

    def __init__(self, service_us: float) -> None:
        self.service_us = service_us

    def open(self, ctx: Any) -> None:
        from examples.bench.harness.jobs import ServiceTime

        self.total = ctx.value_state("total", 0)
        self.service = ServiceTime(self.service_us)

    def process_element(self, value: Any, ctx: Any) -> Any:
        total = self.total.value() + value[1]
        self.total.update(total)
        self.service.spend()
        yield (ctx.key, total)


def service_sum_job(source: Source, sink: TestingSink, service_us: float,
                    config: JobConfig, parallelism: int = 1) -> StreamJob:
    job = StreamJob("autoscaled", num_key_groups=32, parallelism=parallelism, config=config)
    (job.source(source, name="src", parallelism=1)
        .key_by(lambda r: r[0])
        .process(ServiceSum(service_us), name="sum")
        .sink(sink, name="out"))
    return job


def stepped_reference(n: int, keys: int = 40) -> list[tuple[int, int]]:
    """What ``service_sum_job`` outputs for the first ``n`` records of a ``SteppedSource``."""
    acc: dict[int, int] = {}
    out = []
    for i in range(n):
        k, v = stepped_record(i, keys)
        acc[k] = acc.get(k, 0) + v
        out.append((k, acc[k]))
    return out


# ------------------------------------------------------------------------ change of logic

class Tag(KeyedProcessFunction):
    """Counts per key and tags each output with the logic's version:
    ``(key, i, count, tag)`` for a record ``(key, i)``."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def open(self, ctx: Any) -> None:
        self.count = ctx.value_state("count", 0)

    def process_element(self, value: Any, ctx: Any) -> Any:
        self.count.update(self.count.value() + 1)
        yield (value[0], value[1], self.count.value(), self.tag)


def load_outside_tasks(tag: str) -> Tag:
    """Unpickles an ``Unloadable`` anywhere but in a task actor (where it raises, as a
    function whose module exists only on the driver's machine would)."""
    import ray

    name = ray.get_runtime_context().get_actor_name() or ""
    if name.count("/") >= 3:  # a task: <job>/<operator>/<index>/g<generation>
        raise ImportError(f"logic {tag!r} cannot be loaded in task {name}")
    return Unloadable(tag)


class Unloadable(Tag):
    """A ``Tag`` that the tasks cannot deserialise (see ``load_outside_tasks``)."""

    def __reduce__(self) -> Any:
        return (load_outside_tasks, (self.tag,))


def tag_job(records: list[tuple[int, int]], parallelism: int, sink: TestingSink,
            rate: float | None = None, gates: Gates = None,
            config: JobConfig = SMALL) -> StreamJob:
    job = StreamJob("tagged", num_key_groups=32, parallelism=parallelism, config=config)
    (job.source(TestingSource(records, rate=rate, gate=gates), name="src", parallelism=1)
        .key_by(lambda r: r[0])
        .process(Tag("v1"), name="tag")
        .sink(sink, name="out"))
    return job
