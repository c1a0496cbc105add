"""Ding et al.: state moved by SSM, MTM-aware, OMS vs uniform and consistent hashing (Fig. 12-17).

"Optimal operator state migration for elastic data stream processing": the migration-cost
experiments (Fig. 12, 13, 15, 17 and the PMC time of Fig. 14), on reflow's assignment
planners. Pure computations (no Ray).

    python examples/papers/ding.py            # full: 5-15 min on 2 shared CPUs (PMC on Spark ~1 min)
    python examples/papers/ding.py --quick    # seconds; PMC in this process

The paper's model is reflow's (``migration.assignment``): its "tasks" are key groups, its
"nodes" reflow's tasks, its load-balancing threshold θ a bound ``max task load <= θ x mean``
(reflow's ``balance`` is θ - 1: the paper's default θ = 1.2 is ``balance=0.2``), and its
discount factor γ weighs the projected cost of future rescales in MTM-aware migration (§5.2;
γ = 0 is single-step). The cost of a migration is the state it moves, as a share of the whole
operator state, averaged over consecutive migrations (the paper: 100, on a Twitter trace).

Parts:

* ``theta`` (Fig. 12, 13): ``--key-groups`` (64, the paper's m) key groups whose loads and
  state sizes come from the rescale benchmark's generator (uniform keys and Zipf 1.0 keys;
  a group's state is its distinct keys x ``--state-bytes``), a trace of ``--migrations``
  (100) parallelisms in [8, 16] (the paper's range) from a synthetic diurnal tweet-count
  series normalised as the paper does (nodes proportional to the hourly count; a migration
  when it changes). For each θ: the mean share of the state moved per migration by
  ``uniform`` (Flink's contiguous ranges, the paper's "Storm default"), consistent hashing
  (reflow's, deterministic: one layout, where the paper averages 100 random ones) and SSM
  chained along the trace; SSM's planning time per call (Fig. 13). Where θ is infeasible for
  a step (a hot group), SSM uses the smallest θ that works (counted).
* ``tasks`` (Fig. 15): the same at θ = 1.2 with 32 ... 256 key groups: SSM's cost and time.
* ``mtm`` (Fig. 12's MTM line, Fig. 14, Fig. 17) -- scaled down: MTM's pre-computation over
  [8, 16] tasks and 64 groups took the paper hundreds of minutes on 64 executors; here the
  parallelisms are [2, 4] (the paper's range / 4), 128 key groups in ``--units`` (32) units,
  Zipf keys. The MTM is fitted on the trace's first half (the paper: the previous month),
  the ``--migrations`` rescales of its second half are planned by uniform, consistent
  hashing, SSM (over key groups, and over the units), MTM-aware (projected costs by
  ``migration.sequences``; γ swept) and OMS over the units (which knows the sequence: the
  lower bound of unit-aligned plans). θ swept for SSM and MTM at γ = 0.8 (the paper's
  default); PMC timed in this process per θ and, once, on Spark (``migration.pmc``, local
  mode; ``--pmc local`` or ``--quick`` skips Spark).
* ``sequence``: a named sequence of rescales (``--sequence``, 8,12,6,16,...) at reflow's
  default 128 key groups, Zipf keys, θ = 1.2: cumulative bytes of uniform, consistent hashing
  and SSM (OMS and MTM-aware are exponential in the parallelism: not at 16 tasks).

Writes ``results.json``, ``ding.png`` (the paper's style: cost in % of the state against θ,
m and γ) and ``summary.md`` (the paper's claim, reflow's value, the scale, whether it holds)
to ``--out`` (default ``examples/papers/results/ding/``; ``--quick``:
``examples/papers/results/ding-quick/``). Reuses ``examples/bench/assignment.py``'s
workload and SSM helpers and the bench harness.
"""

# ruff: noqa: E402  (the repository root goes on sys.path before reflow's imports)
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np

from examples.bench.assignment import ssm_or_least, workload_of
from examples.bench.harness import cli, jobs, provenance, render
from examples.bench.harness.render import fmt, md_table
from examples.papers import RESULTS_ROOT
from migration.assignment import (
    GroupWorkload,
    consistent_hashing,
    imbalance,
    migration_bytes,
    smallest_balance,
    uniform,
)
from migration.sequences import PmcModel, ProjectedCosts, TransitionMatrix, mtm, oms

THETAS = (1.1, 1.2, 1.3, 1.4, 1.5)  # the paper's θ (max load / mean)
GAMMAS = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9)
PAPER_THETA, PAPER_GAMMA = 1.2, 0.8
PAPER_RANGE, SCALED_RANGE = (8, 16), (2, 4)
ZIPF = 0.8  # the hottest key 3 % of the records: θ = 1.2 holds at 8-16 tasks of 64 groups
SKEWS = (("uniform keys", None), (f"Zipf {ZIPF:g} keys", ZIPF))
DEFAULTS = {"migrations": (100, 20), "records": (400_000, 60_000), "keys": (20_000, 4_000),
            "units": (32, 16), "key_groups_sweep": ("32,64,128,256", "32,64")}
BASELINES = ("uniform", "consistent-hashing")


# ---------------------------------------------------------------------- the trace

def hourly_nodes(hours: int, lo: int, hi: int, seed: int) -> list[int]:
    """Nodes per hour, proportional to a synthetic tweet count (a daily cycle, a weekly one
    and noise), normalised into ``[lo, hi]`` as the paper does with its Twitter crawl."""
    rng = np.random.default_rng(seed)
    t = np.arange(hours)
    count = (1.0 + 0.6 * np.sin(2 * np.pi * (t % 24) / 24 - 1.2)
             + 0.2 * np.sin(2 * np.pi * t / (24 * 7)) + rng.normal(0, 0.15, hours))
    x = (count - count.min()) / (count.max() - count.min())
    return [int(v) for v in np.rint(lo + x * (hi - lo))]


def migrations_of(nodes: Sequence[int]) -> list[int]:
    """The parallelisms the series migrates through: one entry per change (the first
    entry is the start)."""
    out = [nodes[0]]
    out += [b for a, b in zip(nodes, nodes[1:], strict=False) if b != a]
    return out


def trace(lo: int, hi: int, migrations: int, seed: int) -> tuple[list[int], list[int]]:
    """``(history, steps)``: the hourly series of the "previous month" (to fit an MTM) and
    ``migrations + 1`` parallelisms after it (the start, then one per migration)."""
    hours = 24 * 30
    while True:
        nodes = hourly_nodes(2 * hours, lo, hi, seed)
        steps = migrations_of(nodes[hours:])
        if len(steps) > migrations:
            return nodes[:hours], steps[:migrations + 1]
        hours *= 2


def fit_mtm(history: Sequence[int], lo: int, hi: int) -> TransitionMatrix:
    """The MTM as the paper fits it: hour-to-hour transition counts per parallelism,
    normalised per row (a row never seen stays put)."""
    ps = list(range(lo, hi + 1))
    counts = np.zeros((len(ps), len(ps)))
    for a, b in zip(history, history[1:], strict=False):
        counts[a - lo, b - lo] += 1
    rows = []
    for i, r in enumerate(counts):
        rows.append(tuple((r / r.sum()).tolist()) if r.sum() else
                    tuple(1.0 if j == i else 0.0 for j in range(len(ps))))
    return TransitionMatrix(tuple(ps), tuple(rows))


# ---------------------------------------------------------------------- planners

LAYOUTS = (("uniform", uniform), ("consistent-hashing", consistent_hashing))


def baseline_costs(steps: Sequence[int], wl: GroupWorkload) -> dict[str, list[int]]:
    """Bytes per migration of uniform ranges and consistent hashing along ``steps``."""
    m = wl.num_key_groups
    return {name: [migration_bytes(layout(m, a), layout(m, b), wl.sizes)
                   for a, b in zip(steps, steps[1:], strict=False)] for name, layout in LAYOUTS}


def baseline_balance(steps: Sequence[int], wl: GroupWorkload, theta: float
                     ) -> dict[str, dict[str, float]]:
    """Per baseline: the mean max/mean task load it leaves after each migration, and the
    share of migrations after which it breaks θ (neither looks at the load; SSM never does)."""
    m = wl.num_key_groups
    out = {}
    for name, layout in LAYOUTS:
        ratios = [imbalance(wl.loads, layout(m, n), n) for n in steps[1:]]
        out[name] = {"load_ratio": statistics.mean(ratios),
                     "breaks_theta": sum(r > theta + 1e-9 for r in ratios) / len(ratios)}
    return out


def ssm_chain(steps: Sequence[int], wl: GroupWorkload, theta: float,
              start: tuple[int, ...] | None = None) -> dict[str, Any]:
    """SSM along ``steps`` from ``start`` (default uniform ranges), under the paper's θ:
    bytes per migration, planning time per call (wall and CPU ms), and how many steps
    needed a larger θ."""
    cur = uniform(wl.num_key_groups, steps[0]) if start is None else start
    costs, ms, cpu, relaxed = [], [], [], 0
    for n in steps[1:]:
        t0, c0 = time.perf_counter(), time.process_time()
        plan, used = ssm_or_least(cur, n, wl, theta - 1)
        ms.append(1e3 * (time.perf_counter() - t0))
        cpu.append(1e3 * (time.process_time() - c0))
        relaxed += used > theta - 1
        costs.append(plan.predicted_bytes)
        cur = plan.assignment
    return {"bytes": costs, "ms": ms, "cpu_ms": cpu, "relaxed": relaxed}


def share(costs: Sequence[int], wl: GroupWorkload) -> float:
    """Mean bytes per migration in % of the whole state (the paper's y axis)."""
    return 100.0 * statistics.mean(costs) / sum(wl.sizes)


def zipf_workload(args: argparse.Namespace, key_groups: int, zipf: float | None
                  ) -> GroupWorkload:
    keys = jobs.generator_keys(args.records, keys=args.keys, zipf=zipf)
    return workload_of(keys, key_groups, args.state_bytes)


# ---------------------------------------------------------------------- parts

def theta_part(args: argparse.Namespace, steps: list[int]) -> list[dict[str, Any]]:
    rows = []
    for skew, zipf in SKEWS:
        wl = zipf_workload(args, args.key_groups, zipf)
        base = {k: share(v, wl) for k, v in baseline_costs(steps, wl).items()}
        for theta in THETAS:
            s = ssm_chain(steps, wl, theta)
            rows.append({"keys": skew, "theta": theta, **base, "ssm": share(s["bytes"], wl),
                         "baseline_balance": baseline_balance(steps, wl, theta),
                         "ssm_ms_median": statistics.median(s["ms"]),
                         "ssm_ms_max": max(s["ms"]),
                         "ssm_cpu_ms_median": statistics.median(s["cpu_ms"]),
                         "ssm_cpu_ms_p90": float(np.percentile(s["cpu_ms"], 90)),
                         "relaxed": s["relaxed"]})
            print(f"  {skew} θ={theta}: ssm {rows[-1]['ssm']:.1f}% uniform "
                  f"{base['uniform']:.1f}% CH {base['consistent-hashing']:.1f}%", flush=True)
    return rows


def tasks_part(args: argparse.Namespace, steps: list[int]) -> list[dict[str, Any]]:
    rows = []
    for m in (int(x) for x in cli.comma_list(args.key_groups_sweep)):
        wl = zipf_workload(args, m, ZIPF)
        s = ssm_chain(steps, wl, PAPER_THETA)
        rows.append({"key_groups": m, "ssm": share(s["bytes"], wl),
                     "ssm_ms_median": statistics.median(s["ms"]),
                     "ssm_cpu_ms_median": statistics.median(s["cpu_ms"]), "relaxed": s["relaxed"],
                     **{k: share(v, wl) for k, v in baseline_costs(steps, wl).items()}})
    return rows


def pmc_table(model: PmcModel, where: str) -> tuple[ProjectedCosts, float]:
    """The projected costs of ``model`` and the seconds they took (``where``: "local" in
    this process, "spark": ``migration.pmc`` on a local Spark session, session start and
    the Parquet table's write to a temporary directory included)."""
    t0 = time.perf_counter()
    if where == "local":
        return ProjectedCosts.compute(model), time.perf_counter() - t0
    from migration.pmc import precompute, spark_session

    spark = spark_session()
    try:
        with tempfile.TemporaryDirectory(prefix="reflow-pmc-") as tmp:
            table = precompute(spark, model, os.path.join(tmp, "pmc"))
    finally:
        spark.stop()
    return table, time.perf_counter() - t0


def mtm_chain(steps: Sequence[int], wl: GroupWorkload, table: ProjectedCosts,
              start: tuple[int, ...]) -> list[int]:
    """MTM-aware along ``steps`` from ``start``, at the table's θ: bytes per migration."""
    cur, costs = start, []
    for n in steps[1:]:
        plan = mtm(cur, n, wl, table)
        costs.append(plan.predicted_bytes)
        cur = plan.assignment
    return costs


def unit_theta(unit_wl: GroupWorkload, parallelisms: Sequence[int], theta: float) -> float:
    """The paper's θ the scaled part runs at: ``theta``, or the least θ at which every
    parallelism has a balanced partitioning of the units (PMC and OMS need one for each)."""
    least = max(smallest_balance(unit_wl, p) for p in parallelisms)
    return max(theta, 1 + least + 1e-6)


def mtm_part(args: argparse.Namespace) -> dict[str, Any]:
    lo, hi = SCALED_RANGE
    history, steps = trace(lo, hi, args.migrations, args.seed)
    matrix = fit_mtm(history, lo, hi)
    wl = zipf_workload(args, 128, ZIPF)
    total = sum(wl.sizes)
    units = PmcModel.of(wl, matrix, units=args.units, balance=PAPER_THETA - 1).units
    unit_wl = units.fold(wl)
    # every chain starts from uniform ranges over the units, so that MTM at γ = 0 and SSM
    # over the units start alike (the paper: γ = 0 is single-step)
    unit_start = uniform(units.count, steps[0])
    start = tuple(unit_start[u] for u in range(units.count)
                  for _ in range(units.bounds[u + 1] - units.bounds[u]))

    def over_units(theta: float) -> list[int]:
        cur, costs = unit_start, []
        for n in steps[1:]:
            plan, _ = ssm_or_least(cur, n, unit_wl, theta - 1)
            costs.append(plan.predicted_bytes)
            cur = plan.assignment
        return costs

    def run(theta: float, gamma: float, where: str = "local") -> dict[str, Any]:
        used = unit_theta(unit_wl, matrix.parallelisms, theta)
        model = PmcModel.of(wl, matrix, units=args.units, balance=used - 1, gamma=gamma)
        table, secs = pmc_table(model, where)
        return {"theta": theta, "theta_used": used, "gamma": gamma,
                "mtm_bytes": mtm_chain(steps, wl, table, start), "pmc_s": secs,
                "states": sum(len(r) for r in table.entries.values()),
                "iterations": table.iterations}

    by_theta = []
    for theta in THETAS:
        r = run(theta, PAPER_GAMMA)
        used = r["theta_used"]
        row = {"theta": theta, "theta_used": used,
               "ssm": share(ssm_chain(steps, wl, used, start)["bytes"], wl),
               "ssm over units": share(over_units(used), wl),
               "mtm": share(r["mtm_bytes"], wl),
               "oms over units": share([p.predicted_bytes for p in
                                        oms(unit_start, steps[1:], unit_wl, used - 1)], wl),
               "pmc_local_s": r["pmc_s"], "states": r["states"],
               "iterations": r["iterations"]}
        by_theta.append(row)
        print(f"  scaled θ={theta} (runs at {used:.3g}): ssm {row['ssm']:.1f}% ssm/units "
              f"{row['ssm over units']:.1f}% mtm {row['mtm']:.1f}% oms "
              f"{row['oms over units']:.1f}% (PMC {r['pmc_s']:.2f} s)", flush=True)
    by_gamma = []
    for gamma in GAMMAS:
        r = run(PAPER_THETA, gamma)
        by_gamma.append({"gamma": gamma, "theta_used": r["theta_used"],
                         "mtm": share(r["mtm_bytes"], wl), "pmc_local_s": r["pmc_s"],
                         "iterations": r["iterations"]})
    main = run(PAPER_THETA, PAPER_GAMMA)
    used = main["theta_used"]
    per = {**baseline_costs(steps, wl), "ssm": ssm_chain(steps, wl, used, start)["bytes"],
           "ssm over units": over_units(used), "mtm": main["mtm_bytes"],
           "oms over units": [p.predicted_bytes for p in
                              oms(unit_start, steps[1:], unit_wl, used - 1)]}
    spark = None
    if args.pmc == "spark":
        print("  PMC on Spark (local mode) ...", flush=True)
        r = run(PAPER_THETA, PAPER_GAMMA, "spark")
        spark = {"seconds": r["pmc_s"], "states": r["states"],
                 "same_choices": r["mtm_bytes"] == main["mtm_bytes"]}
    return {"steps": steps, "mtm": matrix.to_json(), "units": units.count,
            "state_bytes_total": total, "by_theta": by_theta, "by_gamma": by_gamma,
            "theta_used": used, "bytes": per, "shares": {k: share(v, wl) for k, v in per.items()},
            "pmc_local_s": main["pmc_s"], "pmc_states": main["states"], "pmc_spark": spark}


def sequence_part(args: argparse.Namespace) -> dict[str, Any]:
    steps = [int(x) for x in cli.comma_list(args.sequence)]
    wl = zipf_workload(args, 128, ZIPF)
    per = {**baseline_costs(steps, wl), "ssm": ssm_chain(steps, wl, PAPER_THETA)["bytes"]}
    return {"steps": steps, "bytes": per, "state_bytes_total": sum(wl.sizes),
            "totals": {k: sum(v) for k, v in per.items()}}


# ---------------------------------------------------------------------- the summary

def _at(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    return next(r for r in rows if all(r[k] == v for k, v in match.items()))


def _non_increasing(xs: Sequence[float], slack: float = 1e-9) -> bool:
    return all(b <= a + slack for a, b in zip(xs, xs[1:], strict=False))


def _from_theta(rows: list[dict[str, Any]], skew: str) -> str:
    """"for θ >= x" (the least θ from which CH costs more than SSM), or "no"."""
    above = [r["theta"] for r in rows if r["keys"] == skew
             and r["consistent-hashing"] > r["ssm"]]
    return f"for θ >= {min(above):g} only (CH ignores θ)" if above else "no"


def claims(results: dict[str, Any]) -> list[list[str]]:
    """The summary table's rows: the paper's claim, reflow's value, the scale, holds?"""
    th, tk, mt = results["theta"], results["tasks"], results["mtm"]
    trace_ = (f"{PAPER_RANGE[0]}-{PAPER_RANGE[1]} tasks, {len(results['steps']) - 1} "
              "migrations, synthetic trace (paper: m=64, 8-16 nodes, 100 migrations, Twitter)")
    scale_a = f"m={results['config']['key_groups']}, {trace_}"
    scale_b = (f"m=128 in {mt['units']} units, {SCALED_RANGE[0]}-{SCALED_RANGE[1]} tasks "
               f"(paper's range / 4), {len(mt['steps']) - 1} migrations")
    rows = []
    for skew, _ in SKEWS:
        r = _at(th, keys=skew, theta=PAPER_THETA)
        ratio = r["uniform"] / max(r["ssm"], 1e-9)
        rows.append([f"Fig. 12: Storm's contiguous ranges cost > 2x the proposed ({skew})",
                     f"uniform {r['uniform']:.1f}% vs SSM {r['ssm']:.1f}% per migration at "
                     f"θ=1.2: {ratio:.1f}x", scale_a, "yes" if ratio > 2 else
                     f"ordering yes, ratio {ratio:.1f}x < 2" if ratio > 1 else "no"])
        ch = [x["consistent-hashing"] / max(x["ssm"], 1e-9) for x in th if x["keys"] == skew]
        bal = r["baseline_balance"]["consistent-hashing"]
        rows.append([f"Fig. 12: CH consistently costs more than the proposed ({skew})",
                     f"CH / SSM over θ 1.1-1.5: {min(ch):.1f}x-{max(ch):.1f}x; but CH leaves "
                     f"max/mean load {bal['load_ratio']:.2f} on average and breaks θ=1.2 after "
                     f"{bal['breaks_theta']:.0%} of the migrations (SSM never)", scale_a,
                     "yes" if min(ch) > 1 else _from_theta(th, skew)])
        ys = [x["ssm"] for x in th if x["keys"] == skew]
        relaxed = sum(x["relaxed"] for x in th if x["keys"] == skew)
        rows.append([f"Fig. 12: the proposed methods' cost falls as θ grows ({skew})",
                     " -> ".join(f"{y:.1f}%" for y in ys)
                     + (f" ({relaxed} SSM plans over the sweep needed a larger θ)" if relaxed else ""), scale_a,
                     "yes" if _non_increasing(ys) and ys[-1] < ys[0] else
                     "flat" if _non_increasing(ys) else "no"])
    gaps = [x["ssm over units"] - x["mtm"] for x in mt["by_theta"]]
    rows.append(["Fig. 12: MTM-aware below single-step for every θ, the gap growing with θ",
                 "SSM over the same units - MTM: "
                 + ", ".join(f"{g:+.1f}" for g in gaps) + " points (θ 1.1-1.5); SSM over key "
                 "groups - MTM: " + ", ".join(f"{x['ssm'] - x['mtm']:+.1f}"
                                              for x in mt["by_theta"]),
                 scale_b, ("yes" if min(gaps) > 0 and gaps[-1] >= gaps[0] else
                           "below every θ, gap not growing" if min(gaps) > 0 else
                           "not for every θ" if max(gaps) > 0 else "no")])
    ms = [x["ssm_ms_max"] for x in th]
    med = [x["ssm_ms_median"] for x in th]
    cpu = [x["ssm_cpu_ms_median"] for x in th]
    p90 = [x["ssm_cpu_ms_p90"] for x in th]
    rows.append(["Fig. 13: SSM never exceeds 2 ms (m=64, Java)",
                 f"CPU per call: median {min(cpu):.1f}-{max(cpu):.1f} ms, p90 up to "
                 f"{max(p90):.1f} ms over θ (wall median {min(med):.1f}-{max(med):.1f}, max "
                 f"{max(ms):.0f} ms: Python + numpy, load "
                 f"{results['machine']['loadavg_at_start'][0]:.0f} on "
                 f"{results['machine']['cpus']} CPUs)", scale_a,
                 "yes" if max(p90) <= 2 else "median yes" if max(cpu) <= 2 else
                 f"no ({max(cpu) / 2:.1f}x the paper's bound)"])
    spark = mt.get("pmc_spark")
    rows.append(["Fig. 14: PMC takes hundreds of minutes (Spark, 64 executors, m=64, 8-16 "
                 "nodes)",
                 (f"{spark['seconds']:.0f} s on Spark local mode, " if spark else "")
                 + f"{mt['pmc_local_s']:.2f} s in one process ({mt['pmc_states']} balanced "
                   "partitionings)", scale_b,
                 "not comparable (scaled down: the paper's state space is out of reach)"])
    ys = [x["ssm"] for x in tk]
    ts = [x["ssm_ms_median"] for x in tk]
    ms_ = [x["key_groups"] for x in tk]
    growth = (ts[-1] / max(ts[0], 1e-9)) / ((ms_[-1] / ms_[0]) ** 2) if len(ts) > 1 else None
    rows.append(["Fig. 15: cost falls as m grows; SSM time grows quadratically",
                 "cost " + " -> ".join(f"{y:.1f}%" for y in ys) + f" (m {ms_[0]}-{ms_[-1]}); "
                 "time " + " -> ".join(f"{t:.1f}" for t in ts) + " ms"
                 + (f" ({growth:.2f} x the quadratic growth)" if growth else ""),
                 f"θ=1.2, Zipf {ZIPF:g} keys, {trace_}",
                 ("yes" if _non_increasing(ys) and ys[-1] < ys[0] else
                  "flat" if _non_increasing(ys) else "no") + " (cost); time "
                 + ("about quadratic" if growth and growth >= 0.5 else
                    "below quadratic (reflow's DP is banded by the longest interval θ allows)")])
    gs = [x["mtm"] for x in mt["by_gamma"]]
    g0 = mt["by_theta"][THETAS.index(PAPER_THETA)]["ssm over units"]
    rows.append(["Fig. 17: MTM's cost falls as γ grows; γ=0 is single-step",
                 " -> ".join(f"{y:.1f}%" for y in gs) + f" (γ {GAMMAS[0]}-{GAMMAS[-1]}); "
                 f"SSM over the units {g0:.1f}%", scale_b,
                 "yes" if _non_increasing(gs) and gs[-1] < gs[0] else
                 "flat" if _non_increasing(gs) else "no"])
    sh = mt["shares"]
    rows.append(["§5.1: OMS (knows the sequence) is the least of the unit-aligned plans",
                 ", ".join(f"{k} {v:.1f}%" for k, v in sh.items()), scale_b,
                 "yes" if sh["oms over units"] <= min(sh["mtm"], sh["ssm over units"]) + 1e-9
                 else "no"])
    return rows


def markdown(results: dict[str, Any]) -> str:
    lines = [f"# Ding et al.: optimal operator state migration ({render.load_title(results)})",
             "", render.run_line(results), "",
             "Costs are the state moved per migration, % of the whole operator state (the "
             "paper's metric). θ is the paper's (max task load <= θ x mean; reflow's "
             "`balance` = θ - 1). The paper gives its figures as plots; the claims below are "
             "its text's.", "",
             *md_table(["paper", "reflow (this machine)", "scale", "holds?"], claims(results),
                       left=["reflow (this machine)", "scale", "holds?"]), ""]
    lines += ["## Fig. 12: cost vs θ (% of the state per migration)", "",
              *md_table(["keys", "θ", "uniform ranges", "consistent hashing", "SSM",
                         "SSM ms (median)", "steps at a larger θ"],
                        [[r["keys"], f"{r['theta']:g}", fmt(r["uniform"]),
                          fmt(r["consistent-hashing"]), fmt(r["ssm"]),
                          fmt(r["ssm_ms_median"], ".2f"), str(r["relaxed"])]
                         for r in results["theta"]]), ""]
    lines += [f"## Fig. 15: cost vs key groups (θ = 1.2, Zipf {ZIPF:g} keys)", "",
              *md_table(["key groups", "uniform ranges", "consistent hashing", "SSM",
                         "SSM ms (median)"],
                        [[str(r["key_groups"]), fmt(r["uniform"]),
                          fmt(r["consistent-hashing"]), fmt(r["ssm"]),
                          fmt(r["ssm_ms_median"], ".2f")] for r in results["tasks"]]), ""]
    mt = results["mtm"]
    lines += [f"## MTM-aware and OMS (scaled: {SCALED_RANGE[0]}-{SCALED_RANGE[1]} tasks, 128 "
              f"key groups in {mt['units']} units, Zipf keys)", "",
              f"MTM fitted on the trace's first half: parallelisms {mt['mtm']['parallelisms']},"
              f" rows {[[round(x, 2) for x in r] for r in mt['mtm']['probabilities']]}. "
              f"{len(mt['steps']) - 1} migrations: {mt['steps'][:16]}"
              + (" ..." if len(mt["steps"]) > 16 else ""), "",
              *md_table(["θ", "SSM", "SSM over units", "MTM-aware (γ=0.8)", "OMS over units",
                         "PMC s (local)", "partitionings"],
                        [[f"{r['theta']:g}", fmt(r["ssm"]), fmt(r["ssm over units"]),
                          fmt(r["mtm"]), fmt(r["oms over units"]), fmt(r["pmc_local_s"], ".2f"),
                          str(r["states"])] for r in mt["by_theta"]]), "",
              *md_table(["γ", "MTM-aware cost %", "PMC s (local)", "iterations"],
                        [[f"{r['gamma']:g}", fmt(r["mtm"]), fmt(r["pmc_local_s"], ".2f"),
                          str(r["iterations"])] for r in mt["by_gamma"]]), ""]
    if mt.get("pmc_spark"):
        lines += [f"PMC on Spark (local mode, session start included) at θ=1.2, γ=0.8: "
                  f"{mt['pmc_spark']['seconds']:.1f} s.", ""]
    else:
        lines += ["PMC on Spark: not run (`--pmc local` or `--quick`).", ""]
    sq = results["sequence"]
    lines += [f"## A named sequence {' -> '.join(map(str, sq['steps']))} (128 key groups, "
              f"Zipf {ZIPF:g} keys, θ = 1.2)", "",
              *md_table(["strategy", "total bytes", "% of the state per rescale"],
                        [[k, f"{v:,}",
                          f"{100 * v / (len(sq['steps']) - 1) / sq['state_bytes_total']:.1f}"]
                         for k, v in sq["totals"].items()]), "",
              "OMS and MTM-aware enumerate labelled or balanced partitionings: out of reach at "
              "16 tasks, so they run on the scaled trace above.", ""]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: str) -> None:
    plt = render.pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.4))
    style = {"uniform": ("s", "uniform ranges (Storm/Flink)"),
             "consistent-hashing": ("^", "consistent hashing"), "ssm": ("o", "SSM"),
             "ssm over units": ("D", "SSM over units"), "mtm": ("*", "MTM-aware"),
             "oms over units": ("x", "OMS over units")}

    def lines(ax: Any, xs: Sequence[float], rows: list[dict[str, Any]], keys: Sequence[str]
              ) -> None:
        for k in keys:
            marker, label = style[k]
            ax.plot(xs, [r[k] for r in rows], marker=marker, label=label)
        ax.set_ylabel("migration cost (% of state)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)

    for ax, (skew, _) in zip(axes[0, :2], SKEWS, strict=True):
        rows = [r for r in results["theta"] if r["keys"] == skew]
        lines(ax, [r["theta"] for r in rows], rows, ("uniform", "consistent-hashing", "ssm"))
        ax.set_xlabel("load balancing factor θ")
        ax.set_title(f"Fig. 12: θ vs cost ({skew}, m={results['config']['key_groups']})")
    mt = results["mtm"]
    lines(axes[0, 2], [r["theta"] for r in mt["by_theta"]], mt["by_theta"],
          ("ssm", "ssm over units", "mtm", "oms over units"))
    axes[0, 2].set_xlabel("load balancing factor θ")
    axes[0, 2].set_title(f"Fig. 12, MTM (scaled: {SCALED_RANGE[0]}-{SCALED_RANGE[1]} tasks)")
    tk = results["tasks"]
    lines(axes[1, 0], [r["key_groups"] for r in tk], tk, ("uniform", "consistent-hashing", "ssm"))
    axes[1, 0].set_xscale("log", base=2)
    axes[1, 0].set_xlabel("number of key groups m")
    axes[1, 0].set_title("Fig. 15: m vs cost (θ=1.2)")
    ax = axes[1, 1]
    ax.plot([r["gamma"] for r in mt["by_gamma"]], [r["mtm"] for r in mt["by_gamma"]],
            marker="*", label="MTM-aware")
    ax.axhline(mt["by_theta"][THETAS.index(PAPER_THETA)]["ssm over units"], ls="--",
               color="grey", label="SSM over the same units")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("discount factor γ")
    ax.set_ylabel("migration cost (% of state)")
    ax.set_title("Fig. 17: γ vs cost (scaled)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax = axes[1, 2]
    total = mt["state_bytes_total"]
    for k, ys in mt["bytes"].items():
        marker, label = style[k]
        ax.plot(range(1, len(ys) + 1), 100 * np.cumsum(ys) / total, label=label,
                marker=marker, markevery=max(1, len(ys) // 10))
    ax.set_xlabel("migration")
    ax.set_ylabel("cumulative cost (% of state)")
    ax.set_title("cumulative bytes over the scaled trace (θ=1.2, γ=0.8)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(f"Ding et al. on reflow ({render.load_title(results)})")
    render.save_figure(fig, path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = cli.parser(__doc__, "ding")
    ap.add_argument("--migrations", type=int, help="migrations per trace (100; quick 20)")
    ap.add_argument("--key-groups", type=int, default=64, help="m of Fig. 12 (64, the paper's)")
    ap.add_argument("--key-groups-sweep", help="m of Fig. 15 (32,64,128,256; quick 32,64)")
    ap.add_argument("--records", type=int, help="records whose keys give the loads")
    ap.add_argument("--keys", type=int, help="distinct keys of the generator")
    ap.add_argument("--state-bytes", type=int, default=10_000, help="state per key")
    ap.add_argument("--units", type=int, help="PMC units of the scaled MTM part (32; quick 16)")
    ap.add_argument("--sequence", default="8,12,6,16,10,14,8,12,16,8",
                    help="the named sequence of parallelisms (first: the start)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the synthetic trace")
    ap.add_argument("--pmc", choices=("spark", "local"), default="spark",
                    help="also time PMC on Spark (local mode); --quick: local")
    args = ap.parse_args(argv)
    cli.fill_defaults(args, DEFAULTS)
    if args.quick:
        args.pmc = "local"
    args.out = args.out or os.path.join(RESULTS_ROOT, "ding-quick" if args.quick else "ding")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = provenance.begin(__file__, argv, args)
    _, steps = trace(*PAPER_RANGE, args.migrations, args.seed)
    results["steps"] = steps
    print(f"Ding et al.: θ sweep over {len(steps) - 1} migrations in {PAPER_RANGE} ...",
          flush=True)
    results["theta"] = theta_part(args, steps)
    print("key-group sweep ...", flush=True)
    results["tasks"] = tasks_part(args, steps)
    print("MTM-aware and OMS (scaled) ...", flush=True)
    results["mtm"] = mtm_part(args)
    results["sequence"] = sequence_part(args)
    provenance.finish(results)
    render.write_outputs(args.out, results, markdown=markdown(results), png="ding.png",
                         plot=plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
