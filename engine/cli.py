"""The ``reflow`` command line (an installed console script; works outside a checkout).

    reflow run [--detached] FILE.py [ARGS] run a job script here, or with --address submit
                                           it to a Ray cluster (Ray's job submission);
                                           --detached: its job outlives the script
    reflow list                            the jobs: id, name, state, detached or not, where
    reflow status [JOB]                    a job's state and operators (no JOB: the jobs)
    reflow rescale JOB OPERATOR N          rescale live, with a progress bar from the job's
                                           own rescale progress
    reflow savepoint JOB URI               take a savepoint of a running job
    reflow stop JOB [--savepoint URI]      stop a job, after a savepoint when given
    reflow metrics URL|JOB                 per-operator summary of a job's metrics endpoint
    reflow plot RESULTS.json               a benchmark's figure, again, from its results
    reflow plot --prometheus URL --dashboard NAME
                                           the Grafana dashboard's queries drawn to a PNG
    reflow bench NAME [ARGS]               examples/bench/NAME.py of the checkout here
    reflow bench papers [PAPER [ARGS]]     the papers' reproductions: list them, or run
                                           examples/papers/PAPER.py
    reflow example NAME [ARGS]             examples/NAME.py of the checkout here

Output is for people by default; ``--json`` prints one JSON document instead (list,
status, rescale, savepoint, stop, metrics, run --address). A job is reached by name or id
through ``engine.attach`` (``engine.runtime.registry``): the address files drivers write,
or, with ``--address`` (or ``RAY_ADDRESS``), among the named JobMasters of that Ray
cluster. ``reflow run --detached`` sets ``REFLOW_DETACHED=1`` for the script, which
``job.run()`` reads (``detached=None``).

Exit codes: 0 done; 1 the job or the request failed, or the job has ended (one line says
so, no traceback); 2 a usage problem (no such job, script, benchmark or checkout: the
message says what to do). ``bench``, ``example`` and ``plot RESULTS.json`` run scripts of
a reflow checkout (the ``examples/`` folder is not installed with the package) and say so
when run elsewhere.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from typing import Any, TextIO

from engine.api import DETACHED_ENV
from engine.errors import JobNotFound, JobNotRunningError, ReflowError
from engine.names import JobState

BENCH_DIR = os.path.join("examples", "bench")
PAPERS_DIR = os.path.join("examples", "papers")
EXAMPLES_DIR = "examples"
POLL_S = 0.25  # how often progress is redrawn

_SUMMED = ("reflow_records_in_total", "reflow_records_out_total", "reflow_state_bytes",
           "reflow_key_groups", "reflow_queued_frames", "reflow_useful_seconds_total",
           "reflow_backpressured_seconds_total")
_COLUMNS = [("tasks", "tasks"), ("records in", "reflow_records_in_total"),
            ("records out", "reflow_records_out_total"), ("useful s", "reflow_useful_seconds_total"),
            ("backpr. s", "reflow_backpressured_seconds_total"),
            ("queued", "reflow_queued_frames"), ("key groups", "reflow_key_groups"),
            ("state bytes", "reflow_state_bytes")]


def _err(message: str) -> None:
    print(f"reflow: {message}", file=sys.stderr)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=1, sort_keys=True, default=_jsonable))


def _jsonable(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


class ProgressBar:
    """A one-line progress bar on ``stream``: redrawn in place on a terminal, else a line
    per change (so logs and tests see each step)."""

    def __init__(self, label: str, stream: TextIO | None = None, width: int = 30) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.width = width
        self.tty = self.stream.isatty()
        self._last = ""

    def update(self, done: float, total: float, note: str = "") -> None:
        frac = 0.0 if total <= 0 else min(1.0, done / total)
        fill = round(frac * self.width)
        line = (f"{self.label} [{'#' * fill}{'.' * (self.width - fill)}] "
                f"{done:g}/{total:g}{' ' + note if note else ''}")
        if line == self._last:
            return
        self._last = line
        if self.tty:
            self.stream.write("\r\033[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self._last:
            self.stream.write("\n")
            self.stream.flush()


# ------------------------------------------------------------------ metrics summaries

def summarise(text: str) -> dict[str, dict[str, float]]:
    """Per operator: the number of tasks and the sums of the main series of a job's
    Prometheus exposition ``text``."""
    from prometheus_client.parser import text_string_to_metric_families

    per_op: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(_SUMMED, 0.0))
    tasks: dict[str, set[str]] = defaultdict(set)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            op = s.labels.get("operator")
            if op is None or "task" not in s.labels:
                continue
            tasks[op].add(s.labels["task"])
            if s.name in _SUMMED:
                per_op[op][s.name] += s.value
    return {op: {"tasks": float(len(tasks[op])), **per_op[op]} for op in sorted(tasks)}


def _table(summary: dict[str, dict[str, float]]) -> str:
    lines = [f"{'operator':<20}" + "".join(f"{c:>14}" for c, _ in _COLUMNS)]
    for op, m in summary.items():
        lines.append(f"{op:<20}" + "".join(
            f"{m[k]:>14,.1f}" if k.endswith("_seconds_total") else f"{int(m[k]):>14,}"
            for _, k in _COLUMNS))
    return "\n".join(lines)


def _scrape(url: str) -> str:
    return urllib.request.urlopen(url, timeout=10).read().decode()


def _metrics(args: argparse.Namespace) -> int:
    target = args.target
    if target.startswith(("http://", "https://")):
        url = target
    else:
        handle = _find(args)
        url = handle.metrics_url
        if not url:
            _err(f"job {handle.job_id} serves no metrics endpoint (JobConfig(metrics_port="
                 "None))")
            return 1
    try:
        text = _scrape(url)
    except OSError as exc:
        _err(f"cannot read {url}: {exc}; is the job still running?")
        return 1
    summary = summarise(text)
    if args.json:
        _print_json({"url": url, "operators": summary})
    else:
        print(_table(summary))
    return 0


# ------------------------------------------------------------------ jobs by name

def _find(args: argparse.Namespace) -> Any:
    """The handle of ``args.job`` (or ``args.target``); ``SystemExit`` after printing why not:
    2 for a name no running job has or a cluster that does not answer, 1 for a job that
    ended."""
    from engine.runtime.handle import attach

    try:
        return attach(getattr(args, "job", None) or args.target, args.address)
    except JobNotFound as exc:
        _err(str(exc))
        raise SystemExit(2) from None
    except JobNotRunningError as exc:
        _err(str(exc))
        raise SystemExit(1) from None
    except ReflowError as exc:  # the cluster could not be reached: the address is wrong
        _err(f"{type(exc).__name__}: {exc}")
        raise SystemExit(2) from None


def _ended(st: Any) -> bool:
    return not JobState(st.state).active


def _ended_line(st: Any, what: str = "") -> str:
    """One line saying that the job of status ``st`` ended (and what was not done)."""
    return (f"job {st.job} has ended ({st.state}{': ' + st.error if st.error else ''})"
            f"{'; ' + what if what else ''}")


def _running(handle: Any, what: str) -> Any:
    """``handle``'s status when its job still runs; ``SystemExit(1)`` after one line otherwise."""
    try:
        st = handle.status()
    except ReflowError as exc:
        _err(f"{type(exc).__name__}: {exc}")
        raise SystemExit(1) from None
    if _ended(st):
        _err(_ended_line(st, what))
        raise SystemExit(1)
    return st


def _lifetime(detached: bool | None) -> str:
    return "?" if detached is None else ("detached" if detached else "attached")


def _jobs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``reflow list``'s rows: the address files here and, when a cluster is connected or
    reachable, that cluster's JobMasters, each with the state its JobMaster reports.
    Without ``--address``/``RAY_ADDRESS`` the cluster of the newest address file is asked
    (one Ray connection per process: jobs on other clusters show state ``unknown``);
    files of jobs found ended there are removed."""
    from engine.runtime import local_ray, registry

    files = registry.recorded()
    address = args.address or local_ray.address_from_env()
    unreachable = ""  # the newest file's cluster, when it did not answer
    try:
        if address:
            registry.connect(address)
        elif files and registry.connected_address() is None:
            unreachable = files[0].ray_address
            registry.connect(files[0].ray_address, files[0].auth_mode)
            unreachable = ""
    except ReflowError as exc:
        if address:
            _err(f"{type(exc).__name__}: {exc}")
            raise SystemExit(1) from None
    where = registry.connected_address() or address or None
    ids = registry.cluster_jobs() if where is not None else []
    if where is not None:
        for gone in registry.ended(files, where, ids):
            registry.forget(gone)
    rows = []
    for j in registry.listing(files, where, ids):
        if j.on_cluster:
            state, detached, url = _ask(j)
        else:  # not on the cluster asked: no answer, or on another one
            state = "unreachable" if j.ray_address == unreachable else "unknown"
            detached, url = j.detached, ""
        rows.append({"job": j.job_id, "name": j.name, "state": state, "detached": detached,
                     "ray_address": j.ray_address, "driver": j.driver, "metrics_url": url})
    return rows


def _ask(job: Any) -> tuple[str, bool | None, str]:
    """``(state, detached, metrics URL)`` of the listed ``job`` from its JobMaster; the
    state says why when it does not answer."""
    from engine.runtime.handle import JobHandle
    from engine.runtime.registry import master_of

    master = master_of(job.job_id)
    if master is None:
        return "ended", job.detached, ""
    try:
        st = JobHandle(master, job.job_id, "").status()
    except ReflowError as exc:
        return f"no answer ({type(exc).__name__})", job.detached, ""
    return str(st.state), bool(st.detached), st.metrics_url


def _list(args: argparse.Namespace) -> int:
    from engine.runtime import registry

    jobs = _jobs(args)
    if args.json:
        _print_json(jobs)
        return 0
    if not jobs:
        print(f"no running jobs (recorded in {registry.jobs_dir()}; pass --address for a "
              "cluster's)")
        return 0
    rows = [["job", "name", "state", "lifetime", "ray address", "driver (host:pid)"]]
    rows += [[j["job"], j["name"], j["state"], _lifetime(j["detached"]), j["ray_address"],
              j["driver"] or "-"] for j in jobs]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _status(args: argparse.Namespace) -> int:
    if not args.job:
        return _list(args)
    handle = _find(args)
    try:
        st = handle.status()
        m = None if _ended(st) else handle.metrics()
    except ReflowError as exc:
        _err(f"{type(exc).__name__}: {exc}")
        return 1
    ops: dict[str, dict[str, Any]] = {}
    for t in m.tasks if m is not None else ():
        o = ops.setdefault(t.vertex, {"tasks": 0, "records_in": 0, "records_out": 0,
                                      "key_groups": 0, "state_bytes": 0})
        o["tasks"] += 1
        for k in ("records_in", "records_out", "key_groups", "state_bytes"):
            o[k] += getattr(t, k)
    rescales = [asdict(r) for r in m.rescales] if m is not None else []
    if args.json:
        _print_json({"job": st.job, "state": st.state, "error": st.error,
                     "detached": st.detached, "master_epoch": st.master_epoch,
                     "metrics_url": st.metrics_url, "standby": st.standby,
                     "unresponsive": [list(u) for u in st.unresponsive],
                     "operators": ops, "rescales": rescales})
        return 1 if m is None else 0
    if m is None:
        _err(_ended_line(st))
        return 1
    print(f"job {st.job}: {st.state} ({_lifetime(st.detached)})"
          + (f": {st.error}" if st.error else ""))
    if st.metrics_url:
        print(f"metrics: {st.metrics_url}")
    print(f"{'operator':<20}{'tasks':>7}{'records in':>14}{'records out':>14}"
          f"{'key groups':>12}{'state bytes':>14}")
    for name, o in ops.items():
        print(f"{name:<20}{o['tasks']:>7}{o['records_in']:>14,}{o['records_out']:>14,}"
              f"{o['key_groups']:>12}{o['state_bytes']:>14,}")
    for r in m.rescales:
        print(r.summary())
    for task, seconds in st.unresponsive:
        print(f"unresponsive: {task} for {seconds:.1f} s")
    return 0


def _savepoint(args: argparse.Namespace) -> int:
    handle = _find(args)
    _running(handle, "no savepoint taken")
    try:
        path = handle.savepoint(args.location)
    except ReflowError as exc:
        _err(f"{type(exc).__name__}: {exc}")
        return 1
    if args.json:
        _print_json({"job": handle.job_id, "savepoint": path})
    else:
        print(f"savepoint of job {handle.job_id} at {path}")
    return 0


def _stop(args: argparse.Namespace) -> int:
    handle = _find(args)
    try:
        st = handle.status()
    except ReflowError:
        st = None  # a JobMaster that does not answer is stopped (killed) all the same
    if st is not None and _ended(st):
        with contextlib.suppress(ReflowError):
            handle.stop()  # release what it still holds
        _err(_ended_line(st, "no savepoint taken; its actors are released" if args.savepoint
                         else "its actors are released"))
        return 1
    try:
        path = handle.stop(savepoint=args.savepoint)
    except ReflowError as exc:
        _err(f"{type(exc).__name__}: {exc}")
        return 1
    if args.json:
        _print_json({"job": handle.job_id, "stopped": True, "savepoint": path})
    else:
        print(f"stopped job {handle.job_id}" + (f"; savepoint at {path}" if path else ""))
    return 0


def _rescale(args: argparse.Namespace) -> int:
    handle = _find(args)
    _running(handle, "not rescaled")
    outcome: dict[str, Any] = {}

    def request() -> None:
        try:
            outcome["report"] = handle.rescale(args.operator, args.parallelism,
                                               protocol=args.protocol)
        except ReflowError as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=request, daemon=True)
    worker.start()
    bar = ProgressBar(f"rescale {args.operator} -> {args.parallelism}")
    before = _rescales_done(handle, args.operator)
    while worker.is_alive():
        _draw_progress(bar, handle, args.operator, before)
        worker.join(POLL_S)
    bar.close()
    if "error" in outcome:
        exc = outcome["error"]
        if args.json:
            _print_json({"error": type(exc).__name__, "message": str(exc)})
        else:
            _err(f"{type(exc).__name__}: {exc}")
        return 1
    report = outcome["report"]
    if args.json:
        _print_json({**asdict(report), "summary": report.summary()})
    else:
        print(report.summary())
    return 0


def _rescales_done(handle: Any, operator: str) -> Any:
    """The progress record of ``operator``'s last rescale before this one (None if none)."""
    try:
        return next((r for r in handle.metrics().rescales if r.operator == operator), None)
    except ReflowError:
        return None


def _draw_progress(bar: ProgressBar, handle: Any, operator: str, before: Any) -> None:
    try:
        m = handle.metrics()
    except ReflowError:
        return  # a slow poll: the next one redraws
    r = next((r for r in m.rescales if r.operator == operator), None)
    if r is None or r == before:
        bar.update(0, 1, "requested")
        return
    note = f"key groups, {r.phase}"
    if r.subscales_total:
        done = f"{r.subscales_done}/{r.subscales_total}"
        note = (f"key groups, subscales {done}" if r.phase == "subscales"
                else f"{note}, subscales {done}")
    moved, total = r.groups()
    bar.update(moved, max(total, 1), note)


# ------------------------------------------------------------------ run

def _run(args: argparse.Namespace) -> int:
    from engine.runtime import local_ray

    if not os.path.isfile(args.file):
        _err(f"no script {args.file!r}")
        return 2
    if args.address is None:
        env = dict(os.environ)
        if args.detached:
            env[DETACHED_ENV] = "1"
            if local_ray.address_from_env() is None:
                _err("--detached without RAY_ADDRESS: unless a cluster started with `ray "
                     "start` runs on this machine, the script starts its own Ray, which ends "
                     "with it (and the job with it); set RAY_ADDRESS or pass --address")
        return subprocess.run([sys.executable, args.file, *args.args], env=env).returncode
    return _submit(args)


def _submit(args: argparse.Namespace) -> int:
    """Submit ``python FILE ARGS`` with ``--working-dir`` through Ray's job submission
    (what ``ray job submit --working-dir DIR -- python FILE ARGS`` does), follow its logs
    and return 0 when it SUCCEEDED."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    workdir = os.path.abspath(args.working_dir)
    script = os.path.relpath(os.path.abspath(args.file), workdir)
    if script.startswith(".."):
        _err(f"{args.file} is not under the working directory {workdir}; pass --working-dir")
        return 2
    entrypoint = shlex.join(["python", script, *args.args])
    client = JobSubmissionClient(args.address)
    runtime_env: dict[str, Any] = {"working_dir": workdir}
    if args.detached:
        runtime_env["env_vars"] = {DETACHED_ENV: "1"}
    sid = client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env)
    if not args.json:
        print(f"submitted {sid}: {entrypoint}", file=sys.stderr)
    if args.no_wait:
        if args.json:
            _print_json({"submission_id": sid, "status": str(client.get_job_status(sid))})
        return 0
    if not args.json:
        import asyncio

        async def follow() -> None:
            async for lines in client.tail_job_logs(sid):
                sys.stdout.write(lines)
                sys.stdout.flush()

        asyncio.run(follow())
    status = client.get_job_status(sid)
    while status not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
        time.sleep(POLL_S)
        status = client.get_job_status(sid)
    if args.json:
        _print_json({"submission_id": sid, "status": str(status),
                     "logs": client.get_job_logs(sid)})
    else:
        print(f"{sid}: {status}", file=sys.stderr)
    return 0 if status == JobStatus.SUCCEEDED else 1


# ------------------------------------------------------------------ plot

def _plot(args: argparse.Namespace) -> int:
    if args.prometheus:
        from engine.observability.dashboards import dashboard
        from engine.observability.promplot import PrometheusError, render

        try:
            d = dashboard(args.dashboard)
        except KeyError as exc:
            _err(str(exc.args[0]))
            return 2
        out = args.out or f"{d.uid}.png"
        try:
            drawn = render(args.prometheus, d, out, minutes=args.minutes, job=args.job or ".*")
        except PrometheusError as exc:
            _err(str(exc))
            return 1
        if args.json:
            _print_json({"png": out, "series": drawn})
        else:
            empty = [t for t, n in drawn.items() if n == 0]
            print(f"wrote {out}: {len(drawn)} panels"
                  + (f"; no data for: {', '.join(empty)}" if empty else ""))
        return 0
    if not args.results:
        _err("plot needs RESULTS.json, or --prometheus URL --dashboard NAME")
        return 2
    return _replot(args.results, args.out)


def _replot(results_path: str, out: str | None) -> int:
    """Call ``plot(results, png)`` of the benchmark script that wrote ``results_path``
    (named by its ``command``), from the checkout in the current directory."""
    try:
        with open(results_path) as f:
            results = json.load(f)
    except (OSError, ValueError) as exc:
        _err(f"cannot read {results_path}: {exc}")
        return 2
    cmd = shlex.split(str(results.get("command", "")))
    script = next((c for c in cmd if c.endswith(".py")), None)
    if script is None:
        _err(f"{results_path} does not say which benchmark wrote it (no 'command')")
        return 2
    cwd = os.getcwd()
    if not os.path.isfile(os.path.join(cwd, script)):
        _err(f"no {script} under {cwd}: plotting a benchmark's results runs that benchmark's "
             "plot(); run `reflow plot` from the root of a reflow checkout")
        return 2
    out = out or os.path.splitext(results_path)[0] + ".png"
    code = ("import json, runpy, sys\n"
            "g = runpy.run_path(sys.argv[1], run_name='reflow_plot')\n"
            "g['plot'](json.load(open(sys.argv[2])), sys.argv[3])\n")
    rc = subprocess.run([sys.executable, "-c", code, script, os.path.abspath(results_path),
                         os.path.abspath(out)], cwd=cwd).returncode
    if rc == 0:
        print(f"wrote {out}")
    return rc


# ------------------------------------------------------------------ checkout scripts

def _checkout_script(kind: str, folder: str, name: str, rest: list[str],
                     cwd: str | None = None) -> int:
    """``FOLDER/NAME.py`` under ``cwd`` (default: the current directory) run with this
    interpreter; its exit code, or 2 when there is no such script (the message says what
    to do)."""
    cwd = os.path.abspath(cwd or os.getcwd())
    where = os.path.join(cwd, folder)
    name = name.removesuffix(".py")
    path = os.path.normpath(os.path.join(where, *name.split("/")) + ".py")
    if not os.path.isdir(where):
        print(f"reflow {kind}: no {folder}/ under {cwd}: the {kind} scripts are not "
              f"installed with the package; run `reflow {kind} {name}` from the root of a "
              f"reflow checkout (git clone, then cd into it)", file=sys.stderr)
        return 2
    parts = name.split("/")
    inside = (os.path.commonpath([where, path]) == where and ".." not in parts
              and not os.path.isabs(name) and "" not in parts)
    if not inside or not os.path.isfile(path):
        found = sorted(os.path.relpath(os.path.join(d, f), where)[:-3].replace(os.sep, "/")
                       for d, _, files in os.walk(where) for f in files
                       if f.endswith(".py") and not f.startswith("_")
                       and os.path.relpath(d, where).count(os.sep) < 1
                       and "harness" not in os.path.relpath(d, where))
        print(f"reflow {kind}: no {folder}/{name}.py under {cwd}; available: "
              f"{', '.join(found) or 'none'}", file=sys.stderr)
        return 2
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (cwd, os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, path, *rest], cwd=cwd, env=env).returncode


def _bench(name: str, rest: list[str], cwd: str | None = None) -> int:
    """``reflow bench NAME [args]``: ``examples/bench/NAME.py`` of the checkout in ``cwd``;
    ``reflow bench papers``: the papers' scripts listed, ``reflow bench papers PAPER
    [args]``: ``examples/papers/PAPER.py`` run."""
    if name == "papers":
        if rest and not rest[0].startswith("-"):
            return _checkout_script("bench papers", PAPERS_DIR, rest[0], rest[1:], cwd)
        return _list_papers(cwd)
    return _checkout_script("bench", BENCH_DIR, name, rest, cwd)


def _list_papers(cwd: str | None = None) -> int:
    """Print each ``examples/papers/*.py`` of the checkout with its docstring's first line
    (read, not imported); 2 without the folder."""
    import ast

    cwd = os.path.abspath(cwd or os.getcwd())
    where = os.path.join(cwd, PAPERS_DIR)
    if not os.path.isdir(where):
        print(f"reflow bench papers: no {PAPERS_DIR}/ under {cwd}: run it from the root of a "
              "reflow checkout", file=sys.stderr)
        return 2
    names = sorted(f[:-3] for f in os.listdir(where) if f.endswith(".py")
                   and not f.startswith("_"))
    width = max((len(n) for n in names), default=0)
    for n in names:
        try:
            with open(os.path.join(where, n + ".py")) as f:
                doc = ast.get_docstring(ast.parse(f.read())) or ""
        except (OSError, SyntaxError, ValueError):
            doc = ""
        print(f"{n:<{width}}  {doc.splitlines()[0] if doc else ''}".rstrip())
    print(f"run one: reflow bench papers NAME [--quick] [--out DIR]; what each reproduces: "
          f"{PAPERS_DIR}/README.md")
    return 0


# ------------------------------------------------------------------ parser

class _CommandsFormatter(argparse.HelpFormatter):
    """Keeps each command's help on its line: argparse measures the commands two columns
    less indented than it prints them, so the longest one ("savepoint") wrapped."""

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        if isinstance(action, argparse._SubParsersAction):
            self._action_max_length += 2


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="reflow", description="reflow: live-rescaling streams on Ray. `reflow COMMAND "
        "--help` describes each command.",
        formatter_class=_CommandsFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def job_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--address", default=None,
                       help="Ray cluster to look for the job on (GCS host:port or "
                            "ray://host:10001; default RAY_ADDRESS, else the job's address "
                            "file written by its driver)")
        p.add_argument("--json", action="store_true", help="print JSON")

    r = sub.add_parser("run", help="run a job script here, or submit it to a Ray cluster")
    r.add_argument("--address", default=None,
                   help="Ray dashboard URL (http://head:8265) to submit to; without it the "
                        "script runs here with this interpreter")
    r.add_argument("--working-dir", default=".",
                   help="directory shipped with the submission (default: the current one)")
    r.add_argument("--no-wait", action="store_true", help="return once submitted")
    r.add_argument("--detached", action="store_true",
                   help=f"start the script's job detached ({DETACHED_ENV}=1): it outlives "
                        "the script, on a Ray cluster that does (ray start, --address)")
    r.add_argument("--json", action="store_true", help="print JSON (with --address)")
    r.add_argument("file", help="the job's Python script")
    r.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")

    ls = sub.add_parser("list", help="the jobs: id, name, state, detached or attached, where")
    job_args(ls)

    s = sub.add_parser("status", help="a running job's state and operators (no JOB: list jobs)")
    s.add_argument("job", nargs="?", help="job name or id")
    job_args(s)

    sp = sub.add_parser("savepoint", help="take a savepoint of a running job")
    sp.add_argument("job", help="job name or id")
    sp.add_argument("location", help="directory or URI to write the savepoint to")
    job_args(sp)

    st = sub.add_parser("stop", help="stop a job (sinks flushed), optionally with a savepoint")
    st.add_argument("job", help="job name or id")
    st.add_argument("--savepoint", default=None, metavar="URI",
                    help="take a savepoint there first (the sources stop at its barrier)")
    job_args(st)

    rs = sub.add_parser("rescale", help="change an operator's parallelism while the job runs")
    rs.add_argument("job", help="job name or id")
    rs.add_argument("operator", help="the operator's name (as `reflow status JOB` lists it)")
    rs.add_argument("parallelism", type=int, help="its number of tasks after the rescale")
    rs.add_argument("--protocol", default="drrs",
                    help="drrs (default), meces, pause-resume, fluid, batched, non-disruptive, "
                         "stop-restart")
    job_args(rs)

    m = sub.add_parser("metrics", help="per-operator summary of a job's metrics endpoint")
    m.add_argument("target", help="the metrics URL, or a job name or id")
    job_args(m)

    p = sub.add_parser("plot", help="draw a benchmark's results.json, or a dashboard's "
                                    "queries from Prometheus, to a PNG")
    p.add_argument("results", nargs="?", help="a benchmark's results.json")
    p.add_argument("--prometheus", help="Prometheus base URL, e.g. http://127.0.0.1:9090")
    p.add_argument("--dashboard", default="overview", help="overview (default) or rescaling")
    p.add_argument("--job", default=None, help="job id regex (default: every job)")
    p.add_argument("--minutes", type=float, default=15.0, help="time range (default 15)")
    p.add_argument("--out", default=None, help="PNG to write")
    p.add_argument("--json", action="store_true", help="print JSON")

    for kind, folder in (("bench", BENCH_DIR), ("example", EXAMPLES_DIR)):
        e = sub.add_parser(kind, help=f"run {folder}/NAME.py of the checkout in the current "
                                      "directory")
        e.add_argument("name", help=f"the script under {folder}/, without .py (a subfolder "
                                    "with '/', e.g. nexmark/run)")
        e.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    return ap


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": _run, "list": _list, "status": _status, "rescale": _rescale, "metrics": _metrics,
    "savepoint": _savepoint, "stop": _stop, "plot": _plot,
    "bench": lambda a: _bench(a.name, a.args),
    "example": lambda a: _checkout_script("example", EXAMPLES_DIR, a.name, a.args),
}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return COMMANDS[args.cmd](args)
    except SystemExit as done:  # a command ended early, its one-line reason printed
        return int(done.code or 0)


if __name__ == "__main__":
    sys.exit(main())
