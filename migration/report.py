"""What a rescale reports back (a wire message, so it crosses actors as msgpack).

Why ``summary()``: a rescale can end before its plan did (a newer request superseded it, or
the input ended first), and a one-line print of parallelism, duration and groups moved then
reads as a finished rescale. Every place that prints a report prints ``str(report)``, which
says "cut short" with "moved X of Y planned key groups" whenever that happened.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.wire.messages import wire


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
    ``key_groups_planned``: groups the plan would have moved (more than ``key_groups_moved``
    when the rescale was superseded or cut short by the end of the input).
    ``assignment``: how the target was chosen (``uniform``, ``given`` for an explicit
    rebalance, or a strategy of ``migration.assignment``); with a strategy,
    ``predicted_bytes`` (the state its plan expected to move, by the sizes the tasks
    reported: compare ``bytes_moved``), ``load_ratio`` (max / mean task load it expected)
    and ``assignment_reason``.
    ``protocol`` is what actually ran: a requested protocol, or for an operator without
    key groups ``handover`` (a source) or ``stateless`` (``migration.protocols.LiveMechanism``);
    ``requested_protocol`` is what the request named (set by every live rescale of an
    operator without key groups; "" elsewhere: the same as ``protocol``).
    ``with_partners``: the operator's forward partners (``PhysicalPlan.forward_group``),
    which went from ``old_parallelism`` to ``new_parallelism`` tasks with it, in the same
    rescale (a forward edge joins equal parallelisms); empty when there were none or the
    parallelism did not change.
    ``restarts``: how often the job restarted (from its last checkpoint, or its input's
    start) while the request ran (a task failed); the request then ran again once the job
    ran, so ``old_parallelism`` is
    the operator's when the request came, ``new_parallelism`` its parallelism now, and
    the figures of what moved are the last attempt's.
    ``without``: the DRRS mechanisms the request switched off (the ablation,
    ``migration.protocols.drrs.DrrsMechanism``).
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
    key_groups_planned: int = 0
    assignment: str = ""
    predicted_bytes: int | None = None
    load_ratio: float | None = None
    assignment_reason: str = ""
    requested_protocol: str = ""
    with_partners: tuple[str, ...] = ()
    restarts: int = 0
    without: tuple[str, ...] = ()

    @property
    def cut_short(self) -> bool:
        """True when the rescale ended before its plan did: superseded (by a newer request
        or the end of the input), or fewer groups moved than planned."""
        return self.superseded or self.key_groups_moved < self.key_groups_planned

    def summary(self) -> str:
        """One line for people: protocol, operator, parallelism (and the forward partners
        rescaled with it), duration, groups and bytes moved (and the protocol asked for
        when another one ran). A cut-short rescale says so, with "moved X of Y planned key
        groups" (or that the plan's size is unknown when ``key_groups_planned`` was not
        filled)."""
        proto = (f"{self.protocol} without {', '.join(self.without)}" if self.without
                 else self.protocol)
        head = (f"{proto} rescale of {self.operator!r} "
                f"{self.old_parallelism} -> {self.new_parallelism}")
        if self.with_partners:
            head += (f" with its forward partner{'s' if len(self.with_partners) > 1 else ''} "
                     f"{', '.join(repr(p) for p in self.with_partners)}")
        predicted = ("" if self.predicted_bytes is None else
                     f"; {self.assignment} assignment predicted {self.predicted_bytes} bytes")
        if self.requested_protocol and self.requested_protocol != self.protocol:
            predicted += f" (asked for {self.requested_protocol})"
        if self.restarts:
            predicted += (f"; the job restarted {self.restarts} time"
                          f"{'s' if self.restarts > 1 else ''} during it (a task failed; "
                          f"the request ran again): {self.operator!r} now runs "
                          f"{self.new_parallelism} tasks, and what moved is the last "
                          "attempt's")
        if not self.cut_short:
            return (f"{head} done in {self.duration_s:.2f} s: moved {self.key_groups_moved} "
                    f"key groups ({self.bytes_moved} bytes){predicted}")
        why = ("superseded by a newer request or the end of the input" if self.superseded
               else "fewer groups moved than planned")
        if self.key_groups_planned > 0:
            moved = f"moved {self.key_groups_moved} of {self.key_groups_planned} planned key groups"
        else:
            moved = (f"moved {self.key_groups_moved} key groups (how many were planned was not "
                     "reported)")
        return (f"{head} cut short ({why}) after {self.duration_s:.2f} s: {moved} "
                f"({self.bytes_moved} bytes){predicted}")

    def __str__(self) -> str:
        return self.summary()
