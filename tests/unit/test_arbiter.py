"""The arbiter (``engine.control.arbiter``): what may run together on a job, decided from
events; the rules the JobMaster applied before (checkpoints vs rescales at subscale
granularity, vertex locks, live vs exclusive rescales, the finish, recovery), and the
shell (``engine.runtime.arbitration``) waking waiters by events, without polling."""

from __future__ import annotations

import asyncio

import pytest

from engine.control.arbiter import Action, ActionKind, Arbiter, Verdict
from engine.runtime.arbitration import Arbitration

CKPT = Action(ActionKind.CHECKPOINT)


def running() -> Arbiter:
    return Arbiter(running_job=True)


def rescale(*vertices: str) -> Action:
    return Action(ActionKind.RESCALE, frozenset(vertices))


def verdicts(a: Arbiter) -> list[tuple[int, Verdict]]:
    return [(d.ticket, d.verdict) for d in a.take_decisions()]


# ---------------------------------------------------------------- checkpoints and rescales
def test_a_checkpoint_runs_at_once_when_no_rescale_changes_the_dataflow():
    a = running()
    assert a.request(CKPT).verdict is Verdict.RUN
    assert not a.settled


def test_a_checkpoint_is_refused_while_the_job_does_not_run():
    a = Arbiter()
    d = a.request(CKPT)
    assert d.verdict is Verdict.REFUSE and "does not run" in d.reason


def test_a_checkpoint_waits_for_a_subscale_in_flight_and_starts_when_it_is_done():
    a = running()
    a.rescale_changes("op", False)  # a subscale was injected
    d = a.request(CKPT)
    assert d.verdict is Verdict.QUEUE and not a.settled  # wanted
    a.rescale_changes("op", True)   # both owners reported it done
    assert verdicts(a) == [(d.ticket, Verdict.RUN)]


def test_a_rescale_that_ended_is_quiet():
    a = running()
    a.rescale_changes("op", False)
    d = a.request(CKPT)
    a.rescale_changes("op", None)
    assert verdicts(a) == [(d.ticket, Verdict.RUN)]


def test_a_rescale_waits_at_the_gate_while_a_checkpoint_is_wanted_or_pending():
    a = running()
    ck = a.request(CKPT)
    assert ck.verdict is Verdict.RUN
    g = a.gate("op")
    assert g.verdict is Verdict.QUEUE
    a.finished(ck.ticket)
    assert verdicts(a) == [(g.ticket, Verdict.RUN)]
    assert a.settled


def test_a_gated_rescale_counts_as_quiet_so_the_wanted_checkpoint_starts():
    # two rescales: one mid-subscale, one at its gate; the checkpoint waits only for the first
    a = running()
    a.rescale_changes("a", False)
    a.rescale_changes("b", True)
    ck = a.request(CKPT)
    assert ck.verdict is Verdict.QUEUE
    g = a.gate("b")
    assert g.verdict is Verdict.QUEUE
    b_changes = a.take_decisions()
    assert b_changes == []  # "a" still changes
    a.rescale_changes("a", True)
    assert verdicts(a) == [(ck.ticket, Verdict.RUN)]
    a.finished(ck.ticket)
    assert verdicts(a) == [(g.ticket, Verdict.RUN)]


def test_a_granted_gate_counts_as_changing_until_the_rescale_says_otherwise():
    # no checkpoint may start between the grant and the change it lets start
    a = running()
    a.rescale_changes("op", True)
    assert a.gate("op").verdict is Verdict.RUN
    d = a.request(CKPT)
    assert d.verdict is Verdict.QUEUE
    a.rescale_changes("op", True)
    assert verdicts(a) == [(d.ticket, Verdict.RUN)]


def test_a_stop_restart_is_never_quiet_but_its_own_savepoint_runs():
    a = running()
    sr = a.request(Action(ActionKind.EXCLUSIVE_RESCALE, stop_restart=True, label="stop-restart"))
    assert sr.verdict is Verdict.RUN
    periodic = a.request(CKPT)
    assert periodic.verdict is Verdict.QUEUE  # wanted: waits for the stop-restart
    own = a.request(Action(ActionKind.CHECKPOINT, exclusive=True))
    assert own.verdict is Verdict.RUN  # does not queue behind the wanted one
    a.finished(own.ticket)
    assert verdicts(a) == []
    a.finished(sr.ticket)
    assert verdicts(a) == [(periodic.ticket, Verdict.RUN)]


def test_a_source_rescale_is_quiet_by_its_phases():
    a = running()
    src = a.request(Action(ActionKind.EXCLUSIVE_RESCALE, label="rescale of source 'src'"))
    assert src.verdict is Verdict.RUN
    a.rescale_changes("src", True)
    assert a.request(CKPT).verdict is Verdict.RUN


def test_checkpoints_run_one_at_a_time_first_come_first_served_gates_between():
    a = running()
    first = a.request(CKPT)
    second = a.request(CKPT)
    assert (first.verdict, second.verdict) == (Verdict.RUN, Verdict.QUEUE)
    g = a.gate("op")
    assert g.verdict is Verdict.QUEUE
    a.finished(first.ticket)
    # the gated rescale goes first (changing now), then the next checkpoint is wanted
    assert verdicts(a) == [(g.ticket, Verdict.RUN)]
    a.rescale_changes("op", True)
    assert verdicts(a) == [(second.ticket, Verdict.RUN)]


def test_the_job_stopping_refuses_waiting_checkpoints_and_gates():
    a = running()
    ck = a.request(CKPT)
    queued = a.request(CKPT)
    g = a.gate("op")
    a.job_running(False)
    out = a.take_decisions()
    assert {(d.ticket, d.verdict) for d in out} == {(queued.ticket, Verdict.REFUSE),
                                                    (g.ticket, Verdict.REFUSE)}
    a.finished(ck.ticket)
    assert a.settled
    assert a.gate("op").verdict is Verdict.REFUSE


# ---------------------------------------------------------------- locks
def test_overlapping_locks_queue_first_come_first_served():
    a = running()
    r1 = a.request(rescale("a", "b"))
    r2 = a.request(Action(ActionKind.CHANGE_LOGIC, frozenset({"b", "c"})))
    r3 = a.request(Action(ActionKind.PLACEMENT, frozenset({"c"})))  # behind r2's "c"
    r4 = a.request(rescale("d"))
    assert [d.verdict for d in (r1, r2, r3, r4)] == [Verdict.RUN, Verdict.QUEUE,
                                                      Verdict.QUEUE, Verdict.RUN]
    a.finished(r1.ticket)
    assert verdicts(a) == [(r2.ticket, Verdict.RUN)]
    a.finished(r2.ticket)
    assert verdicts(a) == [(r3.ticket, Verdict.RUN)]


def test_a_replica_refresh_never_queues_and_skips_a_busy_vertex():
    a = running()
    r = a.request(rescale("op"))
    refresh = Action(ActionKind.REPLICA_REFRESH, frozenset({"op"}))
    assert a.request(refresh).verdict is Verdict.REFUSE
    other = a.request(Action(ActionKind.REPLICA_REFRESH, frozenset({"x"})))
    assert other.verdict is Verdict.RUN
    behind = a.request(rescale("x"))  # waits for the refresh, as on the old lock
    assert behind.verdict is Verdict.QUEUE
    a.finished(other.ticket)
    assert verdicts(a) == [(behind.ticket, Verdict.RUN)]
    a.finished(r.ticket)
    assert a.request(refresh).verdict is Verdict.RUN


def test_a_withdrawn_waiter_holds_nothing():
    a = running()
    r1 = a.request(rescale("a"))
    r2 = a.request(rescale("a", "b"))
    r3 = a.request(rescale("b"))
    assert (r2.verdict, r3.verdict) == (Verdict.QUEUE, Verdict.QUEUE)
    a.withdraw(r2.ticket)
    assert verdicts(a) == [(r3.ticket, Verdict.RUN)]
    a.finished(r1.ticket)
    assert verdicts(a) == []


# ---------------------------------------------------------------- live vs exclusive
def test_live_actions_are_refused_while_an_exclusive_rescale_runs():
    a = running()
    sr = a.request(Action(ActionKind.EXCLUSIVE_RESCALE, stop_restart=True, label="stop-restart"))
    for act in (rescale("a"), Action(ActionKind.PLACEMENT, frozenset({"a"})),
                Action(ActionKind.CHANGE_LOGIC, frozenset({"a"}))):
        d = a.request(act)
        assert d.verdict is Verdict.REFUSE and "stop-restart" in d.reason
    assert a.request(Action(ActionKind.REPLICA_REFRESH, frozenset({"a"}))).verdict is Verdict.RUN
    a.finished(sr.ticket)


def test_an_exclusive_rescale_is_refused_while_a_live_one_runs_and_queues_behind_another():
    a = running()
    live = a.request(Action(ActionKind.CHANGE_LOGIC, frozenset({"a"})))
    d = a.request(Action(ActionKind.EXCLUSIVE_RESCALE, stop_restart=True, label="stop-restart"))
    assert d.verdict is Verdict.REFUSE
    assert d.reason == ("a live rescale is running; a stop-restart needs the job to itself: "
                        "try again after it")
    a.finished(live.ticket)
    first = a.request(Action(ActionKind.EXCLUSIVE_RESCALE, label="rescale of source 's'"))
    second = a.request(Action(ActionKind.EXCLUSIVE_RESCALE, stop_restart=True))
    assert (first.verdict, second.verdict) == (Verdict.RUN, Verdict.QUEUE)
    a.finished(first.ticket)
    assert verdicts(a) == [(second.ticket, Verdict.RUN)]


def test_a_live_rescale_granted_its_locks_is_refused_if_an_exclusive_one_started_meanwhile():
    a = running()
    refresh = a.request(Action(ActionKind.REPLICA_REFRESH, frozenset({"a"})))
    r = a.request(rescale("a"))
    assert r.verdict is Verdict.QUEUE
    sr = a.request(Action(ActionKind.EXCLUSIVE_RESCALE, stop_restart=True))
    assert sr.verdict is Verdict.RUN
    a.finished(refresh.ticket)
    out = a.take_decisions()
    assert [(d.ticket, d.verdict) for d in out] == [(r.ticket, Verdict.REFUSE)]
    assert not a.is_running(ActionKind.RESCALE)


# ---------------------------------------------------------------- finish and recovery
def test_the_finish_waits_for_no_rescale_and_runs_once():
    a = running()
    r = a.request(rescale("a"))
    assert a.rescaling
    assert a.request(Action(ActionKind.FINISH)).verdict is Verdict.REFUSE
    a.finished(r.ticket)
    f = a.request(Action(ActionKind.FINISH))
    assert f.verdict is Verdict.RUN and a.finishing
    assert a.request(Action(ActionKind.FINISH)).verdict is Verdict.REFUSE


def test_recovery_refuses_waiting_checkpoints_and_gates_and_quiets_every_rescale():
    a = running()
    a.rescale_changes("a", False)
    ck = a.request(CKPT)
    g = a.gate("b")
    rec = a.request(Action(ActionKind.RECOVERY))
    assert rec.verdict is Verdict.RUN and a.restarting
    assert {(d.ticket, d.verdict) for d in a.take_decisions()} == {
        (ck.ticket, Verdict.REFUSE), (g.ticket, Verdict.REFUSE)}
    assert a.request(Action(ActionKind.RECOVERY)).verdict is Verdict.REFUSE
    assert a.quiescent()
    a.finished(rec.ticket)
    a.job_running(True)
    assert a.request(CKPT).verdict is Verdict.RUN


def test_actions_are_validated():
    with pytest.raises(ValueError, match="needs vertices"):
        Action(ActionKind.RESCALE)
    with pytest.raises(ValueError, match="holds no vertices"):
        Action(ActionKind.CHECKPOINT, frozenset({"a"}))
    with pytest.raises(ValueError):
        Action("no-such-kind")  # type: ignore[arg-type]
    with pytest.raises(KeyError):
        running().finished(42)


# ---------------------------------------------------------------- the shell: woken by events
def test_the_shell_wakes_a_waiting_checkpoint_when_the_rescale_goes_quiet():
    async def main() -> None:
        arb = Arbitration(running())
        arb.event(lambda c: c.rescale_changes("op", False))
        waiter = asyncio.ensure_future(arb.acquire(CKPT))
        await asyncio.sleep(0)
        assert not waiter.done()
        arb.event(lambda c: c.rescale_changes("op", True))
        d = await waiter
        assert d.verdict is Verdict.RUN
        arb.release(d.ticket)
        assert arb.core.settled

    asyncio.run(main())


def test_a_cancelled_waiter_gives_its_ticket_back():
    async def main() -> None:
        arb = Arbitration(running())
        first = await arb.acquire(rescale("a"))
        waiter = asyncio.ensure_future(arb.acquire(rescale("a")))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        arb.release(first.ticket)
        assert arb.core.running == ()

    asyncio.run(main())


def test_hold_releases_and_raises_the_callers_refusal():
    async def main() -> None:
        arb = Arbitration(running())
        async with arb.hold(rescale("a"), RuntimeError):
            assert arb.core.rescaling
        assert not arb.core.rescaling
        async with arb.hold(Action(ActionKind.EXCLUSIVE_RESCALE, stop_restart=True),
                            RuntimeError):
            with pytest.raises(RuntimeError, match="stop-restart"):
                async with arb.hold(rescale("a"), RuntimeError):
                    pass

    asyncio.run(main())


def test_a_cancelled_gate_waiter_gives_its_place_back():
    async def main() -> None:
        arb = Arbitration(running())
        ck = await arb.acquire(CKPT)
        waiter = asyncio.ensure_future(arb.gate("op"))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        arb.core.withdraw(12345)  # unknown: nothing happens
        arb.release(ck.ticket)
        assert arb.core.settled and arb.core.take_decisions() == []

    asyncio.run(main())


def test_the_stop_restarts_savepoint_queued_behind_a_running_checkpoint_passes_a_wanted_one():
    a = running()
    first = a.request(CKPT)
    sr = a.request(Action(ActionKind.EXCLUSIVE_RESCALE, stop_restart=True))
    periodic = a.request(CKPT)
    own = a.request(Action(ActionKind.CHECKPOINT, exclusive=True))
    assert (first.verdict, sr.verdict, periodic.verdict, own.verdict) == (
        Verdict.RUN, Verdict.RUN, Verdict.QUEUE, Verdict.QUEUE)
    a.finished(first.ticket)
    assert verdicts(a) == [(own.ticket, Verdict.RUN)]  # the periodic one is wanted
    a.finished(own.ticket)
    a.finished(sr.ticket)
    assert verdicts(a) == [(periodic.ticket, Verdict.RUN)]
