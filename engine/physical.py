"""The physical plan: operators fused into vertices (chaining), edges with partitioning.

A *vertex* is a chain of operators that run in one task per parallel instance. An operator
is chained to its single upstream when the edge is forward (same parallelism, not keyed,
not a union) and the upstream has no other consumer, as Flink does. Pure: no Ray.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from engine import graph as g

FORWARD = "forward"
REBALANCE = "rebalance"
KEYED = "keyed"


@dataclass(frozen=True)
class Vertex:
    """A chain of operators run together; ``name`` is the head operator's name."""

    name: str
    operators: tuple[g.OperatorDef, ...]
    parallelism: int

    @property
    def head(self) -> g.OperatorDef:
        return self.operators[0]

    @property
    def keyed(self) -> bool:
        return self.head.keyed

    @property
    def is_source(self) -> bool:
        return self.head.kind == g.SOURCE

    @property
    def has_sink(self) -> bool:
        return self.operators[-1].kind == g.SINK


@dataclass(frozen=True)
class Edge:
    """Records from every task of ``src`` to tasks of ``dst`` (input ``port`` there).

    Invariant: ``forward`` edges join vertices of equal parallelism; ``keyed`` edges carry a
    ``key_fn`` evaluated at the sender.
    """

    edge_id: int
    src: str
    dst: str
    partitioning: str
    key_fn: Callable[[Any], Any] | None
    port: int = 0


@dataclass(frozen=True)
class PhysicalPlan:
    vertices: tuple[Vertex, ...]
    edges: tuple[Edge, ...]
    num_key_groups: int

    def vertex(self, name: str) -> Vertex:
        for v in self.vertices:
            if v.name == name:
                return v
        raise KeyError(name)

    def vertex_of(self, operator: str) -> Vertex:
        for v in self.vertices:
            if any(op.name == operator for op in v.operators):
                return v
        raise KeyError(operator)

    def inputs_of(self, vertex: str) -> list[Edge]:
        return [e for e in self.edges if e.dst == vertex]

    def outputs_of(self, vertex: str) -> list[Edge]:
        return [e for e in self.edges if e.src == vertex]

    def neighbours(self, vertex: str) -> frozenset[str]:
        """The other vertices that exchange records with ``vertex``: its inputs' sources
        and its outputs' destinations."""
        return frozenset({e.src for e in self.inputs_of(vertex)}
                         | {e.dst for e in self.outputs_of(vertex)}) - {vertex}

    def rescaled(self, vertex: str, parallelism: int) -> PhysicalPlan:
        """The same plan with one vertex at a new parallelism; chaining is kept, forward
        edges that would join unequal parallelisms become rebalance edges."""
        verts = tuple(
            replace(v, parallelism=parallelism,
                    operators=tuple(replace(op, parallelism=parallelism) for op in v.operators))
            if v.name == vertex else v
            for v in self.vertices
        )
        par = {v.name: v.parallelism for v in verts}
        edges = tuple(
            replace(e, partitioning=REBALANCE)
            if e.partitioning == FORWARD and par[e.src] != par[e.dst] else e
            for e in self.edges
        )
        return PhysicalPlan(verts, edges, self.num_key_groups)


def plan_physical(graph: g.JobGraph) -> PhysicalPlan:
    """Fuse chainable operators into vertices and derive the edges between them."""
    consumers = {op.name: graph.consumers(op.name) for op in graph.operators}
    chained_to: dict[str, str] = {}  # operator -> the operator it is fused behind
    for op in graph.operators:
        if op.kind == g.SOURCE or op.keyed or len(op.inputs) != 1:
            continue
        up = graph.operator(op.inputs[0].upstream)
        if up.parallelism == op.parallelism and len(consumers[up.name]) == 1:
            chained_to[op.name] = up.name
    head_of: dict[str, str] = {}
    chains: dict[str, list[g.OperatorDef]] = {}
    for op in graph.operators:
        head = head_of[chained_to[op.name]] if op.name in chained_to else op.name
        head_of[op.name] = head
        chains.setdefault(head, []).append(op)
    vertices = tuple(Vertex(h, tuple(ops), ops[0].parallelism) for h, ops in chains.items())
    par = {v.name: v.parallelism for v in vertices}
    edges: list[Edge] = []
    for op in graph.operators:
        if op.name in chained_to:
            continue
        for port_idx, inp in enumerate(op.inputs):
            src = head_of[inp.upstream]
            if op.keyed:
                part = KEYED
            elif par[src] == op.parallelism:
                part = FORWARD
            else:
                part = REBALANCE
            edges.append(Edge(len(edges), src, op.name, part, inp.key_fn, inp.port or 0))
            del port_idx
    return PhysicalPlan(vertices, tuple(edges), graph.num_key_groups)
