"""System programs some tests need (not Python packages): found on PATH, or the test is
skipped with how to install them; under CI (``CI`` set, as ``.ci/run`` runs) a missing one
fails the test instead, since ``.ci/run`` installs them."""

from __future__ import annotations

import os
import shutil

import pytest


def require(program: str, package: str) -> str:
    """The path of ``program``; skips (fails under CI) naming the Debian ``package``."""
    found = shutil.which(program)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{program} is missing; .ci/run installs Debian's {package} package")
        pytest.skip(f"needs {program} (apt-get install {package}; .ci/run installs it)")
    return found
