"""The Spark bridge's lanes (``engine.spark.bridge``): the real ``BridgeActor`` and the real
lane readers of ``SparkSource``, joined in one process by an event loop instead of Ray
(no Ray, no Spark session).

* A lane moved to another reader (a source rescale) is read on exactly from the resume
  state: nothing lost, nothing twice, in order.
* A restore onto a new bridge: the resume states say which chunks of the replayed Spark
  micro-batch reflow had emitted (dropped) or emitted in part (the rest delivered).
* A resume state the bridge can no longer serve fails the reader saying so.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pyarrow as pa
import pytest

from engine.io.sources import PartitionedReader
from engine.spark.bridge import BridgeActor, SparkQueryFailed, SparkSource
from engine.spark.schema import to_ipc
from engine.time.clock import ManualClock
from engine.wire.codec import pack_exact, unpack_exact

ROWS = 10  # rows per chunk


class Loop:
    """An event loop stepped by hand: actor calls become tasks, ``done()`` steps it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def step(self) -> None:
        for _ in range(5):
            self.loop.run_until_complete(asyncio.sleep(0))

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        for t in asyncio.all_tasks(self.loop):
            t.cancel()
        self.step()
        self.loop.close()


class _Ref:
    def __init__(self, loop: Loop, task: asyncio.Task[Any]) -> None:
        self.loop, self.task = loop, task

    def future(self) -> _Ref:
        return self

    def done(self) -> bool:
        self.loop.step()
        return self.task.done()

    def result(self) -> Any:
        return self.task.result()


class _Method:
    def __init__(self, loop: Loop, fn: Any) -> None:
        self.loop, self.fn = loop, fn

    def remote(self, *args: Any) -> _Ref:
        return _Ref(self.loop, self.loop.loop.create_task(self.fn(*args)))


class Handle:
    """What a reader sees of the actor: ``handle.get.remote(...).future()``."""

    def __init__(self, loop: Loop, actor: BridgeActor) -> None:
        self.get = _Method(loop, actor.get)


def new_bridge(loop: Loop, queue_chunks: int = 16) -> BridgeActor:
    cfg = {"name": "spark-bridge/t", "source": "t", "schema": "v BIGINT NOT NULL",
           "chunk_rows": ROWS, "queue_chunks": queue_chunks, "dead_letter_dir": "/tmp",
           "connect_timeout_s": 5.0}
    return BridgeActor(pack_exact(cfg))


def reader(source: SparkSource, loop: Loop, actor: BridgeActor, lane: int, lanes: int,
           state: Any = None) -> Any:
    r = source.open_partition(f"{lane}-of-{lanes}", state, ManualClock())
    r._actor = Handle(loop, actor)  # what ray.get_actor would give
    return r


def put(loop: Loop, actor: BridgeActor, batch: int, part: int, chunk: int,
        stream: str = "q") -> str:
    first = (batch * 100 + part * 10 + chunk) * ROWS
    table = pa.table({"v": pa.array(range(first, first + ROWS), pa.int64())})
    return loop.run(actor.put(stream, batch, part, chunk, ROWS, 0, 0, to_ipc(table)))


def poll_some(r: Any, loop: Loop, polls: int, max_records: int = 7) -> list[int]:
    out: list[int] = []
    for _ in range(polls):
        b = r.poll(max_records)
        if b is None:
            break
        out += b.values
    return out


@pytest.fixture
def loop():
    lp = Loop()
    yield lp
    lp.close()


def connect(readers: list[Any]) -> None:
    """Every lane's reader asks once (puts wait until every lane has had its reader)."""
    for r in readers:
        assert r.poll(5).values == []


def test_a_lane_moved_to_another_reader_goes_on_from_its_resume_state(loop):
    src = SparkSource("v BIGINT NOT NULL", name="t", partitions=2)
    actor = new_bridge(loop)
    r0, r1 = reader(src, loop, actor, 0, 2), reader(src, loop, actor, 1, 2)
    connect([r0, r1])
    for c in range(8):
        assert put(loop, actor, 0, 0, c) == "ok"
    got0 = poll_some(r0, loop, 3)  # 7 + 3 + 7 rows of lane 0: a chunk read in part
    state = unpack_exact(pack_exact(r0.offset()))  # what the task reports at release
    assert state["rows"] > 0 and state["batch"] == 0
    r0.close()
    moved = reader(src, loop, actor, 0, 2, state)  # the new task of lane 0
    got1 = poll_some(r1, loop, 40)
    got0 += poll_some(moved, loop, 40)
    loop.run(actor.end_input())
    got0 += poll_some(moved, loop, 5)
    got1 += poll_some(r1, loop, 5)
    assert moved.poll(5) is None and r1.poll(5) is None
    assert sorted(got0 + got1) == list(range(8 * ROWS)), "nothing lost, nothing twice"
    for got in (got0, got1):  # per lane: chunks in order, rows in order
        assert got == sorted(got)
    stats = unpack_exact(actor.get_stats())
    assert stats["rows_taken"] == 8 * ROWS and stats["readers"] == 2


def test_a_restore_onto_a_new_bridge_drops_what_reflow_had_of_the_replayed_batch(loop):
    src = SparkSource("v BIGINT NOT NULL", name="t", partitions=1)
    first = new_bridge(loop)
    r = reader(src, loop, first, 0, 1)
    connect([r])
    for c in range(4):
        put(loop, first, 3, 0, c)  # micro-batch 3, partition 0, chunks 0..3
    emitted = poll_some(r, loop, 5, max_records=5)  # chunks 0 and 1, 5 rows of chunk 2
    assert emitted == list(range(3000, 3025))
    state = unpack_exact(pack_exact(r.offset()))
    assert state["taken"] and state["batch"] == 3
    # everything restarts: a new bridge, Spark replays batch 3, the reader resumes
    second = new_bridge(loop)
    again = reader(src, loop, second, 0, 1, state)
    connect([again])
    replies = [put(loop, second, 3, 0, c) for c in range(4)]
    assert replies == ["dup", "dup", "ok", "ok"]
    loop.run(second.end_input())
    rest = poll_some(again, loop, 40)
    assert emitted + rest == list(range(3000, 3040)), "exactly once across the restore"
    stats = unpack_exact(second.get_stats())
    assert stats["duplicate_rows"] == 2 * ROWS


def test_an_older_batch_replayed_after_a_newer_one_is_a_duplicate(loop):
    src = SparkSource("v BIGINT NOT NULL", name="t", partitions=1)
    actor = new_bridge(loop)
    r = reader(src, loop, actor, 0, 1)
    connect([r])
    assert put(loop, actor, 5, 0, 0) == "ok"
    assert put(loop, actor, 5, 0, 0) == "dup"
    assert put(loop, actor, 6, 0, 0) == "ok"
    assert put(loop, actor, 5, 0, 1) == "dup", "Spark committed 5 before it planned 6"


def test_a_resume_state_the_bridge_dropped_already_fails_the_reader(loop):
    src = SparkSource("v BIGINT NOT NULL", name="t", partitions=1)
    actor = new_bridge(loop)
    r = reader(src, loop, actor, 0, 1)
    connect([r])
    old = r.offset()  # the state of an old checkpoint: nothing emitted
    for c in range(4):
        put(loop, actor, 0, 0, c)
    poll_some(r, loop, 20)  # all emitted: the reader's next get says so
    put(loop, actor, 0, 0, 4)
    poll_some(r, loop, 2)  # takes chunk 5 and asks again: chunks 1..4 go
    r.close()
    stale = reader(src, loop, actor, 0, 1, old)
    with pytest.raises(SparkQueryFailed, match="cannot resume after chunk 0"):
        poll_some(stale, loop, 5)


def test_in_a_job_that_checkpoints_a_lane_keeps_chunks_until_a_checkpoint_covers_them(loop):
    """A task killed after it emitted past the last complete checkpoint: the restored
    reader opens the lane at that checkpoint's state and reads on exactly (the same Spark
    query still running: it will not replay what it committed)."""
    src = SparkSource("v BIGINT NOT NULL", name="t", partitions=1)
    actor = new_bridge(loop)
    r = reader(src, loop, actor, 0, 1)
    r.retain_until_committed()  # the task does so when the job checkpoints
    connect([r])
    for c in range(4):
        put(loop, actor, 0, 0, c)
    before = poll_some(r, loop, 3, max_records=5)  # chunk 0, 5 rows of chunk 1
    checkpoint = unpack_exact(pack_exact(r.offset()))
    r.committed(checkpoint)  # that checkpoint completed
    after = poll_some(r, loop, 40)  # emitted past it (its gets say so), then the task dies
    put(loop, actor, 0, 0, 4)
    after += poll_some(r, loop, 3)
    put(loop, actor, 0, 0, 5)
    after += poll_some(r, loop, 3)
    assert before + after == list(range(60))
    r.close()
    restored = reader(src, loop, actor, 0, 1, checkpoint)
    restored.retain_until_committed()
    loop.run(actor.end_input())
    replay = poll_some(restored, loop, 40)
    assert restored.poll(5) is None
    assert before + replay == list(range(60)), "from the checkpoint on: nothing lost, none twice"
    assert actor.lanes[0].trimmed == checkpoint["seq"], "kept what the checkpoint did not cover"


def test_lanes_are_partitions_any_task_can_read(loop):
    src = SparkSource("v BIGINT NOT NULL", name="t", partitions=4)
    assert src.partitions(1) == ["0-of-4", "1-of-4", "2-of-4", "3-of-4"]
    assert SparkSource("v BIGINT NOT NULL", name="u").partitions(3) == [
        "0-of-3", "1-of-3", "2-of-3"]
    task = PartitionedReader(src, [("0-of-4", None), ("2-of-4", None)], ManualClock())
    assert task.partitions == ("0-of-4", "2-of-4")
    with pytest.raises(ValueError, match="resume state must be"):
        src.open_partition("0-of-4", [3, 10], ManualClock())
    with pytest.raises(ValueError, match="partitions must be an int"):
        SparkSource("v BIGINT NOT NULL", partitions=0)


def spooled_bridge(loop: Loop, spool: str) -> BridgeActor:
    cfg = {"name": "spark-bridge/t", "source": "t", "schema": "v BIGINT NOT NULL",
           "chunk_rows": ROWS, "queue_chunks": 16, "dead_letter_dir": "/tmp",
           "connect_timeout_s": 5.0, "spool_dir": spool}
    return BridgeActor(pack_exact(cfg))


def test_a_restore_in_a_new_process_reads_what_spark_committed_from_the_spool(loop,
                                                                             tmp_path):
    """Driver, bridge and Spark query all gone after reflow emitted rows past its last
    complete checkpoint, of micro-batches Spark had committed (it never sends them again)
    and of one it had not: the new bridge reads the spool, the restored reader goes on
    from the checkpoint, Spark's replay of the uncommitted batch is dropped where spooled,
    and the rows are exactly once. Without the spool the committed rows are lost."""
    spool = str(tmp_path / "spool")
    src = SparkSource("v BIGINT NOT NULL", name="t", partitions=1)
    first = spooled_bridge(loop, spool)
    r = reader(src, loop, first, 0, 1)
    r.retain_until_committed()  # the job checkpoints
    connect([r])
    for c in range(3):
        put(loop, first, 0, 0, c)  # micro-batch 0
    before = poll_some(r, loop, 3, max_records=8)  # chunk 0 and 8 rows of chunk 1
    checkpoint = unpack_exact(pack_exact(r.offset()))
    r.committed(checkpoint)  # the last checkpoint that completes
    after = poll_some(r, loop, 20)  # the rest of batch 0: Spark commits it
    for c in range(2):
        put(loop, first, 1, 0, c)  # micro-batch 1, chunk 2 still to come: not committed
    after += poll_some(r, loop, 20)
    assert before + after == list(range(30)) + list(range(1000, 1020))
    assert unpack_exact(first.get_stats())["spool_chunks"] == 4, "chunk 0 was covered"
    # the process ends; a new one: new bridge on the same spool, the restored reader
    second = spooled_bridge(loop, spool)
    restored = reader(src, loop, second, 0, 1, checkpoint)
    restored.retain_until_committed()
    replay = restored.poll(5).values  # the spool's chunks are there at once
    assert replay == [18, 19], "the rest of the chunk emitted in part"
    assert [put(loop, second, 1, 0, c) for c in range(3)] == ["dup", "dup", "ok"]
    loop.run(second.end_input())
    replay += poll_some(restored, loop, 40)
    assert restored.poll(5) is None
    assert before + replay == list(range(30)) + list(range(1000, 1030)), (
        "from the checkpoint on: nothing lost, nothing twice")
    assert unpack_exact(second.get_stats())["spool_chunks_loaded"] == 4


def test_the_spool_keeps_what_no_checkpoint_covers_and_a_fresh_start_clears_it(loop,
                                                                               tmp_path):
    from engine.spark.spool import ChunkSpool

    spool = str(tmp_path / "spool")
    src = SparkSource("v BIGINT NOT NULL", name="t", partitions=1)
    actor = spooled_bridge(loop, spool)
    r = reader(src, loop, actor, 0, 1)
    r.retain_until_committed()
    connect([r])
    for c in range(4):
        put(loop, actor, 0, 0, c)
    poll_some(r, loop, 20)
    assert ChunkSpool(spool).size()[0] == 4
    r.committed(r.offset())  # a checkpoint covers all four: the next get drops them
    put(loop, actor, 1, 0, 0)
    poll_some(r, loop, 3)
    assert ChunkSpool(spool).size()[0] == 1
    fresh = spooled_bridge(loop, spool)  # a new job of the source, not a restore
    again = reader(src, loop, fresh, 0, 1)
    again.retain_until_committed()
    connect([again])
    assert ChunkSpool(spool).size() == (0, 0)
    # a job without checkpoints spools nothing
    plain = spooled_bridge(loop, spool)
    p = reader(src, loop, plain, 0, 1)
    connect([p])
    put(loop, plain, 0, 0, 0)
    assert unpack_exact(plain.get_stats())["spooling"] is False
    assert ChunkSpool(spool).size() == (0, 0)
