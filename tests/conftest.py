"""Shared fixtures: one local Ray cluster for the whole session (real Ray, no mocks)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_DEDUP_LOGS", "0")


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, namespace="reflow",
                 configure_logging=False, log_to_driver=False)
    yield ray
    ray.shutdown()
