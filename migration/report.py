"""What a rescale reports back (a wire message, so it crosses actors as msgpack)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.messages import wire


@wire
@dataclass(frozen=True, slots=True)
class RescaleReport:
    """One finished rescale.

    Times are wall-clock seconds. ``duration_s`` runs from the request to the moment the
    job processes again with the new tasks. ``key_groups_moved`` counts groups whose owner
    changed; ``bytes_moved`` counts the encoded state bytes shipped between tasks.
    ``phases`` are ``(name, seconds)`` pairs in execution order.
    """

    operator: str
    protocol: str
    old_parallelism: int
    new_parallelism: int
    requested_at: float
    completed_at: float
    duration_s: float
    key_groups_moved: int
    bytes_moved: int
    phases: tuple[tuple[str, float], ...]
    source_offsets: tuple[tuple[str, object], ...] = ()
