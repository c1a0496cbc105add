"""Declared schemas for the Spark bridges: parsing, conforming Arrow data, records.

A schema is declared once, as a Spark DDL string of flat columns
(``"word STRING NOT NULL, n BIGINT"``), a ``pyspark.sql.types.StructType`` or a
``pyarrow.Schema``, and held as a ``ColumnSchema``: the Arrow schema (what travels and what
is stored) plus the DDL (what Spark is told). Supported column types: STRING, BIGINT/LONG,
INT/INTEGER, SMALLINT/SHORT, TINYINT/BYTE, DOUBLE, FLOAT/REAL, BOOLEAN, BINARY, TIMESTAMP,
TIMESTAMP_NTZ and DATE.

In reflow, a row is a tuple of its columns in declared order, or the bare value when the
schema has one column (as ``ParquetSource`` does). Timestamps are int milliseconds since
the epoch and dates int days since the epoch, so every record is a msgpack value.

Only pyarrow is imported here (no pyspark, no Ray): Ray task actors import this module.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import SchemaError

_SPARK_TO_ARROW: dict[str, Any] = {
    "STRING": pa.string(),
    "BIGINT": pa.int64(),
    "LONG": pa.int64(),
    "INT": pa.int32(),
    "INTEGER": pa.int32(),
    "SMALLINT": pa.int16(),
    "SHORT": pa.int16(),
    "TINYINT": pa.int8(),
    "BYTE": pa.int8(),
    "DOUBLE": pa.float64(),
    "FLOAT": pa.float32(),
    "REAL": pa.float32(),
    "BOOLEAN": pa.bool_(),
    "BOOL": pa.bool_(),
    "BINARY": pa.binary(),
    "TIMESTAMP": pa.timestamp("us", tz="UTC"),
    "TIMESTAMP_LTZ": pa.timestamp("us", tz="UTC"),
    "TIMESTAMP_NTZ": pa.timestamp("us"),
    "DATE": pa.date32(),
}


def _spark_type(t: pa.DataType) -> str:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "STRING"
    if pa.types.is_timestamp(t):
        return "TIMESTAMP" if t.tz is not None else "TIMESTAMP_NTZ"
    names = {
        pa.int64(): "BIGINT", pa.int32(): "INT", pa.int16(): "SMALLINT", pa.int8(): "TINYINT",
        pa.float64(): "DOUBLE", pa.float32(): "FLOAT", pa.bool_(): "BOOLEAN",
        pa.binary(): "BINARY", pa.large_binary(): "BINARY", pa.date32(): "DATE",
    }
    for arrow_type, name in names.items():
        if t.equals(arrow_type):
            return name
    raise ValueError(f"column type {t} is not supported by the reflow Spark bridges; use one of "
                     f"{', '.join(sorted(set(_SPARK_TO_ARROW)))}")


_FIELD = re.compile(
    r"^\s*(?:`(?P<q>[^`]+)`|(?P<n>[A-Za-z_][A-Za-z0-9_]*))\s*:?\s+"
    r"(?P<t>[A-Za-z_]+)(?:\s*\(\s*\d+\s*\))?(?P<nn>\s+NOT\s+NULL)?\s*$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class ColumnSchema:
    """A declared flat schema. ``arrow`` is the Arrow schema (nullability included)."""

    arrow: pa.Schema

    @property
    def names(self) -> list[str]:
        return list(self.arrow.names)

    def ddl(self) -> str:
        """The Spark DDL string, e.g. ``"`word` STRING NOT NULL, `count` BIGINT NOT NULL"``."""
        return ", ".join(
            f"`{f.name}` {_spark_type(f.type)}{'' if f.nullable else ' NOT NULL'}"
            for f in self.arrow
        )

    def to_json(self) -> str:
        return json.dumps({"ddl": self.ddl()})

    @staticmethod
    def from_json(text: str) -> ColumnSchema:
        return parse_schema(json.loads(text)["ddl"])


def parse_schema(schema: Any) -> ColumnSchema:
    """A ``ColumnSchema`` from a DDL string, a pyspark ``StructType``, a ``pyarrow.Schema``
    or a ``ColumnSchema``. Raises ``SchemaError`` naming the offending column."""
    if isinstance(schema, ColumnSchema):
        return schema
    if isinstance(schema, pa.Schema):
        for f in schema:
            _spark_type(f.type)  # validates
        if len(set(schema.names)) != len(schema.names) or not schema.names:
            raise SchemaError(f"schema needs unique column names; got {schema.names}")
        return ColumnSchema(schema)
    if hasattr(schema, "fields") and hasattr(schema, "simpleString"):  # pyspark StructType
        parts = []
        for f in schema.fields:
            parts.append(f"`{f.name}` {f.dataType.simpleString().upper()}"
                         f"{'' if f.nullable else ' NOT NULL'}")
        return parse_schema(", ".join(parts))
    if not isinstance(schema, str):
        raise SchemaError(
            f"schema must be a DDL string, a pyspark StructType or a pyarrow.Schema; got "
            f"{type(schema).__name__}")
    fields = []
    for part in _split_top(schema):
        m = _FIELD.match(part)
        if m is None:
            raise SchemaError(f"cannot parse column {part.strip()!r} of schema {schema!r}; "
                              "expected 'name TYPE [NOT NULL]'")
        name = m.group("q") or m.group("n")
        tname = m.group("t").upper()
        if tname in ("VARCHAR", "CHAR"):
            tname = "STRING"
        if tname not in _SPARK_TO_ARROW:
            raise SchemaError(
                f"column {name!r} has type {m.group('t')!r}, which the reflow Spark bridges do "
                f"not support; use one of {', '.join(sorted(_SPARK_TO_ARROW))}")
        fields.append(pa.field(name, _SPARK_TO_ARROW[tname], nullable=m.group("nn") is None))
    if not fields:
        raise SchemaError("schema has no columns")
    names = [f.name for f in fields]
    if len(set(names)) != len(names):
        raise SchemaError(f"schema has duplicate column names: {names}")
    return ColumnSchema(pa.schema(fields))


def _split_top(ddl: str) -> list[str]:
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in ddl:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur))
    return [p for p in out if p.strip()]


# ----------------------------------------------------------------- conforming Arrow data


@dataclass
class BadRow:
    index: int
    reason: str
    row: str  # the input row as JSON (values that JSON cannot hold as their str())


def _cast_each(col: pa.ChunkedArray | pa.Array, target: pa.DataType) -> tuple[list[Any], dict[int, str]]:
    """Slow path: cast value by value; returns the values (None where impossible) and why."""
    out: list[Any] = []
    errors: dict[int, str] = {}
    src_type = col.type
    for i, v in enumerate(col.to_pylist()):
        if v is None:
            out.append(None)
            continue
        try:
            out.append(pc.cast(pa.array([v], type=src_type), target, safe=True)[0].as_py())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, OverflowError,
                ValueError) as exc:
            out.append(None)
            errors[i] = f"cannot convert {v!r} to {target}: {exc}"
    return out, errors


def conform(data: pa.Table | pa.RecordBatch, schema: ColumnSchema) -> tuple[pa.Table, list[BadRow]]:
    """Rows of ``data`` that fit ``schema`` (cast to it, declared columns only, in order) and
    the rows that do not, each with the reason: a missing column, a value that cannot be
    converted to the declared type, or a null in a NOT NULL column. Extra columns are
    ignored. Never raises for bad rows."""
    table = data if isinstance(data, pa.Table) else pa.Table.from_batches([data])
    n = table.num_rows
    reasons: dict[int, str] = {}
    cols = []
    for field in schema.arrow:
        if field.name not in table.column_names:
            col: Any = pa.nulls(n, field.type)
            for i in range(n):
                reasons.setdefault(i, f"missing column {field.name!r}")
        else:
            col = table.column(field.name)
            if not col.type.equals(field.type):
                try:
                    col = pc.cast(col, field.type, safe=True)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                    values, errors = _cast_each(col, field.type)
                    for i, why in errors.items():
                        reasons.setdefault(i, f"column {field.name!r}: {why}")
                    col = pa.array(values, type=field.type)
        if not field.nullable and col.null_count:
            for i in pc.indices_nonzero(col.is_null()).to_pylist():
                reasons.setdefault(i, f"column {field.name!r} is null but declared NOT NULL")
        cols.append(col)
    out = pa.Table.from_arrays(
        [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in cols],
        schema=pa.schema([f.with_nullable(True) for f in schema.arrow]))
    if not reasons:
        return out.cast(schema.arrow), []
    keep = [i not in reasons for i in range(n)]
    good = out.filter(pa.array(keep)).cast(schema.arrow)
    bad = []
    for i in sorted(reasons):
        row = {k: v for k, v in table.slice(i, 1).to_pylist()[0].items()}
        bad.append(BadRow(i, reasons[i], json.dumps(row, default=str)))
    return good, bad


DEAD_LETTER_SCHEMA = pa.schema([
    pa.field("source", pa.string()),
    pa.field("stream", pa.string()),
    pa.field("batch_id", pa.int64()),
    pa.field("partition", pa.int64()),
    pa.field("reason", pa.string()),
    pa.field("row", pa.string()),
])


def write_dead_letters(directory: str, file_name: str, source: str, stream: str, batch_id: int,
                       partition: int, bad: Sequence[BadRow]) -> None:
    """Write bad rows as one Parquet file (atomically; the same name overwrites, so a replay
    of the same chunk leaves one copy)."""
    import os

    import pyarrow.parquet as pq

    from engine.io.sinks import _atomic_write

    os.makedirs(directory, exist_ok=True)
    table = pa.table({
        "source": [source] * len(bad), "stream": [stream] * len(bad),
        "batch_id": [batch_id] * len(bad), "partition": [partition] * len(bad),
        "reason": [b.reason for b in bad], "row": [b.row for b in bad],
    }, schema=DEAD_LETTER_SCHEMA)
    _atomic_write(os.path.join(directory, file_name), lambda tmp: pq.write_table(table, tmp))


def count_dead_letters(directory: str | None) -> int:
    """Rows in the dead-letter Parquet files of ``directory`` (0 when it does not exist)."""
    import os

    import pyarrow.parquet as pq

    if not directory or not os.path.isdir(directory):
        return 0
    return sum(
        pq.ParquetFile(os.path.join(directory, n)).metadata.num_rows
        for n in os.listdir(directory) if n.endswith(".parquet") and not n.startswith(".")
    )


# ----------------------------------------------------------------- chunks and records


def rechunk(batches: Iterable[pa.RecordBatch | pa.Table], rows: int) -> Iterator[pa.Table]:
    """Re-cut a stream of batches into tables of exactly ``rows`` rows (the last may be
    shorter), so chunk k always holds rows [k*rows, (k+1)*rows) of the stream."""
    pending: list[pa.Table] = []
    have = 0
    for b in batches:
        t = b if isinstance(b, pa.Table) else pa.Table.from_batches([b])
        while t.num_rows:
            take = min(rows - have, t.num_rows)
            pending.append(t.slice(0, take))
            have += take
            t = t.slice(take)
            if have == rows:
                yield pa.concat_tables(pending) if len(pending) > 1 else pending[0]
                pending, have = [], 0
    if have:
        yield pa.concat_tables(pending) if len(pending) > 1 else pending[0]


def to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> pa.Table:
    with pa.ipc.open_stream(pa.py_buffer(data)) as r:
        return r.read_all()


_UNIT_PER_MS = {"s": None, "ms": 1, "us": 1000, "ns": 1_000_000}


def _plain(col: pa.ChunkedArray | pa.Array) -> list[Any]:
    """Column values as msgpack-able Python values (timestamps in ms, dates in days)."""
    t = col.type
    if pa.types.is_timestamp(t):
        raw = pc.cast(col, pa.int64())
        per = _UNIT_PER_MS[t.unit]
        if per is None:
            return pc.multiply(raw, 1000).to_pylist()
        if per == 1:
            return raw.to_pylist()
        return pc.floor(pc.divide(pc.cast(raw, pa.float64()), per)).cast(pa.int64()).to_pylist()
    if pa.types.is_date32(t):
        return pc.cast(col, pa.int32()).to_pylist()
    return col.to_pylist()


def plain_columns(table: pa.Table) -> pa.Table:
    """The table with timestamp columns as int64 ms and date columns as int32 days (what
    ``to_records`` makes of them, vectorised), other columns as they are."""
    cols = []
    for c in table.columns:
        t = c.type
        if pa.types.is_timestamp(t):
            raw = pc.cast(c, pa.int64())
            per = _UNIT_PER_MS[t.unit]
            c = (pc.multiply(raw, 1000) if per is None else raw if per == 1 else
                 pc.floor(pc.divide(pc.cast(raw, pa.float64()), per)).cast(pa.int64()))
        elif pa.types.is_date32(t):
            c = pc.cast(c, pa.int32())
        cols.append(c)
    return pa.Table.from_arrays(cols, names=table.column_names)


def to_records(table: pa.Table) -> list[Any]:
    """Rows as tuples of the columns (bare values for a one-column table)."""
    cols = [_plain(c) for c in table.columns]
    if len(cols) == 1:
        return cols[0]
    return list(zip(*cols, strict=True))


def column_ms(table: pa.Table, name: str) -> list[Any]:
    """A timestamp (or integer ms) column as int ms; None where null."""
    return _plain(table.column(name))


def records_to_table(values: Sequence[Any], schema: ColumnSchema,
                     ) -> tuple[pa.Table, list[tuple[int, Any, str]]]:
    """Records (tuples/lists in column order, dicts by name, or bare values for one column)
    as an Arrow table of ``schema`` (in order), and the records that do not fit as
    ``(index in values, record, reason)``."""
    names = schema.names
    width = len(names)
    bad: dict[int, tuple[Any, str]] = {}
    rows: list[Sequence[Any]] = []
    where: list[int] = []  # index in values of each row
    for i, v in enumerate(values):
        if isinstance(v, (tuple, list)):
            if len(v) != width:
                bad[i] = (v, f"record has {len(v)} fields; the schema has {width} ({names})")
                continue
            rows.append(v)
        elif isinstance(v, dict):
            extra = set(v) - set(names)
            if extra:
                bad[i] = (v, f"record has fields {sorted(map(str, extra))} not in {names}")
                continue
            rows.append([v.get(n) for n in names])
        elif width == 1:
            rows.append((v,))
        else:
            bad[i] = (v, f"a scalar record does not fit the {width} columns {names}")
            continue
        where.append(i)
    reasons: dict[int, str] = {}  # by row number
    arrays = []
    for j, field in enumerate(schema.arrow):
        col = [r[j] for r in rows]
        if pa.types.is_timestamp(field.type):
            col = [_ms_to_unit(x, field.type.unit) if isinstance(x, int) and not isinstance(x, bool)
                   else x for x in col]
        try:
            arr = pa.array(col, type=field.type, from_pandas=False)
        except _CONVERSION_ERRORS:
            good_vals = []
            for k, x in enumerate(col):
                try:
                    pa.array([x], type=field.type)
                    good_vals.append(x)
                except _CONVERSION_ERRORS:
                    good_vals.append(None)
                    reasons.setdefault(k, f"field {field.name!r}: {x!r} is not a {field.type}")
            arr = pa.array(good_vals, type=field.type)
        if not field.nullable and arr.null_count:
            for k in pc.indices_nonzero(arr.is_null()).to_pylist():
                reasons.setdefault(k, f"field {field.name!r} is None but declared NOT NULL")
        arrays.append(arr)
    table = pa.Table.from_arrays(arrays, schema=pa.schema(
        [f.with_nullable(True) for f in schema.arrow]))
    if reasons:
        for k, why in reasons.items():
            bad[where[k]] = (values[where[k]], why)
        table = table.filter(pa.array([k not in reasons for k in range(len(rows))]))
    return table.cast(schema.arrow), [(i, v, why) for i, (v, why) in sorted(bad.items())]


_CONVERSION_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError,
                      OverflowError, TypeError, ValueError)


def _ms_to_unit(ms: int, unit: str) -> int:
    return {"s": ms // 1000, "ms": ms, "us": ms * 1000, "ns": ms * 1_000_000}[unit]
