"""The event-time invariant of a live rescale, stepped by hand and at random without Ray.

**No watermark passes a record still on its way to the operator that will process it.**
During a migration a record of a moving key group may be re-routed by the old owner to the
new one, set aside there, or wait for its state; the new owner (a new task learns its
predecessors' watermarks at once) may already have sent a later watermark downstream. So the
old owner puts a *watermark hold* on its output channels when the group freezes
(``WatermarkHold``, at its watermark then) and the new owner lifts it once everything of the
subscale has been processed there (``WatermarkRelease``, behind those outputs): the
receivers' watermark stays at or below the hold in between (``engine.time.event_time.WatermarkTracker``).

Each test here fails without the holds: a window downstream of the rescaled operator
counted late records and lost them.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from engine.api import StreamJob
from engine.dataflow.config import JobConfig
from engine.dataflow.keygroups import uniform_assignment
from engine.io.testing import TestingSink, TestingSource
from engine.time.event_time import MIN_WATERMARK, WatermarkTracker, tumbling_event_time
from engine.wire.messages import (
    MigrateState,
    Watermark,
    WatermarkHold,
    WatermarkRelease,
    decode_frame,
)
from migration.protocols import LIVE
from tests.unit.test_drrs_core import S0, DNet, N, add, key_in

A = S0.key_groups[0]
a = key_in(A)
CFG = JobConfig(batch_size=4, linger_ms=0, metrics_port=None)


def windowed_job(records, sink, *, sum_p=2, win_p=1, config=CFG, size=50) -> StreamJob:
    """src -> key_by(key) -> running sum "sum" -> key_by(constant) -> tumbling window "win"
    (sum of the running totals' values and a count) -> sink: the window is downstream of the
    rescaled operator and keyed by another key."""
    job = StreamJob("wm", num_key_groups=N, config=config)
    (job.source(TestingSource(records, timestamp_fn=lambda r: r[2]), name="src")
        .key_by(lambda r: r[0])
        .reduce(add, name="sum", parallelism=sum_p)
        .key_by(lambda r: r[0] % 3)
        .window(tumbling_event_time(size))
        .reduce(lambda x, y: (x[0], x[1] + y[1]),
                window_fn=lambda key, w, r: [(key, w.start, r[1])], name="win",
                parallelism=win_p)
        .sink(sink, name="out", parallelism=win_p))
    return job


def late(net: DNet, vertex: str = "win") -> int:
    return sum(c.keyed.late_records for n, c in net.cores.items()
               if n in net.dep.tasks[vertex])


def windows_reference(records, size=50) -> list[tuple[int, int, int]]:
    """(key % 3, window start, sum of the running totals in it) of every window."""
    acc: dict[Any, int] = {}
    out: dict[tuple[int, int], int] = {}
    for k, v, ts in records:
        acc[k] = acc.get(k, 0) + v
        w = (k % 3, ts - ts % size)
        out[w] = out.get(w, 0) + acc[k]
    return sorted((k, start, total) for (k, start), total in out.items())


def disordered(rng: random.Random, n: int) -> list[tuple[int, int, int]]:
    """(key, value, timestamp): time moves 0-7 ms a record, records out of order by <= 3."""
    records, t = [], 0
    for _ in range(n):
        t += rng.randrange(0, 8)
        records.append((rng.randrange(20), rng.randrange(10), max(0, t - rng.randrange(0, 4))))
    return records


def emit_watermark(src: Any, records: list[tuple[int, int, int]]) -> None:
    """The source's watermark for what it read (out of order by at most 3: no record read
    later is at or below it), sent when it advanced."""
    hi = max((r[2] for r in records[:len(records) - _left(src)]), default=MIN_WATERMARK)
    if hi - 4 > src.watermark:
        src.watermark = hi - 4
        src.router.broadcast(Watermark(hi - 4))


# ---------------------------------------------------------------- the tracker


def test_a_hold_caps_the_watermark_until_released_in_either_order():
    t = WatermarkTracker()
    assert t.set_channels([1, 2]) is None
    assert t.update(1, 10) is None and t.update(2, 20) == 10
    assert t.hold(7, 15) is None               # a hold above the watermark: caps later ones
    assert t.update(1, 30) == 15               # 20 without the hold
    assert t.release(7) == 20
    # a release that overtook its hold (another channel): the hold never takes effect
    assert t.release(8) is None and 8 in t.released_early
    assert t.hold(8, 5) is None and t.update(2, 40) == 30
    assert not t.holds and not t.released_early


def test_a_token_on_several_paths_is_held_until_every_path_released_it():
    t = WatermarkTracker()
    t.set_channels([1])
    assert t.update(1, 10) == 10
    t.hold(3, 12)
    t.hold(3, 12)                               # relayed by two stateless tasks
    assert t.release(3) is None and t.update(1, 50) == 12
    assert t.release(3) == 50
    # releases first on one path, the hold first on the other: balanced in the end
    assert t.release(4) is None and t.hold(4, 60) is None and t.hold(4, 60) is None
    assert t.update(1, 90) == 60 and t.release(4) == 90
    assert not t.holds and not t.released_early


def test_a_hold_below_the_watermark_keeps_it_and_stops_it():
    t = WatermarkTracker()
    t.set_channels([1])
    assert t.update(1, 50) == 50
    assert t.hold(3, 20) is None and t.update(1, 90) is None and t.current == 50
    assert t.release(3) == 90


def test_early_releases_are_bounded():
    t = WatermarkTracker()
    for token in range(WatermarkTracker.MAX_EARLY_RELEASES + 50):
        t.release(token)
    assert len(t.released_early) == WatermarkTracker.MAX_EARLY_RELEASES
    assert 0 not in t.released_early and t.hold(0, 5) is None and 0 in t.holds


# ---------------------------------------------------------------- by hand


def test_a_rerouted_record_is_not_late_at_a_window_downstream(clock, tmp_path):
    """a1 (ts 30) waits in the old owner's input behind the watermark 40; the new owner is
    at 40 already. After the group left, the old owner re-routes a1 and forwards 40: without
    the hold the window [0, 50) is at watermark 40, then at 60 once the source says so, and
    fires before a1's output reaches it from the new owner."""
    sink = TestingSink(str(tmp_path / "out"))
    recs = [(a, 1, 30), (a, 2, 45)]
    net = DNet(windowed_job(recs, sink), clock)
    src, s, d = net["src/0"], net["sum/0"], net["sum/1"]
    src.router.broadcast(Watermark(5))
    net.pump()
    src.poll_source(1)                     # a1 to s, behind it the watermark 40
    src.router.broadcast(Watermark(40))
    net.deliver()
    net.run("sum/1")
    assert d.watermark == 40 and s.watermark == 5
    net.start_subscale(S0)                 # s freezes the group at 5: its hold
    [state] = net.take_prio(MigrateState)
    net.prio.append(state)
    net.deliver_prio(MigrateState)
    net.deliver()
    net.run("sum/0")                       # a1 re-routed, the confirm behind it; s at 40
    assert s.watermark == 40
    net.deliver()
    net.run("win/0")                       # s's 40 and d's 40 reach the window: held at 5
    assert net["win/0"].watermark == 5
    src.poll_source(1)
    src.router.broadcast(Watermark(60))    # s and d at 60 before d ran a1
    net.deliver()
    net.run("sum/0")
    net.deliver()
    net.run("win/0")
    assert net["win/0"].watermark == 5     # still held: a1 is on its way
    net.pump()
    assert late(net) == 0
    assert net["win/0"].watermark == 60
    assert sink.results() == windows_reference(recs)  # [0, 50): totals 1 and 3
    assert not net["win/0"].tracker.holds


def test_hold_and_release_travel_on_the_owners_data_channels(clock, tmp_path):
    sink = TestingSink(str(tmp_path / "out"))
    net = DNet(windowed_job([(a, 1, 30)], sink), clock)
    win = net["win/0"]
    seen: list[tuple[int, Any]] = []
    receive = win.receive

    def spy(channel_id: int, seq: int, payload: bytes) -> None:
        event = decode_frame(payload).event
        if isinstance(event, (WatermarkHold, WatermarkRelease)):
            seen.append((channel_id, event))
        receive(channel_id, seq, payload)

    win.receive = spy  # type: ignore[method-assign]
    net["src/0"].router.broadcast(Watermark(7))
    net.pump()
    net.start_subscale(S0)
    net.pump()
    sid = S0.subscale_id
    assert sorted(seen, key=lambda x: type(x[1]).__name__) == [
        (net.cid("sum/0", "win/0", edge=1), WatermarkHold(sid, 7)),
        (net.cid("sum/1", "win/0", edge=1), WatermarkRelease(sid))]
    assert not win.tracker.holds and not win.tracker.released_early


# ---------------------------------------------------------------- at random, every protocol


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("change", ["scale-out", "scale-in"])
@pytest.mark.parametrize("protocol", sorted(LIVE))
def test_windows_downstream_of_a_live_rescale_equal_the_reference(clock, tmp_path, protocol,
                                                                  change, seed):
    """Out-of-order records, watermarks every few records, a live rescale of the running sum
    at a random moment with random interleavings: the window downstream counts no late
    record and its sums equal the run without rescaling."""
    rng = random.Random(f"wm-{protocol}-{change}-{seed}")
    print(f"windows downstream: protocol={protocol} change={change} seed={seed}")
    records = disordered(rng, 240)
    sink = TestingSink(str(tmp_path / "out"))
    cfg = JobConfig(batch_size=rng.choice([2, 4]), linger_ms=0, metrics_port=None,
                    drrs_set_aside_cap=rng.choice([1, 3, 200]))
    start_p, new_p = (3, 2) if change == "scale-in" else (2, 3)
    net = DNet(windowed_job(records, sink, sum_p=start_p, win_p=rng.choice([1, 2]),
                            config=cfg, size=10), clock)
    src = net["src/0"]

    slow = net.name("sum/0")  # an old owner whose input lags: the new owners run ahead

    def round_(rng_: random.Random, keep_back: int) -> None:
        if rng.random() < 0.8:
            emit_watermark(src, records)
        net.collect()
        lagging = [f for f in net.frames if f.target == slow]
        net.frames = [f for f in net.frames if f.target != slow]
        DNet._random_round(net, rng_, keep_back)
        net.frames = lagging + net.frames
        for f in [f for f in lagging if rng_.random() < 0.3]:
            net.frames.remove(f)
            net.cores[f.target].receive(f.channel_id, f.seq, f.payload)

    net._random_round = round_  # type: ignore[method-assign] - the rescale's progress too
    for _ in range(20):
        src.poll_source(rng.randint(1, 6))
        round_(rng, 12)
    plan, reports = net.drrs("sum", uniform_assignment(N, new_p), rng, size=2,
                             protocol=protocol, keep_source_back=12)
    assert plan.moved and reports, "the rescale moved nothing"
    while src.status == "running":
        src.poll_source(3)
        emit_watermark(src, records)
        net.pump()
    net.pump()
    assert late(net) == 0
    assert sorted(sink.results()) == windows_reference(records, size=10)


def _left(src) -> int:
    from tests.harness import records_left

    return records_left(src)


# ---------------------------------------------------------------- stateless tasks relay


def forked_job(records, sink, *, config=CFG) -> StreamJob:
    """src -> key_by -> running sum "sum" (2 tasks) -+-> map "tag" (2 tasks: a forward edge,
    not chained, since "sum" has two consumers) -> key_by(key % 3) -> 10 ms windows "win"
    -> sink; and "sum" -> sink "raw". "tag" has no keyed state: it relays holds and
    releases to the window instead of keeping them."""
    job = StreamJob("fork", num_key_groups=N, config=config)
    sums = (job.source(TestingSource(records, timestamp_fn=lambda r: r[2]), name="src")
            .key_by(lambda r: r[0])
            .reduce(add, name="sum", parallelism=2))
    sums.sink(TestingSink(sink.directory + "-raw"), name="raw", parallelism=2)
    (sums.map(lambda r: r, name="tag", parallelism=2)
        .key_by(lambda r: r[0] % 3)
        .window(tumbling_event_time(10))
        .reduce(lambda x, y: (x[0], x[1] + y[1]),
                window_fn=lambda key, w, r: [(key, w.start, r[1])], name="win", parallelism=1)
        .sink(sink, name="out", parallelism=1))
    return job


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("protocol", ["drrs", "pause-resume", "non-disruptive", "meces"])
def test_stateless_tasks_relay_holds_across_a_forward_edge(clock, tmp_path, protocol, seed):
    """A rebalance of "sum" at the same parallelism (a forward edge allows it): the old
    owner's hold reaches the window through "tag" task s and the new owner's release
    through "tag" task d; the window is held in between, never stuck, and counts no late
    record."""
    rng = random.Random(f"fork-{protocol}-{seed}")
    print(f"relay: protocol={protocol} seed={seed}")
    records = disordered(rng, 160)
    sink = TestingSink(str(tmp_path / "out"))
    net = DNet(forked_job(records, sink), clock)
    plan_ = net.plan
    assert [e.partitioning for e in plan_.edges if e.dst == "tag"] == ["forward"]
    src = net["src/0"]

    def round_(rng_: random.Random, keep_back: int) -> None:
        if rng.random() < 0.8:
            emit_watermark(src, records)
        DNet._random_round(net, rng_, keep_back)

    net._random_round = round_  # type: ignore[method-assign]
    for _ in range(15):
        src.poll_source(rng.randint(1, 6))
        round_(rng, 12)
    swap = tuple(1 - o if kg in (1, 2, 6, 9, 13) else o
                 for kg, o in enumerate(net.dep.assignments["sum"]))
    plan, reports = net.drrs("sum", swap, rng, size=2, protocol=protocol)
    assert plan.moved and reports
    for _ in range(3):  # the window is not stuck behind a hold after the rescale
        src.poll_source(3)
        emit_watermark(src, records)
        net.pump()
    assert not net["win/0"].tracker.holds
    while src.status == "running":
        src.poll_source(3)
        emit_watermark(src, records)
        net.pump()
    assert late(net) == 0
    assert sorted(sink.results()) == windows_reference(records, size=10)
    assert not net["tag/0"].tracker.holds and not net["tag/1"].tracker.holds
