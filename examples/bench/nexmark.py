"""Sustainable throughput of NEXMark Q5, Q7 and Q8 on reflow, and the generator's speed.

    python examples/bench/nexmark.py              # ladder + refinement per query, <= ~8 min
    python examples/bench/nexmark.py --quick      # smoke run, ~1-2 min
    python examples/bench/nexmark.py --queries q7s,q8s --parallelism 4

For each query one job runs an open-loop ``NexmarkSource`` whose rate climbs a geometric
ladder (from ``--start-rate``, default per query, times ``--factor`` per step, ``--step-s``
seconds per step; a ``RateSchedule``). Record timestamps are the scheduled emission times, so
the windows are over wall-clock time and the latency of a window result (``LatencySink``:
sink arrival - window end) includes any lag of the source behind its schedule. A step is
*sustainable* when,
over the wall seconds of the step after ``--warmup-s`` (results arriving in them):

* window results keep arriving (at least one in the step),
* their p99 latency (merged per-second histograms) is below ``--threshold-ms`` (1 s), and
* latency does not grow: the mean of the second half of those seconds is at most the first
  half's + max(``--growth-ms``, 25 %).

An overloaded step leaves a backlog, so the next (higher) step fails too; a failed step
followed by a passed one was a transient (this machine is shared: other processes' load
comes and goes) and is marked so. The job is stopped after two failed steps in a row, and the
sustainable rate is the highest step passed before the first failure that is not transient.
Without ``--quick`` a second job refines between that rate and the failing one (``--refine``
steps, starting with a re-test of the passing rate; if that re-test fails, the sustainable
rate falls back to the ladder's step below it). A last step that passed but whose job then
took more than threshold + window + 2 s to drain counts as failed. Results arrive once per
window slide, so a step's percentiles rest on a few results per second: read them as the
latency of the window results, not as a distribution over records.

Queries (windows chosen small so that results arrive every second; ``--parallelism`` keyed
tasks, ``--source-parallelism`` source tasks):

* q5:  hot items, sliding 2 s / 500 ms
* q7:  highest bid, tumbling 1 s;   q7s: sliding 2 s / 500 ms (the DRRS variant)
* q8:  new users, tumbling 1 s;     q8s: sliding 2 s / 500 ms

The generator speed is measured in this process, one core: raw columnar generation
(``NexmarkGenerator.events``) and ``NexmarkReader.poll`` at full speed (tuples), for the bids
(Q5/Q7's input), persons + auctions (Q8's) and all kinds.

Writes ``examples/bench/out/nexmark/results.json`` and ``nexmark.png`` (p50/p99 latency per
step vs rate, per query). The machine is shared and noisy: the load average is recorded.
"""

# ruff: noqa: E402  (the repository root goes on sys.path before reflow's imports)
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from engine import JobConfig, LatencySink, StreamJob
from engine.names import JobState
from engine.observability import LatencyHistogram
from engine.time import SystemClock
from examples.bench.harness import BenchRunError, cli, jobs, provenance, render, run
from examples.bench.harness import analysis as an
from examples.nexmark import queries
from examples.nexmark.generator import NexmarkConfig, NexmarkGenerator
from examples.nexmark.source import NexmarkSource, RateSchedule

SEED = 42
VARIANTS: dict[str, tuple[str, dict[str, int]]] = {
    "q5": ("q5", {"size_ms": 2000, "slide_ms": 500}),
    "q7": ("q7", {"size_ms": 1000}),
    "q7s": ("q7", {"size_ms": 2000, "slide_ms": 500}),
    "q8": ("q8", {"size_ms": 1000}),
    "q8s": ("q8", {"size_ms": 2000, "slide_ms": 500}),
}
#: first ladder rate (events/s) per query: Q8 reads only persons and auctions (8 % of events)
START_RATES = {"q5": 4000.0, "q7": 16000.0, "q7s": 4000.0, "q8": 40000.0, "q8s": 20000.0}


# ------------------------------------------------------------------------ generator speed


def generator_speed(events: int) -> dict[str, Any]:
    """Events/s of the generator alone and of the source reader (tuples), one core."""
    out: dict[str, Any] = {"events": events}
    cfg = NexmarkConfig(seed=SEED)
    gen = NexmarkGenerator(cfg)
    t = time.perf_counter()
    for start in range(0, events, 65_536):
        gen.events(start, min(65_536, events - start))
    dt = time.perf_counter() - t
    out["columns"] = {"events_per_s": events / dt, "seconds": dt}
    for label, kinds in (("bids", ("bids",)), ("persons+auctions", ("persons", "auctions")),
                         ("all", ("persons", "auctions", "bids"))):
        src = NexmarkSource(cfg, event_time=True, num_events=events, kinds=kinds)
        reader = src.open_partition("0-of-1", None, SystemClock())
        n = 0
        t = time.perf_counter()
        while (batch := reader.poll(1000)) is not None:
            n += len(batch)
        dt = time.perf_counter() - t
        out[label] = {"events_per_s": events / dt, "records_per_s": n / dt, "records": n,
                      "seconds": dt}
    return out


# ------------------------------------------------------------------------------ one ladder


def judge(seconds: dict[int, LatencyHistogram], a: float, b: float, args: argparse.Namespace,
          ) -> dict[str, Any]:
    """Verdict of a step that ran over wall time [a, b): look at results arriving in the whole
    seconds within [a + warmup, b)."""
    first = math.ceil(a + min(args.warmup_s, (b - a) / 2))
    last = math.floor(b) - 1
    picked = [(s, seconds[s]) for s in range(first, last + 1) if s in seconds]
    row: dict[str, Any] = {"measured_seconds": max(0, last - first + 1),
                           "seconds_with_results": len(picked),
                           "loadavg_1m": os.getloadavg()[0]}
    if not picked:
        row.update(ok=False, reason="no results")
        return row
    h = an.merged(dict(picked))
    half = max(1, len(picked) // 2)
    early = an.merged(dict(picked[:half])).mean if picked[:half] else 0.0
    late = an.merged(dict(picked[half:])).mean if len(picked) > 1 else early
    stats = an.latency_stats(h)
    row.update(count=h.count, p50_ms=stats["p50_ms"], p99_ms=stats["p99_ms"],
               max_ms=stats["max_ms"], mean_first_half_ms=early, mean_second_half_ms=late)
    if row["p99_ms"] > args.threshold_ms:
        row.update(ok=False, reason=f"p99 {row['p99_ms']:.0f} ms > {args.threshold_ms:.0f} ms")
    elif late > early + max(args.growth_ms, 0.25 * early):
        row.update(ok=False, reason=f"latency grows ({early:.0f} -> {late:.0f} ms)")
    else:
        row.update(ok=True, reason="")
    return row


def run_ladder(name: str, rates: list[float], args: argparse.Namespace) -> dict[str, Any]:
    query, params = VARIANTS[name]
    steps = [(args.step_s, r) for r in rates]
    schedule = RateSchedule(steps)
    total = schedule.total_events()
    source = NexmarkSource(NexmarkConfig(seed=SEED, first_event_rate=rates[0]), event_time=False,
                           rate=steps, num_events=total, split_events=args.split_events)
    sink = LatencySink()
    job = StreamJob(f"bench-{name}", num_key_groups=args.key_groups, parallelism=args.parallelism,
                    config=JobConfig(batch_size=args.batch_size, linger_ms=args.linger_ms,
                                     metrics_port=None))
    queries.build(query, job, source, sink, parallelism=args.parallelism,
                  source_parallelism=args.source_parallelism, **params)
    t_build = time.time()
    handle = job.run()
    t0 = time.time()  # sources start last in run(): the schedule's anchor, within ms
    print(f"  {name}: deployed in {t0 - t_build:.1f} s; ladder "
          + ", ".join(f"{r:,.0f}" for r in rates) + f" events/s, {args.step_s:g} s each")
    bounds = [(t0 + i * args.step_s, t0 + (i + 1) * args.step_s) for i in range(len(rates))]
    window_s = params["size_ms"] / 1000.0
    grace = 1.0 + LatencySink.SAVE_INTERVAL_S  # results of a second are saved within 0.5 s
    verdicts: list[dict[str, Any]] = []
    state = JobState.RUNNING
    finished_at = None
    try:
        while True:
            state = JobState(handle.status().state)
            now = time.time()
            if not state.active:
                finished_at = now
                break
            i = len(verdicts)
            if i < len(rates) and now >= bounds[i][1] + grace:
                v = judge(jobs.latency_seconds(sink), *bounds[i], args)
                verdicts.append(v)
                _print_step(rates[i], v)
                if _confirmed_failure(verdicts):
                    break
            drain_limit = bounds[-1][1] + args.threshold_ms / 1000.0 + window_s + 2.0
            if len(verdicts) == len(rates) and now > drain_limit:
                verdicts[-1].update(ok=False, reason="the job did not drain in time")
                print("    the job did not drain in time: the last step counts as failed")
                break
            time.sleep(0.25)
    finally:
        handle.stop()
    seconds = jobs.latency_seconds(sink)
    while (len(verdicts) < len(rates) and not state.active and state != JobState.FAILED
           and not _confirmed_failure(verdicts)):
        i = len(verdicts)  # the job ended before the driver judged the last steps
        verdicts.append(judge(seconds, *bounds[i], args))
        _print_step(rates[i], verdicts[-1])
    if state == JobState.FAILED:
        raise BenchRunError(f"{name}: the job failed; see its log above (the driver prints the "
                            f"task logs)")
    rows = []
    for i, (r, v) in enumerate(zip(rates, verdicts, strict=False)):
        rows.append({"rate": r, "step": i, **v})
    timeline = [{"t": s + 0.5 - t0, "count": h.count, "p50_ms": h.quantile(0.5),
                 "p99_ms": h.quantile(0.99)} for s, h in sorted(seconds.items())]
    return {"rates": rates, "steps": rows, "deploy_s": t0 - t_build,
            "drain_s": None if finished_at is None else finished_at - bounds[-1][1],
            "timeline": timeline}


def _print_step(rate: float, v: dict[str, Any]) -> None:
    print(f"    {rate:>9,.0f} ev/s: "
          + (f"p50 {v['p50_ms']:7.0f}  p99 {v['p99_ms']:7.0f} ms" if "p99_ms" in v
             else "no results".ljust(28))
          + ("  ok" if v["ok"] else f"  FAIL ({v['reason']})")
          + f"  [load {v['loadavg_1m']:.1f}]", flush=True)


def _confirmed_failure(verdicts: list[dict[str, Any]]) -> bool:
    """Two failed steps in a row: a real overload (its backlog carries over into the next,
    higher, step); a failed step followed by a passed one was a transient (machine noise)."""
    return len(verdicts) >= 2 and not verdicts[-1]["ok"] and not verdicts[-2]["ok"]


def sustainable(rows: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(highest rate passed before the first confirmed failure, that failing rate). A failure
    is confirmed when the next step fails too or it is the last step; a failed step followed
    by a passed one is marked ``transient`` and skipped."""
    best = None
    for k, r in enumerate(rows):
        if r["ok"]:
            best = r["rate"]
            continue
        if k + 1 < len(rows) and rows[k + 1]["ok"]:
            r["transient"] = True
            continue
        return best, r["rate"]
    return best, None


def bench_query(name: str, args: argparse.Namespace) -> dict[str, Any]:
    start = args.start_rate or START_RATES[name]
    rates = [round(start * args.factor ** k) for k in range(args.steps)]
    ladders = [run_ladder(name, rates, args)]
    best, fail = sustainable(ladders[0]["steps"])
    retest_failed = False
    if args.refine and best is not None and fail is not None:
        fine = [round(best * (fail / best) ** (j / (args.refine + 1)))
                for j in range(1, args.refine + 1)]
        ladders.append(run_ladder(name, [best] + fine, args))
        b2, f2 = sustainable(ladders[1]["steps"])
        if b2 is not None:
            best, fail = b2, f2 if f2 is not None else fail
        else:  # the passing rate failed its re-test: fall back to the step below it
            retest_failed = True
            fail = best
            below = [s["rate"] for s in ladders[0]["steps"] if s["ok"] and s["rate"] < best]
            best = max(below) if below else None
    return {"query": VARIANTS[name][0], "windows": VARIANTS[name][1], "ladders": ladders,
            "sustainable_rate": best, "first_failing_rate": fail,
            "retest_failed": retest_failed,
            "below_ladder": best is None, "above_ladder": fail is None}


# ------------------------------------------------------------------------------ reporting


def print_table(results: dict[str, Any]) -> None:
    g = results["generator"]
    print("\ngenerator (one core, this process):")
    print(f"  columns only          {g['columns']['events_per_s']:>12,.0f} events/s")
    for label in ("bids", "persons+auctions", "all"):
        r = g[label]
        print(f"  reader, {label:<16} {r['events_per_s']:>10,.0f} events/s "
              f"({r['records_per_s']:,.0f} records/s)")
    print(f"\nsustainable rate (p99 < {results['args']['threshold_ms']:.0f} ms and not growing; "
          f"parallelism {results['args']['parallelism']}, "
          f"source parallelism {results['args']['source_parallelism']}):")
    print(f"  {'query':<6}{'windows':<22}{'sustainable':>14}{'first failing':>15}"
          f"{'p50 at best':>13}{'p99 at best':>13}")
    for name, q in results["queries"].items():
        w = q["windows"]
        wdesc = (f"slide {w['slide_ms']} / size {w['size_ms']}" if w.get("slide_ms")
                 else f"tumble {w['size_ms']}") + " ms"
        best = q["sustainable_rate"]
        at = [s for lad in q["ladders"] for s in lad["steps"] if s["rate"] == best and s["ok"]]
        p50 = f"{at[-1]['p50_ms']:,.0f} ms" if at else "-"
        p99 = f"{at[-1]['p99_ms']:,.0f} ms" if at else "-"
        bs = "-" if best is None else f"{best:,.0f}" + ("+" if q["above_ladder"] else "")
        fs = "-" if q["first_failing_rate"] is None else f"{q['first_failing_rate']:,.0f}"
        print(f"  {name:<6}{wdesc:<22}{bs:>14}{fs:>15}{p50:>13}{p99:>13}")
    print("  (events/s of all kinds; '+': the whole ladder passed)")


def plot(results: dict[str, Any], path: str) -> None:
    import matplotlib

    plt = render.pyplot()
    names = list(results["queries"])
    fig, axes = plt.subplots(1, len(names), figsize=(4.6 * len(names), 4), squeeze=False)
    thr = results["args"]["threshold_ms"]
    for ax, name in zip(axes[0], names, strict=True):
        q = results["queries"][name]
        for li, lad in enumerate(q["ladders"]):
            rows = [s for s in lad["steps"] if "p99_ms" in s]
            if not rows:
                continue
            marker = "o" if li == 0 else "s"
            rr = [s["rate"] for s in rows]
            ax.plot(rr, [s["p99_ms"] for s in rows], marker=marker, color="C0",
                    label="p99" if li == 0 else "p99 (refine)", linestyle="-" if li == 0 else ":")
            ax.plot(rr, [s["p50_ms"] for s in rows], marker=marker, color="C1",
                    label="p50" if li == 0 else "p50 (refine)", linestyle="-" if li == 0 else ":")
            for s in rows:
                if not s["ok"]:
                    ax.plot([s["rate"]], [s["p99_ms"]], "x", color="red", markersize=10)
        ax.axhline(thr, color="gray", linestyle="--", linewidth=1, label=f"{thr:.0f} ms")
        if q["sustainable_rate"]:
            ax.axvline(q["sustainable_rate"], color="green", linewidth=1,
                       label=f"sustainable {q['sustainable_rate']:,.0f}/s")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ticks = sorted({s["rate"] for lad in q["ladders"] for s in lad["steps"]})
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xticks(ticks, [f"{t / 1000:.3g}k" for t in ticks], rotation=45, fontsize=7)
        ax.set_xlabel("generator rate (events/s)")
        ax.set_ylabel("latency (ms, sink - window end)")
        w = q["windows"]
        ax.set_title(f"{name}: " + (f"sliding {w['size_ms']}/{w['slide_ms']} ms" if w.get(
            "slide_ms") else f"tumbling {w['size_ms']} ms"))
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"NEXMark on reflow, parallelism {results['args']['parallelism']} "
                 f"({os.cpu_count()} cores)")
    render.save_figure(fig, path)


# ---------------------------------------------------------------------------------- main


LADDER = {"factor": (1.5, 2.0), "steps": (8, 5), "step_s": (6.0, 4.0), "warmup_s": (2.0, 1.5),
          "refine": (3, 0), "generator_events": (1_000_000, 200_000)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = cli.parser(__doc__, "nexmark")
    ap.add_argument("--queries", default="q5,q7,q8", help=f"of {','.join(VARIANTS)}")
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--source-parallelism", type=int, default=1)
    ap.add_argument("--key-groups", type=int, default=128)
    ap.add_argument("--start-rate", type=float, default=None,
                    help=f"first rate, events/s (default per query: {START_RATES})")
    ap.add_argument("--factor", type=float, help="ladder factor (1.5; quick 2)")
    ap.add_argument("--steps", type=int, help="ladder steps (8; quick 5)")
    ap.add_argument("--step-s", type=float, help="seconds per step (6; quick 4)")
    ap.add_argument("--warmup-s", type=float, help="seconds of a step not judged (2; quick 1.5)")
    ap.add_argument("--refine", type=int, help="refinement steps (3; quick 0)")
    ap.add_argument("--threshold-ms", type=float, default=1000.0)
    ap.add_argument("--growth-ms", type=float, default=150.0)
    ap.add_argument("--split-events", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--linger-ms", type=float, default=5.0)
    ap.add_argument("--generator-events", type=int, help="(1M; quick 200k)")
    args = ap.parse_args(argv)
    cli.fill_defaults(args, LADDER)
    args.out = cli.out_dir(args, "nexmark")
    args.names = cli.comma_list(args.queries)
    unknown = [n for n in args.names if n not in VARIANTS]
    if unknown:
        ap.error(f"unknown queries {unknown}; choose from {list(VARIANTS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = provenance.begin(__file__, argv)
    results["args"] = vars(args)
    results["started"] = time.strftime("%Y-%m-%d %H:%M:%S")
    results["machine"]["loadavg_start"] = results["machine"]["loadavg_at_start"]
    print(f"generator speed ({args.generator_events:,} events)...")
    results["generator"] = generator_speed(args.generator_events)
    results["queries"] = {}
    run.init_ray()
    try:
        for name in args.names:
            print(f"{name}:")
            results["queries"][name] = bench_query(name, args)
    finally:
        run.shutdown_ray()
    provenance.finish(results)
    results["machine"]["loadavg_end"] = results["machine"]["loadavg_at_end"]
    results["total_s"] = results["total_seconds"]
    print_table(results)
    render.write_outputs(args.out, results, png="nexmark.png", plot=plot)
    print(f"in {results['total_s']:.0f} s ({render.load_title(results)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
