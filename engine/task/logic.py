"""A task's part of a change of logic: ``LogicSwitch`` (Trisk's "assign logic").

Why apart from the core: replacing an operator's function while the job runs is its own
small protocol (stage the function, align the logic barriers, switch between two records,
report); the task core (``engine.task.core``) only hands it the messages and barriers and
the channel changes, and the switch acts on the task only through ``LogicHost`` and the
task's operator chain and output router.

Format. Before the change, the shell stages the new function (``stage``: a keyed function
is opened on the task's state then). Then ``InjectLogicBarrier`` (a predecessor of the
operator's tasks: put ``LogicBarrier(version)`` on these output channels) or ``SwitchLogic``
(a task without inputs: switch now); ``DiscardLogic`` when the change was refused. Reports
``LogicChanged`` once switched.

Guarantees: logic barriers are aligned like checkpoint barriers (``engine.task.alignment``):
on each input channel, records before the barrier saw the old function and records after it
the new one; a channel that delivered the barrier is not read until every live input did
(or ended). The barrier goes no further than the task that switches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from engine.errors import TaskControlError
from engine.operators.chain import OperatorChain
from engine.task.alignment import Aligned, BarrierAligner
from engine.task.channel import OutputRouter
from engine.task.reply import ACK, Reply
from engine.time.clock import Clock
from engine.wire.messages import (
    DiscardLogic,
    InjectLogicBarrier,
    LogicBarrier,
    LogicChanged,
    SwitchLogic,
)


class LogicHost(Protocol):
    """What the logic switch may use of its task, and all it may (``TaskCore``)."""

    @property
    def name(self) -> str: ...

    def function_replaced(self, operator: str, fn: Any) -> None:
        """``operator`` runs ``fn`` from now on (the task's spec follows)."""

    def report(self, msg: Any) -> None:
        """Send ``msg`` to the JobMaster."""


class LogicSwitch:
    """One task's change of logic (see the module doc). ``aligner``: the alignment of logic
    barriers over the task's live inputs (the core does not read a channel it blocks)."""

    def __init__(self, host: LogicHost, chain: OperatorChain, router: OutputRouter,
                 clock: Clock) -> None:
        self.host = host
        self.chain = chain
        self.router = router
        self.aligner = BarrierAligner(clock.monotonic)
        self.is_blocked: Callable[[int], bool] = self.aligner.is_blocked
        self._staged: dict[int, tuple[str, Any]] = {}

    def handlers(self) -> dict[type, Callable[[Any], Reply]]:
        """The control messages this switch takes, by type."""
        return {InjectLogicBarrier: self._inject, SwitchLogic: self._switch,
                DiscardLogic: self._discard}

    def stage(self, version: int, operator: str, fn: Any) -> None:
        """Keep ``fn`` to replace ``operator``'s function at logic barrier ``version``; a
        keyed function is opened now, on this task's state. Raises when the operator is not
        in this task or the function cannot be opened (nothing switched yet)."""
        self.chain.prepare(operator, fn)
        self._staged[version] = (operator, fn)

    # ------------------------------------------------------------ events from the core
    def on_barrier(self, channel_id: int, barrier: LogicBarrier) -> None:
        """A logic barrier arrived on ``channel_id``."""
        self._on_aligned(self.aligner.on_barrier(channel_id, barrier.version))

    def on_end(self, channel_id: int) -> None:
        """An input ended: it counts as aligned."""
        self._on_aligned(self.aligner.on_end(channel_id))

    def set_channels(self, live: Iterable[int]) -> None:
        """The task's live inputs changed."""
        self._on_aligned(self.aligner.set_channels(live))

    # ------------------------------------------------------------ control messages
    def _inject(self, msg: InjectLogicBarrier) -> Reply:
        self.router.send_event_to(set(msg.channel_ids), LogicBarrier(msg.version))
        return ACK

    def _switch(self, msg: SwitchLogic) -> Reply:
        self._on_aligned(self.aligner.trigger(msg.version))
        return ACK

    def _discard(self, msg: DiscardLogic) -> Reply:
        self._staged.pop(msg.version, None)
        if self.aligner.pending == msg.version:
            self.aligner.abort()
        return ACK

    def _on_aligned(self, aligned: Aligned | None) -> None:
        """Every live input delivered logic barrier ``version`` (or the task has none):
        switch to the staged function and report; the barrier goes no further."""
        if aligned is None:
            return
        staged = self._staged.pop(aligned.barrier_id, None)
        if staged is None:
            raise TaskControlError(f"task {self.host.name}: logic barrier "
                                   f"{aligned.barrier_id} aligned, but no function was "
                                   "staged for it")
        operator, fn = staged
        self.chain.switch(operator, fn)
        self.host.function_replaced(operator, fn)
        self.host.report(LogicChanged(self.host.name, operator, aligned.barrier_id,
                                      aligned.alignment_s))
