"""Sequences of rescales: the optimal migration sequence (OMS) and MTM-aware migration.

Why: the single-step optimum (``migration.assignment.ssm``) can leave a layout that makes
the next rescale expensive (Ding et al., §5). When the coming parallelisms are known, OMS
plans them together; when only their probabilities are (a migration transition matrix,
MTM: row ``n``, column ``n'`` = the probability that a job at ``n`` tasks goes to ``n'``
next), the MTM-aware strategy minimises the current cost plus ``γ`` times the projected
cost of the future (PMC), a value pre-computed for every balanced partitioning by value
iteration (``migration.pmc`` runs it on Spark) and looked up at rescale time.

The model is ``migration.assignment``'s. Two approximations, both the paper's, keep the
pre-computation finite; docs/guide/rescaling.md ("MTM-aware rescales") says how to size them:

* **Units.** Projected costs are per partitioning of *units*: runs of consecutive key
  groups (``Units``), ``m`` of them. The number of partitionings of ``m`` units into at most
  ``n_max`` intervals is ``sum_{k <= n_max} C(m - 1, k - 1)``; only balanced ones are kept.
  ``mtm`` chooses among the table's partitionings, so its cuts fall on unit boundaries.
* **Which tasks go.** A projected future rescale may remove any tasks (the paper's Lemma
  5.2: only the partitioning matters); the current step is priced exactly as reflow runs it
  (tasks ``n'..n-1`` removed on a scale-in).

OMS is exact under reflow's model (the highest-numbered tasks go), by dynamic programming
over every balanced, labelled contiguous assignment of each intermediate step: exponential
like the paper's algorithm, so it refuses inputs with more than ``OMS_MAX_STATES`` of them.

Format: ``ProjectedCosts.save(path)`` writes a Parquet dataset ``path/costs`` partitioned
by ``parallelism`` (one directory per parallelism: a lookup reads only its own) with
``ends`` (interval ends in key groups), ``unit_ends`` and ``cost``, and ``path/meta``
(one row: the JSON of the model: key groups, unit bounds, θ, γ, the MTM, iterations).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.errors import AssignmentError, BalanceInfeasible
from migration.assignment import (
    AssignmentPlan,
    GroupWorkload,
    _cap,
    _check_balance,
    _check_counts,
    _check_old,
    effective_loads,
    label_intervals,
    make_plan,
)

OMS_MAX_STATES = 200_000
DEFAULT_GAMMA = 0.9


# ---------------------------------------------------------------------- the MTM


@dataclass(frozen=True)
class TransitionMatrix:
    """``probabilities[i][j]``: the probability that a job at ``parallelisms[i]`` tasks is
    rescaled to ``parallelisms[j]`` next (the diagonal: it stays). Rows sum to 1."""

    parallelisms: tuple[int, ...]
    probabilities: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        ps = tuple(int(p) for p in self.parallelisms)
        rows = tuple(tuple(float(x) for x in r) for r in self.probabilities)
        if not ps or len(set(ps)) != len(ps) or min(ps) < 1:
            raise AssignmentError(f"MTM parallelisms must be distinct and >= 1; got {ps}")
        if len(rows) != len(ps) or any(len(r) != len(ps) for r in rows):
            raise AssignmentError(f"the MTM must be {len(ps)} x {len(ps)} (one row and column "
                                  "per parallelism)")
        for p, r in zip(ps, rows, strict=True):
            if any(not math.isfinite(x) or x < 0 for x in r) or abs(sum(r) - 1.0) > 1e-6:
                raise AssignmentError(f"MTM row {p}: probabilities must be >= 0 and sum to 1; "
                                      f"got {r}")
        object.__setattr__(self, "parallelisms", ps)
        object.__setattr__(self, "probabilities", rows)

    def row(self, parallelism: int) -> dict[int, float]:
        """``n' -> probability`` from ``parallelism`` (zero entries left out)."""
        if parallelism not in self.parallelisms:
            raise AssignmentError(f"parallelism {parallelism} is not in the MTM "
                                  f"({', '.join(map(str, self.parallelisms))})")
        r = self.probabilities[self.parallelisms.index(parallelism)]
        return {p: x for p, x in zip(self.parallelisms, r, strict=True) if x > 0}

    def walk(self, start: int, steps: int, seed: int = 0) -> list[int]:
        """A random sequence of ``steps`` next parallelisms from ``start`` (seeded)."""
        rng = np.random.default_rng(seed)
        out, n = [], start
        for _ in range(steps):
            r = self.row(n)
            n = int(rng.choice(list(r), p=np.array(list(r.values())) / sum(r.values())))
            out.append(n)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"parallelisms": list(self.parallelisms),
                "probabilities": [list(r) for r in self.probabilities]}


#: The paper's Table 4 (parallelisms 2, 3, 4).
PAPER_TABLE_4 = TransitionMatrix((2, 3, 4), ((0.3, 0.6, 0.1), (0.3, 0.4, 0.3),
                                             (0.1, 0.5, 0.4)))


# ---------------------------------------------------------------------- units and partitions


@dataclass(frozen=True)
class Units:
    """Key groups merged into units: unit ``u`` is groups ``bounds[u]..bounds[u+1]-1``."""

    bounds: tuple[int, ...]

    def __post_init__(self) -> None:
        b = tuple(int(x) for x in self.bounds)
        if len(b) < 2 or b[0] != 0 or any(y <= x for x, y in itertools.pairwise(b)):
            raise AssignmentError(f"unit bounds must start at 0 and increase; got {b[:8]}...")
        object.__setattr__(self, "bounds", b)

    @classmethod
    def even(cls, num_key_groups: int, units: int | None = None) -> Units:
        """``units`` runs of (nearly) equal group count (default: one group per unit)."""
        u = num_key_groups if units is None else units
        _check_counts(num_key_groups, u)
        return cls(tuple(i * num_key_groups // u for i in range(u + 1)))

    @property
    def count(self) -> int:
        return len(self.bounds) - 1

    @property
    def num_key_groups(self) -> int:
        return self.bounds[-1]

    def fold(self, workload: GroupWorkload) -> GroupWorkload:
        """The workload per unit (sums of its groups')."""
        if workload.num_key_groups != self.num_key_groups:
            raise AssignmentError(f"the workload has {workload.num_key_groups} key groups, "
                                  f"the units {self.num_key_groups}")
        w = np.add.reduceat(np.asarray(workload.loads), self.bounds[:-1])
        s = np.add.reduceat(np.asarray(workload.sizes, dtype=np.int64), self.bounds[:-1])
        return GroupWorkload(tuple(w.tolist()), tuple(s.tolist()))

    def to_groups(self, unit_ends: Sequence[int]) -> tuple[int, ...]:
        """Interval ends in units -> in key groups."""
        return tuple(self.bounds[e] for e in unit_ends)


def partitions(loads: Sequence[float], parallelism: int, balance: float
               ) -> Iterator[tuple[int, ...]]:
    """Every partition of ``len(loads)`` items into ``parallelism`` non-empty contiguous
    intervals whose loads are within ``(1 + balance) · W / parallelism``, as interval ends
    (ascending, the last ``len(loads)``), in lexicographic order. The loads are used as
    given (pass ``effective_loads``)."""
    m = len(loads)
    _check_counts(m, parallelism)
    pre = np.concatenate(([0.0], np.cumsum(np.asarray(loads, dtype=np.float64))))
    cap = _cap(float(pre[-1]), parallelism, _check_balance(balance))

    def rest(start: int, k: int) -> Iterator[tuple[int, ...]]:
        if k == 1:
            if pre[m] - pre[start] <= cap:
                yield (m,)
            return
        if pre[m] - pre[start] > k * cap:
            return
        for end in range(start + 1, m - k + 2):
            if pre[end] - pre[start] > cap:
                break
            for tail in rest(end, k - 1):
                yield (end, *tail)

    yield from rest(0, parallelism)


def ends_to_assignment(ends: Sequence[int], labels: Sequence[int]) -> tuple[int, ...]:
    out: list[int] = []
    start = 0
    for end, t in zip(ends, labels, strict=True):
        out.extend([t] * (end - start))
        start = end
    return tuple(out)


def partition_cost(sizes: Sequence[int] | np.ndarray, a: Sequence[int], b: Sequence[int]) -> int:
    """Bytes moved from partitioning ``a`` to ``b`` (interval ends) in the paper's model:
    the nodes of ``a`` keep whichever intervals of ``b`` save most (any may go).

    Two interval partitions overlap without crossing (if ``a_i`` before ``a_j`` both keep a
    part of ``b_q``, ``b_p``, then ``b_p`` is not after ``b_q``), so the best matching is a
    longest-common-subsequence style DP over both in order, O(|a| · |b|)."""
    pre = np.concatenate(([0.0], np.cumsum(np.asarray(sizes, dtype=np.float64)))).tolist()
    sa, sb = (0, *a[:-1]), (0, *b[:-1])
    best = [0.0] * (len(b) + 1)
    for i in range(len(a)):
        prev_diag = 0.0
        for j in range(len(b)):
            lo, hi = max(sa[i], sb[j]), min(a[i], b[j])
            here = prev_diag + (pre[hi] - pre[lo] if hi > lo else 0.0)
            prev_diag = best[j + 1]
            best[j + 1] = max(best[j + 1], best[j], here)
    return int(round(pre[-1] - best[-1]))


# ---------------------------------------------------------------------- PMC (value iteration)


@dataclass(frozen=True)
class PmcModel:
    """What the projected costs are computed for: the units, their workload (loads decide
    which partitionings balance, sizes what a migration costs), θ, γ and the MTM."""

    units: Units
    workload: GroupWorkload  # per unit
    mtm: TransitionMatrix
    balance: float
    gamma: float = DEFAULT_GAMMA

    def __post_init__(self) -> None:
        _check_balance(self.balance)
        if not 0 <= self.gamma < 1:
            raise AssignmentError(f"the discount γ must be in [0, 1) for an infinite horizon; "
                                  f"got {self.gamma}")
        if self.workload.num_key_groups != self.units.count:
            raise AssignmentError("the PMC workload needs one entry per unit")
        if max(self.mtm.parallelisms) > self.units.count:
            raise AssignmentError(f"the MTM goes up to {max(self.mtm.parallelisms)} tasks but "
                                  f"there are only {self.units.count} units; use more units")

    @classmethod
    def of(cls, workload: GroupWorkload, mtm: TransitionMatrix, *, units: int | None = None,
           balance: float = 0.2, gamma: float = DEFAULT_GAMMA) -> PmcModel:
        """The model for a key-group ``workload`` merged into ``units`` even units."""
        u = Units.even(workload.num_key_groups, units)
        return cls(u, u.fold(workload), mtm, balance, gamma)

    def states(self) -> list[tuple[int, tuple[int, ...]]]:
        """Every balanced partitioning of the units for each MTM parallelism, as
        ``(parallelism, unit ends)``; ``AssignmentError`` when a parallelism has none."""
        w, _ = effective_loads(self.workload)
        out: list[tuple[int, tuple[int, ...]]] = []
        for p in self.mtm.parallelisms:
            found = [(p, e) for e in partitions(w.tolist(), p, self.balance)]
            if not found:
                raise AssignmentError(
                    f"no partitioning of {self.units.count} units into {p} intervals keeps "
                    f"every task within θ={self.balance:g}; raise the balance or use more units")
            out.extend(found)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"unit_bounds": list(self.units.bounds), "loads": list(self.workload.loads),
                "sizes": list(self.workload.sizes), "mtm": self.mtm.to_json(),
                "balance": self.balance, "gamma": self.gamma}


@dataclass(frozen=True)
class TransitionRow:
    """For one state: per next parallelism, its probability, the indices of that
    parallelism's states and the cost of migrating to each."""

    targets: tuple[tuple[float, np.ndarray, np.ndarray], ...]


def transition_row(model: PmcModel, states: Sequence[tuple[int, tuple[int, ...]]],
                   index: int) -> TransitionRow:
    """State ``index``'s transitions (``partition_cost`` to every state it may go to)."""
    p, ends = states[index]
    by_p: dict[int, list[int]] = {}
    for i, (q, _) in enumerate(states):
        by_p.setdefault(q, []).append(i)
    sizes = model.workload.sizes
    targets = []
    for q, prob in model.mtm.row(p).items():
        idx = np.asarray(by_p[q], dtype=np.int64)
        costs = np.asarray([partition_cost(sizes, ends, states[j][1]) for j in idx],
                           dtype=np.float64)
        targets.append((prob, idx, costs))
    return TransitionRow(tuple(targets))


def bellman(row: TransitionRow, values: np.ndarray, gamma: float) -> float:
    """One value-iteration update: ``sum_n' M[n, n'] · min_P' (c(P, P') + γ · C(P'))``."""
    return float(sum(prob * float(np.min(costs + gamma * values[idx]))
                     for prob, idx, costs in row.targets))


def iterate(sweep: Callable[[np.ndarray], np.ndarray], states: int, gamma: float,
            tolerance: float = 1e-6, max_iterations: int = 10_000) -> tuple[np.ndarray, int]:
    """Value iteration: from ``C = 0``, ``C = sweep(C)`` (one ``bellman`` update of every
    state, wherever it runs) until no value changes by more than ``tolerance`` x (1 + the
    largest); returns the values and the number of sweeps. ``AssignmentError`` if it has
    not converged by ``max_iterations``."""
    values = np.zeros(states)
    for it in range(1, max_iterations + 1):
        new = sweep(values)
        done = np.max(np.abs(new - values), initial=0.0) <= tolerance * (1 + np.max(new, initial=0))
        values = new
        if done:
            return values, it
    raise AssignmentError(f"value iteration did not converge in {max_iterations} iterations "
                          f"(γ={gamma}); lower γ or raise max_iterations")


def value_iteration(rows: Sequence[TransitionRow], gamma: float, tolerance: float = 1e-6,
                    max_iterations: int = 10_000) -> tuple[np.ndarray, int]:
    """``iterate`` over ``rows`` in this process."""
    return iterate(lambda v: np.asarray([bellman(r, v, gamma) for r in rows]), len(rows),
                   gamma, tolerance, max_iterations)


@dataclass(frozen=True)
class ProjectedCosts:
    """The PMC table: per parallelism, each balanced partitioning (interval ends in key
    groups) and its projected migration cost in bytes."""

    model: PmcModel
    entries: Mapping[int, tuple[tuple[tuple[int, ...], float], ...]]
    iterations: int = 0
    _index: dict[tuple[int, ...], float] = field(default_factory=dict, compare=False,
                                                 repr=False)

    def __post_init__(self) -> None:
        for rows in self.entries.values():
            for ends, cost in rows:
                self._index[tuple(ends)] = float(cost)

    @property
    def num_key_groups(self) -> int:
        return self.model.units.num_key_groups

    def candidates(self, parallelism: int) -> tuple[tuple[tuple[int, ...], float], ...]:
        """The partitionings into ``parallelism`` intervals and their projected costs."""
        if parallelism not in self.entries:
            raise AssignmentError(
                f"the projected-cost table has no partitionings for {parallelism} tasks (it "
                f"covers {', '.join(map(str, sorted(self.entries)))}); pre-compute it with an "
                "MTM that includes that parallelism")
        return self.entries[parallelism]

    def cost_of(self, ends: Sequence[int]) -> float | None:
        """The projected cost of a partitioning (interval ends in key groups), if stored."""
        return self._index.get(tuple(ends))

    @classmethod
    def compute(cls, model: PmcModel, tolerance: float = 1e-6,
                max_iterations: int = 10_000) -> ProjectedCosts:
        """The table by value iteration in this process (``migration.pmc`` runs the same
        on Spark)."""
        states = model.states()
        rows = [transition_row(model, states, i) for i in range(len(states))]
        values, its = value_iteration(rows, model.gamma, tolerance, max_iterations)
        return cls.of_states(model, states, values.tolist(), its)

    @classmethod
    def of_states(cls, model: PmcModel, states: Sequence[tuple[int, tuple[int, ...]]],
                  values: Sequence[float], iterations: int) -> ProjectedCosts:
        entries: dict[int, list[tuple[tuple[int, ...], float]]] = {}
        for (p, ends), v in zip(states, values, strict=True):
            entries.setdefault(p, []).append((model.units.to_groups(ends), float(v)))
        return cls(model, {p: tuple(r) for p, r in entries.items()}, iterations)

    # -- storage
    def save(self, path: str) -> None:
        """Write the table as Parquet (see the module doc) with pyarrow."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = [(p, list(ends), cost) for p, r in self.entries.items() for ends, cost in r]
        table = pa.table({"parallelism": [r[0] for r in rows], "ends": [r[1] for r in rows],
                          "cost": [r[2] for r in rows]})
        pq.write_to_dataset(table, f"{path}/costs", partition_cols=["parallelism"],
                            existing_data_behavior="delete_matching")
        pq.write_table(pa.table({"meta": [self.meta_json()]}), f"{path}/meta.parquet")

    def meta_json(self) -> str:
        return json.dumps({"model": self.model.to_json(), "iterations": self.iterations})

    @classmethod
    def load(cls, path: str, parallelisms: Sequence[int] | None = None) -> ProjectedCosts:
        """Read a saved table (a local path or a pyarrow filesystem URI); ``parallelisms``:
        read only those partitions."""
        import pyarrow.dataset as ds
        import pyarrow.parquet as pq

        try:
            meta = json.loads(pq.read_table(f"{path}/meta.parquet").column("meta")[0].as_py())
            data = ds.dataset(f"{path}/costs", format="parquet", partitioning="hive")
        except (OSError, ValueError, KeyError) as exc:
            raise AssignmentError(f"cannot read the projected-cost table at {path!r} ({exc}); "
                                  "write one with migration.pmc (python -m migration.pmc)") from None
        flt = None if parallelisms is None else ds.field("parallelism").isin(list(parallelisms))
        t = data.to_table(filter=flt).to_pydict()
        m = meta["model"]
        mtm = TransitionMatrix(tuple(m["mtm"]["parallelisms"]),
                               tuple(tuple(r) for r in m["mtm"]["probabilities"]))
        model = PmcModel(Units(tuple(m["unit_bounds"])), GroupWorkload(
            tuple(m["loads"]), tuple(m["sizes"])), mtm, m["balance"], m["gamma"])
        entries: dict[int, list[tuple[tuple[int, ...], float]]] = {}
        for p, ends, cost in zip(t["parallelism"], t["ends"], t["cost"], strict=True):
            entries.setdefault(int(p), []).append((tuple(ends), float(cost)))
        return cls(model, {p: tuple(sorted(r)) for p, r in entries.items()},
                   int(meta["iterations"]))


# ---------------------------------------------------------------------- MTM-aware


def mtm(old: Sequence[int], parallelism: int, workload: GroupWorkload,
        projected: ProjectedCosts, balance: float | None = None) -> AssignmentPlan:
    """The MTM-aware assignment (§5.2): among the table's partitionings into
    ``parallelism`` intervals that balance the *current* loads with θ (``balance``, default
    the table's), the one minimising the bytes moved now (exact labelling, reflow's model)
    plus γ x its projected cost. ``BalanceInfeasible`` when none balances."""
    o = _check_old(old, workload)
    if projected.num_key_groups != len(o):
        raise AssignmentError(f"the projected-cost table is for {projected.num_key_groups} key "
                              f"groups, the operator has {len(o)}")
    theta = projected.model.balance if balance is None else _check_balance(balance)
    gamma = projected.model.gamma
    w, note = effective_loads(workload)
    pre = np.concatenate(([0.0], np.cumsum(w)))
    cap = _cap(float(pre[-1]), parallelism, theta)
    sizes = np.asarray(workload.sizes, dtype=np.int64)
    total = int(sizes.sum())
    best: tuple[float, int, tuple[int, ...], float] | None = None
    considered = 0
    least = math.inf
    for ends, future in projected.candidates(parallelism):
        starts = np.asarray((0, *ends[:-1]))
        heaviest = float(np.max(pre[np.asarray(ends)] - pre[starts]))
        least = min(least, heaviest)
        if heaviest > cap:
            continue
        considered += 1
        new, kept = label_intervals(o, sizes, ends, parallelism)
        score = (total - kept) + gamma * future
        if best is None or (score, total - kept) < (best[0], best[1]):
            best = (score, total - kept, new, future)
    if best is None:
        shown = math.ceil((parallelism * least / float(pre[-1]) - 1) * 1e4) / 1e4
        raise BalanceInfeasible(
            f"mtm: none of the table's {len(projected.candidates(parallelism))} partitionings "
            f"into {parallelism} intervals keeps every task within (1 + {theta:g}) x the mean "
            f"of the current load; the smallest balance one of them meets is {shown:g} "
            "(pass it, use 'ssm', or pre-compute the table with finer units)",
            parallelism=parallelism, balance=theta, smallest_balance=max(0.0, shown))
    score, now, new, future = best
    reason = (f"MTM-aware (γ={gamma:g}, θ={theta:g}): {now} bytes move now + γ x {future:.0f} "
              f"projected = {score:.0f}, the least of {considered} balanced partitionings in "
              f"the table (units of {projected.model.units.count})")
    if note:
        reason += f"; {note}"
    return make_plan("mtm", o, new, parallelism, workload, reason, theta, gamma * future)


# ---------------------------------------------------------------------- OMS


def labelled_assignments(loads: Sequence[float], parallelism: int, balance: float
                         ) -> list[tuple[int, ...]]:
    """Every contiguous assignment to ``parallelism`` tasks (each task one non-empty range,
    in any order) that balances with θ."""
    out = []
    for ends in partitions(loads, parallelism, balance):
        for labels in itertools.permutations(range(parallelism)):
            out.append(ends_to_assignment(ends, labels))
    return out


def _move_costs(a: np.ndarray, b: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``out[i, j]``: bytes moved from assignment ``a[i]`` to ``b[j]``."""
    out = np.empty((len(a), len(b)))
    step = max(1, 4_000_000 // max(1, len(b) * a.shape[1]))
    for i in range(0, len(a), step):
        out[i:i + step] = (a[i:i + step, None, :] != b[None, :, :]) @ sizes
    return out


def oms(old: Sequence[int], parallelisms: Sequence[int], workload: GroupWorkload,
        balance: float | Sequence[float] = 0.2) -> tuple[AssignmentPlan, ...]:
    """The optimal migration sequence (§5.1): one plan per rescale in ``parallelisms``, the
    total bytes moved over all of them least among sequences of contiguous assignments that
    each balance with their θ (``balance``: one for all, or one per step). Exact; it
    enumerates every balanced labelled assignment of each step (``AssignmentError`` beyond
    ``OMS_MAX_STATES``), so it suits small numbers of key groups or units."""
    o = _check_old(old, workload)
    steps = [int(p) for p in parallelisms]
    if not steps:
        raise AssignmentError("oms needs at least one parallelism")
    thetas = ([_check_balance(balance)] * len(steps) if isinstance(balance, (int, float))
              else [_check_balance(b) for b in balance])
    if len(thetas) != len(steps):
        raise AssignmentError(f"{len(thetas)} balance values for {len(steps)} rescales")
    w, note = effective_loads(workload)
    sizes = np.asarray(workload.sizes, dtype=np.float64)
    stages: list[np.ndarray] = []
    for p, theta in zip(steps, thetas, strict=True):
        _check_counts(len(o), p)
        count = sum(1 for _ in partitions(w.tolist(), p, theta)) * math.factorial(p)
        if count > OMS_MAX_STATES:
            raise AssignmentError(f"oms: {count} balanced assignments to {p} tasks exceed "
                                  f"{OMS_MAX_STATES}; use fewer key groups (units), or ssm/mtm")
        states = labelled_assignments(w.tolist(), p, theta)
        if not states:
            raise BalanceInfeasible(f"oms: no contiguous assignment to {p} tasks balances "
                                    f"with θ={theta:g}", parallelism=p, balance=theta)
        stages.append(np.asarray(states, dtype=np.int64))
    # backward: value[j] = least bytes from state j of stage i to the end
    value = np.zeros(len(stages[-1]))
    nxt: list[np.ndarray] = []
    for i in range(len(stages) - 2, -1, -1):
        q = _move_costs(stages[i], stages[i + 1], sizes) + value[None, :]
        nxt.append(q.argmin(axis=1))
        value = q.min(axis=1)
    nxt.reverse()
    first = _move_costs(np.asarray([o]), stages[0], sizes)[0] + value
    j = int(first.argmin())
    chosen = [j]
    for i in range(len(stages) - 1):
        j = int(nxt[i][j])
        chosen.append(j)
    plans = []
    prev: tuple[int, ...] = o
    total = float(first.min())
    for i, (p, theta, j) in enumerate(zip(steps, thetas, chosen, strict=True)):
        new = tuple(stages[i][j].tolist())
        plans.append(make_plan(
            "oms", prev, new, p, workload,
            f"optimal sequence, rescale {i + 1} of {len(steps)} to {p} tasks under θ={theta:g};"
            f" {total:.0f} bytes over the whole sequence" + (f"; {note}" if note else ""),
            theta))
        prev = new
    return tuple(plans)
