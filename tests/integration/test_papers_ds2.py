"""``examples/papers/ds2.py --quick`` end to end on real Ray, as its own process (it starts
and stops its own local Ray, as a user's run does): results.json, summary.md and the PNG are
written, every run ran under DS2 and DS2 carried out at least one rescale, each step read
from its decision records. Never their values (how many steps, where it ended): it is a
benchmark. A few minutes on two cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_quick_run_writes_the_decisions_from_both_starts(tmp_path) -> None:
    out = tmp_path / "ds2"
    subprocess.run([sys.executable, os.path.join(ROOT, "examples", "papers", "ds2.py"),
                    "--quick", "--runs", "cpu:1,cpu:8", "--out", str(out)], check=True,
                   cwd=ROOT, timeout=1800)
    assert {p.name for p in out.iterdir()} >= {"results.json", "summary.md", "ds2.png"}
    assert (out / "ds2.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = json.loads((out / "results.json").read_text())
    assert r["command"].startswith("python examples/papers/ds2.py --quick")
    assert len(r["machine"]["loadavg_at_end"]) == 3 and r["total_seconds"] > 0
    assert [(x["variant"], x["start_p"]) for x in r["runs"]] == [("cpu", 1), ("cpu", 8)]
    for x in r["runs"]:
        assert x["status"] == "ok", x.get("reason")
        assert x["samples"] and all(s["t"] >= 0 for s in x["samples"])
        assert x["decisions"], "DS2 recorded no decision at all"
        assert x["parallelisms"][0] == x["start_p"]
        for s in x["steps"]:
            assert s["from"] >= 1 and s["to"] >= 1 and s["reason"].startswith("ds2:")
    # a run without any rescale proves nothing about convergence: DS2 carried one out, or
    # one it decided failed or was still running at the end (on a loaded machine a rescale
    # of a saturated task took minutes)
    assert any(x["steps"] or x["missed"] or x["in_flight"] for x in r["runs"]), \
        [x["no_change_reasons"] for x in r["runs"]]
    summary = (out / "summary.md").read_text()
    assert "| paper |" in summary and "issue 32 item 6" in summary
