"""A caught-up source task waits before its next poll (issue 32 item 8).

Why: the task actor's loop polled a source again as soon as a poll returned records, so an
open-loop source at half load read only the few records that fell due meanwhile
(20,000-35,000 polls a second at 300,000 records/s) and its task used a whole core on the
polls' fixed costs whatever the rate, the core the count task then waited for on a
2-core machine. The loop now polls at
once only while the source has more to read than one poll takes; a source that read all
that was due waits ``SourceDriver.seconds_until_ready``, at least ``poll_interval`` (1 ms,
never more than the job's ``linger_ms``) after that poll.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.api import StreamJob
from engine.dataflow.config import JobConfig
from engine.io.sources import GeneratorSource
from engine.io.testing import TestingSink
from engine.task.source import CAUGHT_UP_POLL_S, SourceDriver, poll_interval
from engine.time.clock import ManualClock
from tests.unit.test_task_core import Net

RATE = 270_000.0  # records/s: steady.py's half load at p=1


def driver(clock: ManualClock, rate: float = RATE, interval: float = CAUGHT_UP_POLL_S,
           ) -> SourceDriver:
    src = GeneratorSource(rate, num_records=10_000_000, num_keys=100)
    d = SourceDriver(SimpleNamespace(fn=src, watermarks=None), clock,  # type: ignore[arg-type]
                     interval)
    d.start([(p, None) for p in src.partitions(1)], retain=False)
    return d


def test_a_caught_up_source_waits_its_poll_interval_before_polling_again() -> None:
    clock = ManualClock()
    d = driver(clock)
    clock.advance(0.0001)  # 100 us after the open: 28 records due
    batch = d.poll(1000)
    assert batch is not None and 0 < len(batch) < 1000
    assert d.caught_up
    # the next record is due in ~4 us; polling then would read one record per poll
    assert d.seconds_until_ready() == pytest.approx(CAUGHT_UP_POLL_S)
    clock.advance(0.0004)
    assert d.seconds_until_ready() == pytest.approx(CAUGHT_UP_POLL_S - 0.0004)
    clock.advance(0.0006)  # the interval has passed: ~270 records are due, one poll
    assert d.seconds_until_ready() == 0.0
    batch = d.poll(1000)
    assert batch is not None and len(batch) == pytest.approx(RATE * CAUGHT_UP_POLL_S, abs=2)


def test_a_source_with_more_due_than_one_poll_is_polled_at_once() -> None:
    clock = ManualClock()
    d = driver(clock)
    clock.advance(0.01)  # 2,700 records due: a backlog
    batch = d.poll(1000)
    assert batch is not None and len(batch) == 1000
    assert not d.caught_up
    assert d.seconds_until_ready() == 0.0


def test_an_empty_poll_waits_for_the_later_of_the_next_record_and_the_interval() -> None:
    clock = ManualClock()
    d = driver(clock, rate=100.0)  # one record every 10 ms
    assert d.poll(1000) is not None  # record 0, due at the open
    assert d.poll(1000) == d.poll(1000).__class__()  # nothing due: empty
    assert d.caught_up
    assert d.seconds_until_ready() == pytest.approx(0.01)  # the record is later


def test_the_interval_is_one_millisecond_and_never_more_than_the_linger() -> None:
    assert poll_interval(5.0) == CAUGHT_UP_POLL_S == 0.001
    assert poll_interval(0.5) == pytest.approx(0.0005)
    assert poll_interval(0.0) == 0.0
    clock = ManualClock()
    d = driver(clock, interval=poll_interval(0.0))  # no batching delay wanted: as before
    clock.advance(0.0001)
    assert d.poll(1000) is not None and d.caught_up
    assert d.seconds_until_ready() < 2 / RATE  # the next record's due time


@pytest.mark.parametrize("linger_ms, expected", [(5.0, 0.001), (0.0, 0.0)])
def test_a_source_task_core_paces_its_polls_by_its_job_linger(tmp_path, linger_ms, expected):
    clock = ManualClock()
    job = StreamJob("poll", num_key_groups=8,
                    config=JobConfig(linger_ms=linger_ms, metrics_port=None))
    (job.source(GeneratorSource(RATE, num_records=1_000_000, num_keys=100), name="gen")
        .sink(TestingSink(str(tmp_path / "out")), name="out"))
    net = Net(job, clock)
    core = net["gen/0"]
    clock.advance(0.0001)
    assert core.poll_source(1000)  # records were due and read
    assert core.source is not None and core.source.caught_up
    assert core.source.seconds_until_ready() == pytest.approx(expected, abs=1 / RATE + 1e-9)
