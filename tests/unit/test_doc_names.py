"""Every module path and code name the docs mention exists in the code (checked with ``ast``,
nothing is imported).

Why: ``docs/architecture.md`` is the map successors read first; it listed modules that had
moved and a mechanism that was gone (``engine/alignment.py`` twice, once with drain
barriers). This keeps it honest after every move:

- ``docs/architecture.md``: every path (``engine/task/core.py``), every dotted name
  (``engine.task.alignment.BarrierAligner``, resolved module by module, then the name, then
  a class member), every backticked ``CamelCase`` or ``CamelCase.member`` and every
  backticked ``snake_case`` identifier must exist in engine/, migration/, controllers/,
  examples/ or tests/ (a class, function, method, attribute, module-level name or module);
- README.md and the other pages of docs/: paths and dotted names.

Names of other systems (Ray, Kubernetes, Flink) are listed in ``EXTERNAL``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "migration", "controllers", "examples", "tests")
PATH_RE = re.compile(
    r"(?<![\w./-])((?:engine|migration|controllers|tests|examples|deploy)/[\w./*-]*)")
DOTTED_RE = re.compile(r"(?<![\w./])((?:engine|migration|controllers)(?:\.\w+)+)(?![\w.])")
TICK_RE = re.compile(r"`([^`\n]+)`")
CAMEL_RE = re.compile(r"^([A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*)(?:\.(\w+))?(?:\(.*\))?$")
SNAKE_RE = re.compile(r"^([a-z][a-z0-9]*_[a-z0-9_]*)$")
EXTERNAL = frozenset({"NodeAffinitySchedulingStrategy", "PodMonitor", "RayCluster", "RayJob",
                      "DataStreamWriter", "SubtaskCheckpointCoordinator", "DeliveryGuarantee",
                      "TimeoutError", "True", "False", "None"})


def _defined(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    if isinstance(node, ast.Import | ast.ImportFrom):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, ast.If | ast.Try):
        return set().union(*(_defined(c) for c in ast.iter_child_nodes(node)
                             if isinstance(c, ast.stmt)))
    return set()


def _members(cls: ast.ClassDef) -> set[str]:
    out = set().union(*(_defined(n) for n in cls.body))
    for node in ast.walk(cls):  # self.x = ... in methods
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "self" and isinstance(node.ctx, ast.Store)):
            out.add(node.attr)
    return out


class Index:
    def __init__(self) -> None:
        self.modules: dict[str, set[str]] = {}          # module -> its top-level names
        self.classes: dict[str, set[str]] = {}          # class name -> its members
        self.functions: set[str] = set()
        for pkg in PACKAGES:
            for path in (ROOT / pkg).rglob("*.py"):
                parts = list(path.relative_to(ROOT).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                tree = ast.parse(path.read_text())
                self.modules[".".join(parts)] = set().union(*(_defined(n) for n in tree.body))
                for node in ast.walk(tree):
                    if isinstance(node, ast.ClassDef):
                        self.classes.setdefault(node.name, set()).update(_members(node))
                    elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                        self.functions.add(node.name)
        self.top = set().union(*self.modules.values())
        self.members = set().union(*self.classes.values())
        self.module_basenames = {m.rpartition(".")[2] for m in self.modules}

    def dotted(self, name: str) -> str | None:
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            mod = ".".join(parts[:i])
            if mod not in self.modules:
                continue
            rest = parts[i:]
            if not rest:
                return None
            if rest[0] not in self.modules[mod]:
                return f"{rest[0]!r} is not defined in {mod}"
            if len(rest) >= 2 and rest[0] in self.classes and rest[1] not in self.classes[rest[0]]:
                return f"{rest[0]}.{rest[1]} does not exist"
            return None
        return "no such module"

    def code_name(self, text: str) -> str | None:
        m = CAMEL_RE.match(text)
        if m:
            cls, member = m.group(1), m.group(2)
            if cls in EXTERNAL:
                return None
            if cls not in self.classes:
                return None if cls in self.top and not member else f"no class {cls}"
            if member and member not in self.classes[cls]:
                return f"{cls}.{member} does not exist"
            return None
        m = SNAKE_RE.match(text)
        if m and not text.startswith("reflow_"):  # reflow_*: metric names
            name = m.group(1)
            if not ({name} & (self.functions | self.members | self.top | self.module_basenames)):
                return f"no name {name}"
        return None


def problems(doc: Path, index: Index, names: bool) -> list[str]:
    out = []
    for lineno, line in enumerate(doc.read_text().splitlines(), 1):
        where = f"{doc.relative_to(ROOT)}:{lineno}"
        for m in PATH_RE.finditer(line):
            path = m.group(1).rstrip(".,:;)")
            if "NAME" in path or "/out/" in path or path.endswith("/out"):
                continue  # a placeholder, or what a run writes (git-ignored)
            if "*" in path or "<" in path:
                if not (ROOT / path.split("*")[0].split("<")[0]).parent.is_dir():
                    out.append(f"{where}: no directory for {path}")
            elif not (ROOT / path).exists():
                out.append(f"{where}: no such path {path}")
        for m in DOTTED_RE.finditer(line):
            if m.group(1).endswith((".md", ".py", ".json", ".yml")):
                continue
            why = index.dotted(m.group(1))
            if why:
                out.append(f"{where}: {m.group(1)}: {why}")
        if names:
            for m in TICK_RE.finditer(line):
                why = index.code_name(m.group(1).strip())
                if why:
                    out.append(f"{where}: `{m.group(1)}`: {why}")
    return out


def test_architecture_names_exist():
    found = problems(ROOT / "docs" / "architecture.md", Index(), names=True)
    assert not found, "docs/architecture.md names what the code lacks:\n" + "\n".join(found)


def test_doc_paths_exist():
    index = Index()
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = [p for d in docs if d.name != "architecture.md"
             for p in problems(d, index, names=False)]
    assert not found, "the docs name paths or modules that do not exist:\n" + "\n".join(found)
