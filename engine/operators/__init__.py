"""What runs on records: the user function interfaces (``functions``:
``KeyedProcessFunction``, ``Context``), the built-in operators (``builtin``: map, filter,
flat_map, reduce, process, sinks), windows (``windows``, ``window_aggregates``) and operator
chaining (``chain``).

May import: ``engine.errors``, ``engine.names``, ``engine.dataflow``, ``engine.state.keyed``,
``engine.time.event_time``, ``engine.io``, ``engine.columnar.batches``."""
