"""Unit tests for engine.wire.messages: wire round trips, frames, refusal of undeclared messages."""

from __future__ import annotations

import dataclasses

import pytest

from engine.control.reconfiguration import DecisionRecord, LogicChangeReport, RescaleRecord
from engine.errors import CodecError
from engine.observability.latency import LatencyHistogram
from engine.observability.metrics import RescaleProgress, TaskMetrics
from engine.wire import messages as m
from engine.wire.codec import pack_exact, pack_fast
from migration.report import RescaleReport

_H = LatencyHistogram()
_H.observe_many([1.0, 2.5, 40.0])


def assert_same(a, b):
    """Equal values of identical types, recursively through tuples/lists/dicts/dataclasses."""
    assert type(a) is type(b), f"{a!r} vs {b!r}"
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


CH0 = m.OutputChannel(3, "op/map/0", 0)
CH1 = m.OutputChannel(4, "op/map/1", 1)

CHANNEL_EVENTS = [
    m.Watermark(1_700_000_000_123),
    m.Watermark(-1),
    m.CheckpointBarrier(7),
    m.CheckpointBarrier(8, "s3://bucket/chk/j/chk-8", True),
    m.LatencyMarker(1_700_000_000.25, 3),
    m.EndOfStream(),
    m.ChannelIdle(),
    m.ConfirmBarrier(3, 17),
    m.PauseBarrier(3),
    m.LogicBarrier(3),
    m.WatermarkHold(5, 1_700_000_000_000),
    m.WatermarkRelease(5),
    m.GroupLeft(5, 17),
    m.GroupArrived(5, 17),
]

# Messages whose fields are plain values.
FLAT_CONTROL_MESSAGES = [
    CH0,
    m.Connect(((1, 0), (2, 0), (3, 1)), ()),
    m.Connect((), ()),
    m.Start(),
    m.Start((("0-of-2", None), ("a.parquet", 10), ("lane-1", {"batch": (3, 4)}))),
    m.Resume(),
    m.InstallKeyGroups(((0, b"\x00\x01"), (127, b""))),
    m.InstallKeyGroups(()),
    m.StopTask(),
    m.TriggerCheckpoint(3, "/tmp/chk/j/chk-3"),
    m.TriggerCheckpoint(4, "/tmp/sp", stop=True),
    m.CheckpointComplete(3),
    m.CheckpointAborted(4),
    m.RestoreState(((5, "/tmp/chk/j/chk-3/sum-0.state", 0, 10, 123),), (("out", ("a", 1)),)),
    m.RestoreState(),
    m.CommitTransactions((("out", (pack_exact({"a": (1, 2)}), None)),)),
    m.CheckpointAck("j/sum/0/g0", 3, "sum-0.state", ((5, 0, 10, 123),), None,
                    (("out", "txn-1"),), 10, 0.5, 0.01, 0.02),
    m.CheckpointAck("j/src/0/g0", 3, "", (), {"0-of-2": 7}, (), 0, 0.0, 0.0, 0.0),
    m.CheckpointDeclined("j/sum/0/g0", 3, "OSError: read-only"),
    m.CheckpointStats(),
    m.AdoptTransactions((("out", "a.bin"), ("out", {"file": "b"}))),
    m.HandOver("j/sum/2/g0", (("out", "c.bin"),)),
    m.ReleaseSource(),
    m.SourceReleased("src/0", {"0-of-2": 7, "a.parquet#3": (1, "x")}),
    m.SourceReleased("src/1", {}, (("out", "c.bin"),)),
    m.TaskFinished("sink/0"),
    m.TaskFailed("map/1", "map", 1, "{'a': 1}", "ZeroDivisionError('division by zero')"),
    m.Ack(),
    m.JobStatus("wordcount", "running"),
    m.StopTask(True),
    m.RemoveOutputChannels((4, 5)),
    m.ReplaceOutputChannel(4, 9),
    m.InjectLogicBarrier(3, (4, 5)),
    m.SwitchLogic(3),
    m.DiscardLogic(3),
    m.LogicChanged("j/sum/0/g0", "sum", 3, 0.125),
    LogicChangeReport("sum", 3, 2, 10.0, 11.5, 0.125),
    m.AddInputs(((7, 0), (8, -1))),
    m.AddInputs(((9, 0),), (3, 4)),
    m.InjectSubscale(2, 0, (5, 6, 7), 3),
    m.TriggerBarrier(2),
    m.HoldFinish(True),
    m.GroupStatsRequest(),
    m.RefreshReplicas(((3, "j/sum/1/g0", -1), (4, "j/sum/1/g0", 2))),
    m.ReplicaUpdate(3, 2, b"\x90", True),
    m.ReplicaAck(3, False),
    m.ReplicasRefreshed(((3, 2),), (4,), 1024, 0.01),
    m.DropReplicas((3, 4)),
    m.GroupStats("j/sum/0/g0", ((3, 10, 2048),), 1.5),
    m.TaskState("j/sum/0/g0", "running", False),
    m.TaskState("j/sum/0/g0", "running", True, "out 3 groups [5] confirms 0/1"),
    m.ExpectIncoming(2, (5, 6), (10, 11), 99),
    m.MigrateState(2, 5, b"\x93\x00", -(2**63)),
    m.SubscaleTriggered(2, ((5, 4096), (6, 0))),
    m.PullState(2, 5),
    m.DescribeTask(),
    m.SubscaleDone("j/sum/0/g0", 2, "old", 1024, 17, 1.5, 0.25),
    TaskMetrics("j/sum/0/g0", "sum", 0, "running", 10, 9, 1000, 900, 1.5, 2.5, 0.25, 3,
                4096, 16, 1, _H.to_wire(), -(2**63)),
    RescaleProgress("sum", "stop-restart", "install", 32, 16, 1024, True),
    RescaleReport("sum", "stop-restart", 2, 4, 1.0, 3.5, 2.5, 16, 2048,
                  (("pause", 0.01), ("drain", 0.2)), (("j/src/0/g0", {"0-of-1": 120}),)),
    m.JobStatus(
        "wordcount", "failed", "user function raised", "count", 2, "('a', 1)", "KeyError('a')",
        "http://127.0.0.1:9000/metrics",
    ),
    m.SinkGuarantee("out", "late_sink", "ParquetSink", "exactly-once", "two-phase commit"),
    DecisionRecord(1.5, "ds2", "scale", "sum", "scale 'sum' to 4 (drrs)", "load 1.9",
                   "executed", "drrs rescale of 'sum' 2 -> 4 done", 1.25, 3, 9.5),
    RescaleRecord("sum", "drrs", 2, 4, 10.0, 11.5, 16, 2048, False, 900.0, 120, 12.5, 80.0,
                  0.13, "controller ds2"),
]

# Messages that nest other wire messages (OutputEdge holds OutputChannels, Connect holds
# OutputEdges).
NESTED_CONTROL_MESSAGES = [
    m.JobStatus("wordcount", "restarting", restarts=2, last_failure="task t died",
                checkpoints=m.CheckpointStats(3, 1, 7, "/tmp/chk/j/chk-7", 0.5, 4096,
                                              (("j/sum/0/g0", 0.01),), "timeout", "/tmp/sp"),
                sinks=(m.SinkGuarantee("out", "sink", "LatencySink", "at-least-once",
                                       "no two-phase commit"),)),
    m.OutputEdge(0, "forward", (CH0,)),
    m.OutputEdge(1, "rebalance", (CH0, CH1)),
    m.OutputEdge(2, "keyed", (CH0, CH1), (0, 1, 1, 0)),
    m.AddOutputChannels(0, (CH0, CH1)),
    m.ExpectOutgoing(2, (5, 6), CH1, 3),
    m.PriorityBatch((m.SubscaleTriggered(3, ((5, 100), (6, 0)), 6),
                     m.MigrateState(3, 6, b"\x00state", 42), m.PullState(3, 5))),
    m.Connect(((1, 0),), (m.OutputEdge(0, "keyed", (CH0, CH1), (1, 0)),)),
]


def test_every_declared_message_is_covered():
    covered = {type(x).__name__ for x in CHANNEL_EVENTS + FLAT_CONTROL_MESSAGES}
    covered |= {type(x).__name__ for x in NESTED_CONTROL_MESSAGES}
    assert covered == set(m._REGISTRY), "add new wire messages to this test module"


@pytest.mark.parametrize(
    "msg", CHANNEL_EVENTS + FLAT_CONTROL_MESSAGES + NESTED_CONTROL_MESSAGES, ids=repr
)
def test_message_round_trip(msg):
    data = m.encode_message(msg)
    assert isinstance(data, bytes)
    out = m.decode_message(data)
    assert out == msg
    assert_same(msg, out)


def test_nested_wire_messages_keep_their_types():
    msg = NESTED_CONTROL_MESSAGES[-1]
    out = m.decode_message(m.encode_message(msg))
    assert type(out.outputs) is tuple and type(out.outputs[0]) is m.OutputEdge
    assert type(out.outputs[0].channels[1]) is m.OutputChannel
    assert out.outputs[0].channels[1] == CH1
    assert type(out.inputs[0]) is tuple


def test_priority_batch_keeps_each_message_and_its_order():
    batch = next(x for x in NESTED_CONTROL_MESSAGES if isinstance(x, m.PriorityBatch))
    out = m.decode_message(m.encode_message(batch))
    assert [type(x) for x in out.messages] == [m.SubscaleTriggered, m.MigrateState, m.PullState]
    assert type(out.messages[1].state) is bytes and out.messages == batch.messages


def test_tags_are_class_names():
    assert m.encode_message(m.Watermark(5)) == pack_exact(["Watermark", 5])
    assert m.decode_message(pack_exact(["TaskFinished", "t"])) == m.TaskFinished("t")


def test_tuples_stay_tuples_in_control_messages():
    out = m.decode_message(m.encode_message(m.InstallKeyGroups(((1, b"a"), (2, b"b")))))
    assert type(out.groups) is tuple
    assert all(type(g) is tuple for g in out.groups)
    assert type(out.groups[0][1]) is bytes


# ---------------------------------------------------------------- frames


@pytest.mark.parametrize("event", [None, *CHANNEL_EVENTS], ids=repr)
def test_frame_round_trip_without_keys(event):
    frame = m.Frame(["a", ("b", 1), {"c": [2]}], [10, 11, 12], event=event)
    out = m.decode_frame(m.encode_frame(frame))
    assert out.values == ("a", ("b", 1), {"c": (2,)})  # fast codec: lists become tuples
    assert out.timestamps == (10, 11, 12)
    assert out.keys is None
    assert out.key_groups is None
    assert out.event == event
    if event is not None:
        assert type(out.event) is type(event)


@pytest.mark.parametrize("event", [None, m.Watermark(99), m.CheckpointBarrier(1)], ids=repr)
def test_frame_round_trip_with_keys(event):
    frame = m.Frame(
        values=[{"user": "u1", "n": 1}, {"user": ("u", 2), "n": 2}],
        timestamps=[1000, 1001],
        keys=["u1", ("u", 2)],
        key_groups=[17, 127],
        event=event,
    )
    out = m.decode_frame(m.encode_frame(frame))
    assert out == m.Frame(
        ({"user": "u1", "n": 1}, {"user": ("u", 2), "n": 2}),
        (1000, 1001),
        ("u1", ("u", 2)),
        (17, 127),
        event,
    )


@pytest.mark.parametrize("stamps", [[7, 7, 7], [7, 8, 7], [7], [7, 7, 8]], ids=repr)
def test_frame_timestamps_all_equal_travel_once_and_come_back_per_record(stamps):
    frame = m.Frame([("k", i) for i in range(len(stamps))], stamps, ["k"] * len(stamps),
                    [3] * len(stamps), m.Watermark(5))
    data = m.encode_frame(frame)
    out = m.decode_frame(data)
    assert out.timestamps == tuple(stamps) and out.event == m.Watermark(5)
    assert out.values == tuple(frame.values)
    many = m.Frame([1] * 1000, [1_764_000_000_000] * 1000)
    assert len(m.encode_frame(many)) < 1100  # one stamp, not a thousand
    assert m.decode_frame(m.encode_frame(many)).timestamps == (1_764_000_000_000,) * 1000


def test_frame_timestamps_of_a_few_batches_travel_as_runs_and_come_back_per_record():
    """A keyed channel's frame at p > 1 holds a few source batches, one stamp each: sent
    as runs (issue 32, item 9), read back one per record; many distinct stamps, floats or
    short frames go as they are."""
    t = 1_764_000_000_000
    two = [t] * 500 + [t + 3] * 500
    frame = m.Frame([("k", i) for i in range(1000)], two, ["k"] * 1000, [3] * 1000)
    data = m.encode_frame(frame)
    assert len(data) < len(m.encode_frame(m.Frame(frame.values, [t + i for i in range(1000)],
                                                  frame.keys, frame.key_groups))) - 8000
    assert m.decode_frame(data).timestamps == tuple(two)
    for stamps in ([t + i % 20 for i in range(40)], [1.5] * 10 + [2.5] * 10, [t, t + 1] * 3,
                   [True] * 10 + [False] * 10):
        out = m.decode_frame(m.encode_frame(m.Frame([0] * len(stamps), stamps)))
        assert out.timestamps == tuple(stamps)
        assert [type(x) for x in out.timestamps] == [type(x) for x in stamps]


def test_empty_frame_carrying_only_an_event():
    out = m.decode_frame(m.encode_frame(m.Frame((), (), event=m.EndOfStream())))
    assert out == m.Frame((), (), None, None, m.EndOfStream())


def test_latency_marker_float_survives_a_frame():
    out = m.decode_frame(m.encode_frame(m.Frame((), (), event=m.LatencyMarker(0.1, 2))))
    assert out.event == m.LatencyMarker(0.1, 2)
    assert type(out.event.created_at) is float


def test_frame_with_undeclared_event_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Bogus:
        x: int

    with pytest.raises(CodecError, match="Bogus is not a declared wire message"):
        m.encode_frame(m.Frame((1,), (1,), event=Bogus(1)))


def test_frame_bytes_with_unknown_event_tag_are_refused():
    data = pack_fast(((1,), (1,), None, None, ("Pickle", b"cos\nsystem\n")))
    with pytest.raises(CodecError, match="not a declared wire message"):
        m.decode_frame(data)


# ---------------------------------------------------------------- refusals


def test_undeclared_message_is_refused_on_encode():
    @dataclasses.dataclass(frozen=True)
    class NotDeclared:
        x: int

    with pytest.raises(CodecError, match="NotDeclared is not a declared wire message"):
        m.encode_message(NotDeclared(1))
    with pytest.raises(CodecError, match="Frame is not a declared wire message"):
        m.encode_message(m.Frame((), ()))
    with pytest.raises(CodecError):
        m.encode_message({"tag": "Watermark"})


def test_subclass_of_declared_message_is_refused():
    @dataclasses.dataclass(frozen=True)
    class SpecialWatermark(m.Watermark):
        pass

    with pytest.raises(CodecError, match="SpecialWatermark"):
        m.encode_message(SpecialWatermark(1))


@pytest.mark.parametrize(
    "payload",
    [["Unknown", 1], ["os.system", "ls"], [], 5, None, {"Nope": 1}, ["__class__"]],
    ids=repr,
)
def test_undeclared_message_is_refused_on_decode(payload):
    with pytest.raises(CodecError, match="not a declared wire message"):
        m.decode_message(pack_exact(payload))


def test_garbage_bytes_are_refused_on_decode():
    with pytest.raises(CodecError):
        m.decode_message(b"\xc1\xc1")
    with pytest.raises(CodecError):
        m.decode_frame(b"\xc1")


@pytest.mark.parametrize(
    "payload", [["Watermark"], ["Watermark", 1, 2], {"Watermark": 1}], ids=repr
)
def test_declared_tag_with_wrong_fields_raises_codec_error(payload):
    with pytest.raises(CodecError):
        m.decode_message(pack_exact(payload))


def test_wire_requires_frozen_dataclass():
    @dataclasses.dataclass
    class Mutable:
        x: int

    class Plain:
        pass

    with pytest.raises(TypeError, match="must be a frozen dataclass"):
        m.wire(Mutable)
    with pytest.raises(TypeError, match="must be a frozen dataclass"):
        m.wire(Plain)
    assert "Mutable" not in m._REGISTRY and "Plain" not in m._REGISTRY


def test_messages_are_immutable():
    wm = m.Watermark(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        wm.timestamp = 2  # type: ignore[misc]


# ---------------------------------------------------------------- OutputEdge invariants


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(partitioning="broadcast", channels=(CH0,)), "unknown partitioning 'broadcast'"),
        (dict(partitioning="forward", channels=()), "exactly one channel"),
        (dict(partitioning="forward", channels=(CH0, CH1)), "exactly one channel"),
        (dict(partitioning="keyed", channels=(CH0, CH1), routing=(0, 2)), "outside"),
        (dict(partitioning="keyed", channels=(CH0,), routing=(0, -1)), "outside"),
        (dict(partitioning="keyed", channels=(), routing=(0,)), "outside"),
    ],
)
def test_output_edge_invariants(kwargs, match):
    with pytest.raises(ValueError, match=match):
        m.OutputEdge(edge_id=0, **kwargs)


def test_output_edge_valid_shapes():
    e = m.OutputEdge(0, "keyed", (CH0, CH1), (1, 0, 1))
    assert e.routing == (1, 0, 1)
    assert m.OutputEdge(1, "rebalance", (CH0, CH1)).routing == ()
    assert m.OutputEdge(2, "forward", (CH1,)).channels == (CH1,)
