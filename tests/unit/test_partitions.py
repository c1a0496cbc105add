"""Sources partitioned independently of tasks: the ``PartitionedReader`` of a source task,
and every built-in source resuming exactly when its partitions move to another number of
tasks (no Ray: readers are driven by hand on a ``ManualClock``).

The property: read some records with the partitions spread over p1 tasks, take the
``{partition: resume state}`` of every task, spread the same partition list over p2 tasks
and read on to the end. Per partition, the records are those of one uninterrupted read of
that partition, in order (nothing lost, nothing twice).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.dataflow.partitions import check_partitions, partitions_of_task
from engine.errors import ConfigError, UserFunctionError
from engine.io.sources import (
    GeneratorSource,
    ParquetSource,
    PartitionedReader,
    Source,
    SourceBatch,
    SourceReader,
    indexed_partitions,
    parse_indexed,
)
from engine.io.testing import SourceGate, TestingSource
from engine.time.clock import ManualClock
from engine.time.event_time import MIN_WATERMARK
from engine.wire.codec import pack_exact, unpack_exact
from examples.nexmark.generator import NexmarkConfig
from examples.nexmark.source import NexmarkSource

# ---------------------------------------------------------------- a tagging wrapper


class Tagged(Source):
    """``source`` with every record tagged by its partition: ``(partition, record)``, so a
    test can check per-partition order through a reader that mixes partitions."""

    def __init__(self, source: Source) -> None:
        self.source = source

    def partitions(self, parallelism: int) -> list[str]:
        return self.source.partitions(parallelism)

    def open_partition(self, partition: str, resume: Any, clock: Any) -> SourceReader:
        return _TaggedReader(partition, self.source.open_partition(partition, resume, clock))


class _TaggedReader(SourceReader):
    def __init__(self, pid: str, inner: SourceReader) -> None:
        self.pid, self.inner = pid, inner

    def poll(self, max_records: int) -> SourceBatch | None:
        b = self.inner.poll(max_records)
        if b is None:
            return None
        return SourceBatch([(self.pid, v) for v in b.values], b.timestamps)

    def offset(self) -> Any:
        return self.inner.offset()

    def seconds_until_ready(self) -> float:
        return self.inner.seconds_until_ready()

    def close(self) -> None:
        self.inner.close()


def drain_partition(src: Source, pid: str) -> list[Any]:
    reader, out = src.open_partition(pid, None, ManualClock()), []
    while (b := reader.poll(1000)) is not None:
        out += b.values
    return out


def per_partition(records: list[tuple[str, Any]]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for pid, v in records:
        out.setdefault(pid, []).append(v)
    return out


def readers_for(src: Source, parts: list[str], p: int, states: dict[str, Any],
                clock: ManualClock) -> list[PartitionedReader]:
    return [PartitionedReader(src, [(pid, states.get(pid))
                                    for pid in partitions_of_task(parts, i, p)], clock)
            for i in range(p)]


# ---------------------------------------------------------------- the sources under test


@pytest.fixture(scope="module")
def parquet_paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("parquet")
    files = base / "files"
    files.mkdir()
    for f in range(5):
        n = 37 * (f + 1)
        pq.write_table(pa.table({"v": [f * 1000 + i for i in range(n)]}),
                       str(files / f"part-{f}.parquet"), row_group_size=16)
    one = str(base / "one.parquet")
    ts = pa.array(np.arange(700, dtype="int64") * 1000, type=pa.timestamp("us"))
    pq.write_table(pa.table({"v": list(range(700)), "t": ts}), one, row_group_size=64)
    return {"files": str(files), "one": one}


SOURCES: dict[str, Callable[[dict[str, str]], Source]] = {
    "testing": lambda _: TestingSource(range(523)),
    "testing-5": lambda _: TestingSource(range(311), partitions=5),
    "generator": lambda _: GeneratorSource(None, num_records=2_000, num_keys=50, seed=4),
    "generator-7": lambda _: GeneratorSource(None, num_records=1_500, partitions=7),
    "parquet-files": lambda paths: ParquetSource(paths["files"], batch_rows=10),
    "parquet-row-groups": lambda paths: ParquetSource(paths["one"], timestamp_column="t",
                                                      batch_rows=20),
    "nexmark": lambda _: NexmarkSource(NexmarkConfig(seed=3), event_time=True,
                                       num_events=3_000, split_events=100),
}


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(sorted(SOURCES)), p0=st.integers(1, 4), p1=st.integers(1, 5),
       p2=st.integers(1, 5), seed=st.integers(0, 2**32 - 1))
def test_every_source_resumes_exactly_at_another_number_of_tasks(
        parquet_paths: dict[str, str], kind: str, p0: int, p1: int, p2: int,
        seed: int) -> None:
    rng = random.Random(seed)
    src = Tagged(SOURCES[kind](parquet_paths))
    parts = src.partitions(p0)  # fixed for the job's life, from the initial parallelism
    want = {pid: drain_partition(src.source, pid) for pid in parts}
    clock = ManualClock()
    got: list[tuple[str, Any]] = []
    # phase 1: p1 tasks read a random number of batches each
    states: dict[str, Any] = {}
    for reader in readers_for(src, parts, p1, {}, clock):
        for _ in range(rng.randint(0, 6)):
            batch = reader.poll(rng.randint(1, 90))
            if batch is None:
                break
            got += batch.values
        states.update(reader.offsets())
        reader.close()
    assert set(states) == set(parts), "every partition reports its state"
    states = unpack_exact(pack_exact(states))  # what a checkpoint stores, msgpack-able
    # phase 2: the same partitions over p2 tasks, from their states, to the end
    for reader in readers_for(src, parts, p2, states, clock):
        while (batch := reader.poll(rng.randint(1, 200))) is not None:
            got += batch.values
        assert reader.ended
    assert per_partition(got) == {pid: v for pid, v in want.items() if v}, (
        f"kind={kind} p0={p0} p1={p1} p2={p2} seed={seed}")


def test_partitions_are_fixed_by_the_source_not_by_the_tasks(parquet_paths):
    assert TestingSource(range(9)).partitions(3) == ["0-of-3", "1-of-3", "2-of-3"]
    assert TestingSource(range(9), partitions=2).partitions(7) == ["0-of-2", "1-of-2"]
    assert GeneratorSource(None, partitions=4).partitions(1) == indexed_partitions(4)
    files = ParquetSource(parquet_paths["files"])
    assert files.partitions(1) == files.partitions(8) == [f"part-{f}.parquet" for f in range(5)]
    assert ParquetSource(parquet_paths["one"]).partitions(2) == [
        f"one.parquet#{k}" for k in range(11)]
    assert partitions_of_task(["a", "b", "c", "d", "e"], 1, 2) == ("b", "d")
    assert partitions_of_task(["a"], 2, 3) == ()


def test_partition_ids_and_states_a_source_does_not_know_are_refused():
    assert parse_indexed("3-of-8") == (3, 8)
    for bad in ("8-of-8", "x-of-2", "1of2", "-1-of-2", "", None):
        with pytest.raises(ValueError, match="not one of its partitions"):
            parse_indexed(bad, "TestingSource")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="resume state must be an int"):
        TestingSource(range(3)).open_partition("0-of-1", [1, 2], ManualClock())
    with pytest.raises(ValueError, match="resume state must be an int"):
        GeneratorSource(None).open_partition("0-of-1", -1, ManualClock())
    with pytest.raises(ConfigError, match="partitions must be an int"):
        TestingSource(range(3), partitions=0)
    with pytest.raises(ConfigError, match="partitions must be an int"):
        GeneratorSource(None, partitions=True)


def test_a_partition_list_must_be_unique_strings():
    assert check_partitions(["a", "b"], "src") == ("a", "b")
    with pytest.raises(ConfigError, match="appears twice"):
        check_partitions(["a", "a"], "src")
    with pytest.raises(ConfigError, match="non-empty strings"):
        check_partitions(["a", 3], "src")
    with pytest.raises(ConfigError, match="must return a list"):
        check_partitions("ab", "src")


# ---------------------------------------------------------------- the reader of a task


class Steps(Source):
    """Partition ``"<name>:<n>:<step>"`` emits n records ``(name, i)``, ``step`` per poll
    at most, timestamps ``i * 10``; ``"<name>:<n>:0"`` has nothing due, forever."""

    def partitions(self, parallelism: int) -> list[str]:
        return []

    def open_partition(self, partition: str, resume: Any, clock: Any) -> SourceReader:
        name, n, step = partition.split(":")
        return _StepsReader(name, int(n), int(step), resume or 0)


class _StepsReader(SourceReader):
    def __init__(self, name: str, n: int, step: int, pos: int) -> None:
        self.name, self.n, self.step, self.pos = name, n, step, pos
        self.closed = False

    def poll(self, max_records: int) -> SourceBatch | None:
        if self.pos >= self.n:
            return None
        end = min(self.n, self.pos + min(self.step, max_records))
        out = [(self.name, i) for i in range(self.pos, end)]
        self.pos = end
        return SourceBatch(out, [i * 10 for _, i in out])

    def offset(self) -> Any:
        return self.pos

    def seconds_until_ready(self) -> float:
        return 0.25 if self.step == 0 else 0.0

    def close(self) -> None:
        self.closed = True


def test_polling_is_fair_over_partitions_and_keeps_each_in_order():
    r = PartitionedReader(Steps(), [("a:100:100", None), ("b:100:100", None),
                                    ("c:100:100", None)], ManualClock())
    first = r.poll(100)
    assert first is not None and {v[0] for v in first.values} == {"a"}
    second = r.poll(100)
    assert second is not None and {v[0] for v in second.values} == {"b"}, "starts after a"
    third = r.poll(150)  # c has 100; a and b have ended (they said so on this poll)
    assert third is not None and third.values == [("c", i) for i in range(100)]
    assert r.offsets() == {"a:100:100": 100, "b:100:100": 100, "c:100:100": 100}
    assert r.poll(10) is None and r.ended


def test_a_small_budget_still_reaches_every_partition_in_turn():
    r = PartitionedReader(Steps(), [(f"{x}:9:9", None) for x in "abc"], ManualClock())
    seen = []
    while (b := r.poll(2)) is not None:
        seen += b.values
    for x in "abc":
        assert [i for n, i in seen if n == x] == list(range(9))
    heads = [n for n, _ in seen[:6]]
    assert heads == ["a", "a", "b", "b", "c", "c"], "one partition per turn, round robin"


def test_ended_partitions_keep_their_state_and_the_reader_ends_with_the_last():
    clock = ManualClock()
    r = PartitionedReader(Steps(), [("a:3:5", None), ("b:8:5", 2)], clock)
    b = r.poll(100)
    assert b is not None and b.values == [("a", 0), ("a", 1), ("a", 2), ("b", 2), ("b", 3),
                                           ("b", 4), ("b", 5), ("b", 6)]
    b = r.poll(100)  # a ends here; b gives its last record
    assert b is not None and b.values == [("b", 7)]
    assert not r.ended
    assert r.offsets() == {"a:3:5": 3, "b:8:5": 8}
    assert r.poll(100) is None and r.ended
    assert r.offsets() == {"a:3:5": 3, "b:8:5": 8}
    assert r.partitions == ("a:3:5", "b:8:5")


def test_release_hands_partitions_over_with_their_states_and_add_takes_them():
    clock = ManualClock()
    src = Steps()
    r = PartitionedReader(src, [("a:10:4", None), ("b:10:4", None)], clock)
    r.poll(8)
    moved = r.release(["b:10:4"])
    assert moved == {"b:10:4": 4}
    assert r.partitions == ("a:10:4",)
    other = PartitionedReader(src, [], clock)
    other.add(list(moved.items()))
    rest = []
    while (b := other.poll(100)) is not None:
        rest += b.values
    assert rest == [("b", i) for i in range(4, 10)]
    with pytest.raises(ValueError, match="is not read by this task"):
        r.release(["b:10:4"])
    with pytest.raises(ValueError, match="read by this task already"):
        r.add([("a:10:4", 0)])


def test_a_reader_with_no_partitions_has_ended():
    r = PartitionedReader(Steps(), [], ManualClock())
    assert r.poll(10) is None and r.ended and r.offsets() == {}


def test_the_frontier_is_the_slowest_live_partitions_latest_timestamp():
    r = PartitionedReader(Steps(), [("fast:100:50", None), ("slow:100:5", None)], ManualClock())
    assert r.frontier() == MIN_WATERMARK, "a partition that emitted nothing holds it"
    r.poll(55)  # fast: 0..49 (ts 490), slow: 0..4 (ts 40)
    assert r.frontier() == 40
    r.poll(55)  # slow first this time: 5..9 (ts 90), then fast 50..99
    assert r.frontier() == 90
    while r.poll(100) is not None:
        pass
    assert r.frontier() == MIN_WATERMARK  # nothing live


def test_hints_come_from_the_partition_due_soonest():
    r = PartitionedReader(Steps(), [("idle:5:0", None), ("busy:5:1", None)], ManualClock())
    assert r.seconds_until_ready() == 0.0
    r.release(["busy:5:1"])
    assert r.seconds_until_ready() == 0.25


# ---------------------------------------------------------------- gates at any parallelism


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 6), p1=st.integers(1, 6), p2=st.integers(1, 6),
       after=st.integers(0, 60), seed=st.integers(0, 2**32 - 1))
def test_a_gate_holds_every_partition_at_any_number_of_partitions_and_tasks(
        n: int, p1: int, p2: int, after: int, seed: int) -> None:
    """The source's tasks together emit exactly records 0..after-1, the gate reports
    reached only once every partition holds, a re-layout while held holds at the same
    records, and opening lets every task read to the end."""
    rng = random.Random(seed)
    gate = SourceGate(after=after)
    src = TestingSource(range(60), gate=gate, partitions=n)
    parts = src.partitions(p1)
    clock = ManualClock()
    emitted: list[int] = []
    readers = readers_for(src, parts, p1, {}, clock)
    assert all(r.poll(1) is None for r in readers if not r.partitions), (
        "a task without partitions (more tasks than partitions) has ended at once")
    pending = [r for r in readers if r.partitions]
    while pending:  # poll at random until every task holds (an empty batch each)
        reader = rng.choice(pending)
        batch = reader.poll(rng.randint(1, 7))
        assert batch is not None, "a held source does not end"
        if batch.values:
            emitted += batch.values
            assert not gate.reached() or sorted(emitted) == list(range(after))
        else:
            pending.remove(reader)
    assert sorted(emitted) == list(range(after))
    assert gate.reached()
    states = {pid: s for r in readers for pid, s in r.offsets().items()}
    # moved while held: still held
    again = [r for r in readers_for(src, parts, p2, states, clock) if r.partitions]
    assert all(r.poll(10).values == [] for r in again)  # type: ignore[union-attr]
    gate.open()
    for r in again:
        while (b := r.poll(rng.randint(1, 13))) is not None:
            emitted += b.values
    assert sorted(emitted) == list(range(60)), f"n={n} p1={p1} p2={p2} after={after}"


def test_the_gate_waits_for_every_partition_not_just_one_task():
    gate = SourceGate(after=6)
    src = TestingSource(range(20), gate=gate, partitions=3)
    r = PartitionedReader(src, [("0-of-3", None), ("1-of-3", None)], ManualClock())
    while (b := r.poll(10)) is not None and b.values:
        pass
    assert not gate.reached(), "partition 2 has not held yet"
    other = PartitionedReader(src, [("2-of-3", None)], ManualClock())
    while (b := other.poll(10)) is not None and b.values:
        pass
    assert gate.reached()


# ---------------------------------------------------------------- errors from partitions()


def test_a_source_whose_partitions_raise_fails_naming_it():
    from engine.dataflow import graph as g
    from engine.dataflow.deployment import source_partitions
    from engine.dataflow.physical import plan_physical

    class Broken(Steps):
        def partitions(self, parallelism: int) -> list[str]:
            raise OSError("cannot list the topic")

    def plan(source: Source) -> Any:
        ops = (g.OperatorDef("src", g.SOURCE, source, 2),
               g.OperatorDef("out", g.MAP, lambda x: x, 2, (g.InputDef("src"),)))
        return plan_physical(g.JobGraph("j", 8, ops))

    with pytest.raises(UserFunctionError) as info:
        source_partitions(plan(Broken()))
    assert info.value.operator == "src" and info.value.phase == "open"
    assert "OSError: cannot list the topic" in info.value.cause

    class Twice(Steps):
        def partitions(self, parallelism: int) -> list[str]:
            return ["x", "x"]

    with pytest.raises(ConfigError, match="source 'src': partition id 'x' appears twice"):
        source_partitions(plan(Twice()))
    assert source_partitions(plan(TestingSource(range(3)))) == {"src": ("0-of-2", "1-of-2")}


def test_parquet_partition_names_are_the_file_names(parquet_paths):
    src = ParquetSource(parquet_paths["files"])
    assert all(os.path.exists(os.path.join(parquet_paths["files"], p))
               for p in src.partitions(1))


def test_columnar_partitions_come_out_as_one_column_batch():
    from engine.columnar.batches import ColumnBatch

    src = GeneratorSource(None, num_records=300, partitions=3, columnar=True)
    reader = PartitionedReader.for_task(src, 0, 1, ManualClock())
    batch = reader.poll(1000)
    assert batch is not None and type(batch.values) is ColumnBatch
    assert len(batch.values) == len(batch.timestamps) == 300
    rows = batch.values.rows()
    assert [r["seq"] for r in rows] == list(range(100)) * 3  # partition after partition
    assert reader.offsets() == {"0-of-3": 100, "1-of-3": 100, "2-of-3": 100}
    assert reader.poll(10) is None
