"""A rescale as a value: ``MigrationPlan``, the one plan type every protocol produces.

Why a value: the coordinator executes a plan, the benchmarks and tests inspect it, and a
report cites its ``reason``; none of them should re-derive which key groups move where.

Format. A plan names the operator, the protocol, the old and new parallelism and
assignment (one task index per key group), and ``steps``: a tuple of steps, each a tuple of
``Subscale`` values (key groups moving from one old owner to one new owner). Steps run one
after another; the subscales of one step run at once. A concurrent protocol (drrs) has a
single step whose subscales the coordinator schedules independently.

Guarantees (checked in ``__post_init__``): every key group whose owner changes is in
exactly one subscale; no unmoved group is in any; a subscale's groups share its
(old, new) pair; subscale ids are unique. ``stop-restart`` plans carry the same steps (one,
by pair) for inspection; the protocol itself moves every group at once.

Grouping and chunking of moves live here once: ``moves_by_pair`` and ``chunk_by_size``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from engine.dataflow.keygroups import moved_key_groups


@dataclass(frozen=True)
class Subscale:
    """Key groups ``key_groups`` move from task index ``old`` to task index ``new``."""

    subscale_id: int
    old: int
    new: int
    key_groups: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.key_groups:
            raise ValueError(f"subscale {self.subscale_id} moves no key group")
        if self.old == self.new:
            raise ValueError(f"subscale {self.subscale_id} moves groups from task {self.old} "
                             "to itself")


@dataclass(frozen=True)
class MigrationPlan:
    """One rescale of ``operator`` with ``protocol``: the new assignment and the steps that
    reach it; ``reason`` says how the steps were chosen (and why, for adaptive planning)."""

    operator: str
    protocol: str
    old_parallelism: int
    new_parallelism: int
    old_assignment: tuple[int, ...]
    new_assignment: tuple[int, ...]
    steps: tuple[tuple[Subscale, ...], ...]
    reason: str = ""
    order: tuple[int, ...] = ()  # the moved groups in priority order, when one was chosen

    def __post_init__(self) -> None:
        if self.old_parallelism < 1 or self.new_parallelism < 1:
            raise ValueError(f"plan for {self.operator!r}: parallelism must be >= 1")
        if len(self.old_assignment) != len(self.new_assignment):
            raise ValueError(
                f"plan for {self.operator!r}: the old and new assignments cover "
                f"{len(self.old_assignment)} and {len(self.new_assignment)} key groups")
        if any(not 0 <= t < self.new_parallelism for t in self.new_assignment):
            raise ValueError(f"plan for {self.operator!r}: the new assignment names a task "
                             f"outside 0..{self.new_parallelism - 1}")
        seen: set[int] = set()
        ids: set[int] = set()
        for sub in self.subscales:
            if sub.subscale_id in ids:
                raise ValueError(f"subscale id {sub.subscale_id} is used twice")
            ids.add(sub.subscale_id)
            for kg in sub.key_groups:
                if kg in seen:
                    raise ValueError(f"key group {kg} is in two subscales")
                if self.old_assignment[kg] != sub.old or self.new_assignment[kg] != sub.new:
                    raise ValueError(f"subscale {sub.subscale_id} does not match the assignments")
                seen.add(kg)
        if seen != set(moved_key_groups(self.old_assignment, self.new_assignment)):
            raise ValueError("the subscales do not cover exactly the moved key groups")
        if self.order and sorted(self.order) != sorted(seen):
            raise ValueError("the priority order is not a permutation of the moved key groups")

    @property
    def subscales(self) -> tuple[Subscale, ...]:
        return tuple(s for step in self.steps for s in step)

    @property
    def moved(self) -> tuple[int, ...]:
        """Moved key groups in step order."""
        return tuple(kg for s in self.subscales for kg in s.key_groups)

    @property
    def work_parallelism(self) -> int:
        """Tasks the operator has while the plan runs (new tasks exist before the first
        step; removed ones go after the last)."""
        return max(self.old_parallelism, self.new_parallelism)


def moves_by_pair(groups: Iterable[int], old: Sequence[int], new: Sequence[int],
                  sort_pairs: bool = False) -> list[tuple[tuple[int, int], list[int]]]:
    """``groups`` (moved key groups, in priority order) grouped by (old owner, new owner):
    pairs in the order of their first group (or sorted), groups in the given order."""
    pairs: dict[tuple[int, int], list[int]] = {}
    for kg in groups:
        pairs.setdefault((old[kg], new[kg]), []).append(kg)
    items = list(pairs.items())
    return sorted(items) if sort_pairs else items


def chunk_by_size(key_groups: Sequence[int], max_groups: int | None = None,
                  sizes: Mapping[int, int] | None = None,
                  max_bytes: int | None = None) -> list[tuple[int, ...]]:
    """Consecutive chunks of ``key_groups`` in their order: a chunk closes at ``max_groups``
    groups, or before a group that would take its ``sizes`` total past ``max_bytes`` (a
    group larger than that travels alone). Unknown sizes count as 0."""
    if max_groups is not None and max_groups < 1:
        raise ValueError("max_groups must be >= 1 or None")
    if max_bytes is not None and max_bytes < 1:
        raise ValueError("max_bytes must be >= 1 or None")
    chunks: list[tuple[int, ...]] = []
    cur: list[int] = []
    total = 0
    for kg in key_groups:
        size = (sizes or {}).get(kg, 0)
        full = (max_groups is not None and len(cur) >= max_groups) or (
            max_bytes is not None and cur and total + size > max_bytes)
        if full:
            chunks.append(tuple(cur))
            cur, total = [], 0
        cur.append(kg)
        total += size
    if cur:
        chunks.append(tuple(cur))
    return chunks


def subscales_by_pair(groups: Iterable[int], old: Sequence[int], new: Sequence[int],
                      first_id: int, max_groups: int | None = None,
                      sizes: Mapping[int, int] | None = None, max_bytes: int | None = None,
                      sort_pairs: bool = False) -> tuple[Subscale, ...]:
    """One step's groups as subscales by (old owner, new owner) pair, each at most
    ``max_groups`` groups and ``max_bytes`` of state (``chunk_by_size``); ids from
    ``first_id``."""
    subs: list[Subscale] = []
    for (o, n), kgs in moves_by_pair(groups, old, new, sort_pairs):
        for chunk in chunk_by_size(kgs, max_groups, sizes, max_bytes):
            subs.append(Subscale(first_id + len(subs), o, n, chunk))
    return tuple(subs)


def steps_from_chunks(chunks: Sequence[Sequence[int]], old: Sequence[int], new: Sequence[int],
                      first_id: int) -> tuple[tuple[Subscale, ...], ...]:
    """Steps in ``chunks`` order, each split by pair; ids consecutive from ``first_id``."""
    steps: list[tuple[Subscale, ...]] = []
    next_id = first_id
    for chunk in chunks:
        step = subscales_by_pair(chunk, old, new, next_id)
        next_id += len(step)
        if step:
            steps.append(step)
    return tuple(steps)
