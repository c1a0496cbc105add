"""A task's operator chain: what a record goes through inside one task (pure).

Why apart from the task core: the core (``engine.task.core``) schedules inputs, aligns barriers
and handles control; the chain is fixed when the task is deployed: the keyed head (with
the task's state backend) or none, then the stateless operators, then the sink. Keeping it
apart keeps the core about scheduling, and gives one place that opens, flushes and closes
every writer a task owns (sinks, late-data sinks, dead-letter sinks).

Format: ``process``/``process_rest`` take and return (values, timestamps), as the runners
do (``engine.operators.builtin``, ``engine.operators.vectorised``): parallel lists, or a
``engine.columnar.batches.ColumnBatch`` with a numpy array of timestamps; what comes out is for
the task's output router.

Guarantees: every writer is opened once, in the constructor; ``flush`` and ``close`` reach
each of them, dead-letter writers included, and so do the two-phase commit calls
(``begin_transactions``, ``pre_commit``, ``commit``: ``engine.io.sinks``), which name each
writer by ``writer_names``: the sink operator's name, ``<head>/late`` for the late-data
sink, ``<operator>/dead-letter`` for a dead-letter sink. Errors of user functions are
raised as the runners raise them (``UserFunctionError`` and friends); the core decides
what they do.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from engine.dataflow import graph as g
from engine.dataflow.config import JobConfig
from engine.io.sinks import SinkWriter
from engine.operators.builtin import (
    Batch,
    ErrorPolicy,
    KeyedRunner,
    Records,
    Stamps,
    StatelessRunner,
)
from engine.operators.vectorised import AggregateRunner, MapBatchesRunner
from engine.operators.window_aggregates import WindowAggregateRunner
from engine.state.backends import make_keyed_backend
from engine.state.keyed import KeyedStateBackend
from engine.time.clock import Clock


def writer_names(operators: tuple[g.OperatorDef, ...]) -> list[str]:
    """The names of the writers a task of these operators owns (``all_writers``): sinks by
    operator, ``<operator>/late``, ``<operator>/dead-letter``. Stable across restarts and
    parallelisms, so a checkpoint's sink transactions find their writer again."""
    out = []
    for op in operators:
        if op.kind == g.SINK:
            out.append(op.name)
        if op.late_sink is not None and op.keyed:
            out.append(late_writer(op.name))
        if op.dead_letter is not None:
            out.append(dead_letter_writer(op.name))
    return out


def late_writer(operator: str) -> str:
    return f"{operator}/late"


def dead_letter_writer(operator: str) -> str:
    return f"{operator}/dead-letter"


class OperatorChain:
    """The operators of task ``task_index`` of ``parallelism`` (a source head is not run
    here). ``keyed``/``backend``: the keyed head and its state backend, owning
    ``key_groups`` (None when the head is not keyed); ``runners``: the operators after it.
    ``watermark``: the watermark user code sees. ``config``/``job_id``/``task_name``: which
    state backend the keyed head gets and where (``engine.state.backends``; no config: the
    in-memory one); ``close_state`` releases it."""

    def __init__(self, operators: tuple[g.OperatorDef, ...], task_index: int, parallelism: int,
                 num_key_groups: int, key_groups: tuple[int, ...], clock: Clock,
                 watermark: Callable[[], int], config: JobConfig | None = None,
                 job_id: str = "", task_name: str = "") -> None:
        self.task_index, self.parallelism, self.clock = task_index, parallelism, clock
        self.writers: dict[str, SinkWriter] = {}
        self.policies: list[ErrorPolicy] = []
        self.backend: KeyedStateBackend | None = None
        self.keyed: KeyedRunner | None = None
        head = operators[0]
        for op in operators:
            if op.kind == g.SINK:
                self.writers[op.name] = op.fn.open(task_index, parallelism, clock)
        if head.keyed:
            self.backend = (KeyedStateBackend(num_key_groups) if config is None else
                            make_keyed_backend(config, num_key_groups, job_id, task_name))
            # a chain dropped without close_state (a task replaced in this process) or the
            # process exiting still releases a RocksDB backend's files
            weakref.finalize(self, self.backend.close)
            for kg in key_groups:
                self.backend.own(kg)
            late = None
            if head.late_sink is not None:
                late = head.late_sink.open(task_index, parallelism, clock)
                self.writers[late_writer(head.name)] = late
            keyed_runner = {g.AGGREGATE: AggregateRunner,
                            g.WINDOW_AGGREGATE: WindowAggregateRunner}.get(head.kind, KeyedRunner)
            self.keyed = keyed_runner(head, self._policy(head), self.backend, task_index, clock,
                                      watermark, late)
        rest = operators[1:] if (head.kind == g.SOURCE or head.keyed) else operators
        self.runners = [(MapBatchesRunner if op.kind == g.MAP_BATCHES else StatelessRunner)(
            op, self._policy(op), self.writers.get(op.name)) for op in rest]
        self.has_sink = any(op.kind == g.SINK for op in operators)

    def _policy(self, op: g.OperatorDef) -> ErrorPolicy:
        writer = None
        if op.dead_letter is not None:
            writer = op.dead_letter.open(self.task_index, self.parallelism, self.clock)
        pol = ErrorPolicy(op.name, self.task_index, writer)
        self.policies.append(pol)
        return pol

    def prepare(self, operator: str, fn: Any) -> None:
        """Make ``fn`` ready to replace ``operator``'s function (a keyed one is opened on
        this task's state now, so an ``open`` that raises refuses the change before any
        task switches); ``ValueError`` when the operator is not in this chain."""
        if self.keyed is not None and self.keyed.op.name == operator:
            self.keyed.prepare(fn)
        elif not any(r.op.name == operator for r in self.runners):
            raise ValueError(f"operator {operator!r} is not in this task's chain")

    def switch(self, operator: str, fn: Any) -> None:
        """``operator`` runs ``fn`` (prepared) from the next record on; state stays."""
        if self.keyed is not None and self.keyed.op.name == operator:
            self.keyed.use(fn)
            return
        for r in self.runners:
            if r.op.name == operator:
                r.op, r.fn = replace(r.op, fn=fn), fn
                return
        raise ValueError(f"operator {operator!r} is not in this task's chain")

    def process(self, values: Records, timestamps: Stamps, keys: Any = None,
                kgs: Any = None, port: int = 0) -> Batch:
        """Records through the whole chain (the keyed head needs ``keys`` and ``kgs``)."""
        if self.keyed is not None:
            values, timestamps = self.keyed.process(values, timestamps, keys, kgs, port)
        return self.process_rest(values, timestamps)

    def process_rest(self, values: Records, timestamps: Stamps) -> Batch:
        """Records through the operators after the head (a source's or timers' output)."""
        for r in self.runners:
            if not values:
                break
            values, timestamps = r.process(values, timestamps)
        return values, timestamps

    def all_writers(self) -> dict[str, SinkWriter]:
        """Every writer of the task by a name stable across restarts: sinks by operator,
        late-data sinks as ``<operator>/late``, dead-letter sinks as
        ``<operator>/dead-letter``."""
        out = dict(self.writers)
        for p in self.policies:
            if p.dead_letter is not None:
                out[dead_letter_writer(p.operator)] = p.dead_letter
        return out

    def flush(self) -> None:
        for w in self.all_writers().values():
            w.flush()

    def begin_transactions(self) -> None:
        """Every writer keeps what it writes invisible until a commit (called once, before
        the first record, in a job that checkpoints: ``SinkWriter.begin_transactions``)."""
        for w in self.all_writers().values():
            w.begin_transactions()

    def pre_commit(self, checkpoint_id: int) -> tuple[tuple[str, Any], ...]:
        """Every writer's transaction for checkpoint ``checkpoint_id`` (``(writer,
        transaction)``; a writer that returns None has nothing to commit)."""
        out = []
        for name, w in self.all_writers().items():
            txn = w.pre_commit(checkpoint_id)
            if txn is not None:
                out.append((name, txn))
        return tuple(out)

    def commit(self, writer: str, transactions: list[Any]) -> None:
        """Commit ``writer``'s pre-committed transactions (a writer this task does not
        have, after a restore into another graph, is skipped)."""
        w = self.all_writers().get(writer)
        if w is not None and transactions:
            w.commit(transactions)

    def close(self) -> None:
        for w in self.all_writers().values():
            w.close()

    def close_state(self) -> None:
        """Release the state backend (a RocksDB one's DB and files) once the task is gone:
        apart from ``close``, which closes the writers when the input ends, while the
        task's state may still be snapshotted or measured. Idempotent."""
        if self.backend is not None:
            self.backend.close()

    @property
    def dead_letters(self) -> int:
        return sum(p.dead_letters for p in self.policies)
