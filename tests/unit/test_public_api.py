"""The public API is what the docs say it is.

* Every public package (``PUBLIC_PACKAGES``) has an ``__all__`` of names it really
  provides, and a package whose names load lazily (``_EXPORTS`` plus ``__getattr__``)
  declares the same names under ``TYPE_CHECKING``, so type checkers, the docs' API
  reference and the layer test see what users get.
* ``import engine`` stays cheap (no Ray, Arrow, Prometheus, runtime or migration), a task
  actor's worker does not import the JobMaster, every public package imports alone in a
  fresh interpreter, and the module-level imports of engine/, migration/ and controllers/
  form no cycle (so any module imports alone, whatever was imported before it).
* Every ``from X import ...`` and ``import X`` in the python code blocks of README.md,
  docs/**/*.md and examples/**/*.md imports, and a name imported from one of reflow's
  packages is in that package's ``__all__`` (from a module: in its ``__all__`` when it has
  one). The docs are read when the test runs.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = ("engine", "migration", "controllers", "examples")
LISTED = ("engine", "controllers")  # their packages list their public names in __all__
PUBLIC_PACKAGES = ("engine", "engine.io", "engine.time", "engine.state", "engine.operators",
                   "engine.columnar", "engine.spark", "engine.checkpoints", "engine.dataflow",
                   "engine.wire", "engine.observability", "controllers")
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<ticks>`{3,}|~{3,})[ \t]*\{?\.?(?:python|py|pycon)\b"
                    r"[^\n]*\n(?P<body>.*?)^(?P=indent)(?P=ticks)[ \t]*$", re.S | re.M)
_IMPORT = re.compile(r"^[ \t]*(?:>>>[ \t]*|\.\.\.[ \t]*)?"
                     r"((?:from[ \t]+[\w.]+[ \t]+import[ \t]+(?:\([^)]*\)|[^\n#]+))"
                     r"|(?:import[ \t]+[^\n#]+))", re.M)


# ------------------------------------------------------------------ the packages


def _init_path(package: str) -> Path:
    return ROOT.joinpath(*package.split("."), "__init__.py")


@pytest.mark.parametrize("package", PUBLIC_PACKAGES)
def test_every_public_package_lists_the_names_it_provides(package):
    mod = importlib.import_module(package)
    names = getattr(mod, "__all__", None)
    assert isinstance(names, list) and names, f"{package} has no __all__"
    assert len(set(names)) == len(names), f"duplicates in {package}.__all__"
    missing = [n for n in names if not hasattr(mod, n)]
    assert not missing, f"{package}.__all__ lists names it does not provide: {missing}"
    namespace: dict = {}
    exec(f"from {package} import *", namespace)  # noqa: S102 - the star import users write
    assert set(names) <= set(namespace)


# errors that never reach a user as themselves: caught inside reflow and turned into one
# that does (a failed task, a refused rescale); engine.errors has them all
INTERNAL_ERRORS = frozenset({"ConnectionClosed", "ConnectionLost", "DataChannelError",
                             "DownstreamDied", "FrameRefused", "FrameTooLarge", "JobRestarted",
                             "KeyFunctionError",
                             "StaleReplicaError", "TaskControlError", "UnknownKeyGroupError",
                             "UnknownSubscaleError"})


def test_engine_exports_every_error_a_user_can_meet():
    import engine
    import engine.errors

    user_facing = set(engine.errors.__all__) - INTERNAL_ERRORS
    exported = {n for n in engine.__all__ if n in engine.errors.__all__}
    assert exported == user_facing, (
        f"add to engine.__all__ (or to INTERNAL_ERRORS): {sorted(user_facing - exported)}; "
        f"not errors a user meets: {sorted(exported - user_facing)}")
    assert set(engine.errors.__all__) >= INTERNAL_ERRORS


def _exports_of(tree: ast.Module) -> dict[str, str] | None:
    for node in tree.body:
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and node.target.id == "_EXPORTS" and node.value is not None):
            return ast.literal_eval(node.value)
    return None


def _imported_names(body: list[ast.stmt]) -> dict[str, str]:
    return {a.asname or a.name: node.module for node in body
            if isinstance(node, ast.ImportFrom) and node.module for a in node.names
            if node.module != "__future__"}


@pytest.mark.parametrize("package", PUBLIC_PACKAGES)
def test_lazy_names_are_declared_for_type_checkers_and_all_is_complete(package):
    tree = ast.parse(_init_path(package).read_text())
    exports = _exports_of(tree) or {}
    checking: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            checking |= _imported_names(node.body)
    assert checking == exports, (
        f"{package}: the names under TYPE_CHECKING and _EXPORTS differ: "
        f"{sorted(set(checking.items()) ^ set(exports.items()))}")
    eager = {n for n in _imported_names(tree.body)
             if n not in ("TYPE_CHECKING", "Any", "lazy_exports")}
    public = set(importlib.import_module(package).__all__)
    assert public == eager | set(exports) | _lazy_by_hand(package), (
        f"{package}: __all__ and the names it imports differ: "
        f"{sorted(public ^ (eager | set(exports)))}")


def _lazy_by_hand(package: str) -> set[str]:
    """Names a package's own ``__getattr__`` loads outside ``_EXPORTS`` (pyspark's)."""
    return {"ReflowDataSource"} if package == "engine.spark" else set()


_PROBE = """
import importlib, sys
importlib.import_module({package!r})
heavy = ("ray", "pyarrow", "prometheus_client", "pyspark", "engine.runtime", "migration",
         "controllers", "engine.io.testing", "engine.operators.vectorised")
print(sorted(m for m in sys.modules if m in heavy or m.startswith(("engine.runtime.",
                                                                   "migration."))))
"""


def _probe(package: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", _PROBE.format(package=package)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_each_public_package_imports_alone_and_engine_stays_cheap():
    """Each in a fresh interpreter (two at a time): an import cycle shows only there."""
    packages = [*PUBLIC_PACKAGES, "engine.runtime.task_actor"]
    loaded: dict[str, list[str]] = {}
    failed = []
    for i in range(0, len(packages), 2):
        procs = {p: _probe(p) for p in packages[i:i + 2]}
        for p, proc in procs.items():
            out, err = proc.communicate(timeout=120)
            if proc.returncode:
                failed.append(f"{p}: {err.strip().splitlines()[-1:]}")
            else:
                loaded[p] = ast.literal_eval(out.strip().splitlines()[-1])
    assert not failed, "public packages that do not import alone:\n" + "\n".join(failed)
    assert loaded["engine"] == [], f"import engine loads {loaded['engine']}"
    actor = loaded["engine.runtime.task_actor"]
    assert "engine.runtime.job_master" not in actor and "engine.runtime.handle" not in actor, \
        "a task actor's worker imports the JobMaster"


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for pkg in ("engine", "migration", "controllers"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            yield ".".join(parts), ast.parse(path.read_text(), str(path))


def _module_level_imports(body: list[ast.stmt], known: set[str]) -> Iterator[str]:
    """The reflow modules a module imports when it is imported (not in functions, not
    under ``TYPE_CHECKING``)."""
    for node in body:
        if isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                yield from _module_level_imports(node.body, known)
            yield from _module_level_imports(node.orelse, known)
        elif isinstance(node, ast.Try):
            for part in (node.body, *(h.body for h in node.handlers), node.orelse,
                         node.finalbody):
                yield from _module_level_imports(part, known)
        elif isinstance(node, ast.Import):
            yield from (t for a in node.names if (t := _known(a.name, known)))
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                t = _known(f"{node.module}.{a.name}", known) or _known(node.module, known)
                if t:
                    yield t


def _known(name: str, known: set[str]) -> str | None:
    parts = name.split(".")
    return next((c for n in range(len(parts), 0, -1) if (c := ".".join(parts[:n])) in known),
                None)


def test_module_level_imports_form_no_cycle():
    """A cycle of module-level imports breaks the import of whichever of its modules comes
    first; without one every module imports alone (checked once for all 120 modules in
    fresh interpreters when this test was written; that takes a minute)."""
    trees = dict(_modules())
    known = set(trees)
    graph = {m: set(_module_level_imports(t.body, known)) - {m} for m, t in trees.items()}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append([*stack[stack.index(n):], n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "module-level import cycles:\n" + "\n".join(" -> ".join(c)
                                                                   for c in cycles)


# ------------------------------------------------------------------ the docs


def _doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
            *sorted((ROOT / "examples").rglob("*.md"))]


def _blocks(text: str) -> Iterator[str]:
    for m in _FENCE.finditer(text):
        lines = m.group("body").splitlines()
        indent = len(m.group("indent"))
        yield "\n".join(line[indent:] if line[:indent].isspace() else line.lstrip()
                        for line in lines) + "\n"


def _imports_in(code: str) -> list[tuple[str, str | None]]:
    """``(module, name)`` of every ``from M import name`` and ``(M, None)`` of every
    ``import M`` in a code block; a block that does not parse as a whole (elisions,
    prompts) is read statement by statement."""
    try:
        statements = [ast.parse(textwrap.dedent(code))]
    except SyntaxError:
        statements = []
        for m in _IMPORT.finditer(code):
            try:
                statements.append(ast.parse(m.group(1).strip()))
            except SyntaxError:
                raise AssertionError(f"cannot read this import: {m.group(0)!r}") from None
    out: list[tuple[str, str | None]] = []
    for tree in statements:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                out += [(node.module, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                out += [(a.name, None) for a in node.names]
    return out


def documented_imports() -> list[tuple[str, str, str | None]]:
    """``(doc file, module, name)`` for every import in the docs' python blocks."""
    out = []
    for path in _doc_files():
        rel = str(path.relative_to(ROOT))
        for block in _blocks(path.read_text()):
            out += [(rel, module, name) for module, name in _imports_in(block)]
    return out


def _problem(module: str, name: str | None) -> str | None:
    """What is wrong with ``from module import name`` (``import module`` for None)."""
    if module.split(".")[0] not in OURS:
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:
            found = False
        return None if found else "not installed"
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        return f"does not import ({exc})"
    if name is None or name == "*":
        return None
    if hasattr(mod, "__path__") and importlib.util.find_spec(f"{module}.{name}") is not None:
        return None  # a submodule: from examples.nexmark import reference
    if not hasattr(mod, name):
        return "no such name"
    public = getattr(mod, "__all__", None)
    if public is None and hasattr(mod, "__path__") and module.split(".")[0] in LISTED:
        return f"package {module} has no __all__"
    if public is not None and name not in public:
        return f"not in {module}.__all__"
    return None


def _statement(module: str, name: str | None) -> str:
    return f"import {module}" if name is None else f"from {module} import {name}"


def test_every_import_in_the_docs_resolves_to_a_public_name():
    found = documented_imports()
    assert any(path == "README.md" and module == "engine" for path, module, _ in found), \
        "no engine import found in README.md: is this check still reading the code blocks?"
    broken = sorted({f"{path}: {_statement(module, name)}: {problem}"
                     for path, module, name in found if (problem := _problem(module, name))})
    assert not broken, "documented imports that do not work:\n" + "\n".join(broken)


def test_the_doc_reader_finds_imports_in_blocks_that_do_not_parse():
    code = ("from engine import (StreamJob,\n    JobConfig)\n>>> job = ...\n"
            "from engine.io import TestingSink\nimport pyarrow.compute as pc\n")
    assert _imports_in(code) == [("engine", "StreamJob"), ("engine", "JobConfig"),
                                 ("engine.io", "TestingSink"), ("pyarrow.compute", None)]


def test_the_doc_reader_finds_blocks_in_tabs_and_admonitions():
    text = ("# x\n\n```python\nfrom engine import StreamJob\n```\n\n"
            "=== \"Tab\"\n\n    ```py title=\"job.py\"\n    from engine import JobConfig\n"
            "    ```\n\n```bash\nfrom nothing import here\n```\n")
    assert [_imports_in(b) for b in _blocks(text)] == [[("engine", "StreamJob")],
                                                       [("engine", "JobConfig")]]
