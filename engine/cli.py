"""The ``reflow`` command line.

    reflow metrics URL            per-operator summary of a running job's metrics endpoint
    reflow example wordcount ...  run an example job (arguments pass through)
    reflow bench NAME ...         run examples/bench/NAME.py of the checkout in the current
                                  directory (e.g. ``reflow bench rescale --scenario q7 --quick``)

The benchmarks are not part of the installed package (``examples/`` is not packaged), so
``reflow bench`` never imports them: it runs the script of the checkout it is started in as
a subprocess with this interpreter and returns its exit code; without a checkout it exits 2
saying where to run it.
"""

from __future__ import annotations

import argparse
import os
import runpy
import subprocess
import sys
import urllib.request
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _metrics(url: str) -> int:
    if not url.startswith(("http://", "https://")):
        print(f"reflow metrics: {url!r} is not an http(s) URL; pass the job's metrics_url",
              file=sys.stderr)
        return 2
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    per_op: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    tasks: dict[str, set[str]] = defaultdict(set)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            op = s.labels.get("operator")
            if op is None or "task" not in s.labels:
                continue
            tasks[op].add(s.labels["task"])
            if s.name in ("reflow_records_in_total", "reflow_records_out_total",
                          "reflow_state_bytes", "reflow_key_groups", "reflow_queued_frames",
                          "reflow_useful_seconds_total", "reflow_backpressured_seconds_total"):
                per_op[op][s.name] += s.value
    cols = ["tasks", "records in", "records out", "useful s", "backpr. s", "queued", "key groups",
            "state bytes"]
    print(f"{'operator':<20}" + "".join(f"{c:>14}" for c in cols))
    for op, m in sorted(per_op.items()):
        vals = [len(tasks[op]), m["reflow_records_in_total"], m["reflow_records_out_total"],
                m["reflow_useful_seconds_total"], m["reflow_backpressured_seconds_total"],
                m["reflow_queued_frames"], m["reflow_key_groups"], m["reflow_state_bytes"]]
        print(f"{op:<20}" + "".join(f"{v:>14,.1f}" if isinstance(v, float) else f"{v:>14,}"
                                      for v in vals))
    return 0


def _script(kind: str, name: str, rest: list[str]) -> int:
    path = os.path.join(ROOT, "examples", f"{name}.py")
    if not os.path.exists(path):
        found = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "examples"))
                       if f.endswith(".py"))
        print(f"reflow {kind}: no {kind} {name!r}; available: {', '.join(found)}", file=sys.stderr)
        return 2
    sys.argv = [path, *rest]
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


BENCH_DIR = os.path.join("examples", "bench")


def _bench(name: str, rest: list[str], cwd: str | None = None) -> int:
    """``reflow bench NAME [args]``: ``examples/bench/NAME.py`` under ``cwd`` (default: the
    current directory) run with this interpreter; its exit code, or 2 when there is no such
    script (the message says what to do)."""
    cwd = os.path.abspath(cwd or os.getcwd())
    folder = os.path.join(cwd, BENCH_DIR)
    path = os.path.join(folder, f"{name}.py")
    if not os.path.isdir(folder):
        print(f"reflow bench: no {BENCH_DIR}/ under {cwd}: the benchmarks are not installed "
              f"with the package; run `reflow bench {name}` from the root of a reflow "
              f"checkout (git clone, then cd into it)", file=sys.stderr)
        return 2
    if os.sep in name or not os.path.isfile(path):
        found = sorted(f[:-3] for f in os.listdir(folder)
                       if f.endswith(".py") and not f.startswith("_"))
        print(f"reflow bench: no {BENCH_DIR}/{name}.py under {cwd}; available: "
              f"{', '.join(found) or 'none'}", file=sys.stderr)
        return 2
    return subprocess.run([sys.executable, path, *rest], cwd=cwd).returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="reflow", description="reflow: live-rescaling streams on Ray")
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("metrics", help="summarise a job's Prometheus endpoint")
    m.add_argument("url")
    for kind, where in (("example", "the repository"),
                        ("bench", "the checkout in the current directory")):
        p = sub.add_parser(kind, help=f"run an {kind} script from {where}")
        p.add_argument("name")
        p.add_argument("args", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    if args.cmd == "metrics":
        return _metrics(args.url)
    if args.cmd == "bench":
        return _bench(args.name, args.args)
    return _script(args.cmd, args.name, args.args)


if __name__ == "__main__":
    sys.exit(main())
