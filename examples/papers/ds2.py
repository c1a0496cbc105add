"""DS2 (Kalavri et al., OSDI'18): convergence from under- and over-provisioned starts.

"Three steps is all you need: fast, accurate, automatic scaling decisions for distributed
streaming dataflows": DS2 measures each operator's true processing rate (records over
useful time) and sets every operator's parallelism to what its target rate needs, all at
once; the paper's claim is that it reaches the right configuration in at most three steps
(one, mostly), without the overshoot and oscillation of Dhalion's one-step-at-a-time
policy (one step instead of Dhalion's six on Heron's word count). This reruns the claim on
reflow's DS2 controller (``controllers.DS2``).

    python examples/papers/ds2.py            # full: 3 runs, 5-12 min on 2 shared CPUs
    python examples/papers/ds2.py --quick    # the same runs, shorter: 4-10 min

The job (issue 32 item 6's): the bench harness's keyed count (``harness.jobs``:
GeneratorSource at ``--rate`` records/s, uniform keys -> key_by -> ``PaddedCount`` as
``agg`` -> a latency sink) whose every ``agg`` task spends ``--service-us`` per record,
slept (``harness.jobs.ServiceTime``): a task serves 1e6 / service_us records/s (500 at the
default 2,000 us) without using a core, the papers' one core per task on a machine whose
two cores all tasks share. At 1,500 records/s the right parallelism is
``ceil(rate x service / 0.7)`` = 5 tasks at DS2's target utilisation of 0.7 (4.3 exactly,
key groups evenly split; 3 tasks run at 100 %): issue 32's target range is 3-5.

Per run (``--runs``) the job starts with ``agg`` at 1 task (under-provisioned) or 8 (over)
with ``controllers.DS2`` on ``agg`` (target utilisation 0.7, band 0.4..1.0,
``--interval``/``--window``, stabilisation = window, ``--scale-down-delay``, live rescales
by drrs; no max parallelism: DS2's own bounds by the cluster's CPUs apply), in one of two
variants: ``shipped`` (DS2's defaults: its bound by the cluster's CPUs counts the cores a
working task uses, measured from the CPU time the tasks report) and ``cpu``
(``cpu_per_task=--cpu-per-task`` given, as a user whose tasks mostly wait would set it).
It runs until it stays put: ``--stay`` s after the last executed decision, the controller
ticking again (at least ``--min-s``; at most ``--max-s``, plus ``--max-wait`` for a rescale
still running). Recorded: every decision (time, from -> to, DS2's reason, also the no-change
ones), per second the parallelism, the source's and agg's rates, the busiest task's
utilisation and the cores a task used, and the sink's latency.

Per run: the decisions it took to come within one task of the ideal (``to_ideal``,
``examples/bench/autoscale.decisions_to_ideal``), overshoot (past the ideal + 1 in the
direction of travel), oscillation (a change of direction), the final parallelism, the time
to the last decision, and the CPU check: the peak parallelism x the cores a working task
used (DS2's cluster bound) against Ray's CPUs.

Writes ``results.json``, ``ds2.png`` (the paper's style: parallelism over time per start,
with the rates) and ``summary.md`` to ``--out`` (default ``examples/papers/results/ds2/``;
``--quick``: ``results/ds2-quick/``). Reuses ``examples/bench/autoscale.py`` (the decision
count and records) and the bench harness.
"""

# ruff: noqa: E402  (the repository root goes on sys.path before reflow's imports)
from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from controllers import DS2
from controllers.ds2 import even_split
from engine import JobConfig
from engine.control.reconfiguration import cpu_share, starved_fraction
from examples.bench.autoscale import TARGET_UTILISATION, _record, decisions_to_ideal
from examples.bench.harness import analysis as an
from examples.bench.harness import cli, jobs, procs, provenance, render, run
from examples.bench.harness.render import fmt, md_table
from examples.papers import RESULTS_ROOT
from examples.papers.trisk import _load_note, patient_ray_start

OP = "agg"
SRC = "gen"
ISSUE_RANGE = (3, 5)  # issue 32 item 6: from 1 task, 3-5 tasks in at most 3 decisions
PAPER_STEPS = 3
DEFAULTS: dict[str, tuple[Any, Any]] = {
    "runs": ("shipped:1,cpu:1,cpu:8", "shipped:1,cpu:1,cpu:8"),
    "max_s": (120.0, 90.0), "stay": (30.0, 25.0), "min_s": (40.0, 35.0),
}
COLORS = ("tab:blue", "tab:red", "tab:green", "tab:purple", "tab:orange", "tab:brown",
          "tab:olive", "tab:cyan")


def ideal_parallelism(rate: float, service_us: float, key_groups: int) -> int:
    """Tasks ``agg`` needs at ``rate`` to run at DS2's target utilisation, key groups evenly
    split (as DS2 aligns them)."""
    need = math.ceil(rate * service_us / 1e6 / TARGET_UTILISATION - 1e-9)
    return even_split(max(1, need), key_groups, 0.15)


#: DS2 as it ships (its cluster bound from the cores the tasks report using), and with the
#: cores a task uses given (``cpu_per_task``)
VARIANTS = ("shipped", "cpu")
VARIANT_NAMES = {"shipped": "DS2 as shipped", "cpu": "DS2, cpu_per_task={cpu:g}"}


def controller(args: argparse.Namespace, variant: str) -> DS2:
    return DS2(interval_s=args.interval, window_s=args.window, stabilisation_s=args.window,
               scale_down_delay_s=args.scale_down_delay, catch_up_s=args.catch_up,
               target_utilisation=TARGET_UTILISATION, operators=[OP],
               cpu_per_task=args.cpu_per_task if variant == "cpu" else None)


def parse_runs(text: str) -> list[tuple[str, int]]:
    """``"shipped:1,cpu:8,2"`` -> ``[("shipped", 1), ("cpu", 8), ("cpu", 2)]`` (a bare
    parallelism runs the ``cpu`` variant)."""
    out = []
    for item in cli.comma_list(text):
        variant, _, p = item.rpartition(":")
        variant = variant or "cpu"
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r} in {item!r}; one of "
                             f"{', '.join(VARIANTS)}")
        out.append((variant, int(p)))
    return out


# ---------------------------------------------------------------------- one run

def run_start(args: argparse.Namespace, variant: str, start_p: int, progress: run.Progress,
              k: int, n: int) -> dict[str, Any]:
    """One job started with ``agg`` at ``start_p`` under DS2 (``variant``), until it
    stays put (no rescale running, none for ``--stay`` s)."""
    import ray

    sink = jobs.WriteLogLatencySink()
    progress.step(f"run {k}/{n}: DS2 {variant}, start at {start_p}", args.max_s)
    src = jobs.generator(rate=args.rate, keys=args.keys, zipf=None,
                         state_bytes=args.state_bytes)
    config = JobConfig(linger_ms=args.linger_ms, metrics_poll_interval_s=0.5,
                       control_timeout_s=30.0)
    job = jobs.keyed_count_job(f"ds2-from-{start_p}", src, sink, parallelism=start_p,
                               key_groups=args.key_groups, config=config,
                               function=jobs.PaddedCount(args.service_us))
    cpus = ray.cluster_resources().get("CPU")
    samples: list[dict[str, Any]] = []
    try:
        handle = job.run(controllers=[controller(args, variant)])
        try:
            # the clock starts when every agg task reports (deployment takes long on a
            # loaded machine); the controller's first window starts about then too
            deadline = time.time() + args.deploy_max
            while len(handle.metrics().operator(OP)) < start_p and time.time() < deadline:
                time.sleep(0.5)
            t0 = time.time()
            prev = None
            while True:
                now = time.time() - t0
                m = handle.metrics()
                sample = {"t": now, "parallelism": len(m.operator(OP)) or None,
                          "rescale": "; ".join(r.summary() for r in m.rescales if r.running)}
                if prev is not None and m.operator(OP):
                    w = m.rates_since(prev)
                    r, s = w.operator(OP), w.operator(SRC)
                    if r is not None and r.seconds > 0:
                        sample.update(agg_in=r.observed_input_rate,
                                      busiest=r.max_utilisation, cores_per_task=cpu_share(r),
                                      starved=starved_fraction(r))
                    if s is not None and s.seconds > 0:
                        sample.update(source_out=s.observed_input_rate)
                samples.append(sample)
                prev = m
                if stays_put(args, [_record(d) for d in handle.decisions()], t0, time.time()):
                    break
                time.sleep(1.0)
            measured = task_cores(handle.job_id)
            decisions = [_record(d) for d in handle.decisions()]
            history = [_record(h) for h in handle.rescale_history()]
            st = handle.status()
            status, error = str(st.state), st.error
        finally:
            handle.stop()
        rows = an.histogram_rows(jobs.latency_seconds(sink))
    finally:
        shutil.rmtree(sink.directory, ignore_errors=True)
    end = samples[-1]["t"] if samples else 0.0
    return {"variant": variant, "start_p": start_p,
            "status": "ok" if status == "running" else status,
            "reason": error or "", "t0": t0, "cores_per_task_measured": measured, "seconds": end, "cluster_cpus": cpus, "samples": samples,
            "decisions": decisions, "history": history,
            "timeline": [{**r, "t": r["second"] + 0.5 - t0}
                         for r in an.dense(rows, int(t0) + 1, int(t0 + end))],
            **analyse(start_p, args.ideal, t0, decisions, samples, cpus, measured)}


def task_cores(job_id: str, seconds: float = 3.0) -> float | None:
    """Cores one ``agg`` task's process uses (mean over them, ``seconds`` of /proc CPU
    time): what DS2 would measure if the tasks reported their CPU time."""
    try:
        pids = {n: p for n, p in procs.job_actor_pids(job_id).items() if f"/{OP}/" in n}
    except Exception:  # the state API is unavailable: not measured
        return None
    before = {n: procs._cpu_seconds(p) for n, p in pids.items()}
    time.sleep(seconds)
    used = [after - before[n] for n, p in pids.items()
            if (after := procs._cpu_seconds(p)) is not None and before[n] is not None]
    return sum(used) / len(used) / seconds if used else None


def stays_put(args: argparse.Namespace, decisions: Sequence[dict[str, Any]], t0: float,
              now: float) -> bool:
    """Whether the run may stop: the controller is ticking (a decision record, of any
    outcome, within the last ``3 x interval + 2`` s: none comes while a rescale it decided
    runs) and its last executed decision ended ``--stay`` s ago, after at least ``--min-s``;
    at ``--max-s`` once it ticks, and ``--max-wait`` s later whatever it does. Pure."""
    t = now - t0
    latest = max((max(d["at"], d.get("last_at") or 0.0) for d in decisions), default=None)
    ticking = latest is not None and now - latest <= 3 * args.interval + 2
    done = max((d["at"] - t0 for d in decisions if _executed(d)), default=0.0)
    if t >= args.max_s + args.max_wait or (t >= args.max_s and ticking):
        return True
    return t >= args.min_s and ticking and t - done >= args.stay


def _executed(d: dict[str, Any]) -> bool:
    return d["kind"] == "scale" and d["outcome"] == "executed"


# ---------------------------------------------------------------------- analysis (pure)

_STEP = re.compile(r"\b(up|down) (\d+) -> (\d+)")
_TO = re.compile(r" to (\d+)\b")


def steps_of(decisions: Sequence[dict[str, Any]], t0: float, start_p: int
             ) -> list[dict[str, Any]]:
    """The executed scale decisions as steps ``{t, done, from, to, seconds, reason}`` (t:
    when DS2 decided, done: when the rescale ended, seconds after ``t0``; a record's ``at``
    is when it was recorded, after the rescale), each ``from`` the parallelism the step
    found (DS2's reason says it; else the previous step's ``to``)."""
    out: list[dict[str, Any]] = []
    p = start_p
    for d in decisions:
        if not _executed(d):
            continue
        m, to = _STEP.search(d["reason"]), _TO.search(d["decision"])
        new = int(to.group(1)) if to else int(m.group(3)) if m else p
        old = int(m.group(2)) if m else p
        out.append({"t": d["at"] - d["seconds"] - t0, "done": d["at"] - t0, "from": old,
                    "to": new, "seconds": d["seconds"], "reason": d["reason"]})
        p = new
    return out


def analyse(start_p: int, ideal: int, t0: float, decisions: Sequence[dict[str, Any]],
            samples: Sequence[dict[str, Any]], cpus: float | None,
            measured_cores: float | None = None) -> dict[str, Any]:
    """One run's figures (see the module doc) from its decisions and samples; the cores a
    task uses are ``measured_cores`` (the processes' CPU time) when given, else what the
    tasks reported."""
    steps = steps_of(decisions, t0, start_p)
    ps = [start_p, *(s["to"] for s in steps)]
    up = ideal >= start_p
    over = [p for p in ps if (p > ideal + 1 if up else p < ideal - 1)]
    moves = [b - a for a, b in zip(ps, ps[1:], strict=False) if b != a]
    turns = sum(1 for a, b in zip(moves, moves[1:], strict=False) if (a > 0) != (b > 0))
    cores = [s["cores_per_task"] for s in samples if s.get("cores_per_task") is not None]
    starved = [s["starved"] for s in samples if s.get("starved") is not None]
    c = measured_cores if measured_cores is not None else an.median(cores) if cores else None
    peak = max(ps)
    held = [d["reason"] for d in decisions if "bounded to" in d["reason"]
            or "no scale-up" in d["reason"]]
    # a rescale DS2 decided that was still running when the run stopped (its decision
    # record comes when it ends): the tasks seen meanwhile say where it was going
    seen = [s["parallelism"] for s in samples if s.get("parallelism")]
    tasks_seen = [p for i, p in enumerate(seen) if i == 0 or p != seen[i - 1]]
    running = [s for s in samples if s.get("rescale")]
    in_flight = None
    if running and samples and samples[-1].get("rescale"):
        in_flight = {"since_s": running[0]["t"], "progress": samples[-1]["rescale"],
                     "tasks_seen": max(seen, default=None)}
    # scale decisions the job refused or that failed (not steps: the parallelism stayed)
    missed = [{"t": d["at"] - d["seconds"] - t0, "outcome": d["outcome"],
               "decision": d["decision"], "reason": d["reason"], "detail": d.get("detail", "")}
              for d in decisions if d["kind"] == "scale" and not _executed(d)]
    final = ps[-1]
    return {
        "ideal_p": ideal, "steps": steps, "parallelisms": ps, "decisions_n": len(steps),
        "to_ideal": decisions_to_ideal(start_p, ps[1:], ideal), "final_p": final,
        "peak_p": peak, "overshoot": bool(over), "overshoot_ps": over, "oscillations": turns,
        "converged_s": steps[-1]["done"] if steps else 0.0,
        "final_within_1": abs(final - ideal) <= 1,
        "cores_per_task_median": c,
        "starved_median": an.median(starved) if starved else None,
        "cpu_demand_at_peak": None if c is None else peak * c,
        "within_cpus": None if c is None or cpus is None else peak * c <= cpus + 1e-9,
        "held": held[:3], "missed": missed, "tasks_seen": tasks_seen, "in_flight": in_flight,
        "no_change_reasons": _reasons(decisions),
    }


def _reasons(decisions: Sequence[dict[str, Any]]) -> list[str]:
    """The distinct no-change reasons, first seen first, without their numbers (a few)."""
    seen: list[str] = []
    for d in decisions:
        if d["outcome"] != "no-change":
            continue
        head = re.split(r"[:(]", d["reason"], maxsplit=1)[0].strip()
        if head and head not in seen:
            seen.append(head)
    return seen[:6]


def verdict(r: dict[str, Any]) -> str:
    """Whether one run meets the paper's claim: within one task of the ideal in at most
    three decisions, no overshoot, no oscillation."""
    if r.get("status") != "ok":
        return f"no run ({r.get('status')})"
    bad = []
    if r["to_ideal"] is None:
        bad.append("never within one task of the ideal")
    elif r["to_ideal"] > PAPER_STEPS:
        bad.append(f"{r['to_ideal']} decisions")
    if r["overshoot"]:
        bad.append(f"overshoot to {r['overshoot_ps']}")
    if r["oscillations"]:
        bad.append(f"{r['oscillations']} change(s) of direction")
    if not r["final_within_1"]:
        bad.append(f"ended at {r['final_p']}")
    if r.get("in_flight"):
        f = r["in_flight"]
        bad.append(f"a rescale to {f['tasks_seen']} tasks still running after "
                   f"{r['seconds'] - f['since_s']:.0f} s")
    return "yes" if not bad else "no: " + ", ".join(bad)


def issue_verdict(r: dict[str, Any]) -> str:
    """Issue 32 item 6: from 1 task, 3-5 tasks in at most 3 decisions, never beyond what
    the cluster's CPUs keep working."""
    if r.get("status") != "ok":
        return f"no run ({r.get('status')})"
    lo, hi = ISSUE_RANGE
    ps = r["parallelisms"]
    reached = next((i for i, p in enumerate(ps) if lo <= p <= hi), None)
    f = r.get("in_flight")
    if reached is None and f and lo <= (f["tasks_seen"] or 0) <= hi \
            and len(ps) <= PAPER_STEPS:
        return (f"decided: {ps[-1]} -> {f['tasks_seen']} in decision {len(ps)}, within the "
                f"CPUs' bound; not carried out: its rescale was still running after "
                f"{r['seconds'] - f['since_s']:.0f} s")
    bad = []
    if reached is None or reached > PAPER_STEPS:
        bad.append("3-5 tasks not reached in 3 decisions")
    if max(ps) > hi:
        bad.append(f"went to {max(ps)}")
    if r.get("in_flight"):
        bad.append(f"a rescale to {r['in_flight']['tasks_seen']} tasks did not finish")
    if r["within_cpus"] is False:
        bad.append(f"peak {r['peak_p']} x {r['cores_per_task_median']:.2f} cores > "
                   f"{r['cluster_cpus']:g} CPUs")
    return "yes" if not bad else "no: " + ", ".join(bad)


def issue_row_verdict(results: dict[str, Any], r: dict[str, Any]) -> str:
    """``issue_verdict``, saying when the machine was outside the target's condition
    (load <= 10 at both ends)."""
    m = results["machine"]
    loads = [m["loadavg_at_start"][0], *(m.get("loadavg_at_end") or [])[:1]]
    v = issue_verdict(r)
    if max(loads) > 10:
        v += f" (at load {max(loads):.0f}, outside the target's load <= 10)"
    return v


# ---------------------------------------------------------------------- output

def claims(results: dict[str, Any]) -> list[list[str]]:
    """The summary's rows: the paper's claims and issue 32's target, per DS2 variant."""
    c = results["config"]
    ok = [r for r in results["runs"] if r.get("status") == "ok"]
    scale = (f"1 operator, {c['rate']:,.0f} rec/s, {1e6 / c['service_us']:,.0f} rec/s per task "
             f"(slept), {c['key_groups']} key groups, 2 shared CPUs (paper: Flink/Heron/"
             "Timely clusters, word count and NEXMark at up to millions of rec/s)")
    rows: list[list[str]] = []
    for variant in VARIANTS:
        mine = [r for r in ok if r.get("variant", "cpu") == variant]
        name = VARIANT_NAMES[variant].format(cpu=c.get("cpu_per_task"))
        for side, pick in (("under-provisioned", lambda r: r["start_p"] < r["ideal_p"]),
                           ("over-provisioned", lambda r: r["start_p"] > r["ideal_p"])):
            runs = [r for r in mine if pick(r)]
            if not runs:
                continue
            val = "; ".join(_path(r) + f" ({_n(r['to_ideal'])} to ±1 of {r['ideal_p']}, "
                                       f"last at {r['converged_s']:.0f} s)" for r in runs)
            good = [verdict(r) == "yes" for r in runs]
            rows.append([f"at most 3 steps, no overshoot or oscillation ({side} start)",
                         f"{name}: {val}", scale,
                         "yes" if all(good) else
                         f"{sum(good)} of {len(runs)} runs; " + "; ".join(
                             verdict(r) for r in runs if verdict(r) != "yes")])
        one = [r for r in mine if r["start_p"] == 1]
        if one:
            rows.append(["one step on Heron's word count (Dhalion: six)",
                         f"{name}: " + ", ".join(_n(r["to_ideal"]) for r in one)
                         + " decision(s) from 1 task", scale,
                         "yes" if all(r["to_ideal"] == 1 for r in one) else
                         "within 3" if all(r["to_ideal"] is not None and r["to_ideal"] <= 3
                                           for r in one) else "no"])
            rows.append(["issue 32 item 6: from 1 task, 3-5 tasks in <= 3 decisions, never "
                         "more than the cluster's CPUs keep working, at load <= 10",
                         f"{name}: " + "; ".join(
                             f"{_path(r)}, peak x cores "
                             f"{fmt(r['cpu_demand_at_peak'], '.2f')} of "
                             f"{fmt(r['cluster_cpus'], 'g')} CPUs" for r in one),
                         f"load {render.load_range(results)}",
                         "; ".join(issue_row_verdict(results, r) for r in one)])
    return rows


def _path(r: dict[str, Any]) -> str:
    """The parallelisms a run went through, and where an unfinished rescale was going."""
    text = " -> ".join(map(str, r["parallelisms"]))
    f = r.get("in_flight")
    return text + (f" -> [{f['tasks_seen']}: decided, rescale unfinished]" if f else "")


def _n(x: int | None) -> str:
    return "never" if x is None else str(x)


def markdown(results: dict[str, Any]) -> str:
    c = results["config"]
    lines = [f"# DS2: convergence from under- and over-provisioned starts "
             f"({render.load_title(results)})", "",
             render.run_line(results), "",
             results["description"] + ".", "",
             "The paper gives its convergence as plots and its claim in words (at most three "
             "steps; one on Heron's word count, where Dhalion took six); the rows below are "
             "those claims.", "",
             *md_table(["paper", "reflow (this machine)", "scale", "holds?"], claims(results),
                       left=["reflow (this machine)", "scale", "holds?"]), "",
             *_load_note(results),
             "## Runs", ""]
    cols = ["DS2", "start", "status", "decisions", "to ideal±1", "path", "final", "ideal", "overshoot",
            "direction changes", "last decision s", "cores/task", "peak x cores / CPUs",
            "load at end", "holds?"]
    rows = []
    for r in results["runs"]:
        if r.get("status") != "ok":
            rows.append([r.get("variant", "cpu"), str(r["start_p"]), str(r.get("status")),
                         *["-"] * (len(cols) - 4), r.get("reason", "")[:80]])
            continue
        rows.append([r.get("variant", "cpu"), str(r["start_p"]), "ok", str(r["decisions_n"]), _n(r["to_ideal"]),
                     " -> ".join(map(str, r["parallelisms"])), str(r["final_p"]),
                     str(r["ideal_p"]), "yes" if r["overshoot"] else "no",
                     str(r["oscillations"]), fmt(r["converged_s"], ".0f"),
                     fmt(r["cores_per_task_median"], ".2f"),
                     f"{fmt(r['cpu_demand_at_peak'], '.2f')} / {fmt(r['cluster_cpus'], 'g')}",
                     fmt((r.get("loadavg_at_end") or [None])[0], ".1f"), verdict(r)])
    lines += md_table(cols, rows, left=("start", "path", "status", "holds?"))
    lines += ["", "## Decisions (time after the job started, from -> to, DS2's reason)", ""]
    for r in results["runs"]:
        if r.get("status") != "ok":
            continue
        lines.append(f"* {VARIANT_NAMES[r.get('variant', 'cpu')].format(cpu=c.get('cpu_per_task'))}"
                     f", start {r['start_p']} (a task's process used "
                     f"{fmt(r.get('cores_per_task_measured'), '.2f')} cores at the end):")
        for s in r["steps"]:
            lines.append(f"  * {s['t']:.1f} s: {s['from']} -> {s['to']} (took "
                         f"{s['seconds']:.1f} s): {s['reason']}")
        for x in r.get("missed", []):
            lines.append(f"  * {x['t']:.1f} s: {x['decision']} {x['outcome']}: {x['reason']}"
                         f" ({x['detail'][:200]})")
        if r.get("in_flight"):
            f = r["in_flight"]
            lines.append(f"  * a rescale DS2 decided was still running when the run stopped "
                         f"(seen from {f['since_s']:.0f} s; {f['tasks_seen']} tasks up; last "
                         f"progress: {f['progress']})")
        if len(r.get("tasks_seen") or []) > 1:
            lines.append("  * agg tasks seen: " + " -> ".join(map(str, r["tasks_seen"])))
        if not r["steps"] and not r.get("missed") and not r.get("in_flight"):
            lines.append("  * no scale decision")
        if r["no_change_reasons"]:
            lines.append("  * no-change reasons seen: " + "; ".join(r["no_change_reasons"]))
        if r["held"]:
            lines.append("  * held by a bound: " + r["held"][0])
    lines += ["", f"Total {results.get('total_seconds', 0):.0f} s, {render.load_title(results)}."
              f" Knobs: interval {c['interval']:g} s, window {c['window']:g} s (also the "
              f"stabilisation), scale-down delay {c['scale_down_delay']:g} s, catch-up "
              f"{c['catch_up']:g} s, target utilisation {TARGET_UTILISATION}, band 0.4..1.0.",
              ""]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: str) -> None:
    """The paper's style: per start, the parallelism over time (steps) against the ideal,
    the rates, and the latency."""
    plt = render.pyplot()
    fig, (a1, a2, a3) = plt.subplots(3, 1, figsize=(11, 9), sharex=True,
                                     gridspec_kw={"height_ratios": [2, 1, 1]})
    nan = float("nan")
    runs = [r for r in results["runs"] if r.get("status") == "ok"]
    for i, r in enumerate(runs):
        col = COLORS[i % len(COLORS)]
        label = f"{r.get('variant', 'cpu')}, start {r['start_p']}"
        s = [x for x in r["samples"] if x.get("parallelism")]
        a1.step([x["t"] for x in s], [x["parallelism"] for x in s], where="post", color=col,
                lw=1.6, label=label)
        for st in r["steps"]:
            a1.plot(st["t"], st["to"], marker="o", color=col, ms=5)
        a2.plot([x["t"] for x in s], [x.get("agg_in", nan) for x in s], color=col, lw=1.0,
                label=f"{label}: {OP} in")
        tl = r["timeline"]
        a3.plot([x["t"] for x in tl], [nan if x["p99_ms"] is None else x["p99_ms"] for x in tl],
                color=col, lw=1.0, label=label)
    if runs:
        ideal = runs[0]["ideal_p"]
        a1.axhline(ideal, color="k", ls="--", lw=1, label=f"ideal ({ideal})")
        a1.axhspan(ISSUE_RANGE[0], ISSUE_RANGE[1], color="0.9", zorder=0,
                   label="issue 32's 3-5 tasks")
    a2.axhline(results["config"]["rate"], color="k", ls=":", lw=1, label="source rate")
    a1.set_ylabel(f"{OP} tasks")
    a1.legend(fontsize=8, ncol=3)
    a2.set_ylabel("records/s")
    a2.legend(fontsize=7, ncol=3)
    a3.set_ylabel("latency p99, ms (log)")
    if any(x.get("p99_ms") for r in runs for x in r["timeline"]):
        a3.set_yscale("log")
    a3.set_xlabel("seconds since the job started (dots: DS2's decisions)")
    fig.suptitle(f"DS2 on reflow: {results['description']}\n{render.load_title(results)}",
                 fontsize=9)
    render.save_figure(fig, path)


# ---------------------------------------------------------------------- main

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = cli.parser(__doc__, "ds2")
    ap.add_argument("--runs", help="the runs, in this order: [variant:]start parallelism "
                                   "of agg, variant 'shipped' (DS2's defaults) or 'cpu' "
                                   "(cpu_per_task given; the default) (shipped:1,cpu:1,"
                                   "cpu:8)")
    ap.add_argument("--cpu-per-task", type=float, default=0.25,
                    help="the 'cpu' variant's DS2(cpu_per_task=...): cores a working task "
                         "uses (a sleeping agg task: ~0.05-0.2 measured; 0.25)")
    ap.add_argument("--rate", type=float, default=1500.0, help="records/s")
    ap.add_argument("--service-us", type=float, default=2000.0,
                    help="per-record service time of an agg task, slept")
    ap.add_argument("--keys", type=int, default=2000)
    ap.add_argument("--state-bytes", type=int, default=1000, help="padding per key")
    ap.add_argument("--key-groups", type=int, default=128)
    ap.add_argument("--linger-ms", type=float, default=15.0)
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between decisions")
    ap.add_argument("--window", type=float, default=6.0,
                    help="metrics window and stabilisation after a rescale, s")
    ap.add_argument("--scale-down-delay", type=float, default=10.0)
    ap.add_argument("--catch-up", type=float, default=30.0)
    ap.add_argument("--max-s", type=float, help="longest run, s (120; quick 90)")
    ap.add_argument("--min-s", type=float, help="shortest run, s (40; quick 35)")
    ap.add_argument("--deploy-max", type=float, default=120.0,
                    help="longest wait for every agg task to report after the deployment, s")
    ap.add_argument("--max-wait", type=float, default=60.0,
                    help="past --max-s, how long a rescale DS2 decided may still run before "
                         "the job stops anyway (s)")
    ap.add_argument("--stay", type=float,
                    help="stop this long after the last executed decision, s (30; quick 25)")
    args = ap.parse_args(argv)
    cli.fill_defaults(args, DEFAULTS)
    try:
        args.runs = parse_runs(args.runs)
    except ValueError as exc:
        ap.error(f"--runs: {exc}")
    if not args.runs or not all(1 <= p <= args.key_groups for _, p in args.runs):
        ap.error("--runs: parallelisms between 1 and --key-groups")
    args.ideal = ideal_parallelism(args.rate, args.service_us, args.key_groups)
    args.out = args.out or os.path.join(RESULTS_ROOT, "ds2-quick" if args.quick else "ds2")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = provenance.begin(__file__, argv, args)
    results["description"] = (
        f"keyed count at {args.rate:,.0f} records/s, {args.service_us:,.0f} us per record per "
        f"{OP} task ({1e6 / args.service_us:,.0f}/s each): ideal {args.ideal} tasks at "
        f"{TARGET_UTILISATION:.0%}; runs {', '.join(f'{v}:{p}' for v, p in args.runs)}")
    results["runs"] = []
    print(f"DS2 convergence: {results['description']}", flush=True)
    results["machine"]["ray"] = run.ray_version()
    progress = run.Progress(args.max_s * len(args.runs))
    # a Ray of its own, not whichever cluster this machine recorded last
    with patient_ray_start():
        run.init_ray()
    try:
        for k, (v, p) in enumerate(args.runs, 1):
            try:
                r = run_start(args, v, p, progress, k, len(args.runs))
            except Exception as exc:  # a failed run is recorded, the others go on
                traceback.print_exc()
                r = {"variant": v, "start_p": p, "status": "failed",
                     "reason": f"{type(exc).__name__}: {exc}"}
            r["loadavg_at_end"] = os.getloadavg()
            results["runs"].append(r)
    finally:
        progress.close()
        run.shutdown_ray()
    provenance.finish(results)
    render.write_outputs(args.out, results, markdown=markdown(results), png="ds2.png",
                         plot=plot)
    return 0 if any(r.get("status") == "ok" for r in results["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
