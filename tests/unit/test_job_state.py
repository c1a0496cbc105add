"""``JobRecord`` (``engine.control.job_state``): one job's state as one frozen value whose
transitions return new records; what the JobMaster alone writes."""

from __future__ import annotations

import dataclasses

import pytest

from engine.api import StreamJob
from engine.checkpoints.metadata import CheckpointKind, CheckpointMetadata
from engine.control.arbiter import Action, ActionKind, Running
from engine.control.job_state import DECISION_RECORDS, RESCALE_RECORDS, JobRecord
from engine.control.reconfiguration import DecisionRecord, RescaleRecord
from engine.io.testing import TestingSink, TestingSource
from engine.names import JobState


def record() -> JobRecord:
    job = StreamJob("js", num_key_groups=8)
    (job.source(TestingSource([(1, 1)]), name="src", parallelism=1)
        .key_by(lambda r: r[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]), name="sum", parallelism=2)
        .sink(TestingSink(), name="out"))
    return JobRecord.initial("job-1", job.graph())


def test_an_initial_record_is_generation_zero_created_and_empty():
    r = record()
    assert r.status == JobState.CREATED and r.generation == 0 and r.next_generation == 1
    assert r.plan is r.deployment.plan and r.plan == r.graph_plan
    assert (r.epoch, r.restarts, r.checkpoint, r.actions) == (0, 0, None, ())


def test_transitions_return_new_records_and_leave_the_old_one_as_it_was():
    r = record()
    dep = dataclasses.replace(r.deployment, generation=3)
    r2 = r.deployed(dep).with_status(JobState.RUNNING)
    assert (r2.generation, r2.status) == (3, JobState.RUNNING)
    assert (r.generation, r.status) == (0, JobState.CREATED)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r2.status = JobState.FAILED  # type: ignore[misc]


def test_a_restart_is_an_epoch_and_completes_as_a_restart():
    r = record().with_status(JobState.RUNNING).restart_began("task died")
    assert (r.status, r.epoch, r.restarts, r.last_failure) == (
        JobState.RESTARTING, 1, 0, "task died")
    r = r.restart_retried().restarted()
    assert (r.status, r.epoch, r.restarts) == (JobState.RUNNING, 2, 1)
    with pytest.raises(ValueError, match="restarts"):
        dataclasses.replace(r, restarts=3)


def test_the_last_complete_checkpoint_is_a_pointer():
    meta = CheckpointMetadata(7, CheckpointKind.SAVEPOINT, "job-1", "js", 0.0, 8, (), (),
                              location="/tmp/sp-7")
    c = record().checkpoint_completed(meta).checkpoint
    assert c is not None and (c.checkpoint_id, c.kind, c.location) == (7, "savepoint", "/tmp/sp-7")


def test_a_change_of_logic_changes_the_graph_the_running_plan_and_what_a_restart_runs():
    r = record()
    op = r.graph.operator("sum")
    new = dataclasses.replace(op, fn=lambda a, b: a)
    vertices = tuple(dataclasses.replace(v, operators=tuple(new if o.name == "sum" else o
                                                            for o in v.operators))
                     for v in r.plan.vertices)
    r2 = r.logic_changed(new, dataclasses.replace(r.plan, vertices=vertices))
    assert r2.graph.operator("sum") is new
    assert r2.plan.vertex_of("sum").head is new
    # a restart (from a checkpoint or from nothing) runs the new function, at the user's
    # parallelism: before, it silently went back to the old one
    assert r2.graph_plan.vertex_of("sum").head.fn is new.fn
    assert r2.graph_plan.vertex_of("sum").parallelism == r.graph_plan.vertex_of("sum").parallelism
    assert r.graph_plan.vertex_of("sum").head is op


def test_histories_are_bounded_and_actions_are_the_arbiters():
    r = record()
    rec = RescaleRecord("sum", "drrs", 2, 3, 0.0, 1.0, 4, 100, False, 10.0, 0, 1.0, 2.0, 0.5)
    for _ in range(RESCALE_RECORDS + 5):
        r = r.rescale_measured(rec)
    assert len(r.rescales) == RESCALE_RECORDS
    d = DecisionRecord(0.0, "c", "no-change", "", "", "", "no-change")
    r = r.with_decisions([d] * (DECISION_RECORDS + 1))
    assert len(r.decisions) == DECISION_RECORDS
    running = (Running(1, Action(ActionKind.RESCALE, frozenset({"sum"}))),)
    r = r.with_actions(running)
    assert r.actions == running
    assert r.summary()["actions"] == ["rescale:sum"]


def test_a_record_holds_its_own_jobs_deployment():
    r = record()
    with pytest.raises(ValueError, match="deployment of job"):
        dataclasses.replace(r, job_id="other")
