"""A drrs rescale's planning asks the tasks for their groups' bytes only, not their keys:
counting a group's keys scans all of its state (on RocksDB every value is read back; 190 MB
in 16 groups: ~0.2 s of one core per task, against ~0.1 ms for the bytes), at every task
of the operator at once, before the first subscale. At Q8 with 1.5 GB on RocksDB drrs's
first subscale started 4.1 s after the request, fluid's (which plans without asking) 0.8 s
(examples/papers/README.md). The adaptive planning of non-disruptive still gets the keys
(its state access ratio is keys touched over keys held)."""

from __future__ import annotations

import pytest

from engine.dataflow.config import JobConfig
from engine.state.rocksdb import RocksDBKeyedStateBackend
from engine.time.clock import ManualClock
from engine.wire.messages import GroupStatsRequest, decode_message, encode_message
from migration.coordinator import LiveRescale, Phase, RescaleRequest, SendControl
from tests.unit.test_coordinator import Driver, context, finish_running, reply

SIZED = JobConfig(metrics_port=None, drrs_subscale_bytes=150, drrs_subscale_size=4)


def _plan_request(protocol: str, config: JobConfig = SIZED) -> GroupStatsRequest:
    """The message the coordinator's planning sends to each task (runs the rescale on)."""
    coord = LiveRescale(RescaleRequest("sum", 3, protocol), context(config=config),
                        ManualClock())
    d = Driver(coord, finish_running)
    cmd = d.run(until=lambda c: isinstance(c, SendControl) and c.phase == Phase.PLAN)
    msgs = {c.message for c in cmd.calls}
    assert len(msgs) == 1 and not coord.committed
    d.queue.extend(coord.on_result(cmd, [reply(c.message, c.task) for c in cmd.calls]))
    d.run()
    assert coord.committed and coord.done
    msg = msgs.pop()
    assert isinstance(msg, GroupStatsRequest)
    return msg


def test_drrs_plans_from_the_groups_bytes_without_counting_their_keys():
    assert _plan_request("drrs") == GroupStatsRequest(keys=False)


def test_the_adaptive_non_disruptive_planning_still_counts_the_keys():
    assert _plan_request("non-disruptive") == GroupStatsRequest(keys=True)


@pytest.mark.parametrize("keys", [True, False])
def test_the_request_says_whether_to_count_keys_on_the_wire(keys):
    assert decode_message(encode_message(GroupStatsRequest(keys))).keys is keys
    assert GroupStatsRequest().keys  # the default: as before (controllers, replication)


def test_a_reply_without_keys_gives_the_bytes_and_reads_no_state(tmp_path, monkeypatch):
    from engine.observability.groupstats import GroupCounters

    b = RocksDBKeyedStateBackend(4, str(tmp_path / "db"), task="t-0")
    try:
        for kg in (0, 1):
            b.own(kg)
            for k in range(5):
                b.set_current((kg, k), kg)
                b.table("persons")[(kg, k)] = "x" * 1000
        c = GroupCounters(1, 0.0)
        full = c.reply("t", b, 1.0)
        assert [g[3] for g in full.groups] == [5, 5]

        def no_scan(kg: int) -> tuple[int, int | None]:
            raise AssertionError("the keys were counted")

        monkeypatch.setattr(b, "group_stats", no_scan)
        light = c.reply("t", b, 2.0, keys=False)
        assert [(g[0], g[2], g[3]) for g in light.groups] == \
            [(g[0], g[2], None) for g in full.groups]
        assert all(g[2] > 5000 for g in light.groups)
    finally:
        b.close()
