"""Unit tests for engine.time.event_time: window arithmetic, assigners, watermark strategy and tracker."""

from __future__ import annotations

import pytest

from engine.errors import JobDefinitionError
from engine.time.event_time import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    WatermarkStrategy,
    WatermarkTracker,
    Window,
    WindowAssigner,
    bounded_out_of_orderness,
    sliding_event_time,
    sliding_processing_time,
    tumbling_event_time,
    tumbling_processing_time,
    window_start,
)

# ---------------------------------------------------------------- Window / window_start


def test_window_max_timestamp_and_order():
    assert Window(0, 10).max_timestamp == 9
    assert Window(-10, 0).max_timestamp == -1
    assert sorted([Window(10, 20), Window(-5, 5), Window(0, 10)]) == [
        Window(-5, 5), Window(0, 10), Window(10, 20)]


@pytest.mark.parametrize(
    ("ts", "size", "offset", "expected"),
    [
        (0, 10, 0, 0),
        (9, 10, 0, 0),
        (10, 10, 0, 10),
        (-1, 10, 0, -10),
        (-10, 10, 0, -10),
        (-11, 10, 0, -20),
        (1, 10, 2, -8),
        (2, 10, 2, 2),
        (11, 10, 2, 2),
        (12, 10, 2, 12),
        (-3, 10, 2, -8),
        (-8, 10, 2, -8),
        (-9, 10, 2, -18),
        (1_700_000_000_123, 1000, 0, 1_700_000_000_000),
        (1_700_000_000_123, 1000, 500, 1_699_999_999_500),
    ],
)
def test_window_start(ts, size, offset, expected):
    start = window_start(ts, size, offset)
    assert start == expected
    assert start <= ts < start + size
    assert (start - offset) % size == 0


def _brute_force(a: WindowAssigner, t: int) -> list[Window]:
    """Every window of the assigner's grid holding t, oldest first."""
    out = []
    lo = t - 3 * a.size_ms - 3 * a.slide_ms
    s = window_start(lo, a.slide_ms, a.offset_ms)
    while s <= t:
        if s <= t < s + a.size_ms:
            out.append(Window(s, s + a.size_ms))
        s += a.slide_ms
    return out


# ---------------------------------------------------------------- assigners


def test_tumbling_assign():
    a = tumbling_event_time(10)
    assert a.event_time and a.size_ms == a.slide_ms == 10 and a.offset_ms == 0
    assert a.assign(0) == [Window(0, 10)]
    assert a.assign(9) == [Window(0, 10)]
    assert a.assign(10) == [Window(10, 20)]
    assert a.assign(-1) == [Window(-10, 0)]
    assert a.assign(-10) == [Window(-10, 0)]


def test_tumbling_assign_with_offset():
    a = tumbling_event_time(10, 3)
    assert a.assign(2) == [Window(-7, 3)]
    assert a.assign(3) == [Window(3, 13)]
    assert a.assign(12) == [Window(3, 13)]
    assert a.assign(-7) == [Window(-7, 3)]
    assert a.assign(-8) == [Window(-17, -7)]


def test_processing_time_helpers():
    t = tumbling_processing_time(100, 7)
    s = sliding_processing_time(100, 25, 5)
    assert (t.size_ms, t.slide_ms, t.offset_ms, t.event_time) == (100, 100, 7, False)
    assert (s.size_ms, s.slide_ms, s.offset_ms, s.event_time) == (100, 25, 5, False)
    assert t.assign(107) == [Window(107, 207)]
    se = sliding_event_time(100, 25, 5)
    assert se.event_time and se.assign(31) == s.assign(31)


def test_sliding_assign_concrete():
    a = sliding_event_time(10, 5)
    assert a.assign(0) == [Window(-5, 5), Window(0, 10)]
    assert a.assign(4) == [Window(-5, 5), Window(0, 10)]
    assert a.assign(5) == [Window(0, 10), Window(5, 15)]
    assert a.assign(-1) == [Window(-10, 0), Window(-5, 5)]
    a = sliding_event_time(10, 5, 2)
    assert a.assign(3) == [Window(-3, 7), Window(2, 12)]
    assert a.assign(1) == [Window(-8, 2), Window(-3, 7)]
    a = sliding_event_time(6, 2)
    assert a.assign(7) == [Window(2, 8), Window(4, 10), Window(6, 12)]


@pytest.mark.parametrize(("size", "slide", "offset"),
                         [(10, 10, 0), (10, 5, 0), (10, 5, 4), (12, 3, 1), (6, 1, 0),
                          (1000, 250, 100), (1, 1, 0)])
def test_sliding_assign_divisible_matches_brute_force(size, slide, offset):
    a = sliding_event_time(size, slide, offset)
    for t in range(-3 * size - 7, 3 * size + 7):
        got = a.assign(t)
        assert got == _brute_force(a, t), t
        assert len(got) == size // slide
        assert got == sorted(got)  # oldest first
        assert all(w.start <= t < w.end and w.end - w.start == size for w in got)
        assert all((w.start - offset) % slide == 0 for w in got)


def test_sliding_assign_non_divisible():
    a = sliding_event_time(10, 3)
    assert a.assign(0) == [Window(-9, 1), Window(-6, 4), Window(-3, 7), Window(0, 10)]
    a = sliding_event_time(10, 4, 1)
    assert a.assign(5) == [Window(-3, 7), Window(1, 11), Window(5, 15)]
    for t in range(-25, 25):
        assert a.assign(t) == _brute_force(a, t), t


@pytest.mark.parametrize(
    ("size", "slide", "offset"),
    [(10, 11, 0), (0, 0, 0), (-10, -10, 0), (10, 0, 0), (0, 5, 0), (10, 5, 5), (10, 5, -1),
     (10, 10, 10), (10, 10, -1)],
)
def test_assigner_validation(size, slide, offset):
    with pytest.raises(JobDefinitionError):
        WindowAssigner(size, slide, offset)


def test_assigner_validation_helpers():
    with pytest.raises(JobDefinitionError, match="slide"):
        sliding_event_time(5, 10)
    with pytest.raises(JobDefinitionError, match="offset"):
        tumbling_event_time(10, 10)
    with pytest.raises(JobDefinitionError, match="> 0"):
        tumbling_processing_time(0)
    # boundaries that are allowed
    assert tumbling_event_time(10, 9).offset_ms == 9
    assert sliding_event_time(10, 10).assign(5) == [Window(0, 10)]


# ---------------------------------------------------------------- WatermarkStrategy


def test_watermark_for():
    s = WatermarkStrategy(0)
    assert s.watermark_for(100) == 99
    assert s.watermark_for(MIN_WATERMARK) == MIN_WATERMARK
    s = bounded_out_of_orderness(50, idle_timeout_ms=1000)
    assert s.idle_timeout_ms == 1000
    assert s.max_out_of_orderness_ms == 50
    assert s.watermark_for(100) == 49
    assert s.watermark_for(0) == -51
    assert s.watermark_for(MIN_WATERMARK) == MIN_WATERMARK


@pytest.mark.parametrize("kwargs", [
    {"max_out_of_orderness_ms": -1},
    {"interval_ms": 0},
    {"interval_ms": -5},
    {"idle_timeout_ms": 0},
    {"idle_timeout_ms": -1},
])
def test_watermark_strategy_validation(kwargs):
    with pytest.raises(JobDefinitionError):
        WatermarkStrategy(**kwargs)


# ---------------------------------------------------------------- WatermarkTracker


def test_tracker_waits_for_every_channel():
    tr = WatermarkTracker()
    assert tr.set_channels([1, 2, 3]) is None
    assert tr.update(1, 100) is None
    assert tr.update(2, 50) is None
    assert tr.current == MIN_WATERMARK
    assert tr.update(3, 70) == 50  # min over channels
    assert tr.current == 50


def test_tracker_min_and_monotone():
    tr = WatermarkTracker()
    tr.set_channels([1, 2])
    tr.update(1, 10)
    assert tr.update(2, 20) == 10
    assert tr.update(1, 15) == 15
    assert tr.update(1, 5) is None  # a channel never goes back
    assert tr.channels[1] == 15
    assert tr.update(2, 12) is None  # channel 2 goes back: ignored
    assert tr.update(1, 30) == 20
    assert tr.update(2, 25) == 25
    assert tr.current == 25
    assert tr.update(2, 25) is None  # same again: no advance


def test_tracker_ignores_unknown_channel():
    tr = WatermarkTracker()
    tr.set_channels([1])
    assert tr.update(9, 100) is None
    assert tr.update(1, 5) == 5
    assert 9 not in tr.channels


def test_tracker_idle_channel_does_not_hold_back():
    tr = WatermarkTracker()
    tr.set_channels([1, 2])
    assert tr.update(1, 100) is None  # 2 has not sent one yet
    assert tr.mark_idle(2) == 100  # 2 is idle: 1 alone decides
    assert tr.update(1, 150) == 150
    # 2 becomes active on its next watermark; it is behind, so nothing advances...
    assert tr.update(2, 120) is None
    assert tr.current == 150  # ...and the task watermark never goes back
    assert tr.update(1, 200) is None  # 2 now holds it back at 120 < 150
    assert tr.update(2, 180) == 180
    assert tr.idle == set()


def test_tracker_idle_channel_that_had_a_watermark():
    tr = WatermarkTracker()
    tr.set_channels([1, 2])
    tr.update(1, 10)
    assert tr.update(2, 5) == 5
    assert tr.mark_idle(2) == 10
    assert tr.update(1, 40) == 40
    assert tr.update(2, 50) is None  # min(40, 50) = 40: no advance
    assert tr.current == 40
    assert tr.update(1, 60) == 50


def test_tracker_all_idle_gives_none():
    tr = WatermarkTracker()
    tr.set_channels([1, 2])
    tr.update(1, 10)
    tr.update(2, 20)
    assert tr.current == 10
    assert tr.mark_idle(1) == 20
    assert tr.mark_idle(2) is None
    assert tr.current == 20
    assert tr.mark_idle(7) is None  # unknown channel: ignored
    assert 7 not in tr.idle
    assert tr.update(1, 30) == 30  # 1 active again: only it counts


def test_tracker_end_stops_counting_and_may_advance():
    tr = WatermarkTracker()
    tr.set_channels([1, 2])
    tr.update(1, 10)
    assert tr.update(2, 100) == 10
    assert tr.end(1) == 100  # the slow channel ended
    assert tr.update(1, 500) is None  # an ended channel no longer counts
    assert tr.update(2, 120) == 120
    assert tr.end(2) is None  # no live channel left


def test_tracker_end_of_channel_without_watermark():
    tr = WatermarkTracker()
    tr.set_channels([1, 2])
    assert tr.update(1, 42) is None
    assert tr.end(2) == 42


def test_tracker_set_channels_removing_advances():
    tr = WatermarkTracker()
    tr.set_channels([1, 2, 3])
    tr.update(1, 10)
    tr.update(2, 20)
    assert tr.update(3, 30) == 10
    assert tr.set_channels([2, 3]) == 20
    assert 1 not in tr.channels
    # adding a channel that has not sent a watermark holds further advances back
    assert tr.set_channels([2, 3, 4]) is None
    assert tr.update(2, 40) is None
    assert tr.update(4, 35) == 30
    assert tr.current == 30


def test_tracker_set_channels_keeps_idle_only_for_live():
    tr = WatermarkTracker()
    tr.set_channels([1, 2])
    tr.mark_idle(2)
    assert tr.update(1, 5) == 5
    tr.set_channels([1])
    assert tr.idle == set()
    tr.set_channels([1, 2])  # 2 is back and not idle: it holds the watermark
    assert tr.update(1, 50) is None
    assert tr.update(2, 60) == 50


def test_tracker_max_watermark():
    tr = WatermarkTracker()
    tr.set_channels([1])
    assert tr.update(1, MAX_WATERMARK) == MAX_WATERMARK
    assert tr.update(1, 0) is None
