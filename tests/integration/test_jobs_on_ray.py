"""Integration tests on a real local Ray cluster: results equal plain-Python references."""

from __future__ import annotations

import dataclasses
import gc
import random
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine import JobConfig, KeyedProcessFunction, StreamJob
from engine.errors import JobDefinitionError, RescaleRefused, UserFunctionError
from engine.io.sinks import Sink, SinkWriter
from engine.io.testing import SourceGate, TestingSink, TestingSource
from tests.jobs import (
    SMALL,
    Moment,
    check_reports,
    per_key,
    profile_job,
    profile_reference,
    running_sum_job,
    running_sum_reference,
    task_actors,
    wait_until,
)

pytestmark = pytest.mark.ray

LINES = [" ".join(random.Random(i).choice("abcdefghij") * random.Random(i + 1).randint(1, 3)
                  for _ in range(6)) for i in range(600)]


def wordcount_reference(lines: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in lines:
        for w in line.split():
            out[w] = out.get(w, 0) + 1
    return out


# 2 is slow: 1 and 4 bound it, and each Ray job costs ~10 CPU-seconds of actor starts
@pytest.mark.parametrize("parallelism", [1, pytest.param(2, marks=pytest.mark.slow), 4])
def test_wordcount_matches_reference(ray_cluster, parallelism):
    sink = TestingSink()
    job = StreamJob("wc", parallelism=parallelism, config=SMALL)
    (job.source(TestingSource(LINES), name="lines", parallelism=min(parallelism, 2))
        .flat_map(str.split, name="split")
        .map(lambda w: (w, 1), name="pair")
        .key_by(lambda p: p[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]), name="count")
        .sink(sink, name="out"))
    job.run().wait(120)
    results = sink.results()
    expected = wordcount_reference(LINES)
    assert len(results) == sum(expected.values())
    final = {}
    for w, c in results:
        final[w] = max(final.get(w, 0), c)
    assert final == expected
    # every word's counts are 1, 2, ..., n in order
    for w, seq in per_key(results).items():
        assert [c for _, c in seq] == list(range(1, expected[w] + 1))


# 2 is slow: 1 and 4 bound it, and each Ray job costs ~10 CPU-seconds of actor starts
@pytest.mark.parametrize("parallelism", [1, pytest.param(2, marks=pytest.mark.slow), 4])
def test_running_sum_and_state_kinds_match_reference(ray_cluster, parallelism):
    rng = random.Random(parallelism)
    records = [(rng.randrange(40), rng.randrange(100)) for _ in range(2000)]
    s1, s2 = TestingSink(), TestingSink()
    h1 = running_sum_job(records, parallelism, s1).run()
    h2 = profile_job(records, parallelism, s2).run()
    h1.wait(120)
    h2.wait(120)
    assert per_key(s1.results()) == per_key(running_sum_reference(records))
    assert per_key(s2.results()) == per_key(profile_reference(records))


def test_failing_user_function_names_operator_task_and_record(ray_cluster):
    def boom(r):
        if r == 137:
            raise ValueError("no 137 here")
        return r

    job = StreamJob("fails", config=SMALL)
    job.source(TestingSource(range(500)), name="src").map(boom, name="boom").sink(TestingSink())
    with pytest.raises(UserFunctionError) as err:
        job.run().wait(60)
    assert err.value.operator == "boom"
    assert err.value.task_index == 0
    assert err.value.record == "137"
    assert "no 137 here" in str(err.value)


def test_failing_keyed_function_fails_job(ray_cluster):
    class Bad(KeyedProcessFunction):
        def process_element(self, value, ctx):
            if value[1] == 77:
                raise KeyError("seventy-seven")
            yield value

    job = StreamJob("fails-keyed", config=SMALL, parallelism=2)
    (job.source(TestingSource([(i % 3, i) for i in range(200)]), name="src")
        .key_by(lambda r: r[0]).process(Bad(), name="bad").sink(TestingSink()))
    with pytest.raises(UserFunctionError) as err:
        job.run().wait(60)
    assert err.value.operator == "bad"
    assert err.value.record == "(2, 77)"


def test_dead_letter_sink_takes_failing_records_and_job_goes_on(ray_cluster):
    out, dead = TestingSink(), TestingSink()

    def inv(r):
        return 100 // (r % 10)

    job = StreamJob("dlq", config=SMALL)
    job.source(TestingSource(range(300)), name="src").map(inv, name="inv", dead_letter=dead).sink(out)
    job.run().wait(60)
    assert sorted(out.results()) == sorted(100 // (r % 10) for r in range(300) if r % 10)
    letters = dead.results()
    assert sorted(r[2] for r in letters) == [r for r in range(300) if r % 10 == 0]
    assert all(r[0] == "inv" and r[1] == 0 and "ZeroDivisionError" in r[3] for r in letters)


class SlowSink(Sink):
    """Sleeps per batch: the pipeline must back-pressure rather than buffer."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def open(self, task_index, parallelism, clock):
        return _SlowWriter(self.delay_s)


class _SlowWriter(SinkWriter):
    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def write(self, values, timestamps):
        time.sleep(self.delay_s)


def test_backpressure_keeps_in_flight_records_bounded(ray_cluster):
    cfg = JobConfig(batch_size=100, linger_ms=2, credits=2, metrics_port=None)
    job = StreamJob("bp", config=cfg, parallelism=2)
    (job.source(TestingSource([(i % 50, 1) for i in range(200_000)]), name="src")
        .key_by(lambda r: r[0]).reduce(lambda a, b: (a[0], a[1] + b[1]), name="sum")
        .map(lambda r: r, name="m", parallelism=1)
        .sink(SlowSink(0.02), name="slow"))
    h = job.run()
    # Records between the source's output and m's input: one source poll waiting for
    # credits, `credits` frames per channel (4 channels) plus a partly filled buffer each,
    # and the outputs of the frames a sum task processes per loop turn (8) before it sends.
    bound = (cfg.source_poll_records + 4 * (cfg.credits + 1) * cfg.batch_size
             + 2 * 8 * cfg.batch_size)
    samples: list[int] = []
    emitted: list[int] = []
    busy: list[float] = []

    def sample() -> bool:
        """One sample of the records in flight; True once the sink has taken 10,000."""
        m = h.metrics()
        src_out, sink_in = m.total("records_out", "src"), m.total("records_in", "m")
        samples.append(src_out - sink_in)
        emitted.append(src_out)
        for t in m.tasks:
            assert t.queued_frames <= cfg.credits * 2, t
            # each task's process reports its CPU time and run-queue wait (DS2 reads them)
            assert t.cpu_seconds is not None and t.cpu_seconds >= 0, t
            assert t.cpu_wait_seconds is not None and t.cpu_wait_seconds >= 0, t
        busy.append(sum(t.cpu_seconds or 0.0 for t in m.tasks if t.vertex == "src"))
        return sink_in >= 10_000

    try:
        wait_until(sample, "the slow sink to take 10,000 records", h)
        # each task worker froze its start-up heap, so full collections skip it
        import ray
        frozen = [ray.get(ray.get_actor(name, namespace="reflow").__ray_call__.remote(
            lambda actor: gc.get_freeze_count())) for name in task_actors(h, "sum")]
        assert len(frozen) == 2 and all(n > 10_000 for n in frozen), frozen
    finally:
        h.stop()
    assert len(samples) >= 5, samples  # sampled while the pipeline ran, not once
    assert busy[-1] > busy[0] >= 0, busy  # the source's CPU seconds grow as it works
    assert max(samples) <= bound, samples
    # the source was really held back by the 5-records/ms sink: far from its 200,000
    assert emitted[-1] < 100_000, emitted


def test_invalid_rescale_requests_are_refused_and_job_untouched(ray_cluster):
    records = [(i % 20, 1) for i in range(3000)]
    sink = TestingSink()
    moment = Moment.at(1000, 0, len(records))  # the job surely runs while refused
    job = running_sum_job(records, 2, sink, rate=3000, gates=moment.gates)
    h = job.run()
    cases = [
        (("nope", 2), "no operator 'nope'"),
        (("sum", 0), "must be an integer >= 1"),
        (("sum", 33), "exceeds the number of key groups"),
        (("out", 2), "chained behind 'sum'"),
    ]

    def refused() -> None:
        for args, text in cases:
            with pytest.raises(RescaleRefused, match=text):
                h.rescale(*args)
        with pytest.raises(RescaleRefused, match="unknown protocol"):
            h.rescale("sum", 3, protocol="teleport")
        # a source has partitions, not key groups (more tasks than partitions is allowed)
        with pytest.raises(RescaleRefused, match="is a source"):
            h.rebalance("src", [0] * 32)
        assert h.metrics().rescales == ()  # nothing started
        assert len(h.metrics().operator("sum")) == 2

    moment.run(h, refused, job_timeout=120)
    assert per_key(sink.results()) == per_key(running_sum_reference(records))


def test_invalid_job_fails_at_build_time_naming_operator():
    job = StreamJob("bad", num_key_groups=8)
    s = job.source(TestingSource([1]), name="src")
    with pytest.raises(JobDefinitionError, match="'agg'"):
        s.key_by(lambda r: r).reduce(lambda a, b: a, name="agg", parallelism=9)
    with pytest.raises(JobDefinitionError, match="'src'"):
        s.map(lambda r: r, name="src")
    with pytest.raises(JobDefinitionError, match="'m'"):
        s.map(lambda r: r, name="m", parallelism=0)


def test_stop_restart_rescale_out_and_in_keeps_results(ray_cluster):
    rng = random.Random(5)
    records = [(rng.randrange(60), rng.randrange(10)) for _ in range(6000)]
    sink = TestingSink()
    moment = Moment.at(2000, 600, len(records))
    h = running_sum_job(records, 2, sink, rate=4000, gates=moment.gates).run()

    def rescales() -> list:
        up = h.rescale("sum", 5, protocol="stop-restart")
        assert (up.old_parallelism, up.new_parallelism) == (2, 5)
        assert up.key_groups_moved > 0 and up.bytes_moved > 0 and up.duration_s > 0
        assert [p for p, _ in up.phases][:2] == ["savepoint", "restore"]
        m = h.metrics()
        assert len(m.operator("sum")) == 5
        assert sum(t.key_groups for t in m.operator("sum")) == 32
        # a rebalance by stop-restart installs the given assignment, not the uniform one
        uneven = tuple([0] * 20 + [1, 2, 3] * 4)
        rb = h.rebalance("sum", uneven, protocol="stop-restart")
        assert rb.protocol == "stop-restart" and rb.new_parallelism == 4
        held = {t.task_index: t.key_groups for t in h.metrics().operator("sum")}
        assert held == {0: 20, 1: 4, 2: 4, 3: 4}
        down = h.rescale("sum", 1, protocol="stop-restart")
        assert down.new_parallelism == 1
        return [up, rb, down]

    check_reports(moment.run(h, rescales, job_timeout=120))
    assert per_key(sink.results()) == per_key(running_sum_reference(records))


@pytest.mark.parametrize("transport", ["tcp", "ray"])
def test_both_data_transports_keep_results_across_live_rescales(ray_cluster, transport):
    # 2 -> 4 -> 2 -> 4: the last scale-out makes new actors under the names of the tasks
    # the scale-in removed, so a sender's connection to the old actor must not be reused
    rng = random.Random(11)
    records = [(rng.randrange(50), rng.randrange(10)) for _ in range(12_000)]
    sink = TestingSink()
    cfg = dataclasses.replace(SMALL, transport=transport)
    moment = Moment.at(300, 1000, len(records))
    h = running_sum_job(records, 2, sink, rate=1000, config=cfg, gates=moment.gates).run()

    def rescales() -> list:
        reports = [h.rescale("sum", p) for p in (4, 2, 4)]
        assert [r.new_parallelism for r in reports] == [4, 2, 4]
        m = h.metrics()
        assert m.status == "running"
        assert len(m.operator("sum")) == 4
        return reports

    check_reports(moment.run(h, rescales, job_timeout=120))
    assert per_key(sink.results()) == per_key(running_sum_reference(records))


def test_metrics_endpoint_serves_prometheus_text(ray_cluster):
    cfg = JobConfig(batch_size=50, linger_ms=2, metrics_port=0, metrics_poll_interval_s=0.2)
    job = StreamJob("metrics", config=cfg, parallelism=2)
    moment = Moment.at(5000, 2000, 20_000)
    (job.source(TestingSource([(i % 7, 1) for i in range(20_000)], rate=5000,
                              gate=moment.gates), name="src")
        .key_by(lambda r: r[0]).reduce(lambda a, b: (a[0], a[1] + b[1]), name="sum")
        .sink(TestingSink(), name="out"))
    h = job.run()
    assert h.metrics_url.startswith("http://127.0.0.1:")
    scraped: list[str] = []

    def served_after_rescale() -> bool:
        """The endpoint shows the rescale, records into all 3 sum tasks and a latency."""
        text = urllib.request.urlopen(h.metrics_url, timeout=10).read().decode()
        scraped[:] = [text]
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        if "reflow_rescales" not in fams or "reflow_end_to_end_latency_seconds" not in fams:
            return False
        sums = [s.value for s in fams["reflow_records_in"].samples
                if s.labels["operator"] == "sum"]
        lat = [s.value for s in fams["reflow_end_to_end_latency_seconds"].samples
               if s.name.endswith("_count")]
        return len(sums) == 3 and sum(sums) > 0 and bool(lat) and max(lat) > 0

    def rescale_and_scrape() -> None:
        h.rescale("sum", 3, protocol="stop-restart")
        wait_until(served_after_rescale, "the metrics endpoint to show the rescale", h)

    try:
        moment.act(h, rescale_and_scrape)
    finally:
        moment.release()
        h.stop()
    text = scraped[0]
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    rin = fams["reflow_records_in"]
    assert rin.type == "counter"
    by_op = {}
    for s in rin.samples:
        assert s.labels["job"] == h.job_id
        by_op.setdefault(s.labels["operator"], []).append(s.value)
    assert set(by_op) == {"src", "sum"}
    assert len(by_op["sum"]) == 3 and sum(by_op["sum"]) > 0
    for name in ("reflow_bytes_in", "reflow_useful_seconds", "reflow_idle_seconds",
                 "reflow_backpressured_seconds", "reflow_queued_frames", "reflow_state_bytes",
                 "reflow_key_groups", "reflow_end_to_end_latency_seconds",
                 "reflow_rescale_key_groups_moved", "reflow_rescales"):
        assert name in fams, name
    kg = {s.labels["task"]: s.value for s in fams["reflow_key_groups"].samples
          if s.labels["operator"] == "sum"}
    assert sum(kg.values()) == 128
    lat = [s for s in fams["reflow_end_to_end_latency_seconds"].samples if s.name.endswith("_count")]
    assert lat and max(s.value for s in lat) > 0
    assert [s.value for s in fams["reflow_rescales"].samples if s.labels["operator"] == "sum"] == [1]


class HeldSum:
    """A running sum that, on the record whose value is ``MARK``, holds (its task does no
    other work) until the file ``<directory>/open`` exists; it touches ``held`` first."""

    MARK = -1

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def __call__(self, acc: tuple[int, int], rec: tuple[int, int]) -> tuple[int, int]:
        if rec[1] == self.MARK:
            import os

            open(os.path.join(self.directory, "held"), "w").close()
            deadline = time.monotonic() + 300
            while not os.path.exists(os.path.join(self.directory, "open")):
                if time.monotonic() > deadline:
                    raise TimeoutError("the test never opened the hold")
                time.sleep(0.01)
            rec = (rec[0], 0)
        return (acc[0], acc[1] + rec[1])


def test_operators_that_feed_each_other_rescale_one_at_a_time(ray_cluster, tmp_path):
    """A rescale of 'b' while one of 'a' (which feeds it) runs is refused, naming 'a', and
    changes nothing; once 'a' is done, 'b' rescales; per key the outputs of both stages
    equal the reference. (Each coordinator wires new tasks to the deployment it started
    from: two neighbours at once would miss each other's new tasks.)"""
    rng = random.Random(11)
    records = [(rng.randrange(30), rng.randrange(1, 10)) for _ in range(3000)]
    records[1500] = (records[1500][0], HeldSum.MARK)  # 'a' holds on it
    sink = TestingSink()
    rest = SourceGate(2000, str(tmp_path / "rest"))  # input left for the rescale of 'b'
    cfg = dataclasses.replace(SMALL, control_timeout_s=60.0)
    job = StreamJob("neighbours", num_key_groups=16, parallelism=2, config=cfg)
    (job.source(TestingSource(records, rate=4000, gate=[rest]), name="src", parallelism=1)
        .key_by(lambda r: r[0]).reduce(HeldSum(str(tmp_path)), name="a")
        .key_by(lambda r: r[0]).reduce(lambda x, y: (x[0], x[1] + y[1]), name="b")
        .sink(sink, name="out"))
    h = job.run()
    try:
        wait_until(lambda: (tmp_path / "held").exists(), "'a' to hold", h)
        outcome: dict[str, object] = {}

        def rescale_a() -> None:
            try:
                outcome["a"] = h.rescale("a", 3)
            except RescaleRefused as exc:  # e.g. planning timed out on a loaded machine
                outcome["a"] = exc

        first = threading.Thread(target=rescale_a)
        first.start()
        wait_until(lambda: any(r.operator == "a" and r.running for r in h.metrics().rescales),
                   "the rescale of 'a' to start", h)
        with pytest.raises(RescaleRefused, match="rescale of 'a', which exchanges records"):
            h.rescale("b", 3)
        assert len(h.metrics().operator("b")) == 2  # untouched
        (tmp_path / "open").touch()
        first.join(300)
        assert not first.is_alive()
        print(f"the rescale of 'a': {outcome['a']}")
        report = h.rescale("b", 3)
        assert report.new_parallelism == 3 and report.key_groups_moved > 0
        rest.open()
        h.wait(180)
    finally:
        (tmp_path / "open").touch()
        rest.open()
        h.stop()
    values = [(k, 0 if v == HeldSum.MARK else v) for k, v in records]
    stage_a = running_sum_reference(values)
    assert per_key(sink.results()) == per_key(running_sum_reference(stage_a))
