"""The columnar data format: ``ColumnBatch`` (an Arrow record batch with its key column),
vectorised key groups (the stable hash) and Arrow IPC data frames (``batches``). The
operators over columns (``Count``, ``Sum``, ``Mean``, ``map_batches``) are in
``engine.operators.vectorised``; ``ColumnarSource`` is in ``engine.io.sources``.

May import: ``engine.errors``, ``engine.names``, ``engine.wire``, ``engine.dataflow``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.names import lazy_exports

if TYPE_CHECKING:
    from engine.columnar.batches import (
        BATCH_FORMATS,
        KG_COLUMN,
        TS_COLUMN,
        ColumnBatch,
        ColumnKey,
        as_rows,
        to_format,
    )
    from engine.errors import ColumnarError

# name -> its module, imported on first use: importing the package loads none of its
# modules, so it costs nothing and closes no import cycle; the imports above are the same
# names for type checkers and the layer test (tests/unit/test_public_api.py checks both agree)
_EXPORTS: dict[str, str] = {
    "BATCH_FORMATS": "engine.columnar.batches",
    "ColumnBatch": "engine.columnar.batches",
    "ColumnKey": "engine.columnar.batches",
    "KG_COLUMN": "engine.columnar.batches",
    "TS_COLUMN": "engine.columnar.batches",
    "as_rows": "engine.columnar.batches",
    "to_format": "engine.columnar.batches",
    "ColumnarError": "engine.errors",
}

__all__ = [
    "as_rows",
    "BATCH_FORMATS",
    "ColumnarError",
    "ColumnBatch",
    "ColumnKey",
    "KG_COLUMN",
    "to_format",
    "TS_COLUMN",
]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
