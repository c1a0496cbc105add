"""The delivery guarantee of each sink (``engine.dataflow.guarantees``): decided from the sink's
two-phase commit and the job's checkpoints, restarts and restore; at-least-once sinks
named in a warning."""

from __future__ import annotations

import pytest

from engine.api import StreamJob
from engine.dataflow.config import JobConfig
from engine.dataflow.guarantees import (
    DeliveryGuarantee,
    at_least_once_warnings,
    guarantee_of,
    sink_guarantees,
)
from engine.io.sinks import LatencySink, ParquetSink
from engine.io.testing import TestingSink, TestingSource

EO, ALO, NONE = (DeliveryGuarantee.EXACTLY_ONCE, DeliveryGuarantee.AT_LEAST_ONCE,
                 DeliveryGuarantee.NONE)


@pytest.mark.parametrize(("two_phase", "checkpointing", "restarts", "restoring", "expected"), [
    (True, True, True, False, EO),
    (True, True, False, True, EO),
    (False, True, True, False, ALO),
    (False, True, False, False, ALO),
    (True, False, True, False, ALO),    # restarts replay from the start, no transactions
    (False, False, True, True, ALO),
    (False, False, False, True, ALO),   # a restore writes again what followed its point
    (True, False, False, True, NONE),   # the restore commits; a failure ends the job
    (True, False, False, False, NONE),
    (False, False, False, False, NONE),
])
def test_guarantee_of(two_phase: bool, checkpointing: bool, restarts: bool, restoring: bool,
                      expected: DeliveryGuarantee) -> None:
    guarantee, reason = guarantee_of(two_phase, checkpointing, restarts, restoring)
    assert guarantee == expected
    assert reason


def _job(config: JobConfig) -> StreamJob:
    job = StreamJob("g", config=config)
    (job.source(TestingSource([1, 2, 3]), name="src")
        .map(lambda x: x, name="double", dead_letter=LatencySink())
        .sink(TestingSink(), name="committed"))
    job.source(TestingSource([4]), name="src2").sink(LatencySink(), name="latency")
    return job


def test_sinks_of_a_checkpointing_job_and_the_warning(tmp_path: object) -> None:
    job = _job(JobConfig(checkpoint_interval_s=1.0))
    got = sink_guarantees(job.graph(), job.config, restoring=False)
    assert [(s.operator, s.role, s.sink, s.guarantee) for s in got] == [
        ("double", "dead_letter", "LatencySink", "at-least-once"),
        ("committed", "sink", "TestingSink", "exactly-once"),
        ("latency", "sink", "LatencySink", "at-least-once"),
    ]
    warnings = at_least_once_warnings(got)
    assert len(warnings) == 2
    assert warnings[0].startswith("sink 'double' (dead_letter) (LatencySink) is at-least-once")
    assert warnings[1].startswith("sink 'latency' (LatencySink) is at-least-once")
    assert "writes the records after that checkpoint again" in warnings[1]
    assert ParquetSink.exactly_once and not LatencySink.exactly_once


def test_a_job_without_checkpoints_or_restarts_warns_of_nothing() -> None:
    job = _job(JobConfig())
    got = sink_guarantees(job.graph(), job.config, restoring=False)
    assert {s.guarantee for s in got} == {"none"}
    assert at_least_once_warnings(got) == []
    restored = sink_guarantees(job.graph(), job.config, restoring=True)
    assert [s.guarantee for s in restored] == ["at-least-once", "none", "at-least-once"]
