"""Keyed state per key group: the backend, the state handles, and key-group snapshots.

State lives in ``KeyedStateBackend.groups[key_group][state_name][key]``. A key group's
timers live with it (``timers[key_group]``: set of ``(time_ms, key, domain)``, domain
``PROCESSING_TIME`` or ``EVENT_TIME``).
A key group encodes on its own (exact msgpack codec, declared codecs for user types) and
reports its size, so migration and checkpoints move single key groups.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from engine.codec import pack_exact, unpack_exact

_SAMPLE = 32
PROCESSING_TIME = 0
EVENT_TIME = 1


class KeyedStateBackend:
    """All keyed state of one task. The task sets ``current_key``/``current_group`` before
    calling user code; state handles read and write through them."""

    def __init__(self, num_key_groups: int) -> None:
        self.num_key_groups = num_key_groups
        self.groups: dict[int, dict[str, dict[Any, Any]]] = {}
        self.timers: dict[int, set[tuple[int, Any, int]]] = {}
        # per time domain: (time, key_group, tie-breaker, key); keys are never compared
        self._heaps: tuple[list[tuple[int, int, int, Any]], ...] = ([], [])
        self._tie = 0
        self.current_key: Any = None
        self.current_group: int = -1
        self._tables: dict[str, dict[Any, Any]] = {}

    # -- ownership
    def own(self, key_group: int) -> None:
        """Take ownership of an empty key group (creates it when missing)."""
        self.groups.setdefault(key_group, {})
        self.timers.setdefault(key_group, set())

    def owned(self) -> list[int]:
        return sorted(self.groups)

    def set_current(self, key: Any, key_group: int) -> None:
        self.current_key = key
        if key_group != self.current_group:
            self.current_group = key_group
            self._tables = self.groups[key_group]

    def table(self, name: str) -> dict[Any, Any]:
        """The ``name`` table of the current key group (key -> value)."""
        t = self._tables.get(name)
        if t is None:
            t = self._tables[name] = {}
        return t

    # -- timers
    def register_timer(self, time_ms: int, domain: int = PROCESSING_TIME) -> None:
        """A timer for the current key; one per (key, time, domain)."""
        entry = (int(time_ms), self.current_key, domain)
        ts = self.timers[self.current_group]
        if entry not in ts:
            ts.add(entry)
            self._push_timer(entry[0], self.current_group, self.current_key, domain)

    def _push_timer(self, time_ms: int, key_group: int, key: Any, domain: int) -> None:
        self._tie += 1
        heapq.heappush(self._heaps[domain], (time_ms, key_group, self._tie, key))

    def delete_timer(self, time_ms: int, domain: int = PROCESSING_TIME) -> None:
        self.timers[self.current_group].discard((int(time_ms), self.current_key, domain))

    def next_timer(self, domain: int = PROCESSING_TIME) -> int | None:
        heap = self._heaps[domain]
        while heap:
            t, kg, _, key = heap[0]
            if kg in self.timers and (t, key, domain) in self.timers[kg]:
                return t
            heapq.heappop(heap)
        return None

    def pop_due_timers(self, now_ms: int, domain: int = PROCESSING_TIME) -> Iterator[tuple[int, int, Any]]:
        """Yield ``(time_ms, key_group, key)`` for every live timer due at ``now_ms``, in
        time order (timers registered while iterating fire too when due)."""
        heap = self._heaps[domain]
        while heap and heap[0][0] <= now_ms:
            t, kg, _, key = heapq.heappop(heap)
            ts = self.timers.get(kg)
            if ts is not None and (t, key, domain) in ts:
                ts.discard((t, key, domain))
                yield t, kg, key

    # -- single key groups
    def snapshot(self, key_group: int) -> bytes:
        """Encode one key group (all its tables and timers)."""
        tables = self.groups.get(key_group, {})
        return pack_exact(
            [
                [[name, list(t.items())] for name, t in tables.items() if t],
                sorted(self.timers.get(key_group, ()), key=repr),
            ]
        )

    def install(self, key_group: int, data: bytes) -> None:
        """Install an encoded key group, replacing anything held for it."""
        tables_enc, timers = unpack_exact(data)
        self.groups[key_group] = {name: dict(items) for name, items in tables_enc}
        self.timers[key_group] = {(int(t), k, int(d)) for t, k, d in timers}
        for t, k, d in self.timers[key_group]:
            self._push_timer(t, key_group, k, d)
        if key_group == self.current_group:
            self._tables = self.groups[key_group]

    def remove(self, key_group: int) -> None:
        """Drop a key group and its timers (after it was snapshotted and sent)."""
        self.groups.pop(key_group, None)
        self.timers.pop(key_group, None)
        if key_group == self.current_group:
            self.current_group = -1
            self._tables = {}

    def size_bytes(self, key_group: int) -> int:
        return len(self.snapshot(key_group))

    def estimated_bytes(self) -> int:
        """Cheap estimate of the encoded size of all state (the first entries of each table
        stand for the rest)."""
        total = 0
        for tables in self.groups.values():
            for t in tables.values():
                n = len(t)
                if n:
                    sample = list(itertools.islice(t.items(), _SAMPLE))
                    total += len(pack_exact(sample)) * n // len(sample)
        return total

    def num_keys(self) -> int:
        return sum(len(t) for tables in self.groups.values() for t in tables.values())


# ---------------------------------------------------------------- state handles

_MISSING = object()


class ValueState:
    """One value per key."""

    def __init__(self, backend: KeyedStateBackend, name: str, default: Any = None) -> None:
        self._b, self._name, self._default = backend, name, default

    def value(self) -> Any:
        return self._b.table(self._name).get(self._b.current_key, self._default)

    def update(self, value: Any) -> None:
        self._b.table(self._name)[self._b.current_key] = value

    def clear(self) -> None:
        self._b.table(self._name).pop(self._b.current_key, None)


class ListState:
    """A list per key."""

    def __init__(self, backend: KeyedStateBackend, name: str) -> None:
        self._b, self._name = backend, name

    def get(self) -> list[Any]:
        v = self._b.table(self._name).get(self._b.current_key)
        return list(v) if v is not None else []

    def add(self, value: Any) -> None:
        t = self._b.table(self._name)
        cur = t.get(self._b.current_key)
        if cur is None:
            t[self._b.current_key] = [value]
        else:
            cur.append(value)

    def update(self, values: list[Any]) -> None:
        self._b.table(self._name)[self._b.current_key] = list(values)

    def clear(self) -> None:
        self._b.table(self._name).pop(self._b.current_key, None)


class MapState:
    """A dict per key."""

    def __init__(self, backend: KeyedStateBackend, name: str) -> None:
        self._b, self._name = backend, name

    def _map(self, create: bool = False) -> dict[Any, Any] | None:
        t = self._b.table(self._name)
        m = t.get(self._b.current_key)
        if m is None and create:
            m = t[self._b.current_key] = {}
        return m

    def get(self, key: Any, default: Any = None) -> Any:
        m = self._map()
        return default if m is None else m.get(key, default)

    def put(self, key: Any, value: Any) -> None:
        self._map(create=True)[key] = value  # type: ignore[index]

    def contains(self, key: Any) -> bool:
        m = self._map()
        return m is not None and key in m

    def remove(self, key: Any) -> None:
        m = self._map()
        if m is not None:
            m.pop(key, None)

    def keys(self) -> list[Any]:
        return list(self._map() or {})

    def items(self) -> list[tuple[Any, Any]]:
        return list((self._map() or {}).items())

    def is_empty(self) -> bool:
        return not self._map()

    def clear(self) -> None:
        self._b.table(self._name).pop(self._b.current_key, None)


class ReducingState:
    """One value per key, folded with ``reduce_fn`` on every ``add``."""

    def __init__(self, backend: KeyedStateBackend, name: str, reduce_fn: Callable[[Any, Any], Any]) -> None:
        self._b, self._name, self._fn = backend, name, reduce_fn

    def add(self, value: Any) -> None:
        t = self._b.table(self._name)
        k = self._b.current_key
        cur = t.get(k, _MISSING)
        t[k] = value if cur is _MISSING else self._fn(cur, value)

    def get(self) -> Any:
        return self._b.table(self._name).get(self._b.current_key)

    def clear(self) -> None:
        self._b.table(self._name).pop(self._b.current_key, None)
