"""Restart strategies: whether a failed job restarts from its last checkpoint (pure).

Why a value that decides: the JobMaster's recovery (``engine.runtime.recovery``) asks on
every failure and does what the decision says; the rule is stepped by hand in tests.

Strategies (Flink's): ``fixed-delay`` restarts after ``JobConfig.restart_delay_s``, at most
``restart_attempts`` times over the job's life; ``none`` never restarts. The strategy in
effect is ``JobConfig.restarts`` (fixed-delay when checkpoints are on, none otherwise).

Guarantee: each decision says why, in words a user reads in the job's error when the
strategy gives up.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.dataflow.config import JobConfig


@dataclass(frozen=True)
class RestartDecision:
    """``restart`` after ``delay_s``, or give up; ``reason`` says which and why."""

    restart: bool
    delay_s: float
    reason: str


class RestartStrategy:
    """Counts the job's restarts and decides on each failure."""

    def __init__(self, config: JobConfig) -> None:
        self.name = config.restarts
        self.attempts = config.restart_attempts
        self.delay_s = config.restart_delay_s
        self.restarts = 0

    def on_failure(self, cause: str) -> RestartDecision:
        """The job failed with ``cause``: restart it (counted) or not."""
        if self.name == "none":
            return RestartDecision(False, 0.0, "the restart strategy is 'none' (checkpoints "
                                   "are off, or restart_strategy='none')")
        if self.restarts >= self.attempts:
            return RestartDecision(
                False, 0.0, f"the restart strategy 'fixed-delay' gave up after "
                f"{self.restarts} restart{'s' if self.restarts != 1 else ''} "
                f"(restart_attempts={self.attempts})")
        self.restarts += 1
        return RestartDecision(True, self.delay_s,
                               f"restart {self.restarts} of {self.attempts} "
                               f"(fixed-delay, {self.delay_s:g} s)")


__all__ = ["RestartDecision", "RestartStrategy"]
