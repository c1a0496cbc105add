"""Replicas of key groups: change tracking and deltas in engine.state.keyed, and the mechanics in
migration.replication (placement, holder store, freshness rule, stats). No Ray."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.state.keyed import (
    EVENT_TIME,
    PROCESSING_TIME,
    KeyedStateBackend,
    ListState,
    MapState,
    ReducingState,
    ValueState,
    apply_delta,
    decode_snapshot,
    delta_base_version,
)
from migration.replication import (
    Refresh,
    ReplicaStore,
    ReplicationStats,
    StaleReplicaError,
    choose_replicated_groups,
    migration_payload,
    place_replicas,
    refresh_replica,
)

N = 4
KG = 1  # the tracked group


def backend() -> KeyedStateBackend:
    b = KeyedStateBackend(N)
    for g in range(N):
        b.own(g)
    return b


def handles(b: KeyedStateBackend) -> tuple[ValueState, ListState, MapState, ReducingState]:
    return (
        ValueState(b, "v", 0),
        ListState(b, "l"),
        MapState(b, "m"),
        ReducingState(b, "r", lambda a, c: a + c),
    )


def same(a: bytes, b: bytes) -> bool:
    return decode_snapshot(a) == decode_snapshot(b)


class FakeClock:
    def __init__(self, step: float) -> None:
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


# ---------------------------------------------------------------- tracking and deltas


def test_tracking_records_keys_made_current_only_in_tracked_groups():
    b = backend()
    v, *_ = handles(b)
    assert not b._changes  # nothing tracked: set_current only tests an empty dict
    b.set_current("x", KG)
    v.update(1)
    assert b.track_changes(KG) == 1
    assert b.changed_keys(KG) == 1  # the current key may still be written
    b.set_current("a", KG)
    v.update(2)
    b.set_current("b", 2)  # other group: not recorded
    v.update(3)
    assert b._changes == {KG: {"x", "a"}}
    assert b.is_tracked(KG) and not b.is_tracked(2) and b.tracked() == [KG]
    b.set_current("y", 2)
    b.note_changed(KG, "z")
    b.note_changed(2, "z")  # untracked group: ignored
    assert b._changes == {KG: {"x", "a", "z"}}
    b.untrack(KG)
    assert not b._changes and b.version(KG) == 1


def test_delta_holds_changed_keys_absent_marks_and_all_timers():
    b = backend()
    v, lst, m, r = handles(b)
    for k in ("a", "b", "c"):
        b.set_current(k, KG)
        v.update(k)
        lst.add(k)
    b.register_timer(50)
    b.track_changes(KG)
    base = b.snapshot(KG)
    assert b.mark_replicated(KG) == 2 and b.version(KG) == 2
    b.set_current("a", KG)
    v.clear()  # gone from one table
    m.put(1, (2, "x"))
    b.set_current("c", KG)
    b.register_timer(70, EVENT_TIME)
    b.set_current(("t", 1), KG)
    r.add(5)
    delta = b.snapshot_delta(KG)
    assert delta_base_version(delta) == 2
    assert len(delta) < len(b.snapshot(KG)) + 64
    out = apply_delta(base, delta)
    assert same(out, b.snapshot(KG))
    tables, timers = decode_snapshot(out)
    assert "a" not in tables["v"] and tables["l"]["a"] == ["a"]
    assert tables["m"]["a"] == {1: (2, "x")} and tables["r"][("t", 1)] == 5
    assert timers == {(50, "c", PROCESSING_TIME), (70, "c", EVENT_TIME)}


def test_mark_replicated_clears_changes_and_bumps_version():
    b = backend()
    v, *_ = handles(b)
    b.track_changes(KG)
    for k in range(10):
        b.set_current(k, KG)
        v.update(k)
    b.set_current("other", 0)
    assert b.changed_keys(KG) == 10
    b.mark_replicated(KG)
    assert b.changed_keys(KG) == 0
    # an unchanged group: the delta carries no keys and reproduces the base
    base = b.snapshot(KG)
    assert same(apply_delta(base, b.snapshot_delta(KG)), base)


def test_remove_and_install_of_a_tracked_group_are_tracked():
    b = backend()
    v, lst, *_ = handles(b)
    b.set_current("a", KG)
    v.update(1)
    b.track_changes(KG)
    base = b.snapshot(KG)
    b.mark_replicated(KG)
    other = backend()
    ov, ol, *_ = handles(other)
    other.set_current("z", KG)
    ol.add(9)
    other.register_timer(5)
    b.install(KG, other.snapshot(KG))
    assert same(apply_delta(base, b.snapshot_delta(KG)), b.snapshot(KG))
    b.remove(KG)
    delta = b.snapshot_delta(KG)
    assert decode_snapshot(apply_delta(base, delta)) == ({}, set())


def test_retracking_bumps_the_version_and_start_version_lifts_it():
    b = backend()
    assert b.version(KG) == 0
    assert b.track_changes(KG) == 1
    assert b.track_changes(KG) == 1  # already tracked: no-op
    b.mark_replicated(KG)
    b.untrack(KG)
    assert b.track_changes(KG) == 3  # a replica at 2 never matches after an untracked gap
    b.untrack(KG)
    assert b.track_changes(KG, start_version=40) == 40


def test_untracked_group_refuses_delta_and_mark():
    b = backend()
    with pytest.raises(ValueError, match="not tracked"):
        b.snapshot_delta(KG)
    with pytest.raises(ValueError, match="not tracked"):
        b.mark_replicated(KG)
    with pytest.raises(ValueError, match="not a key-group delta"):
        apply_delta(b.snapshot(KG), b.snapshot(KG))


KEYS = st.one_of(
    st.integers(-3, 3),
    st.sampled_from(["a", "b", "ключ", ""]),
    st.tuples(st.integers(0, 2), st.sampled_from(["x", "y"])),
    st.tuples(st.tuples(st.integers(0, 1)), st.integers(0, 1)),
)
VALUES = st.one_of(st.integers(-5, 5), st.text(max_size=3), st.tuples(st.integers(0, 3)))
OPS = st.one_of(
    st.tuples(st.just("current"), KEYS, st.sampled_from([KG, KG, KG, 0])),
    st.tuples(st.just("value"), VALUES),
    st.tuples(st.just("value_clear")),
    st.tuples(st.just("list_add"), VALUES),
    st.tuples(st.just("list_update"), st.lists(VALUES, max_size=3)),
    st.tuples(st.just("list_clear")),
    st.tuples(st.just("map_put"), KEYS, VALUES),
    st.tuples(st.just("map_remove"), KEYS),
    st.tuples(st.just("map_clear")),
    st.tuples(st.just("reduce"), st.integers(-5, 5)),
    st.tuples(st.just("reduce_clear")),
    st.tuples(st.just("timer"), st.integers(0, 20), st.sampled_from([PROCESSING_TIME, EVENT_TIME])),
    st.tuples(st.just("timer_delete"), st.integers(0, 20)),
    st.tuples(st.just("fire"), st.integers(0, 20)),
    st.tuples(st.just("remove_group")),
    st.tuples(st.just("install_group"), KEYS, VALUES),
    st.tuples(st.just("mark")),
)


class TrackedGroup:
    """A backend whose group ``KG`` the ``OPS`` tuples act on: ``run(op)`` calls the method
    named after the op (``op_<name>``) with the op's arguments."""

    def __init__(self) -> None:
        self.b = backend()
        self.v, self.lst, self.m, self.r = handles(self.b)
        self.b.set_current("start", KG)

    def usable(self) -> bool:
        """Whether the current key's group is owned (state handles may act on it)."""
        return self.b.current_group in self.b.groups

    def run(self, op: tuple) -> None:
        getattr(self, f"op_{op[0]}")(*op[1:])

    def op_current(self, key, kg) -> None:
        if kg in self.b.groups:
            self.b.set_current(key, kg)

    def op_value(self, x) -> None:
        self.v.update(x)

    def op_value_clear(self) -> None:
        self.v.clear()

    def op_list_add(self, x) -> None:
        self.lst.add(x)

    def op_list_update(self, xs) -> None:
        self.lst.update(xs)

    def op_list_clear(self) -> None:
        self.lst.clear()

    def op_map_put(self, k, x) -> None:
        self.m.put(k, x)

    def op_map_remove(self, k) -> None:
        self.m.remove(k)

    def op_map_clear(self) -> None:
        self.m.clear()

    def op_reduce(self, x) -> None:
        self.r.add(x)

    def op_reduce_clear(self) -> None:
        self.r.clear()

    def op_timer(self, t, d) -> None:
        self.b.register_timer(t, d)

    def op_timer_delete(self, t) -> None:
        self.b.delete_timer(t)

    def op_fire(self, now) -> None:
        for _, kg, key in list(self.b.pop_due_timers(now)):
            self.b.set_current(key, kg)
            self.v.update(("fired", now))

    def op_remove_group(self) -> None:
        self.b.remove(KG)
        self.b.own(KG)

    def op_install_group(self, k, x) -> None:
        other = backend()
        other.set_current(k, KG)
        ValueState(other, "v").update(x)
        other.register_timer(3)
        self.b.install(KG, other.snapshot(KG))

    def op_mark(self) -> None:
        pass  # the test marks (see below); before tracking it does nothing


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pre=st.lists(OPS, max_size=15), ops=st.lists(OPS, max_size=60))
def test_delta_applied_to_the_snapshot_at_mark_gives_the_group_now(pre, ops):
    g = TrackedGroup()
    b = g.b
    for op in pre:
        if op[0] in ("current", "remove_group", "install_group", "mark") or g.usable():
            g.run(op)
    b.track_changes(KG)
    replica = b.snapshot(KG)
    b.mark_replicated(KG)
    for op in ops:
        if op[0] == "mark":
            # a holder chaining deltas keeps the group exactly
            delta = b.snapshot_delta(KG)
            assert delta_base_version(delta) == b.version(KG)
            replica = apply_delta(replica, delta)
            assert same(replica, b.snapshot(KG))
            b.mark_replicated(KG)
        elif op[0] in ("current", "remove_group", "install_group") or g.usable():
            g.run(op)
    assert decode_snapshot(apply_delta(replica, b.snapshot_delta(KG))) == decode_snapshot(
        b.snapshot(KG)
    )


# ---------------------------------------------------------------- which groups, where


def test_choose_replicated_groups_policies():
    loads = {0: 5.0, 1: 50.0, 2: 1.0, 3: 50.0, 5: 7.0}
    assert choose_replicated_groups("none", loads, 0.5, 8) == ()
    assert choose_replicated_groups("all", loads, 0.5, 8) == tuple(range(8))
    assert choose_replicated_groups("hot", loads, 0.5, 8) == (0, 1, 3, 5)
    assert choose_replicated_groups("hot", loads, 0.25, 8) == (1, 3)
    assert choose_replicated_groups("hot", loads, 0.1, 8) == (1,)  # ceil: at least one
    assert choose_replicated_groups("hot", loads, 0.0, 8) == ()
    assert choose_replicated_groups("hot", {}, 0.25, 8) == (0, 1)  # ties by id
    with pytest.raises(ValueError, match="unknown replication policy"):
        choose_replicated_groups("some", loads, 0.5, 8)
    with pytest.raises(ValueError, match="hot_fraction"):
        choose_replicated_groups("hot", loads, 1.5, 8)


def test_place_replicas_never_on_owner_and_even():
    assignment = [kg * 4 // 32 for kg in range(32)]  # contiguous ranges over 4 tasks
    holder = place_replicas(assignment, range(32), 4)
    assert set(holder) == set(range(32))
    assert all(holder[kg] != assignment[kg] for kg in holder)
    counts = [list(holder.values()).count(t) for t in range(4)]
    assert counts == [8, 8, 8, 8]
    assert place_replicas(assignment, range(32), 4) == holder  # deterministic
    assert place_replicas(assignment, [3, 20], 4).keys() == {3, 20}
    assert place_replicas([0, 0], [0, 1], 1) == {}
    assert place_replicas(assignment, [], 4) == {}
    with pytest.raises(ValueError, match="no owner"):
        place_replicas(assignment, [40], 4)


def test_place_replicas_rebalances_what_the_greedy_pass_piles_up():
    # greedy alone: 0 -> task 1, 1 -> task 2, 2 -> task 1 (task 0 owns it): counts 0, 2, 1
    holder = place_replicas([0, 1, 0], range(3), 3)
    assert all(holder[kg] != [0, 1, 0][kg] for kg in holder)
    assert sorted(holder.values()) == [0, 1, 2]
    # as even as owners allow: task 0 owns ten groups, so it can hold only the other two
    assignment = [0] * 10 + [1, 2]
    holder = place_replicas(assignment, range(12), 3)
    assert all(holder[kg] != assignment[kg] for kg in holder)
    assert [list(holder.values()).count(t) for t in range(3)] == [2, 5, 5]
    # every group owned by task 0, two tasks: all on task 1
    assert set(place_replicas([0] * 6, range(6), 2).values()) == {1}


@settings(max_examples=100, deadline=None)
@given(
    p=st.integers(2, 4),
    owners=st.lists(st.integers(0, 3), min_size=1, max_size=7),
    data=st.data(),
)
def test_place_replicas_is_as_even_as_owners_allow(p, owners, data):
    assignment = [o % p for o in owners]
    groups = sorted(data.draw(st.sets(st.integers(0, len(assignment) - 1))))
    holder = place_replicas(assignment, groups, p)
    assert set(holder) == set(groups)
    assert all(holder[kg] != assignment[kg] for kg in holder)

    def spread(holders) -> tuple[int, int]:
        hs = list(holders)
        counts = [hs.count(t) for t in range(p)]
        return max(counts), max(counts) - min(counts)

    # brute force over every placement that avoids the owners
    options = [[t for t in range(p) if t != assignment[kg]] for kg in groups]
    best = [spread(c) for c in itertools.product(*options)]
    ours = spread(holder[kg] for kg in groups)
    assert ours[0] == min(m for m, _ in best)  # no task holds more than it must
    if min(d for _, d in best) <= 1:
        assert ours[1] <= 1


# ---------------------------------------------------------------- holder store


def owner_with_state() -> tuple[KeyedStateBackend, ValueState]:
    b = backend()
    v, *_ = handles(b)
    for k in range(20):
        b.set_current(k, KG)
        v.update(k * 10)
    return b, v


def test_replica_store_chains_refreshes_and_refuses_stale_deltas():
    b, v = owner_with_state()
    store = ReplicaStore()
    clock = FakeClock(0.5)
    stats = ReplicationStats()
    first = refresh_replica(b, KG, clock, stats)
    assert isinstance(first, Refresh) and not first.is_delta and first.version == 2
    store.update(KG, first.version, first.data, first.is_delta, now=10.0)
    assert store.version(KG) == 2 and store.versions() == {KG: 2}
    assert store.bytes_held() == len(first.data) and len(store) == 1
    b.set_current(3, KG)
    v.update(-1)
    second = refresh_replica(b, KG, clock, stats)
    assert second.is_delta and second.version == 3 and len(second.data) < len(first.data)
    store.update(KG, second.version, second.data, True, now=20.0)
    assert same(store._held[KG][1], b.snapshot(KG))
    assert stats == ReplicationStats(
        bytes_copied=len(first.data) + len(second.data),
        refreshes=2,
        full_refreshes=1,
        encode_cpu_s=1.0,
    )
    # the holder missed a refresh: the next delta is refused, a full one repairs it
    b.set_current(4, KG)
    v.update(-2)
    refresh_replica(b, KG, clock, stats)  # lost on the way
    b.set_current(5, KG)
    v.update(-3)
    fourth = refresh_replica(b, KG, clock, stats)
    with pytest.raises(StaleReplicaError, match="applies to version 4, but this holder has version 3"):
        store.update(KG, fourth.version, fourth.data, True, now=30.0)
    assert store.version(KG) == 3  # untouched
    with pytest.raises(StaleReplicaError, match="no replica"):
        ReplicaStore().update(KG, fourth.version, fourth.data, True, now=30.0)
    full = refresh_replica(b, KG, clock, stats, full=True)
    store.update(KG, full.version, full.data, full.is_delta, now=31.0)
    assert store.version(KG) == b.version(KG) == 6
    assert same(store._held[KG][1], b.snapshot(KG))


def test_replica_store_fresh_take_drop():
    b, _ = owner_with_state()
    store = ReplicaStore()
    r = refresh_replica(b, KG, FakeClock(0.0))
    store.update(KG, r.version, r.data, False, now=100.0)
    assert store.fresh(KG, r.version, now=104.0, max_age_s=5.0)
    assert not store.fresh(KG, r.version, now=106.0, max_age_s=5.0)  # too old
    assert not store.fresh(KG, r.version + 1, now=101.0, max_age_s=5.0)  # other version
    assert not store.fresh(0, r.version, now=101.0, max_age_s=5.0)
    assert store.take(KG) == r.data
    assert store.version(KG) is None and store.bytes_held() == 0
    with pytest.raises(KeyError, match="no replica"):
        store.take(KG)
    store.update(KG, r.version, r.data, False, now=100.0)
    store.drop(KG)
    store.drop(KG)
    assert len(store) == 0


# ---------------------------------------------------------------- freshness rule at migration


def test_migration_to_a_stale_holder_ships_the_full_group():
    b, v = owner_with_state()
    store = ReplicaStore()
    r1 = refresh_replica(b, KG, FakeClock(0.0))
    store.update(KG, r1.version, r1.data, False, now=0.0)  # holder at v-1
    b.set_current(7, KG)
    v.update(777)
    refresh_replica(b, KG, FakeClock(0.0))  # owner at v; the holder never got it
    assert store.version(KG) == b.version(KG) - 1
    kind, payload = migration_payload(b, KG, store.version(KG))
    assert kind == "full"
    assert payload == b.snapshot(KG)
    installed = store.reload(KG, kind, payload)
    assert installed == b.snapshot(KG) and store.version(KG) is None


def test_migration_to_a_fresh_holder_ships_a_delta_that_reproduces_the_group():
    b, v = owner_with_state()
    store = ReplicaStore()
    r = refresh_replica(b, KG, FakeClock(0.0))
    store.update(KG, r.version, r.data, False, now=0.0)
    b.set_current(7, KG)
    v.update(777)  # changed after the last refresh
    b.set_current(8, KG)
    v.clear()
    b.register_timer(99)
    kind, payload = migration_payload(b, KG, store.version(KG))
    assert kind == "delta" and len(payload) < len(b.snapshot(KG))
    dest = KeyedStateBackend(N)
    dest.install(KG, store.reload(KG, kind, payload))
    assert decode_snapshot(dest.snapshot(KG)) == decode_snapshot(b.snapshot(KG))
    assert dest.groups[KG]["v"][7] == 777 and 8 not in dest.groups[KG]["v"]
    assert dest.next_timer() == 99


def test_migration_payload_without_replica_or_tracking_is_full():
    b, _ = owner_with_state()
    assert migration_payload(b, KG, None) == ("full", b.snapshot(KG))
    assert migration_payload(b, KG, 0) == ("full", b.snapshot(KG))  # untracked at version 0
    r = refresh_replica(b, KG, FakeClock(0.0))
    assert migration_payload(b, KG, r.version + 1)[0] == "full"  # newer than owner: unknown
    b.untrack(KG)
    assert migration_payload(b, KG, r.version)[0] == "full"


def test_reload_refuses_a_delta_for_another_version():
    b, v = owner_with_state()
    store = ReplicaStore()
    r = refresh_replica(b, KG, FakeClock(0.0))
    store.update(KG, r.version, r.data, False, now=0.0)
    refresh_replica(b, KG, FakeClock(0.0))
    delta = b.snapshot_delta(KG)  # base: the owner's version, one past the holder's
    with pytest.raises(StaleReplicaError, match="migration delta"):
        store.reload(KG, "delta", delta)
    assert store.version(KG) == r.version


def test_set_current_overhead_when_nothing_is_tracked_is_one_check():
    # structural: with no tracked group, set_current reads _changes once and stops there
    b = backend()
    calls = []

    class Spy(dict):
        def get(self, *a):  # would be called only when tracking something
            calls.append(a)
            return super().get(*a)

    b._changes = Spy()
    for k, g in itertools.product(range(5), range(N)):
        b.set_current(k, g)
    assert calls == []
