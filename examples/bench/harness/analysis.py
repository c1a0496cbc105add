"""The numbers every benchmark computes from what reached its sink: pure functions, no Ray.

Why one module: the benchmarks judge a run by the same rules (the scaling period, the
baseline level, peaks, the throughput dip, gaps in the output; examples/bench/README.md, "How
a run is judged"), so a rule changes in one place and is unit-tested once on synthetic series
(``tests/unit/test_bench_rescale.py``).

Format. A *second* is a row ``{"second": int, "count": int, "mean_ms", "p50_ms", "p99_ms",
"max_ms"}`` describing the records that reached the sink in that wall-clock second (latency =
arrival - record timestamp); the ms fields are None when ``count`` is 0 (``p50_ms`` may be
absent in synthetic rows). A *series* is a list of rows, or a dict ``second -> row``.
``per_s`` is a dict ``second -> engine.observability.latency.LatencyHistogram`` (what
``harness.jobs.latency_seconds`` reads from a ``LatencySink``).

* ``histogram_rows``, ``merged``, ``latency_stats``: per-second histograms to rows, merged
  spans and percentile dicts.
* ``dense``, ``window``, ``weighted_mean``, ``level``, ``rate``: per-second series.
* ``scaling_period``: from the rescale request until latency stays within ``tolerance``
  (110 %) of the pre-rescale level for ``stable_s`` consecutive seconds, the stable window
  starting no earlier than the second the rescale completed (examples/bench/README.md).
* ``measure``: every figure of one rescale run (baseline, scaling period, settle, peak,
  spike, dip, tail), the one definition the rescale and planning benchmarks share.
* ``peaks``, ``throughput_dip``: worst second within a span.
* ``add_write``, ``merge_segments``, ``longest_gap``: output activity at the sink as
  ``[first, last]`` write-time segments (seconds) and the longest span without output.
* ``percentile``, ``median``, ``ratio``, ``records_to_cover``.

Guarantees: no function here reads a clock or sleeps; every result is a plain dict, list or
number (JSON-ready), None where the input has nothing to say.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from engine.observability import LatencyHistogram
from examples.bench.harness import BenchError

Row = Mapping[str, Any]
LATENCY_QUANTILES = (0.5, 0.99)

# ----------------------------------------------------------------------------- histograms


def _quantile_key(q: float) -> str:
    """0.5 -> "p50_ms", 0.99 -> "p99_ms", 0.999 -> "p999_ms"."""
    return "p" + f"{q * 100:g}".replace(".", "") + "_ms"


def latency_stats(h: LatencyHistogram, quantiles: Sequence[float] = LATENCY_QUANTILES,
                  digits: int | None = None) -> dict[str, Any]:
    """``count``, ``mean_ms``, ``max_ms`` and one ``pNN_ms`` per quantile of ``h`` (the
    quantiles within ~2 %, mean and max exact); the ms fields are None when ``h`` is empty,
    rounded to ``digits`` when given."""
    keys = ["mean_ms", "max_ms", *(_quantile_key(q) for q in quantiles)]
    if h.count == 0:
        return {"count": 0, **dict.fromkeys(keys)}
    vals = [h.mean, h.max, *(h.quantile(q) for q in quantiles)]
    if digits is not None:
        vals = [round(v, digits) for v in vals]
    return {"count": h.count, **dict(zip(keys, vals, strict=True))}


def merged(per_s: Mapping[int, LatencyHistogram], lo: float | None = None,
           hi: float | None = None) -> LatencyHistogram:
    """One histogram of the seconds ``lo <= s < hi`` (either bound None: open)."""
    h = LatencyHistogram()
    for s, hs in per_s.items():
        if (lo is None or s >= lo) and (hi is None or s < hi):
            h.merge(hs)
    return h


def histogram_rows(per_s: Mapping[int, LatencyHistogram]) -> dict[int, dict[str, Any]]:
    """Second -> row (see the module docstring) for every second with records."""
    return {s: {"second": s, "count": h.count, **latency_stats(h)}
            for s, h in sorted(per_s.items()) if h.count}


# ----------------------------------------------------------------------------- series


def empty_row(second: int) -> dict[str, Any]:
    return {"second": second, "count": 0, "mean_ms": None, "p50_ms": None, "p99_ms": None,
            "max_ms": None}


def by_second(rows: Iterable[Row] | Mapping[int, Row]) -> dict[int, Row]:
    """Second -> row, from rows or from a mapping of them (``histogram_rows``'s)."""
    if isinstance(rows, Mapping):
        return {int(s): r for s, r in rows.items()}
    return {int(r["second"]): r for r in rows}


def dense(rows: Iterable[Row] | Mapping[int, Row], lo: int, hi: int) -> list[dict[str, Any]]:
    """One row per second ``lo <= s < hi``; seconds without a row get an empty row."""
    by = by_second(rows)
    return [dict(by[s]) if s in by else empty_row(s) for s in range(lo, hi)]


def window(rows: Iterable[Row] | Mapping[int, Row], lo: int, hi: int) -> list[Row]:
    """The rows of seconds ``lo <= s < hi`` that have records, ascending."""
    by = by_second(rows)
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
    by = by_second(rows)
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

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise BenchError(f"a scaling period ends ({self.end}) before it starts "
                             f"({self.start}); pass seconds in order")

    @property
    def seconds(self) -> int:
        return self.end - self.start

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": self.seconds}


def settled(rows: Iterable[Row] | Mapping[int, Row], since_s: int, now_s: int, *,
            window: int = 3, tolerance: float = 1.25, slack_ms: float = 5.0) -> bool:
    """Whether latency has settled after the second ``since_s``: each of the ``window``
    whole seconds before ``now_s`` (exclusive) has records and a mean within ``tolerance``
    x the lowest per-second mean since ``since_s`` + ``slack_ms``. A backlog still
    draining (latency falling) or growing (rising) is not settled; neither is a span
    shorter than ``window`` seconds."""
    by = by_second(rows)
    last = range(now_s - window, now_s)
    if now_s - window < since_s or any(not by.get(s, {}).get("count") for s in last):
        return False
    means = [by[s]["mean_ms"] for s in range(since_s, now_s)
             if by.get(s, {}).get("count") and by[s]["mean_ms"] is not None]
    limit = tolerance * min(means) + slack_ms
    return all(by[s]["mean_ms"] <= limit for s in last)


def source_backlog(handle: Any) -> int:
    """Records due at the job's source tasks and not read yet (``TaskMetrics.
    source_backlog``; one metrics call)."""
    return sum(t.source_backlog or 0 for t in handle.metrics().tasks)


def settled_run(handle: Any, rows: Iterable[Row] | Mapping[int, Row], since_s: int,
                now_s: int, rate: float, *, backlog_s: float = 0.2) -> bool:
    """Whether a rescale run's job is in steady state after its build: its sources hold
    no more than ``backlog_s`` seconds of input due and unread (a backlog waiting at the
    source keeps latency high but can be flat, which ``settled`` alone takes for steady)
    and its latency has ``settled`` since ``since_s``."""
    return (settled(rows, since_s, now_s)
            and source_backlog(handle) <= max(1.0, rate * backlog_s))


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
    by = by_second(rows)
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


def measure(rows: Iterable[Row] | Mapping[int, Row], requested: float, completed: float,
            ended: float, *, baseline_s: float, stable_s: int, tolerance: float,
            slack_ms: float, empty_ok: bool = False) -> dict[str, Any]:
    """Every latency figure of one rescale run, from its per-second rows (wall seconds):

    * ``baseline``: the ``baseline_s`` whole seconds before the request second — weighted
      ``mean_ms``, ``level_ms`` (median of the per-second means: one noisy second of a shared
      machine does not move it), highest ``max_ms``, ``records_per_s``;
    * ``period``: the scaling period against the baseline level (``scaling_period``) and its
      weighted ``mean_ms``; ``settle``: the same rule against max(baseline level, level of the
      last ``stable_s`` seconds), i.e. until latency reaches its *new* level;
    * ``peak`` (``peaks`` of the period), ``spike`` (peak max / baseline level),
      ``spike_p99``, ``spike_over_weighted_mean``, ``baseline_spike`` (the baseline's own peak
      max / its level: the noise floor) and ``dip`` (``throughput_dip`` of the period);
    * ``tail_mean_ms``, ``tail_level_ms`` (last ``stable_s`` seconds) and ``post_request``
      (mean and records/s from the request to the end).

    ``ended`` is the time the run stopped observing (the second it fell in is not counted)."""
    by = by_second(rows)
    req_s, done_s, end_s = int(requested), int(completed), int(ended)
    b0 = req_s - int(baseline_s)
    base = window(by, b0, req_s)
    base_level = level(base)
    base_rate = rate(by, b0, req_s)
    kw = {"tolerance": tolerance, "stable_s": stable_s, "slack_ms": slack_ms,
          "empty_ok": empty_ok}
    period = scaling_period(by, req_s, done_s, base_level, end_s, **kw)
    tail = window(by, end_s - stable_s, end_s)
    tail_level = level(tail)
    settle_level = max((x for x in (base_level, tail_level) if x is not None), default=None)
    settle = scaling_period(by, req_s, done_s, settle_level, end_s, **kw)
    p_rows = window(by, period.start, period.end)
    pk = peaks(p_rows)
    base_max = peaks(base)["max_ms"]
    return {
        "baseline": {"from_second": b0, "to_second": req_s, "mean_ms": weighted_mean(base),
                     "level_ms": base_level, "max_ms": base_max, "records_per_s": base_rate},
        "period": {**period.as_dict(), "mean_ms": weighted_mean(p_rows)},
        "settle": settle.as_dict(),
        "peak": pk,
        "spike": ratio(pk["max_ms"], base_level),
        "spike_p99": ratio(pk["p99_ms"], base_level),
        "spike_over_weighted_mean": ratio(pk["max_ms"], weighted_mean(base)),
        "baseline_spike": ratio(base_max, base_level),
        "dip": throughput_dip(by, period.start, period.end, base_rate),
        "tail_mean_ms": weighted_mean(tail),
        "tail_level_ms": tail_level,
        "post_request": {"mean_ms": weighted_mean(window(by, req_s, end_s)),
                         "records_per_s": rate(by, req_s, end_s)},
    }


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
        raise BenchError(f"q must be within [0, 1]; got {q!r} (a percent? divide by 100)")
    pos = q * (len(xs) - 1)
    i = math.floor(pos)
    j = min(i + 1, len(xs) - 1)
    return xs[i] + (xs[j] - xs[i]) * (pos - i)


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``, None when either is missing or ``b`` is 0."""
    return None if a is None or b is None or b == 0 else a / b


def median(values: Iterable[float]) -> float | None:
    return percentile(values, 0.5)


def records_to_cover(keys: Sequence[Any] | Any, coverage: float) -> int | None:
    """How many records of the key sequence ``keys`` it takes until ``coverage`` (0-1] of the
    distinct keys it holds have appeared (None when ``keys`` is empty)."""
    import numpy as np

    if not 0.0 < coverage <= 1.0:
        raise BenchError(f"coverage is a share of the keys in (0, 1]; got {coverage!r}")
    arr = np.asarray(keys)
    if arr.size == 0:
        return None
    uniq, first = np.unique(arr, return_index=True)
    want = max(1, math.ceil(coverage * uniq.size))
    return int(np.sort(first)[want - 1]) + 1


def records_per_cpu_second(timeline: list[dict[str, Any]],
                           cpu_samples: list[tuple[float, float]]) -> dict[str, Any] | None:
    """Records at the sink per CPU-second of the job's actors, over the whole wall seconds
    of ``timeline`` (per-second rows: ``second``, ``count``) that lie inside the span of
    ``cpu_samples`` ((epoch s, cumulative CPU s)), the CPU interpolated at their bounds;
    None when no whole second fits (a run shorter than ~2 s)."""
    if len(cpu_samples) < 2:
        return None
    t0, t1 = cpu_samples[0][0], cpu_samples[-1][0]
    inner = [r for r in timeline if r["second"] >= t0 and r["second"] + 1 <= t1]
    if not inner:
        return None
    lo, hi = inner[0]["second"], inner[-1]["second"] + 1
    ts = [t for t, _ in cpu_samples]
    cs = [c for _, c in cpu_samples]
    import numpy as np

    cpu = float(np.interp(hi, ts, cs) - np.interp(lo, ts, cs))
    records = sum(r["count"] for r in inner if lo <= r["second"] < hi)
    return {"records": records, "cpu_s": cpu, "wall_s": hi - lo,
            "records_per_cpu_s": records / cpu if cpu > 0 else None,
            "cores": cpu / (hi - lo)}


def spread(values: Iterable[float | None]) -> dict[str, Any]:
    """``{median, min, max, n}`` of the values that are not None (Nones when none are)."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": median(xs), "min": xs[0], "max": xs[-1], "n": len(xs)}
