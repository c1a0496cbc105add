"""The unit tier's rules, enforced on every test under tests/unit/.

Why: a unit test that sleeps is timing-dependent (it fails on a loaded machine or passes
without testing anything), and one that starts Ray is an integration test in disguise.
So, for the length of each unit test:

* ``time.sleep`` and ``asyncio.sleep`` called from this repository's code (the tests,
  engine/, migration/, controllers/, examples/) raise ``UnitTierViolation`` for any delay
  > 0 (``asyncio.sleep(0)``, a bare yield to the event loop, is allowed), and the test
  fails at teardown even if the code under test swallowed that error. Calls from the
  standard library or installed packages pass (``subprocess`` polls a child with short
  sleeps, which waits for an event, not for time);
* a test that initialises Ray fails (checked only when ``ray`` was imported; a cluster
  already up before the test, e.g. the integration tier's in a whole-suite run, does not
  count); that Ray is shut down so the tests after it start clean.

Tests that need real time or a real cluster belong in tests/integration/.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest

from engine.io.testing import TestingSink
from engine.time.clock import ManualClock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


def _from_this_repo(depth: int) -> bool:
    """Whether the frame ``depth`` levels above the caller runs code of this repository."""
    filename = os.path.abspath(sys._getframe(depth + 1).f_code.co_filename)
    return filename.startswith(ROOT) and "site-packages" not in filename


class UnitTierViolation(AssertionError):
    """A unit test slept or started Ray."""


_CALL_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_CALL_FAILED] = report.failed


def _ray_initialised() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and hasattr(ray, "is_initialized") and bool(ray.is_initialized())


@pytest.fixture(autouse=True)
def _unit_tier_rules(monkeypatch: pytest.MonkeyPatch,
                     request: pytest.FixtureRequest) -> Iterator[None]:
    attempts: list[str] = []
    real_async_sleep = asyncio.sleep

    def refuse(what: str, seconds: float) -> UnitTierViolation:
        msg = (f"{request.node.nodeid}: {what}({seconds!r}) in a unit test; act on events "
               "(a ManualClock, a gate, a returned future) or move the test to "
               "tests/integration/")
        attempts.append(msg)
        return UnitTierViolation(msg)

    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        if seconds > 0 and _from_this_repo(1):
            raise refuse("time.sleep", seconds)
        real_sleep(seconds)

    def async_sleep(delay: float, result: Any = None) -> Coroutine[Any, Any, Any]:
        # a plain function, so the caller's frame is the code that wrote asyncio.sleep(...)
        if delay > 0 and _from_this_repo(1):
            raise refuse("asyncio.sleep", delay)
        return real_async_sleep(delay, result)

    monkeypatch.setattr(time, "sleep", sleep)
    monkeypatch.setattr(asyncio, "sleep", async_sleep)
    monkeypatch.setattr(asyncio.tasks, "sleep", async_sleep)
    # a whole-suite run may reach here with the integration tier's session cluster still up:
    # only a test that started Ray itself is at fault (and only its Ray is shut down)
    ray_before = _ray_initialised()
    yield
    ray = sys.modules.get("ray")
    started_ray = not ray_before and _ray_initialised()
    if started_ray:
        ray.shutdown()
    if attempts and not request.node.stash.get(_CALL_FAILED, False):
        pytest.fail(attempts[0], pytrace=False)  # the code under test swallowed the error
    if started_ray:
        pytest.fail(f"{request.node.nodeid} initialised Ray; unit tests run without Ray "
                    "(move it to tests/integration/)", pytrace=False)


@pytest.fixture
def clock() -> ManualClock:
    """A manual clock (the engine's time, moved by the test)."""
    return ManualClock()


@pytest.fixture
def sink(tmp_path: Any) -> TestingSink:
    """An exactly-once testing sink writing under the test's temporary directory."""
    return TestingSink(str(tmp_path / "out"))
