"""Live rescale of a keyed operator with large state: DRRS vs stop-restart, latency timeline.

    python examples/bench/rescale_drrs.py            # 20,000 keys x 10 KB (~200 MB), 8 -> 12
    python examples/bench/rescale_drrs.py --quick    # 2,000 keys x 10 KB (~20 MB), 2 -> 4

Job: GeneratorSource(open loop, ``--rate`` records/s, uniform over ``--keys`` keys, records
``(key, seq, state_bytes)``) -> key_by(key) -> ``PaddedCount`` (keyed process function: a
ValueState holding ``state_bytes`` bytes of padding per key plus a count; emits
``(key, count)``) -> LatencySink (chained into the aggregator tasks). 128 key groups.

For each protocol (drrs, stop-restart) a fresh job:

1. Build: run until the generator has emitted enough records to touch ``--coverage`` (99 %)
   of the keys (computed exactly from the generator's deterministic key sequence), at least
   ``--min-build`` s. One metrics call then reads the aggregator's state size.
2. Baseline: ``--baseline`` s (10) untouched; then the request wall time is noted and
   ``handle.rescale("agg", --to, protocol)`` is called (it blocks until the rescale is done).
3. After: keep running ``--after`` s (30) after ``rescale()`` returned (the rescale done), so
   every run observes the same post-rescale span; then ``handle.stop()``.

From the LatencySink per-second histograms (latency = sink arrival - scheduled emission
time, so queueing during a pause counts):

* no-rescale baseline: mean and p99 over the ``--baseline`` whole seconds before the request;
* scaling period: from the request second until latency stays within ``--tolerance`` (110 %)
  of the baseline mean for ``--stable`` (5) consecutive seconds, the window starting no
  earlier than the second the report says the rescale completed; capped at the end of run;
* peak (max per-second max and max per-second p99) and mean/p99 over the scaling period;
* from the RescaleReport: duration_s, bytes_moved, key_groups_moved, rerouted_records,
  suspended_s, propagation_delay_s, phases.

Writes ``examples/bench/out/rescale_drrs/results.json`` and ``rescale_drrs.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import ray  # noqa: E402

from engine import JobConfig, KeyedProcessFunction, StreamJob  # noqa: E402
from engine.latency import LatencyHistogram  # noqa: E402
from engine.sinks import LatencySink  # noqa: E402
from engine.sources import _GEN_CHUNK, GeneratorSource  # noqa: E402
from examples.bench import timeline as tl  # noqa: E402
from examples.bench.provenance import code_state  # noqa: E402

SEED = 0
NUM_KEY_GROUPS = 128
OUT_DIR = os.path.join(ROOT, "examples", "bench", "out", "rescale_drrs")
PROTOCOLS = ("drrs", "stop-restart")


# ------------------------------------------------------------------------------ the job


class PaddedCount(KeyedProcessFunction):
    """Per key: a count and ``state_bytes`` bytes of padding (made on the key's first record)."""

    def open(self, ctx: Any) -> None:
        self.pad = ctx.value_state("pad", None)
        self.n = ctx.value_state("n", 0)

    def process_element(self, value: Any, ctx: Any) -> Any:
        if self.pad.value() is None:
            self.pad.update(bytes(value[2]))
        n = self.n.value() + 1
        self.n.update(n)
        yield (ctx.key, n)


def key_of(record: Any) -> Any:
    return record[0]


def build(args: argparse.Namespace, sink: LatencySink, config: JobConfig) -> StreamJob:
    job = StreamJob("rescale-drrs", num_key_groups=NUM_KEY_GROUPS, parallelism=args.from_p,
                    config=config)
    src = GeneratorSource(rate=args.rate, num_keys=args.keys, skew="uniform",
                          state_bytes_per_key=args.state_bytes, seed=SEED)
    (
        job.source(src, name="gen", parallelism=1)
        .key_by(key_of)
        .process(PaddedCount(), name="agg", parallelism=args.from_p)
        .sink(sink, name="latency")
    )
    return job


def records_to_cover(num_keys: int, coverage: float, limit: int = 50_000_000) -> int:
    """Records the (single) generator task must emit until ``coverage`` of the keys appeared,
    replaying its key sequence exactly (uniform keys, chunks seeded by (seed, 0, chunk))."""
    import numpy as np

    want = int(np.ceil(coverage * num_keys))
    seen = np.zeros(num_keys, dtype=bool)
    distinct = 0
    chunk = 0
    while chunk * _GEN_CHUNK < limit:
        rng = np.random.default_rng([SEED, 0, chunk])
        keys = rng.integers(0, num_keys, size=_GEN_CHUNK, dtype=np.int64)
        # first occurrence of each key within this chunk that was not seen before
        uniq, first = np.unique(keys, return_index=True)
        new = ~seen[uniq]
        order = np.sort(first[new])
        if distinct + len(order) >= want:
            return chunk * _GEN_CHUNK + int(order[want - distinct - 1]) + 1
        distinct += len(order)
        seen[uniq] = True
        chunk += 1
    return limit


# ------------------------------------------------------------------------------ analysis


def per_second(sink: LatencySink) -> dict[int, LatencyHistogram]:
    """Wall second -> merged latency histogram (``LatencySink._load()``, as steady.py does)."""
    return sink._load()[1]


def merged(per_s: dict[int, LatencyHistogram], lo: int, hi: int) -> LatencyHistogram:
    """Merged histogram over wall seconds lo <= s < hi."""
    h = LatencyHistogram()
    for s, hs in per_s.items():
        if lo <= s < hi:
            h.merge(hs)
    return h


def lat(h: LatencyHistogram) -> dict[str, Any]:
    if h.count == 0:
        return {"count": 0, "mean_ms": None, "p50_ms": None, "p99_ms": None, "max_ms": None}
    return {"count": h.count, "mean_ms": h.mean, "p50_ms": h.quantile(0.5),
            "p99_ms": h.quantile(0.99), "max_ms": h.max}


def analyse(per_s: dict[int, LatencyHistogram], requested: float, completed: float,
            end_second: int, args: argparse.Namespace) -> dict[str, Any]:
    req_s = int(requested)  # the (partial) second the request fell in belongs to the period
    base = merged(per_s, req_s - int(args.baseline), req_s)
    base_mean = base.mean if base.count else None
    stable = int(args.stable)
    rows = {s: {"second": s, "count": h.count, "mean_ms": h.mean if h.count else None}
            for s, h in per_s.items()}
    # the window starts once the rescale has completed; capped at the end of the run
    p = tl.scaling_period(rows, req_s, int(completed), base_mean, end_second,
                          tolerance=args.tolerance, stable_s=stable)
    limit, end, stabilized = p.limit_ms, p.end, p.stabilized
    period = merged(per_s, req_s, end)
    secs = [per_s[s] for s in range(req_s, end) if s in per_s and per_s[s].count]
    return {
        "baseline": {**lat(base), "from_second": req_s - int(args.baseline), "to_second": req_s},
        "threshold_mean_ms": limit,
        "period": {"from_second": req_s, "to_second": end, "seconds": end - req_s,
                   "stabilized": stabilized, **lat(period)},
        "tail": {**lat(merged(per_s, end_second - stable, end_second)),
                 "from_second": end_second - stable, "to_second": end_second},
        "peak_max_ms": max((h.max for h in secs), default=None),
        "peak_p99_ms": max((h.quantile(0.99) for h in secs), default=None),
        "peak_second_mean_ms": max((h.mean for h in secs), default=None),
    }


# ------------------------------------------------------------------------------ one run


def run_protocol(protocol: str, args: argparse.Namespace, config: JobConfig,
                 build_records: int) -> dict[str, Any]:
    sink = LatencySink()
    job = build(args, sink, config)
    handle = job.run()
    wall_started = time.time()
    build_s = max(args.min_build, build_records / args.rate)
    metrics_before: dict[str, Any] = {}
    try:
        print(f"[{protocol}] build state: {build_s:.1f} s ({build_records:,} records for "
              f"{args.coverage:.0%} of {args.keys:,} keys) ...", flush=True)
        time.sleep(max(0.0, wall_started + build_s - time.time()))
        m = handle.metrics()
        aggs = [t for t in m.tasks if t.vertex == "agg"]
        metrics_before = {"agg_state_bytes": sum(t.state_bytes for t in aggs),
                          "agg_tasks": len(aggs),
                          "agg_key_groups": sum(t.key_groups for t in aggs),
                          "records_in_agg": sum(t.records_in for t in aggs)}
        print(f"[{protocol}] state {metrics_before['agg_state_bytes'] / 1e6:,.1f} MB over "
              f"{len(aggs)} tasks; baseline {args.baseline:g} s ...", flush=True)
        time.sleep(args.baseline)
        requested = time.time()
        report = handle.rescale("agg", args.to_p, protocol=protocol)
        returned = time.time()
        print(f"[{protocol}] rescale {args.from_p}->{args.to_p}: {report.duration_s:.2f} s, "
              f"{report.key_groups_moved} key groups, {report.bytes_moved / 1e6:,.1f} MB; "
              f"running {args.after:g} s more ...", flush=True)
        time.sleep(max(0.0, returned + args.after - time.time()))
        ended = time.time()
        st = handle.status()
        if st.state != "running":
            raise RuntimeError(f"[{protocol}] job is {st.state!r} after the rescale: {st.error}")
        m = handle.metrics()
        aggs = [t for t in m.tasks if t.vertex == "agg"]
        metrics_after = {"agg_state_bytes": sum(t.state_bytes for t in aggs),
                         "agg_tasks": len(aggs),
                         "agg_key_groups": sum(t.key_groups for t in aggs)}
    finally:
        handle.stop()
    per_s = per_second(sink)
    end_second = int(ended)  # last whole second observed is ended-1
    a = analyse(per_s, requested, report.completed_at, end_second, args)
    # every wall second from the first to the last with records; none arrived: count 0,
    # latencies None (a stop-restart pause shows as a gap in the latency lines)
    secs = sorted(s for s, h in per_s.items() if h.count)
    timeline = []
    for s in range(secs[0], secs[-1] + 1) if secs else ():
        h = per_s.get(s)
        if h is None or not h.count:
            timeline.append({"second": s, "t": s + 0.5 - requested, "count": 0, "mean_ms": None,
                             "p50_ms": None, "p99_ms": None, "max_ms": None})
        else:
            timeline.append({"second": s, "t": s + 0.5 - requested, "count": h.count,
                             "mean_ms": h.mean, "p50_ms": h.quantile(0.5),
                             "p99_ms": h.quantile(0.99), "max_ms": h.max})
    rep = {f: getattr(report, f) for f in report.__dataclass_fields__}
    rep["phases"] = [list(p) for p in report.phases]
    rep["subscales"] = [list(s) for s in report.subscales]
    rep["source_offsets"] = [list(s) for s in report.source_offsets]
    return {
        "protocol": protocol,
        "job_id": handle.job_id,
        "wall_started": wall_started,
        "build_s": build_s,
        "requested_at": requested,
        "rescale_call_returned_at": returned,
        "ended_at": ended,
        "report": rep,
        "metrics_before": metrics_before,
        "metrics_after": metrics_after,
        **a,
        "timeline": timeline,
        "loadavg_at_end": os.getloadavg(),
    }


# ------------------------------------------------------------------------------ output


def fmt(x: float | None, spec: str = ",.1f") -> str:
    return "-" if x is None else format(x, spec)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def summarise(results: dict[str, Any]) -> None:
    by = {r["protocol"]: r for r in results["runs"]}
    d, s = by.get("drrs"), by.get("stop-restart")
    if d and s:
        results["ratios"] = {
            "peak_max_drrs_over_stop_restart": ratio(d["peak_max_ms"], s["peak_max_ms"]),
            "peak_p99_drrs_over_stop_restart": ratio(d["peak_p99_ms"], s["peak_p99_ms"]),
            "period_mean_drrs_over_stop_restart": ratio(d["period"]["mean_ms"], s["period"]["mean_ms"]),
            "duration_drrs_over_stop_restart": ratio(d["report"]["duration_s"], s["report"]["duration_s"]),
        }
    for r in results["runs"]:
        r["period_mean_over_baseline_mean"] = ratio(r["period"]["mean_ms"], r["baseline"]["mean_ms"])


def print_table(results: dict[str, Any]) -> None:
    c = results["config"]
    print()
    print(f"rescale 'agg' {c['from']} -> {c['to']}, {c['keys']:,} keys x {c['state_bytes']:,} B, "
          f"{c['rate']:,.0f} records/s, {NUM_KEY_GROUPS} key groups")
    rows = [
        ("baseline mean ms", lambda r: fmt(r["baseline"]["mean_ms"])),
        ("baseline p99 ms", lambda r: fmt(r["baseline"]["p99_ms"])),
        ("peak ms (max)", lambda r: fmt(r["peak_max_ms"])),
        ("peak ms (per-second p99)", lambda r: fmt(r["peak_p99_ms"])),
        ("scaling-period mean ms", lambda r: fmt(r["period"]["mean_ms"])),
        ("scaling-period p99 ms", lambda r: fmt(r["period"]["p99_ms"])),
        ("scaling period s", lambda r: f"{r['period']['seconds']}"
                                       + ("" if r["period"]["stabilized"] else " (capped)")),
        ("last-5s mean ms (new level)", lambda r: fmt(r["tail"]["mean_ms"])),
        ("period mean / baseline mean", lambda r: fmt(r["period_mean_over_baseline_mean"], ".2f")),
        ("scaling duration s (report)", lambda r: fmt(r["report"]["duration_s"], ".2f")),
        ("state before MB (metrics)", lambda r: fmt(r["metrics_before"].get("agg_state_bytes", 0) / 1e6)),
        ("bytes moved MB", lambda r: fmt(r["report"]["bytes_moved"] / 1e6)),
        ("key groups moved", lambda r: str(r["report"]["key_groups_moved"])),
        ("rerouted records", lambda r: f"{r['report']['rerouted_records']:,}"),
        ("suspended s", lambda r: fmt(r["report"]["suspended_s"], ".3f")),
        ("propagation delay s", lambda r: fmt(r["report"]["propagation_delay_s"], ".3f")),
        ("subscales", lambda r: str(len(r["report"]["subscales"]))),
    ]
    runs = results["runs"]
    print(f"{'':30}" + "".join(f"{r['protocol']:>16}" for r in runs))
    for label, f in rows:
        print(f"{label:30}" + "".join(f"{f(r):>16}" for r in runs))
    ra = results.get("ratios")
    if ra:
        print(f"peak (max) drrs / stop-restart:         {fmt(ra['peak_max_drrs_over_stop_restart'], '.3f')}")
        print(f"peak (p99) drrs / stop-restart:         {fmt(ra['peak_p99_drrs_over_stop_restart'], '.3f')}")
        print(f"period mean drrs / stop-restart:        {fmt(ra['period_mean_drrs_over_stop_restart'], '.3f')}")
    d = next((r for r in runs if r["protocol"] == "drrs"), None)
    if d:
        print(f"drrs scaling-period mean / no-rescale mean: {fmt(d['period_mean_over_baseline_mean'], '.2f')}")
    for r in runs:
        ph = ", ".join(f"{n} {t:.2f}s" for n, t in r["report"]["phases"])
        if ph:
            print(f"{r['protocol']} phases: {ph}")
    print()


def plot(results: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    fig, axes = plt.subplots(2, 1, figsize=(12, 8), sharex=True,
                             gridspec_kw={"height_ratios": [3, 1]})
    ax, ax2 = axes
    colors = {"drrs": "tab:blue", "stop-restart": "tab:red"}
    for i, r in enumerate(runs):
        col = colors.get(r["protocol"])
        tl = r["timeline"]
        t = [row["t"] for row in tl]
        nan = float("nan")
        ax.plot(t, [nan if row["p99_ms"] is None else row["p99_ms"] for row in tl], color=col, marker=".", label=f"{r['protocol']} p99")
        ax.plot(t, [nan if row["mean_ms"] is None else row["mean_ms"] for row in tl], color=col, ls="--", label=f"{r['protocol']} mean")
        ax2.plot(t, [row["count"] for row in tl], color=col, marker=".", label=r["protocol"])
        done = r["report"]["completed_at"] - r["requested_at"]
        for a in (ax, ax2):
            a.axvline(done, color=col, ls=":", lw=1.5)
        p = r["period"]
        ax.axvspan(p["from_second"] - r["requested_at"], p["to_second"] - r["requested_at"],
                   color=col, alpha=0.08)
        ax.annotate(f"{r['protocol']} done\n{r['report']['duration_s']:.1f} s", (done, 0.97 - 0.08 * i),
                    xycoords=("data", "axes fraction"), fontsize=8, color=col, va="top")
        if r["baseline"]["mean_ms"]:
            ax.axhline(r["baseline"]["mean_ms"], color=col, lw=0.7, alpha=0.6)
    for a in (ax, ax2):
        a.axvline(0, color="k", lw=1.5)
    ax.annotate("request", (0, 0.02), xycoords=("data", "axes fraction"), fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("latency per wall second, ms (log)")
    ax.legend(fontsize=8, ncol=2)
    ax2.set_ylabel("records at sink / s")
    ax2.set_xlabel("seconds since the rescale request (dotted: completion; shaded: scaling period)")
    ax2.legend(fontsize=8)
    c = results["config"]
    fig.suptitle(f"reflow rescale 'agg' {c['from']}→{c['to']}: {c['keys']:,} keys × "
                 f"{c['state_bytes']:,} B, {c['rate']:,.0f} rec/s — {results['machine']['cpus']} CPUs, "
                 f"load {results['machine']['loadavg_at_start'][0]:.1f}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=None, help="records/s (default 5000; quick 2000)")
    ap.add_argument("--keys", type=int, default=None, help="keys (default 20000; quick 2000)")
    ap.add_argument("--state-bytes", type=int, default=10_000, help="padding bytes per key")
    ap.add_argument("--from", dest="from_p", type=int, default=None, help="start parallelism (8; quick 2)")
    ap.add_argument("--to", dest="to_p", type=int, default=None, help="target parallelism (12; quick 4)")
    ap.add_argument("--coverage", type=float, default=0.99, help="share of keys built before the baseline")
    ap.add_argument("--min-build", type=float, default=None, help="min build seconds (10; quick 4)")
    ap.add_argument("--baseline", type=float, default=None, help="baseline seconds before request (10; quick 5)")
    ap.add_argument("--after", type=float, default=None,
                    help="seconds to keep running after the rescale returned (30; quick 12)")
    ap.add_argument("--warm-standby", type=int, default=0,
                    help="JobConfig(warm_standby_tasks=n): idle task actors kept for scale-out")
    ap.add_argument("--stable", type=float, default=5, help="stability window, s")
    ap.add_argument("--tolerance", type=float, default=1.10, help="stable = mean <= this x baseline mean")
    ap.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=PROTOCOLS)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=OUT_DIR)
    args = ap.parse_args(argv)
    q = args.quick
    args.rate = args.rate or (2000.0 if q else 5000.0)
    args.keys = args.keys or (2_000 if q else 20_000)
    args.from_p = args.from_p or (2 if q else 8)
    args.to_p = args.to_p or (4 if q else 12)
    args.min_build = args.min_build if args.min_build is not None else (4.0 if q else 10.0)
    args.baseline = args.baseline or (5.0 if q else 10.0)
    args.after = args.after or (12.0 if q else 30.0)
    os.makedirs(args.out, exist_ok=True)
    config = JobConfig(warm_standby_tasks=args.warm_standby)

    build_records = records_to_cover(args.keys, args.coverage)
    results: dict[str, Any] = {
        "command": "python " + " ".join([os.path.relpath(os.path.abspath(__file__), ROOT)]
                                        + (sys.argv[1:] if argv is None else argv)),
        "config": {"rate": args.rate, "keys": args.keys, "state_bytes": args.state_bytes,
                   "expected_state_mb": args.keys * args.state_bytes / 1e6,
                   "from": args.from_p, "to": args.to_p, "num_key_groups": NUM_KEY_GROUPS,
                   "coverage": args.coverage, "build_records": build_records,
                   "min_build_s": args.min_build, "baseline_s": args.baseline,
                   "after_s": args.after, "stable_s": args.stable, "tolerance": args.tolerance,
                   "protocols": args.protocols, "quick": q, "seed": SEED,
                   "job_config": {k: getattr(config, k) for k in config.__dataclass_fields__},
                   "pipeline": "GeneratorSource(uniform, open loop) -> key_by -> PaddedCount "
                               "(ValueState pad bytes + count) -> LatencySink [chained]"},
        "definitions": {
            "latency": "sink arrival - scheduled emission time (ms), per wall second histograms",
            "baseline": "merged histogram of the `baseline_s` whole seconds before the request second",
            "scaling_period": "request second .. first second s >= max(request, completion) such "
                              "that seconds s..s+stable-1 all have mean <= tolerance x baseline "
                              "mean (exclusive end); capped at the end of the run",
            "tail": "merged histogram of the last `stable_s` whole seconds of the run (the "
                    "post-rescale level, to compare with the baseline)",
            "peak_max_ms": "max latency of any record arriving in the scaling period",
            "peak_p99_ms": "highest per-second p99 in the scaling period",
        },
        "code": code_state(ROOT, files_hash=True),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "ray": ray.__version__, "loadavg_at_start": os.getloadavg()},
        "runs": [],
    }
    t_all = time.monotonic()
    ray.init(namespace="reflow", log_to_driver=True, configure_logging=False)
    try:
        for protocol in args.protocols:
            results["runs"].append(run_protocol(protocol, args, config, build_records))
    finally:
        ray.shutdown()
    results["total_seconds"] = time.monotonic() - t_all
    results["code_at_end"] = code_state(ROOT, files_hash=True)
    if results["code_at_end"]["engine_sha256"] != results["code"]["engine_sha256"]:
        print("WARNING: engine/ or migration/ changed during the run; figures mix versions")
    results["machine"]["loadavg_at_end"] = os.getloadavg()
    summarise(results)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    plot(results, os.path.join(args.out, "rescale_drrs.png"))
    print_table(results)
    print(f"total {results['total_seconds']:.0f} s; wrote {os.path.relpath(args.out, ROOT)}/results.json "
          f"and rescale_drrs.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
