"""The bench harness's start of a run: ``run.init_ray``, which cluster a benchmark
connects to (the connection itself is replaced by a recorder: this is the harness's
choice of arguments, not Ray; the scripts' quick runs on Ray are in tests/integration),
and ``provenance.begin``."""

from __future__ import annotations

from typing import Any

import pytest
import ray

from engine.runtime import local_ray
from examples.bench.harness import run


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, dict[str, Any]]]:
    calls: list[tuple[Any, dict[str, Any]]] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(local_ray, "connect",
                        lambda address=None, **kw: calls.append((address, kw)))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(local_ray, "submitted", lambda: False)
    return calls


def test_locally_a_benchmark_starts_its_own_ray(connects: list) -> None:
    run.init_ray()
    (address, kw), = connects
    assert address == local_ray.LOCAL
    assert run.ROOT in kw["runtime_env"]["env_vars"]["PYTHONPATH"]


def test_an_address_given_is_used_with_the_repository_on_the_workers_path(
        connects: list) -> None:
    """trisk.py and ds2.py pass the address of a cluster they started (it raised
    ``TypeError: connect() got multiple values for argument 'address'`` before)."""
    run.init_ray(address="127.0.0.1:6379", log_to_driver=False)
    (address, kw), = connects
    assert address == "127.0.0.1:6379"
    assert kw["log_to_driver"] is False
    assert run.ROOT in kw["runtime_env"]["env_vars"]["PYTHONPATH"]


def test_provenance_begin_records_the_date_and_the_config_of_the_parsed_arguments() -> None:
    """The papers scripts' results carry ``date`` and ``config`` (the arguments but those
    omitted, ``out`` relative to the repository); without arguments, neither."""
    import argparse
    import os

    from examples.bench.harness import ROOT, provenance

    args = argparse.Namespace(out=os.path.join(ROOT, "examples", "x"), rate=5, started=1.0)
    r = provenance.begin("examples/papers/drrs.py", ["--rate", "5"], args, omit=("started",))
    assert r["config"] == {"out": os.path.join("examples", "x"), "rate": 5}
    assert r["date"].endswith(" UTC") and len(r["date"]) == len("2026-11-28 16:25 UTC")
    bare = provenance.begin("examples/papers/drrs.py", [])
    assert "config" not in bare and "date" not in bare
