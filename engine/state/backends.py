"""The keyed state backend a task gets, from its job's configuration.

Why one factory: the operator chain (``engine.operators.chain``) builds a keyed task's
backend, and the choice between the in-memory and the RocksDB backend, where the RocksDB
one lives on disk and how much memory it takes, are the job's (``JobConfig.state_backend``,
``state_dir``, ``state_memory_bytes``), not the chain's.

Layout on disk (RocksDB only)::

    <state_dir>/<job id>/<task name>/<pid>-<random>/   one running task's backend
        reflow.lock                                    flock'ed while the backend is open
        db/                                            its RocksDB

Guarantees: every backend this returns has its own directory (the instance part is new
each time), so two tasks, or a task and its replacement in one process, never share one.
Task actors are killed (``ray.kill``) rather than closed, so before a task opens its
directory it removes every instance directory under the state root that no backend uses:
its process is gone (or is this one) and its lock is free. What a killed task, a task
removed by a rescale or a finished job left on a node is deleted when the next RocksDB
task starts there; a live backend's directory is never touched. ``state_dir`` must be
local to the node (process ids and ``flock`` are). Errors creating or opening a
directory are ``StateBackendError`` naming the path and the task.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import tempfile
import uuid
from typing import Protocol

from engine.names import StateBackend
from engine.state.keyed import KeyedStateBackend


class StateConfig(Protocol):
    """What the factory reads of a job's configuration (``engine.dataflow.config.JobConfig``
    has these fields; state sits below dataflow, so it names them rather than import it)."""

    @property
    def state_backend(self) -> str: ...
    @property
    def state_dir(self) -> str | None: ...
    @property
    def state_memory_bytes(self) -> int: ...

#: the folder of the system's temporary directory under which tasks keep RocksDB state
#: when ``JobConfig.state_dir`` is None
DEFAULT_STATE_FOLDER = "reflow-state"
LOCK_FILE = "reflow.lock"  # flock'ed in an instance directory while it is in use
#: the folder under a node's state root where a restore unpacks a DB checkpoint's files
#: (engine.checkpoints.snapshot.read_db_groups), one temporary folder per restore
RESTORE_FOLDER = "restore"
#: a restore's folder in it: ``<prefix><pid>-<random>`` (``remove_orphaned_restores``)
RESTORE_PREFIX = "reflow-restore-db-"


def state_root(config: StateConfig) -> str:
    """The directory under which this node's tasks of jobs with ``config`` keep state."""
    return config.state_dir or os.path.join(tempfile.gettempdir(), DEFAULT_STATE_FOLDER)


def path_component(name: str) -> str:
    """``name`` as one path component (task names hold ``/`` and spaces at times)."""
    return re.sub(r"[^A-Za-z0-9._=-]", "_", name) or "_"


def task_state_dir(config: StateConfig, job_id: str, task_name: str) -> str:
    """The folder of every instance of task ``task_name`` of job ``job_id`` on this node."""
    return os.path.join(state_root(config), path_component(job_id or "job"), path_component(task_name or "task"))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True


def _abandoned(instance: str) -> bool:
    """An instance directory no backend uses: its process is gone (or is this one), and
    its lock is free. A directory of another live process is never taken, even unlocked:
    that process may be between creating it and locking it."""
    pid_text = os.path.basename(instance).split("-", 1)[0]
    if not pid_text.isdigit():
        return False  # not one this module made
    pid = int(pid_text)
    if pid != os.getpid() and _pid_alive(pid):
        return False
    try:
        lock = open(os.path.join(instance, LOCK_FILE), "ab")  # noqa: SIM115 - closed below
    except OSError:
        return False
    with lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # a live backend's (of this process)
        return True


def remove_orphaned_restores(scratch: str) -> list[str]:
    """Delete the restore folders under ``scratch`` (``<state root>/RESTORE_FOLDER``) whose
    process is gone (killed during a restore: nothing else would delete them, and from a
    remote store they hold copies of a DB's files); returns them. A folder of a live
    process is left alone."""
    removed = []
    for path in _subdirs(scratch):
        name = os.path.basename(path)
        if not name.startswith(RESTORE_PREFIX):
            continue
        pid = name[len(RESTORE_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or _pid_alive(int(pid)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _subdirs(path: str) -> list[str]:
    try:
        return [e.path for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def remove_abandoned(root: str) -> list[str]:
    """Remove the instance directories under ``root`` (``<job>/<task>/<instance>``) that no
    backend uses (``_abandoned``: killed tasks', tasks' removed by a rescale or a job's
    end, whose actors are killed without closing); returns them. The job and task folders
    stay (empty folders cost nothing, and another process may be creating an instance
    in one)."""
    removed: list[str] = []
    for job in _subdirs(root):
        for task in _subdirs(job):
            for instance in _subdirs(task):
                if _abandoned(instance):
                    shutil.rmtree(instance, ignore_errors=True)
                    removed.append(instance)
    return removed


def make_keyed_backend(config: StateConfig, num_key_groups: int, job_id: str = "",
                       task_name: str = "") -> KeyedStateBackend:
    """A new, empty keyed state backend for task ``task_name`` of job ``job_id``, of the
    kind ``config.state_backend`` names. The caller closes it (``close()``) when the task
    stops; a RocksDB backend then deletes its directory."""
    if config.state_backend == StateBackend.MEMORY:
        return KeyedStateBackend(num_key_groups)
    from engine.state.rocksdb import RocksDBKeyedStateBackend  # rocksdict only when used

    task_dir = task_state_dir(config, job_id, task_name)
    remove_abandoned(state_root(config))
    directory = os.path.join(task_dir, f"{os.getpid()}-{uuid.uuid4().hex[:12]}")
    memory = config.state_memory_bytes
    write_buffers = max(memory // 4, 2 << 20)
    objects = memory // 8
    timers = memory // 32  # the timers' caches (engine.state.rocksdb_timers)
    return RocksDBKeyedStateBackend(
        num_key_groups, directory, task=task_name,
        block_cache_bytes=max(memory - write_buffers - objects - timers, 1 << 20),
        write_buffer_bytes=write_buffers, owns_directory=True, object_cache_bytes=objects,
        timer_cache_bytes=timers)

