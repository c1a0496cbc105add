"""Sources and sinks: partitioned sources with resume positions (``sources``), sinks and
their delivery guarantees (``sinks``), and the sources and sinks tests use (``testing``:
``TestingSource`` with its gates, ``TestingSink``).

May import: ``engine.errors``, ``engine.names``, ``engine.time.event_time``, ``engine.wire``,
``engine.observability.latency``, ``engine.columnar.batches`` (lazily)."""
