"""Assignments: which task owns which key group after a rescale (pure functions).

Why: a rescale's cost is the state it moves, and its benefit the load balance it leaves;
both are decided by the target assignment, before any protocol runs. Flink's uniform
ranges move most groups on most rescales (8 -> 12 tasks moves 111 of 128); the optimal
single-step assignment of Ding et al. ("Optimal operator state migration for elastic data
stream processing", §4) moves the least state while every task stays within a load bound.

The model (the paper's, with key groups as its "tasks" and reflow's tasks as its "nodes"):
key groups ``0..m-1`` in key-group order, a per-group workload ``w`` (records/s, measured
by the tasks) and state size ``s`` (bytes). A target assignment over ``n'`` tasks gives each
task one contiguous, non-empty interval of groups; it *balances* with parameter θ when every
task's load is at most ``(1 + θ) · W / n'`` (``W`` the total). Its cost is the bytes of the
groups whose owner changes. reflow removes the highest-numbered tasks on a scale-in (tasks
``n'..n-1``) and numbers new tasks ``n..n'-1``, so a group stays put only when its task is
below ``min(n, n')`` and keeps it; the paper lets a scale-in remove any ``n - n'`` nodes.

Strategies (``AssignmentStrategy``; ``plan_assignment`` dispatches by name):

* ``uniform``: Flink's contiguous ranges of equal group count; ignores load and the current
  assignment;
* ``consistent-hashing``: the paper's baseline; each task has ``virtual_nodes`` points on a
  hash ring, a group belongs to the next point clockwise of its own hash; a rescale moves
  only groups of added or removed tasks, but neither the load nor the state sizes count;
* ``ssm``: the optimal single step (§4.3): the least bytes moved under θ, by an
  O(m²·n') dynamic program over interval ends (vectorised, and banded by the longest
  interval θ allows); ties go to the partition with the most even load;
* ``mtm`` (``migration.sequences``): the current cost plus the projected cost of the
  rescales a migration transition matrix predicts (§5.2), from a pre-computed table;
* ``balanced``: the benchmarks' heuristic for skew (moves few groups, any layout).

Every planner returns an ``AssignmentPlan``: a frozen value with the assignment, the bytes
it is predicted to move, the resulting max and mean task load, θ and a ``reason``.

Guarantees: deterministic; pure (no I/O, no clock); ``ssm``'s plan is minimal in bytes
moved among all contiguous assignments that balance with θ when the current assignment gives
each task one interval (as every strategy here except consistent hashing and ``balanced``
leaves it); otherwise its partition is optimal for a relaxation and its labelling exact,
and the reason says how far from the relaxation's bound it is. A θ that no contiguous
assignment meets raises ``BalanceInfeasible`` naming the smallest θ that would work.
"""

from __future__ import annotations

import hashlib
import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.dataflow.keygroups import uniform_assignment
from engine.errors import AssignmentError, BalanceInfeasible, RescaleRefused
from engine.names import AssignmentStrategy

DEFAULT_BALANCE = 0.2
DEFAULT_VIRTUAL_NODES = 64
_TOLERANCE = 1e-9  # relative slack on the load bound (θ given as the smallest works)
_TIE_WEIGHT = 0.25  # < 1 byte: the evenness tie-break never outweighs a byte of cost


# ---------------------------------------------------------------------- values


@dataclass(frozen=True)
class GroupWorkload:
    """Per key group, in key-group order: ``loads`` (records/s, or any work measure) and
    ``sizes`` (state bytes). Non-negative and finite."""

    loads: tuple[float, ...]
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        loads = tuple(float(x) for x in self.loads)
        sizes = tuple(int(x) for x in self.sizes)
        if len(loads) != len(sizes):
            raise AssignmentError(f"{len(loads)} loads and {len(sizes)} state sizes; give one "
                                  "of each per key group")
        if not loads:
            raise AssignmentError("a workload needs at least one key group")
        if any(not math.isfinite(x) or x < 0 for x in loads):
            raise AssignmentError("loads must be finite and >= 0")
        if any(x < 0 for x in sizes):
            raise AssignmentError("state sizes must be >= 0 bytes")
        object.__setattr__(self, "loads", loads)
        object.__setattr__(self, "sizes", sizes)

    @property
    def num_key_groups(self) -> int:
        return len(self.loads)

    @classmethod
    def even(cls, num_key_groups: int, load: float = 1.0, size: int = 1) -> GroupWorkload:
        """Every group alike: the model when nothing was measured."""
        return cls((load,) * num_key_groups, (size,) * num_key_groups)

    @classmethod
    def from_profiles(cls, profiles: Mapping[int, Any], num_key_groups: int) -> GroupWorkload:
        """From ``migration.planning.GroupProfile``s (``load``, ``state_bytes``) by key
        group; groups without a profile count 0."""
        loads = [0.0] * num_key_groups
        sizes = [0] * num_key_groups
        for kg, p in profiles.items():
            if 0 <= kg < num_key_groups:
                loads[kg] = float(p.load)
                sizes[kg] = int(p.state_bytes)
        return cls(tuple(loads), tuple(sizes))


@dataclass(frozen=True)
class AssignmentPlan:
    """A target assignment and what it costs: ``predicted_bytes`` of state whose owner
    changes (by the workload's sizes), ``max_load`` and ``mean_load`` of the tasks after it,
    the ``balance`` θ asked for (None: not enforced), ``projected_bytes`` (mtm: the
    discounted cost of the rescales expected after this one) and the ``reason``."""

    strategy: str
    parallelism: int
    old_assignment: tuple[int, ...]
    assignment: tuple[int, ...]
    predicted_bytes: int
    max_load: float
    mean_load: float
    reason: str
    balance: float | None = None
    projected_bytes: float | None = None

    def __post_init__(self) -> None:
        if self.parallelism < 1:
            raise AssignmentError(f"parallelism must be >= 1; got {self.parallelism}")
        if len(self.old_assignment) != len(self.assignment):
            raise AssignmentError("the old and new assignments differ in length")
        if any(not 0 <= t < self.parallelism for t in self.assignment):
            raise AssignmentError(f"the assignment names a task outside 0.."
                                  f"{self.parallelism - 1}")
        if self.predicted_bytes < 0:
            raise AssignmentError("predicted bytes must be >= 0")

    @property
    def moved(self) -> tuple[int, ...]:
        """Key groups whose owner changes."""
        return tuple(kg for kg, (a, b) in enumerate(zip(self.old_assignment, self.assignment,
                                                        strict=True)) if a != b)

    @property
    def load_ratio(self) -> float | None:
        """Max over mean task load (1.0 is even); None without load."""
        return None if self.mean_load <= 0 else self.max_load / self.mean_load

    def summary(self) -> str:
        ratio = self.load_ratio
        theta = "" if self.balance is None else f", θ={self.balance:g}"
        return (f"{self.strategy}: {len(self.moved)} key groups ({self.predicted_bytes} bytes) "
                f"move to reach {self.parallelism} tasks; max/mean load "
                f"{'n/a' if ratio is None else f'{ratio:.3f}'}{theta}")


# ---------------------------------------------------------------------- basic assignments


def uniform(num_key_groups: int, parallelism: int) -> tuple[int, ...]:
    """Contiguous ranges of (nearly) equal size, as Flink assigns key groups."""
    return uniform_assignment(num_key_groups, parallelism)


def _ring_point(label: str) -> int:
    return int.from_bytes(hashlib.blake2b(label.encode(), digest_size=8).digest(), "big")


def consistent_hashing(num_key_groups: int, parallelism: int,
                       virtual_nodes: int = DEFAULT_VIRTUAL_NODES) -> tuple[int, ...]:
    """Consistent hashing with virtual nodes: task ``t`` has points ``hash("t/v")`` for
    ``v < virtual_nodes`` on a 64-bit ring, key group ``kg`` the point ``hash("kg")``, and
    belongs to the task of the first point at or after it (wrapping). Adding or removing
    a task moves only the groups it gains or loses. A task may end up with no group."""
    _check_counts(num_key_groups, parallelism)
    if virtual_nodes < 1:
        raise AssignmentError(f"virtual_nodes must be >= 1; got {virtual_nodes}")
    ring = sorted((_ring_point(f"task {t}/{v}"), t) for t in range(parallelism)
                  for v in range(virtual_nodes))
    points = [p for p, _ in ring]
    out = []
    for kg in range(num_key_groups):
        i = bisect_left(points, _ring_point(f"key group {kg}"))
        out.append(ring[i % len(ring)][1])
    return tuple(out)


def rescale_target(old: Sequence[int], num_key_groups: int, parallelism: int,
                   given: Sequence[int] | None = None) -> tuple[int, ...]:
    """The assignment a rescale to ``parallelism`` goes to: ``given`` (a rebalance or a
    strategy's plan), else ``uniform``; empty for an operator without key groups."""
    if not old:
        return ()
    if given is not None:
        return tuple(given)
    return uniform(num_key_groups, parallelism)


def task_loads(loads: Sequence[float], assignment: Sequence[int], parallelism: int
               ) -> list[float]:
    out = [0.0] * parallelism
    for g, t in enumerate(assignment):
        out[t] += loads[g]
    return out


def imbalance(loads: Sequence[float], assignment: Sequence[int], parallelism: int
              ) -> float | None:
    """Highest task load over the mean task load (1.0 is perfectly even)."""
    t = task_loads(loads, assignment, parallelism)
    mean = sum(t) / parallelism
    return None if mean == 0 else max(t) / mean


def migration_bytes(old: Sequence[int], new: Sequence[int], sizes: Sequence[int]) -> int:
    """Bytes of the groups whose owner differs between ``old`` and ``new``."""
    return sum(int(s) for a, b, s in zip(old, new, sizes, strict=True) if a != b)


def balance_holds(loads: Sequence[float], assignment: Sequence[int], parallelism: int,
                  balance: float) -> bool:
    """Whether every task's load is within ``(1 + balance) · W / parallelism``."""
    cap = _cap(sum(loads), parallelism, balance)
    return max(task_loads(loads, assignment, parallelism)) <= cap


def _cap(total: float, parallelism: int, balance: float) -> float:
    cap = (1.0 + balance) * total / parallelism
    return cap * (1.0 + _TOLERANCE) + 1e-12


def _check_counts(num_key_groups: int, parallelism: int) -> None:
    if isinstance(parallelism, bool) or not 1 <= parallelism <= num_key_groups:
        raise AssignmentError(f"parallelism {parallelism} must be between 1 and the number of "
                              f"key groups ({num_key_groups})")


def _check_balance(balance: float) -> float:
    if isinstance(balance, bool) or not isinstance(balance, (int, float)) \
            or not math.isfinite(balance) or balance < 0:
        raise AssignmentError(f"balance (θ) must be a finite number >= 0; got {balance!r}")
    return float(balance)


def _check_old(old: Sequence[int], workload: GroupWorkload) -> tuple[int, ...]:
    o = tuple(int(t) for t in old)
    if len(o) != workload.num_key_groups:
        raise AssignmentError(f"the current assignment covers {len(o)} key groups and the "
                              f"workload {workload.num_key_groups}; give one of each per group")
    if any(t < 0 for t in o):
        raise AssignmentError("the current assignment has a negative task index")
    return o


def effective_loads(workload: GroupWorkload) -> tuple[np.ndarray, str]:
    """The loads the balance bound uses: the measured ones, or one unit per group when
    nothing was measured (a bound on group counts); with a note for the reason."""
    w = np.asarray(workload.loads, dtype=np.float64)
    if w.sum() <= 0:
        return np.ones_like(w), "no load measured: each key group counts as one unit of load"
    return w, ""


def make_plan(strategy: str, old: Sequence[int], new: Sequence[int], parallelism: int,
              workload: GroupWorkload, reason: str, balance: float | None = None,
              projected_bytes: float | None = None) -> AssignmentPlan:
    """An ``AssignmentPlan`` for ``new``, its cost and loads computed from ``workload``."""
    w, _ = effective_loads(workload)
    per_task = task_loads(w.tolist(), new, parallelism)
    return AssignmentPlan(
        str(strategy), parallelism, tuple(int(t) for t in old), tuple(int(t) for t in new),
        migration_bytes(old, new, workload.sizes), max(per_task), sum(per_task) / parallelism,
        reason, balance, projected_bytes)


# ---------------------------------------------------------------------- smallest θ


def smallest_balance(workload: GroupWorkload, parallelism: int) -> float:
    """The least θ for which some contiguous assignment of the groups to ``parallelism``
    non-empty intervals balances: ``n' · L* / W - 1``, where ``L*`` is the least possible
    heaviest interval (an exact min-max partition, O(m² · n'))."""
    m = workload.num_key_groups
    _check_counts(m, parallelism)
    w, _ = effective_loads(workload)
    pre = np.concatenate(([0.0], np.cumsum(w)))
    seg = pre[None, :] - pre[:, None]  # seg[x, x'] = load of [x, x')
    upper = np.triu(np.ones((m + 1, m + 1), dtype=bool), 1)
    seg = np.where(upper, seg, np.inf)
    best = np.full(m + 1, np.inf)
    best[0] = 0.0
    for _ in range(parallelism):
        best = np.min(np.maximum(best[:, None], seg), axis=0)
    total = float(pre[-1])
    return max(0.0, parallelism * float(best[m]) / total - 1.0)


def _infeasible(workload: GroupWorkload, parallelism: int, balance: float,
                what: str) -> BalanceInfeasible:
    least = smallest_balance(workload, parallelism)
    shown = math.ceil(least * 1e4) / 1e4
    w, _ = effective_loads(workload)
    heaviest = float(w.max() / w.sum())
    return BalanceInfeasible(
        f"{what}: no assignment of {workload.num_key_groups} key groups to {parallelism} tasks "
        f"in contiguous ranges keeps every task within (1 + {balance:g}) x the mean load "
        f"(the heaviest key group alone carries {heaviest:.1%} of it); the smallest balance "
        f"that works is {shown:g}: pass balance={shown:g} or more, or another parallelism",
        parallelism=parallelism, balance=balance, smallest_balance=shown)


# ---------------------------------------------------------------------- SSM


@dataclass(frozen=True)
class _Runs:
    """Maximal stretches of consecutive key groups with one owner."""

    of: np.ndarray      # run index per key group
    start: np.ndarray   # per run
    end: np.ndarray
    owner: np.ndarray

    @classmethod
    def of_assignment(cls, old: Sequence[int]) -> _Runs:
        a = np.asarray(old, dtype=np.int64)
        change = np.flatnonzero(a[1:] != a[:-1]) + 1
        start = np.concatenate(([0], change))
        end = np.concatenate((change, [len(a)]))
        return cls(np.concatenate(([0], np.cumsum(a[1:] != a[:-1]))), start, end, a[start])

    @property
    def one_per_task(self) -> bool:
        return len(set(self.owner.tolist())) == len(self.owner)


def _range_max(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(values[lo..hi]) elementwise (inclusive; 0 where lo > hi), by a sparse table."""
    q = len(values)
    table = [values.astype(np.float64)]
    span = 1
    while 2 * span <= q:
        prev = table[-1]
        table.append(np.maximum(prev[:-span], prev[span:]))
        span *= 2
    out = np.zeros(lo.shape)
    ok = lo <= hi
    length = np.where(ok, hi - lo + 1, 1)
    level = np.floor(np.log2(length)).astype(np.int64)
    for k, row in enumerate(table):
        sel = ok & (level == k)
        if sel.any():
            a = lo[sel]
            b = hi[sel] - (1 << k) + 1
            out[sel] = np.maximum(row[a], row[b])
    return out


@dataclass(frozen=True)
class _Band:
    """The DP's grid: interval ``[x, x')`` at row ``x'`` (``0..m``), column ``d = x' - x - 1``
    (``0..B-1``, ``B`` the longest interval that fits the cap); ``feasible`` marks real
    intervals within the cap, ``tie`` their evenness penalty (< 1 byte in total)."""

    xp: np.ndarray
    xc: np.ndarray
    feasible: np.ndarray
    tie: np.ndarray
    band: int

    @classmethod
    def of(cls, w: np.ndarray, cap: float) -> _Band | None:
        m = len(w)
        load_pre = np.concatenate(([0.0], np.cumsum(w)))
        reach = np.searchsorted(load_pre, load_pre[:-1] + cap, side="right") - 1
        longest = reach - np.arange(m)
        if longest.min() < 1:
            return None  # a key group alone exceeds the cap
        band = int(longest.max())
        xp = np.arange(m + 1)[:, None]
        x = xp - 1 - np.arange(band)[None, :]
        valid = x >= 0
        xc = np.where(valid, x, 0)
        feasible = valid & (xp <= reach[xc])
        seg = load_pre[np.broadcast_to(xp, xc.shape)] - load_pre[xc]
        tie = -_TIE_WEIGHT * (seg / float(load_pre[-1])) ** 2
        return cls(np.broadcast_to(xp, xc.shape), xc, feasible, tie, band)

    def walk(self, parallelism: int, options: Sequence[tuple[int, np.ndarray, np.ndarray]]
             ) -> tuple[list[tuple[int, int, int]], float] | None:
        """The DP over ``parallelism`` intervals with two states per end (``f`` in 0, 1).
        ``options``: ``(from f, gain grid, grid of "f' = 1")``. Returns the best path to
        ``(m, f=0)`` as ``(start, end, option)`` per interval, left to right, and its value;
        None when no path exists."""
        neg = -np.inf
        rows, band = self.xp.shape[0], self.band
        # per option, the gain with the evenness tie-break, -inf where infeasible; split by
        # the state it leads to; all options side by side (column = option * band + d)
        base = [np.where(self.feasible, gain + self.tie, neg) for _, gain, _ in options]
        to0 = np.concatenate([np.where(one, neg, b)
                              for b, (_, _, one) in zip(base, options, strict=True)], axis=1)
        to1 = np.concatenate([np.where(one, b, neg)
                              for b, (_, _, one) in zip(base, options, strict=True)], axis=1)
        state = np.concatenate([np.full(self.xc.shape, f) for f, _, _ in options], axis=1)
        start = np.concatenate([self.xc] * len(options), axis=1)
        dp = np.full((2, rows), neg)
        dp[0, 0] = 0.0
        choices: list[tuple[np.ndarray, np.ndarray]] = []
        idx = np.arange(rows)
        for _ in range(parallelism):
            prev = dp[state, start]
            c0, c1 = prev + to0, prev + to1
            a0, a1 = c0.argmax(axis=1), c1.argmax(axis=1)
            dp = np.stack((c0[idx, a0], c1[idx, a1]))
            choices.append((a0, a1))
        m = rows - 1
        if not np.isfinite(dp[0, m]):
            return None
        path: list[tuple[int, int, int]] = []
        pos, f = m, 0
        for a0, a1 in reversed(choices):
            option, length = divmod(int((a0 if f == 0 else a1)[pos]), band)
            path.append((pos - 1 - length, pos, option))
            pos, f = pos - 1 - length, options[option][0]
        assert pos == 0, "the DP's back-pointers do not end at key group 0"
        return path[::-1], float(dp[0, m])


def _ssm_partition(old: tuple[int, ...], sizes: np.ndarray, band: _Band,
                   parallelism: int) -> tuple[list[tuple[int, int, int]], float] | None:
    """The intervals of a max-gain partition as ``(start, end, option)``, left to right
    (``_Band.walk``; None if none fits the cap), and its DP value, exact when every task
    holds one range.

    The DP walks interval ends left to right. State ``(k, x, f)``: groups ``[0, x)`` cut
    into ``k`` intervals; ``f`` = the run of group ``x`` (its old owner's stretch) was
    already credited to an earlier interval. An interval ``[x, x')`` credits at most one
    run it meets: the one holding ``x'-1`` (then ``f' = 1`` when that run goes on past
    ``x'``), the one holding ``x`` (its part from ``x``, if not credited yet), or a run
    wholly inside. Positive credits never cross (intervals and runs are both in order),
    so with one run per task this is exactly the best matching of intervals to the
    surviving tasks (the paper's Lemmas 4.1-4.5 prune the same space differently)."""
    m = len(old)
    runs = _Runs.of_assignment(old)
    eligible = runs.owner < parallelism  # tasks n'..n-1 go away: their groups all move
    size_pre = np.concatenate(([0.0], np.cumsum(sizes, dtype=np.float64)))
    xp, xc, neg = band.xp, band.xc, -np.inf
    first = runs.of[xc]
    last = runs.of[np.maximum(xp - 1, 0)]
    same = first == last
    credit_last = np.where(eligible[last],
                           size_pre[xp] - size_pre[np.maximum(xc, runs.start[last])], neg)
    first_part = np.where(eligible[first] & ~same, size_pre[runs.end[first]] - size_pre[xc], neg)
    run_gain = np.where(eligible, size_pre[runs.end] - size_pre[runs.start], 0.0)
    inner = _range_max(run_gain, first + 1, last - 1)
    cont = np.zeros(m + 1, dtype=bool)
    cont[1:m] = runs.of[1:] == runs.of[:-1]
    cont2 = np.broadcast_to(cont[:, None], xc.shape)
    never = np.zeros(xc.shape, dtype=bool)
    return band.walk(parallelism, (
        (0, credit_last, cont2),                                    # credit the last run
        (1, np.where(same, neg, credit_last), cont2),               # ... it was not yet
        (0, np.maximum(np.maximum(first_part, inner), 0.0), never),  # another run, or none
        (1, np.maximum(inner, 0.0), same & cont2),                  # ... the first is taken
    ))


def _relaxed_partition(old: tuple[int, ...], sizes: np.ndarray, band: _Band,
                       parallelism: int) -> tuple[list[tuple[int, int, int]], float] | None:
    """For a task holding several ranges: the best partition when an interval may credit
    any task's bytes in it, even a task credited elsewhere too. Its value bounds the best
    real gain from above."""
    a = np.asarray(old)
    xp, xc = band.xp, band.xc
    best = np.zeros(xc.shape)
    for t in np.unique(a[a < parallelism]).tolist():
        pre = np.concatenate(([0.0], np.cumsum(np.where(a == t, sizes, 0.0))))
        np.maximum(best, pre[xp] - pre[xc], out=best)
    never = np.zeros(xc.shape, dtype=bool)
    return band.walk(parallelism, ((0, best, never),))


def max_weight_matching(gain: np.ndarray) -> list[int]:
    """A maximum-weight assignment of rows to distinct columns (``rows <= columns``): the
    column of each row. The Hungarian method with potentials (shortest augmenting paths,
    O(r² · c)), vectorised over the columns."""
    rows, cols = gain.shape
    if rows > cols:
        raise AssignmentError(f"cannot match {rows} rows to {cols} columns")
    cost = -np.asarray(gain, dtype=np.float64)
    u = np.zeros(rows + 1)
    v = np.zeros(cols + 1)
    owner = np.zeros(cols + 1, dtype=np.int64)  # 1-based row matched to each column; 0: none
    way = np.zeros(cols + 1, dtype=np.int64)
    for i in range(1, rows + 1):
        owner[0] = i
        j0 = 0
        minv = np.full(cols + 1, np.inf)
        used = np.zeros(cols + 1, dtype=bool)
        while True:
            used[j0] = True
            i0 = owner[j0]
            free = ~used
            free[0] = False
            cur = cost[i0 - 1] - u[i0] - v[1:]
            better = free[1:] & (cur < minv[1:])
            minv[1:][better] = cur[better]
            way[1:][better] = j0
            j1 = int(np.argmin(np.where(free, minv, np.inf)))
            delta = minv[j1]
            u[owner[used]] += delta
            v[used] -= delta
            minv[free] -= delta
            j0 = j1
            if owner[j0] == 0:
                break
        while j0:
            j1 = int(way[j0])
            owner[j0] = owner[j1]
            j0 = j1
    out = [0] * rows
    for j in range(1, cols + 1):
        if owner[j]:
            out[owner[j] - 1] = j - 1
    return out


def label_intervals(old: Sequence[int], sizes: Sequence[int] | np.ndarray, ends: Sequence[int],
                    parallelism: int) -> tuple[tuple[int, ...], int]:
    """The best task for each interval of a fixed partition (``ends``: the end of each
    interval, ascending, the last ``m``): a maximum-weight matching of the intervals to tasks
    ``0..parallelism-1``, the weight being the bytes of an interval its task already holds
    (tasks at or above ``parallelism`` hold nothing that stays). Returns the assignment and
    the bytes that stay."""
    a = np.asarray(old, dtype=np.int64)
    sz = np.asarray(sizes, dtype=np.float64)
    gain = np.zeros((len(ends), parallelism))
    start = 0
    for i, end in enumerate(ends):
        owners = a[start:end]
        keep = owners < parallelism
        np.add.at(gain[i], owners[keep], sz[start:end][keep])
        start = end
    cols = max_weight_matching(gain)
    out: list[int] = []
    start = 0
    for i, end in enumerate(ends):
        out.extend([cols[i]] * (end - start))
        start = end
    return tuple(out), int(round(sum(gain[i, c] for i, c in enumerate(cols))))


def _label_path(old: tuple[int, ...], sizes: np.ndarray, path: Sequence[tuple[int, int, int]],
                parallelism: int) -> tuple[tuple[int, ...], int]:
    """The assignment ``_ssm_partition``'s path credits (one range per task): each interval
    goes to the task of the run it credited, the others to the remaining tasks in order."""
    credited: list[int | None] = []
    gain = 0
    for a, b, option in path:
        best: tuple[int, int | None] = (0, None)  # (bytes, task)
        if option in (0, 1):  # the run holding b-1
            t = old[b - 1]
            if t < parallelism:
                best = (int(sum(sizes[j] for j in range(a, b) if old[j] == t)), t)
        else:  # a run ending inside: the first (option 2 only) or one wholly inside
            j = a
            while j < b:
                k = j
                while k < b and old[k] == old[j]:
                    k += 1
                t = old[j]
                if k < b and (j > a or option == 2) and t < parallelism:
                    got = int(sizes[j:k].sum())
                    if got > best[0]:
                        best = (got, t)
                j = k
        credited.append(best[1])
        gain += best[0]
    spare = iter(sorted(set(range(parallelism)) - {t for t in credited if t is not None}))
    out: list[int] = []
    for (a, b, _), owner in zip(path, credited, strict=True):
        out.extend([next(spare) if owner is None else owner] * (b - a))
    return tuple(out), gain


def ssm(old: Sequence[int], parallelism: int, workload: GroupWorkload,
        balance: float = DEFAULT_BALANCE) -> AssignmentPlan:
    """The optimal single-step migration (§4.3): among assignments of contiguous, non-empty
    key-group ranges to tasks ``0..parallelism-1`` whose loads stay within ``(1 + balance)
    · W / parallelism``, one that moves the fewest bytes (ties: the most even loads).
    ``BalanceInfeasible`` when none exists. See the module doc for the model."""
    o = _check_old(old, workload)
    m = workload.num_key_groups
    _check_counts(m, parallelism)
    theta = _check_balance(balance)
    w, note = effective_loads(workload)
    sizes = np.asarray(workload.sizes, dtype=np.int64)
    cap = _cap(float(w.sum()), parallelism, theta)
    band = _Band.of(w, cap)
    found = _ssm_partition(o, sizes.astype(np.float64), band, parallelism) if band else None
    if found is None:
        raise _infeasible(workload, parallelism, theta, "ssm")
    assert band is not None  # a partition was found in it
    total = int(sizes.sum())
    path = found[0]
    if _Runs.of_assignment(o).one_per_task:
        new, gain = _label_path(o, sizes, path, parallelism)
        parts = [f"optimal single step to {parallelism} tasks under θ={theta:g}: "
                 f"{total - gain} of {total} bytes move"]
    else:
        relaxed = _relaxed_partition(o, sizes.astype(np.float64), band, parallelism)
        assert relaxed is not None
        new, gain = max((label_intervals(o, sizes, [b for _, b, _ in p], parallelism)
                         for p in (path, relaxed[0])), key=lambda r: r[1])
        bound = int(round(relaxed[1] + _tie_of([b for _, b, _ in relaxed[0]], w)))
        parts = [f"single step to {parallelism} tasks under θ={theta:g}: {total - gain} of "
                 f"{total} bytes move; the current assignment gives a task several ranges, "
                 + ("and this is optimal (it meets the bound of a relaxation)" if gain >= bound
                    else f"so optimality is not proven: at most {bound - gain} bytes more "
                         "than the optimum")]
    if note:
        parts.append(note)
    return make_plan(AssignmentStrategy.SSM, o, new, parallelism, workload, "; ".join(parts),
                     theta)


def _tie_of(ends: Sequence[int], w: np.ndarray) -> float:
    total = float(w.sum())
    start, out = 0, 0.0
    for end in ends:
        out += _TIE_WEIGHT * (float(w[start:end].sum()) / total) ** 2
        start = end
    return out


# ---------------------------------------------------------------------- dispatch


def plan_uniform(old: Sequence[int], parallelism: int, workload: GroupWorkload,
                 balance: float | None = None) -> AssignmentPlan:
    """``uniform`` as a plan (θ, when given, is reported, not enforced)."""
    o = _check_old(old, workload)
    _check_counts(len(o), parallelism)
    new = uniform(len(o), parallelism)
    return make_plan(AssignmentStrategy.UNIFORM, o, new, parallelism, workload,
                     f"uniform ranges over {parallelism} tasks" + _theta_note(
                         new, parallelism, workload, balance), balance)


def plan_consistent_hashing(old: Sequence[int], parallelism: int, workload: GroupWorkload,
                            balance: float | None = None,
                            virtual_nodes: int = DEFAULT_VIRTUAL_NODES) -> AssignmentPlan:
    """``consistent_hashing`` as a plan (θ, when given, is reported, not enforced)."""
    o = _check_old(old, workload)
    new = consistent_hashing(len(o), parallelism, virtual_nodes)
    return make_plan(AssignmentStrategy.CONSISTENT_HASHING, o, new, parallelism, workload,
                     f"consistent hashing, {virtual_nodes} virtual nodes per task"
                     + _theta_note(new, parallelism, workload, balance), balance)


def _theta_note(new: Sequence[int], parallelism: int, workload: GroupWorkload,
                balance: float | None) -> str:
    if balance is None:
        return ""
    w, _ = effective_loads(workload)
    held = balance_holds(w.tolist(), new, parallelism, _check_balance(balance))
    return f"; θ={balance:g} {'holds' if held else 'does not hold'} (not enforced)"


def plan_assignment(strategy: str, old: Sequence[int], parallelism: int,
                    workload: GroupWorkload, *, balance: float | None = None,
                    projected: Any = None, virtual_nodes: int = DEFAULT_VIRTUAL_NODES
                    ) -> AssignmentPlan:
    """The plan of ``strategy`` (an ``AssignmentStrategy`` name) from ``old`` to
    ``parallelism`` tasks. ``balance``: θ (ssm and mtm enforce it, default
    ``DEFAULT_BALANCE``; uniform and consistent hashing only report it); ``projected``: the
    ``migration.sequences.ProjectedCosts`` table mtm needs."""
    try:
        s = AssignmentStrategy.parse(strategy, "assignment strategy")
    except ValueError as exc:
        raise AssignmentError(str(exc)) from None
    if s == AssignmentStrategy.UNIFORM:
        return plan_uniform(old, parallelism, workload, balance)
    if s == AssignmentStrategy.CONSISTENT_HASHING:
        return plan_consistent_hashing(old, parallelism, workload, balance, virtual_nodes)
    theta = DEFAULT_BALANCE if balance is None else balance
    if s == AssignmentStrategy.SSM:
        return ssm(old, parallelism, workload, theta)
    from migration.sequences import mtm  # the sequence planners build on this module

    if projected is None:
        raise AssignmentError("assignment 'mtm' needs the pre-computed projected costs "
                              "(migration.sequences.ProjectedCosts; see migration.pmc)")
    return mtm(old, parallelism, workload, projected, balance)


def _strategy(name: object) -> AssignmentStrategy:
    """The strategy ``name`` names; ``AssignmentError`` listing the choices otherwise."""
    try:
        return AssignmentStrategy.parse(name, "assignment strategy")
    except ValueError as exc:
        raise AssignmentError(str(exc)) from None


@dataclass(frozen=True)
class AssignmentSpec:
    """How a rescale chooses its target (``handle.rescale(op, n, assignment=..., balance=...,
    projected_costs=...)``): the ``strategy``, θ (``balance``: ssm and mtm enforce it;
    None: ``DEFAULT_BALANCE`` for ssm, the table's for mtm), mtm's ``projected`` table
    (a ``migration.sequences.ProjectedCosts``) and consistent hashing's ``virtual_nodes``."""

    strategy: AssignmentStrategy
    balance: float | None = None
    projected: Any = None
    virtual_nodes: int = DEFAULT_VIRTUAL_NODES

    def __post_init__(self) -> None:
        s = _strategy(self.strategy)
        object.__setattr__(self, "strategy", s)
        if self.balance is not None:
            object.__setattr__(self, "balance", _check_balance(self.balance))
        if s == AssignmentStrategy.MTM and self.projected is None:
            raise AssignmentError("assignment 'mtm' needs the pre-computed projected costs: "
                                  "pass projected_costs= (a directory written by "
                                  "python -m migration.pmc, or a ProjectedCosts)")
        if self.projected is not None and s != AssignmentStrategy.MTM:
            raise AssignmentError(f"projected costs are for assignment 'mtm', not {s!r}")
        if isinstance(self.virtual_nodes, bool) or self.virtual_nodes < 1:
            raise AssignmentError(f"virtual_nodes must be >= 1; got {self.virtual_nodes!r}")

    @classmethod
    def of(cls, strategy: str, balance: float | None = None,
           projected_costs: Any = None) -> AssignmentSpec:
        """The spec a request names (``handle.rescale``'s and ``Scale``'s ``assignment=``,
        ``balance=``, ``projected_costs=``): ``projected_costs`` a directory written by
        ``python -m migration.pmc`` (read here) or a ``ProjectedCosts``. ``AssignmentError``
        for a bad name, θ or table."""
        from migration.sequences import ProjectedCosts

        table = projected_costs
        if isinstance(table, str):
            table = ProjectedCosts.load(table)
        elif table is not None and not isinstance(table, ProjectedCosts):
            raise AssignmentError(f"projected_costs must be a directory written by python -m "
                                  f"migration.pmc or a ProjectedCosts; got "
                                  f"{type(table).__name__}")
        return cls(_strategy(strategy), balance, table)

    def check(self, num_key_groups: int) -> None:
        """``AssignmentError`` unless it fits an operator with ``num_key_groups`` groups."""
        if self.projected is not None and self.projected.num_key_groups != num_key_groups:
            raise AssignmentError(
                f"the projected-cost table was computed for {self.projected.num_key_groups} key "
                f"groups; this job has {num_key_groups}: pre-compute it with "
                f"--key-groups {num_key_groups}")

    def plan(self, old: Sequence[int], parallelism: int,
             workload: GroupWorkload) -> AssignmentPlan:
        """The target of a rescale from ``old`` to ``parallelism`` tasks."""
        return plan_assignment(self.strategy, old, parallelism, workload, balance=self.balance,
                               projected=self.projected, virtual_nodes=self.virtual_nodes)


def requested_strategy(name: str | None, balance: float | None = None,
                       projected_costs: Any = None) -> AssignmentSpec | None:
    """The ``AssignmentSpec`` a request names (the handle's ``rescale``/``rebalance``, a
    controller's ``Scale``/``Rebalance``); None without a name (uniform ranges).
    ``RescaleRefused`` for a bad name, θ or table, before the job is asked anything."""
    if name is None:
        if balance is not None or projected_costs is not None:
            raise RescaleRefused("balance and projected_costs need an assignment strategy: "
                                 "assignment='ssm' or 'mtm'")
        return None
    try:
        return AssignmentSpec.of(name, balance, projected_costs)
    except AssignmentError as exc:
        raise RescaleRefused(str(exc)) from None


# ---------------------------------------------------------------------- balanced (heuristic)


def balanced(loads: Sequence[float], current: Sequence[int], parallelism: int,
             theta: float = 0.05) -> tuple[int, ...]:
    """An assignment of key groups to ``parallelism`` tasks that evens the load while moving
    few groups. Groups of tasks that no longer exist go first, heaviest first, to the
    least-loaded task. Then, while the most-loaded task T carries more than
    ``(1 + theta)`` times the mean, the best single step between T and the least-loaded task
    U is taken: moving one group of T to U, or swapping a group of T with a lighter one of
    U, whichever brings the pair closest to even (a move wins a tie); it stops when no step
    lowers T's load. Finally a task left without groups takes the lightest group of the task
    holding the most (the parallelism is ``max(assignment) + 1``). Deterministic."""
    if len(loads) != len(current):
        raise AssignmentError(f"loads ({len(loads)}) and the current assignment "
                              f"({len(current)}) differ in length; pass one load per key group")
    if parallelism < 1:
        raise AssignmentError(f"parallelism must be >= 1; got {parallelism}")
    w = [float(x) for x in loads]
    new = [t if 0 <= t < parallelism else -1 for t in current]
    load = [0.0] * parallelism
    for g, t in enumerate(new):
        if t >= 0:
            load[t] += w[g]
    for g in sorted((g for g, t in enumerate(new) if t < 0), key=lambda g: (-w[g], g)):
        t = min(range(parallelism), key=lambda i: (load[i], i))
        new[g] = t
        load[t] += w[g]
    target = (1.0 + theta) * sum(w) / parallelism
    for _ in range(4 * len(w) + 16):
        hi = max(range(parallelism), key=lambda i: (load[i], -i))
        lo = min(range(parallelism), key=lambda i: (load[i], i))
        gap = load[hi] - load[lo]
        if load[hi] <= target or gap <= 0:
            break
        mine = [g for g, t in enumerate(new) if t == hi]
        theirs = [g for g, t in enumerate(new) if t == lo]
        best: tuple[float, int, int, int | None] | None = None  # (distance, kind, g, h)
        for g in mine:
            if 0 < w[g] < gap:
                cand = (abs(gap / 2 - w[g]), 0, g, None)
                best = cand if best is None or cand[:3] < best[:3] else best
            for h in theirs:
                d = w[g] - w[h]
                if 0 < d < gap:
                    cand2 = (abs(gap / 2 - d), 1, g, h)
                    if best is None or cand2[:3] < best[:3]:
                        best = cand2
        if best is None:
            break
        _, _, g, swap = best
        new[g] = lo
        load[hi] -= w[g]
        load[lo] += w[g]
        if swap is not None:
            new[swap] = hi
            load[lo] -= w[swap]
            load[hi] += w[swap]
    counts = [0] * parallelism
    for t in new:
        counts[t] += 1
    for t in range(parallelism):
        if counts[t] == 0:
            donor = max(range(parallelism), key=lambda i: (counts[i], -i))
            if counts[donor] < 2:
                break  # fewer groups than tasks
            g = min((g for g, o in enumerate(new) if o == donor), key=lambda g: (w[g], g))
            new[g] = t
            counts[donor] -= 1
            counts[t] += 1
    return tuple(new)
