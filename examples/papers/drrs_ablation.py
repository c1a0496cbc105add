"""DRRS ablation (Fig. 14): drrs without each of its mechanisms, beside fluid and stop-restart.

The DRRS paper's isolation test ("Having established DRRS's fundamental advantages, we now
conduct an isolation test using the Twitch workload"): the complete system against variants
that keep one of its three mechanisms, Decoupling and Re-routing (DR), Record Scheduling
(Schedule) and Subscale Division (Subscale). Its figures, relative to full DRRS: DR only,
peak latency +30 % and average +22 %; Schedule only +18 % / +15 %; Subscale only +23 % / +18 %.

    python examples/papers/drrs_ablation.py           # full: ~15 min on 2 shared CPUs
    python examples/papers/drrs_ablation.py --quick   # a few minutes: 1 -> 2, 4 variants
    RAY_ADDRESS=local python examples/papers/drrs_ablation.py   # a Ray of its own

(Without ``RAY_ADDRESS`` Ray joins the cluster this machine started last, if any.)

On reflow the mechanisms are switches of a drrs request (``JobHandle.rescale(...,
without=...)``, ``migration.protocols.drrs.DrrsMechanism``): ``decoupled-barriers`` (off:
no priority trigger, the old owner migrates once every predecessor's confirm is in, as a
coupled barrier), ``record-scheduling`` (off: a record that cannot be processed yet stops
its channel instead of being set aside, and pulls ignore the waiting records),
``subscale-division`` (off: one subscale per (old, new) pair, all at once). Variants
(``--variants``, slugs): ``drrs``; ``no-dr``, ``no-schedule``, ``no-subscale`` (one
mechanism off); ``dr-only``, ``schedule-only``, ``subscale-only`` (the paper's variants: two
off); ``none-of-them`` (all three off; not in the default set); and the references ``fluid``
(Megaphone) and ``stop-restart``; with ``--with-none`` the run without rescaling first.

The scenario is the rescale benchmark's ``micro`` (``examples/bench/rescale.py``: generator ->
``PaddedCount`` aggregator 8 -> 12 over 128 key groups, ~200 MB of state, 1 ms of service per
record per task); every run is one fresh job (``rescale.run_one``), the figures those of the
benchmark: peak latency (the highest in the scaling period), average latency (the mean over
the scaling period), scaling time (the rescale report's duration) and the scaling period.
``--repeats`` rounds (1; the order rotates by one per round), medians over them.

Writes ``results.json``, ``drrs_ablation.png`` (Fig. 14's comparison: latency relative to
full DRRS, reflow's bars beside the paper's, and the latency timelines) and ``summary.md``
to ``--out`` (default ``examples/papers/results/drrs_ablation/``; ``--quick``:
``examples/papers/results/drrs_ablation-quick/``).
"""

# ruff: noqa: E402  (the repository root goes on sys.path before reflow's imports)
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from examples.bench import rescale
from examples.bench.harness import cli, provenance, render, run
from examples.bench.harness.render import fmt, md_table
from examples.bench.harness.run import RunStatus
from examples.papers import RESULTS_ROOT

DR, SCHEDULE, SUBSCALE = "decoupled-barriers", "record-scheduling", "subscale-division"
#: slug -> (protocol, the mechanisms switched off, name in the tables)
VARIANTS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "drrs": ("drrs", (), "DRRS"),
    "no-dr": ("drrs", (DR,), "w/o DR"),
    "no-schedule": ("drrs", (SCHEDULE,), "w/o Schedule"),
    "no-subscale": ("drrs", (SUBSCALE,), "w/o Subscale"),
    "dr-only": ("drrs", (SCHEDULE, SUBSCALE), "DR only"),
    "schedule-only": ("drrs", (DR, SUBSCALE), "Schedule only"),
    "subscale-only": ("drrs", (DR, SCHEDULE), "Subscale only"),
    "none-of-them": ("drrs", (DR, SCHEDULE, SUBSCALE), "none of the three"),
    "fluid": ("fluid", (), "fluid (Megaphone)"),
    "stop-restart": ("stop-restart", (), "stop-restart"),
}
NONE = rescale.NONE
#: Fig. 14 (Twitch): (peak, average) latency of a one-mechanism variant / full DRRS's
PAPER = {"dr-only": (1.30, 1.22), "schedule-only": (1.18, 1.15), "subscale-only": (1.23, 1.18)}
#: the paper's headline (abstract, Q7 against Megaphone and Meces): peak -81.1 %, average
#: -95.5 %, scaling time -72.8 % to -86 %
PAPER_HEADLINE = {"peak": 0.189, "average": 0.045, "scaling": (0.14, 0.272)}
ONLY = ("dr-only", "schedule-only", "subscale-only")
WITHOUT = ("no-dr", "no-schedule", "no-subscale")
#: the paper's comparison first, then the references, then one mechanism off at a time:
#: a run stopped early (the outputs are rewritten after every run) keeps what matters most
FULL_VARIANTS = ("drrs", *ONLY, "fluid", "stop-restart", *WITHOUT)
#: the benchmark's settings of a full run (its defaults otherwise): the settling wait and the
#: time after the rescale shortened, so ten runs fit ~15 min on a loaded machine
FULL_BENCH_ARGS = "--settle-max 10 --after 10"
QUICK_VARIANTS = ("drrs", *WITHOUT)
#: the paper's Twitch run: ~500 MB of state, 8 -> 12 moving 111 of 128 key groups
PAPER_STATE_MB, PAPER_MOVED = 500.0, 111
COLORS = {"drrs": "tab:blue", "no-dr": "tab:orange", "no-schedule": "tab:green",
          "no-subscale": "tab:purple", "dr-only": "gold", "schedule-only": "tab:olive",
          "subscale-only": "tab:cyan", "none-of-them": "tab:brown", "fluid": "tab:pink",
          "stop-restart": "tab:red", NONE: "0.45"}


class AblationScenario(rescale.Scenario):
    """The benchmark's scenario, whose request is a variant: its protocol and switches."""

    def request(self, handle: Any, protocol: str) -> Any:
        proto, without, _ = VARIANTS[protocol]
        return handle.rescale(self.op, self.args.to_p, protocol=proto,
                              **({"without": without} if without else {}))


def run_order(variants: list[str], repeats: int, with_none: bool = False
              ) -> list[tuple[str, int]]:
    """(variant, round): the variants' order rotated by one per round; ``with_none``: the
    run without rescaling first in each round (every figure here is relative to full
    DRRS, measured in the same round, so it is a reference line only)."""
    out: list[tuple[str, int]] = []
    for rnd in range(repeats):
        shift = rnd % len(variants)
        order = variants[shift:] + variants[:shift]
        out += [(NONE, rnd)] if with_none else []
        out += [(v, rnd) for v in order]
    return out


# ---------------------------------------------------------------------- the summary


def _median(med: dict[str, Any], variant: str, figure: str) -> float | None:
    row = med.get(variant)
    return None if row is None else row[figure]["median"]


def ratios(results: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Per variant: its medians of peak, average latency, scaling time and scaling period
    over full DRRS's (None when either is missing)."""
    med = results["medians"]
    out: dict[str, dict[str, float | None]] = {}
    for v in med:
        if v in (NONE, "drrs") or v not in VARIANTS:
            continue
        row: dict[str, float | None] = {}
        for name, fig in (("peak", "peak_ms"), ("average", "period_mean_ms"),
                          ("scaling", "migration_s"), ("period", "period_s")):
            a, b = _median(med, v, fig), _median(med, "drrs", fig)
            row[name] = None if a is None or not b else a / b
        out[v] = row
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * (x - 1):+.0f} %"


def _verdict(ok: list[bool | None]) -> str:
    known = [x for x in ok if x is not None]
    if not known:
        return "n/a (not run)"
    if all(known):
        return "yes"
    return "partly" if any(known) else "no"


def scale_text(results: dict[str, Any]) -> str:
    sc = results["scenario"]
    cfg = results["config"]
    moved = next((r["report"]["key_groups_moved"] for r in results["runs"]
                  if r.get("status") == RunStatus.OK and r.get("report")), None)
    state = sc.get("expected_state_mb") or 0.0
    down = f", {PAPER_STATE_MB / state:.1f}x less state" if state else ""
    return (f"micro {cfg['from_p']} -> {cfg['to_p']}, {cfg['key_groups']} key groups"
            f" ({moved if moved is not None else '?'} moved; paper {PAPER_MOVED}), "
            f"~{state:.0f} MB (paper ~{PAPER_STATE_MB:.0f} MB{down}), "
            f"{cfg['rate']:,.0f} rec/s, {results['machine']['cpus']} shared CPUs")


def claims(results: dict[str, Any]) -> list[list[str]]:
    """The summary table's rows: the paper's figure, reflow's value, the scale, holds?"""
    rat = ratios(results)
    scale = scale_text(results)
    rows: list[list[str]] = []
    for v in ONLY:
        peak, avg = PAPER[v]
        r = rat.get(v)
        if r is None:
            rows.append([f"Fig. 14 {VARIANTS[v][2]}: peak {_pct(peak)}, average {_pct(avg)} "
                         "vs DRRS", "not run", scale, "n/a (not run)"])
            continue
        ok = [None if r[k] is None else r[k] > 1.0 for k in ("peak", "average")]
        rows.append([f"Fig. 14 {VARIANTS[v][2]}: peak {_pct(peak)}, average {_pct(avg)} vs DRRS",
                     f"peak {_pct(r['peak'])}, average {_pct(r['average'])}, scaling time "
                     f"{_pct(r['scaling'])}", scale, _verdict(ok)])
    # the ordering of the one-mechanism variants: DR only worst, then Subscale, then Schedule
    if all(v in rat for v in ONLY):
        paper_order = ["dr-only", "subscale-only", "schedule-only"]
        parts, ok2 = [], []
        for k in ("peak", "average"):
            vals = {v: rat[v][k] for v in ONLY}
            if any(x is None for x in vals.values()):
                ok2.append(None)
                continue
            order = sorted(ONLY, key=lambda v: -(vals[v] or 0.0))
            parts.append(f"{k}: " + " > ".join(VARIANTS[v][2] for v in order))
            ok2.append(order == paper_order)
        rows.append(["Fig. 14 ordering: DR only > Subscale only > Schedule only (peak and "
                     "average)", "; ".join(parts) or "n/a", scale, _verdict(ok2)])
    # the complete system lowest (the paper: "the integrated DRRS system achieves the lowest
    # peak and average latencies")
    others = [v for v in rat if v not in ("fluid", "stop-restart")]
    if others:
        ok3 = [None if rat[v][k] is None else rat[v][k] >= 1.0 for v in others
               for k in ("peak", "average")]
        worst = min(others, key=lambda v: rat[v]["peak"] or float("inf"))
        rows.append(["DRRS has the lowest peak and average latency of the variants",
                     f"lowest other peak: {VARIANTS[worst][2]} at {_pct(rat[worst]['peak'])}; "
                     f"{sum(1 for x in ok3 if x)} of {len(ok3)} comparisons at or above DRRS",
                     scale, _verdict(ok3)])
    for v in WITHOUT:
        if v in rat:
            r = rat[v]
            rows.append([f"(not in the paper) {VARIANTS[v][2]}: each mechanism contributes",
                         f"peak {_pct(r['peak'])}, average {_pct(r['average'])}, scaling time "
                         f"{_pct(r['scaling'])}", scale,
                         _verdict([None if r[k] is None else r[k] >= 1.0
                                   for k in ("peak", "average")])])
    for ref in ("fluid", "stop-restart"):
        if ref in rat:
            r = rat[ref]
            inv = {k: (None if r[k] is None or r[k] == 0 else 1.0 / r[k]) for k in r}
            claim = (f"headline (Q7, vs Megaphone and Meces): DRRS peak "
                     f"{PAPER_HEADLINE['peak']:.3f}x, average {PAPER_HEADLINE['average']:.3f}x,"
                     f" scaling time {PAPER_HEADLINE['scaling'][0]:.2f}-"
                     f"{PAPER_HEADLINE['scaling'][1]:.2f}x the baseline's" if ref == "fluid"
                     else "(not in the paper) DRRS below stop-restart on peak, average and "
                          "scaling time")
            rows.append([claim,
                         f"DRRS / {ref}: peak {fmt(inv['peak'], '.3f')}x, average "
                         f"{fmt(inv['average'], '.3f')}x, scaling time "
                         f"{fmt(inv['scaling'], '.3f')}x", scale,
                         _verdict([None if inv[k] is None else inv[k] < 1.0
                                   for k in ("peak", "average", "scaling")])])
    return rows


def markdown(results: dict[str, Any]) -> str:
    med = results["medians"]
    lines = [f"# DRRS ablation (Fig. 14) on reflow ({render.load_title(results)})", "",
             render.run_line(results),
             "", *([f"**Incomplete**: {len(results['runs'])} of {results['planned_runs']} "
                    "runs (the run was stopped; the files are rewritten after every run).",
                    ""] if len(results["runs"]) < results.get("planned_runs", 0) else []),
             f"Scenario: {results['scenario']['description']}. Peak: the highest latency "
             "in the scaling period; average: the mean latency over it; scaling time: the "
             "rescale report's duration. The paper's variants keep one mechanism each "
             "(reflow: the other two switched off); its figures are relative to full DRRS on "
             "its Twitch workload, read from its text.", "",
             *md_table(["paper", "reflow (this machine)", "scale", "holds?"], claims(results),
                       left=["paper", "reflow (this machine)", "scale", "holds?"]), "",
             "## Every variant (medians over the rounds)", ""]
    rows = []
    for v, row in med.items():
        name = VARIANTS[v][2] if v in VARIANTS else "no rescale"
        rows.append([name, str(row["runs"]), fmt(row["peak_ms"]["median"]),
                     fmt(row["period_mean_ms"]["median"], ".1f"),
                     fmt(row["migration_s"]["median"], ".2f"),
                     fmt(row["period_s"]["median"], ".0f"),
                     fmt(row["baseline_mean_ms"]["median"], ".1f"),
                     ", ".join(f"{x:.1f}" for x in row["loadavg_at_end"])])
    lines += md_table(["variant", "runs", "peak ms", "average ms", "scaling time s",
                       "scaling period s", "baseline mean ms", "load at end"], rows)
    failed = [r for r in results["runs"] if r.get("status") != RunStatus.OK]
    if failed:
        lines += ["", "Runs that did not complete: " + "; ".join(
            f"{r['protocol']}: {r.get('status')} ({r.get('reason', '')})" for r in failed)]
    reasons = {r["protocol"]: r["report"].get("planning_reason", "")
               for r in results["runs"] if r.get("report")}
    if reasons:
        lines += ["", "## How each variant ran (the rescale report's planning reason)", ""]
        lines += [f"* {VARIANTS[v][2] if v in VARIANTS else v}: {why}" for v, why in
                  reasons.items()]
    bases = sorted(b for row in med.values() if (b := row["baseline_mean_ms"]["median"]))
    if bases and bases[len(bases) // 2] > 1000.0:
        lines += ["", f"Overload: the median baseline latency (before the request) was "
                  f"{bases[len(bases) // 2] / 1000:.1f} s: the job did not keep up with its "
                  "input even before rescaling (the machine's load, shared with other work, "
                  "is in the title), so every figure here is that of an overloaded job, "
                  "where backlogs, not the mechanisms, set most of the latency."]
    paced = [v for v, why in reasons.items() if "paced by headroom: 1-1 subscales" in why]
    if paced:
        lines += ["", f"Pacing: {', '.join(VARIANTS[v][2] for v in paced if v in VARIANTS)} "
                  "ran one subscale at a time. reflow's drrs paces its subscales by the "
                  "machine's idle cores (`migration.pacing`, `JobConfig.drrs_pacing`), and "
                  "this machine had none to spare (see the load), so the variants that keep "
                  "subscale division ran their subscales in sequence, while those without it "
                  "run every (old, new) pair at once, unpaced; the paper's DRRS runs its "
                  "subscales in parallel. On this machine that, more than the mechanisms, "
                  "decides the scaling times."]
    lines += ["", "Why reflow's ratios differ from the paper's: a smaller state and key space on "
              "two CPUs shared by every task (and by other work: see the load), Python tasks, "
              "one round per variant, and a micro job instead of Twitch's. reflow's "
              "'without decoupled barriers' aligns without blocking channels, and its task "
              "core always reads the other channels when one waits (inter-channel scheduling "
              "stays on); see docs/guide/rescaling.md, 'The DRRS ablation'.", ""]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: str) -> None:
    plt = render.pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(15, 5.6),
                                  gridspec_kw={"width_ratios": [1.1, 1.4]})
    rat = ratios(results)
    shown = [v for v in FULL_VARIANTS if v in rat and v not in ("fluid", "stop-restart")]
    width = 0.2
    for i, v in enumerate(shown):
        r = rat[v]
        for j, k in enumerate(("peak", "average")):
            ax.bar(i + (j - 1.5) * width + width / 2, r[k] or 0.0, width, color=COLORS[v],
                   alpha=1.0 if k == "peak" else 0.6, edgecolor="k",
                   label=None if i else f"reflow {k}")
            if v in PAPER:
                ax.bar(i + (j + 0.5) * width + width / 2, PAPER[v][j], width, color="white",
                       edgecolor=COLORS[v], hatch="//" if k == "peak" else "..",
                       label=None if v != "dr-only" else f"paper {k} (Twitch)")
    ax.axhline(1.0, color="k", lw=1.0)
    ax.set_xticks(range(len(shown)), [VARIANTS[v][2] for v in shown], rotation=30,
                  ha="right", fontsize=8)
    ax.set_ylabel("latency / full DRRS's")
    ax.set_title("Fig. 14: peak and average latency relative to DRRS")
    ax.legend(fontsize=8)
    nan = float("nan")
    for r in results["runs"]:
        if r.get("status") != RunStatus.OK or r.get("round", 0) != 0 or not r.get("timeline"):
            continue
        v = r["protocol"]
        rows = r["timeline"]
        name = VARIANTS[v][2] if v in VARIANTS else "no rescale"
        ax2.plot([x["t"] for x in rows],
                 [nan if x["mean_ms"] is None else x["mean_ms"] for x in rows],
                 color=COLORS.get(v, "k"), lw=1.2, label=name)
    ax2.axvline(0, color="k", lw=1.2)
    ax2.set_yscale("log")
    base = float(results["config"].get("baseline") or 0.0)
    if base:
        ax2.set_xlim(left=-base - 1.0)
    ax2.set_xlabel("seconds since the rescale request")
    ax2.set_ylabel("mean latency per second, ms (log)")
    ax2.set_title("latency over time")
    ax2.legend(fontsize=7, ncol=2)
    fig.suptitle(f"DRRS ablation on reflow: {results['scenario']['description']}\n"
                 f"{render.load_title(results)}", fontsize=9)
    render.save_figure(fig, path)


# ---------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = cli.parser(__doc__, "drrs_ablation")
    ap.add_argument("--variants", help=f"comma-separated slugs of {', '.join(VARIANTS)} "
                                       f"(default: all; quick: {', '.join(QUICK_VARIANTS)})")
    ap.add_argument("--repeats", type=int, default=1, help="rounds (1)")
    ap.add_argument("--with-none", action="store_true",
                    help="also the run without rescaling, first in each round")
    ap.add_argument("--bench-args", default=FULL_BENCH_ARGS,
                    help="arguments for the rescale benchmark's parser, for its micro "
                         f"scenario (default '{FULL_BENCH_ARGS}'; quick: none)")
    args = ap.parse_args(argv)
    variants = cli.comma_list(args.variants) or list(QUICK_VARIANTS if args.quick
                                                     else FULL_VARIANTS)
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    extra = ("" if args.quick and args.bench_args == FULL_BENCH_ARGS
             else args.bench_args).split()
    bench = ["--scenario", "micro", "--no-overhead", "--no-replication-cost",
             *(["--quick"] if args.quick else []), *extra]
    b = rescale.parse_args(bench)
    b.variants, b.repeats, b.with_none = variants, args.repeats, args.with_none
    b.quick = args.quick
    b.out = args.out or os.path.join(RESULTS_ROOT, "drrs_ablation-quick" if args.quick
                                     else "drrs_ablation")
    return b


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = provenance.begin(__file__, argv, args, omit=("backends",))
    sc = AblationScenario(args)
    config = rescale.job_config(args)
    names = run_order(list(args.variants), args.repeats, args.with_none)
    print(f"DRRS ablation: {sc.describe()}", flush=True)
    print(f"runs: {', '.join(v for v, _ in names)}", flush=True)
    results.update({
        "scenario": {"name": "micro", "operator": sc.op, "description": sc.describe(),
                     **sc.info},
        "variants": {v: {"protocol": VARIANTS[v][0], "without": list(VARIANTS[v][1]),
                         "name": VARIANTS[v][2]} for v in args.variants},
        "paper": {"fig14_relative_to_drrs": {v: {"peak": p, "average": a}
                                             for v, (p, a) in PAPER.items()},
                  "headline": PAPER_HEADLINE},
        "runs": [],
    })
    results["machine"]["ray"] = run.ray_version()
    per_run = 5.0 + sc.build_s + args.baseline + args.after + rescale.RESCALE_GUESS_S
    progress = run.Progress(per_run * len(names))
    results["planned_runs"] = len(names)
    run.init_ray()
    try:
        for k, (v, rnd) in enumerate(names, 1):
            r = rescale.run_one(sc, v, config, progress, k, len(names))
            r.pop("note", None)  # the report names the protocol, the run the variant
            r["round"] = rnd
            results["runs"].append(r)
            if r["status"] != RunStatus.OK:
                print(f"\n{v}: {r['status']}: {r.get('reason')}", file=sys.stderr, flush=True)
            if k < len(names):  # what is done so far, should the run be stopped
                try:
                    write(args.out, dict(results, machine=dict(
                        results["machine"], loadavg_at_end=os.getloadavg())))
                except Exception as exc:  # the runs go on; the final write raises it
                    print(f"writing the partial results failed: {exc!r}", file=sys.stderr)
    finally:
        progress.close()
        run.shutdown_ray()
    provenance.finish(results)
    return 0 if write(args.out, results) else 1


def write(out: str, results: dict[str, Any]) -> bool:
    """Summarise ``results`` and write its files to ``out``; False when no rescale ran
    (nothing to compare: only results.json)."""
    results["medians"] = rescale.medians(results)
    results["ratios_to_drrs"] = ratios(results)
    if not any(r.get("report") for r in results["runs"]):
        print("no rescale ran: nothing to compare", file=sys.stderr)
        render.write_outputs(out, results)
        return False
    render.write_outputs(out, results, markdown=markdown(results),
                         png="drrs_ablation.png", plot=plot)
    return True


if __name__ == "__main__":
    sys.exit(main())
