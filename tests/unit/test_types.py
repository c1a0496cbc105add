"""The code type-checks: mypy, with the project's configuration (``[tool.mypy]`` in
pyproject.toml, which says how strict and why), over ``engine``, ``migration`` and
``controllers`` reports no error.

Skipped only where mypy is not installed (it is in the ``test`` extra)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "migration", "controllers")


def test_mypy_passes_with_the_project_config() -> None:
    api = pytest.importorskip("mypy.api", reason="mypy is not installed (the test extra has it)")
    config = ROOT / "pyproject.toml"
    assert "[tool.mypy]" in config.read_text(), "pyproject.toml has no [tool.mypy] section"
    out, err, status = api.run([
        "--config-file", str(config),
        # mypy's own incremental cache (it ignores itself in git): a cold check takes ~15 s
        # of CPU, a re-check of a few changed modules about one
        "--cache-dir", str(ROOT / ".mypy_cache"),
        "--no-error-summary",
        *(str(ROOT / p) for p in PACKAGES),
    ])
    assert status == 0, f"mypy found errors:\n{out}{err}"
