"""Keyed state per key group: the backend, the state handles, and key-group snapshots.

State lives in ``KeyedStateBackend.groups[key_group][state_name][key]``. A key group's
timers live with it (``timers[key_group]``: set of ``(time_ms, key, domain)``, domain
``PROCESSING_TIME`` or ``EVENT_TIME``).
A key group encodes on its own (exact msgpack codec, declared codecs for user types) and
reports its size, so migration and checkpoints move single key groups.

Dense tables (``engine.state.dense``): ``dense_table(name)`` turns one state name into a
task-wide ``DenseTable`` (numpy arrays); each group then holds a ``DenseGroupView`` of it
under that name, read and written like a dict, so everything below works on it unchanged.
``install``/``remove`` keep the dense tables in step; ``undense(name)`` turns one back
into dicts (when a batch brings keys or values it cannot hold).

Change tracking (for replicas, ``migration.replication``): ``track_changes(kg)`` records
every key made current in ``kg`` (and every key of ``kg`` on ``install``/``remove``) as
possibly changed; ``snapshot_delta(kg)`` encodes those keys' current values plus the group's
full timer set; ``apply_delta(base, delta)`` turns the snapshot taken at the last
``mark_replicated(kg)`` into the group's snapshot now.

Incremental checkpoints (``engine.state.incremental``): ``enable_incremental()`` records,
for every group, the keys made current or written and the timers added or removed since
``take_changes()``, and which groups were installed, removed or owned anew (written whole);
``snapshot_changes(kg, keys, timers)`` encodes those keys' current entries as a delta blob.
Until it is called nothing is recorded (``set_current`` tests one flag, as before).

Sizes (``estimated_bytes``: the ``state_bytes`` metric; ``estimated_group_bytes``: the
``GroupStats`` sizes planning reads): both backends report the *logical* encoded size of
the keyed tables, the encoded keys plus the encoded values of every entry, which is what
the tables take in a key-group blob (a savepoint, a checkpoint, a migration) before any
compression; blob framing (a few bytes per table; the RocksDB blob's 8 bytes of lengths per
entry) and timers are not counted. Here each table is measured whole (encoded) in turn, a
bounded number per call, and scaled by its length in between; the RocksDB backend keeps
exact counts on its writes (``engine.state.rocksdb``).
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from engine.errors import CodecError
from engine.wire.codec import pack_exact, unpack_exact

if TYPE_CHECKING:
    from engine.state.dense import DenseTable
    from engine.state.sst_checkpoints import DbCheckpoint

# One state table of one key group (key -> value): a dict, or a ``DenseGroupView`` of a
# dense table (engine.state.dense), which reads and writes like one.
Table = MutableMapping[Any, Any]

#: what one ``estimated_bytes`` call measures at most (whole tables, at least one): tables,
#: entries and bytes
_MEASURE_TABLES = 16
_MEASURE_ENTRIES = 32_768
_MEASURE_BYTES = 8 << 20
#: of which tables measured again in turn (neither new nor moved) take at most
_REFRESH = (4, 8_192, 1 << 20)
#: entries sampled to guess a table no measured table of its name stands for
_SAMPLE = 32


def _table_bytes(table: Table) -> int:
    """The logical bytes of ``table``: its keys' and values' encodings (exact codec), as
    its entries lie in a key-group blob (the flat array without its header)."""
    n = 2 * len(table)
    if not n:
        return 0
    return len(pack_exact(list(itertools.chain.from_iterable(table.items())))) - (
        1 if n < 16 else 3 if n < 1 << 16 else 5)


def _close(measured_length: int, length: int) -> bool:
    """A table measured at ``measured_length`` entries still counts by that measure at
    ``length`` (scaled): its length moved by less than a quarter."""
    return 3 * measured_length <= 4 * length <= 5 * measured_length


def _sampled_bytes(table: Table) -> float:
    """A guess of ``_table_bytes`` from the first entries (a skewed table fools it: used
    only until the table is measured)."""
    sample = list(itertools.islice(table.items(), _SAMPLE))
    return _table_bytes(dict(sample)) * len(table) / len(sample)


PROCESSING_TIME = 0
EVENT_TIME = 1


class KeyedStateBackend:
    """All keyed state of one task. The task sets ``current_key``/``current_group`` before
    calling user code; state handles read and write through them."""

    def __init__(self, num_key_groups: int) -> None:
        self.num_key_groups = num_key_groups
        self.groups: dict[int, dict[str, Table]] = {}
        self.timers: dict[int, set[tuple[int, Any, int]]] = {}
        # per time domain: (time, key_group, tie-breaker, key); keys are never compared
        self._heaps: tuple[list[tuple[int, int, int, Any]], ...] = ([], [])
        self._tie = 0
        self.current_key: Any = None
        self.current_group: int = -1
        self._tables: dict[str, Table] = {}
        # change tracking: key group -> keys possibly changed since its last
        # mark_replicated; empty when no group is tracked (set_current tests it once)
        self._changes: dict[int, set[Any]] = {}
        # key group -> replication version; kept after untrack so versions never repeat
        self._versions: dict[int, int] = {}
        # incremental checkpoints (enable_incremental; None: off, nothing recorded): key
        # group -> keys possibly changed, timers added or removed, since take_changes; and
        # the groups installed, removed or owned anew since (written whole next)
        self._dirty: dict[int, set[Any]] | None = None
        self._dirty_timers: dict[int, set[tuple[int, Any, int]]] = {}
        self._whole: set[int] = set()
        # some change is recorded (replicas or incremental checkpoints): the one test on
        # the per-record path
        self._track = False
        # (key group, table) -> (its logical bytes, its length) when last measured
        self._measured: dict[tuple[int, str], tuple[int, int]] = {}
        self._measure_at = 0
        # key group -> (its tables' lengths, distinct keys then): group_keys
        self._group_keys: dict[int, tuple[tuple[int, ...], int]] = {}
        self._dense: dict[str, DenseTable] = {}
        # bumped whenever groups or dense tables come, go or are replaced (callers that
        # checked a layout remember this and check again only when it moved)
        self.layout_version = 0

    # -- ownership
    def own(self, key_group: int) -> None:
        """Take ownership of an empty key group (creates it when missing)."""
        if key_group not in self.groups:
            self.layout_version += 1
            self._made_whole(key_group)
        self.groups.setdefault(key_group, {})
        self.timers.setdefault(key_group, set())

    def owned(self) -> list[int]:
        return sorted(self.groups)

    def set_current(self, key: Any, key_group: int) -> None:
        self.current_key = key
        if key_group != self.current_group:
            self.current_group = key_group
            self._tables = self.groups[key_group]
        if self._track:  # the only cost when nothing is tracked
            self._note(key_group, key)

    def _note(self, key_group: int, key: Any) -> None:
        """``key`` of ``key_group`` may change: record it for replicas and checkpoints."""
        if self._changes:
            changed = self._changes.get(key_group)
            if changed is not None:
                changed.add(key)
        dirty = self._dirty
        if dirty is not None:
            keys = dirty.get(key_group)
            if keys is None:
                keys = dirty[key_group] = set()
            keys.add(key)

    def table(self, name: str) -> Table:
        """The ``name`` table of the current key group (key -> value)."""
        t = self._tables.get(name)
        if t is None:
            dense = self._dense.get(name)
            t = self._tables[name] = {} if dense is None else dense.view(self.current_group)
        return t

    # -- dense tables
    def dense_table(self, name: str) -> DenseTable | None:
        """The task-wide dense table of state ``name``, made from the groups' ``name``
        tables on first call; None (nothing changed) when their entries cannot be dense
        (``engine.state.dense``)."""
        t = self._dense.get(name)
        if t is not None:
            return t
        from engine.state.dense import DenseTable

        t = DenseTable(name)
        for kg, tables in self.groups.items():
            d = tables.get(name)
            if d and not t.absorb(kg, list(d), list(d.values())):
                return None
        self._dense[name] = t
        self.layout_version += 1
        for kg, tables in self.groups.items():
            if name in tables:
                tables[name] = t.view(kg)
        return t

    def undense(self, name: str) -> None:
        """Turn the dense table ``name`` back into one dict per group (no-op if none)."""
        t = self._dense.pop(name, None)
        if t is None:
            return
        self.layout_version += 1
        for tables in self.groups.values():
            v = tables.get(name)
            if v is not None and getattr(v, "table", None) is t:
                tables[name] = dict(v.items())

    def dense_names(self) -> list[str]:
        return sorted(self._dense)

    # -- timers
    def register_timer(self, time_ms: int, domain: int = PROCESSING_TIME) -> None:
        """A timer for the current key; one per (key, time, domain)."""
        self.add_timer(self.current_group, time_ms, self.current_key, domain)

    def add_timer(self, key_group: int, time_ms: int, key: Any,
                  domain: int = PROCESSING_TIME) -> None:
        """A timer for ``key`` of ``key_group`` (an owned group); one per (key, time,
        domain). Vectorised operators register one per group with a key of their own."""
        entry = (int(time_ms), key, domain)
        ts = self.timers[key_group]
        if entry not in ts:
            ts.add(entry)
            self._push_timer(entry[0], key_group, key, domain)
            if self._dirty is not None:
                self._note_timer(key_group, entry)

    def _note_timer(self, key_group: int, entry: tuple[int, Any, int]) -> None:
        self._dirty_timers.setdefault(key_group, set()).add(entry)

    def _push_timer(self, time_ms: int, key_group: int, key: Any, domain: int) -> None:
        self._tie += 1
        heapq.heappush(self._heaps[domain], (time_ms, key_group, self._tie, key))

    def delete_timer(self, time_ms: int, domain: int = PROCESSING_TIME) -> None:
        entry = (int(time_ms), self.current_key, domain)
        self.timers[self.current_group].discard(entry)
        if self._dirty is not None:
            self._note_timer(self.current_group, entry)

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
                if self._dirty is not None:
                    self._note_timer(kg, (t, key, domain))
                yield t, kg, key

    # -- single key groups
    def snapshot(self, key_group: int) -> bytes:
        """Encode one key group (all its tables and timers) as a key-group blob
        (``encode_group``)."""
        return encode_group(self.groups.get(key_group, {}), self.timers.get(key_group, ()))

    def install(self, key_group: int, data: bytes) -> None:
        """Install a key-group blob of either backend (``decode_group``), replacing
        anything held for it."""
        decoded, timers = decode_group(data)
        changed = self._changes.get(key_group)
        if changed is not None:
            self._note_all(key_group, changed)
        self._made_whole(key_group)
        self.layout_version += 1
        for t in self._dense.values():
            t.drop_group(key_group)
        tables: dict[str, Table] = dict(decoded)
        self.groups[key_group] = tables
        for name in list(self._dense):
            d = tables.get(name)
            if d is not None:
                t = self._dense[name]
                if t.absorb(key_group, list(d), list(d.values())):
                    tables[name] = t.view(key_group)
                else:
                    self.undense(name)
        if changed is not None:
            self._note_all(key_group, changed)
        self.timers[key_group] = {(int(at), k, int(domain)) for at, k, domain in timers}
        for at, k, domain in self.timers[key_group]:
            self._push_timer(at, key_group, k, domain)
        if key_group == self.current_group:
            self._tables = self.groups[key_group]

    def remove(self, key_group: int) -> None:
        """Drop a key group and its timers (after it was snapshotted and sent). A tracked
        group stays tracked (its delta then empties the replica); ``untrack`` it when it
        left for good."""
        changed = self._changes.get(key_group)
        if changed is not None:
            self._note_all(key_group, changed)
        self.groups.pop(key_group, None)
        self._made_whole(key_group)
        self.layout_version += 1
        for t in self._dense.values():
            t.drop_group(key_group)
        self.timers.pop(key_group, None)
        if key_group == self.current_group:
            self.current_group = -1
            self._tables = {}

    # -- change tracking (replicas)
    def track_changes(self, key_group: int, start_version: int | None = None) -> int:
        """Start recording which keys of ``key_group`` may change; returns its version.

        Starting bumps the version (to at least ``start_version``), so a replica taken
        before an untracked period never matches. A group that moves to another task should
        start there above the version it had at its old owner (pass ``start_version``), so
        versions of one group never repeat across owners. No-op when already tracked.
        """
        if key_group in self._changes:
            return self._versions[key_group]
        v = self._versions.get(key_group, 0) + 1
        if start_version is not None and start_version > v:
            v = start_version
        self._versions[key_group] = v
        changed: set[Any] = set()
        if key_group == self.current_group:
            changed.add(self.current_key)  # user code may still write the current key
        self._changes[key_group] = changed
        self._track = True
        return v

    def untrack(self, key_group: int) -> None:
        """Stop recording changes of ``key_group`` (its version is kept)."""
        self._changes.pop(key_group, None)
        self._track = bool(self._changes) or self._dirty is not None

    def is_tracked(self, key_group: int) -> bool:
        return key_group in self._changes

    def tracked(self) -> list[int]:
        """The groups whose changes are recorded: those tracked for replicas, and every
        group with incremental checkpoints on (fast paths that write tables without
        ``set_current`` call ``note_changed`` when this is not empty)."""
        if self._dirty is not None:
            return sorted(set(self._changes).union(self.owned()))
        return sorted(self._changes)

    def version(self, key_group: int) -> int:
        """The version of the last ``mark_replicated`` (or ``track_changes``); 0 if never."""
        return self._versions.get(key_group, 0)

    def note_changed(self, key_group: int, key: Any) -> None:
        """Record a change made without ``set_current`` (fast paths writing tables
        directly). No-op when the group is not tracked."""
        if self._track:
            self._note(key_group, key)

    def changed_keys(self, key_group: int) -> int:
        """How many keys of a tracked group may have changed since the last mark."""
        return len(self._changes.get(key_group, ()))

    def snapshot_delta(self, key_group: int) -> bytes:
        """Encode what changed in a tracked group since its last ``mark_replicated`` (or
        ``track_changes``): for every possibly changed key, its value in each table that
        holds it (tables not listed: absent), plus the group's full timer set, tagged with
        the base version (``version(key_group)``). See ``apply_delta``."""
        changed = self._changes.get(key_group)
        if changed is None:
            raise ValueError(
                f"key group {key_group} is not tracked; call track_changes({key_group}) "
                "before asking for a delta"
            )
        tables = self.groups.get(key_group, {})
        entries = [
            [key, [[name, t[key]] for name, t in tables.items() if key in t]]
            for key in changed
        ]
        return pack_exact(
            [
                _DELTA_TAG,
                self._versions[key_group],
                entries,
                sorted(self.timers.get(key_group, ()), key=repr),
            ]
        )

    def mark_replicated(self, key_group: int) -> int:
        """The group's state as of now is replicated: clear its change set and bump its
        version (returned). Call right after encoding the snapshot or delta that was sent,
        with no state operation in between."""
        changed = self._changes.get(key_group)
        if changed is None:
            raise ValueError(f"key group {key_group} is not tracked; call track_changes first")
        changed.clear()
        if key_group == self.current_group:
            changed.add(self.current_key)  # user code may still write the current key
        v = self._versions[key_group] = self._versions[key_group] + 1
        return v

    def _note_all(self, key_group: int, changed: set[Any]) -> None:
        for t in self.groups.get(key_group, {}).values():
            changed.update(t)

    # -- change tracking (incremental checkpoints: engine.state.incremental)
    def enable_incremental(self) -> None:
        """Record, from now on, per key group the keys made current or written, the timers
        added or removed, and the groups installed, removed or owned anew (every group
        owned now counts as such: its first incremental checkpoint writes it whole).
        Costs nothing until called. Idempotent."""
        if self._dirty is None:
            self._dirty = {}
            self._whole = set(self.owned())
            self._track = True

    @property
    def incremental(self) -> bool:
        return self._dirty is not None

    def _made_whole(self, key_group: int) -> None:
        if self._dirty is not None:
            self._whole.add(key_group)
            self._dirty.pop(key_group, None)
            self._dirty_timers.pop(key_group, None)

    #: whether the backend keeps its state in files of its own, which checkpoints can
    #: take as they are (``checkpoint_files``)
    has_files = False

    def checkpoint_files(self, tag: str) -> DbCheckpoint | None:
        """Checkpoint the whole backend as its own files into a local folder named after
        ``tag``; None when the backend has none (this one: its checkpoints are key-group
        blobs). The RocksDB backend's SST-level incremental checkpoints use it
        (``engine.state.sst_checkpoints``)."""
        return None

    def whole_groups(self) -> frozenset[int]:
        """The groups installed, removed or owned anew since the last ``take_changes``."""
        return frozenset(self._whole)

    def take_changes(self) -> tuple[dict[int, set[Any]], dict[int, set[tuple[int, Any, int]]],
                                    set[int]]:
        """What changed since the last call, and start recording anew: per group the keys
        possibly changed and the timers added or removed, and the groups to write whole.
        The current key stays recorded (user code may still write it)."""
        if self._dirty is None:
            raise ValueError("incremental checkpoints are off; call enable_incremental")
        self.flush()
        out = (self._dirty, self._dirty_timers, self._whole)
        self._dirty, self._dirty_timers, self._whole = {}, {}, set()
        if self.current_group in self.groups:
            self._dirty[self.current_group] = {self.current_key}
        return out

    def snapshot_changes(self, key_group: int, keys: Iterable[Any],
                         timers: Iterable[tuple[int, Any, int]]) -> bytes:
        """A delta blob (``engine.state.incremental``) of ``key_group``: the current
        entries of ``keys`` in every table (the others: tombstones), and which of
        ``timers`` exist now and which no longer."""
        from engine.state.incremental import encode_delta

        live = self.timers.get(key_group, set())
        ts = list(timers)
        return encode_delta(keys, self.groups.get(key_group, {}),
                            [t for t in ts if t in live], [t for t in ts if t not in live])

    def flush(self) -> None:
        """Write back values held outside the tables (nothing here: the tables are the
        dicts; the RocksDB backend writes back the mutable values it lent). Idempotent."""

    def close(self) -> None:
        """Release what the backend holds outside the process's memory (nothing here; the
        RocksDB backend closes its DB and deletes its files). Idempotent."""

    def size_bytes(self, key_group: int) -> int:
        return len(self.snapshot(key_group))

    def estimated_group_bytes(self, key_group: int) -> int:
        """One key group's logical bytes (as ``estimated_bytes``, for one group), for
        planning (a migration ships and counts the exact bytes): each table at its last
        measurement scaled by its length since, a table never measured, or whose length
        moved by a quarter, measured now (encoded once; the metrics' calls to
        ``estimated_bytes`` keep most tables measured)."""
        total = 0.0
        for name, t in self.groups.get(key_group, {}).items():
            n = len(t)
            if n:
                known = self._measured.get((key_group, name))
                if known is None or not _close(known[1], n):
                    known = self._measure(key_group, name, t)
                total += known[0] * n / known[1]
        return int(total)

    def group_keys(self, key_group: int) -> int | None:
        """The distinct keys holding state in ``key_group`` (the denominator of Spacker's
        ratio of state access), exact: the length of its only non-empty table, or the size
        of the union of its tables' keys (one pass, remembered until a table's length
        changes). Never None here (a backend that cannot say returns None)."""
        tables = [t for t in self.groups.get(key_group, {}).values() if len(t)]
        if len(tables) < 2:
            return len(tables[0]) if tables else 0
        lengths = tuple(len(t) for t in tables)
        known = self._group_keys.get(key_group)
        if known is None or known[0] != lengths:
            keys: set[Any] = set()
            for t in tables:
                keys.update(t.keys())
            known = self._group_keys[key_group] = (lengths, len(keys))
            if len(self._group_keys) > 2 * len(self.groups) + 64:
                for kg in [kg for kg in self._group_keys if kg not in self.groups]:
                    del self._group_keys[kg]
        return known[1]

    def group_stats(self, key_group: int) -> tuple[int, int | None]:
        """``(estimated_group_bytes, group_keys)`` of one group: what a ``GroupStats``
        reply says of it."""
        return self.estimated_group_bytes(key_group), self.group_keys(key_group)

    def _measure(self, key_group: int, name: str, t: Table) -> tuple[int, int]:
        known = self._measured[(key_group, name)] = (_table_bytes(t), len(t))
        return known

    def estimated_bytes(self) -> int:
        """The logical encoded size of all keyed state: the encoded keys plus the encoded
        values of every table entry (what the tables' entries take in a savepoint, before
        compression; framing and timers not counted), the figure the RocksDB backend
        keeps exactly for the same state.

        Cheap, and exact up to a bounded staleness: each table counts as its bytes when
        last measured (encoded whole: exact, whatever the spread of its value sizes)
        scaled by its length since. A call measures whole tables within a budget of
        ``_MEASURE_TABLES`` tables, ``_MEASURE_ENTRIES`` entries and ``_MEASURE_BYTES``
        bytes (by their expected size): first those never measured or whose length moved
        by a quarter, then the others in turn (within the smaller ``_REFRESH`` budget:
        they change least), and at least one table (so a call costs one
        ``len`` per table plus at most the budget and one table's encode, never a pass
        over all state: the JobMaster asks every second). The figure is exact once every
        table changed since was measured again: about ``max(tables, entries, bytes)`` over
        the ``_REFRESH`` budget calls after the last change
        (while tables keep moving by a quarter faster than the budget measures them, the
        others wait). Meanwhile a table whose values changed without its length counts at
        its old size, and a table not yet measured at the mean entry size of the measured
        tables of its name (a sample of its first entries when there are none)."""
        measured = self._measured
        total = 0.0
        first: list[tuple[int, str, Table, int]] = []  # new or moved: measured first
        known_tables: list[tuple[int, str, Table, int]] = []  # the others, in turn
        by_name: dict[str, list[float]] = {}  # name -> [bytes, entries] of known tables
        for kg, tables in self.groups.items():
            for name, t in tables.items():
                n = len(t)
                if not n:
                    continue
                known = measured.get((kg, name))
                if known is None or not _close(known[1], n):
                    first.append((kg, name, t, n))
                    continue
                known_tables.append((kg, name, t, n))
                b = known[0] * n / known[1]
                total += b
                acc = by_name.setdefault(name, [0.0, 0])
                acc[0] += b
                acc[1] += n
        left = [_MEASURE_TABLES, _MEASURE_ENTRIES, _MEASURE_BYTES]

        def fits(n: int, guess: float) -> bool:
            return left[0] > 0 and n <= left[1] and guess <= left[2]

        def spend(n: int, nbytes: int) -> None:
            left[0] -= 1
            left[1] -= n
            left[2] -= nbytes

        for i, (kg, name, t, n) in enumerate(first):
            known = measured.get((kg, name))
            seen = by_name.get(name)
            guess = (known[0] * n / known[1] if known is not None
                     else seen[0] / seen[1] * n if seen is not None and seen[1]
                     else None)
            if guess is None and i:
                guess = _sampled_bytes(t)
            if i == 0 or fits(n, guess):  # type: ignore[arg-type]
                b = self._measure(kg, name, t)[0]
                spend(n, b)
                acc = by_name.setdefault(name, [0.0, 0])
                acc[0] += b
                acc[1] += n
            else:  # not measured this call: guessed
                b = guess  # type: ignore[assignment]
            total += b
        if known_tables:  # refresh some in turn (one at least when none was new or moved)
            left[:] = map(min, left, _REFRESH)
            at = self._measure_at % len(known_tables)
            done = 0
            while done < len(known_tables):
                kg, name, t, n = known_tables[(at + done) % len(known_tables)]
                old, old_n = measured[(kg, name)]
                if (done or first) and not fits(n, old * n / old_n):
                    break
                b = self._measure(kg, name, t)[0]
                spend(n, b)
                total += b - old * n / old_n
                done += 1
            self._measure_at = at + done
        if len(measured) > 2 * sum(len(tables) for tables in self.groups.values()) + 64:
            live = {(kg, name) for kg, tables in self.groups.items() for name in tables}
            for k in [k for k in measured if k not in live]:
                del measured[k]
        return int(total)

    def num_keys(self) -> int:
        return sum(len(t) for tables in self.groups.values() for t in tables.values())


# ---------------------------------------------------------------- deltas

_DELTA_TAG = "reflow-kg-delta/1"


def _decode_delta(delta: bytes) -> tuple[int, list[Any], list[Any]]:
    dec = unpack_exact(delta)
    if not (isinstance(dec, list) and len(dec) == 4 and dec[0] == _DELTA_TAG):
        raise ValueError("bytes are not a key-group delta (snapshot_delta); a full snapshot?")
    return int(dec[1]), dec[2], dec[3]


def delta_base_version(delta: bytes) -> int:
    """The version a delta applies to: the group's version when it was encoded."""
    return _decode_delta(delta)[0]


def apply_delta(base: bytes, delta: bytes) -> bytes:
    """The group's full snapshot after applying ``delta`` to ``base``.

    ``base`` must be the group's snapshot at the ``mark_replicated`` whose version the delta
    carries (``delta_base_version``); the caller checks that. The result decodes equal to
    the owner's ``snapshot`` at the time the delta was encoded (as tables and timer set;
    the order of keys inside a table may differ)."""
    _, entries, timers = _decode_delta(delta)
    tables, _ = decode_group(base)
    t: dict[Any, Any] | None
    for key, present in entries:
        for t in tables.values():
            t.pop(key, None)
        for name, value in present:
            t = tables.get(name)
            if t is None:
                t = tables[name] = {}
            t[key] = value
    return encode_group(tables, [(int(at), k, int(d)) for at, k, d in timers])


def decode_snapshot(data: bytes) -> tuple[dict[str, dict[Any, Any]], set[tuple[int, Any, int]]]:
    """A snapshot as ``({table: {key: value}}, timer set)``, empty tables left out: the
    form in which two snapshots of one group compare equal."""
    tables, timers = decode_group(data)
    return (
        {name: t for name, t in tables.items() if t},
        {(int(t), k, int(d)) for t, k, d in timers},
    )


# ---------------------------------------------------------------- key-group blobs
#
# One key group as bytes, the same format for both backends (engine.state.rocksdb writes
# it too), so a checkpoint or a migrated group installs into either:
#
#   msgpack [GROUP_TAG, [[name, flat, lengths?], ...], [[time, key, domain], ...]]
#
# ``flat`` is the table as one array ``[key1, value1, key2, value2, ...]`` (exact codec),
# so the in-memory backend encodes a group with one ``pack_exact`` and decodes it with one
# ``unpack_exact`` plus ``dict(zip(it, it))``: no per-entry tuple (a tuple goes through the
# codec's extension hook, in Python, which made the old ``list(t.items())`` format 10-40x
# slower on small entries) and no map (msgpack interns every str map key). Because msgpack
# is concatenative, the RocksDB backend writes ``flat`` by splicing its stored key and value
# bytes, and adds ``lengths`` (bin: little-endian uint32 per key and value) so that it reads
# its own blobs back by slicing, without decoding; a reader that decodes ignores it.
# Timers are sorted by ``repr``, so a backend encodes the same state to the same bytes.
# The two backends' blobs of one group differ in bytes (lengths, table order) and decode
# equal (``decode_snapshot``).
# The old format (``[[[name, [[k, v], ...]], ...], timers]``, checkpoints written before
# this one) still decodes.

GROUP_TAG = "reflow-kg/2"


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic GC while a group is encoded or decoded: it allocates millions of objects
    and no cycles, and each allocation burst would otherwise run collections over the
    task's whole heap (its other state); measured 2x on small entries."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def encode_group(tables: Mapping[str, Table], timers: Iterable[tuple[int, Any, int]]) -> bytes:
    """A key group's blob from its tables (empty ones left out) and timers."""
    chain = itertools.chain.from_iterable
    with _gc_paused():
        return pack_exact([
            GROUP_TAG,
            [[name, list(chain(t.items()))] for name, t in tables.items() if t],
            sorted(timers, key=repr),
        ])


def decode_group(data: bytes) -> tuple[dict[str, dict[Any, Any]], list[Any]]:
    """A key group's tables (``{name: {key: value}}``) and timers (``[time, key, domain]``
    lists) from a blob of either backend, or of the format before it."""
    with _gc_paused():
        return _decode_group(data)


def _decode_group(data: bytes) -> tuple[dict[str, dict[Any, Any]], list[Any]]:
    dec = unpack_exact(data)
    if isinstance(dec, list) and len(dec) == 3 and dec[0] == GROUP_TAG:
        tables: dict[str, dict[Any, Any]] = {}
        for entry in dec[1]:
            it = iter(entry[1])
            tables[entry[0]] = dict(zip(it, it, strict=True))
        return tables, dec[2]
    if isinstance(dec, list) and len(dec) == 2 and isinstance(dec[0], list):
        return {name: dict(items) for name, items in dec[0]}, dec[1]
    raise CodecError("bytes are not a key-group snapshot (encode_group)")


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

    def _map(self) -> dict[Any, Any] | None:
        return self._b.table(self._name).get(self._b.current_key)

    def _made_map(self) -> dict[Any, Any]:
        """The current key's map, made empty when it has none."""
        t = self._b.table(self._name)
        m = t.get(self._b.current_key)
        if m is None:
            m = t[self._b.current_key] = {}
        return m

    def get(self, key: Any, default: Any = None) -> Any:
        m = self._map()
        return default if m is None else m.get(key, default)

    def put(self, key: Any, value: Any) -> None:
        self._made_map()[key] = value

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
