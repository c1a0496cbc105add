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


# ---------------------------------------------------------------- state at a chosen size


def test_held_padding_sizes_the_window_state_from_rate_and_window() -> None:
    # an event of a window of size S sliding by D is held S^2 / 2D seconds in all
    assert drrs.held_seconds(10_000, 500) == pytest.approx(100.0)
    assert drrs.held_seconds(40_000, 5_000) == pytest.approx(160.0)
    assert drrs.held_seconds(2_000, None) == pytest.approx(1.0)  # tumbling: S / 2
    # Q7 at the paper's 20K tps, 10 s / 500 ms, ~800 MB: about NEXMark's bid size
    q7 = drrs.held_padding("q7", 800, 20_000, 10_000, 500)
    assert set(q7) == {"avg_bid_byte_size"}
    assert 20_000 * 46 / 50 * 100 * q7["avg_bid_byte_size"] == pytest.approx(800e6, rel=0.02)
    # Q8 pads the persons (1 event in 50); twice the state, twice the padding
    a, b = (drrs.held_padding("q8", mb, 2_000, 40_000, 5_000)["avg_person_byte_size"]
            for mb in (500, 1_000))
    assert b - drrs.HELD_BYTES_OFFSET["persons"] == pytest.approx(
        2 * (a - drrs.HELD_BYTES_OFFSET["persons"]), rel=1e-3)
    assert 2_000 / 50 * 160 * a == pytest.approx(500e6, rel=0.01)
    # never below NEXMark's default size, never beyond the generator's pool
    from examples.nexmark.generator import MAX_AVG_BYTE_SIZE

    assert drrs.held_padding("q7", 0.001, 3_000, 2_000, 500) == {"avg_bid_byte_size": 100}
    assert drrs.held_padding("q8", 1e6, 100, 1_000, 500) == {
        "avg_person_byte_size": MAX_AVG_BYTE_SIZE}


def test_state_options_reach_the_scenario_and_the_job_config() -> None:
    args = drrs.parse_args(["--jobs", "q7,q8", "--q7-state-mb", "100", "--q8-state-mb", "200",
                            "--q8-window", "40000/5000", "--state-backend", "rocksdb",
                            "--state-memory-mb", "256", "--state-dir", "/tmp/x"])
    assert (args.q7_state_mb, args.q8_state_mb, args.state_backend) == (100, 200, "rocksdb")
    sargs = drrs.scenario_args(args, "q8", args.protocols)
    assert (sargs.state_backend, sargs.state_memory_mb, sargs.state_dir) == (
        "rocksdb", 256, "/tmp/x")
    assert (sargs.size_ms, sargs.slide_ms) == (40_000, 5_000)
    from examples.bench import rescale

    cfg = drrs.config_for(rescale.job_config(sargs, args.state_backend), "drrs", 8, 12, 200)
    assert cfg.state_backend == "rocksdb" and cfg.state_memory_bytes == 256 << 20
    assert cfg.rescale_timeout_s == pytest.approx(drrs.RESCALE_TIMEOUT_S + 20)
    sc = drrs.make_scenario(args, "q8", sargs)
    assert isinstance(sc, drrs.NexmarkScenario) and sc.build_s >= 45 + 2
    assert sc.padding == drrs.held_padding("q8", 200, args.q8_rate, 40_000, 5_000)
    assert sc.info["state_mb_asked"] == 200 and "persons" in sc.describe()
    q7 = drrs.make_scenario(args, "q7", drrs.scenario_args(args, "q7", args.protocols))
    assert "holding the windows' bids" in q7.describe()
    # without a size: the queries as they are, on the in-memory backend by default
    plain = drrs.parse_args(["--jobs", "q7"])
    assert plain.state_backend == "memory" and plain.q7_state_mb is None
    psargs = drrs.scenario_args(plain, "q7", plain.protocols)
    assert type(drrs.make_scenario(plain, "q7", psargs)) is drrs.rescale.Scenario
    for bad in (["--q8-state-mb", "0"], ["--state-backend", "both"]):
        with pytest.raises(SystemExit):
            drrs.parse_args(bad)


def test_the_scale_column_gives_the_measured_state() -> None:
    runs = _runs()
    j = {"job": "q8", "operator": "q8-join", "description": "q8", "runs": runs,
         "planned_moved": 111, "info": {"state_mb_asked": 2.5}, **drrs.analyse_job(runs)}
    m = drrs.measured_state(j, 128)
    # the moved groups' exact bytes (2 MB for 111 groups), scaled to the 128 groups
    assert m["moved_mb"] == pytest.approx(2.0)
    assert m["state_mb"] == pytest.approx(2.0 * 128 / 111)
    assert m["estimate_mb"] == pytest.approx(5.0)  # the tasks' own, metrics_before
    results = {"config": {**vars(drrs.parse_args(["--state-backend", "rocksdb"]))}}
    text = drrs.state_text(results, j)
    assert "state 2.3 MB measured" in text and "2.0 MB moved" in text
    assert "asked 2.5 MB" in text
    assert "rocksdb backend" in text and "1,301x less" in text  # 3,000 / 2.306
    # nothing moved (only the run without a rescale): the tasks' estimate
    none = [r for r in runs if r["protocol"] == "none"]
    j2 = {**j, "runs": none, **drrs.analyse_job(none)}
    assert "state 5.0 MB measured" in drrs.state_text(results, j2)
    assert "nothing moved" in drrs.state_text(results, j2)
