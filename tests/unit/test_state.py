"""Unit tests for engine.state.keyed (keyed state per key group, timers, snapshots) and the
state-facing parts of engine.functions."""

from __future__ import annotations

import copy

import pytest

from engine.dataflow.keygroups import key_group_of
from engine.operators.functions import (
    Context,
    KeyedProcessFunction,
    ReduceFunction,
    RuntimeContext,
    TimerService,
)
from engine.state.keyed import (
    PROCESSING_TIME,
    KeyedStateBackend,
    ListState,
    MapState,
    ReducingState,
    ValueState,
)

N = 8  # key groups in these tests


def backend(groups=range(N)) -> KeyedStateBackend:
    b = KeyedStateBackend(N)
    for g in groups:
        b.own(g)
    return b


def at(b: KeyedStateBackend, key) -> None:
    """Make ``key`` current, in its real key group."""
    b.set_current(key, key_group_of(key, N))


def keys_in_group(group: int, count: int) -> list[str]:
    out, i = [], 0
    while len(out) < count:
        k = f"key-{i}"
        if key_group_of(k, N) == group:
            out.append(k)
        i += 1
    return out


def drain(b: KeyedStateBackend, now: int) -> list[tuple[int, int, object]]:
    return list(b.pop_due_timers(now))


# ---------------------------------------------------------------- scoping


def test_value_state_is_scoped_per_key_and_per_group():
    b = backend()
    v = ValueState(b, "count", 0)
    b.set_current("a", 1)
    assert v.value() == 0
    v.update(5)
    b.set_current("b", 1)
    assert v.value() == 0
    v.update(7)
    b.set_current("a", 2)  # same key object, other key group: separate state
    assert v.value() == 0
    v.update(9)
    b.set_current("a", 1)
    assert v.value() == 5
    b.set_current("b", 1)
    assert v.value() == 7
    assert b.groups[1]["count"] == {"a": 5, "b": 7}
    assert b.groups[2]["count"] == {"a": 9}
    v.clear()
    assert v.value() == 0
    assert b.groups[1]["count"] == {"a": 5}


def test_two_states_with_different_names_do_not_share():
    b = backend()
    x, y = ValueState(b, "x"), ValueState(b, "y", "dflt")
    b.set_current("k", 0)
    x.update(1)
    assert y.value() == "dflt"
    y.update(2)
    assert (x.value(), y.value()) == (1, 2)


def test_list_state():
    b = backend()
    ls = ListState(b, "events")
    b.set_current("a", 3)
    assert ls.get() == []
    ls.add(1)
    ls.add((2, "x"))
    got = ls.get()
    assert got == [1, (2, "x")]
    got.append("mutating the copy")
    assert ls.get() == [1, (2, "x")]
    b.set_current("b", 3)
    assert ls.get() == []
    ls.update((5, 6))
    assert ls.get() == [5, 6]
    assert type(b.groups[3]["events"]["b"]) is list
    b.set_current("a", 3)
    ls.clear()
    assert ls.get() == []
    b.set_current("b", 3)
    assert ls.get() == [5, 6]


def test_map_state():
    b = backend()
    ms = MapState(b, "m")
    b.set_current("a", 0)
    assert ms.is_empty() and ms.keys() == [] and ms.items() == []
    assert ms.get("x") is None and ms.get("x", 42) == 42
    assert not ms.contains("x")
    ms.put("x", 1)
    ms.put(("t", 2), [3])
    assert ms.get("x") == 1
    assert ms.contains(("t", 2))
    assert ms.keys() == ["x", ("t", 2)]
    assert ms.items() == [("x", 1), (("t", 2), [3])]
    assert not ms.is_empty()
    b.set_current("b", 0)
    assert ms.is_empty() and not ms.contains("x")
    ms.remove("nothing")  # no error on a missing map
    b.set_current("a", 0)
    ms.remove("x")
    assert ms.keys() == [("t", 2)]
    ms.clear()
    assert ms.is_empty() and ms.get(("t", 2)) is None


def test_reducing_state():
    b = backend()
    rs = ReducingState(b, "sum", lambda acc, v: acc + v)
    b.set_current("a", 5)
    assert rs.get() is None
    rs.add(0)  # a falsy first value still counts as present
    rs.add(3)
    rs.add(4)
    assert rs.get() == 7
    b.set_current("b", 5)
    rs.add(10)
    assert rs.get() == 10
    b.set_current("a", 5)
    rs.clear()
    assert rs.get() is None
    rs.add(1)
    assert rs.get() == 1


def test_reducing_state_keeps_a_stored_none_as_a_value():
    b = backend()
    calls = []

    def fn(acc, v):
        calls.append((acc, v))
        return v

    rs = ReducingState(b, "r", fn)
    b.set_current("k", 0)
    rs.add(None)
    rs.add(1)
    assert calls == [(None, 1)]
    assert rs.get() == 1


def test_set_current_on_a_group_not_owned_fails_loudly():
    b = backend(groups=[0, 1])
    with pytest.raises(KeyError):
        b.set_current("k", 5)


def test_own_is_idempotent_and_owned_is_sorted():
    b = KeyedStateBackend(N)
    for g in (5, 1, 3):
        b.own(g)
    b.set_current("k", 3)
    ValueState(b, "v").update(1)
    b.own(3)  # must not wipe an owned group
    assert ValueState(b, "v").value() == 1
    assert b.owned() == [1, 3, 5]


def test_num_keys_counts_every_table():
    b = backend()
    v, ls = ValueState(b, "v"), ListState(b, "l")
    for k in ("a", "b", "c"):
        at(b, k)
        v.update(1)
    at(b, "a")
    ls.add(1)
    assert b.num_keys() == 4


# ---------------------------------------------------------------- snapshot / remove / install


def populate(b: KeyedStateBackend, keys) -> None:
    v = ValueState(b, "v")
    ls = ListState(b, "l")
    ms = MapState(b, "m")
    rs = ReducingState(b, "r", lambda a, x: a + x)
    for i, k in enumerate(keys):
        at(b, k)
        v.update((k, i))
        ls.add(i)
        ls.add([i, "nested"])
        ms.put(("t", i), {"x": b"bytes"})
        rs.add(i)
        b.register_timer(1000 + i)


def test_snapshot_remove_install_moves_exactly_one_group():
    src = backend()
    keys = [f"key-{i}" for i in range(200)]
    populate(src, keys)
    moving = 3
    moving_keys = [k for k in keys if key_group_of(k, N) == moving]
    assert moving_keys, "test data must hit the moving group"
    before_groups = copy.deepcopy(src.groups)
    before_timers = copy.deepcopy(src.timers)

    data = src.snapshot(moving)
    assert isinstance(data, bytes)
    src.remove(moving)

    # the source lost exactly that group, state and timers
    assert moving not in src.owned()
    assert moving not in src.timers
    for g in range(N):
        if g != moving:
            assert src.groups[g] == before_groups[g]
            assert src.timers[g] == before_timers[g]

    dst = backend(groups=[g for g in range(N) if g != moving])
    dst_before = copy.deepcopy(dst.groups)
    dst.install(moving, data)
    assert dst.groups[moving] == before_groups[moving]
    assert dst.timers[moving] == before_timers[moving]
    for g in range(N):
        if g != moving:
            assert dst.groups[g] == dst_before[g]

    # timers travel with the group: they fire at the destination, not at the source
    fired_src = drain(src, 10_000)
    fired_dst = drain(dst, 10_000)
    assert all(kg != moving for _, kg, _ in fired_src)
    assert sorted(k for _, _, k in fired_dst) == sorted(moving_keys)
    assert {kg for _, kg, _ in fired_dst} == {moving}
    assert len(fired_src) == len(keys) - len(moving_keys)


def test_installed_state_behaves_identically():
    src = backend()
    keys = keys_in_group(6, 3)
    populate(src, keys)
    dst = backend(groups=[])
    dst.install(6, src.snapshot(6))

    for b in (src, dst):
        v, ls = ValueState(b, "v"), ListState(b, "l")
        ms, rs = MapState(b, "m"), ReducingState(b, "r", lambda a, x: a + x)
        at(b, keys[1])
        assert v.value() == (keys[1], 1)
        assert type(v.value()) is tuple
        ls.add("after")  # lists must stay lists (append works after install)
        assert ls.get() == [1, [1, "nested"], "after"]
        assert type(b.table("l")[keys[1]]) is list
        assert type(b.table("l")[keys[1]][1]) is list
        assert ms.get(("t", 1)) == {"x": b"bytes"}
        ms.put("new", 1)
        assert ms.keys() == [("t", 1), "new"]
        rs.add(10)
        assert rs.get() == 11
    assert src.groups[6] == dst.groups[6]
    assert src.snapshot(6) == dst.snapshot(6)


def test_install_replaces_the_group_and_rebinds_the_current_group():
    a, b = backend(), backend()
    v_a, v_b = ValueState(a, "v"), ValueState(b, "v")
    a.set_current("k", 2)
    v_a.update("from a")
    b.set_current("k", 2)
    v_b.update("stale")
    ValueState(b, "other").update("dropped")
    b.install(2, a.snapshot(2))  # while group 2 is current in b
    assert v_b.value() == "from a"
    assert ValueState(b, "other").value() is None


def test_remove_of_current_group_then_reown_starts_empty():
    b = backend()
    v = ValueState(b, "v")
    b.set_current("k", 4)
    v.update(1)
    b.remove(4)
    assert b.current_group == -1
    b.own(4)
    b.set_current("k", 4)
    assert v.value() is None


def test_snapshot_of_unknown_group_installs_as_empty_group():
    b = backend(groups=[0])
    data = b.snapshot(7)
    c = backend(groups=[])
    c.install(7, data)
    assert c.owned() == [7]
    assert c.groups[7] == {} and c.timers[7] == set()


def test_snapshot_keeps_key_and_value_types():
    b = backend()
    k = ("tenant", 7)
    b.set_current(k, 1)
    ValueState(b, "v").update({"list": [1], "tuple": (1,), "set": {1}, "bytes": b"x"})
    b.register_timer(5)
    c = backend(groups=[])
    c.install(1, b.snapshot(1))
    key = next(iter(c.groups[1]["v"]))
    assert key == k and type(key) is tuple
    val = c.groups[1]["v"][k]
    assert type(val["list"]) is list and type(val["tuple"]) is tuple
    assert type(val["set"]) is set and type(val["bytes"]) is bytes
    assert c.timers[1] == {(5, k, PROCESSING_TIME)}
    assert type(next(iter(c.timers[1]))[1]) is tuple


# ---------------------------------------------------------------- timers


def test_timers_fire_in_time_order_only_when_due():
    b = backend()
    for key, t in [("a", 30), ("b", 10), ("c", 20), ("d", 20)]:
        at(b, key)
        b.register_timer(t)
    assert b.next_timer() == 10
    assert drain(b, 9) == []
    fired = drain(b, 20)
    assert [t for t, _, _ in fired] == [10, 20, 20]
    assert {k for _, _, k in fired} == {"b", "c", "d"}
    assert all(kg == key_group_of(k, N) for _, kg, k in fired)
    assert b.next_timer() == 30
    assert drain(b, 29) == []
    assert drain(b, 30) == [(30, key_group_of("a", N), "a")]
    assert b.next_timer() is None
    assert drain(b, 10**12) == []


def test_timer_fires_only_once():
    b = backend()
    at(b, "a")
    b.register_timer(5)
    assert len(drain(b, 5)) == 1
    assert drain(b, 5) == []


def test_deleted_timers_do_not_fire():
    b = backend()
    at(b, "a")
    b.register_timer(10)
    b.register_timer(20)
    at(b, "b")
    b.register_timer(10)
    at(b, "a")
    b.delete_timer(10)
    b.delete_timer(999)  # deleting a timer that does not exist is harmless
    fired = drain(b, 100)
    assert sorted((t, k) for t, _, k in fired) == [(10, "b"), (20, "a")]


def test_next_timer_skips_deleted_timers():
    b = backend()
    at(b, "a")
    b.register_timer(10)
    b.register_timer(20)
    b.delete_timer(10)
    assert b.next_timer() == 20


def test_delete_then_register_again_fires_once():
    b = backend()
    at(b, "a")
    b.register_timer(10)
    b.delete_timer(10)
    b.register_timer(10)
    assert drain(b, 10) == [(10, key_group_of("a", N), "a")]


def test_duplicate_registration_fires_once():
    b = backend()
    at(b, "a")
    for _ in range(3):
        b.register_timer(10)
    b.register_timer(10.0)  # same time as a float
    assert len(b.timers[key_group_of("a", N)]) == 1
    assert drain(b, 10) == [(10, key_group_of("a", N), "a")]


def test_same_time_for_different_keys_fires_for_each_key():
    b = backend()
    for k in ("a", "b", "c"):
        at(b, k)
        b.register_timer(10)
    assert sorted(k for _, _, k in drain(b, 10)) == ["a", "b", "c"]


def test_timers_of_a_removed_group_do_not_fire():
    b = backend()
    (k3,) = keys_in_group(3, 1)
    (k4,) = keys_in_group(4, 1)
    at(b, k3)
    b.register_timer(10)
    at(b, k4)
    b.register_timer(20)
    b.remove(3)
    assert b.next_timer() == 20
    assert drain(b, 100) == [(20, 4, k4)]


def test_timers_of_a_removed_then_reowned_group_do_not_fire():
    b = backend()
    (k3,) = keys_in_group(3, 1)
    at(b, k3)
    b.register_timer(10)
    b.remove(3)
    b.own(3)
    assert drain(b, 100) == []


def test_installed_timers_fire_once_even_if_group_is_reinstalled():
    src = backend()
    (k,) = keys_in_group(2, 1)
    at(src, k)
    src.register_timer(10)
    data = src.snapshot(2)
    dst = backend(groups=[])
    dst.install(2, data)
    dst.install(2, data)  # e.g. a retried transfer
    assert dst.next_timer() == 10
    assert drain(dst, 10) == [(10, 2, k)]


def test_timers_for_unorderable_keys_in_one_group():
    b = KeyedStateBackend(1)
    b.own(0)
    for k in ("a", None, ("t", 1)):
        b.set_current(k, 0)
        b.register_timer(10)
    assert len(list(b.pop_due_timers(10))) == 3


# ---------------------------------------------------------------- sizes


def test_size_bytes_positive_and_growing():
    b = backend()
    (k, k2) = keys_in_group(1, 2)
    s0 = b.size_bytes(1)
    assert s0 > 0
    b.set_current(k, 1)
    ValueState(b, "v").update("x" * 100)
    s1 = b.size_bytes(1)
    assert s1 >= s0 + 100
    b.set_current(k2, 1)
    ListState(b, "l").update(list(range(1000)))
    s2 = b.size_bytes(1)
    assert s2 > s1 + 1000
    b.register_timer(123)
    assert b.size_bytes(1) > s2
    assert b.size_bytes(1) == len(b.snapshot(1))
    assert b.size_bytes(0) == s0  # other groups unaffected


def test_estimated_bytes_close_to_sum_of_group_sizes_for_uniform_data():
    b = backend()
    v, ls, ms = ValueState(b, "count", 0), ListState(b, "hist"), MapState(b, "m")
    assert b.estimated_bytes() == 0
    for i in range(2000):
        at(b, f"user-{i}")
        v.update(i)
        ls.add(("e", i))
        ls.add(("f", i))
        ms.put("x", i * 1.5)
    exact = sum(b.size_bytes(g) for g in range(N))
    est = b.estimated_bytes()
    assert exact / 2 <= est <= exact * 2
    # grows with state
    for i in range(2000, 4000):
        at(b, f"user-{i}")
        v.update(i)
    assert b.estimated_bytes() > est


# ---------------------------------------------------------------- functions.py


def test_runtime_context_declares_state_on_the_backend():
    b = backend()
    ctx = RuntimeContext(b, "counter", 1, 4)
    assert (ctx.operator, ctx.task_index, ctx.parallelism) == ("counter", 1, 4)
    count = ctx.value_state("count", 0)
    hist = ctx.list_state("hist")
    seen = ctx.map_state("seen")
    total = ctx.reducing_state("total", max)
    assert isinstance(count, ValueState) and isinstance(hist, ListState)
    assert isinstance(seen, MapState) and isinstance(total, ReducingState)
    at(b, "k")
    count.update(count.value() + 1)
    hist.add("x")
    seen.put("y", True)
    total.add(3)
    total.add(1)
    g = key_group_of("k", N)
    assert b.groups[g]["count"]["k"] == 1
    assert b.groups[g]["hist"]["k"] == ["x"]
    assert b.groups[g]["seen"]["k"] == {"y": True}
    assert b.groups[g]["total"]["k"] == 3


def test_timer_service_and_context():
    b = backend()
    now = [1_000]
    ts = TimerService(b, lambda: now[0])
    ctx = Context(b, ts)
    assert ctx.timestamp == 0
    at(b, "k")
    assert ctx.key == "k"
    assert ts.current_processing_time() == 1_000
    now[0] = 2_000
    assert ts.current_processing_time() == 2_000
    ts.register_processing_time_timer(2_500)
    ts.register_processing_time_timer(2_500)
    ts.register_processing_time_timer(3_000)
    ts.delete_processing_time_timer(3_000)
    assert drain(b, 5_000) == [(2_500, key_group_of("k", N), "k")]
    at(b, ("other", 1))
    assert ctx.key == ("other", 1)


def test_keyed_process_function_defaults():
    f = KeyedProcessFunction()
    assert f.open(None) is None  # type: ignore[arg-type]
    assert f.on_timer(0, None) is None  # type: ignore[arg-type]
    with pytest.raises(NotImplementedError, match="process_element"):
        f.process_element(1, None)  # type: ignore[arg-type]


def test_reduce_function_wraps_the_callable():
    def add(a, b):
        return a + b

    rf = ReduceFunction(add)
    assert isinstance(rf, KeyedProcessFunction)
    assert rf.fn is add
    assert ReduceFunction.STATE == "reduce"
