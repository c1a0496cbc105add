"""The logical job graph: frozen dataclasses validated on construction.

A ``JobGraph`` is a set of ``OperatorDef`` nodes; each non-source operator names its inputs
(``InputDef``: upstream operator, partitioning, key function). Physical plans are derived
from it (``engine.dataflow.physical``); nothing here knows about Ray.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from engine.dataflow.config import check_count
from engine.errors import JobDefinitionError

SOURCE = "source"
MAP = "map"
FLAT_MAP = "flat_map"
FILTER = "filter"
PROCESS = "process"
REDUCE = "reduce"
SINK = "sink"
MAP_BATCHES = "map_batches"  # engine.operators.vectorised: a user function per column batch
AGGREGATE = "aggregate"  # engine.operators.vectorised: running keyed aggregations, vectorised
WINDOW_AGGREGATE = "window_aggregate"  # engine.operators.window_aggregates: vectorised, per window

STATELESS_KINDS = frozenset({MAP, FLAT_MAP, FILTER, SINK, MAP_BATCHES})
KEYED_KINDS = frozenset({PROCESS, REDUCE, AGGREGATE, WINDOW_AGGREGATE})
ALL_KINDS = STATELESS_KINDS | KEYED_KINDS | {SOURCE}


@dataclass(frozen=True)
class InputDef:
    """One input of an operator: records of ``upstream``; ``key_fn`` set on keyed inputs."""

    upstream: str
    key_fn: Callable[[Any], Any] | None = None
    port: int = 0


@dataclass(frozen=True)
class OperatorDef:
    """One logical operator.

    Invariants: ``name`` is a non-empty string without '/'; sources have no inputs, every
    other kind has at least one; keyed kinds have a ``key_fn`` on every input;
    ``parallelism`` is an ``int`` >= 1 (``engine.dataflow.config.check_count``: never a bool; a numpy
    integer is stored as ``int``).
    """

    name: str
    kind: str
    fn: Any
    parallelism: int
    inputs: tuple[InputDef, ...] = ()
    dead_letter: Any = None
    late_sink: Any = None
    watermarks: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise JobDefinitionError(
                f"operator name {self.name!r} must be a non-empty string without '/'"
            )
        if self.kind not in ALL_KINDS:
            raise JobDefinitionError(f"operator {self.name!r} has unknown kind {self.kind!r}")
        object.__setattr__(self, "parallelism", check_count(
            f"operator {self.name!r}: parallelism", self.parallelism, error=JobDefinitionError))
        if self.kind == SOURCE and self.inputs:
            raise JobDefinitionError(f"source {self.name!r} cannot have inputs")
        if self.kind != SOURCE and not self.inputs:
            raise JobDefinitionError(f"operator {self.name!r} has no input")
        if self.kind in KEYED_KINDS and any(i.key_fn is None for i in self.inputs):
            raise JobDefinitionError(
                f"keyed operator {self.name!r} needs key_by(...) on every input"
            )

    @property
    def keyed(self) -> bool:
        return self.kind in KEYED_KINDS


@dataclass(frozen=True)
class JobGraph:
    """A whole job. Operators are in insertion order, which is a topological order.

    Invariants: ``name`` is a non-empty string; ``num_key_groups`` is an ``int`` >= 1
    (``check_count``); operator names are unique; every input names an earlier operator;
    keyed operators have parallelism <= ``num_key_groups``.
    """

    name: str
    num_key_groups: int
    operators: tuple[OperatorDef, ...]
    _by_name: dict[str, OperatorDef] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise JobDefinitionError(f"a job needs a non-empty name; got {self.name!r}")
        object.__setattr__(self, "num_key_groups", check_count(
            f"job {self.name!r}: num_key_groups", self.num_key_groups, error=JobDefinitionError))
        by_name: dict[str, OperatorDef] = {}
        for op in self.operators:
            if op.name in by_name:
                raise JobDefinitionError(
                    f"operator name {op.name!r} is used twice; give each operator a unique name"
                )
            for inp in op.inputs:
                if inp.upstream not in by_name:
                    raise JobDefinitionError(
                        f"operator {op.name!r} reads from unknown operator {inp.upstream!r}"
                    )
                if by_name[inp.upstream].kind == SINK:
                    raise JobDefinitionError(
                        f"operator {op.name!r} reads from sink {inp.upstream!r}; sinks have no output"
                    )
            if op.keyed and op.parallelism > self.num_key_groups:
                raise JobDefinitionError(
                    f"keyed operator {op.name!r} has parallelism {op.parallelism} > "
                    f"num_key_groups {self.num_key_groups}; lower it or raise num_key_groups"
                )
            by_name[op.name] = op
        if not any(op.kind == SOURCE for op in self.operators):
            raise JobDefinitionError(f"job {self.name!r} has no source")
        object.__setattr__(self, "_by_name", by_name)

    def operator(self, name: str) -> OperatorDef:
        try:
            return self._by_name[name]
        except KeyError:
            raise JobDefinitionError(
                f"job {self.name!r} has no operator {name!r}; operators: "
                f"{', '.join(self._by_name)}"
            ) from None

    def consumers(self, name: str) -> list[OperatorDef]:
        return [op for op in self.operators if any(i.upstream == name for i in op.inputs)]

    def with_parallelism(self, name: str, parallelism: int) -> JobGraph:
        """The same graph with one operator's parallelism changed (validated again)."""
        self.operator(name)
        ops = tuple(replace(o, parallelism=parallelism) if o.name == name else o
                    for o in self.operators)
        return JobGraph(self.name, self.num_key_groups, ops)
