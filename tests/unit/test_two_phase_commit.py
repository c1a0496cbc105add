"""Exactly-once sinks by two-phase commit (``engine.io.sinks``): ParquetSink, TestingSink and
the Spark ``OutputLogSink``, driven by hand (no Ray, no Spark session).

For each: with transactions on, what is written and pre-committed is invisible; a commit
makes it visible; committing again (a recovery) is a no-op, also from another writer; data
never pre-committed by a writer that is gone is never visible and is cleaned up; without
transactions a writer behaves as before (visible at flush or at once).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.dataflow import graph as g
from engine.errors import SinkCommitError
from engine.io.sinks import LatencySink, ParquetSink, PendingFiles, Sink, SinkWriter
from engine.io.testing import TestingSink
from engine.operators.chain import OperatorChain
from engine.spark.outlog import OutputLogSink, latest_offset
from engine.time.clock import ManualClock
from engine.wire.codec import pack_exact, unpack_exact


def visible_parquet(directory: str) -> list[Any]:
    rows: list[Any] = []
    for n in sorted(os.listdir(directory)):
        if n.endswith(".parquet") and not n.startswith((".", "_")):
            rows += pq.read_table(os.path.join(directory, n)).column("value").to_pylist()
    return rows


def visible_log(directory: str) -> list[Any]:
    rows: list[Any] = []
    for w, n in sorted(latest_offset(directory).items()):
        for k in range(n):
            path = os.path.join(directory, f"seg-{w}-{k:010d}.parquet")
            rows += pq.read_table(path).column("value").to_pylist()
    return rows


class Kind:
    """One exactly-once sink under test: how to build it and what is visible."""

    def __init__(self, name: str, build: Callable[[str], Sink],
                 visible: Callable[[Sink], list[Any]]) -> None:
        self.name, self.build, self.visible = name, build, visible


KINDS = [
    Kind("parquet", lambda d: ParquetSink(d, rows_per_file=7),
         lambda s: visible_parquet(s.directory)),  # type: ignore[attr-defined]
    Kind("testing", lambda d: TestingSink(d), lambda s: s.results()),  # type: ignore[attr-defined]
    Kind("outlog", lambda d: OutputLogSink(d, "value BIGINT NOT NULL", rows_per_segment=7,
                                           linger_s=3600.0),
         lambda s: visible_log(s.directory)),  # type: ignore[attr-defined]
]


@pytest.fixture(params=KINDS, ids=lambda k: k.name)
def kind(request: pytest.FixtureRequest) -> Kind:
    return request.param


def writer(sink: Sink, task: int = 0, transactions: bool = True) -> SinkWriter:
    w = sink.open(task, 2, ManualClock())
    if transactions:
        w.begin_transactions()
    return w


def test_every_built_in_file_sink_says_it_is_exactly_once_and_the_others_do_not():
    assert ParquetSink.exactly_once and TestingSink.exactly_once
    assert OutputLogSink.exactly_once
    assert not LatencySink.exactly_once and not Sink.exactly_once


def test_pre_committed_data_is_invisible_and_a_commit_shows_it(kind, tmp_path):
    sink = kind.build(str(tmp_path / "out"))
    sink.prepare()
    w = writer(sink)
    w.write(list(range(10)), [0] * 10)
    assert kind.visible(sink) == []
    t1 = w.pre_commit(1)
    assert t1 is not None and unpack_exact(pack_exact(t1)) == t1, "msgpack-able"
    assert kind.visible(sink) == [], "pre-committed is durable, not visible"
    w.write(list(range(10, 15)), [0] * 5)
    t2 = w.pre_commit(2)
    w.commit([t1])
    assert kind.visible(sink) == list(range(10))
    w.write([15], [0])
    w.commit([t2])
    assert kind.visible(sink) == list(range(15)), "15 is not pre-committed yet"
    assert w.pre_commit(3) is not None
    assert w.pre_commit(4) is None, "nothing written since: nothing to commit"
    w.close()


def test_a_commit_is_idempotent_and_any_writer_of_the_sink_can_do_it(kind, tmp_path):
    sink = kind.build(str(tmp_path / "out"))
    sink.prepare()
    w0, w1 = writer(sink, 0), writer(sink, 1)
    w0.write([1, 2, 3], [0] * 3)
    w1.write([4, 5], [0] * 2)
    t0, t1 = w0.pre_commit(7), w1.pre_commit(7)
    w0.commit([t0, t1])
    assert sorted(kind.visible(sink)) == [1, 2, 3, 4, 5]
    w1.commit([t0, t1, None])  # again, after a recovery: a no-op
    w0.close()
    w1.close()
    later = writer(sink, 0)  # a restarted task re-commits the restored checkpoint's
    later.commit([t1, t0])
    assert sorted(kind.visible(sink)) == [1, 2, 3, 4, 5]


def test_abandoned_data_is_never_visible_and_is_cleaned_up(kind, tmp_path):
    directory = str(tmp_path / "out")
    sink = kind.build(directory)
    sink.prepare()
    dead = writer(sink, 0)
    dead.write(list(range(20)), [0] * 20)  # never pre-committed: a failure came first
    if isinstance(sink, TestingSink | OutputLogSink):
        dead.flush()
    dead_files = pending_files(directory)
    assert dead_files, "the dead writer's data is durable but pending"
    live = writer(sink, 1)
    live.write([100], [0])
    live.commit([live.pre_commit(1)])
    assert kind.visible(sink) == [100]
    assert set(pending_files(directory)) == set(dead_files), \
        "a living writer's pending data is never cleaned"
    dead.close()  # its process is gone (the lock it held is free)
    sink.prepare()  # the next run (or the next commit) cleans up
    assert kind.visible(sink) == [100]
    assert pending_files(directory) == [], "nothing pending is left"
    live.write([101], [0])
    live.commit([live.pre_commit(2)])
    assert kind.visible(sink) == [100, 101]


def pending_files(directory: str) -> list[str]:
    root = os.path.join(directory, PendingFiles.ROOT)
    out = []
    for base, _, files in os.walk(root):
        out += [os.path.relpath(os.path.join(base, f), root) for f in files if f != "lock"]
    return sorted(out)


def test_a_commit_whose_data_is_gone_raises_instead_of_losing_records(kind, tmp_path):
    directory = str(tmp_path / "out")
    sink = kind.build(directory)
    sink.prepare()
    w = writer(sink)
    w.write([1, 2], [0, 0])
    t = w.pre_commit(1)
    for pending, *_ in t:
        os.remove(os.path.join(directory, pending))
    with pytest.raises(SinkCommitError, match="cannot commit .*is gone"):
        w.commit([t])


def test_without_transactions_a_writer_behaves_as_before(kind, tmp_path):
    sink = kind.build(str(tmp_path / "out"))
    sink.prepare()
    w = writer(sink, transactions=False)
    w.write(list(range(7)), [0] * 7)  # a full file/segment for parquet and the log
    w.write([7], [0])
    w.flush()
    assert sorted(kind.visible(sink)) == list(range(8))
    assert w.pre_commit(1) is None  # a job without checkpoints never calls it: harmless
    assert not os.path.exists(os.path.join(str(tmp_path / "out"), PendingFiles.ROOT))
    w.close()


@settings(max_examples=30, deadline=None)
@given(ops=st.lists(st.sampled_from(["write", "pre", "commit", "recommit"]), max_size=30),
       kind_index=st.integers(0, len(KINDS) - 1))
def test_visible_is_exactly_what_was_written_before_the_last_committed_barrier(
        tmp_path_factory: pytest.TempPathFactory, ops: list[str], kind_index: int) -> None:
    """Random writes, barriers and commits: the visible records are those written before
    the newest committed barrier, in order, once each."""
    kind = KINDS[kind_index]
    sink = kind.build(str(tmp_path_factory.mktemp("sink") / "out"))
    sink.prepare()
    w = writer(sink)
    written, barriers, txns = 0, [0], []
    committed, committed_txns = 0, 0
    for op in ops:
        if op == "write":
            w.write([written, written + 1, written + 2], [0] * 3)
            written += 3
        elif op == "pre":
            txns.append(w.pre_commit(len(barriers)))
            barriers.append(written)
        elif op == "commit" and txns:
            w.commit(txns)
            committed, committed_txns = barriers[-1], len(txns)
        elif op == "recommit":  # a recovery commits the restored checkpoint's again
            w.commit(txns[:committed_txns])
        assert sorted(kind.visible(sink)) == list(range(committed)), ops
    w.close()


# ---------------------------------------------------------------- the chain's writers


class Recording(Sink):
    exactly_once = True

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def open(self, task_index: int, parallelism: int, clock: Any) -> SinkWriter:
        return _RecordingWriter(self.calls)


class _RecordingWriter(SinkWriter):
    def __init__(self, calls: list[tuple[str, Any]]) -> None:
        self.calls = calls

    def write(self, values: Any, timestamps: Any) -> None:
        self.calls.append(("write", list(values)))

    def begin_transactions(self) -> None:
        self.calls.append(("begin", None))

    def pre_commit(self, checkpoint_id: int) -> Any:
        self.calls.append(("pre", checkpoint_id))
        return [checkpoint_id]

    def commit(self, transactions: Any) -> None:
        self.calls.append(("commit", list(transactions)))


def test_the_chain_reaches_every_writer_by_name_dead_letters_included():
    out, dead = Recording(), Recording()
    ops = (g.OperatorDef("m", g.MAP, lambda x: x, 1, (g.InputDef("src"),), dead_letter=dead),
           g.OperatorDef("out", g.SINK, out, 1, (g.InputDef("m"),)))
    chain = OperatorChain(ops, 0, 1, 8, (), ManualClock(), lambda: 0)
    chain.begin_transactions()
    assert out.calls == [("begin", None)] and dead.calls == [("begin", None)]
    assert dict(chain.pre_commit(3)) == {"out": [3], "m/dead-letter": [3]}
    chain.commit("out", [[3]])
    assert out.calls[-1] == ("commit", [[3]]) and dead.calls[-1] == ("pre", 3)
    chain.commit("elsewhere", [None])  # a writer the task lacks after a graph change
    assert out.calls[-1] == ("commit", [[3]]) and dead.calls[-1] == ("pre", 3)
