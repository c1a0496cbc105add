"""Shared fixtures: one local Ray cluster for the whole session (real Ray, no mocks)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# Every Ray this test process or its children start without an address is a new local one:
# never the cluster another process recorded with `ray start` or ray.cluster_utils (which a
# bare ray.init() would join). Tests that want a cluster pass its address explicitly.
os.environ.setdefault("RAY_ADDRESS", "local")


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    from engine.runtime import local_ray

    if not ray.is_initialized():
        # workers import classes defined in test modules (tests.*) from the repo root
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        # a local start that times out on a busy machine is retried (local_ray.connect)
        local_ray.connect(num_cpus=2, include_dashboard=False, namespace="reflow",
                          configure_logging=False, log_to_driver=False,
                          runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield ray
    ray.shutdown()
