"""Spacker's adaptive default turns replication on, on real Ray (issue 32 item 7): the
tasks count their keys per key group and the distinct keys they touch per second, the
JobMaster gives the rescale the operator's capacity from its latest metrics window, and a
non-disruptive rescale without a planning of large state that few keys touch chooses
replication; the output stays exact."""

from __future__ import annotations

from typing import Any

import pytest

from engine import JobConfig, StreamJob
from engine.dataflow.keygroups import key_group_of
from engine.io.testing import SourceGate, TestingSink, TestingSource
from engine.operators.functions import KeyedProcessFunction
from tests.jobs import Moment, check_reports, per_key, running_sum_reference, wait_until

pytestmark = pytest.mark.ray

GROUPS = 8
KEYS = 240
PAD = 50_000  # bytes of state per key: ~1.5 MB per key group, 12 MB in all
HOT = 700  # records over one key per group after the fill: 8 of 240 keys touched, 3 %
RATE = 100.0  # records/s: the hot phase lasts 7 s, longer than a measuring period + window


class PaddedSum(KeyedProcessFunction):
    """Per key a running sum and, from its first record, ``record[2]`` bytes of padding;
    emits ``(key, sum)`` (the running-sum oracle's output)."""

    def open(self, ctx: Any) -> None:
        self.pad = ctx.value_state("pad", None)
        self.sum = ctx.value_state("sum", 0)

    def process_element(self, value: Any, ctx: Any) -> Any:
        if self.pad.value() is None:
            self.pad.update(bytes(value[2]))
        total = self.sum.value() + value[1]
        self.sum.update(total)
        yield (ctx.key, total)


def test_an_adaptive_rescale_of_large_state_with_low_access_turns_replication_on(ray_cluster):
    fill = [(k, k % 7, PAD) for k in range(KEYS)]  # every key gets its state once
    hot_keys = sorted({key_group_of(k, GROUPS): k for k in range(KEYS)}.values())
    assert len(hot_keys) == GROUPS  # one per group: both tasks keep counting windows
    hot = [(hot_keys[i % GROUPS], i % 5, 0) for i in range(HOT)]
    records = fill + hot
    filled = SourceGate(len(fill))
    moment = Moment.at(len(records) - 20, 10, len(records))
    sink = TestingSink()
    cfg = JobConfig(batch_size=20, linger_ms=5, metrics_poll_interval_s=0.5)
    job = StreamJob("adaptive-replication", num_key_groups=GROUPS, config=cfg)
    (job.source(TestingSource(records, rate=RATE, gate=(filled, *moment.gates)), name="src",
                parallelism=1)
        .key_by(lambda r: r[0])
        .process(PaddedSum(), name="sum", parallelism=2)
        .sink(sink, name="out"))
    h = job.run()

    def rescale() -> Any:
        # every hot record processed: the latest measuring windows hold hot keys only
        wait_until(lambda: len(sink.results()) >= len(records) - 20,
                   "the sums of every record before the rescale", h)
        return h.rescale("sum", 3, protocol="non-disruptive")

    try:
        wait_until(filled.reached, "the source to emit every key once", h)
        # the fill processed before the hot records flow: no window mixes the two phases
        # after the first hot frame
        wait_until(lambda: len(sink.results()) >= len(fill), "the fill's sums", h)
        filled.open()
        report = moment.run(h, rescale, job_timeout=120)
    finally:
        filled.open()
    check_reports([report])
    reason = report.planning_reason
    assert report.protocol == "non-disruptive" and report.key_groups_moved > 0
    assert "adaptive" in reason and "large state" in reason, reason
    assert "replicate the hottest 50%" in reason, reason
    assert "replication 'hot' on from now" in reason, reason
    # measured, not assumed: distinct keys counted, the capacity from the metrics window
    assert "not measured" not in reason and "bounded by the records" not in reason, reason
    assert "of capacity" in reason, reason
    assert per_key(sink.results()) == per_key(running_sum_reference(
        [(k, v) for k, v, _ in records]))
