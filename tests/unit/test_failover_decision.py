"""The takeover's decision (``engine.control.failover``): reconcile with live tasks only when
nothing half-done could be lost, else restart from the latest checkpoint."""

from __future__ import annotations

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from engine.control.arbiter import ActionKind
from engine.control.failover import (
    ID_MARGIN,
    RESTART_ACTIONS,
    FailoverDecision,
    FailoverPath,
    TaskAnswer,
    decide_failover,
)
from engine.names import JobState

ALIVE = {"j/src/0/g0": TaskAnswer.RUNNING, "j/sum/0/g0": TaskAnswer.RUNNING,
         "j/sink/0/g0": TaskAnswer.FINISHED}


def test_all_tasks_alive_and_nothing_running_reconciles_keeping_finished_tasks():
    d = decide_failover(JobState.RUNNING, [], ALIVE, latest_checkpoint=4,
                        next_checkpoint_id=6)
    assert d.path == FailoverPath.RECONCILE
    assert d.finished == {"j/sink/0/g0"}
    assert d.next_checkpoint_id == 6 + ID_MARGIN
    # every id the old JobMaster may have started after the latest complete one
    assert d.abort == tuple(range(5, 6 + ID_MARGIN))


def test_a_running_checkpoint_is_aborted_not_a_reason_to_restart():
    d = decide_failover(JobState.RUNNING, [ActionKind.CHECKPOINT], ALIVE, 2, 3)
    assert d.path == FailoverPath.RECONCILE and 3 in d.abort


@pytest.mark.parametrize("action", sorted(RESTART_ACTIONS, key=str))
def test_a_rescale_or_change_of_logic_in_flight_restarts(action):
    d = decide_failover(JobState.RUNNING, [action], ALIVE, 2, 3)
    assert d.path == FailoverPath.RESTART
    assert str(action) in d.reason
    assert not d.abort and not d.finished


def test_a_missing_or_failed_task_restarts_naming_it():
    gone = {**ALIVE, "j/sum/0/g0": TaskAnswer.MISSING}
    d = decide_failover(JobState.RUNNING, [], gone, 0, 1)
    assert d.path == FailoverPath.RESTART and "j/sum/0/g0" in d.reason
    failed = {**ALIVE, "j/src/0/g0": TaskAnswer.FAILED}
    assert "j/src/0/g0" in decide_failover(JobState.RUNNING, [], failed, 0, 1).reason


def test_a_job_restarting_or_deploying_restarts_and_an_ended_one_stays_ended():
    for status in (JobState.RESTARTING, JobState.CREATED):
        assert decide_failover(status, [], ALIVE, 0, 1).path == FailoverPath.RESTART
    for status in (JobState.FINISHED, JobState.FAILED, JobState.STOPPED):
        assert decide_failover(status, [], ALIVE, 0, 1).path == FailoverPath.ENDED


def test_checkpoint_ids_never_go_back_below_a_complete_checkpoint():
    # the record's counter lagged behind a checkpoint that completed
    d = decide_failover(JobState.RUNNING, [], ALIVE, latest_checkpoint=9,
                        next_checkpoint_id=7)
    assert d.next_checkpoint_id == 10 + ID_MARGIN


def test_only_a_reconciled_decision_carries_finished_tasks_or_aborts():
    with pytest.raises(ValueError):
        FailoverDecision(FailoverPath.RESTART, "x", 3, abort=(1,))
    with pytest.raises(ValueError):
        FailoverDecision(FailoverPath.RECONCILE, "x", 0)


answers_st = st.dictionaries(st.text("abc/0123", min_size=1, max_size=6),
                             st.sampled_from(list(TaskAnswer)), max_size=6)


@seed(20261128)
@settings(max_examples=300, deadline=None)
@given(status=st.sampled_from(list(JobState)),
       running=st.lists(st.sampled_from(list(ActionKind)), max_size=3),
       answers=answers_st, latest=st.integers(0, 50), counter=st.integers(1, 60))
def test_reconcile_exactly_when_it_is_safe(status, running, answers, latest, counter):
    print(f"seed 20261128: {status} {running} {answers} {latest} {counter}")
    d = decide_failover(status, running, answers, latest, counter)
    safe = (status == JobState.RUNNING and not set(running) & RESTART_ACTIONS
            and bool(answers)
            and all(a in (TaskAnswer.RUNNING, TaskAnswer.FINISHED) for a in answers.values()))
    if not status.active:
        assert d.path == FailoverPath.ENDED
    else:
        assert (d.path == FailoverPath.RECONCILE) == safe, d
        assert d.next_checkpoint_id > max(latest, counter - 1)
        if d.path == FailoverPath.RECONCILE:
            assert set(d.abort) == set(range(latest + 1, d.next_checkpoint_id))


def test_a_newest_checkpoint_that_does_not_read_back_restarts():
    d = decide_failover(JobState.RUNNING, [], ALIVE, 4, 6, checkpoints_whole=False)
    assert d.path == FailoverPath.RESTART and "read back" in d.reason
