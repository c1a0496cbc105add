"""The controller API: a policy that reads a job's metrics and decides reconfigurations.

In the spirit of Trisk's controllers, a controller is a small class with one decision
method. The JobMaster runs it every ``interval_s`` seconds (``job.run(controllers=[...])``
or ``handle.add_controller(...)``) and calls::

    decide(metrics: MetricsWindow, view: JobView) -> Decision | list[Decision] | None

``metrics`` covers the last ``window_s`` seconds (never across a rescale: a window starts
at the end of the last one, so it may be shorter; ``metrics.seconds`` says how long): per
operator (``metrics.operators[name]``, an ``OperatorRates``) records in and out, useful
time, true and observed rates, utilisation (MAX and mean over the tasks), capacity, a
source's backlog, and the sinks' latency. ``view`` is the job as it stands: operators in
topological order with parallelism, tasks, assignment, inputs and outputs, the rescales
running, the history of past rescales with what they cost (``RescaleRecord``), and, for a
controller with ``group_stats = True``, per key group load and state size.

A decision is a frozen value with a reason: ``Scale(op, n)``, ``Rebalance(op,
assignment)``, ``ChangeLogic(op, fn)``, ``Place(op, task_index, node)`` or
``NoChange(reason)``. The JobMaster carries each out through the same validated path as
the ``JobHandle`` call of the same name, one at a time per operator; every decision,
carried out or not, is logged, counted in Prometheus
(``reflow_controller_decisions_total{controller,kind,outcome}``) and listed by
``handle.decisions()``. A decision the job refuses (an unknown operator, a parallelism out
of range, an operator already rescaling) is recorded as refused with the reason; a
controller that raises or returns something else is recorded as an error and skipped: the
job never fails because of its controller.

A controller keeps its own state between calls (it runs inside the JobMaster: ``decide``
must not block, sleep or do I/O; it is called from the JobMaster's event loop). An
example::

    from controllers.base import Controller, NoChange, Scale

    class AddOneWhenBusy(Controller):
        interval_s, window_s = 2.0, 4.0

        def decide(self, metrics, view):
            rates = metrics.operators.get("count")
            op = view.operators["count"]
            if rates and rates.max_utilisation > 0.9 and op.parallelism < op.max_parallelism:
                return Scale("count", op.parallelism + 1, reason="busiest task over 90%")
            return NoChange("not busy")
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

from engine.control.reconfiguration import (
    ChangeLogic,
    Decision,
    DecisionKind,
    DecisionOutcome,
    DecisionRecord,
    JobView,
    NoChange,
    OperatorView,
    Place,
    Rebalance,
    RescaleRecord,
    Scale,
)
from engine.observability.rates import MetricsWindow, OperatorRates, TaskRates


class Controller(abc.ABC):
    """Base class of controllers: set ``interval_s`` (how often ``decide`` runs),
    ``window_s`` (how much metrics history it sees), ``group_stats`` (whether the view
    carries per key group load and state size: the JobMaster asks the keyed tasks for them
    before each call, which costs a control call per task) and optionally ``name`` (the
    class name by default; unique per job)."""

    name: str = ""
    interval_s: float = 5.0
    window_s: float = 10.0
    group_stats: bool = False

    @abc.abstractmethod
    def decide(self, metrics: MetricsWindow, view: JobView
               ) -> Decision | Sequence[Decision] | None:
        """The reconfigurations to carry out now (None or an empty list: no change)."""


def rescalable(view: JobView, operators: Sequence[str] | None = None) -> list[OperatorView]:
    """The vertices a policy may rescale, in topological order: every one but the sources,
    or those of ``operators`` (by vertex name)."""
    return [o for o in view.operators.values()
            if not o.is_source and (operators is None or o.name in operators)]


__all__ = ["ChangeLogic", "Controller", "Decision", "DecisionKind", "DecisionOutcome",
           "DecisionRecord", "JobView", "MetricsWindow", "NoChange", "OperatorRates",
           "OperatorView", "Place", "Rebalance", "RescaleRecord", "Scale", "TaskRates",
           "rescalable"]
