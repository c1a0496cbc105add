"""Checkpoints and savepoints: what they hold (``metadata``), where they live (``store``),
who decides when one is complete (``coordinator``) and how a job is deployed from one
(``restore``). The runtime (``engine.runtime.checkpointing``, ``engine.runtime.recovery``)
executes these; nothing here applies Ray.

May import: ``engine.errors``, ``engine.names``, ``engine.wire``, ``engine.time``,
``engine.dataflow``, ``engine.operators`` (the names of a chain's state writers)."""

from engine.checkpoints.metadata import CheckpointKind, CheckpointMetadata
from engine.checkpoints.store import complete_checkpoints, read_metadata, resolve

__all__ = ["CheckpointKind", "CheckpointMetadata", "complete_checkpoints", "read_metadata",
           "resolve"]
