"""The scale benchmark (``examples/bench/scale.py``): its output check, its expected counts
and its summary's verdict, on synthetic results (no Ray)."""

from __future__ import annotations

from typing import Any

from examples.bench import scale
from examples.bench.harness import jobs


def test_the_output_check_accepts_exact_per_key_sequences_only() -> None:
    expected = {1: 2, 2: 1}
    ok = scale.check_output([(1, 1), (2, 1), (1, 2)], expected)
    assert ok["exact"] and ok["records_out"] == 3 and not ok["problems"]
    dup = scale.check_output([(1, 1), (1, 1), (2, 1), (1, 2)], expected)
    assert not dup["exact"] and "key 1: 1 after 1" in dup["problems"]
    lost = scale.check_output([(1, 1), (1, 2)], expected)
    assert not lost["exact"] and any("key 2" in p for p in lost["problems"])
    gap = scale.check_output([(1, 2), (2, 1)], expected)
    assert not gap["exact"]
    extra = scale.check_output([(1, 1), (2, 1), (1, 2), (9, 1)], expected)
    assert not extra["exact"] and any("never emitted" in p for p in extra["problems"])


def test_expected_counts_follow_the_generator_sequence() -> None:
    counts = scale.expected_counts(5_000, 300)
    assert sum(counts.values()) == 5_000
    seq = jobs.generator_keys(5_000, keys=300, zipf=None)
    assert counts[int(seq[0])] == int((seq == seq[0]).sum())


def _results(*, exact: bool = True, moved: bool = True, to: int = 6, tasks_mb: float = 2000,
             ) -> dict[str, Any]:
    peak = {"op_mb": tasks_mb - 200, "tasks_mb": tasks_mb, "total_mb": tasks_mb + 150,
            "largest_mb": 400}
    return {"command": "python examples/bench/scale.py",
            "machine": {"cpus": 2, "loadavg_at_start": [1.0], "loadavg_at_end": [2.0]},
            "config": {"quick": False, "keys": 100, "parallelism": 4, "to": to,
                       "protocol": "drrs", "state_gb": 5.0},
            "run": {"status": "finished", "records": 600, "seconds": 10.0,
                    "records_per_s": 60.0, "bytes_per_key": 50_000_000, "state_bytes": 10**9,
                    "rss": {"peak": peak, "samples": []},
                    "timeline": [{"t": 1.0, "records_in": 5, "state_mb": 1.0,
                                  "disk_mb": 4900.0}],
                    "rescaled_at": 5.0 if to else None,
                    "report": {"duration_s": 2.0, "bytes_moved": 10**9, "mb_per_s": 500.0,
                               "key_groups_moved": 40} if to else None,
                    "verdict": {"exact": exact, "records_out": 600, "records_expected": 600,
                                "keys_out": 100, "problems": [] if exact else ["key 3: 2"],
                                "moved_state": moved}}}


def test_the_summary_passes_an_exact_run_that_moved_state() -> None:
    text = scale.summary(_results())
    assert "**Verdict: PASS**" in text and "within 3 GB" in text
    assert "5.00 GB" in text  # 100 keys seen x 50 MB of padding


def test_the_summary_fails_a_run_that_moved_nothing_or_lost_records() -> None:
    assert "**Verdict: FAIL**" in scale.summary(_results(moved=False))
    assert "**Verdict: FAIL**" in scale.summary(_results(exact=False))
    assert "above 3 GB" in scale.summary(_results(tasks_mb=3500))
    # a run asked for no rescale says so rather than claiming a migration
    assert "no rescale was asked" in scale.summary(_results(to=0, moved=False))
