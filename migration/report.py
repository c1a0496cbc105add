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
    ``phases`` are ``(name, seconds)`` pairs in execution order (stop-restart).
    DRRS adds: ``first_subscale_at``; ``rerouted_records`` by old owners;
    ``suspended_s``, the longest cumulative time a new owner had records waiting and nothing
    processable; ``propagation_delay_s``, mean time from injection at the predecessors to
    the first barrier at the old owner; ``subscales`` as ``(id, start offset from the
    request, duration)``; ``superseded`` when a newer request for the operator cut it short.
    Live protocols add ``planning_reason`` (how the moving groups were ordered and grouped,
    and why, for the adaptive strategy) and ``steps`` (steps run in sequence; 1 for drrs).
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
    first_subscale_at: float = 0.0
    rerouted_records: int = 0
    suspended_s: float = 0.0
    propagation_delay_s: float = 0.0
    subscales: tuple[tuple[int, float, float], ...] = ()
    superseded: bool = False
    planning_reason: str = ""
    steps: int = 0
