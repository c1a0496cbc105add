"""Idle cores of the JobMaster's machine, sampled while a rescale runs (for drrs pacing).

Why: a paced drrs migration (``migration.pacing``) starts as many subscales at once as
the machine has idle cores for; the coordinator is pure, so the runtime measures and hands
it the numbers (``RescaleCoordinator.on_headroom``).

Format: ``CpuHeadroom.sample()`` returns the idle cores (idle + iowait jiffies of every CPU,
over wall time) since its previous sample, or None when less than ``min_interval_s`` passed
or the counters cannot be read (not Linux: then the load average stands in, as
``cpus - loadavg1``).

Guarantees: never raises; reads ``/proc/stat`` only. On a cluster it measures the
JobMaster's node, which is the machine a single-node job runs on; the tasks of a
multi-node job may sit on busier nodes (not measured).
"""

from __future__ import annotations

import os
import time


def _idle_jiffies() -> float | None:
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return float(int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class CpuHeadroom:
    """Idle cores between samples (see the module doc)."""

    def __init__(self, min_interval_s: float = 0.5) -> None:
        self.min_interval_s = min_interval_s
        self._t = time.monotonic()
        self._idle = _idle_jiffies()

    def sample(self) -> float | None:
        now = time.monotonic()
        if now - self._t < self.min_interval_s:
            return None
        idle = _idle_jiffies()
        if idle is None or self._idle is None:
            self._t = now
            try:
                return max(0.0, (os.cpu_count() or 1) - os.getloadavg()[0])
            except OSError:
                return None
        cores = (idle - self._idle) / (now - self._t)
        self._t, self._idle = now, idle
        return max(0.0, cores)
