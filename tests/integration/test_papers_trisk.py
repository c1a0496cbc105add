"""``examples/papers/trisk.py --quick`` end to end on real Ray, as its own process (it starts
its own two-node Ray cluster on this machine and stops it): results.json, summary.md and the
PNG are written, and each of the four reconfigurations ran on its job, with a report and a
latency timeline around it. Never their values: it is a benchmark. Several minutes on two
cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_quick_run_reconfigures_four_ways(tmp_path) -> None:
    out = tmp_path / "trisk"
    env = dict(os.environ, RAY_ADDRESS="")  # the script's own cluster
    subprocess.run([sys.executable, os.path.join(ROOT, "examples", "papers", "trisk.py"),
                    "--quick", "--out", str(out)], check=True, cwd=ROOT, timeout=1800, env=env)
    assert {p.name for p in out.iterdir()} >= {"results.json", "summary.md", "trisk.png"}
    assert (out / "trisk.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = json.loads((out / "results.json").read_text())
    assert r["command"].startswith("python examples/papers/trisk.py --quick")
    assert len(r["machine"]["loadavg_at_end"]) == 3 and r["total_seconds"] > 0
    runs = {x["scenario"]: x for x in r["runs"]}
    assert set(runs) == {"load-balancing", "scaling", "change-of-logic", "placement"}
    for kind, x in runs.items():
        assert x["status"] == "ok", (kind, x.get("reason"))
        rep = x["report"]
        assert rep["completed_at"] >= rep["requested_at"] > 0, kind
        assert any(s["count"] for s in x["timeline"]), kind
        assert x["baseline"]["level_ms"] is not None, kind
    assert runs["load-balancing"]["report"]["key_groups_moved"] > 0
    assert runs["scaling"]["report"]["new_parallelism"] == \
        runs["scaling"]["report"]["old_parallelism"] + 1
    assert runs["change-of-logic"]["report"]["version"] >= 1
    assert runs["placement"]["report"]["moves"]
    assert runs["placement"]["report"]["nodes_after"] != runs["placement"]["report"][
        "nodes_before"]
    summary = (out / "summary.md").read_text()
    assert "| paper |" in summary and "Fig. 13" in summary
