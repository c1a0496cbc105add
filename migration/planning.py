"""Migration planning (Spacker): which moving key groups go when, and how.

Pure functions and values, no Ray and no I/O. A :class:`Planning` holds Spacker's three
knobs: *prioritisation* (the order of the moving key groups), *progressiveness* (how the
ordered groups are cut into sequential steps) and *replication* (plain knobs here; the
mechanics live elsewhere). :func:`plan_steps` turns a rescale (old and new assignment) into
a :class:`~migration.plan.MigrationPlan`: steps run one after another, each step a tuple of
:class:`~migration.plan.Subscale` values, one per (old owner, new owner) pair.
:func:`matching_steps` is Megaphone's matching-based batching (every task sends and
receives at most one group per step) and :func:`adaptive_planning` Spacker's default
strategy (§IV-C), choosing the knobs from a :class:`WorkloadProfile`;
:func:`measure_groups` reads the tasks' per-group counters (records, state bytes, keys) and
their distinct keys touched per second into :class:`MeasuredGroups` (input rate, state
access ratio, arrival order) and
:func:`adaptive_from_measures` runs the default strategy on them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from engine.dataflow.keygroups import moved_key_groups
from migration.plan import MigrationPlan, steps_from_chunks

PRIORITISATIONS = ("random", "hot-first", "arrival-order", "smallest-state-first")
PROGRESSIVENESS = ("all-at-once", "chunks", "one-by-one", "equal-transfer-time")
REPLICATIONS = ("none", "hot", "all")

PrioritisationFn = Callable[[Sequence["GroupProfile"]], Sequence[int]]


# ---------------------------------------------------------------------- values


@dataclass(frozen=True)
class GroupProfile:
    """What planning knows about one key group: recent load (records/s), state size
    (bytes) and ``arrival`` (order of its first record, lower = earlier)."""

    key_group: int
    load: float
    state_bytes: int
    arrival: int = 0

    def __post_init__(self) -> None:
        if self.key_group < 0:
            raise ValueError(f"GroupProfile.key_group must be >= 0, got {self.key_group}")
        if not self.load >= 0:  # also rejects NaN
            raise ValueError(
                f"GroupProfile.load of key group {self.key_group} must be >= 0 records/s, "
                f"got {self.load}")
        if self.state_bytes < 0:
            raise ValueError(
                f"GroupProfile.state_bytes of key group {self.key_group} must be >= 0, "
                f"got {self.state_bytes}")


@dataclass(frozen=True)
class Planning:
    """Spacker's knobs.

    * ``prioritisation``: one of :data:`PRIORITISATIONS` or a callable taking the moving
      groups' profiles and returning their key groups in migration order (a permutation,
      checked when used).
    * ``progressiveness``: one of :data:`PROGRESSIVENESS`; ``"chunks"`` uses ``chunk_size``
      groups per step, ``"equal-transfer-time"`` cuts steps of about equal bytes, each
      taking about ``chunk_seconds`` at ``bandwidth_bytes_per_s`` (at least one group each).
    * ``replication`` (one of :data:`REPLICATIONS`), ``replication_period_s``,
      ``replication_hot_fraction``: knobs only, read by the replication mechanism.
    * ``seed``: makes ``"random"`` prioritisation deterministic.
    """

    prioritisation: str | PrioritisationFn = "random"
    progressiveness: str = "all-at-once"
    chunk_size: int = 4
    chunk_seconds: float = 0.5
    bandwidth_bytes_per_s: float = 100e6
    replication: str = "none"
    replication_period_s: float = 5.0
    replication_hot_fraction: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        p = self.prioritisation
        if not callable(p) and p not in PRIORITISATIONS:
            raise ValueError(
                f"Planning.prioritisation {p!r} is unknown: use one of {PRIORITISATIONS} or a "
                "callable (profiles) -> key groups in order")
        if self.progressiveness not in PROGRESSIVENESS:
            raise ValueError(
                f"Planning.progressiveness {self.progressiveness!r} is unknown: use one of "
                f"{PROGRESSIVENESS}")
        if isinstance(self.chunk_size, bool) or not isinstance(self.chunk_size, int) \
                or self.chunk_size < 1:
            raise ValueError(
                f"Planning.chunk_size must be an int >= 1 (groups per step), got "
                f"{self.chunk_size!r}")
        if not self.chunk_seconds > 0 or math.isinf(self.chunk_seconds):
            raise ValueError(
                f"Planning.chunk_seconds must be a finite number > 0, got {self.chunk_seconds!r}")
        if not self.bandwidth_bytes_per_s > 0 or math.isinf(self.bandwidth_bytes_per_s):
            raise ValueError(
                "Planning.bandwidth_bytes_per_s must be a finite number > 0, got "
                f"{self.bandwidth_bytes_per_s!r}")
        if self.replication not in REPLICATIONS:
            raise ValueError(
                f"Planning.replication {self.replication!r} is unknown: use one of "
                f"{REPLICATIONS}")
        if not self.replication_period_s > 0:
            raise ValueError(
                "Planning.replication_period_s must be > 0 seconds, got "
                f"{self.replication_period_s!r}")
        if not 0 < self.replication_hot_fraction <= 1:
            raise ValueError(
                "Planning.replication_hot_fraction must be in (0, 1], got "
                f"{self.replication_hot_fraction!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"Planning.seed must be an int, got {self.seed!r}")

    def describe(self) -> str:
        """A short human description, e.g. ``"hot-first, chunks of 4"``."""
        prog = {
            "all-at-once": "all-at-once",
            "chunks": f"chunks of {self.chunk_size}",
            "one-by-one": "one-by-one",
            "equal-transfer-time":
                f"equal-transfer-time chunks of ~{self.chunk_seconds:g} s "
                f"at {_fmt_bytes(self.bandwidth_bytes_per_s)}/s",
        }[self.progressiveness]
        return f"{_prio_name(self)}, {prog}"


# ---------------------------------------------------------------------- ordering


def _filled(groups: Sequence[int], profiles: Mapping[int, GroupProfile] | None
            ) -> list[GroupProfile]:
    """Profiles of ``groups`` in order; a missing one is load 0, state 0, arrival = position."""
    profiles = profiles or {}
    out = []
    for pos, kg in enumerate(groups):
        p = profiles.get(kg)
        if p is None:
            p = GroupProfile(kg, 0.0, 0, pos)
        elif p.key_group != kg:
            raise ValueError(f"profiles[{kg}] describes key group {p.key_group}; key them by "
                             "their own key_group")
        out.append(p)
    return out


def order_groups(groups: Sequence[int], profiles: Mapping[int, GroupProfile] | None,
                 planning: Planning) -> tuple[int, ...]:
    """The groups in migration order by ``planning.prioritisation``.

    ``"hot-first"``: highest load first; ``"arrival-order"``: lowest arrival first;
    ``"smallest-state-first"``: fewest bytes first; ties by key group id. ``"random"``: a
    shuffle of the sorted groups seeded by ``planning.seed`` (same input set, same order).
    A callable gets the profiles (in ``groups`` order) and must return a permutation of
    ``groups``. Raises ValueError on duplicate groups or a bad callable result.
    """
    if len(set(groups)) != len(groups):
        raise ValueError("order_groups: groups contain duplicates; pass each key group once")
    filled = _filled(groups, profiles)
    p = planning.prioritisation
    if callable(p):
        result = tuple(p(filled))
        if sorted(result) != sorted(groups):
            missing = sorted(set(groups) - set(result))
            extra = sorted(set(result) - set(groups))
            raise ValueError(
                "the prioritisation callable must return a permutation of the moving key "
                f"groups; missing {missing[:8]}, unexpected {extra[:8]}, "
                f"{len(result)} returned for {len(groups)}")
        return result
    if p == "random":
        out = sorted(groups)
        random.Random(planning.seed).shuffle(out)
        return tuple(out)
    key: Callable[[GroupProfile], tuple[float, int]]
    if p == "hot-first":
        def key(g: GroupProfile) -> tuple[float, int]:
            return (-g.load, g.key_group)
    elif p == "arrival-order":
        def key(g: GroupProfile) -> tuple[float, int]:
            return (g.arrival, g.key_group)
    else:  # smallest-state-first
        def key(g: GroupProfile) -> tuple[float, int]:
            return (g.state_bytes, g.key_group)
    return tuple(g.key_group for g in sorted(filled, key=key))


def progressive_chunks(ordered: Sequence[int], profiles: Mapping[int, GroupProfile] | None,
                 planning: Planning) -> tuple[tuple[int, ...], ...]:
    """Cut ``ordered`` into consecutive non-empty chunks by ``planning.progressiveness``,
    keeping the order (the concatenation of the chunks is ``ordered``).

    ``"equal-transfer-time"``: with B the total bytes and T = chunk_seconds x bandwidth,
    n = ceil(B / T) chunks (1 when B is 0); a group goes to chunk floor(m / (B / n)) where m
    is the byte offset of its middle, so every chunk holds B / n bytes (<= T) give or take
    one group's size, and an oversized group is a chunk of its own.
    """
    ordered = tuple(ordered)
    if not ordered:
        return ()
    mode = planning.progressiveness
    if mode == "all-at-once":
        return (ordered,)
    if mode in ("chunks", "one-by-one"):
        k = planning.chunk_size if mode == "chunks" else 1
        return tuple(ordered[i:i + k] for i in range(0, len(ordered), k))
    sizes = [p.state_bytes for p in _filled(ordered, profiles)]
    total = sum(sizes)
    target = planning.chunk_seconds * planning.bandwidth_bytes_per_s
    if total == 0:
        return (ordered,)
    n = max(1, math.ceil(total / target))
    width = total / n
    chunks: list[list[int]] = []
    last_index = -1
    offset = 0
    for kg, size in zip(ordered, sizes, strict=True):
        index = min(n - 1, int((offset + size / 2) // width))
        if index != last_index:
            chunks.append([])
            last_index = index
        chunks[-1].append(kg)
        offset += size
    return tuple(tuple(c) for c in chunks)


# ---------------------------------------------------------------------- matching


def matching_steps(moves: Mapping[int, tuple[int, int]]) -> tuple[tuple[int, ...], ...]:
    """Megaphone-style matching batches: ``moves`` maps key group -> (old task, new task),
    its iteration order is the priority order.

    Guarantee: in every step each task sends at most one group and receives at most one
    (a task may do one of each); every group is in exactly one step; the number of steps is
    exactly the lower bound D = the most groups any single task sends or receives. This is
    a proper edge colouring of the bipartite multigraph senders x receivers with D colours
    (König): groups are coloured in priority order with the smallest colour free at both
    ends, and when none is, an alternating (Kempe) path is flipped to free one. Steps are
    then ordered by the earliest-priority group they hold and groups inside a step keep the
    priority order, so earlier groups tend to go in earlier steps (the first group is always
    in the first step). Raises ValueError for a "move" whose old and new task are equal.
    """
    order = list(moves)
    if not order:
        return ()
    senders: dict[int, int] = {}
    receivers: dict[int, int] = {}
    for kg in order:
        old, new = moves[kg]
        if old == new:
            raise ValueError(f"matching_steps: key group {kg} does not move (task {old} to "
                             "itself); pass only groups whose owner changes")
        senders[old] = senders.get(old, 0) + 1
        receivers[new] = receivers.get(new, 0) + 1
    degree = max(max(senders.values()), max(receivers.values()))
    # vertices: ("s", task) sends, ("r", task) receives; at[v][colour] = key group
    at: dict[tuple[str, int], dict[int, int]] = {}
    colour_of: dict[int, int] = {}

    def ends(kg: int) -> tuple[tuple[str, int], tuple[str, int]]:
        old, new = moves[kg]
        return ("s", old), ("r", new)

    def free(v: tuple[str, int]) -> list[int]:
        used = at.setdefault(v, {})
        return [c for c in range(degree) if c not in used]

    for kg in order:
        u, v = ends(kg)
        free_u, free_v = free(u), free(v)
        common = [c for c in free_u if c in free_v]
        if common:
            c = common[0]
        else:
            # a free at u (used at v), b free at v (used at u): flip the a/b path from v;
            # in a bipartite graph it never reaches u, so a becomes free at both ends.
            a, b = free_u[0], free_v[0]
            path: list[int] = []
            w, want = v, a
            while want in at[w]:
                e = at[w][want]
                path.append(e)
                x, y = ends(e)
                w = y if w == x else x
                want = b if want == a else a
            for e in path:
                for end in ends(e):
                    del at[end][colour_of[e]]
            for e in path:
                colour_of[e] = b if colour_of[e] == a else a
                for end in ends(e):
                    at[end][colour_of[e]] = e
            c = a
        colour_of[kg] = c
        at[u][c] = kg
        at[v][c] = kg
    rank = {kg: i for i, kg in enumerate(order)}
    classes: dict[int, list[int]] = {}
    for kg in order:
        classes.setdefault(colour_of[kg], []).append(kg)
    steps = sorted(classes.values(), key=lambda groups: rank[groups[0]])
    return tuple(tuple(s) for s in steps)


# ---------------------------------------------------------------------- plans


def plan_steps(operator: str, old_assignment: Sequence[int], new_assignment: Sequence[int],
               planning: Planning, profiles: Mapping[int, GroupProfile] | None = None, *,
               first_id: int = 0, matching: bool = False,
               old_parallelism: int | None = None, new_parallelism: int | None = None,
               protocol: str = "non-disruptive") -> MigrationPlan:
    """Plan a rescale of ``operator``: the groups whose owner changes, ordered by
    ``order_groups`` and cut into steps by ``progressive_chunks`` (or, with ``matching=True``, by
    ``matching_steps`` over that order, so every task sends and receives at most one group
    per step). Each step is split into one ``Subscale`` per (old, new) pair, pairs in order
    of their first group, groups in priority order; ids are consecutive from ``first_id``.
    """
    if len(old_assignment) != len(new_assignment):
        raise ValueError(
            f"plan_steps({operator!r}): old and new assignment cover {len(old_assignment)} and "
            f"{len(new_assignment)} key groups; both must list one task per key group")
    moved = moved_key_groups(old_assignment, new_assignment)
    order = order_groups(moved, profiles, planning)
    if matching:
        chunks = matching_steps({kg: (old_assignment[kg], new_assignment[kg]) for kg in order})
        how = f"{_prio_name(planning)}, matching (each task sends/receives <= 1 group per step)"
    else:
        chunks = progressive_chunks(order, profiles, planning)
        how = planning.describe()
    steps = steps_from_chunks(chunks, old_assignment, new_assignment, first_id)
    subscales = sum(len(step) for step in steps)
    reason = (f"{operator}: {len(moved)} key groups move in {len(steps)} steps "
              f"({subscales} subscales); {how}")
    old_p = old_parallelism if old_parallelism is not None else max(old_assignment, default=0) + 1
    new_p = new_parallelism if new_parallelism is not None else max(new_assignment, default=0) + 1
    return MigrationPlan(operator, protocol, old_p, new_p, tuple(old_assignment),
                         tuple(new_assignment), steps, reason, tuple(order))


def _prio_name(planning: Planning) -> str:
    p = planning.prioritisation
    return p if isinstance(p, str) else f"custom ({getattr(p, '__name__', 'callable')})"


# ---------------------------------------------------------------------- adaptive strategy


@dataclass(frozen=True)
class WorkloadProfile:
    """Spacker §IV-C's five workload inputs (plus bandwidth and, optionally, capacity).

    ``input_rate`` records/s into the operator; ``skew`` max group load / mean group load
    (1 = uniform); ``state_bytes_per_group`` mean state of a moving group; ``groups_to_move``;
    ``state_access_ratio`` the fraction of keys (state) touched per second, in [0, 1];
    ``capacity_rate`` records/s the operator sustains (when known, "high input rate" is
    relative to it).
    """

    input_rate: float
    skew: float
    state_bytes_per_group: float
    groups_to_move: int
    state_access_ratio: float
    bandwidth_bytes_per_s: float = 100e6
    capacity_rate: float | None = None

    def __post_init__(self) -> None:
        if not self.input_rate >= 0:
            raise ValueError(f"WorkloadProfile.input_rate must be >= 0, got {self.input_rate}")
        if not self.skew >= 0:
            raise ValueError(f"WorkloadProfile.skew must be >= 0 (max/mean load), got {self.skew}")
        if not self.state_bytes_per_group >= 0:
            raise ValueError("WorkloadProfile.state_bytes_per_group must be >= 0, got "
                             f"{self.state_bytes_per_group}")
        if self.groups_to_move < 0:
            raise ValueError(
                f"WorkloadProfile.groups_to_move must be >= 0, got {self.groups_to_move}")
        if not 0 <= self.state_access_ratio <= 1:
            raise ValueError("WorkloadProfile.state_access_ratio is a fraction in [0, 1], got "
                             f"{self.state_access_ratio}")
        if not self.bandwidth_bytes_per_s > 0:
            raise ValueError("WorkloadProfile.bandwidth_bytes_per_s must be > 0, got "
                             f"{self.bandwidth_bytes_per_s}")
        if self.capacity_rate is not None and not self.capacity_rate > 0:
            raise ValueError("WorkloadProfile.capacity_rate must be > 0 or None, got "
                             f"{self.capacity_rate}")

    @property
    def total_bytes(self) -> float:
        return self.state_bytes_per_group * self.groups_to_move

    @property
    def transfer_seconds(self) -> float:
        """Estimated time to send all moving state at the bandwidth."""
        return self.total_bytes / self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class AdaptiveThresholds:
    """Where "high"/"large" begins for :func:`adaptive_planning`. The paper leaves these
    relative to hardware and workload; the defaults suit reflow on one machine."""

    high_input_rate: float = 10_000.0  # records/s, used when capacity_rate is unknown
    high_load_fraction: float = 0.7  # input_rate / capacity_rate counted as high
    high_skew: float = 2.0  # max / mean group load
    large_state_bytes_per_group: float = 1024 * 1024
    all_at_once_max_s: float = 1.0  # total transfer time still "small state"
    few_groups: int = 8  # at most this many moving groups is "few"
    less_progressive_chunk_s: float = 0.5  # step length when less progressive
    low_state_access: float = 0.1
    replicate_fraction: float = 0.5  # the paper's "high ratio of keys to replicate"


@dataclass(frozen=True)
class PlanningDecision:
    """The knobs chosen and, per knob, why."""

    planning: Planning
    reason: str
    thresholds: AdaptiveThresholds = field(default_factory=AdaptiveThresholds)


def adaptive_planning(profile: WorkloadProfile,
                      thresholds: AdaptiveThresholds | None = None) -> PlanningDecision:
    """Spacker's default planning strategy (Mao, Zhang, Ma, "Spacker", §IV-C), in our words:

    * Prioritisation: hot-first when the input rate *and* the skew are both high (moving the
      hot groups first relieves the overloaded task and its backlog sooner, §V-C3) and the
      migration takes more than one step; random otherwise (when skew is low the order
      hardly matters and random costs nothing; all-at-once moves every group in the same
      step, so there is nothing to move first, and the adaptive plan is then the fixed
      all-at-once plan).
    * Progressiveness: small state -> all-at-once (finishes fastest at little cost); large
      state and few groups to move -> more progressive (one group per step: lowest spike,
      and with few groups the completion time stays competitive); large state and many
      groups -> less progressive (the paper uses chunks of 16; we cut chunks of about
      ``less_progressive_chunk_s`` of transfer each, "equal-transfer-time").
    * Replication: replicate a high ratio of keys (the paper: 50%) when state is large and
      the state-access ratio is low (replicas stay fresh cheaply and save the transfer);
      otherwise none (frequently changing state makes replicas expensive and stale). The
      paper does not say which half; our mechanism replicates the hottest fraction.

    "Large state" means a mean group state >= ``large_state_bytes_per_group`` or a total
    transfer longer than ``all_at_once_max_s`` (the paper's phase 1 vs 2: the same key size
    but more keys moving counts as larger state). "High input rate" is relative to
    ``capacity_rate`` when known.
    """
    t = thresholds or AdaptiveThresholds()
    p = profile
    # progressiveness
    size_text = (f"{_fmt_bytes(p.state_bytes_per_group)}/group, "
                 f"{_fmt_bytes(p.total_bytes)} ~ {p.transfer_seconds:.2g} s in total")
    large = (p.state_bytes_per_group >= t.large_state_bytes_per_group
             or p.transfer_seconds > t.all_at_once_max_s)
    chunk_seconds = 0.5
    if not large:
        prog = "all-at-once"
        prog_why = f"small state ({size_text}): all-at-once"
    elif p.groups_to_move <= t.few_groups:
        prog = "one-by-one"
        prog_why = (f"large state ({size_text}) and few groups to move ({p.groups_to_move}): "
                    "one-by-one (more progressive)")
    else:
        prog = "equal-transfer-time"
        chunk_seconds = t.less_progressive_chunk_s
        prog_why = (f"large state ({size_text}) and many groups to move ({p.groups_to_move}): "
                    f"equal-transfer-time chunks of ~{chunk_seconds:g} s (less progressive)")
    # prioritisation
    if p.capacity_rate is not None:
        rate_high = p.input_rate >= t.high_load_fraction * p.capacity_rate
        rate_text = (f"input rate {p.input_rate:.0f} rec/s is "
                     f"{p.input_rate / p.capacity_rate:.0%} of capacity")
    else:
        rate_high = p.input_rate >= t.high_input_rate
        rate_text = f"input rate {p.input_rate:.0f} rec/s"
    skew_high = p.skew >= t.high_skew
    if rate_high and skew_high and prog == "all-at-once":
        prio = "random"
        prio_why = (f"high {rate_text} and high skew ({p.skew:.1f}), but every group moves in "
                    "one step: random")
    elif rate_high and skew_high:
        prio = "hot-first"
        prio_why = f"high {rate_text} and high skew ({p.skew:.1f}): hot-first"
    elif skew_high:
        prio = "random"
        prio_why = f"skewed ({p.skew:.1f}) but low {rate_text}: random"
    else:
        prio = "random"
        prio_why = f"low skew ({p.skew:.1f}; {rate_text}): random"
    # replication
    access = f"state access {p.state_access_ratio:.0%}"
    if large and p.state_access_ratio < t.low_state_access:
        repl, fraction = "hot", t.replicate_fraction
        repl_why = f"large state and low {access}: replicate the hottest {fraction:.0%}"
    else:
        repl, fraction = "none", 0.2
        repl_why = ("no replication: " + ("small state" if not large else f"high {access}"))
    planning = Planning(prioritisation=prio, progressiveness=prog, chunk_seconds=chunk_seconds,
                        bandwidth_bytes_per_s=p.bandwidth_bytes_per_s, replication=repl,
                        replication_hot_fraction=fraction)
    return PlanningDecision(planning, f"{prio_why}; {prog_why}; {repl_why}.", t)


def arrival_ranks(loads: Mapping[int, float]) -> dict[int, int]:
    """Each group's rank in the order its next record is expected (0 first), from its
    measured arrival rate: records of a group arriving at ``λ`` per second are next due in
    ``1 / λ`` seconds on average, so the busiest group comes first and groups without
    records last (ties by key group id). Meces' "arrival order" moves the groups in the
    order their records will arrive, so the first records to wait find their state moved."""
    ranked = sorted(loads, key=lambda kg: (-loads[kg], kg))
    return {kg: i for i, kg in enumerate(ranked)}


def profiles_from_metrics(loads: Mapping[int, float], sizes: Mapping[int, int], *,
                          arrivals: Mapping[int, int] | None = None) -> dict[int, GroupProfile]:
    """One profile per key group named in ``loads`` or ``sizes`` (missing values are 0);
    ``arrival`` from ``arrivals``, else from the measured arrival rates (``arrival_ranks``
    of ``loads``, every group named)."""
    groups = sorted(set(loads) | set(sizes))
    if arrivals is None:
        arrivals = arrival_ranks({kg: float(loads.get(kg, 0.0)) for kg in groups})
    return {kg: GroupProfile(kg, float(loads.get(kg, 0.0)), int(sizes.get(kg, 0)),
                             int(arrivals.get(kg, i)))
            for i, kg in enumerate(groups)}


@dataclass(frozen=True)
class MeasuredGroups:
    """What the tasks' per-group counters (``GroupStats`` replies) say about an operator:
    ``loads`` records/s and ``sizes`` state bytes per key group, ``keys`` per key group
    where the tasks report it, ``seconds`` the longest span the records were counted over;
    ``touched`` the distinct keys per second the records of the tasks that counted them
    touched (their latest measuring window, summed; None: no task counted), and
    ``touched_groups`` those tasks' key groups (each of which reports its keys)."""

    loads: Mapping[int, float]
    sizes: Mapping[int, int]
    keys: Mapping[int, int]
    seconds: float
    touched: float | None = None
    touched_groups: frozenset[int] = frozenset()

    @property
    def input_rate(self) -> float:
        """Records/s into the operator (all its groups)."""
        return sum(self.loads.values())

    @property
    def state_access_ratio(self) -> float | None:
        """Spacker's ratio of state access (§IV-C: "proportion of keys accessed per
        second"): distinct keys touched per second over the keys holding state, over the
        groups that report their keys. Distinct, because that is what a replica has to
        catch up on: a key touched a thousand times since the last refresh is one entry
        of the delta. The tasks that counted distinct keys (``touched``) give theirs; for
        the others' groups the upper bound ``min(rate, keys)`` stands in (a record touches
        one key; a group cannot touch more keys than it has), which overstates the ratio
        when records repeat keys. None when no group reports its keys."""
        known = {kg: k for kg, k in self.keys.items() if k > 0}
        total = sum(known.values())
        if not total:
            return None
        touched = self.touched or 0.0
        touched += sum(min(self.loads.get(kg, 0.0), float(k)) for kg, k in known.items()
                       if kg not in self.touched_groups)
        return min(1.0, touched / total)

    @property
    def access_counted(self) -> bool:
        """Every group reporting its keys belongs to a task that counted distinct keys (the
        ratio is measured, not bounded by the records per second)."""
        known = [kg for kg, k in self.keys.items() if k > 0]
        return bool(known) and self.touched is not None and \
            all(kg in self.touched_groups for kg in known)

    def profiles(self) -> dict[int, GroupProfile]:
        """One profile per group, arrival order from the measured rates."""
        return profiles_from_metrics(self.loads, self.sizes)


def measure_groups(replies: Sequence[object]) -> MeasuredGroups:
    """Per-group load, size and key count from the tasks' ``GroupStats`` replies (anything
    with ``groups``: ``(key group, records, state bytes[, keys])`` tuples, and ``seconds``
    the records were counted over; a reply counted over no time gives load 0), and the
    distinct keys touched per second from those that say (``keys_touched`` >= 0 over
    ``touched_seconds`` > 0, every group of the reply with its keys: a task whose keys are
    unknown could not be set against them)."""
    loads: dict[int, float] = {}
    sizes: dict[int, int] = {}
    keys: dict[int, int] = {}
    longest = 0.0
    touched: float | None = None
    touched_groups: set[int] = set()
    for r in replies:
        seconds = float(getattr(r, "seconds", 0.0))
        longest = max(longest, seconds)
        mine = []
        for kg, records, size, *more in getattr(r, "groups", ()):
            loads[kg] = records / seconds if seconds > 0 else 0.0
            sizes[kg] = int(size)
            if more and more[0] is not None:
                keys[kg] = int(more[0])
            mine.append(kg)
        count = getattr(r, "keys_touched", -1)
        over = float(getattr(r, "touched_seconds", 0.0))
        if mine and count is not None and count >= 0 and over > 0 \
                and all(kg in keys for kg in mine):
            touched = (touched or 0.0) + count / over
            touched_groups.update(mine)
    return MeasuredGroups(loads, sizes, keys, longest, touched, frozenset(touched_groups))


def adaptive_from_measures(measured: MeasuredGroups, moved: Sequence[int], *,
                           capacity_rate: float | None = None,
                           bandwidth_bytes_per_s: float = 100e6,
                           thresholds: AdaptiveThresholds | None = None) -> PlanningDecision:
    """Spacker's default planning from what was measured: the input rate and skew from the
    groups' loads, the state per moving group from their sizes, the state access ratio from
    the distinct keys touched per second over their key counts
    (``MeasuredGroups.state_access_ratio``; bounded by the records per second where the
    tasks counted no distinct keys; unmeasured: 1.0, which never replicates; the reason says
    which) and the operator's ``capacity_rate`` (records/s it
    sustains: ``OperatorRates.capacity`` over the latest metrics window; None: unknown, "high
    input rate" is then absolute)."""
    ratio = measured.state_access_ratio
    if capacity_rate is not None and not capacity_rate > 0:
        capacity_rate = None
    workload = workload_from_profiles(
        measured.profiles(), moved, measured.input_rate,
        state_access_ratio=1.0 if ratio is None else ratio,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s, capacity_rate=capacity_rate)
    decision = adaptive_planning(workload, thresholds)
    notes = []
    if ratio is None:
        notes.append("state access not measured (the tasks report no keys per group): "
                     "counted as 100%")
    elif not measured.access_counted:
        notes.append("state access bounded by the records per second (distinct keys not "
                     "counted yet)")
    if capacity_rate is None:
        notes.append("capacity not measured: the input rate is judged absolute")
    if not notes:
        return decision
    return replace(decision, reason=f"{decision.reason} ({'; '.join(notes)})")


def workload_from_profiles(profiles: Mapping[int, GroupProfile], moved: Sequence[int],
                           input_rate: float, *, state_access_ratio: float = 1.0,
                           bandwidth_bytes_per_s: float = 100e6,
                           capacity_rate: float | None = None) -> WorkloadProfile:
    """A :class:`WorkloadProfile` from per-group profiles: skew = max / mean load over all
    profiled groups (1.0 when there is no load), state per group = mean over ``moved``
    (missing profiles count 0). Per-group profiles cannot see per-key access, so
    ``state_access_ratio`` is the caller's (``MeasuredGroups.state_access_ratio``); its
    default 1.0 never asks for replication."""
    loads = [p.load for p in profiles.values()]
    mean = sum(loads) / len(loads) if loads else 0.0
    skew = max(loads) / mean if mean > 0 else 1.0
    sizes = [profiles[kg].state_bytes if kg in profiles else 0 for kg in moved]
    per_group = sum(sizes) / len(sizes) if sizes else 0.0
    return WorkloadProfile(input_rate=input_rate, skew=skew, state_bytes_per_group=per_group,
                           groups_to_move=len(moved), state_access_ratio=state_access_ratio,
                           bandwidth_bytes_per_s=bandwidth_bytes_per_s,
                           capacity_rate=capacity_rate)


def _fmt_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"
