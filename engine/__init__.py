"""reflow's public API: build a ``StreamJob``, ``run()`` it on Ray, rescale it live.

Everything a job script imports is here, ``from engine import ...``:

* the job: ``StreamJob``, ``Stream``, ``KeyedStream``, ``WindowedStream``, ``JobConfig``
  (``TLS``, ``DeliveryGuarantee``, ``StateBackend``), and what running it gives back: ``JobHandle``
  (``attach(job)`` gives one on a running job from another process),
  ``JobStatus``, ``JobMetrics``, ``RescaleReport``, ``LogicChangeReport``, the records of
  past rescales and decisions, ``Planning`` for a rescale's order;
* user functions and their state: ``KeyedProcessFunction``, ``Context``,
  ``RuntimeContext``, ``ReduceFunction``, ``AggregateFunction``, ``ValueState``,
  ``ListState``, ``MapState``, ``ReducingState``;
* sources and sinks: ``GeneratorSource``, ``ParquetSource``, ``ColumnarSource``,
  ``ParquetSink``, ``LatencySink``, the ``Source``/``Sink`` bases to write your own, and
  for tests ``TestingSource``, ``TestingSink``, ``SourceGate``;
* event time: ``WatermarkStrategy``, ``bounded_out_of_orderness``, the window assigners
  (``tumbling_event_time``, ``sliding_event_time`` and their processing-time twins);
* the columnar path: ``ColumnBatch`` and the vectorised aggregates ``Count``, ``Sum``,
  ``Min``, ``Max``, ``Mean``;
* every error a user can meet, all ``ReflowError`` subclasses (``engine.errors`` has the
  tree).

The subpackages list their own public names the same way (``engine.io``, ``engine.time``,
``engine.state``, ``engine.operators``, ``engine.columnar``, ``engine.spark``,
``engine.checkpoints``, ``engine.dataflow``, ``engine.wire``, ``engine.observability``);
the controllers are in ``controllers``. ``import engine`` loads neither Ray, Arrow nor
Prometheus: the names that need them load on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.api import KeyedStream, Stream, StreamJob, WindowedStream
from engine.dataflow.config import JobConfig
from engine.errors import (
    AssignmentError,
    BalanceInfeasible,
    BridgeError,
    ChangeLogicRefused,
    CheckpointFailed,
    CodecError,
    ColumnarError,
    ConfigError,
    ControllerError,
    ControlPlaneError,
    ControlTimeout,
    FailurePhase,
    GateError,
    GateTimeout,
    InternalError,
    InvalidKeyError,
    JobDefinitionError,
    JobFailedError,
    JobMasterFailedOver,
    JobMasterLost,
    JobNotFound,
    JobNotRunningError,
    JobRecordUnreadable,
    OutputCodecError,
    PrometheusError,
    RayUnavailable,
    ReflowError,
    RescaleRefused,
    RescaleTimeout,
    RestoreError,
    SchemaError,
    SinkCommitError,
    SparkQueryFailed,
    StaleJobMaster,
    StateBackendError,
    UnhashableKeyError,
    UserFunctionError,
    WaitTimeout,
)
from engine.io.sinks import LatencySink, ParquetSink, Sink, SinkWriter
from engine.io.sources import (
    ColumnarSource,
    GeneratorSource,
    ParquetSource,
    Source,
    SourceBatch,
    SourceReader,
)
from engine.names import lazy_exports
from engine.operators.functions import (
    Context,
    KeyedProcessFunction,
    ReduceFunction,
    RuntimeContext,
    TimerService,
)
from engine.operators.windows import AggregateFunction
from engine.state.keyed import ListState, MapState, ReducingState, ValueState
from engine.time.event_time import (
    WatermarkStrategy,
    Window,
    WindowAssigner,
    bounded_out_of_orderness,
    sliding_event_time,
    sliding_processing_time,
    tumbling_event_time,
    tumbling_processing_time,
)

if TYPE_CHECKING:
    from engine.columnar.batches import ColumnBatch
    from engine.control.reconfiguration import DecisionRecord, LogicChangeReport, RescaleRecord
    from engine.dataflow.guarantees import DeliveryGuarantee
    from engine.io.testing import SourceGate, TestingSink, TestingSource
    from engine.names import StateBackend
    from engine.observability.metrics import JobMetrics, TaskMetrics
    from engine.operators.vectorised import Aggregation, Count, Max, Mean, Min, Sum
    from engine.runtime.handle import JobHandle, attach
    from engine.wire.codec import register_codec, register_dataclass
    from engine.wire.messages import JobStatus
    from engine.wire.transport import TLS
    from migration.planning import Planning
    from migration.report import RescaleReport

# the rest, imported on first use (name -> its module): a task actor's worker imports
# engine first, and must not pay for the driver's handle (Ray, the JobMaster), Prometheus,
# the testing helpers or the columnar path; the imports above are the same names for type
# checkers and the layer test (tests/unit/test_public_api.py checks both agree)
_EXPORTS: dict[str, str] = {
    "ColumnBatch": "engine.columnar.batches",
    "DecisionRecord": "engine.control.reconfiguration",
    "LogicChangeReport": "engine.control.reconfiguration",
    "RescaleRecord": "engine.control.reconfiguration",
    "DeliveryGuarantee": "engine.dataflow.guarantees",
    "SourceGate": "engine.io.testing",
    "TestingSink": "engine.io.testing",
    "TestingSource": "engine.io.testing",
    "JobMetrics": "engine.observability.metrics",
    "TaskMetrics": "engine.observability.metrics",
    "Aggregation": "engine.operators.vectorised",
    "Count": "engine.operators.vectorised",
    "Max": "engine.operators.vectorised",
    "Mean": "engine.operators.vectorised",
    "Min": "engine.operators.vectorised",
    "Sum": "engine.operators.vectorised",
    "JobHandle": "engine.runtime.handle",
    "attach": "engine.runtime.handle",
    "register_codec": "engine.wire.codec",
    "register_dataclass": "engine.wire.codec",
    "JobStatus": "engine.wire.messages",
    "StateBackend": "engine.names",
    "TLS": "engine.wire.transport",
    "Planning": "migration.planning",
    "RescaleReport": "migration.report",
}

__all__ = [
    "AggregateFunction",
    "Aggregation",
    "AssignmentError",
    "attach",
    "BalanceInfeasible",
    "bounded_out_of_orderness",
    "BridgeError",
    "ChangeLogicRefused",
    "CheckpointFailed",
    "CodecError",
    "ColumnarError",
    "ColumnarSource",
    "ColumnBatch",
    "ConfigError",
    "Context",
    "ControllerError",
    "ControlPlaneError",
    "ControlTimeout",
    "Count",
    "DecisionRecord",
    "DeliveryGuarantee",
    "FailurePhase",
    "GateError",
    "GateTimeout",
    "GeneratorSource",
    "InternalError",
    "InvalidKeyError",
    "JobConfig",
    "JobDefinitionError",
    "JobFailedError",
    "JobHandle",
    "JobMasterFailedOver",
    "JobMasterLost",
    "JobMetrics",
    "JobNotFound",
    "JobNotRunningError",
    "JobRecordUnreadable",
    "JobStatus",
    "KeyedProcessFunction",
    "KeyedStream",
    "LatencySink",
    "ListState",
    "LogicChangeReport",
    "MapState",
    "Max",
    "Mean",
    "Min",
    "OutputCodecError",
    "ParquetSink",
    "ParquetSource",
    "Planning",
    "PrometheusError",
    "RayUnavailable",
    "ReduceFunction",
    "ReducingState",
    "ReflowError",
    "register_codec",
    "register_dataclass",
    "RescaleRecord",
    "RescaleRefused",
    "RescaleReport",
    "RescaleTimeout",
    "RestoreError",
    "RuntimeContext",
    "SchemaError",
    "Sink",
    "SinkCommitError",
    "SinkWriter",
    "sliding_event_time",
    "sliding_processing_time",
    "Source",
    "SourceBatch",
    "SourceGate",
    "SourceReader",
    "SparkQueryFailed",
    "StaleJobMaster",
    "StateBackendError",
    "Stream",
    "StreamJob",
    "Sum",
    "TaskMetrics",
    "TestingSink",
    "TestingSource",
    "TimerService",
    "StateBackend",
    "TLS",
    "tumbling_event_time",
    "tumbling_processing_time",
    "UnhashableKeyError",
    "UserFunctionError",
    "ValueState",
    "WaitTimeout",
    "WatermarkStrategy",
    "Window",
    "WindowAssigner",
    "WindowedStream",
]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
