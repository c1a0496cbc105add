"""Injected time. Engine logic reads time only through a ``Clock`` (never bare ``time.time()``)."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Wall-clock seconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back; for durations."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to; for stepping pure logic in tests."""

    def __init__(self, start: float = 1_000.0) -> None:
        self._t = start

    def now(self) -> float:
        return self._t

    def monotonic(self) -> float:
        return self._t

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a ManualClock cannot go back")
        self._t += seconds


def now_ms(clock: Clock) -> int:
    """Wall-clock milliseconds since the epoch, as record timestamps use."""
    return int(clock.now() * 1000)
