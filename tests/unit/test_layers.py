"""The package layers and the subpackages' import rules, checked on the source with ``ast``
(nothing is imported).

Layers, lowest first; a module may import from its own layer and the layers below only:

1. engine core: the subpackages of ``engine`` named in ``CORE_RULES`` (``engine.spark``
   included, except the Spark connectors that talk to Ray actors, which belong to the
   runtime: a module that applies Ray, and one that imports such a module)
2. task core: ``engine.task``
3. migration: ``migration.*``
4. control plane values: ``engine.control`` (what controllers decide, the job's state)
5. runtime: ``engine.runtime``, ``engine.runtime.*`` (the only place Ray is applied)
6. controllers: ``controllers.*``
7. entry points: ``engine`` (its ``__init__``), ``engine.api``, ``engine.cli``

Inside the engine core, each subpackage imports only the subpackages its rule in
``CORE_RULES`` names (each ``__init__`` docstring says the same under "May import:"), and
the subpackages form no cycle. ``engine.runtime``'s modules form no import cycle.

Every import counts: module-level, inside functions, and under ``TYPE_CHECKING``. The test
prints every violation, not only the first.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "migration", "controllers")
ENTRY_POINTS = frozenset({"engine", "engine.api", "engine.cli"})


class Layer(IntEnum):
    CORE = 1
    TASK = 2
    MIGRATION = 3
    CONTROL = 4
    RUNTIME = 5
    CONTROLLERS = 6
    ENTRY = 7


_E, _N, _W, _T = "engine.errors", "engine.names", "engine.wire", "engine.time"
_D, _S, _O, _C = "engine.dataflow", "engine.state", "engine.observability", "engine.columnar"
_IO, _OPS, _CK = "engine.io", "engine.operators", "engine.checkpoints"

# unit of the engine core -> the units it may import (besides itself)
CORE_RULES: dict[str, frozenset[str]] = {
    _N: frozenset(),
    _E: frozenset({_N}),
    _T: frozenset({_E, _N}),
    _W: frozenset({_E, _N}),
    _D: frozenset({_E, _N, _W}),
    _S: frozenset({_E, _N, _W}),
    _O: frozenset({_E, _N, _W}),
    _C: frozenset({_E, _N, _W, _D}),
    _IO: frozenset({_E, _N, _W, _T, _D, _O, _C}),
    _OPS: frozenset({_E, _N, _W, _T, _D, _S, _O, _C, _IO}),
    _CK: frozenset({_E, _N, _W, _T, _D, _S, _OPS}),
    "engine.spark": frozenset({_E, _N, _W, _T, _C, _IO}),
}
# the top level of engine/: subpackages, and these modules only
TOP_LEVEL_MODULES = frozenset({"__init__", "api", "cli", "errors", "names"})


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    tree: ast.Module
    is_package: bool

    @property
    def package(self) -> str:
        return self.name if self.is_package else self.name.rpartition(".")[0]


@dataclass(frozen=True)
class Import:
    target: str      # the reflow module imported
    line: int
    statement: str


def _modules() -> dict[str, Module]:
    out: dict[str, Module] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            name = ".".join(parts)
            out[name] = Module(name, path, ast.parse(path.read_text(), str(path)), is_package)
    return out


def _ours(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def _known_prefix(name: str, modules: dict[str, Module]) -> str:
    """The longest prefix of a dotted name that is one of our modules."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return name


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (reported as such, still counted)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                out.update(id(n) for n in ast.walk(stmt))
    return out


def _imports(mod: Module, modules: dict[str, Module]) -> list[Import]:
    """Every import of one of our modules anywhere in ``mod``."""
    out: list[Import] = []
    typing_only = _type_checking_nodes(mod.tree)
    for node in ast.walk(mod.tree):
        where = " (under TYPE_CHECKING)" if id(node) in typing_only else ""
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _ours(alias.name):
                    out.append(Import(_known_prefix(alias.name, modules), node.lineno,
                                      f"import {alias.name}{where}"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.package.split(".")
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not _ours(source):
                continue
            by_target: dict[str, list[str]] = {}
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                target = sub if sub in modules else _known_prefix(source, modules)
                by_target.setdefault(target, []).append(alias.name)
            for target, names in by_target.items():
                out.append(Import(target, node.lineno,
                                  f"from {source} import {', '.join(names)}{where}"))
    return out


def _applies_ray(mod: Module) -> bool:
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Import) and any(
                a.name == "ray" or a.name.startswith("ray.") for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and not node.level and node.module and (
                node.module == "ray" or node.module.startswith("ray.")):
            return True
    return False


def layer_of(name: str, modules: dict[str, Module]) -> Layer:
    if name in ENTRY_POINTS:
        return Layer.ENTRY
    if name == "engine.runtime" or name.startswith("engine.runtime."):
        return Layer.RUNTIME
    if name.startswith("controllers"):
        return Layer.CONTROLLERS
    if name.startswith("migration"):
        return Layer.MIGRATION
    if name == "engine.control" or name.startswith("engine.control."):
        return Layer.CONTROL
    if name == "engine.task" or name.startswith("engine.task."):
        return Layer.TASK
    if name in _spark_runtime(modules):
        return Layer.RUNTIME
    return Layer.CORE


def _spark_runtime(modules: dict[str, Module]) -> set[str]:
    """Spark modules that apply Ray, and those that import one of them (to a fixpoint)."""
    spark = {n: m for n, m in modules.items() if n == "engine.spark" or n.startswith("engine.spark.")}
    found = {n for n, m in spark.items() if _applies_ray(m)}
    grew = True
    while grew:
        grew = False
        for n, m in spark.items():
            if n not in found and any(i.target in found for i in _imports(m, modules)):
                found.add(n)
                grew = True
    return found


def violations() -> list[str]:
    modules = _modules()
    out = []
    for name, mod in sorted(modules.items()):
        mine = layer_of(name, modules)
        for imp in _imports(mod, modules):
            theirs = layer_of(imp.target, modules)
            if theirs > mine:
                rel = mod.path.relative_to(ROOT)
                out.append(f"{rel}:{imp.line}: {name} ({mine.name.lower()}) -> {imp.target} "
                           f"({theirs.name.lower()}): {imp.statement}")
    return out


def test_every_layer_has_modules_so_the_check_is_not_vacuous():
    modules = _modules()
    layers = {layer_of(n, modules) for n in modules}
    assert layers >= {Layer.CORE, Layer.TASK, Layer.MIGRATION, Layer.CONTROL, Layer.RUNTIME,
                      Layer.CONTROLLERS, Layer.ENTRY}, layers
    assert sum(len(_imports(m, modules)) for m in modules.values()) > 50


def test_the_layer_rules_themselves():
    modules = _modules()
    assert layer_of("engine.dataflow.keygroups", modules) is Layer.CORE
    assert layer_of("engine.task.core", modules) is Layer.TASK
    assert layer_of("migration.coordinator", modules) is Layer.MIGRATION
    assert layer_of("engine.runtime.handle", modules) is Layer.RUNTIME
    assert layer_of("engine.api", modules) is Layer.ENTRY
    assert layer_of("engine.control.reconfiguration", modules) is Layer.CONTROL
    assert layer_of("engine", modules) is Layer.ENTRY
    spark = [n for n in modules if n.startswith("engine.spark")]
    runtime = _spark_runtime(modules)
    assert {n for n in spark if _applies_ray(modules[n])} <= runtime
    assert layer_of("engine.spark.bridge", modules) is Layer.RUNTIME
    assert layer_of("engine.spark.schema", modules) is Layer.CORE
    assert all(layer_of(n, modules) is (Layer.RUNTIME if n in runtime else Layer.CORE)
               for n in spark)


def test_modules_import_only_from_their_layer_and_below():
    found = violations()
    for v in found:
        print(v)
    assert not found, f"{len(found)} layer violations:\n" + "\n".join(found)


def _applies_ray_remote(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "remote" and \
                isinstance(node.value, ast.Name) and node.value.id == "ray":
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "ray" and \
                any(a.name == "remote" for a in node.names):
            return True
    return False


def test_ray_remote_appears_only_under_engine_runtime():
    runtime = ROOT / "engine" / "runtime"
    outside, inside = [], []
    for name, mod in sorted(_modules().items()):
        text = mod.path.read_text()
        if "ray.remote" in text or _applies_ray_remote(mod.tree):
            (inside if runtime in mod.path.parents else outside).append(name)
    for name in outside:
        print(f"ray.remote outside engine/runtime: {name}")
    assert inside, "ray.remote not found under engine/runtime: is this check still looking?"
    assert not outside, outside


# ---------------------------------------------------------------- subpackages of the core


def unit_of(name: str, modules: dict[str, Module]) -> str:
    """The unit a module belongs to: ``engine.<subpackage>`` (or ``engine.<module>`` at the
    top level), ``migration`` or ``controllers``; a Spark connector that applies Ray counts
    as ``engine.runtime``."""
    parts = name.split(".")
    if parts[0] != "engine":
        return parts[0]
    if len(parts) == 1:
        return "engine"
    if parts[1] == "spark" and name in _spark_runtime(modules):
        return "engine.runtime"
    return f"engine.{parts[1]}"


def _unit_edges(modules: dict[str, Module]) -> dict[str, dict[str, list[str]]]:
    """unit -> imported unit -> the import statements that make the edge."""
    edges: dict[str, dict[str, list[str]]] = {}
    for name, mod in sorted(modules.items()):
        mine = unit_of(name, modules)
        for imp in _imports(mod, modules):
            theirs = unit_of(imp.target, modules)
            if theirs != mine:
                rel = mod.path.relative_to(ROOT)
                edges.setdefault(mine, {}).setdefault(theirs, []).append(
                    f"{rel}:{imp.line}: {imp.statement}")
    return edges


def test_core_subpackages_import_only_what_their_rule_allows():
    modules = _modules()
    core = {unit_of(n, modules) for n in modules if layer_of(n, modules) is Layer.CORE}
    assert core == set(CORE_RULES), f"units without a rule or rules without a unit: " \
        f"{sorted(core ^ set(CORE_RULES))}"
    found = []
    for mine, targets in _unit_edges(modules).items():
        if mine not in CORE_RULES:
            continue
        for theirs, where in targets.items():
            if theirs not in CORE_RULES[mine]:
                found += [f"{w}  ({mine} -> {theirs})" for w in where]
    for v in found:
        print(v)
    assert not found, f"{len(found)} imports outside their subpackage's rule:\n" + \
        "\n".join(found)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path (first node repeated at the end), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_cycle_finder_finds_a_cycle_and_accepts_a_dag():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_subpackages_form_no_cycle():
    modules = _modules()
    edges = _unit_edges(modules)
    cycle = _cycle({u: set(t) for u, t in edges.items()})
    assert cycle is None, "subpackages import each other in a cycle: " + " -> ".join(cycle) + \
        "\n" + "\n".join(w for a, b in zip(cycle, cycle[1:], strict=False) for w in edges[a][b])


def test_engine_runtime_modules_form_no_import_cycle():
    modules = _modules()
    runtime = {n for n in modules if n.startswith("engine.runtime.")}
    graph = {n: {i.target for i in _imports(modules[n], modules) if i.target in runtime}
             for n in runtime}
    cycle = _cycle(graph)
    assert cycle is None, "engine.runtime imports itself in a cycle (TYPE_CHECKING imports " \
        "count): " + " -> ".join(cycle)


def test_each_subpackage_init_states_what_lives_there_and_what_it_may_import():
    found = []
    for sub, allowed in CORE_RULES.items():
        path = ROOT / sub.replace(".", "/") / "__init__.py"
        if not path.exists():
            continue  # a top-level module (engine.errors, engine.names)
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        rule = doc.partition("May import:")[2]
        if not rule:
            found.append(f"{path.relative_to(ROOT)}: no 'May import:' in its docstring")
        missing = [a for a in allowed if f"``{a}``" not in rule]
        if missing:
            found.append(f"{path.relative_to(ROOT)}: 'May import:' does not name {missing}")
    assert not found, "\n".join(found)


def test_engine_top_level_holds_subpackages_and_a_handful_of_modules():
    top = {p.stem for p in (ROOT / "engine").glob("*.py")}
    assert top <= TOP_LEVEL_MODULES, f"modules at engine/'s top level: {sorted(top - TOP_LEVEL_MODULES)}"
    subpackages = {p.parent.name for p in (ROOT / "engine").glob("*/__init__.py")}
    assert len(subpackages) >= 10, subpackages


# ---------------------------------------------------------------- sizes


def class_sizes(path: Path, name: str) -> tuple[int, int, int]:
    """``(lines, methods, attributes assigned on self)`` of class ``name`` in ``path``."""
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    methods = sum(isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) for m in cls.body)
    attrs = {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute)
             and isinstance(n.value, ast.Name) and n.value.id == "self"
             and isinstance(n.ctx, ast.Store)}
    assert cls.end_lineno is not None
    return cls.end_lineno - cls.lineno + 1, methods, len(attrs)


SIZED = (("engine/task/core.py", "TaskCore"), ("engine/runtime/job_master.py", "JobMaster"),
         ("engine/runtime/task_actor.py", "TaskActor"))


def test_task_core_stays_small():
    lines, _, _ = class_sizes(ROOT / "engine/task/core.py", "TaskCore")
    assert lines <= 450, f"TaskCore has {lines} lines; its parts belong in participants " \
        "(engine/task/*) behind hooks, as migration's does"


if __name__ == "__main__":  # python tests/unit/test_layers.py: the sizes, for a note
    for rel, cls in SIZED:
        print(f"{rel} {cls}: lines, methods, attributes = {class_sizes(ROOT / rel, cls)}")
