"""``examples/papers/megaphone.py --quick`` end to end on real Ray, as its own process (its
own local Ray): results.json, summary.md and the PNG are written; on Q7, Q8 and every sweep
point each strategy (all-at-once, batched, fluid) migrated the operator out and back with a
report, the latency timeline has records, the bin-count runs measured latency percentiles,
and the largest sweep job has an RSS series. Never their values: it is a benchmark. Several
minutes on two cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAIN = ("all-at-once", "batched", "fluid")


def _migrated(job: dict, moved: int, where: str) -> None:
    assert job["status"] == "ok", (where, job.get("reason"))
    by = {(m["strategy"], m["direction"]): m for m in job["migrations"]}
    assert set(by) == {(s, d) for s in MAIN for d in ("out", "back")}, where
    for (s, d), m in by.items():
        assert m["status"] == "ok", (where, s, d, m.get("reason"))
        assert m["report"]["key_groups_moved"] == moved, (where, s, d)
        assert m["report"]["completed_at"] >= m["requested_at"] > 0, (where, s, d)
        assert m["duration_s"] > 0 and m["max_latency_ms"] is not None, (where, s, d)
    assert any(x["count"] for x in job["timeline"]), where
    assert job["level_ms"] is not None, where


def test_quick_run_migrates_every_way_and_writes_the_figures(tmp_path) -> None:
    out = tmp_path / "megaphone"
    env = dict(os.environ, RAY_ADDRESS="local")  # the script's own Ray
    subprocess.run([sys.executable, os.path.join(ROOT, "examples", "papers", "megaphone.py"),
                    "--quick", "--out", str(out)], check=True, cwd=ROOT, timeout=2400, env=env)
    assert {p.name for p in out.iterdir()} >= {"results.json", "summary.md", "megaphone.png"}
    assert (out / "megaphone.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = json.loads((out / "results.json").read_text())
    assert r["command"].startswith("python examples/papers/megaphone.py --quick")
    assert len(r["machine"]["loadavg_at_end"]) == 3 and r["total_seconds"] > 0
    for q in ("q7", "q8"):
        d = r["nexmark"][q]
        assert len(d["jobs"]) == 1
        _migrated(d["jobs"][0], d["moved"], q)
        assert set(d["medians"]) == set(MAIN)
    bins = r["bins"]["medians"]
    assert any(not m["live_rescaling"] for m in bins.values())
    for name, m in bins.items():
        assert m["runs"] == 1 and m["p99_ms"] > 0 and m["p50_ms"] <= m["p99_ms"], name
    points = r["sweep"]["points"]
    assert {f for p in points for f in p["figures"]} >= {"fig16", "fig17"}
    for p in points:
        _migrated(p["job"], p["moved"], f"{p['bins']} bins {p['keys']} keys")
    mem = r["sweep"]["memory_point"]
    big = next(p for p in points if (p["bins"], p["keys"]) == (mem["bins"], mem["keys"]))
    series = big["job"]["rss_series"]
    assert series and any(n.startswith("agg/") for n in series["per_process_mb"])
    assert all(m.get("memory", {}).get("max_rise_process") for m in big["job"]["migrations"])
    summary = (out / "summary.md").read_text()
    assert "| paper |" in summary and "Fig. 19" in summary and "Fig. 12" in summary
