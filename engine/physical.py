"""The physical plan: operators fused into vertices (chaining), edges with partitioning.

A *vertex* is a chain of operators that run in one task per parallel instance. An operator
is chained to its single upstream when the edge is forward (same parallelism, not keyed,
not a union) and the upstream has no other consumer, as Flink does. Pure: no Ray.

A forward edge keeps its meaning for the job's life: a rescale that would join unequal
parallelisms across one is refused (``PhysicalPlan.check_rescale``, ``with_parallelism``),
never turned into a rebalance edge, since records of one key would then reach the
receiver along several paths and in another order (docs/architecture.md, "Forward edges").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from engine import graph as g
from engine.errors import RescaleRefused

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
        and its outputs' destinations, and, through a neighbour without key groups (not a
        source), that neighbour's own, and so on: a stateless task passes on what a
        migration sends its receivers (watermark holds, ``engine.group_order``'s markers),
        so operators it joins must not rescale at once either."""
        def direct(v: str) -> set[str]:
            return {e.src for e in self.inputs_of(v)} | {e.dst for e in self.outputs_of(v)}

        seen = {vertex}
        todo = [vertex]
        out: set[str] = set()
        while todo:
            for n in direct(todo.pop()) - seen:
                seen.add(n)
                out.add(n)
                nv = self.vertex(n)
                if not nv.keyed and not nv.is_source:
                    todo.append(n)
        return frozenset(out)

    def forward_edges_of(self, vertex: str) -> list[Edge]:
        """The forward edges into and out of ``vertex`` (each task of one side sends to the
        task at its own index on the other, so both sides run equally many tasks)."""
        return [e for e in self.edges if e.partitioning == FORWARD
                and vertex in (e.src, e.dst) and e.src != e.dst]

    def check_rescale(self, vertex: str, parallelism: int) -> None:
        """Raise ``RescaleRefused`` when running ``vertex`` at ``parallelism`` would change
        what the job computes: a forward edge of the vertex would join unequal
        parallelisms. The refusal names the edge and says what to do. At the vertex's
        current parallelism nothing changes and every request passes."""
        v = self.vertex(vertex)
        if parallelism == v.parallelism:
            return
        for e in self.forward_edges_of(vertex):
            raise RescaleRefused(forward_edge_refusal(e, vertex, v.parallelism, parallelism),
                                 operator=vertex)

    def with_parallelism(self, parallelism: Mapping[str, int]) -> PhysicalPlan:
        """The same plan with these vertices at new parallelisms; chaining and every edge's
        partitioning are kept. ``RescaleRefused`` (naming the edge) when a forward edge
        would join unequal parallelisms: a forward edge never silently becomes a rebalance
        edge (that would change what the job computes; see ``check_rescale``)."""
        verts = tuple(
            replace(v, parallelism=parallelism[v.name],
                    operators=tuple(replace(op, parallelism=parallelism[v.name])
                                    for op in v.operators))
            if v.name in parallelism else v
            for v in self.vertices
        )
        before = {v.name: v.parallelism for v in self.vertices}
        par = {v.name: v.parallelism for v in verts}
        for e in self.edges:
            if e.partitioning == FORWARD and par[e.src] != par[e.dst]:
                moved = e.src if par[e.src] != before[e.src] else e.dst
                raise RescaleRefused(forward_edge_refusal(e, moved, before[moved], par[moved]),
                                     operator=moved)
        return PhysicalPlan(verts, self.edges, self.num_key_groups)

    def rescaled(self, vertex: str, parallelism: int) -> PhysicalPlan:
        """The same plan with one vertex at a new parallelism (``with_parallelism``:
        ``RescaleRefused`` when a forward edge of the vertex would join unequal
        parallelisms)."""
        return self.with_parallelism({vertex: parallelism})


def forward_edge_refusal(edge: Edge, vertex: str, current: int, parallelism: int) -> str:
    """Why a rescale of ``vertex`` from ``current`` to ``parallelism`` tasks is refused over
    forward ``edge``, and what to do instead."""
    other = edge.dst if edge.src == vertex else edge.src
    return (f"{edge.src!r} -> {edge.dst!r} is a forward edge (task i of {edge.src!r} sends only "
            f"to task i of {edge.dst!r}, so both run {current} tasks): rescaling {vertex!r} to "
            f"{parallelism} would turn it into a rebalance edge and change what the job "
            f"computes (records of one key would reach {edge.dst!r} along several paths, in "
            f"another order). reflow does not rescale forward-connected operators; the job "
            f"goes on unchanged. To rescale {vertex!r}, build the job with different "
            f"parallelisms for {vertex!r} and {other!r} (the edge is then a rebalance edge), "
            f"or chain them (equal parallelism, {edge.dst!r} the only consumer of "
            f"{edge.src!r}, no key_by or union between them) and rescale the chain's first "
            f"operator")


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
