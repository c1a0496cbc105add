"""Ray head failover: a reflow job survives a restart of the head's GCS server when Ray's
GCS fault tolerance keeps the GCS's tables in Redis (docs/guide/high-availability.md).

The Redis is a real ``redis-server`` (Debian's package; ``.ci/run`` installs it) that the
fixture below starts on a free loopback port with a password and a temp directory, and stops.
The Ray cluster is a ``ray.cluster_utils.Cluster`` in a subprocess (``tests/gcs_failover_job.py``:
a second Ray cannot share the test session's process), whose head's GCS uses that Redis
(``RAY_REDIS_ADDRESS`` and the head's ``redis_password``, as ``ray start --head`` takes them).
The script runs a checkpointing running sum from its driver, kills the GCS server once
checkpoints completed and output was committed, calls the job handle while the GCS is down,
waits for checkpoints and committed output without it, starts the GCS again and lets the job
run to its end. It prints what it measured (``RESULT {json}``); the test checks it.

Every wait acts on an event (a checkpoint count, the sink's committed records) with a deadline.
A run in which the GCS was not restarted fails (its pid must change), as does one whose GCS
kept nothing in Redis.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.jobs import wait_until
from tests.system import require

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "gcs_failover_job.py"
RECORDS = 8000  # tests/gcs_failover_job.py RECORDS
REDIS_ATTEMPTS = 3


@dataclass(frozen=True)
class Redis:
    """A redis-server of this test: ``address`` (host:port) and its ``password``."""

    address: str
    password: str
    cli: str

    def call(self, *args: str) -> str:
        host, port = self.address.split(":")
        proc = subprocess.run([self.cli, "-h", host, "-p", port, "--no-auth-warning",
                               "-a", self.password, "--raw", *args],
                              capture_output=True, text=True, timeout=30)
        return proc.stdout.strip()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def redis() -> Iterator[Redis]:
    """A password-protected redis-server on a free loopback port, its files in a temp dir
    (no snapshots, no append-only file: the test needs no durability across Redis
    restarts); stopped after the test."""
    exe = require("redis-server", "redis-server")
    cli = require("redis-cli", "redis-server")  # redis-tools, a dependency of redis-server
    password = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="reflow-redis-") as tmp:
        for _ in range(REDIS_ATTEMPTS):  # a free port may be taken before redis binds it
            port = _free_port()
            log = open(os.path.join(tmp, "redis.log"), "w")  # noqa: SIM115 - closed below
            proc = subprocess.Popen(
                [exe, "--port", str(port), "--bind", "127.0.0.1", "--requirepass", password,
                 "--dir", tmp, "--save", "", "--appendonly", "no", "--daemonize", "no"],
                stdout=log, stderr=subprocess.STDOUT)
            server = Redis(f"127.0.0.1:{port}", password, cli)

            def up(p: subprocess.Popen[bytes] = proc, s: Redis = server) -> bool:
                return p.poll() is not None or s.call("ping") == "PONG"

            try:
                wait_until(up, "redis-server to answer", timeout=60)
            except BaseException:
                proc.kill()
                proc.wait(30)
                log.close()
                raise
            if proc.poll() is None:
                break
            log.close()
        else:
            pytest.fail(f"redis-server did not start in {REDIS_ATTEMPTS} attempts: "
                        + Path(tmp, "redis.log").read_text()[-2000:])
        try:
            yield server
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
            log.close()


def _run(mode: str, redis: Redis | None, timeout: float = 480
         ) -> tuple[int, str, dict[str, Any]]:
    """Run the script in ``mode``; (exit code, its output, what it measured)."""
    env = dict(os.environ, RAY_ADDRESS="")
    env.pop("RAY_REDIS_ADDRESS", None)
    if redis is not None:
        env.update(RAY_REDIS_ADDRESS=redis.address, REFLOW_TEST_REDIS_PASSWORD=redis.password)
    proc = subprocess.run([sys.executable, str(SCRIPT), mode], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0 and "RayUnavailable: a local Ray did not start" in out:
        pytest.skip("Ray's head did not start in time on this machine (load average "
                    f"{os.getloadavg()}): that is Ray's start-up, before any reflow code")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    result = json.loads(lines[-1][len("RESULT "):]) if lines else {}
    return proc.returncode, out, result


def test_a_job_survives_a_restart_of_the_gcs_kept_in_redis(redis: Redis) -> None:
    code, out, r = _run("failover", redis)
    print(json.dumps(r, indent=1))
    assert code == 0 and "OK" in out.splitlines(), out[-6000:]
    # the GCS really was killed and a new one started (not a run without a fault)
    assert r["pid_before"] != r["pid_after"], r
    # the GCS's tables were in this Redis (RAY<namespace>@<table> keys)
    keys = redis.call("keys", "*").split()
    assert any(k.endswith("@ACTOR") for k in keys), keys
    # while it was down, the handle's calls came back within their deadline: answered
    # (the JobMaster needs no GCS for them) or ControlTimeout, never a hang
    for call in ("status_while_down", "metrics_while_down"):
        outcome, seconds = r[call]
        assert outcome in ("ok", "ControlTimeout"), (call, r)
        assert seconds <= r["control_timeout_s"] + 5, (call, r)
    # checkpoints completed and output was committed with the GCS down
    assert r["flow_while_down"] is True, r
    assert r["committed_while_down"] > r["before"]["committed"], r
    # the job ran to its end without a restart (no task was lost), exactly
    assert (r["state"], r["restarts"]) == ("finished", 0), r
    assert r["exact"] and r["committed"] == RECORDS, r
    assert r["nodes_after"] == 1, r


def test_a_rescale_asked_for_while_the_gcs_is_down_leaves_the_job_answering(
        redis: Redis) -> None:
    code, out, r = _run("rescale", redis)
    print(json.dumps(r, indent=1))
    assert code == 0 and "OK" in out.splitlines(), out[-6000:]
    assert r["pid_before"] != r["pid_after"], r
    # the job went on answering and checkpointing while the rescale waited for the GCS
    assert r["flow_while_down"] is True, r
    # the rescale ended (done once the GCS was back, or refused), never a hang
    assert r["rescale_while_down"][0] in ("ok", "RescaleRefused"), r
    assert (r["state"], r["restarts"]) == ("finished", 0), r
    assert r["exact"] and r["committed"] == RECORDS, r


@pytest.mark.slow  # a minute: Ray's behaviour without fault tolerance, for the record
def test_without_redis_a_restarted_gcs_is_a_new_cluster_and_the_job_is_lost() -> None:
    """The control: the same run with the GCS's tables in memory. The restarted GCS makes a
    new cluster id, refuses the old cluster's processes (WrongClusterID) and the driver
    aborts on its first call to it: the job is gone (its checkpoints remain)."""
    code, out, _ = _run("noredis", None)
    assert code != 0 and "OK" not in out.splitlines(), out[-6000:]
    assert "WrongClusterID" in out, out[-6000:]
