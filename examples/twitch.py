"""Twitch-like viewer engagement on reflow (the DRRS paper's workload).

    python examples/twitch.py                                   # seeded generator, local Ray
    python examples/twitch.py --csv 100k_a.csv --events 500000  # the public Twitch dataset
    ray job submit --working-dir . -- python examples/twitch.py --events 50000

The pipeline (eight operators; parse and valid run in the source's task; segments is
sessionise's forward partner, so a rescale of sessionise rescales it too)::

    lines -> parse -> valid -> sessionise(viewer) -+-> segments -+-> engagement(streamer) -----+
                                                   |             +-> loyalty(viewer,streamer) -+-> sink
                                                   +-> watch_time(viewer) ---------------------+

* ``parse``: a raw CSV line ``user_id,stream_id,streamer_username,time_start,time_stop``
  (times in 10-minute units, as in the dataset) becomes a tuple with times in ms, or None.
* ``valid``: drops unparsable lines and intervals with ``time_stop <= time_start``.
* ``sessionise`` (keyed by viewer, event-time timers): consecutive watch intervals of a viewer
  less than ``gap`` apart form a session; a session closes when the watermark passes
  ``end + gap`` (or when a later interval starts after it) and is emitted with timestamp
  ``end + gap``.
* ``segments``: a session becomes one ``(viewer, streamer, minutes, session start)`` per
  streamer watched in it.
* ``engagement`` (keyed by streamer, tumbling event-time windows): distinct viewers, minutes
  watched and sessions per streamer and window.
* ``watch_time`` (keyed by viewer, tumbling event-time windows): minutes, sessions, longest
  session and distinct streamers per viewer and window.
* ``loyalty`` (keyed by ``(viewer, streamer)``, keyed state): running minutes, sessions,
  distinct days and a loyalty score, emitted for every segment.

The real dataset (Rappaz, Duchesne, McAuley & West, "Recommendation on live-streaming
platforms: dynamic availability and repeat consumption", RecSys 2021; ``100k_a.csv``/
``full_a.csv``, no header) is read by ``read_twitch_csv``; ``generate_lines`` mimics its shape:
Zipf-skewed streamer popularity and viewer activity, favourite streamers per viewer, watch
intervals chained into sessions, and a daily rate curve with an evening peak.
``reference`` is an independent plain-Python computation of the exact same outputs.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import math
import os
import random
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import (  # noqa: E402
    AggregateFunction,
    JobConfig,
    KeyedProcessFunction,
    Sink,
    Source,
    SourceGate,
    StreamJob,
    TestingSink,
    TestingSource,
    WatermarkStrategy,
    tumbling_event_time,
)

UNIT_MS = 600_000            # the dataset's time unit: 10 minutes
UNIT_MINUTES = 10
UNITS_PER_DAY = 144
HOUR_MS = 3_600_000
DAY_MS = 86_400_000
GAP_MS = 3 * UNIT_MS         # a session closes 30 minutes after its last interval ended
DISORDER_UNITS = 1           # the generator's bounded out-of-orderness (in time_start)


# ============================================================================ the job

def event_time(line: str) -> int:
    """Event time (ms) of a raw line: its ``time_start``; 0 when unparsable (such lines are
    dropped by ``valid`` and never hold a watermark back)."""
    parts = line.split(",")
    if len(parts) >= 4:
        try:
            return max(0, int(parts[3])) * UNIT_MS
        except ValueError:
            pass
    return 0


def parse(line: str) -> tuple[int, int, str, int, int] | None:
    """``(user_id, stream_id, streamer, start_ms, stop_ms)`` or None when malformed."""
    parts = line.strip().split(",")
    if len(parts) != 5:
        return None
    try:
        user, stream, start, stop = int(parts[0]), int(parts[1]), int(parts[3]), int(parts[4])
    except ValueError:
        return None
    return user, stream, parts[2].strip(), start * UNIT_MS, stop * UNIT_MS


def is_valid(ev: tuple[int, int, str, int, int] | None) -> bool:
    return ev is not None and ev[0] >= 0 and bool(ev[2]) and 0 <= ev[3] < ev[4]


def viewer_of(rec: tuple) -> int:
    return rec[0]


def streamer_of(seg: tuple) -> str:
    return seg[1]


def viewer_streamer(seg: tuple) -> tuple[int, str]:
    return seg[0], seg[1]


class Sessionise(KeyedProcessFunction):
    """Per viewer: merge watch intervals at most ``gap_ms`` apart into sessions (event time).

    State: the open session ``[start, end, intervals, {streamer: minutes}]``. Emits
    ``(viewer, start_ms, end_ms, intervals, ((streamer, minutes), ...))`` with timestamp
    ``end + gap``. Needs a watermark bound below ``gap_ms``: then every interval either
    belongs to the open session or starts after it ended, and the output does not depend on
    when watermarks arrive. An interval starting at or behind the current watermark is
    late: dropped and counted (``reflow_late_records``)."""

    def __init__(self, gap_ms: int = GAP_MS) -> None:
        self.gap = gap_ms

    def open(self, ctx: Any) -> None:
        self.session = ctx.value_state("session")

    def _emit(self, s: list, ctx: Any) -> None:
        watched = tuple(sorted(s[3].items()))
        ctx.emit((ctx.key, s[0], s[1], s[2], watched), s[1] + self.gap)

    def process_element(self, ev: tuple, ctx: Any) -> None:
        _user, _stream, streamer, start, stop = ev
        if start <= ctx.timer_service.current_watermark():
            # behind the watermark (disorder beyond the bound): its session may be closed
            # and emitted already, so it is dropped and counted as late
            ctx.output_late(ev)
            return
        s = self.session.value()
        if s is not None and start > s[1] + self.gap:
            # a new session begins before the old one's timer fired: close the old one now
            ctx.timer_service.delete_event_time_timer(s[1] + self.gap)
            self._emit(s, ctx)
            s = None
        if s is None:
            s = [start, stop, 0, {}]
        else:
            if stop > s[1]:
                ctx.timer_service.delete_event_time_timer(s[1] + self.gap)
                s[1] = stop
            s[0] = min(s[0], start)
        s[2] += 1
        s[3][streamer] = s[3].get(streamer, 0) + (stop - start) // 60_000
        ctx.timer_service.register_event_time_timer(s[1] + self.gap)
        self.session.update(s)

    def on_timer(self, timestamp: int, ctx: Any) -> None:
        s = self.session.value()
        if s is not None and s[1] + self.gap == timestamp:
            self._emit(s, ctx)
            self.session.clear()


def segments(session: tuple) -> Iterator[tuple[int, str, int, int]]:
    """A session -> ``(viewer, streamer, minutes, session_start_ms)`` per streamer."""
    user, start, _end, _n, watched = session
    for streamer, minutes in watched:
        yield user, streamer, minutes, start


class Engagement(AggregateFunction):
    """Per streamer and window: ``[{viewer: 1}, minutes, segments]``."""

    def create_accumulator(self) -> list:
        return [{}, 0, 0]

    def add(self, seg: tuple, acc: list) -> list:
        acc[0][seg[0]] = 1
        acc[1] += seg[2]
        acc[2] += 1
        return acc


def engagement_result(streamer: str, w: Any, acc: list) -> list[tuple]:
    return [("engagement", streamer, w.start, len(acc[0]), acc[1], acc[2])]


class WatchTime(AggregateFunction):
    """Per viewer and window: ``[minutes, sessions, longest session, {streamer: 1}]``."""

    def create_accumulator(self) -> list:
        return [0, 0, 0, {}]

    def add(self, session: tuple, acc: list) -> list:
        minutes = sum(m for _, m in session[4])
        acc[0] += minutes
        acc[1] += 1
        acc[2] = max(acc[2], minutes)
        for streamer, _ in session[4]:
            acc[3][streamer] = 1
        return acc


def watch_result(user: int, w: Any, acc: list) -> list[tuple]:
    return [("watch", user, w.start, acc[0], acc[1], acc[2], len(acc[3]))]


def loyalty_score(minutes: int, sessions: int, days: int) -> float:
    """Hours watched, boosted by how many distinct days the viewer came back, plus a small
    bonus per session."""
    return round(minutes / 60 * (1 + 0.5 * (days - 1)) + 0.1 * sessions, 4)


class Loyalty(KeyedProcessFunction):
    """Per (viewer, streamer): running minutes, sessions and distinct days (keyed state);
    emits ``("loyalty", viewer, streamer, minutes, sessions, days, score)`` per segment.
    ``pad_bytes``: also that many bytes of state per pair (benchmarks size the state)."""

    def __init__(self, pad_bytes: int = 0) -> None:
        self.pad_bytes = pad_bytes

    def open(self, ctx: Any) -> None:
        self.stats = ctx.value_state("stats")
        self.pad = ctx.value_state("pad")

    def process_element(self, seg: tuple, ctx: Any) -> Iterable[tuple]:
        user, streamer, minutes, start = seg
        if self.pad_bytes and self.pad.value() is None:
            self.pad.update(bytes(self.pad_bytes))
        st = self.stats.value() or [0, 0, {}]
        st[0] += minutes
        st[1] += 1
        st[2][start // DAY_MS] = 1
        self.stats.update(st)
        return [("loyalty", user, streamer, st[0], st[1], len(st[2]),
                 loyalty_score(st[0], st[1], len(st[2])))]


def build(lines: list[str], sink: Sink, parallelism: int = 2, *, rate: float | None = None,
          key_groups: int = 128, config: JobConfig | None = None,
          bound_ms: int = DISORDER_UNITS * UNIT_MS, gap_ms: int = GAP_MS,
          engagement_window_ms: int = HOUR_MS, watch_window_ms: int = DAY_MS,
          watermark_interval_ms: float = 50.0, late_sink: Sink | None = None,
          sink_parallelism: int = 1,
          gate: SourceGate | Sequence[SourceGate] | None = None,
          source: Source | None = None,
          parallelism_of: dict[str, int] | None = None,
          loyalty_pad_bytes: int = 0) -> StreamJob:
    """The Twitch job over raw ``lines`` (one source task, so per-viewer order is the line
    order); every output goes to ``sink`` tagged ``engagement``/``watch``/``loyalty``.
    ``gate``: holds the source at a record (tests rescale there). ``source``: reads the
    lines instead of a ``TestingSource`` over ``lines`` (the DRRS benchmark replays them
    open-loop: ``examples.bench.harness.replay``); ``parallelism_of``: operator name ->
    parallelism for the keyed operators (default ``parallelism``); ``loyalty_pad_bytes``:
    state padding per (viewer, streamer) pair (``Loyalty``)."""
    par = (parallelism_of or {}).get
    if bound_ms >= gap_ms:
        raise ValueError("the watermark bound must be below the session gap")
    job = StreamJob("twitch", num_key_groups=key_groups, parallelism=parallelism,
                    config=config or JobConfig())
    events = (
        job.source(source or TestingSource(lines, rate=rate, timestamp_fn=event_time,
                                           gate=gate),
                   name="lines",
                   parallelism=1, watermarks=WatermarkStrategy(bound_ms, watermark_interval_ms))
        .map(parse, name="parse")
        .filter(is_valid, name="valid")
    )
    sessions = events.key_by(viewer_of).process(Sessionise(gap_ms), name="sessionise",
                                                parallelism=par("sessionise"))
    segs = sessions.flat_map(segments, name="segments")
    engagement = (segs.key_by(streamer_of)
                  .window(tumbling_event_time(engagement_window_ms), late_sink=late_sink)
                  .aggregate(Engagement(), engagement_result, name="engagement",
                             parallelism=par("engagement")))
    watch = (sessions.key_by(viewer_of)
             .window(tumbling_event_time(watch_window_ms), late_sink=late_sink)
             .aggregate(WatchTime(), watch_result, name="watch_time",
                        parallelism=par("watch_time")))
    loyalty = segs.key_by(viewer_streamer).process(Loyalty(loyalty_pad_bytes), name="loyalty",
                                                   parallelism=par("loyalty"))
    engagement.union(watch, loyalty).sink(sink, name="sink", parallelism=sink_parallelism)
    return job


def outputs_by_kind(results: Iterable[tuple]) -> dict[str, Any]:
    """Sink records -> ``{"engagement": {(streamer, window_start): (viewers, minutes,
    segments)}, "watch": {(viewer, window_start): (...)}, "loyalty": {(viewer, streamer):
    [(minutes, sessions, days, score), ...]}}``; a window that fired twice raises."""
    out: dict[str, Any] = {"engagement": {}, "watch": {}, "loyalty": {}}
    for r in results:
        kind = r[0]
        if kind == "loyalty":
            out["loyalty"].setdefault((r[1], r[2]), []).append(tuple(r[3:]))
        else:
            k = (r[1], r[2])
            if k in out[kind]:
                raise AssertionError(f"{kind} window {k} fired twice")
            out[kind][k] = tuple(r[3:])
    return out


# ============================================================================ reference

def reference(lines: Iterable[str], gap_ms: int = GAP_MS, engagement_window_ms: int = HOUR_MS,
              watch_window_ms: int = DAY_MS) -> dict[str, Any]:
    """The job's outputs computed in plain Python (no engine), in ``outputs_by_kind`` form."""
    open_sessions: dict[int, dict[str, Any]] = {}
    closed: list[dict[str, Any]] = []   # in closing order (per viewer: chronological)

    for line in lines:
        fields = [f.strip() for f in line.strip().split(",")]
        if len(fields) != 5 or not fields[2]:
            continue
        try:
            user, _stream, t0, t1 = (int(fields[i]) for i in (0, 1, 3, 4))
        except ValueError:
            continue
        if user < 0 or t0 < 0 or t1 <= t0:
            continue
        start, stop = t0 * UNIT_MS, t1 * UNIT_MS
        s = open_sessions.get(user)
        if s is not None and start - s["end"] > gap_ms:
            closed.append(open_sessions.pop(user))
            s = None
        if s is None:
            s = open_sessions[user] = {"user": user, "start": start, "end": stop, "n": 0,
                                       "watched": {}}
        s["start"] = min(s["start"], start)
        s["end"] = max(s["end"], stop)
        s["n"] += 1
        s["watched"][fields[2]] = s["watched"].get(fields[2], 0) + (t1 - t0) * UNIT_MINUTES
    closed.extend(open_sessions.values())

    engagement: dict[tuple, list] = {}
    watch: dict[tuple, list] = {}
    loyalty: dict[tuple, list] = {}
    loyalty_state: dict[tuple, tuple[int, int, set]] = {}
    for s in closed:
        t = s["end"] + gap_ms                       # the session's timestamp
        total = sum(s["watched"].values())
        wk = (s["user"], t - t % watch_window_ms)
        w = watch.setdefault(wk, [0, 0, 0, set()])
        w[0] += total
        w[1] += 1
        w[2] = max(w[2], total)
        w[3].update(s["watched"])
        for streamer, minutes in sorted(s["watched"].items()):
            ek = (streamer, t - t % engagement_window_ms)
            e = engagement.setdefault(ek, [set(), 0, 0])
            e[0].add(s["user"])
            e[1] += minutes
            e[2] += 1
            lk = (s["user"], streamer)
            m, n, days = loyalty_state.get(lk, (0, 0, set()))
            m, n = m + minutes, n + 1
            days = days | {s["start"] // DAY_MS}
            loyalty_state[lk] = (m, n, days)
            score = round(m / 60 * (1 + 0.5 * (len(days) - 1)) + 0.1 * n, 4)
            loyalty.setdefault(lk, []).append((m, n, len(days), score))
    return {
        "engagement": {k: (len(v[0]), v[1], v[2]) for k, v in engagement.items()},
        "watch": {k: (v[0], v[1], v[2], len(v[3])) for k, v in watch.items()},
        "loyalty": loyalty,
    }


# ============================================================================ data

def _zipf_cum(n: int, s: float) -> list[float]:
    cum, acc = [], 0.0
    for i in range(1, n + 1):
        acc += 1.0 / i ** s
        cum.append(acc)
    return cum


def _pick(rng: random.Random, cum: list[float]) -> int:
    return bisect.bisect_left(cum, rng.random() * cum[-1])


def daily_curve(unit: int) -> float:
    """Relative activity at a 10-minute unit: a daily sine, low at 08:00, peak at 20:00."""
    hour = (unit % UNITS_PER_DAY) / 6
    return 1.0 + 0.7 * math.sin(2 * math.pi * (hour - 14) / 24)


def generate_lines(n: int, seed: int = 7, num_viewers: int | None = None,
                   num_streamers: int | None = None, rows_per_unit: float = 40.0,
                   streamer_zipf: float = 1.0, viewer_zipf: float = 0.5,
                   invalid_fraction: float = 0.005, disorder_units: int = DISORDER_UNITS,
                   start_unit: int = 0) -> list[str]:
    """``n`` raw lines shaped like the Twitch dataset, in arrival order.

    A viewer (Zipf activity) starts sessions following the daily curve; a session chains 1-6
    watch intervals of 10-120 minutes, each on one of the viewer's favourite streamers (p=0.7)
    or a Zipf-popular one, the next starting 0-20 minutes after the previous stopped. Lines
    arrive ordered by ``time_start`` up to ``disorder_units`` of disorder; a fraction of them
    are corrupted (wrong field count, bad numbers, empty streamer, ``stop <= start``)."""
    if disorder_units >= GAP_MS // UNIT_MS:
        raise ValueError("disorder must stay below the session gap")
    rng = random.Random(seed)
    num_viewers = num_viewers or max(50, n // 8)
    num_streamers = num_streamers or max(20, n // 60)
    s_cum = _zipf_cum(num_streamers, streamer_zipf)
    v_cum = _zipf_cum(num_viewers, viewer_zipf)
    favourites: dict[int, list[int]] = {}
    buckets: dict[int, list[tuple[int, int, int, int]]] = {}
    complete, unit = 0, start_unit
    mean_rows = 2.0
    while complete < n:
        expected = rows_per_unit * daily_curve(unit) / mean_rows
        chains = int(expected) + (rng.random() < expected - int(expected))
        for _ in range(chains):
            user = 1 + _pick(rng, v_cum)
            favs = favourites.get(user)
            if favs is None:
                favs = favourites[user] = [_pick(rng, s_cum) for _ in range(rng.randint(1, 3))]
            t = unit
            for _ in range(min(6, 1 + int(rng.expovariate(1.0)))):
                streamer = rng.choice(favs) if rng.random() < 0.7 else _pick(rng, s_cum)
                stop = t + min(12, 1 + int(rng.expovariate(0.4)))
                buckets.setdefault(t, []).append((user, streamer, t, stop))
                t = stop + rng.choice((0, 0, 0, 1, 2))
        complete += len(buckets.get(unit, ()))
        unit += 1
    rows = [r for u in range(start_unit, unit) for r in buckets.get(u, ())]
    # arrival order: time_start plus up to `disorder_units` of jitter
    keyed = sorted((r[2] + rng.random() * disorder_units, i) for i, r in enumerate(rows))
    lines: list[str] = []
    for _, i in keyed:
        user, streamer, t0, t1 = rows[i]
        stream_id = 30_000_000_000 + streamer * 1000 + t0 // UNITS_PER_DAY
        line = f"{user},{stream_id},streamer{streamer},{t0},{t1}"
        if rng.random() < invalid_fraction:
            line = _corrupt(line, rng)
        lines.append(line)
        if len(lines) == n:
            break
    return lines


def _corrupt(line: str, rng: random.Random) -> str:
    user, stream, name, t0, t1 = line.split(",")
    return rng.choice([
        f"{user},{stream},{name},{t0}",              # a missing field
        f"user{user},{stream},{name},{t0},{t1}",     # not a number
        f"{user},{stream},,{t0},{t1}",               # no streamer
        f"{user},{stream},{name},{t0},{t0}",         # stop <= start
        f"{user},{stream},{name},{t0},{t1},extra",   # a field too many
    ])


def read_twitch_csv(path: str, limit: int | None = None) -> list[str]:
    """Lines of the public Twitch dataset (``user_id,stream_id,streamer_username,time_start,
    time_stop``, times in 10-minute units; a header row is skipped if present), as the raw
    records of this job, stably sorted by ``time_start`` (the files are grouped by user;
    unparsable rows sort first and are dropped by ``valid``). ``limit``: the first rows of the
    file only."""
    rows: list[tuple[int, str]] = []
    with open(path, newline="") as f:
        for i, row in enumerate(csv.reader(f)):
            if limit is not None and len(rows) >= limit:
                break
            if not row or (i == 0 and row[0].strip().lower() in ("user_id", "user")):
                continue
            line = ",".join(c.strip() for c in row)
            rows.append((event_time(line), line))
    rows.sort(key=lambda r: r[0])
    return [line for _, line in rows]


# ============================================================================ main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000, help="raw lines (default 100000)")
    ap.add_argument("--rate", type=float, default=None, help="lines/s (default: full speed)")
    ap.add_argument("--duration", type=float, default=None,
                    help="seconds: with --rate, rate*duration lines; without, stop after it")
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--key-groups", type=int, default=128)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--csv", default=None, help="the real dataset (e.g. 100k_a.csv)")
    ap.add_argument("--no-check", action="store_true", help="skip the reference comparison")
    args = ap.parse_args(argv)

    n = args.events
    if args.duration is not None and args.rate is not None:
        n = int(args.rate * args.duration)
    if args.csv:
        lines = read_twitch_csv(args.csv, limit=n)
        bound = 0                       # sorted by time_start
    else:
        lines = generate_lines(n, args.seed)
        bound = DISORDER_UNITS * UNIT_MS
    sink, late = TestingSink(), TestingSink()
    job = build(lines, sink, args.parallelism, rate=args.rate, key_groups=args.key_groups,
                bound_ms=bound, late_sink=late)
    handle = job.run()
    print(f"job {handle.job_id}: {len(lines):,} lines, parallelism {args.parallelism}")
    start = time.monotonic()
    stopped = False
    try:
        handle.wait(None if args.rate is not None else args.duration)
    except TimeoutError:
        stopped = True
    elapsed = time.monotonic() - start
    # stopped early: about how many (valid) records reached 'sessionise' (metrics lag up to 1 s)
    done = int(handle.metrics().total("records_in", 'sessionise')) if stopped else None
    handle.stop()
    out = outputs_by_kind(sink.results())
    eng, watch, loy = out["engagement"], out["watch"], out["loyalty"]
    by_streamer: dict[str, int] = {}
    for (streamer, _), (_, minutes, _) in eng.items():
        by_streamer[streamer] = by_streamer.get(streamer, 0) + minutes
    top = sorted(by_streamer.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    best = max(loy.items(), key=lambda kv: (kv[1][-1][3], kv[0]), default=None)
    print(f"sessions:        {sum(v[1] for v in watch.values()):,} "
          f"({sum(v[0] for v in watch.values()):,} minutes watched)")
    print(f"engagement:      {len(eng):,} (streamer, hour) windows over "
          f"{len(by_streamer):,} streamers")
    print("top streamers:   " + ", ".join(f"{s} {m / 60:,.0f} h" for s, m in top))
    print(f"loyalty updates: {sum(len(v) for v in loy.values()):,} for {len(loy):,} pairs"
          + (f"; most loyal {best[0]} score {best[1][-1][3]}" if best else ""))
    print(f"late records:    {len(late.results())}")
    if stopped:
        print(f"throughput:      {done / elapsed:,.0f} valid lines/s over {elapsed:.1f} s "
              f"(stopped at --duration after about {done:,} of {len(lines):,} lines)")
    else:
        print(f"throughput:      {len(lines) / elapsed:,.0f} lines/s over {elapsed:.1f} s")
    if stopped or args.no_check:
        print("result: not checked (" + ("--no-check" if args.no_check else
                                         "stopped at --duration before its input ended: "
                                         "the output is a prefix") + ")")
        return 0
    ok = out == reference(lines)
    print("result: OK (equals the plain-Python reference)" if ok else "result: MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
