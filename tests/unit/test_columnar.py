"""The columnar data path (engine.columnar.batches, engine.operators.vectorised): the vectorised key groups
equal the per-record hash, columnar frames round-trip, the router keeps order and routing
across rows and column batches, the vectorised aggregations equal a per-record fold
however the records are cut into batches, and map_batches."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.columnar.batches import (
    ColumnBatch,
    ColumnKey,
    column_key_groups,
)
from engine.dataflow import graph as g
from engine.dataflow.keygroups import key_group_of
from engine.errors import ColumnarError, InvalidKeyError, UserFunctionError
from engine.io.sources import ColumnarSource
from engine.io.testing import TestingSink, TestingSource
from engine.operators.builtin import ErrorPolicy
from engine.operators.vectorised import (
    AggregateRunner,
    ColumnAggregate,
    Count,
    MapBatches,
    MapBatchesRunner,
    Max,
    Mean,
    Min,
    Sum,
    state_tables,
)
from engine.state.keyed import KeyedStateBackend
from engine.time.clock import ManualClock
from engine.wire.messages import EndOfStream, Frame, OutputEdge, decode_frame, encode_frame
from tests.unit.test_channel import FakeNow, chan, drain

N = 16
ints64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


# ---------------------------------------------------------------- key groups


@settings(max_examples=300, deadline=None)
@given(st.lists(ints64, min_size=1, max_size=50), st.sampled_from([7, 16, 128, 1000]))
def test_int_key_groups_equal_the_per_record_hash(keys: list[int], n: int) -> None:
    want = [key_group_of(k, n) for k in keys]
    assert column_key_groups(pa.array(keys, type=pa.int64()), n).tolist() == want
    assert column_key_groups(np.asarray(keys, dtype=np.int64), n).tolist() == want
    small = [k % 100 for k in keys]
    assert column_key_groups(pa.array(small, type=pa.int8()), n).tolist() == [
        key_group_of(k, n) for k in small]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=8), st.none()), min_size=1, max_size=50),
       st.lists(st.floats(allow_nan=False, width=64), min_size=1, max_size=30),
       st.lists(st.binary(max_size=6), min_size=1, max_size=20),
       st.lists(st.booleans(), min_size=1, max_size=10))
def test_other_key_groups_equal_the_per_record_hash(
        strs: list[Any], floats: list[float], blobs: list[bytes], bools: list[bool]) -> None:
    for keys in (strs, floats, blobs, bools):
        assert column_key_groups(pa.array(keys), 128).tolist() == [
            key_group_of(k, 128) for k in keys]
    assert column_key_groups(np.asarray(floats), 128).tolist() == [
        key_group_of(k, 128) for k in floats]


def test_nan_keys_are_refused_as_on_the_record_path() -> None:
    with pytest.raises(InvalidKeyError, match="NaN"):
        column_key_groups(pa.array([1.0, math.nan]), 16)


# ---------------------------------------------------------------- frames and router


def batch(**cols: Any) -> ColumnBatch:
    return ColumnBatch(pa.RecordBatch.from_pydict(cols))


def test_columnar_frame_round_trip_with_keys_groups_and_event() -> None:
    b = batch(k=[3, 4, 3], v=[1.5, 2.5, 3.5], s=["a", "b", "c"])
    data = encode_frame(Frame(b, np.array([10, 11, 12]), "k", np.array([1, 2, 1]),
                              EndOfStream()))
    assert data[:4] == b"\xff\xff\xff\xff"
    f = decode_frame(data)
    assert f.values.rows() == b.rows() and f.timestamps.tolist() == [10, 11, 12]
    assert f.keys.to_pylist() == [3, 4, 3] and f.key_groups.tolist() == [1, 2, 1]
    assert f.event == EndOfStream() and f.ports is None
    plain = decode_frame(encode_frame(Frame(b, np.array([1, 2, 3]))))
    assert plain.keys is None and plain.key_groups is None and plain.event is None


def keyed_router(n_channels: int, batch_size: int = 1000):
    from engine.task.channel import OutputRouter

    routing = tuple(kg % n_channels for kg in range(N))
    edge = OutputEdge(0, "keyed", tuple(chan(i) for i in range(n_channels)), routing)
    r = OutputRouter(batch_size, 0.005, N, {0: ColumnKey("k")}, FakeNow())
    r.connect([edge])
    return r, routing


def test_router_routes_a_column_batch_as_it_routes_rows() -> None:
    keys = list(range(40))
    r, routing = keyed_router(3, batch_size=8)
    r.emit(batch(k=keys, v=[k * 10 for k in keys]), np.arange(40))
    r.flush_all()
    got: dict[int, list[Any]] = {}
    for cid, _, f in drain(r):
        assert type(f.values) is ColumnBatch and len(f.values) <= 8
        got.setdefault(cid, []).extend(
            zip(f.values.rows(), f.timestamps.tolist(), f.keys.to_pylist(),
                f.key_groups.tolist(), strict=True))
    for cid, recs in got.items():
        for row, ts, key, kg in recs:
            assert kg == key_group_of(key, N) and routing[kg] == cid
            assert row == {"k": key, "v": key * 10} and ts == key
        assert [r[1] for r in recs] == sorted(r[1] for r in recs)  # order kept per channel
    assert sum(len(v) for v in got.values()) == 40


def test_router_keeps_order_when_rows_and_batches_alternate() -> None:
    from engine.task.channel import OutputRouter

    edge = OutputEdge(0, "forward", (chan(0),))
    r = OutputRouter(100, 0.005, N, {}, FakeNow())
    r.connect([edge])
    r.emit([{"x": 0}, {"x": 1}], [0, 1])
    r.emit(batch(x=[2, 3]), np.array([2, 3]))
    r.emit([{"x": 4}], [4])
    r.broadcast(EndOfStream())
    seen = []
    for _, _, f in drain(r):
        vals = f.values.rows() if type(f.values) is ColumnBatch else list(f.values)
        seen.extend(v["x"] for v in vals)
    assert seen == [0, 1, 2, 3, 4]


def test_redirect_moves_waiting_column_records_one_by_one() -> None:
    r, routing = keyed_router(2)
    keys = list(range(20))
    r.emit(batch(k=keys), np.arange(20))
    moving = sorted({key_group_of(k, N) for k in keys if routing[key_group_of(k, N)] == 0})[:2]
    r.redirect(0, moving, 1)
    r.flush_all()
    for cid, _, f in drain(r):
        kgs = list(f.key_groups)
        assert all((kg in moving) == (cid == 1) or routing[kg] == cid for kg in kgs)
        assert all(cid == 1 for kg in kgs if kg in moving)


# ---------------------------------------------------------------- aggregations


def agg_runner(*aggs: Any, backend: KeyedStateBackend | None = None) -> AggregateRunner:
    b = backend or KeyedStateBackend(N)
    for kg in range(N):
        b.own(kg)
    op = g.OperatorDef("agg", g.AGGREGATE, ColumnAggregate(aggs, "k"), 1,
                       (g.InputDef("src", ColumnKey("k")),))
    return AggregateRunner(op, ErrorPolicy("agg", 0, None), b, 0, ManualClock(),
                           lambda: 0)


def fold(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The per-record meaning of Count, Sum, Min, Max, Mean of 'v' per 'k'."""
    acc: dict[Any, list[Any]] = {}
    out = []
    for r in records:
        k, v = r["k"], r["v"]
        a = acc.get(k)
        a = [1, v, v, v] if a is None else [a[0] + 1, a[1] + v, min(a[2], v), max(a[3], v)]
        acc[k] = a
        out.append({"k": k, "count()": a[0], "sum(v)": a[1], "min(v)": a[2], "max(v)": a[3],
                    "mean(v)": a[1] / a[0]})
    return out


AGGS = (Count(), Sum("v"), Min("v"), Max("v"), Mean("v"))
values = st.one_of(st.integers(min_value=-1000, max_value=1000),
                   st.floats(min_value=-1e6, max_value=1e6, allow_nan=False))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), values), min_size=1, max_size=120),
       st.lists(st.integers(1, 40), min_size=1, max_size=10), st.booleans(),
       st.booleans())
def test_aggregations_equal_a_per_record_fold_however_batched(
        recs: list[tuple[int, Any]], cuts: list[int], as_rows: bool, as_float: bool) -> None:
    records = [{"k": k, "v": float(v) if as_float else (int(v) if isinstance(v, int) else v)}
               for k, v in recs]
    if not as_float and any(isinstance(r["v"], float) for r in records):
        records = [{"k": r["k"], "v": float(r["v"])} for r in records]
    run = agg_runner(*AGGS)
    out: list[dict[str, Any]] = []
    i = c = 0
    while i < len(records):
        part = records[i:i + cuts[c % len(cuts)]]
        i, c = i + len(part), c + 1
        keys = [r["k"] for r in part]
        kgs = [key_group_of(k, N) for k in keys]
        if as_rows:  # records a migration handles one by one arrive as dict rows
            res, ts = run.process(part, list(range(len(part))), keys, kgs)
        else:
            b = ColumnBatch.from_rows(part)
            res, ts = run.process(b, np.arange(len(part)), b.column("k"), np.asarray(kgs))
        assert type(res) is ColumnBatch and len(ts) == len(part)
        out.extend(res.rows())
    assert out == fold(records)
    state: dict[Any, list[Any]] = {}
    for agg in AGGS:
        for table in state_tables(agg):
            for kg in range(N):
                for k, v in run.backend.groups[kg].get(table, {}).items():
                    state.setdefault(k, []).append(v)
    last = {r["k"]: r for r in fold(records)}
    assert state == {k: [r["count()"], r["sum(v)"], r["min(v)"], r["max(v)"],
                         r["sum(v)"], r["count()"]] for k, r in last.items()}


def test_aggregate_state_moves_with_its_key_group() -> None:
    a = agg_runner(Count(), Sum("v"))
    b = agg_runner(Count(), Sum("v"))
    rows = [{"k": k % 3, "v": k} for k in range(9)]
    keys = [r["k"] for r in rows]
    a.process(rows, [0] * 9, keys, [key_group_of(k, N) for k in keys])
    for kg in range(N):  # snapshot at a, install at b: as every protocol moves a group
        b.backend.install(kg, a.backend.snapshot(kg))
    more = [{"k": 1, "v": 100}]
    out, _ = b.process(more, [0], [1], [key_group_of(1, N)])
    assert out.rows() == [{"k": 1, "count()": 4, "sum(v)": 1 + 4 + 7 + 100}]


def test_aggregate_refuses_bad_columns_naming_the_operator() -> None:
    run = agg_runner(Sum("v"))
    with pytest.raises(UserFunctionError, match="agg.*nulls"):
        run.process(batch(k=[1], v=[None]), np.array([0]), pa.array([1]), np.array([1]))
    with pytest.raises(UserFunctionError, match="not numeric"):
        run.process(batch(k=[1], v=["x"]), np.array([0]), pa.array([1]), np.array([1]))
    with pytest.raises(UserFunctionError, match="no column 'v'"):
        run.process(batch(k=[1]), np.array([0]), pa.array([1]), np.array([1]))


def test_aggregate_definitions_are_checked() -> None:
    with pytest.raises(ColumnarError, match="at least one"):
        ColumnAggregate((), "k")
    with pytest.raises(ColumnarError, match="must differ"):
        ColumnAggregate((Sum("v"), Sum("v")), "k")
    assert ColumnAggregate((Sum("v"), Sum("v", alias_name="total")), "k")
    with pytest.raises(ColumnarError, match="takes Count"):
        ColumnAggregate(("count",), "k")  # type: ignore[arg-type]


# ---------------------------------------------------------------- map_batches


def mb_runner(fn: Any, fmt: str, dead_letter: Any = None) -> MapBatchesRunner:
    op = g.OperatorDef("mb", g.MAP_BATCHES, MapBatches(fn, fmt), 1, (g.InputDef("src"),))
    return MapBatchesRunner(op, ErrorPolicy("mb", 0, dead_letter))


def test_map_batches_in_each_format() -> None:
    def double_np(b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"x": b["x"] * 2}

    def double_pa(t: pa.Table) -> pa.Table:
        import pyarrow.compute as pc

        return pa.table({"x": pc.multiply(t["x"], 2)})

    for fn, fmt in ((double_np, "numpy"), (double_pa, "pyarrow")):
        out, ts = mb_runner(fn, fmt).process(batch(x=[1, 2]), np.array([5, 6]))
        assert out.rows() == [{"x": 2}, {"x": 4}] and ts.tolist() == [5, 6]
    rows_in, ts = mb_runner(double_np, "numpy").process([{"x": 3}], [7])
    assert rows_in.rows() == [{"x": 6}] and ts.tolist() == [7]
    fewer, ts = mb_runner(lambda b: {"n": [len(b["x"])]}, "numpy").process(
        batch(x=[1, 2, 3]), np.array([1, 9, 4]))
    assert fewer.rows() == [{"n": 3}] and ts.tolist() == [9]  # the batch's latest


def test_map_batches_failure_goes_whole_to_dead_letters_or_fails(tmp_path: Any) -> None:
    def boom(b: Any) -> Any:
        raise ValueError("bad batch")

    with pytest.raises(UserFunctionError, match="bad batch.*map_batches over a batch of 2"):
        mb_runner(boom, "numpy").process(batch(x=[1, 2]), np.array([0, 0]))
    dl = TestingSink()
    w = dl.open(0, 1, ManualClock())
    run = mb_runner(boom, "numpy", w)
    assert run.process(batch(x=[1, 2]), np.array([0, 0])) == ([], [])
    w.flush()
    assert [r[2] for r in dl.results()] == [{"x": 1}, {"x": 2}]
    with pytest.raises(ColumnarError, match="batch_format"):
        MapBatches(boom, "arrow")


def test_columnar_source_wraps_a_row_source() -> None:
    rows = [{"k": i % 3, "v": i} for i in range(10)]
    reader = ColumnarSource(TestingSource(rows)).open_partition("0-of-1", None, ManualClock())
    b = reader.poll(4)
    assert type(b.values) is ColumnBatch and b.values.rows() == rows[:4]
    assert reader.offset() == 4
    with pytest.raises(ColumnarError, match="dict row"):
        ColumnBatch.from_rows([1, 2])


def test_column_key_on_a_row() -> None:
    assert ColumnKey("k")({"k": 5}) == 5
    with pytest.raises(ColumnarError, match="without column 'k'"):
        ColumnKey("k")((1, 2))
