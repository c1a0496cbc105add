"""The Ray shells, the only place Ray is applied: the task actor (``task_actor``, its data
connections in ``connections``), the JobMaster (``job_master``, with rescales in
``rescaling``, replication in ``replicas`` and the watch over its actors in ``watch``),
the driver's handle (``handle``) and the Spark bridge actor (``spark_bridge``). Logic
lives in pure classes (``engine.task.core.TaskCore``, ``migration.participant``,
``migration.coordinator``; here ``health``: task health and the standby pool, ``deadlines``:
every control deadline, ``failures``: Ray's errors as reflow's); the shells move bytes,
apply commands and wait."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.runtime.handle import JobHandle, deploy
    from engine.runtime.job_master import NAMESPACE


def __getattr__(name: str) -> Any:
    # lazy: a task actor's worker imports engine.runtime.task_actor, which must not pull in
    # the JobMaster, the handle and the migration coordinator (each new actor pays it)
    if name in ("JobHandle", "deploy"):
        from engine.runtime import handle

        return getattr(handle, name)
    if name == "NAMESPACE":
        from engine.runtime.job_master import NAMESPACE

        return NAMESPACE
    raise AttributeError(f"module 'engine.runtime' has no attribute {name!r}")

__all__ = ["NAMESPACE", "JobHandle", "deploy"]
