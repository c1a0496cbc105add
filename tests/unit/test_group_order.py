"""Per-key order across a live migration, at the receivers of the migrating operator
(``engine.task.group_order``): the old owner's outputs of a group reach a receiver before the new
owner's, whatever the interleaving. Without the ``GroupLeft``/``GroupArrived`` markers the
seeded rescales below reorder a key's running sums at a keyed operator downstream in about
one run of ten (fluid, batched, non-disruptive)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from engine.api import StreamJob
from engine.dataflow.config import JobConfig
from engine.dataflow.keygroups import uniform_assignment
from engine.io.testing import TestingSink, TestingSource
from engine.task.group_order import GroupOrder
from engine.time.clock import ManualClock
from migration.protocols import LIVE
from tests.unit.test_drrs_core import DNet, N, add, per_key, running_sum_reference


def test_an_arrival_waits_for_its_left_and_a_left_first_lets_it_pass():
    o = GroupOrder()
    assert o.on_arrived((1, 5), channel=7) is True      # the new owner's marker came first
    assert o.on_left((1, 6)) is None                     # another group: remembered
    assert o.on_left((1, 5)) == 7                        # channel 7 may be read again
    assert o.on_arrived((1, 6), channel=8) is False      # its left came first: go on
    assert not o.lefts and not o.waiting


def test_markers_on_several_paths_pair_up_one_by_one():
    o = GroupOrder()
    assert o.on_left((2, 1)) is None and o.on_left((2, 1)) is None
    assert o.on_arrived((2, 1), 3) is False and o.on_arrived((2, 1), 4) is False
    assert o.on_arrived((2, 1), 3) is True and o.on_left((2, 1)) == 3
    assert o.describe() == []


def test_unmatched_lefts_are_bounded():
    o = GroupOrder()
    for kg in range(GroupOrder.MAX_UNMATCHED + 10):
        o.on_left((0, kg))
    assert len(o.lefts) == GroupOrder.MAX_UNMATCHED and (0, 0) not in o.lefts


def chained_sums_job(records, sink, config) -> StreamJob:
    """src -> key_by -> running sum "sum" (rescaled) -> key_by(same key) -> "last", which
    emits the latest running sum it got per key -> sink: "last"'s outputs per key are the
    running sums in record order only if it takes each key's sums in order."""
    job = StreamJob("order", num_key_groups=N, config=config)
    (job.source(TestingSource(records), name="src")
        .key_by(lambda r: r[0])
        .reduce(add, name="sum", parallelism=2)
        .key_by(lambda r: r[0])
        .reduce(lambda a, b: b, name="last", parallelism=2)
        .sink(sink, name="out", parallelism=2))
    return job


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("protocol", sorted(LIVE))
def test_a_keyed_operator_downstream_gets_each_key_in_order(tmp_path, protocol, seed):
    rng = random.Random(seed)
    print(f"order downstream: protocol={protocol} seed={seed}")
    records = [(rng.randrange(24), rng.randrange(100)) for _ in range(300)]
    cfg = JobConfig(batch_size=4, linger_ms=0, metrics_port=None,
                    drrs_set_aside_cap=rng.choice([1, 3, 200]))
    sink = TestingSink(str(tmp_path / "out"))
    net = DNet(chained_sums_job(records, sink, cfg), ManualClock())
    src = net["src/0"]
    for _ in range(15):
        src.poll_source(rng.randint(1, 6))
        net._random_round(rng, 10**9)
    plan, reports = net.drrs("sum", uniform_assignment(N, 3), rng, size=2, protocol=protocol)
    assert plan.moved and reports, "the rescale moved nothing"
    net.run_sources()
    got: dict[Any, list] = per_key(sink.results())
    assert got == per_key(running_sum_reference(records))
    for core in net.cores.values():
        assert not core.group_order.waiting and not core.group_order.lefts
