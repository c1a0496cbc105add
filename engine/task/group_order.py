"""Per-key order across a live migration, at the receivers of the migrating operator.

Why: while key group g moves from old owner s to new owner d, a receiver r downstream gets
g's outputs from s (before g left) and from d (after it arrived) on two channels. Nothing
orders two channels: s's last outputs may still queue at r (or wait for credit at s) when
d's first ones arrive, and r would process them out of order, so a keyed running result
or a window's "last value" downstream would differ from the run without rescaling.

Format: two channel events (``engine.wire.messages``). The old owner sends
``GroupLeft(subscale, key_group)`` on every output channel when it gives g away, behind
all its outputs of g; the new owner sends ``GroupArrived(subscale, key_group)`` on every
output channel when g's state is installed, ahead of all its outputs of g. A receiver that
meets ``GroupArrived`` on a channel reads nothing more from that channel until it has met
the matching ``GroupLeft`` (on another channel); if that came first, it goes on at once.

Guarantees: a receiver processes every output of g that the old owner sent it before any
the new owner sent it, whatever the interleaving. Every receiver applies the markers (a
sink or a stateless task too, so its own output keeps the order), except a task whose
inputs are forward edges: it reads one upstream task, so it relays them to its receivers,
behind its outputs, and the old owner's partner relays only the ``GroupLeft``, the new
owner's only the ``GroupArrived``. Markers are counted per (subscale, key group), one pair
per path. The choice is fixed per task (``TaskSpec.forward_input``), never by how many
channels are open at the moment: a task that changed its mind as a removed task's channel
ended would relay an arrival whose departure it had kept. A ``GroupLeft`` waits at most
``MAX_UNMATCHED`` tokens for its ``GroupArrived`` (the oldest forgotten).
A channel waits only for a ``GroupLeft`` its sender's old-owner counterpart sends it: a
receiver created while the markers were on their way could wait forever, so operators
that exchange records, directly or through stateless operators, never rescale at once
(``engine.runtime.rescaling``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Protocol

from engine.task.channel import InputChannel, OutputRouter
from engine.wire.messages import GroupArrived, GroupLeft, WatermarkHold, WatermarkRelease

Token = tuple[int, int]  # (subscale, key group)


class GroupOrder:
    """A receiver's bookkeeping of ``GroupLeft``/``GroupArrived`` markers (pure)."""

    MAX_UNMATCHED = 65_536

    def __init__(self) -> None:
        self.lefts: OrderedDict[Token, int] = OrderedDict()  # left, not yet arrived
        self.waiting: dict[Token, list[int]] = {}  # arrived first: channels that wait

    def on_arrived(self, token: Token, channel: int) -> bool:
        """``GroupArrived`` met on ``channel``: True when the channel must wait for the
        matching ``GroupLeft`` (block it until ``on_left`` names it)."""
        n = self.lefts.get(token, 0)
        if n:
            if n == 1:
                del self.lefts[token]
            else:
                self.lefts[token] = n - 1
            return False
        self.waiting.setdefault(token, []).append(channel)
        return True

    def on_left(self, token: Token) -> int | None:
        """``GroupLeft`` met: the channel that may be read again, or None (remembered for
        the ``GroupArrived`` to come)."""
        chans = self.waiting.get(token)
        if chans:
            channel = chans.pop(0)
            if not chans:
                del self.waiting[token]
            return channel
        self.lefts[token] = self.lefts.get(token, 0) + 1
        self.lefts.move_to_end(token)
        while len(self.lefts) > self.MAX_UNMATCHED:
            self.lefts.popitem(last=False)
        return None

    def describe(self) -> list[str]:
        return [f"channel {c} waits for group {kg} to leave its old owner (subscale {sid})"
                for (sid, kg), chans in self.waiting.items() for c in chans]


class MarkersHost(Protocol):
    """What ``OrderMarkers`` may use of its task (``engine.task.host.CoreHost``)."""

    @property
    def router(self) -> OutputRouter: ...

    def block_channel(self, channel_id: int, token: Hashable) -> None: ...

    def unblock_channels(self, token: Hashable) -> None: ...

    def hold_watermark(self, token: int, watermark: int) -> None:
        """Keep the task's watermark at or below ``watermark`` until ``token`` is released."""

    def release_watermark(self, token: int) -> None: ...


class OrderMarkers:
    """A receiver's part of a live migration upstream: the order markers (``GroupLeft``,
    ``GroupArrived``, applied through ``order``, or relayed by a task whose inputs are
    forward edges) and the watermark holds (``WatermarkHold``/``WatermarkRelease``, held by
    a keyed task, whose timers fire on time, relayed by the others)."""

    def __init__(self, host: MarkersHost, order: GroupOrder, forward_input: bool,
                 keyed: bool) -> None:
        self.host = host
        self.order = order
        self.relay_markers = forward_input  # one path: the receivers keep the order
        self.relay_holds = not keyed  # nothing here fires on time: the receivers hold

    def events(self) -> dict[type, Callable[[InputChannel, Any], None]]:
        """The channel events this part takes, by type."""
        return {GroupLeft: self._on_marker, GroupArrived: self._on_marker,
                WatermarkHold: self._on_hold, WatermarkRelease: self._on_hold}

    def _on_marker(self, ch: InputChannel, event: GroupLeft | GroupArrived) -> None:
        sid, kg = event.subscale, event.key_group
        if self.relay_markers:
            self.host.router.broadcast(event)
        elif isinstance(event, GroupLeft):
            waiting = self.order.on_left((sid, kg))
            if waiting is not None:
                self.host.unblock_channels(("order", sid, kg, waiting))
        elif self.order.on_arrived((sid, kg), ch.channel_id):
            self.host.block_channel(ch.channel_id, ("order", sid, kg, ch.channel_id))

    def _on_hold(self, ch: InputChannel, event: WatermarkHold | WatermarkRelease) -> None:
        if self.relay_holds:
            self.host.router.broadcast(event)
        elif isinstance(event, WatermarkHold):
            self.host.hold_watermark(event.token, event.watermark)
        else:
            self.host.release_watermark(event.token)
