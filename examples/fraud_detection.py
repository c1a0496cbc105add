"""Rule-based card fraud detection on reflow, in event time.

    python examples/fraud_detection.py                          # seeded generator, local Ray
    python examples/fraud_detection.py --csv fraudTrain.csv     # a public card-fraud dataset
    ray job submit --working-dir . -- python examples/fraud_detection.py --events 50000

The pipeline::

    transactions -> valid -> detect(card) -+-----------------------------------------+-> sink
                                           +-> alert_rate(rule, 1 h windows) --------+

* ``valid``: drops transactions without a card or with a non-positive amount (refunds).
* ``detect`` (keyed by card, keyed state and event-time timers): buffers each transaction
  until the watermark passes its timestamp, then evaluates the ``Rules`` on the card's
  transactions in ``(ts, tx_id)`` order, so alerts do not depend on arrival order or source
  parallelism. Emits ``("alert", card_id, tx_id, ts, rule, rules_version, detail)``.
* ``alert_rate`` (keyed by rule, tumbling event-time windows): ``("alert_rate", rule,
  window_start, alerts, distinct cards)``.

``Rules(version, rules)`` is a value given to ``FraudDetector``'s constructor so the logic can
be swapped live: ``--swap-rules v2`` swaps to stricter rules (``stricter_rules``) with
``handle.change_logic("detect", FraudDetector(rules))`` once ``--swap-at`` of the
transactions went through; each card switches at the barrier, and ``check_swap`` verifies
that every transaction was judged by exactly one rule set, old ones first. The state it
works on (``CardProfile``: count, total, recent
transactions) does not depend on the rules. The rules: ``Velocity`` (more than N
transactions in a sliding window), ``AmountSpike`` (amount > k x the card's running average),
``SmallThenLarge`` (a small transaction, then a large one within a minute).

A transaction is ``(tx_id, card_id, ts_ms, amount_cents, merchant, label)`` (label 1 fraud,
0 genuine, -1 unknown). ``generate_transactions`` mimics the public datasets' shape (Zipf card
activity and merchant popularity, per-card log-normal amounts, a daily rate curve, refunds,
injected fraud episodes); ``read_transactions_csv`` reads CSVs with columns ``card_id, ts,
amount, merchant, ...`` and also the Sparkov/Kaggle ``fraudTrain.csv`` names (``cc_num,
unix_time, amt, merchant, is_fraud, trans_num``). ``reference`` recomputes everything in
plain Python.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import datetime as dt
import heapq
import math
import os
import random
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import (  # noqa: E402
    AggregateFunction,
    JobConfig,
    KeyedProcessFunction,
    ReflowError,
    Sink,
    SourceGate,
    StreamJob,
    TestingSink,
    TestingSource,
    WatermarkStrategy,
    tumbling_event_time,
)

BASE_TS = 1_704_067_200_000     # 2024-01-01 00:00 UTC
MINUTE_MS = 60_000
HOUR_MS = 3_600_000
DISORDER_MS = 2_000             # the generator's bounded out-of-orderness


# ============================================================================ rules

@dataclass
class CardProfile:
    """What the rules see of a card: how many transactions it made, their total, and the
    recent ones ``(ts, amount)`` (within ``Rules.lookback_ms`` of the latest)."""

    count: int
    total: int
    recent: list


@dataclass(frozen=True)
class Velocity:
    """More than ``max_txns`` transactions in ``(ts - window_ms, ts]``."""

    max_txns: int = 5
    window_ms: int = MINUTE_MS
    name: str = "velocity"

    @property
    def lookback_ms(self) -> int:
        return self.window_ms

    def check(self, ts: int, amount: int, p: CardProfile) -> int | None:
        n = 1 + sum(1 for t, _ in p.recent if t > ts - self.window_ms)
        return n if n > self.max_txns else None


@dataclass(frozen=True)
class AmountSpike:
    """``amount > factor x`` the card's average so far, once it has ``min_history``."""

    factor: int = 8
    min_history: int = 5
    name: str = "amount_spike"

    @property
    def lookback_ms(self) -> int:
        return 0

    def check(self, ts: int, amount: int, p: CardProfile) -> int | None:
        if p.count >= self.min_history and amount * p.count > self.factor * p.total:
            return amount * p.count * 100 // p.total      # percent of the average
        return None


@dataclass(frozen=True)
class SmallThenLarge:
    """A transaction ``>= large_cents`` within ``within_ms`` after one ``<= small_cents``
    (card testing, then cash-out)."""

    small_cents: int = 200
    large_cents: int = 50_000
    within_ms: int = MINUTE_MS
    name: str = "small_then_large"

    @property
    def lookback_ms(self) -> int:
        return self.within_ms

    def check(self, ts: int, amount: int, p: CardProfile) -> int | None:
        if amount < self.large_cents:
            return None
        gaps = [ts - t for t, a in p.recent if a <= self.small_cents and ts - t <= self.within_ms]
        return min(gaps) if gaps else None


@dataclass(frozen=True)
class Rules:
    """A versioned rule set; ``evaluate`` gives ``(rule name, detail)`` for every rule that
    fires on a transaction given the card's profile before it."""

    version: str
    rules: tuple = (Velocity(), AmountSpike(), SmallThenLarge())

    @property
    def lookback_ms(self) -> int:
        return max((r.lookback_ms for r in self.rules), default=0)

    def evaluate(self, ts: int, amount: int, profile: CardProfile) -> list[tuple[str, int]]:
        out = []
        for r in self.rules:
            detail = r.check(ts, amount, profile)
            if detail is not None:
                out.append((r.name, detail))
        return out


DEFAULT_RULES = Rules("v1")


def stricter_rules(version: str) -> Rules:
    """The rule set a running job swaps to with ``--swap-rules``: tighter thresholds."""
    return Rules(version, (Velocity(4, 30_000), AmountSpike(5, 3),
                           SmallThenLarge(300, 40_000, MINUTE_MS)))


# ============================================================================ the job

def tx_ts(t: tuple) -> int:
    return t[2]


def is_valid(t: tuple) -> bool:
    return t[1] is not None and t[1] != "" and t[3] > 0


def card_of(t: tuple) -> Any:
    return t[1]


def alert_rule(a: tuple) -> str:
    return a[4]


class FraudDetector(KeyedProcessFunction):
    """Per card: buffer transactions until the watermark passes them (``pending``: a map
    ``ts -> [transactions]`` with an event-time timer per ts), then run ``rules`` over them
    in ``(ts, tx_id)`` order and update the card's profile (``[count, total, recent]``).
    A transaction behind the watermark (disorder beyond the bound) is evaluated at the next
    watermark advance, after later ones: keep the bound at least the data's disorder."""

    def __init__(self, rules: Rules = DEFAULT_RULES) -> None:
        self.rules = rules

    def open(self, ctx: Any) -> None:
        self.pending = ctx.map_state("pending")
        self.profile = ctx.value_state("profile")

    def process_element(self, t: tuple, ctx: Any) -> None:
        ts = t[2]
        batch = self.pending.get(ts)
        if batch is None:
            self.pending.put(ts, [t])
            ctx.timer_service.register_event_time_timer(ts)
        else:
            batch.append(t)

    def on_timer(self, timestamp: int, ctx: Any) -> list[tuple]:
        batch = self.pending.get(timestamp)
        if batch is None:
            return []
        self.pending.remove(timestamp)
        state = self.profile.value() or [0, 0, []]
        p = CardProfile(*state)
        horizon = timestamp - self.rules.lookback_ms
        p.recent = [r for r in p.recent if r[0] >= horizon]
        out = []
        for tx_id, card, ts, amount, _merchant, _label in sorted(batch, key=lambda t: t[0]):
            for rule, detail in self.rules.evaluate(ts, amount, p):
                out.append(("alert", card, tx_id, ts, rule, self.rules.version, detail))
            p.count += 1
            p.total += amount
            p.recent.append((ts, amount))
        self.profile.update([p.count, p.total, p.recent])
        return out


class AlertRate(AggregateFunction):
    """Alerts and distinct cards of a rule in a window: ``[alerts, {card: 1}]``."""

    def create_accumulator(self) -> list:
        return [0, {}]

    def add(self, a: tuple, acc: list) -> list:
        acc[0] += 1
        acc[1][a[1]] = 1
        return acc


def alert_rate_result(rule: str, w: Any, acc: list) -> list[tuple]:
    return [("alert_rate", rule, w.start, acc[0], len(acc[1]))]


def build(transactions: list[tuple], sink: Sink, parallelism: int = 2, *,
          rules: Rules = DEFAULT_RULES, rate: float | None = None, key_groups: int = 128,
          config: JobConfig | None = None, bound_ms: int = DISORDER_MS,
          source_parallelism: int = 1, rate_window_ms: int = HOUR_MS,
          watermark_interval_ms: float = 50.0, late_sink: Sink | None = None,
          sink_parallelism: int = 1,
          gate: SourceGate | Sequence[SourceGate] | None = None) -> StreamJob:
    """The fraud job. Its outputs do not depend on ``source_parallelism`` as long as
    ``bound_ms`` covers the transactions' disorder. ``gate``: holds the source at a record
    (tests act there)."""
    job = StreamJob("fraud-detection", num_key_groups=key_groups, parallelism=parallelism,
                    config=config or JobConfig())
    alerts = (
        job.source(TestingSource(transactions, rate=rate, timestamp_fn=tx_ts, gate=gate),
                   name="transactions", parallelism=source_parallelism,
                   watermarks=WatermarkStrategy(bound_ms, watermark_interval_ms))
        .filter(is_valid, name="valid")
        .key_by(card_of)
        .process(FraudDetector(rules), name="detect")
    )
    rates = (alerts.key_by(alert_rule)
             .window(tumbling_event_time(rate_window_ms), late_sink=late_sink)
             .aggregate(AlertRate(), alert_rate_result, name="alert_rate"))
    alerts.union(rates).sink(sink, name="sink", parallelism=sink_parallelism)
    return job


def outputs_by_kind(results: Iterable[tuple]) -> dict[str, Any]:
    """Sink records -> ``{"alerts": {card: [alerts in order]}, "rates": {(rule,
    window_start): (alerts, cards)}}``."""
    alerts: dict[Any, list[tuple]] = {}
    rates: dict[tuple[str, int], tuple] = {}
    for r in results:
        if r[0] == "alert":
            alerts.setdefault(r[1], []).append(tuple(r))
        else:
            if (r[1], r[2]) in rates:
                raise AssertionError(f"alert_rate window {(r[1], r[2])} fired twice")
            rates[(r[1], r[2])] = tuple(r[3:])
    return {"alerts": alerts, "rates": rates}


# ============================================================================ reference

def reference(transactions: Iterable[tuple], rules: Rules = DEFAULT_RULES,
              rate_window_ms: int = HOUR_MS) -> dict[str, Any]:
    """Plain Python: per card, transactions sorted by ``(ts, tx_id)``, each rule checked
    against the whole earlier history by brute force."""
    cards: dict[Any, list[tuple]] = {}
    for t in transactions:
        if t[1] is None or t[1] == "" or t[3] <= 0:
            continue
        cards.setdefault(t[1], []).append(t)
    alerts: dict[Any, list[tuple]] = {}
    rates: dict[tuple[str, int], list] = {}
    for card, txs in cards.items():
        txs.sort(key=lambda t: (t[2], t[0]))
        total = 0
        for i, (tx_id, _, ts, amount, _m, _l) in enumerate(txs):
            fired = []
            for r in rules.rules:
                kind = type(r).__name__
                if kind == "Velocity":
                    n = 1 + sum(1 for t in txs[:i] if ts - t[2] < r.window_ms)
                    if n > r.max_txns:
                        fired.append((r.name, n))
                elif kind == "AmountSpike":
                    if i >= r.min_history and amount * i > r.factor * total:
                        fired.append((r.name, amount * i * 100 // total))
                elif kind == "SmallThenLarge" and amount >= r.large_cents:
                    gaps = [ts - t[2] for t in txs[:i]
                            if t[3] <= r.small_cents and ts - t[2] <= r.within_ms]
                    if gaps:
                        fired.append((r.name, min(gaps)))
            for rule, detail in fired:
                alerts.setdefault(card, []).append(
                    ("alert", card, tx_id, ts, rule, rules.version, detail))
                acc = rates.setdefault((rule, ts - ts % rate_window_ms), [0, set()])
                acc[0] += 1
                acc[1].add(card)
            total += amount
    return {"alerts": alerts, "rates": {k: (v[0], len(v[1])) for k, v in rates.items()}}


def check_swap(transactions: Iterable[tuple], results: Iterable[tuple], old: Rules,
               new: Rules) -> list[str]:
    """What is wrong (nothing: an empty list) with the outputs of a run whose rules changed
    live from ``old`` to ``new`` (``handle.change_logic``): every transaction was judged
    by exactly one rule set (its alerts are those of ``reference`` under that set), each
    card's transactions by ``old`` first and then ``new`` (a card switches once, at the
    barrier, and its transactions are judged in event-time order), and every hourly alert
    rate counts the alerts that were emitted. Which transactions came before the switch
    depends on when it happened; the check does not."""
    txs = list(transactions)
    ref = {r.version: reference(txs, r)["alerts"] for r in (old, new)}
    out = outputs_by_kind(results)
    problems: list[str] = []
    cards = {t[1] for t in txs if is_valid(t)}
    for card in cards:
        mine = sorted((t for t in txs if t[1] == card and is_valid(t)), key=lambda t: (t[2], t[0]))
        got = [a for a in out["alerts"].get(card, [])]
        switched = False
        for t in mine:
            have = [a for a in got if a[2] == t[0]]
            verdicts = [v for v, alerts in ref.items()
                        if [a for a in alerts.get(card, []) if a[2] == t[0]] == have]
            if not verdicts:
                problems.append(f"card {card} tx {t[0]}: alerts {have} fit neither rule set")
            elif verdicts == [new.version]:
                switched = True
            elif switched and verdicts == [old.version]:
                problems.append(f"card {card} tx {t[0]}: judged by {old.version} after "
                                f"{new.version}")
    rates: dict[tuple[str, int], list] = {}
    for seq in out["alerts"].values():
        for a in seq:
            acc = rates.setdefault((a[4], a[3] - a[3] % HOUR_MS), [0, set()])
            acc[0] += 1
            acc[1].add(a[1])
    if {k: (v[0], len(v[1])) for k, v in rates.items()} != out["rates"]:
        problems.append("the alert rates do not count the alerts emitted")
    return problems


# ============================================================================ data

def _zipf_cum(n: int, s: float) -> list[float]:
    cum, acc = [], 0.0
    for i in range(1, n + 1):
        acc += 1.0 / i ** s
        cum.append(acc)
    return cum


def _pick(rng: random.Random, cum: list[float]) -> int:
    return bisect.bisect_left(cum, rng.random() * cum[-1])


def daily_curve(ts: float) -> float:
    """Relative transaction rate at a time of day: quiet at 04:00, busiest at 16:00."""
    hour = (ts - BASE_TS) / HOUR_MS % 24
    return 1.0 + 0.8 * math.sin(2 * math.pi * (hour - 10) / 24)


def generate_transactions(n: int, seed: int = 7, num_cards: int | None = None,
                          num_merchants: int = 500, txns_per_minute: float = 30.0,
                          fraud_rate: float = 0.003, refund_rate: float = 0.003,
                          disorder_ms: int = DISORDER_MS) -> list[tuple]:
    """``n`` transactions ``(tx_id, card_id, ts, amount_cents, merchant, label)`` in arrival
    order (timestamps up to ``disorder_ms`` out of order).

    Cards have Zipf(0.5) activity and a log-normal typical amount (median $30); merchants are
    Zipf(1.0); the rate follows a daily curve. Fraud episodes (label 1) start on random cards:
    card testing (a $0.50-2 charge, then $500-2,000 seconds later), a burst of 6-10
    transactions within a minute, or a single 10-30x spike. A few transactions are refunds
    (negative amounts, dropped by ``valid``)."""
    rng = random.Random(seed)
    num_cards = num_cards or max(100, n // 20)
    card_cum = _zipf_cum(num_cards, 0.5)
    merchant_cum = _zipf_cum(num_merchants, 1.0)
    scale = [math.exp(rng.gauss(math.log(3000), 0.8)) for _ in range(num_cards)]
    card_ids = [4_000_000_000_000_000 + rng.randrange(10**15) for _ in range(num_cards)]
    planned: list[tuple[float, int, int, int, int]] = []   # (ts, order, card, amount, label)
    out: list[tuple[float, int, int, int, str, int]] = []
    t = float(BASE_TS)
    order = 0

    def plan(ts: float, card: int, amount: int, label: int) -> None:
        nonlocal order
        order += 1
        heapq.heappush(planned, (ts, order, card, max(1, amount), label))

    while len(out) < n:
        t += rng.expovariate(txns_per_minute * daily_curve(t) / MINUTE_MS)
        while planned and planned[0][0] <= t and len(out) < n:
            ts, _, card, amount, label = heapq.heappop(planned)
            out.append((ts, card, amount, label))
        if len(out) >= n:
            break
        card = _pick(rng, card_cum)
        amount = max(1, int(scale[card] * math.exp(rng.gauss(0, 0.6))))
        if rng.random() < refund_rate:
            amount = -amount
        out.append((t, card, amount, 0))
        if rng.random() < fraud_rate:
            victim = rng.randrange(num_cards)
            kind = rng.randrange(3)
            if kind == 0:
                plan(t + rng.uniform(1_000, 30_000), victim, rng.randint(50, 200), 1)
                plan(t + rng.uniform(31_000, 55_000), victim, rng.randint(50_000, 200_000), 1)
            elif kind == 1:
                start = t + rng.uniform(1_000, 10_000)
                for _ in range(rng.randint(6, 10)):
                    amount = int(scale[victim] * rng.uniform(0.5, 2))
                    plan(start + rng.uniform(0, 50_000), victim, amount, 1)
            else:
                amount = int(scale[victim] * rng.uniform(10, 30))
                plan(t + rng.uniform(1_000, 60_000), victim, amount, 1)
    txs = []
    for i, (ts, card, amount, label) in enumerate(out):
        merchant = f"m{_pick(rng, merchant_cum):04d}"
        txs.append((i + 1, card_ids[card], int(ts), amount, merchant, label))
    # arrival order: event time plus up to `disorder_ms` of jitter
    arrival = sorted(range(len(txs)), key=lambda i: txs[i][2] + rng.random() * disorder_ms)
    return [txs[i] for i in arrival]


_ALIASES = {
    "tx_id": ("tx_id", "trans_num", "transaction_id", "id"),
    "card_id": ("card_id", "cc_num", "card", "card_number"),
    "amount": ("amount", "amt"),
    "merchant": ("merchant", "merchant_id"),
    "label": ("is_fraud", "fraud", "label", "class"),
}


def _col(row: dict, field: str) -> str | None:
    for name in _ALIASES[field]:
        v = row.get(name)
        if v is not None and v.strip() != "":
            return v.strip()
    return None


def _iso_ms(v: str) -> int:
    d = dt.datetime.fromisoformat(v)
    d = d if d.tzinfo else d.replace(tzinfo=dt.timezone.utc)
    return int(d.timestamp() * 1000)


def _ts_ms(row: dict) -> int | None:
    """``ts``/``timestamp`` (ms, or an ISO datetime, UTC unless it says otherwise), else
    ``trans_date_trans_time``, else ``unix_time`` (s); None when missing or unparsable."""
    try:
        v = (row.get("ts") or row.get("timestamp") or "").strip()
        if v:
            return int(v) if v.lstrip("-").isdigit() else _iso_ms(v)
        v = (row.get("trans_date_trans_time") or "").strip()
        if v:
            return _iso_ms(v)
        v = (row.get("unix_time") or "").strip()
        return int(float(v) * 1000) if v else None
    except ValueError:
        return None


def read_transactions_csv(path: str, limit: int | None = None) -> list[tuple]:
    """Transactions from a CSV with a header: ``card_id`` (or ``cc_num``), ``ts`` in ms or an
    ISO datetime (or ``trans_date_trans_time``, or ``unix_time`` in s), ``amount`` in dollars
    (or ``amt``), ``merchant``, optional ``tx_id``/``trans_num`` (default: the row number)
    and ``is_fraud``/``label``. Transaction ids are ints when all are digits, else strings.
    Sorted by ``ts`` (stable). Rows without a card or time are skipped; an unparsable amount
    becomes 0 (dropped by ``valid``)."""
    out: list[tuple] = []
    with open(path, newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            if limit is not None and len(out) >= limit:
                break
            card = _col(row, "card_id")
            ts = _ts_ms(row)
            if card is None or ts is None:
                continue
            try:
                amount = int((Decimal(_col(row, "amount") or "0") * 100).to_integral_value())
            except InvalidOperation:
                amount = 0
            tx = _col(row, "tx_id")
            label = _col(row, "label")
            out.append((
                str(i + 1) if tx is None else tx,
                int(card) if card.isdigit() else card,
                ts, amount, _col(row, "merchant") or "",
                int(float(label)) if label is not None else -1,
            ))
    # transaction ids order a card's transactions of equal ts: keep them of one type
    if all(t[0].isdigit() for t in out):
        out = [(int(t[0]), *t[1:]) for t in out]
    out.sort(key=lambda t: t[2])
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
    ap.add_argument("--events", type=int, default=100_000, help="transactions (default 100000)")
    ap.add_argument("--rate", type=float, default=None, help="transactions/s (default: full speed)")
    ap.add_argument("--duration", type=float, default=None,
                    help="seconds: with --rate, rate*duration transactions; without, stop after it")
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--source-parallelism", type=int, default=1)
    ap.add_argument("--key-groups", type=int, default=128)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rules-version", default="v1")
    ap.add_argument("--swap-rules", default=None, metavar="VERSION",
                    help="swap to stricter rules (named VERSION) live, with change_logic")
    ap.add_argument("--swap-at", type=float, default=0.5,
                    help="swap once this share of the transactions was taken (default 0.5)")
    ap.add_argument("--csv", default=None, help="transactions CSV (card_id,ts,amount,merchant,...)")
    ap.add_argument("--no-check", action="store_true", help="skip the reference comparison")
    args = ap.parse_args(argv)

    n = args.events
    if args.duration is not None and args.rate is not None:
        n = int(args.rate * args.duration)
    if args.csv:
        txs = read_transactions_csv(args.csv, limit=n)
    else:
        txs = generate_transactions(n, args.seed)
    rules = Rules(args.rules_version)
    if args.swap_rules is not None and args.rate is None:
        args.rate = 2000.0  # at full speed the input could end before the swap
    sink, late = TestingSink(), TestingSink()
    job = build(txs, sink, args.parallelism, rules=rules, rate=args.rate,
                key_groups=args.key_groups, bound_ms=max_disorder(t[2] for t in txs),
                source_parallelism=args.source_parallelism, late_sink=late)
    handle = job.run()
    print(f"job {handle.job_id}: {len(txs):,} transactions, parallelism {args.parallelism}, "
          f"rules {rules.version}")
    start = time.monotonic()
    stopped = False
    swapped = None
    if args.swap_rules is not None:
        swapped = stricter_rules(args.swap_rules)
        valid = sum(1 for t in txs if is_valid(t))
        while handle.status().state == "running" and \
                handle.metrics().total("records_in", "detect") < args.swap_at * valid:
            time.sleep(0.1)
        try:
            report = handle.change_logic("detect", FraudDetector(swapped))
            print(f"swapped rules {rules.version} -> {swapped.version} live: {report}")
        except ReflowError as exc:  # e.g. the input ended first
            print(f"rules not swapped: {exc}")
            swapped = None
    try:
        handle.wait(None if args.rate is not None else args.duration)
    except TimeoutError:
        stopped = True
    elapsed = time.monotonic() - start
    # stopped early: about how many (valid) records reached 'detect' (metrics lag up to 1 s)
    done = int(handle.metrics().total("records_in", 'detect')) if stopped else None
    handle.stop()
    out = outputs_by_kind(sink.results())
    alerts = [a for seq in out["alerts"].values() for a in seq]
    by_rule: dict[str, int] = {}
    for a in alerts:
        by_rule[a[4]] = by_rule.get(a[4], 0) + 1
    labels = {t[0]: t[5] for t in txs}
    flagged = {a[2] for a in alerts}
    fraud = {i for i, lab in labels.items() if lab == 1}
    print(f"alerts:      {len(alerts):,} on {len(flagged):,} transactions of "
          f"{len(out['alerts']):,} cards: "
          + ", ".join(f"{r} {c:,}" for r, c in sorted(by_rule.items())))
    if fraud:
        tp = len(flagged & fraud)
        print(f"vs labels:   precision {tp / max(1, len(flagged)):.2f}, recall "
              f"{tp / len(fraud):.2f} ({len(fraud):,} fraudulent transactions)")
    print(f"alert rate:  {len(out['rates']):,} (rule, hour) windows; "
          f"late records {len(late.results())}")
    if stopped:
        print(f"throughput:  {done / elapsed:,.0f} valid transactions/s over {elapsed:.1f} s "
              f"(stopped at --duration after about {done:,} of {len(txs):,})")
    else:
        print(f"throughput:  {len(txs) / elapsed:,.0f} transactions/s over {elapsed:.1f} s")
    if stopped or args.no_check:
        print("result: not checked (" + ("--no-check" if args.no_check else
                                         "stopped at --duration before its input ended: "
                                         "the output is a prefix") + ")")
        return 0
    if swapped is not None:
        problems = check_swap(txs, sink.results(), rules, swapped)
        for p in problems[:10]:
            print(f"  {p}")
        print("result: OK (each transaction judged by one rule set, each card switched once)"
              if not problems else "result: MISMATCH")
        return 0 if not problems else 1
    ok = out == reference(txs, rules)
    print("result: OK (equals the plain-Python reference)" if ok else "result: MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
