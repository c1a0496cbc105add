"""Barrier alignment over a task's input channels (pure): ``BarrierAligner``.

Why one class: every barrier that marks a cut through the dataflow (a checkpoint barrier, a
drain before a stop, a change of logic) needs the same thing at a task with several inputs:
the task may act on barrier ``n`` only once every input delivered it, and an input that
delivered it must not be read meanwhile, or records after the cut would be processed
before the cut is complete (Flink's aligned ``CheckpointBarrierHandler``). The aligner
decides; the task core does the reading (it skips the channels in ``blocked``) and acts on
what the aligner returns. Nothing here knows what a barrier means: one aligner per kind.

Format. Channels are input channel ids (ints); barriers are identified by ids that grow
(checkpoint ids, drain epochs). A channel is *live* from ``add_channel`` until
``on_end`` (its end of stream) or ``remove_channel``.

Guarantees:

* ``on_barrier(c, n)`` blocks ``c`` until barrier ``n`` is aligned: every live channel
  delivered it, or ended. Ended channels count as aligned (a task whose other inputs
  ended aligns on the inputs it has), and so does a task with no live input at all.
* Exactly one ``Aligned`` per barrier id that completes; at most one alignment is pending
  at a time. A barrier with a higher id than the pending one aborts the pending one (its
  channels are read again; it is reported in ``Aligned.aborted`` of the next completion
  and in ``aborted``), as Flink subsumes a checkpoint by a newer one; a barrier with an id
  not above the last one seen is stale and ignored (it belongs to an aborted alignment).
* ``trigger(n)`` starts alignment ``n`` without a channel (a barrier injected at the task
  itself, e.g. a task whose inputs have all ended): it completes at once when no live
  channel is left, otherwise when every live channel delivered ``n`` or ended.
* A channel added while an alignment is pending is waited for too: the caller must make
  sure it will deliver the barrier or end.
* ``alignment_s`` of an ``Aligned`` is the time from the first barrier (or trigger) of the
  alignment to its completion, on the injected monotonic clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Aligned:
    """Barrier ``barrier_id`` is aligned: every live input delivered it (or ended). Its
    channels are unblocked. ``alignment_s``: first barrier to last; ``aborted``: ids of
    alignments given up since the previous completion (a newer barrier subsumed them)."""

    barrier_id: int
    alignment_s: float
    aborted: tuple[int, ...] = ()


class BarrierAligner:
    """Aligns one kind of barrier over a set of live input channels (see the module doc).

    ``clock``: monotonic seconds, for ``Aligned.alignment_s``."""

    def __init__(self, clock: Callable[[], float], channels: Iterable[int] = ()) -> None:
        self._clock = clock
        self._live: set[int] = set(channels)
        self._arrived: set[int] = set()
        self.pending: int | None = None
        self.last_seen: int | None = None  # highest barrier id met (pending or done)
        self._started = 0.0
        self.aborted: list[int] = []  # aborted since the last completion

    # -- channels
    @property
    def channels(self) -> frozenset[int]:
        """The live channels."""
        return frozenset(self._live)

    def add_channel(self, channel: int) -> None:
        """A new live input (waited for by a pending alignment too)."""
        self._live.add(channel)

    def remove_channel(self, channel: int) -> Aligned | None:
        """The channel is gone (closed, not ended): stop waiting for it."""
        return self.on_end(channel)

    def set_channels(self, channels: Iterable[int]) -> Aligned | None:
        """Replace the live channels (a task reconnected); a pending alignment stops
        waiting for channels no longer there."""
        new = set(channels)
        self._live = new
        self._arrived &= new
        return self._complete_if_aligned()

    # -- barriers
    def is_blocked(self, channel: int) -> bool:
        """Whether the channel must not be read now (it delivered the pending barrier)."""
        return channel in self._arrived

    @property
    def blocked(self) -> frozenset[int]:
        return frozenset(self._arrived)

    def on_barrier(self, channel: int, barrier_id: int) -> Aligned | None:
        """Barrier ``barrier_id`` arrived on ``channel``; the ``Aligned`` when it was the
        last one missing, else None (the channel is blocked, or the barrier was stale)."""
        if not self._begin(barrier_id):
            return None
        if channel in self._live:
            self._arrived.add(channel)
        return self._complete_if_aligned()

    def trigger(self, barrier_id: int) -> Aligned | None:
        """Start alignment ``barrier_id`` from the task itself (no channel delivered it)."""
        if not self._begin(barrier_id):
            return None
        return self._complete_if_aligned()

    def on_end(self, channel: int) -> Aligned | None:
        """``channel`` ended: it counts as aligned from now on."""
        self._live.discard(channel)
        self._arrived.discard(channel)
        return self._complete_if_aligned()

    def abort(self) -> int | None:
        """Give up the pending alignment (its channels are read again); returns its id."""
        aborted = self.pending
        if aborted is not None:
            self.aborted.append(aborted)
        self.pending = None
        self._arrived.clear()
        return aborted

    # -- internals
    def _begin(self, barrier_id: int) -> bool:
        """Make ``barrier_id`` the pending alignment; False when it is stale."""
        if self.pending == barrier_id:
            return True
        if self.last_seen is not None and barrier_id <= self.last_seen:
            return False
        self.abort()
        self.pending = barrier_id
        self.last_seen = barrier_id
        self._started = self._clock()
        return True

    def _complete_if_aligned(self) -> Aligned | None:
        if self.pending is None or not self._arrived >= self._live:
            return None
        done = Aligned(self.pending, self._clock() - self._started, tuple(self.aborted))
        self.pending = None
        self._arrived.clear()
        self.aborted = []
        return done


__all__ = ["Aligned", "BarrierAligner"]
