"""``examples/papers/spacker.py``'s pure parts, no Ray: the spike runs, the Table II and
sweep summaries and verdicts on synthetic runs, the summary and figure they make, the
settings each strategy and sweep asks for, the replication sweep's target and the quote
the stock job parses. Never a measured value: it is a benchmark."""

from __future__ import annotations

from typing import Any

import pytest

from engine import Planning
from examples.bench import planning as pl
from examples.papers import spacker as sp
from examples.stock_exchange import is_valid


def _row(s: int, max_ms: float | None, count: int = 10) -> dict[str, Any]:
    return {"second": s, "count": count if max_ms is not None else 0, "mean_ms": max_ms,
            "p99_ms": max_ms, "max_ms": max_ms}


def test_spikes_are_runs_of_seconds_above_the_threshold() -> None:
    rows = {s: _row(s, m) for s, m in enumerate([5, 50, 60, 5, 70, None, 80, 5])}
    got = sp.spikes(rows, 0, 8, 40.0)
    assert got == [{"start": 1, "seconds": 2, "peak_ms": 60},
                   {"start": 4, "seconds": 1, "peak_ms": 70},
                   {"start": 6, "seconds": 1, "peak_ms": 80}]
    assert sp.spikes(rows, 0, 8, 100.0) == []
    assert sp.spikes(rows, 2, 3, 40.0) == [{"start": 0, "seconds": 1, "peak_ms": 60}]


def _t2_run(strategy: str, conv: float, peak: float, repl: float | None) -> dict[str, Any]:
    return {"strategy": strategy, "status": "ok", "convergence_s": conv, "migration_s": conv / 2,
            "deploy_s": 0.1, "peak_ms": peak, "spike": peak / 10, "spike_count": 1,
            "spike_seconds": 2, "replication_ms": repl, "bytes_moved": 5_000_000,
            "baseline_level_ms": 10.0, "threshold_ms": 40.0,
            "actions": [{"planning_reason": f"{strategy}: 3 key groups move", "requested_at": 1.0}],
            "requested_at": 1.0, "repeat": 0,
            "timeline": [{"t": 0.5, "max_ms": peak}, {"t": 1.5, "max_ms": None}]}


def _table2() -> dict[str, Any]:
    runs = [_t2_run("spacker", 8.0, 200.0, 10.0), _t2_run("all-at-once", 4.0, 1500.0, 0.0),
            _t2_run("progressive", 20.0, 190.0, 0.0), _t2_run("replication", 3.0, 800.0, 20.0),
            {"strategy": "spacker", "status": "failed", "reason": "boom"}]
    return {"runs": runs, "summary": sp.table2_summary(runs)}


def test_table2_summary_takes_medians_of_the_successful_runs_and_verdicts_follow() -> None:
    t2 = _table2()
    s = t2["summary"]
    assert s["spacker"]["runs"] == 2 and s["spacker"]["ok"] == 1
    assert s["spacker"]["convergence_s"] == 8.0 and s["spacker"]["reasons"] == [
        "spacker: 3 key groups move"]
    rows = sp.table2_verdicts(s)
    assert len(rows) == len(sp.STRATEGIES) + 5
    verdicts = [r[-1] for r in rows[len(sp.STRATEGIES):]]
    assert verdicts == ["yes", "yes", "yes", "yes", "yes"]
    s["spacker"]["peak_ms"] = 5000.0  # now above all-at-once and replication
    s["spacker"]["convergence_s"] = 15.0  # faster than progressive, not 2x
    s["spacker"]["replication_ms"] = 0.0  # the adaptive strategy replicated nothing
    rows = sp.table2_verdicts(s)[len(sp.STRATEGIES):]
    assert rows[0][-1] == "no" and rows[1][-1].startswith("ordering only (1.33x")
    assert rows[-1][-1].startswith("n/a")
    assert sp.table2_verdicts({})[len(sp.STRATEGIES)][-1] == "-"  # nothing measured


def _sweep_run(setting: str, peak: float, completion: float, moved: int) -> dict[str, Any]:
    return {"setting": setting, "status": "ok", "spike": peak / 10, "migration_s": completion,
            "peak": {"max_ms": peak}, "baseline_spike": 2.0,
            "report": {"duration_s": completion, "bytes_moved": moved, "steps": 1,
                       "planning_reason": f"agg: 8 key groups move in 1 steps (2 subscales); "
                                          f"random, {setting}"}}


def _sweeps() -> dict[str, Any]:
    phase = {"keys": 800, "state_bytes": 24_000, "rate": 3000.0, "zipf": None, "from_p": 4,
             "to_p": 6, "rebalance": False}
    parts = {
        "progressiveness": [_sweep_run("all-at-once", 900, 1.0, 10), _sweep_run("chunks-1", 90, 3.0, 10),
                            _sweep_run(pl.ADAPTIVE, 100, 1.2, 10)],
        "replication": [_sweep_run("none", 500, 2.0, 100), _sweep_run("all", 100, 0.7, 10)],
        "prioritisation": [_sweep_run("hot-first", 200, 1.0, 10),
                           _sweep_run("random", 400, 1.3, 10)],
    }
    return {p: {"phase": {**phase, "rebalance": p != "progressiveness"}, "runs": runs,
                "summary": sp.sweep_summary(runs)} for p, runs in parts.items()}


def test_sweep_verdicts_follow_the_papers_orderings() -> None:
    sw = _sweeps()
    assert sw["progressiveness"]["summary"]["chunks-1"]["peak_ms"] == 90
    rows = sp.sweep_verdicts(sw)
    assert [r[0].split(":")[0] for r in rows] == ["Fig. 9", "§V-B", "Fig. 10", "Fig. 11"]
    assert [r[-1] for r in rows] == ["yes", "yes", "yes", "yes"]
    sw["prioritisation"]["summary"]["hot-first"]["peak_ms"] = 900
    assert sp.sweep_verdicts(sw)[-1][-1] == "no"
    assert sp.sweep_verdicts({}) == []


def _results() -> dict[str, Any]:
    return {"command": "python examples/papers/spacker.py --quick", "date": "today",
            "machine": {"cpus": 2, "python": "3.11", "platform": "linux",
                        "loadavg_at_start": [3.0, 3.0, 3.0], "loadavg_at_end": [4.0, 4.0, 4.0]},
            "total_seconds": 10.0,
            "config": {"sequence_list": [8, 2, 4, 3], "symbols": 4000, "state_bytes": 20_000,
                       "table_key_groups": 64, "rate": 1000.0, "repeats": 1,
                       "spike_factor": 2.0, "key_groups": 128},
            "table2": _table2(), "sweeps": _sweeps()}


def test_the_summary_has_a_verdict_in_every_row_and_the_figure_is_drawn(tmp_path) -> None:
    results = _results()
    text = sp.markdown(results)
    rows = [line for line in text.splitlines()
            if line.startswith(("| Table II", "| Spacker", "| ...", "| all-at-once and",
                                "| Fig.", "| §"))]
    assert len(rows) == len(sp.STRATEGIES) + 5 + 4
    assert all(line.rstrip(" |").rsplit("|", 1)[1].strip() for line in rows)
    assert "load 3.0 -> 4.0" in text and "8 -> 2 -> 4 -> 3" in text
    assert sp.rescaled(results)
    results["sweeps"]["replication"]["runs"] = [{"setting": "none", "status": "failed"}]
    assert not sp.rescaled(results)  # a part that moved nothing fails the run
    path = tmp_path / "spacker.png"
    sp.plot(results, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_strategies_and_sweep_settings_ask_for_the_right_knobs() -> None:
    assert sp.strategy_planning("spacker") == (None, {})
    p, f = sp.strategy_planning("progressive")
    assert p.progressiveness == "one-by-one" and f == {}
    p, f = sp.strategy_planning("replication")
    assert p.progressiveness == "all-at-once" and f == {"replication": "all"}
    for part, sizes in sp.SWEEPS.items():
        for setting in sizes["all"]:
            planning, fields = sp.sweep_planning(part, setting)
            assert planning is None or isinstance(planning, Planning)
    assert sp.sweep_planning("progressiveness", "chunks-16")[0].chunk_size == 16
    assert sp.sweep_planning("replication", "all-1s")[1]["replication_period_s"] == 1.0
    assert sp.sweep_planning("prioritisation", "key-order")[0].prioritisation is sp.key_order
    with pytest.raises(Exception, match="unknown sweep"):
        sp.sweep_planning("nope", "x")


def test_the_replication_target_moves_every_other_group_to_its_replica_holder() -> None:
    from engine.dataflow.keygroups import uniform_assignment
    from migration.replication import place_replicas

    cur = uniform_assignment(32, 4)
    target = sp.replica_target(32, 4)
    holders = place_replicas(cur, range(32), 4)
    assert [kg for kg in range(32) if target[kg] != cur[kg]] == list(range(1, 32, 2))
    assert all(target[kg] == holders[kg] for kg in range(1, 32, 2))


def test_quotes_are_valid_deterministic_and_key_order_sorts() -> None:
    qs = [sp.to_quote((k, s)) for k in range(20) for s in range(50)]
    assert all(is_valid(q) for q in qs)
    assert sp.to_quote((3, 7)) == sp.to_quote((3, 7))
    assert {q[3] for q in qs} == {"B", "S"}

    class P:
        def __init__(self, kg: int) -> None:
            self.key_group = kg

    assert sp.key_order([P(5), P(1), P(3)]) == [1, 3, 5]


def test_arguments_reject_unknown_parts_and_fill_quick_defaults() -> None:
    a = sp.parse_args(["--quick"])
    assert a.sequence_list == [4, 1, 3, 2] and a.out.endswith("spacker-quick")
    assert a.sweep_settings["replication"] == ("none", "all")
    with pytest.raises(SystemExit):
        sp.parse_args(["--parts", "nope"])
    with pytest.raises(SystemExit):
        sp.parse_args(["--sequence", "4"])


def test_added_runs_join_the_summary_tagged_with_where_they_came_from(tmp_path) -> None:
    results = _results()
    results["table2"]["runs"] = [r for r in results["table2"]["runs"]
                                 if r["strategy"] != "replication"]
    results["table2"]["summary"] = sp.table2_summary(results["table2"]["runs"])
    assert "replication" not in results["table2"]["summary"]
    other = {"command": "python examples/papers/spacker.py --parts table2", "date": "later",
             "machine": {"loadavg_at_start": [9.0], "loadavg_at_end": [8.0]},
             "table2": {"runs": [_t2_run("replication", 3.0, 800.0, 20.0)]}}
    sp.add_runs(results, other)
    assert results["table2"]["summary"]["replication"]["ok"] == 1
    assert results["table2"]["runs"][-1]["added_from"]["command"] == other["command"]
    assert results["added"][0]["table2"] == ["replication"]
    text = sp.markdown(results)
    assert "Runs added from `python examples/papers/spacker.py --parts table2`" in text
    assert sp.main(["--render"]) == 2
