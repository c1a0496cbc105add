"""Placement (migration.coordinator.Placement) without Ray: the router's channel swap, the
coordinator's commands stepped by hand, and the engine's coordinator against real task
cores under seeded random interleavings (tests/harness.py), for every live protocol."""

from __future__ import annotations

import random
from typing import Any

import pytest

from engine.dataflow.config import JobConfig
from engine.dataflow.keygroups import uniform_assignment
from engine.errors import RescaleRefused
from engine.task.channel import OutputRouter
from engine.time.clock import ManualClock
from engine.wire.messages import OutputChannel, OutputEdge, ReplaceOutputChannel, StopTask
from migration.coordinator import (
    CreateTasks,
    Placement,
    RemoveTasks,
    RescaleRequest,
    SendControl,
    UpdateVertex,
    coordinator_for,
)
from migration.protocols import LIVE
from tests import harness
from tests.unit.test_coordinator import Driver, context, finish_running
from tests.unit.test_drrs_core import (
    DNet,
    N,
    drrs_job,
    key_in,
    per_key,
    running_sum_reference,
)

# ------------------------------------------------------------------ the router's swap


ROUTING = uniform_assignment(N, 3)


def _router() -> OutputRouter:
    r = OutputRouter(100, 0.0, N, {0: lambda v: v[0]}, lambda: 0.0)
    r.connect([OutputEdge(0, "keyed", tuple(OutputChannel(100 + i, f"t{i}", 0)
                                            for i in range(3)), ROUTING)])
    return r


def test_the_last_channel_takes_the_retired_ones_place_and_routing():
    r = _router()
    r.add_channels(0, [OutputChannel(103, "t3", 0)])
    ones = [kg for kg in range(N) if ROUTING[kg] == 1]
    r.emit([(key_in(ones[0]), "x")], [1])  # buffered for channel 1 ...
    r.redirect(0, ones, 3)  # ... moves with its group to the new channel
    r.replace_channel(101, 103)
    e = r.edges[0]
    assert [c.channel_id for c in e.channels] == [100, 103, 102]
    assert e.routing == ROUTING
    r.emit([(key_in(ones[1]), "y")], [2])
    r.flush_all()
    assert [(f.channel_id, f.seq, f.records) for f in r.outbox] == [(103, 0, 2)]


def test_a_channel_still_routed_to_cannot_be_retired():
    r = _router()
    r.add_channels(0, [OutputChannel(103, "t3", 0)])
    with pytest.raises(ValueError, match="routing still points"):
        r.replace_channel(101, 103)
    with pytest.raises(ValueError, match="last channel"):
        r.replace_channel(103, 101)
    with pytest.raises(ValueError, match="no output edge"):
        r.replace_channel(7, 8)


# ------------------------------------------------------------------ the coordinator by hand


def test_a_placement_moves_every_group_of_the_task_then_swaps_it_out():
    ctx = context(sum_p=3)
    old_names = ctx.deployment.tasks["sum"]
    coord = coordinator_for(RescaleRequest("sum", 3, "drrs", place=(1, "node-b")), ctx,
                            ManualClock())
    assert isinstance(coord, Placement)
    d = Driver(coord, finish_running)
    assert d.run() is None and coord.done
    created = next(c for c in d.log if isinstance(c, CreateTasks))
    (new,) = created.names
    assert dict(created.nodes) == {new: "node-b"} and dict(created.indices) == {new: 1}
    assert sorted(coord.plan.moved) == [kg for kg, t in enumerate(uniform_assignment(N, 3))
                                        if t == 1]
    swaps = d.sent(ReplaceOutputChannel)
    assert [t for t, _ in swaps] == list(ctx.deployment.tasks["src"])
    ids = ctx.channel_ids
    assert swaps[0][1] == ReplaceOutputChannel(ids.get(0, swaps[0][0], old_names[1]),
                                               ids.get(0, swaps[0][0], new))
    assert d.sent(StopTask) == [(old_names[1], StopTask(True))]
    assert next(c for c in d.log if isinstance(c, RemoveTasks)).names == (old_names[1],)
    final = [c for c in d.log if isinstance(c, UpdateVertex)][-1]
    assert final.tasks == (old_names[0], new, old_names[2])
    assert final.assignment == uniform_assignment(N, 3)
    r = coord.report()
    assert (r.old_parallelism, r.new_parallelism) == (3, 3)
    assert r.key_groups_moved == r.key_groups_planned == len(coord.plan.moved)
    swap = next(i for i, c in enumerate(d.log) if isinstance(c, SendControl)
                and isinstance(c.calls[0].message, ReplaceOutputChannel))
    stop = next(i for i, c in enumerate(d.log) if isinstance(c, SendControl)
                and isinstance(c.calls[0].message, StopTask))
    assert swap < stop  # nothing is sent to the old task once it is told to stop


def test_a_superseded_placement_keeps_both_tasks():
    ctx = context(sum_p=2)
    coord = coordinator_for(RescaleRequest("sum", 2, "fluid", place=(0, "node-b")), ctx,
                            ManualClock())

    def supersede_then_finish(driver: Driver, cmd: Any) -> list[Any]:
        coord.supersede()
        return finish_running(driver, cmd)

    d = Driver(coord, supersede_then_finish)
    d.run()
    assert coord.done and not d.sent(ReplaceOutputChannel) and not d.sent(StopTask)
    r = coord.report()
    assert r.new_parallelism == 3 and r.cut_short


def test_a_placement_needs_a_live_protocol_and_a_task_with_groups():
    with pytest.raises(RescaleRefused, match="not a live protocol"):
        coordinator_for(RescaleRequest("sum", 2, "stop-restart", place=(0, "n")), context(),
                        ManualClock())
    with pytest.raises(ValueError, match="no task 2"):
        RescaleRequest("sum", 2, "drrs", place=(2, "n"))


# ------------------------------------------------------------------ against task cores


class PNet(DNet):
    """``DNet`` whose shell also settles the frames sent to a retired task before it is
    told to stop (the task actor waits for their acknowledgements)."""

    def _settle(self, cmd: Any) -> None:
        super()._settle(cmd)
        if any(isinstance(c.message, ReplaceOutputChannel) for c in cmd.calls):
            self.pump()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("protocol", sorted(LIVE))
def test_running_sums_with_a_placement_in_the_middle_equal_the_reference(protocol, seed):
    import tempfile

    from engine.io.testing import TestingSink

    rng = random.Random(f"place-{protocol}-{seed}")
    records = [(rng.randrange(24), rng.randrange(100)) for _ in range(300)]
    cfg = JobConfig(batch_size=4, linger_ms=0, metrics_port=None,
                    drrs_set_aside_cap=rng.choice([1, 3, 200]), drrs_subscale_size=2)
    sink = TestingSink(tempfile.mkdtemp(prefix="reflow-placement-"))
    src_p = rng.choice([1, 2])
    net = PNet(drrs_job(records, sink, sum_p=3, src_p=src_p, config=cfg), ManualClock())
    for _ in range(12):
        for u in net.sources():
            u.poll_source(rng.randint(1, 6))
        net._random_round(rng, 10**9)
    index = rng.randrange(3)
    before = net.dep.tasks["sum"]
    net.auto_pull = False
    coord, report, _ = harness.rescale(
        net, RescaleRequest("sum", 3, protocol, place=(index, "node-b")),
        lambda: net._random_round(rng, 12), after_send=net._settle, max_subscales=2)
    assert report.new_parallelism == 3 and not report.cut_short
    after = net.dep.tasks["sum"]
    assert [a == b for a, b in zip(before, after, strict=True)] == [i != index for i in range(3)]
    assert before[index] not in net.cores
    placed = net.cores[after[index]]
    assert placed.spec.task_index == index
    assert placed.backend.owned() == [kg for kg in range(N)
                                      if uniform_assignment(N, 3)[kg] == index]
    net.run_sources()
    assert len(sink.results()) == 300
    if src_p == 1:
        assert per_key(sink.results()) == per_key(running_sum_reference(records))
    totals = {k: sum(v for kk, v in records if kk == k) for k, _ in records}
    assert {k: max(v for _, v in rs) for k, rs in per_key(sink.results()).items()} == totals
    for u in net.sources():
        assert u.router.edges[0].routing == uniform_assignment(N, 3)
    assert all(c.status == "finished" for c in net.cores.values())
