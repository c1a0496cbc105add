"""Where the task core meets its migration participant: ``MigrationHooks`` (what the core
asks of it), ``NoMigration`` (a core without one) and ``PartialFrame`` (a frame the
participant could not finish at once).

Why here: the core never imports ``migration``; ``migration.participant`` implements these
hooks and reaches the core only through its ``TaskHost`` (see that module). The layering is
engine core -> ``engine.task`` -> ``migration`` -> runtime.

Guarantees: a frame the participant left waiting (``step_frame`` returned False) is
continued (``can_progress``) before anything else of its channel.
"""

from __future__ import annotations

from typing import Any, Protocol

from engine.columnar.batches import ColumnBatch, as_rows
from engine.errors import TaskControlError
from engine.task.channel import InputChannel
from engine.task.reply import Reply


class PartialFrame:
    """A frame taken from a channel but not fully processed (records waiting for their
    group's state, or an event waiting behind set-aside records); ``pos``: the next record."""

    __slots__ = ("values", "timestamps", "keys", "kgs", "ports", "event", "pos")

    def __init__(self, frame: Any) -> None:
        if type(frame.values) is ColumnBatch:  # a migration handles records one by one
            self.values, self.timestamps = as_rows(frame.values, frame.timestamps)
            self.keys = None if frame.keys is None else frame.keys.to_pylist()
            self.kgs = None if frame.key_groups is None else frame.key_groups.tolist()
        else:
            self.values = frame.values
            self.timestamps = frame.timestamps
            self.keys = frame.keys
            self.kgs = frame.key_groups
        self.ports = frame.ports
        self.event = frame.event
        self.pos = 0


class MigrationHooks(Protocol):
    """What the core asks of its migration participant, and all it asks. ``step_frame`` is
    called only while ``active`` or for a frame with per-record ports, ``can_progress`` only
    for a frame ``step_frame`` left waiting, ``control``/``on_event`` only for messages and
    events the core and its other participants do not know."""

    @property
    def active(self) -> bool:
        """A migration runs through the task: frames take ``step_frame``; it may not finish."""

    def control(self, msg: Any) -> Reply:
        """Carry out a control message, return the reply with its effects
        (``TaskControlError`` if unknown)."""

    def on_event(self, ch: InputChannel, event: Any) -> None:
        """A channel event the core does not know (migration barriers)."""

    def step_frame(self, ch: InputChannel, frame: PartialFrame) -> bool:
        """Process what may be processed of the frame now (advancing ``frame.pos``); True
        when its event may follow at once, False when it must wait (the core parks it)."""

    def can_progress(self, channel_id: int, frame: PartialFrame) -> bool:
        """Whether a parked frame of ``channel_id`` can go on now."""

    def user_watermark(self, watermark: int) -> int:
        """The watermark user code sees for the current key group, given the task's."""

    def describe(self) -> list[str]:
        """Where this task's migrations stand, for a stuck rescale's error."""


class NoMigration:
    """The hooks of a core with no participant: no migration ever runs through it, so it
    takes stop-restart only and refuses every migration message."""

    active = False

    def __init__(self, task_name: str) -> None:
        self.task_name = task_name

    def _refuse(self, what: str) -> TaskControlError:
        return TaskControlError(
            f"task {self.task_name}: {what}; this task has no migration participant and "
            "supports stop-restart only (build it with migration.participant.new_task_core)")

    def control(self, msg: Any) -> Reply:
        raise self._refuse(f"unknown control message {msg!r}")

    def on_event(self, ch: InputChannel, event: Any) -> None:
        raise self._refuse(f"unsupported channel event {event!r} on channel {ch.channel_id}")

    def step_frame(self, ch: InputChannel, frame: PartialFrame) -> bool:
        raise self._refuse(f"a re-routed frame (per-record ports) on channel {ch.channel_id}")

    def can_progress(self, channel_id: int, frame: PartialFrame) -> bool:
        return True

    def user_watermark(self, watermark: int) -> int:
        return watermark

    def describe(self) -> list[str]:
        return []
