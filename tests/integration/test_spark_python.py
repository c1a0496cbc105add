"""Spark's Python workers run the driver's interpreter.

A user runs the main example with a virtualenv's interpreter that is not first on PATH
(``/path/venv/bin/python examples/wordcount.py --once``, as ``ray job submit``, cron or
systemd do). PySpark's own default for its workers is ``python3`` from PATH: here a bare
virtualenv without reflow's packages, so without ``local_spark``'s choice of
``sys.executable`` the data source fails on the executors with "No module named
'msgpack'". Real interpreters, real Spark in local mode, real Ray.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv

import pytest

from engine.spark.link import python_worker_executable

pytestmark = [pytest.mark.spark, pytest.mark.ray]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_worker_python_defaults_to_the_driver(monkeypatch):
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    assert python_worker_executable() == sys.executable
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/py/bin/python")
    assert python_worker_executable() == "/opt/py/bin/python"
    assert python_worker_executable({"spark.pyspark.python": "/x/python"}) == "/x/python"


def test_main_example_with_a_venv_python_off_path(tmp_path):
    # the user's venv sees the installed packages; the python3 on PATH is a venv without them
    user_venv, bare_venv = tmp_path / "venv", tmp_path / "bare"
    venv.create(user_venv, system_site_packages=True, with_pip=False)
    venv.create(bare_venv, system_site_packages=False, with_pip=False)
    bare_python = subprocess.run([str(bare_venv / "bin" / "python3"), "-c", "import msgpack"],
                                 capture_output=True, text=True)
    assert "No module named 'msgpack'" in bare_python.stderr  # the trap is real
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    env["PATH"] = os.pathsep.join([str(bare_venv / "bin"), "/usr/bin", "/bin"])
    env["PYTHONPATH"] = ROOT
    proc = subprocess.run(
        [str(user_venv / "bin" / "python"), "examples/wordcount.py", "--once", "--lines", "2000",
         "--files", "2", "--parallelism", "1", "--mode", "datasource",
         "--work-dir", str(tmp_path / "work")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "result: OK" in proc.stdout
    assert "msgpack" not in out
