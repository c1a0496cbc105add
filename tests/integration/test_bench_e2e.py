"""The benchmarks' quick modes end to end: each script runs as its own process (it starts and
stops its own local Ray, as a user's run does) on real Ray, and its ``results.json``, summary
and PNG are checked. Minutes each on a two-core machine; the ones not run in CI are slow."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.ray

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def bench(name: str, out: str, *args: str, timeout: float = 900) -> dict:
    """Run ``examples/bench/<name>.py --quick --out <out> <args>`` to its end; its results."""
    subprocess.run([sys.executable, os.path.join(ROOT, "examples", "bench", f"{name}.py"),
                    "--quick", "--out", out, *args], check=True, cwd=ROOT, timeout=timeout)
    with open(os.path.join(out, "results.json")) as f:
        res = json.load(f)
    assert res["command"].startswith(f"python examples/bench/{name}.py --quick")
    assert res["code"]["commit"] and res["code_at_end"]["engine_sha256"]
    assert len(res["machine"]["loadavg_at_end"]) == 3 and res["total_seconds"] > 0
    return res


def test_quick_benchmark_end_to_end(tmp_path) -> None:
    out = str(tmp_path)
    res = bench("rescale", out, "--protocols", "drrs,no-such-protocol", "--no-overhead",
                "--from", "2", "--to", "3",  # a replica needs a task besides the owner
                "--replication-cost", "--replication-seconds", "3",
                "--replication-period", "1", "--coverage", "0.9", "--plot-mean")
    runs = {r["protocol"]: r for r in res["runs"]}
    assert runs["none"]["status"] == "ok" and runs["drrs"]["status"] == "ok"
    assert runs["no-such-protocol"]["status"] == "skipped"
    drrs = runs["drrs"]
    assert drrs["report"]["key_groups_moved"] > 0 and drrs["report"]["bytes_moved"] > 0
    assert res["config"]["linger_ms"] == 15.0 and res["config"]["coverage"] == 0.9
    assert res["scenario"]["keys_built"] >= 0.9 * res["config"]["keys"]
    assert "at once" in drrs["report"]["planning_reason"]
    assert drrs["baseline"]["count"] > 0 and drrs["period"]["p99_ms"] is not None
    assert drrs["tail"]["count"] > 0 and drrs["timeline"]
    assert "drrs scaling-period mean / no-rescale mean" in res["ratios"]
    # replication cost: read from the job's Prometheus endpoint, nothing copied without it
    rc = {r["policy"]: r for r in res["replication_cost"]["runs"]}
    assert set(rc) == {"none", "hot", "all"}
    assert rc["none"]["replication_bytes"] == 0
    # bytes grow with the time measured and the refreshes in it (both vary with the load);
    # which key groups have a replica does not
    assert rc["hot"]["replication_bytes"] > 0 and rc["all"]["replication_bytes"] > 0
    assert rc["all"]["replicated_key_groups"] > rc["hot"]["replicated_key_groups"] > 0
    assert rc["none"]["replicated_key_groups"] == 0
    summary = (tmp_path / "summary.md").read_text()
    assert "Replication cost in steady state" in summary and "Detail:" in summary
    assert os.path.getsize(tmp_path / "timeline.png") > 10_000


@pytest.mark.slow
def test_quick_run_end_to_end(tmp_path) -> None:
    out = str(tmp_path)
    res = bench("planning", out, "--phases", "small", "--settings", "all-at-once,adaptive")
    (ph,) = res["phases"]
    assert [r["status"] for r in ph["runs"]] == ["ok", "ok"]
    assert ph["summary"]["adaptive"]["planning_reason"].startswith("adaptive:")
    assert all(r["report"]["key_groups_moved"] > 0 for r in ph["runs"])
    assert os.path.exists(os.path.join(out, "summary.md"))
    assert os.path.getsize(os.path.join(out, "planning.png")) > 10_000


@pytest.mark.slow
def test_steady_quick_end_to_end(tmp_path) -> None:
    res = bench("steady", str(tmp_path), "--parallelism", "1", "--records", "50000",
                "--columnar-records", "500000", "--duration", "4", "--warmup", "1",
                "--variants", "rows,columnar,bytewax")
    full = {r["variant"]: r for r in res["full_speed"]}
    assert full["rows"]["records_at_sink"] == 50_000 and full["rows"]["job_throughput"] > 0
    assert full["columnar"]["records_at_sink"] == 500_000
    for r in (full["rows"], full["columnar"]):
        assert r["sink_throughput"] and r["memory"]["samples"] > 0
        assert r["in_out_throughput"] > 0
    assert ("bytewax" in full) != ("bytewax" in res["skipped"])  # run, or said why not
    assert set(res["medians"]) >= {"rows p=1", "columnar p=1"}
    assert res["floor"]["records"] == 50_000 and res["floor"]["throughput"] > 0
    assert "rows p=1 records per CPU-second / floor" in res["ratios"]
    halves = {h["variant"]: h for h in res["half_load"]}
    for half in halves.values():
        assert half["records_at_sink"] == half["records_expected"] > 0
        assert half["latency_after_warmup"]["count"] > 0
    assert os.path.getsize(tmp_path / "steady.png") > 10_000


@pytest.mark.slow
def test_nexmark_quick_end_to_end(tmp_path) -> None:
    res = bench("nexmark", str(tmp_path), "--queries", "q7", "--steps", "2",
                "--generator-events", "20000")
    q = res["queries"]["q7"]
    steps = q["ladders"][0]["steps"]
    assert len(steps) == 2 and all("ok" in s for s in steps)
    assert any(s.get("count", 0) > 0 for s in steps)  # window results reached the sink
    assert res["generator"]["bids"]["records"] > 0
    assert os.path.getsize(tmp_path / "nexmark.png") > 10_000


@pytest.mark.slow
@pytest.mark.spark
def test_spark_bridge_quick_end_to_end(tmp_path) -> None:
    res = bench("spark_bridge", str(tmp_path), "--records", "20000", "--duration", "4",
                "--warmup", "1", timeout=1200)
    for mode in ("foreach_batch", "datasource"):
        assert res["spark_to_reflow"][mode]["records"] == 20_000
        assert res["latency"][mode]["rows"] > 0
    assert res["reflow_to_spark"]["spark_read_records_per_s"] > 0
    assert res["latency"]["generator"]["engine"]["count"] > 0
    assert os.path.getsize(tmp_path / "spark_bridge.png") > 10_000


@pytest.mark.slow
def test_recovery_benchmark_end_to_end(tmp_path) -> None:
    res = bench("recovery", str(tmp_path), "--records", "60000", "--keys", "2000",
                "--state-mb", "1", "2", "--rate", "4000", "--interval", "1")
    assert set(res["overhead"]["median_throughput"]) == {"off", "10 s", "1 s"}
    assert all(r["checkpoints"] >= 0 for rs in res["overhead"]["runs"].values() for r in rs)
    assert [r["state_mb"] for r in res["duration_by_size"]] == [1, 2]
    assert all(r["bytes"] > 0 and r["duration_s"] > 0 for r in res["duration_by_size"])
    rec = res["recovery"]
    assert rec["restarts"] == 1 and 0 < rec["to_noticed_s"] <= rec["to_running_s"] \
        <= rec["to_output_s"]
    assert os.path.isfile(os.path.join(str(tmp_path), "recovery.png"))


@pytest.mark.slow
def test_scale_benchmark_end_to_end(tmp_path) -> None:
    # a paced source: the input lasts long enough for the rescale asked at 10 % of it
    res = bench("scale", str(tmp_path), "--state-gb", "0.02", "--keys", "2000", "--visits",
                "20", "--rate", "4000", "--rescale-at", "0.1", "--poll", "0.5")
    run = res["run"]
    v = run["verdict"]
    assert run["status"] == "finished" and v["exact"] and v["moved_state"]
    assert v["records_out"] == run["records"] == 40_000
    assert run["report"]["bytes_moved"] > 0 and run["rss"]["peak"]["tasks_mb"] > 0
    assert run["timeline"] and "**Verdict: PASS**" in (tmp_path / "summary.md").read_text()
    assert os.path.getsize(tmp_path / "scale.png") > 10_000
