"""Driver-side glue between Spark Structured Streaming queries and a running reflow job.

``SparkLink(spark, handle)`` starts the queries that feed ``SparkSource``s, builds streaming
DataFrames over ``OutputLogSink`` logs, and runs one watcher thread that carries events
across:

* a Spark query fails -> every linked ``SparkSource`` fails with Spark's message, so its
  source tasks raise and ``handle.wait()`` raises ``JobFailedError`` naming it;
* the reflow job fails -> every bridge fails (the next ``put`` raises, so each feeding
  query fails with reflow's error) and every linked output log is marked failed (its
  reader queries fail with the same error);
* every query feeding a source has ended normally (``availableNow`` done, or stopped) ->
  the source's input ends, so the job can finish;
* the job has finished or been stopped -> every linked output log is sealed, so
  ``wait_output`` knows the final offset.

``close()`` shuts down in order: watcher, Spark queries, the reflow job, the bridge actors.
``local_spark()`` builds a local-mode session (any master via ``master=`` or
``REFLOW_SPARK_MASTER``) with the ``"reflow"`` data source registered, whose Python workers
run the driver's interpreter (``sys.executable``) unless one was configured.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import threading
import time
from typing import Any

from engine.spark.bridge import SparkSource
from engine.spark.outlog import (
    SCHEMA_FILE,
    OutputLogSink,
    failure,
    mark_failed,
    seal,
    sealed_offset,
)

log = logging.getLogger(__name__)


def local_spark(app_name: str = "reflow", master: str | None = None,
                conf: dict[str, Any] | None = None, shuffle_partitions: int = 2,
                log_level: str = "ERROR") -> Any:
    """A SparkSession (local mode unless ``master``/``REFLOW_SPARK_MASTER`` says otherwise)
    with the ``"reflow"`` data source registered. ``spark.stop()`` ends it; the JVM exits
    with this process.

    Spark's Python workers (UDFs, the ``"reflow"`` data source's readers and writers on the
    executors) run ``python_worker_executable(conf)``: the interpreter this process runs on,
    unless ``PYSPARK_PYTHON`` or ``conf["spark.pyspark.python"]`` names another. PySpark's
    own default is ``python3`` from ``PATH``, which under ``ray job submit``, cron or a
    virtualenv not on ``PATH`` is an interpreter without reflow's packages."""
    from pyspark.sql import SparkSession

    python = python_worker_executable(conf)
    # PySpark reads PYSPARK_PYTHON when it creates the SparkContext; the JVM takes the
    # worker executable from each Python function it is handed, not from the conf.
    os.environ["PYSPARK_PYTHON"] = python
    conf = {**(conf or {}), "spark.pyspark.python": python}
    master = master or os.environ.get("REFLOW_SPARK_MASTER") or "local[*]"
    b = (SparkSession.builder.master(master).appName(app_name)
         .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.streaming.noDataProgressEventInterval", "1000"))
    for k, v in (conf or {}).items():
        b = b.config(k, str(v))
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    register(spark)
    return spark


def python_worker_executable(conf: dict[str, Any] | None = None) -> str:
    """The Python Spark's workers run: ``conf["spark.pyspark.python"]``, else
    ``PYSPARK_PYTHON``, else this process's interpreter (``sys.executable``)."""
    return str((conf or {}).get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON")
               or sys.executable)


def register(spark: Any) -> None:
    """Register the ``"reflow"`` Python data source with ``spark`` (idempotent)."""
    from engine.spark.datasource import ReflowDataSource

    spark.dataSource.register(ReflowDataSource)


_ERROR_LINE = re.compile(r"([A-Za-z_][\w.]*(?:Exception|Error)): (.+)$")


def spark_error_summary(exc: BaseException) -> str:
    """The error Spark reports, without the Py4J/JVM wrapping: the last
    ``SomeError: message`` line of its text (else its first line)."""
    text = str(exc)
    found = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(("at ", "File ")):
            continue
        m = _ERROR_LINE.search(stripped)
        if m:
            found = f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(2)}"
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return found or first


def _apply_trigger(writer: Any, trigger: dict[str, Any] | None) -> Any:
    return writer.trigger(**trigger) if trigger else writer


class SparkLink:
    """See the module docstring. ``handle``: the reflow ``JobHandle``."""

    def __init__(self, spark: Any, handle: Any, poll_interval_s: float = 0.25) -> None:
        self.spark = spark
        self.handle = handle
        self.poll_interval_s = poll_interval_s
        register(spark)
        self._lock = threading.Lock()
        self._sources: dict[str, SparkSource] = {}
        self._feeds: list[tuple[Any, SparkSource]] = []
        self._queries: list[Any] = []  # every query started or watched here
        self._logs: dict[str, str] = {}  # directory -> directory
        self._done: set[str] = set()  # query ids already handled
        self._ended: set[str] = set()  # sources whose input was ended
        self.spark_error: str | None = None
        self.spark_error_full: str | None = None
        self.job_error: str | None = None
        self.job_state = "running"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="reflow-spark-link",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ Spark -> reflow
    def feed(self, source: SparkSource, df: Any, *, mode: str = "foreach_batch",
             checkpoint: str | None = None, trigger: dict[str, Any] | None = None,
             query_name: str | None = None, options: dict[str, str] | None = None) -> Any:
        """Start a streaming query writing ``df`` into ``source``; returns the
        ``StreamingQuery``. ``mode``: ``"foreach_batch"`` (each micro-batch goes through
        the Spark driver as Arrow) or ``"datasource"`` (``format("reflow")``: executors
        push their partitions in parallel). ``checkpoint`` (a temp dir when None) is the
        query's Spark checkpoint and its dedupe identity: restart with the same one to
        resume without ingesting a batch twice. ``trigger``: keyword arguments of
        ``DataStreamWriter.trigger``, e.g. ``{"availableNow": True}``."""
        if mode not in ("foreach_batch", "datasource"):
            raise ValueError(f"SparkLink.feed mode must be 'foreach_batch' or 'datasource'; "
                             f"got {mode!r}")
        source.start()
        checkpoint = os.path.abspath(checkpoint or tempfile.mkdtemp(prefix="reflow-feed-ckpt-"))
        stream = f"ckpt:{checkpoint}"
        w = df.writeStream.option("checkpointLocation", checkpoint)
        for k, v in (options or {}).items():
            w = w.option(k, v)
        if query_name:
            w = w.queryName(query_name)
        if mode == "foreach_batch":
            w = w.foreachBatch(source.foreach_batch(stream))
        else:
            w = w.format("reflow").options(**source.writer_options(stream))
        w = _apply_trigger(w, trigger)
        with self._lock:
            self._sources[source.name] = source
            self._ended.discard(source.name)
        q = w.start()
        with self._lock:
            self._feeds.append((q, source))
            self._queries.append(q)
        return q

    def stop_feeds(self, graceful_timeout_s: float = 30.0) -> None:
        """Stop every feeding query, each between two micro-batches when one comes within
        ``graceful_timeout_s``; the sources' input then ends (the job can finish)."""
        for q, _ in list(self._feeds):
            deadline = time.monotonic() + graceful_timeout_s
            while q.isActive and time.monotonic() < deadline:
                with contextlib.suppress(Exception):
                    if not q.status["isTriggerActive"]:
                        break
                time.sleep(0.02)
            with contextlib.suppress(Exception):
                q.stop()

    # ------------------------------------------------------------------ reflow -> Spark
    def read_stream(self, log_or_dir: OutputLogSink | str, **options: Any) -> Any:
        """``spark.readStream.format("reflow")`` over an output log, linked here (sealed
        when the job ends, failed when it fails)."""
        directory = (log_or_dir.directory if isinstance(log_or_dir, OutputLogSink)
                     else os.path.abspath(log_or_dir))
        if isinstance(log_or_dir, OutputLogSink) and not os.path.exists(
                os.path.join(directory, SCHEMA_FILE)):
            log_or_dir.prepare()  # the job may not be deployed yet; Spark needs the schema
        with self._lock:
            self._logs[directory] = directory
        r = self.spark.readStream.format("reflow")
        for k, v in options.items():
            r = r.option(k, str(v))
        return r.load(directory)

    def watch(self, query: Any) -> Any:
        """Watch a query started elsewhere (e.g. the one writing a ``read_stream``): its
        failure fails the reflow job. Returns the query."""
        with self._lock:
            self._queries.append(query)
        return query

    def wait_output(self, query: Any, log_or_dir: OutputLogSink | str,
                    timeout: float | None = None) -> dict[str, int]:
        """Wait until the job has ended (the log is sealed) and ``query`` has processed
        and committed everything in the log; returns the final offset. Raises if the job
        or the query failed."""
        directory = (log_or_dir.directory if isinstance(log_or_dir, OutputLogSink)
                     else os.path.abspath(log_or_dir))
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            final = sealed_offset(directory)
            if final is not None:
                break
            err = failure(directory) or self.job_error
            if err:
                raise RuntimeError(f"reflow job failed: {err}")
            if not query.isActive:
                raise RuntimeError(f"query {query.name or query.id} ended before the job: "
                                   f"{query.exception()}")
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"the reflow job writing {directory} still runs")
            time.sleep(0.1)
        query.processAllAvailable()
        return final

    # ------------------------------------------------------------------ the watcher
    def _watch(self) -> None:
        while not self._stop.wait(self.poll_interval_s):
            try:
                self._check_queries()
                self._check_job()
            except Exception as exc:  # keep watching; report once
                log.warning("SparkLink watcher: %s: %s", type(exc).__name__, exc)

    def _check_queries(self) -> None:
        with self._lock:
            queries = list(self._queries)
            feeds = list(self._feeds)
        for q in queries:
            qid = str(q.id)
            if qid in self._done or q.isActive:
                continue
            self._done.add(qid)
            exc = q.exception()
            if exc is not None:
                msg = f"Spark query {q.name or qid} failed: {spark_error_summary(exc)}"
                log.warning("%s\n%s", msg, exc)
                self.spark_error = self.spark_error or msg
                self.spark_error_full = self.spark_error_full or str(exc)
                self._fail_reflow(msg)
        for name, source in list(self._sources.items()):
            mine = [q for q, s in feeds if s is source]
            if (name not in self._ended and mine and self.spark_error is None
                    and all(not q.isActive and q.exception() is None for q in mine)):
                self._ended.add(name)
                source.end_input()

    def _fail_reflow(self, msg: str) -> None:
        if not self._sources:
            log.warning("%s; no SparkSource is linked, so the reflow job cannot be failed "
                        "from here", msg)
        for source in self._sources.values():
            with contextlib.suppress(Exception):
                source.fail(msg)

    def _check_job(self) -> None:
        if self.job_state not in ("running", "created"):
            return
        st = self.handle.status()
        if st.state in ("running", "created"):
            return
        self.job_state = st.state
        if st.state == "failed":
            self.job_error = st.error
            msg = f"reflow job {self.handle.job_id} failed: {st.error}"
            for source in self._sources.values():
                with contextlib.suppress(Exception):
                    source.fail(msg)
            for d in list(self._logs):
                mark_failed(d, msg)
        else:  # finished or stopped: every sink writer is closed
            for d in list(self._logs):
                seal(d)

    # ------------------------------------------------------------------ shutdown
    def close(self, stop_job: bool = True) -> None:
        """Stop the watcher, every query started or watched here, the job (unless
        ``stop_job`` is False) and the bridge actors. Safe to call twice."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)
        for q in list(self._queries):
            with contextlib.suppress(Exception):
                q.stop()
        if stop_job:
            with contextlib.suppress(Exception):
                self.handle.stop()
        for source in self._sources.values():
            source.close()

    def __enter__(self) -> SparkLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
