"""The RocksDB backend's timers, kept in its RocksDB: a priority queue per key group and
time domain with a small cache of its earliest timers (Flink's
``KeyGroupPartitionedPriorityQueue`` over ``RocksDBCachingPriorityQueueSet``s).

Why: the in-memory backend holds every timer in a set plus a heap entry; a job with a
timer per key then holds its keys' timers in memory, which a backend meant for state
larger than memory cannot. Here a timer is one RocksDB key and memory holds only caches.

Layout (in the backend's DB, inside the key group's range, so a group's timers are cut
out, dropped and installed with its tables)::

    key   = key group (2 bytes, big-endian) | domain id (8 bytes) | time | pack_exact(timer key)
    value = b""

``time`` is the timer's time as 8 bytes big-endian with the sign bit flipped, so the keys
of one group and domain sort by ``(time, encoded timer key)``; the domain id is the
BLAKE2b id (``engine.state.rocksdb``) of a reserved name per time domain, so each domain
is its own contiguous queue, as Flink keeps one queue per domain.

Per (group, domain) a ``_Queue`` caches the queue's first entries as a sorted list of
``(time, encoded key)``, at most ``cache_entries`` of them and about ``queue_bytes``
(both from ``cache_bytes`` over ``2 * num_key_groups`` queues, so the caches together stay
within ``cache_bytes`` whichever groups a task owns); ``complete`` says that the store
holds nothing beyond the cache. Registering a timer is one put, deleting one one delete
(no read: within the cached prefix the cache says whether the timer exists, beyond it
both are idempotent), and both keep the cache the store's exact prefix; a cache emptied
while the store holds more is refilled by one range scan, which starts at the last timer
taken out (the fired timers before it are tombstones a scan would step over). With
incremental checkpoints on, a timer registered again beyond the cache is recorded as
changed once more (its delta then says it exists, which it does).
Per domain a heap over the groups' heads (``(time, key group, encoded key)``, stale
entries skipped and the heap rebuilt when they outnumber the queues) gives the next timer.

Order: timers fire by time, equal times by key group (as on the in-memory backend), and
within one group and time by the timer key's encoding (the in-memory backend: in the
order they were pushed on its heap; neither is a documented guarantee).

Parked timers: a timer popped and put back with ``backend.timers[kg].add(entry)`` (the
operators hold the timers of a group that is not yet active during a DRRS rescale) exists
(it is in the group's snapshots) but does not fire until ``unpark`` (the backend's
``_push_timer``), as on the in-memory backend, where it is in the group's set and not on
its heap. They stay in memory, as the operators' ``held`` lists do.
"""

from __future__ import annotations

import heapq
import struct
from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import rocksdict as rd

from engine.wire.codec import unpack_exact

if TYPE_CHECKING:
    from engine.state.rocksdb import RocksDBKeyedStateBackend

__all__ = ["TIMER_NAMES", "TimerQueues"]

#: reserved state names whose ids prefix the timers' queues, by time domain
#: (PROCESSING_TIME = 0, EVENT_TIME = 1); no table may have them
TIMER_NAMES = ("\x00reflow/timers/processing", "\x00reflow/timers/event")
_TIME = struct.Struct(">Q")
_OFFSET = 1 << 63
_HEAD = 2 + 8  # key group and domain id
_KEY_AT = _HEAD + _TIME.size
#: what a cached entry costs beyond its key's bytes (the tuple, the int, the bytes object,
#: the list slot)
ENTRY_BYTES = 150
#: the most entries one queue caches (Flink caches 128 per key group)
MAX_CACHED = 128

Entry = tuple[int, bytes]  # (time, encoded timer key)
Timer = tuple[int, Any, int]  # (time, timer key, domain), as the in-memory backend's sets


class _Queue:
    """The timers of one key group and domain: the store's key range and its cached first
    entries (module doc)."""

    __slots__ = ("cache", "complete", "domain", "key_group", "nbytes", "prefix", "pushed")

    def __init__(self, key_group: int, domain: int, prefix: bytes) -> None:
        self.key_group = key_group
        self.domain = domain
        self.prefix = prefix
        self.cache: list[Entry] = []
        self.nbytes = 0
        self.complete = True
        self.pushed: Entry | None = None  # the head last pushed on the domain's heap


class TimerQueues:
    """Every timer of one RocksDB backend (module doc). The backend checks ownership and
    records changes for checkpoints; this keeps the store, the caches and the heaps."""

    def __init__(self, backend: RocksDBKeyedStateBackend, num_key_groups: int,
                 cache_bytes: int, domain_ids: tuple[bytes, bytes],
                 pack: Callable[[Any], bytes]) -> None:
        self._b = backend
        self._pack = pack  # ``pack_exact``, as the tables' keys are encoded
        self._ids = domain_ids
        per_queue = max(cache_bytes // (2 * num_key_groups), 1)
        self.queue_bytes = per_queue
        self.cache_entries = max(1, min(MAX_CACHED, per_queue // ENTRY_BYTES))
        self._queues: dict[tuple[int, int], _Queue] = {}
        self._heaps: tuple[list[tuple[int, int, bytes]], ...] = ([], [])
        self.parked: dict[int, set[Timer]] = {}

    # -- keys
    def _prefix(self, key_group: int, domain: int) -> bytes:
        return key_group.to_bytes(2, "big") + self._ids[domain]

    def _time(self, t: int) -> bytes:
        try:
            return _TIME.pack(t + _OFFSET)
        except struct.error:
            raise self._b._error(f"timer time {t} is outside the 64-bit range the RocksDB "
                                 "backend stores") from None

    def _full(self, q: _Queue, e: Entry) -> bytes:
        return q.prefix + self._time(e[0]) + e[1]

    # -- queues
    def queue(self, key_group: int, domain: int) -> _Queue:
        q = self._queues.get((key_group, domain))
        if q is None:
            q = self._queues[(key_group, domain)] = _Queue(
                key_group, domain, self._prefix(key_group, domain))
            self._load(q)
            self._push_head(q)
        return q

    def _load(self, q: _Queue, after: Entry | None = None) -> None:
        """Fill the cache with the queue's first entries from the store (one scan), from
        ``after`` when every entry is known to be above it: the timers fired before
        are tombstones at the range's start, and a scan from there would step over every
        one of them at each refill (Flink's seek hint)."""
        ro = rd.ReadOptions()
        ro.set_iterate_upper_bound(_successor(q.prefix))
        cache: list[Entry] = []
        nbytes = 0
        complete = True
        limit, cap = self.cache_entries, self.queue_bytes
        with self._b._io("reading timers"):
            it: Iterator[bytes] = self._b.db.keys(  # type: ignore[assignment]  # raw mode
                from_key=q.prefix if after is None else self._full(q, after), read_opt=ro)
            start = q.prefix if after is None else self._full(q, after)
            last: bytes | None = None
            for k in it:
                if len(cache) >= limit or nbytes >= cap:
                    complete = False
                    break
                last = k
                kb = k[_KEY_AT:]
                cache.append((_TIME.unpack_from(k, _HEAD)[0] - _OFFSET, kb))
                nbytes += ENTRY_BYTES + len(kb)
            del it  # before ``ro``: the iterator reads its upper bound
            if complete:  # the scan's end, or an error (``_scan_ended``)
                self._b._scan_ended(start, _successor(q.prefix), last)
        q.cache, q.nbytes, q.complete = cache, nbytes, complete

    def _push_head(self, q: _Queue) -> None:
        head = q.cache[0] if q.cache else None
        if head == q.pushed:
            return
        q.pushed = head
        if head is not None:
            heap = self._heaps[q.domain]
            heapq.heappush(heap, (head[0], q.key_group, head[1]))
            if len(heap) > 2 * len(self._queues) + 64:
                self._rebuild(q.domain)

    def _rebuild(self, domain: int) -> None:
        """The heap anew from the heads (stale entries outnumbered the queues)."""
        heap = [(q.cache[0][0], q.key_group, q.cache[0][1])
                for q in self._queues.values() if q.domain == domain and q.cache]
        heapq.heapify(heap)
        self._heaps[domain][:] = heap

    def _has(self, q: _Queue, e: Entry) -> bool:
        c = q.cache
        if q.complete or (c and e <= c[-1]):
            i = bisect_left(c, e)
            return i < len(c) and c[i] == e
        full = self._full(q, e)
        try:  # not ``_io``: a context manager costs as much as the read
            return self._b._db.get(full) is not None  # type: ignore[union-attr]
        except Exception as exc:
            raise self._b._failed("reading timers", exc) from exc

    def _insert(self, q: _Queue, e: Entry) -> None:
        """Store a timer not in the cache, keeping the cache the store's prefix."""
        full = self._full(q, e)
        try:
            self._b._db.put(full, b"", self._b._wo)  # type: ignore[union-attr]
        except Exception as exc:
            raise self._b._failed("writing timers", exc) from exc
        c = q.cache
        if not q.complete and not (c and e < c[-1]):
            return  # beyond the cached prefix: the store alone has it
        insort(c, e)
        q.nbytes += ENTRY_BYTES + len(e[1])
        while len(c) > 1 and (len(c) > self.cache_entries or q.nbytes > self.queue_bytes):
            q.nbytes -= ENTRY_BYTES + len(c.pop()[1])
            q.complete = False
        self._push_head(q)

    def _remove(self, q: _Queue, e: Entry) -> None:
        """Delete a timer (that exists, or lies beyond the cached prefix)."""
        full = self._full(q, e)
        try:
            self._b._db.delete(full, self._b._wo)  # type: ignore[union-attr]
        except Exception as exc:
            raise self._b._failed("writing timers", exc) from exc
        c = q.cache
        if q.complete or (c and e <= c[-1]):
            i = bisect_left(c, e)
            if i < len(c) and c[i] == e:
                del c[i]
                q.nbytes -= ENTRY_BYTES + len(e[1])
        if not c and not q.complete:  # the cache was the store's prefix: the rest is above e
            self._load(q, e)
        self._push_head(q)

    # -- the backend's operations
    def add(self, key_group: int, timer: Timer) -> bool:
        """Register ``timer`` of ``key_group``; False when it is known to exist (parked,
        or cached). Beyond the cached prefix the put is blind (idempotent): no read."""
        parked = self.parked.get(key_group)
        if parked and timer in parked:
            return False
        q = self.queue(key_group, timer[2])
        e = (timer[0], self._pack(timer[1]))
        c = q.cache
        if q.complete or (c and e <= c[-1]):
            i = bisect_left(c, e)
            if i < len(c) and c[i] == e:
                return False
        self._insert(q, e)
        return True

    def delete(self, key_group: int, timer: Timer) -> bool:
        """Delete ``timer`` of ``key_group``; False when it is known not to exist. Beyond
        the cached prefix the delete is blind: no read."""
        parked = self.parked.get(key_group)
        if parked and timer in parked:
            parked.discard(timer)
            return True
        q = self.queue(key_group, timer[2])
        e = (timer[0], self._pack(timer[1]))
        c = q.cache
        if q.complete or (c and e <= c[-1]):
            i = bisect_left(c, e)
            if i >= len(c) or c[i] != e:
                return False
        self._remove(q, e)
        return True

    def contains(self, key_group: int, timer: Timer) -> bool:
        parked = self.parked.get(key_group)
        if parked and timer in parked:
            return True
        return self._has(self.queue(key_group, timer[2]), (timer[0], self._pack(timer[1])))

    def park(self, key_group: int, timer: Timer) -> None:
        """``timer`` exists but does not fire until ``unpark`` (no-op when it exists)."""
        if not self.contains(key_group, timer):
            self.parked.setdefault(key_group, set()).add(timer)

    def unpark(self, key_group: int, timer: Timer) -> None:
        """A parked timer goes back in its queue (no-op for any other)."""
        parked = self.parked.get(key_group)
        if parked and timer in parked:
            parked.discard(timer)
            self.add(key_group, timer)

    def next_time(self, domain: int) -> int | None:
        top = self._top(domain)
        return None if top is None else top[0]

    def _top(self, domain: int) -> tuple[int, int, bytes] | None:
        heap = self._heaps[domain]
        queues = self._queues
        while heap:
            t, kg, kb = heap[0]
            q = queues.get((kg, domain))
            if q is not None and q.cache:
                head = q.cache[0]
                if head[0] == t and head[1] == kb:
                    return heap[0]
            heapq.heappop(heap)
        return None

    def pop_due(self, now_ms: int, domain: int) -> Iterator[tuple[int, int, Any]]:
        """Remove and yield ``(time, key group, key)`` of every timer of ``domain`` due at
        ``now_ms``, in order (timers registered meanwhile fire too when due)."""
        heap = self._heaps[domain]
        while True:
            top = self._top(domain)
            if top is None or top[0] > now_ms:
                return
            heapq.heappop(heap)
            t, kg, kb = top
            self._remove(self._queues[(kg, domain)], (t, kb))
            yield t, kg, unpack_exact(kb)

    def entries(self, key_group: int) -> list[Timer]:
        """Every timer of the group (both domains, parked ones too), from the store."""
        out: list[Timer] = []
        for domain in (0, 1):
            prefix = self._prefix(key_group, domain)
            for k in self._b._scan_keys(prefix, _successor(prefix)):
                out.append((_TIME.unpack_from(k, _HEAD)[0] - _OFFSET,
                            unpack_exact(k[_KEY_AT:]), domain))
        out.extend(self.parked.get(key_group, ()))
        return out

    def count(self, key_group: int) -> int:
        n = len(self.parked.get(key_group, ()))
        for domain in (0, 1):
            prefix = self._prefix(key_group, domain)
            n += sum(1 for _ in self._b._scan_keys(prefix, _successor(prefix)))
        return n

    def write(self, batch: rd.WriteBatch, key_group: int, timers: Iterable[Timer]) -> None:
        """Put ``timers`` in ``batch`` (an install; ``reset`` the group once written)."""
        prefixes = (self._prefix(key_group, 0), self._prefix(key_group, 1))
        for t, key, domain in timers:
            batch.put(prefixes[domain] + self._time(t) + self._pack(key), b"")

    def reset(self, key_group: int) -> None:
        """The group's timers were replaced in the store (installed): reload its queues."""
        self.drop(key_group)
        self.queue(key_group, 0)
        self.queue(key_group, 1)

    def drop(self, key_group: int) -> None:
        """Forget the group's queues and parked timers (its range was deleted or
        replaced); stale heap entries are skipped when they come up."""
        self._queues.pop((key_group, 0), None)
        self._queues.pop((key_group, 1), None)
        self.parked.pop(key_group, None)

    def clear(self) -> None:
        self._queues.clear()
        self.parked.clear()
        for heap in self._heaps:
            heap.clear()

    def cached_bytes(self) -> int:
        """What the caches hold now (at most about ``2 * num_key_groups *
        queue_bytes``), parked timers not counted."""
        return sum(q.nbytes for q in self._queues.values())


def _successor(prefix: bytes) -> bytes:
    return (int.from_bytes(prefix, "big") + 1).to_bytes(len(prefix), "big")

