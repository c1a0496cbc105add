"""The columnar path: batches of records as Arrow-like columns with their key groups
(``batches``) and vectorised aggregates over them (``vectorised``: ``Count``, ``Sum``,
``Mean``, ...).

May import: ``engine.errors``, ``engine.names``, ``engine.dataflow``, ``engine.state.keyed``,
``engine.time.event_time``, ``engine.io``, ``engine.operators.builtin``."""
