"""The job as a definition: the logical graph a user builds (``graph``), its validated
configuration (``config``, ``restart``, ``guarantees``), the physical plan derived from it
(``physical``: vertices, edges, parallelism, forward groups), the key groups and their
assignment to tasks (``keygroups``) and which tasks exist and how they are wired
(``deployment``). Frozen values and pure functions; nothing here runs a record.

May import: ``engine.errors``, ``engine.names``, ``engine.wire`` (message types),
``engine.io`` (source partitions)."""
