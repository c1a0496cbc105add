"""Assignment strategies: the state they move and the balance they leave, SSM's planning
time, MTM-aware against SSM over a sequence of rescales, and the live effect on drrs.

    python examples/bench/assignment.py             # everything, ~3-6 min (live runs ~2 min)
    python examples/bench/assignment.py --quick     # small and short: PMC in this process
    python examples/bench/assignment.py --no-live   # the planning parts only (no Ray)

Parts (``migration.assignment`` and ``migration.sequences``; the model is in docs/guide/rescaling.md):

* ``moves``: 128 key groups holding the keyed-count state of the rescale benchmark's
  generator (``--keys`` keys, ``--state-bytes`` each; a group's size is its distinct keys x
  the padding), its load the records per group over ``--records`` generated records,
  uniform and Zipf (exponent 1.0) keys. For 4 -> 6, 8 -> 12, 12 -> 8 and a rebalance at 8
  tasks: bytes moved and the resulting max / mean task load of ``uniform`` (from uniform
  ranges), ``consistent-hashing`` (from its own layout at the old parallelism, as a job
  that always used it) and ``ssm`` under ``--balance`` θ (from uniform ranges; when the Zipf
  load makes θ impossible, the smallest θ that works, recorded).
* ``timing``: SSM's planning time (median of ``--repeats`` calls, wall and CPU) for 128 and
  1,024 key groups to 16 and 64 tasks from half as many (uniform loads, and Zipf loads at
  the smallest θ that works when θ cannot hold); the target is <= 10 ms for 128 -> 16.
* ``sequence``: a sequence of ``--steps`` (20) parallelisms drawn from the paper's Table 4
  MTM (2, 3 or 4 tasks; seed ``--seed``), from 2 tasks in uniform ranges, even loads and
  sizes. Total bytes moved, all under θ, by: SSM at every step over key groups; SSM over
  ``--units`` units (32; cuts on unit boundaries, as MTM's); the MTM-aware strategy
  (projected costs pre-computed on Spark, ``migration.pmc``, over the units; ``--quick``:
  16 units, in this process); OMS over the units, which knows the sequence.
* ``live`` (``--no-live`` skips it): the rescale benchmark's micro scenario (``--quick``
  settings unless ``--live-full``) run with drrs twice, uniform ranges then ``ssm``:
  migration duration, bytes moved and peak latency, in one run.

Writes ``examples/bench/out/assignment/results.json``, ``summary.md`` (also printed) and
``assignment.png``. Planning times depend on the machine's load (recorded): compare
within one run.
"""

# ruff: noqa: E402  (the repository root goes on sys.path before reflow's imports)
from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np

from engine import BalanceInfeasible
from engine.dataflow import key_group_of
from examples.bench.harness import cli, jobs, provenance, render
from examples.bench.harness.render import fmt, md_table
from migration.assignment import (
    GroupWorkload,
    consistent_hashing,
    make_plan,
    smallest_balance,
    ssm,
    uniform,
)
from migration.sequences import PAPER_TABLE_4, PmcModel, ProjectedCosts, mtm, oms

CASES = ((4, 6), (8, 12), (12, 8), (8, 8))
PAPER_SCALE_IN = "ssm, any tasks go (paper)"
TIMING = ((128, 16), (128, 64), (1024, 16), (1024, 64))
DEFAULTS = {"records": (400_000, 100_000), "keys": (20_000, 5_000), "repeats": (7, 3),
            "units": (32, 16)}


def workload_of(keys: np.ndarray, key_groups: int, state_bytes: int) -> GroupWorkload:
    """Per group: records (load) and distinct keys x ``state_bytes`` (state)."""
    group = np.asarray([key_group_of(int(k), key_groups) for k in range(int(keys.max()) + 1)])
    per_record = group[keys]
    loads = np.bincount(per_record, minlength=key_groups).astype(float)
    distinct = np.bincount(group[np.unique(keys)], minlength=key_groups)
    return GroupWorkload(tuple(loads.tolist()), tuple((distinct * state_bytes).tolist()))


def ssm_or_least(old: tuple[int, ...], n: int, wl: GroupWorkload, theta: float) -> Any:
    """``ssm`` at θ, or at the smallest θ that works (and which one)."""
    try:
        return ssm(old, n, wl, theta), theta
    except BalanceInfeasible as exc:
        return ssm(old, n, wl, exc.smallest_balance), exc.smallest_balance


def ssm_any_tasks_go(old: tuple[int, ...], n: int, wl: GroupWorkload, theta: float) -> Any:
    """The paper's scale-in model, for comparison: any ``n`` of the old tasks may stay, not
    only ``0..n-1`` as in reflow. Exact, by ``ssm`` over every choice of survivors (numbered
    first): C(old tasks, n) calls."""
    tasks = sorted(set(old))
    best = None
    for stay in itertools.combinations(tasks, n):
        label = {t: i for i, t in enumerate(stay + tuple(t for t in tasks if t not in stay))}
        plan = ssm(tuple(label[t] for t in old), n, wl, theta)
        if best is None or plan.predicted_bytes < best.predicted_bytes:
            best = plan
    return best


def moves(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for skew, zipf in (("uniform", None), ("Zipf 1.0", 1.0)):
        keys = jobs.generator_keys(args.records, keys=args.keys, zipf=zipf)
        wl = workload_of(keys, 128, args.state_bytes)
        total = sum(wl.sizes)
        for a, b in CASES:
            start = uniform(128, a)
            plans = {"uniform": make_plan("uniform", start, uniform(128, b), b, wl, "uniform"),
                     "consistent-hashing": make_plan(
                         "consistent-hashing", consistent_hashing(128, a),
                         consistent_hashing(128, b), b, wl, "consistent hashing")}
            plans["ssm"], theta = ssm_or_least(start, b, wl, args.balance)
            if b < a:
                plans[PAPER_SCALE_IN] = ssm_any_tasks_go(start, b, wl, theta)
            before = make_plan("none", start, start, a, wl, "before")
            for name, p in plans.items():
                rows.append({"keys": skew, "case": f"{a} -> {b}" if a != b else f"rebalance at {a}",
                             "strategy": name, "bytes": p.predicted_bytes,
                             "share": p.predicted_bytes / total, "groups": len(p.moved),
                             "load_ratio": p.load_ratio, "load_ratio_before": before.load_ratio,
                             "theta": theta if name.startswith("ssm") else None})
    return rows


def timing(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    rng = np.random.default_rng(7)
    for m, n in TIMING:
        for skew in ("uniform", "zipf"):
            loads = np.ones(m) if skew == "uniform" else 1.0 / np.arange(1, m + 1) ** 1.0
            if skew == "zipf":
                rng.shuffle(loads)
            wl = GroupWorkload(tuple(loads.tolist()), (1000,) * m)
            theta = max(args.balance, smallest_balance(wl, n) + 1e-4)
            old = uniform(m, n // 2)
            ssm(old, n, wl, theta)  # warm-up (numpy's first calls)
            wall, cpu = [], []
            for _ in range(args.repeats):
                t0, c0 = time.perf_counter(), time.process_time()
                plan = ssm(old, n, wl, theta)
                wall.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
            rows.append({"groups": m, "from": n // 2, "to": n, "loads": skew, "theta": theta,
                         "wall_ms": 1e3 * statistics.median(wall),
                         "cpu_ms": 1e3 * statistics.median(cpu),
                         "groups_moved": len(plan.moved)})
    return rows


def sequence(args: argparse.Namespace) -> dict[str, Any]:
    wl = GroupWorkload.even(128, size=args.state_bytes)
    model = PmcModel.of(wl, PAPER_TABLE_4, units=args.units, balance=args.balance,
                        gamma=args.gamma)
    t0 = time.perf_counter()
    if args.quick or args.pmc == "local":
        table, where = ProjectedCosts.compute(model), "in this process"
    else:
        from migration.pmc import precompute, spark_session

        spark = spark_session()
        try:
            table = precompute(spark, model, os.path.join(args.out, "pmc"))
        finally:
            spark.stop()
        where = "on Spark (local mode)"
    pmc_s = time.perf_counter() - t0
    steps = PAPER_TABLE_4.walk(2, args.steps, seed=args.seed)
    start = uniform(128, 2)
    units = model.units
    unit_wl = units.fold(wl)
    unit_start = tuple(start[b] for b in units.bounds[:-1])
    per: dict[str, list[int]] = {"ssm": [], "ssm over units": [], "mtm": []}
    cur = {"ssm": start, "ssm over units": unit_start, "mtm": start}
    for n in steps:
        for name in per:
            if name == "mtm":
                p = mtm(cur[name], n, wl, table)
            elif name == "ssm":
                p = ssm(cur[name], n, wl, args.balance)
            else:
                p = ssm(cur[name], n, unit_wl, args.balance)
            per[name].append(p.predicted_bytes)
            cur[name] = p.assignment
    plans = oms(unit_start, steps, unit_wl, args.balance)
    per["oms over units"] = [p.predicted_bytes for p in plans]
    return {"steps": steps, "bytes": per, "totals": {k: sum(v) for k, v in per.items()},
            "pmc": {"where": where, "seconds": pmc_s, "units": units.count,
                    "partitionings": {p: len(r) for p, r in table.entries.items()},
                    "iterations": table.iterations, "gamma": args.gamma},
            "state_bytes_total": sum(wl.sizes)}


def live(args: argparse.Namespace) -> list[dict[str, Any]]:
    """drrs on the rescale benchmark's micro scenario, uniform ranges then ssm."""
    from examples.bench import rescale as rb
    from examples.bench.harness import run

    out = []
    progress = run.Progress(2 * 40.0)
    run.init_ray()
    try:
        for k, strategy in enumerate(("uniform", "ssm"), 1):
            argv = ["--protocols", "drrs", "--no-baseline-run", "--no-overhead",
                    "--no-replication-cost", "--assignment", strategy,
                    "--balance", str(args.balance)] + ([] if args.live_full else ["--quick"])
            a = rb.parse_args(argv)
            sc = rb.Scenario(a)
            r = rb.run_one(sc, "drrs", rb.job_config(a), progress, k, 2)
            rep = r.get("report") or {}
            period = r.get("period") or {}
            out.append({"strategy": strategy, "status": str(r["status"]),
                        "reason": r.get("reason"), "scenario": sc.describe(),
                        "duration_s": rep.get("duration_s"), "bytes_moved": rep.get("bytes_moved"),
                        "predicted_bytes": rep.get("predicted_bytes"),
                        "key_groups_moved": rep.get("key_groups_moved"),
                        "load_ratio": rep.get("load_ratio"),
                        "subscales": len(rep.get("subscales") or ()),
                        "first_subscale_s": _since_request(rep, "first_subscale_at"),
                        "peak_max_ms": period.get("max_ms"),
                        "period_p99_ms": period.get("p99_ms"),
                        "baseline_level_ms": (r.get("baseline") or {}).get("level_ms")})
    finally:
        progress.close()
        run.shutdown_ray()
    return out


def _since_request(report: dict[str, Any], field: str) -> float | None:
    """Seconds from the request to ``report[field]`` (a wall-clock time), when both exist."""
    at, requested = report.get(field), report.get("requested_at")
    return None if not at or requested is None else at - requested


def markdown(results: dict[str, Any]) -> str:
    lines = [f"# Assignment strategies ({render.load_title(results)})", ""]
    lines += ["## State moved and load left (128 key groups)", "",
              *md_table(["keys", "case", "strategy", "bytes moved", "share", "groups",
                        "max/mean load (before)", "θ"],
                       [[r["keys"], r["case"], r["strategy"], f"{r['bytes']:,}",
                         f"{r['share']:.0%}", str(r["groups"]),
                         f"{fmt(r['load_ratio'], '.2f')} ({fmt(r['load_ratio_before'], '.2f')})",
                         fmt(r["theta"], ".3g")] for r in results["moves"]]), ""]
    lines += ["## SSM planning time", "",
              *md_table(["key groups", "tasks", "loads", "θ", "wall ms", "CPU ms", "groups moved"],
                       [[str(r["groups"]), f"{r['from']} -> {r['to']}", r["loads"],
                         fmt(r["theta"], ".3g"), fmt(r["wall_ms"], ".1f"),
                         fmt(r["cpu_ms"], ".1f"), str(r["groups_moved"])]
                        for r in results["timing"]]), ""]
    s = results["sequence"]
    pmc = s["pmc"]
    lines += ["## MTM-aware vs SSM over a sequence (the paper's Table 4)", "",
              f"Parallelisms: {s['steps']}. Projected costs {pmc['where']} in "
              f"{pmc['seconds']:.1f} s over {pmc['units']} units ({pmc['partitionings']} "
              f"balanced partitionings, {pmc['iterations']} iterations, γ={pmc['gamma']:g}).",
              "",
              *md_table(["strategy", "total bytes", "share of the state per rescale"],
                       [[k, f"{v:,}", f"{v / len(s['steps']) / s['state_bytes_total']:.1%}"]
                        for k, v in s["totals"].items()]),
              "", f"MTM / SSM over the same units: "
                  f"{s['totals']['mtm'] / max(1, s['totals']['ssm over units']):.3f}; MTM / SSM "
                  f"over key groups: {s['totals']['mtm'] / max(1, s['totals']['ssm']):.3f}; OMS "
                  "knows the sequence.", ""]
    if results.get("live"):
        lines += ["## Live: drrs on the rescale benchmark", "",
                  *md_table(["assignment", "status", "duration s", "first subscale s",
                             "subscales", "bytes moved", "predicted", "groups", "max/mean",
                             "baseline ms", "peak max ms", "period p99 ms"],
                           [[r["strategy"], r["status"], fmt(r["duration_s"], ".2f"),
                             fmt(r.get("first_subscale_s"), ".2f"), str(r.get("subscales")),
                             fmt(r["bytes_moved"], ",.0f"), fmt(r["predicted_bytes"], ",.0f"),
                             fmt(r["key_groups_moved"], ".0f"), fmt(r["load_ratio"], ".2f"),
                             fmt(r["baseline_level_ms"], ".0f"),
                             fmt(r["peak_max_ms"], ".0f"), fmt(r["period_p99_ms"], ".0f")]
                            for r in results["live"]]),
                  "", results["live"][0]["scenario"], ""]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: str) -> None:
    plt = render.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    strategies = ["uniform", "consistent-hashing", "ssm"]
    for ax, skew in zip(axes[:2], ("uniform", "Zipf 1.0"), strict=True):
        rows = [r for r in results["moves"] if r["keys"] == skew]
        cases = list(dict.fromkeys(r["case"] for r in rows))
        for i, s in enumerate(strategies):
            ys = [next(r["share"] for r in rows if r["case"] == c and r["strategy"] == s)
                  for c in cases]
            ax.bar(np.arange(len(cases)) + (i - 1) * 0.27, ys, 0.27, label=s)
        ax.set_xticks(range(len(cases)), cases)
        ax.set_ylabel("share of the state moved")
        ax.set_title(f"{skew} keys")
        ax.legend(fontsize=8)
    s = results["sequence"]
    for name, ys in s["bytes"].items():
        axes[2].plot(range(1, len(ys) + 1), np.cumsum(ys), marker=".", label=name)
    axes[2].set_xlabel("rescale")
    axes[2].set_ylabel("bytes moved (cumulative)")
    axes[2].set_title("Table 4 sequence: MTM-aware vs SSM")
    axes[2].legend(fontsize=8)
    fig.suptitle(render.load_title(results))
    render.save_figure(fig, path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = cli.parser(__doc__, "assignment")
    ap.add_argument("--balance", type=float, default=0.2, help="θ (0.2)")
    ap.add_argument("--gamma", type=float, default=0.9, help="MTM discount γ (0.9)")
    ap.add_argument("--records", type=int, help="records whose keys give the loads")
    ap.add_argument("--keys", type=int, help="distinct keys of the generator")
    ap.add_argument("--state-bytes", type=int, default=10_000, help="state per key")
    ap.add_argument("--repeats", type=int, help="SSM calls timed per case")
    ap.add_argument("--units", type=int, help="PMC units (32; --quick 16)")
    ap.add_argument("--steps", type=int, default=20, help="rescales in the sequence")
    ap.add_argument("--seed", type=int, default=1, help="seed of the sequence")
    ap.add_argument("--pmc", choices=("spark", "local"), default="spark",
                    help="where projected costs are computed (--quick: local)")
    ap.add_argument("--no-live", dest="live", action="store_false", help="skip the live runs")
    ap.add_argument("--live-full", action="store_true",
                    help="live runs with the rescale benchmark's full micro settings")
    args = ap.parse_args(argv)
    cli.fill_defaults(args, DEFAULTS)
    args.out = cli.out_dir(args, "assignment")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = provenance.begin(__file__, argv)
    results["config"] = dict(vars(args))
    print("assignment benchmark: moves ...", flush=True)
    results["moves"] = moves(args)
    print("timing ...", flush=True)
    results["timing"] = timing(args)
    print("sequence (PMC) ...", flush=True)
    results["sequence"] = sequence(args)
    if args.live:
        print("live runs (drrs, uniform then ssm) ...", flush=True)
        results["live"] = live(args)
    provenance.finish(results)
    render.write_outputs(args.out, results, markdown=markdown(results), png="assignment.png",
                         plot=plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
