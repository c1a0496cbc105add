"""Runs the engine's own rescale coordinator against task cores in this process.

The JobMaster executes ``migration.coordinator`` commands with Ray (engine/runtime/
rescaling.py); this module executes the same commands on ``TaskCore`` objects that a test
steps by hand, so the seeded interleaving tests exercise the coordinator as the engine runs
it, not a copy. The test supplies ``progress`` (one round of stepping cores and moving
frames, at random or not) that runs while the coordinator waits for reports.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from engine.clock import Clock
from engine.config import JobConfig
from engine.deployment import ChannelIds, Deployment
from engine.messages import SubscaleDone, decode_message, encode_message
from engine.task import TaskCore, TaskSpec
from migration.coordinator import (
    AwaitReports,
    Command,
    CreateTasks,
    EnableReplication,
    ReleaseReplicas,
    RemoveTasks,
    RescaleContext,
    RescaleCoordinator,
    RescaleRequest,
    SendControl,
    Sleep,
    SubscaleCompleted,
    SubscaleIds,
    UpdateVertex,
    coordinator_for,
)
from migration.report import RescaleReport


def make_spec(dep: Deployment, vertex: str, index: int, name: str,
              config: JobConfig) -> TaskSpec:
    """The spec the JobMaster builds (``TaskSpec.of``). Each Ray actor gets its own copy of
    the spec (and so of the user function objects, which keep state handles): copy it."""
    return copy.deepcopy(TaskSpec.of(dep, vertex, index, name, config))


def records_left(core: TaskCore) -> int:
    """Records a ``TestingSource`` task has not emitted yet, over the partitions it reads."""
    from engine.sources import parse_indexed

    assert core.reader is not None, f"{core.name} is not a started source task"
    records = core.spec.operators[0].fn.records
    left = 0
    for pid, emitted in core.reader.offsets().items():
        j, n = parse_indexed(pid)
        left += len(records[j::n]) - (emitted or 0)
    return left


def wire(msg: Any) -> Any:
    """Control messages go over the wire in the runtime: do the same here."""
    return decode_message(encode_message(msg))


class Cores(Protocol):
    """What the executor needs of a test's network of cores."""

    cores: dict[str, TaskCore]
    dep: Deployment
    config: JobConfig
    clock: Clock
    ids: ChannelIds

    def new_core(self, dep: Deployment, vertex: str, index: int, name: str) -> TaskCore: ...


@dataclasses.dataclass
class Executed:
    """What a run did besides the report: every command, the subscale reports by id."""

    commands: list[Command] = dataclasses.field(default_factory=list)
    subscales: dict[int, dict[str, SubscaleDone]] = dataclasses.field(default_factory=dict)
    completed: list[SubscaleCompleted] = dataclasses.field(default_factory=list)


class InProcessExecutor:
    """Executes a coordinator's commands on ``net``'s cores (the JobMaster's part)."""

    def __init__(self, net: Cores, progress: Callable[[], None],
                 after_send: Callable[[SendControl], None] | None = None,
                 max_rounds: int = 5000) -> None:
        self.net = net
        self.progress = progress
        self.after_send = after_send
        self.max_rounds = max_rounds
        # reports made before the rescale are not its business
        self._seen: dict[str, int] = {n: len(c.reports) for n, c in net.cores.items()}
        self.executed = Executed()

    def run(self, coord: RescaleCoordinator) -> RescaleReport:
        queue: deque[Command] = deque(coord.start())
        while not coord.done:
            assert queue, "the coordinator gave no command and is not done"
            cmd = queue.popleft()
            self.executed.commands.append(cmd)
            if isinstance(cmd, AwaitReports):
                queue.extend(self._await(coord))
            else:
                queue.extend(coord.on_result(cmd, self.execute(cmd)))
        return coord.report()

    def _await(self, coord: RescaleCoordinator) -> list[Command]:
        for _ in range(self.max_rounds):
            more = self.feed(coord)
            if more or coord.done:
                return more
            self.progress()
        coord.on_timeout()  # raises, naming what it waited for
        raise AssertionError("on_timeout returned")

    def feed(self, coord: RescaleCoordinator) -> list[Command]:
        """Give the coordinator every report the cores made since the last call."""
        out: list[Command] = []
        for name, core in list(self.net.cores.items()):
            start = self._seen.get(name, 0)
            for report in core.reports[start:]:
                if isinstance(report, SubscaleDone):
                    self.executed.subscales.setdefault(report.subscale, {})[report.role] = report
                out.extend(coord.on_report(wire(report)))
            self._seen[name] = len(core.reports)
        return out

    def execute(self, cmd: Command) -> Any:
        net = self.net
        match cmd:
            case SendControl(calls=calls):
                replies = [net.cores[c.task].handle(wire(c.message)) for c in calls]
                if self.after_send is not None:
                    self.after_send(cmd)
                return [wire(r) for r in replies]
            case CreateTasks(vertex=vertex, names=names, deployment=dep):
                for name in names:
                    net.cores[name] = net.new_core(dep, vertex, dep.tasks[vertex].index(name),
                                                   name)
            case RemoveTasks(names=names):
                for n in names:
                    self._seen.pop(n, None)
                    del net.cores[n]
            case UpdateVertex(vertex=vertex, tasks=tasks, assignment=a, generation=gen):
                net.dep = net.dep.with_vertex(vertex, tasks, a, gen)
            case SubscaleCompleted():
                self.executed.completed.append(cmd)
            case Sleep() | ReleaseReplicas() | EnableReplication():
                pass
            case _:
                raise TypeError(f"unknown command {cmd!r}")
        return None


def rescale(net: Cores, request: RescaleRequest, progress: Callable[[], None], *,
            config: JobConfig | None = None, after_send: Callable[[SendControl], None] | None
            = None, max_subscales: int = 2, epoch: int = 1,
            replicas: dict[int, tuple[str, int]] | None = None,
            max_rounds: int = 5000) -> tuple[RescaleCoordinator, RescaleReport, Executed]:
    """Run ``request`` on ``net`` with the engine's coordinator; ``config`` overrides the
    job's for the coordinator (its limits and sizes), the cores keep theirs."""
    ids = getattr(net, "subscale_ids", None)
    if ids is None:
        ids = SubscaleIds()
        net.subscale_ids = ids  # type: ignore[attr-defined]
    finished = frozenset(n for n, c in net.cores.items() if c.status == "finished")
    ctx = RescaleContext("j", net.dep, config or net.config, net.ids, ids, replicas or {},
                         False, max_subscales, epoch, finished)
    coord = coordinator_for(request, ctx, net.clock)
    ex = InProcessExecutor(net, progress, after_send, max_rounds)
    report = ex.run(coord)
    return coord, report, ex.executed


def run_steps(net: Cores, steps: Any, progress: Callable[[], None] = lambda: None,
              after_send: Callable[[SendControl], None] | None = None) -> None:
    """Execute a bare generator of coordinator commands (``add_tasks_steps``,
    ``remove_tasks_steps``) on ``net``, feeding each result back."""
    ex = InProcessExecutor(net, progress, after_send)
    result = None
    while True:
        try:
            cmd = steps.send(result)
        except StopIteration:
            return
        result = ex.execute(cmd)
