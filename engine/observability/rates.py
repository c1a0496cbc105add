"""True rates per operator over a window of task metrics (pure): DS2's instrumentation, read.

Why: an autoscaler decides on rates, tasks keep counters. Each task counts, since it started,
records in and out, *useful time* (operator work: decoding input, the operators, encoding
output), time idle (waiting for input) and time backpressured (waiting for output credits)
(``engine.observability.metrics.TaskMetrics``). Two snapshots of a job's tasks give per task, and per
operator, what DS2 and Flink's autoscaler decide on:

* true processing rate = records in / useful time: what the tasks could take if they never
  waited; true output rate = records out / useful time;
* observed rates = records / seconds, each task's over the span of its own snapshots where
  they are stamped (``TaskMetrics.at``: a late poll files an older snapshot), an
  operator's the sum of its tasks';
* utilisation = useful time / those seconds per task; an operator's is the MAX over its
  tasks (under skew the busiest task saturates first: the average would overestimate the
  capacity), with the mean beside it; capacity = observed input rate / MAX utilisation,
  the input rate at which the busiest task would be busy all the time;
* at sources, the backlog (records due and not read, ``SourceReader.backlog``) and its
  growth: demand the source could not emit.

"Operator" here is a vertex of the physical plan (a chain of operators run by the same
tasks, named after its first operator): the unit that has a parallelism and rescales.

Format: ``metrics_window(before, after, start, end)`` -> ``MetricsWindow`` (per operator
``OperatorRates``, per task ``TaskRates``, the latency markers that reached the sinks in the
window as a ``LatencyHistogram``). ``MetricsHistory`` keeps a bounded ring of snapshots
(time, task -> ``TaskMetrics``) and cuts windows from it.

Guarantees: no I/O, no clock (times are given). A task present at both ends counts its
difference; one that appeared inside the window counts from zero; one that left inside it
is missing (so callers cut windows that do not span a rescale: ``MetricsHistory.window``'s
``since``). A rate whose denominator is zero is None, never infinite.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from engine.observability.latency import LatencyHistogram
from engine.observability.metrics import TaskMetrics

Snapshot = Mapping[str, TaskMetrics]  # task name -> its latest metrics


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


@dataclass(frozen=True)
class TaskRates:
    """One task over a window: counter differences and the rates derived from them.
    ``seconds``: the span of the task's own two snapshots where both are stamped
    (``TaskMetrics.at``), else the window's."""

    task: str
    operator: str
    task_index: int
    seconds: float
    records_in: int
    records_out: int
    useful_s: float
    idle_s: float
    backpressured_s: float
    queued_frames: int
    state_bytes: int
    key_groups: int
    source_backlog: int | None = None
    backlog_change: int | None = None
    # CPU seconds the task's thread ran, and seconds it was runnable but waited for a CPU
    # (starved), over the window; None where the task does not report them
    cpu_s: float | None = None
    cpu_wait_s: float | None = None

    @property
    def utilisation(self) -> float:
        """Useful time over the window's seconds (0 for an empty window)."""
        return self.useful_s / self.seconds if self.seconds > 0 else 0.0

    @property
    def true_processing_rate(self) -> float | None:
        return _ratio(self.records_in, self.useful_s)

    @property
    def true_output_rate(self) -> float | None:
        return _ratio(self.records_out, self.useful_s)

    @property
    def observed_input_rate(self) -> float:
        return self.records_in / self.seconds if self.seconds > 0 else 0.0

    @property
    def observed_output_rate(self) -> float:
        return self.records_out / self.seconds if self.seconds > 0 else 0.0

    @property
    def backpressured_fraction(self) -> float:
        return self.backpressured_s / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class OperatorRates:
    """One operator (a vertex: the chain its tasks run) over a window."""

    operator: str
    seconds: float
    tasks: tuple[TaskRates, ...]

    @property
    def parallelism(self) -> int:
        return len(self.tasks)

    @property
    def records_in(self) -> int:
        return sum(t.records_in for t in self.tasks)

    @property
    def records_out(self) -> int:
        return sum(t.records_out for t in self.tasks)

    @property
    def useful_s(self) -> float:
        return sum(t.useful_s for t in self.tasks)

    @property
    def state_bytes(self) -> int:
        return sum(t.state_bytes for t in self.tasks)

    @property
    def true_processing_rate(self) -> float | None:
        """Records one task takes per second of useful time (all tasks pooled)."""
        return _ratio(self.records_in, self.useful_s)

    @property
    def true_output_rate(self) -> float | None:
        return _ratio(self.records_out, self.useful_s)

    @property
    def observed_input_rate(self) -> float:
        """The tasks' input rates summed (each over its own span)."""
        return sum(t.observed_input_rate for t in self.tasks)

    @property
    def observed_output_rate(self) -> float:
        return sum(t.observed_output_rate for t in self.tasks)

    @property
    def output_ratio(self) -> float | None:
        """Records out per record in (None without input)."""
        return _ratio(self.records_out, self.records_in)

    @property
    def max_utilisation(self) -> float:
        return max((t.utilisation for t in self.tasks), default=0.0)

    @property
    def mean_utilisation(self) -> float:
        return (sum(t.utilisation for t in self.tasks) / len(self.tasks)) if self.tasks else 0.0

    @property
    def capacity(self) -> float | None:
        """The input rate (records/s) at which the busiest task would never wait, assuming
        every task's load grows in proportion; None without input or work."""
        u = self.max_utilisation
        if u <= 0 or self.records_in == 0:
            return None
        return self.observed_input_rate / u

    @property
    def backpressured_fraction(self) -> float:
        """The largest fraction of the window a task spent waiting for output credits."""
        return max((t.backpressured_fraction for t in self.tasks), default=0.0)

    @property
    def source_backlog(self) -> int | None:
        """Records due at this source and not read, at the window's end (None: unknown)."""
        known = [t.source_backlog for t in self.tasks if t.source_backlog is not None]
        return sum(known) if known else None

    @property
    def backlog_growth(self) -> float | None:
        """How fast the source's backlog grew (records/s; negative while it drains)."""
        known = [t for t in self.tasks if t.backlog_change is not None and t.seconds > 0]
        if not known:
            return None
        return sum((t.backlog_change or 0) / t.seconds for t in known)


@dataclass(frozen=True)
class MetricsWindow:
    """What the job's tasks did between ``start`` and ``end`` (monotonic seconds of the
    clock that timed the snapshots): per operator rates, and ``latency``, the latency
    markers that reached sink tasks in the window (ms)."""

    start: float
    end: float
    operators: Mapping[str, OperatorRates] = field(default_factory=dict)
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def operator(self, name: str) -> OperatorRates | None:
        return self.operators.get(name)

    def summary(self) -> str:
        """One line per operator: parallelism, rates, utilisation (for logs and reasons)."""
        lines = []
        for name, o in self.operators.items():
            tpr = o.true_processing_rate
            true = "" if tpr is None else f" true {tpr:,.0f}/s/task"
            lines.append(f"{name}: p={o.parallelism} in {o.observed_input_rate:,.0f}/s{true} "
                         f"util max {o.max_utilisation:.2f} mean {o.mean_utilisation:.2f}")
        return "; ".join(lines)


def _task_rates(before: TaskMetrics | None, after: TaskMetrics, seconds: float) -> TaskRates:
    def diff(name: str) -> float:
        a = getattr(after, name)
        return a - getattr(before, name) if before is not None else a

    # a backlog is a level, not a counter: without one at the start its change is unknown
    # (counting it from zero read a whole backlog as growth within one window)
    change = None
    prior = before.source_backlog if before is not None else None
    if after.source_backlog is not None and prior is not None:
        change = after.source_backlog - prior

    def optional(name: str) -> float | None:
        a = getattr(after, name, None)
        if a is None:
            return None
        b = getattr(before, name, None) if before is not None else 0.0
        return None if b is None else float(a - b)

    # the task's own span: a poll answered late (or not at all: the collector keeps the
    # previous snapshot) makes a snapshot older than the time it is filed under, and a
    # source's reads plus its backlog's growth over the window's seconds then fell short
    # of its schedule (1,500 records/s read as ~680, issue 32)
    at0, at1 = (None if before is None else before.at), after.at
    if at0 is not None and at1 is not None:
        seconds = max(0.0, at1 - at0)  # 0: the same snapshot at both ends, nothing measured
    return TaskRates(
        after.task, after.vertex, after.task_index, seconds,
        int(diff("records_in")), int(diff("records_out")), float(diff("useful_seconds")),
        float(diff("idle_seconds")), float(diff("backpressured_seconds")),
        after.queued_frames, after.state_bytes, after.key_groups, after.source_backlog, change,
        optional("cpu_seconds"), optional("cpu_wait_seconds"))


def sink_latency(before: Snapshot, after: Snapshot) -> LatencyHistogram:
    """The latency markers sink tasks observed between the two snapshots."""
    out = LatencyHistogram()
    for name, t in after.items():
        h = LatencyHistogram.from_wire(t.latency)
        if h.count == 0:
            continue
        prev = before.get(name)
        out.merge(h if prev is None else h.since(LatencyHistogram.from_wire(prev.latency)))
    return out


def metrics_window(before: Snapshot, after: Snapshot, start: float, end: float,
                   order: Iterable[str] = ()) -> MetricsWindow:
    """The window between two snapshots (task name -> ``TaskMetrics``) taken at ``start``
    and ``end``. Operators come in ``order`` (e.g. topological) where given, then the rest
    in order of appearance; each operator's tasks by task index."""
    if end < start:
        raise ValueError(f"a metrics window ends ({end}) before it starts ({start})")
    seconds = end - start
    per_op: dict[str, list[TaskRates]] = {name: [] for name in order}
    for name, t in after.items():
        per_op.setdefault(t.vertex, []).append(_task_rates(before.get(name), t, seconds))
    ops = {op: OperatorRates(op, seconds, tuple(sorted(ts, key=lambda r: r.task_index)))
           for op, ts in per_op.items() if ts}
    return MetricsWindow(start, end, ops, sink_latency(before, after))


class MetricsHistory:
    """The latest snapshots of a job's tasks, kept for ``keep_s`` seconds (at least two)."""

    def __init__(self, keep_s: float) -> None:
        if not keep_s > 0:
            raise ValueError(f"MetricsHistory keeps snapshots for keep_s > 0 seconds; got {keep_s!r}")
        self.keep_s = keep_s
        self._snaps: deque[tuple[float, dict[str, TaskMetrics]]] = deque()

    def add(self, at: float, tasks: Snapshot) -> None:
        """A snapshot taken at ``at`` (not before the latest one)."""
        if self._snaps and at < self._snaps[-1][0]:
            raise ValueError(f"snapshot at {at} is older than the latest ({self._snaps[-1][0]})")
        self._snaps.append((at, dict(tasks)))
        while len(self._snaps) > 2 and self._snaps[1][0] < at - self.keep_s:
            self._snaps.popleft()

    def __len__(self) -> int:
        return len(self._snaps)

    @property
    def latest(self) -> tuple[float, dict[str, TaskMetrics]] | None:
        return self._snaps[-1] if self._snaps else None

    def snapshots(self, lo: float = float("-inf"), hi: float = float("inf")
                  ) -> list[tuple[float, dict[str, TaskMetrics]]]:
        """The snapshots taken in ``[lo, hi]``, oldest first."""
        return [s for s in self._snaps if lo <= s[0] <= hi]

    def before(self, at: float) -> tuple[float, dict[str, TaskMetrics]] | None:
        """The latest snapshot taken at or before ``at``."""
        found = None
        for s in self._snaps:
            if s[0] > at:
                break
            found = s
        return found

    def window(self, seconds: float, since: float = float("-inf"),
               order: Iterable[str] = ()) -> MetricsWindow | None:
        """The window from the oldest snapshot no older than ``seconds`` before the latest,
        and not before ``since`` (e.g. the end of the last rescale), to the latest; None
        while there are not two such snapshots."""
        if len(self._snaps) < 2:
            return None
        end_t, end = self._snaps[-1]
        lo = max(end_t - seconds, since)
        first = next((s for s in self._snaps if s[0] >= lo), None)
        if first is None or first[0] >= end_t:
            return None
        return metrics_window(first[1], end, first[0], end_t, order)


__all__ = ["MetricsHistory", "MetricsWindow", "OperatorRates", "Snapshot", "TaskRates",
           "metrics_window", "sink_latency"]
