"""The physical plan: operators fused into vertices (chaining), edges with partitioning.

A *vertex* is a chain of operators that run in one task per parallel instance. An operator
is chained to its single upstream when the edge is forward (same parallelism, not keyed,
not a union) and the upstream has no other consumer, as Flink does. Pure: no Ray.

A forward edge keeps its meaning for the job's life: it is never turned into a rebalance
edge, since records of one key would then reach the receiver along several paths and in
another order. Forward-connected operators rescale together instead: a rescale of a vertex
takes its *forward group* (``PhysicalPlan.forward_group``: the vertices reachable over
forward edges in either direction) to the new parallelism in one step, when the group is
one keyed or stateless root with stateless partners (``PhysicalPlan.check_rescale`` says
which partners go with it, or refuses naming the edge); ``with_parallelism`` raises rather
than change one side of a forward edge alone (docs/architecture.md, "Forward edges").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from engine.dataflow import graph as g
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
        """The other vertices that exchange records with ``vertex`` or its forward partners
        (``forward_group``: a rescale of ``vertex`` may rescale them too, so it occupies
        them): the group's inputs' sources and outputs' destinations, and, through a
        neighbour without key groups (not a source), that neighbour's own, and so on: a
        stateless task passes on what a migration sends its receivers (watermark holds,
        ``engine.task.group_order``'s markers), so operators it joins must not rescale at once
        either. The partners themselves are among them."""
        def direct(v: str) -> set[str]:
            return {e.src for e in self.inputs_of(v)} | {e.dst for e in self.outputs_of(v)}

        group = self.forward_group(vertex) or (vertex,)
        seen = set(group)
        todo = list(group)
        out: set[str] = set(group) - {vertex}
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

    def forward_group(self, vertex: str) -> tuple[str, ...]:
        """``vertex`` and every vertex reachable from it over forward edges in either
        direction, in topological order (the plan's vertex order): the vertices that run
        equally many tasks for the job's life and so rescale together. Empty for a name
        that is no vertex of the plan."""
        seen = {vertex}
        todo = [vertex]
        while todo:
            for e in self.forward_edges_of(todo.pop()):
                for n in (e.src, e.dst):
                    if n not in seen:
                        seen.add(n)
                        todo.append(n)
        return tuple(v.name for v in self.vertices if v.name in seen)

    def forward_partners(self, vertex: str) -> tuple[str, ...]:
        """``forward_group(vertex)`` without ``vertex`` (topological order)."""
        return tuple(n for n in self.forward_group(vertex) if n != vertex)

    def _joined_by(self, vertex: str) -> dict[str, Edge]:
        """Each forward partner of ``vertex`` -> the forward edge through which a search
        from ``vertex`` reached it (what a refusal names)."""
        via: dict[str, Edge] = {}
        seen = {vertex}
        todo = [vertex]
        while todo:
            for e in self.forward_edges_of(todo.pop(0)):
                for n in (e.src, e.dst):
                    if n not in seen:
                        seen.add(n)
                        via[n] = e
                        todo.append(n)
        return via

    def check_rescale(self, vertex: str, parallelism: int, *,
                      live: bool = True) -> tuple[str, ...]:
        """The forward partners that go to ``parallelism`` tasks with ``vertex`` (in
        topological order; empty at the vertex's current parallelism, where nothing
        changes and every request passes, or when it has none), or ``RescaleRefused``
        naming the edge and saying what to do when the group cannot rescale as one:

        * it holds a source (a source's partitions are handed over by their own rescale,
          which runs alone);
        * it holds a keyed vertex other than ``vertex`` (that one is the group's root:
          rescale it, and ``vertex`` follows), or more than one keyed vertex;
        * ``live`` and ``vertex`` is keyed: a partner has an input other than one forward
          edge from the group (its tasks would get records of one key along two paths and
          could not relay the order markers that keep a key's outputs in order while key
          groups move: ``engine.task.core.TaskCore._relay_order_marker``).

        Every partner is stateless and not a source when it returns."""
        v = self.vertex(vertex)
        if parallelism == v.parallelism:
            return ()
        partners = self.forward_partners(vertex)
        if not partners:
            return ()
        via = self._joined_by(vertex)
        group = (vertex, *partners)
        if v.is_source:
            e = via[partners[0]]
            raise RescaleRefused(_group_refusal(
                e, vertex, v.parallelism, parallelism,
                f"{vertex!r} is a source: its partitions change hands by a rescale of their "
                f"own, which runs alone, so reflow does not rescale its partners with it"),
                operator=vertex)
        for n in partners:
            if self.vertex(n).is_source:
                raise RescaleRefused(_group_refusal(
                    via[n], vertex, v.parallelism, parallelism,
                    f"{n!r} is a source: its partitions change hands by a rescale of their "
                    f"own, which runs alone, so reflow does not rescale it with "
                    f"{vertex!r}"), operator=vertex)
        keyed = [n for n in group if self.vertex(n).keyed]
        if len(keyed) > 1:
            other = next(n for n in keyed if n != vertex)
            raise RescaleRefused(_group_refusal(
                via[other], vertex, v.parallelism, parallelism,
                f"{', '.join(repr(k) for k in keyed)} are keyed and forward-connected: a "
                f"rescale moves the key groups of one keyed operator"), operator=vertex)
        if keyed and keyed[0] != vertex:
            root = keyed[0]
            also = [n for n in self.forward_partners(root) if n != vertex]
            raise RescaleRefused(
                f"{vertex!r} is forward-connected to keyed {root!r} "
                f"({_edge_name(via[root])} is a forward edge: task i of one side sends only "
                f"to task i of the other, so they run equally many tasks): rescale {root!r}; "
                f"its forward partner {vertex!r} rescales with it"
                + (f" (and {', '.join(repr(n) for n in also)})" if also else "")
                + ". The job goes on unchanged", operator=vertex)
        if live and v.keyed:
            for n in partners:
                extra = [e for e in self.inputs_of(n)
                         if not (e.partitioning == FORWARD and e.src in group)]
                ins = self.inputs_of(n)
                if extra or len(ins) != 1:
                    e = (extra or ins[1:])[0]
                    raise RescaleRefused(_group_refusal(
                        via[n], vertex, v.parallelism, parallelism,
                        f"{n!r} also reads {_edge_name(e)}: while key groups of {vertex!r} "
                        f"move live, a partner keeps a key's outputs in order only when its "
                        f"one input is the forward edge (it relays the migration's order "
                        f"markers then). Use protocol='stop-restart', which rescales the "
                        f"group with the job stopped"), operator=vertex)
        return partners

    def forward_root(self, vertex: str) -> str:
        """The keyed vertex whose live rescale takes ``vertex``'s forward group along
        (``vertex`` itself when it is that one), or "" when ``vertex`` has no forward
        partner or its group has no such root (``check_rescale`` would refuse it)."""
        group = self.forward_group(vertex)
        keyed = [n for n in group if self.vertex(n).keyed]
        if len(group) < 2 or len(keyed) != 1:
            return ""
        root = keyed[0]
        try:
            self.check_rescale(root, self.vertex(root).parallelism + 1)
        except RescaleRefused:
            return ""
        return root

    def check_placement(self, vertex: str) -> None:
        """``RescaleRefused`` naming the edge when ``vertex`` has forward partners: a
        placement runs one more task of the vertex while its key groups move, and the
        partners would need one more too (not built)."""
        via = self._joined_by(vertex)
        for n in self.forward_partners(vertex):
            raise RescaleRefused(
                f"placement of a task of {vertex!r} runs one more task while its key groups "
                f"move, and {_edge_name(via[n])} is a forward edge (task i of one side sends "
                f"only to task i of the other, so they run equally many tasks): reflow does "
                f"not place a task of an operator with forward partners; the job goes on "
                f"unchanged. Rescale {vertex!r} instead (its partners "
                f"{', '.join(repr(p) for p in self.forward_partners(vertex))} rescale with "
                f"it), or build the job with different parallelisms for the two, or chain "
                f"them", operator=vertex)

    def with_parallelism(self, parallelism: Mapping[str, int]) -> PhysicalPlan:
        """The same plan with these vertices at new parallelisms; chaining and every edge's
        partitioning are kept. ``RescaleRefused`` (naming the edge) when a forward edge
        would join unequal parallelisms: a forward edge never silently becomes a rebalance
        edge (that would change what the job computes); forward-connected vertices change
        together, in one call (``forward_group``)."""
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
        parallelisms; ``with_parallelism`` of its whole ``forward_group`` changes them
        together)."""
        return self.with_parallelism({vertex: parallelism})


def _edge_name(edge: Edge) -> str:
    return f"{edge.src!r} -> {edge.dst!r}"


def _group_refusal(edge: Edge, vertex: str, current: int, parallelism: int, why: str) -> str:
    """Why a rescale of ``vertex`` with its forward partners is refused (``why``, the
    partner reached over ``edge``), and what to do instead."""
    return (f"{_edge_name(edge)} is a forward edge (task i of {edge.src!r} sends only to task "
            f"i of {edge.dst!r}, so both run {current} tasks), so rescaling {vertex!r} to "
            f"{parallelism} rescales its forward partners with it, and {why}; the job goes on "
            f"unchanged. To rescale {vertex!r} alone, build the job with different "
            f"parallelisms on the two sides of {_edge_name(edge)} (a rebalance edge then, "
            f"with the order that implies)")


def forward_edge_refusal(edge: Edge, vertex: str, current: int, parallelism: int) -> str:
    """Why a change of ``vertex`` alone from ``current`` to ``parallelism`` tasks is refused
    over forward ``edge``, and what to do instead."""
    other = edge.dst if edge.src == vertex else edge.src
    return (f"{edge.src!r} -> {edge.dst!r} is a forward edge (task i of {edge.src!r} sends only "
            f"to task i of {edge.dst!r}, so both run {current} tasks): {vertex!r} alone at "
            f"{parallelism} would turn it into a rebalance edge and change what the job "
            f"computes (records of one key would reach {edge.dst!r} along several paths, in "
            f"another order). Forward-connected operators change parallelism together: "
            f"give {other!r} {parallelism} tasks in the same step (a rescale of {vertex!r} "
            f"does that: PhysicalPlan.check_rescale)")


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
