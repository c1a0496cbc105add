"""The skew balancer: when one task carries much more than the others, move key groups.

At the same parallelism, a keyed operator whose key groups are unevenly loaded (a hot key,
a skewed key distribution) has one task busier than the rest; it saturates first and holds
the whole operator back (which is why DS2 reads the MAX utilisation). Adding tasks does
not help while the hot groups stay together. This controller watches each keyed
operator's tasks: when the busiest task's input rate exceeds the mean of the others' by
more than ``threshold`` (0.3: 30 % more), it asks for a ``Rebalance`` to the assignment
``assignment(loads, sizes, current, parallelism)`` computes from the measured per key
group loads (``migration.assignment.balanced`` by default: the load evened, few groups
moved), provided it lowers the imbalance (busiest task over the mean) by at least
``min_gain``. It waits while any rescale runs and ``cooldown_s`` after one ends.
"""

from __future__ import annotations

from collections.abc import Sequence

from controllers.base import Controller, JobView, MetricsWindow, NoChange, Rebalance, rescalable
from controllers.cost_aware import Assignment, balanced_target
from engine.control.reconfiguration import Decision
from engine.dataflow.keygroups import moved_key_groups
from engine.errors import ControllerError
from migration.assignment import imbalance


class SkewBalancer(Controller):
    """Rebalances skewed keyed operators at the same parallelism (see the module doc)."""

    group_stats = True

    def __init__(self, *, threshold: float = 0.3, min_gain: float = 0.1,
                 assignment: Assignment = balanced_target, protocol: str = "drrs",
                 operators: Sequence[str] | None = None, cooldown_s: float = 10.0,
                 interval_s: float = 5.0, window_s: float = 10.0,
                 min_window_s: float | None = None, name: str = "balancer") -> None:
        if threshold < 0 or min_gain < 0 or cooldown_s < 0:
            raise ControllerError("SkewBalancer: threshold, min_gain and cooldown_s must be >= 0")
        self.threshold = threshold
        self.min_gain = min_gain
        self.assignment = assignment
        self.protocol = protocol
        self.operators = None if operators is None else tuple(operators)
        self.cooldown_s = cooldown_s
        self.interval_s = interval_s
        self.window_s = window_s
        self.min_window_s = window_s / 2 if min_window_s is None else min_window_s
        self.name = name

    def decide(self, metrics: MetricsWindow, view: JobView) -> list[Decision]:
        if view.finishing:
            return [NoChange("the input is ending")]
        if view.rescaling:
            return [NoChange(f"a rescale is running ({', '.join(sorted(view.rescaling))})")]
        if view.last_rescale_end is not None and view.now - view.last_rescale_end < self.cooldown_s:
            return [NoChange(f"cooling down after the last rescale ({self.cooldown_s:g} s)")]
        if metrics.seconds < self.min_window_s:
            return [NoChange(f"metrics window of {metrics.seconds:.1f} s is too short")]
        out: list[Decision] = []
        calm: list[str] = []
        for op in rescalable(view, self.operators):
            r = metrics.operator(op.name)
            if not op.keyed or op.parallelism < 2 or r is None or r.records_in == 0:
                continue
            rates = [t.observed_input_rate for t in r.tasks]
            hot = max(range(len(rates)), key=lambda i: rates[i])
            others = (sum(rates) - rates[hot]) / (len(rates) - 1)
            excess = rates[hot] / others - 1 if others > 0 else float("inf")
            if excess <= self.threshold:
                calm.append(f"{op.name} busiest task +{excess:.0%}")
                continue
            loads = view.group_load.get(op.name, ())
            if len(loads) != len(op.assignment) or sum(loads) <= 0:
                out.append(NoChange(f"{op.name} is skewed (task {r.tasks[hot].task_index} "
                                    f"+{excess:.0%}) but no key group loads were measured"))
                continue
            sizes = view.group_bytes.get(op.name, ()) or [0] * len(loads)
            target = tuple(self.assignment(loads, sizes, op.assignment, op.parallelism))
            before = imbalance(loads, op.assignment, op.parallelism) or 1.0
            after = imbalance(loads, target, max(target) + 1) or 1.0
            if target == op.assignment or before - after < self.min_gain:
                out.append(NoChange(f"{op.name} is skewed (+{excess:.0%}) but no assignment "
                                    f"lowers its imbalance {before:.2f} by {self.min_gain:g}"))
                continue
            moved = len(moved_key_groups(op.assignment, target))
            out.append(Rebalance(
                op.name, target, protocol=self.protocol,
                reason=(f"{self.name}: task {r.tasks[hot].task_index} of {op.name} takes "
                        f"{rates[hot]:,.0f} rec/s, +{excess:.0%} over the others' mean; "
                        f"imbalance {before:.2f} -> {after:.2f} moving {moved} key groups")))
        return out or [NoChange("no skew above the threshold" + (f": {'; '.join(calm)}"
                                                                  if calm else ""))]


__all__ = ["SkewBalancer"]
