"""The pure helpers of the planning benchmark (examples/bench/planning.py): settings, the
per-run measurement on synthetic latency series, the per-phase verdict, the skewed phase's
load counting and assignment, the report text. No Ray, no job; the quick run end to end is in
tests/integration/test_bench_e2e.py."""

from __future__ import annotations

import json
import os

import pytest

from engine.dataflow.keygroups import key_group_of, uniform_assignment
from examples.bench import planning as pb
from examples.bench.harness import BenchError, balance, jobs
from examples.bench.harness import analysis as tl
from migration.planning import Planning, plan_steps

# ------------------------------------------------------------------------------ settings


def test_every_setting_makes_a_valid_planning_and_adaptive_is_none() -> None:
    for name in pb.SETTINGS:
        p = pb.make_planning(name, bandwidth=5e6, chunk_seconds=0.25)
        if name == pb.ADAPTIVE:
            assert p is None
            continue
        assert isinstance(p, Planning)
        assert p.bandwidth_bytes_per_s == 5e6 and p.chunk_seconds == 0.25
        assert p.replication == "none"
        assert p.prioritisation == ("hot-first" if name.startswith("hot-first") else "random")
    assert pb.make_planning("chunks-4", bandwidth=1e6).chunk_size == 4
    with pytest.raises(BenchError, match="unknown planning setting"):
        pb.make_planning("chunks-5", bandwidth=1e6)


def test_settings_make_the_steps_they_name() -> None:
    old, new = uniform_assignment(32, 4), uniform_assignment(32, 6)
    moved = sum(a != b for a, b in zip(old, new, strict=True))
    steps = {n: len(plan_steps("agg", old, new, pb.make_planning(n, bandwidth=1e6)).steps)
             for n in ("all-at-once", "chunks-4", "one-by-one")}
    assert steps == {"all-at-once": 1, "chunks-4": -(-moved // 4), "one-by-one": moved}


def test_phase_lists_cover_the_brief() -> None:
    for quick in (False, True):
        ph = pb.default_phases(quick)
        assert set(ph) == {"small", "large", "skewed"}
        for p in ph.values():
            assert p.settings[0] == "all-at-once" and pb.ADAPTIVE in p.settings
            assert {"chunks-4", "one-by-one"} <= set(p.settings)
        assert "equal-time" in ph["small"].settings and "equal-time" in ph["large"].settings
        assert {"hot-first/chunks-4", "hot-first/one-by-one"} <= set(ph["skewed"].settings)
        assert ph["skewed"].rebalance and ph["skewed"].zipf
        assert ph["large"].state_bytes >= 20_000 > ph["small"].state_bytes
        assert 10e6 <= ph["large"].expected_state_bytes <= 100e6
    assert "hot-first/equal-time" in pb.default_phases(False)["skewed"].settings


def test_parse_settings_keeps_order_and_rejects_unknown() -> None:
    ph = pb.default_phases(False)["small"]
    assert pb.parse_settings(None, ph) == ph.settings
    assert pb.parse_settings("one-by-one, adaptive,all-at-once,adaptive", ph) == (
        "all-at-once", "adaptive", "one-by-one")
    with pytest.raises(BenchError, match="unknown planning setting"):
        pb.parse_settings("all-at-once,fast", ph)


def test_transfer_bandwidth_excludes_start_up() -> None:
    rep = {"bytes_moved": 10_000_000, "requested_at": 100.0, "first_subscale_at": 103.0,
           "completed_at": 105.0}
    assert pb.transfer_bandwidth(rep) == pytest.approx(5e6)
    assert pb.transfer_bandwidth({**rep, "first_subscale_at": 0.0}) == pytest.approx(2e6)
    assert pb.transfer_bandwidth({**rep, "bytes_moved": 0}) is None
    assert pb.transfer_bandwidth(None) is None
    assert pb.transfer_bandwidth({**rep, "completed_at": 103.0}) is None


# ------------------------------------------------------------------------------ skewed phase


def test_lpt_assignment_evens_zipf_load_and_uses_every_task() -> None:
    keys = jobs.generator_keys(100_000, keys=2_000, zipf=1.0)
    counts = [0] * 2_000
    for k in keys.tolist():
        counts[k] += 1
    loads = balance.group_loads(counts, lambda k: key_group_of(k, 64), 64)
    cur = uniform_assignment(64, 4)
    new = balance.lpt_assignment(loads, 4)
    assert len(new) == 64 and set(new) == {0, 1, 2, 3}
    assert balance.imbalance(loads, new, 4) < balance.imbalance(loads, cur, 4)
    assert balance.imbalance(loads, new, 4) < 1.15
    assert max(loads) / (sum(loads) / 64) > 2  # skewed enough for hot-first


def test_records_to_cover() -> None:
    assert tl.records_to_cover([3, 3, 1, 2, 1, 0], 1.0) == 6
    assert tl.records_to_cover([3, 3, 1, 2, 1, 0], 0.5) == 3
    assert tl.records_to_cover([], 0.9) is None


def test_prepare_phase_builds_until_the_keys_are_seen_and_plans_the_reshuffle() -> None:
    args = pb.parse_args(["--quick"])
    small, _, skewed = args.phase_list
    ctx = pb.prepare_phase(small, args)
    keys = jobs.generator_keys(int(small.rate * 120), keys=small.keys, zipf=None)
    need = tl.records_to_cover(keys, args.coverage)
    assert ctx["build_s"] == pytest.approx(max(args.build, need / small.rate))
    assert ctx["keys_seen"] >= args.coverage * small.keys and "assignment" not in ctx
    ctx = pb.prepare_phase(skewed, args)
    assert ctx["build_s"] == args.build  # Zipf keys: no coverage rule
    assert set(ctx["assignment"]) == set(range(skewed.to_p))
    assert ctx["imbalance_after"] < ctx["imbalance_before"] and ctx["planned_groups_moved"] > 0


# ------------------------------------------------------------------------------ measurement


def rows(values: dict[int, tuple[float, float]], count: int = 1000) -> list[dict]:
    """second -> (mean, max)."""
    return [{"second": s, "count": count, "mean_ms": m, "p99_ms": (m + x) / 2, "max_ms": x}
            for s, (m, x) in sorted(values.items())]


def test_measure_spike_over_baseline_level() -> None:
    series = {s: (10.0, 30.0) for s in range(90, 100)}  # baseline: level 10, max 30
    series[95] = (50.0, 400.0)  # one noisy baseline second does not move the level
    series.update({100: (40.0, 500.0), 101: (20.0, 200.0)})  # the rescale
    series.update({s: (10.0, 25.0) for s in range(102, 110)})
    series[108] = (10.0, 900.0)  # after the period: not part of the spike
    m = tl.measure(rows(series), 100.2, 101.5, 110.0, baseline_s=10, stable_s=3,
                   tolerance=1.1, slack_ms=0.0)
    assert m["baseline"]["level_ms"] == 10.0
    assert m["baseline"]["mean_ms"] == pytest.approx(14.0)
    assert m["period"]["start"] == 100 and m["period"]["end"] == 102 and m["period"]["stabilized"]
    assert m["peak"]["max_ms"] == 500.0
    assert m["spike"] == pytest.approx(50.0)
    assert m["spike_over_weighted_mean"] == pytest.approx(500.0 / 14.0)
    assert m["baseline_spike"] == pytest.approx(40.0)


def test_measure_unstable_run_is_capped_and_without_baseline_has_no_spike() -> None:
    series = {s: (10.0, 20.0) for s in range(90, 100)}
    series.update({s: (100.0, 300.0) for s in range(100, 106)})
    m = tl.measure(rows(series), 100.0, 101.0, 106.0, baseline_s=10, stable_s=3,
                   tolerance=1.1, slack_ms=5.0)
    assert not m["period"]["stabilized"] and m["period"]["end"] == 106
    assert m["spike"] == pytest.approx(30.0)
    empty = tl.measure(rows({s: (10.0, 20.0) for s in range(100, 106)}), 100.0, 101.0, 106.0,
                       baseline_s=5, stable_s=2, tolerance=1.1, slack_ms=0.0)
    assert empty["spike"] is None and empty["baseline"]["level_ms"] is None


# ------------------------------------------------------------------------------ verdict


REASON_AD = ("adaptive: high input rate 14366 rec/s and high skew (7.1): hot-first; small state "
             "(80 KB/group, 3.76 MB ~ 0.038 s in total): all-at-once; no replication: small "
             "state.; agg: 47 key groups move in 1 steps (12 subscales); hot-first, all-at-once")


def run(setting: str, sp: float | None, dur: float, *, steps: int = 1, reason: str = "",
        status: str = "ok") -> dict:
    if status != "ok":
        return {"setting": setting, "status": status, "reason": "boom"}
    return {"setting": setting, "status": "ok", "spike": sp, "migration_s": dur,
            "report": {"duration_s": dur, "bytes_moved": 1000, "steps": steps,
                       "planning_reason": reason}}


def test_phase_summary_best_fixed_and_ratios() -> None:
    runs = [run("all-at-once", 20.0, 1.0, reason="agg: 9 key groups move in 1 steps "
                "(3 subscales); random, all-at-once"),
            run("one-by-one", 5.0, 10.0, steps=9),
            run("chunks-4", 8.0, 3.0, steps=3),
            run("equal-time", None, 2.0, status="failed"),
            run(pb.ADAPTIVE, 22.0, 1.1, reason=REASON_AD)]
    s = pb.phase_summary(runs)
    assert s["best_spike"]["setting"] == "one-by-one"
    assert s["best_completion"]["setting"] == "all-at-once"
    assert s["spike_ratio"] == pytest.approx(22.0 / 5.0)
    assert s["completion_ratio"] == pytest.approx(1.1)
    assert s["meets_target"] is True
    assert s["settings"]["equal-time"] == {**s["settings"]["equal-time"], "runs": 1, "ok": 0}
    ad = s["adaptive"]
    assert ad["chose"] == "hot-first, all-at-once"
    assert ad["inputs"]["input_rate"] == 14366 and ad["inputs"]["skew"] == 7.1
    assert ad["inputs"]["state_per_group"] == "80 KB"
    assert ad["same_plan_as"] == []  # random vs hot-first order: not the same plan


def test_phase_summary_misses_target_and_uses_medians_of_repeats() -> None:
    runs = [run("all-at-once", 10.0, 1.0), run("all-at-once", 30.0, 3.0),
            run("all-at-once", 20.0, 2.0),
            run(pb.ADAPTIVE, 40.0, 5.0), run(pb.ADAPTIVE, 100.0, 9.0)]
    s = pb.phase_summary(runs)
    assert s["settings"]["all-at-once"]["spike"] == 20.0
    assert s["settings"]["all-at-once"]["completion_s"] == 2.0
    assert s["settings"][pb.ADAPTIVE]["spike"] == 70.0
    assert s["spike_ratio"] == pytest.approx(3.5)
    assert s["completion_ratio"] == pytest.approx(3.5)
    assert s["meets_target"] is False


def test_phase_summary_without_adaptive_or_fixed() -> None:
    s = pb.phase_summary([run("all-at-once", 10.0, 1.0), run(pb.ADAPTIVE, 1, 1, status="failed")])
    assert s["adaptive"] is None and s["meets_target"] is None
    s = pb.phase_summary([run(pb.ADAPTIVE, 10.0, 1.0, reason=REASON_AD)])
    assert s["best_spike"] is None and s["spike_ratio"] is None and s["meets_target"] is None


def test_adaptive_text_parsing() -> None:
    r = ("adaptive: low skew (1.9): random; small state (144 KB/group, 13.6 MB ~ 0.14 s in "
         "total): all-at-once; no replication: small state.; agg: 95 key groups move in 1 "
         "steps (6 subscales); random, all-at-once")
    assert pb.adaptive_choice(r) == "random, all-at-once"
    assert pb.adaptive_inputs(r) == {"input_rate": None, "skew": 1.9,
                                     "state_per_group": "144 KB", "state_total": "13.6 MB"}
    assert pb.adaptive_inputs("skewed (3.5) but low input rate 800 rec/s: random")["skew"] == 3.5
    assert pb.adaptive_choice("") == ""
    assert pb.plan_key(r) == "1 steps (6 subscales); random"
    one_chunk = ("agg: 95 key groups move in 1 steps (6 subscales); random, "
                 "equal-transfer-time chunks of ~0.5 s at 36 MB/s")
    assert pb.plan_key(one_chunk) == pb.plan_key(r)  # everything in one step: the same plan
    assert pb.plan_key("agg: 9 key groups move in 3 steps (5 subscales); hot-first, chunks "
                       "of 4") == "3 steps (5 subscales); hot-first, chunks of 4"
    assert pb.plan_key("agg: 9 key groups move in 1 steps (3 subscales); hot-first, "
                       "all-at-once") != pb.plan_key(r)
    assert pb.plan_key("no plan here") is None


def test_settings_that_ran_the_same_plan_are_compared_as_one() -> None:
    one = "agg: 9 key groups move in 1 steps (3 subscales); random, all-at-once"
    one_chunk = ("agg: 9 key groups move in 1 steps (3 subscales); random, "
                 "equal-transfer-time chunks of ~0.5 s at 36 MB/s")
    runs = [run("all-at-once", 20.0, 0.30, reason=one),
            run("equal-time", 18.0, 0.20, reason=one_chunk),  # the same plan, a quiet moment
            run("one-by-one", 5.0, 2.0, steps=9,
                reason="agg: 9 key groups move in 9 steps (9 subscales); random, one-by-one"),
            run(pb.ADAPTIVE, 22.0, 0.26, reason="adaptive: low skew (1.2): random; ...; " + one)]
    s = pb.phase_summary(runs)
    plan = s["plans"][pb.ADAPTIVE]
    assert plan["settings"] == [pb.ADAPTIVE, "all-at-once", "equal-time"]
    assert plan["completion_s"] == pytest.approx(0.26) and plan["spike"] == pytest.approx(20.0)
    assert s["plans"]["one-by-one"]["settings"] == ["one-by-one"]
    # by plan: adaptive is the best completion's own plan; by setting alone it loses to
    # the luckier equal-time run of that plan
    assert s["completion_ratio"] == pytest.approx(1.0)
    assert s["raw_completion_ratio"] == pytest.approx(0.26 / 0.20)
    assert s["spike_ratio"] == pytest.approx(20.0 / 5.0)
    assert s["adaptive"]["same_plan_as"] == ["all-at-once", "equal-time"]
    assert s["adaptive"]["own_completion_s"] == pytest.approx(0.26)
    assert s["meets_target"] is True


def fake_results() -> dict:
    phases = []
    for name, p in pb.default_phases(True).items():
        runs = [run("all-at-once", 20.0, 1.0), run("one-by-one", 5.0, 9.0, steps=9),
                run(pb.ADAPTIVE, 21.0, 1.05, reason=REASON_AD), run("chunks-4", 0, 0,
                                                                   status="skipped")]
        for r in runs:
            if r["status"] == "ok":
                r.update(peak={"max_ms": 100.0}, baseline={"level_ms": 5.0},
                         baseline_spike=4.0, period={"seconds": 3, "stabilized": True})
                r["report"]["key_groups_moved"] = 9
        phases.append({"name": name, "phase": pb.asdict(p), "runs": runs,
                       "summary": pb.phase_summary(runs), "imbalance_before": 1.5,
                       "imbalance_after": 1.0, "planned_groups_moved": 40})
    return {"config": {"quick": True, "key_groups": 64, "warm_standby_tasks": 2},
            "machine": {"cpus": 2, "loadavg_at_start": [1.0, 1, 1], "loadavg_at_end": [2.0, 1, 1]},
            "total_seconds": 12.0, "phases": phases}


def test_markdown_and_plot(tmp_path: object) -> None:
    res = fake_results()
    md = pb.markdown(res)
    assert md.count("| small |") == 5  # verdict row + 4 run rows
    assert "one-by-one (5.0x)" in md and "all-at-once (1.00 s)" in md
    assert "| 1.05 |" in md and "| yes |" in md
    assert "skipped: boom" in md
    assert "chose: hot-first, all-at-once (saw 14,366 rec/s, skew 7.1, 80 KB/group)" in md
    assert "same plan as" not in md
    json.dumps(res, default=str)
    path = os.path.join(str(tmp_path), "p.png")
    pb.plot(res, path)
    assert os.path.getsize(path) > 10_000
