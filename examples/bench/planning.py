"""Spacker's adaptive planning strategy against fixed planning settings, in three phases.

    python examples/bench/planning.py                     # 3 phases, 18 runs, ~10 min
    python examples/bench/planning.py --quick             # 64 key groups, 16 runs, ~5-7 min
    python examples/bench/planning.py --repeats 3         # medians of 3 runs per setting
    python examples/bench/planning.py --phases large --settings all-at-once,one-by-one,adaptive

The Spacker paper (§V-B2, "Spacker for dynamic workloads") runs one micro benchmark through
three phases and compares its adaptive default strategy with fixed migration strategies on
latency spike and completion time. The same here, with the ``non-disruptive`` protocol:

* ``small``: small state (5,000 keys x 64 B), ``agg`` scaled out 4 -> 6 (uniform keys);
* ``large``: large state (1,600 keys x 32 KB, ~51 MB; quick 800 x 24 KB, ~19 MB), scaled out
  4 -> 6;
* ``skewed``: Zipf keys (exponent 1.0) at a high input rate (15,000 records/s: the adaptive
  strategy counts >= 10,000 records/s as high; it sees the records each task counted since it
  started or was last asked, over that time), ``agg`` *rebalanced* at 4 tasks to an
  assignment that evens the per-key-group load. Like the paper's phase 3 it reshuffles the key
  space: longest-processing-time-first from scratch (heaviest group to the least-loaded task;
  ``harness.balance.lpt_assignment``), over the loads counted on the
  generator's deterministic key sequence up to the request (the records the job processed).

Job: GeneratorSource (open loop, one task) -> key_by -> ``PaddedCount`` (per key a count and
``state_bytes`` of padding) -> LatencySink (chained into the aggregator's tasks).

Per phase, one fresh job per planning setting (``--settings``; see ``SETTINGS``): fixed
``Planning`` values (random order: all-at-once, chunks of 4, one-by-one, equal-transfer-time;
in the skewed phase also hot-first with chunks of 4, one-by-one and equal-transfer-time; the
quick run leaves out the skewed phase's two equal-transfer-time settings) and
``adaptive`` (``planning=None``: the engine's adaptive strategy, whose ``planning_reason`` is
recorded). Equal-transfer-time cuts chunks of ~``--chunk-seconds`` (0.5 s) at the bandwidth the
phase's all-at-once run achieved (bytes moved / time from first step to completion), or at
``--bandwidth`` when that run is missing.

Each run: deploy, build state (``--build`` s, longer when the keys need it), baseline
(``--baseline`` s), the request (``handle.rescale``/``handle.rebalance``, blocking), then
``--after`` s. Measured from the sink's per-second latency histograms and the report:

* spike: the highest per-second *max* latency in the scaling period over the pre-rescale mean
  latency, taken as the baseline *level* (median of the per-second means: one noisy second of
  this shared machine does not move it); the baseline's own peak max / level is recorded as
  ``baseline_spike``, the noise floor;
* completion: ``RescaleReport.duration_s`` (request -> last group active). New tasks come
  from ``--warm-standby`` (2) idle actors started with the job, so it measures the migration
  rather than actor start-up (``deploy_s`` is the part before the first step, ``migration_s``
  the rest);
* bytes moved, steps, key groups moved; scaling period (examples/bench/README.md: until the
  per-second mean stays within ``--tolerance`` x baseline + ``--slack-ms`` for ``--stable`` s,
  not before the completion second).

Per phase: the best fixed setting on spike and on completion, adaptive's values and the
ratios adaptive / best (target: <= 1.2 on spike *or* completion). Prints a table, writes
``examples/bench/out/planning/results.json`` (``--quick``: ``.../planning/quick/``),
``summary.md`` and ``planning.png`` (bars per phase). The machine is shared and noisy: compare
within one run.
"""

# ruff: noqa: E402  (the repository root goes on sys.path before reflow's imports)
from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from engine import JobConfig, Planning
from examples.bench.harness import BenchError, balance, cli, jobs, provenance, render, run
from examples.bench.harness import analysis as an
from examples.bench.harness.render import fmt, md_table
from examples.bench.harness.run import RunStatus

PROTOCOL = "non-disruptive"
ADAPTIVE = "adaptive"
TARGET_RATIO = 1.2

# setting name -> Planning knobs (None: adaptive). "equal-time" gets its bandwidth per phase.
SETTINGS: dict[str, dict[str, Any] | None] = {
    "all-at-once": {"prioritisation": "random", "progressiveness": "all-at-once"},
    "chunks-4": {"prioritisation": "random", "progressiveness": "chunks", "chunk_size": 4},
    "one-by-one": {"prioritisation": "random", "progressiveness": "one-by-one"},
    "equal-time": {"prioritisation": "random", "progressiveness": "equal-transfer-time"},
    "hot-first/chunks-4": {"prioritisation": "hot-first", "progressiveness": "chunks",
                           "chunk_size": 4},
    "hot-first/one-by-one": {"prioritisation": "hot-first", "progressiveness": "one-by-one"},
    "hot-first/equal-time": {"prioritisation": "hot-first",
                             "progressiveness": "equal-transfer-time"},
    ADAPTIVE: None,
}
UNIFORM_SETTINGS = ("all-at-once", ADAPTIVE, "chunks-4", "one-by-one", "equal-time")
SKEW_SETTINGS = ("all-at-once", ADAPTIVE, "chunks-4", "hot-first/chunks-4", "one-by-one",
                 "hot-first/one-by-one", "equal-time", "hot-first/equal-time")
QUICK_SKEW_SETTINGS = SKEW_SETTINGS[:6]


@dataclass(frozen=True)
class Phase:
    """One phase of the workload: the job and the request."""

    name: str
    title: str
    keys: int
    state_bytes: int
    rate: float
    zipf: float | None  # None: uniform keys
    from_p: int
    to_p: int
    rebalance: bool
    settings: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.keys < 1 or self.state_bytes < 0 or self.rate <= 0:
            raise BenchError(f"phase {self.name!r}: keys >= 1, state_bytes >= 0 and rate > 0; "
                             f"got {self.keys}, {self.state_bytes}, {self.rate}")
        if self.from_p < 1 or self.to_p < 1:
            raise BenchError(f"phase {self.name!r}: parallelism must be >= 1; got "
                             f"{self.from_p} -> {self.to_p}")

    @property
    def expected_state_bytes(self) -> int:
        return self.keys * self.state_bytes


def default_phases(quick: bool) -> dict[str, Phase]:
    """The three phases (full or quick sizes)."""
    q = quick
    return {
        "small": Phase("small", "small state, scale out", 4_000 if q else 5_000, 64,
                       4000.0, None, 4, 6, False, UNIFORM_SETTINGS),
        "large": Phase("large", "large state, scale out", 800 if q else 1600,
                       24_000 if q else 32_000, 3000.0, None, 4, 6, False, UNIFORM_SETTINGS),
        "skewed": Phase("skewed", "Zipf keys, rebalance", 5_000 if q else 10_000, 1024,
                        15_000.0, 1.0, 4, 4, True, QUICK_SKEW_SETTINGS if q else SKEW_SETTINGS),
    }


TIMING = {  # (full, quick)
    "build": (6.0, 3.0), "baseline": (6.0, 3.0), "after": (6.0, 4.0), "stable": (3, 2),
    "key_groups": (128, 64),
}
RESCALE_GUESS_S = {"small": 3.0, "large": 8.0, "skewed": 6.0}


# ------------------------------------------------------------------------------ pure helpers


def make_planning(name: str, *, bandwidth: float, chunk_seconds: float = 0.5,
                  seed: int = jobs.SEED) -> Planning | None:
    """The ``Planning`` of a setting in ``SETTINGS`` (None for adaptive). ``bandwidth`` and
    ``chunk_seconds`` shape the equal-transfer-time chunks."""
    if name not in SETTINGS:
        raise BenchError(f"unknown planning setting {name!r}; known: {', '.join(SETTINGS)}")
    knobs = SETTINGS[name]
    if knobs is None:
        return None
    return Planning(**knobs, chunk_seconds=chunk_seconds, bandwidth_bytes_per_s=bandwidth,
                    seed=seed)


def parse_settings(text: str | None, phase: Phase) -> tuple[str, ...]:
    """``--settings`` (comma-separated, or None for the phase's own list) kept in the phase's
    order where it has one; unknown names raise ``BenchError``. "all-at-once" goes first (the
    equal-time setting uses its bandwidth)."""
    if text is None:
        return phase.settings
    want = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in want if s not in SETTINGS]
    if unknown:
        raise BenchError(f"unknown planning setting(s) {unknown}; known: "
                         f"{', '.join(SETTINGS)}")
    order = {s: i for i, s in enumerate(SKEW_SETTINGS)}
    return tuple(sorted(dict.fromkeys(want), key=lambda s: order.get(s, len(order))))


def transfer_bandwidth(report: Mapping[str, Any] | None) -> float | None:
    """Bytes/s an (all-at-once) rescale achieved: bytes moved over the time from its first
    step to completion (the task start-up before the first step does not count)."""
    if not report or not report.get("bytes_moved"):
        return None
    span = report["completed_at"] - (report.get("first_subscale_at") or report["requested_at"])
    return report["bytes_moved"] / span if span > 0 else None


def _ok(r: Mapping[str, Any]) -> bool:
    return r.get("status") == RunStatus.OK and r.get("report") is not None


def completion(r: Mapping[str, Any]) -> float | None:
    return r["report"]["duration_s"] if _ok(r) else None


def spike(r: Mapping[str, Any]) -> float | None:
    return r.get("spike") if _ok(r) else None


def per_setting(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Setting -> medians over its successful runs (repeats): spike, completion_s,
    migration_s, bytes_moved, steps; ``ok`` of ``runs`` counts. Settings in first-run order."""
    out: dict[str, dict[str, Any]] = {}
    for r in runs:
        out.setdefault(r["setting"], {"runs": 0, "ok": 0, "_r": []})
        e = out[r["setting"]]
        e["runs"] += 1
        if _ok(r):
            e["ok"] += 1
            e["_r"].append(r)
    for e in out.values():
        rs = e.pop("_r")
        e["spike"] = an.median(x for x in (spike(r) for r in rs) if x is not None)
        e["completion_s"] = an.median(x for x in (completion(r) for r in rs) if x is not None)
        e["migration_s"] = an.median(r["migration_s"] for r in rs
                                     if r.get("migration_s") is not None)
        e["bytes_moved"] = an.median(r["report"]["bytes_moved"] for r in rs)
        e["steps"] = an.median(r["report"].get("steps", 0) for r in rs)
        e["planning_reason"] = rs[0]["report"].get("planning_reason", "") if rs else ""
    return out


def plan_key(reason: str) -> str | None:
    """The plan a run executed, from its report's reason ("... move in 1 steps (6
    subscales); random, all-at-once"): steps, subscales and prioritisation, plus the
    progressiveness when there is more than one step. Every group moving in one step is one
    plan however the setting got there (all-at-once, an equal-time chunk holding everything,
    adaptive choosing all-at-once), since the random order has a fixed seed. None when the
    reason does not say."""
    import re

    m = re.search(r"move in (\d+) steps \((\d+) subscales\); ([^,;]+), ([^;]+)$", reason)
    if m is None:
        return None
    steps, subs, prio, prog = m.groups()
    return f"{steps} steps ({subs} subscales); {prio}" + ("" if steps == "1" else f", {prog}")


def pooled_by_plan(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Setting -> medians of spike, completion_s and migration_s over the successful runs of
    every setting that executed the same plan (``plan_key``), and ``settings``: those
    settings. Runs of one plan differ only by the machine's noise, so they are repeats of
    one measurement; comparing one of them with the lowest of the others would favour
    whichever happened to run at a quiet moment. Settings without a known plan pool alone."""
    by_key: dict[str, list[Mapping[str, Any]]] = {}
    key_of: dict[str, str] = {}
    for r in runs:
        if not _ok(r):
            continue
        k = plan_key(r["report"].get("planning_reason", "")) or f"setting {r['setting']}"
        key_of.setdefault(r["setting"], k)
        by_key.setdefault(key_of[r["setting"]], []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for setting, k in key_of.items():
        rs = by_key[k]
        out[setting] = {
            "plan": k,
            "settings": sorted({r["setting"] for r in rs}),
            "spike": an.median(x for x in (spike(r) for r in rs) if x is not None),
            "completion_s": an.median(x for x in (completion(r) for r in rs) if x is not None),
            "migration_s": an.median(r["migration_s"] for r in rs
                                     if r.get("migration_s") is not None),
        }
    return out


def phase_summary(runs: Sequence[Mapping[str, Any]], target: float = TARGET_RATIO
                  ) -> dict[str, Any]:
    """Per setting medians (``per_setting``) and per plan (``pooled_by_plan``: settings
    that ran the same plan share their runs); the best fixed setting on spike and on
    completion (lowest, by plan), adaptive's values and the ratios adaptive / best, by plan
    (``spike_ratio``, ``completion_ratio``) and by setting alone (``raw_*``);
    ``meets_target``: either by-plan ratio <= ``target`` (None when adaptive or every fixed
    setting failed)."""
    ps = per_setting(runs)
    pool = pooled_by_plan(runs)
    fixed = {k: v for k, v in ps.items() if k != ADAPTIVE and v["ok"]}
    ad = ps.get(ADAPTIVE)
    ad = ad if ad and ad["ok"] else None

    def best(metric: str, table: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
        cand = [(table[k][metric], k) for k in fixed if table[k][metric] is not None]
        if not cand:
            return None
        _, k = min(cand)
        return {"setting": k, "spike": table[k]["spike"],
                "completion_s": table[k]["completion_s"], "migration_s": table[k]["migration_s"]}

    bs, bc, bm = best("spike", pool), best("completion_s", pool), best("migration_s", pool)
    out: dict[str, Any] = {"settings": ps, "plans": pool, "best_spike": bs,
                           "best_completion": bc, "adaptive": None, "spike_ratio": None,
                           "completion_ratio": None, "raw_spike_ratio": None,
                           "raw_completion_ratio": None, "meets_target": None,
                           "target": target}
    if ad is not None:
        reason = ad["planning_reason"]
        ap = pool[ADAPTIVE]
        out["adaptive"] = {"spike": ap["spike"], "completion_s": ap["completion_s"],
                           "migration_s": ap["migration_s"],
                           "own_spike": ad["spike"], "own_completion_s": ad["completion_s"],
                           "bytes_moved": ad["bytes_moved"], "steps": ad["steps"],
                           "planning_reason": reason, "chose": adaptive_choice(reason),
                           "inputs": adaptive_inputs(reason),
                           "same_plan_as": [k for k in ap["settings"] if k != ADAPTIVE]}
        out["spike_ratio"] = an.ratio(ap["spike"], None if bs is None else bs["spike"])
        out["completion_ratio"] = an.ratio(ap["completion_s"],
                                           None if bc is None else bc["completion_s"])
        rbs, rbc = best("spike", fixed), best("completion_s", fixed)
        out["raw_spike_ratio"] = an.ratio(ad["spike"], None if rbs is None else rbs["spike"])
        out["raw_completion_ratio"] = an.ratio(ad["completion_s"],
                                               None if rbc is None else rbc["completion_s"])
        out["best_migration"] = bm
        out["migration_ratio"] = an.ratio(ap["migration_s"],
                                          None if bm is None else bm["migration_s"])
        ratios = [x for x in (out["spike_ratio"], out["completion_ratio"]) if x is not None]
        out["meets_target"] = any(x <= target for x in ratios) if ratios else None
    return out


def adaptive_choice(reason: str) -> str:
    """The knobs a plan used, from its reason: the text after "... subscales); ", e.g.
    "random, all-at-once"."""
    marker = " subscales); "
    if marker in reason:
        return reason.rsplit(marker, 1)[1].strip()
    return ""


def adaptive_inputs(reason: str) -> dict[str, Any]:
    """What the adaptive strategy saw, parsed from its reason: input rate (records/s), skew
    (max / mean group load), state per group and total (as written, e.g. "144 KB")."""
    import re

    def num(pattern: str) -> float | None:
        m = re.search(pattern, reason)
        return float(m.group(1)) if m else None

    m = re.search(r"\(([\d.]+ [KMG]?B)/group, ([\d.]+ [KMG]?B) ~", reason)
    return {"input_rate": num(r"input rate ([\d.]+) rec/s"),
            "skew": num(r"skew(?:ed)? \(([\d.]+)\)"),
            "state_per_group": m.group(1) if m else None,
            "state_total": m.group(2) if m else None}


def _adaptive_notes(r: Mapping[str, Any], summary: Mapping[str, Any]) -> list[str]:
    reason = r["report"].get("planning_reason", "")
    seen = adaptive_inputs(reason)
    saw = ([] if seen["input_rate"] is None else [f"{seen['input_rate']:,.0f} rec/s"]) + [
        f"skew {fmt(seen['skew'], '.1f')}", f"{seen['state_per_group'] or '?'}/group"]
    notes = [f"chose: {adaptive_choice(reason)} (saw {', '.join(saw)})"]
    same = summary.get("adaptive") or {}
    if same.get("same_plan_as"):
        notes.append(f"same plan as {', '.join(same['same_plan_as'])}")
    return notes


def table(results: Mapping[str, Any]) -> str:
    """The markdown table of every run, per phase."""
    cols = ["phase", "setting", "spike x", "peak max ms", "base ms", "base max/level",
            "completion s", "migration s", "steps", "groups", "MB moved", "period s", "notes"]
    rows = []
    for ph in results["phases"]:
        for r in ph["runs"]:
            if not _ok(r):
                rows.append([ph["name"], r["setting"], *[""] * (len(cols) - 3),
                             f"{r.get('status')}: {str(r.get('reason', ''))[:160]}"])
                continue
            rep, per = r["report"], r["period"]
            notes = _adaptive_notes(r, ph["summary"]) if r["setting"] == ADAPTIVE else []
            if r.get("bandwidth") is not None and "equal-time" in r["setting"]:
                notes.append(f"chunks of ~{r['chunk_seconds']:g} s at "
                             f"{r['bandwidth'] / 1e6:.1f} MB/s")
            name = r["setting"] + (f" #{r['repeat'] + 1}" if r.get("repeats", 1) > 1 else "")
            rows.append([ph["name"], f"**{name}**" if r["setting"] == ADAPTIVE else name,
                         fmt(r["spike"], ".1f"), fmt(r["peak"]["max_ms"], ",.0f"),
                         fmt(r["baseline"]["level_ms"]), fmt(r["baseline_spike"], ".1f"),
                         fmt(rep["duration_s"], ".2f"), fmt(r.get("migration_s"), ".2f"),
                         str(rep.get("steps", "-")), str(rep["key_groups_moved"]),
                         fmt(rep["bytes_moved"] / 1e6, ",.1f"),
                         f"{per['seconds']}" + ("" if per["stabilized"] else "+"),
                         "; ".join(notes)])
    return "\n".join(md_table(cols, rows, left=["setting", "notes"]))


def verdicts(results: Mapping[str, Any]) -> str:
    """One markdown table row per phase: best fixed on spike and completion, adaptive, ratios."""
    cols = ["phase", "best spike (fixed)", "best completion (fixed)", "adaptive spike",
            "adaptive completion s", "adaptive / best spike", "adaptive / best completion",
            "by setting alone", f"<= {TARGET_RATIO:g} on either"]
    rows = []
    for ph in results["phases"]:
        s = ph["summary"]
        bs, bc, ad = s["best_spike"], s["best_completion"], s["adaptive"]
        rows.append([
            ph["name"],
            "-" if bs is None else f"{bs['setting']} ({fmt(bs['spike'], '.1f')}x)",
            "-" if bc is None else f"{bc['setting']} ({fmt(bc['completion_s'], '.2f')} s)",
            "-" if ad is None else fmt(ad["spike"], ".1f") + "x",
            "-" if ad is None else fmt(ad["completion_s"], ".2f"),
            fmt(s["spike_ratio"], ".2f"), fmt(s["completion_ratio"], ".2f"),
            f"{fmt(s.get('raw_spike_ratio'), '.2f')} / {fmt(s.get('raw_completion_ratio'), '.2f')}",
            {True: "yes", False: "**no**", None: "-"}[s["meets_target"]],
        ])
    return "\n".join(md_table(cols, rows, left=cols[1:3] + cols[-1:]))


# the table legend, one paragraph
LEGEND = """
*spike x*: highest per-second max latency in the scaling period / baseline level (median of
the baseline's per-second mean latencies, *base ms*); *base max/level*: the same for the
baseline seconds (the noise floor); *completion*: `RescaleReport.duration_s` (request ->
last group active; new tasks come from {warm_standby_tasks} warm standby actors);
*migration*: from the first step to completion; the verdict compares plans: settings that
ran the same plan (e.g. all-at-once, an equal-time chunk holding everything and adaptive
choosing all-at-once) pool their runs and take the medians, so a plan is not compared with a
luckier run of itself (*by setting alone*: spike / completion ratios without pooling);
*period*: scaling period, s ('+': not stable before the end of the run). Target: adaptive
within {target:g}x of the best fixed setting on spike or on completion.
""".strip().replace("\n", " ")


def markdown(results: Mapping[str, Any]) -> str:
    c = results["config"]
    lines = [f"### planning benchmark: adaptive vs fixed (`{PROTOCOL}`)"
             + (" — quick" if c["quick"] else ""), ""]
    for ph in results["phases"]:
        p = ph["phase"]
        keys = "uniform" if p["zipf"] is None else f"Zipf {p['zipf']:g}"
        what = (f"rebalance at {p['from_p']} tasks (LPT reshuffle, load imbalance "
                f"{fmt(ph.get('imbalance_before'), '.2f')} -> "
                f"{fmt(ph.get('imbalance_after'), '.2f')}, "
                f"{ph.get('planned_groups_moved')} groups move)" if p["rebalance"]
                else f"scale out {p['from_p']} -> {p['to_p']}")
        lines.append(f"- **{ph['name']}**: {p['keys']:,} keys ({keys}) x {p['state_bytes']:,} B "
                     f"(~{p['keys'] * p['state_bytes'] / 1e6:,.1f} MB if every key is seen), "
                     f"{p['rate']:,.0f} records/s, {c['key_groups']} key groups; {what}.")
    lines += ["", verdicts(results), "", table(results), ""]
    for ph in results["phases"]:
        s = ph["summary"]
        ad = s["adaptive"]
        if ad:
            bm = s.get("best_migration") or {}
            lines.append(f"- {ph['name']}: adaptive `planning_reason`: {ad['planning_reason']} "
                         f"— migration (first step -> done) "
                         f"{fmt(ad.get('migration_s'), '.2f')} s "
                         f"vs best fixed {bm.get('setting', '-')} "
                         f"{fmt(bm.get('migration_s'), '.2f')} s (ratio "
                         f"{fmt(s.get('migration_ratio'), '.2f')})")
    lines += ["", LEGEND.format(target=TARGET_RATIO, **c)
              + f" Total {results.get('total_seconds', 0):.0f} s, {render.load_title(results)}.",
              ""]
    return "\n".join(lines)


def plot(results: Mapping[str, Any], path: str) -> None:
    """Per phase: spike (top) and completion time (bottom) per setting; adaptive in red, the
    best fixed setting outlined."""
    plt = render.pyplot()
    phases = results["phases"]
    fig, axes = plt.subplots(2, max(1, len(phases)), figsize=(5.2 * max(1, len(phases)), 7.5),
                             squeeze=False)
    for j, ph in enumerate(phases):
        s = ph["summary"]
        ps = {k: v for k, v in s["settings"].items() if v["ok"]}
        names = list(ps)
        runs = [r for r in ph["runs"] if _ok(r)]
        for i, (metric, label, key) in enumerate((
                ("spike", "latency spike (peak max / baseline level)", "best_spike"),
                ("completion_s", "completion time, s (duration_s)", "best_completion"))):
            ax = axes[i][j]
            vals = [ps[n][metric] or 0.0 for n in names]
            colors = ["tab:red" if n == ADAPTIVE else
                      ("tab:orange" if n.startswith("hot-first") else "tab:blue") for n in names]
            bars = ax.bar(range(len(names)), vals, color=colors)
            best = s[key]["setting"] if s.get(key) else None
            for b, n in zip(bars, names, strict=True):
                if n == best:
                    b.set_edgecolor("k")
                    b.set_linewidth(2.0)
            for k, v in enumerate(vals):
                ax.annotate(f"{v:.1f}", (k, v), ha="center", va="bottom", fontsize=7)
            ax.set_xticks(range(len(names)))
            ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
            ax.set_ylabel(label, fontsize=8)
            if i == 0:
                ratio = s.get("spike_ratio")
                ax.set_title(f"{ph['name']}: {ph['phase']['title']}\nadaptive/best spike "
                             f"{fmt(ratio, '.2f')}, completion "
                             f"{fmt(s.get('completion_ratio'), '.2f')}",
                             fontsize=9)
            if i == 0 and any(r.get("baseline_spike") for r in runs):
                floor = an.median(r["baseline_spike"] for r in runs if r.get("baseline_spike"))
                if floor:
                    ax.axhline(floor, color="0.4", ls=":", lw=1)
    fig.suptitle(f"reflow non-disruptive rescale: Spacker adaptive planning (red) vs fixed "
                 f"settings (best outlined; dotted: median baseline max/level) — "
                 f"{render.load_title(results)}", fontsize=10)
    render.save_figure(fig, path)


# ------------------------------------------------------------------------------ the runs


def prepare_phase(phase: Phase, args: argparse.Namespace) -> dict[str, Any]:
    """Build time (long enough to see ``--coverage`` of the keys the run will see), and for
    the rebalance the loads and the LPT assignment, from the generator's key sequence."""
    import numpy as np

    n_total = int(phase.rate * (args.build + args.baseline))
    keys = jobs.generator_keys(max(n_total, int(phase.rate * 120)), keys=phase.keys,
                               zipf=phase.zipf)
    need = an.records_to_cover(keys, args.coverage) if phase.zipf is None else None
    build_s = max(args.build, (need or 0) / phase.rate)
    n_req = int(phase.rate * (build_s + args.baseline))
    seen = keys[:n_req]
    ctx: dict[str, Any] = {"build_s": build_s, "records_at_request": n_req,
                           "keys_seen": int(np.unique(seen).size)}
    ctx["expected_state_mb"] = ctx["keys_seen"] * phase.state_bytes / 1e6
    if phase.rebalance:
        ctx.update(balance.rebalance_target(seen, phase.keys, args.key_groups, phase.from_p,
                                            phase.to_p, reshuffle=True))
    return ctx


def run_one(phase: Phase, setting: str, planning: Planning | None, ctx: dict[str, Any],
            args: argparse.Namespace, progress: run.Progress, label: str) -> dict[str, Any]:
    """One fresh job, one request with ``planning``; never raises for a refused or failed
    rescale (recorded in ``status``)."""
    sink = jobs.WriteLogLatencySink()
    src = jobs.generator(rate=phase.rate, keys=phase.keys, zipf=phase.zipf,
                         state_bytes=phase.state_bytes)
    wrap = getattr(args, "wrap_source", None)  # papers/spacker.py: a fill before the stream
    if wrap is not None:
        src = wrap(src, phase)
    job = jobs.keyed_count_job(f"planning-{phase.name}", src, sink, parallelism=phase.from_p,
                               key_groups=args.key_groups,
                               config=JobConfig(warm_standby_tasks=args.warm_standby,
                                                # more JobConfig fields (papers/spacker.py)
                                                **getattr(args, "job_config", None) or {}))

    def request(handle: Any) -> Any:
        if phase.rebalance:
            return handle.rebalance("agg", ctx["assignment"], protocol=PROTOCOL,
                                    planning=planning)
        return handle.rescale("agg", phase.to_p, protocol=PROTOCOL, planning=planning)

    described = None if planning is None else planning.describe()
    try:
        out = {"setting": setting, "planning": described, **run.rescale_run(
            job, op="agg", request=request, build_s=ctx["build_s"], baseline_s=args.baseline,
            after_s=args.after, progress=progress, label=label,
            what=f"{'rebalance' if phase.rebalance else 'rescale'} ({described or ADAPTIVE})",
            guess_s=RESCALE_GUESS_S[phase.name], settle_max_s=args.settle_max,
            settled=run.settle_check(sink, phase.rate))}
        if out["status"] != RunStatus.OK:
            return out
        rows = an.histogram_rows(jobs.latency_seconds(sink))
    finally:
        shutil.rmtree(sink.directory, ignore_errors=True)
    rep = out["report"]
    out.update(deploy_s=max(0.0, rep["first_subscale_at"] - rep["requested_at"]),
               migration_s=rep["completed_at"] - rep["first_subscale_at"])
    out.update(an.measure(rows, out["requested_at"], rep["completed_at"], out["ended_at"],
                          baseline_s=args.baseline, stable_s=args.stable,
                          tolerance=args.tolerance, slack_ms=args.slack_ms))
    out["timeline"] = [{**r, "t": r["second"] + 0.5 - out["requested_at"]}
                       for r in an.dense(rows, int(out["started_at"]) + 1,
                                         int(out["ended_at"]))]
    out["loadavg_at_end"] = os.getloadavg()
    return out


def run_phase(phase: Phase, ctx: dict[str, Any], args: argparse.Namespace,
              progress: run.Progress, counter: list[int], total_runs: int) -> dict[str, Any]:
    """Every setting of ``phase``, ``--repeats`` times; the phase's results entry."""
    ph: dict[str, Any] = {"name": phase.name, "phase": asdict(phase),
                          **{x: v for x, v in ctx.items() if x != "assignment"}, "runs": []}
    if "assignment" in ctx:
        ph["assignment"] = list(ctx["assignment"])
    bandwidth, bw_from = args.bandwidth, "--bandwidth"
    for rep in range(args.repeats):
        for setting in phase.settings:
            counter[0] += 1
            planning = make_planning(setting, bandwidth=bandwidth,
                                     chunk_seconds=args.chunk_seconds)
            label = f"run {counter[0]}/{total_runs} {phase.name} {setting}"
            try:
                r = run_one(phase, setting, planning, ctx, args, progress, label)
            except Exception as exc:  # a broken run must not lose the others
                r = {"setting": setting, "status": RunStatus.FAILED,
                     "reason": f"{type(exc).__name__}: {exc}"}
            r.update(repeat=rep, repeats=args.repeats)
            if planning is not None:
                r.update(bandwidth=planning.bandwidth_bytes_per_s, bandwidth_from=bw_from,
                         chunk_seconds=planning.chunk_seconds)
            ph["runs"].append(r)
            if r["status"] != RunStatus.OK:
                print(f"{label}: {r['status']}: {r.get('reason')}", file=sys.stderr, flush=True)
            elif setting == "all-at-once" and rep == 0:
                bw = transfer_bandwidth(r["report"])
                if bw:
                    bandwidth, bw_from = bw, "all-at-once run"
    ph["summary"] = phase_summary(ph["runs"])
    return ph


# ------------------------------------------------------------------------------ main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = cli.parser(__doc__, "planning (quick: planning/quick)")
    ap.add_argument("--phases", default="small,large,skewed",
                    help="comma-separated subset of small,large,skewed")
    ap.add_argument("--settings", default=None,
                    help=f"comma-separated planning settings for every phase (default: the "
                         f"phase's list); known: {', '.join(SETTINGS)}")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs per setting (the summary takes medians)")
    ap.add_argument("--warm-standby", type=int, default=2,
                    help="JobConfig(warm_standby_tasks=n): task actors started before the "
                         "request, so completion times do not include actor start-up (0: off)")
    cli.add_rescale_run(ap, TIMING, coverage=0.99, key_groups="128; quick 64")
    ap.add_argument("--chunk-seconds", type=float, default=0.5,
                    help="equal-time setting: seconds of transfer per chunk")
    ap.add_argument("--bandwidth", type=float, default=20e6,
                    help="equal-time setting: bytes/s when the phase has no all-at-once run")
    ap.add_argument("--small-state-bytes", type=int)
    ap.add_argument("--large-state-bytes", type=int)
    ap.add_argument("--large-keys", type=int)
    ap.add_argument("--skewed-rate", type=float)
    args = ap.parse_args(argv)
    cli.fill_defaults(args, TIMING)
    args.out = cli.out_dir(args, "planning", *(["quick"] if args.quick else []))
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    phases = default_phases(args.quick)
    if args.small_state_bytes:
        phases["small"] = replace(phases["small"], state_bytes=args.small_state_bytes)
    if args.large_state_bytes:
        phases["large"] = replace(phases["large"], state_bytes=args.large_state_bytes)
    if args.large_keys:
        phases["large"] = replace(phases["large"], keys=args.large_keys)
    if args.skewed_rate:
        phases["skewed"] = replace(phases["skewed"], rate=args.skewed_rate)
    names = cli.comma_list(args.phases)
    bad = [p for p in names if p not in phases]
    if bad:
        ap.error(f"unknown phase(s) {bad}; use small, large, skewed")
    try:
        args.phase_list = [replace(phases[p], settings=parse_settings(args.settings, phases[p]))
                           for p in names]
    except BenchError as exc:
        ap.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = provenance.begin(__file__, argv)
    results.update({
        "config": {"quick": args.quick, "protocol": PROTOCOL, "key_groups": args.key_groups,
                   "repeats": args.repeats, "warm_standby_tasks": args.warm_standby,
                   "build_s": args.build, "baseline_s": args.baseline, "after_s": args.after,
                   "stable_s": args.stable, "tolerance": args.tolerance,
                   "slack_ms": args.slack_ms, "coverage": args.coverage,
                   "chunk_seconds": args.chunk_seconds, "fallback_bandwidth": args.bandwidth,
                   "seed": jobs.SEED, "target_ratio": TARGET_RATIO,
                   "settings": dict(SETTINGS)},
        "definitions": {
            "spike": "highest per-second max latency (sink arrival - scheduled emission) in "
                     "the scaling period / baseline level (median of the baseline seconds' "
                     "per-second mean latencies); spike_over_weighted_mean uses their "
                     "record-weighted mean instead",
            "baseline_spike": "highest per-second max latency of the baseline seconds / the "
                              "baseline level (what the spike is without a rescale)",
            "completion_s": "RescaleReport.duration_s: request -> last key group active",
            "migration_s": "completed_at - first_subscale_at (after the new tasks started)",
            "scaling_period": "request second .. first second (>= completion second) from "
                              "which `stable_s` seconds have mean <= tolerance x baseline level "
                              "+ slack_ms; capped at the end of the run",
            "meets_target": "adaptive / best fixed <= target_ratio on spike or on completion",
        },
        "phases": [],
    })
    results["machine"]["ray"] = run.ray_version()
    preps = {p.name: prepare_phase(p, args) for p in args.phase_list}
    planned = sum(args.repeats * len(p.settings)
                  * (run.DEPLOY_GUESS_S + preps[p.name]["build_s"] + args.baseline
                     + RESCALE_GUESS_S[p.name] + args.after + 1.0)
                  for p in args.phase_list)
    total_runs = args.repeats * sum(len(p.settings) for p in args.phase_list)
    print(f"planning benchmark: {len(args.phase_list)} phases, {total_runs} runs, "
          f"~{planned / 60:.0f} min planned", flush=True)
    progress = run.Progress(planned)
    run.init_ray()
    counter = [0]
    try:
        for phase in args.phase_list:
            results["phases"].append(run_phase(phase, preps[phase.name], args, progress,
                                               counter, total_runs))
    finally:
        progress.close()
        run.shutdown_ray()
    provenance.finish(results)
    results["summary"] = {ph["name"]: ph["summary"] for ph in results["phases"]}
    render.write_outputs(args.out, results, markdown=markdown(results), png="planning.png",
                         plot=plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
