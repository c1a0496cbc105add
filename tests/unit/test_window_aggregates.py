"""Unit tests (no Ray) for the vectorised window aggregates (``engine.operators.window_aggregates``),
stepped as ``TaskCore`` steps a keyed runner: batches via ``process``, then
``fire_timers(watermark, EVENT_TIME)`` after the task watermark moved.

The property: on random records (keys, int or float values, disordered timestamps),
tumbling and sliding assigners, allowed lateness, watermark schedules and batch cuts, the
vectorised operator emits per key exactly what the per-record window operator
(``engine.operators.windows.WindowOperator`` with an equivalent ``AggregateFunction``) emits, with
the same timestamps and the same late records; and two different cuts of the same input
leave the same state (key groups, timers) and give the same outputs."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.api import StreamJob
from engine.columnar.batches import ColumnBatch, ColumnKey
from engine.dataflow import graph as g
from engine.dataflow.keygroups import key_group_of
from engine.errors import JobDefinitionError
from engine.io.testing import TestingSource
from engine.operators.builtin import ErrorPolicy, KeyedRunner
from engine.operators.vectorised import Count, Max, Mean, Min, Sum
from engine.operators.window_aggregates import ColumnWindowAggregate, WindowAggregateRunner
from engine.operators.windows import AggregateFunction, WindowOperator
from engine.state.keyed import EVENT_TIME, KeyedStateBackend, decode_snapshot
from engine.time.clock import ManualClock
from engine.time.event_time import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    WindowAssigner,
    sliding_event_time,
    tumbling_event_time,
    tumbling_processing_time,
)

N = 8
AGGS = (Count(), Sum("v"), Min("v"), Max("v"), Mean("v"))


class AllOfThem(AggregateFunction):
    """Count, sum, min, max of ``v``, one record at a time (the per-record meaning)."""

    def create_accumulator(self) -> Any:
        return None

    def add(self, value: Any, acc: Any) -> Any:
        x = value["v"]
        return [1, x, x, x] if acc is None else [acc[0] + 1, acc[1] + x, min(acc[2], x),
                                                 max(acc[3], x)]


def as_row(key: Any, w: Any, a: list[Any]) -> list[dict[str, Any]]:
    return [{"k": key, "window_start": w.start, "window_end": w.end, "count()": a[0],
             "sum(v)": a[1], "min(v)": a[2], "max(v)": a[3], "mean(v)": a[1] / a[0]}]


class Collect:
    """A late-data writer that keeps what it gets."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, int]] = []

    def write(self, values: list[Any], timestamps: list[int]) -> None:
        self.rows.extend(zip(values, timestamps, strict=True))


class Task:
    """One keyed task running either operator; ``vectorised`` picks which."""

    def __init__(self, assigner: WindowAssigner, lateness: int, vectorised: bool,
                 columnar: bool = True) -> None:
        self.wm = [MIN_WATERMARK]
        self.backend = KeyedStateBackend(N)
        for kg in range(N):
            self.backend.own(kg)
        self.late = Collect()
        self.vectorised, self.columnar = vectorised, columnar
        inputs = (g.InputDef("src", ColumnKey("k")),)
        if vectorised:
            op = g.OperatorDef("w", g.WINDOW_AGGREGATE,
                               ColumnWindowAggregate(assigner, AGGS, "k", lateness), 1, inputs)
            runner: type[KeyedRunner] = WindowAggregateRunner
        else:
            op = g.OperatorDef("w", g.PROCESS, WindowOperator(
                assigner, "aggregate", AllOfThem(), as_row, lateness), 1, inputs)
            runner = KeyedRunner
        self.runner = runner(op, ErrorPolicy("w", 0, None), self.backend, 0, ManualClock(),
                             lambda: self.wm[0], self.late)  # type: ignore[arg-type]
        self.out: list[tuple[dict[str, Any], int, int]] = []
        self.segment = 0  # outputs carry the segment of the input they came in

    def _take(self, out: Any, ts: Any) -> None:
        rows = out.rows() if type(out) is ColumnBatch else list(out)
        self.out.extend((r, int(t), self.segment) for r, t in zip(rows, ts, strict=True))

    def send(self, records: list[tuple[Any, Any, int]]) -> None:
        if not records:
            return
        rows = [{"k": k, "v": v} for k, v, _ in records]
        ts = [t for _, _, t in records]
        keys: Any = [k for k, _, _ in records]
        kgs = [key_group_of(k, N) for k in keys]
        values: Any = rows
        if self.vectorised and self.columnar:
            values = ColumnBatch.from_rows(rows)
            keys = ColumnKey("k").keys_of(values)
        self._take(*self.runner.process(values, ts, keys, kgs))

    def advance(self, wm: int) -> None:
        if wm > self.wm[0]:
            self.wm[0] = wm
            self._take(*self.runner.fire_timers(wm, EVENT_TIME))
        self.segment += 1

    def per_key(self) -> dict[Any, list[tuple[dict[str, Any], int, int]]]:
        """Per key its outputs: (row, timestamp, segment)."""
        out: dict[Any, list[tuple[dict[str, Any], int, int]]] = {}
        for row, t, segment in self.out:
            out.setdefault(row["k"], []).append((row, t, segment))
        return out

    def state(self) -> dict[int, Any]:
        return {kg: decode_snapshot(self.backend.snapshot(kg)) for kg in self.backend.owned()}


def run(task: Task, segments: list[tuple[list[tuple[Any, Any, int]], int]],
        cuts: list[int]) -> None:
    """Each segment's records in batches of ``cuts`` (cycled), then its watermark."""
    c = 0
    for records, wm in segments:
        i = 0
        while i < len(records):
            size = cuts[c % len(cuts)]
            c += 1
            task.send(records[i:i + size])
            i += size
        task.advance(wm)


ASSIGNERS = [tumbling_event_time(50), sliding_event_time(60, 20),
             tumbling_event_time(40, offset_ms=10), sliding_event_time(50, 15, offset_ms=5)]
values = st.one_of(st.integers(-1000, 1000),
                   st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False))


@st.composite
def streams(draw: Any) -> list[tuple[list[tuple[Any, Any, int]], int]]:
    """Segments of records (key, value, timestamp), each followed by a watermark that lags
    the largest timestamp so far by a random bound (so some records are late)."""
    floats = draw(st.booleans())
    segments = []
    t, top, wm = 0, MIN_WATERMARK, MIN_WATERMARK
    for _ in range(draw(st.integers(1, 8))):
        records = []
        for _ in range(draw(st.integers(0, 30))):
            t += draw(st.integers(0, 12))
            ts = t - draw(st.integers(0, 70))
            v = draw(values)
            v = float(v) if floats else (int(v) if isinstance(v, int) else int(v))
            records.append((draw(st.integers(0, 5)), v, ts))
            top = max(top, ts)
        if top > MIN_WATERMARK:
            wm = max(wm, top - draw(st.integers(0, 20)))
        segments.append((records, wm))
    return segments


@settings(max_examples=150, deadline=None)
@given(streams(), st.sampled_from(ASSIGNERS), st.sampled_from([0, 0, 25, 60]),
       st.lists(st.integers(1, 17), min_size=1, max_size=6), st.booleans())
def test_equals_the_per_record_window_operator_however_batched(
        segments: Any, assigner: WindowAssigner, lateness: int, cuts: list[int],
        columnar: bool) -> None:
    reference = Task(assigner, lateness, vectorised=False)
    run(reference, segments, [1])
    whole = Task(assigner, lateness, vectorised=True, columnar=columnar)
    run(whole, segments, [10**6])
    cut = Task(assigner, lateness, vectorised=True, columnar=columnar)
    run(cut, segments, cuts)
    assert cut.state() == whole.state(), "batch cuts changed the state"
    for task in (reference, whole, cut):
        task.advance(MAX_WATERMARK)
    want = reference.per_key()
    assert whole.per_key() == want
    assert cut.per_key() == want
    assert whole.late.rows == reference.late.rows == cut.late.rows
    assert whole.runner.late_records == reference.runner.late_records
    assert not any(t for tables, _ in whole.state().values() for t in tables.values()), \
        "state left after every window fired and its lateness passed"


def test_a_late_record_within_the_lateness_refires_its_window_at_once() -> None:
    task = Task(tumbling_event_time(10), 20, vectorised=True)
    task.send([("a", 1, 3), ("a", 2, 5)])
    task.advance(9)  # fires [0, 10)
    assert [(r["count()"], r["sum(v)"], t) for r, t, _ in task.out] == [(2, 3, 9)]
    task.send([("a", 4, 7), ("b", 5, 1)])  # within the lateness: re-fired at once
    assert [(r["k"], r["count()"], r["sum(v)"]) for r, _, _ in task.out[1:]] == [
        ("a", 3, 7), ("b", 1, 5)]
    task.advance(29)  # cleanup time of [0, 10)
    task.send([("a", 8, 2)])  # beyond it: late
    assert task.late.rows == [({"k": "a", "v": 8}, 2)]
    assert task.runner.late_records == 1
    assert len(task.out) == 3


def test_state_is_keyed_state_of_its_key_group() -> None:
    task = Task(tumbling_event_time(10), 0, vectorised=True)
    task.send([("a", 1, 3), ("b", 2, 15)])
    kg_a = key_group_of("a", N)
    tables, timers = decode_snapshot(task.backend.snapshot(kg_a))
    assert tables["win/0/open/agg/sum(v)"] == {"a": 1}
    assert timers == {(9, None, EVENT_TIME)}
    other = KeyedStateBackend(N)
    other.install(kg_a, task.backend.snapshot(kg_a))  # as a migration moves it
    assert decode_snapshot(other.snapshot(kg_a)) == (tables, timers)


def test_the_api_builds_a_vectorised_window_aggregate() -> None:
    job = StreamJob("j", num_key_groups=8)
    src = job.source(TestingSource([{"k": 1, "v": 2}], timestamp_fn=lambda r: 0), name="s")
    keyed = src.key_by("k")
    keyed.window(tumbling_event_time(10)).aggregate(Count(), Sum("v"), name="w")
    op = job.graph().operator("w")
    assert op.kind == g.WINDOW_AGGREGATE and op.fn.key_name == "k"
    with pytest.raises(JobDefinitionError, match="event-time"):
        keyed.window(tumbling_processing_time(10)).aggregate(Count(), name="p")
    with pytest.raises(JobDefinitionError, match="window_fn"):
        keyed.window(tumbling_event_time(10)).aggregate(Count(), window_fn=as_row, name="q")
    with pytest.raises(JobDefinitionError, match="must differ"):
        keyed.window(tumbling_event_time(10)).aggregate(Count(alias_name="window_end"))
    # the per-record form still takes its window_fn positionally
    keyed.window(tumbling_event_time(10)).aggregate(AllOfThem(), as_row, name="r")
    assert job.graph().operator("r").kind == g.PROCESS
