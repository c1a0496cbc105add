"""The benchmark harness's rules and parts (examples/bench/harness/) and the rescale
benchmark's pure parts, on synthetic series and sink files written by hand: no Ray, no job,
no sleeps. The quick runs end to end are in tests/integration/test_bench_e2e.py."""

from __future__ import annotations

import json
import os
import types
from typing import Any

import pytest

from engine.observability.latency import LatencyHistogram
from engine.time.clock import ManualClock
from examples.bench import rescale
from examples.bench.harness import BenchError, balance, cli, jobs, provenance, render, run
from examples.bench.harness import analysis as tl


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


def test_settled_waits_for_a_draining_backlog_and_refuses_a_growing_one() -> None:
    # seconds 100..: a backlog the build left drains, then latency is flat
    draining = series([900, 600, 300, 120, 40, 25, 24, 26, 25, 27])
    assert not tl.settled(draining, 100, 103)  # falling fast
    assert not tl.settled(draining, 100, 106)  # 120, 40, 25: still falling
    assert not tl.settled(draining, 100, 107)  # 40 > 1.25 x 24 + 5
    assert tl.settled(draining, 100, 108)  # 25, 24, 26 <= 1.25 x 24 + 5
    assert not tl.settled(draining, 106, 108)  # shorter than the window
    growing = series([20, 40, 80, 160, 320, 640])
    assert not any(tl.settled(growing, 100, now) for now in range(103, 107))
    flat = series([20, 21, 19, 22])
    assert tl.settled(flat, 100, 103) and tl.settled(flat, 100, 104)
    gap = [r for r in flat if r["second"] != 102]
    assert not tl.settled(gap, 100, 103)  # a second without records
    assert not tl.settled({}, 100, 110)


def test_settled_run_also_needs_the_sources_backlog_read() -> None:
    class Handle:  # what settled_run reads: the tasks' source backlog, one metrics call
        def __init__(self, *backlogs: int | None) -> None:
            self.tasks = [types.SimpleNamespace(source_backlog=b) for b in backlogs]

        def metrics(self) -> Any:
            return self

    plateau = series([1900, 1890, 1910, 1905])  # flat, but the input waits at the source
    assert tl.settled(plateau, 100, 104)
    assert not tl.settled_run(Handle(9_000, None), plateau, 100, 104, rate=5000)
    assert tl.settled_run(Handle(400, None), plateau, 100, 104, rate=5000)  # <= 0.2 s
    assert tl.source_backlog(Handle(3, None, 4)) == 7
    assert not tl.settled_run(Handle(0), series([900, 600, 300]), 100, 103, rate=5000)


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
    with pytest.raises(BenchError, match="divide by 100"):
        tl.percentile(xs, 99)
    assert tl.ratio(1, 4) == 0.25 and tl.ratio(None, 4) is None and tl.ratio(1, 0) is None


# ------------------------------------------------------------------------------ assignment


def test_balanced_assignment_evens_load_with_few_moves() -> None:
    loads = [1.0] * 16
    loads[0] = loads[1] = 6.0  # both hot groups on task 0 of a contiguous assignment
    cur = tuple(g * 4 // 16 for g in range(16))
    assert balance.imbalance(loads, cur, 4) == pytest.approx(14 / 6.5)
    new = balance.balanced_assignment(loads, cur, 4)
    assert len(new) == 16 and set(new) == {0, 1, 2, 3}
    assert balance.imbalance(loads, new, 4) < 1.1
    moved = sum(a != b for a, b in zip(cur, new, strict=True))
    assert moved <= 6  # 4 is the least possible here; a fresh balanced layout moves more
    assert balance.balanced_assignment(loads, cur, 4) == new  # deterministic


def test_balanced_assignment_changes_parallelism() -> None:
    loads = [float(g % 5 + 1) for g in range(32)]
    cur = tuple(g * 2 // 32 for g in range(32))
    out = balance.balanced_assignment(loads, cur, 3)  # scale out: task 2 gets groups
    assert set(out) == {0, 1, 2} and balance.imbalance(loads, out, 3) < 1.1
    cur8 = tuple(g * 8 // 32 for g in range(32))
    inn = balance.balanced_assignment(loads, cur8, 4)  # scale in: tasks 4..7 give everything up
    assert set(inn) == {0, 1, 2, 3} and balance.imbalance(loads, inn, 4) < 1.1
    # a group on a surviving task stays there unless it must move
    assert all(inn[g] == cur8[g] for g in range(32) if cur8[g] < 4 and inn[g] == cur8[g])
    # every task keeps a group even with zero load
    z = balance.balanced_assignment([0.0] * 8, tuple([0] * 8), 4)
    assert set(z) == {0, 1, 2, 3}


def test_group_and_task_loads() -> None:
    loads = balance.group_loads({"a": 2, "b": 3, "c": 0}, lambda k: {"a": 0, "b": 1, "c": 1}[k], 3)
    assert loads == [2.0, 3.0, 0.0]
    assert balance.group_loads([1, 1, 1, 1], lambda k: k % 2, 2) == [2.0, 2.0]
    assert balance.task_loads([1.0, 2.0, 3.0], (0, 1, 0), 2) == [4.0, 2.0]
    assert balance.imbalance([0.0, 0.0], (0, 1), 2) is None


# ------------------------------------------------------------------------------ end to end


def test_summary_ratios_against_the_none_run_and_the_runs_own_baseline() -> None:
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
    clock = _FakeTime(overrun)
    monkeypatch.setattr(jobs, "time", clock)
    f = jobs.PaddedCount(service_us=1000)
    f.open(_Ctx())
    outs = [next(iter(f.process_element((7, 0, 16), _Ctx()))) for _ in range(1000)]
    assert outs[-1] == (7, 1000)
    # 1000 records at 1 ms each: 1 s of wall time, whatever the overrun (within the credit
    # cap and one record), where sleeping 1 ms per record would take 1000 * (1 ms + overrun)
    assert clock.now == pytest.approx(1.0, abs=jobs.PaddedCount.MAX_CREDIT_S + 0.001)
    assert all(d >= 0.001 for d in clock.requested)


# ------------------------------------------------------------------------------ histograms


def hist(*ms: float) -> LatencyHistogram:
    h = LatencyHistogram()
    h.observe_many(ms)
    return h


def test_histogram_rows_merged_and_latency_stats() -> None:
    per_s = {100: hist(10, 20, 30), 101: hist(), 102: hist(100)}
    rows = tl.histogram_rows(per_s)
    assert list(rows) == [100, 102]  # a second without records has no row
    assert rows[100]["count"] == 3 and rows[100]["mean_ms"] == pytest.approx(20.0)
    assert rows[100]["max_ms"] == 30 and rows[100]["p50_ms"] == pytest.approx(20.0, rel=0.03)
    assert tl.merged(per_s, 100, 102).count == 3  # [lo, hi)
    assert tl.merged(per_s, 101).count == 1 and tl.merged(per_s).count == 4
    st = tl.latency_stats(tl.merged(per_s), (0.5, 0.9, 0.999), digits=1)
    assert set(st) == {"count", "mean_ms", "max_ms", "p50_ms", "p90_ms", "p999_ms"}
    assert (st["count"], st["mean_ms"], st["max_ms"]) == (4, 40.0, 100.0)
    assert tl.latency_stats(LatencyHistogram()) == {
        "count": 0, "mean_ms": None, "max_ms": None, "p50_ms": None, "p99_ms": None}


def test_measure_settle_tail_and_spike() -> None:
    # baseline 10 ms; the rescale at 108 spikes, then latency settles at a new level of 20 ms
    rows = series([10] * 8 + [300, 50] + [20] * 8, start=100)
    m = tl.measure(rows, 108.3, 109.5, 118.0, baseline_s=8, stable_s=3, tolerance=1.1,
                   slack_ms=0.0)
    assert m["baseline"]["level_ms"] == 10 and m["baseline"]["records_per_s"] == 100
    # never back within 11 ms: the scaling period is capped; settle reaches the new level
    assert (m["period"]["end"], m["period"]["stabilized"]) == (118, False)
    assert (m["settle"]["end"], m["settle"]["stabilized"]) == (110, True)
    assert m["tail_level_ms"] == 20 and m["tail_mean_ms"] == pytest.approx(20.0)
    assert m["spike"] == pytest.approx(900 / 10) and m["baseline_spike"] == pytest.approx(3.0)
    assert m["post_request"]["records_per_s"] == pytest.approx(100.0)
    assert m["dip"]["ratio"] == pytest.approx(1.0)


def test_a_period_cannot_end_before_it_starts() -> None:
    with pytest.raises(BenchError, match="before it starts"):
        tl.Period(10, 9, True, 1.0)


def test_records_to_cover_rejects_a_percent() -> None:
    assert tl.records_to_cover([3, 3, 1, 2, 1, 0], 0.5) == 3
    with pytest.raises(BenchError, match="share of the keys"):
        tl.records_to_cover([1, 2], 99)


# ------------------------------------------------------------------------------ balance


def test_rebalance_target_evens_zipf_load() -> None:
    keys = jobs.generator_keys(50_000, keys=2_000, zipf=1.0)
    t = balance.rebalance_target(keys, 2_000, 64, 4, 4)
    assert t["imbalance_after"] < t["imbalance_before"] and t["imbalance_after"] < 1.15
    cur = tuple(g * 4 // 64 for g in range(64))
    assert t["planned_groups_moved"] == sum(a != b for a, b in zip(cur, t["assignment"],
                                                                     strict=True)) > 0
    assert sum(t["group_loads"]) == 50_000 and t["group_skew"] > 2
    fresh = balance.rebalance_target(keys, 2_000, 64, 4, 4, reshuffle=True)
    assert fresh["assignment"] == balance.lpt_assignment(t["group_loads"], 4)
    assert fresh["planned_groups_moved"] > t["planned_groups_moved"]  # LPT moves more
    with pytest.raises(ValueError, match="one load per key group"):
        balance.balanced_assignment([1.0], (0, 0), 2)


# ------------------------------------------------------------------------------ sinks


def test_write_log_sink_logs_segments_count_and_span(tmp_path) -> None:
    sink = jobs.WriteLogLatencySink(str(tmp_path))
    clock = ManualClock(1000.0)
    a, b = sink.open(0, 2, clock), sink.open(1, 2, clock)
    assert sink.span() is None and sink.segments() == []
    a.write([(1, 0)] * 5, [999_990] * 5)  # 10 ms old
    clock.advance(0.02)
    a.write([(1, 1)] * 3, [1_000_000] * 3)  # within JOIN_S: the same segment
    clock.advance(1.0)
    b.write([(2, 0)] * 2, [1_001_000] * 2)
    a.write([], [])  # nothing written: no segment
    a.flush()
    b.close()
    assert sorted(sink.segments()) == [[1000.0, 1000.02], [1001.02, 1001.02]]
    assert sink.span() == {"first": 1000.0, "last": 1001.02, "count": 10, "writers": 2,
                           "first_record_ts": 999.99}  # the earliest record's timestamp
    assert sink.summary()["count"] == 10  # the latency files are untouched by the logs
    assert tl.longest_gap(sink.segments(), 1000.0, 1001.02)["gap_s"] == pytest.approx(1.0)
    jobs.NullSink().open(0, 1, clock).write([1], [0])  # takes anything


def test_generator_keys_is_the_sources_own_sequence() -> None:
    src = jobs.generator(rate=None, keys=300, zipf=1.0, num_records=70_000)
    reader = src.open_partition("0-of-1", None, ManualClock())
    got: list[int] = []
    while (batch := reader.poll(30_000)) is not None:
        got.extend(v[0] for v in batch.values)
    assert got == jobs.generator_keys(70_000, keys=300, zipf=1.0).tolist()
    assert jobs.generator_keys(0, keys=10, zipf=None).size == 0


# ------------------------------------------------------------------------------ render, cli


def test_fmt_md_table_and_write_outputs(tmp_path, capsys) -> None:
    assert render.fmt(None) == "-" and render.fmt(1234.56) == "1,234.6"
    assert render.fmt(0.5, ".2f") == "0.50"
    lines = render.md_table(["run", "ms", "notes"], [["a", "1", "x"]], left=["notes"])
    assert lines == ["| run | ms | notes |", "|---|---:|---|", "| a | 1 | x |"]
    drawn = []

    def plot(results: dict, path: str) -> None:
        drawn.append(results["n"])
        with open(path, "wb") as f:
            f.write(b"png")

    out = str(tmp_path / "o")
    rel = render.write_outputs(out, {"n": 1, "odd": {1, 2}}, markdown="# md\n", png="p.png",
                               plot=plot)
    assert [os.path.basename(p) for p in rel] == ["results.json", "summary.md", "p.png"]
    assert json.loads((tmp_path / "o" / "results.json").read_text())["odd"] == "{1, 2}"
    assert drawn == [1] and "# md" in capsys.readouterr().out


def test_cli_defaults_explicit_values_win_over_quick(tmp_path) -> None:
    defaults = {"build": (12.0, 2.0), "baseline": (8.0, 3.0), "after": (12.0, 5.0),
                "stable": (5, 2)}

    def parse(*argv: str):
        ap = cli.parser("A benchmark.\n\nmore", "x")
        cli.add_rescale_run(ap, defaults, coverage=None)
        args = ap.parse_args(list(argv))
        cli.fill_defaults(args, defaults)
        return args

    a = parse("--quick", "--after", "7")
    assert (a.build, a.baseline, a.after, a.stable, a.coverage) == (2.0, 3.0, 7.0, 2, None)
    a = parse("--coverage", "0.9")
    assert (a.build, a.stable, a.coverage, a.tolerance, a.slack_ms) == (12.0, 5, 0.9, 1.1, 5.0)
    assert cli.comma_list(" a, b,,c ") == ["a", "b", "c"] and cli.comma_list(None) == []
    assert cli.out_dir(a, "x", "y").endswith(os.path.join("examples", "bench", "out", "x", "y"))
    a.out = str(tmp_path)
    assert cli.out_dir(a, "x") == str(tmp_path)


def test_provenance_begin_and_finish() -> None:
    res = provenance.begin(rescale.__file__, ["--quick"])
    assert res["command"] == "python examples/bench/rescale.py --quick"
    assert set(res["code"]) == {"commit", "engine_dirty", "engine_sha256"}
    assert res["machine"]["cpus"] and len(res["machine"]["loadavg_at_start"]) == 3
    provenance.finish(res)
    assert "_t0" not in res and res["total_seconds"] >= 0
    assert res["code_at_end"]["engine_sha256"] and len(res["machine"]["loadavg_at_end"]) == 3


def test_report_dict_and_progress_lines(capsys) -> None:
    from migration.report import RescaleReport

    rep = RescaleReport(operator="agg", protocol="drrs", old_parallelism=2, new_parallelism=3,
                        requested_at=1.0, completed_at=2.5, duration_s=1.5, key_groups_moved=4,
                        bytes_moved=100, phases=(("migrate", 1.5),), subscales=((1, 0.1, 0.2),))
    d = run.report_dict(rep)
    assert d["phases"] == [["migrate", 1.5]] and d["subscales"] == [[1, 0.1, 0.2]]
    assert d["planning_reason"] == "" and json.dumps(d)
    progress = run.Progress(10.0)
    progress.step("run 1/2 drrs: deploy", 4.0)
    progress.step("run 1/2 drrs: baseline", 6.0)
    progress.close()
    err = capsys.readouterr().err.splitlines()
    assert err[0].endswith("~0:10 left] run 1/2 drrs: deploy")
    assert err[1].endswith("~0:06 left] run 1/2 drrs: baseline")


# ------------------------------------------------------------------------------ rescale.py


def latency_sink(tmp_path, levels: dict[int, float]) -> jobs.WriteLogLatencySink:
    """A sink whose one writer saw 100 records a second, each ``levels[second]`` ms old."""
    sink = jobs.WriteLogLatencySink(str(tmp_path / "sink"))
    clock = ManualClock(float(min(levels)))
    w = sink.open(0, 1, clock)
    for s in sorted(levels):
        clock.advance(s + 0.5 - clock.now())
        now_ms = int(clock.now() * 1000)
        w.write([(1, 0)] * 100, [now_ms - int(levels[s])] * 100)
    w.flush()
    return sink


def test_analyse_a_run_then_summarise_tabulate_and_plot(tmp_path) -> None:
    levels = {s: 10.0 for s in range(1000, 1030)}
    levels.update({1015: 400.0, 1016: 60.0})  # the rescale, requested at 1015.2
    sink = latency_sink(tmp_path, levels)
    args = types.SimpleNamespace(baseline=8, stable=3, tolerance=1.1, slack_ms=0.0)
    sc = types.SimpleNamespace(args=args, empty_ok=False)
    report = {"protocol": "drrs", "completed_at": 1016.4, "duration_s": 1.2,
              "bytes_moved": 2e6, "key_groups_moved": 9, "suspended_s": 0.1,
              "propagation_delay_s": 0.01, "rerouted_records": 42,
              "subscales": [[1, 0.1, 0.2]], "phases": [["migrate", 1.2]],
              "planning_reason": "", "superseded": False}
    r = {"protocol": "drrs", "status": run.RunStatus.OK, "started_at": 1000.0,
         "requested_at": 1015.2, "ended_at": 1030.0, "report": report,
         "metrics_before": {"state_bytes": 5e6}}
    r.update(rescale.analyse(sc, sink, r))
    assert r["baseline"]["level_ms"] == pytest.approx(10.0, rel=0.03)
    assert r["baseline"]["count"] == 800 and r["baseline"]["p99_ms"] == pytest.approx(10, rel=0.03)
    assert (r["period"]["start"], r["period"]["end"], r["period"]["stabilized"]) == (
        1015, 1017, True)
    assert r["period"]["count"] == 200 and r["peak"]["max_ms"] == pytest.approx(400, rel=0.03)
    assert r["tail"]["count"] == 300 and r["dip"]["ratio"] == pytest.approx(1.0)
    assert r["longest_gap"]["gap_s"] == pytest.approx(1.0)  # one write a second
    assert [x["second"] for x in r["timeline"]] == list(range(1001, 1030))
    none = {**r, "protocol": "none", "report": None}
    results = {"runs": [none, r, {"protocol": "fluid", "status": run.RunStatus.FAILED,
                                  "reason": "boom"}],
               "config": {"scenario": "micro", "quick": True, "tolerance": 1.1,
                          "slack_ms": 0.0, "stable_s": 3, "plot_mean": True},
               "scenario": {"description": "a test"}, "total_seconds": 60.0,
               "machine": {"cpus": 2, "loadavg_at_start": [1.0, 1, 1],
                           "loadavg_at_end": [2.0, 1, 1]},
               "overhead": {"skipped": "measured on the micro job only"}}
    rescale.summarise(results)
    ratios = results["ratios"]  # the period's mean (400 + 60) / 2 against the none run's
    assert ratios["drrs scaling-period mean / no-rescale mean"] == pytest.approx(
        230 / (590 / 15), rel=0.01)  # post-request mean, and against its own baseline
    assert ratios["drrs scaling-period mean / its own baseline mean"] == pytest.approx(23.0,
                                                                                      rel=0.01)
    md = rescale.markdown(results)
    assert "| drrs #1 | 10.0 |" in md and "| fluid #1 |" in md and "failed: boom" in md
    assert "| drrs #1 | 10.0 | 10.0 | " in md and "| 42 | 1 | migrate 1.20s |" in md  # detail
    assert "overhead of rescaling support: skipped" in md
    assert "within 1.1 x base + 0 ms for 3 s" in md and "load 1.0 -> 2.0" in md
    path = str(tmp_path / "t.png")
    rescale.plot(results, path)
    assert os.path.getsize(path) > 10_000


def test_runs_alternate_with_the_run_without_rescaling_and_rotate() -> None:
    order = rescale.run_order(["drrs", "fluid", "nosuch"], 2, True)
    assert order == [("none", 0), ("drrs", 0), ("none", 0), ("fluid", 0), ("nosuch", 0),
                     ("none", 1), ("fluid", 1), ("nosuch", 1), ("none", 1), ("drrs", 1)]
    assert rescale.run_order(["drrs"], 1, False) == [("drrs", 0)]


def test_medians_over_rounds_drive_the_ratios() -> None:
    def run(p: str, peak: float, mean: float) -> dict:
        return {"protocol": p, "status": "ok", "peak": {"max_ms": peak, "p99_ms": peak},
                "period": {"mean_ms": mean, "seconds": 5, "stabilized": True},
                "settle": {"seconds": 5}, "baseline": {"mean_ms": 10.0},
                "post_request": {"mean_ms": 10.0}, "report": {"duration_s": 1.0},
                "loadavg_at_end": [3.0]}

    results = {"runs": [run("none", 20, 10), run("drrs", 100, 12), run("none", 30, 20),
                        run("drrs", 300, 40), run("none", 25, 30), run("drrs", 200, 14),
                        run("stop-restart", 2000, 50)]}
    rescale.summarise(results)
    med = results["medians"]
    assert med["drrs"]["peak_ms"] == {"median": 200, "min": 100, "max": 300, "n": 3}
    assert results["ratios"]["drrs peak / stop-restart peak"] == pytest.approx(0.1)
    # the median period mean (14) over the none runs' median mean after the request (10)
    assert results["ratios"]["drrs scaling-period mean / no-rescale mean"] == pytest.approx(
        1.4)
