"""Incremental checkpoints at the state layer (engine.state.incremental, the backends'
trackers): a chain of a full blob and deltas merges to the group's full snapshot on both
backends, the trackers record what changed (and nothing when off), and ``ChainRecord``
decides full, delta or unchanged as documented.

Why differential: the chain restored must equal the full snapshot taken at the same cut,
whatever the operations between the links (writes, deletes, timers, installs); a random
sequence per seed drives both backends through the same operations.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import CodecError
from engine.state.incremental import (
    MIN_DELTA_BYTES,
    Chain,
    ChainRecord,
    encode_delta,
    is_delta,
    merge_chain,
)
from engine.state.keyed import (
    EVENT_TIME,
    PROCESSING_TIME,
    KeyedStateBackend,
    ListState,
    MapState,
    ValueState,
    decode_snapshot,
    encode_group,
)
from engine.state.rocksdb import RocksDBKeyedStateBackend

KGS = 4
KEYS: list[Any] = [0, 1, 7, -3, "a", "bb", (1, "x"), 2**40, b"k", 2.5]
VALUES: list[Any] = [0, 5, "s", None, [1, 2], {"m": [3]}, (4, "t"), b"\x00"]


def _backends(tmp: Path) -> list[KeyedStateBackend]:
    d = tempfile.mkdtemp(dir=tmp)
    return [KeyedStateBackend(KGS), RocksDBKeyedStateBackend(
        KGS, d, task="t", block_cache_bytes=1 << 20, write_buffer_bytes=2 << 20)]


def _step(b: KeyedStateBackend, rng: random.Random, other: KeyedStateBackend) -> None:
    """One random operation on ``b`` (``other``: a backend whose group may be installed)."""
    kg = rng.randrange(KGS)
    key = rng.choice(KEYS)
    op = rng.randrange(10)
    b.set_current(key, kg)
    if op <= 2:
        ValueState(b, rng.choice(["v", "w"])).update(rng.choice(VALUES))
    elif op == 3:
        ValueState(b, "v").clear()
    elif op == 4:
        ListState(b, "l").add(rng.choice(VALUES))
    elif op == 5:
        MapState(b, "m").put(rng.choice(KEYS[:4]), rng.choice(VALUES))
    elif op == 6:
        b.register_timer(rng.randrange(100), rng.choice([PROCESSING_TIME, EVENT_TIME]))
    elif op == 7:
        b.delete_timer(rng.randrange(100), PROCESSING_TIME)
        list(b.pop_due_timers(rng.randrange(30), EVENT_TIME))
    elif op == 8 and rng.random() < 0.2:
        b.install(kg, other.snapshot(kg))
    elif op == 9:  # a fast path: a table written without set_current
        t = b.groups[kg].setdefault("fast", {})
        t[key] = rng.choice(VALUES)
        b.note_changed(kg, key)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_a_chain_of_deltas_merges_to_the_full_snapshot_on_both_backends(
        tmp_path: Path, seed: int) -> None:
    print(f"incremental chain seed={seed}")
    rng = random.Random(seed)
    for b in _backends(tmp_path):
        other = KeyedStateBackend(KGS)
        for kg in range(KGS):
            b.own(kg)
            other.own(kg)
            other.set_current("o", kg)
            ValueState(other, "v").update(kg)
        b.enable_incremental()
        chains: dict[int, list[bytes]] = {}
        for _ in range(rng.randrange(1, 6)):
            for _ in range(rng.randrange(0, 40)):
                _step(b, rng, other)
            keys, timers, whole = b.take_changes()
            for kg in b.owned():
                if kg in whole or kg not in chains or rng.random() < 0.2:
                    chains[kg] = [b.snapshot(kg)]
                elif kg in keys or kg in timers:
                    delta = b.snapshot_changes(kg, keys.get(kg, ()), timers.get(kg, ()))
                    assert is_delta(delta)
                    chains[kg].append(delta)
            for kg in b.owned():
                assert decode_snapshot(merge_chain(chains[kg])) == decode_snapshot(
                    b.snapshot(kg)), (type(b).__name__, kg, len(chains[kg]))
        b.close()


def test_tracking_costs_nothing_until_enabled_and_records_writes_then(tmp_path: Path) -> None:
    for b in _backends(tmp_path):
        b.own(0)
        b.set_current("a", 0)
        ValueState(b, "v").update(1)
        assert not b._track and not b.incremental and b.tracked() == []
        with pytest.raises(ValueError, match="enable_incremental"):
            b.take_changes()
        b.enable_incremental()
        assert b.tracked() == [0]
        keys, timers, whole = b.take_changes()
        assert whole == {0} and not timers  # owned before: written whole first
        b.set_current("b", 0)
        ValueState(b, "v").update(2)
        b.register_timer(5)
        keys, timers, whole = b.take_changes()
        assert keys == {0: {"a", "b"}} and timers == {0: {(5, "b", PROCESSING_TIME)}}
        assert not whole
        b.install(0, b.snapshot(0))
        assert b.whole_groups() == {0}
        b.close()


def test_a_delta_applied_twice_or_over_more_keys_stays_exact() -> None:
    base = encode_group({"v": {"a": 1, "b": 2}}, [(5, "a", 0)])
    delta = encode_delta(["a", "c", "z"], {"v": {"b": 2, "c": 3}}, [(6, "c", 0)], [(5, "a", 0)])
    want = ({"v": {"b": 2, "c": 3}}, {(6, "c", 0)})
    assert decode_snapshot(merge_chain([base, delta])) == want
    assert decode_snapshot(merge_chain([base, delta, delta])) == want


def test_a_chain_not_starting_with_a_full_blob_or_continued_by_one_is_refused() -> None:
    base = encode_group({"v": {"a": 1}}, [])
    delta = encode_delta(["a"], {}, [], [])
    with pytest.raises(CodecError):
        merge_chain([delta])
    with pytest.raises(CodecError):
        merge_chain([base, base])
    with pytest.raises(CodecError):
        merge_chain([])


def test_the_chain_record_confirms_on_completion_and_forgets_on_abort() -> None:
    r = ChainRecord(max_deltas=2, max_fraction=0.5)
    assert r.base(0) is None
    r.taken(1, {0: Chain(0, 100, 0)}, {0: {"a"}}, {})
    assert r.base(0) is None  # not confirmed yet
    assert r.changes({0: {"b"}}, {}) == ({0: {"a", "b"}}, {})  # pending keys go along
    r.completed(1)
    assert r.base(0) == Chain(0, 100, 0)
    assert r.changes({}, {}) == ({}, {})
    assert r.accepts(Chain(1, 10**5, 10), 5 * 10**4 - 10)
    assert not r.accepts(Chain(1, 10**5, 10), 5 * 10**4 - 9)
    assert r.accepts(Chain(1, 100, 10), MIN_DELTA_BYTES - 10)  # small: whatever the base
    assert not r.accepts(Chain(1, 100, 10), MIN_DELTA_BYTES - 9)
    assert not r.accepts(Chain(2, 100, 0), 1)
    r.taken(2, {0: Chain(1, 100, 5)}, {}, {})
    r.completed(2, unsure=[0])  # made whole since the snapshot: not a base
    assert r.base(0) == Chain(0, 100, 0)
    r.completed(7)  # a savepoint's: nothing
    r.taken(3, {0: Chain(1, 100, 5)}, {}, {})
    r.aborted(3)
    assert r.base(0) is None
    r.taken(4, {1: Chain(0, 9, 0)}, {}, {})
    r.forget([1])
    r.completed(4)
    assert r.base(1) is None
