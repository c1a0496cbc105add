"""Detached jobs on the ``reflow`` command's side, without Ray: address files of detached
jobs outlive their drivers, the listing merges files with a cluster's JobMasters and drops
the files of jobs found ended, ``reflow run --detached`` tells the script, and a command
against a job that ended says so in one line and exits 1. The same on a real cluster, with
a driver that exits: tests/integration/test_detached_jobs.py."""

from __future__ import annotations

import json
import os
import socket
import sys

import pytest

from engine import cli
from engine.errors import JobNotFound
from engine.runtime import registry
from engine.wire.messages import JobStatus

GONE_PID = 2**22 + 12345  # no such process


def _free_address() -> str:
    """A GCS address nothing listens on (free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _address(job_id: str, pid: int = GONE_PID, detached: bool = False,
             ray_address: str = "127.0.0.1:1") -> registry.JobAddress:
    return registry.JobAddress(job_id, registry.name_of(job_id), ray_address, "reflow",
                               "http://127.0.0.1:1/metrics", socket.gethostname(), pid,
                               detached=detached)


def _write(folder, addr: registry.JobAddress | dict) -> None:
    os.makedirs(folder, exist_ok=True)
    body = addr if isinstance(addr, dict) else registry.asdict(addr)
    with open(os.path.join(folder, f"{body['job_id']}.json"), "w") as f:
        json.dump(body, f)


@pytest.fixture
def jobs(tmp_path, monkeypatch):
    monkeypatch.setenv(registry.ENV_DIR, str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    # as the ``reflow`` command's own process: connected to no cluster, whatever an earlier
    # test of this pytest process left connected (the session's Ray cluster)
    monkeypatch.setattr(registry, "connected_address", lambda: None)
    return tmp_path


# ------------------------------------------------------------------ address files

def test_a_detached_jobs_file_outlives_its_driver_an_attached_ones_does_not(jobs):
    attached = _address("wc-00000001")
    detached = _address("wc-00000002", detached=True)
    for a in (attached, detached):
        _write(jobs, a)
    assert registry.recorded() == [detached]
    assert not (jobs / "wc-00000001.json").exists()
    assert (jobs / "wc-00000002.json").exists()
    registry.forget(detached.job_id)
    assert registry.recorded() == []


def test_an_address_file_of_an_older_version_reads_as_attached(jobs):
    old = registry.asdict(_address("q7-00000003", pid=os.getpid()))
    del old["detached"]
    _write(jobs, {**old, "written_by": "a newer reflow"})  # unknown fields are ignored
    [addr] = registry.recorded()
    assert addr.job_id == "q7-00000003" and addr.detached is False
    with pytest.raises(ValueError):
        registry.JobAddress.from_json(["not", "a", "file"])
    with pytest.raises(ValueError):
        registry.JobAddress.from_json({**old, "detached": "yes"})


def test_files_on_a_cluster_that_answered_without_their_jobmaster_have_ended():
    here, there = "10.0.0.1:6379", "10.0.0.2:6379"
    files = [_address("a-00000001", detached=True, ray_address=here),
             _address("b-00000002", detached=True, ray_address=here),
             _address("c-00000003", detached=True, ray_address=there)]
    assert registry.ended(files, here, ["b-00000002", "x-00000009"]) == ["a-00000001"]
    assert registry.ended(files, there, []) == ["c-00000003"]
    assert registry.ended(files, "10.0.0.3:6379", []) == []


def test_the_listing_merges_address_files_and_the_clusters_jobmasters():
    here, there = "10.0.0.1:6379", "10.0.0.2:6379"
    files = [_address("a-00000001", detached=True, ray_address=here),
             _address("b-00000002", pid=7, ray_address=here),
             _address("c-00000003", ray_address=there),
             _address("b-00000002", pid=8, ray_address=here)]  # a duplicate: the first wins
    listed = registry.listing(files, here, ["b-00000002", "z-0000000f", "m-00000004"])
    assert [(j.job_id, j.detached, j.on_cluster, j.ray_address) for j in listed] == [
        ("b-00000002", False, True, here),  # a-... ended: not listed
        ("c-00000003", False, False, there),  # another cluster: listed, not asked
        ("m-00000004", None, True, here),  # only the cluster knows it: its status says
        ("z-0000000f", None, True, here)]
    assert listed[0].driver == f"{socket.gethostname()}:7" and listed[2].driver == ""
    # not connected to any cluster: every file, nothing ended
    assert [j.job_id for j in registry.listing(files, None, ["ignored-00000000"])] == [
        "a-00000001", "b-00000002", "c-00000003"]


def test_an_unknown_name_lists_the_jobs_by_name_and_id(jobs):
    _write(jobs, _address("wordcount-0000000a", detached=True))
    with pytest.raises(JobNotFound, match=r"no running job 'q7' recorded in .* \(jobs there: "
                                          r"wordcount \(wordcount-0000000a\)\); pass one of "
                                          r"those names or ids.*--address"):
        registry.resolve("q7")


# ------------------------------------------------------------------ the commands

def test_the_job_commands_parse():
    ap = cli.parser()
    a = ap.parse_args(["stop", "wc", "--savepoint", "/tmp/sp", "--json"])
    assert (a.cmd, a.job, a.savepoint, a.json, a.address) == ("stop", "wc", "/tmp/sp", True,
                                                               None)
    assert ap.parse_args(["stop", "wc"]).savepoint is None
    a = ap.parse_args(["savepoint", "wc-0000000a", "s3://bucket/sp", "--address", "h:6379"])
    assert (a.cmd, a.job, a.location, a.address) == ("savepoint", "wc-0000000a",
                                                     "s3://bucket/sp", "h:6379")
    a = ap.parse_args(["list", "--json"])
    assert (a.cmd, a.json) == ("list", True)
    a = ap.parse_args(["run", "--detached", "job.py", "--records", "5"])
    assert (a.detached, a.file, a.args) == (True, "job.py", ["--records", "5"])
    assert ap.parse_args(["run", "job.py"]).detached is False


_DUMP_ENV = ("import json, os, sys\n"
             "json.dump(os.environ.get('REFLOW_DETACHED'), open(sys.argv[1], 'w'))\n")


def test_run_detached_tells_the_script_and_warns_without_a_cluster(tmp_path, monkeypatch,
                                                                    capsys):
    monkeypatch.delenv(cli.DETACHED_ENV, raising=False)
    monkeypatch.setenv("RAY_ADDRESS", "local")
    script = tmp_path / "job.py"
    script.write_text(_DUMP_ENV)
    seen = tmp_path / "seen.json"
    assert cli.main(["run", "--detached", str(script), str(seen)]) == 0
    assert json.loads(seen.read_text()) == "1"
    assert "--detached without RAY_ADDRESS" in capsys.readouterr().err
    assert cli.main(["run", str(script), str(seen)]) == 0
    assert json.loads(seen.read_text()) is None
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # a cluster given: no warning
    assert cli.main(["run", "--detached", str(script), str(seen)]) == 0
    assert json.loads(seen.read_text()) == "1"
    assert capsys.readouterr().err == ""


def test_list_shows_one_line_per_job_and_keeps_files_of_a_cluster_that_does_not_answer(
        jobs, capsys):
    gone = _free_address()
    _write(jobs, _address("wordcount-0000000a", detached=True, ray_address=gone))
    _write(jobs, _address("nexmark-0000000b", pid=os.getpid(), ray_address="10.9.9.9:1"))
    os.utime(jobs / "wordcount-0000000a.json", (2e9, 2e9))  # the newest: its cluster is asked
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["job", "name", "state", "lifetime", "ray", "address", "driver",
                              "(host:pid)"]
    assert out[1].split()[:5] == ["wordcount-0000000a", "wordcount", "unreachable",
                                  "detached", gone]
    assert out[2].split()[:5] == ["nexmark-0000000b", "nexmark", "unknown", "attached",
                                  "10.9.9.9:1"]
    assert len(out) == 3
    assert (jobs / "wordcount-0000000a.json").exists()  # no answer proves nothing
    assert cli.main(["status", "--json"]) == 0  # status without a job: the same listing
    listed = json.loads(capsys.readouterr().out)
    assert [(j["job"], j["detached"], j["state"]) for j in listed] == [
        ("wordcount-0000000a", True, "unreachable"), ("nexmark-0000000b", False, "unknown")]


def test_a_command_on_a_detached_job_whose_cluster_does_not_answer_says_so_in_one_line(
        jobs, capsys):
    _write(jobs, _address("wordcount-0000000a", detached=True, ray_address=_free_address()))
    for argv in (["status", "wordcount"], ["stop", "wordcount"],
                 ["savepoint", "wordcount", "/tmp/sp"]):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "RayUnavailable: no Ray cluster answers at" in err[0], err
    assert (jobs / "wordcount-0000000a.json").exists()


class _EndedJob:
    """A handle on a job whose JobMaster still answers but whose job has ended."""

    job_id = "wordcount-0000000a"

    def __init__(self) -> None:
        self.stopped = 0

    def status(self) -> JobStatus:
        return JobStatus(self.job_id, "failed", error="UserFunctionError: boom",
                         detached=True)

    def stop(self, savepoint: str | None = None) -> None:
        self.stopped += 1

    def savepoint(self, location: str | None = None) -> str:
        raise AssertionError("no savepoint of an ended job")

    def rescale(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("no rescale of an ended job")

    def metrics(self) -> None:
        raise AssertionError("status of an ended job needs no metrics")


@pytest.mark.parametrize("argv", [["status", "wordcount"], ["savepoint", "wordcount", "/sp"],
                                  ["rescale", "wordcount", "sum", "3"], ["stop", "wordcount"],
                                  ["stop", "wordcount", "--savepoint", "/sp"]])
def test_a_command_on_a_job_that_ended_says_so_in_one_line_and_exits_1(argv, monkeypatch,
                                                                       capsys):
    job = _EndedJob()
    monkeypatch.setattr(cli, "_find", lambda args: job)
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    [line] = captured.err.strip().splitlines()
    assert line.startswith("reflow: job wordcount-0000000a has ended (failed: "
                           "UserFunctionError: boom)"), line
    assert captured.out == ""
    assert job.stopped == (1 if argv[0] == "stop" else 0)  # stop releases what it holds
    if "--savepoint" in argv:
        assert "no savepoint taken" in line


def test_an_ended_jobs_status_in_json_is_the_whole_status_and_exits_1(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_find", lambda args: _EndedJob())
    assert cli.main(["status", "wordcount", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert (doc["state"], doc["detached"], doc["operators"]) == ("failed", True, {})


def test_the_help_of_run_says_what_detached_does(capsys):
    def connected() -> bool:
        return sys.modules.get("ray") is not None and sys.modules["ray"].is_initialized()

    before = connected()  # an earlier test of this process may have connected
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    assert "REFLOW_DETACHED=1" in capsys.readouterr().out
    assert connected() == before  # the help connected to no cluster
