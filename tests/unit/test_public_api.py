"""The public API is what the docs say it is: ``engine.__all__`` lists importable names, and
every ``from engine[.testing|.config] import X`` in the python code blocks of README.md and
docs/*.md resolves."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import engine

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("engine", "engine.io.testing", "engine.dataflow.config")
_BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)
_FROM = re.compile(r"^[ \t]*from[ \t]+([\w.]+)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]+)", re.M)


def _docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _imports_in(code: str) -> list[tuple[str, str]]:
    """``(module, name)`` of every ``from M import name`` in a code block; a block that does
    not parse as a whole (elisions, prompts) is read statement by statement."""
    try:
        statements = [ast.parse(code)]
    except SyntaxError:
        statements = []
        for m in _FROM.finditer(code):
            try:
                statements.append(ast.parse(m.group(0).strip()))
            except SyntaxError:
                raise AssertionError(f"cannot read this import: {m.group(0)!r}") from None
    out = []
    for tree in statements:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in CHECKED and not node.level:
                out += [(node.module, a.name) for a in node.names]
    return out


def documented_imports() -> list[tuple[str, str, str]]:
    """``(doc file, module, name)`` for every checked import in the docs' python blocks."""
    out = []
    for path in _docs():
        for block in _BLOCK.findall(path.read_text()):
            out += [(path.name, m, n) for m, n in _imports_in(block)]
    return out


def test_engine_all_lists_importable_names():
    assert isinstance(engine.__all__, list) and engine.__all__
    assert len(set(engine.__all__)) == len(engine.__all__), "duplicates in engine.__all__"
    missing = [n for n in engine.__all__ if not hasattr(engine, n)]
    assert not missing, f"engine.__all__ lists names engine does not define: {missing}"
    namespace: dict = {}
    exec("from engine import *", namespace)  # noqa: S102 - the star import users write
    assert set(engine.__all__) <= set(namespace)


def test_every_import_in_the_docs_resolves():
    found = documented_imports()
    assert any(path == "README.md" for path, _, _ in found), \
        "no engine import found in README.md: is this check still reading the code blocks?"
    broken = []
    for path, module, name in found:
        mod = importlib.import_module(module)
        if name == "*":
            continue
        if not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                broken.append(f"{path}: from {module} import {name}")
    assert not broken, "documented imports that do not resolve:\n" + "\n".join(broken)


def test_the_doc_reader_finds_imports_in_blocks_that_do_not_parse():
    code = "from engine import (StreamJob,\n    JobConfig)\n>>> job = ...\nfrom engine.io.testing import TestingSink\n"
    assert _imports_in(code) == [("engine", "StreamJob"), ("engine", "JobConfig"),
                                 ("engine.io.testing", "TestingSink")]
