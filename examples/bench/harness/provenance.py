"""What a benchmark run measured, where and how: the provenance part of ``results.json``.

Why: results are compared across days on a shared machine whose code changes under long
runs (others edit ``engine/`` and ``migration/`` meanwhile); without the command, the code
state at both ends and the load average a figure cannot be trusted or reproduced.

Format (``begin`` then ``finish`` add these keys to a results dict):

* ``command``: ``python examples/bench/NAME.py ARGS`` as run;
* ``code``: ``{"commit", "engine_dirty", "engine_sha256"}`` at the start — the commit,
  whether ``engine/`` or ``migration/`` differ from it, and a hash of their ``.py`` files;
  ``code_at_end``: the same at the end (the hashes differ when the code changed mid-run);
* ``machine``: ``cpus``, ``python``, ``platform``, ``loadavg_at_start``, and at the end
  ``loadavg_at_end``; ``total_seconds``.

Driver side only; nothing here imports Ray.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import platform
import subprocess
import sys
import time
from typing import Any

from examples.bench.harness import ROOT

MEASURED = ("engine", "migration")


def _git(root: str, *args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _files_hash(root: str) -> str:
    h = hashlib.sha256()
    for d in MEASURED:
        for base, _, files in sorted(os.walk(os.path.join(root, d))):
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(base, name)
                    h.update(path.encode())
                    with open(path, "rb") as f:
                        h.update(f.read())
    return h.hexdigest()[:16]


def code_state(root: str = ROOT, *, files_hash: bool = True) -> dict[str, Any]:
    """The commit, whether the measured code differs from it and (``files_hash``) a hash of
    the measured ``.py`` files."""
    state: dict[str, Any] = {
        "commit": _git(root, "rev-parse", "HEAD"),
        "engine_dirty": bool(_git(root, "status", "--porcelain", "--", *MEASURED)),
    }
    if files_hash:
        state["engine_sha256"] = _files_hash(root)
    return state


def machine() -> dict[str, Any]:
    """CPUs, Python, platform and the load average now."""
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "loadavg_at_start": os.getloadavg()}


def command(script: str, argv: list[str] | None) -> str:
    """``python <script relative to the root> <args>``; ``argv`` None: this process's."""
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python", os.path.relpath(os.path.abspath(script), ROOT), *args])


def begin(script: str, argv: list[str] | None, args: Any = None,
          omit: tuple[str, ...] = ()) -> dict[str, Any]:
    """A new results dict with ``command``, ``code``, ``machine`` and the start time; with
    the parsed ``args`` also ``date`` (UTC, to the minute) and ``config`` (``args`` but
    ``omit``, its ``out`` relative to the repository)."""
    results: dict[str, Any] = {"command": command(script, argv), "code": code_state(),
                               "machine": machine(), "_t0": time.monotonic()}
    if args is not None:
        results["date"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        results["config"] = {k: v for k, v in vars(args).items() if k not in omit}
        results["config"]["out"] = os.path.relpath(args.out, ROOT)
    return results


def finish(results: dict[str, Any]) -> None:
    """Adds ``total_seconds``, ``code_at_end`` and ``machine.loadavg_at_end``; warns on
    stdout when the measured code changed during the run."""
    t0 = results.pop("_t0", None)
    if t0 is not None:
        results["total_seconds"] = time.monotonic() - t0
    results["code_at_end"] = code_state()
    if results["code_at_end"].get("engine_sha256") != results.get("code", {}).get(
            "engine_sha256"):
        print("WARNING: engine/ or migration/ changed during the run; figures mix versions")
    results["machine"]["loadavg_at_end"] = os.getloadavg()
