"""Jobs on the RocksDB state backend (``JobConfig(state_backend="rocksdb")``), in process.

The factory (``engine.state.backends``): the in-memory backend by default, a RocksDB one
in a directory of its own per task (what a killed task left removed at the next start,
a live backend's directory never touched), the configuration's fields validated.

Both oracles of ``tests/unit/test_oracle_jobs.py`` on RocksDB, with that module's own
case strategy, runner and comparison (imported, not copied): its ``JobConfig`` is
replaced, while an example runs, by one that adds ``state_backend="rocksdb"`` (a state
directory of the example's own and a small memory budget), so every keyed task of the
rescaled run, of the reference and of every restore runs on RocksDB:

* the live oracle, every live protocol, rescaling the keyed stages ``A`` or ``B`` (a
  source or stateless rescale moves no keyed state);
* the checkpoint oracle: checkpoints taken during the rescale, every task lost, the job
  restored from one taken mid-rescale and the rescale asked again.

An example fails unless every keyed backend was a RocksDB one and key-group state was
installed into RocksDB (moved by the rescale; restored by the checkpoint oracle): one that
moved or restored nothing proves nothing. Each example prints its ``Case`` (its seed
replays it: ``oj.run_case(Case(...))`` inside ``on_rocksdb``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import pytest
from hypothesis import Phase, given, note, seed, settings
from hypothesis import strategies as st

import engine.operators.chain as chain_module
from engine.dataflow.config import JobConfig, StateBackend
from engine.errors import ConfigError
from engine.state import backends
from engine.state.keyed import KeyedStateBackend
from engine.state.rocksdb import RocksDBKeyedStateBackend
from tests.unit import test_oracle_jobs as oj

# ---------------------------------------------------------------- configuration, factory


def test_state_backend_defaults_to_memory_and_parses_rocksdb() -> None:
    assert JobConfig().state_backend is StateBackend.MEMORY
    cfg = JobConfig(state_backend="rocksdb")
    assert cfg.state_backend is StateBackend.ROCKSDB and cfg.state_backend == "rocksdb"
    assert type(backends.make_keyed_backend(JobConfig(), 8)) is KeyedStateBackend


@pytest.mark.parametrize(("kwargs", "field_name"), [
    (dict(state_backend="leveldb"), "state_backend"),
    (dict(state_backend=1), "state_backend"),
    (dict(state_dir=""), "state_dir"),
    (dict(state_memory_bytes=1 << 20), "state_memory_bytes"),
    (dict(state_memory_bytes=2.5e8), "state_memory_bytes"),
], ids=lambda v: repr(v))
def test_state_fields_are_validated_naming_the_field(kwargs: dict[str, Any],
                                                     field_name: str) -> None:
    with pytest.raises(ConfigError, match=rf"^JobConfig: {field_name} must be "):
        JobConfig(**kwargs)


def test_each_task_gets_its_own_directory_and_close_removes_it(tmp_path: Any) -> None:
    cfg = JobConfig(state_backend="rocksdb", state_dir=str(tmp_path), state_memory_bytes=8 << 20)
    a = backends.make_keyed_backend(cfg, 8, "job-1", "A[0]")
    again = backends.make_keyed_backend(cfg, 8, "job-1", "A[0]")  # its replacement, same process
    other = backends.make_keyed_backend(cfg, 8, "job-1", "A[1]")
    try:
        assert isinstance(a, RocksDBKeyedStateBackend)
        assert isinstance(again, RocksDBKeyedStateBackend)
        assert isinstance(other, RocksDBKeyedStateBackend)
        dirs = {a.directory, again.directory, other.directory}
        assert len(dirs) == 3
        assert all(d.startswith(str(tmp_path / "job-1")) for d in dirs)
        assert os.path.dirname(a.directory) == backends.task_state_dir(cfg, "job-1", "A[0]")
        a.own(3)
        a.set_current("k", 3)
        a.table("s")["k"] = [1, 2]
        a.flush()
        assert a.estimated_group_bytes(3) > 0 and a.estimated_group_bytes(4) == 0
    finally:
        for b in (a, again, other):
            b.close()
    assert not os.listdir(backends.task_state_dir(cfg, "job-1", "A[0]"))


def test_what_a_killed_task_left_is_removed_when_it_starts_again(tmp_path: Any) -> None:
    cfg = JobConfig(state_backend="rocksdb", state_dir=str(tmp_path), state_memory_bytes=8 << 20)
    live, killed = (backends.make_keyed_backend(cfg, 8, "j", "B[0]") for _ in range(2))
    assert isinstance(live, RocksDBKeyedStateBackend)
    assert isinstance(killed, RocksDBKeyedStateBackend)
    killed.close(remove_files=False)  # as a killed task leaves it
    assert os.path.isdir(killed.directory)
    fresh = backends.make_keyed_backend(cfg, 8, "j", "B[0]")
    try:
        assert not os.path.exists(killed.directory)
        assert os.path.isdir(live.directory)  # its lock is held: left alone
        with open(os.path.join(live.directory, "reflow.lock"), "ab") as f, \
                pytest.raises(OSError):
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        live.close()
        fresh.close()


def test_only_directories_of_dead_processes_or_closed_backends_are_removed(
        tmp_path: Any) -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = tmp_path / "j" / "A_0_" / f"{int(done.stdout)}-abc"
    alive = tmp_path / "j" / "A_1_" / f"{os.getppid()}-abc"  # unlocked: it may be opening
    for d in (dead, alive):
        d.mkdir(parents=True)
        (d / "reflow.lock").touch()
    assert backends.remove_abandoned(str(tmp_path)) == [str(dead)]
    assert alive.is_dir() and not dead.exists()


def test_the_default_state_dir_is_under_the_temporary_directory() -> None:
    d = backends.task_state_dir(JobConfig(), "my job", "A/x[0]")
    assert d == os.path.join(tempfile.gettempdir(), "reflow-state", "my_job", "A_x_0_")


def test_the_backends_estimate_a_group_alike() -> None:
    with tempfile.TemporaryDirectory() as d:
        rocks = RocksDBKeyedStateBackend(8, d, block_cache_bytes=4 << 20,
                                         write_buffer_bytes=2 << 20)
        mem = KeyedStateBackend(8)
        try:
            for b in (rocks, mem):
                b.own(1)
                for k in range(500):
                    b.set_current(k, 1)
                    b.table("v")[k] = f"value-{k}"
                b.flush()
            r, m = rocks.estimated_group_bytes(1), mem.estimated_group_bytes(1)
            assert 0.5 * m <= r <= 2 * m, (r, m)
        finally:
            rocks.close()


# ---------------------------------------------------------------- the oracles on RocksDB


@dataclass
class Opened:
    """What an example's tasks did with state: their backends, and what RocksDB installed."""

    backends: list[KeyedStateBackend] = field(default_factory=list)
    installs: int = 0          # key groups installed with at least one entry
    installed_bytes: int = 0


@contextlib.contextmanager
def on_rocksdb() -> Iterator[Opened]:
    """While it is open, ``test_oracle_jobs`` builds its jobs on RocksDB (a state directory
    of their own); every backend opened is closed at the end."""
    opened = Opened()
    make = backends.make_keyed_backend
    install = RocksDBKeyedStateBackend.install

    def config(**kw: Any) -> JobConfig:
        return JobConfig(state_backend="rocksdb", state_dir=root, state_memory_bytes=8 << 20,
                         **kw)

    def tracked(*args: Any, **kw: Any) -> KeyedStateBackend:
        b = make(*args, **kw)
        opened.backends.append(b)
        return b

    def counted(self: RocksDBKeyedStateBackend, key_group: int, data: bytes) -> None:
        install(self, key_group, data)
        if any(len(t) for t in self.groups[key_group].values()):
            opened.installs += 1
            opened.installed_bytes += len(data)

    with tempfile.TemporaryDirectory(prefix="reflow-rocksdb-jobs-") as root, \
            mock.patch.object(oj, "JobConfig", config), \
            mock.patch.object(chain_module, "make_keyed_backend", tracked), \
            mock.patch.object(RocksDBKeyedStateBackend, "install", counted):
        try:
            yield opened
        finally:
            for b in opened.backends:
                b.close()


def _check(opened: Opened, what: str) -> None:
    assert opened.backends, "no keyed task was created"
    kinds = {type(b).__name__ for b in opened.backends}
    assert kinds == {"RocksDBKeyedStateBackend"}, f"not every task ran on RocksDB: {kinds}"
    assert opened.installs > 0, f"nothing was {what} into RocksDB: the example proves nothing"
    print(f"rocksdb-jobs: {len(opened.backends)} backends, {opened.installs} key groups "
          f"{what} ({opened.installed_bytes} bytes)")


KEYED = ("A", "B")
#: no shrinking: an example costs seconds, and the printed ``Case`` replays a failure
SETTINGS = {**oj.SETTINGS, "phases": (Phase.explicit, Phase.reuse, Phase.generate)}


def _live(protocol: str, examples: int, hypothesis_seed: int) -> Any:
    @seed(hypothesis_seed)
    @settings(max_examples=examples, **SETTINGS)
    @given(case=oj.cases(protocol=protocol, targets=KEYED))
    def test(case: oj.Case) -> None:
        note(f"{case}")
        with on_rocksdb() as opened:
            oj.run_case(case)
        _check(opened, "moved")

    return test


def _checkpoint(protocol: str, examples: int, hypothesis_seed: int) -> Any:
    @seed(hypothesis_seed)
    @settings(max_examples=examples, **SETTINGS)
    @given(case=oj.cases(protocol=protocol, targets=KEYED, late=False),
           crash_after=st.integers(1, 3))
    def test(case: oj.Case, crash_after: int) -> None:
        note(f"crash_after={crash_after} {case}")
        restores: list[int] = []
        restore = oj.harness.Checkpoints.restore

        def counted(self: Any, *args: Any, **kw: Any) -> Any:
            before = opened.installs
            plan = restore(self, *args, **kw)
            restores.append(opened.installs - before)
            return plan

        with on_rocksdb() as opened, \
                mock.patch.object(oj.harness.Checkpoints, "restore", counted), \
                tempfile.TemporaryDirectory(prefix="reflow-rocksdb-chk-") as root:
            oj.run_checkpoint_case(case, root, crash_after)
        _check(opened, "moved or restored")
        assert restores and all(restores), f"a restore installed no state: {restores}"

    return test


for _i, _p in enumerate(oj.PROTOCOLS):
    _name = _p.replace("-", "_")
    globals()[f"test_{_name}_rescale_on_rocksdb_equals_the_run_without"] = (
        _live(_p, 2, 20261128 + _i))
    globals()[f"test_{_name}_checkpoint_kill_restore_on_rocksdb_equals_the_run_without"] = (
        _checkpoint(_p, 1, 20261228 + _i))
