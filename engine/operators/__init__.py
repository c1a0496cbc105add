"""What runs on records: the user function interfaces (``functions``:
``KeyedProcessFunction``, ``Context``), the built-in operators (``builtin``: map, filter,
flat_map, reduce, process, sinks), windows (``windows``, ``window_aggregates``), the vectorised operators of the columnar path
(``vectorised``: ``Count``, ``Sum``, ``Mean``, ``map_batches``) and operator chaining
(``chain``).

May import: ``engine.errors``, ``engine.names``, ``engine.wire``, ``engine.time``,
``engine.dataflow``, ``engine.state``, ``engine.observability``, ``engine.columnar``,
``engine.io``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.names import lazy_exports

if TYPE_CHECKING:
    from engine.operators.functions import (
        Context,
        KeyedProcessFunction,
        ReduceFunction,
        RuntimeContext,
        TimerService,
    )
    from engine.operators.vectorised import Aggregation, Count, Max, Mean, Min, Sum
    from engine.operators.windows import AggregateFunction

# name -> its module, imported on first use: importing the package loads none of its
# modules, so it costs nothing and closes no import cycle; the imports above are the same
# names for type checkers and the layer test (tests/unit/test_public_api.py checks both agree)
_EXPORTS: dict[str, str] = {
    "Context": "engine.operators.functions",
    "KeyedProcessFunction": "engine.operators.functions",
    "ReduceFunction": "engine.operators.functions",
    "RuntimeContext": "engine.operators.functions",
    "TimerService": "engine.operators.functions",
    "Aggregation": "engine.operators.vectorised",
    "Count": "engine.operators.vectorised",
    "Max": "engine.operators.vectorised",
    "Mean": "engine.operators.vectorised",
    "Min": "engine.operators.vectorised",
    "Sum": "engine.operators.vectorised",
    "AggregateFunction": "engine.operators.windows",
}

__all__ = [
    "AggregateFunction",
    "Aggregation",
    "Context",
    "Count",
    "KeyedProcessFunction",
    "Max",
    "Mean",
    "Min",
    "ReduceFunction",
    "RuntimeContext",
    "Sum",
    "TimerService",
]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
