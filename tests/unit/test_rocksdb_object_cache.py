"""The RocksDB backend's object cache keeps dict semantics when it must make room in the
middle of one key's work (``RocksDBKeyedStateBackend._lend`` at four times its share)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.state import rocksdb
from engine.state.keyed import KeyedStateBackend, ValueState
from engine.state.rocksdb import RocksDBKeyedStateBackend


def _rocks(tmp_path: Path) -> RocksDBKeyedStateBackend:
    return RocksDBKeyedStateBackend(8, str(tmp_path / "db"), task="t-0",
                                    block_cache_bytes=1 << 20, write_buffer_bytes=2 << 20,
                                    object_cache_bytes=4096)


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_a_value_held_across_an_in_key_flush_keeps_its_mutations(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    """A mutable value read, then other writes of the same key that fill the cache four
    times over, then the value mutated: the mutation persists, as in the memory backend
    (before the fix the in-key flush wrote the value back and dropped it from the loans,
    so the later mutation was lost)."""
    monkeypatch.setattr(rocksdb, "_MAX_LOANS", 2)
    b: KeyedStateBackend = KeyedStateBackend(8) if backend == "memory" else _rocks(tmp_path)
    try:
        b.own(3)
        b.set_current("k", 3)
        ValueState(b, "profile").update({"visits": 0})
        b.set_current("other", 3)  # the loans written back at a change of key
        b.set_current("k", 3)
        held = ValueState(b, "profile").value()
        for i in range(20):  # 20 more loans of the same key: several in-key flushes
            ValueState(b, f"v{i}").update([i])
        held["visits"] += 1
        b.set_current("other", 3)
        b.set_current("k", 3)
        assert ValueState(b, "profile").value() == {"visits": 1}
        assert [ValueState(b, f"v{i}").value() for i in range(20)] == [[i] for i in range(20)]
    finally:
        if isinstance(b, RocksDBKeyedStateBackend):
            b.close()


def test_a_key_larger_than_the_share_does_not_flush_at_every_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key whose own live values exceed four times the cache's share is kept live once;
    its bytes do not count towards the next in-key flush, so writing its other values does
    not write the large one back each time (quadratic); the next key's change does."""
    b = _rocks(tmp_path)
    flushes = 0
    real = b._write_back

    def counting(*args: object, **kwargs: object) -> dict[bytes, int]:
        nonlocal flushes
        flushes += 1
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(b, "_write_back", counting)
    try:
        b.own(1)
        b.set_current("big", 1)
        ValueState(b, "list").update(["x" * 100] * 400)  # ~40 KB: 10x the 4 KB share
        b.flush()
        big = ValueState(b, "list").value()  # read back: lent at its stored size
        flushes = 0
        for i in range(50):
            ValueState(b, f"small{i}").update([i])
        assert 1 <= flushes <= 2, flushes
        big.append("y")
        b.set_current("next", 1)
        b.set_current("big", 1)
        assert ValueState(b, "list").value()[-1] == "y"
    finally:
        b.close()
