"""``examples/papers/drrs_ablation.py --quick`` end to end on local Ray: the micro job 1 -> 2
with drrs and drrs without each mechanism, and the run without rescaling. It writes
results.json, summary.md and the PNG; every variant rescaled (a run that moved nothing must
not pass) with its switches in the report; the figures are plausible (positive latencies,
the table's verdicts filled). Never their values: it is a benchmark, on a shared machine."""

from __future__ import annotations

import json

import pytest

from examples.papers import drrs_ablation

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_a_quick_run_writes_the_files_and_plausible_figures(tmp_path) -> None:
    out = tmp_path / "drrs_ablation"
    assert drrs_ablation.main(["--quick", "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} >= {"results.json", "summary.md",
                                               "drrs_ablation.png"}
    assert (out / "drrs_ablation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = json.loads((out / "results.json").read_text())
    runs = r["runs"]
    assert all(x["status"] == "ok" for x in runs), [x.get("reason") for x in runs]
    rescaled = [x for x in runs if x["protocol"] != "none"]
    assert {x["protocol"] for x in rescaled} == set(drrs_ablation.QUICK_VARIANTS)
    for x in rescaled:
        rep = x["report"]
        assert rep["key_groups_moved"] > 0 and rep["new_parallelism"] == 2
        assert sorted(rep["without"]) == sorted(drrs_ablation.VARIANTS[x["protocol"]][1])
    for v, row in r["ratios_to_drrs"].items():
        assert row["peak"] is None or row["peak"] > 0, v
    for v, m in r["medians"].items():
        assert m["peak_ms"]["median"] is None or m["peak_ms"]["median"] > 0, v
    summary = (out / "summary.md").read_text()
    rows = [line for line in summary.splitlines()
            if line.startswith("| Fig. 14") or line.startswith("| (not in the paper)")]
    assert len(rows) >= 3 + 3
    assert all(line.rstrip(" |").rsplit("|", 1)[1].strip() for line in rows)
