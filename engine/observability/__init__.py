"""What a job shows about itself: latency histograms (``latency``), rates and the
metrics history (``rates``), per-task metrics exported to Prometheus (``metrics``), per key
group statistics (``groupstats``), the Grafana dashboards and alert rules (``dashboards``)
and plots from a Prometheus server (``promplot``).

May import: ``engine.errors``, ``engine.names``, ``engine.wire``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.names import lazy_exports

if TYPE_CHECKING:
    from engine.errors import PrometheusError
    from engine.observability.dashboards import DASHBOARDS, Dashboard, dashboard, to_grafana, write
    from engine.observability.groupstats import GroupLoad
    from engine.observability.latency import LatencyHistogram
    from engine.observability.metrics import (
        JobMetrics,
        MetricsEndpoint,
        RescaleProgress,
        TaskMetrics,
    )
    from engine.observability.promplot import query_range, render
    from engine.observability.rates import MetricsHistory, MetricsWindow, OperatorRates, TaskRates

# name -> its module, imported on first use: importing the package loads none of its
# modules, so it costs nothing and closes no import cycle; the imports above are the same
# names for type checkers and the layer test (tests/unit/test_public_api.py checks both agree)
_EXPORTS: dict[str, str] = {
    "PrometheusError": "engine.errors",
    "DASHBOARDS": "engine.observability.dashboards",
    "Dashboard": "engine.observability.dashboards",
    "dashboard": "engine.observability.dashboards",
    "to_grafana": "engine.observability.dashboards",
    "write": "engine.observability.dashboards",
    "GroupLoad": "engine.observability.groupstats",
    "LatencyHistogram": "engine.observability.latency",
    "JobMetrics": "engine.observability.metrics",
    "MetricsEndpoint": "engine.observability.metrics",
    "RescaleProgress": "engine.observability.metrics",
    "TaskMetrics": "engine.observability.metrics",
    "query_range": "engine.observability.promplot",
    "render": "engine.observability.promplot",
    "MetricsHistory": "engine.observability.rates",
    "MetricsWindow": "engine.observability.rates",
    "OperatorRates": "engine.observability.rates",
    "TaskRates": "engine.observability.rates",
}

__all__ = [
    "Dashboard",
    "dashboard",
    "DASHBOARDS",
    "GroupLoad",
    "JobMetrics",
    "LatencyHistogram",
    "MetricsEndpoint",
    "MetricsHistory",
    "MetricsWindow",
    "OperatorRates",
    "PrometheusError",
    "query_range",
    "render",
    "RescaleProgress",
    "TaskMetrics",
    "TaskRates",
    "to_grafana",
    "write",
]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
