"""Failure semantics on a real local Ray cluster (issue 19): the control plane never hangs,
and the errors a user sees are reflow's, never Ray's.

Each test acts on events: a ``SourceGate`` holds the input so the job keeps running, a
user function writes a marker file when it blocks, an actor is killed or its process
stopped by the test. Waits for a condition have generous timeouts; calls that must not
hang run in a thread whose answer is awaited with a timeout, so on a runtime that hangs
the test fails instead of hanging with it.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import tempfile
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
import ray
from prometheus_client.parser import text_string_to_metric_families
from ray.exceptions import RayActorError, RayError

from engine import JobConfig, KeyedProcessFunction, StreamJob
from engine.dataflow.deployment import task_name
from engine.errors import (
    ControlTimeout,
    JobMasterLost,
    RescaleRefused,
    UserFunctionError,
)
from engine.io.sinks import Sink
from engine.io.sources import Source
from engine.io.testing import SourceGate, TestingSink, TestingSource
from engine.runtime.deadlines import Deadlines
from tests.jobs import per_key, running_sum_reference

pytestmark = pytest.mark.ray

NAMESPACE = "reflow"


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """``fn()``'s result (or its exception), failing the test if it has not returned after
    ``seconds``: the call under test must not hang (a hung call is left in its thread)."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(fn).result(timeout=seconds)
    except concurrent.futures.TimeoutError:
        pytest.fail(f"the call did not return within {seconds} s: the control plane hangs")
    finally:
        pool.shutdown(wait=False)


def until(cond: Callable[[], Any], timeout: float = 60.0, what: str = "") -> Any:
    """Wait for ``cond()`` to be truthy (polled every 50 ms), failing after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what or cond}")
        time.sleep(0.05)


def held_job(name: str, config: JobConfig, gate: SourceGate, n: int = 4000,
             sink: TestingSink | None = None) -> StreamJob:
    """A running-sum job whose source holds at ``gate`` (so it runs until the test opens
    it)."""
    records = [(i % 40, i % 7) for i in range(n)]
    job = StreamJob(name, num_key_groups=32, parallelism=2, config=config)
    (job.source(TestingSource(records, gate=gate), name="src", parallelism=1)
        .key_by(lambda r: r[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]), name="sum")
        .sink(sink or TestingSink(), name="out"))
    return job


# ------------------------------------------------------------------ 1. deadlines


def test_a_frozen_jobmaster_makes_handle_calls_raise_control_timeout(ray_cluster):
    gate = SourceGate(after=200)
    cfg = JobConfig(batch_size=50, linger_ms=2, metrics_port=None, control_timeout_s=1.0,
                    rescale_timeout_s=1.5)
    d = Deadlines.of(cfg)
    h = held_job("frozen-master", cfg, gate).run()
    pid = ray.get(h._master.__ray_call__.remote(lambda self: os.getpid()))
    gate.wait_reached()
    os.kill(pid, signal.SIGSTOP)
    try:
        calls: list[tuple[Callable[[], Any], float]] = [
            (h.status, d.control_s), (h.metrics, d.control_s),
            (lambda: h.wait(0.5), 0.5 + d.control_s),
            (lambda: h.set_replication("sum", "none"), d.control_s),
            # a rescale waits a window for the answer, then asks whether it advances;
            # (a source cannot be rescaled: once thawed, the JobMaster refuses it at once)
            (lambda: h.rescale("src", 2), d.rescale_window_s + d.control_s)]
        for call, deadline in calls:
            t0 = time.monotonic()
            err = within(60, lambda call=call: _raised(call))
            took = time.monotonic() - t0
            assert isinstance(err, ControlTimeout), repr(err)
            assert deadline <= took + 0.1 and took < deadline + 5, (took, deadline)
            assert err.job == h.job_id and err.call and err.seconds > 0
            assert "control_timeout_s" in str(err) or "rescale_timeout_s" in str(err)
            assert isinstance(err.__cause__, RayError) or err.call == "rescale"
    finally:
        os.kill(pid, signal.SIGCONT)

    def answers_running() -> bool:
        # once thawed it answers again; it first works through the calls that timed out,
        # which on a loaded machine may take longer than one call's control_timeout_s
        seen: list[Any] = []
        err = within(60, lambda: _raised(lambda: seen.append(h.status())))
        if isinstance(err, ControlTimeout):
            return False
        assert err is None, repr(err)
        return bool(seen[0].state == "running")

    until(answers_running, 180, "the thawed JobMaster to answer status() 'running'")
    h.stop()


def _raised(call: Callable[[], Any]) -> BaseException | None:
    try:
        call()
    except BaseException as exc:  # noqa: BLE001 - the test inspects what was raised
        return exc
    return None


# ------------------------------------------------------------------ 2. a stuck user function


class StuckOnce(KeyedProcessFunction):
    """A running sum that blocks (600 s) on the record ``(key, -1)``, after writing the
    index of its task to ``marker`` so the test knows which task is stuck."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def open(self, ctx: Any) -> None:
        self.index = ctx.task_index
        self.total = ctx.value_state("total", 0)

    def process_element(self, value: Any, ctx: Any) -> Any:
        key, v = value
        if v == -1:
            with open(self.marker + ".tmp", "w") as f:
                f.write(str(self.index))
            os.replace(self.marker + ".tmp", self.marker)
            time.sleep(600)
        self.total.update(self.total.value() + v)
        yield (key, self.total.value())


def test_a_stuck_user_function_is_reported_and_does_not_freeze_the_control_plane(ray_cluster):
    marker = os.path.join(tempfile.mkdtemp(prefix="reflow-stuck-"), "stuck")
    records = [(i % 40, 1) for i in range(500)] + [(3, -1)] + [(i % 40, 1) for i in range(500)]
    cfg = JobConfig(batch_size=20, linger_ms=2, metrics_port=0, control_timeout_s=2.0,
                    rescale_timeout_s=3.0, metrics_poll_interval_s=0.2)
    job = StreamJob("stuck", num_key_groups=32, parallelism=2, config=cfg)
    (job.source(TestingSource(records), name="src", parallelism=1)
        .key_by(lambda r: r[0])
        .process(StuckOnce(marker), name="sum")
        .sink(TestingSink(), name="out"))
    h = job.run()
    try:
        until(lambda: os.path.exists(marker), what="the user function to block")
        with open(marker) as f:
            index = int(f.read())

        t0 = time.monotonic()
        m = within(30, h.metrics)
        assert time.monotonic() - t0 < cfg.control_timeout_s + 3
        stuck = task_name(h.job_id, "sum", index, 0)
        assert stuck in dict(m.unresponsive)

        st = until(lambda: (s := within(30, h.status)).state == "running"
                   and dict(s.unresponsive).get(stuck, 0) >= 1.0 and s,
                   what="status() to list the stuck task for >= 1 s")
        assert [t for t, _ in st.unresponsive] == [stuck]  # the healthy tasks answer

        text = urllib.request.urlopen(h.metrics_url, timeout=10).read().decode()
        gauge = {s.labels["task"]: s.value for fam in text_string_to_metric_families(text)
                 for s in fam.samples if s.name == "reflow_task_unresponsive_seconds"
                 and s.labels["operator"] == "sum"}
        assert gauge[str(index)] >= 1.0 and gauge[str(1 - index)] == 0.0

        t0 = time.monotonic()
        err = within(60, lambda: _raised(lambda: h.rescale("sum", 3)))
        took = time.monotonic() - t0
        assert isinstance(err, RescaleRefused), repr(err)
        assert stuck in err.tasks and stuck in str(err) and err.phase and err.operator == "sum"
        assert took < cfg.rescale_timeout_s + cfg.control_timeout_s + 5, took
        st = within(30, h.status)
        assert st.state == "running" and stuck in dict(st.unresponsive)
    finally:
        within(60, h.stop)


# ------------------------------------------------------------------ 3. Ray's errors translated


class FailingOpen(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        if ctx.task_index == 1:
            raise RuntimeError("no database")

    def process_element(self, value: Any, ctx: Any) -> Any:
        yield value


class FailingSource(Source):
    def partitions(self, parallelism: int) -> list[str]:
        return ["topic-0"]

    def open_partition(self, partition: str, resume: Any, clock: Any) -> Any:
        raise OSError("no such topic")


class FailingSink(Sink):
    """Only task 0 fails, so the error names one task whichever task opens first."""

    def open(self, task_index: int, parallelism: int, clock: Any) -> Any:
        if task_index == 0:
            raise PermissionError("read-only bucket")
        return TestingSink().open(task_index, parallelism, clock)


@pytest.mark.parametrize("where", ["function", "source", "sink"])
def test_an_open_that_raises_makes_run_raise_user_function_error(ray_cluster, where):
    cfg = JobConfig(batch_size=50, linger_ms=2, metrics_port=None)
    job = StreamJob(f"open-{where}", num_key_groups=32, parallelism=2, config=cfg)
    src = FailingSource() if where == "source" else TestingSource([(1, 1)] * 100)
    (job.source(src, name="src", parallelism=1)
        .key_by(lambda r: r[0])
        .process(FailingOpen() if where == "function" else _Echo(), name="fn")
        .sink(FailingSink() if where == "sink" else TestingSink(), name="out"))
    with pytest.raises(UserFunctionError) as info:
        within(120, job.run)
    err = info.value
    expected = {"function": ("fn", 1, "RuntimeError: no database"),
                "source": ("src", 0, "OSError: no such topic"),
                "sink": ("out", 0, "PermissionError: read-only bucket")}[where]
    assert (err.operator, err.task_index, err.cause) == expected
    assert err.phase == "open" and err.task and err.record == ""
    assert f"open() of operator {expected[0]!r}" in str(err) and "fix open()" in str(err)
    assert not isinstance(err, RayError)


class _Echo(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Any) -> Any:
        yield value


def test_a_dead_jobmaster_makes_every_handle_call_raise_job_master_lost(ray_cluster):
    gate = SourceGate(after=200)
    cfg = JobConfig(batch_size=50, linger_ms=2, metrics_port=None, control_timeout_s=2.0)
    h = held_job("lost-master", cfg, gate).run()
    gate.wait_reached()
    # a reflow error raised in the JobMaster comes back as itself, not wrapped by Ray
    with pytest.raises(RescaleRefused) as refused:
        h.rescale("no-such-operator", 2)
    assert type(refused.value) is RescaleRefused
    with pytest.raises(RescaleRefused, match="task index"):
        h.rebalance("sum", ["a"] * 32)
    ray.kill(h._master)
    calls = {"status": h.status, "metrics": h.metrics, "wait": lambda: h.wait(5),
             "rescale": lambda: h.rescale("sum", 3),
             "set_replication": lambda: h.set_replication("sum", "all")}
    for name, call in calls.items():
        err = within(60, lambda call=call: _raised(call))
        assert isinstance(err, JobMasterLost), (name, repr(err))
        assert isinstance(err.__cause__, RayActorError) and not isinstance(err, RayError)
        assert err.job == h.job_id and err.call == name and "deploy it again" in str(err)
    within(30, h.stop)  # stopping a job whose JobMaster is gone is not an error


# ------------------------------------------------------------------ 4. warm standby health


def test_a_dead_standby_actor_is_dropped_and_never_handed_to_a_rescale(ray_cluster):
    gate = SourceGate(after=2000)
    records = [(i % 40, i % 7) for i in range(4000)]
    sink = TestingSink()
    # control_timeout_s as the default: the rescale first asks Ray's GCS within half of it
    # (engine.runtime.gcs), and one ray.nodes() took longer than 1 s at load ~50 (refused)
    cfg = JobConfig(batch_size=50, linger_ms=2, metrics_port=None,
                    warm_standby_tasks=3, warm_standby_refill_s=600.0,
                    metrics_poll_interval_s=0.2)
    h = held_job("standby", cfg, gate, len(records), sink).run()
    try:
        assert h.status().standby == 3
        gate.wait_reached()
        ray.kill(ray.get_actor(f"{h.job_id}/standby-0", namespace=NAMESPACE))
        until(lambda: h.status().standby == 2, 30, "status().standby to stop counting it")
        # the next one dies just before the rescale asks for standby actors: it must be
        # found dead when handed out (or at the next poll), not given to the new task
        ray.kill(ray.get_actor(f"{h.job_id}/standby-1", namespace=NAMESPACE))
        report = h.rescale("sum", 4)
        assert (report.old_parallelism, report.new_parallelism) == (2, 4)
        st = h.status()
        assert st.state == "running" and st.standby == 0, st  # no refill within 600 s
        gate.open()
        h.wait(120)
    finally:
        h.stop()
    assert per_key(sink.results()) == per_key(running_sum_reference(records))


class Opaque:
    """A state value of a type with no declared codec: it lives in memory fine, but cannot be
    encoded for a size estimate or a transfer."""

    def __init__(self, n: int) -> None:
        self.n = n


class CountOpaque(KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.value_state("count", None)

    def process_element(self, value, ctx):
        cur = self.count.value()
        self.count.update(Opaque(1 if cur is None else cur.n + 1))
        yield (ctx.key, self.count.value().n)


def test_a_planning_failure_refuses_the_rescale_and_the_job_goes_on(ray_cluster):
    """Issue 19 item 2: sizing the groups for the plan fails (a state value without a
    codec); nothing has changed yet, so the rescale is refused, not the job failed."""
    gate = SourceGate(after=500)
    sink = TestingSink()
    records = [(i % 20, 1) for i in range(1000)]
    job = StreamJob("opaque", num_key_groups=32, parallelism=2,
                    config=JobConfig(metrics_port=None, drrs_subscale_bytes=1_000_000,
                                     rescale_timeout_s=30))
    (job.source(TestingSource(records, gate=gate), name="src", parallelism=1)
        .key_by(lambda r: r[0]).process(CountOpaque(), name="count")
        .sink(sink, name="out"))
    h = job.run()
    try:
        gate.wait_reached(timeout=120)
        with pytest.raises(RescaleRefused, match="before anything changed") as err:
            within(90, lambda: h.rescale("count", 3))
        assert err.value.phase == "plan"
        print(err.value)
        assert "codec" in str(err.value).lower()  # what failed, not Ray's traceback
        assert h.status().state == "running"
        gate.open()
        h.wait(timeout=120)
    finally:
        h.stop()
    last: dict[int, int] = {}
    for k, n in sink.results():
        last[k] = max(last.get(k, 0), n)
    assert last == {k: 50 for k in range(20)}


def test_an_output_without_a_codec_fails_the_job_naming_operator_and_record(ray_cluster):
    """Issue 19 item 5: a record with no codec fails the job as a user error that names the
    operator that produced it, the record and the fix (it said "internal error")."""
    sink = TestingSink()
    records = [(i % 10, 1) for i in range(200)]
    job = StreamJob("nocodec", num_key_groups=32, parallelism=2,
                    config=JobConfig(metrics_port=None))
    (job.source(TestingSource(records), name="src", parallelism=1)
        .map(lambda r: r if r[0] != 4 else (r[0], Opaque(1)), name="make")
        .key_by(lambda r: r[0]).reduce(lambda a, b: a, name="sum")
        .sink(sink, name="out"))
    h = job.run()
    try:
        with pytest.raises(UserFunctionError) as err:
            within(120, lambda: h.wait(timeout=100))
    finally:
        h.stop()
    e = err.value
    assert e.operator == "make" and e.record.startswith("(4, <")
    assert "no codec for Opaque" in str(e) and "register_codec" in str(e)
    assert "internal error" not in str(e)


def test_the_death_of_a_finished_task_is_noticed_and_the_job_recovers(ray_cluster, tmp_path):
    """Issue 32 item 1: a bounded source beside a held one finishes; its actor is then
    killed. The watch notices (it asks finished tasks too), the job restarts from its last
    checkpoint, checkpoints complete again, and the output is exact. Before, the job said
    'running', every checkpoint waited for the dead task's ack until its timeout, and
    nothing was committed."""
    from tests.jobs import task_actors

    bounded = [(i % 10, 1) for i in range(300)]
    held = [(100 + i % 10, 1) for i in range(600)]
    gate = SourceGate(200)
    sink = TestingSink(str(tmp_path / "out"))
    cfg = JobConfig(batch_size=20, linger_ms=2, metrics_port=None, checkpoint_interval_s=0.5,
                    checkpoint_timeout_s=15, checkpoint_dir=str(tmp_path / "chk"),
                    restart_delay_s=0.1)
    job = StreamJob("finished-dies", num_key_groups=16, config=cfg)
    a = job.source(TestingSource(bounded, rate=1000), name="bounded")
    b = job.source(TestingSource(held, rate=1000, gate=gate), name="held")
    (a.union(b).key_by(lambda r: r[0]).reduce(lambda x, y: (x[0], x[1] + y[1]), name="sum")
        .sink(sink, name="out"))
    h = job.run()
    try:
        until(lambda: int(h.metrics().total("records_out", "bounded")) == 300
              and any(t.vertex == "bounded" and t.status == "finished"
                      for t in h.metrics().tasks), 60, "the bounded source to finish")
        gate.wait_reached()
        done = h.status().checkpoints.completed
        until(lambda: h.status().checkpoints.completed > done, 60, "a checkpoint")
        [victim] = task_actors(h, "bounded")
        ray.kill(ray.get_actor(victim, namespace=NAMESPACE))
        until(lambda: h.status().restarts >= 1, 60, "the restart after the finished task died")
        after = h.status().checkpoints.completed
        until(lambda: h.status().checkpoints.completed > after, 60, "a checkpoint after it")
        gate.open()
        st_ = h.wait(120)
    finally:
        gate.open()
        h.stop()
    assert st_.state == "finished" and st_.restarts >= 1
    want = {k: (k, sum(v for kk, v in bounded + held if kk == k)) for k, _ in bounded + held}
    got: dict = {}
    for k, total in sink.results():
        got[k] = max(got.get(k, (k, 0)), (k, total))
    assert got == want


def test_a_function_the_workers_cannot_import_is_named_with_how_to_ship_it(ray_cluster,
                                                                          tmp_path):
    """A job's function from a module only the driver sees: the error names the module and
    how to ship it (before: ``JobMasterLost``, the ModuleNotFoundError only in Ray's log)."""
    import importlib
    import sys

    from engine import StreamJob
    from engine.errors import JobFailedError
    from engine.io.testing import TestingSink, TestingSource

    (tmp_path / "only_on_the_driver.py").write_text(
        "def double(r):\n    return (r[0], r[1] * 2)\n")
    sys.path.insert(0, str(tmp_path))
    try:
        mod = importlib.import_module("only_on_the_driver")
        job = StreamJob("unshipped")
        (job.source(TestingSource([(1, 2)] * 10), name="src").map(mod.double, name="m")
            .sink(TestingSink(), name="out"))
        with pytest.raises(JobFailedError, match="cannot import module 'only_on_the_driver'") \
                as err:
            job.run()
        assert "working-dir" in str(err.value) and err.value.phase == "deploy"
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("only_on_the_driver", None)
