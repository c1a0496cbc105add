"""How much CPU a drrs migration may take: subscales at once and the state each has in
flight, from measured headroom (pure).

Why: a migration's work (snapshot, encode, send, install, re-route) competes with the
job's processing for the same cores. On an idle machine running two subscales at once
finishes sooner at no cost to the records; on a machine busy with other work the same two
subscales push every task into waiting for a core, and the mean latency of *all* keys
rises during the scaling period (measured: drrs's scaling-period mean went from 1.07x to
1.7-5.8x the no-rescale mean as the load average went from ~2 to 8-37). So drrs paces
itself: the fewer idle cores, the fewer subscales at once (never fewer than one: the
migration always progresses). The chunk size follows too: within a subscale the new owner
pulls its groups one at a time (each pull a round trip, each group one snapshot the old
owner makes between records); with cores to spare it may have up to ``chunk_bytes`` of
state in flight beyond one group (several groups pulled at once, so the old owner sends
them back to back and the subscale takes fewer round trips), and on a busy machine one
group at a time, so every task gets back to its records between two groups.

Format: ``HeadroomPacer(max_running, cores_per_subscale, max_chunk_bytes)``;
``observe(idle_cores)`` with each measurement of idle cores (the runtime samples the
machine's CPU counters about every half second while a rescale runs) returns the
subscales allowed at once now and sets ``chunk_bytes``, read when a subscale starts.

Guarantees: the limit is in ``[1, max_running]``, and 1 until the first measurement; it
follows a moving average of the samples (half of each new sample), so one noisy sample
does not swing it. ``chunk_bytes`` is 0 (one group at a time) until the first measurement
and while fewer than ``cores_per_subscale`` cores are idle, ``max_chunk_bytes`` from
``cores_per_subscale + 1`` idle cores on, linear between. ``log`` keeps every (idle
average, limit, chunk bytes) for the report.
"""

from __future__ import annotations


class HeadroomPacer:
    """Subscales at once from idle cores (see the module doc)."""

    def __init__(self, max_running: int, cores_per_subscale: float = 0.5,
                 max_chunk_bytes: int = 0) -> None:
        if max_running < 1:
            raise ValueError(f"max_running must be >= 1; got {max_running!r}")
        if not cores_per_subscale > 0:
            raise ValueError(f"cores_per_subscale must be > 0; got {cores_per_subscale!r}")
        if max_chunk_bytes < 0:
            raise ValueError(f"max_chunk_bytes must be >= 0; got {max_chunk_bytes!r}")
        self.max_running = max_running
        self.cores_per_subscale = cores_per_subscale
        self.max_chunk_bytes = max_chunk_bytes
        self.idle: float | None = None
        self.limit = 1  # until the first measurement: a busy machine is the safe guess
        self.chunk_bytes = 0  # and one group in flight at a time
        self.log: list[tuple[float, int, int]] = []

    def observe(self, idle_cores: float) -> int:
        """A new measurement of idle cores; returns the subscales allowed at once."""
        x = max(0.0, float(idle_cores))
        self.idle = x if self.idle is None else 0.5 * self.idle + 0.5 * x
        self.limit = max(1, min(self.max_running, int(self.idle / self.cores_per_subscale)))
        spare = min(1.0, max(0.0, self.idle - self.cores_per_subscale))
        self.chunk_bytes = int(self.max_chunk_bytes * spare)
        self.log.append((self.idle, self.limit, self.chunk_bytes))
        return self.limit

    def describe(self) -> str:
        """What pacing did, for the report: the range of limits and of idle cores."""
        if not self.log:
            return "not paced (no headroom measured)"
        limits = [x for _, x, _ in self.log]
        idle = [i for i, _, _ in self.log]
        chunks = [c for _, _, c in self.log]
        return (f"paced by headroom: {min(limits)}-{max(limits)} subscales at once, "
                f"{min(chunks) // 1000}-{max(chunks) // 1000} kB in flight beyond one group, "
                f"over {len(self.log)} samples of {min(idle):.2f}-{max(idle):.2f} idle cores")
