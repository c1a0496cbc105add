"""The pure parts of ``examples/papers/drrs_ablation.py`` (no Ray): the run order, the ratios
to full DRRS, the summary's rows and verdicts, the markdown and the figure, on a synthetic
results dict. Never the measured values: it is a benchmark (the quick run on Ray is
tests/integration/test_papers_drrs_ablation.py's)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from examples.bench.harness.run import RunStatus
from examples.papers import drrs_ablation as ab


def _spread(x: float | None) -> dict[str, Any]:
    return {"median": x, "min": x, "max": x, "n": 0 if x is None else 1}


def _row(peak: float | None, avg: float | None, took: float | None) -> dict[str, Any]:
    return {"runs": 1, "peak_ms": _spread(peak), "period_mean_ms": _spread(avg),
            "migration_s": _spread(took), "period_s": _spread(10.0),
            "baseline_mean_ms": _spread(5.0), "loadavg_at_end": [3.0]}


def _results(med: dict[str, dict[str, Any]]) -> dict[str, Any]:
    runs = [{"protocol": v, "status": RunStatus.OK, "round": 0,
             "report": {"key_groups_moved": 111, "planning_reason": f"{v} plan"},
             "timeline": [{"t": -1.0, "mean_ms": 5.0}, {"t": 1.0, "mean_ms": None}]}
            for v in med if v != ab.NONE]
    runs.append({"protocol": "no-dr", "status": RunStatus.FAILED, "reason": "boom"})
    return {"medians": med, "runs": runs, "date": "2026-11-28 12:00 UTC",
            "command": "python examples/papers/drrs_ablation.py", "total_seconds": 600,
            "config": {"from_p": 8, "to_p": 12, "key_groups": 128, "rate": 5000.0,
                       "baseline": 8.0},
            "scenario": {"description": "micro 8 -> 12", "expected_state_mb": 200.0},
            "machine": {"cpus": 2, "platform": "linux", "python": "3.12",
                        "loadavg_at_start": [2.0, 2.0, 2.0], "loadavg_at_end": [3.0, 3.0, 3.0]}}


PAPER_LIKE = {ab.NONE: _row(5.0, 5.0, None), "drrs": _row(100.0, 10.0, 2.0),
              "dr-only": _row(130.0, 12.2, 3.0), "schedule-only": _row(118.0, 11.5, 2.5),
              "subscale-only": _row(123.0, 11.8, 2.8), "no-dr": _row(110.0, 11.0, 2.2),
              "no-schedule": _row(105.0, 10.5, 2.1), "no-subscale": _row(108.0, 10.8, 2.3),
              "fluid": _row(500.0, 100.0, 20.0), "stop-restart": _row(3000.0, 300.0, 10.0)}


def test_the_run_order_starts_without_a_rescale_and_rotates():
    order = ab.run_order(["drrs", "no-dr", "fluid"], 2, with_none=True)
    assert order[:3] == [(ab.NONE, 0), ("drrs", 0), ("no-dr", 0)]
    assert [v for v, r in order if r == 1 and v != ab.NONE] == ["no-dr", "fluid", "drrs"]
    assert sum(1 for v, _ in order if v == ab.NONE) == 2
    assert ab.run_order(["drrs", "fluid"], 1) == [("drrs", 0), ("fluid", 0)]


def test_ratios_are_each_variants_medians_over_full_drrs():
    rat = ab.ratios(_results(PAPER_LIKE))
    assert set(rat) == set(PAPER_LIKE) - {ab.NONE, "drrs"}
    assert rat["dr-only"]["peak"] == pytest.approx(1.30)
    assert rat["dr-only"]["average"] == pytest.approx(1.22)
    assert rat["fluid"]["scaling"] == pytest.approx(10.0)
    missing = dict(PAPER_LIKE, drrs=_row(None, 10.0, 2.0))
    assert ab.ratios(_results(missing))["dr-only"]["peak"] is None


def test_claims_hold_when_reflow_orders_the_variants_as_the_paper():
    rows = ab.claims(_results(PAPER_LIKE))
    assert all(len(r) == 4 and r[3] for r in rows)
    by = {r[0]: r for r in rows}
    dr = next(r for k, r in by.items() if k.startswith("Fig. 14 DR only"))
    assert "peak +30 %, average +22 %" in dr[0] and "peak +30 %" in dr[1] and dr[3] == "yes"
    order = next(r for k, r in by.items() if "ordering" in k)
    assert order[3] == "yes" and "DR only > Subscale only > Schedule only" in order[1]
    assert next(r for k, r in by.items() if k.startswith("DRRS has the lowest"))[3] == "yes"
    headline = [r for k, r in by.items() if k.startswith("headline")
                or k.startswith("(not in the paper) DRRS below")]
    assert len(headline) == 2 and all(r[3] == "yes" for r in headline)
    assert "DRRS / fluid: peak 0.200x, average 0.100x, scaling time 0.100x" in headline[0][1]
    assert "micro 8 -> 12, 128 key groups (111 moved; paper 111)" in dr[2]
    assert "2.5x less state" in dr[2]


def test_claims_say_no_when_a_variant_beats_drrs_and_na_when_not_run():
    med = dict(PAPER_LIKE, **{"schedule-only": _row(90.0, 9.0, 1.0)})
    del med["subscale-only"]
    rows = {r[0]: r for r in ab.claims(_results(med))}
    sched = next(r for k, r in rows.items() if k.startswith("Fig. 14 Schedule only"))
    assert sched[3] == "no"
    sub = next(r for k, r in rows.items() if k.startswith("Fig. 14 Subscale only"))
    assert sub[1] == "not run" and sub[3] == "n/a (not run)"
    assert not any("ordering" in k for k in rows)
    assert next(r for k, r in rows.items() if k.startswith("DRRS has the lowest"))[3] == "partly"


def test_markdown_and_the_figure(tmp_path):
    res = _results(PAPER_LIKE)
    text = ab.markdown(res)
    assert text.startswith("# DRRS ablation (Fig. 14) on reflow (2 CPUs, load 2.0 -> 3.0)")
    assert "| no rescale |" in text and "| DR only |" in text
    assert "Runs that did not complete: no-dr" in text
    assert "* fluid (Megaphone): fluid plan" in text and "Incomplete" not in text
    assert "Pacing:" not in text and "Overload:" not in text
    slow = dict(res, medians={v: dict(r, baseline_mean_ms=_spread(5000.0))
                              for v, r in res["medians"].items()})
    assert "Overload: the median baseline latency (before the request) was 5.0 s" in (
        ab.markdown(slow))
    res["runs"][0]["report"]["planning_reason"] = "x; paced by headroom: 1-1 subscales at once"
    assert "Pacing: DRRS ran one subscale at a time" in ab.markdown(res)
    assert "**Incomplete**: 10 of 12 runs" in ab.markdown(dict(res, planned_runs=12))
    path = tmp_path / "fig.png"
    ab.plot(res, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_scenario_asks_each_variant_with_its_switches():
    calls: list[tuple[Any, ...]] = []

    class Handle:
        def rescale(self, op: str, p: int, **kw: Any) -> None:
            calls.append((op, p, kw))

    sc = ab.AblationScenario.__new__(ab.AblationScenario)
    sc.op, sc.args = "agg", argparse.Namespace(to_p=12)
    sc.request(Handle(), "schedule-only")
    sc.request(Handle(), "fluid")
    assert calls == [("agg", 12, {"protocol": "drrs",
                                  "without": ("decoupled-barriers", "subscale-division")}),
                     ("agg", 12, {"protocol": "fluid"})]


def test_unknown_variants_are_refused_and_quick_runs_small():
    with pytest.raises(SystemExit):
        ab.parse_args(["--variants", "drrs,nosuch"])
    full = ab.parse_args([])
    assert full.variants == list(ab.FULL_VARIANTS) and (full.from_p, full.to_p) == (8, 12)
    assert full.settle_max == 10 and full.after == 10
    quick = ab.parse_args(["--quick"])
    assert quick.variants == list(ab.QUICK_VARIANTS) and quick.settle_max == 30
    assert quick.out.endswith("drrs_ablation-quick")
