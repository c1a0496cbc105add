"""Spacker (Mao, Zhang, Ma): Table II (stock exchange auto-scaling) and the knob sweeps (Fig. 9-11).

"Spacker: Unified State Migration for Distributed Streaming": its Table II and its three
planning knobs, on reflow's ``non-disruptive`` protocol (Spacker's protocol) with
``migration.planning.Planning`` settings and ``JobConfig(replication=...)``.

    python examples/papers/spacker.py             # full: 11 runs, ~15-35 min on 2 shared CPUs
    python examples/papers/spacker.py --quick     # 10 smaller runs, ~8-22 min
    python examples/papers/spacker.py --parts table2 --repeats 2

Parts (``--parts``):

* ``table2`` (Table II): the stock exchange job (``examples/stock_exchange.py``'s matching
  engine and OHLCV bars, keyed by symbol) scaled in after its input rate dropped, in the
  paper's three auto-scaling actions 16 -> 4 -> 8 -> 6, here halved: 8 -> 2 -> 4 -> 3 (quick
  4 -> 1 -> 3 -> 2). The actions are the paper's autoscaler's (DS2's) decisions, replayed
  from the driver ``--gap`` s apart (DS2's own decisions on a shared 2-core machine change
  from run to run, which would make the strategies' convergence incomparable). Per
  migration strategy, one fresh job each: ``spacker`` (``planning=None``: reflow's adaptive
  default, whose reason is recorded), ``all-at-once`` (Trisk's: every moving group in one
  step), ``progressive`` (Megaphone's: one group per step) and ``replication`` (Rhino's
  proactive replication: all-at-once with ``JobConfig(replication="all")``). Measured:
  *convergence*, from the first request to the last rescale's completion (the paper's
  "Completion", gaps included; ``migration_s``: the rescales' time from their first step
  to completion, without starting new tasks, ``deploy_s``),
  *spike*, the highest per-second max latency at the sink from the first request to
  ``--after`` s past convergence (the paper's "Spike"), the *spikes* above
  ``--spike-factor`` x the baseline's own highest per-second max (runs of consecutive
  seconds), and *replication time*, the owners' CPU time per refresh round
  (``reflow_replication_cpu_seconds`` x ``replication_period_s`` / seconds run; the paper's
  "Checkpoint" column is the time replication adds to a checkpoint, its overhead).
  The job: a rate-controlled open-loop source of ``--symbols`` symbols (Zipf
  ``--zipf``, the paper's 0.15) at ``--rate`` quotes/s (the rate after the paper's drop),
  parsed into quotes, ``match`` (keyed by symbol: the price-time books plus ``--state-bytes``
  of per-symbol reference data, so the state is large as in the paper: ~5 GB over millions
  of keys there) -> trades -> 1 s bars -> a latency sink.
* ``prioritisation`` (Fig. 11): the planning benchmark's skewed phase (Zipf 1.0 keys, high
  rate, ``agg`` rebalanced at 4 tasks to a load-evening reshuffle), chunks of 4 in the
  orders ``hot-first`` and ``random`` (``--all-settings``: also ``key-order``, ascending key
  group).
* ``progressiveness`` (Fig. 9): the planning benchmark's large phase (``agg`` 4 -> 6),
  random order, all-at-once and chunks of 4 and 1 key groups (``--all-settings``: also
  chunks of 16 and adaptive).
* ``replication`` (Fig. 10): the planning benchmark's count job with ``--replication-keys``
  keys of 2 KB, every key given its state first (``FilledGenerator``), then
  ``--replication-rate`` uniform records/s (~6 % of the keys touched per second: a replica
  saves only what did not change since its refresh, and the large phase's 3,000 rec/s over
  1,600 keys touched every key twice a second, so replication saved nothing there),
  rebalanced at 4 tasks, half of the key groups (every other one) moving to the task that
  holds their replica under
  ``replication="all"`` (``migration.replication.place_replicas``: where a replica helps),
  all-at-once; ``JobConfig(replication=...)`` none and ``all`` at
  ``--replication-period`` (``--all-settings``: also ``hot`` 50 %, the busiest groups:
  which ones move is fixed, so only those that are hot *and* whose replica holder is the
  target reload locally; and ``all`` every 1 s).

``--quick`` runs two settings per sweep. The full run's settings are sized to end within
~20-35 min on 2 CPUs shared with other work (a job's deployment alone takes one to two
minutes there when the load average is near 100, most of a run).

Every sweep run is the planning benchmark's (``examples/bench/planning.py`` ``run_one``:
deploy, build, settle, baseline, the request, ``--after`` s), one fresh job per setting,
``--repeats`` rounds alternating the settings; figures are medians. Writes
``results.json``, ``spacker.png`` (Table II as bars and the latency timelines, the sweeps
as the paper's bar pairs: latency spike and completion time per setting) and
``summary.md`` (the paper's figure, reflow's value, the scale, whether the paper's ordering
holds) to ``--out`` (default ``examples/papers/results/spacker/``; ``--quick``:
``.../spacker-quick/``).
"""

# ruff: noqa: E402  (the repository root goes on sys.path before reflow's imports)
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from engine import JobConfig, Planning, StreamJob, WatermarkStrategy, tumbling_event_time
from engine.io.sources import GeneratorSource, Source, SourceBatch, SourceReader, parse_indexed
from engine.names import JobState
from engine.time.clock import Clock, now_ms
from examples import stock_exchange as se
from examples.bench import planning as pl
from examples.bench.harness import BenchError, cli, jobs, provenance, render, run
from examples.bench.harness import analysis as an
from examples.bench.harness.render import fmt, md_table
from examples.bench.harness.run import RunStatus
from examples.papers import RESULTS_ROOT

PROTOCOL = "non-disruptive"
PARTS = ("table2", "prioritisation", "progressiveness", "replication")
OP = "match"

#: Table II as printed: (completion ms, spike ms, checkpoint ms); "*": Spacker's spike
PAPER_TABLE2: dict[str, tuple[float, float, float]] = {
    "spacker": (8563.0, 229.0, 137.0),
    "all-at-once": (4489.0, 1739.0, 70.0),
    "progressive": (21782.0, 221.0, 66.0),
    "replication": (2412.0, 797.0, 220.0),
}
PAPER_SEQUENCE = (16, 4, 8, 6)
STRATEGIES = ("spacker", "all-at-once", "progressive", "replication")
STRATEGY_TEXT = {
    "spacker": "adaptive default (planning=None)",
    "all-at-once": "random, all-at-once (Trisk)",
    "progressive": "random, one-by-one (Megaphone)",
    "replication": "random, all-at-once + replication 'all' (Rhino)",
}

# (full, quick)
DEFAULTS: dict[str, tuple[Any, Any]] = {
    "sequence": ("8,2,4,3", "4,1,3,2"),
    "symbols": (4000, 1200), "state_bytes": (20_000, 30_000), "rate": (1000.0, 800.0),
    "table_key_groups": (64, 32), "table_build": (20.0, 12.0), "gap": (3.0, 2.0),
    "build": (6.0, 3.0), "baseline": (6.0, 3.0), "after": (6.0, 4.0), "stable": (3, 2),
    "key_groups": (128, 64), "skewed_rate": (10_000.0, 8_000.0),
    # the replication sweep: every key given its state at once (FilledGenerator), then few
    # of the keys touched per second: ~6 % (the paper's micro-benchmark: 2 %)
    "replication_keys": (16_000, 8_000), "replication_state_bytes": (2_000, 2_000),
    "replication_rate": (1_000.0, 500.0),
}
SWEEPS: dict[str, dict[str, tuple[str, ...]]] = {  # part -> settings: all, full, quick
    "prioritisation": {"all": ("hot-first", "random", "key-order"),
                       "full": ("hot-first", "random"), "quick": ("hot-first", "random")},
    "progressiveness": {"all": ("all-at-once", "chunks-16", "chunks-4", "chunks-1",
                                pl.ADAPTIVE),
                        "full": ("all-at-once", "chunks-4", "chunks-1"),
                        "quick": ("all-at-once", "chunks-1")},
    "replication": {"all": ("none", "hot-50%", "all", "all-1s"),
                    "full": ("none", "all"), "quick": ("none", "all")},
}
#: the planning benchmark's phase each sweep runs (its job, sizes and timing guess)
SWEEP_PHASE = {"prioritisation": "skewed", "progressiveness": "large", "replication": "large"}


# ------------------------------------------------------------------------------ the job


def key_order(profiles: Sequence[Any]) -> list[int]:
    """A prioritisation: the moving key groups in ascending order (no priority at all)."""
    return sorted(p.key_group for p in profiles)


def to_quote(record: tuple) -> tuple:
    """A generator record ``(key, seq)`` as a quote ``(id, ts, symbol, side, price, qty)``:
    deterministic in (key, seq); each symbol's bids and asks scatter around its own mid so
    that about a third cross (as ``stock_exchange.generate_quotes``)."""
    key, seq = record[0], record[1]
    h = (seq * 2654435761 + key * 40503) & 0xFFFFFFFF
    mid = 1000 + (key * 7919) % 49_000
    half = max(1, mid // 2000)
    side = "B" if h & 1 else "S"
    offset = (h >> 8) % (4 * half + 1) - 2 * half
    price = max(1, mid - half + offset if side == "B" else mid + half + offset)
    qty = 100 * (1 + (h >> 16) % 5)
    return (seq, 0, f"S{key:05d}", side, price, qty)


class PaddedBook(se.MatchingEngine):
    """The stock exchange's matching engine plus ``state_bytes`` of per-symbol reference
    data, made on the symbol's first quote and never changed (the paper's job keeps ~5 GB
    over millions of keys; books alone stay small here)."""

    def __init__(self, state_bytes: int, max_depth: int = se.MAX_DEPTH) -> None:
        super().__init__(max_depth)
        self.state_bytes = state_bytes

    def open(self, ctx: Any) -> None:
        super().open(ctx)
        self.ref = ctx.value_state("reference", None)

    def process_element(self, q: tuple, ctx: Any) -> list[tuple]:
        if self.ref.value() is None:
            self.ref.update(bytes(self.state_bytes))
        return super().process_element(q, ctx)


def stock_job(sink: Any, config: JobConfig, *, parallelism: int, key_groups: int,
              rate: float, symbols: int, zipf: float, state_bytes: int) -> StreamJob:
    """quotes (open loop, one task) -> parse -> valid -> ``match`` (by symbol) -> trades ->
    bars (1 s event-time windows, 2 tasks) -> ``sink``; ``match``'s outputs and the bars
    both reach the sink, as in ``stock_exchange.build``."""
    job = StreamJob("spacker-stock", num_key_groups=key_groups, parallelism=parallelism,
                    config=config)
    src = jobs.generator(rate=rate, keys=symbols, zipf=zipf)
    matched = (job.source(src, name="quotes", parallelism=1,
                          watermarks=WatermarkStrategy(0, 50.0))
               .map(to_quote, name="parse")
               .filter(se.is_valid, name="valid")
               .key_by(se.symbol_of)
               .process(PaddedBook(state_bytes), name=OP, parallelism=parallelism))
    bars = (matched.filter(se.is_trade, name="trades")
            .key_by(se.trade_symbol)
            .window(tumbling_event_time(se.BAR_MS))
            .aggregate(se.Bar(), se.bar_result, name="bars", parallelism=2))
    matched.union(bars).sink(sink, name="sink", parallelism=1)
    return job


def strategy_planning(name: str) -> tuple[Planning | None, dict[str, Any]]:
    """A Table II strategy's ``Planning`` (None: adaptive) and ``JobConfig`` fields."""
    if name == "spacker":
        return None, {}
    prog = "one-by-one" if name == "progressive" else "all-at-once"
    planning = Planning(prioritisation="random", progressiveness=prog, seed=jobs.SEED)
    return planning, ({"replication": "all"} if name == "replication" else {})


# ------------------------------------------------------------------------------ pure parts


def access_ratio(rate: float, keys: int) -> float:
    """Spacker's ratio of state access of uniform keys: the share of ``keys`` touched in a
    second by ``rate`` records/s, ``1 - exp(-rate / keys)`` (a key is missed by each record
    with probability ``1 - 1 / keys``)."""
    import math

    return 1.0 - math.exp(-rate / keys)


def spikes(rows: Mapping[int, Mapping[str, Any]], lo: int, hi: int, threshold_ms: float
           ) -> list[dict[str, Any]]:
    """Runs of consecutive seconds ``lo <= s < hi`` whose per-second max latency exceeds
    ``threshold_ms`` (a second without records ends a run): ``start`` (seconds after
    ``lo``), ``seconds`` and ``peak_ms``."""
    out: list[dict[str, Any]] = []
    cur: dict[str, Any] | None = None
    for s in range(lo, hi):
        r = rows.get(s)
        m = r.get("max_ms") if r and r.get("count") else None
        if m is not None and m > threshold_ms:
            if cur is None:
                cur = {"start": s - lo, "seconds": 0, "peak_ms": m}
                out.append(cur)
            cur["seconds"] += 1
            cur["peak_ms"] = max(cur["peak_ms"], m)
        else:
            cur = None
    return out


def sweep_planning(part: str, setting: str, *, seed: int = jobs.SEED
                   ) -> tuple[Planning | None, dict[str, Any]]:
    """A sweep setting's ``Planning`` (None: adaptive) and ``JobConfig`` fields."""
    if part == "prioritisation":
        prio: Any = {"hot-first": "hot-first", "random": "random", "key-order": key_order}[
            setting]
        return Planning(prioritisation=prio, progressiveness="chunks", chunk_size=4,
                        seed=seed), {}
    if part == "progressiveness":
        if setting == pl.ADAPTIVE:
            return None, {}
        if setting == "all-at-once":
            return Planning(progressiveness="all-at-once", seed=seed), {}
        return Planning(progressiveness="chunks", chunk_size=int(setting.split("-")[1]),
                        seed=seed), {}
    if part == "replication":
        fields: dict[str, Any] = {
            "none": {}, "hot-25%": {"replication": "hot", "replication_hot_fraction": 0.25},
            "hot-50%": {"replication": "hot", "replication_hot_fraction": 0.5},
            "all": {"replication": "all"},
            "all-1s": {"replication": "all", "replication_period_s": 1.0}}[setting]
        return Planning(progressiveness="all-at-once", seed=seed), fields
    raise BenchError(f"unknown sweep {part!r}")


class FilledGenerator(Source):
    """The replication sweep's source: first every key once at full speed (partition j of
    n: keys j, j + n, ...; records ``(key, -1, state_bytes)``, so ``PaddedCount`` gives it
    its state), then ``inner``'s records, its schedule starting when the fill is out.

    Why: a replica saves what did not change since its last refresh, so replication pays
    when few of the keys are touched per second (Spacker's "ratio of state access"). A
    random stream at a rate far below the number of keys takes ~4.6 x keys / rate seconds
    to give 99 % of the keys their state; the fill gives it to all at once, and the rate
    alone then sets the share touched per second. (The sweep ran at 3,000 rec/s over 1,600
    keys, every key touched about twice a second: a replica's delta held every key, and
    replication moved as many bytes as none.)"""

    def __init__(self, inner: GeneratorSource) -> None:
        self.inner = inner

    def partitions(self, parallelism: int) -> list[str]:
        return self.inner.partitions(parallelism)

    def open_partition(self, partition: str, resume: Any, clock: Clock) -> SourceReader:
        index, count = parse_indexed(partition, "FilledGenerator")
        keys = list(range(index, self.inner.num_keys, count))
        phase, at = ("fill", 0) if resume is None else resume
        return _FilledReader(self, partition, keys, at if phase == "fill" else len(keys),
                             at if phase == "gen" else None, clock)


class _FilledReader(SourceReader):
    def __init__(self, src: FilledGenerator, partition: str, keys: list[int], pos: int,
                 inner_resume: Any, clock: Clock) -> None:
        self._src, self._partition, self._keys, self._pos = src, partition, keys, pos
        self._clock = clock
        self._inner = (None if pos < len(keys)
                       else src.inner.open_partition(partition, inner_resume, clock))

    def poll(self, max_records: int) -> SourceBatch | None:
        if self._inner is not None:
            return self._inner.poll(max_records)
        chunk = self._keys[self._pos:self._pos + max_records]
        self._pos += len(chunk)
        if self._pos >= len(self._keys):  # filled: the stream's schedule starts now
            self._inner = self._src.inner.open_partition(self._partition, None, self._clock)
        extra = self._src.inner.state_bytes_per_key
        return SourceBatch([(k, -1, extra) for k in chunk], [now_ms(self._clock)] * len(chunk))

    def offset(self) -> Any:
        return ["fill", self._pos] if self._inner is None else ["gen", self._inner.offset()]

    def seconds_until_ready(self) -> float:
        return 0.0 if self._inner is None else self._inner.seconds_until_ready()

    def backlog(self) -> int | None:
        return None if self._inner is None else self._inner.backlog()


def filled_source(src: GeneratorSource, phase: pl.Phase) -> Source:
    """``planning.run_one``'s source hook for the replication sweep (``args.wrap_source``)."""
    return FilledGenerator(src)


def replica_target(key_groups: int, parallelism: int) -> tuple[int, ...]:
    """The replication sweep's rebalance: every other key group (odd ones) moves from its
    uniform owner to the task holding its replica under ``replication="all"``."""
    from engine.dataflow.keygroups import uniform_assignment
    from migration.replication import place_replicas

    cur = uniform_assignment(key_groups, parallelism)
    holders = place_replicas(cur, range(key_groups), parallelism)
    return tuple(holders[kg] if kg % 2 else cur[kg] for kg in range(key_groups))


def table2_summary(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Strategy -> medians over its successful runs: convergence_s, migration_s, peak_ms,
    spike (peak / baseline level), spikes (count), spike_seconds, replication_ms (CPU per
    refresh round), bytes_moved; ``runs``/``ok`` counts; ``reasons``: the adaptive's
    planning reasons (first run)."""
    out: dict[str, dict[str, Any]] = {}
    for r in runs:
        e = out.setdefault(r["strategy"], {"runs": 0, "ok": 0, "_r": []})
        e["runs"] += 1
        if r.get("status") == RunStatus.OK:
            e["ok"] += 1
            e["_r"].append(r)
    for e in out.values():
        rs = e.pop("_r")
        for k in ("convergence_s", "migration_s", "deploy_s", "peak_ms", "spike", "spike_count",
                  "spike_seconds", "replication_ms", "bytes_moved", "baseline_level_ms",
                  "threshold_ms"):
            e[k] = an.median(r[k] for r in rs if r.get(k) is not None)
        e["reasons"] = [a.get("planning_reason", "") for a in rs[0]["actions"]] if rs else []
    return out


def table2_verdicts(s: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    """The summary rows of Table II: the paper's figure, reflow's, whether it holds."""
    def g(name: str, key: str) -> float | None:
        return (s.get(name) or {}).get(key)

    rows: list[list[str]] = []
    for name in STRATEGIES:
        c, sp, ck = PAPER_TABLE2[name]
        rows.append([f"Table II {name}: completion / spike / checkpoint",
                     f"{c / 1000:.1f} s / {sp:.0f} ms / {ck:.0f} ms",
                     f"{fmt(g(name, 'convergence_s'), '.1f')} s / "
                     f"{fmt(g(name, 'peak_ms'), ',.0f')} ms "
                     f"({fmt(g(name, 'spike_count'), '.0f')} spikes) / "
                     f"{fmt(g(name, 'replication_ms'), '.0f')} ms", "-"])

    def holds(cond: bool | None) -> str:
        return "-" if cond is None else ("yes" if cond else "no")

    def lt(a: float | None, b: float | None, slack: float = 1.0) -> bool | None:
        return None if a is None or b is None else a <= b * slack

    sa, aa, pr, rp = (g(n, "peak_ms") for n in STRATEGIES)
    ca, cal, cpr, crp = (g(n, "convergence_s") for n in STRATEGIES)
    rows.append(["Spacker's spike near progressive's, up to 5x below all-at-once and "
                 "replication (229 vs 221, 1739, 797 ms)",
                 "221 / 229 = 0.97; 1739 / 229 = 7.6; 797 / 229 = 3.5",
                 f"progressive / spacker {fmt(an.ratio(pr, sa), '.2f')}; all-at-once / "
                 f"spacker {fmt(an.ratio(aa, sa), '.2f')}; replication / spacker "
                 f"{fmt(an.ratio(rp, sa), '.2f')}",
                 holds(None if None in (sa, aa, pr, rp) else
                       sa <= 1.5 * pr and sa < aa and sa < rp)])
    conv = an.ratio(cpr, ca)
    rows.append(["Spacker converges ~2.6x faster than progressive",
                 "21.8 / 8.6 = 2.5", f"progressive / spacker {fmt(conv, '.2f')}",
                 "-" if conv is None else "yes" if conv >= 2.0 else
                 f"ordering only ({conv:.2f}x, paper 2.5x)" if conv > 1.0 else "no"])
    ma, mpr = g("spacker", "migration_s"), g("progressive", "migration_s")
    mig = an.ratio(mpr, ma)
    rows.append(["... without starting new tasks (migration: first step to completion)",
                 "-", f"progressive / spacker {fmt(mig, '.2f')} ({fmt(mpr, '.1f')} vs "
                      f"{fmt(ma, '.1f')} s)",
                 "-" if mig is None else "yes" if mig > 1.0 else "no"])
    rows.append(["all-at-once and replication converge fastest, progressive slowest",
                 "4.5 s, 2.4 s < 8.6 s < 21.8 s",
                 f"{fmt(cal, '.1f')} s, {fmt(crp, '.1f')} s, spacker {fmt(ca, '.1f')} s, "
                 f"progressive {fmt(cpr, '.1f')} s",
                 holds(None if None in (ca, cal, cpr, crp) else
                       max(cal, crp) <= ca * 1.1 and ca <= cpr)])
    rs, rr = g("spacker", "replication_ms"), g("replication", "replication_ms")
    rows.append(["Spacker's replication (50 % of keys) costs ~40 % less than replicating all",
                 "137 vs 220 ms (0.62)", f"{fmt(rs, '.0f')} vs {fmt(rr, '.0f')} ms "
                 f"({fmt(an.ratio(rs, rr), '.2f')})",
                 "n/a (the adaptive strategy replicated nothing)" if not rs
                 else holds(lt(rs, rr))])
    return rows


def sweep_summary(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Setting -> the planning benchmark's medians (spike, completion_s, migration_s,
    bytes_moved, steps) plus peak_ms (highest per-second max) and the planning reason."""
    ps = pl.per_setting(runs)
    for name, e in ps.items():
        ok = [r for r in runs if r["setting"] == name and r.get("status") == RunStatus.OK
              and r.get("report")]
        e["peak_ms"] = an.median(r["peak"]["max_ms"] for r in ok
                                 if (r.get("peak") or {}).get("max_ms") is not None)
        e["baseline_spike"] = an.median(r["baseline_spike"] for r in ok
                                        if r.get("baseline_spike") is not None)
    return ps


def sweep_verdicts(sweeps: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    """The summary rows of the sweeps (Fig. 9-11): the paper's claim, reflow's, holds?"""
    rows: list[list[str]] = []

    def v(part: str, setting: str, key: str) -> float | None:
        return ((sweeps.get(part) or {}).get("summary", {}).get(setting) or {}).get(key)

    def holds(cond: bool | None) -> str:
        return "-" if cond is None else ("yes" if cond else "no")

    if "progressiveness" in sweeps:
        names = [n for n in sweeps["progressiveness"]["summary"] if n != pl.ADAPTIVE]
        fine = next((n for n in ("chunks-1", "chunks-4") if n in names), None)
        pa, pf = v("progressiveness", "all-at-once", "peak_ms"), v("progressiveness", fine or
                                                                    "", "peak_ms")
        ca, cf = (v("progressiveness", "all-at-once", "completion_s"),
                  v("progressiveness", fine or "", "completion_s"))
        rows.append(["Fig. 9: smaller chunks, longer completion (up to ~3x) and lower spikes "
                     "(up to ~10x)", "chunk-1 vs batch-all: ~3x completion, ~1/10 spike",
                     f"{fine} vs all-at-once: completion {fmt(an.ratio(cf, ca), '.2f')}x, "
                     f"peak {fmt(an.ratio(pf, pa), '.2f')}x",
                     holds(None if None in (pa, pf, ca, cf) else cf >= ca and pf <= pa)])
        fixed = {n: v("progressiveness", n, "peak_ms") for n in names}
        fixed_c = {n: v("progressiveness", n, "completion_s") for n in names}
        ad_p = v("progressiveness", pl.ADAPTIVE, "peak_ms")
        ad_c = v("progressiveness", pl.ADAPTIVE, "completion_s")
        bp = min((x for x in fixed.values() if x is not None), default=None)
        bc = min((x for x in fixed_c.values() if x is not None), default=None)
        if ad_p is not None:
            rp, rc = an.ratio(ad_p, bp), an.ratio(ad_c, bc)
            rows.append(["§V-B: the adaptive default at or near the best fixed setting "
                         "(peak or completion)", "competitive spike, shorter completion",
                         f"adaptive / best fixed: peak {fmt(rp, '.2f')}, completion "
                         f"{fmt(rc, '.2f')}",
                         holds(None if rp is None and rc is None else
                               min(x for x in (rp, rc) if x is not None)
                               <= pl.TARGET_RATIO)])
    if "replication" in sweeps:
        names = list(sweeps["replication"]["summary"])
        full = "all" if "all" in names else None
        bn, ba = v("replication", "none", "bytes_moved"), v("replication", full or "",
                                                            "bytes_moved")
        cn, ca = (v("replication", "none", "completion_s"),
                  v("replication", full or "", "completion_s"))
        pn, pa = v("replication", "none", "peak_ms"), v("replication", full or "", "peak_ms")
        rows.append(["Fig. 10: more keys replicated, shorter completion (up to ~3x) and lower "
                     "spikes (up to ~5x)", "repl-100% vs 0%: ~1/3 completion, ~1/5 spike",
                     f"all vs none: bytes moved {fmt(an.ratio(ba, bn), '.2f')}x, completion "
                     f"{fmt(an.ratio(ca, cn), '.2f')}x, peak {fmt(an.ratio(pa, pn), '.2f')}x",
                     holds(None if None in (ba, bn, ca, cn) else ba < bn and ca <= cn)])
    if "prioritisation" in sweeps:
        ph, pr = v("prioritisation", "hot-first", "peak_ms"), v("prioritisation", "random",
                                                                "peak_ms")
        ch, cr = (v("prioritisation", "hot-first", "completion_s"),
                  v("prioritisation", "random", "completion_s"))
        rows.append(["Fig. 11: hot-first below random on spike (up to ~50 %) and completion "
                     "(up to ~25 %) under skew", "~0.5x spike, ~0.75x completion",
                     f"hot-first / random: peak {fmt(an.ratio(ph, pr), '.2f')}x, completion "
                     f"{fmt(an.ratio(ch, cr), '.2f')}x",
                     holds(None if None in (ph, pr) else ph <= pr)])
    return rows


# ------------------------------------------------------------------------------ the runs


def _replication(handle: Any) -> dict[str, float] | None:
    """The job's replication bytes, CPU seconds and replicas so far (the rescale benchmark's
    reader of the Prometheus endpoint); None when the job has no endpoint."""
    from examples.bench.rescale import _replication as read

    url = getattr(handle, "metrics_url", None)
    if not url:
        return None
    try:
        return read(url)
    except OSError:
        return None


def table2_run(strategy: str, args: argparse.Namespace, progress: run.Progress,
               label: str) -> dict[str, Any]:
    """One fresh stock exchange job under ``strategy``: build, baseline, the replayed
    auto-scaling actions, ``--after`` s; never raises for a refused or failed rescale."""
    planning, fields = strategy_planning(strategy)
    targets = args.sequence_list
    sink = jobs.WriteLogLatencySink()
    cfg = JobConfig(warm_standby_tasks=args.warm_standby, metrics_poll_interval_s=0.5,
                    replication_period_s=args.replication_period, **fields)
    job = stock_job(sink, cfg, parallelism=targets[0], key_groups=args.table_key_groups,
                    rate=args.rate, symbols=args.symbols, zipf=args.zipf,
                    state_bytes=args.state_bytes)
    out: dict[str, Any] = {"strategy": strategy, "status": RunStatus.OK,
                           "planning": None if planning is None else planning.describe(),
                           "config": fields, "actions": []}
    progress.step(f"{label}: deploy", run.DEPLOY_GUESS_S)
    handle = job.run()
    started = time.time()
    try:
        progress.step(f"{label}: build {args.table_build:g} s", args.table_build)
        time.sleep(max(0.0, started + args.table_build - time.time()))
        built = time.time()
        check = run.settle_check(sink, args.rate)
        while not check(handle, built) and time.time() < built + args.settle_max:
            time.sleep(1.0)
        out["settle_s"] = round(time.time() - built, 1)
        out["metrics_before"] = run.op_metrics(handle, OP)
        progress.step(f"{label}: baseline {args.baseline:g} s", args.baseline)
        time.sleep(args.baseline)
        repl0 = _replication(handle)
        first = time.time()
        for i, n in enumerate(targets[1:]):
            if i:
                time.sleep(args.gap)
            progress.step(f"{label}: action {i + 1} -> {n}", 6.0)
            try:
                rep = handle.rescale(OP, n, protocol=PROTOCOL, planning=planning)
            except Exception as exc:  # a refused or failed action ends the run
                out.update(status=RunStatus.FAILED, reason=f"{type(exc).__name__}: {exc}")
                return out
            out["actions"].append(run.report_dict(rep))
        converged = time.time()
        progress.step(f"{label}: after {args.after:g} s", args.after)
        time.sleep(args.after)
        ended = time.time()
        repl1 = _replication(handle)
        st = handle.status()
        if st.state != JobState.RUNNING:
            out.update(status=RunStatus.FAILED, reason=f"job {st.state}: {st.error}")
            return out
        out["metrics_after"] = run.op_metrics(handle, OP)
        rows = an.histogram_rows(jobs.latency_seconds(sink))
    finally:
        progress.step(f"{label}: stop", 1.0)
        handle.stop()
        shutil.rmtree(sink.directory, ignore_errors=True)
    last_done = max(a["completed_at"] for a in out["actions"])
    out.update(started_at=started, requested_at=first, converged_at=converged, ended_at=ended,
               convergence_s=last_done - first,
               migration_s=sum(a["completed_at"] - (a["first_subscale_at"] or a["requested_at"])
                               for a in out["actions"]),
               deploy_s=sum(max(0.0, (a["first_subscale_at"] or a["requested_at"])
                                - a["requested_at"]) for a in out["actions"]),
               bytes_moved=sum(a["bytes_moved"] for a in out["actions"]),
               key_groups_moved=sum(a["key_groups_moved"] for a in out["actions"]))
    m = an.measure(rows, first, last_done, ended, baseline_s=args.baseline,
                   stable_s=args.stable, tolerance=args.tolerance, slack_ms=args.slack_ms)
    out["measure"] = m
    base = m["baseline"]
    out["baseline_level_ms"] = base["level_ms"]
    lo, hi = int(first), int(ended)
    window_rows = an.window(rows, lo, hi)
    out["peak_ms"] = an.peaks(window_rows)["max_ms"]
    out["spike"] = an.ratio(out["peak_ms"], base["level_ms"])
    floor = base["max_ms"] or base["level_ms"]
    out["threshold_ms"] = None if floor is None else args.spike_factor * floor
    runs_ = [] if floor is None else spikes(rows, lo, hi, out["threshold_ms"])
    out.update(spikes=runs_, spike_count=len(runs_),
               spike_seconds=sum(x["seconds"] for x in runs_))
    if repl0 is not None and repl1 is not None:
        cpu = repl1["reflow_replication_cpu_seconds_total"]
        secs = max(1e-9, ended - started)
        period = cfg.replication_period_s
        out.update(replication_bytes=repl1["reflow_replication_bytes_total"],
                   replication_cpu_s=cpu, replicas=int(repl1["reflow_replicas"]),
                   replication_ms=1000.0 * cpu * period / secs if cpu else 0.0)
    out["timeline"] = [{**r, "t": r["second"] + 0.5 - first}
                       for r in an.dense(rows, int(started) + 1, int(ended))]
    out["loadavg_at_end"] = os.getloadavg()
    return out


def sweep_phase(part: str, args: argparse.Namespace) -> pl.Phase:
    """The planning benchmark's phase a sweep runs, adapted: the replication sweep rebalances
    at 4 tasks; the prioritisation sweep runs at ``--skewed-rate``."""
    ph = pl.default_phases(args.quick)[SWEEP_PHASE[part]]
    if part == "replication":
        ph = replace(ph, to_p=ph.from_p, rebalance=True, title="replica holders, rebalance",
                     keys=args.replication_keys, state_bytes=args.replication_state_bytes,
                     rate=args.replication_rate)
    elif part == "prioritisation":
        ph = replace(ph, rate=args.skewed_rate)
    return replace(ph, settings=args.sweep_settings[part])


def sweep_part(part: str, args: argparse.Namespace, progress: run.Progress,
               counter: list[int], total: int) -> dict[str, Any]:
    """Every setting of one sweep, ``--repeats`` rounds alternating the settings, through
    the planning benchmark's ``run_one``."""
    phase = sweep_phase(part, args)
    ctx = pl.prepare_phase(phase, args)
    if part == "replication":
        ctx["assignment"] = replica_target(args.key_groups, phase.from_p)
        ctx["planned_groups_moved"] = args.key_groups // 2
        # every key has its state once the fill is out (FilledGenerator): no coverage wait
        ctx.update(build_s=args.build, keys_seen=phase.keys,
                   expected_state_mb=phase.keys * phase.state_bytes / 1e6,
                   access_per_s=access_ratio(phase.rate, phase.keys))
    res: dict[str, Any] = {"part": part, "phase": asdict(phase),
                           **{k: v for k, v in ctx.items()
                              if k not in ("assignment", "group_loads")}, "runs": []}
    standby = args.warm_standby
    if phase.rebalance:  # no new tasks: no standby actors to start with every job
        args.warm_standby = 0
    try:
        _sweep_runs(part, phase, ctx, res, args, progress, counter, total)
    finally:
        args.warm_standby = standby
    res["summary"] = sweep_summary(res["runs"])
    return res


def _sweep_runs(part: str, phase: pl.Phase, ctx: dict[str, Any], res: dict[str, Any],
                args: argparse.Namespace, progress: run.Progress, counter: list[int],
                total: int) -> None:
    for rep in range(args.repeats):
        for setting in phase.settings:
            counter[0] += 1
            planning, fields = sweep_planning(part, setting)
            args.job_config = fields  # read by planning.run_one's JobConfig
            args.wrap_source = filled_source if part == "replication" else None
            label = f"run {counter[0]}/{total} {part} {setting}"
            try:
                r = pl.run_one(phase, setting, planning, ctx, args, progress, label)
            except Exception as exc:  # a broken run must not lose the others
                r = {"setting": setting, "status": RunStatus.FAILED,
                     "reason": f"{type(exc).__name__}: {exc}"}
            finally:
                args.job_config, args.wrap_source = {}, None
            r.update(repeat=rep, config=fields)
            if r["status"] != RunStatus.OK:
                print(f"{label}: {r['status']}: {r.get('reason')}", file=sys.stderr,
                      flush=True)
            res["runs"].append(r)


# ------------------------------------------------------------------------------ output


def markdown(results: Mapping[str, Any]) -> str:
    c = results["config"]
    lines = [f"# Spacker: Table II and the planning knobs on reflow "
             f"({render.load_title(results)})", "",
             render.run_line(results) + f" · protocol `{PROTOCOL}`", ""]
    rows: list[list[str]] = []
    t2 = results.get("table2")
    scale_t2 = ""
    if t2:
        seq = " -> ".join(map(str, c["sequence_list"]))
        scale_t2 = (f"{seq} (paper 16 -> 4 -> 8 -> 6: "
                    f"{c['sequence_list'][0] / PAPER_SEQUENCE[0]:.2g}x), {c['symbols']:,} symbols x "
                    f"{c['state_bytes'] / 1000:g} KB (~{c['symbols'] * c['state_bytes'] / 1e6:.0f}"
                    f" MB; paper ~5 GB: ~1/{5e9 / (c['symbols'] * c['state_bytes']):.0f}), "
                    f"{c['table_key_groups']} key groups (paper 2^15), {c['rate']:,.0f} "
                    f"quotes/s (paper ~5k after the drop)")
        rows += [[*r[:3], scale_t2 if i == 0 else "as above", r[3]]
                 for i, r in enumerate(table2_verdicts(t2["summary"]))]
    sw = results.get("sweeps", {})
    said: set[str] = set()
    for r in sweep_verdicts(sw):
        part = ("progressiveness" if r[0].startswith(("Fig. 9", "§V-B")) else
                "replication" if r[0].startswith("Fig. 10") else "prioritisation")
        ph = (sw.get(part) or {}).get("phase") or {}
        scale = (f"micro job, {ph.get('keys', 0):,} keys x {ph.get('state_bytes', 0) / 1000:g}"
                 f" KB, {c['key_groups']} key groups, {ph.get('rate', 0):,.0f} rec/s, "
                 f"{ph.get('from_p')} -> {ph.get('to_p')} (paper: 8 tasks, 2^15 keys x 1 MB, "
                 f"2^10 key groups)")
        rows.append([*r[:3], "as above" if part in said else scale, r[3]])
        said.add(part)
    lines += ["The paper gives Table II as numbers and the knob studies as plots (claims "
              "from its text). Spike = highest per-second max latency at the sink; the paper "
              "measured on 4 x 16-core nodes with Flink 1.8, reflow runs on 2 shared CPUs.",
              "", *md_table(["paper", "paper's figure", "reflow (this machine)", "scale",
                             "holds?"], rows,
                            left=["paper's figure", "reflow (this machine)", "scale",
                                  "holds?"]), ""]
    if t2:
        s = t2["summary"]
        lines += [f"## Table II: stock exchange auto-scaling ({scale_t2}; {c['repeats']} "
                  f"run(s) per strategy, medians)", "",
                  *md_table(["strategy", "planning", "convergence s", "migration s", "deploy s",
                             "peak ms", "peak / base", f"spikes > {c['spike_factor']:g}x "
                             "base max", "s above", "base level ms", "replication ms/round",
                             "MB moved",
                             "paper: completion / spike / checkpoint ms"],
                            [[n, STRATEGY_TEXT[n], fmt(s[n]["convergence_s"], ".2f"),
                              fmt(s[n]["migration_s"], ".2f"), fmt(s[n]["deploy_s"], ".2f"),
                              fmt(s[n]["peak_ms"], ",.0f"),
                              fmt(s[n]["spike"], ".1f"), fmt(s[n]["spike_count"], ".0f"),
                              fmt(s[n]["spike_seconds"], ".0f"),
                              fmt(s[n]["baseline_level_ms"], ",.0f"),
                              fmt(s[n]["replication_ms"], ".1f"),
                              fmt(None if s[n]["bytes_moved"] is None
                                  else s[n]["bytes_moved"] / 1e6, ",.1f"),
                              " / ".join(f"{x:,.0f}" for x in PAPER_TABLE2[n])]
                             for n in STRATEGIES if n in s],
                            left=["planning"]), ""]
        reasons = s.get("spacker", {}).get("reasons") or []
        for i, reason in enumerate(reasons, 1):
            lines.append(f"- spacker action {i}: {reason}")
        fails = [f"{r['strategy']}: {r.get('reason')}" for r in t2["runs"]
                 if r.get("status") != RunStatus.OK]
        if fails:
            lines += ["", "Failed runs: " + "; ".join(fails)]
        lines.append("")
    for part, res in sw.items():
        ph = res["phase"]
        lines += [f"## {part} ({ph['keys']:,} keys x {ph['state_bytes']:,} B, "
                  f"{ph['rate']:,.0f} rec/s, {'Zipf ' + str(ph['zipf']) if ph['zipf'] else 'uniform'}"
                  f", {ph['from_p']} -> {ph['to_p']}"
                  f"{' rebalance' if ph['rebalance'] else ''})", "",
                  *md_table(["setting", "peak ms", "spike (peak / base)", "completion s",
                             "migration s", "MB moved", "steps", "runs ok"],
                            [[n, fmt(e["peak_ms"], ",.0f"), fmt(e["spike"], ".1f"),
                              fmt(e["completion_s"], ".2f"), fmt(e["migration_s"], ".2f"),
                              fmt(None if e["bytes_moved"] is None else e["bytes_moved"] / 1e6,
                                  ",.1f"), fmt(e["steps"], ".0f"), f"{e['ok']}/{e['runs']}"]
                             for n, e in res["summary"].items()]), ""]
        if res.get("access_per_s") is not None:
            lines += [f"- every key given its state first, then {res['access_per_s']:.0%} of "
                      "the keys touched per second (Spacker's ratio of state access; the "
                      "paper's micro-benchmark: 2 %)", ""]
        ad = res["summary"].get(pl.ADAPTIVE)
        if ad and ad.get("planning_reason"):
            lines += [f"- adaptive: {ad['planning_reason']}", ""]
    for a in results.get("added", []):
        lines += [f"Runs added from `{a['command']}` ({a.get('date')}, load "
                  f"{a['loadavg_at_start'][0]:.1f} -> "
                  f"{(a.get('loadavg_at_end') or ['?'])[0]:.1f}): Table II "
                  f"{', '.join(a['table2']) or '-'}; sweeps "
                  f"{', '.join(f'{p}: ' + ', '.join(v) for p, v in a['sweeps'].items()) or '-'}"
                  ".", ""]
    lines += [NOTES, ""]
    return "\n".join(lines)


NOTES = """Differences from the paper: the actions of its autoscaler are replayed, not
decided live (reflow's DS2 controllers decide differently from run to run on a shared
machine); the stock exchange's state is padded per symbol (books alone are small) and its
state-access ratio is higher than the paper's 2.7 %; replicas are placed by reflow's rule
(the next task after the owner, evened out), not where a rescale will move a group, so in a
scale-in replication saves only the groups whose holder becomes their owner (the replication
sweep moves groups to their holders to show the mechanism's effect); "replication time" is
the owners' CPU time per refresh round where the paper reports the checkpoint time
replication adds; Python on 2 shared CPUs against Flink on 4 x 16 cores. The adaptive
strategy measures the state-access ratio (distinct keys the tasks touched per second over
the keys holding state) and the capacity (the latest metrics window); its reasons above say
what it measured. Its equal-transfer-time chunks of ~0.5 s at its assumed 100 MB/s hold
most of this state, so "less progressive" runs in one or two steps, close to all-at-once
(the reasons list them), where the paper's chunks of 16 keys were many.
With the load average far above the 2 CPUs, per-second max latencies of seconds come from
scheduling alone (the baseline's own highest max is in results.json): orderings of peaks
within a factor of ~2 are noise there.""".replace("\n", " ")


def plot(results: Mapping[str, Any], path: str) -> None:
    """Table II as grouped bars (convergence, peak latency, replication time: reflow beside
    the paper) and the latency timelines; per sweep, the paper's pairs of bars (latency
    spike, completion time) per setting."""
    plt = render.pyplot()
    t2 = results.get("table2")
    sw = results.get("sweeps", {})
    ncols = max(4, len(sw))
    fig, axes = plt.subplots(3, ncols, figsize=(4.6 * ncols, 11.5), squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    colors = {"spacker": "tab:red", "all-at-once": "tab:blue", "progressive": "tab:green",
              "replication": "tab:purple"}
    if t2:
        s = t2["summary"]
        names = [n for n in STRATEGIES if n in s]
        for j, (key, pidx, label, scale) in enumerate((
                ("convergence_s", 0, "convergence / completion, s", 1000.0),
                ("peak_ms", 1, "latency spike (peak), ms", 1.0),
                ("replication_ms", 2, "replication (checkpoint) time, ms", 1.0))):
            ax = axes[0][j]
            ax.set_visible(True)
            xs = range(len(names))
            ours = [s[n][key] or 0.0 for n in names]
            paper = [PAPER_TABLE2[n][pidx] / scale for n in names]
            ax.bar([x - 0.2 for x in xs], ours, 0.4, color=[colors[n] for n in names],
                   label="reflow")
            ax.bar([x + 0.2 for x in xs], paper, 0.4, color="0.75", hatch="//",
                   label="paper (Table II)")
            for x, v in zip(xs, ours, strict=True):
                ax.annotate(f"{v:,.1f}", (x - 0.2, v), ha="center", va="bottom", fontsize=7)
            ax.set_xticks(list(xs))
            ax.set_xticklabels(names, fontsize=8)
            ax.set_ylabel(label, fontsize=8)
            ax.set_title(f"Table II: {label.split(',')[0]}", fontsize=9)
            if key == "peak_ms":
                ax.set_yscale("log")
            ax.legend(fontsize=7)
        ax = axes[0][3]
        ax.set_visible(True)
        for r in t2["runs"]:
            if r.get("status") != RunStatus.OK or r.get("repeat", 0):
                continue
            tl = r["timeline"]
            ax.plot([x["t"] for x in tl], [x["max_ms"] if x["max_ms"] is not None
                                           else float("nan") for x in tl],
                    color=colors[r["strategy"]], lw=1.0, label=r["strategy"])
            for a in r["actions"]:
                ax.axvline(a["requested_at"] - r["requested_at"], color=colors[r["strategy"]],
                           ls=":", lw=0.6)
        ax.set_yscale("log")
        ax.set_xlabel("s after the first scaling action")
        ax.set_ylabel("per-second max latency, ms")
        ax.set_title("stock exchange: latency (dotted: the scaling actions)", fontsize=9)
        ax.legend(fontsize=7)
    for j, (part, res) in enumerate(sw.items()):
        ps = res["summary"]
        names = list(ps)
        for i, (key, label) in ((1, ("peak_ms", "latency spike (peak), ms")),
                                (2, ("completion_s", "completion time, s"))):
            ax = axes[i][j]
            ax.set_visible(True)
            vals = [ps[n][key] or 0.0 for n in names]
            ax.bar(range(len(names)), vals,
                   color=["tab:red" if n == pl.ADAPTIVE else "tab:blue" for n in names])
            for k, v in enumerate(vals):
                ax.annotate(f"{v:,.1f}", (k, v), ha="center", va="bottom", fontsize=7)
            ax.set_xticks(range(len(names)))
            ax.set_xticklabels(names, rotation=25, ha="right", fontsize=8)
            ax.set_ylabel(label, fontsize=8)
            fig_no = {"progressiveness": 9, "replication": 10, "prioritisation": 11}[part]
            ax.set_title(f"Fig. {fig_no}: {part} — {label.split(',')[0]}", fontsize=9)
    fig.suptitle(f"Spacker on reflow ({PROTOCOL}) — {render.load_title(results)}",
                 fontsize=10)
    render.save_figure(fig, path)


# ------------------------------------------------------------------------------ main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = cli.parser(__doc__, "spacker")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--strategies", default=",".join(STRATEGIES),
                    help=f"Table II: comma-separated subset of {','.join(STRATEGIES)}")
    ap.add_argument("--repeats", type=int, default=1,
                    help="rounds of every setting, alternated (medians)")
    ap.add_argument("--sequence", help="Table II: the auto-scaling actions' parallelisms, the "
                                       "first the start (8,2,4,3; quick 4,1,3,2)")
    ap.add_argument("--symbols", type=int, help="Table II: symbols (4000; quick 1200)")
    ap.add_argument("--state-bytes", type=int,
                    help="Table II: reference data per symbol (20000; quick 30000)")
    ap.add_argument("--zipf", type=float, default=0.15, help="Table II: symbol skew (0.15)")
    ap.add_argument("--rate", type=float, help="Table II: quotes/s (1000; quick 800)")
    ap.add_argument("--table-key-groups", type=int, help="Table II: key groups (64; quick 32)")
    ap.add_argument("--table-build", type=float,
                    help="Table II: seconds of state building (20; quick 12)")
    ap.add_argument("--gap", type=float, help="Table II: seconds between actions (3; quick 2)")
    ap.add_argument("--spike-factor", type=float, default=2.0,
                    help="a spike: a second whose max latency exceeds this x the baseline's "
                         "highest per-second max (2)")
    ap.add_argument("--replication-period", type=float, default=5.0,
                    help="JobConfig.replication_period_s of replicating runs (5)")
    ap.add_argument("--warm-standby", type=int, default=2,
                    help="JobConfig(warm_standby_tasks=n) of every job (2)")
    ap.add_argument("--all-settings", action="store_true",
                    help="every sweep setting (adds key order, chunks of 16, replication "
                         "every 1 s; the full run leaves them out to fit ~20 min on 2 shared "
                         "CPUs)")
    ap.add_argument("--skewed-rate", type=float,
                    help="prioritisation sweep: records/s (10000; quick 8000)")
    ap.add_argument("--replication-keys", type=int,
                    help="replication sweep: keys, each given its state first (16000; quick "
                         "8000)")
    ap.add_argument("--replication-rate", type=float,
                    help="replication sweep: records/s after the fill (1000; quick 500: ~6 %% "
                         "of the keys touched per second)")
    cli.add_rescale_run(ap, DEFAULTS, coverage=0.99, key_groups="sweeps: 128; quick 64")
    # the latency seldom settles on a loaded shared machine; waiting 30 s for it in every
    # run would not fit the runs in ~20 min
    ap.set_defaults(settle_max=10.0)
    args = ap.parse_args(argv)
    cli.fill_defaults(args, DEFAULTS)
    args.out = args.out or os.path.join(RESULTS_ROOT,
                                        "spacker-quick" if args.quick else "spacker")
    args.part_list = cli.comma_list(args.parts)
    bad = [p for p in args.part_list if p not in PARTS]
    if bad:
        ap.error(f"unknown part(s) {bad}; use {', '.join(PARTS)}")
    try:
        args.sequence_list = [int(x) for x in cli.comma_list(args.sequence)]
    except ValueError:
        ap.error(f"--sequence: parallelisms as integers, got {args.sequence!r}")
    if len(args.sequence_list) < 2 or min(args.sequence_list) < 1:
        ap.error("--sequence: a start and at least one action, each >= 1")
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    args.strategy_list = [x for x in STRATEGIES if x in cli.comma_list(args.strategies)]
    if set(cli.comma_list(args.strategies)) - set(STRATEGIES):
        ap.error(f"--strategies: use some of {', '.join(STRATEGIES)}")
    size = "all" if args.all_settings else "quick" if args.quick else "full"
    args.sweep_settings = {p: SWEEPS[p][size] for p in SWEEPS}
    args.job_config = {}
    args.wrap_source = None
    return args


def add_runs(results: dict[str, Any], other: Mapping[str, Any]) -> None:
    """Add ``other``'s Table II and sweep runs (a later run of some strategies or settings,
    e.g. a rerun of one that failed) to ``results``, each tagged ``added_from`` (its
    command, date and load), and recompute the summaries and verdicts. ``results["added"]``
    lists what was added."""
    tag = {"command": other["command"], "date": other.get("date"),
           "loadavg_at_start": other["machine"]["loadavg_at_start"],
           "loadavg_at_end": other["machine"].get("loadavg_at_end")}
    added = results.setdefault("added", [])
    if other.get("table2"):
        t2 = results.setdefault("table2", {"runs": []})
        t2["runs"] += [{**r, "added_from": tag} for r in other["table2"]["runs"]]
        t2["summary"] = table2_summary(t2["runs"])
    for part, res in (other.get("sweeps") or {}).items():
        mine = results.setdefault("sweeps", {}).setdefault(part, {**res, "runs": []})
        mine["runs"] += [{**r, "added_from": tag} for r in res["runs"]]
        mine["summary"] = sweep_summary(mine["runs"])
    added.append({**tag, "table2": [r["strategy"] for r in (other.get("table2") or {}).get(
        "runs", [])], "sweeps": {p: [r["setting"] for r in res["runs"]]
                                 for p, res in (other.get("sweeps") or {}).items()}})
    results["verdicts"] = {
        "table2": table2_verdicts(results["table2"]["summary"]) if "table2" in results else [],
        "sweeps": sweep_verdicts(results.get("sweeps", {}))}


def render_again(out: str, more: Sequence[str]) -> int:
    """``--render``: rewrite ``out``'s summary.md and PNG from its results.json, after adding
    the runs of the results.json files ``more`` (``add_runs``)."""
    import json

    with open(os.path.join(out, "results.json")) as f:
        results = json.load(f)
    for path in more:
        with open(path) as f:
            add_runs(results, json.load(f))
    render.write_outputs(out, results, markdown=markdown(results), png="spacker.png",
                         plot=plot)
    return 0 if rescaled(results) else 1


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--render"]:
        if len(argv) < 2:
            print("usage: spacker.py --render DIR [MORE/results.json ...]", file=sys.stderr)
            return 2
        return render_again(argv[1], argv[2:])
    args = parse_args(argv)
    results = provenance.begin(__file__, argv, args, omit=("job_config",))
    results["paper"] = {"table2": PAPER_TABLE2, "sequence": PAPER_SEQUENCE}
    results["definitions"] = {
        "convergence_s": "first request -> last rescale's completed_at (gaps included)",
        "migration_s": "sum over the rescales of completed_at - first_subscale_at (the "
                       "moving, without starting new tasks)",
        "deploy_s": "sum over the rescales of first_subscale_at - requested_at (new tasks)",
        "peak_ms": "highest per-second max latency at the sink from the first request to "
                   "--after s past convergence",
        "spike_count": "runs of consecutive seconds with max latency > spike_factor x the "
                       "baseline's highest per-second max",
        "replication_ms": "owners' replication CPU seconds x replication_period_s / seconds "
                          "run, in ms: the CPU of one refresh round",
        "sweeps": "examples/bench/planning.py's run_one and definitions (spike = peak max / "
                  "baseline level; completion = RescaleReport.duration_s)",
    }
    results["machine"]["ray"] = run.ray_version()
    t2_runs = len(args.strategy_list) * args.repeats if "table2" in args.part_list else 0
    sweep_parts = [p for p in args.part_list if p != "table2"]
    sweep_runs = args.repeats * sum(len(args.sweep_settings[p]) for p in sweep_parts)
    planned = (t2_runs * (run.DEPLOY_GUESS_S + args.table_build + args.baseline + args.after
                          + 4 * len(args.sequence_list))
               + sweep_runs * (run.DEPLOY_GUESS_S + 2 * args.build + args.baseline + 6.0
                               + args.after))
    print(f"Spacker: {t2_runs} Table II runs, {sweep_runs} sweep runs, ~{planned / 60:.0f} min "
          f"planned", flush=True)
    progress = run.Progress(planned)
    run.init_ray()
    try:
        if t2_runs:
            t2: dict[str, Any] = {"runs": []}
            for rep in range(args.repeats):
                for k, name in enumerate(args.strategy_list):
                    label = f"Table II {rep * len(args.strategy_list) + k + 1}/{t2_runs} {name}"
                    try:
                        r = table2_run(name, args, progress, label)
                    except Exception as exc:  # a broken run must not lose the others
                        r = {"strategy": name, "status": RunStatus.FAILED,
                             "reason": f"{type(exc).__name__}: {exc}"}
                    r["repeat"] = rep
                    if r["status"] != RunStatus.OK:
                        print(f"{label}: {r['status']}: {r.get('reason')}", file=sys.stderr,
                              flush=True)
                    t2["runs"].append(r)
            t2["summary"] = table2_summary(t2["runs"])
            results["table2"] = t2
        results["sweeps"] = {}
        counter = [0]
        for part in sweep_parts:
            results["sweeps"][part] = sweep_part(part, args, progress, counter, sweep_runs)
    finally:
        progress.close()
        run.shutdown_ray()
    provenance.finish(results)
    results["verdicts"] = {
        "table2": table2_verdicts(results["table2"]["summary"]) if "table2" in results else [],
        "sweeps": sweep_verdicts(results["sweeps"])}
    render.write_outputs(args.out, results, markdown=markdown(results), png="spacker.png",
                         plot=plot)
    return 0 if rescaled(results) else 1


def rescaled(results: Mapping[str, Any]) -> bool:
    """Whether every part asked for ran at least one rescale that moved state (a run that
    rescaled nothing must not pass as a result)."""
    t2 = results.get("table2")
    if t2 is not None and not any(r.get("status") == RunStatus.OK and r.get("bytes_moved")
                                  for r in t2["runs"]):
        return False
    return all(any(r.get("status") == RunStatus.OK and (r.get("report") or {}).get(
        "bytes_moved") for r in res["runs"]) for res in results.get("sweeps", {}).values())


if __name__ == "__main__":
    sys.exit(main())
