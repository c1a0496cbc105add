"""The columnar data path: record batches as Arrow columns, vectorised key groups, frames.

Why: a stream whose records have a schema can travel and be processed a batch at a time in
columns instead of a Python object per record: the key groups of 1,000 records are one
vectorised hash, routing is a ``take`` per channel, a frame is Arrow IPC bytes, and the
built-in keyed aggregations (``engine.operators.vectorised``) update their state once per distinct
key instead of once per record.

Format and conventions:

* ``ColumnBatch`` wraps a ``pyarrow.RecordBatch``. Its records, seen one at a time, are
  **dict rows** ``{column: value}`` (Ray Data's row convention): a per-record operator
  (``map``, ``process``, a sink without ``accepts_columns``) given a ``ColumnBatch`` gets
  ``batch.rows()``; the columnar operators take rows too (``ColumnBatch.from_rows``). The
  per-record API is unchanged; converting happens only at such edges.
* A record's timestamp travels beside the batch as an int64 numpy array.
* ``ColumnKey(column)`` is the key function of ``key_by("column")``: ``row[column]`` on
  a dict row, the column itself on a batch.
* ``column_key_groups(column, n)`` gives every value's key group with exactly the stable
  hash of ``engine.dataflow.keygroups`` (property-tested against it): integers (and integer-valued
  floats) vectorised with the same MurmurHash3 finaliser, every other type by hashing each
  distinct value once.
* A columnar frame is Arrow IPC stream bytes (which start with ``0xFFFFFFFF``, never a
  msgpack frame's first byte): the batch's columns plus ``__ts`` (int64 ms) and, on keyed
  channels, ``__kg`` (int32); the schema's metadata ``reflow`` holds msgpack
  ``[event or None, key column or None]``. ``engine.wire.messages.decode_frame`` tells the two
  kinds apart; ``decode_columnar_frame`` returns a ``Frame`` whose ``values`` is a
  ``ColumnBatch``, ``timestamps`` and ``key_groups`` numpy arrays and ``keys`` the key
  column (a ``pyarrow.Array``).

Guarantees: a batch's rows come out in order; ``column_key_groups`` equals
``key_group_of`` value by value (``InvalidKeyError`` for a NaN, as there); no value is
unpickled (Arrow IPC carries only typed buffers).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.dataflow.keygroups import int_key_hashes, stable_hash
from engine.dataflow.keygroups import mod_key_groups as _mod
from engine.errors import ColumnarError, InvalidKeyError
from engine.wire.messages import ColumnarFrameCodec, register_columnar_frames

if TYPE_CHECKING:
    import pyarrow as pa

TS_COLUMN = "__ts"
KG_COLUMN = "__kg"
_META = b"reflow"
IPC_MAGIC = b"\xff\xff\xff\xff"


class ColumnBatch:
    """Records as Arrow columns (see the module doc); ``len`` is the number of records."""

    __slots__ = ("data",)

    def __init__(self, data: pa.RecordBatch) -> None:
        self.data = data

    def __len__(self) -> int:
        return self.data.num_rows

    def __repr__(self) -> str:
        return f"ColumnBatch({self.data.num_rows} rows, {self.data.schema.names})"

    @property
    def names(self) -> list[str]:
        return self.data.schema.names

    def column(self, name: str) -> pa.Array:
        try:
            return self.data.column(name)
        except KeyError:
            raise ColumnarError(f"the batch has no column {name!r}; its columns are "
                                f"{self.names}") from None

    def rows(self) -> list[dict[str, Any]]:
        """The records as dict rows, in order."""
        return self.data.to_pylist()

    def take(self, indices: Any) -> ColumnBatch:
        import pyarrow as pa
        return ColumnBatch(self.data.take(pa.array(indices)))

    def slice(self, start: int, stop: int) -> ColumnBatch:
        return ColumnBatch(self.data.slice(start, stop - start))

    @staticmethod
    def concat(batches: Sequence[ColumnBatch]) -> ColumnBatch:
        import pyarrow as pa
        if len(batches) == 1:
            return batches[0]
        try:
            table = pa.Table.from_batches([b.data for b in batches])
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ColumnarError(f"batches of one stream changed schema: {exc}; give every "
                                "batch the same columns and types") from exc
        return ColumnBatch(table.combine_chunks().to_batches()[0])

    @staticmethod
    def from_rows(rows: Sequence[Any]) -> ColumnBatch:
        """Dict rows as columns (``ColumnarError`` when they are not dicts or do not fit
        one schema)."""
        import pyarrow as pa
        if rows and not isinstance(rows[0], dict):
            raise ColumnarError(
                f"a columnar operator got a record that is not a dict row: {rows[0]!r:.120}; "
                "columnar operators take dict rows {column: value} or Arrow batches")
        try:
            return ColumnBatch(pa.RecordBatch.from_pylist(list(rows)))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
            raise ColumnarError(f"records do not fit one schema as columns: {exc}") from exc

    @staticmethod
    def of(data: Any) -> ColumnBatch:
        """A batch from a ``pyarrow.RecordBatch``/``Table``, a dict of equal-length columns
        (numpy arrays or lists: Ray Data's ``numpy`` format) or a pandas DataFrame."""
        import pyarrow as pa
        if isinstance(data, ColumnBatch):
            return data
        if isinstance(data, pa.RecordBatch):
            return ColumnBatch(data)
        if isinstance(data, pa.Table):
            return ColumnBatch(data.combine_chunks().to_batches()[0] if data.num_rows
                               else pa.RecordBatch.from_pylist([], schema=data.schema))
        if isinstance(data, dict):
            try:
                return ColumnBatch(pa.RecordBatch.from_pydict(data))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
                raise ColumnarError(f"the columns do not make a batch: {exc}") from exc
        if type(data).__name__ == "DataFrame" and hasattr(data, "columns"):
            return ColumnBatch.of(pa.Table.from_pandas(data, preserve_index=False))
        raise ColumnarError(
            f"cannot make a record batch of {type(data).__name__}; return a pyarrow "
            "RecordBatch or Table, a dict of columns, or a pandas DataFrame")


def as_rows(values: Any, timestamps: Any) -> tuple[list[Any], list[int]]:
    """``(values, timestamps)`` as lists: a ``ColumnBatch`` becomes dict rows (the edge
    between the columnar path and per-record operators); lists pass through."""
    if type(values) is ColumnBatch:
        ts = timestamps.tolist() if isinstance(timestamps, np.ndarray) else list(timestamps)
        return values.rows(), ts
    return values, timestamps


class ColumnKey:
    """The key function of ``key_by("column")``: ``row[column]`` for a dict row; on a
    ``ColumnBatch`` the router and the columnar operators read the column itself."""

    __slots__ = ("column",)

    def __init__(self, column: str) -> None:
        if not isinstance(column, str) or not column:
            raise ColumnarError(f"a key column is a non-empty name; got {column!r}")
        self.column = column

    def __call__(self, row: Any) -> Any:
        try:
            return row[self.column]
        except (KeyError, TypeError, IndexError):
            raise ColumnarError(
                f"key_by({self.column!r}) got a record without column {self.column!r}: "
                f"{row!r:.120}; key_by a column name takes dict rows or Arrow batches") from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ColumnKey) and other.column == self.column

    def __hash__(self) -> int:
        return hash(("ColumnKey", self.column))

    def __repr__(self) -> str:
        return f"ColumnKey({self.column!r})"

    def keys_of(self, batch: ColumnBatch) -> pa.Array:
        return batch.column(self.column)


# ---------------------------------------------------------------- key groups, vectorised


def column_key_groups(column: Any, num_key_groups: int) -> np.ndarray:
    """The key group of every value of ``column`` (a ``pyarrow.Array``/``ChunkedArray``, a
    numpy array or a list) as an int32 array, exactly ``key_group_of`` value by value."""
    import pyarrow as pa
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if isinstance(column, pa.Array):
        t = column.type
        if column.null_count == 0 and (pa.types.is_integer(t) and t.bit_width <= 64
                                       and not (pa.types.is_unsigned_integer(t)
                                                and t.bit_width == 64)):
            ints = column.to_numpy(zero_copy_only=False)
            return _mod(int_key_hashes(ints), num_key_groups)
        if column.null_count == 0 and pa.types.is_floating(t):
            return _float_key_groups(column.to_numpy(zero_copy_only=False), num_key_groups)
        return _per_distinct(column, num_key_groups)
    arr = np.asarray(column)
    if arr.dtype.kind in "iu" and arr.dtype != np.uint64:
        return _mod(int_key_hashes(arr), num_key_groups)
    if arr.dtype.kind == "f":
        return _float_key_groups(arr, num_key_groups)
    return _per_distinct(pa.array(list(column)), num_key_groups)


def _float_key_groups(x: np.ndarray, num_key_groups: int) -> np.ndarray:
    import pyarrow as pa
    if np.isnan(x).any():
        bad = float(x[np.isnan(x)][0])
        stable_hash(bad)  # raises InvalidKeyError with the engine's own message
        raise InvalidKeyError(f"the key {bad!r} is NaN")  # pragma: no cover
    whole = np.isfinite(x) & (x == np.floor(x)) & (np.abs(x) < 2.0**63)
    out = np.empty(x.size, dtype=np.int32)
    if whole.all():
        out[:] = _mod(int_key_hashes(x.astype(np.int64)), num_key_groups)
        return out
    out[whole] = _mod(int_key_hashes(x[whole].astype(np.int64)), num_key_groups)
    rest = np.flatnonzero(~whole)
    out[rest] = _per_distinct(pa.array(x[rest]), num_key_groups)
    return out


def _per_distinct(column: pa.Array, num_key_groups: int) -> np.ndarray:
    """Hash each distinct value once (strings, bytes, None, floats, anything else)."""
    enc = column.dictionary_encode()
    table = [stable_hash(u) % num_key_groups for u in enc.dictionary.to_pylist()]
    idx = enc.indices
    lookup = np.asarray(table, dtype=np.int32)
    if idx.null_count:  # nulls are not in the dictionary: hash None
        none_kg = stable_hash(None) % num_key_groups
        out = np.full(len(idx), none_kg, dtype=np.int32)
        valid = ~np.asarray(idx.is_null().to_numpy(zero_copy_only=False))
        out[valid] = lookup[idx.drop_null().to_numpy()]
        return out
    return lookup[idx.to_numpy(zero_copy_only=False)]


# ---------------------------------------------------------------- frames


def stable_order(codes: np.ndarray, bound: int) -> np.ndarray:
    """``np.argsort(codes, kind="stable")`` for codes in ``[0, bound)``: as int16 when
    they fit (numpy sorts 16-bit integers stably by radix, ~20x faster than the merge
    sort of int32/int64 on a batch of 16,384)."""
    if bound <= 32767:
        return np.argsort(codes.astype(np.int16, copy=False), kind="stable")
    return np.argsort(codes, kind="stable")


def group_runs(codes: np.ndarray, groups: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Records grouped by their group code (``codes`` in ``[0, groups)``), each group's
    records in their order: ``(order, sorted codes, sizes, starts, pos)``, where
    ``order`` sorts the records by group stably, ``sizes``/``starts`` are each group's run
    in that order and ``pos`` each sorted record's place in its run."""
    order = stable_order(codes, groups)
    sizes = np.bincount(codes, minlength=groups)
    starts = np.zeros(groups, dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    pos = np.arange(codes.size) - np.repeat(starts, sizes)
    return order, codes[order], sizes, starts, pos


def encode_columnar_frame(batch: ColumnBatch, timestamps: np.ndarray,
                          key_groups: np.ndarray | None, event_wire: Any,
                          key_column: str | None, pack: Callable[[Any], bytes]) -> bytes:
    """A columnar frame (see the module doc); ``event_wire`` is the event already in its
    wire list form (or None), ``pack`` the msgpack encoder of events."""
    import pyarrow as pa
    data = batch.data
    cols = [*data.columns, pa.array(timestamps, type=pa.int64())]
    names = [*data.schema.names, TS_COLUMN]
    if key_groups is not None:
        cols.append(pa.array(key_groups, type=pa.int32()))
        names.append(KG_COLUMN)
    rb = pa.RecordBatch.from_arrays(cols, names=names)
    rb = rb.replace_schema_metadata({_META: pack([event_wire, key_column])})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rb.schema) as w:
        w.write_batch(rb)
    return sink.getvalue().to_pybytes()


def decode_columnar_frame(data: bytes, unpack: Callable[[bytes], Any]
                          ) -> tuple[ColumnBatch, np.ndarray, pa.Array | None,
                                     np.ndarray | None, Any]:
    """``(batch, timestamps, keys, key_groups, event wire list or None)`` of a columnar
    frame."""
    import pyarrow as pa
    with pa.ipc.open_stream(pa.py_buffer(data)) as r:
        rb = r.read_next_batch()
    meta = rb.schema.metadata or {}
    event_wire, key_column = unpack(meta[_META]) if _META in meta else (None, None)
    names = rb.schema.names
    ts = rb.column(names.index(TS_COLUMN)).to_numpy()
    kgs = None
    drop = [TS_COLUMN]
    if KG_COLUMN in names:
        kgs = rb.column(names.index(KG_COLUMN)).to_numpy()
        drop.append(KG_COLUMN)
    keep = [i for i, n in enumerate(names) if n not in drop]
    body = pa.RecordBatch.from_arrays([rb.column(i) for i in keep],
                                      names=[names[i] for i in keep])
    keys = body.column(key_column) if key_column is not None else None
    return ColumnBatch(body), ts, keys, kgs, event_wire


# ---------------------------------------------------------------- batch formats (map_batches)

BATCH_FORMATS = ("pyarrow", "numpy", "pandas")


def to_format(batch: ColumnBatch, batch_format: str) -> Any:
    """The batch as ``map_batches`` hands it to the user function: a ``pyarrow.Table``,
    a dict of numpy arrays, or a pandas DataFrame (pandas must be installed)."""
    import pyarrow as pa
    if batch_format == "pyarrow":
        return pa.Table.from_batches([batch.data])
    if batch_format == "numpy":
        return {n: c.to_numpy(zero_copy_only=False)
                for n, c in zip(batch.names, batch.data.columns, strict=True)}
    if batch_format == "pandas":
        try:
            import pandas  # noqa: F401
        except ImportError:
            raise ColumnarError("map_batches(batch_format='pandas') needs pandas, which is not "
                                "installed: pip install pandas, or use 'pyarrow' or "
                                "'numpy'") from None
        return batch.data.to_pandas()
    raise ColumnarError(f"batch_format must be one of {BATCH_FORMATS}; got {batch_format!r}")


register_columnar_frames(ColumnarFrameCodec(encode_columnar_frame, decode_columnar_frame))
