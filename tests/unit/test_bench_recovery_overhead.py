"""recovery.py's long overhead runs (``--overhead-s``, issue 32 item 10), without Ray: the run
plan (durations, alternation without/with checkpoints, per backend), the source that builds
the state then updates only the hot keys, the figures of a run's samples, and the verdict that
refuses a measurement whose runs did not checkpoint as planned."""

from __future__ import annotations

import os
from typing import Any

import pytest

from engine.time import ManualClock
from examples.bench import recovery
from examples.bench.harness.hot_keys import HotKeysSource

LONG = ["--overhead-s", "120", "--parts", "overhead", "--repeats", "2"]


def test_the_plan_alternates_off_and_checkpoints_on_windows_of_two_minutes() -> None:
    args = recovery.parse_args([*LONG, "--state-backend", "both", "--state-gb", "0.3",
                                "--incremental"])
    plan = recovery.long_plan(args, "rocksdb")
    assert [p.setting for p in plan] == ["off", "10 s", "off", "10 s"]
    assert [p.interval_s for p in plan] == [None, 10.0, None, 10.0]
    assert [(p.number, p.pair) for p in plan] == [(1, 1), (2, 1), (3, 2), (4, 2)]
    assert {p.seconds for p in plan} == {120.0} and {p.backend for p in plan} == {"rocksdb"}
    # 0.3 GB over the 20,000 keys; 1 % of them hot
    src = recovery.long_source(args)
    assert (src.num_keys, src.hot_keys, src.state_bytes) == (20_000, 200, 15_000)
    fields = recovery.overhead_fields(args, "rocksdb")
    assert fields == {"state_backend": "rocksdb", "incremental_checkpoints": True}
    cfg = recovery.config("/tmp/c", plan[1].interval_s, fields)
    assert cfg.incremental_checkpoints and cfg.checkpoint_interval_s == 10.0
    assert recovery.parse_args([]).overhead_s is None  # the short runs stay the default


def test_a_plan_that_cannot_reach_the_checkpoints_is_refused() -> None:
    with pytest.raises(SystemExit):  # 60 s at 10 s: at most 6 checkpoints
        recovery.parse_args(["--overhead-s", "60"])
    with pytest.raises(SystemExit):
        recovery.parse_args([*LONG, "--hot-pct", "0"])
    assert recovery.parse_args(["--overhead-s", "20", "--overhead-interval", "2"]).overhead_s


def test_the_source_builds_every_key_once_then_cycles_over_the_hot_keys() -> None:
    src = HotKeysSource(num_keys=10, hot_keys=3, state_bytes=100, num_records=16)
    parts = src.partitions(2)
    reader = src.open_partition(parts[0], None, ManualClock())
    batch = reader.poll(7)
    assert batch is not None
    assert batch.values == [(0, 0, 100), (2, 1, 100), (4, 2, 100), (6, 3, 100),
                            (8, 4, 100), (0, 5), (2, 6)]
    assert len(batch.timestamps) == 7
    resumed = src.open_partition(parts[0], reader.offset(), ManualClock())
    rest = resumed.poll(100)
    assert rest is not None and rest.values == [(0, 7)]  # 8 records of 16 in partition 0
    assert resumed.poll(100) is None
    other = src.open_partition(parts[1], None, ManualClock()).poll(7)
    assert other is not None and [v[0] for v in other.values] == [1, 3, 5, 7, 9, 1, 1]
    with pytest.raises(ValueError):
        HotKeysSource(num_keys=10, hot_keys=11, state_bytes=1)


def _samples(rate: float, seconds: int, every: float | None, bytes_: int = 1000
             ) -> list[dict[str, Any]]:
    out = []
    for s in range(seconds + 1):
        done = int(s // every) if every else 0
        out.append({"t": 100.0 + s, "records": int(rate * s), "completed": 3 + done,
                    "failed": 0, "last_id": 2 + done, "last_bytes": bytes_ * (done + 1),
                    "last_duration_s": 0.5, "load": 1.0 + s / seconds})
    return out


def _run(number: int, setting: str, rate: float, every: float | None) -> dict[str, Any]:
    plan = recovery.LongRun(number, (number + 1) // 2, "memory", setting, every, 120.0, 5.0)
    return {**recovery.dataclasses.asdict(plan),
            **recovery.window_figures(_samples(rate, 120, every),
                                      {"job_cores": 1.5, "other_cores": 0.3, "span_s": 120})}


def test_a_window_counts_its_checkpoints_and_the_summary_its_overhead(tmp_path: Any) -> None:
    fig = recovery.window_figures(_samples(1000.0, 120, 10.0))
    assert fig["seconds"] == 120 and fig["throughput"] == pytest.approx(1000.0)
    assert fig["checkpoints"] == 12 and fig["checkpoints_failed"] == 0
    assert [c["id"] for c in fig["checkpoint_list"]] == list(range(3, 15))
    assert len(fig["per_second"]) == 120 and (fig["load_start"], fig["load_end"]) == (1.0, 2.0)
    runs = [_run(1, "off", 1000.0, None), _run(2, "10 s", 970.0, 10.0),
            _run(3, "off", 1010.0, None), _run(4, "10 s", 960.0, 10.0)]
    out = recovery.long_summary(runs, min_checkpoints=10, min_seconds=118.8)
    assert out["median_throughput"] == {"off": pytest.approx(1005.0),
                                        "10 s": pytest.approx(965.0)}
    assert out["overhead"]["10 s"] == pytest.approx(1 - 965 / 1005)
    assert out["pair_overhead"] == [pytest.approx(0.03), pytest.approx(1 - 960 / 1010)]
    assert out["verdict"] == {"valid": True, "why_not": [], "inconclusive": False,
                              "met": True}
    md = recovery.markdown({"overhead": {**out, "job": {
        "keys": 20_000, "hot_keys": 200, "state_mb": 200, "incremental": True}},
        "machine": {"cpus": 2, "loadavg_at_start": [1.0, 1, 1], "loadavg_at_end": [2, 1, 1]}})
    assert "| memory | 2 | 10 s | 120 | 970 |" in md and "target <= 5 % met" in md
    path = str(tmp_path / "r.png")
    recovery.plot({"overhead": out, "machine": {"cpus": 2, "loadavg_at_start": [1.0, 1, 1],
                                                "loadavg_at_end": [2, 1, 1]}}, path)
    assert os.path.getsize(path) > 10_000


def test_runs_that_did_not_checkpoint_as_planned_are_no_measurement() -> None:
    short = _run(2, "10 s", 990.0, 15.0)  # 8 checkpoints in its window
    out = recovery.long_summary([_run(1, "off", 1000.0, None), short], 10, 118.8)
    assert out["verdict"]["valid"] is False and out["verdict"]["met"] is False
    assert "run 2 (10 s): 8 checkpoints completed" in out["verdict"]["why_not"][0]
    leaked = _run(1, "off", 1000.0, 10.0)  # a run without checkpoints that checkpointed
    leaked["interval_s"] = None
    out = recovery.long_summary([leaked, _run(2, "10 s", 900.0, 10.0)], 10, 118.8)
    assert not out["verdict"]["valid"]
    slow = recovery.long_summary([_run(1, "off", 1000.0, None), _run(2, "10 s", 900.0, 10.0)],
                                 10, 118.8)
    assert slow["verdict"] == {"valid": True, "why_not": [], "inconclusive": False,
                               "met": False}  # 10 % overhead
    # checkpoints "40 % faster" in one pair, 5 % slower in the other: the load's doing
    noisy = recovery.long_summary([_run(1, "off", 1000.0, None), _run(2, "10 s", 1400.0, 10.0),
                                   _run(3, "off", 1000.0, None), _run(4, "10 s", 950.0, 10.0)],
                                  10, 118.8)
    assert noisy["verdict"]["inconclusive"] and not noisy["verdict"]["met"]
