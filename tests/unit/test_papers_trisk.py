"""``examples/papers/trisk.py``'s pure parts (no Ray): which tasks a placement moves, the
order of the runs, the rescale benchmark's arguments per scenario, and a summary and a
figure from a synthetic results dict. Never a measured value: it is a benchmark."""

from __future__ import annotations

from typing import Any

from examples.papers import trisk


def test_placement_evens_the_tasks_over_the_nodes() -> None:
    assert trisk.placement_moves(["a", "a", "a", "a"], ["a", "b"]) == [(3, "b"), (2, "b")]
    assert trisk.placement_moves(["a", "b", "a", "a"], ["a", "b"]) == [(3, "b")]
    # even already: one task moves anyway (the mechanism is what is measured)
    assert trisk.placement_moves(["a", "b"], ["a", "b"]) == [(1, "a")]
    assert trisk.placement_moves(["a", "a"], ["a"]) == []


def test_load_balancing_runs_once_per_protocol_and_the_others_once() -> None:
    args = trisk.parse_args(["--quick", "--protocols", "pause-resume,stop-restart"])
    assert trisk.run_plan(args) == [
        ("load-balancing", "pause-resume"), ("load-balancing", "stop-restart"),
        ("scaling", "pause-resume"), ("change-of-logic", "-"), ("placement", "pause-resume")]
    assert args.out.endswith("trisk-quick")


def test_the_scenarios_are_the_rescale_benchmarks_with_the_papers_settings() -> None:
    args = trisk.parse_args(["--quick"])
    lb = trisk.scenario_args(args, "load-balancing")
    assert (lb.scenario, lb.skew, lb.state_bytes, lb.from_p, lb.to_p) == (
        "skew", "1.0", 40_960, 4, 4)
    sc = trisk.scenario_args(args, "scaling")
    assert (sc.scenario, sc.skew, sc.state_bytes, sc.from_p, sc.to_p, sc.keys) == (
        "micro", "uniform", 1024, 4, 5, 1000)
    assert trisk.scenario_args(args, "placement").warm_standby == 0


def _run(kind: str, protocol: str, duration: float, peak: float, level: float = 10.0,
         **report: Any) -> dict[str, Any]:
    t = [{"t": float(i) - 5, "p99_ms": peak if i == 6 else level, "count": 100}
         for i in range(15)]
    return {"scenario": kind, "protocol": protocol, "status": "ok", "timeline": t,
            "report": {"requested_at": 100.0, "completed_at": 100.0 + duration,
                       "duration_s": duration, "bytes_moved": 4_000_000,
                       "key_groups_moved": 4, **report},
            "peak": {"p99_ms": peak, "max_ms": peak * 1.2},
            "baseline": {"level_ms": level}, "period": {"seconds": 3, "stabilized": True},
            "tail_level_ms": level, "loadavg_at_end": [3.0, 2.0, 1.0]}


def test_the_summary_compares_with_fig_13_and_the_figure_draws(tmp_path) -> None:
    args = trisk.parse_args(["--quick"])
    runs = [_run("load-balancing", "pause-resume", 0.4, 80.0),
            _run("load-balancing", "stop-restart", 1.5, 900.0),
            _run("load-balancing", "fluid", 3.0, 40.0),
            _run("scaling", "pause-resume", 0.3, 30.0),
            _run("change-of-logic", "-", 0.1, 12.0),
            _run("placement", "pause-resume", 0.8, 200.0, moves=[[3, 0.4], [2, 0.4]]),
            {"scenario": "placement", "protocol": "drrs", "status": "failed",
             "reason": "boom"}]
    res = {"command": "python examples/papers/trisk.py --quick", "date": "2026-11-28",
           "machine": {"cpus": 2, "python": "3.11", "platform": "Linux",
                       "loadavg_at_start": [3.0, 2.0, 1.0], "loadavg_at_end": [4.0, 3.0, 2.0]},
           "total_seconds": 100.0, "config": vars(args), "runs": runs,
           "scenarios": {"scaling": "agg 4 -> 5"}}
    rows = trisk.claims(res)
    assert rows[0][0].startswith("Fig. 13") and "holds" in rows[0][3]
    assert "Flink above Trisk: yes" in rows[1][3] and "within 500 ms: yes" in rows[1][3]
    assert any(r[0].startswith("Fig. 9-12") and r[3] == "yes" for r in rows)
    assert any(r[0].startswith("Fig. 8") and "2 task(s) moved" in r[1] for r in rows)
    assert all(r[3] for r in rows)
    text = trisk.markdown(res)
    assert "| paper |" in text and "boom" in text
    path = tmp_path / "trisk.png"
    trisk.plot(res, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
