"""A keyed operator with a forward partner rescaled live on Ray: out, then back, mid-run.

The job (stock_exchange's and twitch's shape)::

    src (1 task, gated) -> key_by -> running count "sum" (2 tasks) -+-> map "tag" (forward)
                                                                    |     -> key_by -> tumbling event-time windows -> sink
                                                                    +-> sink "seen" (1 task)

"tag" is not chained to "sum" ("sum" has two consumers), so ``sum -> tag`` is a forward
edge: a rescale of "sum" takes "tag" along (``PhysicalPlan.check_rescale``). Each window
emits the running counts of its records in the order they reached it, so per key it equals
the run without rescaling only if the key's records reach it in order while key groups
move (the order markers relayed by "tag"'s tasks keep it) and none is late (the watermark
holds relayed by them). Rescales happen on events (``tests.jobs.Moment``); the reports
list the partner; "tag" runs as many tasks as "sum" after each.
"""

from __future__ import annotations

from typing import Any

import pytest

from engine import StreamJob
from engine.io.testing import TestingSink, TestingSource
from engine.time.event_time import WatermarkStrategy, tumbling_event_time
from tests.integration.test_stateless_rescale_on_ray import CFG, RECORDS, WINDOW, timestamp
from tests.jobs import gates_of, moments, task_actors

pytestmark = pytest.mark.ray

def count(a: tuple, b: tuple) -> tuple:
    return (a[0], a[1] + b[1], b[2])


def in_arrival_order(key: int, w: Any, elements: list[tuple]) -> list[tuple]:
    """``(key, window start, the running counts of its records as they arrived, id sum)``."""
    return [(key, w.start, tuple(e[1] for e in elements), sum(e[2] for e in elements))]


def forward_job(records: list[Any], windows: TestingSink, seen: TestingSink,
                late: TestingSink, gates: list[Any]) -> StreamJob:
    job = StreamJob("forward-group-live", num_key_groups=32, parallelism=2, config=CFG)
    counted = (job.source(TestingSource(records, rate=3000, gate=gates, timestamp_fn=timestamp),
                          name="src", parallelism=1,
                          watermarks=WatermarkStrategy(50, interval_ms=10))
               .key_by(lambda r: r[0]).reduce(count, name="sum"))
    counted.sink(seen, name="seen", parallelism=1)
    (counted.map(lambda r: (r[0], r[1], r[2]), name="tag")
        .key_by(lambda r: r[0])
        .window(tumbling_event_time(WINDOW), late_sink=late)
        .process(in_arrival_order, name="windows")
        .sink(windows, name="out"))
    return job


def test_a_keyed_operator_rescales_live_with_its_forward_partner(ray_cluster):
    records = [(i % 11, 1, i) for i in range(RECORDS)]
    windows, seen, late = TestingSink(), TestingSink(), TestingSink()
    steps = moments(RECORDS, [0.25, 0.3], margin=600)
    h = forward_job(records, windows, seen, late, gates_of(steps)).run()
    reports: list[Any] = []
    try:
        steps[0].wait(h)
        others = {v: task_actors(h, v) for v in ("src", "windows")}
        for moment, p in zip(steps, (3, 2), strict=True):
            reports.append(moment.act(h, lambda p=p: h.rescale("sum", p, protocol="drrs")))
            assert len(task_actors(h, "sum")) == p == len(task_actors(h, "tag")), \
                "the partner rescaled with the operator"
            assert {v: task_actors(h, v) for v in others} == others, "no stop-restart"
        h.wait(120)
    finally:
        for m in steps:
            m.release()
        h.stop()
    assert [(r.old_parallelism, r.new_parallelism) for r in reports] == [(2, 3), (3, 2)]
    for r in reports:
        print(r)
        assert r.protocol == "drrs" and r.with_partners == ("tag",), r
        assert r.key_groups_moved > 0 and "with its forward partner 'tag'" in str(r), r
    # what a run without rescaling gives: per key, each record's running count (records
    # arrive in id order along one path), grouped by window, in that order
    counts: dict[int, int] = {}
    ref: list[tuple] = []
    want: dict[tuple[int, int], tuple[tuple[int, ...], int]] = {}
    for k, _, i in records:
        counts[k] = counts.get(k, 0) + 1
        ref.append((k, counts[k], i))
        w = timestamp((k, 1, i)) // WINDOW * WINDOW
        cs, s = want.get((k, w), ((), 0))
        want[(k, w)] = ((*cs, counts[k]), s + i)
    got: dict[tuple[int, int], tuple[tuple[int, ...], int]] = {}
    for k, w, cs, s in windows.results():
        assert (k, w) not in got, f"window {(k, w)} fired twice"
        got[(k, w)] = (tuple(cs), s)
    assert late.results() == [], "no record was late"
    assert got == want, "per key, the windows' contents in the order of a run without rescaling"
    assert sorted(seen.results()) == sorted(ref)
