"""Issue 32 item 13 on a real local Ray cluster: what a user reads when a task dies.

* a killed downstream task is the failure's headline (not the upstream task that lost its
  data connection to it), and Ray's generic advice about out-of-memory causes is cut from
  a death that was no out-of-memory kill;
* ``status().restarts`` counts restarts begun (``restarts_completed`` those that got the
  job running again);
* a rescale the job restarted under reports it and the parallelism it began from
  (before: "4 -> 4" for a 2 -> 4 request, restart unsaid).

Each test acts on events (a gate holding the source, a marker file written by a blocked
user function, the job's status); waits have generous timeouts and assert nothing on time.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import ray

from engine import JobConfig, KeyedProcessFunction, StreamJob
from engine.io.testing import SourceGate, TestingSink, TestingSource
from tests.jobs import task_actors

pytestmark = pytest.mark.ray

NAMESPACE = "reflow"
RAY_ADVICE = ("Some common causes include", "resource isolation", "dmesg")


def until(cond: Callable[[], Any], timeout: float = 90.0, what: str = "") -> Any:
    """Wait for ``cond()`` to be truthy (polled every 50 ms), failing after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what or cond}")
        time.sleep(0.05)


def sigkill(actor_name: str) -> None:
    """Kill the actor's process with SIGKILL, as the kernel's OOM killer would (Ray then
    adds its advice about out-of-memory causes to the actor's error)."""
    actor = ray.get_actor(actor_name, namespace=NAMESPACE)
    pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=30)
    os.kill(pid, signal.SIGKILL)


def test_a_killed_downstream_task_heads_the_failure_and_restarts_count_when_begun(
        ray_cluster):
    gate = SourceGate(300)
    cfg = JobConfig(batch_size=20, linger_ms=2, metrics_port=None,
                    restart_strategy="fixed-delay", restart_delay_s=2.0)
    job = StreamJob("downstream-dies", num_key_groups=16, config=cfg)
    (job.source(TestingSource([(i % 10, 1) for i in range(5000)], rate=2000, gate=gate),
                name="src")
        .key_by(lambda r: r[0]).reduce(lambda x, y: (x[0], x[1] + y[1]), name="sum")
        .sink(TestingSink(), name="out"))
    h = job.run()
    try:
        gate.wait_reached()
        [victim] = task_actors(h, "sum")
        sigkill(victim)
        gate.open()  # the source sends to the dead task and loses its connection
        st = until(lambda: (s := h.status()).state == "restarting" and s, what="restarting")
        # restarts begun count at once; completed ones once the job runs again
        assert (st.restarts, st.restarts_completed) == (1, 0), st
        failure = st.last_failure
        print(f"last_failure ({len(failure)} chars): {failure}")
        assert failure.startswith(f"task {victim} of operator 'sum' died"), failure
        assert not any(a in failure for a in RAY_ADVICE), failure
        assert "process was killed" in failure and len(failure) < 600, failure
        st = until(lambda: (s := h.status()).state in ("running", "finished") and s,
                   what="the restarted job")
        assert (st.restarts, st.restarts_completed) == (1, 1), st
    finally:
        gate.open()
        h.stop()


class BlockWhileFlag(KeyedProcessFunction):
    """A running sum whose every task, on its first record, writes ``marker`` and blocks
    while the file ``flag`` exists (a task stuck in user code: a live rescale cannot pass
    it, so a rescale requested meanwhile is still running when the test kills it)."""

    def __init__(self, flag: str, marker: str) -> None:
        self.flag, self.marker = flag, marker

    def open(self, ctx: Any) -> None:
        self.total = ctx.value_state("total", 0)
        self.blocked = False

    def process_element(self, value: Any, ctx: Any) -> Any:
        if not self.blocked:
            self.blocked = True
            with open(self.marker, "a") as f:
                f.write("blocked\n")
            while os.path.exists(self.flag):
                time.sleep(0.05)
        self.total.update(self.total.value() + value[1])
        yield (value[0], self.total.value())


def test_a_rescale_the_job_restarted_under_says_so(ray_cluster, tmp_path):
    flag, marker = str(tmp_path / "hold"), str(tmp_path / "blocked")
    open(flag, "w").close()
    cfg = JobConfig(batch_size=20, linger_ms=2, metrics_port=None,
                    restart_strategy="fixed-delay", restart_delay_s=0.2)
    job = StreamJob("rescale-restarts", num_key_groups=16, parallelism=2, config=cfg)
    (job.source(TestingSource([(i % 10, 1) for i in range(2000)], rate=500), name="src")
        .key_by(lambda r: r[0]).process(BlockWhileFlag(flag, marker), name="sum")
        .sink(TestingSink(), name="out"))
    h = job.run()
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(h.rescale("sum", 4, protocol="drrs")))
    try:
        until(lambda: os.path.exists(marker), what="a task of 'sum' to block")
        t.start()
        until(lambda: any(r.operator == "sum" and r.running for r in h.metrics().rescales),
              what="the rescale to run")
        victim = task_actors(h, "sum")[0]
        os.remove(flag)
        ray.kill(ray.get_actor(victim, namespace=NAMESPACE))
        t.join(300)
        assert not t.is_alive() and out, "the rescale did not come back after the restart"
    finally:
        if os.path.exists(flag):
            os.remove(flag)
        h.stop()
    report = out[0]
    print(report)
    assert report.restarts >= 1, report
    assert (report.old_parallelism, report.new_parallelism) == (2, 4), report
    assert "2 -> 4" in str(report) and "restarted" in str(report), report
