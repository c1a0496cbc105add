"""Trisk (Mao et al., SoCC'21): load balancing, scaling, change of logic and placement.

"Trisk: Task-Centric Data Stream Reconfiguration": one control plane for four kinds of
reconfiguration (a task's workload, its resources, its logic, its placement), carried out by
partial pause-and-resume. Its evaluation times each reconfiguration on a running word count
(completion time: from the decision until every affected task is updated and resumed) and
draws the job's latency around it. This reruns the four on reflow's Trisk-style API, each on
one running job:

* ``load-balancing``: ``handle.rebalance(op, assignment)`` of a skewed counter (Zipf keys)
  to the assignment that evens its key groups' loads (``harness.balance``; the rescale
  benchmark's ``skew`` scenario), as Fig. 13's global load balancing at 40,960 B of state
  per key: by ``--protocols`` (default pause-resume, Trisk's partial pause-and-resume;
  stop-restart, Flink's native kill-and-restart; fluid, Megaphone; ``drrs``, reflow's
  default, when asked);
* ``scaling``: ``handle.rescale(op, p + 1)`` (the micro-benchmark's scale-out by one task);
* ``change-of-logic``: ``handle.change_logic(op, fn)``: the same count that also logs a line
  every ``LOG_EVERY`` records, state kept (the micro-benchmark's "log-printing logic");
* ``placement``: ``handle.place(op, i, node)`` of the tasks that make the counter's tasks
  even over two Ray nodes (Fig. 8's "equally allocate tasks to machines").

    python examples/papers/trisk.py            # full: 6 runs, 6-15 min on 2 shared CPUs
    python examples/papers/trisk.py --quick    # 4 runs, 3-10 min

Every job: the bench harness's keyed count (``examples/bench/rescale.py``'s ``Scenario``:
GeneratorSource -> key_by -> ``PaddedCount`` as ``agg``, the counter, at ``--parallelism``
tasks -> latency sink), 1,000 keys (the paper's), ``--service-us`` per record slept (a task
serves 1e6 / service_us records/s without using a core: the paper's one core per task),
run through ``rescale.run_one`` (deploy, build state, settle, baseline, the request, after)
and judged by ``rescale.analyse`` (the bench harness's rules). The scenarios scale the
paper's micro-benchmark down: 4 counter tasks instead of 20 and one source instead of 5,
uniform keys at 50 % of the counter's capacity (the paper's 6,000 tuples/s are 75 %: on a
shared machine a 1 ms sleep overruns, so the headroom is larger), 1,024 B per key; load
balancing on Zipf 1.0 keys at a rate that keeps the hottest task at ~2/3 of its capacity,
40,960 B per key (Fig. 13). The whole run uses a two-node Ray cluster on this
machine (``ray.cluster_utils.Cluster``, 2 logical CPUs each: the same two cores), so
placement has a node to move to; moving a task between two nodes of one machine frees no
CPU, so Fig. 8's latency gain is out of reach, its spike is not.

Per run: the reconfiguration's duration (its report: request to completion, Trisk's
completion time), the latency peak (highest per-second p99 and max in the scaling period),
the baseline, the scaling period (until latency is back within 1.1x the baseline + slack),
state moved, and the per-second latency timeline.

Writes ``results.json``, ``trisk.png`` (the paper's style: latency over time around each
reconfiguration, the reconfiguration shaded) and ``summary.md`` to ``--out`` (default
``examples/papers/results/trisk/``; ``--quick``: ``results/trisk-quick/``).
"""

# ruff: noqa: E402  (the repository root goes on sys.path before reflow's imports)
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from engine.runtime import local_ray
from examples.bench import rescale
from examples.bench.harness import cli, jobs, provenance, render, run
from examples.bench.harness.render import fmt, md_table
from examples.papers import RESULTS_ROOT

SCENARIOS = ("load-balancing", "scaling", "change-of-logic", "placement")
OP = "agg"
LOG_EVERY = 10_000
STARTS = 6  # attempts to start the two-node cluster (a loaded machine needs several)
#: the paper's figures (SoCC'21): Fig. 13, global load balancing on word count, 40,960 B/key
PAPER_LB_MS = {"pause-resume": 1462.0, "stop-restart": 2177.0, "fluid": 39258.0}
PAPER_FLUID_LATENCY_MS = 500.0  # Megaphone's latency stayed within it during Fig. 13
PAPER_PLACEMENT_SPIKE_MS = 600.0  # Fig. 8: placement's latency spike
PAPER_NAMES = {"pause-resume": "Trisk", "stop-restart": "Flink (native)",
               "fluid": "Megaphone", "drrs": "reflow drrs"}
COLORS = {"pause-resume": "tab:blue", "stop-restart": "tab:red", "fluid": "tab:green",
          "drrs": "tab:purple", "non-disruptive": "tab:olive", "batched": "tab:orange",
          "meces": "tab:brown"}
DEFAULTS: dict[str, tuple[Any, Any]] = {
    "scenarios": (",".join(SCENARIOS), ",".join(SCENARIOS)),
    "protocols": ("pause-resume,stop-restart,fluid", "pause-resume"),
    "build": (10.0, 4.0), "baseline": (6.0, 3.0), "after": (12.0, 6.0), "stable": (3, 2),
    "settle_max": (15.0, 6.0),
}


class CountAndLog(jobs.PaddedCount):
    """``PaddedCount`` that also logs a line every ``LOG_EVERY`` records of a task (the
    paper's change of logic: "a simple log-printing logic", state kept)."""

    def open(self, ctx: Any) -> None:
        super().open(ctx)
        self.seen = 0

    def process_element(self, value: Any, ctx: Any) -> Any:
        self.seen += 1
        if self.seen % LOG_EVERY == 0:
            print(f"trisk change of logic: {self.seen} records since the change", flush=True)
        yield from super().process_element(value, ctx)


@dataclass(frozen=True)
class PlacementReport:
    """The tasks one placement moved (``moves``: ``(task index, seconds)`` each, one after
    the other), from the first request to the last completion."""

    operator: str
    protocol: str
    requested_at: float
    completed_at: float
    duration_s: float
    key_groups_moved: int
    bytes_moved: int
    moves: tuple[tuple[int, float], ...]
    nodes_before: tuple[str, ...]
    nodes_after: tuple[str, ...]


@dataclass(frozen=True)
class LogicChange:
    """A ``LogicChangeReport`` as the rescale benchmark's run loop reads reports (it names
    a protocol, and its duration is a field)."""

    operator: str
    protocol: str
    version: int
    tasks: int
    requested_at: float
    completed_at: float
    duration_s: float
    alignment_s: float

    @classmethod
    def of(cls, report: Any) -> LogicChange:
        return cls(report.operator, "change-logic", report.version, report.tasks,
                   report.requested_at, report.completed_at, report.duration_s,
                   report.alignment_s)


def placement_moves(nodes: Sequence[str], alive: Sequence[str]) -> list[tuple[int, str]]:
    """``(task index, node)`` moves that even the tasks over the ``alive`` nodes, taken from
    the busiest node to the least busy one; one move when they are even already (from the
    last task's node to another). Pure."""
    if len(alive) < 2:
        return []
    count = {n: 0 for n in alive}
    for n in nodes:
        if n in count:
            count[n] += 1
    where = list(nodes)
    moves: list[tuple[int, str]] = []
    while True:
        hi = max(count, key=lambda n: count[n])
        lo = min(count, key=lambda n: count[n])
        if count[hi] - count[lo] <= 1:
            break
        i = max(j for j, n in enumerate(where) if n == hi)
        moves.append((i, lo))
        where[i] = lo
        count[hi] -= 1
        count[lo] += 1
    if not moves:
        i = len(where) - 1
        moves.append((i, next(n for n in alive if n != where[i])))
    return moves


class TriskScenario(rescale.Scenario):
    """A rescale-benchmark scenario whose request is one of Trisk's reconfigurations."""

    def __init__(self, args: argparse.Namespace, kind: str) -> None:
        super().__init__(args)
        self.kind = kind

    def describe(self) -> str:
        what = {"change-of-logic": f"change the logic of {self.op} (CountAndLog)",
                "placement": f"place {self.op}'s tasks evenly over two Ray nodes"}
        base = super().describe()
        return base if self.kind not in what else base.rsplit(";", 1)[0] + "; " + what[self.kind]

    def request(self, handle: Any, protocol: str) -> Any:
        if self.kind == "change-of-logic":
            return LogicChange.of(handle.change_logic(self.op, CountAndLog(
                self.args.service_us)))
        if self.kind == "placement":
            return self._place(handle, protocol)
        return super().request(handle, protocol)  # rebalance / rescale

    def _place(self, handle: Any, protocol: str) -> PlacementReport:
        import ray

        before = handle.placement(self.op)
        alive = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
        moves = placement_moves(before, alive)
        if not moves:
            from engine import RescaleRefused

            raise RescaleRefused(f"placement needs two Ray nodes; alive: {alive}")
        t0 = time.time()
        done: list[tuple[int, float]] = []
        groups = moved = 0
        for i, node in moves:
            rep = handle.place(self.op, i, node, protocol=protocol)
            done.append((i, rep.duration_s))
            groups += rep.key_groups_moved
            moved += rep.bytes_moved
        t1 = time.time()
        return PlacementReport(self.op, protocol, t0, t1, t1 - t0, groups, moved, tuple(done),
                               tuple(before), tuple(handle.placement(self.op)))


def scenario_args(args: argparse.Namespace, kind: str) -> argparse.Namespace:
    """The rescale benchmark's arguments for one scenario (parsed by it: its defaults)."""
    skewed = kind == "load-balancing"
    p = args.parallelism
    argv = ["--scenario", "skew" if skewed else "micro",
            "--rate", str(args.skew_rate if skewed else args.rate),
            "--keys", str(args.keys), "--skew", "1.0" if skewed else "uniform",
            "--state-bytes", str(args.lb_state_bytes if skewed else args.state_bytes),
            "--service-us", str(args.service_us), "--from", str(p),
            "--to", str(p + 1 if kind == "scaling" else p),
            "--build", str(args.build), "--baseline", str(args.baseline),
            "--after", str(args.after), "--stable", str(args.stable),
            "--settle-max", str(args.settle_max), "--key-groups", str(args.key_groups),
            "--no-overhead", "--no-replication-cost",
            # idle actors a rescale takes its new tasks from (stop-restart redeploys into
            # them): as many as the rescale benchmark gives for load balancing, one for the
            # scale-out, none where no task is added (a placed task starts on its node)
            "--warm-standby", str(p if skewed else 1 if kind == "scaling" else 0)]
    if args.quick:
        argv.append("--quick")
    return rescale.parse_args(argv)


def run_plan(args: argparse.Namespace) -> list[tuple[str, str]]:
    """``(scenario, protocol)`` in the order they run: load balancing once per protocol,
    every other scenario once (change of logic has no protocol: "-")."""
    out: list[tuple[str, str]] = []
    for kind in args.scenarios:
        if kind == "load-balancing":
            out += [(kind, p) for p in args.protocols]
        else:
            out.append((kind, "-" if kind == "change-of-logic" else args.protocols[0]))
    return out


# ---------------------------------------------------------------------- summary (pure)

def figures(r: dict[str, Any]) -> dict[str, Any]:
    """One run's headline figures: duration (s), peak per-second p99 and max (ms),
    baseline level (ms), scaling period (s), bytes moved."""
    rep = r.get("report") or {}
    peak = r.get("peak") or {}
    return {"duration_s": rep.get("duration_s", (rep.get("completed_at") or 0)
                                  - (rep.get("requested_at") or 0)),
            "peak_p99_ms": peak.get("p99_ms"), "peak_max_ms": peak.get("max_ms"),
            "level_ms": (r.get("baseline") or {}).get("level_ms"),
            "period_s": (r.get("period") or {}).get("seconds"),
            "stabilized": (r.get("period") or {}).get("stabilized"),
            "bytes_moved": rep.get("bytes_moved"), "tail_ms": r.get("tail_level_ms")}


def _ok(results: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [r for r in results["runs"] if r.get("scenario") == kind and r.get("status") == "ok"]


def claims(results: dict[str, Any]) -> list[list[str]]:
    """The summary's rows: the paper's figure or claim, reflow's value, scale, verdict."""
    c = results["config"]
    rows: list[list[str]] = []
    lb = {r["protocol"]: figures(r) for r in _ok(results, "load-balancing")}
    scale_lb = (f"{c['parallelism']} counter tasks (paper 20), 1 source (5), "
                f"{c['keys']:,} Zipf 1.0 keys x {c['lb_state_bytes']:,} B, "
                f"{c['skew_rate']:,.0f} rec/s, 2 shared CPUs")
    if lb:
        val = ", ".join(f"{PAPER_NAMES.get(p, p)} {f['duration_s'] * 1000:,.0f} ms"
                        for p, f in lb.items())
        order = [p for p in ("pause-resume", "stop-restart", "fluid") if p in lb]
        ds = [lb[p]["duration_s"] for p in order]
        holds = ("ordering " + ("holds" if ds == sorted(ds) else "differs") + " ("
                 + " < ".join(PAPER_NAMES[p] for p in sorted(order, key=lambda p: lb[p]
                                                            ["duration_s"])) + ")"
                 if len(order) > 1 else "one protocol run")
        if "pause-resume" in lb and lb["pause-resume"]["duration_s"] > 0:
            base = lb["pause-resume"]["duration_s"]
            ratios = [f"{PAPER_NAMES[p]} {lb[p]['duration_s'] / base:.1f}x (paper "
                      f"{PAPER_LB_MS[p] / PAPER_LB_MS['pause-resume']:.1f}x)"
                      for p in order[1:]]
            if ratios:
                holds += "; vs Trisk: " + ", ".join(ratios)
        rows.append(["Fig. 13: global load balancing completes in 1,462 ms (Trisk), "
                     "2,177 ms (Flink), 39,258 ms (Megaphone)", val, scale_lb, holds])
        peaks = ", ".join(f"{PAPER_NAMES.get(p, p)} {fmt(f['peak_p99_ms'], ',.0f')} ms"
                          for p, f in lb.items())
        verdicts = []
        if "pause-resume" in lb and "stop-restart" in lb:
            a, b = lb["pause-resume"]["peak_p99_ms"], lb["stop-restart"]["peak_p99_ms"]
            if a is not None and b is not None:
                verdicts.append("Flink above Trisk: " + ("yes" if b > a else "no"))
        if "fluid" in lb and lb["fluid"]["peak_p99_ms"] is not None:
            verdicts.append("Megaphone within 500 ms: " + (
                "yes" if lb["fluid"]["peak_p99_ms"] <= PAPER_FLUID_LATENCY_MS else "no"))
        rows.append(["Fig. 13: Flink's peak latency above Trisk's; Megaphone's within 500 ms",
                     "peak per-second p99: " + peaks, scale_lb,
                     "; ".join(verdicts) or "not comparable (one protocol run)"])
    scale_micro = (f"{c['parallelism']} counter tasks (paper 20), 1 source (5), "
                   f"{c['keys']:,} uniform keys x {c['state_bytes']:,} B, {c['rate']:,.0f} "
                   f"rec/s = {c['rate'] * c['service_us'] / 1e6 / c['parallelism']:.0%} of the "
                   "counter (paper 6,000 = 75 %), 2 shared CPUs")
    sub = []
    for kind in ("load-balancing", "scaling", "change-of-logic"):
        for r in _ok(results, kind):
            if kind != "load-balancing" or r["protocol"] == "pause-resume":
                sub.append((kind, figures(r)["duration_s"]))
    if sub:
        rows.append(["Fig. 9-12: reconfigurations complete in hundreds of ms (sub-second)",
                     ", ".join(f"{k} {d * 1000:,.0f} ms" for k, d in sub), scale_micro,
                     "yes" if all(d < 1.0 for _, d in sub) else
                     f"{sum(d < 1.0 for _, d in sub)} of {len(sub)} sub-second"])
    for kind, what in (("scaling", "scale-out by one task"),
                       ("change-of-logic", "change of logic, state kept")):
        for r in _ok(results, kind):
            f = figures(r)
            rows.append([f"§5.3: {what}: negligible latency increase (Fig. 6b: Trisk's "
                         "controller)",
                         f"{f['duration_s'] * 1000:,.0f} ms; peak p99 "
                         f"{fmt(f['peak_p99_ms'], ',.0f')} ms over a {fmt(f['level_ms'], ',.0f')}"
                         f" ms baseline; back in {fmt(f['period_s'], 'd')} s", scale_micro,
                         _spike_verdict(f)])
    for r in _ok(results, "placement"):
        f = figures(r)
        rep = r.get("report") or {}
        moves = rep.get("moves") or []
        rows.append(["Fig. 8: placement: a latency spike of ~600 ms, back within a couple of "
                     "seconds; ~50 % lower latency after (CPU contention relieved)",
                     f"{len(moves)} task(s) moved in {f['duration_s'] * 1000:,.0f} ms; peak "
                     f"p99 {fmt(f['peak_p99_ms'], ',.0f')} ms (max "
                     f"{fmt(f['peak_max_ms'], ',.0f')}); back in {fmt(f['period_s'], 'd')} s; "
                     f"latency {fmt(f['level_ms'], ',.1f')} -> {fmt(f['tail_ms'], ',.1f')} ms",
                     scale_micro + "; two Ray nodes on one machine",
                     ("spike " + ("below" if (f["peak_p99_ms"] or 0) <= PAPER_PLACEMENT_SPIKE_MS
                                  else "above") + " the paper's 600 ms; the latency gain is "
                      "not comparable (both nodes share the same two cores)")])
    return rows


def _spike_verdict(f: dict[str, Any]) -> str:
    level, peak = f["level_ms"], f["peak_p99_ms"]
    if level is None or peak is None:
        return "not measured"
    x = peak / max(level, 1e-9)
    return (f"{'yes' if f['stabilized'] and x <= 3 else 'no'} (peak {x:.1f}x the baseline "
            f"level{'' if f['stabilized'] else ', not back by the end'})")


def run_rows(results: dict[str, Any]) -> list[list[str]]:
    rows = []
    for r in results["runs"]:
        if r.get("status") != "ok":
            rows.append([r.get("scenario", "?"), r.get("protocol", "?"), str(r.get("status")),
                         *["-"] * 7, (r.get("reason") or "")[:100]])
            continue
        f = figures(r)
        rep = r.get("report") or {}
        rows.append([r["scenario"], r["protocol"], "ok", fmt(f["duration_s"] * 1000, ",.0f"),
                     fmt(f["level_ms"], ",.1f"), fmt(f["peak_p99_ms"], ",.0f"),
                     fmt(f["peak_max_ms"], ",.0f"),
                     fmt(f["period_s"], "d") + ("" if f["stabilized"] else "+"),
                     fmt(f["tail_ms"], ",.1f"),
                     f"{rep.get('key_groups_moved', '-')} / "
                     f"{fmt((rep.get('bytes_moved') or 0) / 1e6, ',.1f')} MB"
                     if "bytes_moved" in rep else "-",
                     fmt((r.get("loadavg_at_end") or [None])[0], ".1f")])
    return rows


def markdown(results: dict[str, Any]) -> str:
    lines = [f"# Trisk: four reconfigurations on one running job each "
             f"({render.load_title(results)})", "",
             render.run_line(results) + " · Ray: two nodes on this machine", "",
             "Trisk's completion time is reflow's reconfiguration duration (its report: "
             "request to completion); Trisk's mechanism, partial pause-and-resume, is "
             "reflow's `pause-resume` protocol, Flink's native reconfiguration its "
             "`stop-restart`, Megaphone its `fluid`. Latency: sink arrival - record "
             "timestamp, per wall second; peak: the highest per-second p99 in the scaling "
             "period.", "",
             *md_table(["paper", "reflow (this machine)", "scale", "holds?"], claims(results),
                       left=["reflow (this machine)", "scale", "holds?"]), "",
             *_load_note(results),
             "## Runs", "",
             *md_table(["scenario", "protocol", "status", "duration ms", "baseline ms",
                        "peak p99 ms", "peak max ms", "back in s", "after ms",
                        "groups / state moved", "load at end"], run_rows(results),
                       left=["protocol", "status"]), "",
             "Scenarios:", ""]
    for kind, d in results["scenarios"].items():
        lines.append(f"* {kind}: {d}")
    lines += ["", "'back in': seconds from the request until the per-second mean latency stays "
              "within 1.1x the baseline level + slack ('+': not by the end of the run).", ""]
    return "\n".join(lines)


def _load_note(results: dict[str, Any]) -> list[str]:
    m = results["machine"]
    top = max(m["loadavg_at_start"][0], *(m.get("loadavg_at_end") or [0.0])[:1])
    if top <= 10:
        return []
    return [f"The machine was shared at load {render.load_range(results)} on {m['cpus']} cores: most of "
            "a second of latency and of a reconfiguration's duration here is waiting for a "
            "CPU (a 1 ms sleep overruns many times), so compare the runs with each other "
            "more than with the paper's milliseconds.", ""]


def plot(results: dict[str, Any], path: str) -> None:
    """The paper's style: latency over time around each reconfiguration (request at 0, the
    reconfiguration shaded), one panel per scenario."""
    plt = render.pyplot()
    kinds = [k for k in SCENARIOS if k in results["config"]["scenarios"]]
    fig, axes = plt.subplots(len(kinds), 1, figsize=(11, 2.8 * max(1, len(kinds))),
                             squeeze=False)
    nan = float("nan")
    for ax, kind in zip(axes[:, 0], kinds, strict=True):
        for r in [x for x in results["runs"] if x.get("scenario") == kind]:
            if r.get("status") != "ok":
                continue
            p = r["protocol"]
            col = COLORS.get(p, "k")
            tl = r["timeline"]
            label = "change of logic" if p == "-" else f"{PAPER_NAMES.get(p, p)} ({p})"
            ax.plot([x["t"] for x in tl],
                    [nan if x["p99_ms"] is None else x["p99_ms"] for x in tl], color=col,
                    lw=1.2, marker=".", ms=3, label=label)
            d = figures(r)["duration_s"] or 0.0
            ax.axvspan(0, max(d, 0.05), color=col, alpha=0.15)
        ax.axvline(0, color="k", lw=0.8)
        if any(x.get("p99_ms") for r in results["runs"] if r.get("scenario") == kind
               for x in r.get("timeline") or ()):
            ax.set_yscale("log")
        ax.set_ylabel("latency p99, ms")
        ax.set_title(kind.replace("-", " "), fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    axes[-1, 0].set_xlabel("seconds since the reconfiguration was requested (shaded: until "
                           "it completed)")
    fig.suptitle(f"Trisk's reconfigurations on reflow ({render.load_title(results)})",
                 fontsize=10)
    render.save_figure(fig, path)


# ---------------------------------------------------------------------- main

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = cli.parser(__doc__, "trisk")
    ap.add_argument("--scenarios", help=f"comma-separated, of {', '.join(SCENARIOS)}")
    ap.add_argument("--protocols", help="load balancing's protocols, the first also scaling's "
                                        "and placement's (pause-resume,stop-restart,fluid;"
                                        " quick pause-resume; add drrs for reflow's default)")
    ap.add_argument("--parallelism", type=int, default=4, help="counter tasks (paper: 20)")
    ap.add_argument("--rate", type=float, default=2000.0,
                    help="records/s of the uniform scenarios (2,000: 50 %% of the counter's "
                         "capacity; the paper's 75 %% leaves no headroom on a shared machine, "
                         "where a 1 ms sleep overruns)")
    ap.add_argument("--skew-rate", type=float, default=1500.0,
                    help="records/s of the skewed load balancing (1,500: the hottest task at "
                         "~2/3 of its capacity)")
    ap.add_argument("--service-us", type=float, default=1000.0,
                    help="per-record service time of a counter task, slept")
    ap.add_argument("--keys", type=int, default=1000, help="keys (the paper's 1,000)")
    ap.add_argument("--state-bytes", type=int, default=1024, help="state per key (1,024)")
    ap.add_argument("--lb-state-bytes", type=int, default=40_960,
                    help="state per key of load balancing (Fig. 13's 40,960)")
    ap.add_argument("--key-groups", type=int, default=128)
    for dest in ("build", "baseline", "after", "settle_max"):
        ap.add_argument("--" + dest.replace("_", "-"), type=float,
                        help=f"{cli.RESCALE_RUN_HELP.get(dest, 'seconds')} "
                             f"({DEFAULTS[dest][0]:g}; quick {DEFAULTS[dest][1]:g})")
    ap.add_argument("--stable", type=int, help="stability window of the scaling period, s")
    args = ap.parse_args(argv)
    cli.fill_defaults(args, DEFAULTS)
    args.scenarios = cli.comma_list(args.scenarios)
    args.protocols = cli.comma_list(args.protocols)
    for s in args.scenarios:
        if s not in SCENARIOS:
            ap.error(f"unknown scenario {s!r}; one of {', '.join(SCENARIOS)}")
    if not args.protocols:
        ap.error("--protocols: at least one")
    args.out = args.out or os.path.join(RESULTS_ROOT, "trisk-quick" if args.quick else "trisk")
    return args


def start_cluster() -> Any:
    """A two-node Ray cluster on this machine (2 logical CPUs each), connected. Its head
    records its address as the machine's current Ray cluster (``/tmp/ray/
    ray_current_cluster``), which every ``ray.init()`` without an address on this machine
    then joins (other benchmarks' runs would land in this cluster and die with it): the
    record is put back as it was."""
    from ray._private import utils
    from ray.cluster_utils import Cluster

    record = utils.get_ray_address_file(None)
    before = None
    if os.path.exists(record):
        with open(record) as f:
            before = f.read()
    for attempt in range(1, STARTS + 1):
        # a node gives its raylet 30 s to register (Ray's constant): on a loaded machine it
        # may not, and the start is tried again, as reflow's local_ray.connect does
        started = local_ray._descendants(os.getpid())
        cluster = Cluster(initialize_head=False)
        try:
            with patient_ray_start():
                cluster.add_node(num_cpus=2, include_dashboard=False)
                _restore(record, before)
                cluster.add_node(num_cpus=2)
            break
        except Exception as exc:
            _restore(record, before)
            if "timed out during startup" not in str(exc) or attempt == STARTS:
                raise
            print(f"a Ray node did not start in time (attempt {attempt} of {STARTS}, load "
                  f"{os.getloadavg()[0]:.0f}): trying again", file=sys.stderr, flush=True)
            with contextlib.suppress(Exception):
                cluster.shutdown()
            local_ray._stop(local_ray._descendants(os.getpid()) - started)
            time.sleep(5.0 * attempt)
    run.init_ray(address=cluster.address)
    cluster.wait_for_nodes()
    return cluster


class _SlowClock:
    """The ``time`` module, but ``monotonic`` runs ``factor`` times slower."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def monotonic(self) -> float:
        return time.monotonic() / self.factor


@contextlib.contextmanager
def patient_ray_start(factor: float = 4.0) -> Any:
    """Ray nodes started within give their raylet ``factor`` x Ray's 30 s to register
    with the GCS (a constant in ``ray._private.node``, which times that wait, alone in
    start-up, with ``time.monotonic``): on this shared machine at load 100 every start
    timed out, six times in a row. Only start-up waits are affected."""
    from ray._private import node

    saved = node.time
    node.time = _SlowClock(factor)  # type: ignore[assignment]
    try:
        yield
    finally:
        node.time = saved  # type: ignore[assignment]


def _restore(path: str, text: str | None) -> None:
    if text is None:
        if os.path.exists(path):
            os.remove(path)
        return
    with open(path, "w") as f:
        f.write(text)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = provenance.begin(__file__, argv, args)
    plan = run_plan(args)
    scenarios = {k: TriskScenario(scenario_args(args, k), k) for k in args.scenarios}
    results["scenarios"] = {k: sc.describe() for k, sc in scenarios.items()}
    results["scenario_info"] = {k: sc.info for k, sc in scenarios.items()}
    results["runs"] = []
    print("Trisk: " + "; ".join(f"{k}: {d}" for k, d in results["scenarios"].items()),
          flush=True)
    per_run = 8.0 + args.build + args.baseline + args.after + args.settle_max / 2
    progress = run.Progress(per_run * len(plan))
    os.environ.pop("RAY_ADDRESS", None)  # our own cluster, not one named in the environment
    cluster = start_cluster()
    results["machine"]["ray"] = run.ray_version()
    try:
        for k, (kind, protocol) in enumerate(plan, 1):
            sc = scenarios[kind]
            config = rescale.job_config(sc.args)
            try:
                r = rescale.run_one(sc, "drrs" if protocol == "-" else protocol, config,
                                    progress, k, len(plan))
            except Exception as exc:  # a failed run is recorded, the others go on
                traceback.print_exc()
                r = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
            r.update(scenario=kind, protocol=protocol, loadavg_at_end=os.getloadavg())
            results["runs"].append(r)
            if r.get("status") != "ok":
                print(f"\n{kind} ({protocol}): {r.get('status')}: {r.get('reason')}",
                      file=sys.stderr, flush=True)
    finally:
        progress.close()
        run.shutdown_ray()
        cluster.shutdown()
    provenance.finish(results)
    render.write_outputs(args.out, results, markdown=markdown(results), png="trisk.png",
                         plot=plot)
    return 0 if any(r.get("status") == "ok" for r in results["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
