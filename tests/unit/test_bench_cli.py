"""``reflow bench NAME``: runs examples/bench/NAME.py of the checkout in the current directory
as a subprocess with the same interpreter, and exits 2 saying what to do without one. Each
test works in its own tmp directory; the scripts run here are tiny stand-ins, not jobs."""

from __future__ import annotations

import json
import sys

from engine import cli


def test_bench_without_a_checkout_exits_2_and_says_where_to_run(tmp_path, monkeypatch,
                                                                 capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["bench", "rescale", "--quick"]) == 2
    err = capsys.readouterr().err
    assert f"no {cli.BENCH_DIR}/ under {tmp_path}" in err
    assert "run `reflow bench rescale` from the root of a reflow checkout" in err


def test_bench_names_the_benchmarks_a_checkout_has(tmp_path, monkeypatch, capsys) -> None:
    bench = tmp_path / "examples" / "bench"
    bench.mkdir(parents=True)
    for name in ("rescale.py", "steady.py", "_private.py", "notes.md"):
        (bench / name).write_text("")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["bench", "nosuch"]) == 2
    assert cli.main(["bench", "../bench/rescale"]) == 2  # only scripts of examples/bench
    err = capsys.readouterr().err
    assert "no examples/bench/nosuch.py" in err and "available: rescale, steady" in err


def test_bench_runs_the_checkouts_script_with_this_interpreter(tmp_path, monkeypatch) -> None:
    bench = tmp_path / "examples" / "bench"
    bench.mkdir(parents=True)
    (bench / "echo.py").write_text(
        "import json, os, sys\n"
        "json.dump({'argv': sys.argv[1:], 'exe': sys.executable, 'cwd': os.getcwd()},\n"
        "          open('ran.json', 'w'))\n"
        "sys.exit(3)\n")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["bench", "echo", "--quick", "--out", "x"]) == 3  # its exit code
    ran = json.loads((tmp_path / "ran.json").read_text())
    assert ran == {"argv": ["--quick", "--out", "x"], "exe": sys.executable,
                   "cwd": str(tmp_path)}


def test_bench_papers_lists_the_papers_scripts_with_their_first_line(tmp_path, monkeypatch,
                                                                     capsys) -> None:
    papers = tmp_path / "examples" / "papers"
    papers.mkdir(parents=True)
    (papers / "ding.py").write_text('"""Ding et al.: state moved.\n\nMore."""\n')
    (papers / "drrs.py").write_text("x = 1\n")  # no docstring: listed bare
    (papers / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["bench", "papers"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "ding  Ding et al.: state moved."
    assert out[1] == "drrs"
    assert "reflow bench papers NAME" in out[2]


def test_bench_papers_runs_a_paper_and_names_the_others(tmp_path, monkeypatch, capsys) -> None:
    papers = tmp_path / "examples" / "papers"
    papers.mkdir(parents=True)
    (papers / "ding.py").write_text(
        "import json, sys\njson.dump(sys.argv[1:], open('ran.json', 'w'))\n")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["bench", "papers", "ding", "--quick", "--out", "x"]) == 0
    assert json.loads((tmp_path / "ran.json").read_text()) == ["--quick", "--out", "x"]
    assert cli.main(["bench", "papers", "nosuch"]) == 2
    assert "available: ding" in capsys.readouterr().err


def test_bench_papers_without_a_checkout_exits_2(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["bench", "papers"]) == 2
    assert f"no {cli.PAPERS_DIR}/ under {tmp_path}" in capsys.readouterr().err
