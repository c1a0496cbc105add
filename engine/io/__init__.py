"""Sources and sinks: partitioned sources with resume positions (``sources``, with
``ColumnarSource``: rows as column batches), sinks and their delivery guarantees
(``sinks``), and the sources and sinks tests use (``testing``: ``TestingSource`` with its
gates, ``TestingSink``).

May import: ``engine.errors``, ``engine.names``, ``engine.wire``, ``engine.time``,
``engine.dataflow``, ``engine.observability``, ``engine.columnar``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.names import lazy_exports

if TYPE_CHECKING:
    from engine.errors import GateError, GateTimeout
    from engine.io.sinks import LatencySink, ParquetSink, PendingFiles, Sink, SinkWriter
    from engine.io.sources import (
        ColumnarSource,
        GeneratorSource,
        ParquetSource,
        PartitionedReader,
        Source,
        SourceBatch,
        SourceReader,
        indexed_partitions,
        parse_indexed,
    )
    from engine.io.testing import SourceGate, TestingSink, TestingSource, per_key

# name -> its module, imported on first use: importing the package loads none of its
# modules, so it costs nothing and closes no import cycle; the imports above are the same
# names for type checkers and the layer test (tests/unit/test_public_api.py checks both agree)
_EXPORTS: dict[str, str] = {
    "GateError": "engine.errors",
    "GateTimeout": "engine.errors",
    "LatencySink": "engine.io.sinks",
    "ParquetSink": "engine.io.sinks",
    "PendingFiles": "engine.io.sinks",
    "Sink": "engine.io.sinks",
    "SinkWriter": "engine.io.sinks",
    "ColumnarSource": "engine.io.sources",
    "GeneratorSource": "engine.io.sources",
    "ParquetSource": "engine.io.sources",
    "PartitionedReader": "engine.io.sources",
    "Source": "engine.io.sources",
    "SourceBatch": "engine.io.sources",
    "SourceReader": "engine.io.sources",
    "indexed_partitions": "engine.io.sources",
    "parse_indexed": "engine.io.sources",
    "SourceGate": "engine.io.testing",
    "TestingSink": "engine.io.testing",
    "TestingSource": "engine.io.testing",
    "per_key": "engine.io.testing",
}

__all__ = [
    "ColumnarSource",
    "GateError",
    "GateTimeout",
    "GeneratorSource",
    "indexed_partitions",
    "LatencySink",
    "ParquetSink",
    "ParquetSource",
    "parse_indexed",
    "PartitionedReader",
    "PendingFiles",
    "per_key",
    "Sink",
    "SinkWriter",
    "Source",
    "SourceBatch",
    "SourceGate",
    "SourceReader",
    "TestingSink",
    "TestingSource",
]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
