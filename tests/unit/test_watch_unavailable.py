"""``engine.runtime.watch.Watch.poll``: a task whose metrics call fails with Ray's
``ActorUnavailableError`` (the actor cannot be reached for now: its node's connection broke,
it is restarting) is silent, not dead; one whose call fails with ``ActorDiedError`` is
returned as dead. Before this, both were read as a death and the job failed over a
transient network blip. The handles are plain objects whose ``metrics.remote()`` is a
coroutine: what ``poll`` awaits of a Ray actor handle."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from ray.exceptions import ActorDiedError, ActorUnavailableError

from engine.dataflow.config import JobConfig
from engine.observability.metrics import JobCollector, TaskMetrics
from engine.runtime.deadlines import Deadlines
from engine.runtime.failures import actor_gone
from engine.runtime.watch import Watch
from engine.time.clock import ManualClock
from engine.wire.messages import encode_message

TASKS = ("j/op/0/g0", "j/op/1/g0", "j/op/2/g0")


def _handle(result: Any) -> Any:
    async def remote() -> Any:
        if isinstance(result, BaseException):
            raise result
        return result
    return SimpleNamespace(metrics=SimpleNamespace(remote=remote))


def _metrics(i: int) -> bytes:
    return encode_message(TaskMetrics(
        task=TASKS[i], vertex="op", task_index=i, status="running", records_in=1,
        records_out=1, bytes_in=0, bytes_out=0, useful_seconds=0.0, idle_seconds=0.0,
        backpressured_seconds=0.0, queued_frames=0, state_bytes=0, key_groups=0,
        dead_letters=0, latency=None, watermark=0))


class Port:
    def __init__(self, handles: dict[str, Any]) -> None:
        self.clock = ManualClock()
        self.collector = JobCollector("j", self.clock.monotonic)
        self.deadlines = Deadlines.defaults()
        self.config = JobConfig(metrics_port=None)
        self.handles = handles
        self.dep = SimpleNamespace(tasks={"op": list(TASKS)}, task_names=lambda: list(TASKS))


def _poll(handles: dict[str, Any]) -> tuple[Watch, list[tuple[str, BaseException]]]:
    w = Watch(Port(handles))  # type: ignore[arg-type]
    return w, asyncio.run(w.poll())


def test_an_unavailable_actor_is_silent_and_a_dead_one_dead():
    died_exc = ActorDiedError()
    w, died = _poll({TASKS[0]: _handle(_metrics(0)),
                     TASKS[1]: _handle(ActorUnavailableError("connection lost", None)),
                     TASKS[2]: _handle(died_exc)})
    assert died == [(TASKS[2], died_exc)]
    assert [t for t, _ in w.health.unresponsive()] == [TASKS[1]]
    assert set(w.port.collector.tasks) == {TASKS[0]}


def test_actor_gone_tells_death_from_unavailability():
    assert actor_gone(ActorDiedError())
    assert not actor_gone(ActorUnavailableError("x", None))
    assert not actor_gone(None) and not actor_gone(ValueError("x"))
