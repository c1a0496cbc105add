"""The Spark bridge's actor as a Ray actor class (``engine.spark.bridge.BridgeActor`` holds
its logic: per-partition queues of Arrow chunks between Spark's writers and reflow's source
tasks). Ray is applied here, as for every actor of reflow."""

from __future__ import annotations

import ray

from engine.spark.bridge import BridgeActor

RemoteBridge = ray.remote(max_restarts=0, max_task_retries=0)(BridgeActor)
