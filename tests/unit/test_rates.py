"""True rates from task metrics snapshots, the metrics history, and what a rescale cost."""

from __future__ import annotations

import pytest

from engine.control.reconfiguration import measure_rescale
from engine.observability.latency import LatencyHistogram
from engine.observability.metrics import TaskMetrics
from engine.observability.rates import MetricsHistory, metrics_window


def tm(task: str, vertex: str, index: int, rin: int, rout: int, useful: float,
       idle: float = 0.0, bp: float = 0.0, backlog: int | None = None,
       latencies: list[float] | None = None) -> TaskMetrics:
    h = LatencyHistogram()
    h.observe_many(latencies or [])
    return TaskMetrics(task, vertex, index, "running", rin, rout, 0, 0, useful, idle, bp, 0,
                       0, 0, 0, h.to_wire(), 0, 0, backlog)


def test_a_window_gives_true_and_observed_rates_per_task_and_operator():
    before = {"a/0": tm("a/0", "agg", 0, 1_000, 100, 1.0),
              "a/1": tm("a/1", "agg", 1, 1_000, 100, 1.0)}
    after = {"a/0": tm("a/0", "agg", 0, 6_000, 600, 6.0),   # 5,000 in 5 s useful of 10
             "a/1": tm("a/1", "agg", 1, 3_000, 300, 3.0)}   # 2,000 in 2 s useful
    w = metrics_window(before, after, 100.0, 110.0)
    op = w.operator("agg")
    assert w.seconds == 10.0 and op.parallelism == 2
    assert op.records_in == 7_000 and op.records_out == 700
    assert op.true_processing_rate == pytest.approx(1_000)  # 7,000 per 7 useful seconds
    assert op.observed_input_rate == pytest.approx(700)
    assert op.output_ratio == pytest.approx(0.1)
    assert op.max_utilisation == pytest.approx(0.5) and op.mean_utilisation == pytest.approx(0.35)
    assert op.capacity == pytest.approx(1_400)  # 700 / 0.5: the busiest task saturates
    assert op.tasks[0].true_processing_rate == pytest.approx(1_000)
    assert "agg: p=2" in w.summary()


def test_a_source_backlog_and_its_growth():
    before = {"s/0": tm("s/0", "src", 0, 0, 0, 0.0, backlog=100)}
    after = {"s/0": tm("s/0", "src", 0, 1_000, 1_000, 0.1, backlog=600)}
    op = metrics_window(before, after, 0.0, 5.0).operator("src")
    assert op.source_backlog == 600 and op.backlog_growth == pytest.approx(100)
    blind = metrics_window({}, {"s/0": tm("s/0", "src", 0, 10, 10, 0.1)}, 0, 1).operator("src")
    assert blind.source_backlog is None and blind.backlog_growth is None


def test_rates_without_work_are_none_not_infinite():
    w = metrics_window({}, {"a/0": tm("a/0", "agg", 0, 0, 0, 0.0)}, 0.0, 1.0)
    op = w.operator("agg")
    assert op.true_processing_rate is None and op.capacity is None and op.output_ratio is None


def test_the_window_carries_the_sinks_latency_in_it():
    before = {"k/0": tm("k/0", "sink", 0, 0, 0, 0, latencies=[1.0] * 100)}
    after = {"k/0": tm("k/0", "sink", 0, 0, 0, 0, latencies=[1.0] * 100 + [50.0] * 10)}
    w = metrics_window(before, after, 0.0, 1.0)
    assert w.latency.count == 10
    assert w.latency.quantile(0.5) == pytest.approx(50.0, rel=0.05)


def test_latency_since_subtracts_an_earlier_snapshot():
    h = LatencyHistogram()
    h.observe_many([1.0, 2.0, 3.0])
    earlier = LatencyHistogram.from_wire(h.to_wire())
    h.observe_many([100.0, 200.0])
    d = h.since(earlier)
    assert d.count == 2 and d.mean == pytest.approx(150.0)
    assert d.min == pytest.approx(100.0, rel=0.05) and d.max == pytest.approx(200.0, rel=0.05)
    assert h.since(h).count == 0


def test_the_history_keeps_a_bounded_ring_and_cuts_windows_after_a_rescale():
    hist = MetricsHistory(keep_s=10.0)
    for t in range(30):
        hist.add(float(t), {"a/0": tm("a/0", "agg", 0, 100 * t, 0, 0.1 * t)})
    assert len(hist) <= 12
    w = hist.window(5.0)
    assert (w.start, w.end) == (24.0, 29.0)
    w = hist.window(5.0, since=27.5)
    assert (w.start, w.end) == (28.0, 29.0)
    assert hist.window(5.0, since=29.5) is None
    with pytest.raises(ValueError, match="older"):
        hist.add(3.0, {})


def test_what_a_rescale_cost_is_measured_around_it():
    hist = MetricsHistory(keep_s=60.0)
    src, lat = 0, [5.0] * 10
    for t in range(20):  # 1,000 records/s into agg; a backlog of 2,000 around t=10..12
        backlog = 2_000 if 10 <= t <= 12 else 0
        lat = lat + [400.0 if t in (11, 12) else 5.0] * 10
        src += 1_000
        hist.add(float(t), {"s/0": tm("s/0", "src", 0, src, src, 0.1, backlog=backlog),
                            "a/0": tm("a/0", "agg", 0, src, 0, 0.5 * t),
                            "k/0": tm("k/0", "sink", 0, 0, 0, 0, latencies=lat)})
    rec = measure_rescale(hist, operator="agg", protocol="drrs", old_parallelism=1,
                          new_parallelism=2, requested_at=9.5, completed_at=11.0,
                          key_groups_moved=64, bytes_moved=5_000_000, cut_short=False,
                          by="test")
    assert rec.input_rate == pytest.approx(1_000)
    assert rec.backlog_records == 2_000
    assert rec.latency_before_ms == pytest.approx(5.0, rel=0.05)
    assert rec.peak_latency_ms == pytest.approx(400.0, rel=0.05)
    assert rec.disruption_s == pytest.approx(2.0)  # 2,000 records at 1,000/s
    assert rec.duration_s == pytest.approx(1.5) and rec.megabytes_moved == 5.0


def test_an_overloaded_jobs_growing_backlog_is_not_charged_to_the_rescale():
    hist = MetricsHistory(keep_s=60.0)
    src = 0
    for t in range(20):  # the backlog grows by 500 records/s all along: overload, not rescale
        src += 1_000
        hist.add(float(t), {"s/0": tm("s/0", "src", 0, src, src, 0.1, backlog=500 * t),
                            "a/0": tm("a/0", "agg", 0, src, 0, 0.9 * t)})
    rec = measure_rescale(hist, operator="agg", protocol="drrs", old_parallelism=1,
                          new_parallelism=2, requested_at=9.5, completed_at=12.0,
                          key_groups_moved=64, bytes_moved=1, cut_short=False, by="test")
    assert rec.backlog_records == 0 and rec.disruption_s == 0.0


def test_process_cpu_reports_this_process_cpu_and_run_queue_wait() -> None:
    from engine.observability.metrics import process_cpu

    cpu0, wait0 = process_cpu()
    total = 0
    for i in range(300_000):  # work, not a sleep: the CPU time must grow
        total += i * i
    cpu1, wait1 = process_cpu()
    assert total > 0 and cpu1 > cpu0 >= 0
    assert wait0 is not None and wait1 is not None and wait1 >= 0  # Linux says
