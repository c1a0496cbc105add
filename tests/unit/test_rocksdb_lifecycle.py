"""When a task's RocksDB backend is released, and what a corrupt restore says (in process).

A task's backend is closed, and its directory removed, when the task is stopped
(``StopTask``: a job's stop or end, a task removed by a live scale-in), not only when its
chain is garbage-collected; a stopped task still answers for its metrics. A key-group blob
that passed the store's checksum but does not decode is a ``RestoreError`` naming the task
and the key group (so recovery falls back to an older checkpoint), on both backends.

The job runs on ``tests.oracle_net.OracleNet`` (the engine's cores, deploy steps and rescale
coordinator, in this process); every core ever created stays reachable there, so a backend
closed here was closed by the task's stop, not by a finalizer.
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

from engine.api import StreamJob
from engine.dataflow.config import JobConfig
from engine.errors import RestoreError
from engine.io.testing import TestingSource
from engine.state.rocksdb import RocksDBKeyedStateBackend
from engine.task.core import TaskCore
from engine.wire.messages import InstallKeyGroups, StopTask
from migration.coordinator import RescaleRequest
from tests import harness
from tests.oracle_net import MemorySink, OracleNet

N = 16  # key groups


def _add(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return a[0], a[1] + b[1]


def _key(r: tuple[int, int]) -> int:
    return r[0]


def _job(config: JobConfig, records: int = 600, parallelism: int = 3) -> tuple[StreamJob,
                                                                                MemorySink]:
    sink = MemorySink()
    job = StreamJob("lifecycle", num_key_groups=N, config=config)
    data = [(i % 40, 1) for i in range(records)]
    (job.source(TestingSource(data, partitions=2), name="src", parallelism=2)
        .key_by(_key).reduce(_add, name="A", parallelism=parallelism)
        .sink(sink, name="out", parallelism=1))
    return job, sink


def _rocks(core: TaskCore) -> RocksDBKeyedStateBackend:
    b = core.backend
    assert isinstance(b, RocksDBKeyedStateBackend), type(b)
    return b


def _half_way(net: OracleNet, rng: random.Random, records: int) -> None:
    for _ in range(100_000):
        done = sum(len(c.spec.operators[0].fn.records) - harness.records_left(c)
                   for c in net.sources())
        if done >= records // 2:
            return
        net.round(rng, keep_back=50)
    raise AssertionError("the sources never emitted half their input")


def test_stopped_and_scaled_in_tasks_close_their_rocksdb_backend_and_remove_its_directory(
        tmp_path: Any) -> None:
    cfg = JobConfig(state_backend="rocksdb", state_dir=str(tmp_path), linger_ms=0,
                    metrics_port=None, state_memory_bytes=8 << 20)
    job, sink = _job(cfg)
    rng = random.Random(29)
    net = OracleNet(job)
    try:
        a_tasks = [net.cores[n] for n in net.dep.tasks["A"]]
        dirs = {c.name: _rocks(c).directory for c in a_tasks}
        assert all(os.path.isdir(d) for d in dirs.values()), dirs
        _half_way(net, rng, 600)
        # drrs scale-in 3 -> 2: the task removed stops (StopTask) once its groups moved
        _, report, _ = harness.rescale(net, RescaleRequest("A", 2, "drrs"),
                                       lambda: net.round(rng, 50), after_send=net.after_send,
                                       max_rounds=20000)
        assert report.key_groups_moved > 0, report
        gone = [c for c in a_tasks if c.name not in net.dep.tasks["A"]]
        stay = [c for c in a_tasks if c.name in net.dep.tasks["A"]]
        assert len(gone) == 1 and len(stay) == 2, net.dep.tasks["A"]
        assert gone[0].status == "stopped"
        assert _rocks(gone[0])._db is None, "the removed task's backend is still open"
        assert not os.path.exists(dirs[gone[0].name]), "the removed task left its directory"
        assert gone[0].metrics().state_bytes == 0  # a stopped task still reports
        assert all(os.path.isdir(dirs[c.name]) for c in stay)
        net.finish(rng)
        assert sorted(sink.results())[-1][1] > 0
        # finished, the tasks still hold their state (a final checkpoint may read it) ...
        assert all(_rocks(c)._db is not None for c in stay)
        # ... until the job stops them (JobMaster._stop_tasks)
        for c in stay:
            harness.control(c, StopTask())
            assert _rocks(c)._db is None and not os.path.exists(dirs[c.name])
        left = [os.path.join(r, d) for r, ds, _ in os.walk(tmp_path) for d in ds
                if d.split("-", 1)[0].isdigit()]
        assert not left, f"instance directories left after the job: {left}"
    finally:
        for c in net.all_cores:
            if c.backend is not None:
                c.backend.close()
        sink.drop()


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_a_blob_that_does_not_decode_is_a_restore_error_naming_task_and_group(
        tmp_path: Any, backend: str) -> None:
    cfg = JobConfig(state_backend=backend, state_dir=str(tmp_path), linger_ms=0,
                    metrics_port=None, state_memory_bytes=8 << 20)
    job, sink = _job(cfg, parallelism=1)
    net = OracleNet(job)
    try:
        core = net.cores[net.dep.tasks["A"][0]]
        with pytest.raises(RestoreError, match=rf"task {core.name}: key group 3 of the "
                                               r"checkpoint does not decode") as err:
            core.handle(InstallKeyGroups(((3, b"\x93\xa5not a group"),)))
        assert err.value.reason == "corrupt"
    finally:
        for c in net.all_cores:
            if c.backend is not None:
                c.backend.close()
        sink.drop()
