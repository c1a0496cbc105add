"""A drrs scale-out of a saturated, backlogged keyed task on real Ray: every task serves
about 500 records/s (2 ms per record, slept) and the source offers 1,500, so the one task
has its input channel full (``credits`` frames) when the rescale starts; the old owner then
takes its subscales' confirm barriers ahead of the other groups' queued records
(``migration.participant``, record scheduling at the old owner) and slices its slow
frames. Per key the outputs are those of the run without rescaling. The request acts on an
event (the source holds at a moment until the rescale returned: ``tests.jobs.Moment``),
never on wall time."""

from __future__ import annotations

import pytest

from engine.api import StreamJob
from engine.dataflow.config import JobConfig
from engine.io.testing import TestingSink, TestingSource
from tests.jobs import (
    ServiceSum,
    check_reports,
    gates_of,
    moments,
    per_key,
    rescale_at,
    stepped_record,
    stepped_reference,
)

pytestmark = pytest.mark.ray

RECORDS = 3000
CONFIG = JobConfig(batch_size=100, linger_ms=2, credits=4, metrics_port=None,
                   drrs_subscale_size=2)


def test_drrs_out_of_a_backlogged_task_is_exact(ray_cluster):
    records = [stepped_record(i) for i in range(RECORDS)]
    plan = moments(RECORDS, [0.4], 1500)
    sink = TestingSink()
    job = StreamJob("backlogged", num_key_groups=16, parallelism=1, config=CONFIG)
    (job.source(TestingSource(records, rate=1500, gate=gates_of(plan)), name="src",
                parallelism=1)
        .key_by(lambda r: r[0])
        .process(ServiceSum(2000), name="sum")
        .sink(sink, name="out"))
    handle = job.run()
    reports, refused = rescale_at(handle, "sum", [(plan[0], 3)])
    assert not refused, refused
    assert [(r.old_parallelism, r.new_parallelism) for r in reports] == [(1, 3)]
    check_reports(reports, "backlogged drrs scale-out")
    assert reports[0].key_groups_moved > 0
    assert per_key(sink.results()) == per_key(stepped_reference(RECORDS))
