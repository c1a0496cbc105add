"""What crosses a process boundary and how: the msgpack codecs with declared types
(``codec``; nothing is ever unpickled from the network), every control and data message
(``messages``) and the framing and authentication of the data connections (``transport``).

May import: ``engine.errors``, ``engine.names``, ``engine.dataflow.config`` (transport
limits), ``engine.columnar.batches`` (columnar frames, imported lazily)."""
