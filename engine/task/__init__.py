"""The task: its sans-IO core (``core``: ``TaskCore`` takes records and control messages
and returns what to send), its input channels with credit-based flow control
(``channel``), checkpoint barrier alignment (``alignment``) and the per-key order markers of
a live rescale (``group_order``). The Ray actor that runs a core is
``engine.runtime.task_actor``.

May import: the engine core (every subpackage except ``engine.runtime`` and
``engine.control``); not ``migration`` (the migration participant reaches the core
through ``MigrationHooks``)."""
