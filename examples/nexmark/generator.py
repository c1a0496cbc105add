"""Deterministic, seeded, vectorised NEXMark event generator (plain Python + numpy).

Follows the reference Java generator of the NEXMark suite (nexmark/nexmark,
``nexmark-flink/.../generator``: ``GeneratorConfig``, ``NexmarkGenerator`` and
``model/{Person,Auction,Bid,Price,Strings}Generator``) with a single generator
(``numEventGenerators=1``), ``outOfOrderGroupSize=1`` and a constant event rate:

* event number ``n`` (0-based) is a person if ``n % 50 < 1``, an auction if ``< 4``, otherwise a
  bid (generally: the person/auction/bid proportions of the config);
* ``date_time(n) = base_time_ms + int(n * inter_event_delay_us) // 1000`` with
  ``inter_event_delay_us = 1e6 / first_event_rate`` (the reference ``timestampForEvent``);
* person ids are ``1000 + lastBase0PersonId(n)``, auction ids ``1000 + lastBase0AuctionId(n)``;
* sellers/bidders/auctions are "hot" with probability ``1 - 1/ratio`` (the first id of the
  current batch of 100 people/auctions; the hot bidder is the second person of the batch)
  and otherwise a random recent id (the last ``num_active_people`` people or
  ``num_in_flight_auctions`` auctions, plus a lead of 10 not-yet-generated ids);
* prices are ``round(10 ** (u * 6) * 100)`` (cents, 100 .. 10^8), categories 10..14, an auction
  expires a random 1 .. 2 * horizon ms after creation where the horizon is the time until
  ``num_in_flight_auctions`` more auctions exist; bids get one of 4 hot channels (p = 1/2) or
  ``channel-k`` (k < 10,000) with a per-channel URL;
* ``extra`` pads each event to about the average byte size of its kind.

Randomness is counter-based: the events of chunk ``c`` (event numbers ``[c * 4096, (c+1) * 4096)``)
are drawn from a Philox generator keyed by the seed with ``c`` in its counter. Event ``n`` is a pure
function of ``(config, n)``, so any range can be generated independently and in parallel, and
``events(a, k)`` followed by ``events(a + k, m)`` equals ``events(a, k + m)``.

String columns of an :class:`EventBatch` are fixed-width numpy bytes (``S``) arrays of ASCII;
:meth:`EventBatch.to_records` decodes them to ``str``.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

# ---------------------------------------------------------------------------------------------
# Constants of the reference generator

FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
PERSON_ID_LEAD = 10  # ids of yet-to-be-created people a random person may have
AUCTION_ID_LEAD = 10  # ids of yet-to-be-created auctions a random auction may have
HOT_SELLER_RATIO = 100  # a hot seller is the first person of the last batch of 100
HOT_AUCTION_RATIO = 100  # a hot auction is the first auction of the last batch of 100
HOT_BIDDER_RATIO = 100  # a hot bidder is the second person of the last batch of 100
HOT_CHANNELS_RATIO = 2
CHANNELS_NUMBER = 10_000
MIN_STRING_LENGTH = 3

US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond",
             "Seattle", "Kent", "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah",
               "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones",
              "Noris")
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")

#: events per randomness chunk; part of the determinism contract (changing it changes the data)
CHUNK_SIZE = 4096
#: letters in the per-seed pool the ``extra`` padding strings are cut from
EXTRA_POOL_SIZE = 1 << 20
#: the largest ``avg_*_byte_size``: an ``extra`` (up to 1.2x the asked size) is one cut of
#: the pool
MAX_AVG_BYTE_SIZE = 800_000

PERSON, AUCTION, BID = 0, 1, 2
KIND_NAMES = ("person", "auction", "bid")

_STREAM_EVENTS = 0
_STREAM_TABLES = 1


# ---------------------------------------------------------------------------------------------
# Entities


class Person(NamedTuple):
    id: int
    name: str
    email_address: str
    credit_card: str
    city: str
    state: str
    date_time: int
    extra: str


class Auction(NamedTuple):
    id: int
    item_name: str
    description: str
    initial_bid: int
    reserve: int
    date_time: int
    expires: int
    seller: int
    category: int
    extra: str


class Bid(NamedTuple):
    auction: int
    bidder: int
    price: int
    channel: str
    url: str
    date_time: int
    extra: str


ENTITY_TYPES = (Person, Auction, Bid)
PERSON_FIELDS: tuple[str, ...] = Person._fields
AUCTION_FIELDS: tuple[str, ...] = Auction._fields
BID_FIELDS: tuple[str, ...] = Bid._fields
FIELDS = (PERSON_FIELDS, AUCTION_FIELDS, BID_FIELDS)


# ---------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class NexmarkConfig:
    """Generator parameters (names and defaults of the reference ``NexmarkConfiguration``).

    ``num_events`` only bounds :meth:`NexmarkGenerator.batches` (0 = unbounded);
    :meth:`NexmarkGenerator.events` is defined for every event number. With
    ``strict_foreign_keys`` every seller/bidder/auction reference points to an entity generated
    at or before the referencing event (no id leads, hot bidder clamped); the reference
    generator (default) may point up to 10 ids ahead.
    """

    first_event_rate: float = 10_000.0
    num_events: int = 0
    seed: int = 0
    person_proportion: int = 1
    auction_proportion: int = 3
    bid_proportion: int = 46
    hot_auction_ratio: int = 2
    hot_bidders_ratio: int = 4
    hot_sellers_ratio: int = 4
    num_active_people: int = 1000
    num_in_flight_auctions: int = 100
    avg_person_byte_size: int = 200
    avg_auction_byte_size: int = 500
    avg_bid_byte_size: int = 100
    base_time_ms: int = 0
    strict_foreign_keys: bool = False

    def __post_init__(self) -> None:
        if not self.first_event_rate > 0:
            raise ValueError("first_event_rate must be > 0")
        if self.num_events < 0:
            raise ValueError("num_events must be >= 0")
        for name in ("person_proportion", "auction_proportion", "bid_proportion",
                     "hot_auction_ratio", "hot_bidders_ratio", "hot_sellers_ratio",
                     "num_active_people", "num_in_flight_auctions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        for name in ("avg_person_byte_size", "avg_auction_byte_size", "avg_bid_byte_size"):
            if not 0 <= getattr(self, name) <= MAX_AVG_BYTE_SIZE:
                raise ValueError(f"{name} must be between 0 and {MAX_AVG_BYTE_SIZE:,} (the "
                                 f"padding is cut from a pool of {EXTRA_POOL_SIZE:,} letters); "
                                 f"got {getattr(self, name)}")

    @property
    def total_proportion(self) -> int:
        return self.person_proportion + self.auction_proportion + self.bid_proportion

    @property
    def inter_event_delay_us(self) -> float:
        return 1_000_000.0 / self.first_event_rate

    def replace(self, **changes) -> NexmarkConfig:
        return dataclasses.replace(self, **changes)

    # --- scalar/vector helpers of the reference (accept ints or int64 arrays) ---------------

    def timestamp_for_event(self, n):
        """Event time (ms) of event number ``n``: ``baseTime + (long)(n * delayUs) / 1000``."""
        if isinstance(n, np.ndarray):
            us = (n.astype(np.float64) * self.inter_event_delay_us).astype(np.int64)
            return self.base_time_ms + us // 1000
        return self.base_time_ms + int(n * self.inter_event_delay_us) // 1000

    def kind_of(self, n):
        """0 person, 1 auction, 2 bid."""
        rem = n % self.total_proportion
        pa = self.person_proportion + self.auction_proportion
        if isinstance(rem, np.ndarray):
            return ((rem >= self.person_proportion).astype(np.uint8) + (rem >= pa)).astype(np.uint8)
        return PERSON if rem < self.person_proportion else AUCTION if rem < pa else BID

    def last_base0_person_id(self, n):
        """Id (minus 1000) of the last person generated at or before event ``n``."""
        epoch, offset = n // self.total_proportion, n % self.total_proportion
        if isinstance(offset, np.ndarray):
            offset = np.minimum(offset, self.person_proportion - 1)
        else:
            offset = min(offset, self.person_proportion - 1)
        return epoch * self.person_proportion + offset

    def last_base0_auction_id(self, n):
        """Id (minus 1000) of the last auction generated at or before event ``n`` (-1: none)."""
        tp, pp, ap = self.total_proportion, self.person_proportion, self.auction_proportion
        epoch, offset = n // tp, n % tp
        if isinstance(offset, np.ndarray):
            return np.where(offset < pp, epoch * ap - 1,
                            np.where(offset >= pp + ap, epoch * ap + ap - 1,
                                     epoch * ap + offset - pp))
        if offset < pp:
            return epoch * ap - 1
        if offset >= pp + ap:
            return epoch * ap + ap - 1
        return epoch * ap + offset - pp

    def count_before(self, n: int) -> tuple[int, int, int]:
        """(persons, auctions, bids) among event numbers ``[0, n)``."""
        tp, pp, ap = self.total_proportion, self.person_proportion, self.auction_proportion
        epoch, rem = divmod(n, tp)
        persons = epoch * pp + min(rem, pp)
        auctions = epoch * ap + min(max(rem - pp, 0), ap)
        return persons, auctions, n - persons - auctions


# ---------------------------------------------------------------------------------------------
# Vectorised building blocks


def _philox(seed: int, stream: int, chunk: int) -> np.random.Generator:
    counter = np.array([0, 0, stream, chunk], dtype=np.uint64)
    return np.random.Generator(np.random.Philox(key=seed % (1 << 128), counter=counter))


def _bytes_table(values) -> np.ndarray:
    return np.array([v.encode("ascii") for v in values], dtype=np.bytes_)


def _next_string(rng: np.random.Generator, m: int, max_length: int, special: bytes = b" "):
    """``StringsGenerator.nextString``: 3 .. max_length-1 chars, each ``special`` with p = 1/13,
    else a-z, then trimmed (Java ``trim`` removes surrounding spaces)."""
    width = max_length - 1
    lengths = MIN_STRING_LENGTH + rng.integers(0, max_length - MIN_STRING_LENGTH, m)
    r = rng.integers(0, 13 * 26, (m, width), dtype=np.uint16)  # r < 26 <=> p = 1/13
    chars = np.where(r < 26, np.uint16(special[0]), r % 26 + 97).astype(np.uint8)
    chars *= np.arange(width)[None, :] < lengths[:, None]
    out = chars.view(f"S{width}").reshape(m)
    if special == b" ":
        out = np.char.strip(out, b" ")
    return out


def _str_len(arr: np.ndarray) -> np.ndarray:
    return np.char.str_len(arr).astype(np.int64)


def _java_round(x):
    return np.floor(x + 0.5).astype(np.int64)


def _next_price(rng: np.random.Generator, m: int) -> np.ndarray:
    """``PriceGenerator.nextPrice``: ``round(10^(6u) * 100)`` cents."""
    return _java_round(np.power(10.0, rng.random(m) * 6.0) * 100.0)


def _extra_width(avg: int, min_current: int) -> int:
    desired = max(avg - min_current, 0)
    return max(desired + int(round(desired * 0.2)) + 1, 1)


class _StrTable:
    """A small table of strings (as ``str`` and as an ``S`` array) that columns code into."""

    __slots__ = ("strs", "array", "ref")

    def __init__(self, strs, ref: tuple[int, str]) -> None:
        self.strs: list[str] = list(strs)
        self.array = _bytes_table(self.strs)
        self.ref = ref  # (seed, attribute of _Tables): pickled by reference, not by value

    def __reduce__(self):
        return (_table_attr, self.ref)


def _table_attr(seed: int, name: str):
    return getattr(_tables_for(seed), name)


class _Tables:
    """Per-seed lookup tables: names, cities, states, channels/URLs, the ``extra`` letter pool."""

    def __init__(self, seed: int) -> None:
        rng = _philox(seed, _STREAM_TABLES, 0)
        self.names = _StrTable((f"{f} {last}" for f in FIRST_NAMES for last in LAST_NAMES),
                               (seed, "names"))
        self.cities = _StrTable(US_CITIES, (seed, "cities"))
        self.states = _StrTable(US_STATES, (seed, "states"))
        # channel index: 0..3 the hot channels, 4 + k the channel "channel-k"; each has a fixed
        # URL made of three random path parts ("&channel_id=..." appended for 9 in 10 channels)
        n = len(HOT_CHANNELS) + CHANNELS_NUMBER
        parts = [_next_string(rng, n, 5, b"_").tolist() for _ in range(3)]
        with_id = (rng.integers(0, 10, n) > 0).tolist()
        urls = []
        for i, (a, b, c) in enumerate(zip(*parts, strict=True)):
            url = f"https://www.nexmark.com/{a.decode()}/{b.decode()}/{c.decode()}/item.htm?query=1"
            k = i - len(HOT_CHANNELS)
            if k >= 0 and with_id[i]:
                url += f"&channel_id={_java_abs_int32(_java_reverse_int32(k))}"
            urls.append(url)
        self.channels = _StrTable(list(HOT_CHANNELS)
                                  + [f"channel-{k}" for k in range(CHANNELS_NUMBER)],
                                  (seed, "channels"))
        self.urls = _StrTable(urls, (seed, "urls"))
        letters = np.frombuffer(rng.bytes(EXTRA_POOL_SIZE), dtype=np.uint8)
        self.pool = _Pool((letters % 26 + 97).astype(np.uint8), (seed, "pool"))
        self.names_len = _str_len(self.names.array)
        self.cities_len = _str_len(self.cities.array)
        self.states_len = _str_len(self.states.array)

    def extra(self, rng: np.random.Generator, current: np.ndarray, avg: int,
              width: int) -> PoolStrings:
        """``StringsGenerator.nextExtra``: a string making the event about ``avg`` bytes long
        (``avg - current`` +-20 %), cut at a random offset from the per-seed letter pool."""
        m = len(current)
        desired = avg - current
        delta = _java_round(np.maximum(desired, 0) * 0.2)
        span = rng.integers(0, np.maximum(2 * delta, 1))
        size = np.where(desired < 0, 0, desired - delta + np.where(delta > 0, span, 0))
        offsets = rng.integers(0, len(self.pool.array) - width + 1, m)
        return PoolStrings(offsets, size, self.pool, width)


class _Pool:
    __slots__ = ("array", "text", "ref")

    def __init__(self, array: np.ndarray, ref: tuple[int, str]) -> None:
        array.flags.writeable = False
        self.array = array
        self.text = array.tobytes().decode("ascii")
        self.ref = ref

    def __reduce__(self):
        return (_table_attr, self.ref)


@functools.lru_cache(maxsize=8)
def _tables_for(seed: int) -> _Tables:
    return _Tables(seed)  # immutable once built; shared by the generators of a seed


def _java_reverse_int32(k: int) -> int:
    r = int(f"{k & 0xFFFFFFFF:032b}"[::-1], 2)
    return r - (1 << 32) if r >= 1 << 31 else r


def _java_abs_int32(v: int) -> int:
    return v if v == -(1 << 31) else abs(v)  # Math.abs(Integer.MIN_VALUE) overflows


# ---------------------------------------------------------------------------------------------
# Column encodings: int64/``S`` numpy arrays, or one of the two compact string encodings below


class CodedStrings:
    """A string column stored as codes into a small table (names, cities, states, channels,
    URLs): cheap to generate, slice and turn into Python strings (shared ``str`` objects)."""

    __slots__ = ("codes", "table")

    def __init__(self, codes: np.ndarray, table: _StrTable) -> None:
        self.codes = codes
        self.table = table

    def __len__(self) -> int:
        return len(self.codes)

    def slice(self, lo: int, hi: int) -> CodedStrings:
        return CodedStrings(self.codes[lo:hi], self.table)

    @staticmethod
    def concat(parts: list[CodedStrings]) -> CodedStrings:
        return CodedStrings(np.concatenate([p.codes for p in parts]), parts[0].table)

    def to_numpy(self) -> np.ndarray:
        return self.table.array[self.codes]

    def to_list(self) -> list[str]:
        return list(map(self.table.strs.__getitem__, self.codes.tolist()))

    def to_arrow(self):
        import pyarrow as pa

        return pa.array(self.table.strs, type=pa.string()).take(pa.array(self.codes))

    def equals(self, other) -> bool:
        return (isinstance(other, CodedStrings) and self.table.strs == other.table.strs
                and np.array_equal(self.codes, other.codes))

    def freeze(self) -> None:
        self.codes.flags.writeable = False


class PoolStrings:
    """A string column stored as ``(offset, length)`` slices of a per-seed letter pool (the
    ``extra`` padding): no per-row bytes are materialised until asked for."""

    __slots__ = ("offsets", "lengths", "pool", "width")

    def __init__(self, offsets: np.ndarray, lengths: np.ndarray, pool: _Pool, width: int) -> None:
        self.offsets = offsets
        self.lengths = lengths
        self.pool = pool
        self.width = width

    def __len__(self) -> int:
        return len(self.offsets)

    def slice(self, lo: int, hi: int) -> PoolStrings:
        return PoolStrings(self.offsets[lo:hi], self.lengths[lo:hi], self.pool, self.width)

    @staticmethod
    def concat(parts: list[PoolStrings]) -> PoolStrings:
        return PoolStrings(np.concatenate([p.offsets for p in parts]),
                           np.concatenate([p.lengths for p in parts]), parts[0].pool,
                           parts[0].width)

    def to_numpy(self) -> np.ndarray:
        """An ``S{width}`` array."""
        windows = np.lib.stride_tricks.sliding_window_view(self.pool.array, self.width)
        mat = windows[self.offsets]
        mat *= np.arange(self.width)[None, :] < self.lengths[:, None]
        return mat.view(f"S{self.width}").reshape(len(self))

    def to_list(self) -> list[str]:
        text = self.pool.text
        return [text[o:e] for o, e in zip(self.offsets.tolist(),
                                          (self.offsets + self.lengths).tolist(), strict=True)]

    def to_arrow(self):
        import pyarrow as pa

        return pa.array(self.to_list(), type=pa.string())

    def equals(self, other) -> bool:
        return (isinstance(other, PoolStrings)
                and (self.pool is other.pool or self.pool.text == other.pool.text)
                and np.array_equal(self.offsets, other.offsets)
                and np.array_equal(self.lengths, other.lengths))

    def freeze(self) -> None:
        self.offsets.flags.writeable = False
        self.lengths.flags.writeable = False


def _col_slice(col, lo: int, hi: int):
    return col[lo:hi] if isinstance(col, np.ndarray) else col.slice(lo, hi)


def _col_concat(parts: list):
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts)
    return type(parts[0]).concat(parts)


def _col_numpy(col) -> np.ndarray:
    return col if isinstance(col, np.ndarray) else col.to_numpy()


def _col_list(col) -> list:
    if isinstance(col, np.ndarray):
        return list(map(bytes.decode, col.tolist())) if col.dtype.kind == "S" else col.tolist()
    return col.to_list()


def _col_arrow(col):
    import pyarrow as pa

    if not isinstance(col, np.ndarray):
        return col.to_arrow()
    if col.dtype.kind == "S":
        return pa.array(col, type=pa.binary()).cast(pa.string())
    return pa.array(col, type=pa.int64())


def _col_equal(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return a.equals(b)


def _col_freeze(col) -> None:
    if isinstance(col, np.ndarray):
        col.flags.writeable = False
    else:
        col.freeze()


# ---------------------------------------------------------------------------------------------
# Columnar batches


class Columns:
    """Columns of one entity kind, in event-number order.

    ``cols.price`` / ``cols["price"]`` give a numpy array (int64, or ``S`` ASCII bytes for
    strings; the compact string encodings are materialised on access); ``cols.data`` holds the
    stored encodings; ``event_number`` is each row's event number. Arrays are read-only views
    when they come straight from the generator's chunk cache.
    """

    __slots__ = ("kind", "fields", "data")

    def __init__(self, kind: int, data: dict) -> None:
        self.kind = kind
        self.fields = FIELDS[kind]
        self.data = data

    def __getattr__(self, name: str) -> np.ndarray:
        if name.startswith("__") or name in Columns.__slots__:
            raise AttributeError(name)  # e.g. pickle probing a half-built instance
        try:
            return _col_numpy(self.data[name])
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, name: str) -> np.ndarray:
        return _col_numpy(self.data[name])

    def __len__(self) -> int:
        return len(self.data["event_number"])

    def slice(self, lo: int, hi: int) -> Columns:
        return Columns(self.kind, {k: _col_slice(v, lo, hi) for k, v in self.data.items()})

    @staticmethod
    def concat(kind: int, parts: list[Columns]) -> Columns:
        if len(parts) == 1:
            return parts[0]
        return Columns(kind, {k: _col_concat([p.data[k] for p in parts]) for k in parts[0].data})

    def column_list(self, name: str) -> list:
        """One column as a Python list (``str`` for strings)."""
        return _col_list(self.data[name])

    def to_records(self, named: bool = True) -> list[tuple]:
        """Rows as ``Person``/``Auction``/``Bid`` named tuples (plain tuples if not ``named``)."""
        with _gc_paused():
            cols = [self.column_list(f) for f in self.fields]
            if named:
                return list(map(ENTITY_TYPES[self.kind]._make, zip(*cols, strict=True)))
            return list(zip(*cols, strict=True))

    def to_arrow(self):
        """A ``pyarrow.Table`` with the standard snake_case columns (strings as utf8)."""
        import pyarrow as pa

        return pa.Table.from_arrays([_col_arrow(self.data[f]) for f in self.fields],
                                    names=list(self.fields))

    def equals(self, other: Columns) -> bool:
        return (self.kind == other.kind and self.data.keys() == other.data.keys()
                and all(_col_equal(v, other.data[k]) for k, v in self.data.items()))


@contextmanager
def _gc_paused():
    """Building millions of tuples triggers the cyclic GC over and over; pause it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Records(NamedTuple):
    persons: list[tuple]
    person_times: list[int]
    auctions: list[tuple]
    auction_times: list[int]
    bids: list[tuple]
    bid_times: list[int]


@dataclass(frozen=True, eq=False)
class EventBatch:
    """Events with numbers ``[start, start + count)``, as numpy columns per kind."""

    config: NexmarkConfig
    start: int
    count: int
    persons: Columns
    auctions: Columns
    bids: Columns

    def __len__(self) -> int:
        return self.count

    @property
    def event_numbers(self) -> np.ndarray:
        return np.arange(self.start, self.start + self.count, dtype=np.int64)

    @property
    def kinds(self) -> np.ndarray:
        """Kind of every event (0 person, 1 auction, 2 bid), in event order."""
        return self.config.kind_of(self.event_numbers)

    @property
    def date_time(self) -> np.ndarray:
        """Event time (ms) of every event, in event order."""
        return self.config.timestamp_for_event(self.event_numbers)

    def by_kind(self, kind: int) -> Columns:
        return (self.persons, self.auctions, self.bids)[kind]

    def to_records(self, named: bool = True) -> Records:
        """Per-kind lists of tuples plus parallel lists of their event times (ms)."""
        return Records(self.persons.to_records(named), self.persons.date_time.tolist(),
                       self.auctions.to_records(named), self.auctions.date_time.tolist(),
                       self.bids.to_records(named), self.bids.date_time.tolist())

    def to_events(self, named: bool = True) -> list[tuple]:
        """All events in event-number order, as ``Person``/``Auction``/``Bid`` tuples."""
        out: list = [None] * self.count
        for cols in (self.persons, self.auctions, self.bids):
            for pos, rec in zip((cols.event_number - self.start).tolist(),
                                cols.to_records(named), strict=True):
                out[pos] = rec
        return out

    def equals(self, other: EventBatch) -> bool:
        return (self.config == other.config and self.start == other.start
                and self.count == other.count and self.persons.equals(other.persons)
                and self.auctions.equals(other.auctions) and self.bids.equals(other.bids))

    @staticmethod
    def concat(batches: list[EventBatch]) -> EventBatch:
        """Concatenate consecutive batches (each must start where the previous one ends)."""
        if not batches:
            raise ValueError("no batches")
        for a, b in zip(batches, batches[1:], strict=False):
            if a.start + a.count != b.start or a.config != b.config:
                raise ValueError("batches are not consecutive ranges of one config")
        return EventBatch(batches[0].config, batches[0].start, sum(b.count for b in batches),
                          *(Columns.concat(k, [b.by_kind(k) for b in batches])
                            for k in (PERSON, AUCTION, BID)))


# ---------------------------------------------------------------------------------------------
# Generator


class NexmarkGenerator:
    """Generates any range of the (conceptually infinite) NEXMark event sequence of a config.

    Keeps the last ``cache_chunks`` generated chunks so that consecutive small ranges do not
    regenerate them; not thread-safe (use one generator per thread).
    """

    def __init__(self, config: NexmarkConfig | None = None, cache_chunks: int = 4) -> None:
        self.config = config or NexmarkConfig()
        self._tables = _tables_for(self.config.seed)
        self._cache: OrderedDict[int, tuple[Columns, Columns, Columns]] = OrderedDict()
        self._cache_chunks = cache_chunks
        cfg = self.config
        self._width_person_extra = _extra_width(cfg.avg_person_byte_size, 8)
        self._width_auction_extra = _extra_width(cfg.avg_auction_byte_size, 48)
        self._width_bid_extra = _extra_width(cfg.avg_bid_byte_size, 32)

    def __reduce__(self):
        return (NexmarkGenerator, (self.config, self._cache_chunks))  # tables/cache rebuild

    # --- public API ---------------------------------------------------------------------------

    def events(self, start: int, count: int) -> EventBatch:
        """Events with numbers ``[start, start + count)``."""
        if start < 0 or count < 0:
            raise ValueError("start and count must be >= 0")
        end = start + count
        parts: list[list[Columns]] = [[], [], []]
        first = start // CHUNK_SIZE
        last = (end - 1) // CHUNK_SIZE if count else first
        for c in range(first, last + 1):
            chunk = self._chunk(c)
            lo, hi = max(start, c * CHUNK_SIZE), min(end, (c + 1) * CHUNK_SIZE)
            for kind in (PERSON, AUCTION, BID):
                cols = chunk[kind]
                i, j = np.searchsorted(cols.event_number, (lo, hi))
                parts[kind].append(cols.slice(int(i), int(j)))
        return EventBatch(self.config, start, count,
                          *(Columns.concat(k, parts[k]) for k in (PERSON, AUCTION, BID)))

    def batches(self, batch_size: int = 65_536, start: int = 0,
                stop: int | None = None) -> Iterator[EventBatch]:
        """Consecutive batches from ``start`` to ``stop`` (default ``config.num_events``;
        endless if that is 0)."""
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if stop is None:
            stop = self.config.num_events if self.config.num_events else None
        n = start
        while stop is None or n < stop:
            k = batch_size if stop is None else min(batch_size, stop - n)
            yield self.events(n, k)
            n += k

    # --- chunk generation -----------------------------------------------------------------

    def _chunk(self, c: int) -> tuple[Columns, Columns, Columns]:
        hit = self._cache.get(c)
        if hit is not None:
            self._cache.move_to_end(c)
            return hit
        result = self._generate_chunk(c)
        for cols in result:
            for col in cols.data.values():
                _col_freeze(col)
        self._cache[c] = result
        while len(self._cache) > self._cache_chunks:
            self._cache.popitem(last=False)
        return result

    def _generate_chunk(self, c: int) -> tuple[Columns, Columns, Columns]:
        cfg = self.config
        rng = _philox(cfg.seed, _STREAM_EVENTS, c)
        n = np.arange(c * CHUNK_SIZE, (c + 1) * CHUNK_SIZE, dtype=np.int64)
        kinds = cfg.kind_of(n)
        return (self._persons(rng, n[kinds == PERSON]),
                self._auctions(rng, n[kinds == AUCTION]),
                self._bids(rng, n[kinds == BID]))

    def _next_base0_person_id(self, rng: np.random.Generator, n: np.ndarray) -> np.ndarray:
        """A random recent person: one of the last ``num_active_people`` (+ a lead)."""
        lead = 0 if self.config.strict_foreign_keys else PERSON_ID_LEAD
        num_people = self.config.last_base0_person_id(n) + 1
        active = np.minimum(num_people, self.config.num_active_people)
        return num_people - active + rng.integers(0, active + lead)

    def _next_base0_auction_id(self, rng: np.random.Generator, n: np.ndarray) -> np.ndarray:
        """A random auction among those likely still in flight (+ a lead)."""
        lead = 0 if self.config.strict_foreign_keys else AUCTION_ID_LEAD
        last = self.config.last_base0_auction_id(n)
        lowest = np.maximum(last - self.config.num_in_flight_auctions, 0)
        return lowest + rng.integers(0, last - lowest + 1 + lead)

    def _persons(self, rng: np.random.Generator, n: np.ndarray) -> Columns:
        cfg, t = self.config, self._tables
        m = len(n)
        ts = cfg.timestamp_for_event(n)
        ids = cfg.last_base0_person_id(n) + FIRST_PERSON_ID
        name = CodedStrings(rng.integers(0, len(FIRST_NAMES), m) * len(LAST_NAMES)
                            + rng.integers(0, len(LAST_NAMES), m), t.names)
        email = np.char.add(np.char.add(np.char.add(_next_string(rng, m, 7), b"@"),
                                        _next_string(rng, m, 5)), b".com")
        digits = rng.integers(0, 10, (m, 16), dtype=np.uint8) + ord("0")
        card = np.full((m, 19), ord(" "), dtype=np.uint8)
        for g in range(4):
            card[:, 5 * g:5 * g + 4] = digits[:, 4 * g:4 * g + 4]
        credit_card = card.view("S19").reshape(m)
        city = CodedStrings(rng.integers(0, len(US_CITIES), m), t.cities)
        state = CodedStrings(rng.integers(0, len(US_STATES), m), t.states)
        current = (8 + t.names_len[name.codes] + _str_len(email) + 19 + t.cities_len[city.codes]
                   + t.states_len[state.codes])
        extra = t.extra(rng, current, cfg.avg_person_byte_size, self._width_person_extra)
        return Columns(PERSON, {
            "event_number": n, "id": ids, "name": name, "email_address": email,
            "credit_card": credit_card, "city": city, "state": state, "date_time": ts,
            "extra": extra})

    def _auctions(self, rng: np.random.Generator, n: np.ndarray) -> Columns:
        cfg, t = self.config, self._tables
        m = len(n)
        ts = cfg.timestamp_for_event(n)
        ids = cfg.last_base0_auction_id(n) + FIRST_AUCTION_ID
        hot = rng.integers(0, cfg.hot_sellers_ratio, m) > 0
        hot_seller = (cfg.last_base0_person_id(n) // HOT_SELLER_RATIO) * HOT_SELLER_RATIO
        seller = np.where(hot, hot_seller, self._next_base0_person_id(rng, n)) + FIRST_PERSON_ID
        category = FIRST_CATEGORY_ID + rng.integers(0, NUM_CATEGORIES, m)
        initial_bid = _next_price(rng, m)
        # auction length: uniform in 1 .. 2 * (time until num_in_flight_auctions more auctions)
        ahead = (cfg.num_in_flight_auctions * cfg.total_proportion) // cfg.auction_proportion
        horizon = cfg.timestamp_for_event(n + ahead) - ts
        expires = ts + 1 + rng.integers(0, np.maximum(horizon * 2, 1))
        item_name = _next_string(rng, m, 20)
        description = _next_string(rng, m, 100)
        reserve = initial_bid + _next_price(rng, m)
        current = 8 + _str_len(item_name) + _str_len(description) + 40
        extra = t.extra(rng, current, cfg.avg_auction_byte_size, self._width_auction_extra)
        return Columns(AUCTION, {
            "event_number": n, "id": ids, "item_name": item_name, "description": description,
            "initial_bid": initial_bid, "reserve": reserve, "date_time": ts, "expires": expires,
            "seller": seller, "category": category, "extra": extra})

    def _bids(self, rng: np.random.Generator, n: np.ndarray) -> Columns:
        cfg, t = self.config, self._tables
        m = len(n)
        ts = cfg.timestamp_for_event(n)
        hot = rng.integers(0, cfg.hot_auction_ratio, m) > 0
        hot_auction = (cfg.last_base0_auction_id(n) // HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO
        auction = np.where(hot, hot_auction, self._next_base0_auction_id(rng, n))
        auction += FIRST_AUCTION_ID
        hot = rng.integers(0, cfg.hot_bidders_ratio, m) > 0
        last_person = cfg.last_base0_person_id(n)
        hot_bidder = (last_person // HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1
        if cfg.strict_foreign_keys:
            hot_bidder = np.minimum(hot_bidder, last_person)
        bidder = np.where(hot, hot_bidder, self._next_base0_person_id(rng, n)) + FIRST_PERSON_ID
        price = _next_price(rng, m)
        hot = rng.integers(0, HOT_CHANNELS_RATIO, m) > 0
        channel_index = np.where(hot, rng.integers(0, len(HOT_CHANNELS), m),
                                 len(HOT_CHANNELS) + rng.integers(0, CHANNELS_NUMBER, m))
        extra = t.extra(rng, np.full(m, 32, dtype=np.int64), cfg.avg_bid_byte_size,
                        self._width_bid_extra)
        return Columns(BID, {
            "event_number": n, "auction": auction, "bidder": bidder, "price": price,
            "channel": CodedStrings(channel_index, t.channels),
            "url": CodedStrings(channel_index, t.urls),
            "date_time": ts, "extra": extra})
