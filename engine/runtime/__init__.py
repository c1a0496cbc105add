"""The Ray shells, the only place Ray is applied: the task actor (``task_actor``), the
JobMaster (``job_master``, with replication in ``replicas``), the driver's handle
(``handle``) and the Spark bridge actor (``spark_bridge``). Logic lives in pure classes
(``engine.task.TaskCore``, ``migration.participant``, ``migration.coordinator``); the
shells move bytes, apply commands and wait."""

from engine.runtime.handle import JobHandle, deploy
from engine.runtime.job_master import NAMESPACE

__all__ = ["NAMESPACE", "JobHandle", "deploy"]
