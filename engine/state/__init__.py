"""Keyed state: the per-key-group backend and the state handles users get
(``keyed``: ``ValueState``, ``ListState``, ``MapState``, ``ReducingState``), dense numeric
tables for the vectorised aggregates (``dense``), the RocksDB backend (``rocksdb``:
key-group-prefixed keys, one database per task, bounded memory; its timers in that
database, ``rocksdb_timers``), the factory that picks
one from ``JobConfig.state_backend`` (``backends``), incremental checkpoints' delta
blobs and chains (``incremental``) and the RocksDB backend's SST-level ones
(``sst_checkpoints``). A key group moves between tasks and backends as one
blob of encoded entries. State is encoded with the msgpack codecs of
``engine.wire.codec``.

May import: ``engine.errors``, ``engine.names``, ``engine.wire``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.names import lazy_exports

if TYPE_CHECKING:
    from engine.state.keyed import (
        KeyedStateBackend,
        ListState,
        MapState,
        ReducingState,
        ValueState,
    )

# name -> its module, imported on first use: importing the package loads none of its
# modules, so it costs nothing and closes no import cycle; the imports above are the same
# names for type checkers and the layer test (tests/unit/test_public_api.py checks both agree)
_EXPORTS: dict[str, str] = {
    "KeyedStateBackend": "engine.state.keyed",
    "ListState": "engine.state.keyed",
    "MapState": "engine.state.keyed",
    "ReducingState": "engine.state.keyed",
    "ValueState": "engine.state.keyed",
}

__all__ = [
    "KeyedStateBackend",
    "ListState",
    "MapState",
    "ReducingState",
    "ValueState",
]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
