"""Change of logic, live (Trisk's assign-logic): ``LogicChanger`` replaces an operator's
user function in every task of its vertex at a barrier aligned over the vertex's inputs.

Why a barrier: the switch must be one consistent point in the stream. Every predecessor
task sends ``LogicBarrier(version)`` on its channels to the vertex's tasks, behind every
record it sent before; a task switches once each of its live inputs delivered the barrier
(``engine.task.alignment.BarrierAligner``: an input that delivered it is not read meanwhile).
So every record before the barrier on its channel saw the old function and every record
after it the new one, and the keyed state stays where it is. A source's chain (no inputs)
switches between two reads.

The steps are ``engine.control.steps.ChangeLogicSteps`` (sans-IO, tested in process by the
harness); this module executes them on the task actors. Steps: (1) validation (the operator exists and may change; the function fits its kind:
``engine.operators.builtin.with_function``; the job is not finishing); (2) staging: the function
goes to every task of the vertex (a Ray call argument: the task deserialises it, and opens a
keyed function on its state); one task that cannot refuses the whole change and every
staged copy is discarded, before any task switched; (3) the barriers; (4) every task
reports ``LogicChanged``; (5) the JobMaster's plan carries the new function, so tasks
started later (rescales, placement) run it.

Guarantees: a refusal (``ChangeLogicRefused``) leaves every task on the old function;
after the barriers are sent, a task that does not switch within ``rescale_timeout_s`` fails
the job (some tasks already run the new function). The vertex and its predecessors do not
rescale meanwhile, nor does a stop-restart run (the job's arbiter,
``engine.control.arbiter``, grants them to the change).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Any, Protocol

from engine.control.arbiter import Action, ActionKind
from engine.control.reconfiguration import LogicChangeReport
from engine.control.steps import ChangeLogicSteps, ReplaceOperator, StageLogic, check_change_logic
from engine.dataflow import graph as g
from engine.dataflow.deployment import ChannelIds
from engine.dataflow.physical import PhysicalPlan
from engine.errors import ChangeLogicRefused, JobFailedError, RescaleRefused
from engine.names import JobState
from engine.runtime.arbitration import Arbitration
from engine.runtime.ports import JobPort
from migration.coordinator import AwaitReports, SendControl


class LogicPort(JobPort, Protocol):
    """What a change of logic asks of the JobMaster beyond ``JobPort``."""

    @property
    def ids(self) -> ChannelIds: ...

    async def stage_logic(self, task: str, version: int, operator: str, fn: Any) -> None:
        """Task ``task`` keeps ``fn`` as version ``version`` of ``operator``."""
        ...

    def logic_changed(self, op: g.OperatorDef, plan: PhysicalPlan) -> None:
        """Operator ``op.name`` runs ``op`` from now on, in ``plan``."""
        ...


class LogicChanger:
    """The JobMaster's changes of logic (see the module doc)."""

    def __init__(self, port: LogicPort, arbitration: Arbitration) -> None:
        self.port = port
        self.arbitration = arbitration
        self.version = 0
        self._machines: dict[int, ChangeLogicSteps] = {}
        self._inbox: dict[int, deque[Any]] = {}
        self._broken: dict[int, Exception] = {}

    def on_report(self, msg: Any) -> None:
        """Every running change sees every task report."""
        for version, machine in list(self._machines.items()):
            try:
                self._inbox[version].extend(machine.on_report(msg))
            except Exception as exc:  # its executor raises it
                self._broken[version] = exc

    def _validate(self, operator: str, fn: Any) -> tuple[g.OperatorDef, str]:
        p = self.port
        return check_change_logic(p.dep.plan, operator, fn, job_id=p.job_id,
                                  state=p.record.status, finishing=bool(p.finished))

    async def change(self, operator: str, fn: Any) -> LogicChangeReport:
        p = self.port
        new, vertex = self._validate(operator, fn)
        preds = sorted({e.src for e in p.dep.plan.inputs_of(vertex)})
        # the vertex and its predecessors do not rescale meanwhile, nor does a stop-restart
        async with self.arbitration.hold(Action(ActionKind.CHANGE_LOGIC,
                                                frozenset({vertex, *preds})), RescaleRefused):
            new, vertex = self._validate(operator, fn)
            self.version += 1
            version = self.version
            machine = ChangeLogicSteps(new, version, p.dep, p.ids, p.config, p.clock)
            self._machines[version] = machine
            self._inbox[version] = deque()
            try:
                return await self._run(machine)
            finally:
                self._machines.pop(version, None)
                self._inbox.pop(version, None)
                self._broken.pop(version, None)

    async def _run(self, machine: ChangeLogicSteps) -> LogicChangeReport:
        """Execute the machine's commands; a refusal before any task switched discards
        every staged copy; a failure after it fails the job."""
        p = self.port
        inbox = self._inbox[machine.version]
        try:
            inbox.extend(machine.start())
            while not machine.done:
                if machine.version in self._broken:
                    raise self._broken.pop(machine.version)
                cmd = inbox.popleft()
                if isinstance(cmd, AwaitReports):
                    await self._await_reports(machine, cmd)
                    continue
                inbox.extend(machine.on_result(cmd, await self._apply(machine, cmd)))
        except ChangeLogicRefused:
            for cmd in machine.release_commands():  # every staged copy is discarded
                if isinstance(cmd, SendControl):
                    discards = [asyncio.ensure_future(p.call(c.task, c.message))
                                for c in cmd.calls]
                    await asyncio.wait(discards, timeout=p.deadlines.task_poll_s)
            raise
        except Exception as exc:
            if not machine.committed:
                raise
            msg = (f"change of logic of {machine.operator!r} to version {machine.version} "
                   f"failed after its barriers were sent (some tasks may run the new "
                   f"function): {type(exc).__name__}: {exc}")
            if p.record.status == JobState.RUNNING:
                await p.fail(msg)
            raise JobFailedError(p.record.error or msg, operator=machine.operator) from exc
        report: LogicChangeReport = machine.report()
        return report

    async def _await_reports(self, machine: ChangeLogicSteps, cmd: AwaitReports) -> None:
        """Until a report ended the wait (``on_report`` fills the inbox), the job stopped
        running, or ``cmd.timeout_s`` passed (``on_timeout`` raises)."""
        p = self.port
        inbox = self._inbox[machine.version]
        deadline = p.clock.monotonic() + cmd.timeout_s
        while not inbox and not machine.done:
            if machine.version in self._broken:
                raise self._broken.pop(machine.version)
            if p.record.status != JobState.RUNNING:
                raise JobFailedError(p.record.error or f"job {p.job_id} is {p.record.status}")
            left = deadline - p.clock.monotonic()
            if left <= 0:
                machine.on_timeout()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(p.changed().wait(), max(0.0, min(0.5, left)))

    async def _apply(self, machine: ChangeLogicSteps, cmd: Any) -> Any:
        p = self.port
        match cmd:
            case StageLogic(operator=operator, version=version, fn=fn, tasks=tasks):
                return await self._stage(operator, tasks, fn, version)
            case SendControl():
                return await self._send(cmd, p.config.rescale_timeout_s)
            case ReplaceOperator(definition=new):
                p.logic_changed(new, cmd.apply(p.dep).plan)
                return None
            case _:
                raise TypeError(f"unknown change-of-logic step {cmd!r}")

    async def _send(self, cmd: SendControl, limit: float) -> list[Any]:
        """Every call of ``cmd`` at once, all answered within ``limit`` seconds."""
        p = self.port
        return list(await asyncio.wait_for(asyncio.gather(*(
            p.call(c.task, c.message, c.introduce) for c in cmd.calls)), limit))

    async def _stage(self, operator: str, tasks: tuple[str, ...], fn: Any,
                     version: int) -> tuple[tuple[str, str], ...]:
        """Every task keeps ``fn`` (each its own copy); the tasks that could not, with
        why (those that raised, then those that did not answer in time)."""
        p = self.port
        limit = p.config.rescale_timeout_s
        futs = {t: asyncio.ensure_future(p.stage_logic(t, version, operator, fn))
                for t in tasks}
        _, late = await asyncio.wait(futs.values(), timeout=limit)
        for f in late:
            f.cancel()
        failed = {t: f.exception() for t, f in futs.items() if f.done() and not f.cancelled()
                  and f.exception()}
        silent = [t for t, f in futs.items() if f in late]
        return (tuple((t, _cause(failed[t])) for t in sorted(failed))
                + tuple((t, f"no answer within {limit:g} s") for t in silent))


def _cause(exc: BaseException | None) -> str:
    """The innermost error of a failed Ray call, in one line."""
    seen = exc
    inner = getattr(seen, "cause", None)
    while isinstance(inner, BaseException):
        seen, inner = inner, getattr(inner, "cause", None)
    text = str(seen).strip().splitlines()
    return f"{type(seen).__name__}: {text[-1] if text else ''}"


__all__ = ["LogicChanger"]
