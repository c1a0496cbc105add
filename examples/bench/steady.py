"""Steady-state benchmark of the keyed running count: throughput, CPU per record, latency at
half load, memory; the per-record and the columnar data path, and Bytewax beside them.

    python examples/bench/steady.py             # parallelism 1 2 4, 3 alternated repeats
    python examples/bench/steady.py --quick     # smoke run: parallelism 1 2, one repeat
    python examples/bench/steady.py --variants rows --parallelism 1 --state-backend rocksdb
        # the same job with its state in RocksDB (one backend per invocation)

Variants (``--variants``, alternated within each repeat so that load drift hits all alike):

* ``rows``: GeneratorSource(100,000 keys, Zipf 1.2) -> map (key, seq) -> (key, 1) (chained
  into the source task) -> key_by(key) -> reduce summing the counts (emits every update,
  like Flink's reduce) -> LatencySink (chained into the count tasks); ``--records``.
* ``columnar``: the same keys from ``GeneratorSource(columnar=True)`` (column batches) ->
  ``key_by("key")`` -> ``aggregate(Count())`` (vectorised, every update emitted) ->
  LatencySink; ``--columnar-records``, batches and frames of ``--columnar-batch-size``
  (16,384) rows.
* ``bytewax`` (parallelism 1 only; ``--no-bytewax`` leaves it out; skipped with a message
  when Bytewax is not installed): the same keys pre-generated in memory through Bytewax's
  ``key_on -> stateful_map`` running count on one worker, in a child process
  (``harness/bytewax_count.py``).

Per run, at full speed:
  * throughput, first in to last out = records / (the earliest record timestamp at the sink,
    which at full speed is when the source read it, -> the sink's last write);
  * job throughput = records / (``job.run()`` returned -> the first status poll that sees the
    job finished; excludes actor start-up, includes the end-of-stream drain);
  * records per CPU-second = sink records over the whole wall seconds inside the sampled
    span / CPU seconds the job's actor processes used meanwhile (read from /proc every
    0.25 s; ``harness.analysis.records_per_cpu_second``), and the cores they used;
  * the load average at the run's end.
Per parallelism and variant the medians of ``--repeats`` runs with their range are reported.
Then half load: an open-loop source at 50 % of the variant's median first-in-last-out
throughput for ``--duration`` s; latency = sink arrival time - scheduled emission time (so
queueing counts), percentiles from every second at least ``--warmup`` s after ``run()``
returned; RSS of the job's actor processes every second.

Also the per-core ceiling: a plain Python loop over the same records (pre-generated list)
doing ``counts[k] = counts.get(k, 0) + 1`` and appending every update to a list; its
records/s are also its records per CPU-second (one process, one core). And the rows job's
floor: the rows job's own work in one process with no engine (the source reader's batches,
``to_pair``, ``key_of``, the cached key group, ``add_counts`` on per-group dicts, every update
appended), the least CPU per record any engine running this job in CPython would spend;
``rows / floor`` in records per CPU-second is the share of the job's CPU that is its own
work, the rest is the engine's (frames, the second process, flow control, the sink).

``--inproc``: no Ray; the rows job's real task cores (operator chain, router, frame codec,
input channels, latency sink) driven in this process as their actors drive them
(``harness/inproc.py``): CPU µs per record of the source and of the count tasks at each
``--parallelism``, without the actors' shell (event loop, sockets, acknowledgements) and
without the machine's load in the figures (CPU time of each task's calls); ``--profile``
adds a cProfile. Writes ``inproc.json``.

``--trace``: the half-load runs also gather per-second stall evidence
(``harness/stalls.py``): inside the task workers every collection, task step, metrics
answer and sink save of at least 2 ms (wall and the thread's CPU ms) and a watchdog's late
wake-ups; from ``/proc``, each job process's CPU and run-queue wait per second; the worst
seconds are printed with what happened in them. ``--half-rate R`` runs only half-load
runs at R records/s (``--half-repeats`` rounds; writes ``half-load.json``).

Writes ``examples/bench/out/steady/results.json`` and ``steady.png``.
"""

# ruff: noqa: E402  (the repository root goes on sys.path before reflow's imports)
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from engine import Count, GeneratorSource, JobConfig, LatencySink, Sink, StreamJob
from engine.dataflow.keygroups import DEFAULT_NUM_KEY_GROUPS, KeyGroupCache
from engine.names import JobState
from engine.time import SystemClock
from engine.wire.messages import Frame, decode_frame, encode_frame
from examples.bench.harness import (
    BenchRunError,
    cli,
    jobs,
    procs,
    profile,
    provenance,
    render,
    run,
    stalls,
)
from examples.bench.harness import analysis as an

NUM_KEYS = 100_000
ZIPF_EXPONENT = 1.2
TIMING = {"parallelism": ([1, 2, 4], [1, 2]), "records": (2_000_000, 200_000),
          "columnar_records": (20_000_000, 2_000_000), "duration": (20.0, 8.0),
          "repeats": (3, 1)}
VARIANTS = ("rows", "columnar", "bytewax")


def fmt0(x: float | None, spec: str = ",.0f") -> str:
    return render.fmt(x, spec)


# ------------------------------------------------------------------------------ the job


def to_pair(record: Any) -> tuple[Any, int]:
    return (record[0], 1)


def add_counts(a: Any, b: Any) -> tuple[Any, int]:
    return (a[0], a[1] + b[1])


def source_kwargs(rate: float | None, num_records: int | None, duration_s: float | None,
                  columnar: bool = False) -> dict[str, Any]:
    """The benchmark's ``GeneratorSource`` arguments."""
    return {"rate": rate, "num_records": num_records, "duration_s": duration_s,
            "num_keys": NUM_KEYS, "skew": "zipf", "zipf_exponent": ZIPF_EXPONENT,
            "seed": jobs.SEED, "columnar": columnar}


def source(rate: float | None, num_records: int | None, duration_s: float | None,
           columnar: bool = False) -> GeneratorSource:
    return GeneratorSource(**source_kwargs(rate, num_records, duration_s, columnar))


def build(parallelism: int, source_parallelism: int, src: GeneratorSource, sink: Sink,
          config: JobConfig) -> StreamJob:
    job = StreamJob("steady", parallelism=parallelism, config=config)
    gen = job.source(src, name="gen", parallelism=source_parallelism)
    if src.columnar:
        out = gen.key_by("key").aggregate(Count(), name="count", parallelism=parallelism)
    else:
        out = (gen.map(to_pair, name="pair").key_by(jobs.key_of)
               .reduce(add_counts, name="count", parallelism=parallelism))
    out.sink(sink, name="latency")
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


def _label(actor: str) -> str:
    """A job actor's short label: ``source0``, ``count1``, ``master``."""
    parts = actor.split("/")
    if len(parts) >= 3 and parts[1] in ("gen", "count"):
        return ("source" if parts[1] == "gen" else "count") + parts[2]
    return "master" if "master" in actor.lower() else parts[-1]


def _sampled(p: int, args: argparse.Namespace, src: GeneratorSource, sink: Sink,
             config: JobConfig, profile_it: bool, trace: bool = False) -> dict[str, Any]:
    """Run the job to its end while sampling its processes (and py-spying its first source
    and count task when ``profile_it``; with ``trace``, their scheduler statistics every
    0.25 s, ``stalls.SchedSampler``): deploy time, span, state, pids, sampler, profiles,
    wall start, sched samples."""
    t0 = time.monotonic()
    handle = build(p, args.source_parallelism, src, sink, config).run()
    t_started = time.monotonic()
    wall_started = time.time()
    profiles: dict[str, Any] = {}
    try:
        pids = procs.wait_for_pids(handle.job_id, args.source_parallelism + p + 1)
        sampler = procs.RssSampler(pids, t_started, interval=0.25 if src.rate is None else 1.0)
        sampler.start()
        sched = None
        if trace:
            sched = stalls.SchedSampler({_label(n): pid for n, pid in pids.items()})
            sched.start()
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
        sched_samples = sched.stop() if sched is not None else None
        if state != JobState.FINISHED or span is None:
            raise BenchRunError(f"run p={p} ended in state {state!r}; see the task logs above, "
                                f"or raise --timeout ({args.timeout:g} s)")
        profiles = profile.collect_profiles(recorders, args.profile_seconds)
    finally:
        handle.stop()
    return {"deploy_s": t_started - t0, "span": span, "pids": pids, "sampler": sampler,
            "profiles": profiles, "wall_started": wall_started, "sched": sched_samples}


def _timeline(sink: LatencySink, wall_started: float) -> list[dict[str, Any]]:
    """The sink's per-second rows, each with ``t``: the middle of that wall second since the
    job started."""
    return [{**row, "t": row["second"] + 0.5 - wall_started} for row in sink.timeline()]


def run_full_speed(p: int, variant: str, args: argparse.Namespace, config: JobConfig,
                   profile_it: bool) -> dict[str, Any]:
    if variant == "bytewax":
        return run_bytewax(args)
    columnar = variant == "columnar"
    records = args.columnar_records if columnar else args.records
    if columnar:
        config = columnar_config(config, args)
    sink = jobs.WriteLogLatencySink()
    s = _sampled(p, args, source(None, records, None, columnar), sink, config, profile_it)
    n_sink = sink.summary()["count"]
    span = sink.span()
    timeline = _timeline(sink, s["wall_started"])
    steady, steady_seconds = interior_rate(timeline)
    sink_span = (span["last"] - span["first"]) if span else None
    in_out = (span["last"] - span["first_record_ts"]) if span and span["first_record_ts"] else None
    per_cpu = an.records_per_cpu_second(timeline, s["sampler"].cpu_samples)
    return {
        "variant": variant,
        "parallelism": p,
        "records": records,
        "records_at_sink": n_sink,
        "deploy_s": s["deploy_s"],
        "job_span_s": s["span"],
        "job_throughput": records / s["span"],
        "in_out_span_s": in_out,
        "in_out_throughput": (n_sink / in_out) if in_out else None,
        "sink_first_s": span["first"] - s["wall_started"] if span else None,
        "sink_last_s": span["last"] - s["wall_started"] if span else None,
        "sink_span_s": sink_span,
        "sink_throughput": (n_sink / sink_span) if sink_span else None,
        "interior_seconds_throughput": steady,
        "interior_seconds": steady_seconds,
        "per_cpu": per_cpu,
        "records_per_cpu_s": per_cpu and per_cpu["records_per_cpu_s"],
        "status_poll_interval_s": args.poll,
        "sink_timeline": timeline,
        "memory": procs.memory_summary(s["sampler"].samples, len(s["pids"])),
        "cpu": s["sampler"].cpu(),
        "loadavg_at_end": os.getloadavg(),
        "actors": s["pids"],
        "profiles": s["profiles"],
    }


def columnar_config(config: JobConfig, args: argparse.Namespace) -> JobConfig:
    """``config`` with the columnar runs' larger batches."""
    return dataclasses.replace(config, batch_size=args.columnar_batch_size,
                               source_poll_records=args.columnar_batch_size)


def run_bytewax(args: argparse.Namespace) -> dict[str, Any]:
    """Bytewax's running count in a child process (see the module doc)."""
    import subprocess

    from examples.bench.harness import ROOT as REPO

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    cmd = [sys.executable, "-m", "examples.bench.harness.bytewax_count", str(args.records),
           str(NUM_KEYS), str(ZIPF_EXPONENT)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=args.timeout, check=False)
    if done.returncode != 0:
        raise BenchRunError(f"the Bytewax run failed: {done.stderr[-800:]}")
    r = json.loads(done.stdout.strip().splitlines()[-1])
    return {"variant": "bytewax", "parallelism": 1, "records": r["records"],
            "records_at_sink": r["records_out"], "in_out_span_s": r["wall_s"],
            "in_out_throughput": r["records_per_s"], "job_throughput": r["records_per_s"],
            "records_per_cpu_s": r["records_per_cpu_s"],
            "per_cpu": {"records": r["records"], "cpu_s": r["cpu_s"], "wall_s": r["wall_s"],
                        "records_per_cpu_s": r["records_per_cpu_s"],
                        "cores": r["cpu_s"] / r["wall_s"]},
            "loadavg_at_end": os.getloadavg(), "command": " ".join(cmd)}


def run_half_load(p: int, variant: str, rate: float, args: argparse.Namespace,
                  config: JobConfig) -> dict[str, Any]:
    """One open-loop run at ``rate``; with ``args.trace``, the per-second stall evidence
    (``harness.stalls``) beside the latency."""
    columnar = variant == "columnar"
    trace_dir = tempfile.mkdtemp(prefix="reflow-steady-trace-") if args.trace else None
    if trace_dir is None:
        sink = LatencySink()  # the plain one: what a user measures latency with
        src = source(rate, None, args.duration, columnar)
    else:
        sink = stalls.TracedLatencySink(trace_dir)
        src = stalls.TracedGeneratorSource(trace_dir, **source_kwargs(
            rate, None, args.duration, columnar))
    if columnar:
        config = columnar_config(config, args)
    s = _sampled(p, args, src, sink, config, False, trace=trace_dir is not None)
    warm_second = math.ceil(s["wall_started"] + args.warmup)
    h = an.merged(jobs.latency_seconds(sink), warm_second)
    trace = None
    if trace_dir is not None:
        rows = stalls.per_second(sink.timeline(), s["sched"] or [],
                                 stalls.read_probes(trace_dir))
        rows = [r for r in rows if r["second"] >= warm_second]
        trace = {"per_second": rows, "worst": stalls.worst(rows), "dir": trace_dir}
    return {
        "trace": trace,
        "variant": variant,
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


def _polls(records: int, poll_records: int) -> Any:
    """The rows job's source batches: the same reader, the same records."""
    reader = source(None, records, None).open_partition("0-of-1", None, SystemClock())
    while (b := reader.poll(poll_records)) is not None:
        yield b.values


_STAMP_MS = 1_764_000_000_000  # a record time of 2025: as many bytes as the job's


def _floor_pass(batches: Any, num_key_groups: int,
                frames: list[Frame] | None = None) -> tuple[float, dict[Any, Any]]:
    """One pass of the rows job's own work over ``batches`` (an iterable of record lists),
    no engine: its CPU seconds and final counts. With ``frames`` (a list), each batch's
    frame as the source task would send it is appended (outside the timing)."""
    cache = KeyGroupCache(num_key_groups)
    tables: list[dict[Any, Any]] = [{} for _ in range(num_key_groups)]
    key_of = jobs.key_of
    t = time.process_time()
    for values in batches:
        pairs = list(map(to_pair, values))
        keys = list(map(key_of, pairs))
        kgs = cache.key_groups(keys)
        out = []
        for k, kg, v in zip(keys, kgs, pairs):  # noqa: B905
            table = tables[kg]
            cur = table.get(k)
            new = v if cur is None else add_counts(cur, v)
            table[k] = new
            out.append(new)
        if frames is not None:
            paused = time.process_time()
            frames.append(Frame(pairs, [_STAMP_MS] * len(pairs), keys, kgs))
            t += time.process_time() - paused
    seconds = time.process_time() - t
    return seconds, {k: v[1] for table in tables for k, v in table.items()}


def measure_floor(records: int, poll_records: int, num_key_groups: int,
                  repeats: int = 3) -> dict[str, Any]:
    """The least CPU the rows job's own work takes in one process with no engine: the same
    source reader's batches, ``to_pair``, ``key_of``, the key group (cached), ``add_counts``
    on per-group dicts, every update appended; no frames, no second process, no sink, no
    metrics. Best of ``repeats``; its records/s are records per CPU-second. Also the same
    over the batches pre-generated (as the ceiling's input is: ``pregenerated``), and the
    CPU of encoding and decoding the frames the source task would send (``frame_codec``:
    the least the second process costs)."""
    passes = [_floor_pass(_polls(records, poll_records), num_key_groups)
              for _ in range(repeats)]
    times = [seconds for seconds, _ in passes]
    counts = passes[-1][1]
    batches = list(_polls(records, poll_records))
    frames: list[Frame] = []
    pre = [_floor_pass(batches, num_key_groups, frames if i == 0 else None)[0]
           for i in range(repeats)]
    codec = []
    for _ in range(repeats):
        t = time.process_time()
        for f in frames:
            decode_frame(encode_frame(f))
        codec.append(time.process_time() - t)
    size = sum(len(encode_frame(f)) for f in frames)
    return {"records": sum(counts.values()), "distinct_keys": len(counts), "seconds": times,
            "throughput": records / min(times), "best_of": repeats,
            "pregenerated": {"seconds": pre, "throughput": records / min(pre)},
            "frame_codec": {"seconds": codec, "us_per_record": min(codec) / records * 1e6,
                            "bytes_per_record": size / records},
            "work": "GeneratorSource.poll -> map(to_pair) -> map(key_of) -> key group "
                    "(KeyGroupCache) -> per-group dict: add_counts -> list.append"}


def measure_ceiling(records: int, repeats: int = 3) -> dict[str, Any]:
    """Single-process loop over the same records; best of ``repeats``."""
    data: list[Any] = [v for values in _polls(records, 65536) for v in values]
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

FIGURES = ("in_out_throughput", "job_throughput", "records_per_cpu_s")


def summarise(results: dict[str, Any]) -> None:
    """Per (parallelism, variant): medians and ranges of the full-speed figures; the ratios
    the issue's targets name, from the medians of this one run."""
    rows: dict[str, dict[str, Any]] = {}
    for r in results["full_speed"]:
        key = f"{r['variant']} p={r['parallelism']}"
        rows.setdefault(key, {"variant": r["variant"], "parallelism": r["parallelism"],
                              "runs": 0, **{f: [] for f in FIGURES}})
        rows[key]["runs"] += 1
        for f in FIGURES:
            rows[key][f].append(r.get(f))
    for row in rows.values():
        for f in FIGURES:
            row[f] = an.spread(row[f])
    results["medians"] = rows
    ceil = results["ceiling"]["throughput"]

    def med(variant: str, p: int, f: str) -> float | None:
        row = rows.get(f"{variant} p={p}")
        return None if row is None else row[f]["median"]

    ratios: dict[str, Any] = {}
    for p in results["config"]["parallelism"]:
        for v in ("rows", "columnar"):
            ratios[f"{v} p={p} throughput / ceiling"] = an.ratio(
                med(v, p, "in_out_throughput"), ceil)
            ratios[f"{v} p={p} records per CPU-second / ceiling"] = an.ratio(
                med(v, p, "records_per_cpu_s"), ceil)
        ratios[f"columnar / rows p={p} throughput"] = an.ratio(
            med("columnar", p, "in_out_throughput"), med("rows", p, "in_out_throughput"))
    floor = results.get("floor", {}).get("throughput")
    if floor:
        ratios["rows floor / ceiling"] = an.ratio(floor, ceil)
        ratios["rows floor, pre-generated input / ceiling"] = an.ratio(
            results["floor"]["pregenerated"]["throughput"], ceil)
        for p in results["config"]["parallelism"]:
            ratios[f"rows p={p} records per CPU-second / floor"] = an.ratio(
                med("rows", p, "records_per_cpu_s"), floor)
    for v in ("rows", "columnar"):
        for f, name in (("in_out_throughput", "throughput"),
                        ("records_per_cpu_s", "records per CPU-second")):
            ratios[f"{v} p=1 / bytewax {name}"] = an.ratio(med(v, 1, f), med("bytewax", 1, f))
    for h in results["half_load"]:
        ratios[f"{h['variant']} p={h['parallelism']} half-load p99 ms"] = (
            h["latency_after_warmup"]["p99_ms"])
    results["ratios"] = ratios


def _cell(sp: dict[str, Any], spec: str = ",.0f") -> str:
    if sp["median"] is None:
        return "-"
    if sp["n"] == 1:
        return fmt0(sp["median"], spec)
    return f"{fmt0(sp['median'], spec)} ({fmt0(sp['min'], spec)}-{fmt0(sp['max'], spec)})"


def print_table(results: dict[str, Any]) -> None:
    ceil = results["ceiling"]["throughput"]
    warmup = results["config"]["warmup_s"]
    print(f"\nper-core ceiling (plain Python loop, same {results['ceiling']['records']:,} "
          f"records): {ceil:,.0f} records/s (= records per CPU-second)")
    fl = results.get("floor")
    if fl:
        pre = fl["pregenerated"]["throughput"]
        print(f"rows job's floor (its own work in one process, no engine): "
              f"{fl['throughput']:,.0f} records per CPU-second ({fl['throughput'] / ceil:.3f} "
              f"of the ceiling); over pre-generated batches {pre:,.0f} ({pre / ceil:.3f}); "
              f"its frames' encode + decode {fl['frame_codec']['us_per_record']:.3f} us per "
              f"record ({fl['frame_codec']['bytes_per_record']:.1f} bytes)")
    print()
    print(f"full speed: medians of {results['config']['repeats']} alternated runs (range)")
    _print_rows(
        [("run", 13), ("first in -> last out /s", 30), ("job /s", 28),
         ("per CPU-second", 28), ("/ceil", 6)],
        [[k, _cell(r["in_out_throughput"]), _cell(r["job_throughput"]),
          _cell(r["records_per_cpu_s"]),
          fmt0(an.ratio(r["in_out_throughput"]["median"], ceil), ".3f")]
         for k, r in results["medians"].items()])
    for k, reason in results.get("skipped", {}).items():
        print(f"  {k}: skipped ({reason})")
    print(f"\nhalf load (open loop, 50% of the median throughput; latency excludes the first "
          f"{warmup:g} s)")
    rows = []
    for r in results["half_load"]:
        lat, mem = r["latency_after_warmup"], r["memory"]
        rows.append([r["variant"], str(r["parallelism"]), f"{r['rate']:,.0f}",
                     f"{r['records_at_sink']:,}",
                     *(f"{lat[k]:.1f}" for k in ("p50_ms", "p99_ms", "p999_ms", "max_ms")),
                     *(fmt0(mem.get(k), ".1f") for k in ("start_mb", "end_mb", "max_mb")),
                     _cores(r)])
    _print_rows([("variant", 9), ("p", 3), ("rate/s", 11), ("at sink", 11), ("p50 ms", 8),
                 ("p99 ms", 8), ("p999 ms", 8), ("max ms", 8), ("RSS start", 10),
                 ("RSS end", 8), ("RSS max", 8), ("cores job/other", 16)], rows)
    print("RSS: MB summed over the job's actor processes, sampled every 1 s; cores job/other: "
          "average CPU cores used by the job's actor processes / by everything else")
    print("\nratios (this run's medians):")
    for k, v in results["ratios"].items():
        print(f"  {k}: {fmt0(v, ',.3f')}")
    la = results["machine"]
    print(f"load average {la['loadavg_at_start'][0]:.1f} at start, "
          f"{la.get('loadavg_at_end', [0])[0]:.1f} at end\n")


def _actor_cores(r: dict[str, Any]) -> str:
    """Cores each of a run's actors used (``source0 0.95 count0 0.71 ...``), other: the
    rest of the machine."""
    c = r.get("cpu") or {}
    per = sorted((_label(n), v) for n, v in (c.get("per_actor_cores") or {}).items())
    if not per:
        return "-"
    return " ".join(f"{n} {v:.2f}" for n, v in per) + f" other {c['other_cores']:.2f}"


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


def plot(results: dict[str, Any], path: str) -> None:
    from matplotlib.ticker import FuncFormatter

    plt = render.pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 6))
    meds = list(results["medians"].values())
    x = range(len(meds))
    for f, off, label in (("in_out_throughput", -0.2, "records/s, first in -> last out"),
                          ("records_per_cpu_s", 0.2, "records per CPU-second")):
        vals = [m[f]["median"] or 0 for m in meds]
        lo = [(m[f]["median"] or 0) - (m[f]["min"] or 0) for m in meds]
        hi = [(m[f]["max"] or 0) - (m[f]["median"] or 0) for m in meds]
        ax1.bar([i + off for i in x], vals, 0.4, yerr=[lo, hi], capsize=3, label=label)
    ceil = results["ceiling"]["throughput"]
    ax1.axhline(ceil, color="k", ls="--", label=f"dict-loop ceiling {ceil / 1e6:.2f}M/s")
    if results.get("floor"):
        floor = results["floor"]["throughput"]
        ax1.axhline(floor, color="0.4", ls=":",
                    label=f"rows job's own work, no engine {floor / 1e6:.2f}M per CPU-s")
    ax1.set_xticks(list(x), [f"{m['variant']}\np={m['parallelism']}" for m in meds])
    ax1.set_yscale("log")
    ax1.set_ylabel("records/s (log)")
    ax1.set_title(f"full speed, medians of {results['config']['repeats']} alternated runs "
                  "(bars: range)")
    ax1.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1e6:g}M"))
    ax1.legend(fontsize=8)
    for r in results["half_load"]:
        rows = r["sink_timeline"]
        t = [row["t"] for row in rows]
        ax2.plot(t, [row["p99_ms"] for row in rows], marker=".",
                 label=f"{r['variant']} p={r['parallelism']} p99 ({r['rate']:,.0f}/s)")
    ax2.axvspan(0, results["config"]["warmup_s"], color="0.9", label="warm-up (excluded)")
    ax2.axhline(50, color="k", ls=":", lw=1, label="50 ms")
    ax2.set_yscale("log")
    ax2.set_xlabel("seconds since job started")
    ax2.set_ylabel("p99 end-to-end latency per second, ms (log)")
    ax2.set_title("half load (50% of the median full-speed throughput)")
    ax2.legend(fontsize=7, ncol=2)
    fig.suptitle(f"reflow keyed running count, zipf {ZIPF_EXPONENT} over {NUM_KEYS:,} keys — "
                 f"{render.load_title(results)}")
    render.save_figure(fig, path)


# ------------------------------------------------------------------------------ main


def profile_only(args: argparse.Namespace, config: JobConfig, results: dict[str, Any]) -> int:
    p = args.parallelism[0]
    variant = args.variants[0] if args.variants and args.variants[0] != "bytewax" else "rows"
    records = args.columnar_records if variant == "columnar" else args.records
    run.init_ray()
    try:
        print(f"p={p}: full speed, {variant}, {records:,} records, profiled ...")
        full = run_full_speed(p, variant, args, config, profile_it=True)
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


def inproc_only(args: argparse.Namespace, config: JobConfig, results: dict[str, Any]) -> int:
    """``--inproc``: the rows job's real task cores driven in this process, no Ray
    (``harness/inproc.py``), ``--repeats`` rounds of each parallelism alternated: CPU µs
    per record of the source and the count tasks, records per CPU-second and its share of
    the floor (measured first); ``--profile``: one cProfile per parallelism after them.
    Writes ``inproc.json``."""
    from examples.bench.harness import inproc

    fl = results["floor"] = measure_floor(args.records, config.source_poll_records,
                                          DEFAULT_NUM_KEY_GROUPS)
    floor = fl["throughput"]
    print(f"floor: {floor:,.0f} records per CPU-second ({1e6 / floor:.3f} us per record)")
    results["inproc"] = []
    for rep in range(args.repeats):
        for p in args.parallelism:
            r = inproc.run(p, args.records, config=config)
            r["round"] = rep + 1
            results["inproc"].append(r)
            print(f"  round {rep + 1} p={p}: {r['total_us']:.3f} us per record (source "
                  f"{r['source_us']:.3f}, count tasks {r['count_us']:.3f}), "
                  f"{r['records_per_cpu_s']:,.0f} per CPU-second = "
                  f"{r['records_per_cpu_s'] / floor:.3f} of the floor, {r['frames']} frames",
                  flush=True)
    if args.profile:
        for p in args.parallelism:
            r = inproc.run(p, args.records, profile=True, config=config)
            results.setdefault("inproc_profiles", {})[str(p)] = r.pop("profile")
            print(f"--- cProfile p={p} (both tasks in one process)\n"
                  f"{results['inproc_profiles'][str(p)]}")
    provenance.finish(results)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "inproc.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(f"wrote {path}")
    return 0


def print_trace(half: dict[str, Any]) -> None:
    """The worst seconds of a traced half-load run, with what happened in them."""
    trace = half.get("trace")
    if not trace:
        return
    print("    worst seconds (p99 ms; per process CPU/run-queue wait ms; the longest event "
          "of each kind, wall ms (its thread's CPU ms)):")
    for r in trace["worst"]:
        procs_ = sorted({k.split(".")[0] for k in r if k.endswith(".cpu_ms")})
        sched = " ".join(f"{n} {r[n + '.cpu_ms']:.0f}/{r.get(n + '.wait_ms', 0):.0f}"
                         for n in procs_)
        events = " ".join(
            f"{k[:-4]} {v:.0f}" + (f" ({r[k[:-4] + '_cpu_max']:.0f} cpu)"
                                   if k[:-4] + "_cpu_max" in r else "")
            for k, v in r.items() if k.endswith("_max") and not k.endswith("_cpu_max"))
        print(f"      {r['second'] % 1000:03d}: p99 {r['p99_ms']:.1f} max {r['max_ms']:.1f} "
              f"| {sched} other {r.get('other_ms', 0):.0f} | {events or '-'}")


def half_load_only(args: argparse.Namespace, config: JobConfig,
                   results: dict[str, Any]) -> int:
    """``--half-rate``: ``--half-repeats`` rounds of half-load runs at that rate, the
    variants and parallelisms alternated within each round; writes ``half-load.json``."""
    results["half_load"] = []
    run.init_ray()
    try:
        for rep in range(args.half_repeats):
            for p in args.parallelism:
                for v in args.variants:
                    if v == "bytewax":
                        continue
                    half = run_half_load(p, v, args.half_rate, args, config)
                    results["half_load"].append(half)
                    lat = half["latency_after_warmup"]
                    print(f"  round {rep + 1} {v} p={p} at {args.half_rate:,.0f}/s: p50 "
                          f"{lat['p50_ms']:.1f} ms  p99 {lat['p99_ms']:.1f} ms  max "
                          f"{lat['max_ms']:.1f} ms  cores job/other {_cores(half)}  load "
                          f"{half['loadavg_at_end'][0]:.1f}", flush=True)
                    print_trace(half)
    finally:
        run.shutdown_ray()
    provenance.finish(results)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "half-load.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1, default=str)
    la = results["machine"]
    print(f"load average {la['loadavg_at_start'][0]:.1f} at start, "
          f"{la.get('loadavg_at_end', [0])[0]:.1f} at end; wrote {path}")
    return 0


def full_speed_runs(args: argparse.Namespace, config: JobConfig,
                    results: dict[str, Any]) -> None:
    """Every (parallelism, variant) ``--repeats`` times, the variants alternated within
    each repeat (Bytewax at parallelism 1 only)."""
    for rep in range(args.repeats):
        for p in args.parallelism:
            for v in args.variants:
                if v == "bytewax" and (p != 1 or "bytewax" in results["skipped"]):
                    continue
                first = args.profile and p == args.parallelism[0] and rep == 0 and v == "rows"
                r = run_full_speed(p, v, args, config, profile_it=first)
                results["full_speed"].append(r)
                print(f"  repeat {rep + 1}/{args.repeats} {v} p={p}: "
                      f"{fmt0(r['in_out_throughput'])}/s first in -> last out, "
                      f"{fmt0(r['records_per_cpu_s'])} per CPU-second, cores "
                      f"{_actor_cores(r)}, load {r['loadavg_at_end'][0]:.1f}", flush=True)


def half_load_runs(args: argparse.Namespace, config: JobConfig,
                   results: dict[str, Any]) -> None:
    for p in args.parallelism:
        for v in args.variants:
            if v == "bytewax":
                continue
            row = results["medians"].get(f"{v} p={p}")
            if row is None or row["in_out_throughput"]["median"] is None:
                continue
            rate = 0.5 * row["in_out_throughput"]["median"]
            print(f"{v} p={p}: half load, {rate:,.0f} records/s for {args.duration:g} s ...",
                  flush=True)
            half = run_half_load(p, v, rate, args, config)
            results["half_load"].append(half)
            lat = half["latency_after_warmup"]
            print(f"  p50 {lat['p50_ms']:.1f} ms  p99 {lat['p99_ms']:.1f} ms  max "
                  f"{lat['max_ms']:.1f} ms", flush=True)
            print_trace(half)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = cli.parser(__doc__, "steady")
    ap.add_argument("--parallelism", type=int, nargs="+", default=None,
                    help="count operator parallelisms (default 1 2 4; --quick: 1 2)")
    ap.add_argument("--source-parallelism", type=int, default=1)
    ap.add_argument("--variants", default="rows,columnar,bytewax",
                    help="comma-separated, of rows, columnar, bytewax (default all)")
    ap.add_argument("--records", type=int,
                    help="full-speed records of rows and bytewax (2,000,000; quick 200,000)")
    ap.add_argument("--columnar-batch-size", type=int, default=16_384,
                    help="JobConfig batch_size and source_poll_records of the columnar runs "
                         "(16,384: a column batch's fixed costs need more than 1,000 rows)")
    ap.add_argument("--columnar-records", type=int,
                    help="full-speed records of columnar (20,000,000; quick 2,000,000): its "
                         "runs should last several seconds too")
    ap.add_argument("--duration", type=float, help="half-load seconds (20; quick 8)")
    ap.add_argument("--warmup", type=float, default=3.0,
                    help="half-load seconds excluded from latency")
    ap.add_argument("--repeats", type=int, default=None,
                    help="alternated full-speed runs per parallelism and variant; medians "
                         "are reported and drive the half-load rate (default 3; --quick: 1)")
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
                    help="only the profiled full-speed run at the first parallelism, of the "
                         "first of --variants (rows for bytewax); writes "
                         "profile.json (not results.json)")
    ap.add_argument("--trace", action="store_true",
                    help="half-load runs also gather per-second stall evidence: collections, "
                         "slow task steps, metrics answers and sink saves inside the task "
                         "workers, and each job process's CPU and run-queue wait "
                         "(harness/stalls.py); the worst seconds are printed")
    ap.add_argument("--half-rate", type=float,
                    help="only half-load runs, at this many records/s (no ceiling, floor or "
                         "full-speed runs); writes half-load.json")
    ap.add_argument("--inproc", action="store_true",
                    help="only the rows job's task cores driven in this process, no Ray "
                         "(harness/inproc.py): CPU per record of each task at each "
                         "--parallelism, --repeats rounds; with --profile a cProfile each; "
                         "writes inproc.json")
    ap.add_argument("--half-repeats", type=int, default=1,
                    help="with --half-rate: runs per variant and parallelism, alternated (1)")
    cli.add_state_backend(ap)
    args = ap.parse_args(argv)
    if args.state_backend == cli.BOTH or args.state_gb:
        ap.error("steady.py runs on one --state-backend (memory or rocksdb) per invocation "
                 "and takes no --state-gb (its state is the running count's)")
    cli.fill_defaults(args, TIMING)
    args.out = cli.out_dir(args, "steady")
    args.profile = args.profile or args.profile_only
    args.variants = cli.comma_list(args.variants)
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad or not args.variants:
        ap.error(f"--variants takes {', '.join(VARIANTS)}; got {args.variants}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    config = JobConfig(batch_size=args.batch_size, linger_ms=args.linger_ms,
                       **cli.state_fields(args, args.state_backend))
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
            "variants": args.variants, "columnar_records": args.columnar_records,
            "pipeline": {"rows": "GeneratorSource -> map (k,seq)->(k,1) [chained] -> key_by "
                                 "k -> reduce (a,b)->(a0,a1+b1) -> LatencySink [chained]",
                         "columnar": "GeneratorSource(columnar=True) -> key_by('key') -> "
                                     "aggregate(Count()) -> LatencySink [chained]",
                         "bytewax": "pre-generated list -> key_on -> stateful_map count -> "
                                    "counting sink, one worker"},
        },
        "definitions": {
            "in_out_throughput": "records at the sink / (earliest record timestamp at the sink "
                                 "(its source read time at full speed) -> the last sink write)",
            "records_per_cpu_s": "sink records in the whole wall seconds inside the CPU-sampled "
                                 "span / CPU seconds of the job's actor processes in them "
                                 "(bytewax: records / CPU seconds of its process)",
            "job_throughput": "records / (job.run() returned -> first JobMaster status poll "
                              "seeing the job finished); includes end-of-stream drain, excludes "
                              "actor start-up",
            "sink_throughput": "records at the sink / (wall time of the first sink write() -> "
                               "the last sink write(), over all sink writers); exact to one batch",
            "interior_seconds_throughput": "records at the sink in the whole wall seconds strictly "
                                           "between the first and last second with records, per s",
            "half_load_rate": "50% of the variant's median in_out_throughput at that parallelism, open loop",
            "latency": "sink arrival - scheduled emission time of each record (ms), merged "
                       "per-second sink histograms from ceil(start + warmup) on; within ~2%",
            "rss": "sum of RSS of the job's ALIVE actor processes (task actors + JobMaster), "
                   "every 1 s; start/end/max over samples where all were alive",
        },
    })
    if args.profile_only:
        return profile_only(args, config, results)
    if args.inproc:
        return inproc_only(args, config, results)
    if args.half_rate:
        return half_load_only(args, config, results)
    print(f"ceiling: plain loop over {args.records:,} pre-generated records ...")
    results["ceiling"] = measure_ceiling(args.records)
    print(f"  {results['ceiling']['throughput']:,.0f} records/s")
    if "rows" in args.variants:
        print(f"floor: the rows job's own work over {args.records:,} records, no engine ...")
        fl = results["floor"] = measure_floor(args.records, config.source_poll_records,
                                              DEFAULT_NUM_KEY_GROUPS)
        print(f"  {fl['throughput']:,.0f} records per CPU-second; "
              f"{fl['pregenerated']['throughput']:,.0f} over pre-generated batches; frames "
              f"{fl['frame_codec']['us_per_record']:.3f} us per record to encode and decode")
    results.update(full_speed=[], half_load=[], skipped={})
    if "bytewax" in args.variants:
        from examples.bench.harness import bytewax_count

        why = bytewax_count.available()
        if why:
            print(f"bytewax: skipped: {why}")
            results["skipped"]["bytewax"] = why
    run.init_ray()
    try:
        full_speed_runs(args, config, results)
        summarise(results)
        half_load_runs(args, config, results)
    finally:
        run.shutdown_ray()
    provenance.finish(results)
    summarise(results)
    print_table(results)
    render.write_outputs(args.out, results, png="steady.png", plot=plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
