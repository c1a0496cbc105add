"""reflow's public API: build a ``StreamJob``, ``run()`` it on Ray, rescale it live."""

from engine.api import KeyedStream, Stream, StreamJob
from engine.config import JobConfig
from engine.errors import (
    CodecError,
    ColumnarError,
    ConfigError,
    ControlPlaneError,
    ControlTimeout,
    InternalError,
    InvalidKeyError,
    JobDefinitionError,
    JobFailedError,
    JobMasterLost,
    OutputCodecError,
    ReflowError,
    RescaleRefused,
    RescaleTimeout,
    SinkCommitError,
    UserFunctionError,
    WaitTimeout,
)
from engine.functions import Context, KeyedProcessFunction, RuntimeContext
from engine.state import ListState, MapState, ReducingState, ValueState

__all__ = [
    "CodecError",
    "ColumnarError",
    "ConfigError",
    "ControlPlaneError",
    "ControlTimeout",
    "InternalError",
    "InvalidKeyError",
    "JobMasterLost",
    "OutputCodecError",
    "RescaleTimeout",
    "SinkCommitError",
    "WaitTimeout",
    "Context",
    "JobConfig",
    "JobDefinitionError",
    "JobFailedError",
    "KeyedProcessFunction",
    "KeyedStream",
    "ListState",
    "MapState",
    "ReducingState",
    "ReflowError",
    "RescaleRefused",
    "RuntimeContext",
    "Stream",
    "StreamJob",
    "UserFunctionError",
    "ValueState",
]
