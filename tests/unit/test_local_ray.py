"""``engine.runtime.local_ray.connect``: a local Ray start that times out is retried, other
errors are not, an address is tried once, and giving up is a ``RayUnavailable``. Ray's
``init`` is replaced by a function that fails as Ray does (no cluster is started)."""

from __future__ import annotations

import pytest

from engine.errors import RayUnavailable
from engine.runtime import local_ray

TIMEOUT = Exception("The current node timed out during startup. This could happen because "
                    "some of the raylet failed to startup or the GCS has become overloaded.")


class FlakyInit:
    """Fails with ``errors`` in turn, then returns ``"connected"``; records its calls."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls: list[dict] = []

    def __call__(self, **kwargs):
        self.calls.append(kwargs)
        if self.errors:
            raise self.errors.pop(0)
        return "connected"


@pytest.fixture(autouse=True)
def _no_ray_address(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(local_ray, "_recorded_cluster_is_gone", lambda: False)


def test_a_local_start_that_times_out_is_tried_again():
    init = FlakyInit(TIMEOUT, TIMEOUT)
    assert local_ray.connect(init=init, num_cpus=2) == "connected"
    assert len(init.calls) == 3
    assert all(c == {"address": None, "num_cpus": 2} for c in init.calls)


def test_giving_up_raises_ray_unavailable_with_the_cause_and_what_to_do():
    init = FlakyInit(TIMEOUT, TIMEOUT)
    with pytest.raises(RayUnavailable) as info:
        local_ray.connect(init=init, attempts=2)
    assert len(init.calls) == 2
    assert info.value.__cause__ is TIMEOUT
    assert "2 attempts" in str(info.value) and "ray start --head" in str(info.value)
    assert "load average" in str(info.value)


def test_other_errors_of_init_are_not_retried():
    boom = ValueError("bad runtime_env")
    init = FlakyInit(boom)
    with pytest.raises(ValueError) as info:
        local_ray.connect(init=init)
    assert info.value is boom and len(init.calls) == 1


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_an_address_is_tried_once(monkeypatch, how):
    if how == "environment":
        monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    init = FlakyInit(TIMEOUT)
    with pytest.raises(RayUnavailable, match="127.0.0.1:6379"):
        local_ray.connect("127.0.0.1:6379" if how == "argument" else None, init=init)
    assert len(init.calls) == 1


def test_descendants_of_this_process_exclude_itself_and_strangers():
    import os

    mine = local_ray._descendants(os.getpid())
    assert os.getpid() not in mine
    assert 1 not in mine  # init is nobody's child


@pytest.mark.parametrize("value, expected", [(None, None), ("", None), ("local", None),
                                             ("10.0.0.1:6379", "10.0.0.1:6379")])
def test_ray_address_local_or_empty_is_no_address(monkeypatch, value, expected):
    if value is not None:
        monkeypatch.setenv("RAY_ADDRESS", value)
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert local_ray.address_from_env() == expected
    assert local_ray.submitted() is (expected is not None)


def test_a_submitted_job_counts_as_submitted(monkeypatch):
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    assert local_ray.submitted()


def test_ray_address_local_starts_locally_with_retries(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "local")
    init = FlakyInit(TIMEOUT)
    assert local_ray.connect(init=init) == "connected"
    assert len(init.calls) == 2


def test_a_recorded_cluster_that_is_gone_is_not_joined(monkeypatch):
    monkeypatch.setattr(local_ray, "_recorded_cluster_is_gone", lambda: True)
    init = FlakyInit()
    local_ray.connect(init=init)
    assert init.calls == [{"address": "local"}]


def test_a_live_recorded_cluster_is_left_to_ray(monkeypatch):
    monkeypatch.setattr(local_ray, "_recorded_cluster_is_gone", lambda: False)
    init = FlakyInit()
    local_ray.connect(init=init)
    assert init.calls == [{"address": None}]
