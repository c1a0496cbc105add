"""A stock exchange on reflow: continuous price-time priority matching per symbol.

    python examples/stock_exchange.py                             # seeded generator, local Ray
    python examples/stock_exchange.py --csv quotes.csv            # id,ts,symbol,side,price,qty
    ray job submit --working-dir . -- python examples/stock_exchange.py --events 50000

The pipeline::

    quotes -> valid -> match(symbol) -+--------------------------------------------+-> sink
                                      +-> trades -> bars(symbol, 1 s windows) -----+

* ``valid``: drops quotes with an unknown side, a non-positive price or quantity.
* ``match`` (keyed by symbol, keyed state): the pending buys and sells of the symbol are two
  ``ListState`` books sorted by price then arrival (best first). A buy takes the lowest
  pending sells priced ``<=`` its bid, a sell the highest pending buys priced ``>=`` its ask,
  each at the resting quote's price, with partial fills; what is left of the incoming quote
  rests in its book. Emits ``("trade", buy_id, sell_id, symbol, price, qty)`` per fill and,
  when a book grows beyond ``max_depth``, ``("evict", quote_id, side, symbol, price, qty)``
  for its worst quote.
* ``trades``: keeps the trades.
* ``bars`` (keyed by symbol, tumbling event-time windows): open, high, low, close, volume,
  notional and trade count: ``("bar", symbol, window_start, o, h, l, c, volume, notional, n)``.

Prices are integer cents. A quote is ``(id, ts_ms, symbol, side, price_cents, qty)`` with side
``"B"`` or ``"S"``. ``generate_quotes`` mimics a real feed's shape: Zipf symbol popularity (a
few hot symbols), a U-shaped intraday rate (busy open and close, a lunch lull), news bursts
on hot symbols with a price jump, random-walk mid prices, round and odd lots. ``read_quotes_csv``
reads a CSV with columns ``id,ts,symbol,side,price,qty`` (price in dollars). ``reference`` is
an independent plain-Python matcher (heaps instead of sorted lists).
"""

from __future__ import annotations

import argparse
import bisect
import csv
import heapq
import math
import os
import random
import sys
import time
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import (  # noqa: E402
    AggregateFunction,
    JobConfig,
    KeyedProcessFunction,
    Sink,
    SourceGate,
    StreamJob,
    TestingSink,
    TestingSource,
    WatermarkStrategy,
    tumbling_event_time,
)

BASE_TS = 1_704_205_800_000      # 2024-01-02 09:30 New York, in ms
BAR_MS = 1000
MAX_DEPTH = 500


# ============================================================================ the job

def quote_ts(q: tuple) -> int:
    return q[1]


def is_valid(q: tuple) -> bool:
    return q[3] in ("B", "S") and q[4] > 0 and q[5] > 0 and bool(q[2])


def symbol_of(q: tuple) -> str:
    return q[2]


def is_trade(r: tuple) -> bool:
    return r[0] == "trade"


def trade_symbol(r: tuple) -> str:
    return r[3]


class MatchingEngine(KeyedProcessFunction):
    """Per symbol: the order book as two sorted ``ListState``s.

    ``asks`` holds ``(price, seq, id, qty)`` ascending, ``bids`` ``(-price, seq, id, qty)``
    ascending, so both are best-first with earlier arrivals first at equal prices (``seq``
    is the symbol's arrival counter)."""

    def __init__(self, max_depth: int = MAX_DEPTH) -> None:
        self.max_depth = max_depth

    def open(self, ctx: Any) -> None:
        self.bids = ctx.list_state("bids")
        self.asks = ctx.list_state("asks")
        self.seq = ctx.value_state("seq", 0)

    def process_element(self, q: tuple, ctx: Any) -> list[tuple]:
        qid, _ts, symbol, side, price, qty = q
        seq = self.seq.value()
        self.seq.update(seq + 1)
        out: list[tuple] = []
        buy = side == "B"
        other = self.asks if buy else self.bids
        book = other.get()
        i = 0
        while qty and i < len(book):
            key, s, rid, rqty = book[i]
            rprice = key if buy else -key
            if (rprice > price) if buy else (rprice < price):
                break
            fill = min(qty, rqty)
            out.append(("trade", qid if buy else rid, rid if buy else qid, symbol, rprice, fill))
            qty -= fill
            if fill == rqty:
                i += 1
            else:
                book[i] = (key, s, rid, rqty - fill)
        if i or out:
            del book[:i]
            other.update(book)
        if qty:
            own = self.bids if buy else self.asks
            mine = own.get()
            bisect.insort(mine, (-price if buy else price, seq, qid, qty))
            if len(mine) > self.max_depth:
                key, _s, wid, wqty = mine.pop()
                out.append(("evict", wid, side, symbol, -key if buy else key, wqty))
            own.update(mine)
        return out


class Bar(AggregateFunction):
    """OHLCV of a symbol's trades in a window: ``[o, h, l, c, volume, notional, n]``."""

    def create_accumulator(self) -> list:
        return [0, 0, 0, 0, 0, 0, 0]

    def add(self, t: tuple, acc: list) -> list:
        price, qty = t[4], t[5]
        if acc[6] == 0:
            acc[0] = acc[1] = acc[2] = price
        acc[1] = max(acc[1], price)
        acc[2] = min(acc[2], price)
        acc[3] = price
        acc[4] += qty
        acc[5] += price * qty
        acc[6] += 1
        return acc


def bar_result(symbol: str, w: Any, acc: list) -> list[tuple]:
    return [("bar", symbol, w.start, *acc)]


def build(quotes: list[tuple], sink: Sink, parallelism: int = 2, *, rate: float | None = None,
          key_groups: int = 128, config: JobConfig | None = None, bound_ms: int = 0,
          max_depth: int = MAX_DEPTH, bar_ms: int = BAR_MS, watermark_interval_ms: float = 50.0,
          late_sink: Sink | None = None, sink_parallelism: int = 1,
          gate: SourceGate | Sequence[SourceGate] | None = None) -> StreamJob:
    """The exchange over ``quotes`` (one source task: per-symbol arrival order is the list
    order); match outputs and bars go to ``sink``. ``gate``: holds the source at a record
    (tests rescale there)."""
    job = StreamJob("stock-exchange", num_key_groups=key_groups, parallelism=parallelism,
                    config=config or JobConfig())
    matched = (
        job.source(TestingSource(quotes, rate=rate, timestamp_fn=quote_ts, gate=gate),
                   name="quotes",
                   parallelism=1, watermarks=WatermarkStrategy(bound_ms, watermark_interval_ms))
        .filter(is_valid, name="valid")
        .key_by(symbol_of)
        .process(MatchingEngine(max_depth), name="match")
    )
    bars = (matched.filter(is_trade, name="trades")
            .key_by(trade_symbol)
            .window(tumbling_event_time(bar_ms), late_sink=late_sink)
            .aggregate(Bar(), bar_result, name="bars"))
    matched.union(bars).sink(sink, name="sink", parallelism=sink_parallelism)
    return job


def outputs_by_kind(results: Iterable[tuple]) -> dict[str, Any]:
    """Sink records -> ``{"matches": {symbol: [trade/evict records in order]}, "bars":
    {(symbol, window_start): (o, h, l, c, volume, notional, n)}}``."""
    matches: dict[str, list[tuple]] = {}
    bars: dict[tuple[str, int], tuple] = {}
    for r in results:
        if r[0] == "bar":
            if (r[1], r[2]) in bars:
                raise AssertionError(f"bar {(r[1], r[2])} fired twice")
            bars[(r[1], r[2])] = tuple(r[3:])
        else:
            matches.setdefault(r[3], []).append(tuple(r))
    return {"matches": matches, "bars": bars}


# ============================================================================ reference

def reference(quotes: Iterable[tuple], max_depth: int = MAX_DEPTH,
              bar_ms: int = BAR_MS) -> dict[str, Any]:
    """Plain-Python matching (a heap per side) giving ``outputs_by_kind``'s form."""
    books: dict[str, tuple[list, list, list[int]]] = {}   # symbol -> (bids, asks, [seq])
    matches: dict[str, list[tuple]] = {}
    bars: dict[tuple[str, int], list[int]] = {}
    for qid, ts, symbol, side, price, qty in quotes:
        if side not in ("B", "S") or price <= 0 or qty <= 0 or not symbol:
            continue
        bids, asks, counter = books.setdefault(symbol, ([], [], [0]))
        seq = counter[0]
        counter[0] += 1
        out = matches.setdefault(symbol, [])
        # heaps of [priority, seq, id, remaining]; priority = price for asks, -price for bids
        opposite, sign = (asks, 1) if side == "B" else (bids, -1)
        while qty > 0 and opposite:
            best = opposite[0]
            best_price = best[0] * sign
            if (side == "B" and best_price > price) or (side == "S" and best_price < price):
                break
            n = min(qty, best[3])
            buyer, seller = (qid, best[2]) if side == "B" else (best[2], qid)
            out.append(("trade", buyer, seller, symbol, best_price, n))
            b = bars.setdefault((symbol, ts - ts % bar_ms), [best_price, best_price, best_price,
                                                             best_price, 0, 0, 0])
            b[1], b[2], b[3] = max(b[1], best_price), min(b[2], best_price), best_price
            b[4] += n
            b[5] += n * best_price
            b[6] += 1
            qty -= n
            best[3] -= n
            if best[3] == 0:
                heapq.heappop(opposite)
        if qty > 0:
            mine = bids if side == "B" else asks
            heapq.heappush(mine, [-price if side == "B" else price, seq, qid, qty])
            if len(mine) > max_depth:
                worst = max(mine)
                mine.remove(worst)
                heapq.heapify(mine)
                wprice = -worst[0] if side == "B" else worst[0]
                out.append(("evict", worst[2], side, symbol, wprice, worst[3]))
    return {"matches": {s: m for s, m in matches.items() if m},
            "bars": {k: tuple(v) for k, v in bars.items()}}


# ============================================================================ data

def _tickers(n: int, rng: random.Random) -> list[str]:
    seen: set[str] = set()
    out = []
    while len(out) < n:
        t = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(rng.choice((3, 4))))
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def generate_quotes(n: int, seed: int = 7, num_symbols: int = 100, zipf: float = 1.2,
                    quotes_per_s: float = 2000.0, burst_probability: float = 0.002,
                    invalid_fraction: float = 0.002) -> list[tuple]:
    """``n`` quotes ``(id, ts_ms, symbol, side, price_cents, qty)`` in arrival order
    (timestamps non-decreasing).

    Symbols are Zipf-popular; the rate follows a U over the run (1.0 at the ends, 0.4 in the
    middle); a news burst sends 20-80 quotes on a hot symbol within a few ms after a 0.5-2 %
    jump, skewed to the jump's side. Each symbol's mid price walks randomly; bids and asks
    scatter around it so that about a third cross. Quantities are round lots of 100 (80 %)
    or odd lots; a small fraction of quotes is invalid."""
    rng = random.Random(seed)
    symbols = _tickers(num_symbols, rng)
    cum, acc = [], 0.0
    for i in range(1, num_symbols + 1):
        acc += 1.0 / i ** zipf
        cum.append(acc)
    mids = [int(math.exp(rng.uniform(math.log(1_000), math.log(50_000)))) for _ in symbols]
    out: list[tuple] = []
    t = float(BASE_TS)
    burst_left, burst_sym, burst_up = 0, 0, True
    for qid in range(1, n + 1):
        x = qid / n
        if burst_left:
            burst_left -= 1
            t += rng.random() * 2
            s = burst_sym if rng.random() < 0.8 else bisect.bisect_left(cum, rng.random() * acc)
        else:
            t += rng.expovariate(quotes_per_s * (0.4 + 2.4 * (x - 0.5) ** 2) / 1000)
            s = bisect.bisect_left(cum, rng.random() * acc)
            if rng.random() < burst_probability:
                burst_left = rng.randint(20, 80)
                burst_sym = bisect.bisect_left(cum, rng.random() * acc * 0.05)
                burst_up = rng.random() < 0.5
                jump = rng.uniform(0.005, 0.02) * (1 if burst_up else -1)
                mids[burst_sym] = max(10, int(mids[burst_sym] * (1 + jump)))
        mids[s] = max(10, int(round(mids[s] * math.exp(rng.gauss(0, 0.0005)))))
        mid = mids[s]
        half = max(1, mid // 2000)
        if burst_left and s == burst_sym:
            side = "B" if rng.random() < (0.75 if burst_up else 0.25) else "S"
        else:
            side = "B" if rng.random() < 0.5 else "S"
        offset = int(round(rng.gauss(0, 2 * half)))
        price = max(1, mid - half + offset if side == "B" else mid + half + offset)
        if rng.random() < 0.8:
            qty = 100 * min(50, 1 + int(rng.expovariate(0.5)))
        else:
            qty = rng.randint(1, 99)
        if rng.random() < invalid_fraction:
            side, price, qty = rng.choice([("X", price, qty), (side, -price, qty),
                                           (side, price, 0)])
        out.append((qid, int(t), symbols[s], side, price, qty))
    return out


def read_quotes_csv(path: str, limit: int | None = None) -> list[tuple]:
    """Quotes from a CSV with a header ``id,ts,symbol,side,price,qty`` (``ts`` in ms, ``side``
    B/S or BUY/SELL, ``price`` in dollars), in file order, as ``(id, ts, symbol, side,
    price_cents, qty)``. Rows that do not parse become invalid quotes (side ``"?"``)."""
    out: list[tuple] = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if limit is not None and len(out) >= limit:
                break
            try:
                qid, ts = int(row["id"]), int(row["ts"])
            except (KeyError, TypeError, ValueError):
                continue
            side = (row.get("side") or "").strip().upper()[:1]
            try:
                price = int((Decimal(row["price"].strip()) * 100).to_integral_value())
                qty = int(row["qty"])
            except (KeyError, ArithmeticError, AttributeError, ValueError):
                side, price, qty = "?", 0, 0
            out.append((qid, ts, (row.get("symbol") or "").strip(), side, price, qty))
    return out


def max_disorder(timestamps: Iterable[int]) -> int:
    """The largest amount by which a timestamp is behind an earlier one."""
    top, worst = None, 0
    for t in timestamps:
        if top is None or t > top:
            top = t
        else:
            worst = max(worst, top - t)
    return worst


# ============================================================================ main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000, help="quotes (default 100000)")
    ap.add_argument("--rate", type=float, default=None, help="quotes/s (default: full speed)")
    ap.add_argument("--duration", type=float, default=None,
                    help="seconds: with --rate, rate*duration quotes; without, stop after it")
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--key-groups", type=int, default=128)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--symbols", type=int, default=100)
    ap.add_argument("--csv", default=None, help="quotes CSV: id,ts,symbol,side,price,qty")
    ap.add_argument("--no-check", action="store_true", help="skip the reference comparison")
    args = ap.parse_args(argv)

    n = args.events
    if args.duration is not None and args.rate is not None:
        n = int(args.rate * args.duration)
    if args.csv:
        quotes = read_quotes_csv(args.csv, limit=n)
    else:
        quotes = generate_quotes(n, args.seed, num_symbols=args.symbols)
    sink, late = TestingSink(), TestingSink()
    job = build(quotes, sink, args.parallelism, rate=args.rate, key_groups=args.key_groups,
                bound_ms=max_disorder(q[1] for q in quotes), late_sink=late)
    handle = job.run()
    print(f"job {handle.job_id}: {len(quotes):,} quotes, parallelism {args.parallelism}")
    start = time.monotonic()
    stopped = False
    try:
        handle.wait(None if args.rate is not None else args.duration)
    except TimeoutError:
        stopped = True
    elapsed = time.monotonic() - start
    # stopped early: about how many (valid) records reached 'match' (metrics lag up to 1 s)
    done = int(handle.metrics().total("records_in", 'match')) if stopped else None
    handle.stop()
    out = outputs_by_kind(sink.results())
    trades = [r for m in out["matches"].values() for r in m if r[0] == "trade"]
    evicted = sum(1 for m in out["matches"].values() for r in m if r[0] == "evict")
    volume: dict[str, int] = {}
    for r in trades:
        volume[r[3]] = volume.get(r[3], 0) + r[5]
    hot = sorted(volume.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    notional = sum(r[4] * r[5] for r in trades) / 100
    print(f"trades:       {len(trades):,} ({sum(volume.values()):,} shares, ${notional:,.0f}), "
          f"{evicted:,} quotes evicted from full books")
    print("hot symbols:  " + ", ".join(f"{s} {v:,} shares" for s, v in hot))
    print(f"bars:         {len(out['bars']):,} (symbol, second) bars; "
          f"late records {len(late.results())}")
    if stopped:
        print(f"throughput:   {done / elapsed:,.0f} valid quotes/s over {elapsed:.1f} s "
              f"(stopped at --duration after about {done:,} of {len(quotes):,} quotes)")
    else:
        print(f"throughput:   {len(quotes) / elapsed:,.0f} quotes/s over {elapsed:.1f} s")
    if stopped or args.no_check:
        print("result: not checked (" + ("--no-check" if args.no_check else
                                         "stopped at --duration before its input ended: "
                                         "the output is a prefix") + ")")
        return 0
    ok = out == reference(quotes)
    print("result: OK (equals the plain-Python reference)" if ok else "result: MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
