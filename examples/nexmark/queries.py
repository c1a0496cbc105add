"""NEXMark Q1, Q2, Q5, Q7 and Q8 as reflow jobs (outputs equal ``reference.py``'s exactly).

Each ``build_qN(job, source, sink, ...)`` adds one query to ``job`` and returns nothing:

* ``source`` is a :class:`~examples.nexmark.source.NexmarkSource`; the query takes its config,
  bounds, pacing and timestamps and picks the kinds it needs (``source.with_kinds``). Windowed
  queries need event-time timestamps that track the event order (``event_time=True``, or the
  scheduled emission time of an open-loop source); the sources get ``watermarks`` (default
  :data:`DEFAULT_WATERMARKS`: no out-of-orderness, which is exact for this generator).
* ``sink`` is a Sink or a list of Sinks (each gets every output).
* ``parallelism`` is the parallelism of the query's operators (default: the job's);
  ``source_parallelism`` that of its sources (default: ``parallelism``).
* ``prefix`` (default ``"qN"``) starts every operator name, so that one job can hold several
  queries (e.g. Q7 tumbling and sliding).

Operator names with the default prefix (``OPERATORS``; the keyed ones, ``RESCALABLE``, can be
rescaled by name):

* Q1 ``q1-bids`` -> ``q1-convert`` (map; chained into the source) -> ``q1-sink``.
  ``(auction, bidder, 0.908 * price, date_time)`` per bid.
* Q2 ``q2-bids`` -> ``q2-filter`` -> ``q2-project`` -> ``q2-sink``:
  ``(auction, price)`` of the bids with ``auction % 123 == 0``.
* Q5 hot items: ``q5-bids`` -> ``q5-project`` (auction) -> ``q5-count`` (keyed by auction,
  sliding event-time windows, a count per auction and window, emitted as
  ``(start, end, auction, count)``) -> ``q5-hot-items`` (keyed by window start: the maximum
  count of each window and the auctions that reach it) -> ``q5-sink``.
  ``(window_start, window_end, auction, count)``.
* Q7 highest bid: ``q7-bids`` -> ``q7-project`` -> ``q7-partial-max`` (keyed by a bucket of the
  price, ``price % buckets``: per bucket and window the highest price and its bids; auction and
  bidder are too skewed to key by, half of the bids go to one hot auction) ->
  ``q7-highest-bid`` (keyed by window start: merges the buckets' maxima) -> ``q7-sink``.
  Tumbling windows by default; ``slide_ms`` gives the sliding variant (the DRRS paper's).
  ``(window_start, window_end, auction, bidder, price, date_time)`` per top bid.
  ``hold_bids=True``: the first stage holds every bid of each window, its ``extra`` padding
  included, and picks the top ones when the window fires (``q7_top_bids``), as a window
  operator with a window function does (Flink's NEXMark Q7 joins the window's bids with their
  maximum): the same results, with state that grows with the window's bids and their size
  (``NexmarkConfig.avg_bid_byte_size``); by default it keeps a running maximum per bucket and
  window (``MaxBids``: a few bids, whatever the padding).
* Q8 new users: ``q8-persons`` -> ``q8-person-project`` ``(id, name)`` and ``q8-auctions`` ->
  ``q8-auction-project`` (seller), joined by ``q8-join`` (``window_join``, keyed by person id
  / seller) -> ``q8-new-users`` (keyed by id: one output per person and window, since a person
  with several auctions in a window joins several times) -> ``q8-sink``.
  ``(person_id, name, window_start)``. Tumbling by default; ``slide_ms`` for sliding windows.
  ``hold_extra`` (kinds, e.g. ``("persons",)``): the projections of those kinds keep the
  event's ``extra`` padding, so the join's windows hold it (``(id, name, extra)``,
  ``(seller, extra)``): the same results, with state sized by
  ``NexmarkConfig.avg_person_byte_size`` / ``avg_auction_byte_size``; by default the join
  holds ``(id, name)`` and sellers (a few dozen bytes per event, whatever the padding).

The second stage of Q5 and Q7 collects the first stage's results of one window: those all
carry the window's ``max_timestamp`` (``end - 1``) as timestamp and reach the second stage
before the watermark passes it, so a 1 ms tumbling event-time window keyed by the window start
holds exactly them and fires as soon as they are complete.

Q8's join function does not see the window, so ``q8-new-users`` recovers the window start from
the timestamp the join gives its outputs (the window's ``max_timestamp``) and drops repeats.

Output order: as the reference's only where the reference keeps input order (Q1, Q2 at
parallelism 1); compare the windowed queries sorted (``sort_results``).
``reference_results(query, source, ...)`` runs ``reference.py`` on the same events.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

from engine import (
    AggregateFunction,
    KeyedProcessFunction,
    Sink,
    StreamJob,
    WatermarkStrategy,
    Window,
    sliding_event_time,
    tumbling_event_time,
)
from examples.nexmark.reference import (
    DEFAULT_WINDOW_MS,
    DOLLAR_TO_EURO,
    Q2_AUCTION_MODULUS,
    Q5_SLIDE_MS,
)
from examples.nexmark.source import NexmarkSource

#: watermarks of the query sources: events of a source task come in date_time order
DEFAULT_WATERMARKS = WatermarkStrategy(max_out_of_orderness_ms=0, interval_ms=50.0)
#: default number of price buckets keying Q7's first stage
Q7_BUCKETS = 256

OPERATORS: dict[str, tuple[str, ...]] = {
    "q1": ("q1-bids", "q1-convert", "q1-sink"),
    "q2": ("q2-bids", "q2-filter", "q2-project", "q2-sink"),
    "q5": ("q5-bids", "q5-project", "q5-count", "q5-hot-items", "q5-sink"),
    "q7": ("q7-bids", "q7-project", "q7-partial-max", "q7-highest-bid", "q7-sink"),
    "q8": ("q8-persons", "q8-auctions", "q8-person-project", "q8-auction-project", "q8-join",
           "q8-new-users", "q8-sink"),
}
#: the keyed operators of each query (``JobHandle.rescale`` takes these names)
RESCALABLE: dict[str, tuple[str, ...]] = {
    "q1": (), "q2": (),
    "q5": ("q5-count", "q5-hot-items"),
    "q7": ("q7-partial-max", "q7-highest-bid"),
    "q8": ("q8-join", "q8-new-users"),
}

# field positions (see generator.Person / Auction / Bid)
_P_ID, _P_NAME = 0, 1
_A_SELLER = 7
_B_AUCTION, _B_BIDDER, _B_PRICE, _B_TIME, _B_EXTRA = 0, 1, 2, 5, 6
_P_EXTRA, _A_EXTRA = 7, 9


# ------------------------------------------------------------------------- shared plumbing


def _sinks(sink: Sink | Sequence[Sink]) -> list[Sink]:
    sinks = [sink] if isinstance(sink, Sink) else list(sink)
    if not sinks or not all(isinstance(s, Sink) for s in sinks):
        raise ValueError("sink must be an engine Sink or a non-empty list of them")
    return sinks


def _add_sinks(stream: Any, sink: Sink | Sequence[Sink], prefix: str,
               parallelism: int | None) -> None:
    for i, s in enumerate(_sinks(sink)):
        stream.sink(s, name=f"{prefix}-sink" if i == 0 else f"{prefix}-sink-{i + 1}",
                    parallelism=parallelism)


def _source(job: StreamJob, source: NexmarkSource, kinds: str, name: str,
            parallelism: int | None, watermarks: WatermarkStrategy | None) -> Any:
    if not isinstance(source, NexmarkSource):
        raise TypeError("source must be a NexmarkSource")
    return job.source(source.with_kinds(kinds), name=name, parallelism=parallelism,
                      watermarks=watermarks)


def _assigner(size_ms: int, slide_ms: int | None) -> Any:
    if slide_ms is None or slide_ms == size_ms:
        return tumbling_event_time(size_ms)
    return sliding_event_time(size_ms, slide_ms)


def _par(job: StreamJob, parallelism: int | None) -> int:
    return job.default_parallelism if parallelism is None else parallelism


# ------------------------------------------------------------------------------- Q1 and Q2


def q1_convert(bid: Sequence[Any]) -> tuple[int, int, float, int]:
    return (bid[_B_AUCTION], bid[_B_BIDDER], DOLLAR_TO_EURO * bid[_B_PRICE], bid[_B_TIME])


def q2_selected(bid: Sequence[Any], modulus: int = Q2_AUCTION_MODULUS) -> bool:
    return bid[_B_AUCTION] % modulus == 0


def q2_project(bid: Sequence[Any]) -> tuple[int, int]:
    return (bid[_B_AUCTION], bid[_B_PRICE])


def build_q1(job: StreamJob, source: NexmarkSource, sink: Sink | Sequence[Sink], *,
             prefix: str | None = None,
             parallelism: int | None = None, source_parallelism: int | None = None,
             watermarks: WatermarkStrategy | None = None) -> None:
    """Currency conversion (see the module docstring)."""
    n = prefix or "q1"
    p = _par(job, parallelism)
    bids = _source(job, source, "bids", f"{n}-bids", _or(source_parallelism, p), watermarks)
    _add_sinks(bids.map(q1_convert, name=f"{n}-convert", parallelism=p), sink, n, p)


def build_q2(job: StreamJob, source: NexmarkSource, sink: Sink | Sequence[Sink], *,
             prefix: str | None = None,
             modulus: int = Q2_AUCTION_MODULUS, parallelism: int | None = None,
             source_parallelism: int | None = None,
             watermarks: WatermarkStrategy | None = None) -> None:
    """Selection: the bids of every ``modulus``-th auction (``reference.q2``'s predicate)."""
    n = prefix or "q2"
    p = _par(job, parallelism)
    bids = _source(job, source, "bids", f"{n}-bids", _or(source_parallelism, p), watermarks)
    pred = q2_selected if modulus == Q2_AUCTION_MODULUS else functools.partial(
        q2_selected, modulus=modulus)
    selected = bids.filter(pred, name=f"{n}-filter", parallelism=p)
    _add_sinks(selected.map(q2_project, name=f"{n}-project"), sink, n, p)


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


# -------------------------------------------------------------------------------------- Q5


def bid_auction(bid: Sequence[Any]) -> int:
    return bid[_B_AUCTION]


def identity(x: Any) -> Any:
    return x


def first_field(record: Sequence[Any]) -> Any:
    return record[0]


class Count(AggregateFunction):
    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, accumulator: int) -> int:
        return accumulator + 1


def q5_count_result(auction: int, window: Window, count: int) -> list[tuple[int, int, int, int]]:
    return [(window.start, window.end, auction, count)]


class TopCount(AggregateFunction):
    """Over ``(start, end, auction, count)`` of one window: ``[end, top count, [auctions]]``."""

    def create_accumulator(self) -> list:
        return [0, 0, []]

    def add(self, value: Sequence[Any], acc: list) -> list:
        _, end, auction, count = value
        if count > acc[1]:
            return [end, count, [auction]]
        if count == acc[1]:
            acc[2].append(auction)
        return acc


def q5_hot_items_result(start: int, window: Window, acc: list) -> list[tuple[int, int, int, int]]:
    end, top, auctions = acc
    return [(start, end, a, top) for a in sorted(auctions)]


def build_q5(job: StreamJob, source: NexmarkSource, sink: Sink | Sequence[Sink], *,
             prefix: str | None = None,
             size_ms: int = DEFAULT_WINDOW_MS, slide_ms: int = Q5_SLIDE_MS,
             parallelism: int | None = None, source_parallelism: int | None = None,
             watermarks: WatermarkStrategy | None = DEFAULT_WATERMARKS) -> None:
    """Hot items: per sliding window the auctions with the most bids."""
    n = prefix or "q5"
    p = _par(job, parallelism)
    bids = _source(job, source, "bids", f"{n}-bids", _or(source_parallelism, p), watermarks)
    counts = (bids.map(bid_auction, name=f"{n}-project")
              .key_by(identity)
              .window(sliding_event_time(size_ms, slide_ms))
              .aggregate(Count(), window_fn=q5_count_result, name=f"{n}-count", parallelism=p))
    hot = (counts.key_by(first_field)
           .window(tumbling_event_time(1))
           .aggregate(TopCount(), window_fn=q5_hot_items_result, name=f"{n}-hot-items",
                      parallelism=p))
    _add_sinks(hot, sink, n, p)


# -------------------------------------------------------------------------------------- Q7


def q7_project(bid: Sequence[Any]) -> tuple[int, int, int, int]:
    return (bid[_B_AUCTION], bid[_B_BIDDER], bid[_B_PRICE], bid[_B_TIME])


def q7_project_held(bid: Sequence[Any]) -> tuple[int, int, int, int, str]:
    """``q7_project`` plus the bid's ``extra`` padding (what ``hold_bids`` windows hold)."""
    return (bid[_B_AUCTION], bid[_B_BIDDER], bid[_B_PRICE], bid[_B_TIME], bid[_B_EXTRA])


def q7_top_bids(bucket: int, window: Window, bids: Sequence[Sequence[Any]]) -> list[tuple]:
    """The ``hold_bids`` first stage's window function: over every bid the window held
    (``q7_project_held``, in arrival order), ``(start, end, top price, top bids)`` with the
    bids at the top price in arrival order and without their padding: exactly what
    ``MaxBids`` and ``q7_partial_result`` give for the same bids."""
    top = max(b[2] for b in bids)
    return [(window.start, window.end, top, tuple(tuple(b[:4]) for b in bids if b[2] == top))]


def price_bucket(bid: Sequence[Any], buckets: int = Q7_BUCKETS) -> int:
    return bid[2] % buckets


class MaxBids(AggregateFunction):
    """Over projected bids ``(auction, bidder, price, date_time)``: ``[top price, [bids]]``."""

    def create_accumulator(self) -> list:
        return [-1, []]

    def add(self, bid: Sequence[Any], acc: list) -> list:
        price = bid[2]
        if price > acc[0]:
            return [price, [bid]]
        if price == acc[0]:
            acc[1].append(bid)
        return acc


def q7_partial_result(bucket: int, window: Window, acc: list) -> list[tuple]:
    return [(window.start, window.end, acc[0], tuple(acc[1]))]


class MergeMaxBids(AggregateFunction):
    """Over ``(start, end, price, bids)`` of one window: ``[end, top price, [bids]]``."""

    def create_accumulator(self) -> list:
        return [0, -1, []]

    def add(self, value: Sequence[Any], acc: list) -> list:
        _, end, price, bids = value
        if price > acc[1]:
            return [end, price, list(bids)]
        if price == acc[1]:
            acc[2].extend(bids)
        return acc


def q7_result(start: int, window: Window, acc: list) -> list[tuple]:
    end, _, bids = acc
    return [(start, end, *b) for b in sorted(tuple(b) for b in bids)]


def build_q7(job: StreamJob, source: NexmarkSource, sink: Sink | Sequence[Sink], *,
             prefix: str | None = None,
             size_ms: int = DEFAULT_WINDOW_MS, slide_ms: int | None = None,
             buckets: int = Q7_BUCKETS, parallelism: int | None = None,
             source_parallelism: int | None = None,
             watermarks: WatermarkStrategy | None = DEFAULT_WATERMARKS,
             partial: AggregateFunction | None = None, hold_bids: bool = False) -> None:
    """Highest bid per tumbling window (``slide_ms``: per sliding window). ``partial``: the
    first stage's aggregate (default ``MaxBids()``; the autoscaling benchmark gives it a
    service time). ``hold_bids``: the first stage holds the window's bids (module
    docstring); not with ``partial``."""
    n = prefix or "q7"
    if buckets < 1:
        raise ValueError("buckets must be >= 1")
    if hold_bids and partial is not None:
        raise ValueError("hold_bids picks the top bids itself: give no partial aggregate")
    p = _par(job, parallelism)
    bids = _source(job, source, "bids", f"{n}-bids", _or(source_parallelism, p), watermarks)
    key = price_bucket if buckets == Q7_BUCKETS else functools.partial(price_bucket,
                                                                       buckets=buckets)
    windowed = (bids.map(q7_project_held if hold_bids else q7_project, name=f"{n}-project")
                .key_by(key)
                .window(_assigner(size_ms, slide_ms)))
    if hold_bids:
        partial = windowed.process(q7_top_bids, name=f"{n}-partial-max", parallelism=p)
    else:
        partial = windowed.aggregate(partial or MaxBids(), window_fn=q7_partial_result,
                                     name=f"{n}-partial-max", parallelism=p)
    highest = (partial.key_by(first_field)
               .window(tumbling_event_time(1))
               .aggregate(MergeMaxBids(), window_fn=q7_result, name=f"{n}-highest-bid",
                          parallelism=p))
    _add_sinks(highest, sink, n, p)


# -------------------------------------------------------------------------------------- Q8


def person_id_name(person: Sequence[Any]) -> tuple[int, str]:
    return (person[_P_ID], person[_P_NAME])


def auction_seller(auction: Sequence[Any]) -> int:
    return auction[_A_SELLER]


def person_id_name_extra(person: Sequence[Any]) -> tuple[int, str, str]:
    """``person_id_name`` plus the ``extra`` padding (``hold_extra`` persons)."""
    return (person[_P_ID], person[_P_NAME], person[_P_EXTRA])


def auction_seller_extra(auction: Sequence[Any]) -> tuple[int, str]:
    """The seller and the ``extra`` padding (``hold_extra`` auctions; keyed by the seller)."""
    return (auction[_A_SELLER], auction[_A_EXTRA])


def q8_join(person: Sequence[Any], seller: int) -> tuple[int, str]:
    return (person[0], person[1])


class NewUsers(KeyedProcessFunction):
    """Keyed by person id; input ``(id, name)`` from the window join, whose timestamp is the
    window's ``max_timestamp``. Emits ``(id, name, window_start)`` once per window and forgets
    the window when the watermark passes it."""

    def __init__(self, size_ms: int) -> None:
        self.size_ms = size_ms

    def open(self, ctx: Any) -> None:
        self.seen = ctx.map_state("windows")

    def process_element(self, value: Sequence[Any], ctx: Any) -> Iterable[tuple]:
        start = ctx.timestamp + 1 - self.size_ms
        if self.seen.contains(start):
            return ()
        self.seen.put(start, True)
        ctx.timer_service.register_event_time_timer(ctx.timestamp)
        return ((value[0], value[1], start),)

    def on_timer(self, timestamp: int, ctx: Any) -> None:
        self.seen.remove(timestamp + 1 - self.size_ms)


def build_q8(job: StreamJob, source: NexmarkSource, sink: Sink | Sequence[Sink], *,
             prefix: str | None = None,
             size_ms: int = DEFAULT_WINDOW_MS, slide_ms: int | None = None,
             parallelism: int | None = None, source_parallelism: int | None = None,
             watermarks: WatermarkStrategy | None = DEFAULT_WATERMARKS,
             hold_extra: Iterable[str] = ()) -> None:
    """New users: people who registered and created an auction in the same window.
    ``hold_extra``: of ``"persons"``, ``"auctions"``, the kinds whose ``extra`` padding the
    join's windows hold (module docstring)."""
    n = prefix or "q8"
    held = frozenset((hold_extra,) if isinstance(hold_extra, str) else hold_extra)
    if not held <= {"persons", "auctions"}:
        raise ValueError(f"hold_extra: kinds of persons, auctions; got {sorted(held)}")
    p = _par(job, parallelism)
    sp = _or(source_parallelism, p)
    persons = (_source(job, source, "persons", f"{n}-persons", sp, watermarks)
               .map(person_id_name_extra if "persons" in held else person_id_name,
                    name=f"{n}-person-project"))
    sellers = (_source(job, source, "auctions", f"{n}-auctions", sp, watermarks)
               .map(auction_seller_extra if "auctions" in held else auction_seller,
                    name=f"{n}-auction-project"))
    joined = persons.key_by(first_field).window_join(
        sellers.key_by(first_field if "auctions" in held else identity),
        _assigner(size_ms, slide_ms), q8_join, name=f"{n}-join", parallelism=p)
    new_users = joined.key_by(first_field).process(NewUsers(size_ms), name=f"{n}-new-users",
                                                   parallelism=p)
    _add_sinks(new_users, sink, n, p)


# ------------------------------------------------------------------------------ dispatch

BUILDERS = {"q1": build_q1, "q2": build_q2, "q5": build_q5, "q7": build_q7, "q8": build_q8}


def build(query: str, job: StreamJob, source: NexmarkSource, sink: Sink | Sequence[Sink],
          **kwargs: Any) -> None:
    """``build_qN`` by name (``"q1"`` .. ``"q8"``)."""
    try:
        builder = BUILDERS[query]
    except KeyError:
        raise ValueError(f"unknown query {query!r}; one of {sorted(BUILDERS)}") from None
    builder(job, source, sink, **kwargs)


# ----------------------------------------------------------------------------- reference


def reference_results(query: str, source: NexmarkSource, *, size_ms: int | None = None,
                      slide_ms: int | None = None) -> list[tuple]:
    """``reference.py``'s output for what ``build(query, job, source, ...)`` computes on a
    bounded ``source`` with ``event_time=True`` (the windowed results sorted as the reference
    sorts them; Q1 and Q2 in input order). ``size_ms``/``slide_ms`` as given to the builder
    (None: the builder's defaults)."""
    from examples.nexmark import reference
    from examples.nexmark.generator import NexmarkGenerator

    if source.num_events is None:
        raise ValueError("the reference needs a bounded source (num_events)")
    if not source.event_time and query not in ("q1", "q2"):
        raise ValueError("windowed reference results need event_time=True timestamps")
    rec = NexmarkGenerator(source.config).events(0, source.num_events).to_records(named=False)
    size = DEFAULT_WINDOW_MS if size_ms is None else size_ms
    if query == "q1":
        return reference.q1(rec.bids)
    if query == "q2":
        return reference.q2(rec.bids)
    if query == "q5":
        return reference.q5(rec.bids, size_ms=size,
                            slide_ms=Q5_SLIDE_MS if slide_ms is None else slide_ms)
    if query == "q7":
        return reference.q7_sliding(rec.bids, size_ms=size,
                                    slide_ms=size if slide_ms is None else slide_ms)
    if query == "q8":
        return reference.q8_sliding(rec.persons, rec.auctions, size_ms=size,
                                    slide_ms=size if slide_ms is None else slide_ms)
    raise ValueError(f"unknown query {query!r}")


def sort_results(query: str, results: Iterable[tuple]) -> list[tuple]:
    """Engine outputs in the reference's order (Q1/Q2: unchanged; Q8: by window, id, name)."""
    out = [tuple(r) for r in results]
    if query in ("q1", "q2"):
        return out
    if query == "q8":
        return sorted(out, key=lambda r: (r[2], r[0], r[1]))
    return sorted(out)
