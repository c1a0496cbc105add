"""Unit tests (no Ray) for keyed event-time and processing-time windows and window joins,
driven through ``engine.operators.builtin.KeyedRunner`` the way ``TaskCore`` drives them: records via
``process``, timers via ``fire_timers(watermark, EVENT_TIME)`` after the task watermark moved,
and ``fire_timers(now, PROCESSING_TIME)`` by the clock."""

from __future__ import annotations

from typing import Any

import pytest

from engine.dataflow import graph as g
from engine.dataflow.keygroups import key_group_of
from engine.io.testing import TestingSink
from engine.operators.builtin import ErrorPolicy, KeyedRunner
from engine.operators.functions import KeyedProcessFunction
from engine.operators.windows import PANES, AggregateFunction, WindowJoin, WindowOperator
from engine.state.keyed import EVENT_TIME, PROCESSING_TIME, KeyedStateBackend
from engine.time.clock import ManualClock, now_ms
from engine.time.event_time import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    Window,
    sliding_event_time,
    tumbling_event_time,
    tumbling_processing_time,
)

N = 8  # key groups; "a" and "c" are in group 7, "b" in group 4, "g" in group 0
KG_A = key_group_of("a", N)
assert KG_A == key_group_of("c", N) != key_group_of("b", N)


def key_fn(record: Any) -> Any:
    return record[0]


class Harness:
    """One keyed task: a backend owning ``groups``, a runner, a watermark cell, a late sink."""

    def __init__(self, fn: KeyedProcessFunction, tmp_path, groups=range(N),
                 clock: ManualClock | None = None, name: str = "w") -> None:
        self.clock = clock or ManualClock(1.0)
        self.wm = [MIN_WATERMARK]
        self.backend = KeyedStateBackend(N)
        for kg in groups:
            self.backend.own(kg)
        self.late_sink = TestingSink(str(tmp_path / f"late-{name}"))
        self.late_writer = self.late_sink.open(0, 1, self.clock)
        op = g.OperatorDef(name, "process", fn, 1,
                           inputs=(g.InputDef("src", key_fn), g.InputDef("src2", key_fn, 1)))
        self.fn = fn
        self.runner = KeyedRunner(op, ErrorPolicy(name, 0, None), self.backend, 0, self.clock,
                                  lambda: self.wm[0], self.late_writer)

    def send(self, records: list[tuple[Any, int]], port: int = 0) -> list[tuple[Any, int]]:
        """records: (value, timestamp); the key is value[0]. Returns (output, timestamp)."""
        values = [r for r, _ in records]
        ts = [t for _, t in records]
        keys = [key_fn(v) for v in values]
        kgs = [key_group_of(k, N) for k in keys]
        out, out_ts = self.runner.process(values, ts, keys, kgs, port)
        assert len(out) == len(out_ts)
        return list(zip(out, out_ts, strict=True))

    def advance(self, wm: int) -> list[tuple[Any, int]]:
        """As TaskCore._on_watermark: set the task watermark, then fire event-time timers."""
        assert wm > self.wm[0]
        self.wm[0] = wm
        out, out_ts = self.runner.fire_timers(wm, EVENT_TIME)
        return list(zip(out, out_ts, strict=True))

    def tick(self, now: int | None = None) -> list[tuple[Any, int]]:
        now = now_ms(self.clock) if now is None else now
        out, out_ts = self.runner.fire_timers(now, PROCESSING_TIME)
        return list(zip(out, out_ts, strict=True))

    def late(self) -> list[tuple[Any, int]]:
        return self.late_sink.results_with_timestamps()

    def panes(self, key: Any) -> dict:
        return self.backend.groups[key_group_of(key, N)].get(PANES, {}).get(key) or {}

    def timers(self) -> set:
        return {t for ts in self.backend.timers.values() for t in ts}


def add(a, b):
    return (a[0], a[1] + b[1])


def by_key(out):
    return sorted(out, key=repr)


# ---------------------------------------------------------------- reduce / aggregate / process


def test_tumbling_reduce_per_key(tmp_path):
    h = Harness(WindowOperator(tumbling_event_time(10), "reduce", add), tmp_path)
    assert h.send([(("a", 1), 1), (("b", 10), 3), (("a", 2), 5), (("a", 4), 12),
                   (("b", 20), 9), (("c", 100), 10)]) == []
    assert h.advance(5) == []
    assert h.advance(8) == []
    assert by_key(h.advance(9)) == [(("a", 3), 9), (("b", 30), 9)]
    assert h.advance(18) == []
    assert by_key(h.advance(25)) == [(("a", 4), 19), (("c", 100), 19)]
    assert h.late() == [] and h.runner.late_records == 0
    assert h.panes("a") == {} and h.panes("b") == {} and h.timers() == set()


def test_window_fires_once_and_only_at_max_timestamp(tmp_path):
    h = Harness(WindowOperator(tumbling_event_time(10), "reduce", add), tmp_path)
    h.send([(("a", 1), 0), (("a", 2), 9), (("a", 4), 10), (("a", 8), 29)])
    assert h.backend.next_timer(EVENT_TIME) == 9
    assert h.backend.next_timer(PROCESSING_TIME) is None
    assert h.tick(10**15) == []  # event-time windows ignore the clock
    assert h.advance(8) == []
    # a big jump fires every due window, in time order, each with its max_timestamp
    assert h.advance(25) == [(("a", 3), 9), (("a", 4), 19)]
    assert h.advance(28) == []
    assert h.advance(29) == [(("a", 8), 29)]
    assert h.advance(MAX_WATERMARK) == []


def test_sliding_count_with_window_fn(tmp_path):
    class Count(AggregateFunction):
        def create_accumulator(self):
            return 0

        def add(self, value, acc):
            return acc + 1

    op = WindowOperator(sliding_event_time(10, 5), "aggregate", Count(),
                        window_fn=lambda k, w, n: [(k, w.start, w.end, n)])
    h = Harness(op, tmp_path)
    h.send([(("a", 0), 1), (("a", 0), 6), (("b", 0), 3), (("a", 0), 7), (("a", 0), 12)])
    assert by_key(h.advance(4)) == [(("a", -5, 5, 1), 4), (("b", -5, 5, 1), 4)]
    assert by_key(h.advance(9)) == [(("a", 0, 10, 3), 9), (("b", 0, 10, 1), 9)]
    assert h.advance(14) == [(("a", 5, 15, 3), 14)]
    assert h.advance(19) == [(("a", 10, 20, 1), 19)]
    assert h.advance(100) == []


def test_window_fn_may_emit_several_or_none(tmp_path):
    op = WindowOperator(tumbling_event_time(10), "reduce", add,
                        window_fn=lambda k, w, r: [] if k == "b" else [r, (k, w)])
    h = Harness(op, tmp_path)
    h.send([(("a", 1), 1), (("b", 1), 2)])
    assert h.advance(9) == [(("a", 1), 9), (("a", Window(0, 10)), 9)]


class Average(AggregateFunction):
    def create_accumulator(self):
        return [0, 0]

    def add(self, value, acc):
        return [acc[0] + value[1], acc[1] + 1]

    def get_result(self, acc):
        return acc[0] / acc[1]


def test_aggregate_average(tmp_path):
    h = Harness(WindowOperator(tumbling_event_time(100), "aggregate", Average()), tmp_path)
    h.send([(("a", 1), 10), (("a", 2), 20), (("b", 7), 30), (("a", 6), 99), (("a", 50), 100)])
    assert by_key(h.advance(99)) == [(3.0, 99), (7.0, 99)]
    assert h.advance(199) == [(50.0, 199)]


def test_aggregate_default_result_is_accumulator(tmp_path):
    class Sum(AggregateFunction):
        def create_accumulator(self):
            return 100

        def add(self, value, acc):
            return acc + value[1]

    h = Harness(WindowOperator(tumbling_event_time(10), "aggregate", Sum()), tmp_path)
    h.send([(("a", 1), 1), (("a", 2), 2)])
    assert h.advance(9) == [(103, 9)]


def test_process_window_function_gets_all_elements_in_order(tmp_path):
    seen = []

    def fn(key, window, elements):
        seen.append((key, window, list(elements)))
        return [(key, window.start, [e[1] for e in elements])]

    h = Harness(WindowOperator(tumbling_event_time(10), "process", fn), tmp_path)
    # arrival order, not timestamp order
    h.send([(("a", "x"), 7), (("a", "y"), 2), (("b", "p"), 5)])
    h.send([(("a", "z"), 9), (("a", "next"), 10)])
    assert by_key(h.advance(9)) == [(("a", 0, ["x", "y", "z"]), 9), (("b", 0, ["p"]), 9)]
    assert sorted(seen, key=repr)[0] == ("a", Window(0, 10), [("a", "x"), ("a", "y"), ("a", "z")])
    assert h.advance(19) == [(("a", 10, ["next"]), 19)]


def test_process_window_function_returning_none(tmp_path):
    h = Harness(WindowOperator(tumbling_event_time(10), "process", lambda k, w, e: None), tmp_path)
    h.send([(("a", 1), 1)])
    assert h.advance(9) == []
    assert h.panes("a") == {}


def test_unknown_kind_rejected():
    with pytest.raises(ValueError, match="kind"):
        WindowOperator(tumbling_event_time(10), "fold", add)


# ---------------------------------------------------------------- late data


def test_late_records_go_to_late_writer(tmp_path):
    op = WindowOperator(tumbling_event_time(10), "reduce", add)
    h = Harness(op, tmp_path)
    h.send([(("a", 1), 3)])
    assert h.advance(9) == [(("a", 1), 9)]
    # window [0, 10) is gone: ts 9 and 0 are late, 10 is not
    assert h.send([(("a", 5), 9), (("b", 6), 0), (("a", 7), 10)]) == []
    assert h.late() == [(("a", 5), 9), (("b", 6), 0)]
    assert h.runner.late_records == 2
    assert h.advance(19) == [(("a", 7), 19)]  # late records never reach a window
    assert h.panes("a") == {} and h.panes("b") == {}


def test_late_on_watermark_exactly_at_max_timestamp(tmp_path):
    # watermark w promises no record <= w follows: once w == max_timestamp the window is gone,
    # even before its timer ran
    h = Harness(WindowOperator(tumbling_event_time(10), "reduce", add), tmp_path)
    h.wm[0] = 9
    assert h.send([(("a", 1), 9)]) == []
    assert h.late() == [(("a", 1), 9)]
    h.wm[0] = 8
    h.send([(("a", 2), 9)])
    assert h.late() == [(("a", 1), 9)] and h.runner.late_records == 1


def test_sliding_record_is_late_only_when_all_windows_are_gone(tmp_path):
    h = Harness(WindowOperator(sliding_event_time(10, 5), "reduce", add), tmp_path)
    h.send([(("a", 1), 6)])  # windows [0, 10) and [5, 15)
    assert h.advance(9) == [(("a", 1), 9)]
    # ts 7: [0, 10) is gone, [5, 15) still open -> counted there only, not late
    # ts 3: [-5, 5) and [0, 10) are both gone -> late
    assert h.send([(("a", 10), 7), (("a", 100), 3)]) == []
    assert h.late() == [(("a", 100), 3)]
    assert h.runner.late_records == 1
    assert h.advance(14) == [(("a", 11), 14)]


def test_allowed_lateness_refires_and_then_drops_the_pane(tmp_path):
    op = WindowOperator(tumbling_event_time(10), "reduce", add, allowed_lateness_ms=5)
    h = Harness(op, tmp_path)
    h.send([(("a", 1), 1), (("a", 2), 2)])
    assert h.advance(9) == [(("a", 3), 9)]
    assert h.panes("a") == {(0, 10): (("a", 3), True)}  # kept, marked fired
    # late but allowed (9 + 5 > 9): fires again at once with the updated result
    assert [v for v, _ in h.send([(("a", 4), 3)])] == [("a", 7)]
    assert h.advance(13) == []
    assert [v for v, _ in h.send([(("a", 8), 4)])] == [("a", 15)]
    assert h.late() == []
    # cleanup at max_timestamp + lateness = 14: dropped without another firing
    assert h.advance(14) == []
    assert h.panes("a") == {}
    assert h.timers() == set()
    assert h.send([(("a", 16), 5)]) == []
    assert h.late() == [(("a", 16), 5)]
    assert h.runner.late_records == 1


def test_allowed_lateness_refire_timestamp_is_max_timestamp(tmp_path):
    h = Harness(WindowOperator(tumbling_event_time(10), "reduce", add, allowed_lateness_ms=5),
                tmp_path)
    h.send([(("a", 1), 1)])
    assert h.advance(9) == [(("a", 1), 9)]
    assert h.send([(("a", 4), 3)]) == [(("a", 5), 9)]


def test_allowed_lateness_for_window_without_pane(tmp_path):
    # the first record of a window arrives after the watermark passed its end but within the
    # lateness: its result is emitted by the next watermark at the latest, stamped max_timestamp
    h = Harness(WindowOperator(tumbling_event_time(10), "reduce", add, allowed_lateness_ms=5),
                tmp_path)
    h.send([(("b", 1), 1)])
    assert h.advance(11) == [(("b", 1), 9)]
    out = h.send([(("a", 2), 5)])
    out += h.advance(12)
    assert out == [(("a", 2), 9)]
    assert h.advance(20) == []
    assert h.panes("a") == {} and h.panes("b") == {}
    assert h.late() == []


def test_allowed_lateness_cleanup_timer_shared_with_next_window(tmp_path):
    # lateness == size: the cleanup of [0, 10) (at 19) is the firing time of [10, 20)
    h = Harness(WindowOperator(tumbling_event_time(10), "reduce", add, allowed_lateness_ms=10),
                tmp_path)
    h.send([(("a", 1), 5), (("a", 2), 15)])
    assert h.advance(9) == [(("a", 1), 9)]
    assert h.advance(19) == [(("a", 2), 19)]
    assert h.panes("a") == {(10, 20): (("a", 2), True)}
    assert [v for v, _ in h.send([(("a", 4), 12)])] == [("a", 6)]
    h.send([(("a", 8), 8)])
    assert h.late() == [(("a", 8), 8)]
    assert h.advance(29) == []
    assert h.panes("a") == {}


# ---------------------------------------------------------------- processing time


def test_a_processing_time_window_fires_once_with_a_record_of_its_last_millisecond(tmp_path):
    clock = ManualClock(1.0)  # 1000 ms: window [1000, 2000), max_timestamp 1999
    op = WindowOperator(tumbling_processing_time(1000), "reduce", add)
    h = Harness(op, tmp_path, clock=clock)
    h.wm[0] = 10**12
    h.send([(("a", 1), 0)])
    clock.advance(0.999)  # 1999 ms: the window's last millisecond
    assert h.tick() == []  # not yet: a record may still come in this millisecond
    h.send([(("a", 2), 0)])
    clock.advance(0.001)  # 2000 ms
    assert h.tick() == [(("a", 3), 1999)]  # once, with both records
    assert h.tick(10**6) == []


def test_processing_time_tumbling_fires_by_clock(tmp_path):
    clock = ManualClock(1.0)  # 1000 ms
    op = WindowOperator(tumbling_processing_time(1000), "reduce", add)
    h = Harness(op, tmp_path, clock=clock)
    h.wm[0] = 10**12  # the event-time watermark plays no role
    h.send([(("a", 1), 0), (("b", 5), 0)])
    clock.advance(0.5)
    h.send([(("a", 2), 999_999)])
    clock.advance(0.75)  # 2250 ms: next window
    h.send([(("a", 4), 0)])
    assert h.late() == []
    assert h.runner.fire_timers(MAX_WATERMARK, EVENT_TIME) == ([], [])
    assert h.tick(1998) == []
    assert by_key(h.tick(2250)) == [(("a", 3), 1999), (("b", 5), 1999)]
    assert h.tick(2998) == []
    clock.advance(0.75)  # 3000 ms
    assert h.tick() == [(("a", 4), 2999)]
    assert h.tick(10**6) == []
    assert h.panes("a") == {}


# ---------------------------------------------------------------- migration


def test_panes_and_timers_migrate_and_fire_once_in_the_new_owner(tmp_path):
    def make():
        return WindowOperator(tumbling_event_time(10), "aggregate", Average(),
                              window_fn=lambda k, w, r: [(k, w.start, r)])

    old = Harness(make(), tmp_path, name="old")
    old.send([(("a", 1), 1), (("c", 10), 4), (("b", 7), 5), (("a", 3), 12)])
    assert old.advance(3) == []

    new = Harness(make(), tmp_path, groups=[], name="new")
    data = old.backend.snapshot(KG_A)
    new.backend.install(KG_A, data)
    old.backend.remove(KG_A)
    new.wm[0] = old.wm[0]

    assert new.panes("a") == {(0, 10): ([1, 1], False), (10, 20): ([3, 1], False)}
    assert new.backend.next_timer(EVENT_TIME) == 9
    # event-time timers stay event-time timers
    assert new.tick(10**15) == []
    assert old.advance(9) == [(("b", 0, 7.0), 9)]
    assert by_key(new.advance(9)) == [(("a", 0, 1.0), 9), (("c", 0, 10.0), 9)]
    # records of the migrated group keep arriving at the new owner
    new.send([(("a", 5), 15)])
    assert old.advance(50) == []
    assert new.advance(50) == [(("a", 10, 4.0), 19)]
    assert new.advance(60) == []
    assert old.timers() == set() and new.timers() == set()


def test_fired_pane_migrates_with_allowed_lateness(tmp_path):
    def make():
        return WindowOperator(tumbling_event_time(10), "process",
                              lambda k, w, e: [(k, sorted(x[1] for x in e))],
                              allowed_lateness_ms=20)

    old = Harness(make(), tmp_path, name="old")
    old.send([(("a", 1), 1), (("a", 2), 2)])
    assert old.advance(9) == [(("a", [1, 2]), 9)]
    new = Harness(make(), tmp_path, groups=[], name="new")
    new.backend.install(KG_A, old.backend.snapshot(KG_A))
    old.backend.remove(KG_A)
    new.wm[0] = 9
    assert [v for v, _ in new.send([(("a", 3), 3)])] == [("a", [1, 2, 3])]
    assert old.advance(40) == []
    assert new.advance(28) == []
    assert new.panes("a") == {(0, 10): ([("a", 1), ("a", 2), ("a", 3)], True)}
    assert new.advance(29) == []
    assert new.panes("a") == {}
    new.send([(("a", 4), 4)])
    assert new.late() == [(("a", 4), 4)] and old.late() == []


# ---------------------------------------------------------------- window join


def pair(left, right):
    return (left[1], right[1])


def test_window_join_pairs_per_key_and_window(tmp_path):
    h = Harness(WindowJoin(tumbling_event_time(10), pair), tmp_path)
    assert h.send([(("a", "L1"), 1), (("b", "Lb"), 2), (("a", "L2"), 8),
                   (("a", "L3"), 11)], port=0) == []
    assert h.send([(("a", "R1"), 3), (("c", "Rc"), 4), (("a", "R2"), 9),
                   (("a", "R3"), 15)], port=1) == []
    assert h.advance(9) == [(("L1", "R1"), 9), (("L1", "R2"), 9), (("L2", "R1"), 9),
                            (("L2", "R2"), 9)]
    assert h.advance(19) == [(("L3", "R3"), 19)]
    assert h.panes("a") == {} and h.panes("b") == {} and h.panes("c") == {}
    assert h.timers() == set()


def test_window_join_unmatched_and_late(tmp_path):
    op = WindowJoin(tumbling_event_time(10), pair)
    h = Harness(op, tmp_path)
    h.send([(("a", "L1"), 1)], port=0)
    h.send([(("a", "R1"), 10)], port=1)  # other window
    assert h.advance(9) == []
    h.send([(("a", "Rlate"), 5)], port=1)
    assert h.late() == [(("a", "Rlate"), 5)]
    assert h.runner.late_records == 1
    h.send([(("a", "L2"), 12)], port=0)
    assert h.advance(19) == [(("L2", "R1"), 19)]


def test_window_join_sliding(tmp_path):
    h = Harness(WindowJoin(sliding_event_time(10, 5), pair), tmp_path)
    h.send([(("a", "L"), 6)], port=0)  # [0, 10) and [5, 15)
    h.send([(("a", "R"), 12)], port=1)  # [5, 15) and [10, 20)
    assert h.advance(9) == []
    assert h.advance(14) == [(("L", "R"), 14)]
    assert h.advance(19) == []


def test_window_join_allowed_lateness_pairs_with_earlier_records(tmp_path):
    h = Harness(WindowJoin(tumbling_event_time(10), pair, allowed_lateness_ms=5), tmp_path)
    h.send([(("a", "L1"), 1)], port=0)
    h.send([(("a", "R1"), 2)], port=1)
    assert h.advance(9) == [(("L1", "R1"), 9)]
    out = h.send([(("a", "L2"), 3)], port=0)
    out += h.advance(13)
    assert h.late() == []
    assert [v for v, _ in out] == [("L2", "R1")]


# ---------------------------------------------------------------- runner / context plumbing


class Probe(KeyedProcessFunction):
    """Records what the context says, registers timers of both domains."""

    def __init__(self, log: list) -> None:
        self.log = log

    def process_element(self, value, ctx):
        ts = ctx.timer_service
        self.log.append(("element", ctx.key, ctx.port, ctx.timestamp, ts.current_watermark()))
        ts.register_event_time_timer(value[1])
        ts.register_processing_time_timer(value[1])
        if value[1] == 99:
            ts.delete_event_time_timer(99)
        if value[1] == 50:
            ctx.output_late(value)
        return ()

    def on_timer(self, timestamp, ctx):
        self.log.append(("timer", ctx.key, ctx.time_domain, timestamp, ctx.timestamp,
                         ctx.timer_service.current_watermark()))
        return [(ctx.key, ctx.time_domain, timestamp)]


def test_context_port_time_domain_watermark_and_late_output(tmp_path):
    log: list = []
    h = Harness(Probe(log), tmp_path)
    h.wm[0] = 3
    h.send([(("a", 20), 7)], port=1)
    h.send([(("b", 10), 8), (("b", 99), 9), (("b", 50), 11)], port=0)
    assert log == [("element", "a", 1, 7, 3), ("element", "b", 0, 8, 3),
                   ("element", "b", 0, 9, 3), ("element", "b", 0, 11, 3)]
    assert h.late() == [(("b", 50), 11)] and h.runner.late_records == 1
    log.clear()
    # event time: 10 and 20 fire (99 was deleted; 50 not due), the processing timers do not
    assert h.advance(60) == [(("b", "event", 10), 10), (("a", "event", 20), 20),
                             (("b", "event", 50), 50)]
    assert log[0] == ("timer", "b", "event", 10, 10, 60)
    assert h.advance(MAX_WATERMARK) == []
    # processing time: all four fire, in time order
    assert h.tick(1000) == [(("b", "processing", 10), 10), (("a", "processing", 20), 20),
                            (("b", "processing", 50), 50), (("b", "processing", 99), 99)]
    assert log[-1][2] == "processing"


def test_timer_error_goes_through_error_policy(tmp_path):
    class Boom(KeyedProcessFunction):
        def process_element(self, value, ctx):
            ctx.timer_service.register_event_time_timer(5)

        def on_timer(self, timestamp, ctx):
            raise RuntimeError("boom")

    from engine.errors import UserFunctionError

    h = Harness(Boom(), tmp_path)
    h.send([(("a", 1), 1)])
    with pytest.raises(UserFunctionError, match="boom"):
        h.advance(5)
