"""Connecting the driver to Ray, and starting a local Ray that survives a loaded machine.

Why: ``ray.init()`` without an address starts a local cluster, and Ray gives the new node a
fixed 30 s to register with its GCS (``ray._private.node``); on a busy two-core machine
(load 30 and more, measured here: 40 s for one start) it misses that now and then and
``ray.init`` raises a bare ``Exception`` ("The current node timed out during startup"),
leaving the node's processes running. A job, a benchmark or a test session that starts its
own Ray then fails for a reason that has nothing to do with it.

What ``connect`` does: with an address (argument or ``RAY_ADDRESS``) it connects once, as
``ray.init`` does. Without one it does what ``ray.init`` does (join the cluster that
``ray start`` recorded on this machine, else start a local one), except that a recorded
cluster that is gone (its GCS no longer runs: a crashed ``ray start`` or test cluster) is
ignored instead of failing the connection; and when a local start times out it stops what
that attempt left running (the processes it started, found as new children of this process
in ``/proc``) and tries again, ``attempts`` times in all. ``RAY_ADDRESS=local`` (Ray's own
word for "start a new local instance"; the test suite sets it so that no test joins another
process's cluster) counts as no address. Errors: ``RayUnavailable`` (a ``ReflowError``)
naming the address or the attempts and the load average, with Ray's error as the cause;
any other error of ``ray.init`` propagates unchanged.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from typing import Any

from engine.errors import RayUnavailable

START_ATTEMPTS = 3
_STARTUP_TIMEOUT = "timed out during startup"
LOCAL = "local"


def address_from_env() -> str | None:
    """``RAY_ADDRESS``, unless it is unset, empty or ``"local"``."""
    address = os.environ.get("RAY_ADDRESS")
    return None if not address or address == LOCAL else address


def submitted() -> bool:
    """Whether this driver runs against a given cluster (``RAY_ADDRESS``) or was submitted
    with ``ray job submit``, rather than starting its own local Ray."""
    return address_from_env() is not None or "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ


def connect(address: str | None = None, *, attempts: int = START_ATTEMPTS,
            init: Callable[..., Any] | None = None, **init_kwargs: Any) -> Any:
    """``ray.init(address=address, **init_kwargs)``, retried up to ``attempts`` times when it
    starts a local Ray that does not come up in time; returns what ``ray.init`` returned.
    ``init`` replaces ``ray.init`` (tests of the retry logic)."""
    import ray

    if init is None:
        init = ray.init
    local = address == LOCAL or (address is None and address_from_env() is None)
    if address is None and local and _recorded_cluster_is_gone():
        address = LOCAL
    tries = attempts if local else 1
    last: Exception | None = None
    for _ in range(tries):
        before = _descendants(os.getpid())
        try:
            return init(address=address, **init_kwargs)
        except Exception as exc:  # Ray raises a bare Exception on a startup timeout
            if _STARTUP_TIMEOUT not in str(exc):
                raise
            last = exc
            with contextlib.suppress(Exception):
                ray.shutdown()
            _stop(_descendants(os.getpid()) - before)
    where = (f"a local Ray did not start in {tries} attempts" if local
             else f"Ray at {address or address_from_env()} did not answer in time")
    raise RayUnavailable(
        f"{where} (load average {_load()}): {last}. Start Ray yourself (`ray start --head`) "
        "and pass its address (RAY_ADDRESS or job.run(address=...)), or retry when the "
        "machine is less busy") from last


def started_here() -> bool:
    """Whether the Ray this process is connected to was started by it (``ray.init()``
    without a cluster to join): it stops when this process exits."""
    try:
        from ray._private import worker
    except ImportError:  # another Ray version: say nothing
        return False
    node = getattr(worker, "_global_node", None)
    return bool(getattr(node, "head", False))


def _recorded_cluster_is_gone() -> bool:
    """Whether ``ray start`` recorded a cluster on this machine whose GCS no longer runs
    (``ray.init()`` would try to join it and fail). Ray's own lookups; False when they are
    not there (another Ray version): then Ray decides as it always does."""
    try:
        from ray._private import services, utils

        recorded = utils.read_ray_address(None)
        if not recorded:
            return False
        # an lru_cache'd function, which ray annotates as a plain callable
        services.find_gcs_addresses.cache_clear()  # type: ignore[attr-defined]
        return recorded not in services.find_gcs_addresses()
    except Exception:
        return False


def _load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (Linux ``/proc``; empty where there is none)."""
    parents: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return set()
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
        parents.setdefault(ppid, []).append(int(entry))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), ()):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def _stop(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
