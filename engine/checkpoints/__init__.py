"""Checkpoints and savepoints: what they hold (``metadata``), where they live (``store``),
who decides when one is complete (``coordinator``) and how a job is deployed from one
(``restore``); beside them, the durable job record a restarted JobMaster reads
(``durable_record``: the value and its bytes; ``job_store``: where it lives, fenced by
JobMaster epochs). The runtime (``engine.runtime.checkpointing``, ``engine.runtime.recovery``)
executes these; nothing here applies Ray.

May import: ``engine.errors``, ``engine.names``, ``engine.wire``, ``engine.time``,
``engine.dataflow``, ``engine.operators`` (the names of a chain's state writers),
``engine.state`` (merging an incremental checkpoint's chains)."""

from engine.checkpoints.metadata import CheckpointKind, CheckpointMetadata
from engine.checkpoints.store import complete_checkpoints, read_metadata, resolve

__all__ = ["CheckpointKind", "CheckpointMetadata", "complete_checkpoints", "read_metadata",
           "resolve"]
