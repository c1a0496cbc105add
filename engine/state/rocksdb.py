"""A keyed state backend on RocksDB (``rocksdict``, raw bytes mode): state larger than memory.

Why: ``KeyedStateBackend`` keeps every key in Python dicts, so a task holds at most what its
process's memory holds. This backend keeps the tables in one RocksDB instance per task,
with a bounded block cache and write buffers, and offers the same interface and
observable behaviour (``tests/unit/test_rocksdb_state.py`` runs random operation sequences
against both and compares them). Timers live in the DB too, one key per timer, with a
bounded cache of each group's earliest ones (``engine.state.rocksdb_timers``); change
tracking stays in memory, as in the in-memory backend.

Layout (one DB, in ``<directory>/db``)::

    key   = key group (2 bytes, big-endian) | state name id (8 bytes) | pack_exact(user key)
    value = pack_exact(value)

The name id is the first 8 bytes of the BLAKE2b hash of the state name, so ids are the
same in every task and process (a collision between two names of one task is refused).
Timers are two more "tables" of the group, one per time domain, under reserved names
(``key group | domain id | time | pack_exact(timer key)``, ``engine.state.rocksdb_timers``).
A key group is therefore one contiguous key range, and one table of it a sub-range:
dropping a group is one range delete, cutting it out one range scan. Writes go without the
write-ahead log: the DB is scratch space, checkpoints and migrations carry the state
(``snapshot``), and a backend always starts empty (what a killed task left is deleted).

Key groups move as bytes: ``snapshot(kg)`` splices the stored key and value bytes into
the shared key-group blob format (``engine.state.keyed.encode_group``, which the in-memory
backend decodes with one ``unpack_exact``), adding per-entry lengths; ``install(kg, blob)``
slices those bytes back out and writes them in write batches (no log): no key or value
is decoded. A blob of the in-memory backend (no lengths) is cut at msgpack object
boundaries (``Unpacker.skip``), also without decoding; a blob of the format before
(checkpoints written before it) is decoded and re-encoded.

Checkpoints as files: ``checkpoint_files(tag)`` takes RocksDB's own checkpoint of the
whole DB (SST files hard-linked, a fresh MANIFEST) into ``<directory>/checkpoints/<tag>``
for an SST-level incremental checkpoint (``engine.state.sst_checkpoints``), and
``groups_from_checkpoint`` opens such files read-only and cuts key groups out of them as
blobs, as ``snapshot`` does.

Values read from a table are decoded objects. An object cache in front of RocksDB keeps
them (``object_cache_bytes``, an eighth of the task's state memory from the factory):

* *loans*: every value written, and every mutable value read (anything but int, float,
  str, bytes, bool, None, frozenset: ``ListState.add`` and ``MapState.put`` mutate the value
  in place, and must behave as on dicts), kept as the live object and written back in one
  write batch (``flush()``) before any scan (snapshot, delta, iteration, length) and once
  they exceed the cache's share (``_MAX_LOANS`` entries or the bytes), at the next change
  of the current key (``set_current``), or at four times that share in the middle of a
  key's work (the fast paths below never call ``set_current``), when the current key's
  mutable values stay live (its code may still hold one it read and mutate it);
* *clean* values: immutable values as RocksDB holds them (read, or written back), dropped
  all at once when they exceed their share.

A loan counts towards its share at its encoded size: as read (the stored bytes), or as
written (bytes and str by their length, other scalars at 9 bytes, small tuples by their
items, anything else encoded once). A container lent (list, dict, set, bytearray, which
``ListState.add``, ``MapState.put`` or user code grow in place) is encoded again whenever
its length reaches twice the length it was measured at plus two, checked when it is read
from or assigned to the cache: so it counts at no less than about half its size, and the
measures of a container grown item by item cost at most about twice its final encoding.
Growth nested inside an item (a list inside a dict whose length stays) is seen at the next
write-back only. The current key's growth counts as kept (live, it cannot be freed before
the key's work ends); the next change of key writes it back once the share is exceeded.

Sizes (``estimated_bytes``, ``estimated_group_bytes``): the logical bytes each table
stores, encoded user keys plus encoded values, are counted on every write: a write-back
knows the stored length each loan replaces when the cache read the key, found it
missing, or wrote it back before (``_base``), and reads the rest in one multi-get; range
deletes drop their tables' counts and an install counts the bytes it writes. So the
figure is exact and costs no scan, and equals the in-memory backend's for the same state.

So a hot key costs a dict lookup per access instead of a RocksDB read and write (the
steady-state job was 3-20x slower per record on RocksDB without it). Contract: a value's
mutations persist until it is written back, as with a dict; code that writes tables
without ``set_current`` (the vectorised and window fast paths) assigns (``t[k] = v``) and
never mutates a value it read. A value without a codec therefore fails on write-back
(``CodecError``), not only at the next checkpoint as on the in-memory backend.

Differences from the in-memory backend (the callers that rely on them: see the
``RocksDBKeyedStateBackend`` docstring): ``groups[kg]`` is a mapping view of names to
table views; assigning a table (``groups[kg][name] = d``) copies ``d`` in, so writes to
``d`` afterwards do not reach the backend; ``groups[kg].pop(name)`` returns a dict copy;
``len(table)`` scans; no dense tables (``dense_table`` returns None, so the vectorised
operators use their dict path).

Two backends never open one directory: ``<directory>/reflow.lock`` is held with
``flock`` while the backend is open; errors opening or writing the directory are
``StateBackendError`` naming the path and the task.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import operator
import os
import shutil
import uuid
from collections.abc import (
    Callable,
    ItemsView,
    Iterable,
    Iterator,
    KeysView,
    Mapping,
    MutableMapping,
    MutableSet,
    Sequence,
    ValuesView,
)
from typing import IO, Any, TypeVar

import msgpack
import rocksdict as rd

from engine.errors import CodecError, ReflowError, StateBackendError
from engine.state.backends import LOCK_FILE
from engine.state.incremental import array_header, lengths_bytes, lengths_of
from engine.state.keyed import (
    _DELTA_TAG,
    GROUP_TAG,
    PROCESSING_TIME,
    KeyedStateBackend,
    Table,
    _gc_paused,
    decode_group,
)
from engine.state.rocksdb_timers import TIMER_NAMES, TimerQueues
from engine.state.sst_checkpoints import DbCheckpoint
from engine.wire.codec import pack_exact, unpack_exact

__all__ = ["RocksDBKeyedStateBackend", "groups_from_checkpoint"]

_KG_BYTES = 2
_ID_BYTES = 8
_PREFIX = _KG_BYTES + _ID_BYTES
_V = TypeVar("_V")
_IMMUTABLE: frozenset[type] = frozenset({int, float, str, bytes, bool, type(None), frozenset})
#: mutable containers whose growth in place the object cache follows (by their length)
_GROWS: frozenset[type] = frozenset({list, dict, set, bytearray})
#: loans (dirty or mutable values) beyond which they are written back at the next change of
#: the current key (4x: at once)
_MAX_LOANS = 16384
# an install writes in batches of about this many bytes (bounded memory per write).
# Batches, not an ingested SST file: measured (examples/bench/state_backend.py, 64 MB
# groups) the task's thread spends as long on either (~300-500 MB/s), the SST costs an
# fsync, and the flushed memtable scans ~1.5x faster afterwards than the ingested file
_BATCH_BYTES = 16 << 20
_MISSING = object()
#: what the object cache counts per entry beyond the value's encoded bytes (the dict slot,
#: the key's bytes object)
_ENTRY_BYTES = 100

_GROUP_TAG = pack_exact(GROUP_TAG)

# scalars encode through one reused packer: ``pack_exact`` builds a packer per call, which
# was 0.7 us of every state access (0.15 us this way); the bytes are the same
_PACKER = msgpack.Packer(strict_types=True, use_bin_type=True, autoreset=True)
_SCALARS: frozenset[type] = frozenset({int, str, bytes, float, bool, type(None)})


def _pack(obj: Any, _fast: Any = _PACKER.pack, _scalars: frozenset[type] = _SCALARS) -> bytes:
    """``pack_exact(obj)``, faster for scalars."""
    if type(obj) in _scalars:
        try:
            return _fast(obj)
        except OverflowError:  # an int beyond 64 bits: the codec's extension
            pass
    return pack_exact(obj)


def _encoded_size(value: Any) -> int:
    """About ``len(_pack(value))``, without encoding scalars and small tuples (bytes and
    str at their length plus the largest header, other scalars at 9, the most an int or
    a float takes; a tuple of up to 8 items as its items plus 4); anything else encoded.
    A value without a codec counts as 9 here: it fails where it is written back."""
    t = type(value)
    if t is bytes or t is str:
        return len(value) + 5
    if t in _SCALARS:
        return 9
    if t is tuple and len(value) <= 8:  # (count, payload)-like values: no encode
        return 4 + sum(map(_encoded_size, value))
    try:
        return len(_pack(value))
    except Exception:  # noqa: BLE001 - see above
        return 9


def _name_id(name: str) -> bytes:
    return hashlib.blake2b(name.encode(), digest_size=_ID_BYTES).digest()


def _successor(prefix: bytes) -> bytes:
    """The smallest key above every key starting with ``prefix`` (never all 0xff here:
    key groups are below 0xffff)."""
    return (int.from_bytes(prefix, "big") + 1).to_bytes(len(prefix), "big")


def _interleave(items: list[tuple[bytes, bytes]]) -> list[bytes]:
    """``[(full key, value), ...]`` -> ``[user key, value, ...]`` (C loops only)."""
    raw: list[bytes] = [b""] * (2 * len(items))
    keys = map(operator.itemgetter(0), items)
    raw[0::2] = map(operator.getitem, keys, itertools.repeat(slice(_PREFIX, None)))
    raw[1::2] = map(operator.itemgetter(1), items)
    return raw


class RocksDBKeyedStateBackend(KeyedStateBackend):
    """All keyed state of one task, in RocksDB under ``directory`` (see the module doc).

    Same interface as ``KeyedStateBackend``; ``close()`` releases the DB, the lock and
    (by default) the directory's contents (the directory too with ``owns_directory``). Memory: ``block_cache_bytes`` of block cache
    (index and filter blocks included), at most ``write_buffer_bytes`` of memtables, and
    about ``timer_cache_bytes`` of cached timers (``engine.state.rocksdb_timers``).

    Callers outside ``engine.state`` that create a table through ``groups``
    (``engine.operators.builtin.KeyedRunner._reduce_table``,
    ``engine.operators.vectorised.AggregateRunner._tables``,
    ``engine.operators.window_aggregates``' ``_store``) use
    ``groups[kg].setdefault(name, {})``, which returns the live table here and the dict
    there (``groups[kg][name] = {}`` and then writing to the dict would write nowhere
    here). Reading through ``groups`` (``task.checkpointing.unencodable_state``,
    ``participant``'s ``kg in b.groups``) works unchanged; sizes for planning come from
    ``estimated_group_bytes`` (counts kept on writes, not a scan per ``len(table)``).
    Built per task by ``engine.state.backends.make_keyed_backend`` from ``JobConfig``.
    """

    def __init__(self, num_key_groups: int, directory: str | os.PathLike[str], *,
                 task: str = "", block_cache_bytes: int = 64 << 20,
                 write_buffer_bytes: int = 32 << 20, owns_directory: bool = False,
                 object_cache_bytes: int = 16 << 20,
                 timer_cache_bytes: int = 4 << 20,
                 checkpoint: Mapping[int, Sequence[str]] | None = None) -> None:
        if not 0 < num_key_groups < 1 << (8 * _KG_BYTES):
            raise StateBackendError(f"num_key_groups must be in 1..65535 for the RocksDB "
                                    f"state backend, got {num_key_groups}",
                                    path=os.fspath(directory), task=task)
        super().__init__(num_key_groups)
        self.directory = os.fspath(directory)
        self.task = task
        self.owns_directory = owns_directory
        self._lock: IO[bytes] | None = None
        self._db: rd.Rdict | None = None
        # key group -> {state name: table view}: the names a group holds (a table may be
        # empty, as a dict in the in-memory backend may be)
        self._reg: dict[int, dict[str, _TableView]] = {}
        self.groups = _OwnedGroups(self, self._group)  # type: ignore[assignment]
        self._group_views: dict[int, _GroupView] = {}
        self._ids: dict[str, bytes] = {}
        self._names: dict[bytes, str] = {}
        # the object cache (module doc): loans (to write back) and clean values, by full key
        self._loans: dict[bytes, Any] = {}
        self._loan_bytes = 0
        # per loan, the encoded size it is counted at in _loan_bytes (without _ENTRY_BYTES);
        # per container loan, the length at which it is measured again (twice the last)
        self._loan_size: dict[bytes, int] = {}
        self._grow: dict[bytes, int] = {}
        # full key -> its stored value's length (0: absent), for keys the cache read, wrote
        # back or found missing (what a write-back replaces): every write keeps it true;
        # pruned to the loans' keys when it outgrows the cache (_prune_base)
        self._base: dict[bytes, int] = {}
        # table prefix (key group | name id) -> the logical bytes it stores: encoded user
        # keys plus encoded values, kept on every write (estimated_bytes); no timers
        self._stored: dict[bytes, int] = {}
        self._kept_bytes = 0  # the current key's loans kept live by an in-key flush
        self._clean: dict[bytes, Any] = {}
        self._clean_bytes = 0
        self._cache_bytes = max(object_cache_bytes, 1 << 12)
        # timers: in the DB, under reserved names (refused as table names)
        timer_ids = (_name_id(TIMER_NAMES[0]), _name_id(TIMER_NAMES[1]))
        self._timer_ids = frozenset(timer_ids)
        for name, i in zip(TIMER_NAMES, timer_ids, strict=True):
            self._names[i] = name
        self._tq = TimerQueues(self, num_key_groups, timer_cache_bytes, timer_ids, _pack)
        self.timers = _OwnedGroups(  # type: ignore[assignment]
            self, lambda kg: _GroupTimers(self, kg))
        #: names this DB instance apart from every other, e.g. the task's next one after a
        #: restart (its SST file numbers start again at 1): ``engine.state.sst_checkpoints``
        self.instance = uuid.uuid4().hex[:12]
        self._read_only = checkpoint is not None
        if checkpoint is None:
            self._open(block_cache_bytes, write_buffer_bytes)
        else:
            self._open_checkpoint(checkpoint, block_cache_bytes)

    # -- lifecycle
    def _open(self, block_cache_bytes: int, write_buffer_bytes: int) -> None:
        path = self.directory
        try:
            os.makedirs(path, exist_ok=True)
            lock = open(os.path.join(path, LOCK_FILE), "ab")  # noqa: SIM115 - held while open
        except OSError as exc:
            raise self._error(f"cannot create the state directory ({exc.strerror or exc}); "
                              "give the task a writable directory") from exc
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            lock.close()
            raise self._error("the state directory is locked by another open state backend "
                              "(another task, or this task not closed); give each task its "
                              "own directory") from exc
        self._lock = lock
        try:
            lock.truncate(0)
            lock.write(f"{os.getpid()} {self.task}\n".encode())
            lock.flush()
            # what a killed task left: state restarts empty, its DB checkpoints go too
            shutil.rmtree(os.path.join(path, "db"), ignore_errors=True)
            shutil.rmtree(os.path.join(path, "checkpoints"), ignore_errors=True)
            self._db = rd.Rdict(os.path.join(path, "db"),
                                self._options(block_cache_bytes, write_buffer_bytes))
        except Exception as exc:
            self._release()
            raise self._error(f"cannot open RocksDB in the state directory: {exc}") from exc
        wo = rd.WriteOptions()
        wo.disable_wal = True  # type: ignore[method-assign,assignment]  # a property; the stub says method
        self._db.set_write_options(wo)
        self._wo = wo

    def _open_checkpoint(self, groups: Mapping[int, Sequence[str]],
                         block_cache_bytes: int) -> None:
        """Open ``directory``, a checkpoint of a backend's DB (``checkpoint_files``),
        read-only and unlocked, holding ``groups`` with those table names."""
        try:
            self._db = rd.Rdict(self.directory, self._options(block_cache_bytes, 1 << 20),
                                access_type=rd.AccessType.read_only())
        except Exception as exc:
            raise self._error(f"cannot open the checkpointed RocksDB files: {exc}") from exc
        for kg, names in groups.items():
            self._reg[kg] = {name: _TableView(self, kg, name) for name in names}

    @staticmethod
    def _options(block_cache_bytes: int, write_buffer_bytes: int) -> rd.Options:
        opts = rd.Options(raw_mode=True)
        opts.create_if_missing(True)
        table = rd.BlockBasedOptions()
        table.set_block_cache(rd.Cache(block_cache_bytes))
        table.set_cache_index_and_filter_blocks(True)
        table.set_bloom_filter(10, False)
        table.set_block_size(16 << 10)  # key-group scans read whole ranges
        opts.set_block_based_table_factory(table)
        opts.set_write_buffer_size(max(write_buffer_bytes // 2, 1 << 20))
        opts.set_max_write_buffer_number(2)
        opts.set_db_write_buffer_size(write_buffer_bytes)
        opts.set_compression_type(rd.DBCompressionType.lz4())
        opts.set_max_background_jobs(2)
        return opts

    def _error(self, what: str) -> StateBackendError:
        return StateBackendError(f"task {self.task or '?'}: state directory {self.directory}: "
                                 f"{what}", path=self.directory, task=self.task)

    @contextlib.contextmanager
    def _io(self, doing: str) -> Iterator[None]:
        """RocksDB failures (disk full, I/O errors) as ``StateBackendError``."""
        try:
            yield
        except ReflowError:
            raise
        except Exception as exc:
            raise self._failed(doing, exc) from exc

    def _failed(self, doing: str, exc: Exception) -> StateBackendError:
        if self._db is None:
            return self._error("the state backend is closed")
        return self._error(f"{doing} failed: {exc}")

    @property
    def db(self) -> rd.Rdict:
        if self._db is None:
            raise self._error("the state backend is closed")
        return self._db

    def close(self, remove_files: bool = True) -> None:
        """Close the DB and release the directory's lock; ``remove_files`` deletes the DB
        (state is scratch: checkpoints hold what must survive), and the directory itself
        when the backend was given it for itself (``owns_directory``: the factory
        ``engine.state.backends.make_keyed_backend`` makes one per task). Idempotent."""
        self._loans.clear()
        self._loan_size.clear()
        self._grow.clear()
        self._base.clear()
        self._stored.clear()
        self._clean.clear()
        self._tq.clear()
        if self._read_only:  # a checkpoint's files: the reader's to keep or delete
            remove_files = False
        if self._db is not None:
            with contextlib.suppress(Exception):
                self._db.close()
            self._db = None
            if remove_files:
                shutil.rmtree(os.path.join(self.directory, "db"), ignore_errors=True)
                shutil.rmtree(os.path.join(self.directory, "checkpoints"), ignore_errors=True)
        self._release()
        if remove_files and self.owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def _release(self) -> None:
        if self._lock is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock.fileno(), fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def __enter__(self) -> RocksDBKeyedStateBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- names and views
    def _id(self, name: str) -> bytes:
        i = self._ids.get(name)
        if i is None:
            if name in TIMER_NAMES:
                raise StateBackendError(f"state name {name!r} is reserved for timers",
                                        path=self.directory, task=self.task)
            i = _name_id(name)
            other = self._names.get(i)
            if other is not None and other != name:
                raise StateBackendError(f"state names {other!r} and {name!r} hash to one id; "
                                        "rename one", path=self.directory, task=self.task)
            self._ids[name] = i
            self._names[i] = name
        return i

    def _view(self, key_group: int, name: str) -> _TableView:
        """The table view of ``name`` in ``key_group``, registered (created) when missing."""
        reg = self._reg[key_group]
        v = reg.get(name)
        if v is None:
            v = reg[name] = _TableView(self, key_group, name)
        return v

    def _group(self, key_group: int) -> _GroupView:
        g = self._group_views.get(key_group)
        if g is None:
            g = self._group_views[key_group] = _GroupView(self, key_group)
        return g

    # -- ownership and the current key
    def own(self, key_group: int) -> None:
        if key_group not in self._reg:
            self.layout_version += 1
            self._reg[key_group] = {}
            self._made_whole(key_group)

    def set_current(self, key: Any, key_group: int) -> None:
        if ((len(self._loans) >= _MAX_LOANS or self._loan_bytes >= self._cache_bytes)
                and (key is not self.current_key or key_group != self.current_group)):
            self.flush()
        self.current_key = key
        if key_group != self.current_group:
            self._tables = self._reg[key_group]  # type: ignore[assignment]
            self.current_group = key_group
        if self._track:
            self._note(key_group, key)

    def table(self, name: str) -> Table:
        t = self._tables.get(name)
        if t is None:
            t = self._view(self.current_group, name)
        return t

    def flush(self) -> None:
        """Write the loans (written or mutable values) back in one batch; they are no
        longer live (immutable ones stay cached as clean values)."""
        self._write_back()

    def _write_back(self, sizes_of: Mapping[bytes, Any] | None = None) -> dict[bytes, int]:
        """``flush``, returning the encoded size of each loan whose key is in
        ``sizes_of``. Keeps the stored-bytes counts: a loan replaces its stored value,
        whose length the cache knows when it read the key (``_base``), else one multi-get
        of the keys written blind tells."""
        loans = self._loans
        self._kept_bytes = 0
        sizes: dict[bytes, int] = {}
        if not loans:
            return sizes
        base = self._base
        base_get = base.get
        unknown: list[tuple[bytes, int]] = []  # written blind: (key, new length)
        batch = rd.WriteBatch(raw_mode=True)
        put = batch.put
        clean = self._clean
        stored = self._stored
        stored_get = stored.get
        kept = self._clean_bytes
        pre, immutable, pack, entry = _PREFIX, _IMMUTABLE, _pack, _ENTRY_BYTES
        for k, v in loans.items():
            enc = pack(v)
            put(k, enc)
            n = len(enc)
            old = base_get(k)
            if old is None:
                unknown.append((k, n))
            else:
                p = k[:pre]
                stored[p] = stored_get(p, 0) + n - (old or pre - len(k))
            if type(v) in immutable:
                clean[k] = v
                base[k] = n
                kept += n + entry
            elif sizes_of and k in sizes_of:
                sizes[k] = base[k] = n
            else:
                base.pop(k, None)
        if unknown:  # what they replace: read before the batch is written
            with self._io("reading state"):
                olds: list[bytes | None] = self.db.get(  # type: ignore[assignment]
                    [k for k, _ in unknown])
            for (k, n), raw in zip(unknown, olds, strict=True):
                p = k[:_PREFIX]
                stored[p] = stored.get(p, 0) + n - (_PREFIX - len(k) if raw is None
                                                     else len(raw))
        loans.clear()
        self._loan_size.clear()
        self._grow.clear()
        self._loan_bytes = 0
        self._clean_bytes = kept
        if kept > self._cache_bytes:
            clean.clear()
            self._clean_bytes = 0
        if len(base) > 4 * _MAX_LOANS + len(clean):
            self._prune_base()
        with self._io("writing state"):
            self.db.write(batch, self._wo)
        return sizes

    def _prune_base(self) -> None:
        """Keep ``_base`` to the keys cached (its entries stay true; others may go)."""
        base = self._base
        self._base = {k: base[k] for k in itertools.chain(self._loans, self._clean)
                      if k in base}

    def _lend(self, full: bytes, value: Any, size: int) -> None:
        """Keep ``value`` as the loan of ``full`` (written back later), counted at ``size``
        (its encoded size, exact or estimated), making room at four times the loans' share
        (a key's work in progress is not interrupted below)."""
        if (len(self._loans) >= 4 * _MAX_LOANS
                or self._loan_bytes - self._kept_bytes >= 4 * self._cache_bytes):
            self._flush_in_key()
        self._loans[full] = value
        self._loan_size[full] = size
        self._loan_bytes += size + _ENTRY_BYTES
        if type(value) in _GROWS:
            self._grow[full] = 2 * len(value) + 2

    def _resize(self, full: bytes, value: Any) -> None:
        """Count the loan ``full`` (now ``value``) again when it may have grown: a container
        measured at length n is encoded again once its length reaches 2n + 2 (so the
        encodes of a growing container cost at most twice its final encoding, and it is
        counted at no less than about half its size); any other value at its scalar
        size. The current key's growth counts as kept (it is live: flushing it in the
        middle of the key's work would free nothing)."""
        if type(value) in _GROWS:
            limit = self._grow.get(full)
            if limit is not None and len(value) < limit:
                return
            size = _encoded_size(value)
            self._grow[full] = 2 * len(value) + 2
        else:
            self._grow.pop(full, None)
            size = _encoded_size(value)
        delta = size - self._loan_size.get(full, 0)
        self._loan_size[full] = size
        self._loan_bytes += delta
        if self._is_current(full):
            self._kept_bytes += delta

    def _is_current(self, full: bytes) -> bool:
        """``full`` is a key of the current key (any table of the current group)."""
        group = self.current_group
        if group is None or group < 0 or int.from_bytes(full[:_KG_BYTES], "big") != group:
            return False
        try:
            return full[_PREFIX:] == _pack(self.current_key)
        except Exception:  # noqa: BLE001 - a key without a codec fails where it is written
            return False

    def _flush_in_key(self) -> None:
        """``flush()`` in the middle of the current key's work: everything is written back,
        but the current key's mutable values stay loans (live), since its code may still
        hold and mutate one it read (``items = lst.get(); count.update(n);
        items.append(x)`` persists, as with a dict). Their bytes are not counted towards
        the next in-key flush (a key larger than the share would otherwise flush at every
        write); the next change of key writes them back."""
        group = self.current_group
        keep: dict[bytes, Any] = {}
        if group is not None and group >= 0:
            try:
                packed = _pack(self.current_key)
            except Exception:  # noqa: BLE001 - a key without a codec fails where it is written
                packed = None
            if packed is not None:
                kg = group.to_bytes(_KG_BYTES, "big")
                keep = {k: v for k, v in self._loans.items()
                        if type(v) not in _IMMUTABLE and k[_PREFIX:] == packed
                        and k[:_KG_BYTES] == kg}
        sizes = self._write_back(keep)
        for k, v in keep.items():
            self._loans[k] = v
            self._loan_size[k] = sizes[k]
            self._loan_bytes += sizes[k] + _ENTRY_BYTES
            if type(v) in _GROWS:
                self._grow[k] = 2 * len(v) + 2
        self._kept_bytes = self._loan_bytes

    def _keep_clean(self, full: bytes, value: Any, size: int) -> None:
        """Cache an immutable ``value`` as RocksDB holds it under ``full``."""
        if size > self._cache_bytes >> 4:
            return  # a large value would push out many small hot ones
        if self._clean_bytes + size > self._cache_bytes:
            self._clean.clear()
            self._clean_bytes = 0
        self._clean[full] = value
        self._clean_bytes += size + _ENTRY_BYTES

    def _forget(self, full: bytes) -> None:
        """Drop ``full`` from the object cache (its stored value is replaced or deleted)."""
        if self._loans.pop(full, _MISSING) is not _MISSING:
            self._loan_bytes -= self._loan_size.pop(full, 0) + _ENTRY_BYTES
            self._grow.pop(full, None)
        self._clean.pop(full, None)
        self._base.pop(full, None)

    def _write(self, prefix: bytes, pairs: Iterable[tuple[Any, Any]]) -> None:
        """Write ``pairs`` under ``prefix`` in one batch (values encoded now: no loans);
        the stored values they replace are read in one multi-get (for the counts)."""
        entries = {prefix + _pack(k): _pack(v) for k, v in pairs}
        if not entries:
            return
        for full in entries:
            self._forget(full)
        keys = list(entries)
        batch = rd.WriteBatch(raw_mode=True)
        with self._io("reading state"):
            olds: list[bytes | None] = self.db.get(keys)  # type: ignore[assignment, arg-type]
        delta = 0
        for (full, enc), old in zip(entries.items(), olds, strict=True):
            batch.put(full, enc)
            delta += len(enc) + (len(full) - _PREFIX if old is None else -len(old))
        with self._io("writing state"):
            self.db.write(batch, self._wo)
        self._stored[prefix] = self._stored.get(prefix, 0) + delta

    def _drop_loans(self, prefix: bytes) -> None:
        """Forget the cached values under ``prefix`` (its range is deleted or replaced)."""
        for k in [k for k in self._loans if k.startswith(prefix)]:
            self._forget(k)
        self._clean.clear()  # rare (a group installed, removed, a table cleared): all of it
        self._clean_bytes = 0
        self._base.clear()

    def _drop_stored(self, prefix: bytes) -> None:
        """The range under ``prefix`` (a table or a group) was deleted: its counts go."""
        for p in [p for p in self._stored if p.startswith(prefix)]:
            del self._stored[p]

    # -- dense tables: none on disk (the vectorised operators take their dict path)
    def dense_table(self, name: str) -> None:
        return None

    def undense(self, name: str) -> None:
        return None

    def dense_names(self) -> list[str]:
        return []

    # -- timers: in the DB (engine.state.rocksdb_timers), same semantics as the base class
    def add_timer(self, key_group: int, time_ms: int, key: Any,
                  domain: int = PROCESSING_TIME) -> None:
        if key_group not in self._reg:
            raise KeyError(key_group)
        entry = (int(time_ms), key, domain)
        if self._tq.add(key_group, entry) and self._dirty is not None:
            self._note_timer(key_group, entry)

    def delete_timer(self, time_ms: int, domain: int = PROCESSING_TIME) -> None:
        kg = self.current_group
        if kg not in self._reg:
            raise KeyError(kg)
        entry = (int(time_ms), self.current_key, domain)
        self._tq.delete(kg, entry)
        if self._dirty is not None:
            self._note_timer(kg, entry)

    def _push_timer(self, time_ms: int, key_group: int, key: Any, domain: int) -> None:
        """A timer put back with ``timers[kg].add`` (parked: it exists but does not fire)
        fires again (the operators' ``release_held``); no-op for any other."""
        self._tq.unpark(key_group, (time_ms, key, domain))

    def next_timer(self, domain: int = PROCESSING_TIME) -> int | None:
        return self._tq.next_time(domain)

    def pop_due_timers(self, now_ms: int, domain: int = PROCESSING_TIME,
                       ) -> Iterator[tuple[int, int, Any]]:
        for t, kg, key in self._tq.pop_due(now_ms, domain):
            if self._dirty is not None:
                self._note_timer(kg, (t, key, domain))
            yield t, kg, key

    def timer_cache_bytes(self) -> int:
        """What the timers' caches hold in memory now (bounded by ``timer_cache_bytes``;
        timers parked by a rescale's hold not counted)."""
        return self._tq.cached_bytes()

    def _timer_list(self, key_group: int) -> list[tuple[int, Any, int]]:
        if key_group not in self._reg:
            return []
        with self._io("reading timers"):
            return sorted(self._tq.entries(key_group), key=repr)

    # -- scans
    def _scan(self, lo: bytes, hi: bytes) -> Iterator[tuple[bytes, bytes]]:
        ro = rd.ReadOptions()
        ro.set_iterate_upper_bound(hi)
        ro.fill_cache(False)  # type: ignore[call-arg]  # the stub lacks the flag
        ro.set_readahead_size(2 << 20)
        items: Iterable[tuple[bytes, bytes]] = self.db.items(from_key=lo, read_opt=ro)  # type: ignore[assignment]
        # a generator, so ``ro`` lives as long as the iterator: the iterator does not keep
        # its read options (and their upper bound) alive, and reads a freed bound otherwise
        item = None
        for item in items:
            yield item
        del ro
        self._scan_ended(lo, hi, None if item is None else item[0])

    def _scan_keys(self, lo: bytes, hi: bytes) -> Iterator[bytes]:
        ro = rd.ReadOptions()
        ro.set_iterate_upper_bound(hi)
        keys: Iterable[bytes] = self.db.keys(from_key=lo, read_opt=ro)  # type: ignore[assignment]
        key = None
        for key in keys:  # a generator: see _scan
            yield key
        del ro
        self._scan_ended(lo, hi, key)

    def _scan_ended(self, lo: bytes, hi: bytes, last: bytes | None) -> None:
        """A scan of ``lo``..``hi`` stopped after ``last``: raise when it stopped at an error
        (a block that does not match its checksum) rather than at the range's end.
        rocksdict's ``items``/``keys`` end silently at an error; a seek just past the last
        key read reaches the same block again, and the iterator's ``status`` says why."""
        ro = rd.ReadOptions()
        ro.set_iterate_upper_bound(hi)
        it = self.db.iter(ro)
        try:
            it.seek(lo if last is None else last + b"\x00")
            if not it.valid():
                it.status()
        except Exception as exc:
            raise self._failed("reading state", exc) from exc
        finally:
            del it
            del ro

    # -- single key groups
    def snapshot(self, key_group: int) -> bytes:
        """The group as a key-group blob (``engine.state.keyed.encode_group``), spliced from
        the stored bytes: nothing is decoded or encoded but the names and timers."""
        self.flush()
        parts: list[bytes] = []
        tables = 0
        with self._io("reading state"), _gc_paused():
            for name, view in self._reg.get(key_group, {}).items():
                raw = _interleave(list(self._scan(view.prefix, view.end)))
                if raw:
                    tables += 1
                    parts += (b"\x93", pack_exact(name), array_header(len(raw)), *raw,
                              pack_exact(lengths_bytes(raw)))
        timers = pack_exact(self._timer_list(key_group))
        return b"".join((b"\x93", _GROUP_TAG, array_header(tables), *parts, timers))

    def install(self, key_group: int, data: bytes) -> None:
        """Install a key-group blob of either backend, replacing anything held for it;
        the entries' bytes are written as they are, in write batches."""
        with _gc_paused():
            tables, timers = _split_blob(data)
        changed = self._changes.get(key_group)
        if changed is not None:
            self._note_all(key_group, changed)
        kg = key_group.to_bytes(_KG_BYTES, "big")
        self._drop_loans(kg)
        self._made_whole(key_group)
        self.layout_version += 1
        reg: dict[str, _TableView] = {}
        ts = {(int(at), k, int(d)) for at, k, d in timers}
        with self._io("installing state"):
            if key_group in self._reg:  # a group never owned, or removed, holds no keys
                self.db.delete_range(kg, _successor(kg), self._wo)
            self._drop_stored(kg)
            if ts:
                batch = rd.WriteBatch(raw_mode=True)
                self._tq.write(batch, key_group, ts)
                self.db.write(batch, self._wo)
            for name, raw in tables:
                if not raw:
                    continue
                view = reg[name] = _TableView(self, key_group, name)
                keys = list(map(view.prefix.__add__, raw[0::2]))
                values = raw[1::2]
                size = sum(map(len, raw))  # the logical bytes: encoded keys and values
                self._stored[view.prefix] = size
                step = max(1, _BATCH_BYTES * len(keys) // max(1, size))
                for at in range(0, len(keys), step):
                    batch = rd.WriteBatch(raw_mode=True)
                    put = batch.put
                    for k, v in zip(keys[at:at + step], values[at:at + step], strict=True):
                        put(k, v)
                    self.db.write(batch, self._wo)
        self._reg[key_group] = reg
        if changed is not None:
            self._note_all(key_group, changed)
        self._tq.reset(key_group)
        if key_group == self.current_group:
            self._tables = reg  # type: ignore[assignment]

    def remove(self, key_group: int) -> None:
        changed = self._changes.get(key_group)
        if changed is not None:
            self._note_all(key_group, changed)
        kg = key_group.to_bytes(_KG_BYTES, "big")
        self._drop_loans(kg)
        with self._io("removing state"):
            self.db.delete_range(kg, _successor(kg), self._wo)
        self._drop_stored(kg)
        self._reg.pop(key_group, None)
        self._group_views.pop(key_group, None)
        self._made_whole(key_group)
        self.layout_version += 1
        self._tq.drop(key_group)
        if key_group == self.current_group:
            self.current_group = -1
            self._tables = {}

    # -- checkpoints as the DB's own files (engine.state.sst_checkpoints)
    has_files = True

    def checkpoint_files(self, tag: str) -> DbCheckpoint | None:
        """Checkpoint the whole DB as its own files into a new folder
        ``<directory>/checkpoints/<tag>`` (engine.state.sst_checkpoints): every loan
        written back, the memtables flushed, each live SST file hard-linked, a fresh
        MANIFEST. None when some state of the task is not in the DB (parked timers, held
        in memory during a rescale): take blobs then. The caller deletes the folder."""
        if any(self._tq.parked.values()):
            return None
        self.flush()
        target = os.path.join(self.directory, "checkpoints", tag)
        with self._io("checkpointing the state"):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.rmtree(target, ignore_errors=True)
            rd.Checkpoint(self.db).create_checkpoint(target)
            files = {e.name: e.stat().st_size for e in os.scandir(target) if e.is_file()}
        return DbCheckpoint(target, files, {kg: tuple(reg) for kg, reg in
                                            sorted(self._reg.items())}, self.instance)

    # -- change tracking
    def snapshot_delta(self, key_group: int) -> bytes:
        changed = self._changes.get(key_group)
        if changed is None:
            raise ValueError(
                f"key group {key_group} is not tracked; call track_changes({key_group}) "
                "before asking for a delta"
            )
        views = list(self._reg.get(key_group, {}).items())
        entries = []
        for key in changed:
            present = []
            for name, view in views:
                v = view.get(key, _MISSING)
                if v is not _MISSING:
                    present.append([name, v])
            entries.append([key, present])
        return pack_exact([_DELTA_TAG, self._versions[key_group], entries,
                           self._timer_list(key_group)])

    def _note_all(self, key_group: int, changed: set[Any]) -> None:
        for view in self._reg.get(key_group, {}).values():
            changed.update(view)

    def snapshot_changes(self, key_group: int, keys: Iterable[Any],
                         timers: Iterable[tuple[int, Any, int]]) -> bytes:
        """A delta blob (``engine.state.incremental``) spliced from the stored bytes:
        one multi-get per table, nothing decoded but the keys' encoding."""
        from engine.state.incremental import encode_delta_raw

        self.flush()
        packed = sorted(map(_pack, keys))
        tables = []
        with self._io("reading state"):
            for name, view in self._reg.get(key_group, {}).items():
                full: list[Any] = list(map(view.prefix.__add__, packed))
                values: list[bytes | None] = self.db.get(full) if full else []  # type: ignore[assignment]
                tables.append((name, [x for k, v in zip(packed, values, strict=True)
                                      if v is not None for x in (k, v)]))
        owned = key_group in self._reg
        present: list[tuple[int, Any, int]] = []
        gone: list[tuple[int, Any, int]] = []
        with self._io("reading timers"):
            for t in timers:
                (present if owned and self._tq.contains(key_group, t) else gone).append(t)
        return encode_delta_raw(packed, tables, present, gone)

    # -- sizes
    def estimated_bytes(self) -> int:
        """The logical encoded size of all keyed state: the encoded user keys plus the
        encoded values of every table entry (what the tables' entries take in a savepoint
        before compression; framing and timers not counted), the same figure the in-memory
        backend reports for the same state. Exact, from counts kept on every write (no scan,
        no read): the loans are written back first (``_flush_in_key``: the current key's
        mutable values stay live). Not RocksDB's on-disk size (compressed, with overwritten
        entries not yet compacted away). 0 once closed: a stopped task's metrics may still
        be asked for."""
        if self._db is None:
            return 0
        if self._loans:
            self._flush_in_key()
        return sum(self._stored.values())

    def num_keys(self) -> int:
        """Exact, by a scan of every table (costs a pass over the keys; timers are not
        keys)."""
        self.flush()
        timers = self._timer_ids
        return sum(1 for k in self._scan_keys(b"", b"\xff\xff")
                   if k[_KG_BYTES:_PREFIX] not in timers)

    def group_bytes(self, key_group: int) -> int:
        """One group's logical bytes by a scan (encoded user keys plus values of its tables'
        entries; timers not counted): what ``estimated_group_bytes`` keeps counts of."""
        self.flush()
        kg = key_group.to_bytes(_KG_BYTES, "big")
        timers = self._timer_ids
        return sum(len(k) - _PREFIX + len(v) for k, v in self._scan(kg, _successor(kg))
                   if k[_KG_BYTES:_PREFIX] not in timers)

    def estimated_group_bytes(self, key_group: int) -> int:
        """One key group's logical bytes (as ``estimated_bytes``, for one group): exact,
        from the counts, after writing the loans back (unless the only loans are the
        current key's live values already written back: their growth since is not seen).
        0 once closed (a stopped task's statistics)."""
        if self._db is None:
            return 0
        if self._loans and self._loan_bytes != self._kept_bytes:  # (asked for every group
            self._flush_in_key()  # in a row: the current key's live values written once)
        prefix = key_group.to_bytes(_KG_BYTES, "big")
        return sum(n for p, n in self._stored.items() if p.startswith(prefix))

    def group_keys(self, key_group: int) -> int | None:
        """The distinct keys holding state in one group: exact, by one scan of its keys
        (distinct encoded user keys over its tables; timers are not keys). 0 once
        closed."""
        return self.group_stats(key_group)[1]

    def group_stats(self, key_group: int) -> tuple[int, int | None]:
        """``(estimated_group_bytes, group_keys)``: the bytes from the counts, the keys
        from one scan of the group's keys (a set of their encodings)."""
        if self._db is None:
            return 0, 0
        self.flush()
        kg = key_group.to_bytes(_KG_BYTES, "big")
        timers = self._timer_ids
        keys = {k[_PREFIX:] for k in self._scan_keys(kg, _successor(kg))
                if k[_KG_BYTES:_PREFIX] not in timers}
        return self.estimated_group_bytes(key_group), len(keys)


def _split_blob(data: bytes) -> tuple[list[tuple[str, list[bytes]]], list[Any]]:
    """A key-group blob's tables as ``[(name, [key bytes, value bytes, ...])]`` (each the
    exact encoding) and its timers, without decoding entries: sliced by the lengths a
    RocksDB blob carries, else cut at object boundaries. An old-format blob is decoded
    and re-encoded (checkpoints written before the blob format)."""
    u = msgpack.Unpacker(max_buffer_size=max(len(data), 1024), strict_map_key=False)
    u.feed(data)
    try:
        n = u.read_array_header()
        if n != 3 or u.unpack() != GROUP_TAG:
            return _split_decoded(data)
        out: list[tuple[str, list[bytes]]] = []
        for _ in range(u.read_array_header()):
            fields = u.read_array_header()
            name = u.unpack()
            if fields == 3:  # skip the flat array whole, then slice it by the lengths
                head = u.tell()
                u.skip()
                end = u.tell()
                first = data[head]
                start = head + (1 if first & 0xF0 == 0x90 else 3 if first == 0xDC else 5)
                count = (first & 0x0F if first & 0xF0 == 0x90
                         else int.from_bytes(data[head + 1:start], "big"))
                offsets = list(itertools.accumulate(lengths_of(u.unpack()), initial=start))
                raw = list(map(data.__getitem__, map(slice, offsets[:-1], offsets[1:])))
                if offsets[-1] != end or len(raw) != count:
                    raise CodecError("key-group blob: the lengths do not match the entries")
            else:
                count = u.read_array_header()
                start = u.tell()
                raw = []
                skip, tell = u.skip, u.tell
                for _ in range(count):
                    skip()
                    end = tell()
                    raw.append(data[start:end])
                    start = end
            out.append((name, raw))
        timers = unpack_exact(data[u.tell():])
    except CodecError:
        raise
    except Exception as exc:
        raise CodecError(f"bytes are not a key-group snapshot: {exc}") from exc
    return out, timers


def _split_decoded(data: bytes) -> tuple[list[tuple[str, list[bytes]]], list[Any]]:
    tables, timers = decode_group(data)
    return [(name, [_pack(x) for x in itertools.chain.from_iterable(t.items())])
            for name, t in tables.items()], timers


class _TableView(MutableMapping[Any, Any]):
    """One state table of one key group: the key range ``prefix``..``end``."""

    __slots__ = ("_b", "end", "key_group", "name", "prefix")

    def __init__(self, backend: RocksDBKeyedStateBackend, key_group: int, name: str) -> None:
        self._b = backend
        self.key_group = key_group
        self.name = name
        self.prefix = key_group.to_bytes(_KG_BYTES, "big") + backend._id(name)
        self.end = _successor(self.prefix)

    def get(self, key: Any, default: Any = None) -> Any:
        full = self.prefix + _pack(key)
        b = self._b
        v = b._loans.get(full, _MISSING)
        if v is not _MISSING:
            limit = b._grow.get(full)  # a container lent: grown since it was measured?
            if limit is not None and type(v) in _GROWS and len(v) >= limit:
                b._resize(full, v)
            return v
        v = b._clean.get(full, _MISSING)
        if v is not _MISSING:
            return v
        try:
            raw = b._db.get(full)  # type: ignore[union-attr]
        except Exception as exc:
            raise b._failed("reading state", exc) from exc
        if len(b._base) < 8 * _MAX_LOANS + len(b._clean):  # a write that follows needs
            b._base[full] = 0 if raw is None else len(raw)  # no read (bounded, see _base)
        if raw is None:
            return default
        v = unpack_exact(raw)
        if type(v) in _IMMUTABLE:
            b._keep_clean(full, v, len(raw))
        else:
            b._lend(full, v, len(raw))
        return v

    def __getitem__(self, key: Any) -> Any:
        v = self.get(key, _MISSING)
        if v is _MISSING:
            raise KeyError(key)
        return v

    def __setitem__(self, key: Any, value: Any) -> None:
        full = self.prefix + _pack(key)
        b = self._b
        loans = b._loans
        if full in loans:  # a hot key: already cached to be written back
            loans[full] = value
            if type(value) in _GROWS:  # (a container replaced by a scalar keeps its count)
                b._resize(full, value)
            return
        if b._db is None:
            raise b._error("the state backend is closed")
        b._clean.pop(full, None)
        t = type(value)
        b._lend(full, value, 9 if t is int or t is float else _encoded_size(value))

    def __delitem__(self, key: Any) -> None:
        if self.pop(key, _MISSING) is _MISSING:
            raise KeyError(key)

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        full = self.prefix + _pack(key)
        b = self._b
        v = b._loans.get(full, _MISSING)
        b._forget(full)
        raw = b.db.get(full)
        if raw is not None:
            with b._io("writing state"):
                b.db.delete(full, b._wo)
            stored = b._stored
            stored[self.prefix] = stored.get(self.prefix, 0) - (len(full) - _PREFIX + len(raw))
            if v is _MISSING:
                v = unpack_exact(raw)
        if v is _MISSING:
            if default is _MISSING:
                raise KeyError(key)
            return default
        return v

    def __contains__(self, key: object) -> bool:
        full = self.prefix + _pack(key)
        b = self._b
        return full in b._loans or full in b._clean or b.db.get(full) is not None

    def __iter__(self) -> Iterator[Any]:
        self._b.flush()
        for k in self._b._scan_keys(self.prefix, self.end):
            yield unpack_exact(k[_PREFIX:])

    def __len__(self) -> int:
        self._b.flush()
        return sum(1 for _ in self._b._scan_keys(self.prefix, self.end))

    def __bool__(self) -> bool:
        self._b.flush()
        return next(self._b._scan_keys(self.prefix, self.end), None) is not None

    def items(self) -> ItemsView[Any, Any]:
        return _Items(self)

    def values(self) -> ValuesView[Any]:
        return _Values(self)

    def keys(self) -> KeysView[Any]:
        return KeysView(self)

    def _pairs(self) -> Iterator[tuple[Any, Any]]:
        self._b.flush()
        for k, v in self._b._scan(self.prefix, self.end):
            yield unpack_exact(k[_PREFIX:]), unpack_exact(v)

    def clear(self) -> None:
        b = self._b
        b._drop_loans(self.prefix)
        with b._io("writing state"):
            b.db.delete_range(self.prefix, self.end, b._wo)
        b._drop_stored(self.prefix)

    def update(self, other: Any = (), /, **kw: Any) -> None:  # one batch
        pairs = other.items() if isinstance(other, Mapping) else other
        self._b._write(self.prefix, itertools.chain(pairs, kw.items()))

    def __repr__(self) -> str:
        return f"<RocksDB table {self.name!r} of key group {self.key_group}>"


class _Items(ItemsView[Any, Any]):
    _mapping: _TableView

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        return self._mapping._pairs()


class _Values(ValuesView[Any]):
    _mapping: _TableView

    def __iter__(self) -> Iterator[Any]:
        for _, v in self._mapping._pairs():
            yield v


class _GroupTimers(MutableSet[tuple[int, Any, int]]):
    """``timers[kg]``: a group's timers as a set of ``(time, key, domain)``, read from the
    DB. ``add`` parks a timer (it exists but fires only once pushed back with
    ``_push_timer``), as ``add`` on the in-memory backend's set puts it in the set and not
    on the heap; ``discard`` deletes it."""

    def __init__(self, backend: RocksDBKeyedStateBackend, key_group: int) -> None:
        self._b = backend
        self.key_group = key_group

    def __contains__(self, timer: object) -> bool:
        if not (isinstance(timer, tuple) and len(timer) == 3 and isinstance(timer[0], int | float)):
            return False
        with self._b._io("reading timers"):
            return self._b._tq.contains(self.key_group, (int(timer[0]), timer[1], timer[2]))

    def __iter__(self) -> Iterator[tuple[int, Any, int]]:
        with self._b._io("reading timers"):
            return iter(self._b._tq.entries(self.key_group))

    def __len__(self) -> int:
        with self._b._io("reading timers"):
            return self._b._tq.count(self.key_group)

    def add(self, timer: tuple[int, Any, int]) -> None:
        self._b._tq.park(self.key_group, (int(timer[0]), timer[1], timer[2]))

    def discard(self, timer: tuple[int, Any, int]) -> None:
        self._b._tq.delete(self.key_group, (int(timer[0]), timer[1], timer[2]))

    def __repr__(self) -> str:
        return f"<RocksDB timers of key group {self.key_group}>"


class _OwnedGroups(Mapping[int, _V]):
    """A view of the owned key groups (``backend.groups``, ``backend.timers``): each
    group's value made by ``make`` when asked."""

    def __init__(self, backend: RocksDBKeyedStateBackend, make: Callable[[int], _V]) -> None:
        self._b = backend
        self._make = make

    def __getitem__(self, key_group: int) -> _V:
        if key_group not in self._b._reg:
            raise KeyError(key_group)
        return self._make(key_group)

    def get(self, key_group: int, default: Any = None) -> Any:
        if key_group not in self._b._reg:
            return default
        return self._make(key_group)

    def __contains__(self, key_group: object) -> bool:
        return key_group in self._b._reg

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._b._reg))

    def __len__(self) -> int:
        return len(self._b._reg)


class _GroupView(MutableMapping[str, Table]):
    """A key group's tables by name (``groups[kg]``): the names it holds, each a live
    ``_TableView``. Assigning a mapping copies it in; ``pop`` returns a dict copy."""

    def __init__(self, backend: RocksDBKeyedStateBackend, key_group: int) -> None:
        self._b = backend
        self.key_group = key_group

    @property
    def _reg(self) -> dict[str, _TableView]:
        return self._b._reg[self.key_group]

    def __getitem__(self, name: str) -> Table:
        return self._reg[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self._reg.get(name, default)

    def __contains__(self, name: object) -> bool:
        return name in self._reg

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._reg))

    def __len__(self) -> int:
        return len(self._reg)

    def __setitem__(self, name: str, table: Table) -> None:
        view = self._b._view(self.key_group, name)
        if table is view:
            return
        pairs = list(table.items())
        view.clear()
        self._b._write(view.prefix, pairs)

    def __delitem__(self, name: str) -> None:
        view = self._reg.pop(name)
        view.clear()

    def pop(self, name: str, default: Any = _MISSING) -> Any:
        view = self._reg.get(name)
        if view is None:
            if default is _MISSING:
                raise KeyError(name)
            return default
        out = dict(view.items())
        del self[name]
        return out

    def setdefault(self, name: str, default: Any = None) -> Table:
        view = self._reg.get(name)
        if view is None:
            self[name] = {} if default is None else default
            view = self._reg[name]
        return view


def groups_from_checkpoint(directory: str, num_key_groups: int,
                           names: Mapping[int, Sequence[str]], key_groups: Iterable[int]
                           ) -> list[tuple[int, bytes]]:
    """The key groups ``key_groups`` of a DB checkpoint in ``directory``
    (``RocksDBKeyedStateBackend.checkpoint_files``; ``names``: what it returned) as
    key-group blobs, as the backend's ``snapshot`` gives them: the stored bytes spliced,
    nothing decoded. RocksDB checks every block it reads against its checksum; a group
    the checkpoint does not hold comes back empty. ``StateBackendError`` when the files
    do not open as a DB."""
    wanted = sorted(set(key_groups))
    reader = RocksDBKeyedStateBackend(
        num_key_groups, directory, block_cache_bytes=8 << 20,
        checkpoint={kg: names.get(kg, ()) for kg in wanted})
    try:
        return [(kg, reader.snapshot(kg)) for kg in wanted]
    finally:
        reader.close()
