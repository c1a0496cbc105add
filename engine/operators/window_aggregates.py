"""Vectorised event-time window aggregates of the columnar data path.

Why: ``keyed.window(tumbling_event_time(...)).aggregate(Count(), Sum("v"))`` on a columnar
stream assigns a batch's records to windows and folds them per key and window with a few
numpy calls, and reads and writes keyed state once per distinct (key, window) of the batch,
instead of a Python call per record and window as the per-record window operator
(``engine.operators.windows.WindowOperator``) makes.

Meaning: exactly that of the per-record window operator with an ``AggregateFunction``
computing the same aggregations (``engine.operators.vectorised``'s Count, Sum, Min, Max, Mean):

* the same window assignment (``WindowAssigner.assign``: tumbling or sliding, with offset);
* the same lateness rule: a record is dropped from every window whose ``max_timestamp +
  allowed_lateness`` is at or below the watermark; a record with no window left is late
  (counted, and written to the ``late_sink`` as its dict row); a record arriving in a
  window that has fired, or whose ``max_timestamp`` the watermark has passed, within the
  allowed lateness, re-fires that (key, window) at once with its updated result;
* a window fires when the watermark reaches its ``max_timestamp``; its state is dropped
  then, or ``allowed_lateness`` later.

Output (the documented columnar form): one row per (key, window) firing, as a column
batch with columns ``<key column>`` (or ``key``), ``window_start``, ``window_end`` and one
per aggregation (``count()``, ``sum(v)``, ...), timestamped with the window's
``max_timestamp``. Per key, rows come in the order the per-record operator emits them.

State (keyed state of the key-group backend, so every protocol migrates it and checkpoints
include it): per key group and window, one table per aggregation state table
(``engine.operators.vectorised.state_tables``) named ``win/<start>/open/<table>`` while the window is
pending and ``win/<start>/fired/<table>`` after it fired (kept for the allowed lateness);
key -> accumulator. Timers are per key group, not per key: ``(max_timestamp, None,
EVENT_TIME)`` fires every key of the group's window at once (and the cleanup timer
``max_timestamp + allowed_lateness``).

Guarantees: per key, outputs and final state do not depend on how records were cut into
batches (sums of floats are added in record order); processing-time windows are refused
at job definition (use the per-record ``aggregate(AggregateFunction)``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine.columnar.batches import ColumnBatch, group_runs
from engine.dataflow import graph as g
from engine.errors import ColumnarError, UserFunctionError
from engine.io.sinks import SinkWriter
from engine.names import NameEnum
from engine.operators.builtin import Batch, ErrorPolicy, KeyedRunner, describe
from engine.operators.vectorised import (
    Aggregation,
    ColumnAggregate,
    factorize,
    fold,
    numeric_columns,
    state_tables,
)
from engine.state.keyed import EVENT_TIME, PROCESSING_TIME, KeyedStateBackend, Table
from engine.time.clock import Clock
from engine.time.event_time import WindowAssigner

WINDOW_STATE = "win"  # the prefix of a window aggregate's state tables
WINDOW_START, WINDOW_END = "window_start", "window_end"


class OpenOrFired(NameEnum):
    """The two phases of a window's state tables (see the module doc)."""

    OPEN = "open"
    FIRED = "fired"


class ColumnWindowAggregate(ColumnAggregate):
    """The function of a vectorised window aggregate: the assigner, the aggregations, the
    output key column and the allowed lateness. Run by ``WindowAggregateRunner``."""

    def __init__(self, assigner: WindowAssigner, aggregations: tuple[Aggregation, ...],
                 key_name: str, allowed_lateness_ms: int = 0) -> None:
        if not assigner.event_time:
            raise ColumnarError("vectorised window aggregates run on event-time windows; for "
                                "processing-time windows use aggregate(AggregateFunction)")
        super().__init__(aggregations, key_name)
        names = [key_name, WINDOW_START, WINDOW_END, *(a.name for a in aggregations)]
        if len(set(names)) != len(names):
            raise ColumnarError(f"window aggregate output columns must differ: {names}; "
                                "give the aggregation an alias_name")
        self.assigner = assigner
        self.lateness = int(allowed_lateness_ms)
        self.tables = [t for a in aggregations for t in state_tables(a)]

    def table(self, start: int, phase: OpenOrFired, name: str) -> str:
        """The state table ``name`` of the window starting at ``start`` in ``phase``."""
        return f"{WINDOW_STATE}/{start}/{phase}/{name}"


class WindowAggregateRunner(KeyedRunner):
    """Runs a vectorised window aggregate a batch at a time (see the module doc)."""

    def __init__(self, op: g.OperatorDef, policy: ErrorPolicy, backend: KeyedStateBackend,
                 task_index: int, clock: Clock, watermark: Callable[[], int],
                 late_writer: SinkWriter | None = None) -> None:
        super().__init__(op, policy, backend, task_index, clock, watermark, late_writer)
        self.spec: ColumnWindowAggregate = op.fn
        self.task_index = task_index
        self.watermark = watermark

    # ------------------------------------------------------------ records
    def process(self, values: Any, timestamps: Any, keys: Any, kgs: Any,
                port: int = 0) -> Batch:
        try:
            return self._assign(values, timestamps, keys, kgs)
        except ColumnarError as exc:
            first = values.rows()[0] if type(values) is ColumnBatch else values[0]
            raise UserFunctionError(self.op.name, self.task_index, describe(first),
                                    str(exc)) from exc

    def _windows(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every (record, window start) of the batch, per record oldest window first."""
        a = self.spec.assigner
        per = -(-a.size_ms // a.slide_ms)
        latest = ts - np.mod(ts - a.offset_ms, a.slide_ms)
        back = np.arange(per - 1, -1, -1, dtype=np.int64) * a.slide_ms
        starts = (latest[:, None] - back[None, :]).ravel()
        rec = np.repeat(np.arange(ts.size), per)
        keep = starts > ts[rec] - a.size_ms
        return rec[keep], starts[keep]

    def _late(self, values: Any, ts: np.ndarray, late: np.ndarray) -> None:
        idx = np.flatnonzero(late)
        self.late_records += int(idx.size)
        if self.late_writer is not None:
            rows = (values.take(idx).rows() if type(values) is ColumnBatch
                    else [values[i] for i in idx.tolist()])
            self.late_writer.write(rows, ts[idx].tolist())

    def _assign(self, values: Any, timestamps: Any, keys: Any, kgs: Any) -> Batch:
        n = len(values)
        if not n:
            return [], []
        spec, size = self.spec, self.spec.assigner.size_ms
        ts = np.asarray(timestamps, dtype=np.int64)
        wm = self.watermark()
        rec, starts = self._windows(ts)
        alive = starts + (size - 1 + spec.lateness) > wm
        late = np.bincount(rec[alive], minlength=n) == 0
        if late.any():
            self._late(values, ts, late)
        rec, starts = rec[alive], starts[alive]
        if not rec.size:
            return [], []
        cols = numeric_columns(values, [a.on for a in spec.aggregations if a.on])
        codes, uniques = factorize(keys)
        kg_of_code = np.empty(len(uniques), dtype=np.int64)
        kg_of_code[codes] = np.asarray(kgs, dtype=np.int64)
        # groups: distinct (key, window) pairs of the entries (record, window)
        window_starts, window_of = np.unique(starts, return_inverse=True)
        pair = codes[rec] * window_starts.size + window_of
        group_pairs, gid = np.unique(pair, return_inverse=True)
        groups = group_pairs.size
        g_code = group_pairs // window_starts.size
        g_start = window_starts[group_pairs % window_starts.size].tolist()
        g_key = [uniques[c] for c in g_code.tolist()]
        g_kg = kg_of_code[g_code].tolist()
        source, fired = self._lookup(g_key, g_start, g_kg, wm)
        order, sc, sizes, run_starts, pos = group_runs(gid, groups)
        emit = fired[gid]  # entries of windows that fire at once: their running values
        out_cols: list[np.ndarray] = []
        finals: dict[str, list[Any]] = {}
        for agg in spec.aggregations:
            xs = None if agg.on is None else cols[agg.on][rec[order]]
            names = state_tables(agg)
            bases = [self._bases(source, name, g_key, 0 if i or xs is None or
                                 agg.kind in ("sum", "mean") else xs[run_starts].tolist())
                     for i, name in enumerate(names)]
            running, fins = fold(agg.kind, xs, sc, pos, sizes, run_starts, bases)
            for name, fin in zip(names, fins, strict=True):
                finals[name] = fin.tolist()
            if emit.any():
                out = np.empty(rec.size, dtype=running.dtype)
                out[order] = running
                out_cols.append(out[emit])
        self._store(g_key, g_start, g_kg, source, fired, finals)
        if not emit.any():
            return [], []
        e_rec, e_start = rec[emit], starts[emit]
        key_col = [uniques[c] for c in codes[e_rec].tolist()]
        return self._batch(key_col, e_start, out_cols), e_start + (size - 1)

    def _lookup(self, g_key: list[Any], g_start: list[int], g_kg: list[int], wm: int
                ) -> tuple[list[dict[str, Table] | None], np.ndarray]:
        """Per group the tables holding its accumulators (None: none yet) and whether it
        fires at once (its window fired, or the watermark passed its ``max_timestamp``)."""
        spec, size = self.spec, self.spec.assigner.size_ms
        first = spec.tables[0]
        groups_of = self.backend.groups
        source: list[dict[str, Table] | None] = []
        fired = np.zeros(len(g_key), dtype=bool)
        for i, (key, start, kg) in enumerate(zip(g_key, g_start, g_kg, strict=True)):
            tables = groups_of.get(kg)
            if tables is None:
                tables = self._group(kg)
            got = None
            for phase in (OpenOrFired.FIRED, OpenOrFired.OPEN):
                t = tables.get(spec.table(start, phase, first))
                if t is not None and key in t:
                    got = {name: tables[spec.table(start, phase, name)]
                           for name in spec.tables}
                    fired[i] = phase == OpenOrFired.FIRED
                    break
            if not fired[i]:
                fired[i] = start + size - 1 <= wm
            source.append(got)
        return source, fired

    @staticmethod
    def _bases(source: list[dict[str, Table] | None], name: str, g_key: list[Any],
               default: Any) -> np.ndarray:
        if isinstance(default, list):
            return np.asarray([d if s is None else s[name][k]
                               for s, k, d in zip(source, g_key, default, strict=True)])
        return np.asarray([default if s is None else s[name][k]
                           for s, k in zip(source, g_key, strict=True)])

    def _store(self, g_key: list[Any], g_start: list[int], g_kg: list[int],
               source: list[dict[str, Table] | None], fired: np.ndarray,
               finals: dict[str, list[Any]]) -> None:
        """Write each group's accumulators to its window's open or fired tables (a group
        that fired at once leaves the open ones) and set the group's timers."""
        spec, backend = self.spec, self.backend
        size, lateness = spec.assigner.size_ms, spec.lateness
        tracked = bool(backend.tracked())
        timers: set[tuple[int, int]] = set()
        for i, (key, start, kg) in enumerate(zip(g_key, g_start, g_kg, strict=True)):
            tables = backend.groups[kg]
            phase = OpenOrFired.FIRED if fired[i] else OpenOrFired.OPEN
            old = source[i]
            for name in spec.tables:
                tname = spec.table(start, phase, name)
                t = tables.get(tname)
                if t is None:
                    t = tables.setdefault(tname, {})  # the live table on every backend
                if old is not None and old[name] is not t:
                    del old[name][key]  # it fired at once: it leaves the open table
                    if not old[name]:
                        del tables[spec.table(start, OpenOrFired.OPEN, name)]
                t[key] = finals[name][i]
            if tracked:
                backend.note_changed(kg, key)
            end = start + size - 1
            if not fired[i]:
                timers.add((kg, end))
            if lateness:
                timers.add((kg, end + lateness))
        for kg, at in timers:
            backend.add_timer(kg, at, None, EVENT_TIME)

    def _batch(self, keys: list[Any], starts: np.ndarray, aggs: list[Any]) -> ColumnBatch:
        import pyarrow as pa

        spec = self.spec
        names = [spec.key_name, WINDOW_START, WINDOW_END, *(a.name for a in spec.aggregations)]
        arrays = [pa.array(keys), pa.array(starts, type=pa.int64()),
                  pa.array(starts + spec.assigner.size_ms, type=pa.int64()),
                  *(pa.array(a) for a in aggs)]
        return ColumnBatch(pa.RecordBatch.from_arrays(arrays, names=names))

    # ------------------------------------------------------------ timers
    def fire_timers(self, now: int, domain: int = PROCESSING_TIME) -> Batch:
        """Fire every key group's windows whose timers are due at ``now`` (the watermark);
        a group not yet active here (DRRS) keeps its timers until it is."""
        spec, backend = self.spec, self.backend
        size, lateness = spec.assigner.size_ms, spec.lateness
        keys: list[Any] = []
        starts: list[int] = []
        columns: dict[str, list[Any]] = {name: [] for name in spec.tables}
        for t, kg, key in backend.pop_due_timers(now, domain):
            if self.hold is not None and self.hold(kg):
                backend.timers[kg].add((t, key, domain))
                self.held.setdefault(kg, []).append((t, key, domain))
                continue
            tables = backend.groups[kg]
            start = t + 1 - size
            opened = [tables.pop(spec.table(start, OpenOrFired.OPEN, name), None)
                      for name in spec.tables]
            if opened[0]:
                fired_keys = list(opened[0])
                keys.extend(fired_keys)
                starts.extend([start] * len(fired_keys))
                for name, table in zip(spec.tables, opened, strict=True):
                    assert table is not None, "a window's tables are written together"
                    columns[name].extend(table.values())
                    if lateness:
                        kept = tables.setdefault(spec.table(start, OpenOrFired.FIRED, name), {})
                        kept.update(table)
                self._changed(kg, fired_keys)
            if lateness:
                gone = t - lateness + 1 - size
                dropped = [tables.pop(spec.table(gone, OpenOrFired.FIRED, name), None)
                           for name in spec.tables]
                if dropped[0]:
                    self._changed(kg, list(dropped[0]))
        if not keys:
            return [], []
        out = [self._result(agg, columns) for agg in spec.aggregations]
        starts_arr = np.asarray(starts, dtype=np.int64)
        return self._batch(keys, starts_arr, out), starts_arr + (size - 1)

    @staticmethod
    def _result(agg: Aggregation, columns: dict[str, list[Any]]) -> list[Any]:
        names = state_tables(agg)
        if agg.kind == "mean":
            return [s / c for s, c in zip(columns[names[0]], columns[names[1]], strict=True)]
        return columns[names[0]]

    def _changed(self, kg: int, keys: list[Any]) -> None:
        if self.backend.tracked():
            for key in keys:
                self.backend.note_changed(kg, key)
