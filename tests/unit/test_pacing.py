"""drrs paces its migration by measured headroom (migration.pacing): the pacer's limit, and
a coordinator that starts fewer subscales at once when the machine has no idle cores."""

from __future__ import annotations

from typing import Any

import pytest

from engine.dataflow.config import JobConfig
from engine.time.clock import ManualClock
from engine.wire.messages import ExpectIncoming
from migration.coordinator import AwaitReports, LiveRescale, RescaleRequest
from migration.pacing import HeadroomPacer
from migration.participant import NewOwnerRole
from tests.unit.test_coordinator import Driver, context, finish_running


def test_pacer_limits_follow_idle_cores_within_bounds() -> None:
    p = HeadroomPacer(4, cores_per_subscale=0.5)
    assert p.limit == 1  # no measurement yet: one at a time
    assert p.observe(0.0) == 1  # a busy machine: one at a time, never none
    assert p.observe(4.0) == 4  # moving average (0 + 4) / 2 = 2 idle cores -> 4
    assert p.observe(10.0) == 4  # never above the configured number
    assert HeadroomPacer(2).observe(0.9) == 1
    assert "1-4 subscales at once, 0-0 kB in flight beyond one group, over 3 samples" \
        in p.describe()
    with pytest.raises(ValueError):
        HeadroomPacer(0)


def test_chunk_bytes_follow_idle_cores_one_group_at_a_time_when_busy() -> None:
    p = HeadroomPacer(4, cores_per_subscale=0.5, max_chunk_bytes=1000)
    assert p.chunk_bytes == 0  # no measurement yet: one group at a time
    p.observe(0.4)
    assert p.chunk_bytes == 0  # under half a core idle: one group at a time
    p.observe(1.6)  # average 1.0: half-way from 0.5 to 1.5 idle cores
    assert p.chunk_bytes == 500
    p.observe(3.0)  # average 2.0
    assert p.chunk_bytes == 1000  # never above the configured bytes
    assert HeadroomPacer(2).observe(8.0) == 2 and HeadroomPacer(2).chunk_bytes == 0
    assert "0-1 kB in flight" in p.describe()
    with pytest.raises(ValueError):
        HeadroomPacer(1, max_chunk_bytes=-1)


def test_the_new_owner_pulls_within_its_chunk_of_state_in_flight() -> None:
    sizes = {1: 300, 2: 300, 3: 300, 4: 300}
    one = NewOwnerRole()
    one.expect(7, (1, 2, 3, 4), (10,), 11, old_owner="s")
    one.on_triggered(7, sizes, pushed=1)
    assert one.next_pull(7) is None  # one group in flight: wait for it
    chunked = NewOwnerRole()
    chunked.expect(7, (1, 2, 3, 4), (10,), 11, old_owner="s", chunk_bytes=700)
    chunked.on_triggered(7, sizes, pushed=1)
    assert [chunked.next_pull(7), chunked.next_pull(7), chunked.next_pull(7)] == [2, 3, None]
    chunked.on_state(7, 1, 300, 0)  # one arrived: room for one more
    assert chunked.next_pull(7) == 4 and chunked.next_pull(7) is None


def _max_running(cfg: JobConfig, idle: float | None) -> tuple[int, str]:
    """Scale 2 -> 6 with drrs; before every wait the runtime's headroom sample is
    ``idle`` (None: none measured). Returns the most subscales running at once."""
    most, reason, _ = _paced_run(cfg, idle)
    return most, reason


def _paced_run(cfg: JobConfig, idle: float | None) -> tuple[int, str, set[int]]:
    """As ``_max_running``, and the chunk bytes the new owners were given."""
    coord = LiveRescale(RescaleRequest("sum", 6, "drrs"), context(config=cfg),
                        ManualClock())
    most = [0]

    def on_wait(d: Driver, cmd: AwaitReports) -> list[Any]:
        if coord._sched is not None:
            most[0] = max(most[0], len(coord._sched.running))
        if idle is not None:
            coord.on_headroom(idle)
        return finish_running(d, cmd)

    d = Driver(coord, on_wait)
    d.run()
    assert coord.done and coord.report().key_groups_moved == coord.report().key_groups_planned
    chunks = {m.chunk_bytes for _, m in d.sent(ExpectIncoming)}
    return most[0], coord.report().planning_reason, chunks


def test_the_coordinator_gives_new_owners_the_paced_chunk() -> None:
    cfg = JobConfig(metrics_port=None, drrs_subscale_bytes=None, drrs_subscale_size=1,
                    drrs_max_subscales=4, drrs_max_subscales_per_task=4,
                    drrs_max_chunk_bytes=2_000_000)
    assert _paced_run(cfg, 0.0)[2] == {0}  # busy: one group at a time
    _, reason, idle_chunks = _paced_run(cfg, 8.0)
    assert 2_000_000 in idle_chunks and "0-2000 kB in flight" in reason
    unpaced = JobConfig(**{**cfg.__dict__, "drrs_pacing": False})
    assert _paced_run(unpaced, 0.0)[2] == {2_000_000}  # unpaced: the most, always


def test_a_busy_machine_gets_one_subscale_at_a_time_an_idle_one_more() -> None:
    cfg = JobConfig(metrics_port=None, drrs_subscale_bytes=None, drrs_subscale_size=1,
                    drrs_max_subscales=4, drrs_max_subscales_per_task=4)
    busy, reason = _max_running(cfg, 0.0)
    assert busy == 1 and "paced by headroom: 1-1 subscales at once" in reason
    idle, _ = _max_running(cfg, 8.0)
    assert idle > 1
    unpaced, reason = _max_running(JobConfig(**{**cfg.__dict__, "drrs_pacing": False}), 0.0)
    assert unpaced > 1 and "paced" not in reason
