"""The RocksDB keyed state backend against the in-memory one (engine.state.rocksdb).

Why: the RocksDB backend must be a drop-in for ``KeyedStateBackend``. A differential test
drives both with the same random sequence of state operations (value, list, map and
reducing state, timers, ownership, snapshot and install across backends, change
tracking and deltas, the ``groups`` views the operators use) and asserts every
observable result is the same; then the blob format, the lock and the error cases.
Timers (on RocksDB in the DB, ``engine.state.rocksdb_timers``): registered, deleted,
fired up to a time (in the same order: by time, then key group; the keys of one group
and time compared as sets, as the backends order them differently), registered and
deleted while firing, parked and pushed back as the operators' DRRS hold does, read
through ``timers[kg]``, and with caches of one entry (every refill path).
"""

from __future__ import annotations

import operator
import os
import random
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import CodecError, StateBackendError
from engine.state import rocksdb
from engine.state.keyed import (
    EVENT_TIME,
    PROCESSING_TIME,
    KeyedStateBackend,
    ListState,
    MapState,
    ReducingState,
    ValueState,
    apply_delta,
    decode_group,
    decode_snapshot,
)
from engine.state.rocksdb import RocksDBKeyedStateBackend

KGS = 6
KEYS: list[Any] = [0, 1, 7, -3, "a", "bb", "", (1, "x"), (2, (3,)), 2**40, b"k"]
VALUES: list[Any] = [0, 5, -1, 2.5, "s", None, True, b"\x00\x01", [1, 2], {"m": [3]},
                     (4, "t"), [], {"n": 1.5}, frozenset({1, 2})]


def _backends(tmp: Path, object_cache_bytes: int = 16 << 20, timer_cache_bytes: int = 4 << 20,
              ) -> tuple[KeyedStateBackend, RocksDBKeyedStateBackend]:
    d = tempfile.mkdtemp(dir=tmp)
    return KeyedStateBackend(KGS * 2), RocksDBKeyedStateBackend(
        KGS * 2, d, task="t-0", block_cache_bytes=1 << 20, write_buffer_bytes=2 << 20,
        object_cache_bytes=object_cache_bytes, timer_cache_bytes=timer_cache_bytes)


def _in_order(fired: list[tuple[int, int, Any]]) -> list[tuple[int, int, list[str]]]:
    """Fired timers as runs of one time and key group, each run's keys as a sorted list:
    the order both backends share."""
    runs: list[tuple[int, int, list[str]]] = []
    for t, kg, key in fired:
        if runs and runs[-1][:2] == (t, kg):
            runs[-1][2].append(repr(key))
        else:
            runs.append((t, kg, [repr(key)]))
    return [(t, kg, sorted(keys)) for t, kg, keys in runs]


TIMES = [*range(-3, 51), 2**62, -(2**62)]


def _snap(b: KeyedStateBackend, kg: int) -> Any:
    return decode_snapshot(b.snapshot(kg))


class _Pair:
    """Applies each operation to both backends and checks the results agree."""

    def __init__(self, mem: KeyedStateBackend, rocks: RocksDBKeyedStateBackend,
                 rng: random.Random) -> None:
        self.b = (mem, rocks)
        self.rng = rng
        self.stash: list[bytes] = []  # snapshots of either backend, installed later
        self.replicas: dict[int, tuple[bytes, bytes]] = {}  # kg -> per backend base
        self.held: tuple[list[Any], list[Any]] = ([], [])  # parked timers, per backend

    def both(self, what: str, fn: Any) -> Any:
        out = [fn(b) for b in self.b]
        assert out[0] == out[1], (what, out)
        return out[0]

    def owned(self) -> list[int]:
        return self.both("owned", lambda b: b.owned())

    def step(self) -> None:
        rng = self.rng
        owned = self.owned()
        op = rng.choice(["own", "own", "value", "list", "map", "reduce", "value", "list",
                         "map", "timer", "fire", "snapshot", "install", "remove",
                         "track", "delta", "groups", "table", "read", "timer", "timer",
                         "timer", "fire", "fire_and_register", "hold", "release",
                         "timer_set"])
        if op == "own" or not owned:
            kg = rng.randrange(KGS)
            self.both("own", lambda b: b.own(kg))
            return
        kg = rng.choice(owned)
        key = rng.choice(KEYS)
        self.both("set_current", lambda b: b.set_current(key, kg))
        getattr(self, "op_" + op)(kg, key)

    def op_value(self, kg: int, key: Any) -> None:
        v = self.rng.choice(VALUES)
        kind = self.rng.randrange(3)
        def go(b: KeyedStateBackend) -> Any:
            if kind == 0:
                ValueState(b, "v").update(v)
            elif kind == 1:
                ValueState(b, "v").clear()
            return ValueState(b, "v", default="d").value()
        self.both("value", go)

    def op_list(self, kg: int, key: Any) -> None:
        v = self.rng.choice(VALUES)
        kind = self.rng.randrange(4)
        def go(b: KeyedStateBackend) -> Any:
            s = ListState(b, "l")
            if kind == 0:
                s.add(v)
                s.add(v)
            elif kind == 1:
                s.update([v, 1])
            elif kind == 2:
                s.clear()
            return s.get()
        self.both("list", go)

    def op_map(self, kg: int, key: Any) -> None:
        k = self.rng.choice(KEYS)
        v = self.rng.choice(VALUES)
        kind = self.rng.randrange(4)
        clear = self.rng.random() < 0.2
        def go(b: KeyedStateBackend) -> Any:
            s = MapState(b, "m")
            if kind == 0:
                s.put(k, v)
            elif kind == 1:
                s.remove(k)
            elif kind == 2 and clear:
                s.clear()
            return (s.get(k, "none"), s.contains(k), sorted(map(repr, s.keys())),
                    sorted(map(repr, s.items())), s.is_empty())
        self.both("map", go)

    def op_reduce(self, kg: int, key: Any) -> None:
        x = self.rng.randint(-5, 5)
        clear = self.rng.random() < 0.1
        def go(b: KeyedStateBackend) -> Any:
            s = ReducingState(b, "r", operator.add)
            if clear:
                s.clear()
            else:
                s.add(x)
            return s.get()
        self.both("reduce", go)

    def op_timer(self, kg: int, key: Any) -> None:
        t = self.rng.choice(TIMES)
        domain = self.rng.choice([PROCESSING_TIME, EVENT_TIME])
        kind = self.rng.randrange(3)
        other = self.rng.choice(KEYS)
        def go(b: KeyedStateBackend) -> Any:
            if kind == 0:
                b.register_timer(t, domain)
            elif kind == 1:
                b.delete_timer(t, domain)
            else:
                b.add_timer(kg, t, other, domain)
            return b.next_timer(domain)
        self.both("timer", go)

    def op_fire(self, kg: int, key: Any) -> None:
        now = self.rng.choice(TIMES)
        domain = self.rng.choice([PROCESSING_TIME, EVENT_TIME])
        self.both("fire", lambda b: _in_order(list(b.pop_due_timers(now, domain))))
        self.both("next", lambda b: (b.next_timer(PROCESSING_TIME), b.next_timer(EVENT_TIME)))

    def op_fire_and_register(self, kg: int, key: Any) -> None:
        """Timers fired as an operator's ``on_timer`` does: each may register a later timer
        (due now or not: it fires in the same pass when due) and delete another."""
        now = self.rng.randint(0, 50)
        domain = self.rng.choice([PROCESSING_TIME, EVENT_TIME])
        later = self.rng.randint(1, 6)
        def go(b: KeyedStateBackend) -> Any:
            fired = []
            for t, g, k in b.pop_due_timers(now, domain):
                fired.append((t, g, k))
                b.set_current(k, g)
                # the chains end at a time, not a count (a count would depend on the order
                # within one group and time, which the backends do not share)
                if now - 8 <= t and t + later <= now + 5:
                    b.register_timer(t + later, domain)
                    b.delete_timer(t + later + 1, domain)
            return _in_order(fired)
        self.both("fire_and_register", go)

    def op_hold(self, kg: int, key: Any) -> None:
        """Fire, and put the timers of some groups back (the DRRS hold of
        ``engine.operators.builtin``): they stay in the group but do not fire."""
        now = self.rng.randint(0, 50)
        domain = self.rng.choice([PROCESSING_TIME, EVENT_TIME])
        holding = set(self.rng.sample(range(KGS), 3))
        def go(b: KeyedStateBackend, held: list[Any]) -> Any:
            fired = []
            for t, g, k in b.pop_due_timers(now, domain):
                if g in holding:
                    b.timers[g].add((t, k, domain))
                    held.append((t, g, k, domain))
                else:
                    fired.append((t, g, k))
            return _in_order(fired), b.next_timer(domain)
        out = [go(b, h) for b, h in zip(self.b, self.held, strict=True)]
        assert out[0] == out[1], ("hold", out)

    def op_release(self, kg: int, key: Any) -> None:
        for b, held in zip(self.b, self.held, strict=True):
            for t, g, k, d in sorted(held, key=repr):
                b._push_timer(t, g, k, d)
            held.clear()
        self.both("next", lambda b: (b.next_timer(PROCESSING_TIME), b.next_timer(EVENT_TIME)))

    def op_timer_set(self, kg: int, key: Any) -> None:
        t = self.rng.choice(TIMES)
        domain = self.rng.choice([PROCESSING_TIME, EVENT_TIME])
        self.both("timers[kg]", lambda b: (sorted(b.timers[kg], key=repr), len(b.timers[kg]),
                                           (t, key, domain) in b.timers[kg], kg in b.timers,
                                           sorted(b.timers)))

    def op_snapshot(self, kg: int, key: Any) -> None:
        snaps = [b.snapshot(kg) for b in self.b]
        assert decode_snapshot(snaps[0]) == decode_snapshot(snaps[1])
        self.stash.extend(snaps)

    def op_install(self, kg: int, key: Any) -> None:
        if not self.stash:
            return
        data = self.rng.choice(self.stash)
        target = self.rng.randrange(KGS)  # owned or not, current or not
        self.both("install", lambda b: b.install(target, data))
        self.both("installed", lambda b: _snap(b, target))

    def op_remove(self, kg: int, key: Any) -> None:
        self.both("remove", lambda b: b.remove(kg))
        self.both("owned", lambda b: b.owned())

    def op_track(self, kg: int, key: Any) -> None:
        if self.rng.random() < 0.2:
            self.both("untrack", lambda b: b.untrack(kg))
            self.replicas.pop(kg, None)
            return
        self.both("track", lambda b: b.track_changes(kg))
        bases = tuple(b.snapshot(kg) for b in self.b)
        self.both("mark", lambda b: b.mark_replicated(kg))
        self.replicas[kg] = bases  # type: ignore[assignment]

    def op_delta(self, kg: int, key: Any) -> None:
        if kg not in self.replicas or not self.b[0].is_tracked(kg):
            return
        bases = self.replicas[kg]
        out = []
        for b, base in zip(self.b, bases, strict=True):
            full = apply_delta(base, b.snapshot_delta(kg))
            assert decode_snapshot(full) == _snap(b, kg)
            out.append(full)
            b.mark_replicated(kg)
        assert decode_snapshot(out[0]) == decode_snapshot(out[1])
        self.replicas[kg] = (out[0], out[1])
        self.both("version", lambda b: b.version(kg))

    def op_groups(self, kg: int, key: Any) -> None:
        """What the window and reduce fast paths do through ``groups``."""
        name = self.rng.choice(["w/1", "w/2", "v"])
        kind = self.rng.randrange(4)
        v = self.rng.randint(0, 9)
        def go(b: KeyedStateBackend) -> Any:
            tables = b.groups[kg]
            if kind == 0:
                t = tables.setdefault(name, {})
                t[key] = v
                b.note_changed(kg, key)
                return sorted(map(repr, t.items()))
            if kind == 1:
                popped = tables.pop(name, None)
                if popped is not None:
                    for k in popped:
                        b.note_changed(kg, k)
                return None if popped is None else sorted(map(repr, popped.items()))
            if kind == 2:
                got = tables.get(name)
                return None if got is None else (key in got, got.get(key, "none"), len(got),
                                                 bool(got))
            return (name in tables, kg in b.groups, sorted(b.groups))
        self.both("groups", go)

    def op_table(self, kg: int, key: Any) -> None:
        v = self.rng.choice(VALUES)
        kind = self.rng.randrange(3)
        def go(b: KeyedStateBackend) -> Any:
            t = b.table("v")
            if kind == 0:
                t[key] = v
            elif kind == 1:
                t.pop(key, None)
            return sorted(map(repr, t.items())), sorted(map(repr, t.values()))
        self.both("table", go)

    def op_read(self, kg: int, key: Any) -> None:
        self.both("num_keys", lambda b: b.num_keys())
        self.both("snapshot", lambda b: _snap(b, kg))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_random_operations_observe_the_same_on_both_backends(tmp_path: Path, seed: int) -> None:
    """Random sequences of state operations give the same results on both backends,
    and every group's snapshot decodes the same at the end."""
    print(f"rocksdb differential seed={seed}")
    _differential(tmp_path, seed)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_random_operations_observe_the_same_with_a_tiny_object_cache(tmp_path: Path,
                                                                     seed: int) -> None:
    """The same with the object cache at its smallest: loans written back after two
    entries, clean values dropped every few KB (every path through the cache's bounds),
    and timer caches of one entry per group and domain (refilled from RocksDB at every
    timer fired)."""
    print(f"rocksdb differential (tiny object cache) seed={seed}")
    before = rocksdb._MAX_LOANS
    rocksdb._MAX_LOANS = 2
    try:
        _differential(tmp_path, seed, object_cache_bytes=4096, timer_cache_bytes=1)
    finally:
        rocksdb._MAX_LOANS = before


def _differential(tmp_path: Path, seed: int, object_cache_bytes: int = 16 << 20,
                  timer_cache_bytes: int = 4 << 20) -> None:
    rng = random.Random(seed)
    mem, rocks = _backends(tmp_path, object_cache_bytes, timer_cache_bytes)
    try:
        pair = _Pair(mem, rocks, rng)
        for _ in range(rng.randint(20, 250)):
            pair.step()
        for kg in pair.owned():
            assert _snap(mem, kg) == _snap(rocks, kg), kg
        assert mem.num_keys() == rocks.num_keys()
        for domain in (PROCESSING_TIME, EVENT_TIME):  # every timer left, in order
            pair.both("drain", lambda b, d=domain: _in_order(list(b.pop_due_timers(2**63 - 1, d))))
        assert mem.tracked() == rocks.tracked()
    finally:
        rocks.close()


def test_blobs_install_across_backends_and_back(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A group goes memory -> RocksDB -> memory -> RocksDB and decodes the same, written
    in several batches."""
    monkeypatch.setattr(rocksdb, "_BATCH_BYTES", 4096)
    mem, rocks = _backends(tmp_path)
    try:
        mem.own(1)
        for i in range(20_000):
            mem.set_current(i if i % 3 else f"k{i}", 1)
            ValueState(mem, "v").update(b"x" * (i % 50))
            if i % 7 == 0:
                ListState(mem, "l").add((i, [i]))
        mem.register_timer(5)
        want = _snap(mem, 1)
        rocks.install(1, mem.snapshot(1))
        assert _snap(rocks, 1) == want
        blob = rocks.snapshot(1)
        assert decode_group(blob)[0] == decode_group(mem.snapshot(1))[0]
        other = KeyedStateBackend(KGS * 2)
        other.install(1, blob)
        assert _snap(other, 1) == want
        rocks.remove(1)
        assert rocks.num_keys() == 0
        rocks.install(3, blob)  # a RocksDB blob, sliced by its lengths
        assert _snap(rocks, 3) == want
    finally:
        rocks.close()


def test_a_blob_of_the_format_before_installs_in_both(tmp_path: Path) -> None:
    from engine.wire.codec import pack_exact

    old = pack_exact([[["v", [[1, "a"], [(2, 3), [4]]]]], [[7, "k", 0]]])
    mem, rocks = _backends(tmp_path)
    try:
        for b in (mem, rocks):
            b.install(0, old)
            assert _snap(b, 0) == ({"v": {1: "a", (2, 3): [4]}}, {(7, "k", 0)})
    finally:
        rocks.close()


def test_corrupt_blob_is_a_codec_error(tmp_path: Path) -> None:
    mem, rocks = _backends(tmp_path)
    try:
        mem.own(0)
        mem.set_current(1, 0)
        ValueState(mem, "v").update(1)
        blob = mem.snapshot(0)
        for b in (mem, rocks):
            with pytest.raises(CodecError):
                b.install(0, blob[: len(blob) // 2])
            with pytest.raises(CodecError):
                b.install(0, b"\xc1garbage")
    finally:
        rocks.close()


def test_a_locked_directory_is_refused_naming_path_and_task(tmp_path: Path) -> None:
    d = tmp_path / "state"
    first = RocksDBKeyedStateBackend(8, d, task="op[0]")
    try:
        with pytest.raises(StateBackendError) as err:
            RocksDBKeyedStateBackend(8, d, task="op[1]")
        assert err.value.path == str(d) and err.value.task == "op[1]"
        assert str(d) in str(err.value) and "locked" in str(err.value)
    finally:
        first.close()
    again = RocksDBKeyedStateBackend(8, d, task="op[1]")  # released on close
    again.close()


def test_a_directory_left_by_a_killed_task_is_cleaned(tmp_path: Path) -> None:
    d = tmp_path / "state"
    b = RocksDBKeyedStateBackend(8, d, task="op[0]")
    b.own(2)
    b.set_current("k", 2)
    ValueState(b, "v").update(1)
    b.close(remove_files=False)  # as a killed task leaves it
    assert os.listdir(d / "db")
    b = RocksDBKeyedStateBackend(8, d, task="op[0]")
    try:
        assert b.num_keys() == 0 and b.owned() == []
    finally:
        b.close()
    assert sorted(os.listdir(d)) == ["reflow.lock"]


def test_an_unusable_directory_is_a_state_backend_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(StateBackendError) as err:
        RocksDBKeyedStateBackend(8, not_a_dir / "state", task="op[3]")
    assert err.value.task == "op[3]" and str(not_a_dir / "state") in str(err.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_directory_is_a_state_backend_error(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(StateBackendError):
            RocksDBKeyedStateBackend(8, ro / "state", task="op[0]")
    finally:
        ro.chmod(0o700)


def test_closed_backend_refuses_use(tmp_path: Path) -> None:
    _, rocks = _backends(tmp_path)
    rocks.own(0)
    rocks.close()
    rocks.close()  # idempotent
    rocks.set_current(1, 0)
    with pytest.raises(StateBackendError, match="closed"):
        ValueState(rocks, "v").update(1)


def test_mutations_of_a_value_read_persist_until_the_key_changes(tmp_path: Path) -> None:
    _, rocks = _backends(tmp_path)
    try:
        rocks.own(0)
        rocks.set_current("a", 0)
        t = rocks.table("m")
        t["a"] = {"x": [1]}
        t["a"]["x"].append(2)  # in place, as MapState and ListState do
        rocks.set_current("b", 0)
        assert rocks.table("m")["a"] == {"x": [1, 2]}
    finally:
        rocks.close()
