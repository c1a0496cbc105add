"""Event-time windows on a real Ray cluster: exact results at any parallelism, across a
stop-restart rescale, late data to the side output, and a window join."""

from __future__ import annotations

import pytest

from engine import KeyedProcessFunction, StreamJob
from engine.dataflow.config import JobConfig
from engine.io.testing import TestingSink, TestingSource
from engine.time.event_time import WatermarkStrategy, tumbling_event_time
from tests import jobs

pytestmark = pytest.mark.ray

CFG = JobConfig(batch_size=50, linger_ms=2, metrics_port=None)
BOUND = 40


def disordered(n: int, seed: int) -> list[tuple[int, int, int]]:
    return jobs.disordered(n, seed, keys=6, bound_ms=BOUND, max_step_ms=15)


def sliding_sums(records, size, slide):
    return jobs.sliding_sums_reference(records, size, slide)


def windowed_job(records, parallelism, sink, rate=None, gates=None):
    return jobs.windowed_sum_job(records, parallelism, sink, rate=rate, bound_ms=BOUND,
                                 gates=gates)


def as_dict(results):
    out = {}
    for k, s, e, v in results:
        assert (k, s, e) not in out, f"window {(k, s, e)} fired twice"
        out[(k, s, e)] = v
    return out


@pytest.mark.parametrize("parallelism", [1, 4])
def test_sliding_windows_exact_at_any_parallelism(ray_cluster, parallelism):
    records = disordered(3000, 11)
    sink = TestingSink()
    windowed_job(records, parallelism, sink).run().wait(120)
    assert as_dict(sink.results()) == sliding_sums(records, 400, 100)


def test_windows_exact_across_stop_restart_rescales(ray_cluster):
    records = disordered(8000, 12)
    sink = TestingSink()
    out, back = jobs.moments(len(records), [0.1, 0.1], margin=600)  # at records 800 and 1600
    h = windowed_job(records, 2, sink, rate=1500, gates=jobs.gates_of([out, back])).run()
    try:
        reports = [out.act(h, lambda: h.rescale("win", 5, protocol="stop-restart")),
                   back.act(h, lambda: h.rescale("win", 1, protocol="stop-restart"))]
        h.wait(120)
    finally:
        out.release()
        back.release()
        h.stop()
    assert [(r.old_parallelism, r.new_parallelism) for r in reports] == [(2, 5), (5, 1)]
    jobs.check_reports(reports)
    assert as_dict(sink.results()) == sliding_sums(records, 400, 100)


def test_late_records_go_to_the_late_sink(ray_cluster):
    records = [(i % 3, 1, i * 10) for i in range(600)] + [(1, 100, 5)]  # the last is 6 s late
    sink, late = TestingSink(), TestingSink()
    job = StreamJob("late", num_key_groups=8, config=CFG)
    (job.source(TestingSource(records, rate=1000, timestamp_fn=lambda r: r[2]), name="src",
                watermarks=WatermarkStrategy(0, interval_ms=10))
        .key_by(lambda r: r[0])
        .window(tumbling_event_time(1000), late_sink=late)
        .reduce(lambda a, b: (a[0], a[1] + b[1], 0), name="win")
        .sink(sink, name="out"))
    h = job.run()
    h.wait(120)
    assert late.results() == [(1, 100, 5)]
    assert sum(r[1] for r in sink.results()) == 600


def test_window_join_pairs_records_of_equal_keys_per_window(ray_cluster):
    people = [(p, f"name{p}", p * 100) for p in range(20)]                 # (id, name, ts)
    auctions = [(1000 + i, i % 25, i * 60) for i in range(40)]             # (id, seller, ts)
    sink = TestingSink()
    job = StreamJob("join", num_key_groups=16, parallelism=3, config=CFG)
    wm = WatermarkStrategy(0, interval_ms=10)
    p = job.source(TestingSource(people, timestamp_fn=lambda r: r[2]), name="people", watermarks=wm)
    a = job.source(TestingSource(auctions, timestamp_fn=lambda r: r[2]), name="auctions", watermarks=wm)
    (p.key_by(lambda r: r[0])
        .window_join(a.key_by(lambda r: r[1]), tumbling_event_time(1000),
                     lambda person, auction: (person[0], auction[0]), name="join")
        .sink(sink, name="out"))
    job.run().wait(120)
    expected = sorted((pp[0], aa[0]) for pp in people for aa in auctions
                      if pp[0] == aa[1] and pp[2] // 1000 == aa[2] // 1000)
    assert expected  # the data do produce matches
    assert sorted(sink.results()) == expected


class SlowWindowSum(KeyedProcessFunction):
    """Tumbling event-time windows of 50 ms summing a key's values, fired by event-time
    timers, at 250 us of service a record (``jobs.ServiceSum``'s cost): the old owners of a
    migration have a backlog, so a moving group's confirms come back late and its timers,
    held meanwhile, fire at the new owner after the watermark passed them."""

    def open(self, ctx):
        from examples.bench.harness.jobs import ServiceTime

        self.sums = ctx.value_state("sums", None)
        self.service = ServiceTime(250)

    def process_element(self, value, ctx):
        start = ctx.timestamp - ctx.timestamp % 50
        sums = dict(self.sums.value() or {})
        sums[start] = sums.get(start, 0) + value[1]
        self.sums.update(sums)
        ctx.timer_service.register_event_time_timer(start + 49)
        self.service.spend()
        return ()

    def on_timer(self, timestamp, ctx):
        sums = dict(self.sums.value() or {})
        total = sums.pop(timestamp - 49, 0)
        self.sums.update(sums)
        yield (ctx.key, total)


def downstream_window_job(records, sink, late, rate, gates):
    """src -> key_by(key) -> 50 ms windows summing values, "sum" (rescaled; ``SlowWindowSum``)
    -> key_by(key % 3) -> tumbling event-time windows of 200 ms summing those sums, "win"
    -> sink; late records of "win" to ``late``."""
    job = StreamJob("downstream-windows", num_key_groups=32, parallelism=2, config=CFG)
    (job.source(TestingSource(records, rate=rate, timestamp_fn=lambda r: r[2], gate=gates),
                name="src", parallelism=1, watermarks=WatermarkStrategy(BOUND, interval_ms=10))
        .key_by(lambda r: r[0])
        .process(SlowWindowSum(), name="sum")
        .key_by(lambda r: r[0] % 3)
        .window(tumbling_event_time(200), late_sink=late)
        .reduce(lambda a, b: (a[0], a[1] + b[1]),
                window_fn=lambda k, w, r: [(k, w.start, r[1])], name="win", parallelism=1)
        .sink(sink, name="out", parallelism=1))
    return job


def downstream_window_reference(records):
    out: dict[tuple[int, int], int] = {}
    for k, v, ts in records:
        w = (k % 3, ts - ts % 200)
        out[w] = out.get(w, 0) + v
    return sorted((k, s, t) for (k, s), t in out.items())


@pytest.mark.parametrize("protocol", [
    "drrs", *(pytest.param(p, marks=pytest.mark.slow)
              for p in ("pause-resume", "fluid", "batched", "non-disruptive", "meces"))])
def test_a_window_downstream_of_a_live_rescale_sees_no_late_record(ray_cluster, protocol):
    """The event-time invariant on Ray: a live rescale of the windowed "sum" (2 -> 4, then
    4 -> 2) while windows downstream of it, keyed by another key, fire; no record is late
    there (without the watermark holds, windows whose timers the migration held fired at
    the new owner after both owners had sent a later watermark) and every window equals
    the run without rescaling."""
    # many keys, each rare: a moving group's records seldom reach its new owner directly
    # (such a record, set aside, would hold the new owner's watermark back by itself)
    records = jobs.disordered(8000, 31, keys=3000, bound_ms=BOUND, max_step_ms=15)
    sink, late = TestingSink(), TestingSink()
    # records flow throughout each rescale (3,000 a second for a second or so)
    out, back = jobs.moments(len(records), [0.15, 0.4], margin=3000)
    h = downstream_window_job(records, sink, late, 3000, jobs.gates_of([out, back])).run()
    reports, refused = jobs.rescale_at(h, "sum", [(out, 4), (back, 2)], protocol=protocol)
    assert not refused, refused
    assert [(r.old_parallelism, r.new_parallelism) for r in reports] == [(2, 4), (4, 2)]
    jobs.check_reports(reports)
    assert late.results() == []
    assert sorted(sink.results()) == downstream_window_reference(records)
