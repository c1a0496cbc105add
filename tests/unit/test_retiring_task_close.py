"""A retiring task's own close is never its receiver's death; a standby a rescale took is
never killed by the pool (no Ray: the decisions and the task shell's settle, on futures).

The defect (CI, about one full run in two; the papers' runs at load 100+): a scale-in's
``StopTask`` reaches task T while T's loop still runs. The stop call settles T's frames
(waits for their acknowledgements), then closes T's data connections. T's loop, woken
meanwhile, saw the task stopped and settled too. Both took frames off the same queues
before their acknowledgements came, so the stop's settle returned while the loop still
waited for a frame, and the stop closed the connection under it: the frame failed with
"data connection to task out1/1 was closed", the loop read that as the receiver's death
and failed T, and the JobMaster failed the job (or, after waiting for a dead task that did
not exist, the next rescale: "phase deploy", its new task killed by the restart).
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest
from ray.exceptions import ActorDiedError, ActorUnavailableError

from engine.errors import ConnectionClosed, ConnectionLost, DownstreamDied, FrameRefused
from engine.runtime.connections import ack_failure
from engine.runtime.health import StandbyPool
from engine.runtime.task_actor import TaskActor
from engine.task.channel import CreditGate
from engine.task.spec import FAILED, FINISHED, RUNNING, STOPPED

CLOSED = "data connection to task j/out1/1/g0 was closed by this task"


# ------------------------------------------------------------------ the classification


@pytest.mark.parametrize("status", [STOPPED, FINISHED, FAILED])
def test_a_task_that_no_longer_runs_does_not_read_its_own_close_as_a_death(status):
    assert ack_failure(ConnectionClosed(CLOSED), running=status == RUNNING) is None


def test_a_running_task_that_closed_a_connection_under_its_frames_lost_them():
    died = ack_failure(ConnectionClosed(CLOSED), running=True)
    assert isinstance(died, DownstreamDied) and "j/out1/1/g0" in str(died)


@pytest.mark.parametrize("running", [True, False])
@pytest.mark.parametrize("exc", [
    ConnectionLost("data connection to task j/out1/1/g0 lost: IncompleteReadError: ..."),
    FrameRefused("task j/out1/1/g0 refused frame 3 of channel 7: unknown channel"),
    ActorDiedError(),
], ids=["lost", "refused", "actor-died"])
def test_a_receiver_that_went_away_or_refused_is_a_death_whatever_the_sender_does(exc, running):
    assert isinstance(ack_failure(exc, running), DownstreamDied)


# ------------------------------------------------------------------ the shell's settle


def _actor(status: str, in_flight: dict[int, list[asyncio.Future[None]]]) -> TaskActor:
    """A task actor's shell with only what settling reads (no core loop, no sockets)."""
    a = TaskActor.__new__(TaskActor)
    a.core = SimpleNamespace(status=status)  # type: ignore[assignment]
    a.gate = CreditGate(8)
    a.in_flight = {}
    for cid, futs in in_flight.items():
        a.in_flight[cid] = deque(futs)
        for _ in futs:
            a.gate.on_send(cid)
    return a


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_a_stop_settles_until_every_frame_is_acknowledged_while_the_loop_settles_too():
    """The stop's settle is waiting for frame 1 of channel 7 when the loop ends and
    settles as well; frame 1's acknowledgement comes, frame 2's and channel 8's do not
    yet. The stop must still be waiting (before: it returned, having left frame 2 to the
    loop, and closed the connection under it). Every frame's credit comes back once."""

    async def go() -> None:
        loop = asyncio.get_running_loop()
        f1, f2, f3 = (loop.create_future() for _ in range(3))
        a = _actor(STOPPED, {7: [f1, f2], 8: [f3]})
        stop = asyncio.ensure_future(a._settle_in_flight())
        await _turns()
        ending_loop = asyncio.ensure_future(a._settle_in_flight())
        await _turns()
        f1.set_result(None)
        await _turns()
        assert not stop.done(), "the stop settled with frames unacknowledged"
        f2.set_result(None)
        await _turns()
        assert not stop.done() and not ending_loop.done()
        f3.set_result(None)
        await asyncio.gather(stop, ending_loop)
        assert a.gate.total_in_flight() == 0
        assert all(not q for q in a.in_flight.values())

    asyncio.run(go())


def test_the_stop_then_its_close_fail_nothing_the_loop_waits_for():
    """The whole sequence: both settle, the stop returns, closes the connection (frames
    still unacknowledged fail with ``ConnectionClosed``, as ``DataClient.close`` does),
    and the loop's settle ends without a death."""

    async def go() -> None:
        loop = asyncio.get_running_loop()
        futs = [loop.create_future() for _ in range(4)]
        a = _actor(STOPPED, {7: futs[:2], 8: futs[2:]})
        stop = asyncio.ensure_future(a._settle_in_flight())
        await _turns()
        ending_loop = asyncio.ensure_future(a._settle_in_flight())
        await _turns()
        for f in futs:  # acknowledged one by one, until the stop's settle returns
            if stop.done():
                break
            f.set_result(None)
            await _turns()
        await stop
        for f in futs:  # close_connections: whatever is left fails as closed here
            if not f.done():
                f.set_exception(ConnectionClosed(CLOSED))
        await ending_loop  # raises DownstreamDied before the fix

    asyncio.run(go())


def test_a_frame_failed_by_the_stopped_tasks_own_close_is_not_a_death_but_a_lost_one_is():
    async def settle(status: str, exc: BaseException) -> None:
        f = asyncio.get_running_loop().create_future()
        f.set_exception(exc)
        a = _actor(status, {7: [f]})
        await a._settle_in_flight()

    asyncio.run(settle(STOPPED, ConnectionClosed(CLOSED)))
    with pytest.raises(DownstreamDied, match="closed by this task"):
        asyncio.run(settle(RUNNING, ConnectionClosed(CLOSED)))
    with pytest.raises(DownstreamDied, match="lost"):
        asyncio.run(settle(STOPPED, ConnectionLost("data connection to task x lost: EOF")))


def test_reaping_skips_a_frame_the_stopped_task_closed_and_counts_its_credit():
    async def go() -> None:
        f = asyncio.get_running_loop().create_future()
        f.set_exception(ConnectionClosed(CLOSED))
        a = _actor(STOPPED, {7: [f]})
        a._reap_acks()
        assert a.gate.total_in_flight() == 0 and not a.in_flight[7]
        g = asyncio.get_running_loop().create_future()
        g.set_exception(ConnectionClosed(CLOSED))
        b = _actor(RUNNING, {7: [g]})
        with pytest.raises(DownstreamDied):
            b._reap_acks()

    asyncio.run(go())


# ------------------------------------------------------------------ the standby pool


class ScriptedActors:
    """Actors as names whose pings answer, one by one, what the test scripts: each ping
    waits for its event (when given), then succeeds or raises its error."""

    def __init__(self) -> None:
        self.script: dict[str, list[tuple[asyncio.Event | None, BaseException | None]]] = {}
        self.killed: list[str] = []

    def make(self, name: str) -> str:
        return name

    async def ping(self, actor: str) -> None:
        steps = self.script.get(actor)
        gate, error = steps.pop(0) if steps else (None, None)
        if gate is not None:
            await gate.wait()
        if error is not None:
            raise error

    def kill(self, actor: Any) -> None:
        self.killed.append(actor)


def test_a_standby_taken_while_the_pool_checks_it_is_never_killed_by_the_check():
    """The watch's check pings standby-0; meanwhile a scale-out takes standby-0 (its own
    ping answers) and makes it a task; then the check's ping fails (a transient
    ``ActorUnavailableError`` here). The check must leave the task alone (before: it
    killed the scale-out's new task before it ran) and still drop a dead one it holds."""

    async def go() -> None:
        fake = ScriptedActors()
        pool = StandbyPool("j/standby", 2, fake.make, fake.ping, fake.kill, 1.0)
        pool.fill()
        answer = asyncio.Event()
        fake.script["j/standby-0"] = [(answer, ActorUnavailableError("busy", None)),
                                      (None, None)]
        fake.script["j/standby-1"] = [(answer, ActorDiedError())]
        check = asyncio.ensure_future(pool.check())
        await _turns()
        assert await pool.take() == "j/standby-0"
        answer.set()
        assert await check == 1
        assert fake.killed == ["j/standby-1"] and pool.dropped == ["j/standby-1"]
        assert len(pool) == 0

    asyncio.run(go())
