"""The Spark bridges on real PySpark (local mode) and a real local Ray cluster (no mocks).

files -> Spark Structured Streaming -> reflow (SparkSource) -> OutputLogSink -> Spark reader
-> Parquet, compared with a Spark batch computation of the same result; replayed Spark
micro-batches; the reader resuming from its committed offset; a rescale mid-run; bad rows;
failures crossing in both directions. Code shipped to workers lives in engine/spark/.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import sys
import time
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine import JobConfig, StreamJob
from engine.errors import JobFailedError
from engine.io.testing import TestingSink, TestingSource
from engine.spark import OutputLogSink, SparkLink, SparkSource, local_spark, parse_schema
from engine.spark.jobs import RaiseOn, SpoilAt, build_wordcount, key_of, sum_second
from engine.spark.outlog import latest_offset, segment_name
from engine.spark.schema import SchemaError, conform, rechunk, records_to_table, to_records

pytestmark = [pytest.mark.ray, pytest.mark.spark]

CFG = JobConfig(metrics_port=None, batch_size=200, linger_ms=2)
WC_SCHEMA = "word STRING NOT NULL, count BIGINT NOT NULL"


@pytest.fixture(scope="module")
def spark(ray_cluster):
    session = local_spark("reflow-tests", master="local[2]", shuffle_partitions=2)
    yield session
    session.stop()


def test_python_workers_import_the_installed_byte_compiled_pyspark(spark):
    """local_spark's worker launcher: a worker's pyspark is the installed package (its
    .pyc cached), not the pyspark.zip Spark puts first on the workers' PYTHONPATH, and
    the worker runs this interpreter."""
    import pyspark

    def where(_: object) -> tuple[str, str, str]:
        import sys

        import pyspark as worker_pyspark
        return worker_pyspark.__file__, sys.executable, os.environ.get("PYTHONPATH", "")

    [(module, python, path)] = spark.sparkContext.parallelize([0], 1).map(where).collect()
    assert module == pyspark.__file__ and ".zip" not in module
    assert python == sys.executable
    assert "pyspark.zip" not in path


def write_files(directory: str, files: range, lines_per_file: int, seed: int,
                vocabulary: str = "abcdefghijkl") -> list[str]:
    """Files ``f{i:03d}.txt`` for i in ``files``, each appearing atomically (by rename)."""
    os.makedirs(directory, exist_ok=True)
    lines_all = []
    for f in files:
        rng = random.Random(seed * 1000 + f)
        lines = [" ".join(rng.choice(vocabulary) * rng.randint(1, 2) for _ in range(6))
                 for _ in range(lines_per_file)]
        lines_all += lines
        tmp = os.path.join(directory, f".f{f:03d}.tmp")
        with open(tmp, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        os.replace(tmp, os.path.join(directory, f"f{f:03d}.txt"))
    return lines_all


def wait_for(cond, timeout: float = 90.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.02)


def lines_df(spark, directory: str):
    return (spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(directory)
            .withColumnRenamed("value", "line"))


def spark_reference(spark, directory: str):
    """The expected Parquet rows by a Spark batch computation: for each word with total n,
    the rows (word, 1), ..., (word, n)."""
    from pyspark.sql import functions as F

    words = (spark.read.text(directory)
             .select(F.explode(F.split(F.trim("value"), r"\s+")).alias("word"))
             .where(F.col("word") != ""))
    totals = words.groupBy("word").count()
    return totals.select("word", F.explode(F.sequence(F.lit(1), F.col("count"))).alias("count"))


def assert_same_rows(actual, expected) -> None:
    """The same multiset of (word, count) rows: no update lost, none duplicated."""
    got = Counter((r["word"], r["count"]) for r in actual.collect())
    want = Counter((r["word"], r["count"]) for r in expected.collect())
    assert sum(got.values()) == sum(want.values())
    assert got == want


def run_pipeline(spark, tmp_path, mode: str, rescale: list[tuple[str, int]] | None = None,
                 n_files: int = 4, lines_per_file: int = 500):
    """Spark files -> reflow wordcount -> output log -> Spark Parquet; returns the output
    directory, the input directory and what happened.

    Without ``rescale``: every file exists up front and the feed runs ``availableNow``.
    With it: the feed keeps running (processing-time trigger) and picks up files written
    in ``len(rescale) + 1`` groups; each rescale starts as soon as reflow has taken rows of
    the group before it, then the next group is written; the feed is stopped once reflow
    has taken every line, which ends the job's input."""
    inp, work = str(tmp_path / "in"), str(tmp_path)
    k = len(rescale or []) + 1
    per = -(-n_files // k)
    groups = [range(i, min(i + per, n_files)) for i in range(0, n_files, per)]
    total = n_files * lines_per_file
    write_files(inp, groups[0], lines_per_file, seed=7)
    src = SparkSource("line STRING NOT NULL", name=f"lines-{mode}-{time.time_ns()}",
                      chunk_rows=250, queue_chunks=2, partitions=4)
    out = OutputLogSink(os.path.join(work, "log"), WC_SCHEMA, linger_s=0.1)
    job = StreamJob(f"wc-{mode}", parallelism=2, config=CFG)
    build_wordcount(job, src, out, source_parallelism=2)
    handle = job.run()
    info: dict = {"rescales": []}
    with SparkLink(spark, handle, poll_interval_s=0.1) as link:
        link.feed(src, lines_df(spark, inp), mode=mode,
                  trigger={"processingTime": "200 milliseconds"} if rescale
                  else {"availableNow": True},
                  checkpoint=os.path.join(work, "ckpt-in"))
        outq = link.start(
            link.read_stream(out).writeStream.format("parquet")
            .option("path", os.path.join(work, "out"))
            .option("checkpointLocation", os.path.join(work, "ckpt-out"))
            .trigger(processingTime="200 milliseconds"))
        if rescale:
            level = 0
            for (op, n), group in zip(rescale, groups[1:], strict=True):
                wait_for(lambda lv=level: src.stats()["rows_taken"] > lv, what="rows to flow")
                taken = src.stats()["rows_taken"]
                # the source hands its lanes over live; the counts restart
                report = handle.rescale(op, n, protocol="drrs" if op == "lines"
                                        else "stop-restart")
                info["rescales"].append((taken, report.new_parallelism))
                level = src.stats()["rows_taken"]
                write_files(inp, group, lines_per_file, seed=7)
            wait_for(lambda: src.stats()["rows_taken"] == total, what="all lines taken")
            link.stop_feeds()
        handle.wait(180)
        link.wait_output(outq, out, timeout=120)
        info["stats"] = src.stats()
    return os.path.join(work, "out"), inp, info


# ----------------------------------------------------------------- end to end


def test_files_spark_reflow_spark_parquet_equals_spark_batch(spark, tmp_path):
    out, inp, info = run_pipeline(spark, tmp_path, "foreach_batch")
    assert_same_rows(spark.read.parquet(out), spark_reference(spark, inp))
    assert info["stats"]["dead_letters"] == 0
    assert info["stats"]["batches"] == 4  # one file per micro-batch


def test_rescale_mid_spark_fed_run_changes_nothing(spark, tmp_path):
    # the Data Source writer (executors push their partitions); the query keeps running
    # and picks up new files before, between and after the rescales: of the counts
    # (stop-restart) and of the Spark-fed source itself (its lanes handed over live)
    out, inp, info = run_pipeline(
        spark, tmp_path, "datasource", rescale=[("count", 3), ("lines", 4), ("count", 1),
                                                ("lines", 1)], n_files=10,
        lines_per_file=300)
    assert [p for _, p in info["rescales"]] == [3, 4, 1, 1]
    assert all(0 < taken < 10 * 300 for taken, _ in info["rescales"])  # mid-run, all
    assert info["stats"]["rows_taken"] == 10 * 300
    assert_same_rows(spark.read.parquet(out), spark_reference(spark, inp))


# ----------------------------------------------------------------- exactly-once output


def test_a_spark_fed_job_that_checkpoints_recovers_a_killed_task_exactly(spark, tmp_path):
    """A task killed while the Spark query goes on: the job restarts from its last complete
    checkpoint, the source's lanes are read on from that checkpoint's states (the bridge
    kept what the checkpoint did not cover; Spark will not replay what it committed), and
    the exactly-once sink holds every running count once."""
    import dataclasses

    import ray

    from tests.jobs import task_actors, wait_until

    inp = str(tmp_path / "in")
    write_files(inp, range(0, 2), 300, seed=11)
    src = SparkSource("line STRING NOT NULL", name=f"ckpt-{time.time_ns()}", chunk_rows=50,
                      queue_chunks=2, partitions=2)
    sink = TestingSink(str(tmp_path / "out"))  # exactly-once: the job checkpoints
    cfg = dataclasses.replace(CFG, checkpoint_interval_s=0.5,
                              checkpoint_dir=str(tmp_path / "chk"), restart_delay_s=0.1,
                              restart_attempts=5)
    job = StreamJob("wc-recovery", parallelism=2, config=cfg)
    build_wordcount(job, src, sink, source_parallelism=2)
    handle = job.run()
    with SparkLink(spark, handle, poll_interval_s=0.1) as link:
        link.feed(src, lines_df(spark, inp), trigger={"processingTime": "200 milliseconds"},
                  checkpoint=str(tmp_path / "ckpt-in"))
        wait_for(lambda: src.stats()["rows_taken"] == 600, what="the first files taken")
        done = handle.status().checkpoints.completed
        wait_until(lambda: handle.status().checkpoints.completed > done, "a checkpoint",
                   handle)
        write_files(inp, range(2, 4), 300, seed=11)
        wait_for(lambda: src.stats()["rows_taken"] > 600, what="rows after the checkpoint")
        ray.kill(ray.get_actor(task_actors(handle, "count")[0], namespace="reflow"))
        wait_until(lambda: handle.status().restarts >= 1, "the restart", handle)
        wait_for(lambda: src.stats()["rows_taken"] == 1200, what="all lines taken")
        link.stop_feeds()
        st_ = handle.wait(180)
    assert st_.restarts >= 1, "no restart: the kill tested nothing"
    want = Counter((r["word"], r["count"]) for r in spark_reference(spark, inp).collect())
    assert Counter(sink.results()) == want, "running counts lost or twice"


def _batch_ids(checkpoint: str, sub: str) -> set[str]:
    d = os.path.join(checkpoint, sub)
    return {n for n in os.listdir(d) if n.isdigit()} if os.path.isdir(d) else set()


def _spark_committed_everything(checkpoint: str, batches: int = 0) -> bool:
    """Every micro-batch the query planned (``offsets/<id>``) is committed
    (``commits/<id>``), at least ``batches`` of them: Spark will not send them again."""
    planned = _batch_ids(checkpoint, "offsets")
    return len(planned) >= max(1, batches) and planned <= _batch_ids(checkpoint, "commits")


def test_a_spark_fed_job_restored_in_a_new_process_loses_no_committed_rows(spark, tmp_path):
    """The driver's process ends (job, bridge and Spark query gone at once) after Spark
    committed micro-batches whose rows reflow took after its restore point; a new bridge,
    the query started again from its checkpoint and ``job.run(restore_from=...)`` give
    running counts equal to Spark's batch reference: the rows Spark will not send again
    come from the bridge's spool (nothing lost), the rest from Spark (nothing twice)."""
    import dataclasses

    import ray

    inp, spool, query_ckpt = (str(tmp_path / n) for n in ("in", "spool", "ckpt-in"))
    write_files(inp, range(0, 2), 300, seed=13)
    sink = TestingSink(str(tmp_path / "out"))  # exactly-once: the job checkpoints
    # checkpoints on (the spool with them), none periodic within the test: the savepoint
    # is the restore point, so the rows after it are surely past it
    cfg = dataclasses.replace(CFG, checkpoint_interval_s=3600,
                              checkpoint_dir=str(tmp_path / "chk"))
    name = f"restart-{time.time_ns()}"

    def start(restore_from: str | None = None) -> tuple[SparkSource, Any, SparkLink]:
        src = SparkSource("line STRING NOT NULL", name=name, chunk_rows=50, queue_chunks=2,
                          partitions=2, spool_dir=spool)
        job = StreamJob("wc-restart", parallelism=2, config=cfg)
        build_wordcount(job, src, sink, source_parallelism=2)
        handle = job.run(restore_from=restore_from)
        link = SparkLink(spark, handle, poll_interval_s=0.1)
        link.feed(src, lines_df(spark, inp), trigger={"processingTime": "200 milliseconds"},
                  checkpoint=query_ckpt)
        return src, handle, link

    src, handle, link = start()
    try:
        wait_for(lambda: src.stats()["rows_taken"] == 600, what="the first files taken")
        savepoint = handle.savepoint(str(tmp_path / "sp"))
        write_files(inp, range(2, 4), 300, seed=13)
        wait_for(lambda: src.stats()["rows_taken"] == 1200, what="rows after the savepoint")
        wait_for(lambda: _spark_committed_everything(query_ckpt),
                 what="Spark committing the batches after the savepoint")
        assert src.stats()["spool_chunks"] >= 600 // 50, "rows past the savepoint not spooled"
    finally:  # the process ends: no savepoint, no drain, no commit
        link.close(stop_job=False)  # the queries and the bridge actors
        with contextlib.suppress(Exception):
            ray.kill(handle._master)  # its task actors go with it
    write_files(inp, range(4, 6), 300, seed=13)
    src, handle, link = start(restore_from=savepoint)
    with link:  # one micro-batch per file: Spark commits one once reflow took all of it
        wait_for(lambda: _spark_committed_everything(query_ckpt, batches=6), timeout=180,
                 what="Spark committing the new files")
        link.stop_feeds()
        st_ = handle.wait(180)
        loaded = src.stats()["spool_chunks_loaded"]
    assert st_.state == "finished" and st_.checkpoints.restored_from == savepoint, st_
    assert loaded >= 600 // 50, "nothing read from the spool"
    want = Counter((r["word"], r["count"]) for r in spark_reference(spark, inp).collect())
    assert Counter(sink.results()) == want, "running counts lost or twice"


def test_the_output_logs_reader_sees_committed_segments_only(spark, tmp_path):
    """Two-phase commit of the output log (what a checkpointing job does with it): what a
    writer pre-committed is durable but Spark's reader does not see it; a commit shows it,
    once; data of a writer that died before pre-committing is never seen."""
    from engine.time.clock import ManualClock

    log_dir, out_dir, ckpt = (str(tmp_path / n) for n in ("log", "out", "ckpt"))
    sink = OutputLogSink(log_dir, WC_SCHEMA, rows_per_segment=50, linger_s=3600.0)
    sink.prepare()
    w = sink.open(0, 1, ManualClock())
    w.begin_transactions()
    dead = sink.open(1, 2, ManualClock())
    dead.begin_transactions()
    dead.write([("lost", i) for i in range(30)], [0] * 30)
    dead.flush()  # durable, pending, never pre-committed: a failure came first
    w.write([(f"w{i % 5}", i) for i in range(120)], [0] * 120)
    t1 = w.pre_commit(1)
    w.write([(f"w{i % 5}", i) for i in range(120, 150)], [0] * 30)
    t2 = w.pre_commit(2)

    def read_all() -> list[tuple[str, int]]:
        q = (spark.readStream.format("reflow").load(log_dir).writeStream.format("parquet")
             .option("path", out_dir).option("checkpointLocation", ckpt)
             .trigger(availableNow=True).start())
        q.awaitTermination(120)
        assert q.exception() is None
        if not os.path.exists(out_dir) or not any(n.endswith(".parquet")
                                                  for n in os.listdir(out_dir)):
            return []
        return sorted((r["word"], r["count"]) for r in spark.read.parquet(out_dir).collect())

    assert read_all() == [], "pre-committed segments are invisible"
    w.commit([t1])
    assert read_all() == sorted((f"w{i % 5}", i) for i in range(120))
    dead.close()  # its process is gone
    w.commit([t1, t2])  # a recovery commits the restored checkpoint's again: no-op for t1
    assert read_all() == sorted((f"w{i % 5}", i) for i in range(150)), "each row once"
    w.close()
    assert not any("lost" in str(p) for p in os.listdir(log_dir))


# ----------------------------------------------------------------- replay


def _drop_last_commit(checkpoint: str) -> int:
    commits = os.path.join(checkpoint, "commits")
    last = max(int(n) for n in os.listdir(commits) if n.isdigit())
    os.remove(os.path.join(commits, str(last)))
    crc = os.path.join(commits, f".{last}.crc")
    if os.path.exists(crc):
        os.remove(crc)
    return last


@pytest.mark.parametrize("mode", ["foreach_batch", "datasource"])
def test_replayed_micro_batch_is_not_ingested_twice(spark, ray_cluster, tmp_path, mode):
    inp = str(tmp_path / "in")
    lines = write_files(inp, range(2), 400, seed=3)
    src = SparkSource("line STRING NOT NULL", name=f"replay-{mode}-{time.time_ns()}",
                      chunk_rows=300)
    sink = TestingSink()
    job = StreamJob("replay", parallelism=1, config=CFG)
    build_wordcount(job, src, sink)
    handle = job.run()
    ckpt = str(tmp_path / "ckpt")
    stream = f"ckpt:{ckpt}"

    def run_query():
        w = lines_df(spark, inp).writeStream.option("checkpointLocation", ckpt)
        if mode == "foreach_batch":
            w = w.foreachBatch(src.foreach_batch(stream))
        else:
            w = w.format("reflow").options(**src.writer_options(stream))
        q = w.trigger(availableNow=True).start()
        q.awaitTermination(120)
        assert q.exception() is None
        return q

    try:
        run_query()
        assert src.stats()["rows_taken"] == len(lines)
        # as if Spark crashed after reflow took the last batch but before the batch's commit
        # log entry: on restart Spark runs that batch again with the same offsets

        replayed = _drop_last_commit(ckpt)
        run_query()
        st = src.stats()
        assert st["last_batch_id"] == replayed
        assert st["duplicate_rows"] == 400  # the whole replayed batch, acknowledged and dropped
        assert st["rows_taken"] == len(lines)
        src.end_input()
        handle.wait(60)
        final: dict[str, int] = {}
        for w, c in sink.results():
            final[w] = max(final.get(w, 0), c)
        expected: dict[str, int] = {}
        for line in lines:
            for w in line.split():
                expected[w] = expected.get(w, 0) + 1
        assert final == expected
        assert len(sink.results()) == sum(expected.values())
        handle.stop()
        src.close()
        # a closed source answers with the figures its bridge had, starting no new one
        assert src.stats()["rows_taken"] == len(lines) and src._actor is None
    finally:
        handle.stop()
        src.close()


# ----------------------------------------------------------------- the reader


def test_reader_resumes_from_committed_offset_after_restart(spark, ray_cluster, tmp_path):
    log_dir, out_dir, ckpt = (str(tmp_path / n) for n in ("log", "out", "ckpt"))
    sink = OutputLogSink(log_dir, WC_SCHEMA, rows_per_segment=100)
    first = [(f"k{i % 7}", i) for i in range(500)]
    second = [(f"k{i % 7}", i) for i in range(500, 800)]

    def write_log(records):
        job = StreamJob("writer", parallelism=2, config=CFG)
        job.source(TestingSource(records), name="src", parallelism=2).sink(sink, name="log")
        job.run().wait(60)

    def read_all():
        q = (spark.readStream.format("reflow").load(log_dir).writeStream.format("parquet")
             .option("path", out_dir).option("checkpointLocation", ckpt).start())
        q.processAllAvailable()
        progress = [p for p in q.recentProgress if p["numInputRows"] > 0]
        q.stop()
        return progress

    write_log(first)
    p1 = read_all()
    done = p1[-1]["sources"][0]["endOffset"]
    assert spark.read.parquet(out_dir).count() == len(first)
    write_log(second)  # new writers append to the same log
    p2 = read_all()
    # the restarted query starts at the offset the first one ended (and committed) at
    assert json.loads(p2[0]["sources"][0]["startOffset"]) == json.loads(done)
    rows = {(r["word"], r["count"]) for r in spark.read.parquet(out_dir).collect()}
    assert spark.read.parquet(out_dir).count() == len(first) + len(second)
    assert rows == set(first + second)


# ----------------------------------------------------------------- bad input


def test_bad_rows_go_to_dead_letters_and_are_counted(spark, ray_cluster, tmp_path):
    inp = str(tmp_path / "in")
    os.makedirs(inp)
    with open(os.path.join(inp, "a.csv"), "w") as f:
        f.write("a,1\nb,2\na,x\n,4\nb,5\nc,9999999999999999999999\na,3\n")
    df = spark.readStream.schema("word STRING, n STRING").csv(inp)
    dl = str(tmp_path / "dead")
    src = SparkSource("word STRING NOT NULL, n BIGINT NOT NULL", name=f"bad-{time.time_ns()}",
                      dead_letter_dir=dl)
    log_dir = str(tmp_path / "log")
    out = OutputLogSink(log_dir, "word STRING NOT NULL, total BIGINT NOT NULL")
    job = StreamJob("bad", parallelism=1, config=CFG)
    (job.source(src, name="rows").key_by(key_of).reduce(sum_second, name="sum")
        .map(SpoilAt("b", 7), name="spoil")
        .sink(out, name="log"))
    handle = job.run()
    with SparkLink(spark, handle, poll_interval_s=0.1) as link:
        link.feed(src, df, trigger={"availableNow": True},
                  checkpoint=str(tmp_path / "ckpt"))
        handle.wait(120)
        stats = src.stats()
    assert stats["dead_letters"] == 3 and stats["rows_taken"] == 4
    bad = spark.read.parquet(dl).collect()
    assert sorted(r["reason"].split(":")[0] for r in bad) == [
        "column 'n'", "column 'n'", "column 'word' is null but declared NOT NULL"]
    assert {json.loads(r["row"])["n"] for r in bad} == {"x", "4", "9999999999999999999999"}
    # the output log's own bad records (b's running total 7 spoiled to a string)
    assert out.dead_letters() == 1
    segments = [os.path.join(log_dir, n) for n in sorted(os.listdir(log_dir))
                if n.startswith("seg-")]
    got = sorted(r for p in segments for r in to_records(pq.read_table(p)))
    assert got == [("a", 1), ("a", 4), ("b", 2)]


def test_columnar_source_hands_arrow_batches_to_vectorised_aggregations(spark, ray_cluster,
                                                                        tmp_path):
    """SparkSource(columnar=True): Spark's Arrow batches go on as column batches (no rows
    made) into key_by a column and the vectorised Count and Sum."""
    from engine.operators.vectorised import Count, Sum

    inp = str(tmp_path / "in")
    os.makedirs(inp)
    rng = random.Random(3)
    rows = [(f"w{rng.randrange(20)}", rng.randrange(100)) for _ in range(3000)]
    for i in range(3):
        with open(os.path.join(inp, f"p{i}.csv"), "w") as f:
            f.writelines(f"{w},{n}\n" for w, n in rows[i * 1000:(i + 1) * 1000])
    df = spark.readStream.schema("word STRING, n BIGINT").csv(inp)
    src = SparkSource("word STRING NOT NULL, n BIGINT NOT NULL", name=f"col-{time.time_ns()}",
                      columnar=True)
    sink = TestingSink()
    job = StreamJob("columnar-spark", parallelism=2, config=CFG)
    (job.source(src, name="rows", parallelism=1).key_by("word")
        .aggregate(Count(), Sum("n"), name="agg").sink(sink, name="out"))
    handle = job.run()
    with SparkLink(spark, handle, poll_interval_s=0.1) as link:
        link.feed(src, df, trigger={"availableNow": True}, checkpoint=str(tmp_path / "ckpt"))
        handle.wait(120)
    final: dict = {}
    for r in sink.results():
        assert set(r) == {"word", "count()", "sum(n)"}
        c, t = final.get(r["word"], (0, 0))
        final[r["word"]] = (max(c, r["count()"]), max(t, r["sum(n)"]))
    want: dict = {}
    for w, n in rows:
        c, t = want.get(w, (0, 0))
        want[w] = (c + 1, t + n)
    assert final == want and len(sink.results()) == len(rows)


# ----------------------------------------------------------------- failures cross over


def test_spark_query_failure_fails_the_reflow_job(spark, ray_cluster, tmp_path):
    from pyspark.sql import functions as F

    inp = str(tmp_path / "in")
    write_files(inp, range(1), 50, seed=5)
    with open(os.path.join(inp, "z.txt"), "w") as f:
        f.write("poison\n")
    df = lines_df(spark, inp).select(
        F.when(F.col("line") == "poison", F.raise_error(F.lit("poison pill xyz-42")))
        .otherwise(F.col("line")).alias("line"))
    src = SparkSource("line STRING NOT NULL", name=f"fail-{time.time_ns()}")
    job = StreamJob("fails", parallelism=1, config=CFG)
    build_wordcount(job, src, TestingSink())
    handle = job.run()
    with SparkLink(spark, handle, poll_interval_s=0.1) as link:
        q = link.feed(src, df, trigger={"processingTime": "100 milliseconds"},
                      checkpoint=str(tmp_path / "ckpt"))
        with pytest.raises(JobFailedError, match="xyz-42"):
            handle.wait(120)
        assert q.exception() is not None
        assert "xyz-42" in handle.status().error


def test_reflow_job_failure_fails_the_spark_queries(spark, ray_cluster, tmp_path):
    inp = str(tmp_path / "in")
    write_files(inp, range(2), 200, seed=6)
    src = SparkSource("line STRING NOT NULL", name=f"kaput-{time.time_ns()}")
    out = OutputLogSink(str(tmp_path / "log"), WC_SCHEMA)
    job = StreamJob("kaput", parallelism=1, config=CFG)
    build_wordcount(job, src, out, word_filter=RaiseOn("bb", "kaput-123"))
    handle = job.run()
    with SparkLink(spark, handle, poll_interval_s=0.1) as link:
        feed = link.feed(src, lines_df(spark, inp), mode="datasource",
                         trigger={"processingTime": "100 milliseconds"},
                         checkpoint=str(tmp_path / "ckpt"))
        reader = link.watch(link.read_stream(out).writeStream.format("noop")
                            .trigger(processingTime="100 milliseconds").start())
        with pytest.raises(JobFailedError, match="kaput-123"):
            handle.wait(120)
        for q in (feed, reader):
            deadline = time.monotonic() + 60
            while q.isActive and time.monotonic() < deadline:
                time.sleep(0.1)
            assert "kaput-123" in str(q.exception())


# ----------------------------------------------------------------- pure parts


def test_schema_parsing_and_conforming():
    s = parse_schema("`word` STRING NOT NULL, n bigint, ts TIMESTAMP, d DATE, v VARCHAR(10)")
    assert s.names == ["word", "n", "ts", "d", "v"]
    assert parse_schema(s.ddl()) == s
    for bad in ("", "x MAP<STRING,INT>", "a INT, a INT", "nonsense"):
        with pytest.raises(SchemaError):
            parse_schema(bad)
    table = pa.table({"word": ["a", None, "c"], "n": ["1", "2", "three"], "extra": [1, 2, 3]})
    good, bad = conform(table, parse_schema("word STRING NOT NULL, n BIGINT"))
    assert good.to_pylist() == [{"word": "a", "n": 1}]
    assert [b.index for b in bad] == [1, 2]
    assert to_records(good) == [("a", 1)]
    t, bad2 = records_to_table([("a", 1), ("b", "x"), ["c", 3], {"word": "d", "n": 4}, "e"],
                               parse_schema("word STRING NOT NULL, n BIGINT"))
    assert to_records(t) == [("a", 1), ("c", 3), ("d", 4)]
    assert [i for i, _, _ in bad2] == [1, 4]
    chunks = list(rechunk([pa.record_batch({"x": list(range(5))}),
                           pa.record_batch({"x": list(range(5, 12))})], 4))
    assert [c.column("x").to_pylist() for c in chunks] == [[0, 1, 2, 3], [4, 5, 6, 7],
                                                            [8, 9, 10, 11]]


def test_log_offsets_count_contiguous_segments_only(tmp_path):
    d = str(tmp_path)
    w1, w2 = "0000000000000000001-t0000-aaaaaaaa", "0000000000000000002-t0001-bbbbbbbb"
    for w, ns in ((w1, (0, 1, 3)), (w2, (1,))):
        for n in ns:
            open(os.path.join(d, segment_name(w, n)), "w").close()
    open(os.path.join(d, ".seg-tmp.parquet.tmp"), "w").close()
    assert latest_offset(d) == {w1: 2}  # w1's segment 2 is not visible yet; w2 lacks 0
    shutil.rmtree(d)
