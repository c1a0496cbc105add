"""Word count with Spark at both ends: text files -> Spark Structured Streaming -> reflow
(keyed running count) -> durable output log -> Spark -> Parquet.

    python examples/wordcount.py --once                  # generated input; local Spark and Ray
    python examples/wordcount.py --input DIR --output OUT  # keeps running, picks up new files
    ray job submit --working-dir . -- python examples/wordcount.py --once   # on a Ray cluster

Spark reads ``--input`` (text files, one line of words per line; a generated directory when
none is given) and feeds each micro-batch into reflow's source tasks (``--mode``:
``foreach_batch`` through the Spark driver, or ``datasource``, the executors pushing their
partitions). reflow counts words (parallelism ``--parallelism``) and writes every count
update to an output log, which Spark reads as a stream and writes as Parquet to
``--output``: columns ``word`` and ``count``, one row per count update, so a word's last
(largest) count is its total. With ``--once`` the job ends by itself once every file
present at start has been consumed and written; without it the query keeps polling for
new files until Ctrl-C (or ``--duration`` seconds), then drains and stops cleanly.

Prints records, distinct words, throughput and end-to-end latency percentiles (from the
moment Spark handed a line to reflow), then the verdict on the whole output: ``result: OK``
when every word's rows in the Parquet output hold the counts 1, 2, ..., n, each once, n its
occurrences in the input files (counted in Python, apart from Spark and reflow), else
``result: MISMATCH`` (exit 1) with what differs. With ``--rescale-to N`` the count operator is
rescaled live (``--rescale-protocol``, default drrs: words whose key groups do not move keep
flowing) once half the lines are in, and the rescale report is printed; it says "cut short"
with the key groups moved of those planned when the input ended (or another request came)
before the rescale finished.
``--spark-master`` (or ``REFLOW_SPARK_MASTER``) and ``--ray-address`` select other clusters.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import JobConfig, LatencySink, StreamJob  # noqa: E402
from engine.spark import OutputLogSink, SparkLink, SparkSource, local_spark  # noqa: E402
from engine.spark.jobs import build_wordcount  # noqa: E402


def make_lines(n: int, seed: int, vocabulary: int = 20_000, words_per_line: int = 8) -> list[str]:
    """Seeded text with a Zipf-like word distribution."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(vocabulary)]
    weights = [1.0 / (i + 1) for i in range(vocabulary)]
    words = rng.choices(vocab, weights, k=n * words_per_line)
    return [" ".join(words[i:i + words_per_line]) for i in range(0, len(words), words_per_line)]


def generate_input(directory: str, lines: int, files: int, seed: int) -> None:
    """``files`` text files holding ``lines`` lines in all (each appears atomically)."""
    os.makedirs(directory, exist_ok=True)
    all_lines = make_lines(lines, seed)
    per = -(-len(all_lines) // files)
    for i in range(files):
        chunk = all_lines[i * per:(i + 1) * per]
        tmp = os.path.join(directory, f".part-{i:04d}.txt.tmp")
        with open(tmp, "w") as f:
            f.write("\n".join(chunk) + "\n")
        os.replace(tmp, os.path.join(directory, f"part-{i:04d}.txt"))


def count_words(directory: str) -> Counter[str]:
    """Occurrences of each word in the text files of ``directory`` (those Spark reads: not
    hidden, not starting with '_'), counted here in Python, apart from the job."""
    counts: Counter[str] = Counter()
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if name.startswith((".", "_")) or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            for line in f:
                counts.update(line.split())
    return counts


def check_counts(per_word: dict[str, tuple[int, int, int, int]],
                 occurrences: Counter[str]) -> list[str]:
    """What differs from the exact output (empty: exact). ``per_word``: word -> (rows,
    smallest count, largest count, distinct counts) of the Parquet output; a word seen n
    times must have n rows with the counts 1..n, each once."""
    bad = sorted(w for w in set(per_word) | set(occurrences)
                 if per_word.get(w) != (occurrences[w], 1, occurrences[w], occurrences[w]))
    if not bad:
        return []
    shown = "; ".join(f"{w!r}: (rows, min, max, distinct) {per_word.get(w)}, seen "
                      f"{occurrences[w]} times" for w in bad[:3])
    return [f"{len(bad)} of {len(occurrences):,} words differ (e.g. {shown})"]


def build(source: SparkSource, log: OutputLogSink, latency: LatencySink,
          parallelism: int) -> StreamJob:
    job = StreamJob("wordcount", parallelism=parallelism,
                    config=JobConfig(batch_size=1000, linger_ms=5))
    build_wordcount(job, source, log, source_parallelism=min(parallelism, 2),
                    extra_sinks=(latency,))
    return job


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", default=None, help="directory of text files (default: generated)")
    ap.add_argument("--output", default=None, help="Parquet output directory (default: temp)")
    ap.add_argument("--once", action="store_true",
                    help="exit once every file present at start is consumed and written")
    ap.add_argument("--duration", type=float, default=None,
                    help="without --once: stop after this many seconds (default: Ctrl-C)")
    ap.add_argument("--lines", type=int, default=50_000, help="lines to generate")
    ap.add_argument("--files", type=int, default=5, help="files to generate")
    ap.add_argument("--files-per-trigger", type=int, default=1)
    ap.add_argument("--trigger-ms", type=int, default=500, help="Spark trigger interval")
    ap.add_argument("--mode", choices=["foreach_batch", "datasource"], default="datasource")
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rescale-to", type=int, default=None)
    ap.add_argument("--rescale-protocol", default="drrs",
                    help="the live protocol of --rescale-to (default drrs)")
    ap.add_argument("--work-dir", default=None,
                    help="checkpoints, output log and dead letters (default: temp)")
    ap.add_argument("--spark-master", default=None, help="default: local[*]")
    ap.add_argument("--ray-address", default=None, help="default: start a local Ray")
    args = ap.parse_args(argv)

    work = args.work_dir or tempfile.mkdtemp(prefix="reflow-wordcount-")
    inp = args.input
    if inp is None:
        inp = os.path.join(work, "input")
        generate_input(inp, args.lines, args.files, args.seed)
    out_dir = args.output or os.path.join(work, "output")

    stopping: dict[str, Any] = {"now": False, "asked": None}

    def on_signal(signum: int, frame: object) -> None:
        first = stopping.get("asked")
        if first is not None and time.monotonic() - first > 2.0:
            raise KeyboardInterrupt  # Ctrl-C again: give up draining
        if first is None:  # drain Spark and reflow, then summarize
            stopping["now"], stopping["asked"] = True, time.monotonic()

    def install_handlers() -> None:
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)

    install_handlers()

    import ray

    started_ray = not ray.is_initialized()
    spark = local_spark("reflow-wordcount", master=args.spark_master)
    link = None
    try:
        source = SparkSource("line STRING NOT NULL", name=f"wordcount-lines-{os.getpid()}",
                             dead_letter_dir=os.path.join(work, "dead-letters"))
        log = OutputLogSink(os.path.join(work, "log"),
                            "word STRING NOT NULL, count BIGINT NOT NULL")
        latency = LatencySink()
        job = build(source, log, latency, args.parallelism)
        handle = job.run(address=args.ray_address)
        install_handlers()  # again: connecting to Ray may install its own
        print(f"job {handle.job_id} running; metrics at {handle.metrics_url}")
        link = SparkLink(spark, handle)
        start = time.monotonic()
        lines_df = (spark.readStream.format("text")
                    .option("maxFilesPerTrigger", args.files_per_trigger).load(inp)
                    .withColumnRenamed("value", "line"))
        link.feed(source, lines_df, mode=args.mode,
                  trigger={"availableNow": True} if args.once
                  else {"processingTime": f"{args.trigger_ms} milliseconds"},
                  checkpoint=os.path.join(work, "checkpoint-in"), query_name="lines-to-reflow")
        out_query = link.start(
            link.read_stream(log).writeStream.format("parquet").option("path", out_dir)
            .option("checkpointLocation", os.path.join(work, "checkpoint-out"))
            .trigger(processingTime=f"{args.trigger_ms} milliseconds")
            .queryName("reflow-to-parquet"))
        total_lines = spark.read.text(inp).count() if args.rescale_to else 0
        rescaled = not args.rescale_to
        last_note = time.monotonic()
        while True:
            st = handle.status()
            if st.state not in ("running", "created"):
                break
            if not rescaled and source.stats()["rows_taken"] >= total_lines // 2:
                report = handle.rescale("count", args.rescale_to,
                                        protocol=args.rescale_protocol)
                rescaled = True
                print(report)  # says "cut short" when the input ended first
            if stopping["now"] or (not args.once and args.duration is not None
                                   and time.monotonic() - start >= args.duration):
                print("stopping: draining Spark and reflow ...")
                link.stop_feeds()
                stopping["now"] = False
                args.duration = None
            if not args.once and time.monotonic() - last_note >= 10:
                s = source.stats()
                print(f"  {s['rows_taken']:,} lines taken from Spark in {s['batches']} batches; "
                      f"{log.rows():,} count updates in the output log")
                last_note = time.monotonic()
            time.sleep(0.2)
        handle.wait()
        elapsed = time.monotonic() - start
        link.wait_output(out_query, log, timeout=300)
        stats = source.stats()

        from pyspark.sql import functions as F

        result = spark.read.parquet(out_dir)
        records = result.count()
        per_word = {r["word"]: (r["n"], r["lo"], r["hi"], r["distinct"]) for r in
                    result.groupBy("word").agg(F.count("*").alias("n"),
                                               F.min("count").alias("lo"),
                                               F.max("count").alias("hi"),
                                               F.countDistinct("count").alias("distinct"))
                    .collect()}
        distinct = len(per_word)
        total = sum(v[2] for v in per_word.values())
        occurrences = count_words(inp)
        expected = sum(occurrences.values())
        s = latency.summary()
        print(f"records (words): {records:,} of {expected:,} expected")
        print(f"distinct words:  {distinct:,}; total count {total:,}")
        print(f"throughput:      {records / elapsed:,.0f} records/s over {elapsed:.1f} s")
        if s["count"]:
            print(f"latency (ms):    p50 {s['p50_ms']:.1f}  p99 {s['p99_ms']:.1f}  "
                  f"max {s['max_ms']:.1f}")
        print(f"spark -> reflow: {stats['rows_taken']:,} lines in {stats['batches']} micro-batches "
              f"({args.mode}); {stats['dead_letters']} dead letters")
        print(f"output:          {out_dir}")
        problems = check_counts(per_word, occurrences)
        for p in problems:
            print(f"  {p}")
        print(f"result: OK (every word's counts are 1..n, n its occurrences in the input: "
              f"{distinct:,} words, {records:,} rows)" if not problems else "result: MISMATCH")
        return 0 if not problems else 1
    finally:
        if link is not None:
            link.close()
        spark.stop()
        if started_ray:
            ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
