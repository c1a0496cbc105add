"""``examples/papers/spacker.py --quick`` end to end on real Ray, as its own process (it
starts and stops its own local Ray, as a user's run does): results.json, summary.md and the
PNG are written, every strategy and sweep setting ran a rescale that moved state, and the
figures are plausible. Never their values: it is a benchmark. Several minutes on two cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_quick_run_writes_table_ii_and_the_sweeps(tmp_path) -> None:
    out = tmp_path / "spacker"
    subprocess.run([sys.executable, os.path.join(ROOT, "examples", "papers", "spacker.py"),
                    "--quick", "--out", str(out)], check=True, cwd=ROOT, timeout=1800)
    assert {p.name for p in out.iterdir()} >= {"results.json", "summary.md", "spacker.png"}
    assert (out / "spacker.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = json.loads((out / "results.json").read_text())
    assert r["command"].startswith("python examples/papers/spacker.py --quick")
    assert len(r["machine"]["loadavg_at_end"]) == 3 and r["total_seconds"] > 0
    # Table II: each strategy ran every scaling action, each of which moved state
    runs = r["table2"]["runs"]
    assert {x["strategy"] for x in runs} == {"spacker", "all-at-once", "progressive",
                                             "replication"}
    seq = r["config"]["sequence_list"]
    for x in runs:
        assert x["status"] == "ok", x.get("reason")
        assert [(a["old_parallelism"], a["new_parallelism"]) for a in x["actions"]] == list(
            zip(seq, seq[1:], strict=False))
        assert all(a["key_groups_moved"] > 0 and a["bytes_moved"] > 0 for a in x["actions"])
        assert x["convergence_s"] > 0 and x["peak_ms"] > 0 and x["spike_count"] >= 0
    steps = {x["strategy"]: [a["steps"] for a in x["actions"]] for x in runs}
    assert all(s == 1 for s in steps["all-at-once"])
    assert steps["progressive"] == [a["key_groups_moved"] for x in runs
                                    if x["strategy"] == "progressive" for a in x["actions"]]
    repl = next(x for x in runs if x["strategy"] == "replication")
    assert repl["replication_bytes"] > 0 and repl["replication_ms"] > 0
    # the sweeps: one rescale per setting, each moved state
    for part, res in r["sweeps"].items():
        assert {x["setting"] for x in res["runs"]} == set(r["config"]["sweep_settings"][part])
        for x in res["runs"]:
            assert x["status"] == "ok", (part, x.get("reason"))
            assert x["report"]["key_groups_moved"] > 0 and x["report"]["bytes_moved"] > 0
    summary = (out / "summary.md").read_text()
    rows = [line for line in summary.splitlines()
            if line.startswith(("| Table II", "| Spacker", "| ...", "| all-at-once and",
                                "| Fig.", "| §"))]
    assert len(rows) >= 4 + 5 + 3
    assert all(line.rstrip(" |").rsplit("|", 1)[1].strip() for line in rows)  # a verdict
