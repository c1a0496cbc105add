"""Vectorised operators of the columnar data path: keyed aggregations and ``map_batches``.

Why: on a stream of column batches (``engine.columnar.batches``) a running count, sum, min, max or
mean per key costs a few numpy calls per batch and one state read and write per distinct
key, instead of a Python call per record; ``map_batches`` hands a whole batch to a user
function, as Ray Data's does.

* ``Count()``, ``Sum(col)``, ``Min(col)``, ``Max(col)``, ``Mean(col)``: the aggregations
  (Ray Data's names; output columns ``count()``, ``sum(col)``, ... unless ``alias_name``).
  ``keyed.aggregate(*aggs)`` emits, for every input record, the key and each aggregation's
  running value for that key after the record (what Flink's ``reduce`` emits), as a
  ``ColumnBatch``.
* Their state is keyed state of the key-group backend: per aggregation one table (key ->
  accumulator: a count, a sum, a min, a max; a mean has two, its sum and its count; names
  from ``state_tables``), so every protocol migrates it, snapshots include it, and the
  rows path (records a migration had to handle one by one) reads and writes the same
  values. With integer keys each table is a task-wide dense table
  (``engine.state.dense``): a batch finds its distinct keys with one ``searchsorted``
  and reads and writes them with one gather and one scatter (about 3x fewer CPU seconds
  than dicts on steady.py's count). Other keys, or a column whose values turn from ints
  to floats, turn the operator's tables back into dicts (one ``map``/``update`` per key
  group), where they stay.
* ``MapBatches(fn, batch_format)``: ``fn`` gets a ``pyarrow.Table`` ("pyarrow"), a dict of
  numpy arrays ("numpy") or a pandas DataFrame ("pandas") and returns any of those; the
  output keeps the input's timestamps when it has as many rows, else every output row gets
  the batch's latest timestamp.

Guarantees: per key, the outputs and the final state are those of folding the key's
records one at a time in order (sums of floats are added in record order, never re-
associated), so results do not depend on how records were cut into batches: the
correctness oracle holds across rescales. Aggregated columns must be numeric without nulls
(``ColumnarError``, which fails the job as a ``UserFunctionError`` naming the operator).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine.columnar.batches import (
    BATCH_FORMATS,
    ColumnBatch,
    ColumnKey,
    group_runs,
    stable_order,
    to_format,
)
from engine.dataflow import graph as g
from engine.errors import ColumnarError, UserFunctionError
from engine.io.sinks import SinkWriter
from engine.operators.builtin import Batch, ErrorPolicy, KeyedRunner, StatelessRunner, describe
from engine.operators.functions import KeyedProcessFunction
from engine.state.dense import int64_keys
from engine.state.keyed import KeyedStateBackend, Table
from engine.time.clock import Clock

AGG_STATE = "agg"  # the prefix of an aggregate operator's state tables


class Aggregation:
    """One aggregation of ``keyed.aggregate``; ``on`` the column it reads (None: none)."""

    kind = ""

    def __init__(self, on: str | None = None, alias_name: str | None = None) -> None:
        if on is not None and (not isinstance(on, str) or not on):
            raise ColumnarError(f"{type(self).__name__}: the column is a non-empty name; "
                                f"got {on!r}")
        if alias_name is not None and (not isinstance(alias_name, str) or not alias_name):
            raise ColumnarError(f"{type(self).__name__}: alias_name must be a non-empty "
                                f"string; got {alias_name!r}")
        self.on = on
        self.name = alias_name or f"{self.kind}({on or ''})"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.on!r})" if self.on else f"{type(self).__name__}()"


class Count(Aggregation):
    """Records per key."""

    kind = "count"

    def __init__(self, alias_name: str | None = None) -> None:
        super().__init__(None, alias_name)


class Sum(Aggregation):
    """Sum of a numeric column per key."""

    kind = "sum"

    def __init__(self, on: str, alias_name: str | None = None) -> None:
        super().__init__(on, alias_name)


class Min(Sum):
    """Smallest value of a numeric column per key."""

    kind = "min"


class Max(Sum):
    """Largest value of a numeric column per key."""

    kind = "max"


class Mean(Sum):
    """Mean of a numeric column per key (a float)."""

    kind = "mean"


class ColumnAggregate(KeyedProcessFunction):
    """The function of an ``aggregate`` operator: its aggregations and the name of the key
    column of its output. Run by ``AggregateRunner``, never record by record."""

    def __init__(self, aggregations: tuple[Aggregation, ...], key_name: str) -> None:
        if not aggregations:
            raise ColumnarError("aggregate() needs at least one aggregation, e.g. Count()")
        for a in aggregations:
            if not isinstance(a, Aggregation):
                raise ColumnarError(f"aggregate() takes Count(), Sum(col), Min(col), Max(col) "
                                    f"or Mean(col); got {a!r}")
        names = [key_name, *(a.name for a in aggregations)]
        if len(set(names)) != len(names):
            raise ColumnarError(f"aggregate() output columns must differ: {names}; give "
                                "repeated aggregations an alias_name")
        self.aggregations = aggregations
        self.key_name = key_name

    def process_element(self, value: Any, ctx: Any) -> Any:  # pragma: no cover
        raise AssertionError("an aggregate operator runs in AggregateRunner")


def key_name_of(key_fn: Any) -> str:
    """The output key column of an aggregate after ``key_by(key_fn)``."""
    return key_fn.column if isinstance(key_fn, ColumnKey) else "key"


class MapBatches:
    """The function of a ``map_batches`` operator (see the module doc)."""

    def __init__(self, fn: Callable[[Any], Any], batch_format: str) -> None:
        if batch_format not in BATCH_FORMATS:
            raise ColumnarError(f"map_batches batch_format must be one of {BATCH_FORMATS}; "
                                f"got {batch_format!r}")
        self.fn = fn
        self.batch_format = batch_format

    def __call__(self, batch: Any) -> Any:
        return self.fn(batch)


# ---------------------------------------------------------------- runners


class MapBatchesRunner(StatelessRunner):
    """Runs ``map_batches``: one call of the user function per batch. A batch whose call
    raises goes whole to the dead-letter sink (each record with the error), or fails the
    job naming the operator, the task and the batch's first record."""

    def process(self, values: Any, timestamps: Any) -> Batch:
        spec: MapBatches = self.fn
        batch = values if type(values) is ColumnBatch else ColumnBatch.from_rows(values)
        ts = np.asarray(timestamps, dtype=np.int64)
        try:
            out = ColumnBatch.of(spec.fn(to_format(batch, spec.batch_format)))
        except UserFunctionError:
            raise
        except Exception as exc:
            self._batch_failed(batch, ts, exc)
            return [], []
        if len(out) != len(batch):
            ts = np.full(len(out), int(ts.max()) if ts.size else 0, dtype=np.int64)
        return out, ts

    def _batch_failed(self, batch: ColumnBatch, ts: np.ndarray, exc: BaseException) -> None:
        rows = batch.rows()
        error = f"{type(exc).__name__}: {exc}"
        pol = self.policy
        if pol.dead_letter is None:
            raise UserFunctionError(pol.operator, pol.task_index,
                                    describe(rows[0]) if rows else "",
                                    f"{error} (map_batches over a batch of {len(rows)} "
                                    "records, this one first)") from exc
        pol.dead_letter.write([(pol.operator, pol.task_index, r, error) for r in rows],
                              ts.tolist())
        pol.dead_letters += len(rows)


def numeric_columns(values: Any, names: list[str]) -> dict[str, np.ndarray]:
    """The columns ``names`` of a batch (or of dict rows) as int64 or float64 arrays;
    ``ColumnarError`` when one has nulls or is not numeric."""
    if not names:
        return {}
    batch = values if type(values) is ColumnBatch else ColumnBatch.from_rows(values)
    out = {}
    for name in dict.fromkeys(names):
        col = batch.column(name)
        if col.null_count:
            raise ColumnarError(f"aggregate column {name!r} has nulls; drop or fill them "
                                "first (e.g. with map_batches)")
        arr = col.to_numpy(zero_copy_only=False)
        if arr.dtype.kind not in "iuf":
            raise ColumnarError(f"aggregate column {name!r} is {col.type}, not numeric")
        out[name] = arr.astype(np.float64 if arr.dtype.kind == "f" else np.int64, copy=False)
    return out


def factorize(keys: Any) -> tuple[np.ndarray, list[Any]]:
    """Per record the index of its key among the distinct keys (in order of first
    appearance for lists), and the distinct keys as Python values."""
    if isinstance(keys, list | tuple):
        index: dict[Any, int] = {}
        codes = [index.setdefault(k, len(index)) for k in keys]
        return np.asarray(codes, dtype=np.int64), list(index)
    import pyarrow.compute as pc

    enc = pc.dictionary_encode(keys, null_encoding="encode")
    return (enc.indices.to_numpy(zero_copy_only=False).astype(np.int64),
            enc.dictionary.to_pylist())


def _segmented(op: np.ufunc, xs: np.ndarray, sc: np.ndarray, pos: np.ndarray,
               sizes: np.ndarray, starts: np.ndarray, prior: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """``op`` accumulated along each key's records in order, starting from ``prior`` (per
    key), for records sorted by key (``xs``; ``sc`` their key, ``pos`` their place in the
    key's run). Returns (per sorted record the running value, per key the final value).
    Sequential per key, so floats add exactly as one record at a time would."""
    n, groups = xs.size, sizes.size
    width = int(sizes.max()) + 1
    if groups * width <= 8 * n + 4096:
        m = np.zeros((groups, width), dtype=xs.dtype)
        m[:, 0] = prior
        m[sc, pos + 1] = xs
        c = op.accumulate(m, axis=1)
        return c[sc, pos + 1], c[np.arange(groups), sizes]
    out = np.empty(n, dtype=xs.dtype)  # one long run and many short ones: per key
    final = np.empty(groups, dtype=xs.dtype)
    for k in range(groups):
        s, e = int(starts[k]), int(starts[k] + sizes[k])
        c = op.accumulate(np.concatenate([prior[k:k + 1], xs[s:e]]))
        out[s:e] = c[1:]
        final[k] = c[-1]
    return out, final


class AggregateRunner(KeyedRunner):
    """Runs ``aggregate`` on a batch at a time (see the module doc)."""

    def __init__(self, op: g.OperatorDef, policy: ErrorPolicy, backend: KeyedStateBackend,
                 task_index: int, clock: Clock, watermark: Callable[[], int],
                 late_writer: SinkWriter | None = None) -> None:
        super().__init__(op, policy, backend, task_index, clock, watermark, late_writer)
        self.spec: ColumnAggregate = op.fn
        self.task_index = task_index
        self._dense_ok = True  # integer keys keep their state in dense tables
        # groups known to hold the dense tables' views, as of the backend's layout_version
        self._views_at = -1
        self._viewed: set[int] = set()

    def process(self, values: Any, timestamps: Any, keys: Any, kgs: Any,
                port: int = 0) -> Batch:
        try:
            return self._aggregate(values, timestamps, keys, kgs)
        except ColumnarError as exc:
            first = values.rows()[0] if type(values) is ColumnBatch else values[0]
            raise UserFunctionError(self.op.name, self.task_index, describe(first),
                                    str(exc)) from exc

    def _columns(self, values: Any) -> dict[str, np.ndarray]:
        return numeric_columns(values, [a.on for a in self.spec.aggregations if a.on])

    def _tables(self, runs: list[tuple[int, int, int]], name: str) -> list[Table]:
        """Table ``name`` of each key group of ``runs`` (created when missing)."""
        out = []
        groups = self.backend.groups
        for kg, _, _ in runs:
            owned = groups.get(kg)
            if owned is None:
                owned = self._group(kg)
            t = owned.get(name)
            if t is None:
                t = owned.setdefault(name, {})  # the live table on every backend
            out.append(t)
        return out

    @staticmethod
    def _read(tables: list[Table], runs: list[tuple[int, int, int]],
              keys: list[Any], defaults: list[Any]) -> list[Any]:
        vals: list[Any] = []
        for t, (_, s, e) in zip(tables, runs, strict=True):
            vals.extend(map(t.get, keys[s:e], defaults[s:e]))
        return vals

    @staticmethod
    def _write(tables: list[Table], runs: list[tuple[int, int, int]],
               keys: list[Any], values: list[Any]) -> None:
        for t, (_, s, e) in zip(tables, runs, strict=True):
            t.update(zip(keys[s:e], values[s:e], strict=True))

    def _aggregate(self, values: Any, timestamps: Any, keys: Any, kgs: Any
                   ) -> tuple[ColumnBatch, np.ndarray]:
        import pyarrow as pa

        n = len(values)
        ts = np.asarray(timestamps, dtype=np.int64)
        cols = self._columns(values)
        ikeys = None
        if self._dense_ok and n:
            ikeys = int64_keys(keys)
            if ikeys is None:
                self._no_dense()
        if ikeys is not None:
            running = self._dense(cols, keys, ikeys, np.asarray(kgs, dtype=np.int64))
        if ikeys is None or running is None:
            running = self._dicts(cols, keys, kgs)
        out_cols: list[Any] = [keys if not isinstance(keys, list | tuple) else pa.array(keys)]
        for order, run in running:
            out = np.empty(n, dtype=run.dtype)
            out[order] = run
            out_cols.append(pa.array(out))
        names = [self.spec.key_name, *(a.name for a in self.spec.aggregations)]
        return ColumnBatch(pa.RecordBatch.from_arrays(out_cols, names=names)), ts

    def _no_dense(self) -> None:
        """From now on this operator keeps its state in dicts (a batch brought keys or
        values a dense table cannot hold)."""
        self._dense_ok = False
        for agg in self.spec.aggregations:
            for name in state_tables(agg):
                self.backend.undense(name)

    def _dense(self, cols: dict[str, np.ndarray], keys: Any, ikeys: np.ndarray,
               kgs: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]] | None:
        """The batch against dense tables (``engine.state.dense``): per aggregation (the
        records' order by key, the running values in that order). None, having changed
        nothing, when the state cannot be dense (then the dict path runs)."""
        names = [name for agg in self.spec.aggregations for name in state_tables(agg)]
        made = {name: self.backend.dense_table(name) for name in names}
        stores = {name: t for name, t in made.items() if t is not None}
        if len(stores) < len(made):
            self._no_dense()
            return None
        if isinstance(keys, list | tuple):
            uniq, codes = np.unique(ikeys, return_inverse=True)
        else:
            import pyarrow.compute as pc

            enc = pc.dictionary_encode(keys)
            codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
            uniq = enc.dictionary.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        groups = uniq.size
        group_kg = np.empty(groups, dtype=np.int64)
        group_kg[codes] = kgs
        touched = np.unique(group_kg).tolist()
        if self._views_at != self.backend.layout_version:
            self._views_at, self._viewed = self.backend.layout_version, set()
        if not self._viewed.issuperset(touched):
            self._own_views(touched, stores)
            self._viewed.update(touched)
        order, sc, sizes, starts, pos = group_runs(codes, groups)
        found_at = {name: t.lookup(uniq) for name, t in stores.items()}
        results = []
        writes = []
        for agg in self.spec.aggregations:
            xs = None if agg.on is None else cols[agg.on][order]
            tables = state_tables(agg)
            bases = []
            for i, name in enumerate(tables):
                t = stores[name]
                slots, found = found_at[name]
                if xs is not None and i == 0 and agg.kind in ("min", "max"):
                    default = xs[starts]
                else:
                    default = np.zeros(groups, dtype=t.values.dtype)
                bases.append(np.where(found, t.gather(slots), default)
                             if len(t) else default)
            running, finals = fold(agg.kind, xs, sc, pos, sizes, starts, bases)
            for name, fin in zip(tables, finals, strict=True):
                if not stores[name].accepts(fin.dtype):
                    self._no_dense()  # e.g. a float column after ints: keep exact types
                    return None
                writes.append((name, fin))
            results.append((order, running))
        for name, fin in writes:
            slots, found = found_at[name]
            stores[name].assign(uniq, group_kg, slots, found, fin)
        if self.backend.tracked():
            for kg, key in zip(group_kg.tolist(), uniq.tolist(), strict=True):
                self.backend.note_changed(kg, key)
        return results

    def _own_views(self, key_groups: list[int], stores: dict[str, Any]) -> None:
        """Each touched group holds the dense tables' views (raises for a group this task
        does not own)."""
        groups = self.backend.groups
        for kg in key_groups:
            owned = groups.get(kg)
            if owned is None:
                owned = self._group(kg)
            for name, t in stores.items():
                v = t.view(kg)
                cur = owned.get(name)
                if cur is not v:
                    if cur:  # the backend keeps dense names as views; never drop entries
                        raise AssertionError(f"key group {kg} holds a dict for dense "
                                             f"table {name!r}")
                    owned[name] = v

    def _dicts(self, cols: dict[str, np.ndarray], keys: Any, kgs: Any
               ) -> list[tuple[np.ndarray, np.ndarray]]:
        """The batch against one dict per key group and table: per aggregation (the
        records' order by key, the running values in that order)."""
        import operator

        codes, uniques = factorize(keys)
        groups = len(uniques)
        group_kg = np.empty(groups, dtype=np.int64)
        group_kg[codes] = np.asarray(kgs, dtype=np.int64)
        # distinct keys in key-group order: one table lookup per key group, not per key
        perm = stable_order(group_kg, self.backend.num_key_groups)
        rank = np.empty(groups, dtype=np.int64)
        rank[perm] = np.arange(groups)
        codes = rank[codes]
        group_kg = group_kg[perm]
        uniques = list(operator.itemgetter(*perm.tolist())(uniques)) if groups > 1 else uniques
        cut = np.flatnonzero(np.diff(group_kg)) + 1
        bounds = [0, *cut.tolist(), groups]
        runs = list(zip(group_kg[bounds[:-1]].tolist(), bounds[:-1], bounds[1:], strict=True))
        order, sc, sizes, starts, pos = group_runs(codes, groups)
        results = [(order, self._one(agg, cols, order, sc, pos, sizes, starts, runs, uniques))
                   for agg in self.spec.aggregations]
        if self.backend.tracked():
            for (kg, s, e) in runs:
                for key in uniques[s:e]:
                    self.backend.note_changed(kg, key)
        return results

    def _one(self, agg: Aggregation, cols: dict[str, np.ndarray], order: np.ndarray,
             sc: np.ndarray, pos: np.ndarray, sizes: np.ndarray, starts: np.ndarray,
             runs: list[tuple[int, int, int]], keys: list[Any]) -> np.ndarray:
        """Per sorted record the running value of ``agg``; its accumulators (tables
        ``state_tables(agg)``) updated for every key."""
        xs = None if agg.on is None else cols[agg.on][order]
        defaults = [0] * len(keys) if xs is None or agg.kind in ("sum", "mean") \
            else xs[starts].tolist()
        tables = [self._tables(runs, name) for name in state_tables(agg)]
        bases = [np.asarray(self._read(t, runs, keys, defaults if i == 0 else [0] * len(keys)))
                 for i, t in enumerate(tables)]
        running, finals = fold(agg.kind, xs, sc, pos, sizes, starts, bases)
        for t, fin in zip(tables, finals, strict=True):
            self._write(t, runs, keys, fin.tolist())
        return running


def fold(kind: str, xs: np.ndarray | None, sc: np.ndarray, pos: np.ndarray,
         sizes: np.ndarray, starts: np.ndarray, bases: list[np.ndarray]
         ) -> tuple[np.ndarray, list[np.ndarray]]:
    """One aggregation folded over groups of records sorted by group (``xs`` the sorted
    values, None for a count; ``sc`` each record's group, ``pos`` its place in the group's
    run, ``sizes``/``starts`` the runs), from the accumulators ``bases`` (per state table of
    ``state_tables``, per group; a min/max group without one starts from its first value).
    Returns (per sorted record the running value, per state table the final accumulators).
    Sequential per group: floats add exactly as one record at a time would."""
    if kind == "count":
        base = bases[0].astype(np.int64, copy=False)
        return base[sc] + pos + 1, [base + sizes]
    assert xs is not None
    base = bases[0]
    dtype = np.result_type(base.dtype, xs.dtype)
    op = {"sum": np.add, "mean": np.add, "min": np.minimum, "max": np.maximum}[kind]
    run, fin = _segmented(op, xs.astype(dtype, copy=False), sc, pos, sizes, starts,
                          base.astype(dtype, copy=False))
    if kind != "mean":
        return run, [fin]
    n0 = bases[1].astype(np.int64, copy=False)
    return run / (n0[sc] + pos + 1), [fin, n0 + sizes]


def state_tables(agg: Aggregation) -> tuple[str, ...]:
    """The keyed-state tables of one aggregation (key -> accumulator): one per aggregation,
    two for a mean (its sum and its count)."""
    base = f"{AGG_STATE}/{agg.name}"
    return (f"{base}/sum", f"{base}/count") if agg.kind == "mean" else (base,)
