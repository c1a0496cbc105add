"""Policies that decide reconfigurations while a job runs.

``controllers.base``: the API (``Controller``, the decisions, the view and the metrics
window); ``controllers.ds2``: DS2 autoscaling; ``controllers.cost_aware``: DS2 with the
measured cost of reflow's own migrations; ``controllers.balancer``: the skew balancer.
Run them with ``job.run(controllers=[...])`` or ``handle.add_controller(...)``.
"""

from controllers.balancer import SkewBalancer
from controllers.base import (
    ChangeLogic,
    Controller,
    Decision,
    DecisionKind,
    DecisionOutcome,
    DecisionRecord,
    JobView,
    MetricsWindow,
    NoChange,
    OperatorRates,
    OperatorView,
    Place,
    Rebalance,
    RescaleRecord,
    Scale,
    TaskRates,
    rescalable,
)
from controllers.cost_aware import CostAwareDS2
from controllers.ds2 import DS2

__all__ = [
    "DS2",
    "ChangeLogic",
    "Controller",
    "CostAwareDS2",
    "Decision",
    "DecisionKind",
    "DecisionOutcome",
    "DecisionRecord",
    "JobView",
    "MetricsWindow",
    "NoChange",
    "OperatorRates",
    "OperatorView",
    "Place",
    "Rebalance",
    "RescaleRecord",
    "Scale",
    "SkewBalancer",
    "TaskRates",
    "rescalable",
]
