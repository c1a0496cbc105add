"""What a task core answers to a control message: the reply and what its shell must do.

Why a value: the task core (``engine.task.core``) is sans-IO, but some messages need the
shell (``engine.runtime.task_actor``) to act before it answers: wait until every frame a
stop queued was acknowledged, start the task's loop, read a checkpoint's key groups from the
store, wait for the holders of replicas. The handler that knows the message says so in its
``Reply``; the shell carries out ``Reply.effects`` and never looks at the message's type, so
a new message cannot be forgotten there.

Format: ``Reply(message, effects, then)``. ``message`` is the wire message the control call
returns; ``effects`` an ``Effects`` (``NO_EFFECTS`` for most); ``then``, when set, completes
the reply from the answers to the priority messages the call queued (the shell sends each as
its own call, waits for every answer, and returns ``then(answers)`` instead of ``message``).

``dispatch_table`` merges the handler tables of a task's parts (the core and its
participants), each message type to one handler.

Guarantees: ``Effects`` is validated (settling implies sending everything first;
``InternalError`` otherwise); a reply
with no effects is the common case and costs nothing beyond the value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from engine.errors import InternalError, TaskControlError
from engine.wire.messages import Ack, RestoreState


@dataclass(frozen=True, slots=True)
class Effects:
    """What the shell does for a control call before it answers.

    ``flush_all``: send every queued frame, waiting for credits. ``settle``: then wait until
    the frames sent on these output channels were acknowledged; ``settle_all``: on every
    channel. ``start_loop``: the task started, run its processing loop (once). ``restore``:
    read these key groups and transactions from the store (off the loop), give the core the
    messages they make (``engine.checkpoints.snapshot.restore_messages``) and answer.
    ``close_outputs``: after all that, close the task's data connections (it stopped:
    nothing more is sent on them)."""

    flush_all: bool = False
    settle: frozenset[int] = frozenset()
    settle_all: bool = False
    start_loop: bool = False
    restore: RestoreState | None = None
    close_outputs: bool = False

    def __post_init__(self) -> None:
        if (self.settle or self.settle_all) and not self.flush_all:
            raise InternalError("a reply that settles output channels must flush them first "
                             "(flush_all): frames still queued would never be acknowledged")


NO_EFFECTS = Effects()


@dataclass(frozen=True, slots=True)
class Reply:
    """A control message's answer (``message``) with what the shell must do first
    (``effects``) and, for a call whose priority messages must be answered before it
    completes, how their answers complete it (``then``)."""

    message: Any
    effects: Effects = NO_EFFECTS
    then: Callable[[Sequence[Any]], Any] | None = None


ACK = Reply(Ack())

H = TypeVar("H")


def dispatch_table(task: str, *parts: Mapping[type, H]) -> dict[type, H]:
    """One table of handlers by message type from the tables of a task's parts; a type two
    parts register is refused (``TaskControlError``): one of them would never be called."""
    table: dict[type, H] = {}
    for part in parts:
        for kind, handler in part.items():
            if kind in table:
                raise TaskControlError(f"task {task}: two parts of the task take "
                                       f"{kind.__name__}; each message type has one handler")
            table[kind] = handler
    return table
