"""Time: the injectable clock every engine module reads (``clock``), and event time
(``event_time``): windows and window assigners, watermark strategies, and the watermark
tracker a task keeps over its inputs (holds and releases during a live rescale included).

May import: ``engine.errors``, ``engine.names``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.names import lazy_exports

if TYPE_CHECKING:
    from engine.time.clock import Clock, ManualClock, SystemClock, now_ms
    from engine.time.event_time import (
        MAX_WATERMARK,
        MIN_WATERMARK,
        WatermarkStrategy,
        WatermarkTracker,
        Window,
        WindowAssigner,
        bounded_out_of_orderness,
        sliding_event_time,
        sliding_processing_time,
        tumbling_event_time,
        tumbling_processing_time,
        window_start,
    )

# name -> its module, imported on first use: importing the package loads none of its
# modules, so it costs nothing and closes no import cycle; the imports above are the same
# names for type checkers and the layer test (tests/unit/test_public_api.py checks both agree)
_EXPORTS: dict[str, str] = {
    "Clock": "engine.time.clock",
    "ManualClock": "engine.time.clock",
    "SystemClock": "engine.time.clock",
    "now_ms": "engine.time.clock",
    "MAX_WATERMARK": "engine.time.event_time",
    "MIN_WATERMARK": "engine.time.event_time",
    "WatermarkStrategy": "engine.time.event_time",
    "WatermarkTracker": "engine.time.event_time",
    "Window": "engine.time.event_time",
    "WindowAssigner": "engine.time.event_time",
    "bounded_out_of_orderness": "engine.time.event_time",
    "sliding_event_time": "engine.time.event_time",
    "sliding_processing_time": "engine.time.event_time",
    "tumbling_event_time": "engine.time.event_time",
    "tumbling_processing_time": "engine.time.event_time",
    "window_start": "engine.time.event_time",
}

__all__ = [
    "bounded_out_of_orderness",
    "Clock",
    "ManualClock",
    "MAX_WATERMARK",
    "MIN_WATERMARK",
    "now_ms",
    "sliding_event_time",
    "sliding_processing_time",
    "SystemClock",
    "tumbling_event_time",
    "tumbling_processing_time",
    "WatermarkStrategy",
    "WatermarkTracker",
    "Window",
    "window_start",
    "WindowAssigner",
]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
