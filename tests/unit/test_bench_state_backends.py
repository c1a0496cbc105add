"""The benchmarks' state backend options (``harness.cli.add_state_backend``): parsing, the
job configurations they give, and ``both`` reported side by side (rescale.py's summary and
table, recovery.py's tables and PNG), on synthetic results (no Ray)."""

from __future__ import annotations

import os
import types
from typing import Any

import pytest

from examples.bench import recovery, rescale
from examples.bench.harness import cli, run


def test_rescale_takes_a_backend_and_a_size_in_gb() -> None:
    a = rescale.parse_args(["--state-backend", "both", "--state-gb", "0.5",
                            "--protocols", "drrs"])
    assert a.backends == ["memory", "rocksdb"]
    assert a.state_bytes == 25_000  # 0.5 GB over the 20,000 keys
    assert a.coverage == 0.99  # the whole size is built
    rocks = rescale.job_config(a, "rocksdb")
    assert rocks.state_backend == "rocksdb" and rescale.job_config(a).state_backend == "memory"
    # the options before stay as they were
    b = rescale.parse_args(["--state-bytes", "1234"])
    assert (b.backends, b.state_bytes, b.coverage) == (["memory"], 1234, None)
    c = rescale.parse_args(["--state-backend", "rocksdb", "--state-gb", "5",
                            "--state-memory-mb", "64", "--state-dir", "/tmp/x"])
    cfg = rescale.job_config(c, "rocksdb")
    assert (cfg.state_memory_bytes, cfg.state_dir) == (64 << 20, "/tmp/x")
    assert c.state_bytes == 250_000


def test_recovery_takes_sizes_in_gb_and_parts() -> None:
    a = recovery.parse_args(["--state-backend", "both", "--state-gb", "0.2", "1.5",
                             "--parts", "recovery"])
    assert a.state_mb == [200, 1500] and a.parts == ["recovery"]
    assert cli.state_backends(a) == ["memory", "rocksdb"]
    assert recovery.parse_args([]).state_mb == [20, 200]
    with pytest.raises(SystemExit):
        recovery.parse_args(["--parts", "nosuch"])
    assert recovery.parse_args([]).restart_modes == ["reuse"]
    assert recovery.parse_args(["--restart-modes", "new,local"]).restart_modes == ["new", "local"]
    with pytest.raises(SystemExit):
        recovery.parse_args(["--restart-modes", "new,nosuch"])
    assert recovery.RESTART_MODES["new"] == {"recovery_reuses_processes": False}
    cfg = recovery.config("/tmp/c", 1.0, cli.state_fields(a, "rocksdb"))
    assert cfg.state_backend == "rocksdb" and cfg.checkpoint_interval_s == 1.0


def _run(p: str, backend: str, peak: float, mean: float) -> dict[str, Any]:
    return {"protocol": p, "backend": backend, "status": run.RunStatus.OK,
            "peak": {"max_ms": peak, "p99_ms": peak},
            "period": {"mean_ms": mean, "seconds": 5, "stabilized": True, "p99_ms": peak},
            "settle": {"seconds": 5, "stabilized": True},
            "baseline": {"mean_ms": 10.0, "level_ms": 10.0, "p50_ms": 9.0, "p99_ms": 20.0},
            "post_request": {"mean_ms": 10.0}, "report": None, "loadavg_at_end": [3.0],
            "rss": {"peak_total_mb": 900.0 if backend == "memory" else 600.0},
            "dip": {"ratio": 1.0}, "longest_gap": {"gap_s": 0.1}, "tail": {"mean_ms": 10.0}}


def test_both_backends_are_summarised_apart_and_tabulated_side_by_side() -> None:
    runs = [_run("none", "memory", 20, 10), _run("none", "rocksdb", 30, 12),
            _run("drrs", "memory", 100, 20), _run("drrs", "rocksdb", 300, 36)]
    results: dict[str, Any] = {
        "runs": runs, "scenario": {"description": "a test"}, "total_seconds": 1.0,
        "config": {"scenario": "micro", "quick": False, "tolerance": 1.1, "slack_ms": 5.0,
                   "stable_s": 3, "repeats": 1},
        "machine": {"cpus": 2, "loadavg_at_start": [1.0, 1, 1], "loadavg_at_end": [2.0, 1, 1]}}
    rescale.summarise_backends(results, ["memory", "rocksdb"])
    by = results["by_backend"]
    assert by["memory"]["ratios"]["drrs scaling-period mean / no-rescale mean"] == 2.0
    assert by["rocksdb"]["ratios"]["drrs scaling-period mean / no-rescale mean"] == 3.6
    assert by["rocksdb"]["medians"]["drrs"]["rss_peak_mb"]["median"] == 600.0
    md = rescale.markdown(results)
    assert "on the rocksdb state backend" in md and "Side by side (medians):" in md
    assert "| drrs | 20.0 | 100 | - | 900 | 36.0 | 300 | - | 600 |" in md
    assert "| drrs #1 [rocksdb] |" in md


def test_recovery_tables_and_plot_show_both_backends(tmp_path: Any) -> None:
    def part(backend: str, to_output: float) -> dict[str, Any]:
        return {"state_backend": backend,
                "duration_by_size": [{"state_mb": 200, "bytes": 150_000_000,
                                      "duration_s": 1.5, "path": "x"}],
                "recovery": {"checkpoint_bytes": 150_000_000, "to_noticed_s": 0.5,
                             "to_running_s": 2.0, "to_output_s": to_output,
                             "tasks_rss_mb": 700.0}}

    results = {"by_backend": {"memory": part("memory", 3.0), "rocksdb": part("rocksdb", 4.0)},
               "machine": {"cpus": 2, "loadavg_at_start": [1.0, 1, 1],
                           "loadavg_at_end": [2.0, 1, 1]}}
    md = recovery.markdown(results)
    # results without a restart mode are of the one way there was: every task a new actor;
    # without the state's size (results from before it was recorded): "-"
    assert "| memory | new | - | 150 MB | 0.50 | 2.00 | 3.00 | 700 |" in md
    assert "| rocksdb | new | - | 150 MB | 0.50 | 2.00 | 4.00 | 700 |" in md
    assert "| rocksdb | 200 MB | 150,000,000 | 1.50 |" in md
    path = str(tmp_path / "r.png")
    recovery.plot(results, path)
    assert os.path.getsize(path) > 10_000
    one = {**part("memory", 3.0), "machine": results["machine"]}  # one backend: old layout
    assert "| memory | new | - | 150 MB |" in recovery.markdown(one)
    # --restart-modes: one row per mode, each drawn
    modes = [{**part("memory", t)["recovery"], "mode": m, "state_bytes": 1_500_000_000}
             for m, t in (("new", 3.0), ("reuse", 1.0), ("standby", 0.6))]
    several = {**one, "recovery": {**modes[0], "modes": modes}}
    md = recovery.markdown(several)
    assert "| memory | reuse | 1,500 MB | 150 MB | 0.50 | 2.00 | 1.00 | 700 |" in md
    assert "| memory | standby | 1,500 MB | 150 MB | 0.50 | 2.00 | 0.60 | 700 |" in md
    recovery.plot(several, path)
    assert os.path.getsize(path) > 10_000
    args = types.SimpleNamespace(state_backend="rocksdb", state_dir=None, state_memory_mb=None)
    assert cli.state_fields(args, "rocksdb") == {"state_backend": "rocksdb"}
