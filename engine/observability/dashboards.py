"""reflow's Grafana dashboards, defined once as data: Grafana JSON, ``reflow plot`` and the
tests all read these definitions.

Why code and not hand-written JSON: the queries are what matters, and three readers need
them (Grafana through the provisioned JSON in ``deploy/grafana/dashboards/``, ``reflow plot
--prometheus URL --dashboard NAME`` which draws the same queries with matplotlib for users
without Grafana, and the test that asserts every query returns data from a real Prometheus
scraping a real job). Plain frozen dataclasses rather than grafana-foundation-sdk: the SDK
needs Python 3.11+ while reflow supports 3.10, its builders would still leave the queries to
be read back out of the built objects, and this module must stay importable from the
installed package with reflow's own dependencies only (``reflow plot`` runs outside a
checkout).

Format: a dashboard is rows of panels. ``to_grafana(dashboard)`` returns Grafana's
dashboard JSON model (schemaVersion 39: a row panel heading each row's timeseries and
state-timeline panels, two panels a line, a ``job`` template variable over
``label_values(reflow_job_running, job)``, a Prometheus data source variable, annotations
from PromQL). Queries use Grafana's ``$job`` and ``$__rate_interval``; ``expand(expr, job,
rate_interval)`` substitutes them for a plain Prometheus query.

Guarantees: panel titles are unique within a dashboard; every row has a panel and every
panel at least one query;
``python -m engine.observability.dashboards DIR`` writes ``DIR/<uid>.json`` for every dashboard (what
``deploy/grafana/dashboards/`` holds; a test fails when the checked-in files differ).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from engine.names import NameEnum


class PanelKind(NameEnum):
    TIMESERIES = "timeseries"
    STATE = "state-timeline"


@dataclass(frozen=True)
class Query:
    """One PromQL expression and its legend (Grafana's ``{{label}}`` templating)."""

    expr: str
    legend: str = ""

    def __post_init__(self) -> None:
        if not self.expr.strip():
            raise ValueError("a query needs a PromQL expression")


@dataclass(frozen=True)
class Panel:
    """A graph: ``unit`` is Grafana's unit id (``s``, ``bytes``, ``percentunit``, ...)."""

    title: str
    queries: tuple[Query, ...]
    unit: str = "short"
    description: str = ""
    kind: PanelKind = PanelKind.TIMESERIES
    stacked: bool = False

    def __post_init__(self) -> None:
        if not self.queries:
            raise ValueError(f"panel {self.title!r} has no query")


@dataclass(frozen=True)
class Row:
    """A titled group of panels (Grafana's row), drawn in order, two a line."""

    title: str
    panels: tuple[Panel, ...]

    def __post_init__(self) -> None:
        if not self.panels:
            raise ValueError(f"row {self.title!r} has no panel")


@dataclass(frozen=True)
class Annotation:
    """Events drawn on every panel: a PromQL expression true at the events' times."""

    name: str
    expr: str
    text: str


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]
    annotations: tuple[Annotation, ...] = field(default=())

    @property
    def panels(self) -> tuple[Panel, ...]:
        """Every panel, row after row."""
        return tuple(p for r in self.rows for p in r.panels)

    def __post_init__(self) -> None:
        titles = [p.title for p in self.panels]
        dup = {t for t in titles if titles.count(t) > 1}
        if dup:
            raise ValueError(f"dashboard {self.uid!r}: panel titles used twice: {sorted(dup)}")

    def queries(self) -> list[tuple[str, Query]]:
        """``(panel or annotation title, query)`` for every query of the dashboard."""
        out = [(p.title, q) for p in self.panels for q in p.queries]
        out += [(f"annotation: {a.name}", Query(a.expr, a.text)) for a in self.annotations]
        return out


J = 'job=~"$job"'
RATE = "$__rate_interval"


def _rate(metric: str, by: str = "operator") -> str:
    return f"sum by ({by}) (rate({metric}{{{J}}}[{RATE}]))"


def _share(metric: str) -> str:
    """The mean fraction of time an operator's tasks spent in ``metric`` (0-1)."""
    return (f"sum by (operator) (rate({metric}{{{J}}}[{RATE}])) / "
            f"count by (operator) ({metric}{{{J}}})")


def _quantile(q: float, metric: str, by: str = "le", window: str = RATE) -> str:
    return (f"histogram_quantile({q}, sum by ({by}) "
            f"(rate({metric}_bucket{{{J}}}[{window}])))")


# checkpoints come every checkpoint_interval_s (often a minute or more): their rates are
# taken over a window long enough to hold several
CHECKPOINT_WINDOW = "5m"

OVERVIEW = Dashboard(
    uid="reflow-overview",
    title="reflow: job overview",
    description="Throughput, latency, time use, queues, watermarks, state, checkpoints and "
                "controllers of reflow jobs",
    rows=(
        Row("Throughput and latency", (
            Panel("Records in per second",
                  (Query(_rate("reflow_records_in_total"), "{{operator}}"),),
                  "ops", "Records taken in by each operator's tasks"),
            Panel("Records out per second",
                  (Query(_rate("reflow_records_out_total"), "{{operator}}"),),
                  "ops", "Records sent by each operator's tasks"),
            Panel("End-to-end latency",
                  tuple(Query(_quantile(q, "reflow_end_to_end_latency_seconds"),
                              f"p{int(q * 100)}") for q in (0.5, 0.95, 0.99)),
                  "s", "Latency markers from the sources to the sinks (histogram "
                       "percentiles)"),
        )),
        Row("Time use", (
            Panel("Useful share",
                  (Query(_share("reflow_useful_seconds_total"), "{{operator}}"),),
                  "percentunit", "Mean fraction of time the operator's tasks did operator "
                  "work (DS2's useful time)"),
            Panel("True processing rate per task",
                  (Query(f"{_rate('reflow_records_in_total')} / "
                         f"{_rate('reflow_useful_seconds_total')}", "{{operator}}"),),
                  "ops", "Records an operator's task takes per second of useful time: what "
                  "it could take if it never waited (DS2)"),
            Panel("Backpressured share",
                  (Query(_share("reflow_backpressured_seconds_total"), "{{operator}}"),),
                  "percentunit", "Mean fraction of time the tasks waited for output credits"),
            Panel("Idle share", (Query(_share("reflow_idle_seconds_total"), "{{operator}}"),),
                  "percentunit", "Mean fraction of time the tasks waited for input"),
        )),
        Row("Queues, watermarks and state", (
            Panel("Queued frames",
                  (Query(f"sum by (operator) (reflow_queued_frames{{{J}}})",
                         "{{operator}}"),),
                  "short", "Frames waiting in the operator's input queues (bounded by "
                           "credits)"),
            Panel("Watermark lag",
                  (Query(f"time() - max by (operator) "
                         f"(reflow_watermark_milliseconds{{{J}}} > 0) / 1000", "{{operator}}"),),
                  "s", "Wall-clock time minus the operator's event-time watermark "
                       "(operators of jobs with event time)"),
            Panel("State bytes per task",
                  (Query(f"reflow_state_bytes{{{J}}}", "{{operator}} {{task}}"),),
                  "bytes", "Logical encoded size of each task's keyed state"),
            Panel("Key groups per task",
                  (Query(f"reflow_key_groups{{{J}}}", "{{operator}} {{task}}"),),
                  "short", "Key groups each task holds (moves when an operator rescales)"),
            Panel("Unresponsive tasks",
                  (Query(f"max by (operator) (reflow_task_unresponsive_seconds{{{J}}})",
                         "{{operator}}"),),
                  "s", "Seconds since a task last answered the JobMaster (0 while it "
                       "answers)"),
        )),
        Row("Checkpoints", (
            Panel("Checkpoints by outcome",
                  (Query(f"sum by (outcome) (reflow_checkpoints_total{{{J}}})",
                         "{{outcome}}"),),
                  "short", "Checkpoints completed and failed since the job started "
                           "(JobConfig.checkpoint_interval_s)"),
            Panel("Checkpoint duration",
                  tuple(Query(_quantile(q, "reflow_checkpoint_duration_seconds",
                                        window=CHECKPOINT_WINDOW), f"p{int(q * 100)}")
                        for q in (0.5, 0.95)),
                  "s", f"Time from a checkpoint's trigger to its completion, over the last "
                       f"{CHECKPOINT_WINDOW}"),
            Panel("Checkpoint size",
                  (Query(f"max by (job) (reflow_checkpoint_size_bytes{{{J}}})", "{{job}}"),),
                  "bytes", "Bytes of state in the latest complete checkpoint"),
            Panel("Checkpoint alignment per task",
                  (Query(f"reflow_checkpoint_alignment_seconds{{{J}}}",
                         "{{operator}} {{task}}"),),
                  "s", "How long each task aligned its inputs in the latest complete "
                       "checkpoint (first barrier to last): long for a task behind "
                       "backpressure"),
            Panel("Job restarts",
                  (Query(f"max by (job) (reflow_job_restarts_total{{{J}}})", "{{job}}"),),
                  "short", "Restarts of the job from its latest checkpoint after a failure "
                           "(JobConfig.restart_strategy)"),
        )),
        Row("Controllers", (
            Panel("Controller decisions",
                  (Query(f"sum by (controller, kind, outcome) "
                         f"(reflow_controller_decisions_total{{{J}}})",
                         "{{controller}} {{kind}}: {{outcome}}"),),
                  "short", "Decisions of the job's controllers since it started, by kind "
                           "(scale, rebalance, change-logic, place, no-change, invalid) and "
                           "outcome (executed, no-change, refused, failed, error)"),
            Panel("Controller decisions per minute",
                  (Query(f"60 * sum by (controller, outcome) "
                         f"(rate(reflow_controller_decisions_total{{{J}}}[{RATE}]))",
                         "{{controller}}: {{outcome}}"),),
                  "short", "How often each controller decided, by outcome: refused, failed "
                           "or error decisions deserve a look (handle.decisions())"),
        )),
    ),
    annotations=(
        Annotation("rescales", f"changes(reflow_rescales_total{{{J}}}[1m]) > 0",
                   "rescale of {{operator}} done"),
        Annotation("checkpoint failures",
                   f'changes(reflow_checkpoints_total{{{J}, outcome="failed"}}[1m]) > 0',
                   "a checkpoint of {{job}} failed"),
    ),
)

RESCALING = Dashboard(
    uid="reflow-rescaling",
    title="reflow: rescaling",
    description="What each rescale of a reflow job is doing and what it costs",
    rows=(Row("Progress", (
        Panel("Rescale phase",
              (Query(f"max by (operator, protocol, phase) (reflow_rescale_in_progress{{{J}}})",
                     "{{operator}} {{protocol}}: {{phase}}"),),
              "short", "1 while a rescale of the operator runs, by protocol and phase",
              PanelKind.STATE),
        Panel("Key groups moved",
              (Query(f"max by (operator) (reflow_rescale_key_groups_moved{{{J}}})",
                     "{{operator}} moved"),
               Query(f"max by (operator) (reflow_rescale_key_groups{{{J}}})",
                     "{{operator}} to move")),
              "short", "Key groups moved so far by the current (or last) rescale, of those planned"),
        Panel("Bytes moved",
              (Query(f"max by (operator) (reflow_rescale_bytes_moved{{{J}}})", "{{operator}}"),),
              "bytes", "State bytes moved by the current (or last) rescale"),
        Panel("Subscales",
              (Query(f"max by (operator) (reflow_rescale_subscales_done{{{J}}})",
                     "{{operator}} done"),
               Query(f"max by (operator) (reflow_rescale_subscales{{{J}}} - "
                     f"reflow_rescale_subscales_done{{{J}}})", "{{operator}} not done")),
              "short", "Subscales (drrs) or steps of the current rescale: done, and running or "
                       "waiting"),
        Panel("Subscale duration",
              (Query(f"histogram_quantile(0.5, sum by (le, operator) "
                     f"(reflow_rescale_subscale_seconds_bucket{{{J}}}))", "{{operator}} p50"),
               Query(f"histogram_quantile(0.95, sum by (le, operator) "
                     f"(reflow_rescale_subscale_seconds_bucket{{{J}}}))", "{{operator}} p95")),
              "s", "Duration of completed subscales (over the job's life)"),
    )), Row("What it costs", (
        Panel("Re-routed records",
              (Query(f"max by (operator) (reflow_rescale_rerouted_records{{{J}}})",
                     "{{operator}}"),),
              "short", "Records the old owners forwarded to the new ones (drrs)"),
        Panel("Suspension",
              (Query(f"max by (operator) (reflow_rescale_suspended_seconds{{{J}}})",
                     "{{operator}}"),),
              "s", "Longest cumulative time a task had records waiting and nothing processable"),
        Panel("Propagation delay",
              (Query(f"max by (operator) (reflow_rescale_propagation_delay_seconds{{{J}}})",
                     "{{operator}}"),),
              "s", "Mean time from a barrier's injection to its arrival at the old owner"),
        Panel("Rescale running time",
              (Query(f"max by (operator) (reflow_rescale_running_seconds{{{J}}})",
                     "{{operator}}"),
               Query(f"max(reflow_rescale_timeout_seconds{{{J}}})", "rescale_timeout_s")),
              "s", "How long the running rescale has run, against the job's rescale_timeout_s"),
        Panel("Rescales done",
              (Query(f"sum by (operator) (reflow_rescales_total{{{J}}})", "{{operator}}"),),
              "short", "Completed rescales per operator"),
    ))),
    annotations=OVERVIEW.annotations[:1],
)

DASHBOARDS: dict[str, Dashboard] = {"overview": OVERVIEW, "rescaling": RESCALING}


def dashboard(name: str) -> Dashboard:
    """The dashboard called ``name`` (``overview``, ``rescaling``, or its uid); ``KeyError``
    naming the known ones otherwise."""
    for key, d in DASHBOARDS.items():
        if name in (key, d.uid):
            return d
    raise KeyError(f"no dashboard {name!r}; known: {', '.join(DASHBOARDS)}")


def expand(expr: str, job: str = ".*", rate_interval: str = "1m") -> str:
    """``expr`` with Grafana's variables replaced: ``$job`` by the regex ``job``,
    ``$__rate_interval`` by ``rate_interval``."""
    return expr.replace("$__rate_interval", rate_interval).replace("$job", job)


_DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
_WIDTH, _HEIGHT = 12, 8


def _panel(p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    custom: dict[str, Any] = {"lineWidth": 1, "fillOpacity": 10}
    if p.kind == PanelKind.TIMESERIES and p.stacked:
        custom["stacking"] = {"mode": "normal", "group": "A"}
    return {
        "id": pid, "type": str(p.kind), "title": p.title, "description": p.description,
        "datasource": _DATASOURCE,
        "gridPos": {"h": _HEIGHT, "w": _WIDTH, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": p.unit, "custom": custom}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "none"}},
        "targets": [{"refId": chr(ord("A") + i), "datasource": _DATASOURCE, "expr": q.expr,
                     "legendFormat": q.legend, "range": True}
                    for i, q in enumerate(p.queries)],
    }


def _layout(d: Dashboard) -> list[dict[str, Any]]:
    """Grafana's flat panel list: each row's header (an expanded row panel, one unit high),
    then its panels two a line; ids count up from 1 in that order."""
    out: list[dict[str, Any]] = []
    y = 0
    for row in d.rows:
        out.append({"id": len(out) + 1, "type": "row", "title": row.title, "collapsed": False,
                    "panels": [], "gridPos": {"h": 1, "w": 2 * _WIDTH, "x": 0, "y": y}})
        y += 1
        for i, p in enumerate(row.panels):
            out.append(_panel(p, len(out) + 1, i % 2 * _WIDTH, y + i // 2 * _HEIGHT))
        y += -(-len(row.panels) // 2) * _HEIGHT
    return out


def to_grafana(d: Dashboard) -> dict[str, Any]:
    """Grafana's dashboard JSON model of ``d`` (for file provisioning or import)."""
    return {
        "uid": d.uid, "title": d.title, "description": d.description,
        "tags": ["reflow"], "timezone": "browser", "editable": True,
        "schemaVersion": 39, "version": 1, "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0},
            {"name": "job", "label": "Job", "type": "query", "datasource": _DATASOURCE,
             "query": {"query": "label_values(reflow_job_running, job)", "refId": "jobs"},
             "definition": "label_values(reflow_job_running, job)", "refresh": 2,
             "includeAll": True, "allValue": ".*", "multi": True,
             "current": {"text": "All", "value": "$__all"}, "hide": 0, "sort": 1},
        ]},
        "annotations": {"list": [
            {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
             "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
             "name": "Annotations & Alerts", "type": "dashboard"},
            *({"name": a.name, "datasource": _DATASOURCE, "enable": True,
               "iconColor": "orange", "expr": a.expr, "step": "10s",
               "titleFormat": a.name, "textFormat": a.text, "useValueForTime": False}
              for a in d.annotations),
        ]},
        "panels": _layout(d),
    }


def write(directory: str) -> list[str]:
    """Write ``<directory>/<uid>.json`` for every dashboard; returns the paths."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for d in DASHBOARDS.values():
        path = os.path.join(directory, f"{d.uid}.json")
        with open(path, "w") as f:
            json.dump(to_grafana(d), f, indent=2, sort_keys=True)
            f.write("\n")
        paths.append(path)
    return paths


if __name__ == "__main__":
    for written in write(sys.argv[1] if len(sys.argv) > 1 else "deploy/grafana/dashboards"):
        print("wrote", written)
