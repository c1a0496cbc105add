"""Event time: watermark strategies, windows and window assigners (pure).

Timestamps are int milliseconds. A watermark ``w`` promises that no record with timestamp
``<= w`` follows. Windows are half-open ``[start, end)`` and fire when the watermark (or,
for processing-time windows, the clock) reaches ``end - 1`` (Flink's ``maxTimestamp``).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import JobDefinitionError

MIN_WATERMARK = -(2**63)
MAX_WATERMARK = 2**63 - 1


@dataclass(frozen=True)
class WatermarkStrategy:
    """Bounded out-of-orderness: watermark = max timestamp seen - ``max_out_of_orderness_ms`` - 1.

    ``interval_ms``: how often a source task emits its watermark. ``idle_timeout_ms``: a
    source task that emitted nothing for that long marks itself idle (its channels stop
    holding back downstream watermarks) until it emits again; None never.
    """

    max_out_of_orderness_ms: int = 0
    interval_ms: float = 200.0
    idle_timeout_ms: float | None = None

    def __post_init__(self) -> None:
        if self.max_out_of_orderness_ms < 0:
            raise JobDefinitionError("WatermarkStrategy: max_out_of_orderness_ms must be >= 0")
        if self.interval_ms <= 0:
            raise JobDefinitionError("WatermarkStrategy: interval_ms must be > 0")
        if self.idle_timeout_ms is not None and self.idle_timeout_ms <= 0:
            raise JobDefinitionError("WatermarkStrategy: idle_timeout_ms must be > 0 or None")

    def watermark_for(self, max_timestamp: int) -> int:
        if max_timestamp == MIN_WATERMARK:
            return MIN_WATERMARK
        return max_timestamp - self.max_out_of_orderness_ms - 1


def bounded_out_of_orderness(ms: int, idle_timeout_ms: float | None = None) -> WatermarkStrategy:
    """``WatermarkStrategy(ms, idle_timeout_ms=idle_timeout_ms)``: Flink's name for it."""
    return WatermarkStrategy(ms, idle_timeout_ms=idle_timeout_ms)


@dataclass(frozen=True, order=True)
class Window:
    """The half-open interval ``[start, end)`` in ms."""

    start: int
    end: int

    @property
    def max_timestamp(self) -> int:
        return self.end - 1


def window_start(timestamp: int, size: int, offset: int = 0) -> int:
    """Start of the window of length ``size`` (aligned to ``offset``) holding ``timestamp``."""
    return timestamp - (timestamp - offset) % size


@dataclass(frozen=True)
class WindowAssigner:
    """Tumbling (``slide == size``) or sliding windows, in event time or processing time."""

    size_ms: int
    slide_ms: int
    offset_ms: int = 0
    event_time: bool = True

    def __post_init__(self) -> None:
        if self.size_ms <= 0 or self.slide_ms <= 0:
            raise JobDefinitionError("window size and slide must be > 0 ms")
        if self.slide_ms > self.size_ms:
            raise JobDefinitionError("window slide must not exceed its size (gaps lose records)")
        if not 0 <= self.offset_ms < self.slide_ms:
            raise JobDefinitionError("window offset must be in [0, slide)")

    def assign(self, timestamp: int) -> list[Window]:
        """Every window holding ``timestamp``, oldest first."""
        start = window_start(timestamp, self.slide_ms, self.offset_ms)
        out = []
        while start > timestamp - self.size_ms:
            out.append(Window(start, start + self.size_ms))
            start -= self.slide_ms
        out.reverse()
        return out


def tumbling_event_time(size_ms: int, offset_ms: int = 0) -> WindowAssigner:
    """Back-to-back event-time windows of ``size_ms``, aligned to ``offset_ms``."""
    return WindowAssigner(size_ms, size_ms, offset_ms, True)


def sliding_event_time(size_ms: int, slide_ms: int, offset_ms: int = 0) -> WindowAssigner:
    """Event-time windows of ``size_ms`` starting every ``slide_ms`` (a record is in
    ``size_ms / slide_ms`` of them), aligned to ``offset_ms``."""
    return WindowAssigner(size_ms, slide_ms, offset_ms, True)


def tumbling_processing_time(size_ms: int, offset_ms: int = 0) -> WindowAssigner:
    """Back-to-back processing-time windows of ``size_ms`` (by the task's clock)."""
    return WindowAssigner(size_ms, size_ms, offset_ms, False)


def sliding_processing_time(size_ms: int, slide_ms: int, offset_ms: int = 0) -> WindowAssigner:
    """Processing-time windows of ``size_ms`` starting every ``slide_ms`` (by the task's
    clock)."""
    return WindowAssigner(size_ms, slide_ms, offset_ms, False)


class WatermarkTracker:
    """The watermark of a task: the minimum over its live input channels and its holds.

    A channel counts once it has sent a watermark; an ended or removed channel stops
    counting; an idle channel does not hold the minimum back. ``update`` returns the new
    task watermark when it advanced, else None.

    Holds (``engine.wire.messages.WatermarkHold``/``WatermarkRelease``) keep the watermark at or
    below a value while a live rescale still has records on their way to a new owner: a
    hold counts like one more channel from ``hold`` until its ``release``, whatever the
    channels do meanwhile. Holds and releases of one token are counted: a token may come
    several times, once per path (stateless tasks in between relay them, and each relays
    both, or only the hold or only the release on a forward edge, so the paths balance), and
    is held while more holds than releases came. A release may come first (another
    channel); the hold that balances it then never takes effect. Tokens with more releases
    than holds are kept for at most ``MAX_EARLY_RELEASES`` tokens, the oldest forgotten
    first. The watermark never goes back: a hold below it stops it.
    """

    MAX_EARLY_RELEASES = 1024

    def __init__(self) -> None:
        self.channels: dict[int, int] = {}
        self.live: set[int] = set()
        self.idle: set[int] = set()
        self.holds: dict[int, int] = {}  # token -> watermark, while held
        self._balance: dict[int, int] = {}  # token -> holds - releases, when not 0
        self.released_early: dict[int, None] = {}  # tokens with more releases; bounded
        self.current = MIN_WATERMARK

    def set_channels(self, channel_ids: list[int]) -> int | None:
        self.live = set(channel_ids)
        self.channels = {c: w for c, w in self.channels.items() if c in self.live}
        self.idle &= self.live
        return self._recompute()

    def update(self, channel_id: int, watermark: int) -> int | None:
        if channel_id not in self.live:
            return None
        self.idle.discard(channel_id)
        if watermark > self.channels.get(channel_id, MIN_WATERMARK):
            self.channels[channel_id] = watermark
        return self._recompute()

    def mark_idle(self, channel_id: int) -> int | None:
        if channel_id in self.live:
            self.idle.add(channel_id)
        return self._recompute()

    def end(self, channel_id: int) -> int | None:
        self.live.discard(channel_id)
        self.channels.pop(channel_id, None)
        self.idle.discard(channel_id)
        return self._recompute()

    def hold(self, token: int, watermark: int) -> int | None:
        """A hold of ``token`` at ``watermark`` came (on one path)."""
        self._count(token, +1, watermark)
        return None

    def release(self, token: int) -> int | None:
        """A release of ``token`` came (on one path); returns the new watermark when that
        lifted the hold and advanced it."""
        if self._count(token, -1, 0):
            return self._recompute()
        return None

    def _count(self, token: int, step: int, watermark: int) -> bool:
        """Add ``step`` to the token's balance; True when that lifted its hold."""
        was_held = token in self.holds
        n = self._balance.get(token, 0) + step
        if n:
            self._balance[token] = n
        else:
            self._balance.pop(token, None)
        if n > 0:
            self.holds.setdefault(token, watermark)
        else:
            self.holds.pop(token, None)
        if n < 0:
            self.released_early[token] = None
            while len(self.released_early) > self.MAX_EARLY_RELEASES:
                self._balance.pop(next(iter(self.released_early)), None)
                del self.released_early[next(iter(self.released_early))]
        else:
            self.released_early.pop(token, None)
        return was_held and token not in self.holds

    def _recompute(self) -> int | None:
        active = [c for c in self.live if c not in self.idle]
        if not active:
            return None
        if any(c not in self.channels for c in active):
            return None
        wm = min(self.channels[c] for c in active)
        if self.holds:
            wm = min(wm, min(self.holds.values()))
        if wm > self.current:
            self.current = wm
            return wm
        return None
        if any(c not in self.channels for c in active):
            return None
        wm = min(self.channels[c] for c in active)
        if wm > self.current:
            self.current = wm
            return wm
        return None
