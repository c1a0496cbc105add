"""drrs paces its migration by measured headroom (migration.pacing): the pacer's limit, and
a coordinator that starts fewer subscales at once when the machine has no idle cores."""

from __future__ import annotations

from typing import Any

import pytest

from engine.clock import ManualClock
from engine.config import JobConfig
from migration.coordinator import AwaitReports, LiveRescale, RescaleRequest
from migration.pacing import HeadroomPacer
from tests.unit.test_coordinator import Driver, context, finish_running


def test_pacer_limits_follow_idle_cores_within_bounds() -> None:
    p = HeadroomPacer(4, cores_per_subscale=0.5)
    assert p.limit == 1  # no measurement yet: one at a time
    assert p.observe(0.0) == 1  # a busy machine: one at a time, never none
    assert p.observe(4.0) == 4  # moving average (0 + 4) / 2 = 2 idle cores -> 4
    assert p.observe(10.0) == 4  # never above the configured number
    assert HeadroomPacer(2).observe(0.9) == 1
    assert "1-4 subscales at once over 3 samples" in p.describe()
    with pytest.raises(ValueError):
        HeadroomPacer(0)


def _max_running(cfg: JobConfig, idle: float | None) -> tuple[int, str]:
    """Scale 2 -> 6 with drrs; before every wait the runtime's headroom sample is
    ``idle`` (None: none measured). Returns the most subscales running at once."""
    coord = LiveRescale(RescaleRequest("sum", 6, "drrs"), context(config=cfg),
                        ManualClock())
    most = [0]

    def on_wait(d: Driver, cmd: AwaitReports) -> list[Any]:
        if coord._sched is not None:
            most[0] = max(most[0], len(coord._sched.running))
        if idle is not None:
            coord.on_headroom(idle)
        return finish_running(d, cmd)

    Driver(coord, on_wait).run()
    assert coord.done and coord.report().key_groups_moved == coord.report().key_groups_planned
    return most[0], coord.report().planning_reason


def test_a_busy_machine_gets_one_subscale_at_a_time_an_idle_one_more() -> None:
    cfg = JobConfig(metrics_port=None, drrs_subscale_bytes=None, drrs_subscale_size=1,
                    drrs_max_subscales=4, drrs_max_subscales_per_task=4)
    busy, reason = _max_running(cfg, 0.0)
    assert busy == 1 and "paced by headroom: 1-1 subscales at once" in reason
    idle, _ = _max_running(cfg, 8.0)
    assert idle > 1
    unpaced, reason = _max_running(JobConfig(**{**cfg.__dict__, "drrs_pacing": False}), 0.0)
    assert unpaced > 1 and "paced" not in reason
