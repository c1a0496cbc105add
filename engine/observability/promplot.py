"""Draw a dashboard's own queries from a Prometheus server to a PNG (``reflow plot
--prometheus URL --dashboard NAME``): what a user without Grafana sees instead.

Why: no Grafana server is at hand on many machines (none is packaged for Debian), but a
Prometheus is one ``apt-get install`` away. The panels, queries and legends are those of
``engine.observability.dashboards`` (the same definitions the Grafana JSON is generated from), run as range
queries through Prometheus's HTTP API (``/api/v1/query_range``) and drawn with matplotlib,
one subplot per panel, in the dashboard's order.

Guarantees: ``query_range`` raises ``PrometheusError`` (a ``ReflowError``) with Prometheus's
own message when a query is refused or the server cannot be reached; ``render`` draws every
panel (a panel whose queries returned nothing says "no data" in its box) and returns, per
panel title, how many series it drew, so a caller (or a test) knows what the picture shows.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from engine.errors import PrometheusError
from engine.observability.dashboards import Dashboard, Panel, expand


@dataclass(frozen=True)
class Series:
    """One result series of a range query: its legend and its (unix time, value) points."""

    legend: str
    points: tuple[tuple[float, float], ...]


def _legend(template: str, labels: dict[str, str]) -> str:
    out = template
    for k, v in labels.items():
        out = out.replace("{{" + k + "}}", v)
    return out or ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__")


def api(base_url: str, path: str, params: dict[str, Any], timeout: float = 30.0) -> Any:
    """GET ``base_url`` + ``path`` with ``params``; the ``data`` of Prometheus's answer."""
    url = base_url.rstrip("/") + path + "?" + urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            body = json.loads(r.read().decode())
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read().decode())
        except ValueError:
            raise PrometheusError(f"Prometheus at {base_url} answered {exc.code} to "
                                  f"{path}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise PrometheusError(f"cannot reach Prometheus at {base_url}: {exc}; pass the "
                              "server's base URL, e.g. http://127.0.0.1:9090") from None
    if body.get("status") != "success":
        raise PrometheusError(f"Prometheus refused {params.get('query', path)!r}: "
                              f"{body.get('errorType')}: {body.get('error')}")
    return body["data"]


def query_range(base_url: str, expr: str, start: float, end: float, step: float,
                legend: str = "") -> list[Series]:
    """The series ``expr`` returns from ``start`` to ``end`` (unix seconds) every ``step``
    seconds; NaN and infinite points are dropped."""
    data = api(base_url, "/api/v1/query_range",
               {"query": expr, "start": start, "end": end, "step": step})
    out = []
    for r in data["result"]:
        pts = tuple((float(t), float(v)) for t, v in r["values"]
                    if math.isfinite(float(v)))
        if pts:
            out.append(Series(_legend(legend, r["metric"]), pts))
    return out


def panel_series(base_url: str, panel: Panel, start: float, end: float, step: float,
                 job: str = ".*", rate_interval: str = "1m") -> list[Series]:
    return [s for q in panel.queries
            for s in query_range(base_url, expand(q.expr, job, rate_interval), start, end,
                                 step, q.legend)]


# Grafana's unit ids as a reader would write them
_UNITS = {"short": "", "ops": "per second", "percentunit": "share of time, 0-1", "s": "s",
          "bytes": "bytes"}


def _starts(series: list[Series], step: float) -> list[float]:
    """The times at which each series begins a run of points (an annotation is drawn once
    per event, not at every step while its expression stays true)."""
    out = []
    for s in series:
        prev = None
        for t, _ in s.points:
            if prev is None or t - prev > step * 1.5:
                out.append(t)
            prev = t
    return out


def render(base_url: str, dashboard: Dashboard, out_png: str, *, minutes: float = 15.0,
           end: float | None = None, step: float | None = None, job: str = ".*",
           rate_interval: str = "1m") -> dict[str, int]:
    """Draw ``dashboard``'s panels over the last ``minutes`` (up to ``end``, default now)
    into ``out_png``; returns the number of series each panel drew."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end = time.time() if end is None else end
    start = end - minutes * 60
    step = step or max(1.0, minutes * 60 / 240)
    cols = 2
    rows = -(-len(dashboard.panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(13, 3.0 * rows), squeeze=False)
    drawn: dict[str, int] = {}
    marks = sorted({t for a in dashboard.annotations
                    for t in _starts(query_range(base_url, expand(a.expr, job, rate_interval),
                                                 start, end, step), step)})
    every = {p.title: panel_series(base_url, p, start, end, step, job, rate_interval)
             for p in dashboard.panels}
    first = min((s.points[0][0] for ss in every.values() for s in ss), default=start)
    for ax, panel in zip(axes.flat, dashboard.panels, strict=False):
        series = every[panel.title]
        drawn[panel.title] = len(series)
        for s in series:
            ts = [t - end for t, _ in s.points]
            ax.plot(ts, [v for _, v in s.points], label=s.legend, lw=1.2)
        for t in marks:
            ax.axvline(t - end, color="orange", lw=0.8, alpha=0.6)
        ax.set_xlim(min(first - end, -step), 0)
        unit = _UNITS.get(panel.unit, panel.unit)
        ax.set_title(panel.title + (f" ({unit})" if unit else ""), fontsize=10)
        ax.set_xlabel("seconds before now", fontsize=8)
        ax.tick_params(labelsize=8)
        if series:
            ax.legend(fontsize=7, loc="upper left")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes,
                    color="grey")
    for ax in list(axes.flat)[len(dashboard.panels):]:
        ax.axis("off")
    fig.suptitle(f"{dashboard.title}: job {job}, last {minutes:g} min, from {base_url}"
                 + (" (orange: rescales)" if marks else ""), fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(out_png, dpi=90)
    plt.close(fig)
    return drawn


__all__ = ["PrometheusError", "Series", "api", "panel_series", "query_range", "render"]
