"""Incremental checkpoints of keyed state: the delta blob, chains of blobs, and the task's
record of the chains it wrote.

Why: a full checkpoint writes every key group whole, so with 1 % of the keys updated per
interval it writes 100 % of the state each time. With ``JobConfig.incremental_checkpoints``
each backend records, per key group, the keys made current or written since the last
incremental snapshot (``KeyedStateBackend.enable_incremental``, ``take_changes``) and a
checkpoint writes per group either a full blob (``engine.state.keyed.encode_group``) or a
*delta* of those keys. A group's state in a checkpoint is then a *chain*: its last full
blob (the base) and the deltas written after it, oldest first, in the files of earlier
checkpoints (``engine.checkpoints.shared`` keeps them while a retained checkpoint refers
to them). ``merge_chain`` turns a chain back into one full blob, which either backend
installs as it installs any other.

Format of a delta blob (msgpack, concatenative like the group blob)::

    [DELTA_TAG,
     keys,             flat array of the changed keys [k1, k2, ...] (exact codec)
     key_lengths,      bin: little-endian uint32 per key's encoding, or nil
     tables,           [[name, [k1, v1, k2, v2, ...], lengths?], ...]  as in a group blob
     timers_set,       [[time, key, domain], ...]  timers that exist now
     timers_unset]     [[time, key, domain], ...]  timers that no longer exist

Applying a delta to a group: every key of ``keys`` leaves every table (a tombstone), then
each table's entries are put, then the timers set and unset. So a delta holds the changed
keys' whole current state (a key absent from a table is absent there), and a delta taken
over a superset of the changed keys is still exact: applying one is idempotent. The RocksDB
backend writes the entries as the stored bytes with their lengths, the in-memory backend
with one ``pack_exact``; ``merge_chain`` works on the entries' bytes (a dict of key bytes to
value bytes per table, no entry decoded) when the base carries lengths (RocksDB), and on
decoded tables otherwise (an in-memory blob decodes with one ``unpack_exact``).

Guarantees: ``merge_chain(base, *deltas)`` decodes equal (``decode_snapshot``) to the
group's full snapshot at the last delta; a chain whose first blob is not a full blob, or a
later one not a delta, raises ``CodecError``. ``ChainRecord`` never lets a group's delta
refer to a chain the task cannot vouch for: a group installed, removed or owned anew since
(``whole``), or any checkpoint aborted since, gets a full blob next.
"""

from __future__ import annotations

import itertools
import sys
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack

from engine.errors import CodecError
from engine.state.keyed import GROUP_TAG, _gc_paused, decode_group, encode_group
from engine.wire.codec import pack_exact, unpack_exact

DELTA_TAG = "reflow-kg-ckpt-delta/1"
#: a group's chain holds at most this many deltas; the next change writes a full blob
MAX_DELTA_CHAIN = 8
#: ... and a full blob too once its deltas' bytes would exceed this fraction of the base's
MAX_DELTA_FRACTION = 0.5
#: ... unless they stay below this many bytes: a group that small costs as much to write
#: whole, and the chain's length still bounds what a restore reads
MIN_DELTA_BYTES = 4096

Timer = tuple[int, Any, int]
_GROUP_TAG = pack_exact(GROUP_TAG)
_DELTA_TAG = pack_exact(DELTA_TAG)


# ---------------------------------------------------------------- byte helpers


def array_header(n: int) -> bytes:
    """The msgpack header of an array of ``n`` items."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def lengths_bytes(raw: Sequence[bytes]) -> bytes:
    """Little-endian uint32 per item's length."""
    a = array("I", map(len, raw))
    if sys.byteorder == "big":
        a.byteswap()
    return a.tobytes()


def lengths_of(data: bytes) -> array[int]:
    """The lengths ``lengths_bytes`` wrote."""
    a = array("I")
    a.frombytes(data)
    if sys.byteorder == "big":
        a.byteswap()
    return a


def _cut(data: bytes, head: int, end: int, lengths: bytes | None) -> list[bytes]:
    """The flat array encoded in ``data[head:end]`` as each item's encoding: sliced by
    ``lengths`` when given, else cut at object boundaries (no item decoded)."""
    first = data[head]
    start = head + (1 if first & 0xF0 == 0x90 else 3 if first == 0xDC else 5)
    count = (first & 0x0F if first & 0xF0 == 0x90
             else int.from_bytes(data[head + 1:start], "big"))
    if lengths is not None:
        offsets = list(itertools.accumulate(lengths_of(lengths), initial=start))
        if offsets[-1] != end or len(offsets) != count + 1:
            raise CodecError("key-group blob: the lengths do not match the entries")
        return list(map(data.__getitem__, map(slice, offsets[:-1], offsets[1:])))
    u = _unpacker(data[start:end])
    raw: list[bytes] = []
    at = start
    skip, tell = u.skip, u.tell
    for _ in range(count):
        skip()
        nxt = start + tell()
        raw.append(data[at:nxt])
        at = nxt
    return raw


def _flat_with_lengths(u: msgpack.Unpacker, data: bytes, has_lengths: bool
                       ) -> tuple[list[bytes], bool]:
    """The next item of ``u`` (a flat array, followed by its lengths when
    ``has_lengths``) cut into items; and whether lengths were there."""
    head = u.tell()
    u.skip()
    end = u.tell()
    lengths = u.unpack() if has_lengths else None
    return _cut(data, head, end, lengths), lengths is not None


def _tables(u: msgpack.Unpacker, data: bytes) -> tuple[list[tuple[str, list[bytes]]], bool]:
    """A blob's tables as ``[(name, [key, value, ...] bytes)]``, and whether every table
    carried lengths (a RocksDB blob)."""
    out: list[tuple[str, list[bytes]]] = []
    with_lengths = True
    for _ in range(u.read_array_header()):
        fields = u.read_array_header()
        name = u.unpack()
        raw, had = _flat_with_lengths(u, data, fields == 3)
        with_lengths = with_lengths and had
        out.append((name, raw))
    return out, with_lengths


def _unpacker(data: bytes) -> msgpack.Unpacker:
    u = msgpack.Unpacker(max_buffer_size=max(len(data), 1024), strict_map_key=False)
    u.feed(data)
    return u


@dataclass
class _Split:
    tables: list[tuple[str, list[bytes]]]
    timers: list[Any]
    with_lengths: bool
    keys: list[bytes] = field(default_factory=list)
    unset: list[Any] = field(default_factory=list)


def _split(data: bytes, delta: bool) -> _Split:
    """A full blob (``delta`` False) or a delta blob, cut into entry bytes."""
    u = _unpacker(data)
    try:
        n = u.read_array_header()
        tag = u.unpack()
        if delta:
            if n != 6 or tag != DELTA_TAG:
                raise CodecError("a chain's later blob is not a delta blob")
            head = u.tell()
            u.skip()
            end = u.tell()
            keys = _cut(data, head, end, u.unpack())
            tables, with_lengths = _tables(u, data)
            timers, unset = unpack_exact(b"\x92" + data[u.tell():])
            return _Split(tables, timers, with_lengths, keys, unset)
        if n != 3 or tag != GROUP_TAG:
            raise CodecError("a chain's first blob is not a key-group blob")
        tables, with_lengths = _tables(u, data)
        return _Split(tables, unpack_exact(data[u.tell():]), with_lengths)
    except CodecError:
        raise
    except Exception as exc:
        raise CodecError(f"bytes are not a key-group blob: {exc}") from exc


def _has_lengths(data: bytes) -> bool:
    """Whether a full blob's first table carries lengths (a RocksDB blob; one without
    tables: True). Reads the headers only."""
    u = _unpacker(data[:4096])
    try:
        u.read_array_header()
        u.skip()
        if not u.read_array_header():
            return True
        return bool(u.read_array_header() == 3)
    except Exception:  # noqa: BLE001 - not a blob: _split says why
        return True


# ---------------------------------------------------------------- deltas


def encode_delta(keys: Iterable[Any], tables: Mapping[str, Mapping[Any, Any]],
                 timers_set: Iterable[Timer], timers_unset: Iterable[Timer]) -> bytes:
    """A delta blob from decoded state (the in-memory backend): ``keys`` changed, and for
    each table the entries of those keys it holds now."""
    keys = list(keys)
    parts = []
    for name, t in tables.items():
        flat: list[Any] = []
        for k in keys:
            if k in t:
                flat += (k, t[k])
        if flat:
            parts.append([name, flat])
    with _gc_paused():
        return pack_exact([DELTA_TAG, keys, None, parts, sorted(timers_set, key=repr),
                           sorted(timers_unset, key=repr)])


def encode_delta_raw(keys: Sequence[bytes], tables: Sequence[tuple[str, list[bytes]]],
                     timers_set: Iterable[Timer], timers_unset: Iterable[Timer]) -> bytes:
    """A delta blob spliced from entry bytes (the RocksDB backend): ``keys`` the changed
    keys' encodings, ``tables`` ``[(name, [key, value, ...] bytes)]`` the entries held now."""
    parts: list[bytes] = [b"\x96", _DELTA_TAG, array_header(len(keys)), *keys,
                          pack_exact(lengths_bytes(keys))]
    live = [(name, raw) for name, raw in tables if raw]
    parts.append(array_header(len(live)))
    for name, raw in live:
        parts += (b"\x93", pack_exact(name), array_header(len(raw)), *raw,
                  pack_exact(lengths_bytes(raw)))
    parts += (pack_exact(sorted(timers_set, key=repr)),
              pack_exact(sorted(timers_unset, key=repr)))
    return b"".join(parts)


def is_delta(data: bytes) -> bool:
    """Whether ``data`` is a delta blob (else: a full key-group blob, or not a blob)."""
    return data[1:1 + len(_DELTA_TAG)] == _DELTA_TAG and data[:1] == b"\x96"


def _timer_set(timers: Iterable[Any]) -> set[Timer]:
    return {(int(t), k, int(d)) for t, k, d in timers}


def merge_chain(blobs: Sequence[bytes]) -> bytes:
    """The full key-group blob of a chain: ``blobs[0]`` a full blob, the rest deltas,
    oldest first (``CodecError`` otherwise). One blob is returned as it is."""
    if not blobs:
        raise CodecError("an empty chain of key-group blobs")
    if len(blobs) == 1:
        if is_delta(blobs[0]):
            raise CodecError("a chain's first blob is not a key-group blob")
        return blobs[0]
    with _gc_paused():
        if not _has_lengths(blobs[0]):
            return _merge_decoded(blobs)
        base = _split(blobs[0], delta=False)
        if not base.with_lengths:
            return _merge_decoded(blobs)
        dicts: dict[str, dict[bytes, bytes]] = {
            name: dict(zip(raw[0::2], raw[1::2], strict=True)) for name, raw in base.tables}
        timers = _timer_set(base.timers)
        for data in blobs[1:]:
            d = _split(data, delta=True)
            for t in dicts.values():
                pop = t.pop
                for k in d.keys:
                    pop(k, None)
            for name, entries in d.tables:
                dicts.setdefault(name, {}).update(
                    zip(entries[0::2], entries[1::2], strict=True))
            timers -= _timer_set(d.unset)
            timers |= _timer_set(d.timers)
        parts: list[bytes] = []
        n = 0
        for name, t in dicts.items():
            if not t:
                continue
            n += 1
            raw: list[bytes] = [b""] * (2 * len(t))
            raw[0::2] = t.keys()
            raw[1::2] = t.values()
            parts += (b"\x93", pack_exact(name), array_header(len(raw)), *raw,
                      pack_exact(lengths_bytes(raw)))
        return b"".join((b"\x93", _GROUP_TAG, array_header(n), *parts,
                         pack_exact(sorted(timers, key=repr))))


def _merge_decoded(blobs: Sequence[bytes]) -> bytes:
    tables, base_timers = decode_group(blobs[0])
    timers = _timer_set(base_timers)
    for data in blobs[1:]:
        dec = unpack_exact(data)
        if not (isinstance(dec, list) and len(dec) == 6 and dec[0] == DELTA_TAG):
            raise CodecError("a chain's later blob is not a delta blob")
        _, keys, _, parts, tset, tunset = dec
        for t in tables.values():
            for k in keys:
                t.pop(k, None)
        for entry in parts:
            it = iter(entry[1])
            tables.setdefault(entry[0], {}).update(zip(it, it, strict=True))
        timers -= _timer_set(tunset)
        timers |= _timer_set(tset)
    return encode_group(tables, timers)


# ---------------------------------------------------------------- the task's chains


class BlobKind:
    """What a checkpoint holds for one key group: a ``FULL`` blob, a ``DELTA`` on the
    group's chain in the previous complete checkpoint, or nothing new (``UNCHANGED``: the
    previous chain as it is)."""

    FULL = "full"
    DELTA = "delta"
    UNCHANGED = "unchanged"


@dataclass(frozen=True)
class Chain:
    """A group's chain as a task wrote it: its deltas, and the bytes of base and deltas."""

    deltas: int
    base_bytes: int
    delta_bytes: int


@dataclass
class _Pending:
    chains: dict[int, Chain]
    keys: dict[int, set[Any]]
    timers: dict[int, set[Timer]]


class ChainRecord:
    """One task's incremental checkpoints (sans-IO): which chain each key group has in
    the last checkpoint the task knows complete, and what changed since.

    ``plan`` (at a checkpoint's snapshot) says per group what to write; ``completed`` and
    ``aborted`` (the JobMaster's notifications) confirm or forget. Changes taken at a
    checkpoint that is not confirmed yet are kept and go into the next delta too (a delta
    over more keys than changed is exact), so a checkpoint that fails, or whose completion
    the task never hears of, loses nothing; an abort makes every group full next time."""

    def __init__(self, max_deltas: int | None = None,
                 max_fraction: float | None = None) -> None:
        self.max_deltas = MAX_DELTA_CHAIN if max_deltas is None else max_deltas
        self.max_fraction = MAX_DELTA_FRACTION if max_fraction is None else max_fraction
        self.confirmed: dict[int, Chain] = {}
        #: the checkpoint whose chains ``confirmed`` are (-1: none); a delta holds every
        #: change since it (changes of checkpoints taken after it are folded in)
        self.base_checkpoint = -1
        self._pending: dict[int, _Pending] = {}

    def forget(self, key_groups: Iterable[int]) -> None:
        """These groups were installed, removed or owned anew: no chain of theirs holds."""
        for kg in key_groups:
            self.confirmed.pop(kg, None)
            for p in self._pending.values():
                p.chains.pop(kg, None)

    def changes(self, keys: dict[int, set[Any]], timers: dict[int, set[Timer]]
                ) -> tuple[dict[int, set[Any]], dict[int, set[Timer]]]:
        """``keys``/``timers`` changed since the last snapshot, with those of snapshots not
        confirmed yet: what a delta must hold."""
        if not self._pending:
            return keys, timers
        k = {kg: set(s) for kg, s in keys.items()}
        t = {kg: set(s) for kg, s in timers.items()}
        for p in self._pending.values():
            for kg, s in p.keys.items():
                k.setdefault(kg, set()).update(s)
            for kg, s in p.timers.items():
                t.setdefault(kg, set()).update(s)
        return k, t

    def base(self, key_group: int) -> Chain | None:
        """The group's chain in the last checkpoint known complete (None: write it full)."""
        return self.confirmed.get(key_group)

    def accepts(self, chain: Chain, delta_bytes: int) -> bool:
        """Whether a delta of ``delta_bytes`` may go on ``chain`` (else: a full blob)."""
        total = chain.delta_bytes + delta_bytes
        return chain.deltas + 1 <= self.max_deltas and (
            total <= self.max_fraction * chain.base_bytes or total <= MIN_DELTA_BYTES)

    def taken(self, checkpoint_id: int, chains: dict[int, Chain], keys: dict[int, set[Any]],
              timers: dict[int, set[Timer]]) -> None:
        """Checkpoint ``checkpoint_id`` wrote ``chains`` (per group: its chain after it),
        taking these changes (as ``take_changes`` gave them)."""
        self._pending[checkpoint_id] = _Pending(chains, keys, timers)

    def completed(self, checkpoint_id: int, unsure: Iterable[int] = ()) -> None:
        """Checkpoint ``checkpoint_id`` is complete: its chains (and earlier pending ones')
        are the base from now on, except for the groups in ``unsure`` (made whole since)."""
        if checkpoint_id not in self._pending:
            return  # a savepoint, or a checkpoint this task took no incremental part in
        skip = set(unsure)
        for cid in sorted(c for c in self._pending if c <= checkpoint_id):
            p = self._pending.pop(cid)
            self.confirmed.update({kg: c for kg, c in p.chains.items() if kg not in skip})
        self.base_checkpoint = checkpoint_id

    def aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` failed: the JobMaster's chains and ours may differ
        from now on, so every group is written full next time."""
        if checkpoint_id in self._pending:
            self.confirmed.clear()
            self._pending.clear()
            self.base_checkpoint = -1


class _Backend(Protocol):
    """What ``take_incremental`` uses of a keyed state backend (``KeyedStateBackend``)."""

    def owned(self) -> list[int]: ...
    def snapshot(self, key_group: int) -> bytes: ...
    def take_changes(self) -> tuple[dict[int, set[Any]], dict[int, set[Timer]], set[int]]: ...
    def snapshot_changes(self, key_group: int, keys: Iterable[Any],
                         timers: Iterable[Timer]) -> bytes: ...


def take_incremental(b: _Backend, rec: ChainRecord, checkpoint_id: int
                     ) -> tuple[tuple[tuple[int, bytes], ...], tuple[int, ...], tuple[int, ...]]:
    """A task's key groups for incremental checkpoint ``checkpoint_id``: per group a full
    blob (no chain to build on, or the chain would grow too long or its deltas too big), a
    delta of what changed since the last checkpoint known complete, or nothing
    (unchanged). Returns the blobs ``(key group, bytes)``, the delta groups and the
    unchanged groups; ``rec`` records what was taken."""
    keys, timers, whole = b.take_changes()
    rec.forget(whole)
    want_keys, want_timers = rec.changes(keys, timers)
    groups: list[tuple[int, bytes]] = []
    deltas: list[int] = []
    unchanged: list[int] = []
    chains: dict[int, Chain] = {}
    for kg in b.owned():
        base = rec.base(kg)
        k, t = want_keys.get(kg, ()), want_timers.get(kg, ())
        if base is not None and not k and not t:
            unchanged.append(kg)
            chains[kg] = base
            continue
        if base is not None:
            delta = b.snapshot_changes(kg, k, t)
            if rec.accepts(base, len(delta)):
                groups.append((kg, delta))
                deltas.append(kg)
                chains[kg] = Chain(base.deltas + 1, base.base_bytes,
                                   base.delta_bytes + len(delta))
                continue
        full = b.snapshot(kg)
        groups.append((kg, full))
        chains[kg] = Chain(0, len(full), 0)
    rec.taken(checkpoint_id, chains, keys, timers)
    return tuple(groups), tuple(deltas), tuple(unchanged)


__all__ = ["DELTA_TAG", "MAX_DELTA_CHAIN", "MAX_DELTA_FRACTION", "MIN_DELTA_BYTES", "BlobKind", "Chain",
           "ChainRecord", "array_header", "encode_delta", "encode_delta_raw", "is_delta",
           "lengths_bytes", "merge_chain", "take_incremental"]
