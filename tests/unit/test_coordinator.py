"""The rescale coordinator (migration.coordinator) stepped by hand: commands out, results and
reports in. No cores here: replies are made up per message type, so every decision of the
coordinator (what it asks, when it waits, when it may still refuse) is visible. The seeded
interleaving oracle in test_drrs_core.py / test_task_core.py runs the same coordinator
against real task cores."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest

from engine.api import StreamJob
from engine.checkpoints.coordinator import vertices_of
from engine.checkpoints.metadata import CheckpointMetadata
from engine.checkpoints.metadata import TaskState as PartState
from engine.dataflow.config import JobConfig
from engine.dataflow.deployment import ChannelIds, initial_deployment
from engine.dataflow.keygroups import moved_key_groups, uniform_assignment
from engine.dataflow.physical import plan_physical
from engine.errors import RescaleRefused, RescaleTimeout
from engine.io.testing import TestingSink, TestingSource
from engine.time.clock import ManualClock
from engine.wire.messages import (
    Ack,
    ExpectIncoming,
    ExpectOutgoing,
    GroupStats,
    GroupStatsRequest,
    HoldFinish,
    InjectSubscale,
    RemoveOutputChannels,
    StopTask,
    SubscaleDone,
    TaskFinished,
    TaskState,
)
from migration.assignment import AssignmentSpec, consistent_hashing
from migration.coordinator import (
    AwaitReports,
    Call,
    CreateTasks,
    DataflowChanges,
    LiveRescale,
    Phase,
    ReleaseReplicas,
    RemoveTasks,
    RescaleContext,
    RescaleRequest,
    RestoreJob,
    SendControl,
    StopRestartRescale,
    SubscaleCompleted,
    SubscaleIds,
    TakeSavepoint,
    UpdateVertex,
    coordinator_for,
)
from migration.protocols import RescaleProtocol
from migration.protocols.stop_restart import PHASES

N = 16
CFG = JobConfig(metrics_port=None, drrs_subscale_bytes=None, drrs_subscale_size=4)


def context(sum_p: int = 2, config: JobConfig = CFG,
            finished: frozenset[str] = frozenset()) -> RescaleContext:
    job = StreamJob("j", num_key_groups=N, config=config)
    (job.source(TestingSource([(1, 1)]), name="src", parallelism=1)
        .key_by(lambda r: r[0]).reduce(lambda a, b: a, name="sum", parallelism=sum_p)
        .sink(TestingSink(), name="out"))
    dep = initial_deployment(plan_physical(job.graph()), "j")
    return RescaleContext("j", dep, config, ChannelIds(), SubscaleIds(), {}, False, 2,
                          finished)


def reply(msg: Any, task: str, ended: bool = False) -> Any:
    match msg:
        case HoldFinish():
            return TaskState(task, "running", ended)
        case GroupStatsRequest():
            return GroupStats(task, tuple((kg, 10, 100) for kg in range(N)), 1.0)
        case _:
            return Ack()


class Driver:
    """Executes commands with made-up replies; ``on_wait`` answers an ``AwaitReports``
    with the reports a real job would send (None: leave it waiting)."""

    def __init__(self, coord: Any, on_wait: Any = None, ended: bool = False) -> None:
        self.coord = coord
        self.on_wait = on_wait
        self.ended = ended
        self.log: list[Any] = []
        self.queue: deque[Any] = deque()

    def run(self, until: Any = None) -> Any:
        if not self.queue and not self.log:
            self.queue.extend(self.coord.start())
        while self.queue:
            cmd = self.queue.popleft()
            self.log.append(cmd)
            if until is not None and until(cmd):
                return cmd
            if isinstance(cmd, AwaitReports):
                reports = self.on_wait(self, cmd) if self.on_wait else []
                for r in reports:
                    self.queue.extend(self.coord.on_report(r))
                continue
            result = None
            if isinstance(cmd, SendControl):
                result = [reply(c.message, c.task, self.ended) for c in cmd.calls]
            self.queue.extend(self.coord.on_result(cmd, result))
        return None

    def sent(self, kind: type) -> list[tuple[str, Any]]:
        return [(c.task, c.message) for cmd in self.log if isinstance(cmd, SendControl)
                for c in cmd.calls if isinstance(c.message, kind)]


def finish_running(driver: Driver, cmd: AwaitReports) -> list[Any]:
    """Both owners of every running subscale report it done."""
    coord = driver.coord
    out = []
    for sid, sub in list(coord._sched.running.items()):
        names = coord._names
        out.append(SubscaleDone(names[sub.old], sid, "old", 50 * len(sub.key_groups), 2, 0.0, 0.0))
        out.append(SubscaleDone(names[sub.new], sid, "new", 50 * len(sub.key_groups), 0, 0.0,
                                0.25))
    return out


def test_a_live_scale_out_holds_creates_runs_every_subscale_and_releases():
    ctx = context()
    coord = LiveRescale(RescaleRequest("sum", 3, "drrs"), ctx, ManualClock())
    d = Driver(coord, finish_running)
    assert d.run() is None and coord.done
    kinds = [type(c).__name__ for c in d.log]
    assert kinds[0] == "SendControl" and d.log[0].phase == Phase.HOLD
    assert "CreateTasks" in kinds and kinds.index("CreateTasks") < kinds.index("AwaitReports")
    created = next(c for c in d.log if isinstance(c, CreateTasks))
    assert created.names == ("j/sum/2/g1",)
    # both owners expect a subscale before any predecessor injects it
    first_inject = next(i for i, c in enumerate(d.log) if isinstance(c, SendControl)
                        and isinstance(c.calls[0].message, InjectSubscale))
    first_expect = next(i for i, c in enumerate(d.log) if isinstance(c, SendControl)
                        and isinstance(c.calls[0].message, (ExpectIncoming, ExpectOutgoing)))
    assert first_expect < first_inject
    new = uniform_assignment(N, 3)
    moved = moved_key_groups(uniform_assignment(N, 2), new)
    report = coord.report()
    assert report.key_groups_moved == report.key_groups_planned == len(moved)
    assert report.bytes_moved == 50 * len(moved) and report.rerouted_records > 0
    assert report.new_parallelism == 3 and not report.superseded
    assert report.suspended_s == 0.25
    assert sorted(kg for c in d.log if isinstance(c, SubscaleCompleted)
                  for kg in c.key_groups) == moved
    final = [c for c in d.log if isinstance(c, UpdateVertex)][-1]
    assert final.assignment == new and len(final.tasks) == 3
    # the hold is released on every task, the new one included, at the very end
    last = d.log[-1]
    assert isinstance(last, SendControl) and last.phase == Phase.RELEASE
    assert {c.task for c in last.calls} == {"j/sum/0/g0", "j/sum/1/g0", "j/sum/2/g1"}
    assert all(c.message == HoldFinish(False) for c in last.calls)
    assert coord.progress().phase == "done" and not coord.progress().running


def test_scale_in_removes_the_tasks_left_without_groups():
    coord = LiveRescale(RescaleRequest("sum", 1, "pause-resume"), context(sum_p=3),
                        ManualClock())
    d = Driver(coord, finish_running)
    d.run()
    removed = [c for c in d.log if isinstance(c, RemoveTasks)]
    assert removed == [RemoveTasks(("j/sum/1/g0", "j/sum/2/g0"))]
    assert [c for c in d.log if isinstance(c, ReleaseReplicas)][0].gone == removed[0].names
    assert coord.report().new_parallelism == 1 and coord.report().steps == 1


def test_nothing_is_changed_before_the_plan_and_an_ended_input_refuses():
    coord = LiveRescale(RescaleRequest("sum", 3, "drrs"), context(), ManualClock())
    d = Driver(coord, finish_running, ended=True)
    with pytest.raises(RescaleRefused, match="input of operator 'sum' has ended"):
        d.run()
    assert not coord.committed
    assert [m for _, m in d.sent(HoldFinish)][-2:] == [HoldFinish(False)] * 2
    assert not any(isinstance(c, (CreateTasks, UpdateVertex)) for c in d.log)


def test_planning_asks_the_tasks_for_sizes_before_committing():
    cfg = JobConfig(metrics_port=None, drrs_subscale_bytes=150, drrs_subscale_size=4)
    coord = LiveRescale(RescaleRequest("sum", 3, "drrs"), context(config=cfg), ManualClock())
    d = Driver(coord, finish_running)
    cmd = d.run(until=lambda c: isinstance(c, SendControl) and c.phase == Phase.PLAN)
    assert isinstance(cmd.calls[0].message, GroupStatsRequest) and not coord.committed
    assert coord.release_commands()[0].phase == Phase.RELEASE
    d.queue.extend(coord.on_result(cmd, [reply(c.message, c.task) for c in cmd.calls]))
    d.run()
    assert coord.committed and coord.done
    # 100 bytes a group, 150 a subscale: every group travels alone
    assert all(len(s.key_groups) == 1 for s in coord.plan.subscales)
    assert "MB of state" in coord.report().planning_reason


def test_a_superseded_rescale_finishes_what_runs_and_says_so():
    ctx = context()
    ctx.max_subscales = 1
    coord = LiveRescale(RescaleRequest("sum", 4, "drrs"), ctx, ManualClock())

    def first_then_supersede(driver: Driver, cmd: AwaitReports) -> list[Any]:
        driver.coord.supersede()
        return finish_running(driver, cmd)

    d = Driver(coord, first_then_supersede)
    d.run()
    report = coord.report()
    assert report.superseded
    assert 0 < report.key_groups_moved < report.key_groups_planned
    # a cut-short scale-out keeps every task it made: groups may sit on any of them
    assert report.new_parallelism == 4


def test_a_predecessor_that_finishes_meanwhile_does_not_stop_the_rescale():
    # FLIP-147: a finished task elsewhere (a bounded source) leaves the rescale to finish
    ctx = context()
    ctx.max_subscales = 1
    coord = LiveRescale(RescaleRequest("sum", 4, "batched"), ctx, ManualClock())

    def end_then_finish(driver: Driver, cmd: AwaitReports) -> list[Any]:
        return [TaskFinished("j/src/0/g0"), *finish_running(driver, cmd)]

    Driver(coord, end_then_finish).run()
    report = coord.report()
    assert not report.superseded and report.steps > 1
    assert report.key_groups_moved == report.key_groups_planned


def test_a_task_of_the_operator_that_finished_stops_further_subscales():
    ctx = context()
    ctx.max_subscales = 1
    coord = LiveRescale(RescaleRequest("sum", 4, "batched"), ctx, ManualClock())

    def end_then_finish(driver: Driver, cmd: AwaitReports) -> list[Any]:
        return [TaskFinished("j/sum/0/g0"), *finish_running(driver, cmd)]

    Driver(coord, end_then_finish).run()
    assert coord.report().superseded and coord.report().steps > 1


def test_a_wait_that_runs_out_names_the_subscale_and_its_tasks():
    coord = LiveRescale(RescaleRequest("sum", 3, "fluid"), context(), ManualClock())
    d = Driver(coord)  # nobody reports
    cmd = d.run(until=lambda c: isinstance(c, AwaitReports))
    assert cmd.phase == Phase.SUBSCALES and cmd.timeout_s == CFG.rescale_timeout_s
    with pytest.raises(RescaleTimeout, match="subscale 0 .*reported by: nobody") as err:
        coord.on_timeout()
    assert err.value.phase == "subscales" and set(err.value.tasks) <= {
        "j/sum/0/g0", "j/sum/1/g0", "j/sum/2/g1"}
    assert coord.committed  # tasks were created: the job, not the request, fails


def test_a_result_for_another_command_is_an_error():
    coord = LiveRescale(RescaleRequest("sum", 3, "drrs"), context(), ManualClock())
    (first,) = coord.start()
    with pytest.raises(RuntimeError, match="not the command"):
        coord.on_result(SendControl((), Phase.HOLD), [])
    assert coord.on_report(SubscaleDone("x", 99, "old", 0, 0, 0.0, 0.0)) == []
    assert isinstance(first, SendControl)


def test_stop_restart_takes_a_stopping_savepoint_then_restores_the_job_from_it():
    ctx = context()
    coord = coordinator_for(RescaleRequest("sum", 3, RescaleProtocol.STOP_RESTART), ctx,
                            ManualClock())
    assert isinstance(coord, StopRestartRescale)
    first = coord.start()
    assert first == [TakeSavepoint(stop=True)] and coord.committed
    assert coord.phase == Phase.SAVEPOINT
    meta = CheckpointMetadata(
        4, "checkpoint", "j", "j", 0.0, N, vertices_of(ctx.deployment),
        (PartState("j/src/0/g0", "src", 0, source_state={"0-of-1": 42}),
         PartState("j/sum/0/g0", "sum", 0, "f", ((0, 0, 1, 0),)),
         PartState("j/sum/1/g0", "sum", 1)))
    [restore] = coord.on_result(first[0], meta)
    assert isinstance(restore, RestoreJob) and coord.phase == Phase.RESTORE
    assert restore.checkpoint is meta and restore.parallelism == {"sum": 3}
    assert restore.assignments == {"sum": uniform_assignment(N, 3)}
    new_dep = ctx.deployment.with_vertex("sum", ("a", "b", "c"), uniform_assignment(N, 3), 1)
    assert coord.on_result(restore, new_dep) == [] and coord.done
    report = coord.report()
    assert [p for p, _ in report.phases] == [str(p) for p in PHASES]
    assert report.source_offsets == (("j/src/0/g0", {"0-of-1": 42}),)
    assert report.bytes_moved == 1 and report.new_parallelism == 3
    assert report.key_groups_moved == len(moved_key_groups(uniform_assignment(N, 2),
                                                            uniform_assignment(N, 3)))


def test_dataflow_changes_follow_subscales_until_both_owners_report():
    changes = DataflowChanges()
    expect = SendControl((Call("d", ExpectIncoming(5, (1,), (), 0)),), Phase.SUBSCALES)
    assert changes.starts(expect) and changes.starts(CreateTasks("sum", ("x",), None))
    assert changes.starts(SendControl((Call("u", RemoveOutputChannels((3,))),), Phase.REMOVE))
    assert not changes.starts(SendControl((Call("s", StopTask(True)),), Phase.REMOVE))
    assert not changes.starts(SendControl((Call("u", HoldFinish(True)),), Phase.HOLD))
    changes.on_command(expect)
    assert changes.subscales == {5} and not changes.quiet(Phase.SUBSCALES)
    changes.on_report(SubscaleDone("s", 5, "old", 0, 0, 0.0, 0.0))
    assert changes.subscales == {5}
    changes.on_report(SubscaleDone("d", 5, "new", 0, 0, 0.0, 0.0))
    assert changes.quiet(Phase.SUBSCALES) and not changes.quiet(Phase.DEPLOY)


def test_the_request_is_validated():
    with pytest.raises(ValueError, match="integer"):
        RescaleRequest("sum", True, "drrs")
    with pytest.raises(ValueError, match="unknown protocol 'nope'"):
        RescaleRequest("sum", 2, "nope")
    assert RescaleRequest("sum", 2, "fluid").protocol is RescaleProtocol.FLUID


# ------------------------------------------------------------------ assignment strategies


def test_an_ssm_rescale_plans_from_the_tasks_stats_and_reports_its_prediction():
    req = RescaleRequest("sum", 3, "drrs", strategy=AssignmentSpec("ssm", 0.2))
    coord = LiveRescale(req, context(), ManualClock())
    d = Driver(coord, finish_running)
    cmd = d.run(until=lambda c: isinstance(c, SendControl) and c.phase == Phase.PLAN)
    assert isinstance(cmd.calls[0].message, GroupStatsRequest) and not coord.committed
    d.queue.extend(coord.on_result(cmd, [reply(c.message, c.task) for c in cmd.calls]))
    d.run()
    plan, report = coord.assignment_plan, coord.report()
    assert plan is not None and coord.plan.new_assignment == plan.assignment
    uniform_moves = len(moved_key_groups(uniform_assignment(N, 2), uniform_assignment(N, 3)))
    assert len(plan.moved) < uniform_moves
    assert report.assignment == "ssm" and report.predicted_bytes == 100 * len(plan.moved)
    assert report.load_ratio is not None and report.load_ratio <= 1.2
    assert "optimal single step" in report.assignment_reason
    assert "ssm assignment predicted" in str(report)


def test_a_balance_no_assignment_meets_refuses_before_anything_changes():
    req = RescaleRequest("sum", 3, "pause-resume", strategy=AssignmentSpec("ssm", 0.0))
    coord = LiveRescale(req, context(), ManualClock())
    d = Driver(coord, finish_running)
    with pytest.raises(RescaleRefused, match="smallest balance that works is 0.125") as err:
        d.run()
    assert err.value.phase == "plan" and err.value.operator == "sum"
    assert not coord.committed
    assert [m for _, m in d.sent(HoldFinish)][-2:] == [HoldFinish(False)] * 2
    assert not any(isinstance(c, (CreateTasks, UpdateVertex)) for c in d.log)


def test_stop_restart_with_a_strategy_asks_the_stats_then_restores_to_its_target():
    ctx = context()
    req = RescaleRequest("sum", 3, RescaleProtocol.STOP_RESTART,
                         strategy=AssignmentSpec("consistent-hashing"))
    coord = coordinator_for(req, ctx, ManualClock())
    [stats] = coord.start()
    assert isinstance(stats, SendControl) and stats.phase == Phase.PLAN
    assert {type(c.message) for c in stats.calls} == {GroupStatsRequest}
    assert not coord.committed  # a refusal here would leave the job as it is
    [savepoint] = coord.on_result(stats, [reply(c.message, c.task) for c in stats.calls])
    assert savepoint == TakeSavepoint(stop=True) and coord.committed
    meta = CheckpointMetadata(4, "checkpoint", "j", "j", 0.0, N, vertices_of(ctx.deployment),
                              (PartState("j/sum/0/g0", "sum", 0),
                               PartState("j/sum/1/g0", "sum", 1)))
    [restore] = coord.on_result(savepoint, meta)
    target = consistent_hashing(N, 3)
    assert isinstance(restore, RestoreJob) and restore.assignments == {"sum": target}
    new_dep = ctx.deployment.with_vertex("sum", ("a", "b", "c"), target, 1)
    assert coord.on_result(restore, new_dep) == [] and coord.done
    report = coord.report()
    assert report.assignment == "consistent-hashing"
    assert report.key_groups_moved == len(moved_key_groups(uniform_assignment(N, 2), target))
    with pytest.raises(ValueError, match="not both"):
        RescaleRequest("sum", 3, "drrs", assignment=(0,) * N, strategy=AssignmentSpec("ssm"))
    assert LiveRescale(RescaleRequest("sum", 3, "drrs"), context(),
                       ManualClock())._with_assignment(report_stub()).assignment == "uniform"


def test_a_stop_restart_whose_balance_no_assignment_meets_is_refused_before_the_savepoint():
    req = RescaleRequest("sum", 3, RescaleProtocol.STOP_RESTART,
                         strategy=AssignmentSpec("ssm", 0.0))
    coord = coordinator_for(req, context(), ManualClock())
    [stats] = coord.start()
    with pytest.raises(RescaleRefused, match="smallest balance that works is 0.125"):
        coord.on_result(stats, [reply(c.message, c.task) for c in stats.calls])
    assert not coord.committed


def report_stub() -> Any:
    from migration.report import RescaleReport

    return RescaleReport("sum", "drrs", 2, 3, 0.0, 1.0, 1.0, 0, 0, ())


def test_a_rebalance_by_ssm_that_finds_the_load_within_theta_moves_nothing():
    for protocol in ("drrs", "fluid", "non-disruptive"):
        req = RescaleRequest("sum", 2, protocol, strategy=AssignmentSpec("ssm", 0.5))
        coord = LiveRescale(req, context(), ManualClock())
        Driver(coord, finish_running).run()
        report = coord.report()
        assert report.key_groups_moved == report.key_groups_planned == 0
        assert report.predicted_bytes == 0 and report.new_parallelism == 2
