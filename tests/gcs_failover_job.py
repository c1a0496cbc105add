"""Run as a script by ``tests/integration/test_gcs_failover.py`` (a Ray cluster of its own
cannot share the test session's process): a checkpointing running-sum job on a
``ray.cluster_utils.Cluster`` whose GCS keeps its tables in the Redis at
``RAY_REDIS_ADDRESS`` (started by the test), driven from this process; the head's GCS server
is killed while the job runs and records flow, and started again.

Steps (each waits on an event, with a deadline):

1. the source holds at record ``HOLD``; once a checkpoint has completed and the sink has
   committed records, the source is let on (``Moment``) and the GCS server is killed;
2. while it is down: ``status()`` and ``metrics()`` on the job handle are called (each must
   come back or raise ``ControlTimeout`` within its deadline), and the script waits for a
   checkpoint to complete without the GCS;
3. the GCS server is started again (a new process: its pid is printed and compared); a
   checkpoint completes after it is back; the source is released;
4. the job ends; per key its committed output equals the plain-Python reference, and it
   never restarted (no task was lost).

``limits`` as the first argument measures Ray's own behaviour while the GCS is down instead
(actor creation, named-actor lookup, placement groups) and prints it.

Prints one ``RESULT {json}`` line with what was measured, then ``OK``."""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from engine import JobConfig  # noqa: E402
from engine.errors import ReflowError  # noqa: E402
from engine.io.testing import TestingSink  # noqa: E402
from engine.runtime import local_ray  # noqa: E402
from tests.jobs import (  # noqa: E402
    Moment,
    per_key,
    running_sum_job,
    running_sum_reference,
    wait_until,
)

RECORDS = 8000
HOLD = 2000  # the source holds here until the GCS is killed
MARGIN = 3000  # records let through while the GCS is down and after
RATE = 1000.0
DOWN_WAIT_S = 40.0  # how long the script waits for an event while the GCS is down
RECONNECT_S = 120
PROBE_S = 5.0  # how long a probe of Ray while the GCS is down may wait (limits)
DOWN_CHECKPOINTS = 5  # checkpoints that complete while the GCS is down


def _head(cluster: Cluster) -> Any:
    """The head's ``ray._private.node.Node`` (it starts and kills the GCS server)."""
    assert cluster.head_node is not None, "the cluster has no head"
    return cluster.head_node


def _gcs_pid(cluster: Cluster) -> int:
    return int(_head(cluster).all_processes["gcs_server"][0].process.pid)


def _kill_gcs(cluster: Cluster) -> int:
    """Kill the head's GCS server; returns its pid once it has exited."""
    proc = _head(cluster).all_processes["gcs_server"][0].process
    _head(cluster).kill_gcs_server()
    proc.wait(60)
    return int(proc.pid)


def _timed(call: Any) -> tuple[str, float]:
    """(outcome, seconds) of ``call()``: ``ok`` or the exception's class name."""
    t0 = time.monotonic()
    try:
        call()
        outcome = "ok"
    except Exception as exc:  # noqa: BLE001 - the outcome is what is measured
        outcome = type(exc).__name__
    return outcome, round(time.monotonic() - t0, 2)


def _in_thread(call: Any, seconds: float) -> tuple[str, float]:
    """``_timed(call)`` in a thread, given up after ``seconds`` (``hangs``)."""
    out: list[tuple[str, float]] = []
    t = threading.Thread(target=lambda: out.append(_timed(call)), daemon=True)
    t.start()
    t.join(seconds)
    return out[0] if out else ("hangs", seconds)


def failover(cluster: Cluster, mode: str) -> dict[str, Any]:
    """The job through a GCS restart (``mode`` "rescale": a rescale is asked for while the
    GCS is down). Returns what was measured."""
    rng = random.Random(11)
    records = [(rng.randrange(40), rng.randrange(100)) for _ in range(RECORDS)]
    sink = TestingSink()
    cfg = JobConfig(batch_size=50, linger_ms=2, metrics_port=None, checkpoint_interval_s=0.3,
                    checkpoint_dir=tempfile.mkdtemp(prefix="reflow-gcs-ft-"),
                    restart_delay_s=0.1, restart_attempts=10, metrics_poll_interval_s=0.25,
                    control_timeout_s=5.0, rescale_timeout_s=30.0)
    moment = Moment.at(HOLD, MARGIN, RECORDS)
    # detached: the JobMaster and the tasks are detached actors (a job that outlives its
    # driver must survive the GCS restart too)
    h = running_sum_job(records, 2, sink, rate=RATE, config=cfg,
                        gates=moment.gates).run(detached=True)
    out: dict[str, Any] = {"mode": mode, "control_timeout_s": cfg.control_timeout_s}
    probe_s = cfg.control_timeout_s + 10  # a call still out after this hangs

    def while_down() -> None:
        """Calls on the handle, and the job's progress, with the GCS down."""
        before = out["before"]
        out["status_while_down"] = _in_thread(h.status, probe_s)
        out["metrics_while_down"] = _in_thread(h.metrics, probe_s)
        if mode == "rescale":
            threading.Thread(target=lambda: out.setdefault(
                "rescale_while_down", _timed(lambda: h.rescale("sum", 3))), daemon=True).start()
        # checkpoints complete and output is committed without the GCS: the JobMaster's
        # calls on its tasks and the tasks' data connections need none
        try:
            wait_until(lambda: h.status().checkpoints.completed
                       > before["checkpoints"] + DOWN_CHECKPOINTS
                       and len(sink.results()) > before["committed"],
                       "checkpoints and committed output while the GCS is down", h,
                       timeout=DOWN_WAIT_S)
            out["flow_while_down"] = True
        except (AssertionError, ReflowError) as exc:
            out["flow_while_down"] = f"{type(exc).__name__}: {exc}"
        out["committed_while_down"] = len(sink.results())

    def gcs_restart() -> None:
        wait_until(lambda: h.status().checkpoints.completed >= 2 and len(sink.results()) > 0,
                   "two checkpoints and committed output", h)
        out["before"] = {"checkpoints": h.status().checkpoints.completed,
                         "committed": len(sink.results())}
        out["pid_before"] = _gcs_pid(cluster)
        t_kill = time.monotonic()
        _kill_gcs(cluster)
        try:
            while_down()
        finally:  # whatever failed, the GCS comes back (or the cluster dies with it)
            out["gcs_down_s"] = round(time.monotonic() - t_kill, 2)
            _head(cluster).start_gcs_server()
            out["pid_after"] = _gcs_pid(cluster)
        restarted = h.status().checkpoints.completed
        wait_until(lambda: h.status().checkpoints.completed > restarted,
                   "a checkpoint after the GCS restart", h)
        if mode == "rescale":
            wait_until(lambda: "rescale_while_down" in out, "the rescale to return",
                       timeout=3 * cfg.rescale_timeout_s)
        # the GCS serves again (a call that needs it: the node table)
        out["nodes_after"] = sum(1 for n in ray.nodes() if n["Alive"])

    try:
        moment.act(h, gcs_restart)
        st = h.wait(240)
    finally:
        moment.release()
        h.stop()
    out["state"], out["restarts"] = st.state, st.restarts
    out["checkpoints"] = st.checkpoints.completed
    out["exact"] = per_key(sink.results()) == per_key(running_sum_reference(records))
    out["committed"] = len(sink.results())
    return out


class _Probe:
    def ping(self) -> int:
        return os.getpid()


Probe: Any = ray.remote(num_cpus=0)(_Probe)


def limits(cluster: Cluster) -> dict[str, Any]:
    """Ray's own behaviour while the GCS is down (no reflow code)."""
    from ray.util.placement_group import placement_group

    named = Probe.options(name="probe", namespace="gcs-ft").remote()
    ray.get(named.ping.remote())
    out: dict[str, Any] = {"pid_before": _gcs_pid(cluster)}
    t_kill = time.monotonic()
    _kill_gcs(cluster)
    out["call_existing_actor"] = _in_thread(lambda: ray.get(named.ping.remote(), timeout=10),
                                            PROBE_S)
    fresh = Probe.remote()
    ready, _ = ray.wait([fresh.ping.remote()], timeout=PROBE_S)
    out["create_actor_ready"] = bool(ready)
    named_late: list[Any] = []
    out["create_named_actor"] = _in_thread(lambda: named_late.append(
        Probe.options(name="late", namespace="gcs-ft").remote()), PROBE_S)
    out["get_actor_by_name"] = _in_thread(
        lambda: ray.get_actor("probe", namespace="gcs-ft"), PROBE_S)
    pgs: list[Any] = []
    # placement_group() itself waits for the GCS (a synchronous RPC)
    out["create_placement_group"] = _in_thread(
        lambda: pgs.append(placement_group([{"CPU": 1}])), PROBE_S)
    out["list_named_actors"] = _in_thread(
        lambda: ray.util.list_named_actors(all_namespaces=True), PROBE_S)
    out["nodes"] = _in_thread(ray.nodes, PROBE_S)
    out["cluster_resources"] = _in_thread(ray.cluster_resources, PROBE_S)
    out["down_s"] = round(time.monotonic() - t_kill, 2)
    _head(cluster).start_gcs_server()
    out["pid_after"] = _gcs_pid(cluster)
    t0 = time.monotonic()
    out["fresh_actor_after_restart"] = ray.get(fresh.ping.remote(), timeout=120) > 0
    out["fresh_actor_after_restart_s"] = round(time.monotonic() - t0, 2)
    wait_until(lambda: bool(pgs), "placement_group() to return", timeout=120)
    out["placement_group_after_restart"] = bool(ray.wait([pgs[0].ready()], timeout=120)[0])
    out["get_actor_after_restart"] = _timed(lambda: ray.get_actor("probe", namespace="gcs-ft"))
    wait_until(lambda: bool(named_late), "the named actor's creation to return", timeout=120)
    out["named_actor_after_restart"] = ray.get(named_late[0].ping.remote(), timeout=120) > 0
    return out


def main(mode: str) -> int:
    if not os.environ.get("RAY_REDIS_ADDRESS") and mode != "noredis":
        print("RAY_REDIS_ADDRESS is not set: this script needs the test's Redis", flush=True)
        return 2
    clusters: list[Cluster] = []

    def start(address: str | None = None, **_: Any) -> Any:
        # the GCS's keys in Redis: a fresh namespace per attempt (a retried start must not
        # load the tables of an attempt that failed); a restarted GCS inherits it
        os.environ["RAY_external_storage_namespace"] = f"reflow-test-{uuid.uuid4().hex[:8]}"  # noqa: SIM112 - Ray reads this spelling
        cluster = Cluster()
        clusters.append(cluster)
        cluster.add_node(
            num_cpus=4, include_dashboard=False,
            redis_password=os.environ.get("REFLOW_TEST_REDIS_PASSWORD", ""),
            # every process of the cluster (the driver too) exits when the GCS is
            # unreachable for this long (Ray's default: 60 s); generous for a loaded machine
            _system_config={"gcs_rpc_server_reconnect_timeout_s": RECONNECT_S})
        return ray.init(address=cluster.address, namespace="reflow", configure_logging=False,
                        log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": ROOT}})

    # a head that misses Ray's start-up deadline on a loaded machine is stopped and
    # started again (what the test session's own local Ray does)
    local_ray.connect(local_ray.LOCAL, init=start)
    cluster = clusters[-1]
    try:
        result = limits(cluster) if mode == "limits" else failover(cluster, mode)
        print("RESULT " + json.dumps(result), flush=True)
        if mode != "limits":
            assert result["exact"], "the output differs from the reference"
        print("OK", flush=True)
        return 0
    finally:
        ray.shutdown()
        for c in clusters:
            c.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "failover"))
