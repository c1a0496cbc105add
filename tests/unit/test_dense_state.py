"""Dense keyed-state tables (engine.state.dense) and the vectorised aggregations on them:
a group's view behaves as a dict, the backend keeps dense tables in step with install and
remove, snapshots and replica deltas of a dense group decode equal to the dict form, and
an aggregate on dense tables emits the same values and keeps the same state as one on
dicts, through random batches, migrations and fallbacks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.columnar.batches import ColumnBatch, ColumnKey
from engine.dataflow import graph as g
from engine.dataflow.keygroups import key_group_of
from engine.operators.builtin import ErrorPolicy
from engine.operators.vectorised import AggregateRunner, ColumnAggregate, Count, Max, Mean, Min, Sum
from engine.state import dense as dense_state
from engine.state.dense import DenseGroupView, DenseTable, int64_keys, value_kind
from engine.state.keyed import KeyedStateBackend, apply_delta, decode_snapshot
from engine.time.clock import ManualClock

N = 16
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


# ---------------------------------------------------------------- the table and its views


def test_what_can_be_dense() -> None:
    assert value_kind([1, 2]) == "i" and value_kind([1.0, -0.0]) == "f" and value_kind([]) == ""
    assert value_kind([1, 2.0]) is None and value_kind([True]) is None
    assert value_kind([2**63]) is None and value_kind(["a"]) is None
    assert int64_keys([1, -5]).tolist() == [1, -5]
    assert int64_keys([True, 1]) is None and int64_keys([2**64]) is None
    assert int64_keys(["a"]) is None
    import pyarrow as pa

    assert int64_keys(pa.array([3, 4], type=pa.int32())).dtype == np.int64
    assert int64_keys(pa.array([3, None])) is None
    assert int64_keys(pa.array([3], type=pa.uint64())) is None
    assert int64_keys(pa.array(["x"])) is None


def test_absorb_refuses_what_does_not_fit_and_changes_nothing() -> None:
    t = DenseTable("s")
    assert t.absorb(1, [5, 2], [10, 20])
    assert not t.absorb(2, [7], [1.5])  # floats into an int table
    assert not t.absorb(2, ["k"], [1])
    assert not t.absorb(2, [True], [1])
    keys, kgs, _ = t.entries()
    assert keys.tolist() == [2, 5] and kgs.tolist() == [1, 1]
    assert dict(t.view(1).items()) == {5: 10, 2: 20} and len(t.view(2)) == 0


OPS = st.lists(st.tuples(st.sampled_from(["set", "del", "get", "drop"]),
                         st.integers(0, 3), st.integers(-6, 6), st.integers(-99, 99)),
               max_size=60)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_views_behave_as_one_dict_per_group(ops: list[tuple[str, int, int, int]]) -> None:
    t = DenseTable("s")
    ref: dict[int, dict[int, int]] = {kg: {} for kg in range(4)}
    owner: dict[int, int] = {}  # a key belongs to one group, as key groups guarantee
    for op, kg, key, value in ops:
        kg = owner.setdefault(key, kg)
        v = t.view(kg)
        if op == "set":
            v[key] = value
            ref[kg][key] = value
        elif op == "del":
            if key in ref[kg]:
                del v[key]
                del ref[kg][key]
            else:
                with pytest.raises(KeyError):
                    del v[key]
        elif op == "get":
            assert v.get(key, "none") == ref[kg].get(key, "none")
            assert (key in v) == (key in ref[kg])
        else:
            t.drop_group(kg)
            for k in ref[kg]:
                del owner[k]
            ref[kg] = {}
        for g_ in range(4):
            view = t.view(g_)
            assert dict(view.items()) == ref[g_] and len(view) == len(ref[g_])
            assert sorted(view) == sorted(ref[g_]) and bool(view) == bool(ref[g_])
        keys = t.entries()[0].tolist()
        assert keys == sorted(keys) and len(set(keys)) == len(t)


BATCHES = st.lists(st.tuples(st.lists(st.integers(-30, 30), min_size=1, max_size=12,
                                      unique=True),
                             st.integers(-99, 99), st.integers(0, 3)),
                   min_size=1, max_size=25)


@settings(max_examples=200, deadline=None)
@given(BATCHES, st.sampled_from([1, 4, 65_536]))
def test_batches_read_and_write_as_one_dict_through_side_table_merges(
        batches: list[tuple[list[int], int, int]], delta_max: int) -> None:
    """lookup/gather/assign a batch of distinct keys at a time (new keys go to the side
    table, merged past ``DELTA_MAX``; small here so merges happen), with groups dropped
    between batches: the table holds what one dict would."""
    saved = dense_state.DELTA_MAX
    dense_state.DELTA_MAX = delta_max
    try:
        t = DenseTable("s")
        ref: dict[int, int] = {}
        for keys, add, drop in batches:
            k = np.asarray(keys, dtype=np.int64)
            kgs = np.abs(k) % 4  # a key's group is fixed
            slots, found = t.lookup(k)
            assert found.tolist() == [x in ref for x in keys]
            held = t.gather(slots) if len(t) else np.zeros(k.size, dtype=np.int64)
            assert [int(v) for v, f in zip(held, found, strict=True) if f] == \
                [ref[x] for x in keys if x in ref]
            new = np.where(found, held, 0) + add
            t.assign(k, kgs, slots, found, new)
            ref.update(zip(keys, new.tolist(), strict=True))
            if add % 5 == 0:  # now and then a group leaves
                t.drop_group(drop)
                ref = {x: v for x, v in ref.items() if abs(x) % 4 != drop}
            assert len(t) == len(ref)
        assert {kg: dict(t.view(kg).items()) for kg in range(4)} == \
            {kg: {x: v for x, v in ref.items() if abs(x) % 4 == kg} for kg in range(4)}
    finally:
        dense_state.DELTA_MAX = saved


def test_a_view_refuses_what_the_table_cannot_hold() -> None:
    t = DenseTable("s")
    v = t.view(0)
    v[1] = 5
    with pytest.raises(TypeError, match="int keys"):
        v["a"] = 1
    with pytest.raises(TypeError, match="int keys"):
        v[2] = 1.5
    with pytest.raises(KeyError, match="key group 0"):
        t.view(3)[1] = 7
    assert dict(v.items()) == {1: 5} and isinstance(v, DenseGroupView)


# ---------------------------------------------------------------- the backend


def backend_with(tables: dict[int, dict[int, int]], name: str = "agg/x") -> KeyedStateBackend:
    b = KeyedStateBackend(N)
    for kg in range(N):
        b.own(kg)
    for kg, entries in tables.items():
        b.groups[kg][name] = dict(entries)
    return b


def test_dense_table_takes_the_groups_dicts_and_snapshots_do_not_change() -> None:
    b = backend_with({1: {10: 1, 3: 2}, 4: {7: 5}})
    b.groups[4]["other"] = {"s": "x"}
    before = {kg: decode_snapshot(b.snapshot(kg)) for kg in range(N)}
    t = b.dense_table("agg/x")
    assert t is not None and b.dense_table("agg/x") is t and b.dense_names() == ["agg/x"]
    assert isinstance(b.groups[1]["agg/x"], DenseGroupView)
    assert b.groups[4]["other"] == {"s": "x"}  # other tables stay dicts
    assert {kg: decode_snapshot(b.snapshot(kg)) for kg in range(N)} == before
    assert b.num_keys() == 4 and b.estimated_bytes() > 0


def test_dense_table_refused_leaves_the_dicts() -> None:
    b = backend_with({1: {10: 1}, 2: {"k": 2}})
    assert b.dense_table("agg/x") is None
    assert type(b.groups[1]["agg/x"]) is dict and b.dense_names() == []


def test_install_and_remove_keep_the_dense_table_in_step() -> None:
    a = backend_with({1: {10: 1, 3: 2}, 2: {8: 4}})
    b = backend_with({1: {99: 9}, 5: {50: 5}})
    ta, tb = a.dense_table("agg/x"), b.dense_table("agg/x")
    assert ta is not None and tb is not None
    b.install(1, a.snapshot(1))  # replaces the group: key 99 goes
    assert dict(b.groups[1]["agg/x"].items()) == {3: 2, 10: 1}
    assert tb.entries()[0].tolist() == [3, 10, 50]
    b.remove(5)
    assert tb.entries()[0].tolist() == [3, 10] and 5 not in b.groups
    b.own(5)
    b.set_current(50, 5)
    assert b.table("agg/x").get(50) is None  # a group that came back starts empty
    b.table("agg/x")[50] = 1
    assert dict(b.groups[5]["agg/x"].items()) == {50: 1}


def test_installing_what_a_dense_table_cannot_hold_turns_it_back_into_dicts() -> None:
    a = backend_with({1: {"k": 1}})
    b = backend_with({2: {8: 4}})
    assert b.dense_table("agg/x") is not None
    b.install(1, a.snapshot(1))
    assert b.dense_names() == []
    assert b.groups[1]["agg/x"] == {"k": 1} and type(b.groups[2]["agg/x"]) is dict
    assert b.groups[2]["agg/x"] == {8: 4}


def test_replica_deltas_of_a_dense_group_apply_as_for_dicts() -> None:
    b = backend_with({3: {1: 1, 2: 2}})
    t = b.dense_table("agg/x")
    assert t is not None
    b.track_changes(3)
    base = b.snapshot(3)
    b.mark_replicated(3)
    b.set_current(2, 3)
    b.table("agg/x")[2] = 20
    b.set_current(9, 3)
    b.table("agg/x")[9] = 90
    del b.groups[3]["agg/x"][1]
    b.note_changed(3, 1)
    assert decode_snapshot(apply_delta(base, b.snapshot_delta(3))) == \
        decode_snapshot(b.snapshot(3)) == ({"agg/x": {2: 20, 9: 90}}, set())


# ---------------------------------------------------------------- aggregations on dense tables


def runner(*aggs: Any, dense: bool) -> AggregateRunner:
    b = KeyedStateBackend(N)
    for kg in range(N):
        b.own(kg)
    op = g.OperatorDef("agg", g.AGGREGATE, ColumnAggregate(aggs, "k"), 1,
                       (g.InputDef("src", ColumnKey("k")),))
    r = AggregateRunner(op, ErrorPolicy("agg", 0, None), b, 0, ManualClock(), lambda: 0)
    r._dense_ok = dense
    return r


def feed(r: AggregateRunner, part: list[dict[str, Any]], as_rows: bool) -> list[dict[str, Any]]:
    keys = [p["k"] for p in part]
    kgs = [key_group_of(k, N) for k in keys]
    if as_rows:
        out, _ = r.process(part, list(range(len(part))), keys, kgs)
    else:
        b = ColumnBatch.from_rows(part)
        out, _ = r.process(b, np.arange(len(part)), b.column("k"), np.asarray(kgs))
    return out.rows()


def snapshots(r: AggregateRunner) -> dict[int, Any]:
    return {kg: decode_snapshot(r.backend.snapshot(kg)) for kg in range(N)}


AGGS = (Count(), Sum("v"), Min("v"), Max("v"), Mean("v"))
STEP = st.tuples(
    st.lists(st.tuples(st.one_of(st.integers(-5, 5), INT64), st.integers(-50, 50)),
             min_size=1, max_size=40),
    st.booleans(),  # as dict rows (records a migration handled one by one)
    st.lists(st.integers(0, N - 1), max_size=3),  # key groups that leave and come back
)


@settings(max_examples=150, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=8), st.booleans(), st.sampled_from([2, 65_536]))
def test_dense_aggregation_equals_the_dict_one_through_migrations(
        steps: list[Any], floats: bool, delta_max: int) -> None:
    """Seeded by hypothesis (its seed is printed on failure): the same batches into a runner
    on dense tables and one on dicts; between batches some groups are snapshotted, removed
    and installed again (a migration out and back), in both. Outputs, snapshots and the
    dense tables' use agree."""
    saved = dense_state.DELTA_MAX
    dense_state.DELTA_MAX = delta_max  # 2: the side table merges at almost every batch
    try:
        _dense_equals_dicts(steps, floats)
    finally:
        dense_state.DELTA_MAX = saved


def _dense_equals_dicts(steps: list[Any], floats: bool) -> None:
    dense, dicts = runner(*AGGS, dense=True), runner(*AGGS, dense=False)
    for recs, as_rows, moving in steps:
        part = [{"k": k, "v": float(v) if floats else v} for k, v in recs]
        assert feed(dense, part, as_rows) == feed(dicts, part, as_rows)
        for kg in moving:
            for r in (dense, dicts):
                data = r.backend.snapshot(kg)
                r.backend.remove(kg)
                r.backend.own(kg)
                r.backend.install(kg, data)
        assert snapshots(dense) == snapshots(dicts)
    assert dense._dense_ok and len(dense.backend.dense_names()) == 6
    assert dicts.backend.dense_names() == []


def test_keys_that_cannot_be_dense_turn_the_operator_back_to_dicts() -> None:
    dense, dicts = runner(Count(), Sum("v"), dense=True), runner(Count(), Sum("v"), dense=False)
    for part, as_rows in (([{"k": 1, "v": 2}, {"k": 2, "v": 3}], False),
                          ([{"k": "a", "v": 1}, {"k": "b", "v": 1}], True),
                          ([{"k": 2, "v": 5}], False)):
        assert feed(dense, part, as_rows) == feed(dicts, part, as_rows)
    assert not dense._dense_ok and dense.backend.dense_names() == []
    assert snapshots(dense) == snapshots(dicts)


def test_a_float_column_after_ints_keeps_the_untouched_keys_ints() -> None:
    dense, dicts = runner(Sum("v"), dense=True), runner(Sum("v"), dense=False)
    for part in ([{"k": 1, "v": 2}, {"k": 2, "v": 3}], [{"k": 1, "v": 0.5}]):
        assert feed(dense, part, False) == feed(dicts, part, False)
    assert snapshots(dense) == snapshots(dicts)
    kg2 = key_group_of(2, N)
    assert type(dense.backend.groups[kg2]["agg/sum(v)"][2]) is int
    assert not dense._dense_ok


def test_a_record_of_a_group_not_owned_is_refused_on_the_dense_path() -> None:
    from engine.operators.builtin import UnknownKeyGroupError

    r = runner(Count(), dense=True)
    r.backend.remove(key_group_of(3, N))
    with pytest.raises(UnknownKeyGroupError, match="does not own"):
        feed(r, [{"k": 3, "v": 1}], False)
