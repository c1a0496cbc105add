"""The Ray shells, the only place Ray is applied: the task actor (``task_actor``, its data
connections in ``connections``), the JobMaster (``job_master``, the one writer of the
job's ``engine.control.job_state.JobRecord``; its helpers: rescales in ``rescaling``,
recovery in ``recovery``, checkpoints in ``checkpointing``, controllers in
``controller_runner``, changes of logic in ``logic``, replication in ``replicas``, the
watch over its actors in ``watch``, each holding a narrow port (``ports``) instead of the
JobMaster, and the arbiter's futures in ``arbitration``; a detached job's durable record
and takeover in ``failover``; whether Ray's GCS answers in ``gcs``), the driver's handle
(``handle``)
and the Spark bridge actor (``spark_bridge``). Logic lives in pure classes
(``engine.task.core.TaskCore``, ``migration.participant``, ``migration.coordinator``,
``engine.control.arbiter``; here ``health``: task health and the standby pool,
``deadlines``: every control deadline, ``failures``: Ray's errors as reflow's); the shells
move bytes, apply commands and wait. The modules here import each other without a cycle
(``job_master`` is imported by ``handle`` and ``registry`` only; no helper does)."""

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
