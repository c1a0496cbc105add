"""DS2 that knows what its own migrations cost: ``CostAwareDS2``.

Flink's autoscaler charges every action a fixed ``restart.time`` (5 minutes by default):
the capacity it asks for includes what it needs to catch up the backlog a restart builds,
and since every action costs the same, it cannot tell a cheap action from a dear one.
reflow rescales live, and measures what each rescale held up (``RescaleRecord``: the
sources' backlog it built and the latency excess, as ``disruption_s``, the seconds of input
it held up, beside the bytes it moved). This policy uses those measurements:

1. **A cost model per protocol**, fitted on the job's own history: ``disruption_s = fixed_s
   + per_mb_s * MB moved`` (least squares with non-negative terms over the last
   ``memory`` rescales of the protocol; priors until there are measurements: live
   protocols ``prior_live``, stop-restart ``prior_stop_restart``). The protocol is the one
   that ran (``RescaleReport.protocol``): a live request for an operator without key
   groups runs ``stateless`` (no state moves, no other operator stops) and is predicted
   and fitted as such, never as the key-group protocol it named.
2. **DS2's parallelism with the measured cost** in place of the fixed restart time: the
   capacity must also drain, within ``catch_up_s``, the backlog the migration itself will
   build (``target rate * predicted disruption``), so a cheap live migration asks for
   little extra capacity where a fixed restart time over-provisions.
3. **The protocol and the assignment**, per action: among ``protocols`` and the target
   assignments of ``assignments`` (``uniform`` ranges; ``ssm``, the optimal single step of
   ``migration.assignment``: fewest bytes moved under a load bound; ``balanced``: few
   moves, even load, any layout; or any function ``(loads, sizes, current, parallelism)
   -> assignment``) that keep every
   task's load within ``1 + balance`` of the mean, the pair whose predicted disruption
   (from the key groups' state sizes that would move) is lowest.
4. **Pay-off.** An action runs only when its gain pays for its disruption over the
   ``horizon`` it is expected to last (the median time between this operator's past
   rescales, at most ``horizon_s``):

   * a scale-up removes a deficit (target + catch-up above capacity): it runs when the
     records that deficit would pile up over the horizon exceed the records the migration
     holds up (``target rate * disruption``);
   * a scale-down frees tasks: it runs when the task-seconds it frees over the horizon
     are at least ``payback`` times the task-seconds its migration disrupts (old
     parallelism * disruption), and when the tasks left can drain the backlog it builds
     within ``catch_up_s``.

   An action skipped is a ``NoChange`` whose reason gives the numbers.

Where it decides differently from plain DS2 (and why) is in each decision's reason and in
the benchmark's notes (``examples/bench/autoscale.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controllers.base import JobView, MetricsWindow, NoChange, Scale
from controllers.ds2 import DS2, Estimate
from engine.control.reconfiguration import Decision, OperatorView, RescaleRecord
from engine.dataflow.keygroups import moved_key_groups
from engine.errors import AssignmentError, ControllerError
from migration.assignment import (
    GroupWorkload,
    balanced,
    imbalance,
    ssm,
    uniform,
)
from migration.protocols import protocol_used

Assignment = Callable[[Sequence[float], Sequence[int], Sequence[int], int], tuple[int, ...]]


def uniform_target(loads: Sequence[float], sizes: Sequence[int], current: Sequence[int],
                   parallelism: int) -> tuple[int, ...]:
    """Contiguous ranges (what a rescale without an assignment does)."""
    return uniform(len(current), parallelism)


def balanced_target(loads: Sequence[float], sizes: Sequence[int], current: Sequence[int],
                    parallelism: int) -> tuple[int, ...]:
    """``migration.assignment.balanced``: even load, few groups moved."""
    return balanced(loads, current, parallelism)


def ssm_target(loads: Sequence[float], sizes: Sequence[int], current: Sequence[int],
               parallelism: int, balance: float = 0.2) -> tuple[int, ...]:
    """``migration.assignment.ssm``: the fewest bytes moved with every task's load within
    ``1 + balance`` of the mean (contiguous ranges; ``BalanceInfeasible`` when none)."""
    return ssm(current, parallelism, GroupWorkload(tuple(loads), tuple(sizes)),
               balance).assignment


DEFAULT_ASSIGNMENTS: dict[str, Assignment] = {"uniform": uniform_target, "ssm": ssm_target,
                                              "balanced": balanced_target}


@dataclass(frozen=True)
class CostModel:
    """``disruption_s = fixed_s + per_mb_s * megabytes`` for one protocol, fitted on
    ``observations`` measured rescales (0: the prior)."""

    protocol: str
    fixed_s: float
    per_mb_s: float
    observations: int

    def predict(self, megabytes: float) -> float:
        return self.fixed_s + self.per_mb_s * max(0.0, megabytes)

    def __str__(self) -> str:
        basis = (f"fitted on {self.observations} rescales" if self.observations
                 else "prior, no rescale measured yet")
        return f"{self.protocol}: {self.fixed_s:.2f} s + {self.per_mb_s:.3f} s/MB ({basis})"


def fit_cost(records: Sequence[RescaleRecord], protocol: str, prior: tuple[float, float],
             memory: int = 10) -> CostModel:
    """The cost model of ``protocol`` from its last ``memory`` complete, measured rescales
    (least squares of disruption on megabytes moved, both terms >= 0; with one rescale, or
    all of one size, the prior's slope and the fixed part fitted)."""
    recs = [r for r in records if r.protocol == protocol and not r.cut_short
            and r.input_rate > 0][-memory:]
    if not recs:
        return CostModel(protocol, prior[0], prior[1], 0)
    xs = [r.megabytes_moved for r in recs]
    ys = [r.disruption_s for r in recs]
    n = len(recs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 1e-12:
        slope = prior[1]
    else:
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    slope = max(0.0, slope)
    fixed = my - slope * mx
    if fixed < 0:  # through the origin instead
        fixed = 0.0
        sx2 = sum(x * x for x in xs)
        slope = sum(x * y for x, y in zip(xs, ys, strict=True)) / sx2 if sx2 > 0 else 0.0
    return CostModel(protocol, fixed, slope, n)


@dataclass(frozen=True)
class Option:
    """One way to carry out a rescale: protocol asked for (and ``runs_as``, what runs when
    that differs), target assignment, what it moves and the predicted disruption (seconds
    of input held up, from the cost model of what runs)."""

    protocol: str
    assignment_name: str
    assignment: tuple[int, ...] | None
    megabytes: float
    disruption_s: float
    imbalance: float | None
    runs_as: str = ""

    @property
    def used(self) -> str:
        """The protocol that will run (``migration.protocols.protocol_used``): the one asked
        for, or ``stateless``/``handover`` for an operator without key groups."""
        return self.runs_as or self.protocol


class CostAwareDS2(DS2):
    """DS2 with the measured migration cost (see the module doc). Takes every ``DS2``
    argument; ``protocols``: the protocols it may choose from; ``assignments``: name ->
    target-assignment function (``DEFAULT_ASSIGNMENTS``: uniform, balanced; pass
    ``migration.assignment``'s optimal ones when there); ``balance``: the load imbalance
    an assignment may leave; ``horizon_s``: the longest an action is expected to last;
    ``payback``: how many times the disrupted task-seconds a scale-down must free."""

    group_stats = True
    default_name = "cost-aware"

    def __init__(self, *, protocols: Sequence[str] = ("drrs",),
                 assignments: Mapping[str, Assignment] | None = None, balance: float = 0.1,
                 horizon_s: float = 120.0, payback: float = 5.0,
                 prior_live: tuple[float, float] = (0.5, 0.2),
                 prior_stop_restart: tuple[float, float] = (5.0, 0.2), memory: int = 10,
                 **ds2: Any) -> None:  # DS2's keyword arguments, checked by DS2
        if "assignment" in ds2:
            raise ControllerError("CostAwareDS2 chooses each rescale's assignment itself, "
                                  "among assignments= (name -> function); it takes no "
                                  "assignment=")
        super().__init__(**ds2)
        if not protocols:
            raise ControllerError("CostAwareDS2: protocols must name at least one protocol")
        if horizon_s <= 0 or payback < 0 or balance < 0:
            raise ControllerError("CostAwareDS2: horizon_s must be > 0, payback and balance >= 0")
        self.protocols = tuple(protocols)
        self.assignments = dict(DEFAULT_ASSIGNMENTS if assignments is None else assignments)
        if not self.assignments:
            raise ControllerError("CostAwareDS2: assignments must hold at least one function")
        self.balance = balance
        self.horizon_s = horizon_s
        self.payback = payback
        self.prior_live = prior_live
        self.prior_stop_restart = prior_stop_restart
        self.memory = memory

    # ------------------------------------------------------------------ the cost model
    def model(self, protocol: str, view: JobView) -> CostModel:
        prior = self.prior_stop_restart if protocol == "stop-restart" else self.prior_live
        return fit_cost(view.rescales, protocol, prior, self.memory)

    def runs_as(self, protocol: str, op: OperatorView) -> str:
        """What a rescale of ``op`` asked with ``protocol`` runs as: the protocol whose
        measured rescales predict its cost (a live request for an operator without key
        groups runs ``stateless``, and is measured as such)."""
        return protocol_used(protocol, keyed=op.keyed, source=op.is_source)

    def disruption_s(self, op: OperatorView, target_rate: float, view: JobView,
                     metrics: MetricsWindow) -> float:
        """The cheapest protocol's predicted disruption for moving half the operator's
        state (the parallelism is not known yet here; ``finish`` predicts it exactly)."""
        r = metrics.operator(op.name)
        mb = (r.state_bytes / 1e6 / 2) if r is not None and op.keyed else 0.0
        return min(self.model(self.runs_as(p, op), view).predict(mb) for p in self.protocols)

    def horizon(self, operator: str, view: JobView) -> float:
        """How long an action on ``operator`` is expected to last: the median time between
        its past rescales (at most ``horizon_s``), else ``horizon_s``."""
        times = [r.requested_at for r in view.history(operator)]
        gaps = sorted(b - a for a, b in zip(times, times[1:], strict=False))
        if not gaps:
            return self.horizon_s
        return min(self.horizon_s, gaps[len(gaps) // 2])

    # ------------------------------------------------------------------ the options
    def _profile(self, op: OperatorView, view: JobView, metrics: MetricsWindow
                 ) -> tuple[list[float], list[int]]:
        """Per key group load and state size: the view's, else each task's average."""
        n = len(op.assignment)
        loads = list(view.group_load.get(op.name, ()))
        sizes = list(view.group_bytes.get(op.name, ()))
        r = metrics.operator(op.name)
        if len(sizes) != n or len(loads) != n:
            per_task: dict[int, tuple[float, int]] = {}
            if r is not None:
                for t in r.tasks:
                    groups = max(1, t.key_groups)
                    per_task[t.task_index] = (t.observed_input_rate / groups,
                                              t.state_bytes // groups)
            if len(loads) != n:
                loads = [per_task.get(t, (1.0, 0))[0] for t in op.assignment]
            if len(sizes) != n:
                sizes = [per_task.get(t, (0.0, 0))[1] for t in op.assignment]
        return loads, sizes

    def options(self, op: OperatorView, parallelism: int, view: JobView,
                metrics: MetricsWindow) -> list[Option]:
        """Every (protocol, assignment) way to bring ``op`` to ``parallelism``, cheapest
        first among those within the balance bound (then the rest, most even first)."""
        current = op.assignment
        out: list[Option] = []
        if not op.keyed or not current:  # no state moves: 'stateless' (or as asked)
            for proto in self.protocols:
                used = self.runs_as(proto, op)
                out.append(Option(proto, "none", None, 0.0,
                                  self.model(used, view).predict(0.0), None,
                                  used if used != proto else ""))
            return sorted(out, key=lambda o: o.disruption_s)
        loads, sizes = self._profile(op, view, metrics)
        seen: set[tuple[int, ...]] = set()
        for name, fn in self.assignments.items():
            try:
                target = tuple(fn(loads, sizes, current, parallelism))
            except AssignmentError:  # e.g. ssm: no contiguous assignment within its bound
                continue
            if target in seen or len(target) != len(current):
                continue
            seen.add(target)
            mb = sum(sizes[kg] for kg in moved_key_groups(current, target)) / 1e6
            imb = imbalance(loads, target, parallelism) if sum(loads) > 0 else None
            for proto in self.protocols:
                explicit = None if name == "uniform" else target
                out.append(Option(proto, name, explicit, mb,
                                  self.model(proto, view).predict(mb), imb))
        bound = 1 + self.balance
        fits = sorted((o for o in out if o.imbalance is None or o.imbalance <= bound),
                      key=lambda o: (o.disruption_s, o.megabytes))
        rest = sorted((o for o in out if o not in fits),
                      key=lambda o: (o.imbalance or 0.0, o.disruption_s))
        return fits + rest

    # ------------------------------------------------------------------ the pay-off
    def finish(self, decisions: list[Decision], estimates: Mapping[str, Estimate],
               metrics: MetricsWindow, view: JobView) -> list[Decision]:
        out: list[Decision] = []
        for d in decisions:
            if not isinstance(d, Scale):
                out.append(d)
                continue
            op = view.operators[d.operator]
            e = estimates[d.operator]
            options = self.options(op, d.parallelism, view, metrics)
            best = options[0]
            held = e.target_rate * best.disruption_s  # records the migration holds up
            horizon = self.horizon(d.operator, view)
            how = (f"{best.protocol} (runs as {best.runs_as})" if best.runs_as
                   else best.protocol)
            cost = (f"{how} with the {best.assignment_name} assignment moves "
                    f"{best.megabytes:.2f} MB, predicted to hold up {best.disruption_s:.2f} s "
                    f"of input ({held:,.0f} records; {self.model(best.used, view)})")
            skip = self._skip(d, e, best, held, horizon)
            if skip:
                out.append(NoChange(f"{self.name}: skip {d.operator} {e.parallelism} -> "
                                    f"{d.parallelism}: {skip}; {cost}"))
                continue
            out.append(Scale(d.operator, d.parallelism, protocol=best.protocol,
                             assignment=best.assignment, planning=d.planning,
                             reason=f"{d.reason}; {cost}"))
        return out

    def _skip(self, d: Scale, e: Estimate, best: Option, held: float, horizon: float) -> str:
        """Why the action does not pay for its disruption ("" when it does)."""
        p, q = e.parallelism, d.parallelism
        capacity = e.capacity or 0.0
        if q > p:
            deficit = e.target_rate + e.catch_up - capacity
            if deficit > 0 and deficit * horizon < held:
                return (f"the deficit of {deficit:,.0f} rec/s piles up {deficit * horizon:,.0f} "
                        f"records over the {horizon:.0f} s horizon, fewer than the migration "
                        f"holds up")
            return ""
        freed = (p - q) * horizon
        disrupted = p * best.disruption_s
        if freed < self.payback * disrupted:
            return (f"it frees {freed:,.0f} task-seconds over the {horizon:.0f} s horizon, less "
                    f"than {self.payback:g} x the {disrupted:,.1f} task-seconds its migration "
                    f"disrupts")
        spare = capacity * q / p - e.target_rate
        if held > 0 and (spare <= 0 or held / spare > self.catch_up_s):
            drain = math.inf if spare <= 0 else held / spare
            return (f"{q} tasks would drain the {held:,.0f} records it holds up in "
                    f"{drain:,.0f} s, beyond catch_up_s={self.catch_up_s:g}")
        return ""


__all__ = ["DEFAULT_ASSIGNMENTS", "Assignment", "CostAwareDS2", "CostModel", "Option",
           "balanced_target", "fit_cost", "ssm_target", "uniform_target"]
