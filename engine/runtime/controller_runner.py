"""The JobMaster's controller runner: calls each controller every ``interval_s`` and
carries out its decisions through the same validated paths as the ``JobHandle`` calls.

Why in the JobMaster: decisions act on the job (a rescale, a change of logic, a
placement), and the JobMaster is where those run and where the metrics arrive; a controller
is user code (``controllers.base.Controller``), shipped here with the call that added it,
like an operator's function. The policy is the controller's (sans-IO: metrics and view
in, decisions out); this module only feeds it and executes what it returns.

What it keeps: a bounded history of the tasks' metrics snapshots (one per metrics poll,
``engine.observability.rates.MetricsHistory``) from which each controller gets its window; the measured
cost of every finished rescale, whoever asked for it (``RescaleRecord``, measured
``settle`` seconds after the rescale ended, from the same history); and the decisions
(``DecisionLog``: the latest 1000, folded, counted for Prometheus).

Guarantees: a controller that raises, or returns something that is no decision, is
recorded as an error and skipped; a decision the job refuses is recorded as refused and
the job runs on unchanged; a controller's decisions for different operators run at once,
those for one operator one after another, and a decision for an operator that is already
rescaling is refused (a controller never supersedes a rescale someone asked for). Nothing
here fails the job; only a decision that fails after changing it does (as the same call
from the handle would). The runner stops with the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from engine.control.reconfiguration import (
    DECISION_TYPES,
    ChangeLogic,
    DecisionLog,
    DecisionOutcome,
    DecisionRecord,
    JobView,
    NoChange,
    OperatorView,
    Place,
    Rebalance,
    RescaleRecord,
    Scale,
    as_decisions,
    check_controller,
    measure_rescale,
    record_of,
)
from engine.errors import ControllerError, JobFailedError, ReflowError, RescaleRefused
from engine.names import JobState
from engine.observability.rates import MetricsHistory, MetricsWindow
from engine.runtime.ports import JobPort
from engine.wire.messages import GroupStatsRequest
from migration.assignment import AssignmentSpec, requested_strategy
from migration.report import RescaleReport

if TYPE_CHECKING:
    from engine.dataflow.physical import PhysicalPlan

log = logging.getLogger("reflow.controllers")

HISTORY_MIN_S = 120.0   # metrics snapshots kept at least this long
SETTLE_POLLS = 3        # metrics polls after a rescale before its cost is measured


@dataclass
class _Entry:
    name: str
    controller: Any
    next_at: float


@dataclass
class _Finished:
    report: Any
    started: float
    ended: float
    by: str


def neighbourhoods(plan: PhysicalPlan, per_op: dict[str, list[Any]]) -> list[list[Any]]:
    """One round's decisions (by operator) in groups that may run at once: operators
    whose vertices exchange records (directly, or through other vertices decided in the
    same round) go in one group, in the order decided, since the rescaler refuses a
    rescale beside a running neighbour's. An operator the plan does not know is a group
    of its own (refused when carried out, naming it)."""
    def vertex(op: str) -> str:
        try:
            return plan.vertex_of(op).name
        except KeyError:
            return op

    parent: dict[str, str] = {}

    def root(v: str) -> str:
        while parent.setdefault(v, v) != v:
            v = parent[v]
        return v

    vertices = {op: vertex(op) for op in per_op}
    chosen = set(vertices.values())
    for v in chosen:  # an unknown name has no edges, so no neighbours
        for n in plan.neighbours(v) & chosen:
            parent[root(v)] = root(n)
    groups: dict[str, list[Any]] = {}
    for op, ds in per_op.items():
        groups.setdefault(root(vertices[op]), []).extend(ds)
    return list(groups.values())


class ControllerPort(JobPort, Protocol):
    """What the controllers' decisions ask of the JobMaster beyond ``JobPort``: the same
    validated paths as the ``JobHandle``'s calls, and the job's record of what happened."""

    @property
    def nodes(self) -> dict[str, str]:
        """Task name -> the Ray node it runs on, where known."""
        ...

    @property
    def rescaling_operators(self) -> frozenset[str]: ...

    async def placement(self, operator: str) -> list[str]: ...

    def alive_nodes(self) -> list[str]: ...

    async def run_rescale(self, operator: str, parallelism: int | None, protocol: str,
                          assignment: Any, planning: Any, by: str,
                          strategy: AssignmentSpec | None) -> RescaleReport: ...

    async def run_placement(self, operator: str, task_index: int, node: str, protocol: str,
                            by: str) -> RescaleReport: ...

    async def run_change_logic(self, operator: str, fn: Any) -> Any: ...

    def rescale_measured(self, record: RescaleRecord) -> None:
        """Keep ``record`` in the job's rescale history."""
        ...

    def decided(self, records: tuple[DecisionRecord, ...]) -> None:
        """The controllers' decisions so far (the job's record keeps them)."""
        ...


class ControllerRunner:
    """Runs one job's controllers inside its JobMaster (see the module doc)."""

    def __init__(self, port: ControllerPort) -> None:
        self.port = port
        poll = port.config.metrics_poll_interval_s
        self.settle_s = SETTLE_POLLS * poll
        self.history = MetricsHistory(HISTORY_MIN_S)
        self.decision_log = DecisionLog()
        self.last_rescale_end: float | None = None
        self._entries: dict[str, _Entry] = {}
        self._finished: list[_Finished] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        port.collector.decisions = self.decision_log.counts

    # ------------------------------------------------------------------ controllers
    def add(self, controller: Any) -> str:
        """Run ``controller`` from now on (its first call after ``interval_s``); returns its
        name. ``ControllerError`` when it is no controller or its name is taken."""
        name = check_controller(controller, tuple(self._entries))
        now = self.port.clock.monotonic()
        self._entries[name] = _Entry(name, controller, now + float(controller.interval_s))
        keep = max(HISTORY_MIN_S, 3 * max(float(e.controller.window_s)
                                          for e in self._entries.values()))
        self.history.keep_s = max(self.history.keep_s, keep)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())
        self._wake.set()
        return name

    def remove(self, name: str) -> None:
        if self._entries.pop(name, None) is None:
            raise ControllerError(f"no controller named {name!r} runs on this job; running: "
                                  f"{', '.join(self._entries) or 'none'}")

    @property
    def names(self) -> list[str]:
        return list(self._entries)

    def controllers(self) -> list[Any]:
        """The running controllers, in the order they were added."""
        return [e.controller for e in self._entries.values()]

    def stop(self) -> None:
        """Run no controller any more (a fenced JobMaster)."""
        self._entries.clear()
        if self._task is not None:
            self._task.cancel()

    def decisions(self, controller: str | None = None) -> tuple[DecisionRecord, ...]:
        return self.decision_log.records(controller)

    @property
    def records(self) -> tuple[RescaleRecord, ...]:
        """The measured rescales (the latest ``RESCALE_RECORDS``: the job's record)."""
        return self.port.record.rescales

    # ------------------------------------------------------------------ observations
    def observe(self) -> None:
        """After each metrics poll: keep the snapshot; measure rescales that settled."""
        now = self.port.clock.monotonic()
        self.history.add(now, self.port.collector.tasks)
        done = [f for f in self._finished if now >= f.ended + self.settle_s]
        for f in done:
            self._finished.remove(f)
            r = f.report
            self.port.rescale_measured(measure_rescale(
                self.history, operator=r.operator, protocol=r.protocol,
                old_parallelism=r.old_parallelism, new_parallelism=r.new_parallelism,
                requested_at=f.started, completed_at=f.ended,
                key_groups_moved=r.key_groups_moved, bytes_moved=r.bytes_moved,
                cut_short=r.cut_short, by=f.by))

    def rescale_finished(self, report: Any, started: float, ended: float, by: str) -> None:
        """A rescale ended (``report``: its ``RescaleReport``); measure it once settled."""
        self.last_rescale_end = ended
        self._finished.append(_Finished(report, started, ended, by))

    # ------------------------------------------------------------------ the loop
    async def _loop(self) -> None:
        p = self.port
        while p.record.status.active:
            if not self._entries:
                self._wake.clear()
                await self._wake.wait()
                continue
            now = p.clock.monotonic()
            due = [e for e in self._entries.values() if e.next_at <= now]
            if not due:
                wait = min(e.next_at for e in self._entries.values()) - now
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), max(0.0, wait))
                continue
            for e in due:
                if e.name not in self._entries or not p.record.status.active:
                    continue
                e.next_at = p.clock.monotonic() + float(e.controller.interval_s)
                try:
                    await self._tick(e)
                except Exception as exc:  # never let a controller's tick end the runner
                    self._record(e.name, None, DecisionOutcome.ERROR,
                                 f"the runner failed: {type(exc).__name__}: {exc}")

    async def _tick(self, e: _Entry) -> None:
        p = self.port
        if p.record.status != JobState.RUNNING:
            return
        order = [v.name for v in p.dep.plan.vertices]
        since = self.last_rescale_end if self.last_rescale_end is not None else -math.inf
        window = self.history.window(float(e.controller.window_s), since, order)
        if window is None:
            return  # fewer than two snapshots since the last rescale: nothing to decide on
        view = await self.view(bool(getattr(e.controller, "group_stats", False)))
        try:
            returned = e.controller.decide(window, view)
        except Exception as exc:
            self._record(e.name, None, DecisionOutcome.ERROR,
                         f"decide raised {type(exc).__name__}: {exc}")
            return
        per_op: dict[str, list[Any]] = {}
        for d in as_decisions(returned):
            if not isinstance(d, DECISION_TYPES):
                self._record(e.name, d, DecisionOutcome.ERROR,
                             "not a decision: return Scale, Rebalance, ChangeLogic, Place or "
                             "NoChange values")
            elif isinstance(d, NoChange):
                self._record(e.name, d, DecisionOutcome.NO_CHANGE)
            else:
                per_op.setdefault(d.operator, []).append(d)
        await asyncio.gather(*(self._run_all(e.name, ds)
                               for ds in neighbourhoods(self.port.dep.plan, per_op)))

    async def _run_all(self, controller: str, decisions: Sequence[Any]) -> None:
        for d in decisions:
            await self.execute(controller, d)

    async def execute(self, controller: str, d: Any) -> DecisionRecord:
        """Carry out one decision and record what became of it."""
        p = self.port
        t0 = p.clock.monotonic()
        try:
            detail = await self._carry_out(controller, d)
        except RescaleRefused as exc:
            return self._record(controller, d, DecisionOutcome.REFUSED, str(exc),
                                p.clock.monotonic() - t0)
        except JobFailedError as exc:
            return self._record(controller, d, DecisionOutcome.FAILED, str(exc),
                                p.clock.monotonic() - t0)
        except ReflowError as exc:
            return self._record(controller, d, DecisionOutcome.REFUSED,
                                f"{type(exc).__name__}: {exc}", p.clock.monotonic() - t0)
        except Exception as exc:
            outcome = (DecisionOutcome.FAILED if p.record.status == JobState.FAILED
                       else DecisionOutcome.REFUSED)
            return self._record(controller, d, outcome, f"{type(exc).__name__}: {exc}",
                                p.clock.monotonic() - t0)
        return self._record(controller, d, DecisionOutcome.EXECUTED, detail,
                            p.clock.monotonic() - t0)

    async def _carry_out(self, controller: str, d: Any) -> str:
        p = self.port
        if d.operator in p.rescaling_operators:
            raise RescaleRefused(f"a rescale of {d.operator!r} is running; a controller does "
                                 "not supersede it (decide again once it ended)")
        by = f"controller {controller}"
        if isinstance(d, (Scale, Rebalance)):
            if isinstance(d, Scale) and d.assignment is None and d.operator in p.dep.tasks \
                    and len(p.dep.tasks[d.operator]) == d.parallelism:
                raise RescaleRefused(f"{d.operator!r} already runs {d.parallelism} tasks")
            strategy = requested_strategy(d.strategy, d.balance, d.projected_costs)
            report = await p.run_rescale(
                d.operator, d.parallelism, d.protocol,
                None if strategy is not None else d.assignment, d.planning, by, strategy)
            return str(report)
        if isinstance(d, Place):
            report = await p.run_placement(d.operator, d.task_index, d.node, "drrs", by)
            return str(report)
        if isinstance(d, ChangeLogic):
            return str(await p.run_change_logic(d.operator, d.fn))
        raise ControllerError(f"unknown decision {d!r}")

    def _record(self, controller: str, d: Any, outcome: DecisionOutcome, detail: str = "",
                seconds: float = 0.0) -> DecisionRecord:
        rec = self.decision_log.add(record_of(self.port.clock.now(), controller, d, outcome,
                                              detail, seconds))
        level = {DecisionOutcome.NO_CHANGE: logging.DEBUG, DecisionOutcome.EXECUTED: logging.INFO
                 }.get(outcome, logging.WARNING)
        log.log(level, "job %s: %s", self.port.job_id, rec)
        self.port.decided(self.decision_log.records())
        return rec

    # ------------------------------------------------------------------ the view
    async def view(self, group_stats: bool = False) -> JobView:
        """The job as a controller sees it now (per key group load and size when asked:
        one ``GroupStatsRequest`` per keyed task, within ``Deadlines.task_poll_s``)."""
        p = self.port
        dep, plan = p.dep, p.dep.plan
        nkg = plan.num_key_groups
        ops: dict[str, OperatorView] = {}
        for v in plan.vertices:  # asks each task's node once, later calls read the cache
            await p.placement(v.name)
        dep, plan = p.dep, p.dep.plan
        for v in plan.vertices:
            tasks = dep.tasks[v.name]
            ops[v.name] = OperatorView(
                v.name, tuple(o.name for o in v.operators), v.head.kind, v.keyed,
                len(tasks), nkg, tuple(e.src for e in plan.inputs_of(v.name)),
                tuple(e.dst for e in plan.outputs_of(v.name)), tuple(tasks),
                tuple(dep.assignments.get(v.name, ())),
                tuple(p.nodes.get(t, "") for t in tasks),
                tuple(sorted({e.dst if e.src == v.name else e.src
                              for e in plan.forward_edges_of(v.name)})),
                plan.forward_root(v.name), task_cpus=p.config.task_num_cpus)
        loads: dict[str, tuple[float, ...]] = {}
        sizes: dict[str, tuple[int, ...]] = {}
        if group_stats:
            loads, sizes = await self._group_stats([v.name for v in plan.vertices if v.keyed])
        cpus, cpus_available = await _cluster_cpus()
        return JobView(p.job_id, p.clock.monotonic(), nkg, ops,
                       p.rescaling_operators, bool(p.finished),
                       self.last_rescale_end, tuple(self.records), loads, sizes,
                       tuple(p.alive_nodes()), cpus=cpus, cpus_available=cpus_available)

    async def _group_stats(self, vertices: list[str]
                           ) -> tuple[dict[str, tuple[float, ...]], dict[str, tuple[int, ...]]]:
        p = self.port
        nkg = p.dep.plan.num_key_groups
        calls = {(v, t): asyncio.ensure_future(p.call(t, GroupStatsRequest()))
                 for v in vertices for t in p.dep.tasks[v] if t in p.handles}
        if not calls:
            return {}, {}
        await asyncio.wait(calls.values(), timeout=p.deadlines.task_poll_s)
        loads: dict[str, list[float]] = {v: [0.0] * nkg for v in vertices}
        sizes: dict[str, list[int]] = {v: [0] * nkg for v in vertices}
        complete = set(vertices)
        for (v, _), f in calls.items():
            if not f.done() or f.cancelled() or f.exception() is not None:
                f.cancel()
                complete.discard(v)
                continue
            reply = f.result()
            for kg, records, size, *_ in reply.groups:  # then the group's keys
                loads[v][kg] = records / reply.seconds if reply.seconds > 0 else 0.0
                sizes[v][kg] = size
        return ({v: tuple(loads[v]) for v in complete}, {v: tuple(sizes[v]) for v in complete})

    # ------------------------------------------------------------------ the driver's view
    def window(self, seconds: float) -> MetricsWindow | None:
        """The latest metrics window of up to ``seconds``, from the end of the last rescale
        on (a window spanning one misses the tasks that left); None before two polls."""
        order = [v.name for v in self.port.dep.plan.vertices]
        since = float("-inf") if self.last_rescale_end is None else self.last_rescale_end
        return self.history.window(seconds, since, order=order)


__all__ = ["ControllerRunner"]


async def _cluster_cpus() -> tuple[float | None, float | None]:
    """The cluster's CPUs and those no actor reserves (Ray's ``cluster_resources`` and
    ``available_resources``: calls to the GCS, so off the event loop); None where Ray
    cannot say, and a controller then bounds nothing by them."""
    import ray

    def read() -> tuple[float | None, float | None]:
        total = ray.cluster_resources().get("CPU")
        free = ray.available_resources().get("CPU")
        return (None if total is None else float(total),
                None if free is None else float(free))

    try:
        return await asyncio.to_thread(read)
    except Exception:  # noqa: BLE001 - a view without the bound beats no view
        log.debug("Ray did not say how many CPUs the cluster has", exc_info=True)
        return None, None
