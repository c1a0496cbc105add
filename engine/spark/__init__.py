"""Spark Structured Streaming bridges (how to use them: docs/guide/spark.md).

Spark -> reflow: ``SparkSource`` (a reflow source fed through a bridge actor), fed by
``SparkLink.feed`` with ``foreachBatch`` or the ``"reflow"`` Data Source stream writer.
reflow -> Spark: ``OutputLogSink`` (a durable log of Parquet segments with offsets), read by
``spark.readStream.format("reflow").load(dir)`` (``SparkLink.read_stream``).

``ReflowDataSource`` and ``local_spark`` import pyspark; the rest does not (Ray task actors
import this package).

May import: ``engine.errors``, ``engine.names``, ``engine.wire``, ``engine.time``,
``engine.columnar``, ``engine.io``; the connectors that talk to the bridge actor
(``bridge`` and the modules importing it) belong to the runtime layer and may import
``engine.runtime``.
"""

from typing import Any

from engine.errors import BridgeError, SchemaError, SparkQueryFailed
from engine.spark.bridge import BridgeClient, SparkSource
from engine.spark.link import SparkLink, local_spark, register
from engine.spark.outlog import OutputLogSink
from engine.spark.schema import ColumnSchema, parse_schema

__all__ = [
    "BridgeClient",
    "BridgeError",
    "ColumnSchema",
    "OutputLogSink",
    "ReflowDataSource",
    "SchemaError",
    "SparkLink",
    "SparkQueryFailed",
    "SparkSource",
    "local_spark",
    "parse_schema",
    "register",
]


def __getattr__(name: str) -> Any:
    if name == "ReflowDataSource":
        from engine.spark.datasource import ReflowDataSource

        return ReflowDataSource
    raise AttributeError(f"module 'engine.spark' has no attribute {name!r}")
