"""The docs site builds: ``mkdocs build --strict`` (every page in the nav, every link and
every ``:::`` API reference resolved from the docstrings) into a temporary folder.

It runs MkDocs as a user would (a subprocess, the repository's ``mkdocs.yml``), so a broken
link, a page left out of the nav or a docstring mkdocstrings cannot render fails CI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_site_builds_strictly(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    assert (site / "index.html").is_file()
    assert (site / "api").is_dir(), "the API reference was not generated"
