"""Word count on reflow: lines -> words -> keyed running count -> Parquet + latency sink.

    python examples/wordcount.py                       # local Ray, started by the job
    ray job submit --working-dir . -- python examples/wordcount.py   # on a Ray cluster

Prints records, distinct words, throughput and end-to-end latency percentiles. With
``--rescale-to N`` the count operator is rescaled (stop-restart) half-way through.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow.parquet as pq  # noqa: E402

from engine import JobConfig, StreamJob  # noqa: E402
from engine.sinks import LatencySink, ParquetSink  # noqa: E402
from engine.testing import TestingSource  # noqa: E402


def make_lines(n: int, seed: int, vocabulary: int = 20_000, words_per_line: int = 8) -> list[str]:
    """Seeded text with a Zipf-like word distribution."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(vocabulary)]
    weights = [1.0 / (i + 1) for i in range(vocabulary)]
    words = rng.choices(vocab, weights, k=n * words_per_line)
    return [" ".join(words[i:i + words_per_line]) for i in range(0, len(words), words_per_line)]


def build(lines: list[str], parallelism: int, out_dir: str, latency: LatencySink,
          rate: float | None) -> StreamJob:
    job = StreamJob("wordcount", parallelism=parallelism,
                    config=JobConfig(batch_size=1000, linger_ms=5))
    counts = (
        job.source(TestingSource(lines, rate=rate), name="lines", parallelism=1)
        .flat_map(str.split, name="split")
        .map(lambda w: (w, 1), name="pair")
        .key_by(lambda p: p[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]), name="count")
    )
    counts.sink(ParquetSink(out_dir, schema=["word", "count"]), name="parquet")
    counts.sink(latency, name="latency")
    return job


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--rate", type=float, default=None, help="lines/s (default: full speed)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--output", default=None, help="Parquet output directory")
    ap.add_argument("--rescale-to", type=int, default=None)
    args = ap.parse_args(argv)

    lines = make_lines(args.lines, args.seed)
    out_dir = args.output or tempfile.mkdtemp(prefix="reflow-wordcount-")
    latency = LatencySink()
    job = build(lines, args.parallelism, out_dir, latency, args.rate)
    handle = job.run()
    print(f"job {handle.job_id} running; metrics at {handle.metrics_url}")
    start = time.monotonic()
    if args.rescale_to:
        while latency.summary()["count"] < len(lines) * 2:
            time.sleep(0.2)
        report = handle.rescale("count", args.rescale_to)
        print(f"rescaled count {report.old_parallelism} -> {report.new_parallelism} in "
              f"{report.duration_s:.2f} s ({report.key_groups_moved} key groups, "
              f"{report.bytes_moved} bytes moved)")
    handle.wait()
    elapsed = time.monotonic() - start
    table = pq.read_table(out_dir)
    words = table.column("word").to_pylist()
    counts = table.column("count").to_pylist()
    final: dict[str, int] = {}
    for w, c in zip(words, counts, strict=True):
        final[w] = max(final.get(w, 0), c)
    expected = sum(len(line.split()) for line in lines)
    s = latency.summary()
    print(f"records (words): {len(words):,} of {expected:,} expected")
    print(f"distinct words:  {len(final):,}; total count {sum(final.values()):,}")
    print(f"throughput:      {len(words) / elapsed:,.0f} records/s over {elapsed:.1f} s")
    print(f"latency (ms):    p50 {s['p50_ms']:.1f}  p99 {s['p99_ms']:.1f}  max {s['max_ms']:.1f}")
    print(f"output:          {out_dir}")
    handle.stop()
    ok = len(words) == expected and sum(final.values()) == expected
    print("result: OK" if ok else "result: MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
