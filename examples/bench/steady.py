"""Steady-state benchmark of the keyed count job: throughput, latency at half load, memory.

    python examples/bench/steady.py             # parallelism 1 2 4, 2M records, 20 s half load
    python examples/bench/steady.py --quick     # smoke run: 200k records, 8 s, parallelism 1 2

Job: GeneratorSource(num_keys=100_000, zipf 1.2) -> map (key, seq) -> (key, 1) (chained into
the source task) -> key_by(key) -> reduce summing the counts (emits every update, like
Flink's reduce) -> LatencySink (chained into the count tasks).

For every parallelism p of the count operator, two phases:

1. Full speed (rate=None, ``--records`` records). The driver polls only the JobMaster's
   status (every ``--poll`` s; asking tasks for metrics would make them pack state samples)
     * job throughput  = records / (``job.run()`` returned -> first status poll that sees the
       job finished). ``run()`` returns once every task is deployed and started (sources
       last), so this span covers all processing plus end-of-stream drain and the finish
       reports; it excludes Ray/actor start-up.
     * sink throughput = records counted at the sink / (wall time of the sink's first
       ``write()`` -> its last ``write()``, over all sink writers; logged by
       ``harness.jobs.WriteLogLatencySink``, exact to one batch).
     * interior rate   = records at the sink in the whole wall-clock seconds strictly between
       the first and the last second with any record (``LatencySink.timeline()``), per second.
   Run ``--repeats`` times; the run with the median job throughput is reported.
2. Half load: an open-loop source at 50 % of that p's (median) job throughput for ``--duration`` s.
   Latency = sink arrival time - scheduled emission time of the record (so queueing counts),
   percentiles merged from the sink's per-second histograms of every second at least
   ``--warmup`` s after ``run()`` returned. RSS of all the job's Ray worker processes (task
   actors + JobMaster), summed, sampled every second.

Also the per-core ceiling: a plain Python loop over the same records (pre-generated list)
doing ``counts[k] = counts.get(k, 0) + 1`` and appending every update to a list.

Writes ``examples/bench/out/steady/results.json`` and ``steady.png``.
"""

# ruff: noqa: E402  (the repository root goes on sys.path before reflow's imports)
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from engine import JobConfig, StreamJob
from engine.clock import SystemClock
from engine.names import JobState
from engine.sinks import LatencySink, Sink
from engine.sources import GeneratorSource
from examples.bench.harness import BenchRunError, cli, jobs, procs, profile, provenance, render, run
from examples.bench.harness import analysis as an

NUM_KEYS = 100_000
ZIPF_EXPONENT = 1.2
TIMING = {"parallelism": ([1, 2, 4], [1, 2]), "records": (2_000_000, 200_000),
          "duration": (20.0, 8.0), "repeats": (3, 1)}


def fmt0(x: float | None, spec: str = ",.0f") -> str:
    return render.fmt(x, spec)


# ------------------------------------------------------------------------------ the job


def to_pair(record: Any) -> tuple[Any, int]:
    return (record[0], 1)


def add_counts(a: Any, b: Any) -> tuple[Any, int]:
    return (a[0], a[1] + b[1])


def source(rate: float | None, num_records: int | None, duration_s: float | None
           ) -> GeneratorSource:
    return GeneratorSource(rate=rate, num_records=num_records, duration_s=duration_s,
                           num_keys=NUM_KEYS, skew="zipf", zipf_exponent=ZIPF_EXPONENT,
                           seed=jobs.SEED)


def build(parallelism: int, source_parallelism: int, src: GeneratorSource, sink: Sink,
          config: JobConfig) -> StreamJob:
    job = StreamJob("steady", parallelism=parallelism, config=config)
    (
        job.source(src, name="gen", parallelism=source_parallelism)
        .map(to_pair, name="pair")
        .key_by(jobs.key_of)
        .reduce(add_counts, name="count", parallelism=parallelism)
        .sink(sink, name="latency")
    )
    return job


# ------------------------------------------------------------------------------ phases


def interior_rate(timeline: list[dict[str, Any]]) -> tuple[float | None, int]:
    """Records/s over the whole wall seconds strictly between the first and the last second
    with any record at the sink (the partial first and last seconds are left out)."""
    inner = timeline[1:-1]
    if not inner:
        return None, 0
    seconds = inner[-1]["second"] - inner[0]["second"] + 1
    return sum(r["count"] for r in inner) / seconds, seconds


def _sampled(p: int, args: argparse.Namespace, src: GeneratorSource, sink: Sink,
             config: JobConfig, profile_it: bool) -> dict[str, Any]:
    """Run the job to its end while sampling its processes (and py-spying its first source
    and count task when ``profile_it``): deploy time, span, state, pids, sampler, profiles,
    wall start."""
    t0 = time.monotonic()
    handle = build(p, args.source_parallelism, src, sink, config).run()
    t_started = time.monotonic()
    wall_started = time.time()
    profiles: dict[str, Any] = {}
    try:
        pids = procs.wait_for_pids(handle.job_id, args.source_parallelism + p + 1)
        sampler = procs.RssSampler(pids, t_started)
        sampler.start()
        recorders: dict[str, Any] = {}
        if profile_it:
            targets = {label: pid for name, pid in pids.items()
                       for label, part in (("source", "/gen/0/"), ("count", "/count/0/"))
                       if part in name}
            print(f"  py-spy on {targets} for {args.profile_seconds:.0f} s")
            recorders = profile.profile_pids(targets, args.profile_seconds, args.out,
                                             args.profile_gil)
        timeout = args.timeout + (0.0 if src.rate is None else args.duration)
        span, state = run.wait_finished(handle, args.poll if src.rate is None else 0.5,
                                        timeout, since=t_started)
        sampler.stop()
        if state != JobState.FINISHED or span is None:
            raise BenchRunError(f"run p={p} ended in state {state!r}; see the task logs above, "
                                f"or raise --timeout ({args.timeout:g} s)")
        profiles = profile.collect_profiles(recorders, args.profile_seconds)
    finally:
        handle.stop()
    return {"deploy_s": t_started - t0, "span": span, "pids": pids, "sampler": sampler,
            "profiles": profiles, "wall_started": wall_started}


def _timeline(sink: LatencySink, wall_started: float) -> list[dict[str, Any]]:
    """The sink's per-second rows, each with ``t``: the middle of that wall second since the
    job started."""
    return [{**row, "t": row["second"] + 0.5 - wall_started} for row in sink.timeline()]


def run_full_speed(p: int, args: argparse.Namespace, config: JobConfig,
                   profile_it: bool) -> dict[str, Any]:
    sink = jobs.WriteLogLatencySink()
    s = _sampled(p, args, source(None, args.records, None), sink, config, profile_it)
    n_sink = sink.summary()["count"]
    span = sink.span()
    timeline = _timeline(sink, s["wall_started"])
    steady, steady_seconds = interior_rate(timeline)
    sink_span = (span["last"] - span["first"]) if span else None
    return {
        "parallelism": p,
        "records": args.records,
        "records_at_sink": n_sink,
        "deploy_s": s["deploy_s"],
        "job_span_s": s["span"],
        "job_throughput": args.records / s["span"],
        "sink_first_s": span["first"] - s["wall_started"] if span else None,
        "sink_last_s": span["last"] - s["wall_started"] if span else None,
        "sink_span_s": sink_span,
        "sink_throughput": (n_sink / sink_span) if sink_span else None,
        "interior_seconds_throughput": steady,
        "interior_seconds": steady_seconds,
        "status_poll_interval_s": args.poll,
        "sink_timeline": timeline,
        "memory": procs.memory_summary(s["sampler"].samples, len(s["pids"])),
        "memory_samples": [{k: v for k, v in x.items() if k != "per_actor"}
                           for x in s["sampler"].samples],
        "cpu": s["sampler"].cpu(),
        "loadavg_at_end": os.getloadavg(),
        "actors": s["pids"],
        "profiles": s["profiles"],
    }


def run_half_load(p: int, rate: float, args: argparse.Namespace, config: JobConfig
                  ) -> dict[str, Any]:
    sink = LatencySink()  # the plain one: what a user measures latency with
    src = source(rate, None, args.duration)
    s = _sampled(p, args, src, sink, config, False)
    warm_second = math.ceil(s["wall_started"] + args.warmup)
    h = an.merged(jobs.latency_seconds(sink), warm_second)
    return {
        "parallelism": p,
        "rate": rate,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "records_expected": src.partition_records(0, 1) if args.source_parallelism == 1 else None,
        "records_at_sink": sink.summary()["count"],
        "job_span_s": s["span"],
        "latency_after_warmup": {**an.latency_stats(h, (0.5, 0.99, 0.999)),
                                 "from_epoch_second": warm_second},
        "latency_whole_run": sink.summary(),
        "sink_timeline": _timeline(sink, s["wall_started"]),
        "memory": procs.memory_summary(s["sampler"].samples, len(s["pids"]), args.warmup),
        "memory_samples": s["sampler"].samples,
        "cpu": s["sampler"].cpu(),
        "loadavg_at_end": os.getloadavg(),
        "actors": s["pids"],
    }


def measure_ceiling(records: int, repeats: int = 3) -> dict[str, Any]:
    """Single-process loop over the same records; best of ``repeats``."""
    reader = source(None, records, None).open_partition("0-of-1", None, SystemClock())
    data: list[Any] = []
    while True:
        b = reader.poll(65536)
        if b is None:
            break
        data.extend(b.values)
    times = []
    for _ in range(repeats):
        counts: dict[Any, int] = {}
        out: list[Any] = []
        t = time.perf_counter()
        for k, _seq in data:
            c = counts[k] = counts.get(k, 0) + 1
            out.append((k, c))
        times.append(time.perf_counter() - t)
        del out
    best = min(times)
    seen: set[Any] = set()
    growth = []  # distinct keys (= keyed state entries) after n records: state grows with them
    marks = {len(data) * i // 8 for i in range(1, 9)}
    for i, (k, _seq) in enumerate(data, 1):
        seen.add(k)
        if i in marks:
            growth.append([i, len(seen)])
    return {"records": len(data), "distinct_keys": len(counts), "distinct_keys_after": growth,
            "seconds": times,
            "throughput": len(data) / best,
            "loop": "for k, _ in records: c = counts[k] = counts.get(k, 0) + 1; out.append((k, c))",
            "best_of": repeats}


# ------------------------------------------------------------------------------ output


def _cores(r: dict[str, Any]) -> str:
    c = r.get("cpu") or {}
    if not c:
        return "-"
    return f"{c['job_cores']:.2f}/{c['other_cores']:.2f}"


def _print_rows(cols: list[tuple[str, int]], rows: list[list[str]]) -> None:
    """Right-aligned columns of the given widths under their headers."""
    print(" ".join(f"{h:>{w}}" for h, w in cols))
    for r in rows:
        print(" ".join(f"{c:>{w}}" for c, (_, w) in zip(r, cols, strict=True)))


def print_table(results: dict[str, Any]) -> None:
    ceil = results["ceiling"]["throughput"]
    warmup = results["config"]["warmup_s"]
    print(f"\nper-core ceiling (plain Python loop, same {results['ceiling']['records']:,} "
          f"records): {ceil:,.0f} records/s\n\nfull speed (records/s)")
    _print_rows(
        [("p", 3), ("job", 10), ("sink", 10), ("interior", 10), ("job span s", 11),
         ("sink span s", 12), ("job/ceil", 9), ("sink/ceil", 9), ("cores job/other", 16)],
        [[str(r["parallelism"]), fmt0(r["job_throughput"]), fmt0(r["sink_throughput"]),
          fmt0(r["interior_seconds_throughput"]), f"{r['job_span_s']:.2f}",
          fmt0(r["sink_span_s"], ".2f"), f"{r['job_throughput'] / ceil:.3f}",
          fmt0(r["sink_throughput"] and r["sink_throughput"] / ceil, ".3f"), _cores(r)]
         for r in results["full_speed"]])
    print(f"\nhalf load (open loop, 50% of job throughput; latency excludes first {warmup:g} s)")
    rows = []
    for r in results["half_load"]:
        lat, mem = r["latency_after_warmup"], r["memory"]
        rows.append([str(r["parallelism"]), f"{r['rate']:,.0f}", f"{r['records_at_sink']:,}",
                     *(f"{lat[k]:.1f}" for k in ("p50_ms", "p99_ms", "p999_ms", "max_ms")),
                     *(fmt0(mem.get(k), ".1f") for k in ("start_mb", "end_mb", "max_mb")),
                     fmt0(mem.get("after_warmup_growth_mb"), "+.1f"),
                     fmt0(mem.get("second_half_growth_mb"), "+.1f"), _cores(r)])
    _print_rows([("p", 3), ("rate/s", 9), ("at sink", 9), ("p50 ms", 8), ("p99 ms", 8),
                 ("p999 ms", 8), ("max ms", 8), ("RSS start", 10), ("RSS end", 8),
                 ("RSS max", 8), ("+warm", 7), ("+2nd half", 9), ("cores job/other", 16)], rows)
    print(f"RSS: MB summed over the job's actor processes (task actors + JobMaster), sampled every "
          f"1 s; +warm = end - first sample after {warmup:g} s, "
          f"+2nd half = growth over the second half of the run")
    print("cores job/other: average CPU cores used by the job's actor processes / by every "
          "other process on the machine (Ray daemons, driver, other users) during the run")
    print()


def plot(results: dict[str, Any], path: str) -> None:
    from matplotlib.ticker import FuncFormatter

    plt = render.pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 6))
    full = results["full_speed"]
    ps = [str(r["parallelism"]) for r in full]
    x = range(len(ps))
    w = 0.38
    job = [r["job_throughput"] for r in full]
    lo = [r["job_throughput"] - min(x["job_throughput"] for x in r.get("runs", [r])) for r in full]
    hi = [max(x["job_throughput"] for x in r.get("runs", [r])) - r["job_throughput"] for r in full]
    ax1.bar([i - w / 2 for i in x], job, w, yerr=[lo, hi], capsize=3,
            label=f"job (run() → finished); median of {results['config']['repeats']}, "
                  f"bars = range")
    ax1.bar([i + w / 2 for i in x], [r["sink_throughput"] or 0 for r in full], w,
            label="sink, first → last record")
    ceil = results["ceiling"]["throughput"]
    ax1.axhline(ceil, color="k", ls="--", label=f"per-core ceiling {ceil / 1e6:.1f}M/s")
    ax1.set_xticks(list(x), ps)
    ax1.set_xlabel("count operator parallelism")
    ax1.set_ylabel("records/s")
    ax1.set_title(f"full speed, {results['config']['records']:,} records")
    for i, r in enumerate(full):
        ax1.annotate(f"{r['job_throughput'] / 1e3:,.0f}k\n({r['job_throughput'] / ceil:.1%})",
                     (i - w / 2, r["job_throughput"]), ha="center", va="bottom", fontsize=8)
    ax1.set_ylim(0, ceil * 1.1)
    ax1.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1e6:g}M"))
    ax1.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12))

    for r in results["half_load"]:
        rows = r["sink_timeline"]
        t = [row["t"] for row in rows]
        line, = ax2.plot(t, [row["p99_ms"] for row in rows], marker=".",
                         label=f"p={r['parallelism']} p99 ({r['rate']:,.0f}/s)")
        ax2.plot(t, [row["p50_ms"] for row in rows], ls="--", color=line.get_color(),
                 label=f"p={r['parallelism']} p50")
    ax2.axvspan(0, results["config"]["warmup_s"], color="0.9", label="warm-up (excluded)")
    ax2.set_yscale("log")
    ax2.set_xlabel("seconds since job started")
    ax2.set_ylabel("end-to-end latency per second, ms (log)")
    ax2.set_title("half load (50% of full-speed job throughput)")
    ax2.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    la = results["machine"]
    fig.suptitle(f"reflow keyed count, zipf {ZIPF_EXPONENT} over {NUM_KEYS:,} keys — "
                 f"{la['cpus']} CPUs, load avg {la['loadavg_at_start'][0]:.1f} at start, "
                 f"{la.get('loadavg_at_end', [0])[0]:.1f} at end")
    render.save_figure(fig, path)


# ------------------------------------------------------------------------------ main


def profile_only(args: argparse.Namespace, config: JobConfig, results: dict[str, Any]) -> int:
    p = args.parallelism[0]
    run.init_ray()
    try:
        print(f"p={p}: full speed, {args.records:,} records, profiled ...")
        full = run_full_speed(p, args, config, profile_it=True)
    finally:
        run.shutdown_ray()
    print(f"  job {full['job_throughput']:,.0f}/s over {full['job_span_s']:.2f} s (with py-spy "
          f"attached)")
    results["full_speed_profiled"] = {k: v for k, v in full.items() if k != "profiles"}
    results["profiles"] = full["profiles"]
    provenance.finish(results)
    with open(os.path.join(args.out, f"profile{'-gil' if args.profile_gil else ''}.json"),
              "w") as f:
        json.dump(results, f, indent=1, default=str)
    for label, prof in full["profiles"].items():
        print(f"\n{label}: {prof.get('total_samples')} thread samples, "
              f"{prof.get('busy_samples')} busy ({prof.get('busy_pct', 0):.0f}%); shares below "
              f"are of busy samples ({prof.get('file')})")
        for kind in ("categories", "self_by_line", "self_by_function", "inclusive_by_function"):
            print(f"  top {kind}:")
            for row in prof.get(kind, [])[:15]:
                print(f"    {row['pct']:5.1f}%  {row['frame']}")
    return 0


def parallelism_point(p: int, args: argparse.Namespace, config: JobConfig
                      ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Full speed ``--repeats`` times at count parallelism ``p`` (the median run stands for
    it), then half load at 50 % of its job throughput."""
    print(f"p={p}: full speed, {args.records:,} records ...")
    runs = []
    for i in range(args.repeats):
        runs.append(run_full_speed(p, args, config,
                                   profile_it=args.profile and p == args.parallelism[0] and i == 0))
        if args.repeats > 1:
            print(f"    run {i + 1}/{args.repeats}: job {runs[-1]['job_throughput']:,.0f}/s")
    full = sorted(runs, key=lambda r: r["job_throughput"])[(len(runs) - 1) // 2]
    full["runs"] = [{k: r[k] for k in ("job_throughput", "sink_throughput",
                                        "interior_seconds_throughput", "job_span_s",
                                        "sink_span_s", "cpu")} for r in runs]
    full["profiles"] = next((r["profiles"] for r in runs if r["profiles"]), {})
    print(f"  job {full['job_throughput']:,.0f}/s over {full['job_span_s']:.2f} s; "
          f"sink {fmt0(full['sink_throughput'])}/s over {fmt0(full['sink_span_s'], '.2f')} s; "
          f"interior seconds {fmt0(full['interior_seconds_throughput'])}/s")
    for label, prof in full["profiles"].items():
        print(f"  profile {label}: {prof.get('total_samples')} samples -> {prof.get('file')}")
    rate = 0.5 * full["job_throughput"]
    print(f"p={p}: half load, {rate:,.0f} records/s for {args.duration:g} s ...")
    half = run_half_load(p, rate, args, config)
    lat = half["latency_after_warmup"]
    print(f"  p50 {lat['p50_ms']:.1f} ms  p99 {lat['p99_ms']:.1f} ms  max {lat['max_ms']:.1f} ms; "
          f"RSS {fmt0(half['memory'].get('start_mb'))} -> "
          f"{fmt0(half['memory'].get('end_mb'))} MB")
    return full, half


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = cli.parser(__doc__, "steady")
    ap.add_argument("--parallelism", type=int, nargs="+", default=None,
                    help="count operator parallelisms (default 1 2 4; --quick: 1 2)")
    ap.add_argument("--source-parallelism", type=int, default=1)
    ap.add_argument("--records", type=int, help="full-speed records (2,000,000; quick 200,000)")
    ap.add_argument("--duration", type=float, help="half-load seconds (20; quick 8)")
    ap.add_argument("--warmup", type=float, default=3.0,
                    help="half-load seconds excluded from latency")
    ap.add_argument("--repeats", type=int, default=None,
                    help="full-speed runs per parallelism; the median (by job throughput) is "
                         "reported and drives the half-load rate (default 3; --quick: 1)")
    ap.add_argument("--poll", type=float, default=0.05,
                    help="full-speed job-status poll interval, s (asks only the JobMaster)")
    ap.add_argument("--timeout", type=float, default=300.0, help="per-run timeout, s")
    ap.add_argument("--batch-size", type=int, default=JobConfig().batch_size)
    ap.add_argument("--linger-ms", type=float, default=JobConfig().linger_ms)
    ap.add_argument("--profile", action="store_true",
                    help="py-spy the source and count task during the p=1 full-speed run")
    ap.add_argument("--profile-seconds", type=float, default=10.0)
    ap.add_argument("--profile-gil", action="store_true",
                    help="py-spy --gil: sample only the thread holding the GIL")
    ap.add_argument("--profile-only", action="store_true",
                    help="only the profiled full-speed run at the first parallelism; writes "
                         "profile.json (not results.json)")
    args = ap.parse_args(argv)
    cli.fill_defaults(args, TIMING)
    args.out = cli.out_dir(args, "steady")
    args.profile = args.profile or args.profile_only
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    config = JobConfig(batch_size=args.batch_size, linger_ms=args.linger_ms)
    results = provenance.begin(__file__, argv)
    results["machine"]["ray"] = run.ray_version()
    results.update({
        "config": {
            "parallelism": args.parallelism, "source_parallelism": args.source_parallelism,
            "records": args.records, "duration_s": args.duration, "warmup_s": args.warmup,
            "num_keys": NUM_KEYS, "skew": "zipf", "zipf_exponent": ZIPF_EXPONENT,
            "seed": jobs.SEED, "poll_interval_s": args.poll, "quick": args.quick,
            "repeats": args.repeats,
            "job_config": {k: getattr(config, k) for k in config.__dataclass_fields__},
            "pipeline": "GeneratorSource -> map (k,seq)->(k,1) [chained] -> key_by k -> "
                        "reduce (a,b)->(a0,a1+b1) -> LatencySink [chained]",
        },
        "definitions": {
            "job_throughput": "records / (job.run() returned -> first JobMaster status poll "
                              "seeing the job finished); includes end-of-stream drain, excludes "
                              "actor start-up",
            "sink_throughput": "records at the sink / (wall time of the first sink write() -> "
                               "the last sink write(), over all sink writers); exact to one batch",
            "interior_seconds_throughput": "records at the sink in the whole wall seconds strictly "
                                           "between the first and last second with records, per s",
            "half_load_rate": "50% of that parallelism's job_throughput, open loop",
            "latency": "sink arrival - scheduled emission time of each record (ms), merged "
                       "per-second sink histograms from ceil(start + warmup) on; within ~2%",
            "rss": "sum of RSS of the job's ALIVE actor processes (task actors + JobMaster), "
                   "every 1 s; start/end/max over samples where all were alive",
        },
    })
    if args.profile_only:
        return profile_only(args, config, results)
    print(f"ceiling: plain loop over {args.records:,} pre-generated records ...")
    results["ceiling"] = measure_ceiling(args.records)
    print(f"  {results['ceiling']['throughput']:,.0f} records/s")
    results["full_speed"], results["half_load"] = [], []
    run.init_ray()
    try:
        for p in args.parallelism:
            full, half = parallelism_point(p, args, config)
            results["full_speed"].append(full)
            results["half_load"].append(half)
    finally:
        run.shutdown_ray()
    provenance.finish(results)
    ceil = results["ceiling"]["throughput"]
    results["ratios"] = [{"parallelism": r["parallelism"],
                          "job_over_ceiling": r["job_throughput"] / ceil,
                          "sink_over_ceiling": (r["sink_throughput"] or 0) / ceil,
                          "interior_over_ceiling": (r["interior_seconds_throughput"] or 0) / ceil}
                         for r in results["full_speed"]]
    print_table(results)
    render.write_outputs(args.out, results, png="steady.png", plot=plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
