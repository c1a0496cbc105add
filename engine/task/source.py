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
again), so downstream watermarks may advance without this source.
"""

from __future__ import annotations

from typing import Any

from engine.dataflow import graph as g
from engine.io.sources import PartitionedReader, SourceBatch
from engine.time.clock import Clock
from engine.time.event_time import MIN_WATERMARK
from engine.wire.messages import ChannelIdle, Watermark


class SourceDriver:
    """The reading of source task with head operator ``head`` (see the module doc)."""

    def __init__(self, head: g.OperatorDef, clock: Clock) -> None:
        self.fn = head.fn
        self.clock = clock
        self.strategy = head.watermarks  # None: no event-time watermarks
        self.reader: PartitionedReader | None = None
        self._max_ts = MIN_WATERMARK
        self._last_emit = clock.monotonic()
        self._idle = False

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
        """How long the loop may wait before polling again (1 s before ``start``)."""
        return 1.0 if self.reader is None else self.reader.seconds_until_ready()
