"""A source task's reading: ``SourceDriver`` (its partitions' reader and its event-time
watermarks).

Why apart from the core: only a source task reads partitions, and what it keeps for that
(the reader, the newest event time read, when it last read a record) is no other task's
business. The task core (``engine.task.core``) polls the driver, processes the batches it
returns and sends what ``due`` says.

Format: ``poll`` returns the next ``SourceBatch`` (possibly empty: nothing was due) or None
once every partition has ended; ``due`` returns the event to broadcast now, a later
``Watermark`` or ``ChannelIdle``, or None.

Guarantees: a source's watermark is its strategy's watermark for the smallest frontier
over its partitions (a lagging partition holds it back) and never goes back; after
``idle_timeout_ms`` without records the channels are marked idle once (until records come
again), so downstream watermarks may advance without this source. A source that read
everything due (``caught_up``) is polled again no sooner than ``poll_interval_s`` after
that poll (``seconds_until_ready``); one with more to read is polled at once.
"""

from __future__ import annotations

from typing import Any

from engine.dataflow import graph as g
from engine.io.sources import PartitionedReader, SourceBatch
from engine.time.clock import Clock
from engine.time.event_time import MIN_WATERMARK
from engine.wire.messages import ChannelIdle, Watermark

# How long a caught-up source waits at least between two polls (capped by the job's
# ``linger_ms``, see ``poll_interval``).
CAUGHT_UP_POLL_S = 0.001


def poll_interval(linger_ms: float) -> float:
    """A caught-up source's least time between polls, in seconds, for a job whose records
    may wait ``linger_ms`` for their frame: ``CAUGHT_UP_POLL_S``, never more than the
    linger (``linger_ms=0``, no batching delay wanted: poll again at once).

    Why: an open-loop source that polled again as soon as a poll returned read only what
    fell due meanwhile (20,000-35,000 polls a second at 300,000 records/s, ~10 records
    each), and its task spent a whole core on the polls' fixed costs whatever the rate
    (1.0 cores at 300,000 records/s, against 0.33-0.43 with this floor), the core the
    count task and Ray's daemons then waited for on a 2-core machine (issue 32 item 8).
    Records wait in their channel up to the linger anyway; a millisecond more of it makes
    the polls ~50x larger at that rate."""
    return max(0.0, min(CAUGHT_UP_POLL_S, linger_ms / 1000.0))


class SourceDriver:
    """The reading of source task with head operator ``head`` (see the module doc);
    ``poll_interval_s``: a caught-up source's least time between polls
    (``poll_interval``)."""

    def __init__(self, head: g.OperatorDef, clock: Clock,
                 poll_interval_s: float = CAUGHT_UP_POLL_S) -> None:
        self.fn = head.fn
        self.clock = clock
        self.strategy = head.watermarks  # None: no event-time watermarks
        self.reader: PartitionedReader | None = None
        self.poll_interval_s = poll_interval_s
        self._max_ts = MIN_WATERMARK
        self._last_emit = clock.monotonic()
        self._idle = False
        self._polled_at = clock.monotonic()
        self.caught_up = False  # the last poll read less than it asked: all that was due

    def start(self, partitions: Any, retain: bool) -> None:
        """Open the task's partitions (once); ``retain``: keep what a checkpoint that is not
        complete yet may have to re-read (exactly-once sources)."""
        if self.reader is None:
            self.reader = PartitionedReader(self.fn, partitions, self.clock, retain=retain)

    def poll(self, max_records: int) -> SourceBatch | None:
        """The next batch (empty when nothing was due); None once every partition has ended
        (the reader is closed then). Only after ``start``."""
        reader = self.reader
        assert reader is not None, "poll before start"
        batch = reader.poll(max_records)
        self._polled_at = self.clock.monotonic()
        self.caught_up = batch is not None and len(batch.values) < max_records
        if batch is None:
            reader.close()
        elif len(batch.values) and self.strategy is not None:
            self._max_ts = max(self._max_ts, reader.frontier())
            self._last_emit = self.clock.monotonic()
            self._idle = False
        return batch

    def due(self, watermark: int) -> Watermark | ChannelIdle | None:
        """What the task sends now, given its ``watermark``: the watermark of the records
        read so far if later, else ``ChannelIdle`` after ``idle_timeout_ms`` without
        records (once), else nothing."""
        st = self.strategy
        if st is None:
            return None
        wm = st.watermark_for(self._max_ts)
        if wm > watermark:
            return Watermark(wm)
        if (st.idle_timeout_ms is not None and not self._idle
                and (self.clock.monotonic() - self._last_emit) * 1000 >= st.idle_timeout_ms):
            self._idle = True
            return ChannelIdle()
        return None

    def seconds_until_ready(self) -> float:
        """How long the loop may wait before polling again: 1 s before ``start``; after a
        poll that read all that was due (``caught_up``), until the reader's next record and
        at least until ``poll_interval_s`` after that poll; else what the reader says (0
        while records are due)."""
        if self.reader is None:
            return 1.0
        wait = self.reader.seconds_until_ready()
        if self.caught_up:
            wait = max(wait, self._polled_at + self.poll_interval_s - self.clock.monotonic())
        return wait
