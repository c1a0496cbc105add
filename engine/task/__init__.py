"""The task: its sans-IO core (``core``: ``TaskCore`` takes records and control messages
and returns what to send, ``spec``: what a task is), its inputs (``inputs``: which channel
to read next; ``channel``: credit-based flow control), a source's reading (``source``), and
its participants, each behind a narrow host interface that ``host.CoreHost`` implements:
checkpoints and two-phase commit (``checkpointing``, with barrier alignment in
``alignment``), change of logic (``logic``), source rescale (``handover``), the task's
channels (``wiring``), the per-key order markers of a live rescale (``group_order``) and,
from ``migration``, live migration (its hooks in ``migration_hooks``). Control messages are
dispatched by type; each handler returns a ``reply.Reply`` saying what the shell must do.
The Ray actor that runs a core is ``engine.runtime.task_actor``.

May import: the engine core (``engine.errors``, ``engine.names``, ``engine.wire``,
``engine.time``, ``engine.dataflow``, ``engine.state``, ``engine.observability``,
``engine.columnar``, ``engine.io``, ``engine.operators``, ``engine.checkpoints``); not
``migration`` (the migration participant reaches the core through ``MigrationHooks``)."""
