"""``JobPort``: what the JobMaster's helpers may read of their job and ask of the runtime.

Why: the helpers (rescales, recovery, checkpoints, controllers, changes of logic, replicas,
the watch) used to hold the JobMaster itself, read and write any of its fields and import
it (an import cycle). Each now holds a port typed by a ``Protocol``: this base, read-only
views of the job (its ``JobRecord``, configuration, clock, deadlines, metrics) and the
calls every helper needs (a control call to a task, failing the job), extended in each
helper's module by the few requests that helper alone makes (e.g. ``RescalePort``). The
JobMaster implements every port; only it writes the job's record, so every change a helper
makes to the job is a request named in its port. No runtime module but ``handle`` imports
``job_master``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Set
from typing import Any, Protocol

from engine.control.job_state import JobRecord
from engine.dataflow.config import JobConfig
from engine.dataflow.deployment import Deployment
from engine.observability.metrics import JobCollector
from engine.runtime.deadlines import Deadlines
from engine.time.clock import Clock


class JobPort(Protocol):
    """The reads and requests every helper may use (see the module doc)."""

    @property
    def job_id(self) -> str: ...

    @property
    def config(self) -> JobConfig: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def deadlines(self) -> Deadlines: ...

    @property
    def collector(self) -> JobCollector: ...

    @property
    def record(self) -> JobRecord:
        """The job's state now (a frozen value: read it again after an await)."""
        ...

    @property
    def dep(self) -> Deployment:
        """``record.deployment``."""
        ...

    @property
    def handles(self) -> Mapping[str, Any]:
        """The live task actors by task name."""
        ...

    @property
    def finished(self) -> Set[str]:
        """The tasks whose input ended."""
        ...

    async def call(self, task: str, msg: Any, introduce: Any = ()) -> Any:
        """A control message to ``task``, its decoded reply."""
        ...

    async def each(self, tasks: list[str], call: Any, deadline: float) -> None:
        """``call(task)`` for every task at once, all answered by ``deadline``."""
        ...

    def changed(self) -> asyncio.Event:
        """Set at the next change of the job (a report, a failure, a stop)."""
        ...

    async def fail(self, error: str) -> None:
        """The job failed (the restart strategy decides what follows)."""
        ...


__all__ = ["JobPort"]
