"""Per-key-group load and key access of a task, counted cheaply enough to be always on (pure).

Why: rescale planning (``GroupStatsRequest``: the coordinator's plans, SSM and the skew
balancer) needs records per key group, so every keyed task counts them; counting every
record of every frame cost ~4% of a count task's CPU even when nothing ever rescaled
(``Counter.update`` over each frame's key groups, ~85 µs per 1,000 records here).

Format: ``GroupLoad.observe(kgs)`` per frame (a list of key groups, or a numpy array for
columnar frames); ``take()`` returns ``{key_group: records}`` since the last ``take`` and
starts over.

Guarantees: the total over all groups is exact (every frame's length is counted). How it
splits over groups is estimated from a sample: every ``sample_every``-th list frame (the
first one always) is counted group by group, and the counts are scaled to the total.
Frames mix keys at random, so the estimate is unbiased; ``sample_every=1`` counts exactly.
Columnar frames are counted exactly (one ``numpy.bincount``, cheaper than a sample).

``KeyAccess`` measures the other half of Spacker's *ratio of state access* (the share of
the keys accessed per second; the keys held come from the state backend): the distinct
keys the task's records touch per second. Counting distinct keys takes a set of every key
seen, so it is not always on: a window of ``window_s`` seconds collects the keys of every
frame (one ``set.update`` per frame), then the task rests until ``period_s`` after the
window began, and the latest finished window is what a ``GroupStats`` reply says. Between
windows a frame costs one comparison of the clock. ``GroupCounters`` holds both for a task
(one call per frame) and makes its ``GroupStats`` reply with the backend's bytes and keys.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.wire.messages import GroupStats


class GroupLoad:
    """Records per key group since the last ``take`` (see the module doc)."""

    __slots__ = ("_countdown", "_exact", "_sampled", "_total", "counts", "sample_every")

    def __init__(self, sample_every: int = 8) -> None:
        if sample_every < 1:
            raise ValueError(f"GroupLoad sample_every must be >= 1; got {sample_every!r}")
        self.sample_every = sample_every
        self.counts: Counter[int] = Counter()  # sampled list frames
        self._exact: np.ndarray | None = None  # columnar frames, counted exactly
        self._countdown = 0  # list frames to skip before the next sample
        self._sampled = 0  # records of the sampled list frames
        self._total = 0  # records of every list frame

    def observe(self, kgs: Sequence[int] | Any) -> None:
        """Count one frame's records (``kgs``: their key groups)."""
        if isinstance(kgs, np.ndarray):
            counts = np.bincount(kgs)
            if self._exact is None:
                self._exact = counts
            elif counts.size > self._exact.size:
                counts[: self._exact.size] += self._exact
                self._exact = counts
            else:
                self._exact[: counts.size] += counts
            return
        n = len(kgs)
        self._total += n
        if self._countdown:
            self._countdown -= 1
            return
        self._countdown = self.sample_every - 1
        self.counts.update(kgs)
        self._sampled += n

    def take(self) -> dict[int, int]:
        """``{key_group: records}`` since the last call (estimated, see the module doc);
        the counters restart."""
        out: dict[int, int] = {}
        if self._sampled:
            scale = self._total / self._sampled
            out = {kg: round(c * scale) for kg, c in self.counts.items()}
        if self._exact is not None:
            for kg in np.flatnonzero(self._exact).tolist():
                out[kg] = out.get(kg, 0) + int(self._exact[kg])
        self.counts = Counter()
        self._exact = None
        self._countdown = self._sampled = self._total = 0
        return out


class KeyAccess:
    """Distinct keys a task's records touch per second, measured in windows (see the module
    doc): ``observe`` every keyed frame, ``take`` the latest finished window.

    A window starts at the first frame at or after its due time and ends at the first frame
    ``window_s`` or more after it began, or at a ``take`` that late; it counts the distinct
    keys of its frames from the first (included) to the last (excluded) over the seconds
    between them, so a steady stream is counted exactly and a sparse one over more than
    ``window_s`` (the idle time counts: fewer keys per second). No sampling inside a window:
    distinct keys seen in a sample of frames cannot be scaled back to all frames. Keys that
    cannot be hashed stop the measure (None from then on)."""

    __slots__ = ("_due", "_keys", "_latest", "_start", "period_s", "window_s")

    def __init__(self, window_s: float = 1.0, period_s: float = 5.0) -> None:
        if not window_s > 0 or not period_s >= window_s or math.isinf(period_s):
            raise ValueError(f"KeyAccess needs 0 < window_s <= period_s < inf; got window_s="
                             f"{window_s!r}, period_s={period_s!r}")
        self.window_s = window_s
        self.period_s = period_s
        self._keys: set[Any] | None = None  # the running window's keys
        self._start = 0.0
        self._due = -math.inf  # the next window starts at the first frame from then
        self._latest: tuple[int, float] | None = None

    def observe(self, keys: Any, now: float, batch: Any = None) -> None:
        """One frame's keys at monotonic time ``now``: a list or tuple, a numpy or Arrow
        array, or (columnar frames) the name of ``batch``'s key column, read only while a
        window runs; None counts nothing."""
        seen = self._keys
        if seen is None:
            if now < self._due:
                return
            seen = self._keys = set()
            self._start = now
        elif now - self._start >= self.window_s:
            self._finish(now)
            if now < self._due:
                return
            seen = self._keys = set()
            self._start = now
        if keys is None:  # a frame without its keys: nothing to count
            return
        if isinstance(keys, str):
            keys = batch.column(keys)
        if not isinstance(keys, list | tuple):
            keys = keys.tolist() if hasattr(keys, "tolist") else keys.to_pylist()
        try:
            seen.update(keys)
        except TypeError:  # unhashable keys: no distinct count, ever
            self._keys, self._due, self._latest = None, math.inf, None

    def _finish(self, now: float) -> None:
        seen = self._keys
        assert seen is not None
        self._latest = (len(seen), now - self._start)
        self._keys = None
        self._due = self._start + self.period_s

    def take(self, now: float) -> tuple[int, float] | None:
        """``(distinct keys, seconds)`` of the latest finished window (a running window
        ``window_s`` old or more finishes now), or None before the first. Changes nothing
        else: the figure is a level, it stands until the next window replaces it."""
        if self._keys is not None and now - self._start >= self.window_s:
            self._finish(now)
        return self._latest


class GroupCounters:
    """A keyed task's planning counters behind one call per frame and one per
    ``GroupStatsRequest``: records per key group (``GroupLoad``) and distinct keys touched
    per second (``KeyAccess``), with the state backend's bytes and keys per group."""

    __slots__ = ("access", "load", "since")

    def __init__(self, sample_every: int, now: float) -> None:
        self.load = GroupLoad(sample_every)
        self.access = KeyAccess()
        self.since = now  # the records are counted from then

    def observe(self, kgs: Any, keys: Any, now: float, batch: Any = None) -> None:
        """One keyed frame: its records' key groups and keys (``KeyAccess.observe``)."""
        self.load.observe(kgs)
        self.access.observe(keys, now, batch)

    def reply(self, task: str, backend: Any, now: float, keys: bool = True) -> GroupStats:
        """The ``GroupStats`` of ``task`` now (``backend``: its keyed state backend, None
        for a task without keyed state); the record counters restart. ``keys`` False: each
        group's keys are None (``GroupStatsRequest.keys``: no scan of the state)."""
        counts = self.load.take()
        groups = () if backend is None else tuple(
            (kg, counts.get(kg, 0), *(backend.group_stats(kg) if keys
                                      else (backend.estimated_group_bytes(kg), None)))
            for kg in backend.owned())
        touched = None if backend is None else self.access.take(now)
        seconds, self.since = now - self.since, now
        return GroupStats(task, groups, seconds, *((-1, 0.0) if touched is None else touched))
