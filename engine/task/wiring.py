"""How a task's channels are set and changed: ``Wiring`` (``Connect`` and the live changes of
its output channels).

Why apart from the core: a task is wired at deploy (``Connect``: its input channels and its
output edges) and rewired live by rescales (output channels added, removed, or one replaced
by another). What a new receiver must learn at once (the sender's watermark, or that it has
finished) is this part's concern; the task core (``engine.task.core``) only reads its inputs
and writes to its router. Input channels added live are ``engine.task.handover``'s
(``AddInputs``), as they may have to wait for others to end.

Format: ``Connect``, ``AddOutputChannels``, ``RemoveOutputChannels``,
``ReplaceOutputChannel``; each answered with ``Ack``. The removal and the replacement ask the
shell to send everything and wait until the channels that go away acknowledged it all.

Guarantees: a new output channel gets the task's current watermark (when it has one) and, if
the task has finished, its end of stream, before anything else; a channel is removed or
retired only once every frame sent on it was acknowledged (the shell's part).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from engine.task.channel import OutputRouter
from engine.task.inputs import InputSet
from engine.task.reply import ACK, Effects, Reply
from engine.task.spec import FINISHED, TaskStatus
from engine.time.event_time import MIN_WATERMARK
from engine.wire.messages import (
    AddOutputChannels,
    Connect,
    EndOfStream,
    RemoveOutputChannels,
    ReplaceOutputChannel,
    Watermark,
)


class WiringHost(Protocol):
    """What the wiring may use of its task, and all it may (``engine.task.host.CoreHost``)."""

    @property
    def inputs(self) -> InputSet: ...

    @property
    def router(self) -> OutputRouter: ...

    @property
    def status(self) -> TaskStatus: ...

    @property
    def watermark(self) -> int: ...

    def inputs_changed(self) -> None:
        """The live inputs changed: the barrier aligners follow."""

    def watermark_may_advance(self) -> None:
        """The live inputs changed: the task's watermark follows (and may advance)."""


class Wiring:
    """One task's channels as deployed and rewired (see the module doc)."""

    def __init__(self, host: WiringHost) -> None:
        self.host = host

    def handlers(self) -> dict[type, Callable[[Any], Reply]]:
        """The control messages this part takes, by type."""
        return {Connect: self._connect, AddOutputChannels: self._add_outputs,
                RemoveOutputChannels: self._remove_outputs,
                ReplaceOutputChannel: self._replace_output}

    def _connect(self, msg: Connect) -> Reply:
        host, router = self.host, self.host.router
        host.inputs.connect(dict((i, 0) if isinstance(i, int) else i for i in msg.inputs))
        host.inputs_changed()
        before = router.channel_ids()
        router.connect(msg.outputs)
        if host.status == FINISHED:  # new receivers must learn that nothing more comes
            router.send_event_to(router.channel_ids() - before, EndOfStream())
            return ACK
        host.watermark_may_advance()
        if host.watermark > MIN_WATERMARK:  # new channels learn the current watermark
            router.broadcast(Watermark(host.watermark))
        return ACK

    def _add_outputs(self, msg: AddOutputChannels) -> Reply:
        host = self.host
        host.router.add_channels(msg.edge_id, msg.channels)
        new = {c.channel_id for c in msg.channels}
        if host.watermark > MIN_WATERMARK:
            host.router.send_event_to(new, Watermark(host.watermark))
        if host.status == FINISHED:
            host.router.send_event_to(new, EndOfStream())
        return ACK

    def _remove_outputs(self, msg: RemoveOutputChannels) -> Reply:
        self.host.router.remove_channels(set(msg.channel_ids))
        return Reply(ACK.message, Effects(flush_all=True, settle=frozenset(msg.channel_ids)))

    def _replace_output(self, msg: ReplaceOutputChannel) -> Reply:
        self.host.router.replace_channel(msg.retired, msg.replacement)
        # the retired task must take all it was sent before the answer
        return Reply(ACK.message, Effects(flush_all=True, settle=frozenset((msg.retired,))))
