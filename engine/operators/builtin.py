"""Operator runners: how each operator kind processes a batch inside a task (pure).

Runners take and return parallel lists (values, timestamps). Fast paths run a whole batch
through the user function; when it raises, the batch is re-run record by record to find the
offending record, which then goes to the dead-letter sink (when configured) or fails the job
with operator, task and record named. Re-running is correct for map, flat_map and filter
(pure per record: a record's output is kept only once) but not for a sink: a writer that
raised part-way may have written the records before the failing one, and writing them again
duplicates them in a non-idempotent sink. So a sink's batch is written exactly once: when the
write raises, the whole batch goes to the dead-letter sink (each record with the error) or
the job fails naming the operator, the task and the batch's first record.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from engine.columnar.batches import ColumnBatch, as_rows
from engine.dataflow import graph as g
from engine.errors import JobDefinitionError, UnknownKeyGroupError, UserFunctionError
from engine.io.sinks import SinkWriter
from engine.operators.functions import (
    Context,
    KeyedProcessFunction,
    ReduceFunction,
    RuntimeContext,
    TimerService,
)
from engine.state.keyed import EVENT_TIME, PROCESSING_TIME, KeyedStateBackend, Table
from engine.time.clock import Clock, now_ms

# A batch of records and their timestamps (ms), what runners take and emit: rows (a list;
# a tuple when decoded from a frame) with a sequence of stamps, or on the columnar path a
# ``ColumnBatch`` with a numpy array of stamps.
Records = Sequence[Any] | ColumnBatch
Stamps = Sequence[int] | np.ndarray
Batch = tuple[Records, Stamps]
_MISSING = object()


def describe(record: Any, limit: int = 200) -> str:
    text = repr(record)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ErrorPolicy:
    """What happens to a record whose user function raised: dead letter, or fail the job."""

    def __init__(self, operator: str, task_index: int, dead_letter: SinkWriter | None) -> None:
        self.operator = operator
        self.task_index = task_index
        self.dead_letter = dead_letter
        self.dead_letters = 0

    def on_error(self, record: Any, timestamp: int, exc: BaseException) -> None:
        cause = f"{type(exc).__name__}: {exc}"
        if self.dead_letter is None:
            raise UserFunctionError(self.operator, self.task_index, describe(record), cause) from exc
        self.dead_letter.write([(self.operator, self.task_index, record, cause)], [timestamp])
        self.dead_letters += 1

    def on_batch_error(
        self, values: list[Any], timestamps: list[int], exc: BaseException,
    ) -> None:
        """A sink's write of a whole batch raised. Nothing of it is written again: with a
        dead-letter sink every record of the batch goes there as
        ``(operator, task_index, record, error)`` (in one write); without one
        ``UserFunctionError`` names the operator, the task and the batch's first record."""
        n = len(values)
        error = f"{type(exc).__name__}: {exc}"
        if self.dead_letter is None:
            raise UserFunctionError(
                self.operator, self.task_index, describe(values[0]),
                f"{error} (writing a batch of {n} records, this one first; the batch was not "
                "written again, as records before the failing one may already be written)",
            ) from exc
        cause = f"{error} (the sink's write of a batch of {n} records raised; not retried)"
        self.dead_letter.write([(self.operator, self.task_index, v, cause) for v in values],
                               list(timestamps))
        self.dead_letters += n


class StatelessRunner:
    """map, flat_map, filter, and sink (see the module doc for what happens on errors)."""

    def __init__(self, op: g.OperatorDef, policy: ErrorPolicy, writer: SinkWriter | None = None) -> None:
        self.op = op
        self.kind = op.kind
        self.fn = op.fn
        self.policy = policy
        self.writer = writer

    def process(self, values: Records, timestamps: Stamps) -> Batch:
        if self.kind == g.SINK:
            if type(values) is ColumnBatch and not getattr(self.writer, "accepts_columns",
                                                           False):
                values, timestamps = as_rows(values, timestamps)
            self._write(values, timestamps)
            return [], []
        rows, stamps = as_rows(values, timestamps)  # the edge to per-record code
        try:
            return self._fast(rows, stamps)
        except UserFunctionError:
            raise
        except Exception:
            return self._slow(rows, stamps)

    def _fast(self, values: Sequence[Any], timestamps: Sequence[int]
              ) -> tuple[Sequence[Any], Sequence[int]]:
        fn = self.fn
        if self.kind == g.MAP:
            return list(map(fn, values)), timestamps
        if self.kind == g.FILTER:
            keep = [bool(fn(v)) for v in values]
            return ([v for v, k in zip(values, keep, strict=True) if k],
                    [t for t, k in zip(timestamps, keep, strict=True) if k])
        if self.kind == g.FLAT_MAP:
            out: list[Any] = []
            out_ts: list[int] = []
            for v, t in zip(values, timestamps, strict=True):
                n = len(out)
                out.extend(fn(v))
                out_ts.extend([t] * (len(out) - n))
            return out, out_ts
        raise AssertionError(self.kind)

    def _write(self, values: Records, timestamps: Stamps) -> None:
        """One write of the batch; never retried (see the module doc)."""
        assert self.writer is not None
        if not values:
            return
        try:
            # a ColumnBatch only reaches a writer with ``accepts_columns``, which takes it as
            # it is (SinkWriter's contract; ``write``'s signature names the row form only)
            self.writer.write(values, timestamps)  # type: ignore[arg-type]
        except Exception as exc:
            self.policy.on_batch_error(*as_rows(values, timestamps), exc)

    def _slow(self, values: Sequence[Any], timestamps: Sequence[int]
              ) -> tuple[Sequence[Any], Sequence[int]]:
        out: list[Any] = []
        out_ts: list[int] = []
        for v, t in zip(values, timestamps, strict=True):
            try:
                o, ots = self._fast([v], [t])
            except Exception as exc:
                self.policy.on_error(v, t, exc)
                continue
            out.extend(o)
            out_ts.extend(ots)
        return out, out_ts


def with_function(op: g.OperatorDef, fn: Any) -> g.OperatorDef:
    """``op`` running ``fn`` instead of its function (a change of logic), or
    ``JobDefinitionError`` saying what ``fn`` must be: a function for map, flat_map and
    filter; a function of two values (or a ``ReduceFunction``) for reduce; a
    ``KeyedProcessFunction`` for process, or for a window operator the new window function
    of the same kind (``reduce``: a function of two values, ``aggregate``: an
    ``AggregateFunction``, ``process``: ``fn(key, window, elements)``), its assigner and
    result function kept. Sources and sinks cannot change their logic."""
    from engine.operators.windows import AggregateFunction, WindowOperator

    what = f"operator {op.name!r} ({op.kind})"
    if op.kind in (g.SOURCE, g.SINK):
        raise JobDefinitionError(f"{what}: the logic of sources and sinks cannot change live")
    if op.kind in (g.MAP, g.FLAT_MAP, g.FILTER):
        if not callable(fn):
            raise JobDefinitionError(f"{what}: the new logic must be a function; got {fn!r:.80}")
        return replace(op, fn=fn)
    if op.kind == g.REDUCE:
        if isinstance(fn, ReduceFunction):
            return replace(op, fn=fn)
        if not callable(fn) or isinstance(fn, KeyedProcessFunction):
            raise JobDefinitionError(f"{what}: the new logic must be a function of two values; "
                                     f"got {fn!r:.80}")
        return replace(op, fn=ReduceFunction(fn))
    if isinstance(fn, KeyedProcessFunction):
        return replace(op, fn=fn)
    cur = op.fn
    if isinstance(cur, WindowOperator):
        ok = isinstance(fn, AggregateFunction) if cur.kind == "aggregate" else callable(fn)
        if ok:
            return replace(op, fn=WindowOperator(cur.assigner, cur.kind, fn, cur.window_fn,
                                                 cur.lateness))
        raise JobDefinitionError(
            f"{what}: a window {cur.kind} takes a new "
            f"{'AggregateFunction' if cur.kind == 'aggregate' else 'function'} (or a whole "
            f"KeyedProcessFunction); got {fn!r:.80}")
    raise JobDefinitionError(f"{what}: the new logic must be a KeyedProcessFunction; got "
                             f"{fn!r:.80}")


class KeyedRunner:
    """process and reduce: per-record calls with the record's key as current key."""

    def __init__(
        self, op: g.OperatorDef, policy: ErrorPolicy, backend: KeyedStateBackend,
        task_index: int, clock: Clock, watermark: Callable[[], int],
        late_writer: SinkWriter | None = None,
    ) -> None:
        self.op = op
        self.policy = policy
        self.backend = backend
        self.fn: KeyedProcessFunction = op.fn
        self.clock = clock
        self.timer_service = TimerService(backend, lambda: now_ms(clock), watermark)
        self.ctx = Context(backend, self.timer_service)
        self.late_writer = late_writer
        self.late_records = 0
        # DRRS: timers of groups not yet active here are held back until they are
        self.hold: Callable[[int], bool] | None = None
        self.held: dict[int, list[tuple[int, Any, int]]] = {}
        self.ctx._late = self._on_late
        self.is_reduce = isinstance(self.fn, ReduceFunction)
        self._reduce_cache: list[Table | None] = []  # see _reduce_tables
        self._reduce_cache_at = -1
        self.runtime_context = RuntimeContext(backend, op.name, task_index, op.parallelism)
        self.fn.open(self.runtime_context)

    def prepare(self, fn: KeyedProcessFunction) -> None:
        """Open ``fn`` (it declares its state on this task's backend) before ``use``."""
        fn.open(self.runtime_context)

    def use(self, fn: KeyedProcessFunction) -> None:
        """Process with ``fn`` (prepared) from the next record on; the state stays."""
        self.fn = fn
        self.op = replace(self.op, fn=fn)
        self.is_reduce = isinstance(fn, ReduceFunction)

    def _on_late(self, value: Any, timestamp: int) -> None:
        self.late_records += 1
        if self.late_writer is not None:
            self.late_writer.write([value], [timestamp])

    def process(self, values: Records, timestamps: Stamps, keys: Any, kgs: Any,
                port: int = 0) -> Batch:
        if type(values) is ColumnBatch:  # the edge from the columnar path
            keys = keys.to_pylist() if hasattr(keys, "to_pylist") else list(keys)
            kgs = kgs.tolist() if hasattr(kgs, "tolist") else list(kgs)
        values, timestamps = as_rows(values, timestamps)  # rows pass through
        self.ctx.port = port
        self.ctx.time_domain = None
        out: list[Any] = []
        out_ts: list[int] = []
        self.ctx._out = (out, out_ts)
        n = len(values)
        self.pos = 0  # index of the record being processed, kept for error reports
        while self.pos < n:
            try:
                if self.is_reduce:
                    self._reduce_from(values, timestamps, keys, kgs, out, out_ts)
                else:
                    self._process_from(values, timestamps, keys, kgs, out, out_ts)
            except (UserFunctionError, UnknownKeyGroupError):
                raise
            except Exception as exc:
                self.policy.on_error(values[self.pos], timestamps[self.pos], exc)
                self.pos += 1
        return out, out_ts

    def _group(self, kg: int) -> dict[str, Table]:
        try:
            return self.backend.groups[kg]
        except KeyError:
            raise UnknownKeyGroupError(
                f"operator {self.op.name!r} got a record of key group {kg}, which this task "
                "does not own"
            ) from None

    def _reduce_from(self, values: list[Any], timestamps: list[int], keys: list[Any],
                     kgs: list[int], out: list[Any], out_ts: list[int]) -> None:
        reducer = self.fn
        assert isinstance(reducer, ReduceFunction)  # only then is_reduce
        fn = reducer.fn
        tables = self._reduce_tables()
        note = self.backend.note_changed if self.backend.tracked() else None
        start = self.pos
        before = len(out)
        append = out.append
        missing = _MISSING
        if start:
            keys, kgs, values = keys[start:], kgs[start:], values[start:]
        try:
            # one output per record, appended last: the records done are the outputs added;
            # the timestamps are copied once, in ``finally``
            for k, kg, v in zip(keys, kgs, values):  # noqa: B905 - equal lengths
                table = tables[kg]
                if table is None:
                    table = self._reduce_table(tables, kg)
                cur = table.get(k, missing)
                new = v if cur is missing else fn(cur, v)
                table[k] = new
                if note is not None:
                    note(kg, k)
                append(new)
        finally:
            i = start + len(out) - before
            out_ts.extend(timestamps[start:i])
            self.pos = i

    def _reduce_tables(self) -> list[Table | None]:
        """Per key group the reduce state table, or None where not looked up yet; kept
        while the backend's layout (groups, installs) is unchanged."""
        b = self.backend
        if self._reduce_cache_at != b.layout_version or len(self._reduce_cache) != b.num_key_groups:
            self._reduce_cache = [None] * b.num_key_groups
            self._reduce_cache_at = b.layout_version
        return self._reduce_cache

    def _reduce_table(self, tables: list[Table | None], kg: int) -> Table:
        owned = self.backend.groups.get(kg)
        if owned is None:
            owned = self._group(kg)
        name = ReduceFunction.STATE
        table = owned.get(name)
        if table is None:
            table = owned.setdefault(name, {})  # the live table on every backend
        tables[kg] = table
        return table

    def _process_from(self, values: list[Any], timestamps: list[int], keys: list[Any],
                      kgs: list[int], out: list[Any], out_ts: list[int]) -> None:
        backend, ctx, fn = self.backend, self.ctx, self.fn
        n = len(values)
        while self.pos < n:
            i = self.pos
            kg = kgs[i]
            if kg not in backend.groups:
                self._group(kg)
            backend.set_current(keys[i], kg)
            ts = timestamps[i]
            ctx.timestamp = ts
            res = fn.process_element(values[i], ctx)
            if res is not None:
                before = len(out)
                try:
                    out.extend(res)
                except BaseException:
                    del out[before:]  # a failed record emits nothing
                    raise
                out_ts.extend([ts] * (len(out) - before))
            self.pos = i + 1

    def release_held(self, key_group: int) -> None:
        """The group became active: its held timers go back on the timer heaps."""
        for t, key, domain in self.held.pop(key_group, ()):
            self.backend._push_timer(t, key_group, key, domain)

    def fire_timers(self, now: int, domain: int = PROCESSING_TIME) -> Batch:
        """Fire every timer of ``domain`` due at ``now`` (the clock, or the watermark)."""
        out: list[Any] = []
        out_ts: list[int] = []
        self.ctx._out = (out, out_ts)
        self.ctx.time_domain = "event" if domain == EVENT_TIME else "processing"
        for t, kg, key in self.backend.pop_due_timers(now, domain):
            if self.hold is not None and self.hold(kg):
                self.backend.timers[kg].add((t, key, domain))
                self.held.setdefault(kg, []).append((t, key, domain))
                continue
            self.backend.set_current(key, kg)
            self.ctx.timestamp = t
            try:
                res = self.fn.on_timer(t, self.ctx)
                if res is not None:
                    before = len(out)
                    out.extend(res)
                    out_ts.extend([t] * (len(out) - before))
            except Exception as exc:
                self.policy.on_error(("timer", key, t), t, exc)
        return out, out_ts
