"""Deploy, recovery and replica refresh as the engine's sans-IO steps
(``engine.control.steps``): the commands as values, and the deploy and recovery run by the
unit-test harness (``tests.harness``) on task cores, as the JobMaster runs them."""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

from engine.api import StreamJob
from engine.checkpoints.restore import TaskRestore
from engine.control.steps import (
    DeploySteps,
    ForgetReplicas,
    RecoveryOutcome,
    RecoverySteps,
    ReplaceDeployment,
    ReplicaRefreshOutcome,
    ReplicaRefreshSteps,
    recovery_candidates,
)
from engine.dataflow.config import JobConfig
from engine.dataflow.deployment import ChannelIds, Deployment, connect_messages, initial_deployment
from engine.dataflow.physical import plan_physical
from engine.errors import RestoreError
from engine.io.testing import TestingSink, TestingSource
from engine.operators.functions import KeyedProcessFunction
from engine.task.core import TaskCore
from engine.time.clock import ManualClock
from engine.wire.messages import (
    Connect,
    GroupStats,
    GroupStatsRequest,
    RefreshReplicas,
    ReplicasRefreshed,
    RestoreState,
    Start,
)
from migration.coordinator import (
    Call,
    CreateTasks,
    Phase,
    ReleaseReplicas,
    RemoveTasks,
    SendControl,
    Sleep,
)
from migration.participant import new_task_core
from tests import harness
from tests.oracle_net import OracleNet

CFG = JobConfig(batch_size=3, linger_ms=0, metrics_port=None)
KEYS = 6


class Count(KeyedProcessFunction):
    """``(key, i, count)`` per record: the count is keyed state."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.value_state("count", 0)

    def process_element(self, value: Any, ctx: Any) -> Any:
        self.count.update(self.count.value() + 1)
        yield (value[0], value[1], self.count.value())


def _job(n: int, sink: Any, src_p: int = 2, count_p: int = 3, out_p: int = 1,
         config: JobConfig = CFG) -> tuple[StreamJob, list[tuple[int, int]]]:
    """``src`` -> key_by -> ``count`` -> ``out`` (a vertex of its own unless ``out_p`` is
    ``count_p``); key ``i % KEYS``, partition ``i % src_p``: one order per key."""
    records = [(i % KEYS, i) for i in range(n)]
    job = StreamJob("deploy", num_key_groups=16, config=config)
    (job.source(TestingSource(records), name="src", parallelism=src_p)
        .key_by(lambda r: r[0]).process(Count(), name="count", parallelism=count_p)
        .sink(sink, name="out", parallelism=out_p))
    return job, records


def _reference(records: list[tuple[int, int]]) -> dict[int, list[tuple]]:
    out: dict[int, list[tuple]] = {}
    for key, i in records:
        out.setdefault(key, []).append((key, i, len(out.get(key, ())) + 1))
    return out


def _per_key(results: list[tuple]) -> dict[int, list[tuple]]:
    out: dict[int, list[tuple]] = {}
    for r in results:
        out.setdefault(r[0], []).append(r)
    return out


def _run(steps: Any, results: dict[type, Any] | None = None) -> list[Any]:
    """Drive ``steps`` by hand: every command's result from ``results`` by type (a
    ``SendControl``: one reply per call), None otherwise; the commands in order."""
    log: list[Any] = []
    queue = list(steps.start())
    while queue:
        cmd = queue.pop(0)
        log.append(cmd)
        result = (results or {}).get(type(cmd))
        if isinstance(cmd, SendControl) and result is None:
            result = [None] * len(cmd.calls)
        queue.extend(steps.on_result(cmd, result))
    assert steps.done
    return log


# ---------------------------------------------------------------------- deploy as values


def test_deploy_creates_connects_receivers_first_restores_and_starts_sources_last(tmp_path):
    job, _ = _job(10, TestingSink(str(tmp_path / "out")))
    dep = initial_deployment(plan_physical(job.graph()), "j")
    ids = ChannelIds()
    steps = DeploySteps(dep, ids, ManualClock())
    log = _run(steps)
    assert steps.report() is dep and steps.committed
    vertices = [v.name for v in dep.plan.vertices]
    assert vertices == ["src", "count", "out"]
    assert log[0] == ReplaceDeployment(dep)
    assert log[1:4] == [CreateTasks(v, dep.tasks[v], dep) for v in vertices]
    connect = log[4]
    assert isinstance(connect, SendControl) and connect.phase == Phase.DEPLOY
    want = connect_messages(dep, ChannelIds())
    assert [c.task for c in connect.calls] == [*dep.tasks["out"], *dep.tasks["count"],
                                              *dep.tasks["src"]]
    for c in connect.calls:
        assert isinstance(c.message, Connect) and c.message == want[c.task]
        assert set(c.introduce) == {ch.target for e in want[c.task].outputs
                                    for ch in e.channels}
    starts = log[5:]  # no state: no restore step
    assert [s.phase for s in starts] == [Phase.START] * 3
    assert [[c.task for c in s.calls] for s in starts] == [list(dep.tasks[v])
                                                          for v in reversed(vertices)]
    assert [c.message for c in starts[-1].calls] == [Start((("0-of-2", None),)),
                                                    Start((("1-of-2", None),))]


def test_a_deploy_from_a_checkpoint_removes_first_restores_state_and_resumes_sources(tmp_path):
    job, _ = _job(10, TestingSink(str(tmp_path / "out")))
    dep = initial_deployment(plan_physical(job.graph()), "j")
    src0, src1 = dep.tasks["src"]
    c0 = dep.tasks["count"][0]
    restore = {src0: TaskRestore(source_state={"0-of-2": 4}),
               src1: TaskRestore(),
               c0: TaskRestore(groups=((3, "file:///x", 0, 10, 7),),
                               transactions=(("out", ("t",)),))}
    log = _run(DeploySteps(dep, ChannelIds(), ManualClock(), restore, remove=("a", "b")))
    assert log[0] == RemoveTasks(("a", "b")) and log[1] == ReplaceDeployment(dep)
    (restoring,) = [c for c in log if isinstance(c, SendControl) and c.phase == Phase.RESTORE]
    assert restoring.calls == (Call(c0, RestoreState(((3, "file:///x", 0, 10, 7),),
                                                     (("out", ("t",)),))),)
    last = log[-1]
    assert [c.message for c in last.calls] == [Start((("0-of-2", 4),)),
                                               Start((("1-of-2", None),))]
    with pytest.raises(ValueError, match="does not have"):
        DeploySteps(dep, ChannelIds(), ManualClock(), {"nope": TaskRestore()})


# ---------------------------------------------------------------------- deploy in the harness


class BareNet:
    """Cores and nothing else: the harness deploys them (``tests.harness.Cores``)."""

    def __init__(self, job: StreamJob) -> None:
        self.clock = ManualClock()
        self.config = job.config
        self.dep: Deployment = initial_deployment(plan_physical(job.graph()), "j")
        self.ids = ChannelIds()
        self.cores: dict[str, TaskCore] = {}

    def new_core(self, dep: Deployment, vertex: str, index: int, name: str) -> TaskCore:
        return new_task_core(harness.make_spec(dep, vertex, index, name, self.config),
                             self.clock)

    def pump(self) -> None:
        """Step and deliver everything until nothing moves (the sources read it all)."""
        while True:
            moved = False
            for core in self.cores.values():
                if core.is_source and core.status == "running":
                    moved |= bool(core.poll_source(5))
                while core.step():
                    moved = True
                while core.router.outbox:
                    f = core.router.outbox.popleft()
                    self.cores[f.target].receive(f.channel_id, f.seq, f.payload)
                    moved = True
                core.consumed.clear()
            if not moved:
                return


def test_the_harness_deploys_with_the_engine_steps_and_the_job_runs_to_its_reference(tmp_path):
    sink = TestingSink(str(tmp_path / "out"))
    job, records = _job(60, sink, src_p=2, count_p=2, out_p=2)
    net = BareNet(job)
    dep = harness.deploy(net)
    assert dep is net.dep and set(net.cores) == set(dep.task_names())
    assert all(c.status == "running" for c in net.cores.values())
    net.pump()
    assert _per_key(sink.results()) == _reference(records)


# ---------------------------------------------------------------------- recovery


def test_a_recovery_without_a_checkpoint_starts_the_job_again_from_its_input(tmp_path):
    job, _ = _job(10, TestingSink(str(tmp_path / "out")))
    plan = plan_physical(job.graph())
    old = initial_deployment(plan, "j")
    steps = RecoverySteps(plan, "j", 1, old.partitions, ChannelIds(), ManualClock(),
                          candidates=recovery_candidates(None, ()),
                          old_tasks=old.task_names(), delay_s=0.5)
    log = _run(steps)
    assert log[:2] == [RemoveTasks(tuple(old.task_names())), Sleep(0.5)]
    outcome = steps.report()
    assert isinstance(outcome, RecoveryOutcome) and outcome.restored is None
    assert outcome.deployment.generation == 1 and log[2] == ReplaceDeployment(outcome.deployment)
    assert not any(isinstance(c, SendControl) and c.phase == Phase.RESTORE for c in log)
    assert outcome.note == ""


def test_a_recovery_falls_back_to_an_older_checkpoint_when_the_newest_does_not_read_back(
        tmp_path):
    """Two checkpoints; the newer one's state file is torn. The recovery's deploy from it
    fails restoring (``RestoreError`` at a task), its tasks go, and the job is deployed
    from the older one at the next generation; the sink then holds the reference's
    outputs."""
    cfg = JobConfig(batch_size=3, linger_ms=0, metrics_port=None, checkpoint_interval_s=60,
                    checkpoints_retained=10)
    sink = TestingSink(str(tmp_path / "out"))
    job, records = _job(150, sink, src_p=2, count_p=2, out_p=2, config=cfg)
    net = OracleNet(job)
    rng = random.Random(3)
    progress = lambda: net.round(rng, 10)  # noqa: E731
    cps = harness.Checkpoints(net, str(tmp_path / "chk"), progress)
    for _ in range(15):
        progress()
    first = cps.take()
    for _ in range(15):
        progress()
    second = cps.take()
    torn = next(t for t in second.tasks if t.groups)
    with open(os.path.join(second.location, torn.file), "r+b") as f:
        f.truncate(3)
    for _ in range(5):
        progress()
    candidates = recovery_candidates(cps.coord.latest, cps.coord.retained)
    assert [c.checkpoint_id for c in candidates] == [second.checkpoint_id, first.checkpoint_id]
    net.forget_in_flight()  # the killed tasks' frames are gone with them
    generation = net.dep.generation + 1
    steps = RecoverySteps(plan_physical(job.graph()), "j", generation, net.dep.partitions,
                          net.ids, net.clock, candidates, old_tasks=tuple(net.cores))
    ex = harness.InProcessExecutor(net, progress)
    outcome = ex.run(steps)
    assert outcome.restored is not None and outcome.restored.checkpoint is first
    assert outcome.deployment.generation == generation + 1 and net.dep is outcome.deployment
    assert len(outcome.skipped) == 1 and f"checkpoint {second.checkpoint_id}" in outcome.note
    deploys = [c for c in ex.executed.commands if isinstance(c, ReplaceDeployment)]
    assert [d.deployment.generation for d in deploys] == [generation, generation + 1]
    assert RemoveTasks(tuple(deploys[0].deployment.task_names())) in ex.executed.commands
    assert set(net.cores) == set(outcome.deployment.task_names())
    cps.coord.restored(first)
    net.finish(rng)
    cps.take()  # the final checkpoint commits the end
    # the sink committed the newer checkpoint's output before the failure, and the job
    # replays from the older one: those outputs come twice, identical (the state came back
    # with the older checkpoint); every other output exactly once, per key in order
    results = sink.results()
    assert len(results) > len(records), "the newer checkpoint had committed some output"
    assert {r[1] for r in results} == {i for _, i in records}
    assert _per_key(list(dict.fromkeys(results))) == _reference(records)


def test_a_recovery_whose_last_candidate_does_not_read_back_fails_with_it(tmp_path):
    cfg = JobConfig(batch_size=3, linger_ms=0, metrics_port=None, checkpoint_interval_s=60)
    job, _ = _job(60, TestingSink(str(tmp_path / "out")), config=cfg)
    net = OracleNet(job)
    rng = random.Random(4)
    cps = harness.Checkpoints(net, str(tmp_path / "chk"), lambda: net.round(rng, 5))
    for _ in range(10):
        net.round(rng, 5)
    only = cps.take()
    torn = next(t for t in only.tasks if t.groups)
    with open(os.path.join(only.location, torn.file), "r+b") as f:
        f.truncate(3)
    steps = RecoverySteps(plan_physical(job.graph()), "j", 1, net.dep.partitions, net.ids,
                          net.clock, (only,), old_tasks=tuple(net.cores))
    with pytest.raises(RestoreError):
        harness.InProcessExecutor(net, lambda: None).run(steps)


# ---------------------------------------------------------------------- replica refresh


def test_a_replica_refresh_forgets_moved_replicas_and_refreshes_each_owners_groups(tmp_path):
    job, _ = _job(10, TestingSink(str(tmp_path / "out")), count_p=2)
    dep = initial_deployment(plan_physical(job.graph()), "j")
    t0, t1 = dep.tasks["count"]
    owner = {kg: dep.tasks["count"][i] for kg, i in enumerate(dep.assignments["count"])}
    # a replica of group 0 held by its own owner cannot stay: it moves to the other task
    held = {0: (owner[0], 3)}
    steps = ReplicaRefreshSteps("count", dep, "all", 1.0, held, ManualClock())
    (stats,) = steps.start()
    assert stats == SendControl((Call(t0, GroupStatsRequest()), Call(t1, GroupStatsRequest())),
                                Phase.REFRESH)
    replies = [GroupStats(t, tuple((kg, 10, 100) for kg, o in owner.items() if o == t), 1.0)
               for t in (t0, t1)]
    (forget,) = steps.on_result(stats, replies)
    assert forget == ForgetReplicas("count", (0,))
    (release,) = steps.on_result(forget, None)
    assert release == ReleaseReplicas("count")
    (refresh,) = steps.on_result(release, None)
    assert refresh.phase == Phase.REFRESH and [c.task for c in refresh.calls] == [t0, t1]
    for c in refresh.calls:
        assert isinstance(c.message, RefreshReplicas)
        groups = [kg for kg, _, _ in c.message.targets]
        assert sorted(groups) == sorted(kg for kg, o in owner.items() if o == c.task)
        assert all(h != c.task and v == -1 for _, h, v in c.message.targets)  # all new
        assert set(c.introduce) == {h for _, h, _ in c.message.targets}
    answers = [ReplicasRefreshed(tuple((kg, 1) for kg, _, _ in c.message.targets),
                                 (), 50, 0.5) for c in refresh.calls]
    assert steps.on_result(refresh, answers) == [] and steps.done
    outcome = steps.report()
    assert isinstance(outcome, ReplicaRefreshOutcome) and outcome.bytes == 100
    assert outcome.cpu_s == 1.0 and set(outcome.held) == set(owner)
    assert all(h != owner[kg] and v == 1 for kg, (h, v) in outcome.held.items())


def test_a_recovery_falls_back_only_for_a_checkpoint_that_does_not_read_back(tmp_path):
    """Any other failure of a deploy (a task died, did not answer) is raised as it is."""
    from engine.errors import JobFailedError

    cfg = JobConfig(batch_size=3, linger_ms=0, metrics_port=None, checkpoint_interval_s=60)
    job, _ = _job(40, TestingSink(str(tmp_path / "out")), config=cfg)
    net = OracleNet(job)
    rng = random.Random(5)
    cps = harness.Checkpoints(net, str(tmp_path / "chk"), lambda: net.round(rng, 5))
    older = cps.take()
    newer = cps.take()
    steps = RecoverySteps(plan_physical(job.graph()), "j", 1, net.dep.partitions, net.ids,
                          net.clock, (newer, older))
    cmd = steps.start()[0]
    while not (isinstance(cmd, SendControl) and cmd.phase == Phase.RESTORE):
        (cmd,) = steps.on_result(cmd, [None] * len(cmd.calls)
                                 if isinstance(cmd, SendControl) else None)
    with pytest.raises(JobFailedError, match="died"):
        steps.on_error(cmd, JobFailedError("task x died"))
    assert not steps.done
