"""Keyed state: the per-key-group backend and the state handles users get
(``keyed``: ``ValueState``, ``ListState``, ``MapState``, ``ReducingState``), dense numeric
tables for the vectorised aggregates (``dense``), and the msgpack codecs state and messages
are encoded with (``engine.wire.codec``).

May import: ``engine.errors``, ``engine.names``, ``engine.wire``."""
