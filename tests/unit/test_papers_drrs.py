"""``examples/papers/drrs.py``'s pure parts on synthetic runs (no Ray): the common-window
average, the breakdown from a report, drrs's change against the baselines, the verdicts,
the throughput deviation, and that the summary and the figure are written from a results
dict. Never a measured value: it is a benchmark."""

from __future__ import annotations

import argparse

import pytest

from examples.bench.harness import render
from examples.bench.harness.replay import ReplaySource
from examples.bench.harness.run import RunStatus
from examples.papers import drrs


def _run(protocol: str, *, peak: float, period: int, mean: float, stabilized: bool = True,
         report: dict | None = None) -> dict:
    timeline = [{"t": t + 0.5, "count": 1000, "mean_ms": mean if t < period else 10.0,
                 "p99_ms": mean, "max_ms": peak} for t in range(-3, 20)]
    return {"protocol": protocol, "status": RunStatus.OK, "round": 0, "timeline": timeline,
            "peak": {"max_ms": peak}, "period": {"seconds": period, "stabilized": stabilized,
                                                 "mean_ms": mean},
            "baseline": {"level_ms": 10.0}, "metrics_before": {"state_bytes": 5_000_000},
            "loadavg_at_end": [3.0, 3.0, 3.0], "report": report}


def _report(duration: float, subs: int, prop: float, suspended: float) -> dict:
    return {"duration_s": duration, "propagation_delay_s": prop, "suspended_s": suspended,
            "subscales": [[i, 0.5 * i, 1.0] for i in range(subs)], "rerouted_records": 7,
            "key_groups_moved": 111, "bytes_moved": 2_000_000, "phases": []}


def _runs() -> list[dict]:
    return [
        _run("none", peak=20, period=0, mean=10),
        _run("drrs", peak=100, period=2, mean=30, report=_report(2.0, 8, 0.01, 0.2)),
        _run("fluid", peak=800, period=10, mean=200, report=_report(14.0, 28, 0.05, 0.1)),
        _run("meces", peak=500, period=6, mean=150, report=_report(5.0, 4, 0.005, 0.9)),
        _run("stop-restart", peak=3000, period=8, mean=900,
             report={"duration_s": 3.0, "phases": [["savepoint", 1.0]]}),
        {"protocol": "meces", "status": RunStatus.FAILED, "round": 1, "reason": "boom"},
    ]


def test_the_average_is_over_the_longest_live_period_and_changes_are_drrs_against_each() -> None:
    a = drrs.analyse_job(_runs())
    assert a["common_window_s"] == 10  # fluid's period: the longest of drrs, fluid, meces
    per = a["per_protocol"]
    # drrs: 2 s at 30 ms then 8 s at 10 ms over the same 10 s window as fluid
    assert per["drrs"]["avg_ms"] == pytest.approx((2 * 30 + 8 * 10) / 10)
    assert per["fluid"]["avg_ms"] == pytest.approx(200)
    assert per["meces"]["runs"] == 1  # the failed run is left out
    ch = a["change_pct"]
    assert ch["fluid"]["peak"] == pytest.approx(100 * (100 / 800 - 1))
    assert ch["meces"]["time"] == pytest.approx(100 * (2 / 6 - 1))
    assert per["drrs"]["propagation_cum_s"] == pytest.approx(0.08)
    assert per["drrs"]["unit_wait_mean_s"] == pytest.approx(0.5 * 3.5)
    assert per["stop-restart"]["units"] == 0
    assert per["stop-restart"]["suspended_s"] is None  # no units: not a live figure


def test_verdicts_keep_the_papers_direction_and_say_how_far() -> None:
    assert drrs.holds("q7", "peak", "fluid", -80.0) == "yes"
    assert drrs.holds("q7", "peak", "fluid", -20.0) == "yes, smaller gain"
    assert drrs.holds("q7", "avg", "meces", 5.0) == "no"
    assert drrs.holds("twitch", "peak", "fluid", 10.0) == "yes (comparable)"
    assert drrs.holds("twitch", "peak", "meces", -10.0) == "yes"
    assert drrs.holds("q8", "time", "fluid", None) == "not measured"


def test_throughput_deviation_counts_a_silent_second_in_full() -> None:
    r = {"timeline": [{"t": -1.5, "count": 0}, {"t": 0.5, "count": 1000},
                      {"t": 1.5, "count": 0}, {"t": 2.5, "count": 1500}]}
    assert drrs.throughput_deviation(r, 1000.0, 3) == pytest.approx(100 * (0 + 1 + 0.5) / 3)


def test_the_summary_and_the_figure_come_from_a_results_dict(tmp_path) -> None:
    jobs = []
    for job in ("q7", "q8", "twitch"):
        runs = _runs()
        jobs.append({"job": job, "operator": drrs.OPERATOR[job], "description": job,
                     "info": {}, "runs": runs, "planned_moved": 111, **drrs.analyse_job(runs)})
    cell_runs = {p: {"protocol": p, "status": RunStatus.OK, "throughput_deviation_pct": d,
                     "peak_ms": 50.0} for p, d in (("drrs", 5.0), ("fluid", 9.0))}
    args = drrs.parse_args(["--quick"])
    results = {"command": "python examples/papers/drrs.py", "date": "today",
               "machine": {"cpus": 2, "python": "3", "platform": "linux",
                           "loadavg_at_start": [1.0, 1, 1], "loadavg_at_end": [2.0, 2, 2]},
               "config": {**vars(args), "from_p": 8, "to_p": 12},
               "moved_key_groups": 111, "caveats": list(drrs.CAVEATS), "jobs": jobs,
               "total_seconds": 1.0,
               "sensitivity": {"from": 4, "to": 6, "protocols": ["drrs", "fluid"],
                               "window_s": 12,
                               "cells": [{"rate": r, "state_mb": 10.0, "skew": 0.0,
                                          "runs": cell_runs} for r in (1500.0, 3000.0)]}}
    text = drrs.markdown(results)
    rows = [line for line in text.splitlines() if line.startswith("| Fig.")
            or line.startswith("| §")]
    assert len(rows) >= 3 * 3 + 1
    assert all(line.rstrip(" |").rsplit("|", 1)[1].strip() for line in rows)  # a verdict
    assert "-81.1 % / -80.3 %" in text and "drrs lowest in 2 of 2 cells" in text
    path = tmp_path / "drrs.png"
    drrs.plot(results, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    render.write_outputs(str(tmp_path / "out"), results, markdown=text)
    # written again from the results.json alone
    (tmp_path / "out" / "summary.md").unlink()
    assert drrs.main(["--from-results", str(tmp_path / "out" / "results.json")]) == 0
    assert (tmp_path / "out" / "summary.md").read_text() == text
    assert (tmp_path / "out" / "drrs.png").exists()


def test_quick_and_full_defaults() -> None:
    full, quick = drrs.parse_args([]), drrs.parse_args(["--quick"])
    assert (full.from_p, full.to_p, full.key_groups) == (8, 12, 128)
    assert full.jobs == ["q7", "q8", "twitch"] and not full.sensitivity
    assert quick.sensitivity and len(drrs.grid(quick)) <= 2
    assert full.out.endswith("results/drrs") and quick.out.endswith("results/drrs-quick")
    assert drrs.order(["a", "b"], 2) == [("none", 0), ("a", 0), ("b", 0), ("b", 1), ("a", 1)]
    with pytest.raises(SystemExit):
        drrs.parse_args(["--jobs", "q9"])
    assert isinstance(full, argparse.Namespace)


def test_the_replay_keeps_event_times_and_dues_records_at_the_compressed_pace(tmp_path) -> None:
    class Clock:
        t = 1000.0

        def now(self) -> float:
            return self.t

        def monotonic(self) -> float:
            return self.t

    lines = [(0, "a"), (60_000, "b"), (30_000, "c"), (120_000, "d")]  # disorder kept
    src = ReplaySource(lines, lambda r: r[0], speedup=60.0, directory=str(tmp_path))
    clock = Clock()
    reader = src.open_partition("0-of-1", None, clock)
    assert reader.poll(10).values == [(0, "a")]
    clock.t += 1.0  # 60 s of event time
    b = reader.poll(10)
    assert b.values == [(60_000, "b"), (30_000, "c")] and b.timestamps == [60_000, 30_000]
    assert reader.backlog() == 0
    clock.t += 5.0
    assert reader.backlog() == 1
    # reopened (stop-restart): the same origin, the backlog is still due
    again = src.open_partition("0-of-1", reader.offset(), clock)
    assert again.poll(10).values == [(120_000, "d")]
    assert again.poll(10) is None


def test_an_update_replaces_the_jobs_it_ran_and_says_so(tmp_path) -> None:
    import json

    machine = {"loadavg_at_start": [5.0, 5, 5], "loadavg_at_end": [6.0, 6, 6]}
    old = {"jobs": [{"job": "q7", "v": 1}, {"job": "q8", "v": 1}],
           "not_run": ["twitch: the --budget-min 1 was spent before it started"]}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(old))
    new = {"jobs": [{"job": "q8", "v": 2}, {"job": "twitch", "v": 2}], "command": "cmd",
           "date": "now", "machine": machine}
    got = drrs.merged(str(path), new)
    assert got["jobs"] == [{"job": "q7", "v": 1}, {"job": "q8", "v": 2},
                           {"job": "twitch", "v": 2}]
    assert got["not_run"] == []
    assert got["updates"][0]["jobs"] == ["q8", "twitch"]
