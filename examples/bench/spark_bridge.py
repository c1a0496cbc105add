"""Benchmark of the Spark bridges: throughput of each direction and the bridge's added latency.

    python examples/bench/spark_bridge.py            # 1M records per direction, 20 s latency runs
    python examples/bench/spark_bridge.py --quick    # smoke run: 200k records, 8 s runs

Spark runs in local mode (``local[2]``), Ray is started here; both on this machine.

1. **Spark -> reflow** (per mode: ``foreach_batch`` and ``datasource``): ``--records``
   rows ``(key BIGINT, seq BIGINT)`` in 10 Parquet files, read by Spark Structured
   Streaming (``maxFilesPerTrigger=1``, ``availableNow``) and fed into a ``SparkSource``
   (2 source tasks) whose records go straight to a sink chained into the source tasks.
   Throughput = records / (first row taken by reflow -> last row taken); "with start-up"
   counts from the query's start. Baseline: the same Spark query into Spark's ``noop``
   sink (Spark's own read cost, no bridge).
2. **reflow -> Spark**: a ``GeneratorSource`` job (2 tasks, full speed) writes ``--records``
   records into an ``OutputLogSink``; baseline: the same job into a no-op sink. Then Spark
   reads the log (``format("reflow")``, ``availableNow``) into ``noop``: read throughput =
   records / sum of the micro-batches' trigger execution times (and / wall time with
   query start-up).
3. **Added latency**: the keyed count job (key_by -> running count -> latency sink,
   parallelism 2) at ``--rate`` records/s for ``--duration`` s, fed (a) by a
   ``GeneratorSource`` (timestamp = scheduled emission time, the engine's own latency) and
   (b) by Spark's ``rate`` source through each bridge mode (trigger ``--trigger-ms``). For
   (b) two latencies per record: from the moment Spark handed the row to the bridge (the
   bridge's own cost) and from the row's creation time in Spark (what a user sees,
   including Spark's micro-batch interval; Spark's ``rate`` source releases rows once per
   second, so this includes up to a second of Spark-side batching). Also the bridge's own
   queue wait: hand-over -> a source task takes the chunk (mean per chunk). The window
   starts when the first rows reach reflow (query and executor start-up excluded);
   percentiles over the seconds after ``--warmup``. Added latency = (b) - (a), mostly the
   micro-batch arriving as one burst that the job then works through.

The machine is shared and noisy: the load average at start is recorded; compare within
one run. Writes ``examples/bench/out/spark_bridge/results.json`` and ``spark_bridge.png``
(throughput per direction, latency per feed).
"""

# ruff: noqa: E402  (the repository root goes on sys.path before reflow's imports)
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from engine import GeneratorSource, JobConfig, LatencySink, Sink, SinkWriter, StreamJob
from engine.spark import OutputLogSink, SparkSource, local_spark
from examples.bench.harness import BenchRunError, cli, jobs, provenance, render, run
from examples.bench.harness import analysis as an
from examples.bench.harness.jobs import NullSink

NUM_KEYS = 1000
CONFIG = JobConfig(metrics_port=None)
MODES = ("foreach_batch", "datasource")


# ------------------------------------------------------------------------------ job parts


class DualLatencySink(Sink):
    """Two latency sinks: ``now - record timestamp`` (bridge hand-over time) and
    ``now - record[1]`` (the row's creation time in Spark, ms)."""

    def __init__(self) -> None:
        self.bridge = LatencySink()
        self.created = LatencySink()

    def prepare(self) -> None:
        self.bridge.prepare()
        self.created.prepare()

    def open(self, task_index: int, parallelism: int, clock: Any) -> SinkWriter:
        return _DualWriter(self.bridge.open(task_index, parallelism, clock),
                           self.created.open(task_index, parallelism, clock))


class _DualWriter(SinkWriter):
    def __init__(self, a: SinkWriter, b: SinkWriter) -> None:
        self.a, self.b = a, b

    def write(self, values: Any, timestamps: Any) -> None:
        self.a.write(values, timestamps)
        self.b.write(values, [v[1] for v in values])

    def flush(self) -> None:
        self.a.flush()
        self.b.flush()


def spark_row(r: Any) -> tuple[int, int, int]:
    """(timestamp ms, value) from Spark's rate source -> (key, created ms, 1)."""
    return (r[1] % NUM_KEYS, r[0], 1)


def gen_row(r: Any) -> tuple[int, int, int]:
    """(key, seq) from the generator -> (key, seq, 1)."""
    return (r[0], r[1], 1)


def key_of(r: Any) -> Any:
    return r[0]


def running_count(a: Any, b: Any) -> tuple[Any, Any, int]:
    return (b[0], b[1], a[2] + b[2])


def latency_after(sink: LatencySink, since_s: float) -> dict[str, Any]:
    """count, p50/p90/p99, max and mean (ms, to 0.1) over the sink's seconds from wall
    second ``since_s`` on."""
    h = an.merged(jobs.latency_seconds(sink), since_s)
    return an.latency_stats(h, (0.5, 0.9, 0.99), digits=1)


# ------------------------------------------------------------------------------ phases


def write_input(directory: str, records: int, files: int = 10) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(directory, exist_ok=True)
    per = -(-records // files)
    for i in range(files):
        lo, hi = i * per, min(records, (i + 1) * per)
        seq = pa.array(range(lo, hi), type=pa.int64())
        key = pa.array([s % NUM_KEYS for s in range(lo, hi)], type=pa.int64())
        pq.write_table(pa.table({"key": key, "seq": seq}),
                       os.path.join(directory, f"part-{i:03d}.parquet"))


def input_df(spark: Any, directory: str) -> Any:
    return (spark.readStream.schema("key BIGINT, seq BIGINT").option("maxFilesPerTrigger", 1)
            .parquet(directory))


def spark_to_reflow(spark: Any, inp: str, records: int, mode: str, work: str) -> dict[str, Any]:
    src = SparkSource("key BIGINT NOT NULL, seq BIGINT NOT NULL", name=f"bench-in-{mode}")
    job = StreamJob(f"bench-in-{mode}", parallelism=2, config=CONFIG)
    job.source(src, name="bridge", parallelism=2).sink(NullSink(), name="null")
    handle = job.run()
    ckpt = os.path.join(work, f"ckpt-in-{mode}")
    stream = f"ckpt:{ckpt}"
    w = input_df(spark, inp).writeStream.option("checkpointLocation", ckpt)
    if mode == "foreach_batch":
        w = w.foreachBatch(src.foreach_batch(stream))
    else:
        w = w.format("reflow").options(**src.writer_options(stream))
    t0 = time.monotonic()
    q = w.trigger(availableNow=True).start()
    first = None
    while True:
        taken = src.stats()["rows_taken"]
        now = time.monotonic()
        if taken and first is None:
            first = now
        if taken >= records:
            break
        if not q.isActive and q.exception() is not None:
            raise BenchRunError(f"the Spark query failed: {q.exception()}")
        time.sleep(0.01)
    end = time.monotonic()
    q.awaitTermination(60)
    stats = src.stats()
    src.end_input()
    handle.wait(60)
    handle.stop()
    src.close()
    assert stats["rows_taken"] == records, stats
    return {"records": records, "mode": mode,
            "records_per_s": round(records / (end - first)),
            "records_per_s_with_startup": round(records / (end - t0)),
            "seconds": round(end - first, 2), "micro_batches": stats["batches"]}


def into_noop(df: Any, checkpoint: str) -> tuple[int, float, float]:
    """Run streaming ``df`` into Spark's ``noop`` sink (``availableNow``) to its end:
    (rows read, seconds the micro-batches executed, wall seconds with query start-up)."""
    t0 = time.monotonic()
    q = (df.writeStream.format("noop").option("checkpointLocation", checkpoint)
         .trigger(availableNow=True).start())
    q.awaitTermination()
    wall = time.monotonic() - t0
    busy = sum(p["durationMs"].get("triggerExecution", 0) for p in q.recentProgress) / 1000
    return sum(p["numInputRows"] for p in q.recentProgress), busy, wall


def spark_noop_baseline(spark: Any, inp: str, records: int, work: str) -> dict[str, Any]:
    rows, busy, wall = into_noop(input_df(spark, inp), os.path.join(work, "ckpt-noop"))
    return {"records": rows, "records_per_s": round(rows / busy) if busy else None,
            "records_per_s_with_startup": round(rows / wall)}


def reflow_to_spark(spark: Any, records: int, work: str) -> dict[str, Any]:
    out: dict[str, Any] = {"records": records}
    for name, sink in (("null", NullSink()),
                       ("log", OutputLogSink(os.path.join(work, "log"),
                                             "key BIGINT NOT NULL, seq BIGINT NOT NULL"))):
        job = StreamJob(f"bench-out-{name}", parallelism=2, config=CONFIG)
        job.source(GeneratorSource(rate=None, num_records=records, num_keys=NUM_KEYS),
                   name="gen", parallelism=2).sink(sink, name=name)
        handle = job.run()
        t0 = time.monotonic()
        handle.wait(600)
        dt = time.monotonic() - t0
        handle.stop()
        out[f"job_into_{name}_records_per_s"] = round(records / dt)
    log_dir = os.path.join(work, "log")
    rows, busy, wall = into_noop(spark.readStream.format("reflow").load(log_dir),
                                 os.path.join(work, "ckpt-out"))
    assert rows == records, (rows, records)
    out.update({"spark_read_records_per_s": round(rows / busy),
                "spark_read_records_per_s_with_startup": round(rows / wall),
                "segments": sum(1 for n in os.listdir(log_dir) if n.startswith("seg-"))})
    return out


def latency_generator(rate: float, duration: float, warmup: float) -> dict[str, Any]:
    sink = LatencySink()
    job = StreamJob("bench-lat-gen", parallelism=2, config=CONFIG)
    (job.source(GeneratorSource(rate=rate, duration_s=duration, num_keys=NUM_KEYS),
                name="gen", parallelism=2)
        .map(gen_row, name="row").key_by(key_of).reduce(running_count, name="count")
        .sink(sink, name="latency"))
    handle = job.run()
    t0 = time.time()
    handle.wait(duration + 120)
    handle.stop()
    return {"engine": latency_after(sink, t0 + warmup)}


def latency_spark(spark: Any, mode: str, rate: float, duration: float, warmup: float,
                  trigger_ms: int, work: str) -> dict[str, Any]:
    sink = DualLatencySink()
    src = SparkSource("timestamp TIMESTAMP NOT NULL, value BIGINT NOT NULL",
                      name=f"bench-lat-{mode}", chunk_rows=1024)
    job = StreamJob(f"bench-lat-{mode}", parallelism=2, config=CONFIG)
    (job.source(src, name="bridge", parallelism=2)
        .map(spark_row, name="row").key_by(key_of).reduce(running_count, name="count")
        .sink(sink, name="latency"))
    handle = job.run()
    ckpt = os.path.join(work, f"ckpt-lat-{mode}")
    stream = f"ckpt:{ckpt}"
    df = (spark.readStream.format("rate").option("rowsPerSecond", int(rate))
          .option("numPartitions", 2).load())
    w = df.writeStream.option("checkpointLocation", ckpt)
    if mode == "foreach_batch":
        w = w.foreachBatch(src.foreach_batch(stream))
    else:
        w = w.format("reflow").options(**src.writer_options(stream))
    q = w.trigger(processingTime=f"{trigger_ms} milliseconds").start()
    deadline = time.monotonic() + 300
    while src.stats()["rows_taken"] == 0:  # query start-up (and executors joining Ray)
        if time.monotonic() > deadline or (not q.isActive and q.exception() is not None):
            raise BenchRunError(f"no rows reached reflow within 300 s (Spark query: "
                                    f"{q.exception()}); check that Spark's executors can reach Ray")
        time.sleep(0.05)
    t0 = time.time()
    base = src.stats()
    time.sleep(duration)
    mid = src.stats()
    q.stop()
    stats = src.stats()
    src.end_input()
    handle.wait(120)
    handle.stop()
    src.close()
    chunks = mid["chunks_taken"] - base["chunks_taken"]
    return {"bridge": latency_after(sink.bridge, t0 + warmup),
            "from_spark_row_creation": latency_after(sink.created, t0 + warmup),
            "bridge_queue_wait_ms_mean": (round((mid["wait_ms_sum"] - base["wait_ms_sum"])
                                                / chunks, 1) if chunks else None),
            "bridge_queue_wait_ms_max": stats["wait_ms_max"],
            "rows": stats["rows_taken"], "micro_batches": stats["batches"]}


# ------------------------------------------------------------------------------ main


def measure(spark: Any, records: int, duration: float, warmup: float,
            args: argparse.Namespace, work: str) -> dict[str, Any]:
    """The three measurements (see the module docstring), printed as they come."""
    results: dict[str, Any] = {}
    inp = os.path.join(work, "input")
    write_input(inp, records)
    print(f"spark -> reflow, {records:,} records ...")
    base = spark_noop_baseline(spark, inp, records, work)
    print(f"  spark alone (noop sink):  {base['records_per_s']:>10,} records/s")
    into = {"spark_noop_baseline": base}
    for mode in MODES:
        r = spark_to_reflow(spark, inp, records, mode, work)
        into[mode] = r
        print(f"  {mode + ':':<25} {r['records_per_s']:>10,} records/s "
              f"({r['records_per_s_with_startup']:,} with query start-up)")
    results["spark_to_reflow"] = into
    print(f"reflow -> spark, {records:,} records ...")
    out = reflow_to_spark(spark, records, work)
    results["reflow_to_spark"] = out
    print(f"  job into a null sink:     {out['job_into_null_records_per_s']:>10,} records/s")
    print(f"  job into the output log:  {out['job_into_log_records_per_s']:>10,} records/s")
    print(f"  spark reading the log:    {out['spark_read_records_per_s']:>10,} records/s "
          f"({out['spark_read_records_per_s_with_startup']:,} with query start-up)")
    print(f"latency at {args.rate:,.0f} records/s, {duration:.0f} s runs ...")
    lat = {"generator": latency_generator(args.rate, duration, warmup)}
    g = lat["generator"]["engine"]
    print(f"  generator source:         p50 {g.get('p50_ms')} ms  p99 {g.get('p99_ms')} ms")
    for mode in MODES:
        r = latency_spark(spark, mode, args.rate, duration, warmup, args.trigger_ms, work)
        b, c = r["bridge"], r["from_spark_row_creation"]
        for q in ("p50_ms", "p99_ms"):
            r[f"added_{q}"] = (None if b.get(q) is None or g.get(q) is None
                               else round(b[q] - g[q], 1))
        lat[mode] = r
        print(f"  {mode + ':':<25} from hand-over p50 {b.get('p50_ms')} ms p99 "
              f"{b.get('p99_ms')} ms (added vs generator: p50 {r['added_p50_ms']} ms, p99 "
              f"{r['added_p99_ms']} ms); bridge queue wait mean "
              f"{r['bridge_queue_wait_ms_mean']} ms; from Spark row creation p50 "
              f"{c.get('p50_ms')} ms p99 {c.get('p99_ms')} ms")
    results["latency"] = lat
    return results


def plot(results: dict[str, Any], path: str) -> None:
    """Throughput per direction (left) and latency p50/p99 per feed (right)."""
    plt = render.pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    into, out = results["spark_to_reflow"], results["reflow_to_spark"]
    bars = {"spark alone (noop)": into["spark_noop_baseline"]["records_per_s"] or 0,
            **{f"spark -> reflow\n{m}": into[m]["records_per_s"] for m in MODES},
            "job -> null sink": out["job_into_null_records_per_s"],
            "job -> output log": out["job_into_log_records_per_s"],
            "spark reads log": out["spark_read_records_per_s"]}
    ax1.bar(range(len(bars)), list(bars.values()), color="tab:blue")
    ax1.set_xticks(range(len(bars)), list(bars), rotation=30, ha="right", fontsize=8)
    ax1.set_ylabel("records/s")
    ax1.set_title(f"throughput, {results['params']['records']:,} records")
    lat = results["latency"]
    feeds = {"generator": lat["generator"]["engine"],
             **{f"{m}\n(hand-over)": lat[m]["bridge"] for m in MODES},
             **{f"{m}\n(row created)": lat[m]["from_spark_row_creation"] for m in MODES}}
    x = range(len(feeds))
    for k, (q, w) in enumerate((("p50_ms", -0.2), ("p99_ms", 0.2))):
        ax2.bar([i + w for i in x], [f.get(q) or 0 for f in feeds.values()], 0.4,
                label=q[:-3], color=f"C{k}")
    ax2.set_xticks(list(x), list(feeds), rotation=30, ha="right", fontsize=8)
    ax2.set_yscale("log")
    ax2.set_ylabel("latency, ms (log)")
    ax2.set_title(f"keyed count at {results['params']['rate']:,.0f} records/s")
    ax2.legend(fontsize=8)
    fig.suptitle(f"reflow Spark bridges, Spark local[2] — {render.load_title(results)}",
                 fontsize=10)
    render.save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser(__doc__, "spark_bridge")
    ap.add_argument("--records", type=int, help="per direction (1M; quick 200k)")
    ap.add_argument("--rate", type=float, default=5000.0, help="latency runs, records/s")
    ap.add_argument("--duration", type=float, help="latency runs, s (20; quick 8)")
    ap.add_argument("--warmup", type=float, help="excluded from latency, s (5; quick 3)")
    ap.add_argument("--trigger-ms", type=int, default=100)
    args = ap.parse_args(argv)
    cli.fill_defaults(args, {"records": (1_000_000, 200_000), "duration": (20.0, 8.0),
                             "warmup": (5.0, 3.0)})
    args.out = cli.out_dir(args, "spark_bridge")
    results = provenance.begin(__file__, argv)
    results["machine"].update(load_average_at_start=results["machine"]["loadavg_at_start"],
                              ray=run.ray_version())
    results["params"] = {"records": args.records, "rate": args.rate,
                         "duration_s": args.duration, "warmup_s": args.warmup,
                         "trigger_ms": args.trigger_ms, "spark_master": "local[2]",
                         "source_tasks": 2}
    work = tempfile.mkdtemp(prefix="reflow-bench-spark-")
    spark = local_spark("reflow-bench", master="local[2]", shuffle_partitions=2)
    import pyspark

    results["machine"]["pyspark"] = pyspark.__version__
    run.init_ray(log_to_driver=False, include_dashboard=False)
    try:
        results.update(measure(spark, args.records, args.duration, args.warmup, args, work))
    finally:
        spark.stop()
        run.shutdown_ray()
        shutil.rmtree(work, ignore_errors=True)
    provenance.finish(results)
    render.write_outputs(args.out, results, png="spark_bridge.png", plot=plot)
    print(f"total {results['total_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
