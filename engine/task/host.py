"""The task core as its participants see it: ``CoreHost``.

Why an adapter: each participant (``migration.participant``, ``engine.task.checkpointing``,
``engine.task.logic``, ``engine.task.handover``, ``engine.task.wiring``,
``engine.task.group_order``) may act on its task only through a narrow host interface
(``TaskHost``, ``CheckpointHost``, ``LogicHost``, ``HandoverHost``, ``WiringHost``,
``MarkersHost``). ``CoreHost`` implements all of them over one
``TaskCore``, so the core's own class keeps its data path and life, a participant never
holds the core itself, and what participants may do is listed in one place (Flink's
``SingleCheckpointBarrierHandler.ControllerImpl`` plays this part for its handler states).

Guarantees: every member delegates to the core at once (no state here); this is the only
class besides ``TaskCore`` that uses the core's internal methods.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from engine.dataflow.config import JobConfig
from engine.io.sources import PartitionedReader
from engine.state.keyed import EVENT_TIME, KeyedStateBackend
from engine.task.channel import OutputRouter
from engine.task.inputs import InputSet
from engine.task.spec import FAILED, Record, TaskStatus
from engine.time.clock import Clock

if TYPE_CHECKING:
    from engine.task.core import TaskCore


class CoreHost:
    """What the participants of ``core`` may use of it (see the module doc)."""

    __slots__ = ("core",)

    def __init__(self, core: TaskCore) -> None:
        self.core = core

    # ------------------------------------------------------------ what the task is
    @property
    def name(self) -> str:
        return self.core.name

    @property
    def config(self) -> JobConfig:
        return self.core.spec.config

    @property
    def clock(self) -> Clock:
        return self.core.clock

    @property
    def router(self) -> OutputRouter:
        return self.core.router

    @property
    def inputs(self) -> InputSet:
        return self.core.input_set

    @property
    def backend(self) -> KeyedStateBackend | None:
        return self.core.backend

    @property
    def status(self) -> TaskStatus:
        return self.core.status

    @property
    def reader(self) -> PartitionedReader | None:
        return self.core.reader

    @property
    def watermark(self) -> int:
        return self.core.watermark

    @property
    def suspended_s(self) -> float:
        return self.core.suspended_s

    @property
    def migrating(self) -> bool:
        return self.core.migration.active

    # ------------------------------------------------------------ inputs
    def add_input(self, channel_id: int, port: int) -> None:
        self.core.add_input(channel_id, port)

    def remove_input_if_idle(self, channel_id: int) -> bool:
        if not self.core.input_set.remove_if_idle(channel_id):
            return False
        self.core.inputs_changed()
        return True

    def block_channel(self, channel_id: int, token: Hashable) -> None:
        self.core.input_set.block(channel_id, token)

    def unblock_channels(self, token: Hashable) -> None:
        self.core.input_set.unblock(token)

    def inputs_changed(self) -> None:
        self.core.inputs_changed()

    def watermark_may_advance(self) -> None:
        self.core.watermark_may_advance()

    def hold_watermark(self, token: int, watermark: int) -> None:
        self.core.advance_watermark(self.core.tracker.hold(token, watermark))

    def release_watermark(self, token: int) -> None:
        self.core.advance_watermark(self.core.tracker.release(token))

    # ------------------------------------------------------------ processing
    def run_records(self, records: list[Record]) -> None:
        """Process records in order, in runs of the same port."""
        i, n = 0, len(records)
        while i < n:
            port = records[i][4]
            j = i
            while j < n and records[j][4] == port:
                j += 1
            run = records[i:j]
            keyed = run[0][3] >= 0
            self.core.run([r[0] for r in run], [r[1] for r in run],
                          [r[2] for r in run] if keyed else None,
                          [r[3] for r in run] if keyed else None, port)
            i = j

    def guarded(self, fn: Callable[..., None], *args: Any) -> None:
        self.core.guarded(fn, *args)

    def hold_timers(self, held: Callable[[int], bool]) -> None:
        if self.core.keyed is not None:
            self.core.keyed.hold = held

    def release_timers(self, key_group: int) -> None:
        if self.core.keyed is not None:
            self.core.keyed.release_held(key_group)

    def drop_held_timers(self, key_group: int) -> None:
        if self.core.keyed is not None:
            self.core.keyed.held.pop(key_group, None)

    def fire_event_timers(self) -> None:
        core = self.core
        if core.keyed is not None:
            values, timestamps = core.keyed.fire_timers(core.watermark, EVENT_TIME)
            core.run_rest(values, timestamps)

    # ------------------------------------------------------------ what leaves the task
    def report(self, msg: Any) -> None:
        self.core.report(msg)

    def send_priority(self, target: str, msg: Any) -> None:
        self.core.priority_out.append((target, msg))

    # ------------------------------------------------------------ the task's life
    def check_finish(self) -> None:
        self.core.finish_if_ended()

    def fail(self, operator: str, record: str, cause: str, permanent: bool = False) -> None:
        self.core.fail(operator, record, cause, permanent)

    def pause(self) -> None:
        self.core.paused = True

    def quiesce(self) -> None:
        self.core.paused = self.core.quiet = True

    def stop(self, end_outputs: bool) -> tuple[tuple[str, Any], ...]:
        return self.core.stop(end_outputs)

    def close_writers(self) -> None:
        self.core.checkpoints.close_writers()

    def source_offsets(self) -> dict[str, Any]:
        return self.core.source_offsets()

    def discard(self) -> None:
        """Stop the task as if killed (a restart reuses its process:
        ``engine.runtime.task_actor.TaskActor.recycle``): nothing of it runs, reports or
        snapshots any more and its state backend is closed (a RocksDB one's files
        removed); its sinks' writers are left unclosed (a restart drops their uncommitted
        output)."""
        core = self.core
        core.status = FAILED
        core.reports.clear()
        core.snapshots.clear()
        with contextlib.suppress(Exception):  # a backend a stop closed already
            core.chain.close_state()

    def function_replaced(self, operator: str, fn: Any) -> None:
        core = self.core
        core.spec = dataclasses.replace(core.spec, operators=tuple(
            dataclasses.replace(op, fn=fn) if op.name == operator else op
            for op in core.spec.operators))
