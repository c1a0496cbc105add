"""Dense keyed-state tables: one table of a task's keyed state held as numpy arrays.

Why: a vectorised aggregation (``engine.vectorised``) touches thousands of distinct keys per
batch. Read and written one Python dict operation at a time, per key group, that was 42 %
of the columnar running count's time. A ``DenseTable`` holds one table (one state name)
for all key groups of a task, as three arrays sorted by key: keys, their key groups and
their values. A batch then finds all its keys with one ``searchsorted`` and reads and
writes their values with one gather and one scatter.

Format and the backend's view of it: the key-group backend (``engine.state``) still holds,
per key group, a mapping per state name; for a dense name that mapping is a
``DenseGroupView`` of the task's table, restricted to the group. Snapshots, migration,
checkpoints, replicas and the size estimates read a group through the view exactly as they
read a dict, so a group's encoded form does not change (its entries come in key order).
``KeyedStateBackend.install``/``remove`` keep the table in step with the groups.

What fits: keys that are Python ints within int64 (never bools), values all ints within
int64 or all floats, per table. ``absorb`` refuses anything else (the caller keeps dicts);
``accepts`` tells whether a batch's values keep the table's type, so a table never turns
ints of keys a batch did not touch into floats.

Guarantees: per key, a view reads and writes the same value a dict would; ``keys`` stays
sorted and unique; every key belongs to the group recorded beside it; a group that left the
task (``drop_group``) leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any

import numpy as np

_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1


def _ints(xs: list[Any]) -> bool:
    return all(type(x) is int and _INT64_MIN <= x <= _INT64_MAX for x in xs)


def value_kind(values: list[Any]) -> str | None:
    """"i" when all ``values`` are Python ints within int64, "f" when all are floats, else
    None (a table of them cannot be dense); "" for no values."""
    if not values:
        return ""
    if _ints(values):
        return "i"
    if all(type(v) is float for v in values):
        return "f"
    return None


def int64_keys(keys: Any) -> np.ndarray | None:
    """``keys`` (a list of values or an Arrow array) as an int64 array when every key is an
    int that fits (bools and nulls do not), else None."""
    if isinstance(keys, list | tuple):
        return np.asarray(keys, dtype=np.int64) if _ints(keys) else None
    import pyarrow as pa

    t = keys.type
    if (not pa.types.is_integer(t) or t == pa.uint64() or keys.null_count):
        return None
    return keys.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


class DenseTable:
    """One state table of a task, for all its key groups (see the module doc)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.keys = np.empty(0, dtype=np.int64)
        self.kgs = np.empty(0, dtype=np.int64)
        self.values = np.empty(0, dtype=np.int64)
        self.kind = ""  # "i" or "f" once a value is held
        self._views: dict[int, DenseGroupView] = {}
        self._counts: np.ndarray | None = None  # entries per key group, while unchanged

    def __len__(self) -> int:
        return int(self.keys.size)

    def view(self, key_group: int) -> DenseGroupView:
        """The mapping of ``key_group``'s entries (one object per group)."""
        v = self._views.get(key_group)
        if v is None:
            v = self._views[key_group] = DenseGroupView(self, key_group)
        return v

    def accepts(self, dtype: np.dtype) -> bool:
        """Whether values of ``dtype`` keep the table's kind (int or float)."""
        kind = "i" if dtype.kind in "iu" else "f" if dtype.kind == "f" else None
        return kind is not None and (not self.kind or kind == self.kind)

    # -- batches
    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per key its slot and whether it is held (a slot of a key not held is where it
        would go, clipped into range; never read it)."""
        slots = np.searchsorted(self.keys, keys)
        if not self.keys.size:
            return slots, np.zeros(keys.size, dtype=bool)
        np.minimum(slots, self.keys.size - 1, out=slots)
        return slots, self.keys[slots] == keys

    def assign(self, keys: np.ndarray, key_groups: np.ndarray, slots: np.ndarray,
               found: np.ndarray, values: np.ndarray) -> None:
        """Set the values of distinct ``keys`` (slots and found from ``lookup`` just before,
        nothing changed in between): held ones in place, the others inserted with their
        key group. ``values`` must be ``accepts``-ed."""
        if not self.accepts(values.dtype):
            raise TypeError(f"dense table {self.name!r} holds kind {self.kind!r}; "
                            f"got {values.dtype}")
        if not self.kind and values.size:
            self.kind = "i" if values.dtype.kind in "iu" else "f"
            self.values = self.values.astype(np.int64 if self.kind == "i" else np.float64)
        if found.all():
            self.values[slots] = values
            return
        self.values[slots[found]] = values[found]
        new = ~found
        self._insert(keys[new], key_groups[new], values[new])

    def _insert(self, keys: np.ndarray, key_groups: np.ndarray, values: np.ndarray) -> None:
        if not keys.size:
            return
        order = np.argsort(keys, kind="stable")
        keys, key_groups, values = keys[order], key_groups[order], values[order]
        at = np.searchsorted(self.keys, keys)
        self.keys = np.insert(self.keys, at, keys)
        self.kgs = np.insert(self.kgs, at, key_groups.astype(np.int64, copy=False))
        self.values = np.insert(self.values, at, values.astype(self.values.dtype))
        self._counts = None

    # -- whole groups
    def absorb(self, key_group: int, keys: list[Any], values: list[Any]) -> bool:
        """Take a group's entries (keys not held yet); False, changing nothing, when they
        do not fit (see the module doc)."""
        kind = value_kind(values)
        if kind is None or not _ints(keys) or (kind and self.kind and kind != self.kind):
            return False
        if not keys:
            return True
        if not self.kind:
            self.kind = kind
            self.values = self.values.astype(np.int64 if kind == "i" else np.float64)
        k = np.asarray(keys, dtype=np.int64)
        self._insert(k, np.full(k.size, key_group, dtype=np.int64),
                     np.asarray(values, dtype=self.values.dtype))
        return True

    def drop_group(self, key_group: int) -> None:
        """Forget every entry of ``key_group``."""
        keep = self.kgs != key_group
        if not keep.all():
            self.keys, self.kgs, self.values = self.keys[keep], self.kgs[keep], self.values[keep]
            self._counts = None

    def group_slots(self, key_group: int) -> np.ndarray:
        return np.flatnonzero(self.kgs == key_group)

    def group_len(self, key_group: int) -> int:
        if self._counts is None:
            self._counts = np.bincount(self.kgs) if self.kgs.size else np.zeros(0, np.int64)
        return int(self._counts[key_group]) if 0 <= key_group < self._counts.size else 0

    # -- single keys (views; not the hot path)
    def slot_of(self, key: Any) -> int:
        """The slot of ``key``, or -1 when it is not held."""
        if type(key) is not int or not _INT64_MIN <= key <= _INT64_MAX or not self.keys.size:
            return -1
        i = int(np.searchsorted(self.keys, key))
        return i if i < self.keys.size and int(self.keys[i]) == key else -1

    def set_one(self, key_group: int, key: Any, value: Any) -> None:
        kind = value_kind([value])
        if not _ints([key]) or kind is None or (self.kind and kind != self.kind):
            raise TypeError(f"dense state table {self.name!r} holds int keys and "
                            f"{'int' if self.kind == 'i' else 'float'} values; got key "
                            f"{key!r}, value {value!r}")
        i = self.slot_of(key)
        if i >= 0:
            self.values[i] = value
        elif not self.absorb(key_group, [key], [value]):  # pragma: no cover - checked above
            raise TypeError(f"dense state table {self.name!r}: cannot hold {key!r}")

    def delete_slot(self, slot: int) -> None:
        self.keys = np.delete(self.keys, slot)
        self.kgs = np.delete(self.kgs, slot)
        self.values = np.delete(self.values, slot)
        self._counts = None


class DenseGroupView(MutableMapping[Any, Any]):
    """One key group's entries of a ``DenseTable``, as a mapping (key -> value)."""

    __slots__ = ("table", "key_group")

    def __init__(self, table: DenseTable, key_group: int) -> None:
        self.table = table
        self.key_group = key_group

    def _slot(self, key: Any) -> int:
        i = self.table.slot_of(key)
        return i if i >= 0 and int(self.table.kgs[i]) == self.key_group else -1

    def __getitem__(self, key: Any) -> Any:
        i = self._slot(key)
        if i < 0:
            raise KeyError(key)
        return self.table.values[i].item()

    def get(self, key: Any, default: Any = None) -> Any:
        i = self._slot(key)
        return default if i < 0 else self.table.values[i].item()

    def __contains__(self, key: object) -> bool:
        return self._slot(key) >= 0

    def __setitem__(self, key: Any, value: Any) -> None:
        i = self.table.slot_of(key)
        if i >= 0 and int(self.table.kgs[i]) != self.key_group:
            raise KeyError(f"key {key!r} belongs to key group {int(self.table.kgs[i])}, "
                           f"not {self.key_group}")
        self.table.set_one(self.key_group, key, value)

    def __delitem__(self, key: Any) -> None:
        i = self._slot(key)
        if i < 0:
            raise KeyError(key)
        self.table.delete_slot(i)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.table.keys[self.table.group_slots(self.key_group)].tolist())

    def __len__(self) -> int:
        return self.table.group_len(self.key_group)

    def items(self) -> list[tuple[Any, Any]]:  # type: ignore[override]
        """The group's entries in key order (a list: views are read to encode them)."""
        s = self.table.group_slots(self.key_group)
        return list(zip(self.table.keys[s].tolist(), self.table.values[s].tolist(),
                        strict=True))

    def __repr__(self) -> str:
        return f"DenseGroupView({self.table.name!r}, group {self.key_group}, {dict(self.items())})"
