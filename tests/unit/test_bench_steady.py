"""The steady bench's reference loops do the work they claim: the floor (the rows job's own
work, no engine) counts every record once and ends with the ceiling's keys."""

from __future__ import annotations

import pytest

from examples.bench import steady


def test_floor_counts_the_same_records_and_keys_as_the_ceiling() -> None:
    floor = steady.measure_floor(20_000, 1000, 128, repeats=1)
    ceiling = steady.measure_ceiling(20_000, repeats=1)
    assert floor["records"] == ceiling["records"] == 20_000
    assert floor["distinct_keys"] == ceiling["distinct_keys"] > 1000
    assert floor["throughput"] > 0


def test_the_stall_trace_puts_each_second_s_evidence_beside_its_latency() -> None:
    from examples.bench.harness import stalls

    latency = [{"second": 100, "count": 10, "p50_ms": 5.0, "p99_ms": 9.0, "max_ms": 9.5},
               {"second": 101, "count": 10, "p50_ms": 6.0, "p99_ms": 80.0, "max_ms": 90.0}]
    # [wall s, machine busy CPU s, {process: [cpu s, run-queue wait s]}] every 0.5 s
    samples = [[100.0, 10.0, {"count0": [1.0, 0.0]}],
               [100.5, 10.4, {"count0": [1.2, 0.01]}],
               [101.0, 10.8, {"count0": [1.4, 0.01]}],
               [101.5, 11.6, {"count0": [1.5, 0.06]}]]
    probes = [{"label": "sink0", "events": [[101.2, "gc", 30.0, "gen 2", 4.0],
                                            [101.7, "gc", 12.0, "gen 1", 11.0],
                                            [101.3, "late", 40.0, None],
                                            [99.0, "gc", 50.0, None]]}]
    rows = stalls.per_second(latency, samples, probes)
    assert [r["second"] for r in rows] == [100, 101]
    assert rows[0]["count0.cpu_ms"] == pytest.approx(200.0) and "sink0.gc" not in rows[0]
    assert rows[0]["other_ms"] == pytest.approx(200.0)  # 400 ms busy, 200 the count task's
    r = rows[1]
    assert (r["count0.cpu_ms"], r["count0.wait_ms"]) == (pytest.approx(300.0),
                                                         pytest.approx(50.0))
    assert (r["sink0.gc"], r["sink0.gc_max"], r["sink0.late_max"]) == (42.0, 30.0, 40.0)
    assert r["sink0.gc_cpu_max"] == 11.0 and "sink0.late_cpu_max" not in r
    assert stalls.worst(rows, 1) == [r]
    assert steady._label("j1/count/0/g3") == "count0" and steady._label("j1/gen/0/g1") == "source0"


@pytest.mark.parametrize("p", [1, 2])
def test_the_in_process_driver_runs_the_job_to_its_end_and_splits_cpu_by_task(p) -> None:
    """``--inproc`` (harness/inproc.py): the real cores of the rows job, no Ray; every record
    reaches the sink and both tasks' CPU is counted."""
    from examples.bench.harness import inproc

    sources, counts, config = inproc.build_cores(p, 5_000)
    assert len(sources) == 1 and len(counts) == p and config.metrics_port is None
    r = inproc.run(p, 5_000)
    assert r["records"] == r["records_at_count_tasks"] == 5_000 and r["frames"] >= 5
    assert r["source_us"] > 0 and r["count_us"] > 0
    assert r["total_us"] == pytest.approx(r["source_us"] + r["count_us"])
