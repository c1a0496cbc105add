"""Timers on the RocksDB backend are kept in RocksDB, with bounded caches in memory
(engine.state.rocksdb_timers).

Why: a job with a timer per key must not hold its keys' timers in memory on the backend
meant for state larger than memory. The behaviour is the in-memory backend's
(``test_rocksdb_state.py``'s differential tests drive timers on both); here: the Python
memory 200,000 timers take (tracemalloc: what the process allocates, not wall time), the
firing order, the bounded heap of heads, and the errors.
"""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.errors import StateBackendError
from engine.state.backends import make_keyed_backend
from engine.state.keyed import EVENT_TIME, PROCESSING_TIME, KeyedStateBackend, ValueState
from engine.state.rocksdb import RocksDBKeyedStateBackend
from engine.state.rocksdb_timers import TIMER_NAMES

GROUPS = 128
N = 200_000
CACHE = 1 << 20


def _register(b: KeyedStateBackend, n: int) -> None:
    for i in range(n):
        b.set_current(f"key-{i}", i % GROUPS)
        b.register_timer((i * 7919) % 100_000, EVENT_TIME)


def _growth(b: KeyedStateBackend, n: int) -> tuple[int, int]:
    """(bytes still allocated, peak bytes) while registering ``n`` timers on ``b``."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        _register(b, n)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return current - base, peak - base


def test_200k_timers_on_rocksdb_keep_python_memory_within_the_cache_bound(
        tmp_path: Path) -> None:
    """200,000 timers over 128 key groups: the RocksDB backend's Python memory stays
    within its timer cache (1 MiB) plus a fixed allowance for the queues' objects, while
    the in-memory backend's grows by tens of MB; firing them all reads them back in order
    within the same bound."""
    mem = KeyedStateBackend(GROUPS)
    for kg in range(GROUPS):
        mem.own(kg)
    held_by_memory, _ = _growth(mem, N)
    del mem

    rocks = RocksDBKeyedStateBackend(GROUPS, tmp_path / "s", task="t", timer_cache_bytes=CACHE,
                                     block_cache_bytes=8 << 20, write_buffer_bytes=8 << 20)
    try:
        for kg in range(GROUPS):
            rocks.own(kg)
        allowance = 256 << 10  # queue objects, heaps, dicts of 256 queues
        held, peak = _growth(rocks, N)
        print(f"{N} timers: in-memory backend +{held_by_memory / 2**20:.1f} MiB, RocksDB "
              f"+{held / 2**20:.2f} MiB (peak {peak / 2**20:.2f}), cache "
              f"{rocks.timer_cache_bytes() / 2**20:.2f} MiB")
        assert rocks.timer_cache_bytes() <= CACHE
        assert held <= CACHE + allowance and peak <= CACHE + allowance
        assert held_by_memory > 10 * (CACHE + allowance)  # the bound means something
        assert len(rocks.timers[5]) == len(range(5, N, GROUPS))

        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            fired = 0
            last = (-1, -1)
            for t, kg, _ in rocks.pop_due_timers(100_000, EVENT_TIME):
                assert (t, kg) >= last  # by time, then key group
                last = (t, kg)
                fired += 1
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        print(f"fired {fired}: peak +{peak / 2**20:.2f} MiB")
        assert fired == N and peak <= CACHE + allowance
        assert rocks.next_timer(EVENT_TIME) is None and len(rocks.timers[5]) == 0
    finally:
        rocks.close()


def test_equal_times_fire_by_key_group_on_both_backends(tmp_path: Path) -> None:
    rocks = RocksDBKeyedStateBackend(8, tmp_path / "s", task="t", timer_cache_bytes=1)
    mem = KeyedStateBackend(8)
    try:
        for b in (mem, rocks):
            for kg in (6, 2, 4):
                b.own(kg)
                for k in ("z", "a", "m"):
                    b.set_current(k, kg)
                    b.register_timer(10)
                    b.register_timer(5)
        fired = [list(b.pop_due_timers(10)) for b in (mem, rocks)]
        for f in fired:
            assert [(t, kg) for t, kg, _ in f] == [(t, kg) for t in (5, 10) for kg in (2, 4, 6)
                                                   for _ in range(3)]
        assert sorted(fired[0], key=repr) == sorted(fired[1], key=repr)
    finally:
        rocks.close()


def test_the_heap_of_group_heads_stays_bounded(tmp_path: Path) -> None:
    """A head that changes at every registration (ever earlier times) leaves stale heap
    entries; the heap is rebuilt from the heads before they outnumber the queues."""
    rocks = RocksDBKeyedStateBackend(8, tmp_path / "s", task="t")
    try:
        rocks.own(3)
        rocks.set_current("k", 3)
        for t in range(10_000, 0, -1):
            rocks.register_timer(t)
            assert len(rocks._tq._heaps[PROCESSING_TIME]) <= 2 * 2 + 64 + 1
        assert rocks.next_timer() == 1
        assert [t for t, _, _ in rocks.pop_due_timers(5)] == [1, 2, 3, 4, 5]
    finally:
        rocks.close()


def test_timers_are_not_keys_and_move_with_their_group(tmp_path: Path) -> None:
    rocks = RocksDBKeyedStateBackend(8, tmp_path / "s", task="t")
    try:
        rocks.own(1)
        rocks.set_current("a", 1)
        ValueState(rocks, "v").update(1)
        rocks.register_timer(7, EVENT_TIME)
        rocks.register_timer(-(2**63))  # the smallest time stored
        assert rocks.num_keys() == 1 and list(rocks.groups[1]) == ["v"]
        blob = rocks.snapshot(1)
        rocks.remove(1)
        assert rocks.next_timer(EVENT_TIME) is None and 1 not in rocks.timers
        mem = KeyedStateBackend(8)
        mem.install(4, blob)
        assert mem.timers[4] == {(7, "a", EVENT_TIME), (-(2**63), "a", PROCESSING_TIME)}
        rocks.install(2, mem.snapshot(4))
        assert rocks.timers[2] == mem.timers[4]
        assert rocks.next_timer(EVENT_TIME) == 7 and rocks.next_timer() == -(2**63)
    finally:
        rocks.close()


def test_reserved_names_and_out_of_range_times_are_refused(tmp_path: Path) -> None:
    rocks = RocksDBKeyedStateBackend(8, tmp_path / "s", task="op[2]")
    try:
        rocks.own(0)
        rocks.set_current("a", 0)
        with pytest.raises(StateBackendError, match="reserved"):
            ValueState(rocks, TIMER_NAMES[1]).update(1)
        with pytest.raises(StateBackendError, match="64-bit") as err:
            rocks.register_timer(2**63)
        assert err.value.task == "op[2]"
        with pytest.raises(KeyError):
            rocks.add_timer(5, 1, "k")  # a group not owned, as on the in-memory backend
    finally:
        rocks.close()


def test_the_factory_gives_the_timer_caches_a_share_of_state_memory(tmp_path: Path) -> None:
    config = SimpleNamespace(state_backend="rocksdb", state_dir=str(tmp_path),
                             state_memory_bytes=64 << 20)
    b = make_keyed_backend(config, 128, "job", "op[0]")
    try:
        assert isinstance(b, RocksDBKeyedStateBackend)
        q = b._tq
        assert 2 * 128 * q.queue_bytes <= (64 << 20) // 32
        assert 1 <= q.cache_entries <= 128
    finally:
        b.close()
