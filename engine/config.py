"""Job configuration: one frozen dataclass, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import JobDefinitionError


@dataclass(frozen=True)
class JobConfig:
    """Knobs of a deployed job.

    ``batch_size``/``linger_ms``: a channel sends a frame when it holds this many records or
    its oldest record waited this long. ``credits``: unacknowledged frames a sender may have
    on one channel (a frame is acknowledged when the receiver takes it for processing), so a
    task holds at most ``credits`` frames per input channel. ``metrics_port``: 0 picks a free
    port, None disables the endpoint. ``task_num_cpus``: CPUs each task actor reserves
    (0 lets many tasks share a small machine). ``drrs_*``: the DRRS set-aside cap per
    task (records), subscale size (key groups) and subscales per task at once;
    ``drrs_max_subscales``: subscales of the operator at once (None: as many as the CPUs
    of the Ray cluster when the rescale starts; a migration is CPU work that competes
    with the processing, and more subscales at once stretch each one, so more records wait
    longer);
    ``drrs_subscale_bytes``: a subscale also holds at most this much state (estimated per
    group when the rescale is planned; a larger group moves alone; None: no budget). A
    subscale's groups are sent one after another and records of all of them wait at the
    new owner from the start, so the budget bounds the wait of its last group.
    ``warm_standby_tasks``: idle task actors kept ready for scale-out; a rescale that takes
    some leaves the pool short until ``warm_standby_refill_s`` after it ended (starting
    actors costs CPU, which the rescale should not compete with).
    ``rescale_timeout_s``: how long a rescale phase or subscale may take before the job fails.
    ``batched_step_size``/``batched_matching``: key groups per step of the ``batched``
    protocol, or steps in which every task sends and receives at most one group.
    ``step_gap_ms``: pause between the steps of step-wise protocols (fluid, batched,
    non-disruptive).
    ``replication``: which key groups of keyed operators keep a replica on another task
    during normal processing ("none", "hot": the ``replication_hot_fraction`` busiest, "all"),
    refreshed every ``replication_period_s`` with the changes since the last refresh; a
    migration to the replica's holder then ships only those changes.
    ``transport``: how data frames travel between tasks: "tcp" (default) over a direct
    socket per pair of task actors (``engine.transport``; a frame costs a write and a read),
    or "ray" as one actor call per frame (~1.3 ms of CPU over both ends). ``data_host``: the
    address each task's data socket binds to and is reached at: 127.0.0.1 by default, which
    serves a single machine (a local Ray cluster, several raylets on one host included); on a
    multi-machine cluster set it to "0.0.0.0" (each task then advertises its node's address)
    or use ``transport="ray"``.
    ``live_rescaling``: False switches off the per-frame and per-timer checks that live
    migration needs (only ``stop-restart`` is then accepted); it exists to measure what
    rescaling support costs in steady state.
    """

    batch_size: int = 1000
    linger_ms: float = 5.0
    credits: int = 4
    latency_marker_interval_ms: float = 100.0
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = 0
    metrics_poll_interval_s: float = 1.0
    task_num_cpus: float = 0.0
    source_poll_records: int = 1000
    timer_check_interval_ms: float = 10.0
    drrs_set_aside_cap: int = 200
    drrs_subscale_size: int = 4
    drrs_subscale_bytes: int | None = 1_000_000
    drrs_max_subscales_per_task: int = 2
    drrs_max_subscales: int | None = None
    warm_standby_tasks: int = 0
    warm_standby_refill_s: float = 10.0
    rescale_timeout_s: float = 300.0
    batched_step_size: int = 4
    batched_matching: bool = False
    step_gap_ms: float = 0.0
    replication: str = "none"
    replication_period_s: float = 5.0
    replication_hot_fraction: float = 0.2
    live_rescaling: bool = True
    transport: str = "tcp"
    data_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        checks = [
            (self.batch_size >= 1, "batch_size must be >= 1"),
            (self.linger_ms >= 0, "linger_ms must be >= 0"),
            (self.credits >= 1, "credits must be >= 1 (a channel needs one frame in flight)"),
            (self.latency_marker_interval_ms > 0, "latency_marker_interval_ms must be > 0"),
            (self.metrics_port is None or 0 <= self.metrics_port < 65536, "metrics_port must be a port number, 0, or None"),
            (self.metrics_poll_interval_s > 0, "metrics_poll_interval_s must be > 0"),
            (self.task_num_cpus >= 0, "task_num_cpus must be >= 0"),
            (self.source_poll_records >= 1, "source_poll_records must be >= 1"),
            (self.timer_check_interval_ms > 0, "timer_check_interval_ms must be > 0"),
            (self.drrs_set_aside_cap >= 1, "drrs_set_aside_cap must be >= 1 record"),
            (self.drrs_subscale_size >= 1, "drrs_subscale_size must be >= 1 key group"),
            (self.drrs_subscale_bytes is None or self.drrs_subscale_bytes >= 1,
             "drrs_subscale_bytes must be >= 1 byte or None (no byte budget)"),
            (self.drrs_max_subscales_per_task >= 1, "drrs_max_subscales_per_task must be >= 1"),
            (self.drrs_max_subscales is None or self.drrs_max_subscales >= 1,
             "drrs_max_subscales must be >= 1 or None (as many as the cluster's CPUs)"),
            (self.warm_standby_tasks >= 0, "warm_standby_tasks must be >= 0"),
            (self.warm_standby_refill_s >= 0, "warm_standby_refill_s must be >= 0"),
            (self.rescale_timeout_s > 0, "rescale_timeout_s must be > 0"),
            (self.batched_step_size >= 1, "batched_step_size must be >= 1 key group"),
            (self.step_gap_ms >= 0, "step_gap_ms must be >= 0"),
            (self.replication in ("none", "hot", "all"),
             "replication must be 'none', 'hot' or 'all'"),
            (self.replication_period_s > 0, "replication_period_s must be > 0"),
            (0 < self.replication_hot_fraction <= 1, "replication_hot_fraction must be in (0, 1]"),
            (self.transport in ("tcp", "ray"), "transport must be 'tcp' or 'ray'"),
            (bool(self.data_host), "data_host must be an address to bind the data socket to"),
        ]
        for ok, msg in checks:
            if not ok:
                raise JobDefinitionError(f"JobConfig: {msg}")
