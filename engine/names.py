"""``NameEnum``: the base of every ``str`` enum in reflow (protocols, job states, roles,
assignment strategies).

Why: protocol names, states and roles travel in msgpack messages and are typed by users
(``handle.rescale(op, 4, protocol="drrs")``), so each member must *be* its string: it
compares, hashes and encodes as its value, and ``str()``/f-strings give the value. A plain
``str``-mixin ``Enum`` hashes by member name, so ``"drrs" in {RescaleProtocol.DRRS: ...}``
would be false; this base hashes as the string.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, TypeVar

_E = TypeVar("_E", bound="NameEnum")


class NameEnum(str, Enum):
    """A string-valued enum whose members behave as their value (see the module doc)."""

    __hash__ = str.__hash__

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @classmethod
    def parse(cls: type[_E], value: object, what: str) -> _E:
        """The member named by ``value``; ``ValueError`` listing the choices otherwise."""
        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(m.value for m in cls)
            raise ValueError(f"unknown {what} {value!r}; choose one of: {choices}") from None


class JobState(NameEnum):
    """Where a job is in its life (``JobStatus.state``); ``restarting``: its tasks are being
    restarted from the last checkpoint after a failure (it runs again afterwards)."""

    CREATED = "created"
    RUNNING = "running"
    RESTARTING = "restarting"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def active(self) -> bool:
        return self in (JobState.CREATED, JobState.RUNNING, JobState.RESTARTING)


class SubscaleRole(NameEnum):
    """Which side of a subscale a task reports for (``SubscaleDone.role``)."""

    OLD = "old"
    NEW = "new"


class AssignmentStrategy(NameEnum):
    """How a rescale chooses its target assignment (``handle.rescale(assignment=...)``,
    ``Scale(assignment=...)``; the planners are in ``migration.assignment``)."""

    UNIFORM = "uniform"
    CONSISTENT_HASHING = "consistent-hashing"
    SSM = "ssm"
    MTM = "mtm"

    @property
    def needs_workload(self) -> bool:
        """Whether it reads per-group loads and sizes (asked from the tasks)."""
        return self in (AssignmentStrategy.SSM, AssignmentStrategy.MTM)


class StateBackend(NameEnum):
    """Where a keyed task keeps its state (``JobConfig.state_backend``): ``memory`` in
    per-key-group Python dicts (``engine.state.keyed``), ``rocksdb`` in one RocksDB
    instance per task on the node's local disk (``engine.state.rocksdb``)."""

    MEMORY = "memory"
    ROCKSDB = "rocksdb"


def lazy_exports(namespace: dict[str, Any], exports: Mapping[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's module-level ``__getattr__`` and ``__dir__`` (PEP 562) for its public
    names: ``exports`` maps each name to the module that defines it, imported on first use
    and then kept in ``namespace`` (the package's ``globals()``), so importing a package
    loads none of its modules and closes no import cycle. Unknown names raise
    ``AttributeError`` as for any module."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # the next access does not come here
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *namespace.get("__all__", ())})

    return __getattr__, __dir__
