"""The ``reflow`` command's parts that need no Ray: its commands and help, the progress bar,
the metrics summary, ``plot RESULTS.json`` through the benchmark's own ``plot``, running
checkout scripts, and finding jobs through address files (the lookups on a running job:
tests/integration/test_cluster.py)."""

from __future__ import annotations

import io
import json
import os
import sys

import pytest

from engine import cli
from engine.errors import JobNotFound
from engine.runtime import registry

COMMANDS = ("run", "list", "status", "rescale", "savepoint", "stop", "metrics", "plot",
            "bench", "example")


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert f"    {name} " in out, name
    assert set(cli.COMMANDS) == set(COMMANDS)


def test_progress_bar_writes_a_line_per_change_off_a_terminal():
    out = io.StringIO()
    bar = cli.ProgressBar("rescale sum -> 3", out, width=10)
    bar.update(0, 1, "requested")
    bar.update(0, 1, "requested")  # unchanged: not written again
    bar.update(4, 8, "key groups, migrate")
    bar.update(8, 8, "key groups, done")
    bar.close()
    assert out.getvalue().splitlines() == [
        "rescale sum -> 3 [..........] 0/1 requested",
        "rescale sum -> 3 [#####.....] 4/8 key groups, migrate",
        "rescale sum -> 3 [##########] 8/8 key groups, done",
    ]


EXPOSITION = """\
# TYPE reflow_records_in counter
reflow_records_in_total{job="j",operator="sum",task="0"} 10.0
reflow_records_in_total{job="j",operator="sum",task="1"} 5.0
reflow_records_in_total{job="j",operator="src",task="0"} 0.0
# TYPE reflow_key_groups gauge
reflow_key_groups{job="j",operator="sum",task="0"} 20.0
reflow_key_groups{job="j",operator="sum",task="1"} 12.0
# TYPE reflow_job_running gauge
reflow_job_running{job="j"} 1.0
"""


def test_metrics_summary_sums_per_operator():
    s = cli.summarise(EXPOSITION)
    assert list(s) == ["src", "sum"]
    assert s["sum"]["tasks"] == 2 and s["sum"]["reflow_records_in_total"] == 15
    assert s["sum"]["reflow_key_groups"] == 32 and s["src"]["tasks"] == 1
    table = cli._table(s)
    assert table.splitlines()[0].startswith("operator")
    row = table.splitlines()[2].split()  # counts print as integers, seconds with a decimal
    assert row[0] == "sum" and row[2] == "15" and row[4] == "0.0" and row[7] == "32"


def _checkout(tmp_path, monkeypatch):
    bench = tmp_path / "examples" / "bench"
    bench.mkdir(parents=True)
    (bench / "fake.py").write_text(
        "def plot(results, path):\n"
        "    open(path, 'w').write('figure of ' + str(results['value']))\n")
    monkeypatch.chdir(tmp_path)
    return bench


def test_plot_results_runs_the_benchmarks_own_plot(tmp_path, monkeypatch, capsys):
    bench = _checkout(tmp_path, monkeypatch)
    results = bench / "results.json"
    results.write_text(json.dumps({"command": "python examples/bench/fake.py --quick",
                                   "value": 42}))
    assert cli.main(["plot", str(results), "--out", str(tmp_path / "again.png")]) == 0
    assert (tmp_path / "again.png").read_text() == "figure of 42"
    assert "wrote" in capsys.readouterr().out


def test_plot_results_outside_a_checkout_says_where_to_run(tmp_path, monkeypatch, capsys):
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"command": "python examples/bench/rescale.py"}))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["plot", str(results)]) == 2
    assert "run `reflow plot` from the root of a reflow checkout" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text(json.dumps({"value": 1}))
    assert cli.main(["plot", str(tmp_path / "bad.json")]) == 2
    assert "does not say which benchmark wrote it" in capsys.readouterr().err
    assert cli.main(["plot"]) == 2
    assert "RESULTS.json, or --prometheus URL --dashboard NAME" in capsys.readouterr().err


def test_example_outside_a_checkout_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["example", "wordcount", "--once"]) == 2
    err = capsys.readouterr().err
    assert "no examples/ under" in err and "run `reflow example wordcount` from the root" in err


def test_run_runs_the_script_here_with_this_interpreter(tmp_path, monkeypatch):
    script = tmp_path / "job.py"
    script.write_text("import json, sys\n"
                      "json.dump([sys.executable, sys.argv[1:]], open('ran.json', 'w'))\n"
                      "sys.exit(4)\n")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "job.py", "--records", "5"]) == 4
    assert json.loads((tmp_path / "ran.json").read_text()) == [sys.executable,
                                                                ["--records", "5"]]
    assert cli.main(["run", "missing.py"]) == 2


# ------------------------------------------------------------------ address files

def _address(job_id: str, pid: int, host: str | None = None) -> registry.JobAddress:
    return registry.JobAddress(job_id, registry.name_of(job_id), "127.0.0.1:6379", "reflow",
                               "http://127.0.0.1:1/metrics",
                               host or registry.socket.gethostname(), pid)


def _write(folder, addr: registry.JobAddress) -> None:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{addr.job_id}.json"), "w") as f:
        json.dump(registry.asdict(addr), f)


def test_address_files_of_gone_drivers_are_dropped(tmp_path, monkeypatch):
    monkeypatch.setenv(registry.ENV_DIR, str(tmp_path))
    gone = _address("wc-00000001", 2**22 + 12345)  # no such pid
    live = _address("wc-00000002", os.getpid())
    elsewhere = _address("q7-00000003", 2**22 + 12345, host="another-host")
    for a in (gone, live, elsewhere):
        _write(tmp_path, a)
    (tmp_path / "junk.json").write_text("{not json")
    assert {a.job_id for a in registry.recorded()} == {live.job_id, elsewhere.job_id}
    assert not (tmp_path / f"{gone.job_id}.json").exists()
    registry.forget(live.job_id)
    assert {a.job_id for a in registry.recorded()} == {elsewhere.job_id}


def test_resolve_by_name_or_id_and_says_what_it_knows(tmp_path, monkeypatch):
    monkeypatch.setenv(registry.ENV_DIR, str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(JobNotFound, match=r"no running job 'wc' recorded in .*jobs there: "
                                          r"none.*pass --address"):
        registry.resolve("wc")
    a, b = _address("wc-00000001", os.getpid()), _address("wc-00000002", os.getpid())
    _write(tmp_path, a)
    _write(tmp_path, b)
    with pytest.raises(JobNotFound, match="2 running jobs are named 'wc': wc-00000001, "
                                          "wc-00000002; pass the job id"):
        registry.resolve("wc")
    with pytest.raises(JobNotFound, match=r"no running job 'q7'.*wc-0000000[12]"):
        registry.resolve("q7")
    assert registry.name_of("my-job-name-1a2b3c4d") == "my-job-name"


def test_example_names_a_script_in_a_subfolder_and_lists_them(tmp_path, capsys):
    (tmp_path / "examples" / "nexmark").mkdir(parents=True)
    (tmp_path / "examples" / "nexmark" / "run.py").write_text("raise SystemExit(3)\n")
    (tmp_path / "examples" / "wc.py").write_text("")
    assert cli._checkout_script("example", "examples", "nexmark/run", [], cwd=str(tmp_path)) == 3
    assert cli._checkout_script("example", "examples", "../wc", [], cwd=str(tmp_path)) == 2
    assert "available: nexmark/run, wc" in capsys.readouterr().err


def test_status_with_an_address_nothing_listens_on_fails_at_once_in_one_line(capsys):
    import socket

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert cli.main(["status", "--address", f"127.0.0.1:{port}"]) == 1
    assert cli.main(["status", "somejob", "--address", f"ray://127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("RayUnavailable: no Ray cluster answers" in e for e in err)
