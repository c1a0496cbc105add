"""``examples/papers/megaphone.py``'s pure parts (no Ray): the paper's migration, the
strategies' configs, the sweep's points, the memory figures, and the summary, its verdicts
and the figure built from a synthetic results dict. Never a measured value: the script is
a benchmark (``tests/integration/test_papers_megaphone.py`` runs it)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from engine import JobConfig
from engine.dataflow.keygroups import moved_key_groups, uniform_assignment
from examples.papers import megaphone as mg


@pytest.mark.parametrize(("groups", "tasks"), [(16, 2), (128, 4), (4096, 4), (64, 8)])
def test_half_move_sends_half_of_half_of_the_tasks_groups_to_the_other_half(
        groups: int, tasks: int) -> None:
    old = uniform_assignment(groups, tasks)
    new = mg.half_move(groups, tasks)
    moved = moved_key_groups(old, new)
    assert len(moved) == groups // 4
    assert max(new) == tasks - 1  # the parallelism stays
    half = tasks // 2
    assert all(old[kg] < half and new[kg] == old[kg] + half for kg in moved)


def test_half_move_needs_two_tasks() -> None:
    with pytest.raises(ValueError, match="2 tasks"):
        mg.half_move(16, 1)


def test_the_strategies_map_to_reflow_protocols_and_share_jobs_when_they_can() -> None:
    assert mg.protocol_of("all-at-once") == "pause-resume"
    assert mg.protocol_of("fluid") == "fluid"
    assert mg.protocol_of("batched") == "batched"
    groups = mg.job_groups([*mg.MAIN, "one-step batched"])
    assert [members for _, members in groups] == [list(mg.MAIN), ["one-step batched"]]
    fields, _ = groups[0]
    cfg = mg.job_config(JobConfig(), fields, 256)
    assert cfg.batched_matching
    one = mg.job_config(JobConfig(), groups[1][0], 256)
    assert one.batched_step_size == 256 and not one.batched_matching  # one step


def _args(**over: Any) -> argparse.Namespace:
    a = mg.parse_args(["--quick", "--out", "/nonexistent"])
    for k, v in over.items():
        setattr(a, k, v)
    return a


def test_sweep_points_share_the_common_point_and_name_their_figures() -> None:
    a = _args(sweep_bins="16,64", keys=2000, sweep_keys="1024,2000", sweep_fixed_bins=64,
              proportional=True, keys_per_bin=16)
    pts = {(p["bins"], p["keys"]): p["figures"] for p in mg.sweep_points(a)}
    assert pts[(64, 2000)] == ["fig16", "fig17"]
    assert pts[(16, 2000)] == ["fig16"]
    assert pts[(64, 1024)] == ["fig17", "fig18"]
    assert pts[(16, 256)] == ["fig18"]
    assert len(pts) == 4


def test_parse_args_refuses_an_odd_parallelism_and_unknown_parts() -> None:
    with pytest.raises(SystemExit):
        mg.parse_args(["--parallelism", "3"])
    with pytest.raises(SystemExit):
        mg.parse_args(["--parts", "nexmark,bogus"])


def test_memory_figures_take_the_rise_over_the_level_before_the_request() -> None:
    series = {"t": [-2.5, -1.0, 0.5, 1.0, 3.0, 9.0],
              "total_mb": [0.0] * 6,
              "per_process_mb": {"agg/0": [100, 102, 150, 130, 101, 300],
                                 "agg/1": [90, 90, 95, 92, 90, 90],
                                 "master": [50, 50, 50, 50, 50, 50]}}
    m = mg.memory_figures(series, "agg", 0.0, 1.5)
    assert m["per_process"]["agg/0"] == {"level_mb": 101, "peak_mb": 150, "rise_mb": 49}
    assert m["max_rise_process"] == "agg/0" and m["max_rise_mb"] == 49
    assert m["total_rise_mb"] == 49 + 5
    assert mg.memory_figures(None, "agg", 0.0, 1.0) == {}


def test_order_verdict() -> None:
    order = ("fluid", "batched", "all-at-once")
    assert mg._order_verdict({"fluid": 1, "batched": 2, "all-at-once": 3}, order) == "yes"
    assert mg._order_verdict({"fluid": 2, "batched": 1, "all-at-once": 3}, order).startswith(
        "partly")
    assert mg._order_verdict({"fluid": 3, "batched": 2, "all-at-once": 1}, order) == "no"
    assert mg._order_verdict({"fluid": None, "batched": 2, "all-at-once": 1},
                             order).startswith("n/a")


# ---------------------------------------------------------------------- a synthetic run

LAT = {"all-at-once": (900.0, 0.5, 40.0), "batched": (200.0, 1.0, 5.0),
       "fluid": (80.0, 3.0, 2.0)}


def _med(lat: float, dur: float, rise: float = 1.0) -> dict[str, Any]:
    return {"migrations": 1, "duration_s": dur, "max_latency_ms": lat, "peak_p99_ms": lat / 2,
            "mb_moved": 5.0, "memory_rise_mb": rise, "failed": []}


def _job(scale: float = 1.0) -> dict[str, Any]:
    """A job that ran each strategy out and back, 10 s apart, from t = 1000."""
    migrations, t = [], 1000.0
    for s, (lat, dur, rise) in LAT.items():
        for d in ("out", "back"):
            migrations.append({"strategy": s, "round": 0, "direction": d, "status": "ok",
                               "requested_at": t, "duration_s": dur * scale,
                               "max_latency_ms": lat * scale,
                               "report": {"completed_at": t + dur, "duration_s": dur,
                                          "bytes_moved": 5e6},
                               "memory": {"max_rise_process": "agg/0", "max_rise_mb": rise}})
            t += 10.0
    tl = [{"second": s, "count": 100, "mean_ms": 5.0, "p50_ms": 4.0,
           "p99_ms": 30.0 if s % 10 == 1 else 9.0, "max_ms": 40.0 if s % 10 == 1 else 12.0}
          for s in range(990, 1065)]
    ts = [x * 0.25 for x in range(300)]
    return {"status": "ok", "migrations": migrations, "timeline": tl, "level_ms": 5.0,
            "baseline_max_ms": 100.0,
            "rss_series": {"epoch": 990.0, "t": ts, "total_mb": [300.0] * len(ts),
                           "per_process_mb": {"agg/0": [100.0 + (x % 10) for x in ts]}}}


def synthetic() -> dict[str, Any]:
    nexmark = {q: {"operator": f"{q}-op", "rate": 8000.0, "size_ms": 2000, "slide_ms": 500,
                   "key_groups": 128, "parallelism": 4, "moved": 32, "state_mb": 3.0,
                   "jobs": [_job()], "medians": {s: _med(*v) for s, v in LAT.items()},
                   "medians_back": {s: _med(*v) for s, v in LAT.items()}}
               for q in mg.QUERIES}
    meds = {}
    for name, b, live, f in (("16 bins", 16, True, 1.0), ("256 bins", 256, True, 1.1),
                             ("4096 bins", 4096, True, 1.2),
                             ("native (16 bins)", 16, False, 0.9)):
        meds[name] = {"bins": b, "live_rescaling": live, "runs": 1,
                      **{mg.qkey(q): 5.0 * f * (1 + 10 * q) for q in mg.CCDF_QUANTILES},
                      "mean_ms": 6.0 * f, "max_ms": 80.0 * f, "records_per_s": 3000.0,
                      "records_per_cpu_s": 10_000 / f, "cores": 0.5,
                      "p99_over_smallest": f, "p50_over_smallest": f,
                      "per_cpu_over_smallest": 1 / f}
    bins = {"rate": 3000.0, "keys": 4000, "parallelism": 4, "runs": [], "medians": meds}
    points = []
    for b, n, figs, k in ((16, 4000, ["fig16"], 1.0), (64, 4000, ["fig16", "fig17"], 0.7),
                          (64, 8000, ["fig17"], 1.6)):
        points.append({"bins": b, "keys": n, "figures": figs, "moved": b // 4,
                       "state_mb": n * 0.0125, "build_s": 4.0, "job": _job(k),
                       "medians": {s: _med(lt * (k if s != "all-at-once" else 1.0),
                                           d * k, rise) for s, (lt, d, rise) in LAT.items()},
                       "medians_back": {}})
    sweep = {"rate": 3000.0, "state_bytes": 12_500, "parallelism": 4, "points": points,
             "memory_point": {"bins": 64, "keys": 8000}}
    return {"command": "python examples/papers/megaphone.py", "date": "2026-11-28 11:00 UTC",
            "machine": {"cpus": 2, "python": "3.11", "platform": "linux",
                        "loadavg_at_start": [2.0, 2.0, 2.0], "loadavg_at_end": [3.0, 3.0, 3.0]},
            "total_seconds": 600.0,
            "config": {**vars(_args(keys=4000, sweep_fixed_bins=64)), "gap": 5.0,
                       "repeats": 1, "parallelism": 4},
            "nexmark": nexmark, "bins": bins, "sweep": sweep}


def test_strategy_medians_take_both_directions_or_one() -> None:
    job = _job(2.0)
    job["migrations"][-1]["max_latency_ms"] = 1000.0  # fluid back
    med = mg.strategy_medians(job["migrations"])
    assert set(med) == set(mg.MAIN)
    assert med["fluid"]["max_latency_ms"] == 580.0 and med["fluid"]["migrations"] == 2
    back = mg.strategy_medians(job["migrations"], mg.REPORTED)
    assert back["fluid"]["max_latency_ms"] == 1000.0 and back["fluid"]["migrations"] == 1
    assert med["all-at-once"]["mb_moved"] == 5.0
    assert med["batched"]["memory_rise_mb"] == 5.0


def test_the_summary_has_a_verdict_for_every_claim_and_the_expected_ones_hold() -> None:
    r = synthetic()
    rows = mg.claims(r)
    text = {row[0].split(":")[0]: row[3] for row in rows}
    assert all(len(row) == 4 and all(row) for row in rows)
    assert text["Fig. 11"].startswith("no")  # all-at-once above 2x the pre-migration max
    assert text["Fig. 12"].startswith("yes (not comparable: 3.0 MB")
    assert text["Fig. 13-15"].startswith("yes: flat up to 4096")
    # all-at-once's latency does not grow with the domain in the synthetic points
    assert text["Fig. 17"] == "5 of 6 grow; all-at-once highest at every size"
    assert text["Fig. 16"] == "yes (latency)"
    assert text["Fig. 19"] == "yes"
    assert text["Fig. 1"] == "ordering yes, 2.8x (not orders of magnitude)"
    order = [row for row in rows if row[0].startswith("§5.3: max latency")][0]
    assert order[3] == "yes"
    dur = [row for row in rows if row[0].startswith("§5.3: duration")][0]
    assert dur[3] == "yes"
    md = mg.markdown(r)
    assert md.count("| Fig.") >= 5 and "load average 2.0 -> 3.0" in md


def test_the_figure_is_drawn_from_a_synthetic_run(tmp_path) -> None:
    path = tmp_path / "megaphone.png"
    mg.plot(synthetic(), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
