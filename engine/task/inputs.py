"""A task's input channels and which one it reads next: ``InputSet`` (pure).

Why apart from the core: which channel may be read now is a concern of its own (Flink's
input gate): a channel is skipped while a token blocks it (a migration's alignment, a source
rescale, a per-key order marker), while a barrier aligner blocks it (checkpoints, change of
logic), or while the frame it left unfinished (its head) cannot go on; the others are read
round-robin. The task core (``engine.task.core``) processes what this set hands it.

Format: ``channels`` (channel id -> ``InputChannel``), ``heads`` (channel id -> the frame
left unfinished, ``PartialFrame``), ``blocked`` (channel id -> the tokens blocking it).

Guarantees: a channel with a head is read from its head, never from its queue, so each
channel's frames are processed in order; a channel with queued, pending or unfinished frames
is never closed.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from engine.errors import TaskControlError
from engine.task.channel import InputChannel
from engine.task.migration_hooks import PartialFrame


class InputSet:
    """The input channels of task ``task`` (see the module doc). ``max_ahead``: how far
    ahead of the next expected frame a frame may arrive (``InputChannel``); ``aligning``:
    whether a barrier aligner blocks a channel; ``can_progress``: whether a head may go on
    now."""

    def __init__(self, task: str, max_ahead: int, aligning: Callable[[int], bool],
                 can_progress: Callable[[int, PartialFrame], bool]) -> None:
        self.task = task
        self.channels: dict[int, InputChannel] = {}
        self.heads: dict[int, PartialFrame] = {}
        self.blocked: dict[int, set[Hashable]] = {}
        self._max_ahead = max_ahead
        self._aligning = aligning
        self._can_progress = can_progress
        self._order: list[int] = []
        self._rr = 0

    def receive(self, channel_id: int, seq: int, payload: bytes) -> None:
        """A frame arrived on ``channel_id`` (``TaskControlError``: no such channel)."""
        ch = self.channels.get(channel_id)
        if ch is None:
            raise TaskControlError(f"task {self.task} has no input channel {channel_id}; the "
                                   "sender's outputs and this task's inputs disagree")
        ch.offer(seq, payload)

    def queued_frames(self) -> int:
        return sum(len(c.queue) for c in self.channels.values()) + len(self.heads)

    def next(self, peek: bool = False) -> InputChannel | None:
        """The next channel that can go on (round-robin), or None; ``peek``: do not move
        the round-robin position."""
        order = self._order
        n = len(order)
        for i in range(n):
            cid = order[(self._rr + i) % n]
            if cid in self.blocked or self._aligning(cid):
                continue
            head = self.heads.get(cid)
            if (head is not None and self._can_progress(cid, head)) or (
                head is None and self.channels[cid].queue
            ):
                if not peek:
                    self._rr = (self._rr + i + 1) % n
                return self.channels[cid]
        return None

    def connect(self, wanted: dict[int, int]) -> None:
        """Read exactly the channels ``wanted`` (channel id -> input port) from now on."""
        for cid in list(self.channels):
            if cid not in wanted:
                if self.channels[cid].queue or self.channels[cid].pending:
                    raise TaskControlError(f"task {self.task}: removing input {cid} with "
                                           "queued frames; drain the channel before "
                                           "reconnecting")
                del self.channels[cid]
        for cid, port in wanted.items():
            if cid not in self.channels:
                self.channels[cid] = InputChannel(cid, port, self._max_ahead)
        self._order = sorted(self.channels)
        self._rr = 0

    def add(self, channel_id: int, port: int) -> bool:
        """Open a channel; False when it is open already."""
        if channel_id in self.channels:
            return False
        self.channels[channel_id] = InputChannel(channel_id, port, self._max_ahead)
        self._order = sorted(self.channels)
        return True

    def remove_if_idle(self, channel_id: int) -> bool:
        """Close a channel with nothing queued, pending or unfinished; False otherwise."""
        ch = self.channels.get(channel_id)
        if ch is None or ch.queue or ch.pending or channel_id in self.heads:
            return False
        del self.channels[channel_id]
        self._order = sorted(self.channels)
        self._rr = 0
        return True

    def readable(self, channel_id: int) -> bool:
        """Whether ``channel_id`` may be read now: no token and no barrier aligner blocks it."""
        return channel_id not in self.blocked and not self._aligning(channel_id)

    def block(self, channel_id: int, token: Hashable) -> None:
        """Do not read ``channel_id`` until ``token`` is lifted."""
        self.blocked.setdefault(channel_id, set()).add(token)

    def unblock(self, token: Hashable) -> None:
        """Lift ``token`` from every channel; a channel is read again once none is left."""
        for cid in [c for c, tokens in self.blocked.items() if token in tokens]:
            tokens = self.blocked[cid]
            tokens.discard(token)
            if not tokens:
                del self.blocked[cid]

    def describe(self, aligner_blocked: Callable[[int], bool]) -> str:
        """Each channel: queued frames, ended, blocked, unfinished head."""
        return " ".join(
            f"{cid}:{len(c.queue)}q{'/ended' if c.ended else ''}"
            f"{'/blocked' if cid in self.blocked or aligner_blocked(cid) else ''}"
            f"{'/head' if cid in self.heads else ''}" for cid, c in self.channels.items())
