"""Key groups: the unit of state, routing and migration (pure functions).

``key_group = stable_hash(key) % num_key_groups``. The hash is stable across processes and
machines (never Python's ``hash()``, which is salted per process for str). An *assignment*
is a tuple with one task index per key group.

Keys that cannot partition records are refused here, where a key is hashed (a key-group
cache miss, so the check costs nothing for keys already seen): NaN, which never equals
itself (every NaN record would be a key of its own), raises ``InvalidKeyError``; a type with
no stable encoding raises ``UnhashableKeyError``. Both are ``ReflowError``s.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from itertools import repeat

import msgpack
import numpy as np

from engine.errors import InvalidKeyError, UnhashableKeyError

DEFAULT_NUM_KEY_GROUPS = 128
_VECTOR_MISSES = 32  # new keys in one batch from which ints are hashed with numpy
_MASK32 = 0xFFFFFFFF


def _fmix32(h: int) -> int:
    # MurmurHash3 finaliser: spreads nearby integers over all key groups.
    h &= _MASK32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK32
    h ^= h >> 16
    return h


def _normalise(key: object) -> object:
    # Keys equal in Python (1 == 1.0 == np.float64(1.0) == True) must land in the same key
    # group; a NaN equals nothing, so it cannot be a key at all.
    t = type(key)
    if isinstance(key, bool):  # bool cannot be subclassed: the same test as ``t is bool``
        return int(key)
    if isinstance(key, float):  # float and its subclasses (numpy.float64)
        if key != key:
            raise InvalidKeyError(
                f"the key {key!r} is NaN, which never equals itself: every NaN record would be "
                "a key of its own and none would share state; map NaN to a real key (e.g. "
                "None) or filter such records out before key_by"
            )
        return int(key) if key.is_integer() else float(key)
    if t is tuple and isinstance(key, tuple):  # a plain tuple; a namedtuple stays itself
        return tuple(_normalise(k) for k in key)
    return key


def stable_hash(key: object) -> int:
    """A 32-bit hash of ``key`` that is the same in every process and on every machine.

    str, bytes and int are hashed directly; any other msgpack-encodable key (tuples, floats,
    None) through its msgpack encoding. Keys that compare equal (``1``, ``1.0``, ``True``)
    hash equally. ``InvalidKeyError`` for a NaN (alone or in a tuple), ``UnhashableKeyError``
    (a ``TypeError``) for a key with no stable encoding.
    """
    if type(key) is str:
        return _fmix32(zlib.crc32(key.encode("utf-8")))
    if type(key) is int:
        return _fmix32((key & _MASK32) ^ ((key >> 32) & _MASK32) ^ (0x9E3779B9 if key < 0 else 0))
    if type(key) is bytes:
        return _fmix32(zlib.crc32(key))
    norm = _normalise(key)
    if type(norm) is int:
        return stable_hash(norm)
    try:
        key = norm
        return _fmix32(zlib.crc32(msgpack.packb(key, use_bin_type=True)))
    except (TypeError, OverflowError) as exc:
        raise UnhashableKeyError(
            f"key {key!r} of type {type(key).__name__} cannot be hashed stably; "
            "key_by must return str, bytes, int, float, bool, None or tuples of them"
        ) from exc


def int_key_hashes(keys: np.ndarray) -> np.ndarray:
    """``stable_hash`` of each int64 key, vectorised (uint32): MurmurHash3's finaliser of
    ``low 32 bits ^ high 32 bits`` (``^ 0x9E3779B9`` for a negative key)."""
    k = keys.astype(np.int64, copy=False)
    u = k.view(np.uint64)
    m = u >> np.uint64(32)
    m ^= u
    m &= np.uint64(_MASK32)
    neg = k < 0
    if neg.any():
        m[neg] ^= np.uint64(0x9E3779B9)
    h = m.astype(np.uint32)
    with np.errstate(over="ignore"):
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h *= np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
    return h


def mod_key_groups(hashes: np.ndarray, num_key_groups: int) -> np.ndarray:
    """Key groups (int32) of ``int_key_hashes`` output (which it may change in place)."""
    n = num_key_groups
    if n & (n - 1) == 0:
        hashes &= np.uint32(n - 1)
        return hashes.view(np.int32)
    return (hashes % np.uint32(n)).astype(np.int32)


def key_group_of(key: object, num_key_groups: int) -> int:
    """The key group that ``key`` belongs to."""
    return stable_hash(key) % num_key_groups


class KeyGroupCache:
    """Memoises ``key_group_of`` for hot keys; bounded so memory stays flat (cleared whole
    when full). A batch is looked up in one C-level pass; when it brings ``_VECTOR_MISSES``
    or more new keys that are all ``int`` within int64, they are hashed in one numpy pass
    (``int_key_hashes``, the same hash), else one at a time."""

    def __init__(self, num_key_groups: int, max_entries: int = 500_000) -> None:
        self.num_key_groups = num_key_groups
        self._max = max_entries
        self._cache: dict[object, int] = {}

    def key_groups(self, keys: Sequence[object]) -> list[int]:
        cache = self._cache
        out = list(map(cache.get, keys, repeat(-1, len(keys))))  # one C-level pass
        if -1 not in out:
            return out
        n = self.num_key_groups
        missed = [i for i, kg in enumerate(out) if kg < 0]
        if len(missed) >= _VECTOR_MISSES:  # many new keys: ints are hashed in one numpy pass
            new = [keys[i] for i in missed]
            if set(map(type, new)) == {int}:
                try:
                    arr = np.array(new, dtype=np.int64)
                except OverflowError:  # beyond int64: one at a time below
                    pass
                else:
                    if len(cache) + len(new) > self._max:
                        cache.clear()
                    kgs = mod_key_groups(int_key_hashes(arr), n).tolist()
                    cache.update(zip(new, kgs, strict=True))
                    for i, kg in zip(missed, kgs):  # noqa: B905 - equal lengths
                        out[i] = kg
                    return out
        for i in missed:  # the keys not seen before
            k = keys[i]
            kg = cache.get(k, -1)  # an earlier miss of this batch may have added it
            if kg < 0:
                kg = stable_hash(k) % n
                if len(cache) >= self._max:
                    cache.clear()
                cache[k] = kg
            out[i] = kg
        return out


def uniform_assignment(num_key_groups: int, parallelism: int) -> tuple[int, ...]:
    """Contiguous, balanced ranges of key groups per task (Flink's default assignment).

    ``ValueError`` unless ``parallelism`` is an integer (not a bool) in 1..num_key_groups."""
    if isinstance(parallelism, bool) or not 1 <= parallelism <= num_key_groups:
        raise ValueError(
            f"parallelism {parallelism} must be between 1 and the number of key groups "
            f"({num_key_groups})"
        )
    return tuple(kg * parallelism // num_key_groups for kg in range(num_key_groups))


def key_groups_of_task(assignment: Sequence[int], task_index: int) -> list[int]:
    """The key groups an assignment gives to one task, in ascending order."""
    return [kg for kg, t in enumerate(assignment) if t == task_index]


def validate_assignment(assignment: Sequence[int], num_key_groups: int, parallelism: int) -> None:
    """Raise ValueError unless ``assignment`` maps every key group to a task index (an
    ``int``, never a bool) in range."""
    if len(assignment) != num_key_groups:
        raise ValueError(
            f"the assignment has {len(assignment)} entries; it needs one task index per key "
            f"group ({num_key_groups})"
        )
    bad = [kg for kg, t in enumerate(assignment)
           if not (isinstance(t, int) and not isinstance(t, bool) and 0 <= t < parallelism)]
    if bad:
        raise ValueError(
            f"key groups {bad[:8]} map to task indices outside 0..{parallelism - 1}"
        )


def moved_key_groups(old: Sequence[int], new: Sequence[int]) -> list[int]:
    """Key groups whose owner differs between two assignments of the same operator."""
    return [kg for kg, (a, b) in enumerate(zip(old, new, strict=True)) if a != b]
