"""Pure helpers of the rescale benchmarks (``rescale.py``, ``rescale_drrs.py``).

No Ray and no engine imports: everything here works on plain numbers, so it is unit-tested
on synthetic series (``tests/test_bench_rescale.py``).

A *second* is a row ``{"second": int, "count": int, "mean_ms", "p99_ms", "max_ms"}`` that
describes the records that reached the sink in that wall-clock second (latency = arrival -
record timestamp); the ms fields are None when ``count`` is 0. A *series* is a list of rows,
or a dict ``second -> row``.

* ``dense``, ``window``, ``weighted_mean``, ``level``, ``rate``: per-second series.
* ``scaling_period``: DESIGN.md §11 — from the rescale request until latency stays within
  ``tolerance`` (110 %) of the pre-rescale level for ``stable_s`` consecutive seconds, the
  stable window starting no earlier than the second the rescale completed.
* ``peaks``, ``throughput_dip``: worst second within a span.
* ``add_write``, ``merge_segments``, ``longest_gap``: output activity at the sink as
  ``[first, last]`` write-time segments (seconds) and the longest span without output.
* ``percentile``, ``ratio``.
* ``group_loads``, ``task_loads``, ``imbalance``, ``balanced_assignment``: per-key-group load
  and an assignment that evens it while keeping most groups where they are.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

Row = Mapping[str, Any]

# ----------------------------------------------------------------------------- series


def empty_row(second: int) -> dict[str, Any]:
    return {"second": second, "count": 0, "mean_ms": None, "p99_ms": None, "max_ms": None}


def _by_second(rows: Iterable[Row] | Mapping[int, Row]) -> dict[int, Row]:
    if isinstance(rows, Mapping):
        return {int(s): r for s, r in rows.items()}
    return {int(r["second"]): r for r in rows}


def dense(rows: Iterable[Row] | Mapping[int, Row], lo: int, hi: int) -> list[dict[str, Any]]:
    """One row per second ``lo <= s < hi``; seconds without a row get an empty row."""
    by = _by_second(rows)
    return [dict(by[s]) if s in by else empty_row(s) for s in range(lo, hi)]


def window(rows: Iterable[Row] | Mapping[int, Row], lo: int, hi: int) -> list[Row]:
    """The rows of seconds ``lo <= s < hi`` that have records, ascending."""
    by = _by_second(rows)
    return [by[s] for s in sorted(by) if lo <= s < hi and by[s]["count"]]


def weighted_mean(rows: Iterable[Row], field: str = "mean_ms") -> float | None:
    """Mean latency over the records of several seconds (each second weighted by its count)."""
    n = 0
    total = 0.0
    for r in rows:
        c = r["count"]
        if c and r[field] is not None:
            n += c
            total += c * r[field]
    return total / n if n else None


def level(rows: Iterable[Row], field: str = "mean_ms") -> float | None:
    """The latency level of a span: the median of its per-second values (one noisy second
    does not move it)."""
    return median(r[field] for r in rows if r["count"] and r[field] is not None)


def rate(rows: Iterable[Row] | Mapping[int, Row], lo: int, hi: int) -> float | None:
    """Records per second at the sink over the seconds ``lo <= s < hi`` (empty ones count)."""
    if hi <= lo:
        return None
    by = _by_second(rows)
    return sum(by[s]["count"] for s in range(lo, hi) if s in by) / (hi - lo)


# ----------------------------------------------------------------------------- scaling period


@dataclass(frozen=True)
class Period:
    """Seconds ``start <= s < end`` of a scaling period; ``stabilized`` False when latency
    never stayed within the limit before the end of the run (``end`` is then the run's end)."""

    start: int
    end: int
    stabilized: bool
    limit_ms: float | None

    @property
    def seconds(self) -> int:
        return self.end - self.start

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": self.seconds}


def scaling_period(rows: Iterable[Row] | Mapping[int, Row], request_s: int, completed_s: int,
                   level_ms: float | None, end_s: int, *, tolerance: float = 1.10,
                   stable_s: int = 5, slack_ms: float = 0.0, field: str = "mean_ms",
                   empty_ok: bool = False) -> Period:
    """The scaling period: from the request second until the first second ``s`` (not before
    the completion second) from which ``stable_s`` seconds in a row all have
    ``field <= tolerance * level_ms + slack_ms``; the period is ``[request_s, s)``, at least
    the request second. ``end_s`` is exclusive: the first second not observed; a stable
    window must fit before it, else the period runs to ``end_s`` (``stabilized`` False).

    A second without records fails the window unless ``empty_ok`` (sparse outputs such as
    window results, where a stall shows as later high latency); a window still needs one
    second with records."""
    by = _by_second(rows)
    stable = max(1, int(stable_s))
    if level_ms is None:
        return Period(request_s, max(end_s, request_s + 1), False, None)
    limit = tolerance * level_ms + slack_ms

    def ok(s: int) -> bool | None:
        r = by.get(s)
        if r is None or not r["count"] or r[field] is None:
            return None if empty_ok else False
        return r[field] <= limit

    s = max(request_s, completed_s)
    while s + stable <= end_s:
        verdicts = [ok(x) for x in range(s, s + stable)]
        if all(v is not False for v in verdicts) and any(v for v in verdicts):
            return Period(request_s, max(s, request_s + 1), True, limit)
        s += 1
    return Period(request_s, max(end_s, request_s + 1), False, limit)


def peaks(rows: Iterable[Row]) -> dict[str, float | None]:
    """Worst second of a span: highest max, per-second p99 and per-second mean latency."""
    rows = [r for r in rows if r["count"]]
    return {
        "max_ms": max((r["max_ms"] for r in rows if r["max_ms"] is not None), default=None),
        "p99_ms": max((r["p99_ms"] for r in rows if r["p99_ms"] is not None), default=None),
        "mean_ms": max((r["mean_ms"] for r in rows if r["mean_ms"] is not None), default=None),
    }


def throughput_dip(rows: Iterable[Row] | Mapping[int, Row], lo: int, hi: int,
                   reference_per_s: float | None) -> dict[str, Any]:
    """Lowest per-second sink throughput over ``lo <= s < hi`` (a second without records
    counts as 0) and its ratio to ``reference_per_s`` (the pre-rescale mean)."""
    d = dense(rows, lo, hi)
    if not d:
        return {"min_per_s": None, "second": None, "ratio": None}
    low = min(d, key=lambda r: r["count"])
    return {"min_per_s": low["count"], "second": low["second"],
            "ratio": ratio(low["count"], reference_per_s)}


# ----------------------------------------------------------------------------- output gaps


def add_write(segments: list[list[float]], t: float, join_s: float) -> None:
    """Note output at time ``t`` (non-decreasing): extend the last ``[first, last]`` segment
    when ``t`` is within ``join_s`` of its end, else open a new one."""
    if segments and t - segments[-1][1] <= join_s:
        segments[-1][1] = max(segments[-1][1], t)
    else:
        segments.append([t, t])


def merge_segments(segments: Iterable[Sequence[float]], join_s: float = 0.0
                   ) -> list[tuple[float, float]]:
    """The union of activity segments (from several writers), sorted; segments closer than
    ``join_s`` are joined."""
    out: list[list[float]] = []
    for a, b in sorted((float(s[0]), float(s[1])) for s in segments):
        if out and a - out[-1][1] <= join_s:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def longest_gap(segments: Iterable[Sequence[float]], lo: float, hi: float) -> dict[str, Any]:
    """The longest time without output that overlaps ``[lo, hi]``: between two consecutive
    (merged) segments, or from the last output to ``hi``, or from ``lo`` to the first output
    when nothing came before it. Its full length counts, also the part outside the span."""
    merged = merge_segments(segments)
    best: tuple[float, float] | None = None

    def consider(a: float, b: float) -> None:
        nonlocal best
        if b > a and b >= lo and a <= hi and (best is None or b - a > best[1] - best[0]):
            best = (a, b)

    prev_end: float | None = None
    for a, b in merged:
        consider(lo if prev_end is None else prev_end, a)
        prev_end = b if prev_end is None else max(prev_end, b)
    consider(lo if prev_end is None else prev_end, hi)
    if best is None:
        return {"gap_s": 0.0, "from": None, "to": None}
    return {"gap_s": best[1] - best[0], "from": best[0], "to": best[1]}


# ----------------------------------------------------------------------------- numbers


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-quantile (0 <= q <= 1) with linear interpolation (numpy's default)."""
    xs = sorted(float(v) for v in values)
    if not xs:
        return None
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be within [0, 1]; got {q!r}")
    pos = q * (len(xs) - 1)
    i = math.floor(pos)
    j = min(i + 1, len(xs) - 1)
    return xs[i] + (xs[j] - xs[i]) * (pos - i)


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``, None when either is missing or ``b`` is 0."""
    return None if a is None or b is None or b == 0 else a / b


def median(values: Iterable[float]) -> float | None:
    return percentile(values, 0.5)


# ----------------------------------------------------------------------------- load balance


def group_loads(key_counts: Mapping[Any, float] | Sequence[float], key_group: Any,
                num_key_groups: int) -> list[float]:
    """Per-key-group load from per-key loads (a mapping key -> load, or a sequence indexed by
    key) and a function ``key -> key group``."""
    items = key_counts.items() if isinstance(key_counts, Mapping) else enumerate(key_counts)
    out = [0.0] * num_key_groups
    for k, v in items:
        if v:
            out[key_group(k)] += float(v)
    return out


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


def balanced_assignment(loads: Sequence[float], current: Sequence[int], parallelism: int,
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
        raise ValueError("loads and current assignment differ in length")
    if parallelism < 1:
        raise ValueError("parallelism must be >= 1")
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
        _, _, g, h = best
        new[g] = lo
        load[hi] -= w[g]
        load[lo] += w[g]
        if h is not None:
            new[h] = hi
            load[lo] -= w[h]
            load[hi] += w[h]
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
