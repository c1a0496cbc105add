"""The ``"reflow"`` Python Data Source (``pyspark.sql.datasource``, Spark 4.x).

Register it once per session: ``spark.dataSource.register(ReflowDataSource)``
(``engine.spark.local_spark`` and ``SparkLink`` do).

**Into reflow** (stream writer, runs on the executors, partitions in parallel)::

    df.writeStream.format("reflow").options(**source.writer_options()) \\
        .option("checkpointLocation", ckpt).start()

Options: ``bridge`` (the ``SparkSource`` bridge actor name), ``address`` (the Ray cluster
the executors connect to, ``ray.init(address=...)`` once per Python worker),
``rayAuthMode`` (the cluster's ``RAY_AUTH_MODE``; the token is found by Ray on the
executor's machine, never passed as an option), ``stream``
(optional dedupe identity; default the Spark query id, which survives restarts from the
checkpoint). Each task pushes its partition as Arrow chunks and returns once reflow took
them, so a micro-batch commits only after reflow has it; the batch id and partition make a
replayed batch idempotent. Requires the ``engine`` package on the executors.

**Out of reflow** (stream reader over an ``OutputLogSink`` directory)::

    spark.readStream.format("reflow").load(log_directory)

Offsets are ``{writer: segments}`` (``engine.spark.outlog``); ``partitions(start, end)``
lists the segments in between, ``read`` returns their Arrow record batches, ``commit``
records the offset in ``_committed-<readerName>.json``. Options: ``maxSegmentsPerTrigger``
(admission control), ``segmentsPerPartition`` (default 8), ``readerName``. Supports
``trigger(availableNow=True)``. A failed reflow job (``_FAILED``) fails the query with the
job's error. Spark's checkpoint makes the query resume from its committed offset.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)

FORMAT = "reflow"


class ReflowDataSource(DataSource):
    """``format("reflow")``: a stream writer into a ``SparkSource`` bridge and a stream
    reader of an ``OutputLogSink`` directory (module docstring)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        path = self.options.get("path")
        if not path:
            raise ValueError(
                "format('reflow') needs the output log directory to read: "
                "spark.readStream.format('reflow').load(DIRECTORY)")
        from engine.spark.outlog import read_log_schema

        return read_log_schema(path).ddl()

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamArrowWriter:
        return BridgeStreamWriter(dict(self.options))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return OutputLogStreamReader(dict(self.options), schema)


# ====================================================================== writer


@dataclass
class BridgeCommit(WriterCommitMessage):
    stream: str
    batch_id: int
    partition: int
    rows: int
    dead_letters: int
    duplicate_rows: int


def _opt(options: dict[str, Any], key: str, default: Any = None) -> Any:
    for k, v in options.items():
        if k.lower() == key.lower():
            return v
    return default


class BridgeStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: dict[str, Any]) -> None:
        self.bridge = _opt(options, "bridge")
        if not self.bridge:
            raise ValueError("writeStream.format('reflow') needs option 'bridge' (see "
                             "SparkSource.writer_options())")
        self.address = _opt(options, "address")
        self.auth_mode = _opt(options, "rayAuthMode")
        self.stream = _opt(options, "stream")

    def write(self, iterator: Iterator[Any]) -> BridgeCommit:
        from pyspark import TaskContext

        from engine.errors import BridgeError
        from engine.spark.bridge import BridgeClient

        tc = TaskContext.get()
        batch = tc.getLocalProperty("streaming.sql.batchId") if tc is not None else None
        if tc is None or batch is None:
            raise BridgeError("format('reflow') writes streaming queries only "
                              "(df.writeStream...); no micro-batch id is set")
        # Spark sets the query id wherever it sets the micro-batch id
        stream = self.stream or tc.getLocalProperty("sql.streaming.queryId") or ""
        client = BridgeClient.cached(self.bridge, self.address, self.auth_mode)
        counts = client.push(stream, int(batch), tc.partitionId(), iterator)
        return BridgeCommit(stream, int(batch), tc.partitionId(), counts["rows"],
                            counts["dead_letters"], counts["duplicate_rows"])

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Every task returned only after reflow took its rows; nothing is left to publish.
        return None

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Rows reflow already took stay taken; the replay of this batch is deduplicated.
        return None


# ====================================================================== reader


@dataclass
class SegmentPartition(InputPartition):
    paths: list[str]


class OutputLogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, Any], schema: Any) -> None:
        from engine.spark.schema import parse_schema

        self.path = _opt(options, "path")
        if not self.path:
            raise ValueError("readStream.format('reflow') needs the output log directory: "
                             ".load(DIRECTORY)")
        self.reader_name = str(_opt(options, "readerName", "default"))
        self.max_segments = int(_opt(options, "maxSegmentsPerTrigger", 0))
        self.per_partition = max(1, int(_opt(options, "segmentsPerPartition", 8)))
        self.ddl = parse_schema(schema).ddl()
        self._target: dict[str, int] | None = None

    # offsets: output-log writer -> segments read (Spark keeps them as JSON)
    def initialOffset(self) -> dict[str, int]:
        return {}

    def _available(self, start: dict[str, int]) -> dict[str, int]:
        from engine.spark.outlog import failure, latest_offset

        err = failure(self.path)
        if err is not None:
            raise RuntimeError(f"the reflow job writing {self.path} failed: {err}")
        latest = latest_offset(self.path)
        for w, n in start.items():
            latest[w] = max(latest.get(w, 0), int(n))
        if self._target is not None:
            latest = {w: min(n, max(self._target.get(w, 0), int(start.get(w, 0))))
                      for w, n in latest.items()}
            latest = {w: n for w, n in latest.items() if n > 0}
        return latest

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        latest = self._available(start)
        budget = limit.max_files if isinstance(limit, ReadMaxFiles) else None
        if budget is None:
            return latest
        out = dict(start)
        for w in sorted(latest):
            have = int(start.get(w, 0))
            take = min(latest[w] - have, budget)
            if take > 0:
                out[w] = have + take
                budget -= take
            if budget <= 0:
                break
        return out

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxFiles(self.max_segments) if self.max_segments > 0 else ReadAllAvailable()

    def reportLatestOffset(self) -> dict[str, int] | None:
        from engine.spark.outlog import latest_offset

        return latest_offset(self.path)

    def prepareForTriggerAvailableNow(self) -> None:
        from engine.spark.outlog import latest_offset

        self._target = latest_offset(self.path)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        from engine.spark.outlog import segments_between

        parts: list[InputPartition] = []
        for _, paths in segments_between(self.path, start, end):
            for i in range(0, len(paths), self.per_partition):
                parts.append(SegmentPartition(paths[i:i + self.per_partition]))
        return parts

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import pyarrow.parquet as pq

        from engine.spark.schema import parse_schema

        schema = parse_schema(self.ddl).arrow
        assert isinstance(partition, SegmentPartition)
        for path in partition.paths:
            table = pq.read_table(path, columns=schema.names)
            yield from table.cast(schema).to_batches()

    def commit(self, end: dict[str, int]) -> None:
        from engine.spark.outlog import record_commit

        record_commit(self.path, self.reader_name, end)
