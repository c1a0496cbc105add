"""Reconfigurations as values (Trisk): what a controller decides, the read-only view of the
job it decides on, and the records of what was decided and of what past rescales cost.

Why here, in the engine core: controllers (``controllers/``, the top layer) build these
values and the JobMaster's controller runner (``engine.runtime``) executes them; both sides
need the same types, and the runtime may not import controllers. ``controllers.base``
re-exports everything a controller author needs.

* **Decisions** (frozen, validated on construction, each with a ``reason``): ``Scale(op, n)``,
  ``Rebalance(op, assignment)``, ``ChangeLogic(op, fn)``, ``Place(op, task_index, node)`` and
  ``NoChange(reason)``. ``Scale`` and ``Rebalance`` take the protocol, a planning and an
  assignment (explicit, or a strategy such as ``"ssm"`` with its ``balance``: the target is
  then planned from the tasks' loads when the rescale runs), as
  ``JobHandle.rescale``/``rebalance`` do.
* **The view** (``JobView``): the operators (vertices of the physical plan) in topological
  order with their parallelism, tasks, assignment, inputs and outputs; which are rescaling;
  the history of rescales with what they cost (``RescaleRecord``); per key group load and
  state size when the controller asked for them.
* **Records** (``DecisionRecord``, a wire message): one per decision, executed or not, with
  its outcome; ``DecisionLog`` keeps a bounded number and folds identical consecutive
  no-change decisions of a controller into one (``repeats``).
* **What a rescale cost** (``measure_rescale``): from the metrics history around it, the
  backlog it built at the sources, the peak latency and the seconds of input it held up.
* **Starved windows** (``without_cpu_wait``, ``starved_fraction``, ``cpu_share``): an
  operator's rates with the time its tasks waited for a CPU taken out of their useful time,
  and how many cores a working task uses (from the tasks' CPU counters, where reported).

Guarantees: no I/O, no clock (times are given); a decision with a field of the wrong kind
raises ``ControllerError`` when built; the log never holds more than its ``capacity``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from engine.errors import ControllerError
from engine.names import AssignmentStrategy, NameEnum
from engine.observability.rates import (
    MetricsHistory,
    OperatorRates,
    metrics_window,
    sink_latency,
)
from engine.wire.messages import wire


class DecisionKind(NameEnum):
    """What a decision asks for (``DecisionRecord.kind``, the ``kind`` label of
    ``reflow_controller_decisions_total``)."""

    SCALE = "scale"
    REBALANCE = "rebalance"
    CHANGE_LOGIC = "change-logic"
    PLACE = "place"
    NO_CHANGE = "no-change"
    INVALID = "invalid"  # the controller raised or returned something that is no decision


class DecisionOutcome(NameEnum):
    """What became of a decision (``DecisionRecord.outcome``)."""

    EXECUTED = "executed"    # carried out; ``detail`` is its report
    NO_CHANGE = "no-change"  # the controller decided to leave the job as it is
    REFUSED = "refused"      # the job refused it and runs on unchanged; ``detail`` says why
    FAILED = "failed"        # it failed after changing the job (the job failed with it)
    ERROR = "error"          # the controller raised, or returned no decision; skipped


def _operator(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ControllerError(f"{what}: operator must be a non-empty operator name; got {value!r}")
    return value


def _integer(value: object, what: str, minimum: int) -> int:
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ControllerError(f"{what} must be an integer >= {minimum}; got {value!r}")
    return int(value)


def _reason(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ControllerError(f"{what}: reason must be a string; got {value!r}")
    return value


def _protocol(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ControllerError(f"{what}: protocol must be a protocol name; got {value!r}")
    return value


def _assignment(value: object, what: str) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ControllerError(f"{what}: assignment must be a sequence of task indices, one per "
                              f"key group; got {value!r}")
    out = tuple(_integer(t, f"{what}: a task index", 0) for t in value)
    if not out:
        raise ControllerError(f"{what}: the assignment is empty; give one task index per key group")
    return out


def _target(value: object, what: str, balance: object,
            projected_costs: object) -> tuple[int, ...] | AssignmentStrategy | None:
    """A decision's ``assignment``: task indices, a strategy name, or None (uniform)."""
    if isinstance(value, str):
        try:
            target: tuple[int, ...] | AssignmentStrategy | None = AssignmentStrategy.parse(
                value, "assignment strategy")
        except ValueError as exc:
            raise ControllerError(f"{what}: {exc} (or a sequence of task indices)") from None
    else:
        target = None if value is None else _assignment(value, what)
    if not isinstance(target, AssignmentStrategy) and (balance is not None
                                                       or projected_costs is not None):
        raise ControllerError(f"{what}: balance and projected_costs go with an assignment "
                              "strategy (e.g. assignment='ssm', balance=0.2)")
    if balance is not None and (isinstance(balance, bool) or not isinstance(balance, (int, float))
                                or not balance >= 0):
        raise ControllerError(f"{what}: balance must be a number >= 0; got {balance!r}")
    return target


@dataclass(frozen=True)
class Scale:
    """Rescale ``operator`` to ``parallelism`` tasks, live with ``protocol`` (as
    ``JobHandle.rescale``); ``assignment``: the key group -> task index target, or a strategy
    name (``"uniform"``, ``"consistent-hashing"``, ``"ssm"``, ``"mtm"``: planned from the
    tasks' loads when the rescale runs, with ``balance`` θ and mtm's ``projected_costs``),
    None: the uniform ranges; ``planning``: a ``migration.planning.Planning`` or None."""

    kind: ClassVar[DecisionKind] = DecisionKind.SCALE
    operator: str
    parallelism: int
    reason: str = ""
    protocol: str = "drrs"
    # given as task indices or a strategy name; held as a tuple or an AssignmentStrategy
    assignment: Sequence[int] | str | None = None
    planning: Any = None
    balance: float | None = None
    projected_costs: Any = None

    def __post_init__(self) -> None:
        what = f"Scale({self.operator!r}, {self.parallelism!r})"
        _operator(self.operator, what)
        object.__setattr__(self, "parallelism", _integer(self.parallelism, f"{what}: parallelism", 1))
        _reason(self.reason, what)
        _protocol(self.protocol, what)
        object.__setattr__(self, "assignment", _target(self.assignment, what, self.balance,
                                                       self.projected_costs))

    @property
    def strategy(self) -> AssignmentStrategy | None:
        """The assignment strategy asked for, if any."""
        return self.assignment if isinstance(self.assignment, AssignmentStrategy) else None

    def __str__(self) -> str:
        how = ("" if self.assignment is None else
               f", assignment {self.strategy}" if self.strategy is not None
               else " with a chosen assignment")
        return f"scale {self.operator!r} to {self.parallelism} ({self.protocol}{how})"


@dataclass(frozen=True)
class Rebalance:
    """Move key groups of ``operator`` so that group ``kg`` is held by task
    ``assignment[kg]`` (as ``JobHandle.rebalance``), or, with a strategy name (e.g.
    ``"ssm"`` and ``balance``), to the target it plans at the current parallelism."""

    kind: ClassVar[DecisionKind] = DecisionKind.REBALANCE
    operator: str
    assignment: tuple[int, ...] | AssignmentStrategy
    reason: str = ""
    protocol: str = "drrs"
    planning: Any = None
    balance: float | None = None
    projected_costs: Any = None

    def __post_init__(self) -> None:
        what = f"Rebalance({self.operator!r})"
        _operator(self.operator, what)
        target = _target(self.assignment, what, self.balance, self.projected_costs)
        if target is None:
            raise ControllerError(f"{what}: assignment must be a sequence of task indices or "
                                  "an assignment strategy; got None")
        object.__setattr__(self, "assignment", target)
        _reason(self.reason, what)
        _protocol(self.protocol, what)

    @property
    def strategy(self) -> AssignmentStrategy | None:
        """The assignment strategy asked for, if any."""
        return self.assignment if isinstance(self.assignment, AssignmentStrategy) else None

    @property
    def parallelism(self) -> int | None:
        """The parallelism after it (None with a strategy: the current one)."""
        if isinstance(self.assignment, AssignmentStrategy):
            return None
        return max(self.assignment) + 1

    def __str__(self) -> str:
        if self.strategy is not None:
            return f"rebalance {self.operator!r} by {self.strategy} ({self.protocol})"
        return (f"rebalance {self.operator!r} over {self.parallelism} tasks ({self.protocol})")


@dataclass(frozen=True)
class ChangeLogic:
    """Replace ``operator``'s user function by ``fn`` in every task at a barrier aligned
    over the operator's inputs, keeping its keyed state (as ``JobHandle.change_logic``)."""

    kind: ClassVar[DecisionKind] = DecisionKind.CHANGE_LOGIC
    operator: str
    fn: Any
    reason: str = ""

    def __post_init__(self) -> None:
        what = f"ChangeLogic({self.operator!r})"
        _operator(self.operator, what)
        if self.fn is None:
            raise ControllerError(f"{what}: fn must be the new function; got None")
        _reason(self.reason, what)

    def __str__(self) -> str:
        return f"change the logic of {self.operator!r} to {type(self.fn).__name__}"


@dataclass(frozen=True)
class Place:
    """Move task ``task_index`` of ``operator`` to Ray node ``node`` (a node id), live:
    its replacement starts there and its key groups migrate to it (as ``JobHandle.place``)."""

    kind: ClassVar[DecisionKind] = DecisionKind.PLACE
    operator: str
    task_index: int
    node: str
    reason: str = ""

    def __post_init__(self) -> None:
        what = f"Place({self.operator!r}, {self.task_index!r})"
        _operator(self.operator, what)
        object.__setattr__(self, "task_index", _integer(self.task_index, f"{what}: task_index", 0))
        if not isinstance(self.node, str) or not self.node:
            raise ControllerError(f"{what}: node must be a Ray node id; got {self.node!r}")
        _reason(self.reason, what)

    def __str__(self) -> str:
        return f"place task {self.task_index} of {self.operator!r} on node {self.node[:12]}"


@dataclass(frozen=True)
class NoChange:
    """Leave the job as it is, saying why."""

    kind: ClassVar[DecisionKind] = DecisionKind.NO_CHANGE
    reason: str = ""

    def __post_init__(self) -> None:
        _reason(self.reason, "NoChange")

    def __str__(self) -> str:
        return "no change"


Decision = Scale | Rebalance | ChangeLogic | Place | NoChange
DECISION_TYPES = (Scale, Rebalance, ChangeLogic, Place, NoChange)


# ---------------------------------------------------------------------- the view


@dataclass(frozen=True)
class OperatorView:
    """One vertex of the physical plan as a controller sees it: ``name`` (its first
    operator's), ``operators`` (the chain its tasks run), ``kind`` of that first operator,
    ``keyed``, ``parallelism`` and ``max_parallelism`` (the job's key groups for a keyed
    vertex), ``inputs``/``outputs`` (upstream and downstream vertices), ``tasks`` (names by
    index), ``assignment`` (key group -> task index; empty when not keyed), ``nodes``
    (the Ray node of each task where known, else "") and ``forward`` (the neighbours it is
    joined to by a forward edge: task i sends to task i, so both sides always run equally
    many tasks; a rebalance at the same parallelism changes nothing there).
    ``forward_root``: in a forward group that rescales live as one
    (``engine.dataflow.physical.PhysicalPlan.check_rescale``: one keyed vertex, the rest stateless
    partners), that keyed vertex, whose rescale takes the group along; "" otherwise (no
    forward edge, or a group only a rebuilt job can change). ``task_cpus``: the CPUs each
    of its task actors reserves from Ray (``JobConfig.task_num_cpus``; 0: none)."""

    name: str
    operators: tuple[str, ...]
    kind: str
    keyed: bool
    parallelism: int
    max_parallelism: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    tasks: tuple[str, ...]
    assignment: tuple[int, ...] = ()
    nodes: tuple[str, ...] = ()
    forward: tuple[str, ...] = ()
    forward_root: str = ""
    task_cpus: float = 0.0

    @property
    def is_source(self) -> bool:
        return self.kind == "source"

    @property
    def fixed_parallelism(self) -> str:
        """Why a controller must not rescale it itself ("" when it may): a forward partner
        follows its group's keyed root (rescale that one), and a forward group without one
        keeps its parallelism (its rescale would be refused)."""
        if not self.forward or self.forward_root == self.name:
            return ""
        if self.forward_root:
            return (f"{self.name!r} is a forward partner of {self.forward_root!r} and "
                    f"rescales with it")
        return (f"{self.name!r} is joined to {', '.join(repr(n) for n in self.forward)} by a "
                "forward edge, and their forward group cannot rescale as one (a rescale "
                "would be refused)")


@wire
@dataclass(frozen=True, slots=True)
class RescaleRecord:
    """One finished rescale and what it cost, measured from the job's metrics around it.

    Times are the JobMaster's monotonic seconds. ``input_rate``: records/s into the
    operator before it; ``latency_before_ms``/``peak_latency_ms``: the p99 of the
    latency markers at the sinks before, and the highest p99 of one metrics interval from
    the request until ``settle`` seconds after the end; ``backlog_records``: how far the
    sources' backlog rose above its trend before the request (an overloaded job's backlog
    grows anyway); ``disruption_s``: the seconds of input the rescale held up,
    ``backlog_records / input_rate`` (where no source knows its backlog: the peak latency's
    excess over its level before); ``by``: who asked (``handle`` or the controller)."""

    operator: str
    protocol: str
    old_parallelism: int
    new_parallelism: int
    requested_at: float
    completed_at: float
    key_groups_moved: int
    bytes_moved: int
    cut_short: bool
    input_rate: float
    backlog_records: int
    latency_before_ms: float
    peak_latency_ms: float
    disruption_s: float
    by: str = ""

    @property
    def duration_s(self) -> float:
        return self.completed_at - self.requested_at

    @property
    def megabytes_moved(self) -> float:
        return self.bytes_moved / 1e6


@wire
@dataclass(frozen=True, slots=True)
class LogicChangeReport:
    """A finished change of logic: ``operator`` runs function ``version`` in all its
    ``tasks``; wall-clock ``requested_at``/``completed_at``; ``alignment_s``: the longest a
    task waited for the barrier on all its inputs."""

    operator: str
    version: int
    tasks: int
    requested_at: float
    completed_at: float
    alignment_s: float

    @property
    def duration_s(self) -> float:
        return self.completed_at - self.requested_at

    def __str__(self) -> str:
        return (f"change of logic of {self.operator!r} to version {self.version} done in "
                f"{self.duration_s:.2f} s on {self.tasks} tasks (longest alignment "
                f"{self.alignment_s * 1000:.0f} ms)")


@dataclass(frozen=True)
class JobView:
    """A read-only view of the job when a controller is called.

    ``now``: the JobMaster's monotonic seconds (the metrics window's clock);
    ``operators``: every vertex by name, in topological order; ``rescaling``: vertices with
    a rescale running; ``finishing``: some input has ended (rescales are refused then);
    ``last_rescale_end``: when the last rescale of the job ended (None: none yet);
    ``rescales``: the measured history, oldest first; ``group_load`` (records/s) and
    ``group_bytes`` per key group of each keyed vertex, filled only for controllers with
    ``group_stats = True``; ``nodes``: the ids of the alive Ray nodes; ``cpus``: the CPUs
    of the cluster (Ray's ``cluster_resources()["CPU"]``) and ``cpus_available``: those no
    actor or task reserves now (``available_resources()["CPU"]``), what a scale-up can
    still get; None: not known (no bound)."""

    job: str
    now: float
    num_key_groups: int
    operators: Mapping[str, OperatorView]
    rescaling: frozenset[str] = frozenset()
    finishing: bool = False
    last_rescale_end: float | None = None
    rescales: tuple[RescaleRecord, ...] = ()
    group_load: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    group_bytes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    nodes: tuple[str, ...] = ()
    cpus: float | None = None
    cpus_available: float | None = None

    def __post_init__(self) -> None:
        for what in ("cpus", "cpus_available"):
            value = getattr(self, what)
            if value is not None and (isinstance(value, bool) or not isinstance(
                    value, (int, float)) or not value >= 0):
                raise ControllerError(f"JobView.{what} must be a number of CPUs >= 0 or None; "
                                      f"got {value!r}")

    def operator(self, name: str) -> OperatorView:
        try:
            return self.operators[name]
        except KeyError:
            raise ControllerError(f"job {self.job} has no operator (vertex) {name!r}; "
                                  f"vertices: {', '.join(self.operators)}") from None

    def sources(self) -> list[OperatorView]:
        return [o for o in self.operators.values() if o.is_source]

    def history(self, operator: str | None = None) -> list[RescaleRecord]:
        return [r for r in self.rescales if operator is None or r.operator == operator]


# ---------------------------------------------------------------------- starved windows


def without_cpu_wait(rates: OperatorRates) -> OperatorRates:
    """``rates`` with each task's CPU wait (``TaskRates.cpu_wait_s``: runnable, no CPU)
    taken out of its useful time: on an oversubscribed machine a task's busy time includes
    stretches in which it would have worked but had no core, and read as work they make
    the true rate and the capacity look low (DS2 then asks for tasks the machine cannot
    run either). Tasks that do not report the wait are unchanged."""
    tasks = tuple(t if not t.cpu_wait_s else replace(
        t, useful_s=max(0.0, t.useful_s - min(t.useful_s, t.cpu_wait_s)))
        for t in rates.tasks)
    return rates if tasks == rates.tasks else replace(rates, tasks=tasks)


def starved_fraction(rates: OperatorRates) -> float | None:
    """The share of the operator's useful time its tasks waited for a CPU (None: no task
    reports it, or no useful time)."""
    known = [t for t in rates.tasks if t.cpu_wait_s is not None]
    useful = sum(t.useful_s for t in known)
    if not known or useful <= 0:
        return None
    return min(1.0, sum(min(t.useful_s, t.cpu_wait_s or 0.0) for t in known) / useful)


def cpu_share(rates: OperatorRates) -> float | None:
    """Cores one task of the operator keeps busy while it works: CPU seconds over useful
    time without the CPU wait (1.0: pure computation; near 0: it mostly sleeps or waits on
    I/O). None when no task reports its CPU time or it did no work."""
    known = [t for t in rates.tasks if t.cpu_s is not None]
    work = sum(max(0.0, t.useful_s - (t.cpu_wait_s or 0.0)) for t in known)
    if not known or work <= 0:
        return None
    return min(1.0, sum(t.cpu_s or 0.0 for t in known) / work)


# ---------------------------------------------------------------------- records


@wire
@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One decision of a controller, executed or not (``JobHandle.decisions()``).

    ``at``/``last_at``: wall-clock seconds when it was (last) made; ``kind`` and
    ``outcome``: ``DecisionKind``/``DecisionOutcome`` values; ``decision``: what it asked,
    in words; ``reason``: the controller's; ``detail``: the rescale report, the refusal or
    the error; ``seconds``: how long carrying it out took; ``repeats``: identical
    consecutive no-change decisions of the controller folded into this record."""

    at: float
    controller: str
    kind: str
    operator: str
    decision: str
    reason: str
    outcome: str
    detail: str = ""
    seconds: float = 0.0
    repeats: int = 1
    last_at: float = 0.0

    def __str__(self) -> str:
        what = f"{self.controller}: {self.decision} -> {self.outcome}"
        why = f" ({self.reason})" if self.reason else ""
        more = f": {self.detail}" if self.detail else ""
        times = f" [x{self.repeats}]" if self.repeats > 1 else ""
        return what + why + more + times


def record_of(at: float, controller: str, decision: Any, outcome: DecisionOutcome,
              detail: str = "", seconds: float = 0.0) -> DecisionRecord:
    """The record of ``decision``: a decision value, anything else a controller gave
    (recorded as invalid), or None when it gave nothing (it raised; ``detail`` says how)."""
    if decision is None:
        return DecisionRecord(at, controller, str(DecisionKind.INVALID), "", "no decision", "",
                              str(outcome), detail, seconds, 1, at)
    if isinstance(decision, DECISION_TYPES):
        kind = decision.kind
        operator = getattr(decision, "operator", "")
        return DecisionRecord(at, controller, str(kind), operator, str(decision),
                              decision.reason, str(outcome), detail, seconds, 1, at)
    return DecisionRecord(at, controller, str(DecisionKind.INVALID), "",
                          f"{type(decision).__name__}: {decision!r:.120}", "", str(outcome),
                          detail, seconds, 1, at)


class DecisionLog:
    """The latest ``capacity`` decision records (oldest dropped first) and a count of every
    decision by (controller, kind, outcome), for Prometheus."""

    def __init__(self, capacity: int = 1000) -> None:
        if capacity < 1:
            raise ValueError(f"a decision log holds at least one record; got {capacity}")
        self._records: deque[DecisionRecord] = deque(maxlen=capacity)
        self.counts: dict[tuple[str, str, str], int] = {}

    def add(self, record: DecisionRecord) -> DecisionRecord:
        """Keep ``record``; an identical no-change of the same controller right after its
        previous record is folded into it (``repeats`` + 1). Returns the record kept."""
        key = (record.controller, record.kind, record.outcome)
        self.counts[key] = self.counts.get(key, 0) + 1
        if record.kind == DecisionKind.NO_CHANGE:
            for i in range(len(self._records) - 1, -1, -1):
                prev = self._records[i]
                if prev.controller != record.controller:
                    continue
                if prev.kind == record.kind and prev.reason == record.reason:
                    folded = replace(prev, repeats=prev.repeats + 1, last_at=record.at)
                    self._records[i] = folded
                    return folded
                break
        self._records.append(record)
        return record

    def records(self, controller: str | None = None) -> tuple[DecisionRecord, ...]:
        return tuple(r for r in self._records if controller is None or r.controller == controller)

    def __len__(self) -> int:
        return len(self._records)


# ---------------------------------------------------------------------- what a rescale cost


def _backlog(snapshot: Mapping[str, Any]) -> int | None:
    known = [t.source_backlog for t in snapshot.values() if t.source_backlog is not None]
    return sum(known) if known else None


def _p99(h: Any) -> float:
    return float(h.quantile(0.99)) if h.count else 0.0


def measure_rescale(history: MetricsHistory, *, operator: str, protocol: str,
                    old_parallelism: int, new_parallelism: int, requested_at: float,
                    completed_at: float, key_groups_moved: int, bytes_moved: int,
                    cut_short: bool, by: str, baseline_s: float = 5.0) -> RescaleRecord:
    """What a rescale cost, from the snapshots in ``history`` (monotonic times): the
    input rate of ``operator`` and the sinks' p99 latency over ``baseline_s`` before the
    request, the sources' backlog just before it, and the peaks of both from the request
    to the latest snapshot (take it ``settle`` seconds after the end)."""
    before = history.before(requested_at)
    after = history.snapshots(requested_at, math.inf)
    rate, base_latency, base_backlog, trend = 0.0, 0.0, None, 0.0
    base_at = requested_at
    if before is not None:
        base_at = before[0]
        base_backlog = _backlog(before[1])
        start = history.before(before[0] - baseline_s) or history.snapshots()[0]
        if start[0] < before[0]:
            w = metrics_window(start[1], before[1], start[0], before[0])
            op = w.operator(operator)
            rate = op.observed_input_rate if op is not None else 0.0
            base_latency = _p99(w.latency)
            growth = [o.backlog_growth for o in w.operators.values()
                      if o.backlog_growth is not None]
            trend = max(0.0, sum(growth))  # an overloaded job's backlog grew anyway
    peak_latency, excess_backlog, known = base_latency, 0.0, base_backlog is not None
    prev = before
    for at, snap in after:
        if prev is not None:
            peak_latency = max(peak_latency, _p99(sink_latency(prev[1], snap)))
        b = _backlog(snap)
        if b is not None:
            expected = (base_backlog or 0) + trend * (at - base_at)
            excess_backlog = max(excess_backlog, b - expected)
            known = True
        prev = (at, snap)
    backlog = int(excess_backlog)
    if known:  # the sources' backlog beyond its trend measures what was held up
        held = backlog / rate if rate > 0 else 0.0
    else:  # no source knows its backlog: the latency's excess
        held = max(0.0, peak_latency - base_latency) / 1000.0
    return RescaleRecord(operator, protocol, old_parallelism, new_parallelism, requested_at,
                         completed_at, key_groups_moved, bytes_moved, cut_short, rate, backlog,
                         base_latency, peak_latency, held, by)


# ---------------------------------------------------------------------- controller checks


def check_controller(controller: Any, taken: Sequence[str] = ()) -> str:
    """The name ``controller`` runs under; ``ControllerError`` when it is no controller: it
    needs a callable ``decide(metrics, view)``, ``interval_s`` and ``window_s`` > 0 and
    finite, and a name (``name``, else its class name) not in ``taken``."""
    decide: Callable[..., Any] | None = getattr(controller, "decide", None)
    if not callable(decide):
        raise ControllerError(f"{controller!r} is not a controller: it has no decide(metrics, "
                              "view) method (subclass controllers.base.Controller)")
    for attr in ("interval_s", "window_s"):
        value = getattr(controller, attr, None)
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not 0 < value < math.inf):
            raise ControllerError(f"controller {type(controller).__name__}: {attr} must be a "
                                  f"number of seconds > 0; got {value!r}")
    name = getattr(controller, "name", "") or type(controller).__name__
    if not isinstance(name, str):
        raise ControllerError(f"controller {type(controller).__name__}: name must be a string; "
                              f"got {name!r}")
    if name in taken:
        raise ControllerError(f"a controller named {name!r} runs already on this job; give this "
                              "one another name (its name attribute)")
    return name


def as_decisions(returned: Any) -> list[Any]:
    """What ``decide`` returned as a list: one decision, a sequence of them, or None (no
    change). Elements are not checked here (the runner records non-decisions as errors)."""
    if returned is None:
        return [NoChange("the controller returned nothing")]
    if isinstance(returned, DECISION_TYPES):
        return [returned]
    if isinstance(returned, (list, tuple)):
        return list(returned) or [NoChange("the controller returned no decision")]
    return [returned]


__all__ = ["DECISION_TYPES", "ChangeLogic", "Decision", "DecisionKind", "DecisionLog",
           "DecisionOutcome", "DecisionRecord", "JobView", "LogicChangeReport", "NoChange",
           "OperatorView", "Place",
           "Rebalance", "RescaleRecord", "Scale", "as_decisions", "check_controller",
           "cpu_share", "measure_rescale", "record_of", "starved_fraction", "without_cpu_wait"]
