"""A mergeable latency histogram with fixed log buckets (pure; no Ray, no I/O).

Every ``LatencyHistogram`` has the same bucket layout, so histograms from different tasks,
processes or seconds merge exactly by adding counts. Buckets grow by 4% from 0.1 ms to
1,000 s; a quantile is reported as its bucket's geometric midpoint (clamped to the observed
min/max), so it is within ~2% of the true value. Two buckets sit below 0.1 ms: negative
values (clock skew between hosts) and [0, 0.1) ms (e.g. integer latencies of 0 ms); each is
represented by the mean of its values. Values at or above the top bound share one overflow
bucket, represented by the observed maximum.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

LOWEST_MS = 0.1
HIGHEST_MS = 1_000_000.0
GROWTH = 1.04
_LOG_GROWTH = math.log(GROWTH)
NUM_LOG_BUCKETS = math.ceil(math.log(HIGHEST_MS / LOWEST_MS) / _LOG_GROWTH)
NUM_BUCKETS = NUM_LOG_BUCKETS + 3  # [negative, [0, LOWEST), log buckets..., overflow]
_NEG = 0
_SMALL = 1
_FIRST_LOG = 2
_OVERFLOW = NUM_LOG_BUCKETS + 2
# Geometric midpoints of the log buckets: bucket _FIRST_LOG + i is [LOWEST*g^i, LOWEST*g^(i+1)).
_MIDPOINTS = LOWEST_MS * GROWTH ** (np.arange(NUM_LOG_BUCKETS, dtype=np.float64) + 0.5)
_WIRE_VERSION = 1


def _log_buckets(x: np.ndarray) -> np.ndarray:
    """Bucket indices of latencies ``x`` (ms, finite), vectorised."""
    idx = np.floor(np.log(np.maximum(x, LOWEST_MS) / LOWEST_MS) / _LOG_GROWTH).astype(np.int64)
    idx += _FIRST_LOG
    np.minimum(idx, _OVERFLOW, out=idx)
    return idx


# Integer latencies (ms timestamps subtracted, as sinks measure them) below this many ms are
# bucketed by table lookup rather than a log per value; the table is made by the same
# function, so both ways give the same bucket.
_INT_TABLE_MS = 1 << 16
_INT_BUCKETS = _log_buckets(np.arange(_INT_TABLE_MS, dtype=np.float64))
_INT_BUCKETS[0] = _SMALL  # 0 ms lies in [0, LOWEST_MS)


def _bucket_of(ms: float) -> int:
    if ms < LOWEST_MS:
        return _NEG if ms < 0 else _SMALL
    return min(_OVERFLOW, int(math.log(ms / LOWEST_MS) / _LOG_GROWTH) + _FIRST_LOG)


class LatencyHistogram:
    """Counts of latencies (ms) in fixed log buckets, plus exact count, sum, min and max.

    ``observe``/``observe_many`` add values (non-finite values are ignored); ``merge`` adds
    another histogram; ``to_wire``/``from_wire`` round-trip through msgpack-able lists.
    """

    __slots__ = ("_count", "_counts", "_max", "_min", "_neg_sum", "_small_sum", "_sum")

    def __init__(self) -> None:
        self._counts = np.zeros(NUM_BUCKETS, dtype=np.int64)
        self._count = 0
        self._sum = 0.0
        self._min = math.inf
        self._max = -math.inf
        self._neg_sum = 0.0  # sum of the values in the negative bucket
        self._small_sum = 0.0  # sum of the values in [0, LOWEST_MS)

    # -- recording -------------------------------------------------------------------------

    def observe(self, ms: float) -> None:
        """Record one latency in milliseconds."""
        ms = float(ms)
        if not math.isfinite(ms):
            return
        b = _bucket_of(ms)
        self._counts[b] += 1
        if b == _NEG:
            self._neg_sum += ms
        elif b == _SMALL:
            self._small_sum += ms
        self._count += 1
        self._sum += ms
        self._min = min(self._min, ms)
        self._max = max(self._max, ms)

    def observe_many(self, values: Iterable[float] | np.ndarray) -> None:
        """Record many latencies (ms) at once, vectorised. Integer arrays in [0, 65536) ms
        (what a sink gets from integer ms timestamps) take a table lookup instead of a log
        per value."""
        x = np.asarray(values if isinstance(values, np.ndarray) else list(values))
        if x.size == 0:
            return
        if x.dtype.kind in "iu":
            lo, hi = int(x.min()), int(x.max())
            if lo >= 0 and hi < _INT_TABLE_MS:
                # 0 ms lands in [0, LOWEST_MS), whose sum (of zeros) does not change
                self._counts += np.bincount(_INT_BUCKETS[x], minlength=NUM_BUCKETS)
                self._count += int(x.size)
                self._sum += float(x.sum())
                self._min = min(self._min, float(lo))
                self._max = max(self._max, float(hi))
                return
        x = x.astype(np.float64, copy=False)
        x = x[np.isfinite(x)]
        if x.size == 0:
            return
        idx = _log_buckets(x)
        under = x < LOWEST_MS
        if under.any():
            neg = x < 0
            small = under & ~neg
            idx[neg] = _NEG
            idx[small] = _SMALL
            self._neg_sum += float(x[neg].sum())
            self._small_sum += float(x[small].sum())
        self._counts += np.bincount(idx, minlength=NUM_BUCKETS)
        self._count += int(x.size)
        self._sum += float(x.sum())
        self._min = min(self._min, float(x.min()))
        self._max = max(self._max, float(x.max()))

    def observe_repeated(self, ms: float, n: int) -> None:
        """Record the latency ``ms`` ``n`` times: the same as ``observe_many([ms] * n)`` (the
        same bucket and extremes; the same sums for integer ``ms``, else up to rounding), at
        the cost of one value. A sink's batch whose records share one timestamp (a source's
        batch read at once) is one latency."""
        if n <= 0:
            return
        if type(ms) is int and 0 <= ms < _INT_TABLE_MS:
            b = int(_INT_BUCKETS[ms])
        else:
            ms = float(ms)
            if not math.isfinite(ms):
                return
            b = (_NEG if ms < 0 else _SMALL) if ms < LOWEST_MS else int(
                _log_buckets(np.array([ms], dtype=np.float64))[0])
        self._counts[b] += n
        total = ms * n
        if b == _NEG:
            self._neg_sum += total
        elif b == _SMALL:
            self._small_sum += total
        self._count += n
        self._sum += float(total)
        self._min = min(self._min, float(ms))
        self._max = max(self._max, float(ms))

    def copy(self) -> LatencyHistogram:
        """An independent histogram with the same observations."""
        return LatencyHistogram().merge(self)

    def merge(self, other: LatencyHistogram) -> LatencyHistogram:
        """Add ``other``'s observations to this histogram (in place); returns self."""
        self._counts += other._counts
        self._count += other._count
        self._sum += other._sum
        self._neg_sum += other._neg_sum
        self._small_sum += other._small_sum
        self._min = min(self._min, other._min)
        self._max = max(self._max, other._max)
        return self

    def since(self, earlier: LatencyHistogram) -> LatencyHistogram:
        """The observations made after ``earlier``, a previous snapshot of this same
        cumulative histogram (counts subtracted; a bucket that went down counts 0). The
        exact min and max of the difference are unknown: they are its lowest and highest
        non-empty buckets' representative values, clamped to this histogram's range."""
        out = LatencyHistogram()
        counts = np.maximum(self._counts - earlier._counts, 0)
        n = int(counts.sum())
        if n == 0:
            return out
        reps = self._representatives()
        nz = np.flatnonzero(counts)
        out._counts = counts
        out._count = n
        out._neg_sum = max(0.0, self._neg_sum - earlier._neg_sum)
        out._small_sum = max(0.0, self._small_sum - earlier._small_sum)
        out._sum = max(0.0, self._sum - earlier._sum)
        out._min = float(reps[nz[0]])
        out._max = float(reps[nz[-1]])
        return out

    # -- reading ---------------------------------------------------------------------------

    @property
    def count(self) -> int:
        return self._count

    @property
    def sum_ms(self) -> float:
        return self._sum

    @property
    def sum_seconds(self) -> float:
        """Sum of all observations in seconds (a Prometheus histogram's ``_sum``)."""
        return self._sum / 1000.0

    @property
    def mean(self) -> float:
        """Mean latency (ms); 0.0 when empty."""
        return self._sum / self._count if self._count else 0.0

    @property
    def max(self) -> float:
        """Largest latency observed (ms), exact; 0.0 when empty."""
        return self._max if self._count else 0.0

    @property
    def min(self) -> float:
        """Smallest latency observed (ms), exact; 0.0 when empty."""
        return self._min if self._count else 0.0

    def _representatives(self) -> np.ndarray:
        """One value per bucket, non-decreasing, each within its bucket's observed range."""
        reps = np.empty(NUM_BUCKETS, dtype=np.float64)
        neg, small = int(self._counts[_NEG]), int(self._counts[_SMALL])
        reps[_NEG] = self._neg_sum / neg if neg else 0.0
        reps[_SMALL] = self._small_sum / small if small else 0.0
        reps[_FIRST_LOG:_OVERFLOW] = _MIDPOINTS
        reps[_OVERFLOW] = self._max if self._counts[_OVERFLOW] else HIGHEST_MS
        if self._count:
            np.clip(reps, self._min, self._max, out=reps)
        return np.maximum.accumulate(reps)

    def quantile(self, q: float) -> float:
        """The q-quantile (0 <= q <= 1) in ms, within ~2% (exact at q=0 and q=1); 0.0 when
        empty. Uses the nearest rank: the smallest value with at least ceil(q*count)
        observations at or below it."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile q must be in [0, 1], got {q!r}")
        if self._count == 0:
            return 0.0
        if q == 0.0:
            return self._min
        if q == 1.0:
            return self._max
        rank = max(1, math.ceil(q * self._count))
        bucket = int(np.searchsorted(np.cumsum(self._counts), rank, side="left"))
        return float(self._representatives()[bucket])

    def cumulative_buckets(self, bounds_seconds: Sequence[float]) -> list[int]:
        """For each upper bound (seconds, ascending; ``math.inf`` allowed), how many
        observations are <= it, as a Prometheus histogram's ``le`` buckets. A bucket that
        straddles a bound counts as below it when its representative value is, so each
        count is exact up to one bucket (~4%) around the bound."""
        bounds = [float(b) for b in bounds_seconds]
        if any(b2 < b1 for b1, b2 in itertools.pairwise(bounds)):
            raise ValueError("cumulative_buckets: bounds must be in ascending order")
        if not bounds:
            return []
        cum = np.cumsum(self._counts)
        cut = np.searchsorted(self._representatives(), np.asarray(bounds) * 1000.0, side="right")
        return [int(cum[k - 1]) if k > 0 else 0 for k in cut.tolist()]

    # -- wire ------------------------------------------------------------------------------

    def to_wire(self) -> list[Any]:
        """A msgpack-able list (sparse counts): ``from_wire`` rebuilds an equal histogram."""
        nz = np.flatnonzero(self._counts)
        return [
            _WIRE_VERSION, LOWEST_MS, GROWTH, NUM_BUCKETS,
            nz.tolist(), self._counts[nz].tolist(),
            self._count, self._sum, self._neg_sum, self._small_sum,
            self._min if self._count else None, self._max if self._count else None,
        ]

    @classmethod
    def from_wire(cls, wire: Sequence[Any]) -> LatencyHistogram:
        """Rebuild a histogram from ``to_wire()`` output; ValueError on another layout."""
        if len(wire) != 12 or wire[0] != _WIRE_VERSION:
            raise ValueError("not a LatencyHistogram wire value (or an unknown version)")
        _, lowest, growth, num_buckets, idx, counts, count, total, neg, small, lo, hi = wire
        if (lowest, growth, num_buckets) != (LOWEST_MS, GROWTH, NUM_BUCKETS):
            raise ValueError(
                f"LatencyHistogram layout mismatch: wire has lowest={lowest} growth={growth} "
                f"buckets={num_buckets}, this build has {LOWEST_MS}/{GROWTH}/{NUM_BUCKETS}"
            )
        h = cls()
        if idx:
            h._counts[np.asarray(idx, dtype=np.int64)] = np.asarray(counts, dtype=np.int64)
        h._count = int(count)
        h._sum = float(total)
        h._neg_sum = float(neg)
        h._small_sum = float(small)
        if h._count:
            h._min = float(lo)
            h._max = float(hi)
        return h

    def __repr__(self) -> str:
        return (
            f"LatencyHistogram(count={self._count}, mean={self.mean:.3f}ms, "
            f"p50={self.quantile(0.5):.3f}ms, p99={self.quantile(0.99):.3f}ms, "
            f"max={self.max:.3f}ms)"
        )
