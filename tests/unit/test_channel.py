"""Unit tests for engine.task.channel: InputChannel reordering, CreditGate accounting and
OutputRouter partitioning, batching, linger, events and reconnects (pure, no Ray)."""

from __future__ import annotations

import random

import pytest

from engine.dataflow.keygroups import key_group_of
from engine.task.channel import CreditGate, InputChannel, KeyFunctionError, OutputRouter
from engine.wire.messages import (
    CheckpointBarrier,
    EndOfStream,
    Frame,
    LatencyMarker,
    OutputChannel,
    OutputEdge,
    Watermark,
    decode_frame,
    encode_frame,
)

N = 16  # key groups


class FakeNow:
    """An injectable monotonic clock."""

    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def chan(cid: int, target: str | None = None) -> OutputChannel:
    return OutputChannel(cid, target or f"t{cid}", 0)


def router(edges, batch_size=4, linger_s=0.005, key_fns=None, now=None) -> OutputRouter:
    r = OutputRouter(batch_size, linger_s, N, key_fns or {}, now or FakeNow())
    r.connect(edges)
    return r


def drain(r: OutputRouter) -> list[tuple[int, int, Frame]]:
    """Take the outbox as (channel_id, seq, decoded frame), in order."""
    out = []
    while r.outbox:
        f = r.outbox.popleft()
        frame = decode_frame(f.payload)
        assert f.records == len(frame.values)
        assert f.target == f"t{f.channel_id}"
        out.append((f.channel_id, f.seq, frame))
    return out


def values_by_channel(frames) -> dict[int, list]:
    out: dict[int, list] = {}
    for cid, _, fr in frames:
        out.setdefault(cid, []).extend(fr.values)
    return out


# ---------------------------------------------------------------- InputChannel


def payload(i: int) -> bytes:
    return encode_frame(Frame([i], [0]))


def test_input_channel_in_order_frames_are_ready_at_once():
    ch = InputChannel(7, port=1)
    assert ch.offer(0, b"a") == 1
    assert ch.offer(1, b"b") == 1
    assert list(ch.queue) == [(0, b"a"), (1, b"b")]
    assert ch.next_seq == 2 and ch.port == 1 and len(ch) == 2


def test_input_channel_restores_order_from_shuffled_sequence_numbers():
    ch = InputChannel(3)
    order = list(range(50))
    random.Random(4).shuffle(order)
    ready = 0
    for seq in order:
        ready += ch.offer(seq, payload(seq))
    assert ready == 50
    assert [s for s, _ in ch.queue] == list(range(50))
    assert [decode_frame(p).values for _, p in ch.queue] == [(i,) for i in range(50)]
    assert ch.pending == {}


def test_input_channel_holds_frames_behind_a_gap():
    ch = InputChannel(3)
    assert ch.offer(2, b"c") == 0
    assert ch.offer(1, b"b") == 0
    assert not ch.queue and len(ch) == 2
    assert ch.offer(0, b"a") == 3
    assert [p for _, p in ch.queue] == [b"a", b"b", b"c"]


def test_input_channel_rejects_duplicates_queued_and_pending():
    ch = InputChannel(9)
    ch.offer(0, b"a")
    ch.offer(2, b"c")
    with pytest.raises(ValueError, match="channel 9: frame 0 delivered twice"):
        ch.offer(0, b"a")
    with pytest.raises(ValueError, match="frame 2 delivered twice"):
        ch.offer(2, b"c")
    ch.queue.popleft()  # consumed frames count as delivered too
    with pytest.raises(ValueError):
        ch.offer(0, b"a")
    assert ch.next_seq == 1 and ch.pending == {2: b"c"}


# ---------------------------------------------------------------- CreditGate


def test_credit_gate_accounting():
    gate = CreditGate(2)
    assert gate.can_send(1) and gate.in_flight(1) == 0
    gate.on_send(1)
    gate.on_send(1)
    assert not gate.can_send(1)
    assert gate.can_send(2)  # per channel
    with pytest.raises(RuntimeError, match="channel 1: sent without credit"):
        gate.on_send(1)
    gate.on_send(2)
    assert gate.in_flight(1) == 2 and gate.in_flight(2) == 1
    assert gate.total_in_flight() == 3
    gate.on_ack(1)
    assert gate.can_send(1) and gate.in_flight(1) == 1
    assert gate.total_in_flight() == 2
    gate.on_ack(1)
    gate.on_ack(2)
    assert gate.total_in_flight() == 0


def test_credit_gate_ack_without_frame_raises():
    gate = CreditGate(1)
    with pytest.raises(RuntimeError, match="channel 5: acknowledgement without a frame"):
        gate.on_ack(5)
    gate.on_send(5)
    gate.on_ack(5)
    with pytest.raises(RuntimeError):
        gate.on_ack(5)
    assert gate.in_flight(5) == 0


def test_credit_gate_needs_a_credit():
    with pytest.raises(ValueError):
        CreditGate(0)


# ---------------------------------------------------------------- OutputRouter: partitioning


def test_forward_batches_preserve_order_and_seq():
    r = router([OutputEdge(0, "forward", (chan(10),))], batch_size=4)
    sent = list(range(23))
    for i in range(0, 23, 3):
        r.emit(sent[i:i + 3], [1000 + v for v in sent[i:i + 3]])
    r.flush_all()
    frames = drain(r)
    assert all(len(fr.values) <= 4 for _, _, fr in frames)
    assert [s for _, s, _ in frames] == list(range(len(frames)))
    assert values_by_channel(frames) == {10: sent}
    assert [t for _, _, fr in frames for t in fr.timestamps] == [1000 + v for v in sent]
    assert all(fr.keys is None and fr.key_groups is None and fr.event is None
               for _, _, fr in frames)
    assert r.records_out == 23
    assert r.bytes_out == sum(len(encode_frame(fr)) for _, _, fr in frames)


def test_large_emit_is_split_into_frames_of_batch_size():
    r = router([OutputEdge(0, "forward", (chan(1),))], batch_size=10)
    r.emit(list(range(25)), [0] * 25)
    frames = drain(r)
    assert [len(fr.values) for _, _, fr in frames] == [10, 10, 5]
    assert [s for _, s, _ in frames] == [0, 1, 2]
    assert r.buffered_records() == 0


def test_rebalance_round_robins_batches_over_channels():
    r = router([OutputEdge(0, "rebalance", (chan(1), chan(2), chan(3)))], batch_size=100)
    for i in range(7):
        r.emit([i], [0])
    r.flush_all()
    assert values_by_channel(drain(r)) == {1: [0, 3, 6], 2: [1, 4], 3: [2, 5]}


def test_every_edge_gets_every_record():
    r = router([OutputEdge(0, "forward", (chan(1),)),
                OutputEdge(1, "rebalance", (chan(2), chan(3)))], batch_size=100)
    r.emit(["a", "b"], [1, 2])
    r.emit(["c"], [3])
    r.flush_all()
    assert values_by_channel(drain(r)) == {1: ["a", "b", "c"], 2: ["a", "b"], 3: ["c"]}


def test_keyed_routes_by_routing_table_and_carries_keys_and_groups():
    routing = tuple((kg * 7) % 3 for kg in range(N))  # scattered, not contiguous
    edge = OutputEdge(0, "keyed", (chan(20), chan(21), chan(22)), routing)
    r = router([edge], batch_size=5, key_fns={0: lambda rec: rec[0]})
    records = [(f"k{i % 13}", i) for i in range(200)]
    for i in range(0, 200, 17):
        chunk = records[i:i + 17]
        r.emit(chunk, [v for _, v in chunk])
    r.flush_all()
    frames = drain(r)
    seen: dict[int, list] = {}
    for cid, _, fr in frames:
        assert 1 <= len(fr.values) <= 5
        assert len(fr.keys) == len(fr.key_groups) == len(fr.values) == len(fr.timestamps)
        for v, ts, k, kg in zip(fr.values, fr.timestamps, fr.keys, fr.key_groups, strict=True):
            assert k == v[0]
            assert kg == key_group_of(k, N)
            assert cid == 20 + routing[kg]
            assert ts == v[1]
            seen.setdefault(cid, []).append(v)
    # per-channel order is emission order, and nothing is lost
    for cid, vals in seen.items():
        assert vals == [rec for rec in records if 20 + routing[key_group_of(rec[0], N)] == cid]
    assert sum(len(v) for v in seen.values()) == 200
    # sequence numbers per channel are 0, 1, 2, ...
    for cid in seen:
        assert [s for c, s, _ in frames if c == cid] == list(range(sum(c == cid for c, _, _ in frames)))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_keyed_split_of_large_and_small_emits_keeps_order_and_routing(seed):
    """Emits of 1-300 records (split by numpy from 32 on, one by one below), timestamps
    shared or not, the routing changed halfway (its cached array must follow): every record
    goes where the routing said at its emit, in emission order per channel, with its own
    timestamp, key and key group."""
    print(f"seed={seed}")
    rng = random.Random(seed)
    edge = OutputEdge(0, "keyed", (chan(0), chan(1), chan(2)),
                      tuple(rng.randrange(3) for _ in range(N)))
    r = router([edge], batch_size=50, linger_s=10.0, key_fns={0: lambda rec: rec[0]})
    expected: dict[int, list] = {0: [], 1: [], 2: []}
    i = 0
    for round_ in range(60):
        if round_ == 30:
            r.flush_all()
            routing = tuple(rng.randrange(3) for _ in range(N))
            r.update_routing(0, routing)
        routing = r.edges[0].routing
        n = rng.choice([1, 2, 31, 32, 33, 100, 300])
        recs = [(rng.randrange(40), i + j) for j in range(n)]
        stamps = [7] * n if rng.random() < 0.5 else [rec[1] for rec in recs]
        r.emit(recs, stamps)
        for rec, ts in zip(recs, stamps, strict=True):
            expected[routing[key_group_of(rec[0], N)]].append((rec, ts))
        i += n
    r.flush_all()
    got: dict[int, list] = {0: [], 1: [], 2: []}
    for cid, _, fr in drain(r):
        for v, ts, k, kg in zip(fr.values, fr.timestamps, fr.keys, fr.key_groups, strict=True):
            assert k == v[0] and kg == key_group_of(k, N)
            got[cid].append((v, ts))
    assert got == expected


def test_keyed_emits_send_whole_frames_and_keep_the_remainder_lingering():
    """Records spread over two channels: each buffer crosses the batch size by a fraction
    of an emit; only whole frames go, the rest starts its linger at that emit (issue 32,
    item 9: flushing everything sent a short frame after each full one)."""
    now = FakeNow(0.0)
    edge = OutputEdge(0, "keyed", (chan(1), chan(2)), tuple(kg % 2 for kg in range(N)))
    r = router([edge], batch_size=10, linger_s=1.0, key_fns={0: lambda rec: rec}, now=now)
    keys = [k for k in range(1000) if key_group_of(k, N) % 2 == 0][:7]  # all to channel 1
    r.emit(keys, [0] * 7)
    now.t = 0.5
    r.emit(keys + keys[:1], [1] * 8)  # 15 for channel 1: one frame of 10, 5 kept
    frames = drain(r)
    assert [(c, len(fr.values)) for c, _, fr in frames] == [(1, 10)]
    assert list(frames[0][2].timestamps) == [0] * 7 + [1] * 3
    assert r.buffered_records() == 5 and r.next_deadline() == pytest.approx(1.5)
    now.t = 1.4
    r.flush_due()
    assert not r.outbox
    now.t = 1.5
    r.flush_due()
    assert [(c, s, list(fr.values)) for c, s, fr in drain(r)] == [(1, 1, keys[3:] + keys[:1])]
    # many small emits over two channels: frames are full but for the last of each channel
    spread = list(range(5000))
    for i in range(0, 5000, 64):
        r.emit(spread[i:i + 64], [0] * len(spread[i:i + 64]))
    r.flush_all()
    sizes = [len(fr.values) for _, _, fr in drain(r)]
    assert sum(sizes) == 5000 and sum(s < 10 for s in sizes) <= 2


def test_keyed_edge_with_one_channel_gets_everything_with_keys():
    r = router([OutputEdge(0, "keyed", (chan(4),), (0,) * N)], batch_size=100,
               key_fns={0: lambda rec: rec})
    r.emit([1, 2, 3], [0, 0, 0])
    r.flush_all()
    [(cid, seq, fr)] = drain(r)
    assert (cid, seq) == (4, 0)
    assert fr.values == (1, 2, 3) and fr.keys == (1, 2, 3)
    assert fr.key_groups == tuple(key_group_of(k, N) for k in (1, 2, 3))


def test_update_routing_changes_the_target_of_key_groups():
    edge = OutputEdge(0, "keyed", (chan(1), chan(2)), (0,) * N)
    r = router([edge], batch_size=100, key_fns={0: lambda rec: rec})
    r.update_routing(0, (1,) * N)
    r.emit(list(range(10)), [0] * 10)
    r.flush_all()
    assert values_by_channel(drain(r)) == {2: list(range(10))}


def test_key_function_error_carries_the_record():
    def key(rec):
        return rec["k"]

    r = router([OutputEdge(0, "keyed", (chan(1), chan(2)), (0, 1) * (N // 2))],
               key_fns={0: key})
    with pytest.raises(KeyFunctionError) as info:
        r.emit([{"k": 1}, {"x": 2}, {"k": 3}], [0, 0, 0])
    assert info.value.record == {"x": 2}
    assert isinstance(info.value.cause, KeyError)
    assert str(info.value) == "KeyError: 'k'"
    assert r.buffered_records() == 0 and not r.outbox


@pytest.mark.parametrize("key_fn", [lambda rec: [rec], lambda rec: {"k": rec}, lambda rec: object()])
def test_unhashable_key_raises_key_function_error_with_the_record(key_fn):
    r = router([OutputEdge(0, "keyed", (chan(1), chan(2)), (0, 1) * (N // 2))],
               key_fns={0: key_fn})
    with pytest.raises(KeyFunctionError) as info:
        r.emit([5, 6], [0, 0])
    assert info.value.record == 5
    assert isinstance(info.value.cause, TypeError)


# ---------------------------------------------------------------- linger


def test_linger_flush_with_injected_clock():
    now = FakeNow(100.0)
    r = router([OutputEdge(0, "rebalance", (chan(1), chan(2)))], batch_size=100,
               linger_s=0.5, now=now)
    assert r.next_deadline() is None
    r.emit(["a"], [0])          # channel 1 at t=100
    now.t = 100.25
    r.emit(["b"], [0])          # channel 2 at t=100.25
    r.emit(["c"], [0])          # channel 1 again: its buffer still dates from t=100
    assert r.next_deadline() == pytest.approx(100.5)
    now.t = 100.49
    r.flush_due()
    assert not r.outbox and r.buffered_records() == 3
    now.t = 100.5
    r.flush_due()
    frames = drain(r)
    assert [(c, s, fr.values) for c, s, fr in frames] == [(1, 0, ("a", "c"))]
    assert r.next_deadline() == pytest.approx(100.75)
    now.t = 100.8
    r.flush_due()
    assert [(c, s, fr.values) for c, s, fr in drain(r)] == [(2, 0, ("b",))]
    assert r.next_deadline() is None and r.buffered_records() == 0


def test_linger_starts_again_after_a_full_batch_flush():
    now = FakeNow(0.0)
    r = router([OutputEdge(0, "forward", (chan(1),))], batch_size=2, linger_s=1.0, now=now)
    r.emit([1, 2], [0, 0])  # full: flushed at once
    assert len(drain(r)) == 1 and r.next_deadline() is None
    now.t = 5.0
    r.emit([3], [0])
    assert r.next_deadline() == 6.0
    now.t = 5.5
    r.flush_due()
    assert not r.outbox


# ---------------------------------------------------------------- events


def test_broadcast_flushes_then_appends_event_to_every_channel():
    r = router([OutputEdge(0, "rebalance", (chan(1), chan(2))),
                OutputEdge(1, "forward", (chan(3),))], batch_size=4)
    r.emit([1, 2], [0, 0])   # edge 0 -> channel 1, edge 1 -> channel 3
    r.emit([3, 4], [0, 0])   # edge 0 -> channel 2, edge 1 -> channel 3 (4 records: flushed)
    assert [(f.channel_id, f.seq, f.records) for f in r.outbox] == [(3, 0, 4)]
    r.outbox.clear()
    r.emit([5], [0])         # edge 0 -> channel 1, edge 1 -> channel 3
    r.broadcast(Watermark(42))
    frames = drain(r)
    got = {(c, s): (fr.values, fr.event) for c, s, fr in frames}
    assert got == {
        (1, 0): ((1, 2, 5), Watermark(42)),
        (2, 0): ((3, 4), Watermark(42)),
        (3, 1): ((5,), Watermark(42)),
    }
    r.broadcast(EndOfStream())  # nothing buffered: empty frames with the event only
    assert [(c, s, fr.values, fr.event) for c, s, fr in drain(r)] == [
        (1, 1, (), EndOfStream()), (2, 1, (), EndOfStream()), (3, 2, (), EndOfStream())]


def test_broadcast_puts_event_on_the_last_frame_of_a_big_buffer():
    r = router([OutputEdge(0, "forward", (chan(1),))], batch_size=100)
    r.emit(list(range(5)), [0] * 5)
    r.batch_size = 2  # a buffer larger than the batch size is split on flush
    r.broadcast(CheckpointBarrier(3))
    frames = drain(r)
    assert [(fr.values, fr.event) for _, _, fr in frames] == [
        ((0, 1), None), ((2, 3), None), ((4,), CheckpointBarrier(3))]
    assert [s for _, s, _ in frames] == [0, 1, 2]


def test_latency_markers_round_robin_one_channel_per_edge_behind_records():
    r = router([OutputEdge(0, "rebalance", (chan(1), chan(2), chan(3))),
                OutputEdge(1, "forward", (chan(4),))], batch_size=100)
    r.emit(["x"], [0])  # edge 0 -> channel 1
    markers = [LatencyMarker(float(i), 0) for i in range(4)]
    got = []
    for m in markers:
        r.send_marker(m)
        got.append([(c, fr.values, fr.event) for c, _, fr in drain(r)])
    assert got == [
        [(1, ("x",), markers[0]), (4, ("x",), markers[0])],
        [(2, (), markers[1]), (4, (), markers[1])],
        [(3, (), markers[2]), (4, (), markers[2])],
        [(1, (), markers[3]), (4, (), markers[3])],
    ]


# ---------------------------------------------------------------- reconnect


def test_reconnect_keeps_seq_of_kept_channels_and_starts_new_ones_at_zero():
    r = router([OutputEdge(0, "rebalance", (chan(1), chan(2)))], batch_size=1)
    for i in range(5):
        r.emit([i], [0])  # 1: seq 0,1,2   2: seq 0,1
    drain(r)
    r.connect([OutputEdge(0, "rebalance", (chan(2), chan(5)))])
    for i in range(4):
        r.emit([i], [0])
    assert [(f.channel_id, f.seq) for f in r.outbox] == [(2, 2), (5, 0), (2, 3), (5, 1)]


def test_reconnect_resets_round_robin():
    edges = [OutputEdge(0, "rebalance", (chan(1), chan(2), chan(3)))]
    r = router(edges, batch_size=100)
    r.emit(["a"], [0])
    r.emit(["b"], [0])
    r.send_marker(LatencyMarker(1.0, 0))  # marker round robin now points at channel 2
    r.flush_all()
    drain(r)
    r.connect(edges)
    r.emit(["c"], [0])
    r.send_marker(LatencyMarker(2.0, 0))
    assert [(c, fr.values) for c, _, fr in drain(r)] == [(1, ("c",))]


def test_reconnect_from_five_channels_to_one_then_marker():
    r = router([OutputEdge(0, "rebalance", tuple(chan(i) for i in range(5)))], batch_size=100)
    for i in range(4):
        r.send_marker(LatencyMarker(float(i), 0))  # round robin index at 4
    drain(r)
    r.connect([OutputEdge(0, "rebalance", (chan(3),))])
    r.send_marker(LatencyMarker(9.0, 0))
    [(cid, seq, fr)] = drain(r)
    assert (cid, seq, fr.event) == (3, 1, LatencyMarker(9.0, 0))


def test_reconnect_refuses_unflushed_records():
    r = router([OutputEdge(0, "forward", (chan(1),))], batch_size=100)
    r.emit([1], [0])
    with pytest.raises(RuntimeError, match="unflushed"):
        r.connect([OutputEdge(0, "forward", (chan(1),))])


def test_a_frame_further_ahead_than_credits_allow_is_refused_not_kept():
    """Issue 32 item 11: the reorder buffer kept frames with far-future sequence numbers
    (+100 MiB after their sender left); now one ``max_ahead`` or more beyond the next
    expected is refused and nothing is kept."""
    import pytest

    from engine.task.channel import InputChannel

    ch = InputChannel(3, max_ahead=8)
    assert ch.offer(7, b"a") == 0 and len(ch) == 1
    with pytest.raises(ValueError, match="ahead of the next expected"):
        ch.offer(8, b"far" * 1000)
    assert len(ch) == 1 and 8 not in ch.pending
    assert ch.offer(0, b"z") == 1 and ch.offer(8, b"now in reach") == 0
