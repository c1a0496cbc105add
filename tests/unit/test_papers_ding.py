"""``examples/papers/ding.py --quick`` (pure computations, no Ray): it writes results.json,
summary.md and the PNG, and its figures are plausible (shares of the state within 0-100 %,
one row per θ, γ and key-group count, a verdict in every summary row). Never their values:
it is a benchmark."""

from __future__ import annotations

import json
import math

from examples.papers import ding


def _share(x: float) -> bool:
    return math.isfinite(x) and 0 <= x <= 100


def test_a_quick_run_writes_the_files_and_plausible_figures(tmp_path) -> None:
    out = tmp_path / "ding"
    assert ding.main(["--quick", "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} >= {"results.json", "summary.md", "ding.png"}
    assert (out / "ding.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = json.loads((out / "results.json").read_text())
    assert r["command"].startswith("python examples/papers/ding.py --quick")
    assert len(r["steps"]) == r["config"]["migrations"] + 1
    assert all(8 <= n <= 16 for n in r["steps"])
    assert len(r["theta"]) == len(ding.THETAS) * len(ding.SKEWS)
    for row in r["theta"]:
        assert all(_share(row[k]) for k in ("uniform", "consistent-hashing", "ssm"))
        assert row["ssm_cpu_ms_median"] >= 0
    assert [row["key_groups"] for row in r["tasks"]] == [32, 64]
    mt = r["mtm"]
    assert [row["gamma"] for row in mt["by_gamma"]] == list(ding.GAMMAS)
    assert all(_share(row["mtm"]) for row in mt["by_gamma"])
    assert all(_share(row[k]) for row in mt["by_theta"]
               for k in ("ssm", "ssm over units", "mtm", "oms over units"))
    assert {len(v) for v in mt["bytes"].values()} == {len(mt["steps"]) - 1}
    assert mt["pmc_spark"] is None  # --quick: PMC in this process only
    summary = (out / "summary.md").read_text()
    rows = [line for line in summary.splitlines() if line.startswith("| Fig.")
            or line.startswith("| §")]
    assert len(rows) >= 10
    assert all(line.rstrip(" |").rsplit("|", 1)[1].strip() for line in rows)  # a verdict


def test_the_trace_migrates_within_its_range_and_the_mtm_rows_sum_to_one() -> None:
    history, steps = ding.trace(8, 16, 30, seed=3)
    assert len(steps) == 31 and all(a != b for a, b in zip(steps, steps[1:], strict=False))
    m = ding.fit_mtm(history, 8, 16)
    assert m.parallelisms == tuple(range(8, 17))
    assert all(abs(sum(r) - 1) < 1e-9 for r in m.probabilities)
