"""The package layers, checked on the source with ``ast`` (nothing is imported).

Layers, lowest first; a module may import from its own layer and the layers below only:

1. engine core: every engine module not listed below (``engine.spark.*`` included, except
   the Spark connectors that talk to Ray actors, which belong to the runtime: a module that
   applies Ray, and one that imports such a module)
2. task core: ``engine.task.core``
3. migration: ``migration.*``
4. runtime: ``engine.runtime``, ``engine.runtime.*`` (the only place Ray is applied)
5. controllers: ``controllers.*``
6. entry points: ``engine`` (its ``__init__``), ``engine.api``, ``engine.cli``

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
    RUNTIME = 4
    CONTROLLERS = 5
    ENTRY = 6


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
    if name == "engine.task.core" or name.startswith("engine.task."):
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
    assert layers >= {Layer.CORE, Layer.TASK, Layer.MIGRATION, Layer.RUNTIME, Layer.ENTRY}, \
        layers
    assert sum(len(_imports(m, modules)) for m in modules.values()) > 50


def test_the_layer_rules_themselves():
    modules = _modules()
    assert layer_of("engine.dataflow.keygroups", modules) is Layer.CORE
    assert layer_of("engine.task.core", modules) is Layer.TASK
    assert layer_of("migration.coordinator", modules) is Layer.MIGRATION
    assert layer_of("engine.runtime.handle", modules) is Layer.RUNTIME
    assert layer_of("engine.api", modules) is Layer.ENTRY
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
