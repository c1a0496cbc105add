"""Unit tests for the built-in sources and sinks (GeneratorSource, ParquetSource,
ParquetSink, LatencySink), engine.observability.latency.LatencyHistogram, and what a sink's failed batch
becomes (never re-written). No Ray: readers and writers are opened directly and driven by a
ManualClock; task cores are stepped by hand."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.api import StreamJob
from engine.dataflow import graph as g
from engine.dataflow.config import JobConfig
from engine.errors import UserFunctionError
from engine.io.sinks import LatencySink, ParquetSink, Sink, SinkWriter
from engine.io.sources import GeneratorSource, ParquetSource, PartitionedReader, SourceReader
from engine.io.testing import TestingSink, TestingSource
from engine.observability.latency import LatencyHistogram
from engine.operators.builtin import ErrorPolicy, StatelessRunner
from engine.time.clock import ManualClock
from engine.wire.codec import pack_exact, unpack_exact
from engine.wire.messages import TaskFailed

# -- helpers ---------------------------------------------------------------------------------


def drain(reader: SourceReader, batch: int = 1000) -> tuple[list[Any], list[int]]:
    values: list[Any] = []
    timestamps: list[int] = []
    while (b := reader.poll(batch)) is not None:
        assert len(b.values) == len(b.timestamps)
        values.extend(b.values)
        timestamps.extend(b.timestamps)
    return values, timestamps


def read_in_order(src: Any, batch: int = 1000,
                  clock: ManualClock | None = None) -> tuple[list[Any], list[int]]:
    """Every partition of ``src`` read to its end, one after the other in list order."""
    values: list[Any] = []
    timestamps: list[int] = []
    for p in src.partitions(1):
        v, t = drain(src.open_partition(p, None, clock or ManualClock()), batch)
        values += v
        timestamps += t
    return values, timestamps


def read_n(reader: SourceReader, n: int, batch: int) -> list[Any]:
    out: list[Any] = []
    while len(out) < n:
        b = reader.poll(min(batch, n - len(out)))
        assert b is not None
        out.extend(b.values)
    return out


# -- GeneratorSource -------------------------------------------------------------------------


def test_generator_is_deterministic_and_seq_counts_up() -> None:
    src = GeneratorSource(None, num_records=150_000, num_keys=50, seed=7)
    a, ts_a = drain(src.open_partition("0-of-1", None, ManualClock()), batch=777)
    b, _ = drain(src.open_partition("0-of-1", None, ManualClock()), batch=4096)
    assert len(a) == 150_000
    assert a == b
    assert [r[1] for r in a] == list(range(150_000))
    assert all(type(r) is tuple and len(r) == 2 for r in a[:1000])
    keys = [r[0] for r in a]
    assert min(keys) == 0 and max(keys) == 49
    assert set(ts_a) == {1_000_000}  # full speed: timestamps are the (manual) poll time
    other_seed, _ = drain(GeneratorSource(None, num_records=1000, num_keys=50, seed=8)
                          .open_partition("0-of-1", None, ManualClock()))
    assert [r[0] for r in other_seed] != keys[:1000]


@pytest.mark.parametrize(("skew", "first"), [("zipf", [0, 1, 72, 11, 0]),
                                             ("uniform", [811, 85, 179, 236, 181])])
def test_generator_keys_are_pinned_and_the_same_in_columns(skew: str, first: list[int]
                                                           ) -> None:
    """The sequence benchmarks and examples depend on: pinned, whatever the poll sizes
    (a chunk's zipf keys are ranked a slice at a time), rows and columns alike."""
    src = GeneratorSource(None, num_records=140_000, num_keys=1000, skew=skew, seed=3)
    rows, _ = drain(src.open_partition("0-of-1", None, ManualClock()), batch=65_537)
    assert [r[0] for r in rows[:5]] == first
    cols = GeneratorSource(None, num_records=140_000, num_keys=1000, skew=skew, seed=3,
                           columnar=True).open_partition("0-of-1", None, ManualClock())
    keys: list[int] = []
    for size in [1, 777, 65_536, 12, 70_000, 10_000]:
        b = cols.poll(size)
        keys.extend(b.values.column("key").to_pylist())
    assert keys == [r[0] for r in rows]


@pytest.mark.parametrize("skew", ["uniform", "zipf"])
@pytest.mark.parametrize("cut", [1, 65_535, 65_536, 70_000])
def test_generator_resume_at_offset_continues_the_same_sequence(skew: str, cut: int) -> None:
    src = GeneratorSource(None, num_records=140_000, num_keys=300, skew=skew,
                          state_bytes_per_key=128, seed=3)
    full, _ = drain(src.open_partition("1-of-2", None, ManualClock()))
    assert len(full) == 70_000
    reader = src.open_partition("1-of-2", None, ManualClock())
    head = read_n(reader, cut, batch=997)
    offset = reader.offset()
    assert offset == cut
    assert pack_exact(offset)  # msgpack-able
    tail, _ = drain(src.open_partition("1-of-2", unpack_exact(pack_exact(offset)), ManualClock()))
    assert head + tail == full
    assert full[5] == (full[5][0], 5, 128)


def test_generator_splits_records_and_rate_over_tasks() -> None:
    src = GeneratorSource(None, num_records=10, num_keys=1000, seed=1)
    per_task = [drain(src.open_partition(f"{i}-of-3", None, ManualClock()))[0] for i in range(3)]
    assert [len(v) for v in per_task] == [4, 3, 3]
    assert sum(len(v) for v in per_task) == 10
    assert [[r[1] for r in v] for v in per_task] == [[0, 1, 2, 3], [0, 1, 2], [0, 1, 2]]
    assert per_task[1] != per_task[2]  # each task has its own random stream
    assert GeneratorSource(None, num_records=2).partition_records(3, 4) == 0
    assert drain(src.open_partition("0-of-20", None, ManualClock()))[0] != []
    assert drain(src.open_partition("15-of-20", None, ManualClock()))[0] == []

    # rate 100/s over 4 tasks: each task emits 25/s, i.e. one record every 40 ms.
    clock = ManualClock(2_000.0)
    reader = GeneratorSource(100.0, num_records=1000).open_partition("2-of-4", None, clock)
    clock.advance(1.0)
    batch = reader.poll(10_000)
    assert batch is not None and len(batch) == 26  # records 0..25 due at 0, 40, ..., 1000 ms
    assert batch.timestamps[:3] == [2_000_000, 2_000_040, 2_000_080]


def test_zipf_is_skewed_and_uniform_is_not() -> None:
    n = 200_000
    zipf, _ = drain(GeneratorSource(None, num_records=n, num_keys=1000, skew="zipf",
                                    zipf_exponent=1.2).open_partition("0-of-1", None, ManualClock()))
    uniform, _ = drain(GeneratorSource(None, num_records=n, num_keys=1000)
                       .open_partition("0-of-1", None, ManualClock()))
    zc = Counter(r[0] for r in zipf)
    uc = Counter(r[0] for r in uniform)
    weights = np.arange(1, 1001, dtype=float) ** -1.2
    expected_top = weights[0] / weights.sum()  # ~0.22
    top_key, top_count = zc.most_common(1)[0]
    assert top_key == 0
    assert top_count / n == pytest.approx(expected_top, rel=0.03)
    assert zc[1] / n == pytest.approx(weights[1] / weights.sum(), rel=0.05)
    assert top_count / n > 100 * (1 / 1000)  # far above a uniform key's share
    assert uc.most_common(1)[0][1] / n < 2 * (1 / 1000)
    assert len(uc) == 1000 and all(0 <= k < 1000 for k in zc)


def test_open_loop_timestamps_are_the_schedule_when_polled_late() -> None:
    clock = ManualClock(1_000.0)
    src = GeneratorSource(100.0, num_records=2000, num_keys=10)  # p=2: 50/s per task
    reader = src.open_partition("0-of-2", None, clock)
    first = reader.poll(100)
    assert first is not None and first.timestamps == [1_000_000]  # record 0 due at open
    assert reader.poll(100) == first.__class__()  # nothing else due yet: empty batch
    assert reader.seconds_until_ready() == pytest.approx(0.02)
    clock.advance(0.01)
    assert reader.seconds_until_ready() == pytest.approx(0.01)

    clock.advance(9.99)  # polled 10 s late: 500 more records are due
    late = reader.poll(120)  # the engine takes only 120 of them
    assert late is not None and len(late) == 120
    assert late.timestamps == [1_000_000 + 20 * n for n in range(1, 121)]
    assert [r[1] for r in late.values] == list(range(1, 121))
    assert reader.seconds_until_ready() == 0.0  # more are overdue
    rest = reader.poll(10_000)
    assert rest is not None and len(rest) == 380
    assert rest.timestamps[-1] == 1_010_000  # never ahead of the schedule

    # Reopening from the resume state (a restore, a stop-restart) continues the schedule
    # itself: every record that fell due while no reader ran is overdue at once, with its
    # scheduled timestamp, so the outage counts as latency.
    assert reader.offset() == [501, 1_000_000.0]
    clock2 = ManualClock(1_015.0)  # reopened 5 s after the reader stopped
    resumed = src.open_partition("0-of-2", reader.offset(), clock2)
    assert resumed.backlog() == 250 and resumed.seconds_until_ready() == 0.0
    b = resumed.poll(1000)
    assert b is not None and [r[1] for r in b.values] == list(range(501, 751))
    assert b.timestamps[0] == 1_010_020 and b.timestamps[-1] == 1_015_000
    clock2.advance(0.05)
    b = resumed.poll(100)
    assert b is not None and b.timestamps == [1_015_020, 1_015_040]
    assert resumed.offset() == [753, 1_000_000.0]

    # A bare int (a resume state written before the schedule start was kept) restarts the
    # schedule at the open: that record is due then.
    clock3 = ManualClock(5_000.0)
    legacy = src.open_partition("0-of-2", 501, clock3)
    b = legacy.poll(100)
    assert b is not None and [r[1] for r in b.values] == [501] and b.timestamps == [5_000_000]
    clock3.advance(0.1)
    b = legacy.poll(100)
    assert b is not None and b.timestamps == [5_000_020, 5_000_040, 5_000_060, 5_000_080,
                                              5_000_100]
    assert legacy.offset() == [507, 5_000_000.0 - 501 * 20]
    for bad in ([1, "x"], [-1, 0.0], [1, 2, 3], "7", [1, float("nan")]):
        with pytest.raises(ValueError, match="resume state"):
            src.open_partition("0-of-2", bad, clock3)
    assert GeneratorSource(None).open_partition("0-of-1", 3, clock3).offset() == 3


def test_poll_returns_none_at_the_end() -> None:
    reader = GeneratorSource(None, num_records=5).open_partition("0-of-1", None, ManualClock())
    assert len(reader.poll(3) or []) == 3
    assert len(reader.poll(3) or []) == 2
    assert reader.poll(3) is None
    assert reader.poll(3) is None
    assert reader.offset() == 5

    clock = ManualClock()
    reader = GeneratorSource(10.0, duration_s=1.0).open_partition("0-of-1", None, clock)  # 10 records
    clock.advance(100.0)
    values, _ = drain(reader)
    assert [r[1] for r in values] == list(range(10))

    clock = ManualClock()
    reader = GeneratorSource(None, duration_s=2.0).open_partition("0-of-1", None, clock)
    assert len(reader.poll(50) or []) == 50
    clock.advance(2.0)
    assert reader.poll(50) is None

    assert GeneratorSource(None, num_records=0).open_partition("0-of-1", None, ManualClock()).poll(9) is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rate": 0}, "rate"),
        ({"rate": float("inf")}, "rate"),
        ({"rate": None, "num_records": -1}, "num_records"),
        ({"rate": None, "duration_s": 0}, "duration_s"),
        ({"rate": None, "num_keys": 0}, "num_keys"),
        ({"rate": None, "skew": "pareto"}, "skew"),
        ({"rate": None, "zipf_exponent": -1.0}, "zipf_exponent"),
        ({"rate": None, "state_bytes_per_key": -5}, "state_bytes_per_key"),
        ({"rate": None, "seed": -1}, "seed"),
    ],
)
def test_generator_rejects_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GeneratorSource(**kwargs)


# -- ParquetSink / ParquetSource -------------------------------------------------------------


def write_all(sink: ParquetSink, records: list[Any], timestamps: list[int], task: int = 0,
              batch: int = 333) -> None:
    sink.prepare()
    writer = sink.open(task, 1, ManualClock())
    for i in range(0, len(records), batch):
        writer.write(records[i:i + batch], timestamps[i:i + batch])
    writer.close()


def test_parquet_round_trip_with_timestamps(tmp_path: Any) -> None:
    out = str(tmp_path / "out")
    records = [(i % 7, f"s{i}", i * 0.5) for i in range(1000)]
    stamps = [1_700_000_000_000 + i for i in range(1000)]
    write_all(ParquetSink(out, schema=["k", "name", "x"], rows_per_file=300,
                          include_timestamps=True), records, stamps)
    names = sorted(os.listdir(out))
    assert len(names) == 4  # 300 + 300 + 300 + 100 rows
    assert all(n.startswith("part-0-") and n.endswith(".parquet") for n in names)
    assert [n[-13:] for n in names] == [f"{i:05d}.parquet" for i in range(4)]
    assert pq.read_table(os.path.join(out, names[3])).num_rows == 100
    assert pq.read_schema(os.path.join(out, names[0])).names == ["k", "name", "x", "timestamp"]

    values, ts = read_in_order(ParquetSource(out, timestamp_column="timestamp"), batch=128)
    assert values == records
    assert ts == stamps
    values, _ = read_in_order(ParquetSource(out, columns=["x", "k"]))
    assert values == [(r[2], r[0]) for r in records]


def test_parquet_scalars_dicts_and_ingestion_time(tmp_path: Any) -> None:
    scalars = str(tmp_path / "scalars")
    write_all(ParquetSink(scalars), list(range(50)), [0] * 50)
    assert pq.read_schema(os.path.join(scalars, os.listdir(scalars)[0])).names == ["value"]
    clock = ManualClock(1_234.5)
    values, ts = read_in_order(ParquetSource(scalars), clock=clock)
    assert values == list(range(50))
    assert set(ts) == {1_234_500}

    dicts = str(tmp_path / "dicts")
    write_all(ParquetSink(dicts), [{"a": i, "b": str(i)} for i in range(20)], [0] * 20)
    values, _ = read_in_order(ParquetSource(dicts, columns=["b"]))
    assert values == [str(i) for i in range(20)]

    with pytest.raises(ValueError, match="does not fit"):
        ParquetSink(str(tmp_path / "bad"), schema=["a", "b"]).open(0, 1, ManualClock()).write(
            [(1, 2, 3)], [0])


def test_parquet_sink_writes_atomically_and_only_on_flush(tmp_path: Any) -> None:
    out = str(tmp_path / "out")
    sink = ParquetSink(out, rows_per_file=100)
    sink.prepare()
    writer = sink.open(3, 4, ManualClock())
    writer.write(list(range(99)), [0] * 99)
    assert os.listdir(out) == []  # buffered
    writer.write([99, 100], [0, 0])
    assert len(os.listdir(out)) == 1  # one full file
    writer.flush()
    names = sorted(os.listdir(out))
    assert len(names) == 2 and all(n.startswith("part-3-") for n in names)
    assert not any(n.endswith(".tmp") for n in names)
    writer.flush()  # nothing buffered: no empty file
    assert len(os.listdir(out)) == 2


def test_parquet_source_resume_at_a_partitions_state(tmp_path: Any) -> None:
    out = str(tmp_path / "out")
    records = [(i, i * i) for i in range(1000)]
    write_all(ParquetSink(out, schema=["a", "b"], rows_per_file=250), records, [0] * 1000)
    src = ParquetSource(out, batch_rows=64)
    parts = src.partitions(1)
    assert len(parts) == 4 and parts == sorted(parts)  # one per file, by name
    second = parts[1]
    want = records[250:500]
    for cut in (0, 1, 63, 64, 249, 250):
        reader = src.open_partition(second, None, ManualClock())
        head = read_n(reader, cut, batch=50) if cut else []
        state = unpack_exact(pack_exact(reader.offset()))
        assert state == cut
        reader.close()
        tail, _ = drain(src.open_partition(second, state, ManualClock()), batch=90)
        assert head + tail == want, cut
    with pytest.raises(ValueError, match="resume state"):
        src.open_partition(second, [0, 5], ManualClock())
    with pytest.raises(ValueError, match="not one of its partitions"):
        src.open_partition("other.parquet", None, ManualClock())


def test_parquet_source_has_a_partition_per_file_read_by_task_j_mod_p(tmp_path: Any) -> None:
    out = str(tmp_path / "out")
    records = list(range(1000))
    write_all(ParquetSink(out, rows_per_file=100), records, [0] * 1000)  # 10 files
    src = ParquetSource(out)
    parts = src.partitions(3)
    per_task = [drain(PartitionedReader.for_task(src, i, 3, ManualClock()))[0]
                for i in range(3)]
    assert [len(v) for v in per_task] == [400, 300, 300]  # files 0,3,6,9 / 1,4,7 / 2,5,8
    assert sorted(per_task[1]) == [v for f in (1, 4, 7) for v in range(f * 100, f * 100 + 100)]
    assert sorted(v for vs in per_task for v in vs) == records
    assert parts == src.partitions(1), "files, not tasks, make the partitions"


def test_parquet_source_splits_row_groups_of_a_single_file(tmp_path: Any) -> None:
    path = str(tmp_path / "one.parquet")
    ts = pa.array(np.arange(1000, dtype="int64") * 1000 + 5_000_000, type=pa.timestamp("us"))
    pq.write_table(pa.table({"v": list(range(1000)), "t": ts}), path, row_group_size=100)
    assert pq.ParquetFile(path).metadata.num_row_groups == 10
    src = ParquetSource(path, timestamp_column="t", batch_rows=30)
    assert src.partitions(2) == [f"one.parquet#{k}" for k in range(10)]
    got = [drain(PartitionedReader.for_task(src, i, 2, ManualClock())) for i in range(2)]
    assert [len(v) for v, _ in got] == [500, 500]
    assert sorted(got[1][0]) == [v for g in (1, 3, 5, 7, 9) for v in range(g * 100, g * 100 + 100)]
    assert sorted(got[0][0] + got[1][0]) == list(range(1000))
    values, stamps = drain(src.open_partition("one.parquet#1", None, ManualClock()))
    assert values == list(range(100, 200))
    assert stamps[:2] == [5_000 + 100, 5_000 + 101]  # microseconds -> ms
    # resume inside a row group
    reader = src.open_partition("one.parquet#3", None, ManualClock())
    head = read_n(reader, 70, batch=40)
    assert reader.offset() == 70
    tail, _ = drain(src.open_partition("one.parquet#3", reader.offset(), ManualClock()))
    assert head + tail == list(range(300, 400))


# -- LatencyHistogram ------------------------------------------------------------------------


def test_histogram_quantiles_match_numpy() -> None:
    rng = np.random.default_rng(42)
    data = rng.lognormal(mean=3.0, sigma=1.5, size=200_000)  # ms, ~0.01 ms .. ~20 s
    h = LatencyHistogram()
    h.observe_many(data)
    assert h.count == data.size
    assert h.mean == pytest.approx(data.mean(), rel=1e-9)
    assert h.max == data.max()
    for q in (0.01, 0.1, 0.5, 0.9, 0.99, 0.999):
        assert h.quantile(q) == pytest.approx(np.percentile(data, q * 100), rel=0.03), q
    assert h.quantile(1.0) == data.max() and h.quantile(0.0) == data.min()
    uniform = rng.uniform(1, 500, size=50_000)
    hu = LatencyHistogram()
    hu.observe_many(uniform.tolist())
    for q in (0.5, 0.9, 0.99):
        assert hu.quantile(q) == pytest.approx(np.percentile(uniform, q * 100), rel=0.03)
    with pytest.raises(ValueError):
        h.quantile(1.5)
    assert LatencyHistogram().quantile(0.5) == 0.0


def test_histogram_merge_wire_and_single_observe() -> None:
    rng = np.random.default_rng(1)
    data = rng.exponential(50.0, size=10_000)
    whole, a, b, single = LatencyHistogram(), LatencyHistogram(), LatencyHistogram(), \
        LatencyHistogram()
    whole.observe_many(data)
    a.observe_many(data[:3000])
    b.observe_many(data[3000:])
    for x in data.tolist():
        single.observe(x)
    merged = a.merge(b)
    wire = unpack_exact(pack_exact(merged.to_wire()))
    back = LatencyHistogram.from_wire(wire)
    for h in (merged, back, single):
        assert h.count == 10_000
        assert h.sum_ms == pytest.approx(data.sum())
        assert h.max == whole.max
        assert h.to_wire()[4:6] == whole.to_wire()[4:6]  # identical bucket counts
        for q in (0.5, 0.99):
            assert h.quantile(q) == whole.quantile(q)
    bad = whole.to_wire()
    bad[2] = 1.5
    with pytest.raises(ValueError, match="layout"):
        LatencyHistogram.from_wire(bad)


def test_histogram_zero_and_negative_latencies() -> None:
    h = LatencyHistogram()
    h.observe_many([0, 0, 0, 0, -2, -4, 7])
    assert h.quantile(0.5) == 0.0  # [0, 0.1 ms) reports the mean of its values: exactly 0
    assert h.quantile(0.1) == -3.0  # so does the negative bucket
    assert h.min == -4 and h.max == 7
    assert h.quantile(0.99) == pytest.approx(7, rel=0.03)
    h.observe(float("nan"))
    h.observe(0.05)
    assert h.count == 8
    assert h.quantile(0.7) == pytest.approx(0.01)  # mean of 0, 0, 0, 0, 0.05


def test_histogram_cumulative_buckets() -> None:
    rng = np.random.default_rng(5)
    data = rng.lognormal(2.0, 1.0, size=20_000)  # ms
    h = LatencyHistogram()
    h.observe_many(data)
    bounds = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, float("inf")]
    got = h.cumulative_buckets(bounds)
    assert got == sorted(got) and got[-1] == h.count
    for b, c in zip(bounds[:-1], got[:-1], strict=True):
        lo = int(np.sum(data <= b * 1000 / 1.04))
        hi = int(np.sum(data <= b * 1000 * 1.04))
        assert lo <= c <= hi, (b, c, lo, hi)
    assert h.sum_seconds == pytest.approx(data.sum() / 1000)
    with pytest.raises(ValueError):
        h.cumulative_buckets([1.0, 0.5])


# -- LatencySink -----------------------------------------------------------------------------


def test_latency_sink_summary_and_timeline_from_files(tmp_path: Any) -> None:
    sink = LatencySink(str(tmp_path / "lat"))
    sink.prepare()
    clock = ManualClock(1_000.0)
    w0 = sink.open(0, 2, clock)
    w1 = sink.open(1, 2, clock)
    now = 1_000_000
    w0.write([None] * 100, [now - 10] * 100)
    w1.write([None] * 100, [now - 30] * 100)
    assert sink.summary()["count"] == 0  # not saved yet: 0.5 s have not passed
    clock.advance(0.6)
    w0.write([], [])  # the periodic save happens inside write()
    assert sink.summary()["count"] == 100
    clock.advance(0.5)  # second 1001
    w1.write([None] * 50, [now + 1_100 - 100] * 50)
    w0.flush()
    w1.flush()
    files = [n for n in os.listdir(sink.directory) if n.endswith(".msgpack")]
    assert sorted(n.split("-")[0] for n in files) == ["0", "1"]

    s = sink.summary()
    assert s["count"] == 250
    assert s["mean_ms"] == pytest.approx((100 * 10 + 100 * 30 + 50 * 100) / 250)
    assert s["max_ms"] == 100
    assert s["p50_ms"] == pytest.approx(30, rel=0.03)
    assert s["p90_ms"] == pytest.approx(100, rel=0.03)
    assert s["p99_ms"] == pytest.approx(100, rel=0.03)
    assert s["p999_ms"] == pytest.approx(100, rel=0.03)

    t = sink.timeline()
    assert [e["second"] for e in t] == [1000, 1001]
    assert t[0]["count"] == 200 and t[0]["mean_ms"] == pytest.approx(20)
    assert t[0]["max_ms"] == 30
    assert t[0]["p50_ms"] == pytest.approx(10, rel=0.03)
    assert t[0]["p99_ms"] == pytest.approx(30, rel=0.03)
    assert t[1] == {"second": 1001, "count": 50, "mean_ms": 100.0, "max_ms": 100.0,
                    "p50_ms": pytest.approx(100, rel=0.03),
                    "p99_ms": pytest.approx(100, rel=0.03)}
    assert set(sink.timeline()[0]) == {"second", "count", "mean_ms", "max_ms", "p50_ms",
                                       "p99_ms"}
    sink.clear()
    assert sink.summary() == {"count": 0, "mean_ms": None, "p50_ms": None, "p90_ms": None,
                              "p99_ms": None, "p999_ms": None, "max_ms": None}


def test_latency_sink_default_directory_and_long_run() -> None:
    sink = LatencySink()
    assert os.path.isdir(sink.directory)
    clock = ManualClock(50_000.0)
    w = sink.open(0, 1, clock)
    for i in range(300):  # 300 seconds, latency i ms in second i
        w.write([None] * 10, [int(clock.now() * 1000) - i] * 10)
        clock.advance(1.0)
    w.close()
    t = sink.timeline()
    assert len(t) == 300
    assert [e["count"] for e in t] == [10] * 300
    assert [e["max_ms"] for e in t] == list(range(300))
    assert sink.summary()["count"] == 3000
    assert sink.summary()["p50_ms"] == pytest.approx(149, rel=0.03)


# -- a sink's failed batch is never written again (issue 14) ---------------------------------

# what each FlakySink writer wrote, by sink key: module-global, so it survives the deep copy
# a task spec makes of its sink
WRITTEN: dict[str, list[Any]] = {}


class FlakyWriter(SinkWriter):
    """A non-idempotent writer: writes records one by one and raises on a record "bad",
    after those before it were written (as a writer failing part-way through a batch)."""

    def __init__(self, written: list[Any]) -> None:
        self.written = written
        self.calls = 0

    def write(self, values: Any, timestamps: Any) -> None:
        self.calls += 1
        for v in values:
            if v == "bad":
                raise ValueError("bad record")
            self.written.append(v)


class FlakySink(Sink):
    def __init__(self, key: str) -> None:
        self.key = key
        WRITTEN[key] = []

    def open(self, task_index: int, parallelism: int, clock: Any) -> SinkWriter:
        return FlakyWriter(WRITTEN[self.key])


class ListWriter(SinkWriter):
    def __init__(self) -> None:
        self.calls: list[list[tuple[Any, int]]] = []

    def write(self, values: Any, timestamps: Any) -> None:
        self.calls.append(list(zip(values, timestamps, strict=True)))


def sink_op(name: str = "out") -> g.OperatorDef:
    return g.OperatorDef(name, g.SINK, None, 1, (g.InputDef("up"),))


def test_failed_sink_batch_is_not_rewritten_and_fails_naming_the_first_record() -> None:
    written: list[Any] = []
    writer = FlakyWriter(written)
    runner = StatelessRunner(sink_op(), ErrorPolicy("out", 2, None), writer)
    assert runner.process(["w", "x"], [1, 2]) == ([], [])
    with pytest.raises(UserFunctionError) as info:
        runner.process(["a", "b", "bad", "c"], [3, 4, 5, 6])
    e = info.value
    assert (e.operator, e.task_index, e.record) == ("out", 2, "'a'")
    assert e.cause.startswith("ValueError: bad record (writing a batch of 4 records")
    assert writer.calls == 2  # one write per batch: never record by record
    assert written == ["w", "x", "a", "b"]  # nothing written twice
    assert max(Counter(written).values()) == 1


def test_failed_sink_batch_goes_to_the_dead_letter_sink_whole() -> None:
    written: list[Any] = []
    writer, dead = FlakyWriter(written), ListWriter()
    policy = ErrorPolicy("out", 0, dead)
    runner = StatelessRunner(sink_op(), policy, writer)
    assert runner.process(["a", "b", "bad", "c"], [3, 4, 5, 6]) == ([], [])
    assert written == ["a", "b"] and writer.calls == 1
    cause = "ValueError: bad record (the sink's write of a batch of 4 records raised; not retried)"
    assert dead.calls == [[(("out", 0, v, cause), t)
                           for v, t in zip(["a", "b", "bad", "c"], [3, 4, 5, 6], strict=True)]]
    assert policy.dead_letters == 4
    assert runner.process(["d"], [7]) == ([], [])  # the next batch is written as usual
    assert written == ["a", "b", "d"]


def test_map_filter_flat_map_keep_the_per_record_slow_path() -> None:
    dead = ListWriter()
    policy = ErrorPolicy("m", 0, dead)
    m = StatelessRunner(g.OperatorDef("m", g.MAP, lambda v: 10 // v, 1, (g.InputDef("up"),)),
                        policy)
    assert m.process([1, 0, 5], [1, 2, 3]) == ([10, 2], [1, 3])
    assert [[r for r, _ in c] for c in dead.calls] == [
        [("m", 0, 0, "ZeroDivisionError: integer division or modulo by zero")]]


def test_a_task_whose_sink_batch_fails_names_operator_task_and_first_record() -> None:
    from tests.unit.test_validation import task_cores

    job = StreamJob("flaky", num_key_groups=8,
                    config=JobConfig(batch_size=10, linger_ms=0, metrics_port=None))
    job.source(TestingSource(["a", "b", "bad", "c"]), name="src").sink(
        FlakySink("no-dead-letter"), name="out")
    [core] = task_cores(job, ManualClock()).values()  # source and sink chained in one task
    core.poll_source(10)
    assert core.status == "failed"
    [f] = [r for r in core.reports if isinstance(r, TaskFailed)]
    assert (f.operator, f.task_index, f.record) == ("out", 0, "'a'")
    assert "ValueError: bad record" in f.cause and "not written again" in f.cause
    assert WRITTEN["no-dead-letter"] == ["a", "b"]


def test_a_sink_dead_letter_takes_the_failed_batch_and_the_job_goes_on(tmp_path: Any) -> None:
    from tests.unit.test_validation import task_cores

    dead = TestingSink(str(tmp_path / "dead"))
    job = StreamJob("flaky", num_key_groups=8,
                    config=JobConfig(batch_size=10, linger_ms=0, metrics_port=None))
    job.source(TestingSource(["a", "b", "bad", "c"]), name="src").sink(
        FlakySink("dead-letter"), name="out", dead_letter=dead)
    assert job.graph().operator("out").dead_letter is dead
    [core] = task_cores(job, ManualClock()).values()
    while core.poll_source(10):
        pass
    assert core.status == "finished"
    assert WRITTEN["dead-letter"] == ["a", "b"]
    assert [(op, i, v) for op, i, v, _ in dead.results()] == [
        ("out", 0, "a"), ("out", 0, "b"), ("out", 0, "bad"), ("out", 0, "c")]
    assert core.metrics().dead_letters == 4


def test_parquet_writer_is_all_or_nothing_on_a_record_that_does_not_fit(tmp_path: Any) -> None:
    out = str(tmp_path / "out")
    sink = ParquetSink(out, schema=["a", "b"])
    sink.prepare()
    w = sink.open(0, 1, ManualClock())
    w.write([(1, 2)], [0])
    with pytest.raises(ValueError, match="does not fit"):
        w.write([(3, 4), (5, 6, 7), (8, 9)], [0, 0, 0])
    w.write([(10, 11)], [0])
    w.flush()
    values, _ = read_in_order(ParquetSource(out))
    assert values == [(1, 2), (10, 11)]  # nothing of the failed batch


def test_parquet_writer_first_record_that_does_not_fit_leaves_it_usable(tmp_path: Any) -> None:
    out = str(tmp_path / "out")
    sink = ParquetSink(out, schema=["a", "b"])
    sink.prepare()
    w = sink.open(0, 1, ManualClock())
    with pytest.raises(ValueError, match="does not fit schema"):
        w.write([7, (1, 2)], [0, 0])
    w.write([(1, 2)], [0])
    w.flush()
    assert read_in_order(ParquetSource(out))[0] == [(1, 2)]


def test_parquet_writer_keeps_earlier_rows_and_drops_the_batch_when_a_file_fails(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = str(tmp_path / "out")
    sink = ParquetSink(out, rows_per_file=2)
    sink.prepare()
    w = sink.open(0, 1, ManualClock())
    w.write([1], [0])  # buffered
    real = pq.write_table

    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", disk_full)
    with pytest.raises(OSError, match="disk full"):
        w.write([2, 3], [0, 0])  # fills a file, whose write fails
    monkeypatch.setattr(pq, "write_table", real)
    assert os.listdir(out) == []
    w.write([4], [0])
    w.flush()
    values, _ = read_in_order(ParquetSource(out))
    assert values == [1, 4]  # the earlier row kept; the failed batch's rows nowhere


def test_pending_files_are_published_where_they_were_written(tmp_path):
    """A job restored from a savepoint into another directory publishes the savepoint's
    pre-committed files in the directory they were written in (Flink's file sink commits
    to its committable's own path); transactions of older checkpoints, without a
    directory, are read against the committing writer's."""
    import os

    from engine.io.sinks import PendingFiles

    old, new = str(tmp_path / "old"), str(tmp_path / "new")
    os.makedirs(new)
    w = PendingFiles(old, "w0")
    with open(os.path.join(w.open_dir, "part-1"), "w") as f:
        f.write("x")
    txn = w.seal(7)
    assert txn is not None and txn[0][2] == os.path.abspath(old)
    PendingFiles.commit(new, [txn], "sink")
    assert os.path.exists(os.path.join(old, "part-1")) and not os.listdir(new)
    PendingFiles.commit(new, [txn], "sink")  # twice: a no-op
    legacy = [[e[0], e[1]] for e in txn]
    PendingFiles.commit(old, [legacy], "sink")
