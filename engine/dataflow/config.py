"""Job configuration (one frozen dataclass) and the count check every layer shares.

Why: a setting of the wrong type fails far from where it was written (``batch_size=1.5``
surfaces as a slicing error inside a task actor; ``parallelism=True`` deploys one task), so
every value is checked where it is given. Guarantees: a ``JobConfig`` that constructs holds
values of its declared types (numpy integers become ``int``, integers in float fields become
``float``) within their documented ranges; ``check_count`` is the one definition of "a
count" (an integer, never a bool, at least a minimum), used by the builders, the graph, the
sources and the JobMaster's rescale validation. Errors are ``ConfigError`` (a
``JobDefinitionError`` and a ``ValueError``) naming the setting, the value and what is
expected, unless the caller asks for another ``ReflowError`` class.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from dataclasses import dataclass, field
from typing import NoReturn

from engine.errors import ConfigError, ReflowError
from engine.names import StateBackend
from engine.wire.transport import TLS

#: the smallest ``JobConfig.state_memory_bytes``: RocksDB's two write buffers of 1 MiB and a
#: block cache that holds the index and filter blocks of a few files
MIN_STATE_MEMORY_BYTES = 8 << 20


def check_count(
    what: str, value: object, minimum: int = 1, error: type[ReflowError] = ConfigError,
) -> int:
    """``value`` as an ``int`` when it is an integer >= ``minimum``; otherwise raise
    ``error(message)`` with a message naming ``what``, the value given and what is expected.

    Booleans are not counts (``True`` is an ``int`` in Python, but ``parallelism=True`` is a
    slip, not a request for one task); floats are not, even ``2.0``; numpy integers are, and
    come back as ``int`` (so they encode on the wire). ``what`` is the reader's name for the
    setting, e.g. ``"operator 'count': parallelism"`` or ``"JobConfig: batch_size"``;
    ``error`` must take the message as its only required argument (``JobDefinitionError``,
    ``RescaleRefused``, ...).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(
            f"{what} must be an integer >= {minimum}; got {value!r} ({type(value).__name__})"
        )
    if value < minimum:
        raise error(f"{what} must be an integer >= {minimum}; got {value!r}")
    return int(value)


# What each annotation of a JobConfig field accepts, for the message of a refused value.
_EXPECTED = {
    "int": "an integer", "float": "a number (not NaN)", "bool": "True or False", "str": "a string",
    "TLS": "an engine.wire.transport.TLS",
}


def _typed(name: str, annotation: str, value: object) -> object:
    """``value`` checked against a field annotation (``int``, ``float``, ``bool``, ``str``,
    each optionally ``| None``) and normalised to that builtin type; ``ConfigError`` else.
    Another annotation is passed through unchecked (tests/unit/test_validation.py fails
    until this function learns it)."""
    optional = annotation.endswith(" | None")
    base = annotation.removesuffix(" | None")
    if value is None and optional:
        return None
    if base == "int":
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)
    elif base == "float":
        if (isinstance(value, numbers.Real) and not isinstance(value, bool)
                and not math.isnan(value)):
            return float(value)
    elif base == "bool":
        if isinstance(value, bool):
            return value
    elif base == "str":
        if isinstance(value, str):
            return value
    elif base == "TLS":
        if isinstance(value, TLS):
            return value
    else:  # a type this check does not know yet: never fail a user's job over it
        return value
    _refuse(name, annotation, value)


def _refuse(name: str, annotation: str, value: object) -> NoReturn:
    """``ConfigError``: field ``name`` (of that annotation) does not take ``value``."""
    base = annotation.removesuffix(" | None")
    expected = _EXPECTED[base] + (" or None" if annotation.endswith(" | None") else "")
    raise ConfigError(
        f"JobConfig: {name} must be {expected}; got {value!r} ({type(value).__name__})"
    )


def _metrics_host_default() -> str:
    return os.environ.get("REFLOW_METRICS_HOST") or "127.0.0.1"


def _data_host_default() -> str:
    return os.environ.get("REFLOW_DATA_HOST") or "127.0.0.1"


#: the variables that give ``JobConfig.tls`` its default (certificate, key, CA), so a
#: deployment (``deploy/k8s``: a Secret mounted in every pod) turns the data transport's TLS
#: on without changing the job's code
TLS_ENV = ("REFLOW_TLS_CERT_FILE", "REFLOW_TLS_KEY_FILE", "REFLOW_TLS_CA_FILE")


def tls_from_env() -> TLS | None:
    """``TLS(cert, key, ca)`` of ``REFLOW_TLS_CERT_FILE`` / ``REFLOW_TLS_KEY_FILE`` /
    ``REFLOW_TLS_CA_FILE`` (optional: default the certificate itself), None when none is
    set. ``ConfigError`` naming the variable when one of the pair is missing or a variable
    names no file on this machine (the driver's: the JobConfig is made there and the tasks
    read the same paths, so a missing mount fails the job at its start rather than at each
    task's first connection)."""
    cert, key, ca = (os.environ.get(name, "").strip() for name in TLS_ENV)
    if not (cert or key or ca):
        return None
    unset = [name for name, value in zip(TLS_ENV[:2], (cert, key), strict=True) if not value]
    if unset:
        raise ConfigError(
            f"JobConfig: tls from the environment needs both {TLS_ENV[0]} and {TLS_ENV[1]}; "
            f"{' and '.join(unset)} {'is' if len(unset) == 1 else 'are'} not set (set it, or "
            "unset the other REFLOW_TLS_* variables to run without TLS)")
    for name, path in zip(TLS_ENV, (cert, key, ca), strict=True):
        if path and not os.path.isfile(path):
            raise ConfigError(
                f"JobConfig: {name}={path!r} names no file on this node (a TLS "
                "certificate, key or CA in PEM; on Kubernetes, is the Secret mounted "
                "there?); give the file on every node, or unset the REFLOW_TLS_* "
                "variables to run without TLS")
    return TLS(cert, key, ca or None)


def _metrics_port_default() -> int | None:
    """``REFLOW_METRICS_PORT`` as an int (a value that is not one is refused, naming it, as
    the type check refuses a bad ``metrics_port``), else 0."""
    text = os.environ.get("REFLOW_METRICS_PORT", "").strip()
    if not text:
        return 0
    if not text.isdigit():
        _refuse("metrics_port", "int | None", text)
    return int(text)


@dataclass(frozen=True)
class JobConfig:
    """Knobs of a deployed job.

    ``batch_size``/``linger_ms``: a channel sends a frame when it holds this many records or
    its oldest record waited this long; a source task that read all that was due polls
    again no sooner than the smaller of 1 ms and ``linger_ms`` later
    (``engine.task.source.poll_interval``). ``credits``: unacknowledged frames a sender may have
    on one channel (a frame is acknowledged when the receiver takes it for processing), so a
    task holds at most ``credits`` frames per input channel. ``metrics_host``: the address
    the job's Prometheus endpoint binds to (default ``REFLOW_METRICS_HOST``, else
    127.0.0.1); ``metrics_port``: 0 picks a free port, None disables the endpoint (default
    ``REFLOW_METRICS_PORT``, else 0). The variables let a deployment (``deploy/k8s``) open
    the endpoint on the pod network without changing the job's code. ``task_num_cpus``: CPUs each task actor reserves
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
    actors costs CPU, which the rescale should not compete with); a restart after a
    failure also takes one for each task whose process died.
    ``recovery_reuses_processes``: a restart after a failure turns the task actors that are
    still alive into standby actors (``recycle``: stopped as if killed) and makes them the
    restarted tasks, each its former task where it can, instead of starting a process per
    task (a few seconds each on a loaded machine); only the dead tasks' processes are new
    (or warm standby actors). False: every task actor is killed and started anew.
    ``rescale_timeout_s``: how long a rescale phase or subscale may take before the job fails.
    ``control_timeout_s``: how long the driver's ``JobHandle`` waits for the JobMaster to
    answer ``status``/``metrics``/``set_replication`` (the JobMaster waits half of it for
    each task's metrics and reports the tasks that did not answer as unresponsive);
    ``ControlTimeout`` when it does not (see ``JobHandle`` for the other calls' deadlines).
    ``batched_step_size``/``batched_matching``: key groups per step of the ``batched``
    protocol, or steps in which every task sends and receives at most one group.
    ``step_gap_ms``: pause between the steps of step-wise protocols (fluid, batched,
    non-disruptive).
    ``replication``: which key groups of keyed operators keep a replica on another task
    during normal processing ("none", "hot": the ``replication_hot_fraction`` busiest, "all"),
    refreshed every ``replication_period_s`` with the changes since the last refresh; a
    migration to the replica's holder then ships only those changes.
    ``transport``: how data frames travel between tasks: "tcp" (default) over a direct
    socket per pair of task actors (``engine.wire.transport``; a frame costs a write and a read),
    or "ray" as one actor call per frame (~1.3 ms of CPU over both ends). ``data_host``: the
    address each task's data socket binds to and is reached at: 127.0.0.1 by default, which
    serves a single machine (a local Ray cluster, several raylets on one host included); on a
    multi-machine cluster set it to "0.0.0.0" (each task then advertises its node's address)
    or use ``transport="ray"`` (default: ``REFLOW_DATA_HOST``, else 127.0.0.1).
    ``tls``: a ``TLS`` makes the data transport's connections mutually authenticated TLS
    (``transport="tcp"`` only; None: plain TCP, with the per-task token as the only check;
    default: the files named by ``REFLOW_TLS_CERT_FILE`` / ``REFLOW_TLS_KEY_FILE`` /
    ``REFLOW_TLS_CA_FILE`` when set, ``tls_from_env``, and not used with
    ``transport="ray"``; else None).
    ``max_frame_bytes``: the largest data frame a task sends or accepts; a connection whose
    length field announces more is closed before anything is allocated, and a sender whose
    batch encodes to more fails naming the operator and this setting (lower
    ``batch_size`` or raise the limit).
    ``checkpoint_interval_s``: take an aligned checkpoint this often (None: no periodic
    checkpoints; the default); it is written under ``checkpoint_dir`` (a local path or any
    URI pyarrow.fs takes, e.g. ``s3://bucket/path``; None: ``reflow-checkpoints`` in the
    system's temporary directory, which serves one machine) as ``<job id>/chk-<n>``, and
    the last ``checkpoints_retained`` stay there. A checkpoint that does not complete
    within ``checkpoint_timeout_s`` fails; more than ``tolerable_checkpoint_failures``
    failed checkpoints in a row fail the job.
    ``restart_strategy``: what a failure (a task died, a user function raised) does:
    "fixed-delay" restarts every task from the last complete checkpoint (from the start of
    the input when there is none) after ``restart_delay_s``, at most ``restart_attempts``
    times over the job's life; "none" fails the job. None: "fixed-delay" when checkpoints
    are on, "none" otherwise.
    ``live_rescaling``: False switches off the per-frame and per-timer checks that live
    migration needs (only ``stop-restart`` is then accepted); it exists to measure what
    rescaling support costs in steady state.
    ``drrs_pacing``: drrs starts at most as many subscales at once as the machine's idle
    cores allow (half a core each, between 1 and ``drrs_max_subscales``), measured while it
    runs (``migration.pacing``), and lets a subscale's new owner have up to
    ``drrs_max_chunk_bytes`` of state in flight beyond one group (pulls several groups at
    once) when at least 1.5 cores are idle, one group at a time below half a core idle,
    linear between; False: always ``drrs_max_subscales`` and ``drrs_max_chunk_bytes``.
    ``group_load_sample_every``: a keyed task counts its records per key group (the load
    rescale planning asks for with ``GroupStatsRequest``) on one frame in this many and
    scales the counts to all its records (``engine.observability.groupstats``); 1 counts every frame.
    ``state_backend``: where keyed tasks keep their state (``StateBackend``): "memory"
    (default; Python dicts, fastest while the state fits the task's memory) or "rocksdb"
    (RocksDB on the node's local disk: state larger than memory, at some cost per
    access). ``state_dir``: the local directory under which each RocksDB task keeps its
    database, as ``<state_dir>/<job id>/<task>/<instance>`` (one directory per running
    task, never shared; what a killed task left is removed when the task starts again on
    that node; None: ``reflow-state`` in the node's temporary directory).
    ``state_memory_bytes``: the memory each RocksDB task gives its state (a quarter as
    RocksDB's write buffers, an eighth as the cache of decoded values in front of it, a
    32nd as the caches of the timers kept in it, the rest as block cache; at least 8 MiB);
    state and timers beyond it live on disk.
    Both are ignored by the "memory" backend.
    ``incremental_checkpoints``: a periodic checkpoint writes only what changed since the
    previous one: on "rocksdb" the DB's SST files written since (``engine.state.
    sst_checkpoints``), on "memory", per key group, the changed keys' values and tombstones
    as a delta blob chained to the group's last full blob (``engine.state.incremental``);
    it refers to the earlier checkpoints' files for the rest; retention then deletes a
    file only when no retained checkpoint refers to it (``engine.checkpoints.shared``). Flink's
    ``state.backend.incremental``. Savepoints stay whole and self-contained. False
    (default): every checkpoint writes every key group whole, and nothing is tracked.
    ``local_recovery``: each task also keeps its checkpoint parts on its node's disk (a
    hard link to the stored file when the store is the local filesystem, a copy
    otherwise; under ``state_dir``), and a task restored on that node reads them instead
    of the store, each key group checked against its checksum (the store when a copy is
    missing or does not match; ``engine.checkpoints.local``); an SST-level checkpoint's
    files (RocksDB, incremental) are hard links of the DB's files, used when their size
    matches, their blocks checked by RocksDB as it reads them. Flink's
    ``state.backend.local-recovery``. It pays when the store is remote; it costs a second
    write of each part to the local disk and that disk's space for the last checkpoints.
    """

    batch_size: int = 1000
    linger_ms: float = 5.0
    credits: int = 4
    latency_marker_interval_ms: float = 100.0
    metrics_host: str = field(default_factory=_metrics_host_default)
    metrics_port: int | None = field(default_factory=_metrics_port_default)
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
    recovery_reuses_processes: bool = True
    rescale_timeout_s: float = 300.0
    control_timeout_s: float = 5.0
    batched_step_size: int = 4
    batched_matching: bool = False
    step_gap_ms: float = 0.0
    replication: str = "none"
    replication_period_s: float = 5.0
    replication_hot_fraction: float = 0.2
    live_rescaling: bool = True
    transport: str = "tcp"
    data_host: str = field(default_factory=_data_host_default)
    tls: TLS | None = field(default_factory=tls_from_env)
    max_frame_bytes: int = 64 * 1024 * 1024
    group_load_sample_every: int = 8
    drrs_pacing: bool = True
    drrs_max_chunk_bytes: int = 4_000_000
    checkpoint_interval_s: float | None = None
    checkpoint_dir: str | None = None
    checkpoints_retained: int = 3
    checkpoint_timeout_s: float = 600.0
    tolerable_checkpoint_failures: int = 3
    restart_strategy: str | None = None
    restart_attempts: int = 3
    restart_delay_s: float = 1.0
    state_backend: str = StateBackend.MEMORY
    state_dir: str | None = None
    state_memory_bytes: int = 128 << 20
    incremental_checkpoints: bool = False
    local_recovery: bool = False

    def __post_init__(self) -> None:
        """Refuse (``ConfigError``, naming the field, the value and what is expected) a
        field of the wrong type, then one out of its range."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            typed = _typed(f.name, str(f.type), value)
            if typed is not value:
                object.__setattr__(self, f.name, typed)
        if self.transport == "ray" and self.tls is not None and (
                self.tls.cert_file, self.tls.key_file, self.tls.ca_file) == tuple(
                os.environ.get(name, "").strip() or None for name in TLS_ENV):
            # the deployment's TLS is for the tcp transport's sockets; actor calls have none
            object.__setattr__(self, "tls", None)
        checks = [
            ("batch_size", self.batch_size >= 1, ">= 1"),
            ("linger_ms", self.linger_ms >= 0, ">= 0"),
            ("credits", self.credits >= 1, ">= 1 (a channel needs one frame in flight)"),
            ("latency_marker_interval_ms", self.latency_marker_interval_ms > 0, "> 0"),
            ("metrics_port", self.metrics_port is None or 0 <= self.metrics_port < 65536,
             "a port number, 0 (any free port), or None (no endpoint)"),
            ("metrics_poll_interval_s", self.metrics_poll_interval_s > 0, "> 0"),
            ("task_num_cpus", self.task_num_cpus >= 0, ">= 0"),
            ("source_poll_records", self.source_poll_records >= 1, ">= 1"),
            ("timer_check_interval_ms", self.timer_check_interval_ms > 0, "> 0"),
            ("drrs_set_aside_cap", self.drrs_set_aside_cap >= 1, ">= 1 record"),
            ("drrs_subscale_size", self.drrs_subscale_size >= 1, ">= 1 key group"),
            ("drrs_subscale_bytes",
             self.drrs_subscale_bytes is None or self.drrs_subscale_bytes >= 1,
             ">= 1 byte or None (no byte budget)"),
            ("drrs_max_subscales_per_task", self.drrs_max_subscales_per_task >= 1, ">= 1"),
            ("drrs_max_subscales",
             self.drrs_max_subscales is None or self.drrs_max_subscales >= 1,
             ">= 1 or None (as many as the cluster's CPUs)"),
            ("warm_standby_tasks", self.warm_standby_tasks >= 0, ">= 0"),
            ("warm_standby_refill_s", self.warm_standby_refill_s >= 0, ">= 0"),
            ("rescale_timeout_s", self.rescale_timeout_s > 0, "> 0"),
            ("control_timeout_s", 0 < self.control_timeout_s < math.inf, "> 0 and finite"),
            ("batched_step_size", self.batched_step_size >= 1, ">= 1 key group"),
            ("step_gap_ms", self.step_gap_ms >= 0, ">= 0"),
            ("replication", self.replication in ("none", "hot", "all"),
             "'none', 'hot' or 'all'"),
            ("replication_period_s", self.replication_period_s > 0, "> 0"),
            ("replication_hot_fraction", 0 < self.replication_hot_fraction <= 1, "in (0, 1]"),
            ("transport", self.transport in ("tcp", "ray"), "'tcp' or 'ray'"),
            ("data_host", bool(self.data_host), "an address to bind the data socket to"),
            ("tls", self.tls is None or self.transport == "tcp",
             "None with transport='ray' (TLS is for the tcp transport's sockets)"),
            ("max_frame_bytes", self.max_frame_bytes >= 1024, ">= 1024 bytes"),
            ("drrs_max_chunk_bytes", self.drrs_max_chunk_bytes >= 0,
             ">= 0 bytes (0: one group in flight at a time)"),
            ("group_load_sample_every", self.group_load_sample_every >= 1,
             ">= 1 (1: count every frame)"),
            ("checkpoint_interval_s",
             self.checkpoint_interval_s is None or 0 < self.checkpoint_interval_s < math.inf,
             "> 0 seconds and finite, or None (no periodic checkpoints)"),
            ("checkpoint_dir", self.checkpoint_dir is None or bool(self.checkpoint_dir),
             "a directory or URI, or None (a temporary directory)"),
            ("checkpoints_retained", self.checkpoints_retained >= 1, ">= 1"),
            ("checkpoint_timeout_s", self.checkpoint_timeout_s > 0, "> 0"),
            ("tolerable_checkpoint_failures", self.tolerable_checkpoint_failures >= 0, ">= 0"),
            ("restart_strategy", self.restart_strategy in (None, "fixed-delay", "none"),
             "'fixed-delay', 'none' or None (fixed-delay when checkpoints are on)"),
            ("restart_attempts", self.restart_attempts >= 0, ">= 0"),
            ("restart_delay_s", 0 <= self.restart_delay_s < math.inf, ">= 0 and finite"),
            ("state_backend", self.state_backend in tuple(StateBackend),
             " or ".join(repr(m.value) for m in StateBackend)),
            ("state_dir", self.state_dir is None or bool(self.state_dir),
             "a local directory, or None (reflow-state in the temporary directory)"),
            ("state_memory_bytes", self.state_memory_bytes >= MIN_STATE_MEMORY_BYTES,
             f">= {MIN_STATE_MEMORY_BYTES} bytes (8 MiB)"),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise ConfigError(
                    f"JobConfig: {name} must be {expected}; got {getattr(self, name)!r}"
                )
        # the member, so it compares and prints as its value and matches by identity
        object.__setattr__(self, "state_backend", StateBackend(self.state_backend))

    @property
    def checkpointing(self) -> bool:
        """Periodic checkpoints are on (sinks then commit at checkpoints: two-phase)."""
        return self.checkpoint_interval_s is not None

    @property
    def restarts(self) -> str:
        """The restart strategy in effect: ``restart_strategy``, or its default."""
        if self.restart_strategy is not None:
            return self.restart_strategy
        return "fixed-delay" if self.checkpointing else "none"
