"""Detached jobs on real Ray, managed from another process than the one that started them.

A driver (``tests/detached_job.py``, started by ``reflow run --detached`` in a subprocess,
connected to this test session's Ray cluster through ``RAY_ADDRESS``) starts a
checkpointing running sum per key whose source holds at a gate, and exits. From this
process: ``engine.attach`` finds the job by name, its status says running and detached,
``reflow list``/``status``/``savepoint``/``stop --savepoint`` act on it through
``engine.cli.main``, and the output its sink committed is, per key, exactly the plain-Python
running sums of the records before the gate; a job restored from the stop's savepoint
produces exactly the rest. An attached job (no ``--detached``) still ends with its driver.
The main use on a ``ray start`` head (test_cluster.py's ``head`` fixture): ``reflow run
--address DASHBOARD --detached`` submits the script, the submission succeeds when it ends,
and ``reflow status/list/stop --savepoint --address GCS`` in other processes manage the
job, whose output is exact. Every wait is on an event (the gate, the driver's exit, the cluster's actors) with a
deadline; nothing sleeps for time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from engine.io.testing import SourceGate, TestingSink
from tests.detached_job import HOLD, RECORDS, build
from tests.integration.test_cluster import Head, head  # noqa: F401 - the fixture
from tests.jobs import per_key, running_sum_reference, wait_until

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]


def _actors_of(job_id: str) -> list[str]:
    """The named actors of ``job_id`` (its JobMaster, tasks, standbys) on the cluster."""
    import ray

    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["namespace"] == "reflow" and a["name"].startswith(f"{job_id}/"))


def _drive(tmp_path: Path, name: str, gcs: str, detached: bool) -> tuple[str, SourceGate,
                                                                          TestingSink]:
    """Run the driver script to its end (``reflow run [--detached]``); the job's id, its
    gate and its sink."""
    gate = SourceGate(HOLD, str(tmp_path / f"gate-{name}"))
    out = tmp_path / f"out-{name}"
    env = {k: v for k, v in os.environ.items() if k != "REFLOW_DETACHED"}
    env.update(RAY_ADDRESS=gcs, REFLOW_JOBS_DIR=str(tmp_path / "jobs"), PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "engine.cli", "run", *(["--detached"] if detached else []),
           "tests/detached_job.py", "--name", name, "--gate", gate.directory, "--out",
           str(out), "--checkpoints", str(tmp_path / "checkpoints")]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [line] = [x for x in done.stdout.splitlines() if x.startswith("job ")]
    job_id, said = line.split()[1:]
    assert said == f"detached={detached}", line
    return job_id, gate, TestingSink(str(out))


def _sums(sink: TestingSink) -> dict[str, list[tuple]]:
    return per_key(sink.results())


def test_a_detached_job_outlives_its_driver_and_the_cli_manages_it(ray_cluster, tmp_path,
                                                                   monkeypatch, capsys):
    import engine
    from engine import cli
    from engine.runtime import registry

    gcs = ray_cluster.get_runtime_context().gcs_address
    monkeypatch.setenv(registry.ENV_DIR, str(tmp_path / "jobs"))
    name = f"detached-{uuid.uuid4().hex[:6]}"
    job_id, gate, sink = _drive(tmp_path, name, gcs, detached=True)
    try:
        # the driver has exited: the job runs on, its source held at the gate
        gate.wait_reached(timeout=180)
        handle = engine.attach(name)
        assert handle.job_id == job_id
        st = handle.status()
        assert (st.state, st.detached) == ("running", True), st
        [addr] = [a for a in registry.recorded() if a.job_id == job_id]
        assert addr.detached  # its address file was kept after the driver exited

        assert cli.main(["list", "--json"]) == 0
        [entry] = [j for j in json.loads(capsys.readouterr().out) if j["job"] == job_id]
        assert (entry["name"], entry["state"], entry["detached"]) == (name, "running", True)
        assert cli.main(["list"]) == 0
        [row] = [x for x in capsys.readouterr().out.splitlines() if x.startswith(job_id)]
        assert row.split()[1:5] == [name, "running", "detached", gcs], row

        assert cli.main(["status", name]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"job {job_id}: running (detached)\n"), out
        assert "sum" in out
        # a process not connected to Ray finds it through the address file its driver left
        env = dict(os.environ, RAY_ADDRESS="local", REFLOW_JOBS_DIR=str(tmp_path / "jobs"),
                   PYTHONPATH=str(ROOT))
        other = subprocess.run([sys.executable, "-m", "engine.cli", "status", name, "--json"],
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert other.returncode == 0, other.stderr[-3000:]
        doc = json.loads(other.stdout)
        assert (doc["job"], doc["state"], doc["detached"]) == (job_id, "running", True), doc
        assert doc["operators"]["sum"]["tasks"] == 2, doc

        assert cli.main(["savepoint", name, str(tmp_path / "sp1"), "--json"]) == 0
        taken = json.loads(capsys.readouterr().out)
        assert taken["job"] == job_id and os.path.isdir(taken["savepoint"]), taken

        assert cli.main(["stop", name, "--savepoint", str(tmp_path / "sp2"), "--json"]) == 0
        stopped = json.loads(capsys.readouterr().out)
        assert stopped["stopped"] and os.path.isdir(stopped["savepoint"]), stopped
    finally:
        gate.open()
        if registry.master_exists(job_id):  # the test failed before its stop
            engine.attach(job_id).stop()

    # every actor of the job is released, its file forgotten, and it is gone by name
    wait_until(lambda: not _actors_of(job_id), f"the actors of {job_id} to be released")
    assert not any(a.job_id == job_id for a in registry.recorded())
    assert cli.main(["status", name]) == 2
    [err] = capsys.readouterr().err.strip().splitlines()
    assert f"no job {name!r} on the Ray cluster at {gcs}" in err, err

    # exactly the records before the gate, each key's running sums in order, once
    reference = running_sum_reference(RECORDS)
    assert _sums(sink) == per_key(reference[:HOLD])

    # the stop's savepoint holds exactly that state: a job restored from it (attached,
    # from this process) produces exactly the rest
    rest = TestingSink(str(tmp_path / "rest"))
    with build(name, gate, rest, str(tmp_path / "checkpoints")).run(
            restore_from=stopped["savepoint"]) as again:
        assert again.status().detached is False
        again.wait(timeout=240)
    assert _sums(rest) == per_key(reference[HOLD:])


def test_a_command_on_a_detached_job_that_ended_says_so_in_one_line(ray_cluster, tmp_path,
                                                                     monkeypatch, capsys):
    """An address file of a detached job whose cluster answers without its JobMaster: the
    job ended; the command says so in one line, exits 1 and forgets the file."""
    import engine
    from engine import cli
    from engine.errors import JobNotRunningError
    from engine.runtime import registry

    gcs = ray_cluster.get_runtime_context().gcs_address
    monkeypatch.setenv(registry.ENV_DIR, str(tmp_path / "jobs"))
    monkeypatch.setenv("RAY_ADDRESS", "local")
    ended = registry.JobAddress("ended-0000000e", "ended", gcs, "reflow", "", "elsewhere", 1,
                                detached=True)
    for argv in (["status", "ended"], ["stop", "ended-0000000e"],
                 ["savepoint", "ended", str(tmp_path / "sp")]):
        os.makedirs(tmp_path / "jobs", exist_ok=True)
        (tmp_path / "jobs" / "ended-0000000e.json").write_text(
            json.dumps(registry.asdict(ended)))
        assert cli.main(argv) == 1, argv
        [err] = capsys.readouterr().err.strip().splitlines()
        assert err == (f"reflow: job ended-0000000e has ended: the Ray cluster at {gcs} "
                       "holds no JobMaster for it (its address file is removed)"), err
        assert not (tmp_path / "jobs" / "ended-0000000e.json").exists()
    (tmp_path / "jobs" / "ended-0000000e.json").write_text(json.dumps(registry.asdict(ended)))
    with pytest.raises(JobNotRunningError, match="has ended"):
        engine.attach("ended")
    with pytest.raises(engine.JobNotFound, match=r"no job 'nosuch' on the Ray cluster at .*"
                                                 r"\(jobs there: .*\); pass one of those"):
        engine.attach("nosuch")


def test_an_attached_job_ends_with_its_driver(ray_cluster, tmp_path, monkeypatch):
    """Today's behaviour stays: without --detached the job's actors are owned by the
    driver and go when it exits; nothing finds it afterwards."""
    import engine
    from engine.runtime import registry

    gcs = ray_cluster.get_runtime_context().gcs_address
    monkeypatch.setenv(registry.ENV_DIR, str(tmp_path / "jobs"))
    name = f"attached-{uuid.uuid4().hex[:6]}"
    job_id, gate, _ = _drive(tmp_path, name, gcs, detached=False)
    try:
        wait_until(lambda: not _actors_of(job_id),
                   f"the actors of {job_id} to end with its driver")
    finally:
        gate.open()
    assert not any(a.job_id == job_id for a in registry.recorded())
    with pytest.raises(engine.JobNotFound, match=f"no job {name!r}"):
        engine.attach(name)


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_job_submitted_detached_outlives_its_submission(head: Head, tmp_path):  # noqa: F811
    """The main use: ``reflow run --address DASHBOARD --detached`` submits the script with
    Ray's job submission to a ``ray start`` head; the submission SUCCEEDS when the script
    ends, the job runs on, and another process stops it with a savepoint by the cluster's
    address; the output is exact."""
    name = f"submitted-{uuid.uuid4().hex[:6]}"
    gate = SourceGate(HOLD, str(tmp_path / "gate"))
    out = tmp_path / "out"
    env = dict(head.env, REFLOW_JOBS_DIR=str(tmp_path / "jobs"))
    submitted = _cli("run", "--address", head.dashboard, "--detached", "--json",
                     "tests/detached_job.py", "--name", name, "--gate", gate.directory,
                     "--out", str(out), "--checkpoints", str(tmp_path / "checkpoints"),
                     env=env)
    assert submitted.returncode == 0, (submitted.stdout + submitted.stderr)[-4000:]
    outcome = json.loads(submitted.stdout)
    assert outcome["status"] == "SUCCEEDED" and "detached=True" in outcome["logs"], outcome
    stopped = False
    try:
        gate.wait_reached(timeout=180)
        st = _cli("status", name, "--address", head.gcs, "--json", env=env)
        assert st.returncode == 0, st.stderr[-3000:]
        doc = json.loads(st.stdout)
        assert (doc["state"], doc["detached"]) == ("running", True), doc
        listed = _cli("list", "--address", head.gcs, "--json", env=env)
        assert listed.returncode == 0, listed.stderr[-3000:]
        [entry] = [j for j in json.loads(listed.stdout) if j["name"] == name]
        assert (entry["job"], entry["state"], entry["detached"]) == (doc["job"], "running",
                                                                     True), entry
        stop = _cli("stop", name, "--address", head.gcs, "--savepoint", str(tmp_path / "sp"),
                    "--json", env=env)
        assert stop.returncode == 0, stop.stderr[-3000:]
        stopped = json.loads(stop.stdout)["stopped"]
    finally:
        gate.open()
        if not stopped:
            _cli("stop", name, "--address", head.gcs, env=env)
    gone = _cli("status", name, "--address", head.gcs, env=env)
    assert gone.returncode == 2 and f"no job {name!r}" in gone.stderr, gone.stderr
    reference = running_sum_reference(RECORDS)
    assert _sums(TestingSink(str(out))) == per_key(reference[:HOLD])
