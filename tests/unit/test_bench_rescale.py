"""The pure timeline helpers of the rescale benchmark (examples/bench/timeline.py), on
synthetic series: no Ray. The end-to-end benchmark run is marked slow."""

from __future__ import annotations

import pytest

from examples.bench import timeline as tl


def sec(s: int, mean: float | None, count: int = 100, p99: float | None = None,
        mx: float | None = None) -> dict:
    if mean is None:
        return tl.empty_row(s)
    return {"second": s, "count": count, "mean_ms": mean,
            "p99_ms": mean * 2 if p99 is None else p99, "max_ms": mean * 3 if mx is None else mx}


def series(means: list[float | None], start: int = 100, counts: list[int] | None = None) -> list:
    counts = counts or [100] * len(means)
    return [sec(start + i, m, c) for i, (m, c) in enumerate(zip(means, counts, strict=True))
            if m is not None]


# ------------------------------------------------------------------------------ series


def test_dense_fills_missing_seconds() -> None:
    rows = series([10, None, 12], start=5)
    d = tl.dense(rows, 4, 9)
    assert [r["second"] for r in d] == [4, 5, 6, 7, 8]
    assert [r["count"] for r in d] == [0, 100, 0, 100, 0]
    assert d[1]["mean_ms"] == 10 and d[2]["mean_ms"] is None


def test_window_weighted_mean_level_rate() -> None:
    rows = series([10, 20, 1000, 10], counts=[100, 300, 1, 100])
    assert [r["second"] for r in tl.window(rows, 101, 103)] == [101, 102]
    # weighted by count: (10*100 + 20*300 + 1000*1 + 10*100) / 501
    assert tl.weighted_mean(rows) == pytest.approx(9000 / 501)
    assert tl.level(rows) == pytest.approx(15.0)  # median of 10, 10, 20, 1000
    assert tl.rate(rows, 100, 104) == pytest.approx(501 / 4)
    assert tl.rate(rows, 100, 106) == pytest.approx(501 / 6)  # empty seconds count
    assert tl.weighted_mean([]) is None and tl.level([]) is None and tl.rate(rows, 5, 5) is None


# ------------------------------------------------------------------------------ scaling period


def test_scaling_period_ends_at_first_stable_window() -> None:
    # request at 105, spike, back to baseline from 108 on
    means = [10] * 5 + [10, 300, 50, 10, 10.5, 11, 10, 10, 10]
    rows = series(means)
    p = tl.scaling_period(rows, 105, 105, 10.0, 114, tolerance=1.1, stable_s=3)
    assert (p.start, p.end, p.seconds, p.stabilized) == (105, 108, 3, True)
    assert p.limit_ms == pytest.approx(11.0)


def test_scaling_period_waits_for_completion() -> None:
    rows = series([10] * 14)  # latency never moved, but the rescale completed at 109
    p = tl.scaling_period(rows, 105, 109, 10.0, 114, stable_s=3)
    assert (p.end, p.stabilized) == (109, True)


def test_scaling_period_at_least_the_request_second() -> None:
    rows = series([10] * 14)
    p = tl.scaling_period(rows, 105, 105, 10.0, 114, stable_s=3)
    assert (p.start, p.end, p.seconds) == (105, 106, 1)


def test_scaling_period_capped_when_never_stable() -> None:
    rows = series([10] * 5 + [100, 12, 10, 12, 10, 12, 10])  # alternates above 11 ms
    p = tl.scaling_period(rows, 105, 105, 10.0, 112, stable_s=3)
    assert (p.end, p.seconds, p.stabilized) == (112, 7, False)
    # a window must fit before the end of the run: the last two seconds are not enough
    rows = series([10] * 5 + [100] * 5 + [10, 10])
    assert not tl.scaling_period(rows, 105, 105, 10.0, 112, stable_s=3).stabilized


def test_scaling_period_slack_and_tolerance() -> None:
    rows = series([10] * 5 + [100, 14, 14, 14, 14])
    assert not tl.scaling_period(rows, 105, 105, 10.0, 110, stable_s=3).stabilized
    p = tl.scaling_period(rows, 105, 105, 10.0, 110, stable_s=3, slack_ms=5)
    assert (p.end, p.stabilized, p.limit_ms) == (106, True, pytest.approx(16.0))
    p = tl.scaling_period(rows, 105, 105, 10.0, 110, stable_s=3, tolerance=1.5)
    assert p.end == 106


def test_scaling_period_empty_seconds() -> None:
    rows = series([10] * 5 + [100, None, 10, None, 10, 10])  # sparse window results
    strict = tl.scaling_period(rows, 105, 105, 10.0, 111, stable_s=3)
    assert strict.end == 111 and not strict.stabilized  # no 3 s without a gap
    sparse = tl.scaling_period(rows, 105, 105, 10.0, 111, stable_s=3, empty_ok=True)
    assert (sparse.end, sparse.stabilized) == (106, True)
    # a window of empty seconds only is not stable
    rows = series([10] * 5 + [100, None, None, None])
    assert not tl.scaling_period(rows, 105, 105, 10.0, 109, stable_s=3, empty_ok=True).stabilized


def test_scaling_period_without_baseline() -> None:
    p = tl.scaling_period([], 105, 107, None, 110)
    assert (p.end, p.stabilized, p.limit_ms) == (110, False, None)
    assert p.as_dict()["seconds"] == 5


# ------------------------------------------------------------------------------ peaks, dip


def test_peaks() -> None:
    rows = [sec(1, 10, p99=30, mx=50), sec(2, 40, p99=90, mx=400), sec(3, 80, p99=85, mx=120),
            tl.empty_row(4)]
    assert tl.peaks(rows) == {"max_ms": 400, "p99_ms": 90, "mean_ms": 80}
    assert tl.peaks([]) == {"max_ms": None, "p99_ms": None, "mean_ms": None}


def test_throughput_dip() -> None:
    rows = series([10] * 6, counts=[1000, 1000, 400, 1600, 1000, 1000])
    d = tl.throughput_dip(rows, 102, 105, 1000.0)
    assert (d["min_per_s"], d["second"], d["ratio"]) == (400, 102, pytest.approx(0.4))
    # a second without output is a dip to 0
    rows = series([10, 10, None, 10], counts=[1000, 1000, 0, 1000])
    d = tl.throughput_dip(rows, 100, 104, 1000.0)
    assert (d["min_per_s"], d["second"], d["ratio"]) == (0, 102, 0.0)
    assert tl.throughput_dip(rows, 100, 100, 1000.0)["ratio"] is None
    assert tl.throughput_dip(rows, 100, 104, None)["ratio"] is None


# ------------------------------------------------------------------------------ gaps


def test_add_write_segments() -> None:
    segs: list[list[float]] = []
    for t in (1.0, 1.01, 1.05, 1.2, 1.21, 3.0):
        tl.add_write(segs, t, 0.05)
    assert segs == [[1.0, 1.05], [1.2, 1.21], [3.0, 3.0]]


def test_longest_gap_across_writers() -> None:
    # two writers: the union has gaps 2.0-2.5 and 4.0-7.0; before 1.0 nothing
    a = [[1.0, 2.0], [7.0, 8.0]]
    b = [[1.5, 1.9], [2.5, 4.0]]
    g = tl.longest_gap(a + b, 0.5, 8.0)
    assert g == {"gap_s": pytest.approx(3.0), "from": 4.0, "to": 7.0}
    # only the gaps that overlap the span count (full length)
    g = tl.longest_gap(a + b, 1.0, 3.0)
    assert (g["gap_s"], g["from"], g["to"]) == (pytest.approx(0.5), 2.0, 2.5)
    g = tl.longest_gap(a + b, 5.0, 5.5)
    assert g["gap_s"] == pytest.approx(3.0)


def test_longest_gap_edges() -> None:
    assert tl.longest_gap([], 1.0, 4.0) == {"gap_s": 3.0, "from": 1.0, "to": 4.0}
    # output stops at 2.0 and never resumes within the span: the gap runs to its end
    assert tl.longest_gap([[0.0, 2.0]], 1.0, 5.0)["gap_s"] == pytest.approx(3.0)
    # no output before the first segment: from the span start
    assert tl.longest_gap([[3.0, 5.0]], 1.0, 5.0)["gap_s"] == pytest.approx(2.0)
    # continuous output: no gap
    assert tl.longest_gap([[0.0, 10.0]], 1.0, 5.0)["gap_s"] == 0.0
    assert tl.merge_segments([[3, 4], [1, 2], [1.5, 3.5]]) == [(1.0, 4.0)]


# ------------------------------------------------------------------------------ numbers


def test_percentile_and_ratio() -> None:
    xs = [5, 1, 4, 2, 3]
    assert tl.percentile(xs, 0.0) == 1 and tl.percentile(xs, 1.0) == 5
    assert tl.percentile(xs, 0.5) == 3 and tl.median([1, 2, 3, 4]) == 2.5
    assert tl.percentile(range(101), 0.99) == pytest.approx(99.0)
    assert tl.percentile([1, 2], 0.25) == pytest.approx(1.25)
    assert tl.percentile([], 0.5) is None
    with pytest.raises(ValueError):
        tl.percentile(xs, 99)
    assert tl.ratio(1, 4) == 0.25 and tl.ratio(None, 4) is None and tl.ratio(1, 0) is None


# ------------------------------------------------------------------------------ assignment


def test_balanced_assignment_evens_load_with_few_moves() -> None:
    loads = [1.0] * 16
    loads[0] = loads[1] = 6.0  # both hot groups on task 0 of a contiguous assignment
    cur = tuple(g * 4 // 16 for g in range(16))
    assert tl.imbalance(loads, cur, 4) == pytest.approx(14 / 6.5)
    new = tl.balanced_assignment(loads, cur, 4)
    assert len(new) == 16 and set(new) == {0, 1, 2, 3}
    assert tl.imbalance(loads, new, 4) < 1.1
    moved = sum(a != b for a, b in zip(cur, new, strict=True))
    assert moved <= 6  # 4 is the least possible here; a fresh balanced layout moves more
    assert tl.balanced_assignment(loads, cur, 4) == new  # deterministic


def test_balanced_assignment_changes_parallelism() -> None:
    loads = [float(g % 5 + 1) for g in range(32)]
    cur = tuple(g * 2 // 32 for g in range(32))
    out = tl.balanced_assignment(loads, cur, 3)  # scale out: task 2 gets groups
    assert set(out) == {0, 1, 2} and tl.imbalance(loads, out, 3) < 1.1
    cur8 = tuple(g * 8 // 32 for g in range(32))
    inn = tl.balanced_assignment(loads, cur8, 4)  # scale in: tasks 4..7 give everything up
    assert set(inn) == {0, 1, 2, 3} and tl.imbalance(loads, inn, 4) < 1.1
    # a group on a surviving task stays there unless it must move
    assert all(inn[g] == cur8[g] for g in range(32) if cur8[g] < 4 and inn[g] == cur8[g])
    # every task keeps a group even with zero load
    z = tl.balanced_assignment([0.0] * 8, tuple([0] * 8), 4)
    assert set(z) == {0, 1, 2, 3}


def test_group_and_task_loads() -> None:
    loads = tl.group_loads({"a": 2, "b": 3, "c": 0}, lambda k: {"a": 0, "b": 1, "c": 1}[k], 3)
    assert loads == [2.0, 3.0, 0.0]
    assert tl.group_loads([1, 1, 1, 1], lambda k: k % 2, 2) == [2.0, 2.0]
    assert tl.task_loads([1.0, 2.0, 3.0], (0, 1, 0), 2) == [4.0, 2.0]
    assert tl.imbalance([0.0, 0.0], (0, 1), 2) is None


# ------------------------------------------------------------------------------ end to end


@pytest.mark.slow
@pytest.mark.ray
def test_summary_ratios_against_the_none_run_and_the_runs_own_baseline() -> None:
    from examples.bench import rescale

    results = {"runs": [
        {"protocol": "none", "status": "ok", "post_request": {"mean_ms": 40.0},
         "period": {"mean_ms": 41.0}, "baseline": {"mean_ms": 39.0}},
        {"protocol": "drrs", "status": "ok", "period": {"mean_ms": 60.0},
         "baseline": {"mean_ms": 30.0}},
        {"protocol": "fluid", "status": "failed"},
    ]}
    rescale.summarise(results)
    r = results["ratios"]
    assert r["drrs scaling-period mean / no-rescale mean"] == pytest.approx(1.5)
    assert r["drrs scaling-period mean / its own baseline mean"] == pytest.approx(2.0)
    assert results["no_rescale_mean_ms"] == 40.0
    assert not any(k.startswith(("none ", "fluid ")) for k in r)


class _FakeTime:
    """A clock whose sleeps overrun by ``overrun`` seconds (a busy machine waking late)."""

    def __init__(self, overrun: float) -> None:
        self.now, self.overrun, self.requested = 0.0, overrun, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, d: float) -> None:
        self.requested.append(d)
        self.now += d + self.overrun


class _State:
    def __init__(self, default) -> None:
        self.v = default

    def value(self):
        return self.v

    def update(self, v) -> None:
        self.v = v


class _Ctx:
    key = 7

    def value_state(self, name, default):
        return _State(default)


@pytest.mark.parametrize("overrun", [0.0, 0.0003, 0.003])
def test_padded_count_service_time_does_not_grow_with_late_wakeups(monkeypatch, overrun) -> None:
    from examples.bench import rescale

    clock = _FakeTime(overrun)
    monkeypatch.setattr(rescale, "time", clock)
    f = rescale.PaddedCount(service_us=1000)
    f.open(_Ctx())
    outs = [next(iter(f.process_element((7, 0, 16), _Ctx()))) for _ in range(1000)]
    assert outs[-1] == (7, 1000)
    # 1000 records at 1 ms each: 1 s of wall time, whatever the overrun (within the credit
    # cap and one record), where sleeping 1 ms per record would take 1000 * (1 ms + overrun)
    assert clock.now == pytest.approx(1.0, abs=rescale.PaddedCount.MAX_CREDIT_S + 0.001)
    assert all(d >= 0.001 for d in clock.requested)


def test_quick_benchmark_end_to_end(tmp_path) -> None:
    import json

    from examples.bench import rescale

    assert rescale.main(["--quick", "--protocols", "drrs,no-such-protocol", "--no-overhead",
                         "--from", "2", "--to", "3",  # a replica needs a task besides the owner
                         "--replication-cost", "--replication-seconds", "3",
                         "--replication-period", "1", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    runs = {r["protocol"]: r for r in res["runs"]}
    assert runs["none"]["status"] == "ok" and runs["drrs"]["status"] == "ok"
    assert runs["no-such-protocol"]["status"] == "skipped"
    assert runs["drrs"]["report"]["key_groups_moved"] > 0
    assert res["config"]["linger_ms"] == rescale.LINGER_MS
    assert "at once" in runs["drrs"]["report"]["planning_reason"]
    # replication cost: read from the job's Prometheus endpoint, nothing copied without it
    rc = {r["policy"]: r for r in res["replication_cost"]["runs"]}
    assert set(rc) == set(rescale.REPLICATION_POLICIES)
    assert rc["none"]["replication_bytes"] == 0
    assert rc["all"]["replication_bytes"] > rc["hot"]["replication_bytes"] > 0
    assert "Replication cost in steady state" in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "summary.md").exists() and (tmp_path / "timeline.png").exists()
