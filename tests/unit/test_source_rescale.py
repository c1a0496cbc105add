"""A source rescaled live: the engine's coordinator (``SourceRescale``) hands the source's
partitions over to a new set of tasks, run by ``tests/harness.py`` on task cores under
seeded random interleavings (sources read, frames arrive late and out of order, cores step
in random amounts). The oracle: per key, the outputs equal those of a plain-Python
reference (the run without rescaling), and no event-time record is late.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.api import StreamJob
from engine.dataflow.config import JobConfig
from engine.dataflow.deployment import start_messages
from engine.io.testing import TestingSink, TestingSource
from engine.time.clock import ManualClock
from engine.time.event_time import WatermarkStrategy, tumbling_event_time
from engine.wire.messages import AddInputs, ReleaseSource, SourceReleased
from migration.coordinator import HANDOVER, RescaleRequest, SourceRescale
from tests import harness
from tests.unit.test_drrs_core import DNet, per_key

N = 16
CFG = JobConfig(batch_size=4, linger_ms=0, metrics_port=None)
PARTS = 6


def records(n: int) -> list[tuple[int, int, int]]:
    """Record i is ``(key, 1, i)`` with a key of partition ``i % PARTS`` only, so a key's
    records come along one path (one partition) and its running sums are exact."""
    return [((i % PARTS) * 10 + (i // PARTS) % 3, 1, i) for i in range(n)]


def job(recs: list[Any], sink: TestingSink, src_p: int, *, windowed: bool = False,
        ) -> StreamJob:
    j = StreamJob("src-rescale", num_key_groups=N, config=CFG)
    src = j.source(TestingSource(recs, partitions=PARTS, timestamp_fn=lambda r: r[2] * 10),
                   name="src", parallelism=src_p,
                   watermarks=WatermarkStrategy(0) if windowed else None)
    keyed = src.key_by(lambda r: r[0])
    if windowed:
        (keyed.window(tumbling_event_time(50))
            .reduce(lambda a, b: (a[0], a[1] + b[1], max(a[2], b[2])), name="sum",
                    parallelism=2, window_fn=lambda k, w, r: [(k, w.start, r[1])])
            .sink(sink, name="out"))
    else:
        keyed.reduce(lambda a, b: (a[0], a[1] + b[1]), name="sum", parallelism=2).sink(
            sink, name="out")
    return j


def reduce_reference(recs: list[Any]) -> list[Any]:
    """What the job's reduce emits without rescaling: per key, the record, then sums."""
    acc: dict[int, Any] = {}
    out = []
    for r in recs:
        acc[r[0]] = r if r[0] not in acc else (r[0], acc[r[0]][1] + r[1])
        out.append(acc[r[0]])
    return out


def random_round(net: DNet, rng: random.Random) -> None:
    """test_drrs_core's random round: sources read, cores step, frames arrive, at random."""
    net._random_round(rng, 0)


def finish(net: DNet) -> None:
    while any(c.status == "running" for c in net.sources()):
        for c in net.sources():
            c.poll_source(7)
        net.pump()
    net.pump()


def rescale_source(net: DNet, p: int, rng: random.Random) -> Any:
    request = RescaleRequest("src", p, "drrs")
    # what a task actor's shell does: a control call's frames leave before it returns
    coord, report, _ = harness.rescale(net, request, lambda: random_round(net, rng),
                                       after_send=lambda cmd: net.collect())
    assert isinstance(coord, SourceRescale)
    return report


@settings(max_examples=25, deadline=None)
@given(src_p=st.integers(1, 3), steps=st.lists(st.integers(1, PARTS), min_size=1, max_size=3),
       seed=st.integers(0, 2**32 - 1), windowed=st.booleans())
def test_a_source_rescaled_live_gives_the_results_of_a_run_without(
        tmp_path_factory: pytest.TempPathFactory, src_p: int, steps: list[int], seed: int,
        windowed: bool) -> None:
    rng = random.Random(seed)
    recs = records(240)
    sink = TestingSink(str(tmp_path_factory.mktemp("out")))
    net = DNet(job(recs, sink, src_p, windowed=windowed), ManualClock())
    reports = []
    for p in steps:
        for _ in range(rng.randint(1, 12)):
            random_round(net, rng)
        reports.append(rescale_source(net, p, rng))
    finish(net)
    check_oracle(net, sink, recs, steps, reports, windowed,
                 f"src_p={src_p} steps={steps} seed={seed} windowed={windowed}")


def check_oracle(net: DNet, sink: TestingSink, recs: list[Any], steps: list[int],
                 reports: list[Any], windowed: bool, where: str) -> None:
    """Per key the results of the run without rescaling; and the rescales asked for ran
    (an example that rescaled nothing fails here)."""
    assert reports and [r.new_parallelism for r in reports] == steps, where
    assert all(r.protocol == HANDOVER for r in reports)
    assert len(net.dep.tasks["src"]) == steps[-1]
    got = sink.results()
    if windowed:
        want: dict[tuple[int, int], int] = {}
        for k, _, i in recs:
            want[(k, i * 10 // 50 * 50)] = want.get((k, i * 10 // 50 * 50), 0) + 1
        assert sorted(got) == sorted((k, w, n) for (k, w), n in want.items()), where
        assert sum(c.keyed.late_records for c in net.cores.values() if c.keyed) == 0, where
    else:
        assert per_key(got) == per_key(reduce_reference(recs)), where
    # every partition was read to its end exactly once: each reported state says so
    last = {p: s for t, states in reports[-1].source_offsets for p, s in states.items()}
    assert set(last) == {f"{j}-of-{PARTS}" for j in range(PARTS)}


def test_an_example_without_a_rescale_fails_the_oracle(tmp_path):
    sink = TestingSink(str(tmp_path / "out"))
    recs = records(60)
    net = DNet(job(recs, sink, 2), ManualClock())
    finish(net)
    with pytest.raises(AssertionError):
        check_oracle(net, sink, recs, [3], [], False, "no rescale")


def test_the_handover_holds_new_channels_until_the_old_ones_end(tmp_path):
    """Step by step: a receiver reads the new source tasks' channels only after the old
    ones delivered EndOfStream; the released task's offsets are where it stopped."""
    sink = TestingSink(str(tmp_path / "out"))
    recs = records(120)
    net = DNet(job(recs, sink, 2), ManualClock())
    src0 = net["src/0"]
    src0.poll_source(4)
    net.collect()
    held_frames = list(net.frames)  # src/0's records, not delivered yet
    net.frames.clear()
    assert held_frames
    # what SourceRescale does, by hand: a receiver waits for src/0 -> sum/0 to end
    old = net.cid("src/0", "sum/0")
    sum0 = net["sum/0"]
    assert sum0.handle(AddInputs(((999, 0),), (old,))) is not None
    assert 999 in sum0._step_blocked
    reply = src0.handle(ReleaseSource())
    assert isinstance(reply, SourceReleased) and reply.task == src0.name
    assert set(reply.offsets) == {"0-of-6", "2-of-6", "4-of-6"}
    assert sum(reply.offsets.values()) == 4, "where it stopped: 4 records read"
    assert src0.status == "stopped" and not src0.poll_source(5)
    net.collect()
    ends = [f for f in net.frames if f.target == sum0.name]
    for f in held_frames + ends:  # the old channel's frames, EndOfStream last
        net.cores[f.target].receive(f.channel_id, f.seq, f.payload)
    net.frames = [f for f in net.frames if f.target != sum0.name]
    assert 999 in sum0._step_blocked, "blocked until the old channel is processed"
    net.run("sum/0")
    assert 999 not in sum0._step_blocked
    assert sum0.inputs[old].ended


def test_start_messages_give_each_source_task_its_partitions(tmp_path):
    sink = TestingSink(str(tmp_path / "out"))
    net = DNet(job(records(12), sink, 4), ManualClock())
    starts = start_messages(net.dep, {"src": {"1-of-6": 1}})
    got = {n: m.partitions for n, m in starts.items() if "/src/" in n}
    assert list(got.values()) == [(("0-of-6", None), ("4-of-6", None)),
                                  (("1-of-6", 1), ("5-of-6", None)),
                                  (("2-of-6", None),), (("3-of-6", None),)]
    assert all(m.partitions == () for n, m in starts.items() if "/src/" not in n)
