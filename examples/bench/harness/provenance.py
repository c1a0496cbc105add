"""What code a benchmark measured, for its ``results.json`` (driver side; no Ray).

``code_state(root)``: the commit, and whether ``engine/`` or ``migration/`` differ from it;
with ``files_hash`` also a hash of their ``.py`` files (others may edit them while a long
run goes on: compare the state at the start with the state at the end).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from typing import Any

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


def code_state(root: str, *, files_hash: bool = False) -> dict[str, Any]:
    state: dict[str, Any] = {
        "commit": _git(root, "rev-parse", "HEAD"),
        "engine_dirty": bool(_git(root, "status", "--porcelain", "--", *MEASURED)),
    }
    if files_hash:
        state["engine_sha256"] = _files_hash(root)
    return state
