"""Task metrics snapshots and the job's Prometheus endpoint.

Tasks keep plain counters (``TaskCore``) and send ``TaskMetrics`` snapshots; the JobMaster
polls them and serves them, with rescale progress, on one endpoint per job
(prometheus-client, bound to 127.0.0.1 unless configured). Names follow Prometheus
conventions: ``reflow_`` prefix, base units, ``_total`` counters, ``_seconds``.
"""

from __future__ import annotations

import os
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from engine.observability.latency import LatencyHistogram
from engine.wire.messages import wire

CHECKPOINT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@wire
@dataclass(frozen=True, slots=True)
class TaskMetrics:
    """A snapshot of one task's counters (monotonic since the task started).

    ``useful_seconds``: time in operator work (decoding input, the operators, encoding
    output), DS2's *useful time*; ``idle_seconds``: waiting for input;
    ``backpressured_seconds``: waiting for output credits. ``records_in / useful_seconds``
    is the task's true processing rate. ``source_backlog``: at a source task, records due
    or available and not read yet (``SourceReader.backlog``); None when unknown or not a
    source. ``cpu_seconds`` / ``cpu_wait_seconds``: CPU time the task's process used, and
    time it was runnable but had no CPU, since the task's first metrics snapshot
    (``process_cpu``; filled in by the task's actor, None where not measured): DS2 takes the wait out of the useful
    time and bounds scale-ups by the cores a task uses. ``at``: when the task took the
    snapshot, on its own monotonic clock (filled in by the task's actor; None: not
    stamped): a poll answered late or not at all leaves the collector an older snapshot
    than its time says, so rates are taken over the span between a task's own stamps
    (``engine.observability.rates``)."""

    task: str
    vertex: str
    task_index: int
    status: str
    records_in: int
    records_out: int
    bytes_in: int
    bytes_out: int
    useful_seconds: float
    idle_seconds: float
    backpressured_seconds: float
    queued_frames: int
    state_bytes: int
    key_groups: int
    dead_letters: int
    latency: Any
    watermark: int
    late_records: int = 0
    source_backlog: int | None = None
    cpu_seconds: float | None = None
    cpu_wait_seconds: float | None = None
    at: float | None = None


def process_cpu(thread: int | None = None) -> tuple[float, float | None]:
    """This process's CPU seconds (every thread) and the seconds its threads were runnable
    but waited for a CPU (the run-queue wait of ``/proc/self/task/*/schedstat``; None where
    the kernel does not say). A task actor is one process, so these are its task's.
    ``thread``: only that thread's wait (a native thread id: the task's loop thread, whose
    busy time the wait is taken out of; a Ray worker's other threads wait too)."""
    cpu = time.process_time()
    try:
        tids = [str(thread)] if thread is not None else os.listdir("/proc/self/task")
    except OSError:
        return cpu, None
    wait = 0.0
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                wait += int(f.read().split()[1]) / 1e9
        except FileNotFoundError:
            continue  # a thread that ended meanwhile
        except (OSError, ValueError, IndexError):
            return cpu, None
    return cpu, wait


@wire
@dataclass(frozen=True, slots=True)
class RescaleProgress:
    """What a running (or the last) rescale of ``operator`` is doing."""

    operator: str
    protocol: str
    phase: str
    key_groups_total: int
    key_groups_moved: int
    bytes_moved: int
    running: bool
    subscales_total: int = 0
    subscales_done: int = 0
    rerouted_records: int = 0
    suspended_s: float = 0.0
    propagation_delay_s: float = 0.0

    def groups(self) -> tuple[int, int]:
        """``(key groups moved, key groups to move)`` so far."""
        return self.key_groups_moved, self.key_groups_total

    def summary(self) -> str:
        """One line for people, e.g. ``drrs rescale of 'count': migrate, 12/32 key groups
        moved, subscales 3/8 (running)``."""
        subs = (f", subscales {self.subscales_done}/{self.subscales_total}"
                if self.subscales_total else "")
        return (f"{self.protocol} rescale of {self.operator!r}: {self.phase}, "
                f"{self.key_groups_moved}/{self.key_groups_total} key groups moved{subs}"
                + (" (running)" if self.running else ""))


@dataclass(frozen=True)
class JobMetrics:
    """What ``JobHandle.metrics()`` returns: every live task's snapshot and rescale progress.

    ``taken_at``: the JobMaster's monotonic seconds when it was taken (``rates_since``
    divides by the difference of two).

    ``unresponsive``: ``(task, seconds)`` for each task that did not answer this poll in
    time, with the seconds since it last answered (stuck in user code, or overloaded); its
    entry in ``tasks`` is the last snapshot it sent (its counters stood still since)."""

    job: str
    status: str
    tasks: tuple[TaskMetrics, ...]
    rescales: tuple[RescaleProgress, ...]
    endpoint: str | None
    unresponsive: tuple[tuple[str, float], ...] = ()
    taken_at: float = 0.0

    def __post_init__(self) -> None:
        if any(seconds < 0 for _, seconds in self.unresponsive):
            raise ValueError(f"unresponsive seconds must be >= 0: {self.unresponsive!r}")

    def operator(self, vertex: str) -> list[TaskMetrics]:
        return [t for t in self.tasks if t.vertex == vertex]

    def rates_since(self, earlier: JobMetrics) -> Any:
        """The ``engine.observability.rates.MetricsWindow`` between ``earlier`` (a previous
        ``JobHandle.metrics()`` of this job) and this snapshot: per operator true and observed
        processing and output rates, utilisation (MAX and mean over its tasks), capacity."""
        from engine.observability.rates import metrics_window

        return metrics_window({t.task: t for t in earlier.tasks}, {t.task: t for t in self.tasks},
                              earlier.taken_at, self.taken_at)

    def total(self, field: str, vertex: str | None = None) -> float:
        return sum(getattr(t, field) for t in self.tasks if vertex is None or t.vertex == vertex)

    def latency(self, vertex: str | None = None) -> LatencyHistogram:
        h = LatencyHistogram()
        for t in self.tasks:
            if vertex is None or t.vertex == vertex:
                h.merge(LatencyHistogram.from_wire(t.latency))
        return h


_COUNTERS = [
    ("records_in", "reflow_records_in", "Records taken in by the task"),
    ("records_out", "reflow_records_out", "Records sent by the task"),
    ("bytes_in", "reflow_bytes_in", "Encoded bytes received by the task"),
    ("bytes_out", "reflow_bytes_out", "Encoded bytes sent by the task"),
    ("useful_seconds", "reflow_useful_seconds",
     "Time in operator work: decoding input, the operators, encoding output (DS2's useful "
     "time; records_in over it is the true processing rate)"),
    ("idle_seconds", "reflow_idle_seconds", "Time spent waiting for input"),
    ("backpressured_seconds", "reflow_backpressured_seconds", "Time blocked on output credits"),
    ("dead_letters", "reflow_dead_letters", "Records sent to a dead-letter sink"),
    ("late_records", "reflow_late_records", "Records that arrived after their windows closed"),
]
_GAUGES = [
    ("queued_frames", "reflow_queued_frames", "Frames waiting in the task's input queues"),
    ("state_bytes", "reflow_state_bytes", "Logical encoded size of the task's keyed state "
     "(encoded keys plus values, before compression; timers not counted)"),
    ("key_groups", "reflow_key_groups", "Key groups held by the task"),
    ("watermark", "reflow_watermark_milliseconds", "The task's event-time watermark"),
]
_LABELS = ["job", "operator", "task"]


class JobCollector:
    """A prometheus-client collector reading the JobMaster's latest snapshots.

    ``unresponsive``: task name -> (operator, task index, monotonic time it last answered)
    for the tasks that did not answer the latest metrics poll; ``clock`` reads the same
    monotonic clock, so the gauge counts the seconds up to the scrape."""

    def __init__(self, job: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.job = job
        self.clock = clock
        self.tasks: dict[str, TaskMetrics] = {}
        self.unresponsive: dict[str, tuple[str, int, float]] = {}
        self.rescales: dict[str, RescaleProgress] = {}
        self.rescales_total: dict[str, int] = {}
        self.subscale_seconds: dict[str, list[float]] = {}  # operator -> completed subscales
        self.replication_bytes: dict[str, int] = {}
        self.replication_cpu_s: dict[str, float] = {}
        self.replicas: dict[str, int] = {}
        self.checkpoints_total: dict[str, int] = {}  # outcome (completed, failed) -> count
        self.checkpoint_durations: list[float] = []  # every completed checkpoint's, in order
        self.checkpoint_bytes = 0  # the latest completed checkpoint's
        self.checkpoint_alignment: dict[str, tuple[str, int, float]] = {}  # task -> (op, i, s)
        self.restarts = 0
        self.running = 1
        # (controller, kind, outcome) -> decisions (the controller runner's counts)
        self.decisions: dict[tuple[str, str, str], int] = {}
        self.rescale_started: dict[str, float] = {}  # operator -> clock() when it began
        self.rescale_timeout_s = 0.0  # the job's JobConfig.rescale_timeout_s

    def collect(self) -> Iterator[Any]:
        tasks = list(self.tasks.values())
        for field, name, doc in _COUNTERS:
            fam = CounterMetricFamily(name, doc, labels=_LABELS)
            for t in tasks:
                fam.add_metric([self.job, t.vertex, str(t.task_index)], getattr(t, field))
            yield fam
        for field, name, doc in _GAUGES:
            g = GaugeMetricFamily(name, doc, labels=_LABELS)
            for t in tasks:
                g.add_metric([self.job, t.vertex, str(t.task_index)], getattr(t, field))
            yield g
        backlog = GaugeMetricFamily(
            "reflow_source_backlog_records",
            "Records due or available at a source task and not read yet (lag), where the "
            "source knows", labels=_LABELS)
        for t in tasks:
            if t.source_backlog is not None:
                backlog.add_metric([self.job, t.vertex, str(t.task_index)], t.source_backlog)
        yield backlog
        yield self._unresponsive_gauge(tasks)
        hist = HistogramMetricFamily(
            "reflow_end_to_end_latency_seconds",
            "Latency of latency markers from source to sink tasks",
            labels=_LABELS,
        )
        for t in tasks:
            h = LatencyHistogram.from_wire(t.latency)
            if h.count == 0:
                continue
            counts = h.cumulative_buckets(list(LATENCY_BUCKETS_S))
            buckets = [(repr(b), c) for b, c in zip(LATENCY_BUCKETS_S, counts, strict=False)]
            buckets.append(("+Inf", h.count))
            hist.add_metric([self.job, t.vertex, str(t.task_index)], buckets, h.sum_seconds)
        yield hist
        phase = GaugeMetricFamily(
            "reflow_rescale_in_progress", "1 while a rescale of the operator runs, by phase",
            labels=["job", "operator", "protocol", "phase"],
        )
        moved = GaugeMetricFamily(
            "reflow_rescale_key_groups_moved", "Key groups moved by the current/last rescale",
            labels=["job", "operator"],
        )
        total = GaugeMetricFamily(
            "reflow_rescale_key_groups", "Key groups to move in the current/last rescale",
            labels=["job", "operator"],
        )
        moved_b = GaugeMetricFamily(
            "reflow_rescale_bytes_moved", "State bytes moved by the current/last rescale",
            labels=["job", "operator"],
        )
        for r in self.rescales.values():
            phase.add_metric([self.job, r.operator, r.protocol, r.phase], 1 if r.running else 0)
            moved.add_metric([self.job, r.operator], r.key_groups_moved)
            total.add_metric([self.job, r.operator], r.key_groups_total)
            moved_b.add_metric([self.job, r.operator], r.bytes_moved)
        yield from (phase, moved, total, moved_b)
        live = [
            ("reflow_rescale_subscales", "Subscales (steps' subscales) of the current/last rescale",
             "subscales_total"),
            ("reflow_rescale_subscales_done", "Subscales completed in the current/last rescale",
             "subscales_done"),
            ("reflow_rescale_rerouted_records", "Records re-routed by old owners (drrs)",
             "rerouted_records"),
            ("reflow_rescale_suspended_seconds",
             "Longest cumulative time a task had records waiting and nothing processable",
             "suspended_s"),
            ("reflow_rescale_propagation_delay_seconds",
             "Mean time from injection at the predecessors to the first barrier at the old owner",
             "propagation_delay_s"),
        ]
        for name, doc, field in live:
            gauge = GaugeMetricFamily(name, doc, labels=["job", "operator"])
            for r in self.rescales.values():
                gauge.add_metric([self.job, r.operator], getattr(r, field))
            yield gauge
        sub = HistogramMetricFamily("reflow_rescale_subscale_seconds",
                                    "Duration of each completed subscale", labels=["job", "operator"])
        for op, durations in self.subscale_seconds.items():
            bounds = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
            buckets = [(repr(b), sum(1 for d in durations if d <= b)) for b in bounds]
            buckets.append(("+Inf", len(durations)))
            sub.add_metric([self.job, op], buckets, sum(durations))
        yield sub
        rb = CounterMetricFamily("reflow_replication_bytes", "State bytes copied to replicas",
                                 labels=["job", "operator"])
        rc = CounterMetricFamily("reflow_replication_cpu_seconds",
                                 "Time owners spent encoding replica refreshes",
                                 labels=["job", "operator"])
        rn = GaugeMetricFamily("reflow_replicas", "Key groups with a replica",
                               labels=["job", "operator"])
        for op in self.replication_bytes:
            rb.add_metric([self.job, op], self.replication_bytes[op])
            rc.add_metric([self.job, op], self.replication_cpu_s.get(op, 0.0))
            rn.add_metric([self.job, op], self.replicas.get(op, 0))
        yield from (rb, rc, rn)
        yield from self._rescale_clock()
        count = CounterMetricFamily("reflow_rescales", "Completed rescales", labels=["job", "operator"])
        for op, n in self.rescales_total.items():
            count.add_metric([self.job, op], n)
        yield count
        dec = CounterMetricFamily(
            "reflow_controller_decisions",
            "Decisions of the job's controllers, by kind and by what became of them",
            labels=["job", "controller", "kind", "outcome"])
        for (controller, kind, outcome), n in sorted(self.decisions.items()):
            dec.add_metric([self.job, controller, kind, outcome], n)
        yield dec
        yield from self._checkpoint_metrics()
        up = GaugeMetricFamily("reflow_job_running", "1 while the job runs", labels=["job"])
        up.add_metric([self.job], self.running)
        yield up


    def _checkpoint_metrics(self) -> Iterator[Any]:
        """Checkpoints by outcome, their durations and the latest one's size and alignment
        per task; restarts after failures."""
        total = CounterMetricFamily("reflow_checkpoints", "Checkpoints by outcome",
                                    labels=["job", "outcome"])
        for outcome in ("completed", "failed"):
            total.add_metric([self.job, outcome], self.checkpoints_total.get(outcome, 0))
        yield total
        durations = self.checkpoint_durations
        hist = HistogramMetricFamily("reflow_checkpoint_duration_seconds",
                                     "Time from trigger to complete of each checkpoint",
                                     labels=["job"])
        buckets = [(repr(b), sum(1 for d in durations if d <= b)) for b in CHECKPOINT_BUCKETS_S]
        buckets.append(("+Inf", len(durations)))
        hist.add_metric([self.job], buckets, sum(durations))
        yield hist
        size = GaugeMetricFamily("reflow_checkpoint_size_bytes",
                                 "Bytes of state in the latest complete checkpoint",
                                 labels=["job"])
        size.add_metric([self.job], self.checkpoint_bytes)
        yield size
        align = GaugeMetricFamily("reflow_checkpoint_alignment_seconds",
                                  "Time the task aligned its inputs in the latest complete "
                                  "checkpoint (first barrier to last)", labels=_LABELS)
        for operator, index, seconds in self.checkpoint_alignment.values():
            align.add_metric([self.job, operator, str(index)], seconds)
        yield align
        restarts = CounterMetricFamily("reflow_job_restarts",
                                       "Restarts of the job begun after a failure (each attempt)",
                                       labels=["job"])
        restarts.add_metric([self.job], self.restarts)
        yield restarts

    def _rescale_clock(self) -> Iterator[GaugeMetricFamily]:
        """How long each operator's running rescale has run (0 when none runs), and the
        job's ``rescale_timeout_s``: an alert compares the two per job."""
        g = GaugeMetricFamily("reflow_rescale_running_seconds",
                              "Seconds the operator's running rescale has run (0 when none runs)",
                              labels=["job", "operator"])
        now = self.clock()
        for op, r in self.rescales.items():
            since = self.rescale_started.get(op)
            g.add_metric([self.job, op],
                         max(0.0, now - since) if r.running and since is not None else 0.0)
        yield g
        t = GaugeMetricFamily("reflow_rescale_timeout_seconds",
                              "The job's rescale_timeout_s: how long a rescale phase may take",
                              labels=["job"])
        t.add_metric([self.job], self.rescale_timeout_s)
        yield t

    def _unresponsive_gauge(self, tasks: list[TaskMetrics]) -> GaugeMetricFamily:
        """0 for a task that answered the latest poll, else the seconds since it last did
        (every task has a series, so an alert can watch it from the start)."""
        g = GaugeMetricFamily(
            "reflow_task_unresponsive_seconds",
            "Seconds since the task last answered the JobMaster's metrics poll, while it does "
            "not answer (e.g. stuck in user code); 0 while it answers",
            labels=_LABELS,
        )
        now = self.clock()
        silent = dict(self.unresponsive)
        for t in tasks:
            if t.task not in silent:
                g.add_metric([self.job, t.vertex, str(t.task_index)], 0.0)
        for vertex, index, since in silent.values():
            g.add_metric([self.job, vertex, str(index)], max(0.0, now - since))
        return g


class _BoundedServer(socketserver.ThreadingMixIn, WSGIServer):
    """A WSGI server with at most ``MAX_CONNECTIONS`` connections served at once (more are
    closed at once) and a read timeout per connection: idle or slow clients cannot pile up
    threads in the JobMaster (prometheus_client's server has neither bound)."""

    daemon_threads = True
    MAX_CONNECTIONS = 16

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slots = threading.BoundedSemaphore(self.MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or went away is closed quietly (no traceback)."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, (TimeoutError, ConnectionError)):
            super().handle_error(request, client_address)


class _BoundedServer6(_BoundedServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    timeout = 10.0  # seconds a connection may stay silent before it is closed

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass


class MetricsEndpoint:
    """One HTTP endpoint serving a job's metrics; ``port`` 0 picks a free port. At most
    ``_BoundedServer.MAX_CONNECTIONS`` scrapes at once, each closed after
    ``_QuietHandler.timeout`` seconds of silence."""

    def __init__(self, collector: JobCollector, host: str, port: int) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        server_class = _BoundedServer6 if ":" in host else _BoundedServer
        self._server = make_server(host, port, make_wsgi_app(self.registry), server_class,
                                   handler_class=_QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="reflow-metrics", daemon=True)
        self._thread.start()
        self.host = host
        self.port = self._server.server_port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
