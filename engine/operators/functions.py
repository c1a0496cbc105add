"""User function types: ``KeyedProcessFunction`` with its contexts, and the built-in reduce."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from engine.state.keyed import (
    EVENT_TIME,
    KeyedStateBackend,
    ListState,
    MapState,
    ReducingState,
    ValueState,
)
from engine.time.event_time import MIN_WATERMARK


class RuntimeContext:
    """Given to ``KeyedProcessFunction.open``: declares state, tells where the function runs."""

    def __init__(self, backend: KeyedStateBackend, operator: str, task_index: int, parallelism: int) -> None:
        self._backend = backend
        self.operator = operator
        self.task_index = task_index
        self.parallelism = parallelism

    def value_state(self, name: str, default: Any = None) -> ValueState:
        return ValueState(self._backend, name, default)

    def list_state(self, name: str) -> ListState:
        return ListState(self._backend, name)

    def map_state(self, name: str) -> MapState:
        return MapState(self._backend, name)

    def reducing_state(self, name: str, reduce_fn: Callable[[Any, Any], Any]) -> ReducingState:
        return ReducingState(self._backend, name, reduce_fn)


class TimerService:
    """Timers of the current key, in processing time (ms since the epoch) or event time."""

    def __init__(self, backend: KeyedStateBackend, now_ms: Callable[[], int],
                 watermark: Callable[[], int] = lambda: MIN_WATERMARK) -> None:
        self._backend = backend
        self._now_ms = now_ms
        self._watermark = watermark

    def current_processing_time(self) -> int:
        return self._now_ms()

    def current_watermark(self) -> int:
        return self._watermark()

    def register_event_time_timer(self, time_ms: int) -> None:
        """Call ``on_timer(time_ms, ...)`` for the current key once the watermark reaches it."""
        self._backend.register_timer(time_ms, EVENT_TIME)

    def delete_event_time_timer(self, time_ms: int) -> None:
        self._backend.delete_timer(time_ms, EVENT_TIME)

    def register_processing_time_timer(self, time_ms: int) -> None:
        """Call ``on_timer(time_ms, ...)`` for the current key once processing time reaches it.

        One timer per (key, time): registering the same time twice fires once.
        """
        self._backend.register_timer(time_ms)

    def delete_processing_time_timer(self, time_ms: int) -> None:
        self._backend.delete_timer(time_ms)


class Context:
    """Given to ``process_element`` and ``on_timer``: the current key, the record's (or
    timer's) timestamp, the input ``port`` (0, or 1 for the second input of a two-input
    operator), the ``time_domain`` of a firing timer, and the timer service."""

    __slots__ = ("_backend", "timestamp", "timer_service", "port", "time_domain", "_late", "_out")

    def __init__(self, backend: KeyedStateBackend, timer_service: TimerService) -> None:
        self._backend = backend
        self.timer_service = timer_service
        self.timestamp = 0
        self.port = 0
        self.time_domain: str | None = None
        self._late: Callable[[Any, int], None] | None = None
        self._out: tuple[list[Any], list[int]] | None = None

    def emit(self, value: Any, timestamp: int | None = None) -> None:
        """Emit an output now with an explicit timestamp (default: the current one); the
        alternative to returning outputs, for outputs that carry another time."""
        if self._out is None:
            raise RuntimeError("emit() is only valid inside process_element or on_timer")
        self._out[0].append(value)
        self._out[1].append(self.timestamp if timestamp is None else timestamp)

    def output_late(self, value: Any) -> None:
        """Send a record that arrived too late to the operator's late-data output."""
        if self._late is not None:
            self._late(value, self.timestamp)

    @property
    def key(self) -> Any:
        return self._backend.current_key


class KeyedProcessFunction:
    """Per-key processing with keyed state and timers (Flink's KeyedProcessFunction).

    Declare state in ``open`` (``self.count = ctx.value_state("count", 0)``); state handles
    always act on the current key. ``process_element`` and ``on_timer`` return an iterable of
    outputs (``yield`` works) or None. Outputs inherit the timestamp of the input (of the
    timer, in ``on_timer``).
    """

    def open(self, ctx: RuntimeContext) -> None:  # noqa: B027 - optional hook
        """Declare state here."""

    def process_element(self, value: Any, ctx: Context) -> Iterable[Any] | None:
        raise NotImplementedError("a KeyedProcessFunction must implement process_element")

    def on_timer(self, timestamp: int, ctx: Context) -> Iterable[Any] | None:
        return None


class ReduceFunction(KeyedProcessFunction):
    """Emits the running reduced value of the key for every input (Flink's ``reduce``)."""

    STATE = "reduce"

    def __init__(self, fn: Callable[[Any, Any], Any]) -> None:
        self.fn = fn
