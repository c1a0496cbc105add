"""Driver-side glue between Spark Structured Streaming queries and a running reflow job.

``SparkLink(spark, handle)`` starts the queries that feed ``SparkSource``s, builds streaming
DataFrames over ``OutputLogSink`` logs, and runs one watcher thread that carries events
across:

* a Spark query fails -> every linked ``SparkSource`` fails with Spark's message, so its
  source tasks raise and ``handle.wait()`` raises ``JobFailedError`` naming it; except a
  query the link started (``feed``, ``start``) that failed in Spark's own start-up of a
  Python worker (``QueryRestarts``): that one is started again from its checkpoint, up to
  ``query_restarts`` times, and the job never sees it;
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
run the driver's interpreter (``sys.executable``) unless one was configured; in local mode
through ``worker_launcher``, so they import the installed, byte-compiled pyspark.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import shlex
import shutil
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
    executors, its planners and streaming runners on the driver) run
    ``python_worker_executable(conf)``: the interpreter this process runs on, unless
    ``PYSPARK_PYTHON`` or ``conf["spark.pyspark.python"]`` names another. PySpark's own
    default is ``python3`` from ``PATH``, which under ``ray job submit``, cron or a
    virtualenv not on ``PATH`` is an interpreter without reflow's packages. In local mode,
    when neither names one, the workers start through ``worker_launcher``."""
    from pyspark.sql import SparkSession

    master = master or os.environ.get("REFLOW_SPARK_MASTER") or "local[*]"
    python = python_worker_executable(conf)
    if python == sys.executable and master.startswith("local"):
        python = worker_launcher(python)
    # PySpark reads PYSPARK_PYTHON when it creates the SparkContext; the JVM takes the
    # worker executable from each Python function it is handed, not from the conf.
    os.environ["PYSPARK_PYTHON"] = python
    conf = {**(conf or {}), "spark.pyspark.python": python}
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
    ``PYSPARK_PYTHON``, else this process's interpreter (``sys.executable``). A
    ``worker_launcher`` an earlier ``local_spark`` of this process left in ``PYSPARK_PYTHON``
    counts as the interpreter it launches, not as the user's choice (so a later session
    with another master gets the interpreter itself)."""
    configured = str((conf or {}).get("spark.pyspark.python")
                     or os.environ.get("PYSPARK_PYTHON") or sys.executable)
    return next((python for python, launcher in _launchers.items() if launcher == configured),
                configured)


_LAUNCHER = """#!/bin/sh
# Written by reflow (engine.spark.link.worker_launcher): starts Spark's Python workers on
# the interpreter below, importing the installed pyspark (byte-compiled once) instead of
# the zipped copy Spark puts first on their PYTHONPATH, which every worker compiles anew.
set -f
kept=
IFS=:
for entry in $PYTHONPATH; do
  case "$entry" in
    {zips}/*.zip) ;;
    *) kept="${{kept:+$kept:}}$entry" ;;
  esac
done
unset IFS
PYTHONPATH=$kept
export PYTHONPATH
exec {python} "$@"
"""
_launchers: dict[str, str] = {}  # python -> its launcher, made once per process


def worker_launcher(python: str) -> str:
    """An executable that runs ``python`` for Spark's Python workers with the installed
    pyspark's ``python/lib/*.zip`` taken off their ``PYTHONPATH``; ``python`` itself when
    pyspark is not installed with its zips (a Spark distribution's own ``python/``).

    Why: Spark starts a Python process for every planner, commit and streaming runner (and
    gives it a fixed 10 s to connect back) with ``$SPARK_HOME/python/lib/pyspark.zip``
    first on its path. Python cannot cache bytecode for modules imported from a zip, so
    each of them compiles pyspark anew: 1.6 s of CPU against 0.5 s from the installed,
    byte-compiled package, the same files (a pip install's zip is built from them). The
    launcher is a shell script in a temp directory of this process's, removed at exit;
    ``python`` itself where that directory's file system does not execute files."""
    import pyspark

    if python in _launchers:
        return _launchers[python]
    zips = os.path.join(os.path.dirname(os.path.abspath(pyspark.__file__)), "python", "lib")
    if not os.path.isfile(os.path.join(zips, "pyspark.zip")):
        return python
    directory = tempfile.mkdtemp(prefix="reflow-spark-python-")
    if os.statvfs(directory).f_flag & getattr(os, "ST_NOEXEC", 0):  # e.g. a hardened /tmp
        shutil.rmtree(directory, ignore_errors=True)
        return python
    atexit.register(shutil.rmtree, directory, True)
    path = os.path.join(directory, "python")
    with open(path, "w") as f:
        f.write(_LAUNCHER.format(zips=shlex.quote(zips), python=shlex.quote(python)))
    os.chmod(path, 0o700)
    _launchers[python] = path
    return path


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


#: Failures of Spark's own machinery starting a query's Python worker, not of the query's
#: data or code. Spark waits a fixed 10 s for a new Python worker (the data source's reader
#: on the driver, a planner, a commit) to connect back (``PythonWorkerFactory``; no Spark
#: setting changes it), which a machine with many more runnable processes than cores
#: misses. Spark's own answer is to restart the query from its checkpoint.
TRANSIENT_SPARK_ERRORS = ("Python worker failed to connect back",)


class QueryRestarts:
    """Whether a failed query is started again: only a query the link started (it holds the
    writer, so the restart resumes from the query's checkpoint: the feed's dedupe and
    Spark's file sinks make that exactly-once), only for a ``TRANSIENT_SPARK_ERRORS``
    failure, at most ``limit`` times per query (Spark's query id, which a checkpoint
    keeps)."""

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"query_restarts must be >= 0; got {limit}")
        self.limit = limit
        self.used: dict[str, int] = {}  # query id -> restarts so far

    def should_restart(self, query_id: str, error: str) -> bool:
        """True (and counted) when the query ``query_id`` that failed with ``error`` is to
        be started again."""
        if not any(t in error for t in TRANSIENT_SPARK_ERRORS):
            return False
        if self.used.get(query_id, 0) >= self.limit:
            return False
        self.used[query_id] = self.used.get(query_id, 0) + 1
        return True


def _apply_trigger(writer: Any, trigger: dict[str, Any] | None) -> Any:
    return writer.trigger(**trigger) if trigger else writer


class SparkLink:
    """See the module docstring. ``handle``: the reflow ``JobHandle``; ``query_restarts``:
    how often one query the link started may be started again after a failure of Spark's
    Python worker start-up (``QueryRestarts``)."""

    def __init__(self, spark: Any, handle: Any, poll_interval_s: float = 0.25,
                 query_restarts: int = 3) -> None:
        self.spark = spark
        self.handle = handle
        self.poll_interval_s = poll_interval_s
        register(spark)
        self._lock = threading.Lock()
        self._sources: dict[str, SparkSource] = {}
        self._feeds: list[tuple[Any, SparkSource]] = []
        self._queries: list[Any] = []  # every query started or watched here
        self._logs: dict[str, str] = {}  # directory -> directory
        self._done: set[str] = set()  # query run ids already handled
        self._writers: dict[str, Any] = {}  # query id -> the DataStreamWriter that started it
        self._restarts = QueryRestarts(query_restarts)
        self._checking = threading.Lock()  # one _check_queries at a time
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
            self._writers[str(q.id)] = w
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

    def start(self, writer: Any) -> Any:
        """Start ``writer``'s query (a ``DataStreamWriter``, e.g. of a ``read_stream``, with
        a ``checkpointLocation``) and watch it: its failure fails the reflow job, except a
        failure of Spark's Python worker start-up, after which the link starts it again
        from its checkpoint. Returns the ``StreamingQuery`` (``current`` gives the one
        running after a restart)."""
        q = writer.start()
        with self._lock:
            self._queries.append(q)
            self._writers[str(q.id)] = writer
        return q

    def watch(self, query: Any) -> Any:
        """Watch a query started elsewhere: its failure fails the reflow job (the link
        cannot start it again: prefer ``start``). Returns the query."""
        with self._lock:
            self._queries.append(query)
        return query

    def current(self, query: Any) -> Any:
        """The query running in place of ``query`` (the same Spark query id) after a
        restart; ``query`` itself if none."""
        with self._lock:
            return next((q for q in reversed(self._queries) if str(q.id) == str(query.id)),
                        query)

    def wait_output(self, query: Any, log_or_dir: OutputLogSink | str,
                    timeout: float | None = None) -> dict[str, int]:
        """Wait until the job has ended (the log is sealed) and ``query`` has processed
        and committed everything in the log; returns the final offset. Raises if the job
        or the query failed; a query the link restarts (``start``) is followed to the one
        running in its place."""
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
            if not self.current(query).isActive:
                self._check_queries()  # a failure the link restarts is not the end
                q = self.current(query)
                if not q.isActive:
                    raise RuntimeError(f"query {q.name or q.id} ended before the job: "
                                       f"{q.exception()}")
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"the reflow job writing {directory} still runs")
            time.sleep(0.1)
        while True:
            q = self.current(query)
            try:
                q.processAllAvailable()
                return final
            except Exception:
                # a query that fails while this waits (e.g. Spark's start-up of its reader
                # missed the connect-back) may be one the link restarts: wait on that one
                ends = time.monotonic() + 30
                while q.isActive and time.monotonic() < ends:
                    time.sleep(0.05)  # Spark marks it terminated just after it raised
                self._check_queries()
                if str(self.current(query).runId) == str(q.runId):
                    raise

    # ------------------------------------------------------------------ the watcher
    def _watch(self) -> None:
        while not self._stop.wait(self.poll_interval_s):
            try:
                self._check_queries()
                self._check_job()
            except Exception as exc:  # keep watching; report once
                log.warning("SparkLink watcher: %s: %s", type(exc).__name__, exc)

    def _check_queries(self) -> None:
        with self._checking:
            self._check_queries_locked()

    def _check_queries_locked(self) -> None:
        with self._lock:
            queries = list(self._queries)
        for q in queries:
            qid = str(q.id)
            if str(q.runId) in self._done or q.isActive:
                continue
            self._done.add(str(q.runId))
            exc = q.exception()
            if exc is not None and self._restart(q, str(exc)):
                continue
            if exc is not None:
                msg = f"Spark query {q.name or qid} failed: {spark_error_summary(exc)}"
                log.warning("%s\n%s", msg, exc)
                self.spark_error = self.spark_error or msg
                self.spark_error_full = self.spark_error_full or str(exc)
                self._fail_reflow(msg)
        with self._lock:
            feeds = list(self._feeds)
        for name, source in list(self._sources.items()):
            mine = [q for q, s in feeds if s is source]
            if (name not in self._ended and mine and self.spark_error is None
                    and all(not q.isActive and q.exception() is None for q in mine)):
                self._ended.add(name)
                source.end_input()

    def _restart(self, query: Any, error: str) -> bool:
        """Start ``query``'s writer again when ``QueryRestarts`` says so; True if it did."""
        qid = str(query.id)
        writer = self._writers.get(qid)
        if writer is None or not self._restarts.should_restart(qid, error):
            return False
        try:
            new = writer.start()
        except Exception as exc:  # it cannot start again: the original failure stands
            log.warning("Spark query %s could not be restarted: %s", query.name or qid,
                        spark_error_summary(exc))
            return False
        with self._lock:
            self._queries = [new if q is query else q for q in self._queries]
            self._feeds = [(new if q is query else q, s) for q, s in self._feeds]
        log.warning("Spark query %s failed in Spark's start-up of a Python worker (%s); "
                    "restarted from its checkpoint (restart %d of at most %d)",
                    query.name or qid, spark_error_summary(RuntimeError(error)),
                    self._restarts.used[qid], self._restarts.limit)
        return True

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
