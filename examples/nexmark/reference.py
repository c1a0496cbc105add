"""Plain-Python reference implementations of NEXMark queries (the oracle for engine results).

Inputs are lists of ``Person``/``Auction``/``Bid`` tuples (named or plain, in the field order
of :mod:`examples.nexmark.generator`). A record's event time is its ``date_time`` field unless a
parallel list of timestamps (ms) is passed. Windows follow Flink's event-time semantics: a
record at time ``t`` belongs to every window ``[start, start + size)`` with ``start`` a multiple
of ``slide`` (plus ``offset``) and ``start <= t < start + size``
(``SlidingEventTimeWindows.assignWindows``; tumbling windows are ``slide == size``). Every window
that receives at least one record is complete (the input is bounded), so results are those of a
run whose final watermark passes all windows.

Output order: Q1 and Q2 keep input order; the windowed queries are sorted (see each function).

Queries follow the Flink SQL of the NEXMark suite (nexmark/nexmark,
``nexmark-flink/src/main/resources/queries/q*.sql``):

* Q1 currency conversion: ``SELECT auction, bidder, 0.908 * price AS price, dateTime FROM bid``.
* Q2 selection: ``SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0``. (The original
  CQL query selected ``auction IN (1007, 1020, 2001, 2019, 2087)``; the Flink/Beam versions use
  every 123rd auction so that results keep coming.)
* Q5 hot items: ``HOP(bid, dateTime, 2 s slide, 10 s size)``, bids per auction per window, keep
  the auctions whose count is the window's maximum (ties all kept).
* Q7 highest bid: ``TUMBLE(bid, dateTime, 10 s)``, the bids whose price equals the window's
  maximum. (The Flink SQL joins back on ``price = maxprice AND dateTime BETWEEN window_end - 10 s
  AND window_end``, which would also admit a bid at exactly ``window_end`` -- i.e. one of the next
  window -- if it had the same price; here a bid only counts for the windows it belongs to.)
* Q8 monitor new users: ``TUMBLE(person)`` and ``TUMBLE(auction)`` of 10 s joined on
  ``person.id = auction.seller`` and equal window bounds: people who registered and created an
  auction in the same window.

The sliding variants of Q7 and Q8 (used by the DRRS evaluation) take ``size_ms``/``slide_ms``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

# field positions (see generator.Person / Auction / Bid)
_P_ID, _P_NAME, _P_TIME = 0, 1, 6
_A_TIME, _A_SELLER = 5, 7
_B_AUCTION, _B_BIDDER, _B_PRICE, _B_TIME = 0, 1, 2, 5

DOLLAR_TO_EURO = 0.908
Q2_AUCTION_MODULUS = 123
DEFAULT_WINDOW_MS = 10_000
Q5_SLIDE_MS = 2_000


def window_starts(ts: int, size_ms: int, slide_ms: int | None = None,
                  offset_ms: int = 0) -> list[int]:
    """Starts of the windows containing time ``ts``, ascending (Flink's window assignment)."""
    slide = size_ms if slide_ms is None else slide_ms
    if size_ms <= 0 or slide <= 0:
        raise ValueError("window size and slide must be > 0")
    last = ts - (ts - offset_ms + slide) % slide  # TimeWindow.getWindowStartWithOffset
    starts = []
    start = last
    while start > ts - size_ms:
        starts.append(start)
        start -= slide
    starts.reverse()
    return starts


def _times(records: Sequence, timestamps: Sequence[int] | None, field: int) -> Sequence[int]:
    if timestamps is None:
        return [r[field] for r in records]
    if len(timestamps) != len(records):
        raise ValueError("timestamps must be parallel to the records")
    return timestamps


def q1(bids: Sequence) -> list[tuple]:
    """Currency conversion: ``(auction, bidder, 0.908 * price, date_time)`` per bid, in input
    order. The price is a float (``0.908 * price``; IEEE multiplication is commutative, so
    ``price * 0.908`` gives the same value)."""
    return [(b[_B_AUCTION], b[_B_BIDDER], DOLLAR_TO_EURO * b[_B_PRICE], b[_B_TIME]) for b in bids]


def q2(bids: Sequence, modulus: int = Q2_AUCTION_MODULUS) -> list[tuple]:
    """Selection: ``(auction, price)`` of the bids with ``auction % modulus == 0``, input order."""
    return [(b[_B_AUCTION], b[_B_PRICE]) for b in bids if b[_B_AUCTION] % modulus == 0]


def q5(bids: Sequence, timestamps: Sequence[int] | None = None,
       size_ms: int = DEFAULT_WINDOW_MS, slide_ms: int = Q5_SLIDE_MS) -> list[tuple]:
    """Hot items: per sliding window the auction(s) with the most bids.

    Returns ``(window_start, window_end, auction, count)`` sorted by window start, then auction.
    """
    counts: dict[int, Counter] = defaultdict(Counter)
    for bid, ts in zip(bids, _times(bids, timestamps, _B_TIME), strict=True):
        for start in window_starts(ts, size_ms, slide_ms):
            counts[start][bid[_B_AUCTION]] += 1
    out = []
    for start in sorted(counts):
        per_auction = counts[start]
        top = max(per_auction.values())
        out.extend((start, start + size_ms, auction, top)
                   for auction in sorted(a for a, c in per_auction.items() if c == top))
    return out


def q7_sliding(bids: Sequence, timestamps: Sequence[int] | None = None,
               size_ms: int = DEFAULT_WINDOW_MS, slide_ms: int = DEFAULT_WINDOW_MS) -> list[tuple]:
    """Highest bid per (sliding) window: every bid whose price is its window's maximum.

    Returns ``(window_start, window_end, auction, bidder, price, date_time)`` sorted (tuple
    order). A bid is reported once per window it tops.
    """
    windows: dict[int, list] = defaultdict(list)
    for bid, ts in zip(bids, _times(bids, timestamps, _B_TIME), strict=True):
        for start in window_starts(ts, size_ms, slide_ms):
            windows[start].append(bid)
    out = []
    for start, members in windows.items():
        top = max(b[_B_PRICE] for b in members)
        out.extend((start, start + size_ms, b[_B_AUCTION], b[_B_BIDDER], b[_B_PRICE], b[_B_TIME])
                   for b in members if b[_B_PRICE] == top)
    out.sort()
    return out


def q7(bids: Sequence, timestamps: Sequence[int] | None = None,
       size_ms: int = DEFAULT_WINDOW_MS) -> list[tuple]:
    """Highest bid per tumbling window (see :func:`q7_sliding` for the output)."""
    return q7_sliding(bids, timestamps, size_ms, size_ms)


def q8_sliding(persons: Sequence, auctions: Sequence,
               person_times: Sequence[int] | None = None,
               auction_times: Sequence[int] | None = None,
               size_ms: int = DEFAULT_WINDOW_MS, slide_ms: int = DEFAULT_WINDOW_MS) -> list[tuple]:
    """New users per (sliding) window: people who registered in a window and were the seller of
    an auction created in the same window.

    Returns distinct ``(person_id, name, window_start)`` sorted by window start, then id, name.
    """
    people: dict[int, set] = defaultdict(set)
    for p, ts in zip(persons, _times(persons, person_times, _P_TIME), strict=True):
        for start in window_starts(ts, size_ms, slide_ms):
            people[start].add((p[_P_ID], p[_P_NAME]))
    sellers: dict[int, set] = defaultdict(set)
    for a, ts in zip(auctions, _times(auctions, auction_times, _A_TIME), strict=True):
        for start in window_starts(ts, size_ms, slide_ms):
            sellers[start].add(a[_A_SELLER])
    rows = {(pid, name, start) for start, members in people.items()
            for pid, name in members if pid in sellers.get(start, ())}
    return sorted(rows, key=lambda r: (r[2], r[0], r[1]))


def q8(persons: Sequence, auctions: Sequence, person_times: Sequence[int] | None = None,
       auction_times: Sequence[int] | None = None,
       size_ms: int = DEFAULT_WINDOW_MS) -> list[tuple]:
    """New users per tumbling window (see :func:`q8_sliding` for the output)."""
    return q8_sliding(persons, auctions, person_times, auction_times, size_ms, size_ms)
