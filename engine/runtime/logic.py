"""Change of logic, live (Trisk's assign-logic): ``LogicChanger`` replaces an operator's
user function in every task of its vertex at a barrier aligned over the vertex's inputs.

Why a barrier: the switch must be one consistent point in the stream. Every predecessor
task sends ``LogicBarrier(version)`` on its channels to the vertex's tasks, behind every
record it sent before; a task switches once each of its live inputs delivered the barrier
(``engine.task.alignment.BarrierAligner``: an input that delivered it is not read meanwhile).
So every record before the barrier on its channel saw the old function and every record
after it the new one, and the keyed state stays where it is. A source's chain (no inputs)
switches between two reads.

Steps: (1) validation (the operator exists and may change; the function fits its kind:
``engine.operators.builtin.with_function``; the job is not finishing); (2) staging: the function
goes to every task of the vertex (a Ray call argument: the task deserialises it, and opens a
keyed function on its state); one task that cannot refuses the whole change and every
staged copy is discarded, before any task switched; (3) the barriers; (4) every task
reports ``LogicChanged``; (5) the JobMaster's plan carries the new function, so tasks
started later (rescales, placement) run it.

Guarantees: a refusal (``ChangeLogicRefused``) leaves every task on the old function;
after the barriers are sent, a task that does not switch within ``rescale_timeout_s`` fails
the job (some tasks already run the new function). The vertex and its predecessors do not
rescale meanwhile (their locks), nor does a stop-restart run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import TYPE_CHECKING, Any

from engine.control.reconfiguration import LogicChangeReport
from engine.dataflow import graph as g
from engine.dataflow.physical import PhysicalPlan
from engine.errors import ChangeLogicRefused, JobDefinitionError, JobFailedError
from engine.names import JobState
from engine.operators.builtin import with_function
from engine.wire.messages import (
    DiscardLogic,
    InjectLogicBarrier,
    LogicChanged,
    SwitchLogic,
)

if TYPE_CHECKING:
    from engine.runtime.job_master import JobMaster


def _with_operator(plan: PhysicalPlan, op: g.OperatorDef) -> PhysicalPlan:
    """``plan`` with the vertex running ``op.name`` running ``op`` instead."""
    vertices = tuple(
        dataclasses.replace(v, operators=tuple(op if o.name == op.name else o
                                               for o in v.operators))
        for v in plan.vertices)
    return dataclasses.replace(plan, vertices=vertices)


class LogicChanger:
    """The JobMaster's changes of logic (see the module doc)."""

    def __init__(self, master: JobMaster) -> None:
        self.m = master
        self.version = 0
        self._changed: dict[int, dict[str, LogicChanged]] = {}

    def on_report(self, msg: Any) -> None:
        if isinstance(msg, LogicChanged) and msg.version in self._changed:
            self._changed[msg.version][msg.task] = msg

    def _validate(self, operator: str, fn: Any) -> tuple[g.OperatorDef, str]:
        m = self.m
        if m.state != JobState.RUNNING:
            raise ChangeLogicRefused(f"job {m.job_id} is {m.state}, not running")
        if m.finished:
            raise ChangeLogicRefused(f"job {m.job_id} is finishing (some of its input ended); "
                                     "its logic no longer changes", operator=operator)
        try:
            op = m.graph.operator(operator)
            new = with_function(op, fn)
        except JobDefinitionError as exc:
            raise ChangeLogicRefused(str(exc), operator=operator) from None
        return new, m.dep.plan.vertex_of(operator).name

    async def change(self, operator: str, fn: Any) -> LogicChangeReport:
        m = self.m
        new, vertex = self._validate(operator, fn)
        preds = sorted({e.src for e in m.dep.plan.inputs_of(vertex)})
        async with contextlib.AsyncExitStack() as stack:
            for v in sorted({vertex, *preds}):  # one order: no two changes deadlock
                await stack.enter_async_context(m.vertex_lock(v))
            await stack.enter_async_context(m.rescaler.excluding_stop_restart())
            new, vertex = self._validate(operator, fn)
            self.version += 1
            version = self.version
            self._changed[version] = {}
            try:
                return await self._run(operator, vertex, new, version)
            finally:
                self._changed.pop(version, None)

    async def _run(self, operator: str, vertex: str, new: g.OperatorDef,
                   version: int) -> LogicChangeReport:
        m = self.m
        requested = m.clock.now()
        tasks = tuple(m.dep.tasks[vertex])
        await self._stage(operator, tasks, new.fn, version)
        # committed: from here on some task may switch
        plan = m.dep.plan
        if plan.vertex(vertex).is_source:
            calls = [m.call(t, SwitchLogic(version)) for t in tasks]
        else:
            ids = m.ids
            calls = [m.call(u, InjectLogicBarrier(version, tuple(
                ids.get(e.edge_id, u, t) for t in tasks)))
                for e in plan.inputs_of(vertex) for u in m.dep.tasks[e.src]]
        deadline = m.clock.monotonic() + m.config.rescale_timeout_s
        try:
            await asyncio.wait_for(asyncio.gather(*calls), m.config.rescale_timeout_s)
            done = self._changed[version]
            while not set(tasks) <= set(done):
                if m.state != JobState.RUNNING:
                    raise JobFailedError(m.error or f"job {m.job_id} is {m.state}")
                left = deadline - m.clock.monotonic()
                if left <= 0:
                    missing = sorted(set(tasks) - set(done))
                    raise TimeoutError(f"tasks {', '.join(missing)} did not switch within "
                                       f"rescale_timeout_s={m.config.rescale_timeout_s:g} s")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(m.changed().wait(), min(0.5, left))
        except Exception as exc:
            msg = (f"change of logic of {operator!r} to version {version} failed after its "
                   f"barriers were sent (some tasks may run the new function): "
                   f"{type(exc).__name__}: {exc}")
            if m.state == JobState.RUNNING:
                await m.fail(msg)
            raise JobFailedError(m.error or msg, operator=operator) from exc
        m.graph = g.JobGraph(m.graph.name, m.graph.num_key_groups, tuple(
            new if o.name == operator else o for o in m.graph.operators))
        m.dep = dataclasses.replace(m.dep, plan=_with_operator(m.dep.plan, new))
        m.plan = m.dep.plan
        done = self._changed[version]
        return LogicChangeReport(operator, version, len(tasks), requested, m.clock.now(),
                                 max((r.alignment_s for r in done.values()), default=0.0))

    async def _stage(self, operator: str, tasks: tuple[str, ...], fn: Any,
                     version: int) -> None:
        """Every task keeps ``fn`` (each its own copy); one that cannot refuses the change
        and every copy is discarded."""
        m = self.m

        async def stage(t: str) -> None:
            pending = m._configuring.get(t)
            if pending is not None:
                await pending
            await m.handles[t].stage_logic.remote(version, operator, fn)

        futs = {t: asyncio.ensure_future(stage(t)) for t in tasks}
        _, late = await asyncio.wait(futs.values(), timeout=m.config.rescale_timeout_s)
        failed = {t: f.exception() for t, f in futs.items() if f.done() and f.exception()}
        silent = [t for t, f in futs.items() if f in late]
        if not failed and not silent:
            return
        for f in late:
            f.cancel()
        discard = [asyncio.ensure_future(m.call(t, DiscardLogic(version))) for t in tasks]
        await asyncio.wait(discard, timeout=m.deadlines.task_poll_s)
        why = [f"{t}: {_cause(e)}" for t, e in failed.items()]
        why += [f"{t}: no answer within {m.config.rescale_timeout_s:g} s" for t in silent]
        raise ChangeLogicRefused(
            f"change of logic of {operator!r} refused before any task switched; the job runs "
            f"on with the old function. The new function could not be taken by "
            f"{'; '.join(why)}", operator=operator, phase="stage",
            tasks=tuple(sorted(failed)) + tuple(silent))


def _cause(exc: BaseException | None) -> str:
    """The innermost error of a failed Ray call, in one line."""
    seen = exc
    while seen is not None and getattr(seen, "cause", None) is not None \
            and isinstance(seen.cause, BaseException):
        seen = seen.cause
    text = str(seen).strip().splitlines()
    return f"{type(seen).__name__}: {text[-1] if text else ''}"


__all__ = ["LogicChanger"]
