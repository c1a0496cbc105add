"""``examples/papers/ds2.py``'s pure parts (no Ray): the steps read from DS2's decision
records, the verdicts on the paper's claim and on issue 32's target, and a summary and a
figure from a synthetic results dict. Never a measured value: it is a benchmark."""

from __future__ import annotations

from typing import Any

import pytest

from examples.papers import ds2

T0 = 1000.0


def _scale(at: float, old: int, new: int, seconds: float = 2.0) -> dict[str, Any]:
    way = "up" if new > old else "down"
    return {"at": T0 + at, "kind": "scale", "outcome": "executed", "seconds": seconds,
            "decision": f"scale 'agg' to {new} (drrs)",
            "reason": f"ds2: {way} {old} -> {new}: needs 2,143 rec/s of capacity for 1,500 "
                      "rec/s; has 500 at p=1: load 3.00"}


def _idle(at: float, reason: str = "stabilising: 1.0 of 6 s since the last rescale"
          ) -> dict[str, Any]:
    return {"at": T0 + at, "kind": "no-change", "outcome": "no-change", "seconds": 0.0,
            "decision": "no change", "reason": reason}


def _run(start: int, decisions: list[dict[str, Any]], cores: float | None = 0.1,
         variant: str = "cpu") -> dict[str, Any]:
    samples = [{"t": 1.0, "parallelism": start}]
    r = {"variant": variant, "start_p": start, "status": "ok", "t0": T0, "cluster_cpus": 2.0,
         "samples": samples, "decisions": decisions, "timeline": [], "seconds": 60.0,
         "cores_per_task_measured": cores, "loadavg_at_end": [3.0, 2.0, 1.0]}
    r.update(ds2.analyse(start, 5, T0, decisions, samples, 2.0, cores))
    return r


def test_the_ideal_is_the_target_utilisation_with_even_key_groups() -> None:
    assert ds2.ideal_parallelism(1500, 2000, 128) == 5  # 4.3 tasks at 70 %
    assert ds2.ideal_parallelism(100, 2000, 128) == 1


def test_runs_parse_with_the_cpu_variant_by_default() -> None:
    assert ds2.parse_runs("shipped:1, cpu:8,2") == [("shipped", 1), ("cpu", 8), ("cpu", 2)]
    with pytest.raises(ValueError, match="unknown variant"):
        ds2.parse_runs("other:1")


def test_one_step_up_to_the_ideal_holds_the_claim_and_the_issue_target() -> None:
    r = _run(1, [_idle(3), _scale(8, 1, 5), _idle(20, "every operator within the band")])
    assert [(s["from"], s["to"]) for s in r["steps"]] == [(1, 5)]
    assert r["steps"][0]["t"] == pytest.approx(6.0)  # recorded at 8 s, after 2 s of rescale
    assert r["to_ideal"] == 1 and not r["overshoot"] and r["oscillations"] == 0
    assert r["converged_s"] == pytest.approx(8.0)
    assert r["within_cpus"] and r["cpu_demand_at_peak"] == pytest.approx(0.5)
    assert ds2.verdict(r) == "yes"
    assert ds2.issue_verdict(r) == "yes"
    assert r["no_change_reasons"] == ["stabilising", "every operator within the band"]


def test_overshoot_and_oscillation_are_reported() -> None:
    r = _run(1, [_scale(8, 1, 16), _scale(30, 16, 6), _scale(50, 6, 8)], cores=0.2)
    assert r["parallelisms"] == [1, 16, 6, 8]
    assert r["overshoot"] and r["overshoot_ps"] == [16, 8]
    assert r["oscillations"] == 2  # up, down, up
    assert r["within_cpus"] is False  # 16 tasks x 0.2 cores > 2 CPUs
    v = ds2.verdict(r)
    assert v.startswith("no:") and "overshoot" in v and "direction" in v
    iv = ds2.issue_verdict(r)
    assert "went to 16" in iv and "CPUs" in iv


def test_a_run_held_below_the_ideal_never_reaches_it() -> None:
    held = _scale(8, 1, 2)
    held["reason"] += ("; bounded to 2 (DS2 asks 5): the cluster's 2 CPUs keep 2 tasks "
                       "working at 1 cores each (not measured: a core each)")
    r = _run(1, [held, _idle(30, "agg out of the utilisation band 0.4..1.0 but held")],
             variant="shipped")
    assert r["to_ideal"] is None and r["final_p"] == 2 and r["held"]
    assert "never within one task" in ds2.verdict(r)
    assert "3-5 tasks not reached" in ds2.issue_verdict(r)


def test_a_rescale_still_running_at_the_end_is_reported_from_the_samples() -> None:
    samples = [{"t": 1.0, "parallelism": 1, "rescale": ""},
               {"t": 20.0, "parallelism": 4, "rescale": "drrs rescale of 'agg': subscales"},
               {"t": 90.0, "parallelism": 4, "rescale": "drrs rescale of 'agg': subscales"}]
    r = {"start_p": 1, "status": "ok", "cluster_cpus": 2.0, "seconds": 90.0,
         **ds2.analyse(1, 5, T0, [_idle(5)], samples, 2.0, 0.01)}
    assert r["tasks_seen"] == [1, 4]
    assert r["in_flight"] == {"since_s": 20.0, "progress": "drrs rescale of 'agg': subscales",
                              "tasks_seen": 4}
    assert "still running after 70 s" in ds2.verdict(r)
    assert ds2.issue_verdict(r).startswith("decided: 1 -> 4 in decision 1")
    assert ds2._path(r) == "1 -> [4: decided, rescale unfinished]"


def test_down_from_over_provisioned_counts_the_steps() -> None:
    r = _run(8, [_idle(5, "scale-down delayed: agg 8 -> 5 in 10 s"), _scale(18, 8, 5)])
    assert r["to_ideal"] == 1 and not r["overshoot"] and ds2.verdict(r) == "yes"


def test_a_run_stops_once_the_controller_ticks_and_stayed_put() -> None:
    args = ds2.parse_args(["--quick"])  # min 35 s, stay 25 s, max 90 s, interval 2 s
    ds = [_scale(8, 1, 5), _idle(20, "every operator within the band")]
    ds[1]["last_at"] = T0 + 40.0
    assert not ds2.stays_put(args, ds, T0, T0 + 30.0)  # before --min-s
    assert ds2.stays_put(args, ds, T0, T0 + 41.0)  # ticking, 33 s after the rescale
    # no record for 20 s: a rescale it decided is running; wait, up to 60 s past --max-s
    assert not ds2.stays_put(args, ds, T0, T0 + 60.0)
    assert not ds2.stays_put(args, ds, T0, T0 + 100.0)
    assert ds2.stays_put(args, ds, T0, T0 + 151.0)  # --max-s 90 + --max-wait 60


def _results(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"command": "python examples/papers/ds2.py --quick", "date": "2026-11-28 11:00 UTC",
            "machine": {"cpus": 2, "python": "3.11", "platform": "Linux",
                        "loadavg_at_start": [3.0, 2.0, 1.0], "loadavg_at_end": [4.0, 3.0, 2.0]},
            "total_seconds": 100.0, "description": "keyed count",
            "config": {"rate": 1500.0, "service_us": 2000.0, "key_groups": 128,
                       "cpu_per_task": 0.25, "interval": 2.0, "window": 6.0,
                       "scale_down_delay": 10.0, "catch_up": 30.0},
            "runs": runs}


def test_the_summary_has_a_verdict_in_every_claim_row_and_the_figure_draws(tmp_path) -> None:
    runs = [_run(1, [_scale(8, 1, 5)]), _run(8, [_scale(18, 8, 5)]),
            _run(1, [_scale(8, 1, 2)], variant="shipped"),
            {"variant": "cpu", "start_p": 12, "status": "failed", "reason": "boom"}]
    res = _results(runs)
    rows = ds2.claims(res)
    assert len(rows) == 7  # cpu: under, over, one step, issue; shipped: under, one step, issue
    assert all(r[3] for r in rows)
    text = ds2.markdown(res)
    assert "| paper |" in text and "1 -> 5" in text and "boom" in text
    assert "DS2, cpu_per_task=0.25" in text and "DS2 as shipped" in text
    path = tmp_path / "ds2.png"
    ds2.plot(res, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
