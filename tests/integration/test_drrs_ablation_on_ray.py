"""The DRRS ablation on real Ray: ``JobHandle.rescale(..., without=...)`` with all three
mechanisms switched off (``migration.protocols.drrs.DrrsMechanism``) rescales live and the
outputs are exact (per key those of the run without rescaling), on a running sum and on
event-time sliding windows. The requests act on events (the source holds at each moment
until the rescale returned: ``tests.jobs.Moment``), never on wall time."""

from __future__ import annotations

import random

import pytest

from engine.errors import RescaleRefused
from engine.io.testing import TestingSink
from tests.jobs import (
    disordered,
    gates_of,
    moments,
    per_key,
    running_sum_job,
    running_sum_reference,
    sliding_sums_reference,
    windowed_sum_job,
)

pytestmark = pytest.mark.ray

ALL = ("decoupled-barriers", "record-scheduling", "subscale-division")
RECORDS = 6000
MARGIN = 600


def _rescale_at(handle, op, steps, without):
    """At each moment, rescale ``op`` with drrs ``without``; the gates are released and the
    job waited for whatever happens. Returns the reports."""
    reports = []
    plan = [m for m, _ in steps]
    try:
        for moment, p in steps:
            moment.act(handle, lambda p=p: reports.append(
                handle.rescale(op, p, "drrs", without=without)))
    finally:
        for m in plan:
            m.release()
    handle.wait(240)
    return reports


def _check_reports(reports, without):
    assert reports, "no rescale ran"
    for r in reports:
        assert r.protocol == "drrs" and r.without == tuple(sorted(without))
        assert r.key_groups_moved > 0 and not r.cut_short, r.summary()
        assert "without decoupled barriers, record scheduling, subscale division" in (
            r.planning_reason)


def test_running_sum_rescaled_without_every_mechanism_is_exact(ray_cluster):
    rng = random.Random(31)
    records = [(rng.randrange(60), rng.randrange(100)) for _ in range(RECORDS)]
    plan = moments(RECORDS, [0.25, 0.35], MARGIN)
    sink = TestingSink()
    handle = running_sum_job(records, 3, sink, rate=2000, gates=gates_of(plan)).run()
    try:
        reports = _rescale_at(handle, "sum", list(zip(plan, [5, 2], strict=True)), ALL)
    finally:
        handle.stop()
    _check_reports(reports, ALL)
    assert [(r.old_parallelism, r.new_parallelism) for r in reports] == [(3, 5), (5, 2)]
    got, want = per_key(sink.results()), per_key(running_sum_reference(records))
    assert got == want


def test_event_time_windows_rescaled_without_every_mechanism_are_exact(ray_cluster):
    records = disordered(RECORDS, 77)
    plan = moments(RECORDS, [0.3], MARGIN)
    sink = TestingSink()
    handle = windowed_sum_job(records, 4, sink, rate=2000, gates=gates_of(plan)).run()
    try:
        with pytest.raises(RescaleRefused, match="has none of them"):
            handle.rescale("win", 5, "fluid", without=["record-scheduling"])
        reports = _rescale_at(handle, "win", [(plan[0], 7)], ALL)
    finally:
        handle.stop()
    _check_reports(reports, ALL)
    got: dict = {}
    for k, s, e, v in sink.results():
        assert (k, s, e) not in got, f"window {(k, s, e)} fired twice"
        got[(k, s, e)] = v
    assert got == sliding_sums_reference(records)
