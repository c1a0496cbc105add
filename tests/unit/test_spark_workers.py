"""Spark's Python workers under reflow: which interpreter they run
(``python_worker_executable``), the ``worker_launcher`` that takes pyspark's zips off their
path, and when SparkLink starts a failed Spark query again (``QueryRestarts``: only after a
failure of Spark's own Python worker start-up, at most ``limit`` times per query). Both run
on real Spark in tests/integration/test_spark_python.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pyspark
import pytest

from engine.spark import link
from engine.spark.link import (
    TRANSIENT_SPARK_ERRORS,
    QueryRestarts,
    python_worker_executable,
    worker_launcher,
)

CONNECT_BACK = ("org.apache.spark.SparkException: Python worker failed to connect back.\n"
                "\tat org.apache.spark.api.python.PythonWorkerFactory.createSimpleWorker")


def test_a_python_worker_that_did_not_connect_back_is_restarted_up_to_the_limit():
    r = QueryRestarts(2)
    assert r.should_restart("q1", CONNECT_BACK)
    assert r.should_restart("q1", CONNECT_BACK)
    assert not r.should_restart("q1", CONNECT_BACK)  # the third time stands
    assert r.should_restart("q2", CONNECT_BACK)  # counted per query
    assert r.used == {"q1": 2, "q2": 1}


@pytest.mark.parametrize("error", [
    "AnalysisException: [UNABLE_TO_INFER_SCHEMA] Unable to infer schema for Parquet",
    "PythonException: ValueError: bad row",
    "reflow job words-1 failed: UserFunctionError ...",
    "",
])
def test_other_failures_are_never_restarted(error):
    r = QueryRestarts(3)
    assert not r.should_restart("q", error)
    assert r.used == {}


def test_no_restarts_at_all_and_a_bad_limit():
    assert not QueryRestarts(0).should_restart("q", CONNECT_BACK)
    with pytest.raises(ValueError, match="query_restarts must be >= 0"):
        QueryRestarts(-1)
    assert all(TRANSIENT_SPARK_ERRORS)


def test_the_launcher_drops_only_pysparks_own_zips_and_runs_the_interpreter(tmp_path):
    launcher = worker_launcher(sys.executable)
    assert launcher != sys.executable and worker_launcher(sys.executable) == launcher
    zips = os.path.join(os.path.dirname(pyspark.__file__), "python", "lib")
    mine = str(tmp_path / "my lib")  # a user's entry, with a space, stays
    path = os.pathsep.join([os.path.join(zips, "pyspark.zip"), mine,
                            os.path.join(zips, "py4j-0.10.9.9-src.zip"), "/elsewhere/x.zip"])
    shown = subprocess.run(
        [launcher, "-c", "import os, sys; print(sys.executable); print(os.environ['PYTHONPATH'])"],
        env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, check=True)
    python, kept = shown.stdout.splitlines()
    assert os.path.realpath(python) == os.path.realpath(sys.executable)
    assert kept == os.pathsep.join([mine, "/elsewhere/x.zip"])


def test_the_users_python_wins_and_a_launcher_left_in_the_env_is_not_a_choice(monkeypatch):
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    assert python_worker_executable() == sys.executable
    assert python_worker_executable({"spark.pyspark.python": "/opt/py"}) == "/opt/py"
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3.11")
    assert python_worker_executable() == "/usr/bin/python3.11"
    # what local_spark leaves in the environment for its session's workers
    monkeypatch.setenv("PYSPARK_PYTHON", worker_launcher(sys.executable))
    assert python_worker_executable() == sys.executable
    assert link._launchers[sys.executable] == os.environ["PYSPARK_PYTHON"]


def test_no_launcher_where_the_temp_dir_cannot_execute(monkeypatch, tmp_path):
    class NoExec:
        f_flag = os.ST_NOEXEC

    monkeypatch.setattr(link.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(link.os, "statvfs", lambda _: NoExec())
    assert worker_launcher("/opt/elsewhere/python") == "/opt/elsewhere/python"
    assert "/opt/elsewhere/python" not in link._launchers
    assert list(tmp_path.iterdir()) == []  # its directory went again
