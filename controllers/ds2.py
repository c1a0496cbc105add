"""DS2: one decision from the true rates to the parallelism every operator needs.

The policy (DS2, OSDI'18; with the Flink Kubernetes operator autoscaler's safeguards):

1. **Target rates, propagated.** A source's target rate is what it read plus how fast its
   backlog grew (the demand it could not emit: ``SourceReader.backlog``). A source that
   cannot tell its backlog counts what it read, a lower bound: when it was backpressured
   (more than ``_BLOCKED`` of the window) its demand may be higher by an unknown amount,
   and the operators it feeds that are saturated count as out of the band (step 3), so
   each decision grows them by ``1 / target_utilisation`` until the source flows freely: a
   few decisions instead of one, never an extrapolation (its read rate over the time it
   was not backpressured read a throttled source's short unblocked bursts as its demand:
   1 -> 16 tasks for 3 needed, issue 32). Walking the graph in topological order, an
   operator's target input rate is the sum of its inputs' target output rates; its target
   output rate is its target input rate times its output ratio (records out / records
   in). The sources' backlog is propagated the same way as a catch-up rate: the backlog
   divided by ``catch_up_s``, except the records that piled up while DS2's own last
   rescale ran (the backlog beyond its level when DS2 decided, until it drains back
   below it): a rescale's duration is not demand, and draining what it held up within
   ``catch_up_s`` sized the operator for a transient (1 -> 2 -> 11 tasks for 5, the
   second step asking 2,693 rec/s of catch-up for 81,000 records held up by the first);
   the headroom of the target utilisation drains them. A source's rates are taken over
   the span of its own metrics snapshots (``engine.observability.rates``): over the
   window's seconds a snapshot answered late read a source scheduled at 1,500 rec/s,
   held back by a saturated operator, as 680 rec/s of demand.
2. **True rates, MAX across tasks, starved time discounted.** An operator's capacity at
   its current parallelism is its observed input rate over the MAX utilisation (useful
   time / window) of its tasks: under skew the busiest task saturates first, and the
   average would overestimate it. Time a task waited for a CPU (``TaskRates.cpu_wait_s``,
   where reported) is not useful time: it is taken out first
   (``engine.control.reconfiguration.without_cpu_wait``), and on a window where the
   operator's tasks waited for a CPU more than ``max_starved`` of their busy time DS2 does
   not scale the operator up (the machine has no core for more tasks), nor down (what
   little useful time is left measures no capacity: at load 27, 98% of the busy time of
   8 tasks serving 1,500 rec/s read as 23,490 rec/s per task, and 8 -> 3 for 5).
3. **Utilisation band.** Nothing moves while every operator's load (target + catch-up
   rate, over its capacity) lies within ``band`` (Flink's 0.4 .. 1.0 around a 0.7 target),
   except a saturated operator (busiest task ``_SATURATED`` busy) behind a backpressured
   source that cannot tell its backlog (step 1).
4. **All at once.** Otherwise every operator gets ``ceil(p * needed / capacity)`` tasks,
   ``needed = target / target_utilisation + catch_up + target * disruption_s / catch_up_s``;
   ``disruption_s`` is Flink's fixed ``restart.time`` here (``restart_time_s``, 0 by
   default: a live rescale barely stops the job; ``controllers.cost_aware`` measures it).
5. **Forward groups.** Operators joined by forward edges run equally many tasks and
   rescale together: DS2 decides for the group's keyed root (``OperatorView.forward_root``),
   whose rescale takes its stateless partners along, and leaves the partners to it; an
   operator whose forward group cannot rescale as one keeps its parallelism (reflow would
   refuse). Either way DS2 says so in a ``NoChange`` instead of proposing it, and still
   counts the rates.
6. **Even key-group splits.** For a keyed operator, the smallest parallelism whose busiest
   task (by key groups, uniform ranges) holds at most ``1 + key_group_tolerance`` times the
   groups the exact parallelism would give it; then clamped to ``[min, max]`` (max: the
   job's key groups for keyed operators).
7. **What the cluster can host.** A scale-up goes no further than (each bound where
   known): ``p * max_scale_up`` (Flink's ``scale-up.max-factor``); the tasks Ray can still
   place, ``p + cpus_available / task_cpus``, when the tasks reserve CPUs
   (``JobView.cpus_available``, ``OperatorView.task_cpus``); and the tasks the cluster's
   CPUs can keep working, ``JobView.cpus / c``, with ``c`` the cores a working task uses
   (``cpu_per_task``, else its reservation, else measured from its CPU time, else 1). A
   bound never scales an operator down.
8. **No flapping.** No decision while a rescale runs, nor within ``stabilisation_s`` after
   one ends (and the metrics window never spans a rescale), nor on a window a task's
   counters span longer than (useful + idle + backpressured time over ``_OVERSPAN`` x the
   window: its snapshot at the start was late or missing, so its rates and utilisation
   are inflated: "377% busy" and a source read at 2.8x its rate on a loaded machine,
   issue 32), nor on one at whose start a source task's backlog was unknown (its growth,
   demand it could not read, is then unknown: what it read alone was taken for its
   demand), nor on one in which a task answered no metrics poll (the same snapshot at
   both ends: nothing measured); a scale-up is carried out at once, a scale-down only
   after it was recommended continuously for ``scale_down_delay_s``, and then to the
   highest parallelism recommended meanwhile.

``estimate`` is the pure computation (one ``Estimate`` per operator); ``decide`` adds the
band, the delays and the decisions. Subclasses change ``disruption_s`` (what an action
costs) and ``finish`` (what becomes of the recommended actions).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from controllers.base import Controller, JobView, MetricsWindow, NoChange, Scale, rescalable
from engine.control.reconfiguration import (
    Decision,
    OperatorView,
    cpu_share,
    starved_fraction,
    without_cpu_wait,
)
from engine.errors import ControllerError
from engine.observability.rates import OperatorRates

_BLOCKED = 0.1  # a source backpressured longer than this share of the window wanted more
_SATURATED = 0.9  # a busiest task at least this busy (CPU wait excluded) takes no more
# a task's accounted time (useful + idle + backpressured) beyond this many times the window:
# its counters are not the window's (its snapshot at the start was late or missing)
_OVERSPAN = 1.25


@dataclass(frozen=True)
class Estimate:
    """DS2's numbers for one operator: ``target_rate`` (records/s it must take), ``catch_up``
    (records/s more to drain the sources' backlog), ``capacity`` (records/s at the current
    parallelism, busiest task saturated; None: not measured), ``load`` ((target + catch-up)
    / capacity), ``optimal`` (the parallelism DS2 recommends) and ``reason``;
    ``saturated``: its busiest task is saturated behind a backpressured source that cannot
    tell its demand (out of the band whatever the load says); ``held``: why it stays below
    what the rates ask for ("" when it does not: a cluster bound, starved tasks)."""

    operator: str
    parallelism: int
    target_rate: float
    catch_up: float
    capacity: float | None
    load: float | None
    optimal: int
    reason: str
    saturated: bool = False
    held: str = ""

    @property
    def measured(self) -> bool:
        return self.load is not None


def even_split(parallelism: int, num_key_groups: int, tolerance: float) -> int:
    """The smallest parallelism whose busiest task holds at most ``1 + tolerance`` times
    the key groups ``parallelism`` exact tasks would each hold (uniform ranges give the
    busiest task ``ceil(groups / p)``)."""
    if parallelism >= num_key_groups:
        return num_key_groups
    allowed = math.floor(num_key_groups / parallelism * (1 + tolerance) + 1e-9)
    return max(1, math.ceil(num_key_groups / max(1, allowed)))


class DS2(Controller):
    """DS2 autoscaling (see the module doc). ``operators``: the vertices it may rescale
    (default: all but sources); ``limits``: per operator ``(min, max)`` overriding
    ``min_parallelism``/``max_parallelism``; ``protocol``: how its rescales run;
    ``assignment``: how they choose the target (an assignment strategy name, e.g. ``"ssm"``
    with ``balance`` θ: planned from the tasks' loads when the rescale runs; None: uniform
    ranges); ``max_scale_up``: at most this many times the tasks per decision (None: no
    factor); ``cpu_per_task``: cores a working task uses, for the cluster's CPU bound (None:
    its reservation, else measured, else 1); ``max_starved``: no scale-up on a window
    whose tasks waited for a CPU longer than this share of their busy time."""

    default_name = "ds2"

    def __init__(self, *, target_utilisation: float = 0.7,
                 band: tuple[float, float] = (0.4, 1.0), catch_up_s: float = 30.0,
                 restart_time_s: float = 0.0, stabilisation_s: float = 10.0,
                 scale_down_delay_s: float = 30.0, min_parallelism: int = 1,
                 max_parallelism: int | None = None,
                 limits: Mapping[str, tuple[int, int]] | None = None,
                 key_group_tolerance: float = 0.15, protocol: str = "drrs",
                 assignment: str | None = None, balance: float | None = None,
                 operators: Sequence[str] | None = None, interval_s: float = 5.0,
                 window_s: float = 10.0, min_window_s: float | None = None,
                 max_scale_up: float | None = None, cpu_per_task: float | None = None,
                 max_starved: float = 0.5, name: str = "") -> None:
        lo, hi = band
        checks = [
            ("target_utilisation", 0 < target_utilisation <= 1, "in (0, 1]"),
            ("band", 0 <= lo <= target_utilisation <= hi, "(low, high) around the target"),
            ("catch_up_s", catch_up_s > 0, "> 0"),
            ("restart_time_s", restart_time_s >= 0, ">= 0"),
            ("stabilisation_s", stabilisation_s >= 0, ">= 0"),
            ("scale_down_delay_s", scale_down_delay_s >= 0, ">= 0"),
            ("min_parallelism", min_parallelism >= 1, ">= 1"),
            ("max_parallelism", max_parallelism is None or max_parallelism >= min_parallelism,
             ">= min_parallelism or None"),
            ("key_group_tolerance", key_group_tolerance >= 0, ">= 0"),
            ("interval_s", interval_s > 0, "> 0"),
            ("window_s", window_s > 0, "> 0"),
            ("max_scale_up", max_scale_up is None or max_scale_up >= 1, ">= 1 or None"),
            ("cpu_per_task", cpu_per_task is None or 0 < cpu_per_task <= 1,
             "in (0, 1] or None"),
            ("max_starved", 0 < max_starved <= 1, "in (0, 1]"),
        ]
        for what, ok, expected in checks:
            if not ok:
                raise ControllerError(f"{type(self).__name__}: {what} must be {expected}; got "
                                      f"{locals()[what]!r}")
        self.target_utilisation = target_utilisation
        self.band = (lo, hi)
        self.catch_up_s = catch_up_s
        self.restart_time_s = restart_time_s
        self.stabilisation_s = stabilisation_s
        self.scale_down_delay_s = scale_down_delay_s
        self.min_parallelism = min_parallelism
        self.max_parallelism = max_parallelism
        self.limits = dict(limits or {})
        self.key_group_tolerance = key_group_tolerance
        self.protocol = protocol
        # a bad strategy or θ fails here, not at the first rescale
        Scale("_", 1, assignment=assignment, balance=balance)
        self.assignment = assignment
        self.assignment_balance = balance  # CostAwareDS2's own balance is another knob
        self.operators = None if operators is None else tuple(operators)
        self.interval_s = interval_s
        self.window_s = window_s
        self.min_window_s = window_s / 2 if min_window_s is None else min_window_s
        self.max_scale_up = max_scale_up
        self.cpu_per_task = cpu_per_task
        self.max_starved = max_starved
        self.name = name or self.default_name
        # operator -> (first recommended at, highest parallelism recommended since)
        self.pending_down: dict[str, tuple[float, int]] = {}
        # source -> its backlog when DS2 last decided a rescale; what piled up beyond it is
        # the rescale's own (no catch-up for it), until the backlog drains below it
        self.rescale_backlog: dict[str, int] = {}

    # ------------------------------------------------------------------ the computation
    def bounds(self, op: OperatorView) -> tuple[int, int]:
        lo, hi = self.limits.get(op.name, (self.min_parallelism, self.max_parallelism))
        top = op.max_parallelism if hi is None else min(hi, op.max_parallelism)
        return max(1, lo), max(1, top)

    def disruption_s(self, op: OperatorView, target_rate: float, view: JobView,
                     metrics: MetricsWindow) -> float:
        """Seconds of input an action on ``op`` holds up, whose backlog the new capacity
        must drain within ``catch_up_s``: Flink's fixed ``restart.time``."""
        return self.restart_time_s

    def _source_rates(self, name: str, r: OperatorRates | None
                      ) -> tuple[float, float, bool, int]:
        """(demand, catch-up) in records read per second at source ``name``, whether its
        demand may be higher than that by an unknown amount (it cannot tell its backlog
        and was backpressured: what it read is a lower bound), and the records of its
        backlog that DS2's last rescale held up (no catch-up for them)."""
        if r is None:
            return 0.0, 0.0, False, 0
        read = r.observed_input_rate
        backlog, growth = r.source_backlog, r.backlog_growth
        if backlog is None:
            return read, 0.0, r.backpressured_fraction > _BLOCKED, 0
        base = self.rescale_backlog.get(name)
        held_up = 0 if base is None else max(0, backlog - base)
        return (max(0.0, read + (growth or 0.0)), (backlog - held_up) / self.catch_up_s,
                False, held_up)

    def estimate(self, metrics: MetricsWindow, view: JobView) -> dict[str, Estimate]:
        """DS2's estimate for every vertex, in topological order (sources included, with
        their own parallelism as ``optimal``)."""
        out: dict[str, Estimate] = {}
        # per output edge: (target, catch-up, demand unknown above the target)
        edge_rate: dict[str, tuple[float, float, bool]] = {}
        for name, op in view.operators.items():
            r = metrics.operator(name)
            ratio = 1.0 if r is None or r.output_ratio is None else r.output_ratio
            per_edge = ratio / max(1, len(op.outputs))
            if op.is_source:
                demand, catch, blocked, held_up = self._source_rates(name, r)
                edge_rate[name] = (demand * per_edge, catch * per_edge, blocked)
                why = "a source" + (f"; {held_up:,} records of its backlog piled up while "
                                    "DS2's last rescale ran: no catch-up for them (the "
                                    "headroom drains them)" if held_up else "")
                out[name] = Estimate(name, op.parallelism, demand, catch, None, None,
                                     op.parallelism, why)
                continue
            ins = [edge_rate.get(u, (0.0, 0.0, False)) for u in op.inputs]
            target = sum(e[0] for e in ins)
            catch = sum(e[1] for e in ins)
            blocked = any(e[2] for e in ins)
            edge_rate[name] = (target * per_edge, catch * per_edge, blocked)
            out[name] = self._estimate_one(op, r, target, catch, blocked, view, metrics)
        return out

    def _estimate_one(self, op: OperatorView, raw: OperatorRates | None, target: float,
                      catch: float, blocked: bool, view: JobView,
                      metrics: MetricsWindow) -> Estimate:
        p = op.parallelism
        lo, hi = self.bounds(op)
        r = None if raw is None else without_cpu_wait(raw)
        capacity = None if r is None else r.capacity
        if capacity is None:
            if target + catch <= 0:  # idle: nothing to process, nothing measured
                best = self._align(op, lo, lo, hi)
                return Estimate(op.name, p, target, catch, None, 0.0, best,
                                "no input in the window")
            return Estimate(op.name, p, target, catch, None, None, p,
                            "not measured (input expected, none processed)")
        assert r is not None and raw is not None
        load = (target + catch) / capacity
        saturated = blocked and r.max_utilisation >= _SATURATED
        needed = (target / self.target_utilisation + catch
                  + target * self.disruption_s(op, target, view, metrics) / self.catch_up_s)
        exact = max(1, math.ceil(p * needed / capacity - 1e-9))
        best = self._align(op, exact, lo, hi)
        held = ""
        starved = starved_fraction(raw)
        if best > p:
            best, held = self._bounded_up(op, raw, best, lo, hi, view)
        elif best < p and starved is not None and starved > self.max_starved:
            best, held = p, (f"no scale-down: its tasks waited for a CPU {starved:.0%} of "
                             f"their busy time (more than {self.max_starved:.0%}), so its "
                             "capacity without that wait is not measured")
        tpr = r.true_processing_rate or 0.0
        reason = (f"needs {needed:,.0f} rec/s of capacity for {target:,.0f} rec/s"
                  f"{f' + {catch:,.0f} catch-up' if catch else ''}"
                  f"{' (a source was backpressured: its demand may be higher)' if saturated else ''}"
                  f"; has {capacity:,.0f} at p={p} (true {tpr:,.0f}/s per task, busiest "
                  f"{r.max_utilisation:.0%} busy"
                  f"{f', {starved:.0%} of busy time waiting for a CPU' if starved else ''}): "
                  f"load {load:.2f}{f'; {held}' if held else ''}")
        return Estimate(op.name, p, target, catch, capacity, load, best, reason, saturated, held)

    def _bounded_up(self, op: OperatorView, raw: OperatorRates, best: int, lo: int, hi: int,
                    view: JobView) -> tuple[int, str]:
        """``best`` (> the current parallelism) within what the cluster can host and the
        scale-up factor, and what held it lower ("" when nothing did)."""
        p = op.parallelism
        starved = starved_fraction(raw)
        if starved is not None and starved > self.max_starved:
            return p, (f"no scale-up: its tasks waited for a CPU {starved:.0%} of their busy "
                       f"time (more than {self.max_starved:.0%}), more tasks would wait too")
        bounds: list[tuple[int, str]] = []
        if self.max_scale_up is not None:
            bounds.append((math.ceil(p * self.max_scale_up - 1e-9),
                           f"at most {self.max_scale_up:g}x its tasks per decision"))
        if op.task_cpus > 0 and view.cpus_available is not None:
            bounds.append((p + math.floor(view.cpus_available / op.task_cpus + 1e-9),
                           f"Ray has {view.cpus_available:g} CPUs available for tasks of "
                           f"{op.task_cpus:g} CPUs"))
        if view.cpus is not None:
            c, how = self._cores_per_task(op, raw)
            bounds.append((math.floor(view.cpus / c + 1e-9),
                           f"the cluster's {view.cpus:g} CPUs keep {view.cpus / c:.3g} tasks "
                           f"working at {c:.2g} cores each ({how})"))
        if not bounds:
            return best, ""
        limit, why = min(bounds)
        limit = max(p, limit)
        if best <= limit:
            return best, ""
        bounded = self._align(op, limit, lo, hi)
        if not p <= bounded <= limit:  # the even split moved it out: the bound itself
            bounded = limit
        return bounded, f"bounded to {bounded} (DS2 asks {best}): {why}"

    def _cores_per_task(self, op: OperatorView, raw: OperatorRates) -> tuple[float, str]:
        if self.cpu_per_task is not None:
            return self.cpu_per_task, "cpu_per_task"
        if op.task_cpus > 0:
            return min(1.0, op.task_cpus), "its reservation"
        measured = cpu_share(raw)
        if measured is not None:
            return max(0.01, measured), "measured"
        return 1.0, "not measured: a core each"

    def _align(self, op: OperatorView, parallelism: int, lo: int, hi: int) -> int:
        p = max(lo, min(hi, parallelism))
        if op.keyed and op.assignment:
            p = even_split(p, len(op.assignment), self.key_group_tolerance)
        return max(lo, min(hi, p))

    # ------------------------------------------------------------------ the decision
    def decide(self, metrics: MetricsWindow, view: JobView) -> list[Decision]:
        wait = self._wait_reason(metrics, view)
        if wait:
            return [NoChange(wait)]
        estimates = self.estimate(metrics, view)
        backlogs = {name: r.source_backlog for name, r in metrics.operators.items()
                    if name in view.operators and view.operators[name].is_source
                    and r.source_backlog is not None}
        for name, level in backlogs.items():  # drained back: the rescale's backlog is gone
            if level <= self.rescale_backlog.get(name, -1):
                del self.rescale_backlog[name]
        ops = {o.name: o for o in rescalable(view, self.operators)}
        mine = [estimates[n] for n in ops if estimates[n].measured]
        lo, hi = self.band
        # out of the band and able to move (one at its limit stays where it is)
        outside = [e for e in mine if e.load is not None
                   and (not lo <= e.load <= hi or e.saturated)
                   and e.optimal != e.parallelism]
        # a forward partner follows its group's root; a group without one keeps its size
        fixed = [e for e in outside if ops[e.operator].fixed_parallelism]
        kept = [NoChange(f"{self.name}: {e.operator} stays at {e.parallelism} (DS2 would go to "
                         f"{e.optimal}: {e.reason}): {ops[e.operator].fixed_parallelism}")
                for e in fixed]
        outside = [e for e in outside if e not in fixed]
        if not outside:
            self.pending_down.clear()
            loads = ", ".join(f"{e.operator} {e.load:.2f}" + (
                "" if e.load is not None and lo <= e.load <= hi and not e.saturated else
                " (forward edge)" if e in fixed else f" ({e.held})" if e.held
                else " (at its limit)")
                for e in mine)
            held = [e.operator for e in mine if e.held and e.load is not None
                    and (not lo <= e.load <= hi or e.saturated)]
            headline = (f"{', '.join(held)} out of the utilisation band {lo}..{hi} but held "
                        "where it is" if held else
                        f"every operator {'it may rescale ' if kept else ''}within "
                        f"the utilisation band {lo}..{hi}")
            return [*kept, NoChange(f"{headline}{': ' + loads if loads else ''}")]
        decisions: list[Decision] = list(kept)
        waiting: list[str] = []
        for e in mine:
            if e in fixed:
                self.pending_down.pop(e.operator, None)
                continue
            if e.optimal > e.parallelism:
                self.pending_down.pop(e.operator, None)
                decisions.append(Scale(e.operator, e.optimal, protocol=self.protocol,
                                       assignment=self.assignment, balance=self.assignment_balance,
                                       reason=f"{self.name}: up {e.parallelism} -> {e.optimal}: "
                                              f"{e.reason}"))
            elif e.optimal < e.parallelism:
                first, highest = self.pending_down.get(e.operator, (view.now, e.optimal))
                highest = max(highest, e.optimal)
                if view.now - first >= self.scale_down_delay_s:
                    self.pending_down.pop(e.operator, None)
                    decisions.append(Scale(
                        e.operator, highest, protocol=self.protocol,
                        assignment=self.assignment, balance=self.assignment_balance,
                        reason=f"{self.name}: down {e.parallelism} -> {highest} (the highest "
                               f"recommended over {view.now - first:.0f} s): {e.reason}"))
                else:
                    self.pending_down[e.operator] = (first, highest)
                    waiting.append(f"{e.operator} {e.parallelism} -> {highest} in "
                                   f"{self.scale_down_delay_s - (view.now - first):.0f} s")
            else:
                self.pending_down.pop(e.operator, None)
        decisions = self.finish(decisions, estimates, metrics, view)
        if any(isinstance(d, Scale) for d in decisions):
            for name, level in backlogs.items():
                self.rescale_backlog[name] = min(level, self.rescale_backlog.get(name, level))
        else:
            why = "scale-down delayed: " + "; ".join(waiting)
            notes = [d for d in decisions if isinstance(d, NoChange)]
            if not notes or (waiting and all(d in kept for d in notes)):
                notes.append(NoChange(why))
            decisions = list(notes)
        return decisions

    def _wait_reason(self, metrics: MetricsWindow, view: JobView) -> str:
        if view.finishing:
            return "the input is ending: rescales are refused now"
        if view.rescaling:
            return f"a rescale is running ({', '.join(sorted(view.rescaling))})"
        if view.last_rescale_end is not None:
            since = view.now - view.last_rescale_end
            if since < self.stabilisation_s:
                return (f"stabilising: {since:.1f} of {self.stabilisation_s:g} s since the "
                        "last rescale")
        if metrics.seconds < self.min_window_s:
            return (f"metrics window of {metrics.seconds:.1f} s is shorter than "
                    f"{self.min_window_s:g} s")
        return _overspan(metrics)

    def finish(self, decisions: list[Decision], estimates: Mapping[str, Estimate],
               metrics: MetricsWindow, view: JobView) -> list[Decision]:
        """What becomes of the recommended scale decisions (DS2 carries them all out)."""
        return decisions


def _overspan(metrics: MetricsWindow) -> str:
    """Why the window does not measure ("" when it does): a task that answered no poll in
    it, a task whose accounted time exceeds ``_OVERSPAN`` x its span, or a source task that
    tells its backlog now but did not at the window's start (its snapshot then came before
    it ran): the backlog's growth is demand it could not read, and without it what the
    source read, held back by a saturated operator, would be taken for its whole demand."""
    for r in metrics.operators.values():
        for t in r.tasks:
            if t.seconds <= 0 < metrics.seconds:
                return (f"waiting for a window that measures: task {t.task} answered no "
                        "metrics poll in it (the same snapshot at both ends)")
            if t.source_backlog is not None and t.backlog_change is None:
                return (f"waiting for a window that measures: source task {t.task}'s "
                        "backlog at the window's start is unknown, so its growth (demand "
                        "it could not read) is")
            spent = t.useful_s + t.idle_s + t.backpressured_s
            if t.seconds > 0 and spent > _OVERSPAN * t.seconds:
                return (f"waiting for a window that measures: task {t.task}'s counters span "
                        f"{spent:.1f} s of a {t.seconds:.1f} s window (its snapshot at the "
                        "start was late or missing)")
    return ""


__all__ = ["DS2", "Estimate", "even_split"]
