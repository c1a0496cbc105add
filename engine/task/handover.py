"""A source rescale at one task: ``SourceHandover`` (partitions move between source tasks).

Why apart from the core: a source rescale moves partitions from old source tasks to new
ones while the job runs. The old task releases its partitions (``ReleaseSource``: stop
reading, end its outputs, answer with its positions and its uncommitted sink output); a
downstream task reads a new source task's channels only once the old channels they replace
have ended (``AddInputs(after=)``). The task core (``engine.task.core``) hands this part
the messages and channel ends; it acts on the task only through ``HandoverHost``.

Format. ``ReleaseSource`` is answered with ``SourceReleased`` (offsets, transactions) and
effects: everything queued is sent and acknowledged before the answer. ``hold(new, old)``
blocks the new channels until every old one delivered its end of stream (``on_end``).

Guarantees: a partition that moves from an old source task to a new one keeps its order at
every downstream task (the old task's records come first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from engine.io.sources import PartitionedReader
from engine.task.inputs import InputSet
from engine.task.reply import ACK, Effects, Reply
from engine.task.spec import FAILED, RUNNING, TaskStatus
from engine.wire.messages import AddInputs, ReleaseSource, SourceReleased

#: stopping: send everything queued and wait until every frame sent was acknowledged
STOPPED_EFFECTS = Effects(flush_all=True, settle_all=True, close_outputs=True)


class HandoverHost(Protocol):
    """What the source handover may use of its task, and all it may (``TaskCore``)."""

    @property
    def name(self) -> str: ...

    @property
    def status(self) -> TaskStatus: ...

    @property
    def reader(self) -> PartitionedReader | None:
        """A source task's reader (None before ``Start`` and for other tasks)."""

    def source_offsets(self) -> dict[str, Any]:
        """``{partition: resume state}`` after the last record emitted."""

    def pause(self) -> None:
        """Read no more input."""

    def stop(self, end_outputs: bool) -> tuple[tuple[str, Any], ...]:
        """Stop the task (ending its outputs); returns the sink output it hands over."""

    def close_writers(self) -> None:
        """Close the task's sink writers (once)."""

    @property
    def inputs(self) -> InputSet: ...

    def add_input(self, channel_id: int, port: int) -> None: ...

    def inputs_changed(self) -> None:
        """The live inputs changed: the barrier aligners follow."""

    def watermark_may_advance(self) -> None:
        """The live inputs changed: the task's watermark follows."""

    def block_channel(self, channel_id: int, token: int) -> None: ...

    def unblock_channels(self, token: int) -> None: ...


class SourceHandover:
    """One task's part of source rescales (see the module doc)."""

    def __init__(self, host: HandoverHost) -> None:
        self.host = host
        # token -> old channels that must end before the new channels it blocks are read;
        # negative tokens: migration blocks channels with subscale ids (>= 0)
        self._waiting: dict[int, set[int]] = {}

    def handlers(self) -> dict[type, Callable[[Any], Reply]]:
        """The control messages this part takes, by type."""
        return {ReleaseSource: self._release, AddInputs: self._add_inputs}

    def _add_inputs(self, msg: AddInputs) -> Reply:
        """Read these channels too; with ``after``, only once those channels ended."""
        host = self.host
        for cid, port in msg.inputs:
            host.add_input(cid, port)
        channels = host.inputs.channels
        old = {c for c in msg.after if c in channels and not channels[c].ended}
        if old and msg.inputs:  # a source rescale: the old channels' records come first
            self.hold([cid for cid, _ in msg.inputs], old)
        host.inputs_changed()
        host.watermark_may_advance()
        return ACK

    def _release(self, msg: ReleaseSource) -> Reply:
        """An old source task: stop reading for good, end the outputs, stop; answer with
        the positions read and the sink output no checkpoint committed."""
        host = self.host
        offsets = host.source_offsets()
        handed: tuple[tuple[str, Any], ...] = ()
        if host.reader is not None:
            host.reader.close()
        if host.status == RUNNING:
            host.pause()
            handed = host.stop(end_outputs=True)
        elif host.status != FAILED:
            host.close_writers()
        return Reply(SourceReleased(host.name, offsets, handed), STOPPED_EFFECTS)

    def hold(self, new: Iterable[int], old: set[int]) -> None:
        """Read the ``new`` channels only once every channel in ``old`` has ended."""
        token = min(self._waiting, default=0) - 1
        self._waiting[token] = old
        for cid in new:
            self.host.block_channel(cid, token)

    def on_end(self, channel_id: int) -> None:
        """An input ended: the new channels waiting for it (and no other) are read now."""
        for token in [t for t, old in self._waiting.items() if channel_id in old]:
            old = self._waiting[token]
            old.discard(channel_id)
            if not old:
                del self._waiting[token]
                self.host.unblock_channels(token)
