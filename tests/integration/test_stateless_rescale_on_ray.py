"""A stateless operator rescaled live on Ray (``StatelessRescale``): out, then in, mid-run.

The job: ``src`` (one task, gated) -> ``map`` (two tasks: a rebalance edge) -> key_by ->
``sum`` (a running count and id sum) -> sink; and an event-time variant with out-of-order
timestamps, bounded-out-of-orderness watermarks and tumbling windows (late records go to a
side sink, which must stay empty). Rescales happen on events: the source holds at each
action's record (``tests.jobs.Moment``). Checked: per key the results of a run without
rescaling, the reports name the stateless rescale (and the protocol asked for), the map's
task count changed, and no stop-restart happened (the other operators' tasks kept their
names, generation 0).

A forward edge: a rescale of the stateless partner of a keyed operator, or a placement of
one of the keyed operator's tasks, is refused naming the edge, and the job runs on unchanged
(a rescale of the keyed operator takes the partner along: test_forward_group_on_ray.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from engine import JobConfig, StreamJob
from engine.errors import RescaleRefused
from engine.io.testing import TestingSink, TestingSource
from engine.time.event_time import WatermarkStrategy, tumbling_event_time
from migration.coordinator import STATELESS
from tests.jobs import Moment, gates_of, moments, per_key, task_actors

pytestmark = pytest.mark.ray

RECORDS = 6000  # at 3,000 records/s: a 2 s job
WINDOW = 100
CFG = JobConfig(batch_size=50, linger_ms=2, metrics_port=None)


def timestamp(r: tuple[int, int, int]) -> int:
    """Out of order by up to 40 ms (never late against a 50 ms bound)."""
    return r[2] + (r[2] * 7919) % 41


def stateless_job(records: list[Any], sink: TestingSink, late: TestingSink, windowed: bool,
                  gates: list[Any]) -> StreamJob:
    job = StreamJob("stateless-live", num_key_groups=32, parallelism=2, config=CFG)
    src = job.source(TestingSource(records, rate=3000, gate=gates,
                                   timestamp_fn=timestamp if windowed else None),
                     name="src", parallelism=1,
                     watermarks=WatermarkStrategy(50, interval_ms=10) if windowed else None)
    keyed = (src.map(lambda r: (r[0], r[1], r[2]), name="map", parallelism=2)
             .key_by(lambda r: r[0]))
    if windowed:
        (keyed.window(tumbling_event_time(WINDOW), late_sink=late)
            .reduce(lambda a, b: (a[0], a[1] + b[1], a[2] + b[2]), name="sum",
                    window_fn=lambda k, w, r: [(k, w.start, r[1], r[2])])
            .sink(sink, name="out"))
    else:
        keyed.reduce(lambda a, b: (a[0], a[1] + b[1], a[2] + b[2]), name="sum").sink(
            sink, name="out")
    return job


def check(records: list[Any], results: list[Any], windowed: bool) -> None:
    if windowed:
        want: dict[tuple[int, int], tuple[int, int]] = {}
        for k, _, i in records:
            w = timestamp((k, 1, i)) // WINDOW * WINDOW
            n, s = want.get((k, w), (0, 0))
            want[(k, w)] = (n + 1, s + i)
        got: dict[tuple[int, int], tuple[int, int]] = {}
        for k, w, n, s in results:
            assert (k, w) not in got, f"window {(k, w)} fired twice"
            got[(k, w)] = (n, s)
        assert got == want
        return
    want_keys = per_key(records)
    for k, outs in per_key(results).items():  # counts exact whatever path each record took
        assert [o[1] for o in outs] == list(range(1, len(want_keys[k]) + 1)), f"key {k}"
        assert outs[-1][2] == sum(r[2] for r in want_keys[k]), f"key {k}: lost or twice"
    assert set(per_key(results)) == set(want_keys)


@pytest.mark.parametrize("windowed", [False, True])
def test_a_stateless_operator_rescales_live_out_and_in(ray_cluster, windowed):
    records = [(i % 11, 1, i) for i in range(RECORDS)]
    sink, late = TestingSink(), TestingSink()
    steps = moments(RECORDS, [0.25, 0.3], margin=600)
    h = stateless_job(records, sink, late, windowed, gates_of(steps)).run()
    reports: list[Any] = []
    try:
        steps[0].wait(h)
        others = {v: task_actors(h, v) for v in ("src", "sum")}
        assert task_actors(h, "map") and all(n.endswith("/g0") for t in others.values()
                                             for n in t)
        for moment, p in zip(steps, (4, 1), strict=True):
            reports.append(moment.act(h, lambda p=p: h.rescale("map", p, protocol="drrs")))
            assert len(task_actors(h, "map")) == p, "the map's tasks changed live"
            # no stop-restart: every other task is the one the job started with
            assert {v: task_actors(h, v) for v in others} == others
        h.wait(120)
    finally:
        for m in steps:
            m.release()
        h.stop()
    assert [(r.old_parallelism, r.new_parallelism) for r in reports] == [(2, 4), (4, 1)]
    for r in reports:
        print(r)
        assert r.protocol == STATELESS and r.requested_protocol == "drrs", r
        assert r.key_groups_moved == 0 and "stateless rescale of 'map'" in str(r)
    check(records, sink.results(), windowed)
    assert late.results() == [], "no record was late"


def test_a_forward_partner_alone_is_refused_and_the_job_runs_on(ray_cluster):
    records = [(i % 7, 1, i) for i in range(3000)]
    sink = TestingSink()
    moment = Moment.at(1000, 300, len(records))
    job = StreamJob("forward", num_key_groups=16, parallelism=2, config=CFG)
    counted = (job.source(TestingSource(records, rate=3000, gate=moment.gates), name="src",
                          parallelism=1)
               .key_by(lambda r: r[0]).reduce(lambda a, b: (a[0], a[1] + b[1], b[2]),
                                              name="match"))
    seen = counted.filter(lambda r: True, name="trades")  # forward: 'match' has 2 consumers
    counted.union(seen).sink(sink, name="out", parallelism=1)
    h = job.run()

    def refused() -> None:
        for p, proto in ((1, "drrs"), (3, "stop-restart")):
            with pytest.raises(RescaleRefused, match="'match' -> 'trades' is a forward edge.*"
                                                     "rescale 'match'; its forward partner "
                                                     "'trades' rescales with it"):
                h.rescale("trades", p, protocol=proto)
        with pytest.raises(RescaleRefused, match="runs one more task while its key groups"):
            h.place("match", 0, "any-node")  # a placement runs p + 1 tasks for a while
        assert len(task_actors(h, "trades")) == 2 and len(task_actors(h, "match")) == 2

    moment.run(h, refused, job_timeout=120)
    assert len(sink.results()) == 2 * len(records)
