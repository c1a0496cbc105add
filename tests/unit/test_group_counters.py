"""The measures Spacker's adaptive planning reads (issue 32 item 7): distinct keys touched
per second (``engine.observability.groupstats.KeyAccess``), keys per key group from both
state backends, a task core's ``GroupStats`` reply carrying them, and the capacity a
rescale takes from the job's latest metrics window (``engine.runtime.rescaling``)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pyarrow as pa
import pytest

from engine.columnar.batches import ColumnBatch
from engine.observability.groupstats import GroupCounters, KeyAccess
from engine.state.keyed import KeyedStateBackend
from engine.time.clock import ManualClock
from engine.wire.messages import GroupStats, GroupStatsRequest, decode_message, encode_message
from migration.planning import measure_groups
from tests.unit.pipeline_model import Pipeline, Stage
from tests.unit.test_task_core import Net, records_for, running_sum_job

# ---------------------------------------------------------------- KeyAccess


def test_a_window_counts_distinct_keys_over_its_seconds_then_rests():
    a = KeyAccess(window_s=1.0, period_s=4.0)
    assert a.take(0.0) is None  # nothing measured yet
    a.observe([1, 2, 2, 3], 10.0)  # opens the window
    a.observe([3, 4], 10.5)
    assert a.take(10.9) is None  # the window runs: not finished
    a.observe([5, 6, 7], 11.0)  # 1 s after the start: ends it, its keys excluded
    assert a.take(11.0) == (4, 1.0)
    a.observe([8, 9], 12.0)  # resting until 14.0: not counted
    assert a.take(13.9) == (4, 1.0)  # a level: it stands
    a.observe([1], 14.2)  # the next window
    assert a.take(14.5) == (4, 1.0)
    assert a.take(15.7) == (1, pytest.approx(1.5))  # finished by a take 1 s or more late


def test_a_sparse_stream_is_counted_over_the_seconds_it_took():
    a = KeyAccess(window_s=1.0, period_s=1.0)
    a.observe([1], 0.0)
    a.observe([2], 3.0)  # idle for 3 s: 1 key over 3 s; the next window starts here
    assert a.take(3.0) == (1, 3.0)
    a.observe([2, 3], 3.5)
    assert a.take(4.0) == (2, 1.0)


def test_columnar_numpy_and_arrow_keys_are_counted_and_unhashable_keys_stop_the_measure():
    a = KeyAccess(window_s=1.0, period_s=1.0)
    batch = ColumnBatch(pa.record_batch({"k": [1, 2, 2], "v": [0, 0, 0]}))
    a.observe("k", 0.0, batch)  # a columnar frame: the name of its key column
    a.observe(np.array([2, 3], dtype=np.int64), 0.2)
    a.observe(pa.array([4, 4]), 0.4)
    a.observe(None, 0.6)  # a frame without keys counts nothing
    assert a.take(1.0) == (4, 1.0)
    a.observe([[1, 2]], 2.0)  # a list cannot be hashed: no count from now on
    a.observe([1], 5.0)
    assert a.take(9.0) is None


def test_key_access_validates_its_window():
    for window, period in ((0.0, 1.0), (2.0, 1.0), (1.0, math.inf)):
        with pytest.raises(ValueError, match="KeyAccess"):
            KeyAccess(window, period)


# ---------------------------------------------------------------- keys per key group


def test_the_memory_backend_counts_each_groups_keys_exactly_over_its_tables():
    b = KeyedStateBackend(8)
    for kg in range(3):
        b.own(kg)
    b.groups[0]["n"] = {k: k for k in range(10)}
    b.groups[0]["pad"] = {k: b"x" for k in range(5, 15)}  # 15 distinct keys over two tables
    b.groups[1]["n"] = {k: k for k in range(7)}
    assert [b.group_keys(kg) for kg in range(3)] == [15, 7, 0]
    b.groups[0]["pad"][99] = b"y"  # a table grew: counted again
    assert b.group_keys(0) == 16
    size, keys = b.group_stats(1)
    assert keys == 7 and size == b.estimated_group_bytes(1) > 0


def test_the_rocksdb_backend_counts_each_groups_keys_with_the_scan_of_its_bytes(tmp_path):
    pytest.importorskip("rocksdict")
    from engine.state.rocksdb import RocksDBKeyedStateBackend

    b = RocksDBKeyedStateBackend(8, tmp_path / "db", task="op[0]")
    try:
        for kg in range(2):
            b.own(kg)
        for k in range(10):
            b.set_current(k, 0)
            b.table("n")[k] = k
            if k >= 4:
                b.table("pad")[k] = b"x" * 100
            b.add_timer(0, 1_000 + k, k)  # timers are not keys
        b.set_current("a", 1)
        b.table("n")["a"] = 1
        assert b.group_stats(0) == (b.group_bytes(0), 10)
        assert b.group_keys(1) == 1
    finally:
        b.close()
    assert b.group_stats(0) == (0, 0)  # closed: a stopped task's statistics


# ---------------------------------------------------------------- the GroupStats reply


def test_group_counters_reply_with_records_bytes_keys_and_keys_touched():
    b = KeyedStateBackend(4)
    for kg in range(2):
        b.own(kg)
    b.groups[0]["n"] = {k: k for k in range(0, 20, 2)}
    b.groups[1]["n"] = {k: k for k in range(1, 20, 2)}
    c = GroupCounters(sample_every=1, now=100.0)
    c.observe([0, 1, 0], [0, 1, 2], 100.0)
    c.observe([0], [2], 100.4)
    reply = c.reply("t", b, 101.0)
    assert reply.groups == ((0, 3, b.estimated_group_bytes(0), 10),
                            (1, 1, b.estimated_group_bytes(1), 10))
    assert (reply.seconds, reply.keys_touched, reply.touched_seconds) == (1.0, 3, 1.0)
    assert decode_message(encode_message(reply)) == reply
    later = c.reply("t", b, 103.0)  # records restart; the touched keys are a level
    assert [g[1] for g in later.groups] == [0, 0] and later.keys_touched == 3
    assert c.reply("s", None, 104.0) == GroupStats("s", (), 1.0)  # not keyed: nothing


def test_a_keyed_task_cores_group_stats_reply_says_its_keys_and_the_keys_it_touched(
        tmp_path):
    """The reply a coordinator reads (it said ``(kg, records, bytes)`` only, so the state
    access ratio was never measured and the adaptive default never replicated)."""
    from engine.io.testing import TestingSink

    clock = ManualClock()
    records = records_for(300, keys=40, seed=3)
    net = Net(running_sum_job(records, TestingSink(str(tmp_path / "out"))), clock)
    net.run_sources()
    clock.advance(1.0)
    replies = [net[f"sum/{i}"].handle(GroupStatsRequest()) for i in range(2)]
    for r in replies:
        keys = {kg: k for kg, _, _, k in r.groups}
        assert sum(keys.values()) > 0
        # every key of the task's groups arrived within the window: touched them all
        assert (r.keys_touched, r.touched_seconds) == (sum(keys.values()), 1.0)
    m = measure_groups(replies)
    assert m.access_counted and sum(m.keys.values()) == 40
    assert m.state_access_ratio == pytest.approx(1.0)  # 40 keys of 40 touched in 1 s
    # records per group from a sample of frames, scaled to the exact total (rounded per group)
    assert sum(r * m.seconds for r in m.loads.values()) == pytest.approx(300, abs=len(m.loads))


# ---------------------------------------------------------------- capacity


def test_a_rescale_takes_the_operators_capacity_from_the_latest_metrics_window():
    """``RescaleContext.capacity_rate`` (it was never filled): DS2's capacity, the input
    rate at which the busiest task would be busy all the time."""
    from engine.runtime.rescaling import operator_capacity

    job = Pipeline([Stage("agg", rate=500.0, parallelism=2)], source_rate=600.0)
    assert operator_capacity(job.window(), "agg") == pytest.approx(1000.0)
    skewed = Pipeline([Stage("agg", rate=500.0, parallelism=2, weights=(3, 1))], 600.0)
    # the busiest task takes 3/4: busy all the time at 500 / 0.75 records/s
    assert operator_capacity(skewed.window(), "agg") == pytest.approx(500 / 0.75)
    assert operator_capacity(job.window(), "nope") is None
    assert operator_capacity(None, "agg") is None
    idle = Pipeline([Stage("agg", rate=500.0, parallelism=2)], source_rate=0.0)
    assert operator_capacity(idle.window(), "agg") is None


def test_the_capacity_discounts_cpu_wait_unless_the_wait_exceeds_the_work():
    """The CPU wait is the whole process's: a task that waited for a core a tenth of its
    busy time is discounted (DS2's reading); one that waited longer than it worked (a light
    task on a loaded machine: the wait fell mostly outside its work) keeps its rate, or a
    rescale of a lightly loaded operator on a busy machine never knew its capacity."""
    from engine.runtime.rescaling import operator_capacity

    w = Pipeline([Stage("agg", rate=500.0, parallelism=2)], source_rate=600.0).window()

    def waited(seconds_of_wait: float) -> object:
        ops = dict(w.operators)
        agg = ops["agg"]
        ops["agg"] = dataclasses.replace(agg, tasks=tuple(
            dataclasses.replace(t, cpu_wait_s=seconds_of_wait * t.useful_s)
            for t in agg.tasks))
        return dataclasses.replace(w, operators=ops)

    # useful 6 s of 10 per task (0.6), a tenth of it starved: 0.54, 600 / 0.54
    assert operator_capacity(waited(0.1), "agg") == pytest.approx(600 / 0.54)
    assert operator_capacity(waited(3.0), "agg") == pytest.approx(1000.0)
