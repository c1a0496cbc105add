"""Keyed windows and window joins, built on keyed state and timers.

Panes live in keyed map state (``window -> pane``), so they migrate with their key group;
each window has a timer at its ``max_timestamp`` (event or processing time) that fires it.
A record whose windows have all passed ``max_timestamp + allowed_lateness`` is *late*: it
is counted and sent to the operator's late-data sink, never silently dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from engine.operators.functions import Context, KeyedProcessFunction, RuntimeContext
from engine.time.event_time import Window, WindowAssigner

_MISSING = object()
PANES = "__window_panes"


class AggregateFunction:
    """Incremental aggregation (Flink's AggregateFunction): accumulators must be msgpack
    values or declared types, since they migrate with their key group."""

    def create_accumulator(self) -> Any:
        raise NotImplementedError

    def add(self, value: Any, accumulator: Any) -> Any:
        raise NotImplementedError

    def get_result(self, accumulator: Any) -> Any:
        return accumulator


WindowResultFn = Callable[[Any, Window, Any], Iterable[Any]]


class WindowOperator(KeyedProcessFunction):
    """One keyed window operator. ``kind`` is ``reduce`` (``fn(a, b)``), ``aggregate``
    (``fn`` an AggregateFunction) or ``process`` (``fn(key, window, elements)`` returns the
    outputs). ``window_fn(key, window, result)``, when given, turns a reduce/aggregate result
    into outputs; without it the result itself is emitted. Outputs carry the window's
    ``max_timestamp``."""

    def __init__(self, assigner: WindowAssigner, kind: str, fn: Any,
                 window_fn: WindowResultFn | None = None, allowed_lateness_ms: int = 0) -> None:
        if kind not in ("reduce", "aggregate", "process"):
            raise ValueError(f"unknown window function kind {kind!r}")
        self.assigner = assigner
        self.kind = kind
        self.fn = fn
        self.window_fn = window_fn
        self.lateness = allowed_lateness_ms

    def open(self, ctx: RuntimeContext) -> None:
        self.panes = ctx.map_state(PANES)

    # -- helpers
    def _time(self, ctx: Context) -> int:
        if self.assigner.event_time:
            return ctx.timestamp
        return ctx.timer_service.current_processing_time()

    def _register(self, ctx: Context, t: int) -> None:
        _register_fire(self.assigner, ctx, t)

    def _add(self, pane: Any, value: Any) -> Any:
        if self.kind == "reduce":
            return value if pane is _MISSING else self.fn(pane, value)
        if self.kind == "aggregate":
            acc = self.fn.create_accumulator() if pane is _MISSING else pane
            return self.fn.add(value, acc)
        if pane is _MISSING:
            return [value]
        pane.append(value)
        return pane

    def _results(self, key: Any, w: Window, pane: Any) -> Iterable[Any]:
        if self.kind == "process":
            return self.fn(key, w, pane) or ()
        result = self.fn.get_result(pane) if self.kind == "aggregate" else pane
        if self.window_fn is not None:
            return self.window_fn(key, w, result) or ()
        return (result,)

    # -- processing
    def process_element(self, value: Any, ctx: Context) -> Iterable[Any]:
        t = self._time(ctx)
        event_time = self.assigner.event_time
        wm = ctx.timer_service.current_watermark()
        accepted = False
        for w in self.assigner.assign(t):
            if event_time and w.max_timestamp + self.lateness <= wm:
                continue  # this window is gone
            accepted = True
            k = (w.start, w.end)
            entry = self.panes.get(k)
            pane, fired = (_MISSING, False) if entry is None else entry
            pane = self._add(pane, value)
            if event_time and (fired or w.max_timestamp <= wm):
                # late but within the allowed lateness: (re-)fire at once
                for r in self._results(ctx.key, w, pane):
                    ctx.emit(r, w.max_timestamp)
                fired = True
            else:
                self._register(ctx, w.max_timestamp)
            self.panes.put(k, (pane, fired))
            if self.lateness and event_time:
                self._register(ctx, w.max_timestamp + self.lateness)
        if not accepted:
            ctx.output_late(value)
        return ()

    def on_timer(self, timestamp: int, ctx: Context) -> Iterable[Any]:
        timestamp = _fired_window_end(self.assigner, timestamp)
        out: list[Any] = []
        size = self.assigner.size_ms
        # the window whose max_timestamp this is: fire it
        w = Window(timestamp + 1 - size, timestamp + 1)
        entry = self.panes.get((w.start, w.end))
        if entry is not None and not entry[1]:
            for r in self._results(ctx.key, w, entry[0]):
                ctx.emit(r, w.max_timestamp)
            if self.lateness and self.assigner.event_time:
                self.panes.put((w.start, w.end), (entry[0], True))
            else:
                self.panes.remove((w.start, w.end))
        # the window whose cleanup time this is: drop it
        if self.lateness and self.assigner.event_time:
            c = Window(timestamp - self.lateness + 1 - size, timestamp - self.lateness + 1)
            centry = self.panes.get((c.start, c.end))
            if centry is not None and centry[1]:
                self.panes.remove((c.start, c.end))
        return out


class WindowJoin(KeyedProcessFunction):
    """Joins two keyed inputs (ports 0 and 1) per window: for every window, every pair of a
    left and a right record with the same key gives ``join_fn(left, right)`` when the window
    fires (left records in arrival order, right records in arrival order within each). A
    record arriving within the allowed lateness after the window fired is joined at once
    with the other side's records. Outputs carry the window's ``max_timestamp``."""

    def __init__(self, assigner: WindowAssigner, join_fn: Callable[[Any, Any], Any],
                 allowed_lateness_ms: int = 0) -> None:
        self.assigner = assigner
        self.join_fn = join_fn
        self.lateness = allowed_lateness_ms

    def open(self, ctx: RuntimeContext) -> None:
        self.panes = ctx.map_state(PANES)

    def _register(self, ctx: Context, t: int) -> None:
        _register_fire(self.assigner, ctx, t)

    def process_element(self, value: Any, ctx: Context) -> Iterable[Any]:
        event_time = self.assigner.event_time
        t = ctx.timestamp if event_time else ctx.timer_service.current_processing_time()
        wm = ctx.timer_service.current_watermark()
        accepted = False
        for w in self.assigner.assign(t):
            if event_time and w.max_timestamp + self.lateness <= wm:
                continue
            accepted = True
            k = (w.start, w.end)
            left, right, fired = self.panes.get(k) or ([], [], False)
            (left if ctx.port == 0 else right).append(value)
            if event_time and (fired or w.max_timestamp <= wm):
                pairs = ([(value, r) for r in right] if ctx.port == 0
                         else [(lv, value) for lv in left])
                if not fired:
                    pairs = [(lv, r) for lv in left for r in right]
                for a, b in pairs:
                    ctx.emit(self.join_fn(a, b), w.max_timestamp)
                fired = True
            else:
                self._register(ctx, w.max_timestamp)
            self.panes.put(k, (left, right, fired))
            if self.lateness and event_time:
                self._register(ctx, w.max_timestamp + self.lateness)
        if not accepted:
            ctx.output_late(value)
        return ()

    def on_timer(self, timestamp: int, ctx: Context) -> Iterable[Any]:
        timestamp = _fired_window_end(self.assigner, timestamp)
        size = self.assigner.size_ms
        out: list[Any] = []
        k = (timestamp + 1 - size, timestamp + 1)
        entry = self.panes.get(k)
        if entry is not None and not entry[2]:
            left, right, _ = entry
            for a, b in [(a, b) for a in left for b in right]:
                ctx.emit(self.join_fn(a, b), timestamp)
            if self.lateness and self.assigner.event_time:
                self.panes.put(k, (left, right, True))
            else:
                self.panes.remove(k)
        if self.lateness and self.assigner.event_time:
            c = (timestamp - self.lateness + 1 - size, timestamp - self.lateness + 1)
            centry = self.panes.get(c)
            if centry is not None and centry[2]:
                self.panes.remove(c)
        return out


def _register_fire(assigner: WindowAssigner, ctx: Context, max_timestamp: int) -> None:
    """The timer that fires the window ending at ``max_timestamp``. A processing-time window
    fires one millisecond after it (when no record can be assigned to it any more: a record
    read in its last millisecond still belongs to it), so it fires once, with every record
    it got; event-time windows fire when the watermark reaches ``max_timestamp``."""
    if assigner.event_time:
        ctx.timer_service.register_event_time_timer(max_timestamp)
    else:
        ctx.timer_service.register_processing_time_timer(max_timestamp + 1)


def _fired_window_end(assigner: WindowAssigner, timestamp: int) -> int:
    """The ``max_timestamp`` of the window a timer at ``timestamp`` fires."""
    return timestamp if assigner.event_time else timestamp - 1
