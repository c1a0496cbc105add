"""The autoscaling benchmark's figures from synthetic runs (examples/bench/autoscale.py)."""

from __future__ import annotations

import argparse

import pytest

from examples.bench import autoscale


def args(**kw) -> argparse.Namespace:
    a = autoscale.parse_args(["--quick"])
    for k, v in kw.items():
        setattr(a, k, v)
    return a


def test_the_ideal_parallelism_follows_the_service_time():
    a = args(rate=1000.0, service_us=250.0, size_ms=2000, slide_ms=500, key_groups=64, max_p=8)
    # 920 bids/s x 4 windows x 250 us = 0.92 s of work per second; at 70 %: 2 tasks
    assert autoscale.ideal_parallelism(a, 1000.0) == 2
    assert autoscale.ideal_parallelism(a, 3000.0) == 4  # 2.76 / 0.7 = 3.9
    assert autoscale.ideal_parallelism(a, 30_000.0) == 8  # clamped


def _decision(t0, at, p, seconds=1.0, outcome="executed", kind="scale", reason=""):
    return {"at": t0 + at, "kind": kind, "outcome": outcome, "seconds": seconds,
            "decision": f"scale 'q7-partial-max' to {p} (drrs)", "reason": reason}


def test_step_figures_count_decisions_recovery_and_overshoot():
    t0 = 1000.0
    a = args(baseline=4.0, stable=3, tolerance=1.1, slack_ms=0.0)
    samples = [{"t": float(s), "parallelism": 2 if s < 12 else (6 if s < 20 else 4),
                "source_out": 0} for s in range(40)]
    decisions = [_decision(t0, 11.0, 6), _decision(t0, 19.0, 4, seconds=2.0),
                 _decision(t0, 25.0, 3, outcome="refused"), _decision(t0, 5.0, 3)]

    def row(s: int, mean: float) -> dict:
        return {"second": int(t0) + s, "count": 10, "mean_ms": mean, "p99_ms": 2 * mean,
                "max_ms": 3 * mean, "p50_ms": mean}

    rows = [row(s, 100.0 if s < 10 else (900.0 if s < 24 else 105.0)) for s in range(40)]
    f = autoscale.step_figures(a, t0, 10.0, 30.0, samples, decisions, rows, ideal=4)
    assert f["decisions"] == 2 and f["parallelisms"] == [6, 4]
    assert f["converged_s"] == pytest.approx(11.0)  # the last one ended at 21 s
    assert f["level_ms"] == 100.0
    assert f["recovered_s"] == 14 and f["recovered"]  # back within 110 % from second 24
    assert (f["peak_p"], f["final_p"], f["overshoot"]) == (6, 4, 2)
    assert f["task_s"] == 2 * 2 + 6 * 8 + 4 * 10
    assert f["peak_p99_ms"] == 1800.0
    # the run hands the rows as histogram_rows makes them: second -> row
    assert autoscale.step_figures(a, t0, 10.0, 30.0, samples, decisions,
                                  {r["second"]: r for r in rows}, ideal=4) == f


def test_a_step_that_never_recovers_is_marked():
    t0 = 0.0
    a = args(baseline=4.0, stable=3, tolerance=1.1, slack_ms=0.0)
    rows = [{"second": s, "count": 1, "mean_ms": 10.0 if s < 10 else 500.0, "p99_ms": 1.0,
             "max_ms": 1.0, "p50_ms": 1.0} for s in range(30)]
    samples = [{"t": float(s), "parallelism": 1, "source_out": 0} for s in range(30)]
    f = autoscale.step_figures(a, t0, 10.0, 30.0, samples, [], rows, ideal=1)
    assert not f["recovered"] and f["recovered_s"] == 20 and f["decisions"] == 0


def test_the_summary_names_skipped_actions():
    run = {"policy": "cost-aware", "status": "ok", "rescales": 2, "bytes_moved": 1234,
           "held_up_s": 0.5, "skipped": ["cost-aware: skip q7-partial-max 4 -> 3: ..."]}
    step = {"decisions": 1, "converged_s": 3.0, "recovered_s": 5, "recovered": True,
            "peak_p": 4, "final_p": 4, "ideal_p": 4, "overshoot": 0, "task_s": 100.0,
            "peak_p99_ms": 900.0}
    run.update(up=step, down=step)
    results = {"config": {"quick": True}, "description": "d", "runs": [run],
               "total_seconds": 10.0,
               "machine": {"cpus": 2, "loadavg_at_start": [1.0], "loadavg_at_end": [2.0]}}
    text = autoscale.markdown(results)
    assert "| cost-aware | up | 1 | 3.0 | 5 |" in text
    assert "cost-aware skipped 1 action(s)" in text and "1,234" in text
