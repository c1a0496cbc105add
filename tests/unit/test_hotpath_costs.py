"""The always-on bookkeeping made cheap (issue 20) still says what it said: per-group load
(sampled, scaled to the exact total), the state-size estimate (cached per table), and the
latency histogram's integer fast path (the same buckets as the float path)."""

from __future__ import annotations

import tempfile
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.io.sinks import LatencySink
from engine.observability.groupstats import GroupLoad
from engine.observability.latency import LatencyHistogram
from engine.state.keyed import KeyedStateBackend
from engine.time.clock import ManualClock
from engine.wire.codec import unpack_exact


def test_group_load_every_frame_is_exact() -> None:
    load = GroupLoad(sample_every=1)
    load.observe([1, 2, 2])
    load.observe([3, 2])
    assert load.take() == {1: 1, 2: 3, 3: 1}
    assert load.take() == {}  # the counters restart


def test_group_load_sampled_total_is_exact_and_split_is_close() -> None:
    rng = np.random.default_rng(7)
    load = GroupLoad(sample_every=8)
    weights = np.array([0.5, 0.3, 0.2])
    frames = [rng.choice(3, size=1000, p=weights).tolist() for _ in range(400)]
    for f in frames:
        load.observe(f)
    got = load.take()
    assert abs(sum(got.values()) - 400_000) <= 3  # rounding per group only
    for kg, w in enumerate(weights):
        assert got[kg] == pytest.approx(400_000 * w, rel=0.02)


def test_group_load_first_frame_is_sampled_and_columnar_frames_count_exactly() -> None:
    load = GroupLoad(sample_every=100)
    load.observe([5, 5, 6])  # one frame only: it is the sample
    load.observe(np.array([0, 6, 6, 9], dtype=np.int64))
    assert load.take() == {5: 2, 6: 3, 0: 1, 9: 1}


def test_group_load_refuses_a_stride_below_one() -> None:
    with pytest.raises(ValueError, match="sample_every"):
        GroupLoad(0)


def _backend(values: dict[int, Any]) -> KeyedStateBackend:
    b = KeyedStateBackend(8)
    for kg in range(4):
        b.own(kg)
    for k, v in values.items():
        b.groups[k % 4].setdefault("v", {})[k] = v
    return b


def test_state_size_estimate_follows_growth_and_changed_values() -> None:
    b = _backend({k: bytes(100) for k in range(400)})
    exact = sum(b.size_bytes(kg) for kg in range(4))
    assert b.estimated_bytes() == pytest.approx(exact, rel=0.1)
    for k in range(400, 4000):  # tables grow tenfold: re-sampled at once
        b.groups[k % 4]["v"][k] = bytes(100)
    exact = sum(b.size_bytes(kg) for kg in range(4))
    assert b.estimated_bytes() == pytest.approx(exact, rel=0.1)
    for t in b.groups.values():  # same lengths, values ten times larger: refreshed in turn
        for k in t["v"]:
            t["v"][k] = bytes(1000)
    exact = sum(b.size_bytes(kg) for kg in range(4))
    for _ in range(4):
        b.estimated_bytes()
    assert b.estimated_bytes() == pytest.approx(exact, rel=0.1)
    b.remove(0)
    b.remove(1)
    assert b.estimated_bytes() == pytest.approx(b.size_bytes(2) + b.size_bytes(3), rel=0.1)


def test_state_size_estimate_samples_a_bounded_number_of_tables_per_call(monkeypatch) -> None:
    import engine.state.keyed as state_mod

    b = KeyedStateBackend(128)
    for kg in range(128):
        b.own(kg)
    for k in range(12_800):
        b.groups[k % 128].setdefault("v", {})[k] = bytes(50)
    samples = []
    real = state_mod._table_bytes  # every measure and sample goes through it
    monkeypatch.setattr(state_mod, "_table_bytes", lambda t: samples.append(len(t)) or real(t))
    exact = sum(b.size_bytes(kg) for kg in range(128))
    limit = 16  # of 128 tables
    for _ in range(3):  # 128 new tables: estimated from the sampled ones meanwhile
        samples.clear()
        assert b.estimated_bytes() == pytest.approx(exact, rel=0.1)
        assert len(samples) <= limit
    for k in range(12_800, 51_200):  # every table grows fourfold at once
        b.groups[k % 128]["v"][k] = bytes(50)
    exact = sum(b.size_bytes(kg) for kg in range(128))
    samples.clear()
    assert b.estimated_bytes() == pytest.approx(exact, rel=0.1)
    assert len(samples) <= limit
    b.groups[0]["w"] = {1: "x" * 500}  # a name never sampled: sampled at once
    for kg in range(1, 128):
        b.groups[kg]["w"] = {1: "x" * 500}
    samples.clear()
    exact = sum(b.size_bytes(kg) for kg in range(128))
    assert b.estimated_bytes() == pytest.approx(exact, rel=0.1)
    assert len(samples) <= limit + 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=-5, max_value=70_000), min_size=1, max_size=200))
def test_integer_latencies_bucket_as_floats_do(ms: list[int]) -> None:
    fast, slow = LatencyHistogram(), LatencyHistogram()
    fast.observe_many(np.asarray(ms, dtype=np.int64))
    slow.observe_many(np.asarray(ms, dtype=np.float64))
    assert fast.to_wire() == slow.to_wire()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(min_value=-5, max_value=70_000),
                          st.integers(min_value=1, max_value=50)), min_size=1, max_size=12))
def test_latency_sink_records_runs_of_one_timestamp_as_the_array_path(
        runs: list[tuple[int, int]]) -> None:
    """A batch of a few source batches (runs of one timestamp each) is observed run by run
    (``observe_repeated``, issue 32 item 9): the same histogram as one value per record,
    up to 8 runs and past them (then the array path)."""
    clock = ManualClock(1000.0)
    now_ms = int(clock.now() * 1000)
    stamps = [now_ms - ms for ms, n in runs for _ in range(n)]
    with tempfile.TemporaryDirectory() as d:
        w = LatencySink(d).open(0, 1, clock)
        w.write([None] * len(stamps), stamps)
        expected = LatencyHistogram()
        expected.observe_many(now_ms - np.asarray(stamps, dtype=np.int64))
        assert w._current.to_wire() == expected.to_wire()  # type: ignore[attr-defined]


def test_latency_sink_total_is_the_sum_of_its_seconds(tmp_path: Any) -> None:
    clock = ManualClock(1000.0)
    sink = LatencySink(str(tmp_path))
    w = sink.open(0, 1, clock)
    for i in range(30):
        now_ms = int(clock.now() * 1000)
        w.write([None] * 3, [now_ms - i, now_ms - 2 * i, now_ms - 3])
        clock.advance(0.4)
    w.flush()
    total = sink.histogram()
    seconds = [LatencyHistogram.from_wire(unpack_exact(b)) for f in tmp_path.iterdir()
               for _, b in unpack_exact(f.read_bytes())[2]]
    merged = LatencyHistogram()
    for h in seconds:
        merged.merge(h)
    assert total.count == 90 and merged.to_wire() == total.to_wire()
    assert len(sink.timeline()) == len(seconds) >= 12
