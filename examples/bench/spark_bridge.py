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
one run. Writes ``examples/bench/out/spark_bridge/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import ray  # noqa: E402

from engine import JobConfig, StreamJob  # noqa: E402
from engine.latency import LatencyHistogram  # noqa: E402
from engine.sinks import LatencySink, Sink, SinkWriter  # noqa: E402
from engine.sources import GeneratorSource  # noqa: E402
from engine.spark import OutputLogSink, SparkSource, local_spark  # noqa: E402

OUT_DIR = os.path.join(ROOT, "examples", "bench", "out", "spark_bridge")
NUM_KEYS = 1000
CONFIG = JobConfig(metrics_port=None)


# ------------------------------------------------------------------------------ job parts


class NullSink(Sink):
    """Takes records and drops them (bridge-only throughput)."""

    def open(self, task_index: int, parallelism: int, clock: Any) -> SinkWriter:
        return _NullWriter()


class _NullWriter(SinkWriter):
    def write(self, values: Any, timestamps: Any) -> None:
        pass


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
    """Percentiles over the per-second histograms from wall second ``since_s`` on (uses
    ``LatencySink._load()``, as examples/bench/steady.py does)."""
    _, per_second = sink._load()
    h = LatencyHistogram()
    for second, hist in per_second.items():
        if second >= since_s:
            h.merge(hist)
    if not h.count:
        return {"count": 0}
    return {"count": h.count, "p50_ms": round(h.quantile(0.5), 1),
            "p90_ms": round(h.quantile(0.9), 1), "p99_ms": round(h.quantile(0.99), 1),
            "max_ms": round(h.max, 1), "mean_ms": round(h.mean, 1)}


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
            raise RuntimeError(str(q.exception()))
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


def spark_noop_baseline(spark: Any, inp: str, records: int, work: str) -> dict[str, Any]:
    t0 = time.monotonic()
    q = (input_df(spark, inp).writeStream.format("noop")
         .option("checkpointLocation", os.path.join(work, "ckpt-noop"))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    wall = time.monotonic() - t0
    busy = sum(p["durationMs"].get("triggerExecution", 0) for p in q.recentProgress) / 1000
    rows = sum(p["numInputRows"] for p in q.recentProgress)
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
    t0 = time.monotonic()
    q = (spark.readStream.format("reflow").load(log_dir).writeStream.format("noop")
         .option("checkpointLocation", os.path.join(work, "ckpt-out"))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    wall = time.monotonic() - t0
    busy = sum(p["durationMs"].get("triggerExecution", 0) for p in q.recentProgress) / 1000
    rows = sum(p["numInputRows"] for p in q.recentProgress)
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
            raise RuntimeError(f"no rows reached reflow: {q.exception()}")
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=None, help="per direction (default 1M)")
    ap.add_argument("--rate", type=float, default=5000.0, help="latency runs, records/s")
    ap.add_argument("--duration", type=float, default=None, help="latency runs, s (default 20)")
    ap.add_argument("--warmup", type=float, default=None, help="excluded from latency, s")
    ap.add_argument("--trigger-ms", type=int, default=100)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=OUT_DIR)
    args = ap.parse_args(argv)
    records = args.records or (200_000 if args.quick else 1_000_000)
    duration = args.duration or (8.0 if args.quick else 20.0)
    warmup = args.warmup if args.warmup is not None else (3.0 if args.quick else 5.0)

    started = time.time()
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg(),
                    "python": platform.python_version(), "ray": ray.__version__},
        "params": {"records": records, "rate": args.rate, "duration_s": duration,
                   "warmup_s": warmup, "trigger_ms": args.trigger_ms, "spark_master": "local[2]",
                   "source_tasks": 2},
    }
    work = tempfile.mkdtemp(prefix="reflow-bench-spark-")
    spark = local_spark("reflow-bench", master="local[2]", shuffle_partitions=2)
    import pyspark

    results["machine"]["pyspark"] = pyspark.__version__
    ray.init(namespace="reflow", include_dashboard=False, configure_logging=False,
             log_to_driver=False)
    try:
        inp = os.path.join(work, "input")
        write_input(inp, records)
        print(f"spark -> reflow, {records:,} records ...")
        base = spark_noop_baseline(spark, inp, records, work)
        print(f"  spark alone (noop sink):  {base['records_per_s']:>10,} records/s")
        into = {"spark_noop_baseline": base}
        for mode in ("foreach_batch", "datasource"):
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
        for mode in ("foreach_batch", "datasource"):
            r = latency_spark(spark, mode, args.rate, duration, warmup, args.trigger_ms, work)
            b, c = r["bridge"], r["from_spark_row_creation"]
            r["added_p50_ms"] = (round(b["p50_ms"] - g["p50_ms"], 1)
                                 if b.get("p50_ms") is not None and g.get("p50_ms") is not None
                                 else None)
            r["added_p99_ms"] = (round(b["p99_ms"] - g["p99_ms"], 1)
                                 if b.get("p99_ms") is not None and g.get("p99_ms") is not None
                                 else None)
            lat[mode] = r
            print(f"  {mode + ':':<25} from hand-over p50 {b.get('p50_ms')} ms p99 "
                  f"{b.get('p99_ms')} ms (added vs generator: p50 {r['added_p50_ms']} ms, p99 "
                  f"{r['added_p99_ms']} ms); bridge queue wait mean "
                  f"{r['bridge_queue_wait_ms_mean']} ms; from Spark row creation p50 "
                  f"{c.get('p50_ms')} ms p99 {c.get('p99_ms')} ms")
        results["latency"] = lat
    finally:
        spark.stop()
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    results["total_seconds"] = round(time.time() - started, 1)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "results.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
    print(f"total {results['total_seconds']:.0f} s; wrote {os.path.relpath(path, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
