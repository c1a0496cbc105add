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

pytestmark = [pytest.mark.spark, pytest.mark.ray]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_main_example_with_a_venv_python_off_path(tmp_path):
    # the user's venv sees the installed packages; the python3 on PATH is a venv without them
    user_venv, bare_venv = tmp_path / "venv", tmp_path / "bare"
    venv.create(user_venv, system_site_packages=False, with_pip=False)
    # the user's venv sees what this interpreter sees: its own site-packages (when the
    # tests run inside a virtualenv, system_site_packages would show the base
    # interpreter's instead, without the packages installed into that virtualenv)
    seen = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))
            and os.path.isdir(p)]
    [user_site] = (user_venv / "lib").glob("python*/site-packages")
    (user_site / "reflow-test-parent.pth").write_text(  # addsitedir: their .pth files too
        "".join(f"import site; site.addsitedir({p!r})\n" for p in seen))
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


# a second run of the main example (138 s at load 20 here) with a 10 s wait built in;
# tests/unit/test_spark_workers.py covers QueryRestarts' decisions in the default suite
@pytest.mark.slow
def test_a_python_worker_that_never_connects_back_restarts_the_query(tmp_path):
    """Spark waits a fixed 10 s for a new Python worker to connect back, which a machine
    at load 30 misses. Here the first start of the output query's reader on the driver
    (pyspark's streaming source runner) exits without connecting: Spark fails that query
    after its 10 s, SparkLink starts it again from its checkpoint, and the main example's
    output is still exact."""
    marker, wrapper = tmp_path / "failed-once", tmp_path / "python"
    wrapper.write_text(
        "#!/bin/sh\n"
        'case "$*" in *python_streaming_source_runner*)\n'
        f'  mkdir "{marker}" 2>/dev/null && exit 1;;\n'
        "esac\n"
        f'exec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    env = {**os.environ, "PYSPARK_PYTHON": str(wrapper), "PYTHONPATH": ROOT}
    proc = subprocess.run(
        [sys.executable, "examples/wordcount.py", "--once", "--lines", "2000", "--files", "2",
         "--parallelism", "1", "--work-dir", str(tmp_path / "work")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert marker.is_dir()  # the worker did fail once
    assert ("Spark query reflow-to-parquet failed in Spark's start-up of a Python worker "
            "(Python worker failed to connect back.); restarted from its "
            "checkpoint (restart 1 of at most 3)") in proc.stderr
    assert "result: OK" in proc.stdout
