"""What a restart does to each sink: the delivery guarantee of a job's sinks, decided once
when the job is deployed (never on the record path).

Why: a sink that cannot do two-phase commit (``Sink.exactly_once = False``) is silently
at-least-once in a job that checkpoints: a restart from a checkpoint writes again every
record after it. A Flink user reads that off the sink's ``DeliveryGuarantee``; reflow says
it the same way, per sink operator, in a WARNING at ``job.run()`` and in
``JobStatus.sinks``.

The decision (``guarantee_of``), for a sink of a job with these settings:

* checkpoints on: ``exactly-once`` for a two-phase-commit sink, else ``at-least-once``
  (records after the restored checkpoint are written again);
* checkpoints off, restart strategy "fixed-delay": ``at-least-once`` for every sink (a
  restart replays the input from its start, or from the restored savepoint, and what was
  written stays);
* checkpoints off, no restarts: ``at-least-once`` for a sink without two-phase commit when
  the job is restored (what the earlier run wrote after the restored point is written
  again), else ``none`` (Flink's NONE: a failure ends the job; what was written stays,
  nothing is written again).
"""

from __future__ import annotations

from engine.dataflow import graph as g
from engine.dataflow.config import JobConfig
from engine.names import NameEnum
from engine.wire.messages import SinkGuarantee


class DeliveryGuarantee(NameEnum):
    """What a sink holds after a restart (Flink's ``DeliveryGuarantee``)."""

    EXACTLY_ONCE = "exactly-once"
    AT_LEAST_ONCE = "at-least-once"
    NONE = "none"


class SinkRole(NameEnum):
    """Where a sink sits on its operator (``SinkGuarantee.role``)."""

    SINK = "sink"
    DEAD_LETTER = "dead_letter"
    LATE_SINK = "late_sink"


def guarantee_of(two_phase: bool, checkpointing: bool, restarts: bool,
                 restoring: bool) -> tuple[DeliveryGuarantee, str]:
    """The guarantee of a sink (``two_phase``: its class says ``exactly_once``) in a job
    that checkpoints / restarts after a failure / starts from ``restore_from``, with the
    reason (see the module doc)."""
    if checkpointing:
        if two_phase:
            return (DeliveryGuarantee.EXACTLY_ONCE,
                    "two-phase commit: output becomes visible when the checkpoint that "
                    "covers it completes")
        return (DeliveryGuarantee.AT_LEAST_ONCE,
                "no two-phase commit: a restart from a checkpoint writes the records after "
                "that checkpoint again")
    if restarts:
        return (DeliveryGuarantee.AT_LEAST_ONCE,
                "the job does not checkpoint: a restart replays the input from its start "
                "(or the restored savepoint) and what was written stays")
    if restoring and not two_phase:
        return (DeliveryGuarantee.AT_LEAST_ONCE,
                "no two-phase commit: the records the earlier run wrote after the restored "
                "checkpoint are written again")
    return (DeliveryGuarantee.NONE,
            "the job neither checkpoints nor restarts: a failure ends it, what was written "
            "stays")


def sink_guarantees(graph: g.JobGraph, config: JobConfig,
                    restoring: bool) -> tuple[SinkGuarantee, ...]:
    """Every sink of ``graph`` (sink operators, dead-letter and late sinks) with its
    guarantee, in operator order."""
    out: list[SinkGuarantee] = []
    restarts = config.restarts != "none"
    for op in graph.operators:
        for role, sink in ((SinkRole.SINK, op.fn if op.kind == g.SINK else None),
                           (SinkRole.DEAD_LETTER, op.dead_letter),
                           (SinkRole.LATE_SINK, op.late_sink)):
            if sink is None:
                continue
            guarantee, reason = guarantee_of(bool(getattr(sink, "exactly_once", False)),
                                             config.checkpointing, restarts, restoring)
            out.append(SinkGuarantee(op.name, str(role), type(sink).__name__,
                                     str(guarantee), reason))
    return tuple(out)


def at_least_once_warnings(guarantees: tuple[SinkGuarantee, ...]) -> list[str]:
    """One warning per at-least-once sink, naming its operator and what a restart does."""
    return [
        f"sink {s.operator!r}" + ("" if s.role == SinkRole.SINK else f" ({s.role})")
        + f" ({s.sink}) is at-least-once: {s.reason}. Use a sink with two-phase commit "
        "(exactly_once = True, e.g. ParquetSink) or make the consumer deduplicate."
        for s in guarantees if s.guarantee == DeliveryGuarantee.AT_LEAST_ONCE
    ]
