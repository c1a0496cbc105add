"""The checkpoint coordinator as a sans-IO state machine: trigger, complete, fail, retain.

Why apart from the JobMaster: when a checkpoint is complete, when it has failed, which
checkpoints to keep and when failures fail the job are decisions, and decisions are tested
by stepping them by hand. The JobMaster (``engine.runtime.checkpointing``) only executes
the commands returned here (control calls, writing the metadata, deleting directories) and
feeds back the tasks' reports; the unit harness executes the same commands on task cores.

Protocol (Flink's aligned checkpoints): ``trigger`` sends ``TriggerCheckpoint`` to every
task (sources start the barrier; a task with live inputs only learns the checkpoint exists,
which blocks nothing; a task whose inputs all ended snapshots at once). Each task aligns,
snapshots, writes its part and acknowledges (``CheckpointAck``); once every task of the
deployment at the trigger acknowledged, the metadata is written (``WriteMetadata``), and
once written (``on_written``) the checkpoint is complete: the tasks are told
(``NotifyComplete``: sinks commit), older checkpoints beyond ``checkpoints_retained`` are
discarded. A decline, a failed metadata write, a timeout (``check``) or an abort fails it:
the tasks are told (``NotifyAborted``), its directory is discarded, and more than
``tolerable_checkpoint_failures`` failed checkpoints in a row return ``FailJob``.

Incremental checkpoints (``JobConfig.incremental_checkpoints``): a task acknowledges some
key groups as a delta on, or unchanged from, the group's chain in the job's last complete
*checkpoint* (never a savepoint); the metadata gives every group its chain, the earlier
links as ``../chk-<n>/<file>``. A group whose earlier chain the coordinator does not hold
fails the checkpoint (the tasks then write every group whole). Retention goes through
``SharedFiles``: a retired checkpoint whose files no retained one refers to is deleted
whole (``Discard``), otherwise only its ``_metadata`` and its files no longer referred to
(``DiscardFiles``).

Guarantees: at most one checkpoint is pending; ids grow (also across restarts and
restores); only a complete checkpoint is ever ``latest`` (the one recovery uses); acks of
another checkpoint or of a task not expected are ignored; savepoints are never discarded
and their failures do not count towards the job's failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.checkpoints.metadata import (
    CheckpointKind,
    CheckpointMetadata,
    Link,
    TaskState,
    VertexState,
)
from engine.checkpoints.shared import SharedFiles, own_files
from engine.checkpoints.store import directory_name, join, link_uri
from engine.dataflow.config import JobConfig
from engine.dataflow.deployment import Deployment
from engine.time.clock import Clock
from engine.wire.messages import CheckpointAck, CheckpointDeclined, CheckpointStats

#: how many failed checkpoints' directories are remembered, for parts written late
_FAILED_REMEMBERED = 16

# ---------------------------------------------------------------------- commands


@dataclass(frozen=True)
class TriggerTasks:
    """Send ``TriggerCheckpoint(checkpoint_id, location, stop, savepoint)`` to each of
    ``tasks``."""

    checkpoint_id: int
    location: str
    stop: bool
    tasks: tuple[str, ...]
    savepoint: bool = False


@dataclass(frozen=True)
class WriteMetadata:
    """Write ``metadata`` (its ``_metadata`` file, last); report with ``on_written``."""

    metadata: CheckpointMetadata


@dataclass(frozen=True)
class NotifyComplete:
    """Send ``CheckpointComplete(checkpoint_id)`` to ``tasks`` (sinks commit)."""

    checkpoint_id: int
    tasks: tuple[str, ...]


@dataclass(frozen=True)
class NotifyAborted:
    """Send ``CheckpointAborted(checkpoint_id, forget_uploads)`` to ``tasks`` (stop
    aligning it)."""

    checkpoint_id: int
    tasks: tuple[str, ...]
    forget_uploads: bool = False


@dataclass(frozen=True)
class Discard:
    """Delete these checkpoint directories."""

    locations: tuple[str, ...]


@dataclass(frozen=True)
class DiscardFiles:
    """Retention of incremental checkpoints (``store.discard_files``): the checkpoints at
    ``locations`` stop being checkpoints (``_metadata`` deleted), ``files`` (URIs no
    retained checkpoint refers to) are deleted, emptied directories removed."""

    locations: tuple[str, ...]
    files: tuple[str, ...]


@dataclass(frozen=True)
class FailJob:
    """Too many checkpoints failed in a row: fail the job with ``reason``."""

    reason: str


Command = (TriggerTasks | WriteMetadata | NotifyComplete | NotifyAborted | Discard
           | DiscardFiles | FailJob)


@dataclass(frozen=True)
class Outcome:
    """How checkpoint ``checkpoint_id`` ended: ``metadata`` when complete, else ``reason``
    (and the ``task`` that declined it, if one did)."""

    checkpoint_id: int
    kind: CheckpointKind
    metadata: CheckpointMetadata | None = None
    reason: str = ""
    task: str = ""

    @property
    def completed(self) -> bool:
        return self.metadata is not None


@dataclass
class _Pending:
    checkpoint_id: int
    kind: CheckpointKind
    location: str
    stop: bool
    started: float  # monotonic
    created_at: float  # wall clock
    vertices: tuple[VertexState, ...]
    expected: dict[str, tuple[str, int]]  # task -> (vertex, index)
    acks: dict[str, CheckpointAck] = field(default_factory=dict)
    writing: bool = False
    metadata: CheckpointMetadata | None = None


def vertices_of(dep: Deployment) -> tuple[VertexState, ...]:
    """The deployment's vertices as a checkpoint records them."""
    return tuple(VertexState(v.name, tuple(op.name for op in v.operators), v.parallelism,
                             v.keyed, v.is_source, dep.assignments.get(v.name, ()),
                             dep.partitions.get(v.name, ()))
                 for v in dep.plan.vertices)


class CheckpointCoordinator:
    """One job's checkpoints (see the module doc). ``root``: the job's checkpoint directory
    (``<checkpoint_dir>/<job id>``)."""

    def __init__(self, job_id: str, job_name: str, num_key_groups: int, config: JobConfig,
                 clock: Clock, root: str) -> None:
        self.job_id, self.job_name = job_id, job_name
        self.num_key_groups = num_key_groups
        self.config = config
        self.clock = clock
        self.root = root
        self.pending: _Pending | None = None
        self.next_id = 1
        self.retained: list[CheckpointMetadata] = []  # complete checkpoints, oldest first
        self.latest: CheckpointMetadata | None = None  # the one recovery uses
        self.consecutive_failures = 0
        self.completed = 0
        self.failed = 0
        self.last_failure = ""
        self.restored_from = ""
        self.outcomes: list[Outcome] = []  # for whoever waits on a checkpoint
        self.shared = SharedFiles()  # the retained checkpoints' files
        # failed checkpoints' directories, whose late parts are deleted as they come
        self._failed_locations: dict[int, str] = {}
        self._last_trigger: float | None = None

    # -- when
    def due(self) -> bool:
        """A periodic checkpoint is due: checkpoints are on, none is pending, and the
        interval passed since the last one was triggered (or since the first ask)."""
        interval = self.config.checkpoint_interval_s
        if interval is None or self.pending is not None:
            return False
        now = self.clock.monotonic()
        if self._last_trigger is None:
            self._last_trigger = now
        return now - self._last_trigger >= interval

    # -- trigger
    def trigger(self, dep: Deployment, kind: CheckpointKind = CheckpointKind.CHECKPOINT,
                location: str | None = None, stop: bool = False) -> list[Command]:
        """Start checkpoint ``next_id`` of ``dep``'s tasks (written to ``location``; by
        default ``<root>/chk-<id>``). ``stop``: a stop-with-savepoint."""
        if self.pending is not None:
            raise RuntimeError(f"checkpoint {self.pending.checkpoint_id} is still pending")
        cid = self.next_id
        self.next_id += 1
        loc = location if location is not None else join(self.root, f"chk-{cid}")
        self._last_trigger = self.clock.monotonic()
        expected = {t: (v.name, i) for v in dep.plan.vertices
                    for i, t in enumerate(dep.tasks[v.name])}
        self.pending = _Pending(cid, CheckpointKind.parse(kind, "checkpoint kind"), loc, stop,
                                self._last_trigger, self.clock.now(), vertices_of(dep),
                                expected)
        return [TriggerTasks(cid, loc, stop, tuple(expected),
                             self.pending.kind == CheckpointKind.SAVEPOINT)]

    # -- what tasks say
    def on_report(self, msg: Any) -> list[Command]:
        """A task's ``CheckpointAck`` or ``CheckpointDeclined`` (anything else: nothing).
        One for a checkpoint that failed meanwhile deletes its directory again: the task
        wrote its part after the failure's ``Discard``, and nothing else would."""
        if isinstance(msg, (CheckpointAck, CheckpointDeclined)):
            late = self._failed_locations.get(msg.checkpoint_id)
            if late is not None:
                return [Discard((late,))]
        p = self.pending
        if p is None or p.writing:
            return []
        if isinstance(msg, CheckpointAck):
            if msg.checkpoint_id != p.checkpoint_id or msg.task not in p.expected:
                return []
            p.acks[msg.task] = msg
            if len(p.acks) < len(p.expected):
                return []
            missing = self._missing_chain(p)
            if missing is not None:
                return self._fail(*missing, forget_uploads=True)
            p.metadata = self._metadata(p)
            p.writing = True
            return [WriteMetadata(p.metadata)]
        if isinstance(msg, CheckpointDeclined) and msg.checkpoint_id == p.checkpoint_id:
            return self._fail(f"task {msg.task} declined it: {msg.reason}", msg.task)
        return []

    def _metadata(self, p: _Pending) -> CheckpointMetadata:
        order = {t: i for i, t in enumerate(p.expected)}  # the deployment's order
        acks = sorted(p.acks.values(), key=lambda a: order[a.task])
        chained = any(a.deltas or a.unchanged for a in acks)
        previous = self._previous_chains(p) if chained else {}
        tasks = tuple(TaskState(a.task, *p.expected[a.task], a.file, a.groups, a.source_state,
                                a.transactions, a.bytes, a.alignment_s, a.sync_s, a.async_s,
                                self._chains(a, p.expected[a.task][0], previous)
                                if chained else (), a.db_files)
                      for a in acks)
        return CheckpointMetadata(
            p.checkpoint_id, p.kind, self.job_id, self.job_name, p.created_at,
            self.num_key_groups, p.vertices, tasks,
            self.clock.monotonic() - p.started, p.location)

    def _previous_chains(self, p: _Pending) -> dict[tuple[str, int], tuple[Link, ...]]:
        """The chains of the last retained checkpoint, ``(vertex, key group) -> links``,
        the links as the pending checkpoint names them (``../chk-<n>/<file>``)."""
        if not self.retained or p.location != join(self.root, f"chk-{p.checkpoint_id}"):
            return {}
        prev = self.retained[-1]
        here = directory_name(prev.location)
        out: dict[tuple[str, int], tuple[Link, ...]] = {}
        for t in prev.tasks:
            if t.chains:
                for kg, links in t.chains:
                    out[(t.vertex, kg)] = tuple(
                        (f if f.startswith("../") else f"../{here}/{f}", o, n, c)
                        for f, o, n, c in links)
            else:
                for kg, o, n, c in t.groups:
                    out[(t.vertex, kg)] = ((f"../{here}/{t.file}", o, n, c),)
        return out

    def _missing_chain(self, p: _Pending) -> tuple[str, str] | None:
        """Why the pending checkpoint cannot be composed, and the task that says so: a
        task built a group on a chain the job's last checkpoint does not hold, or on a
        checkpoint newer than it (its deltas lack the changes between; e.g. the task
        heard of a completion that a JobMaster taking over did not find), or named a
        file of its DB in an earlier checkpoint that no retained checkpoint holds (None:
        it can be)."""
        held = self.shared.files()
        for a in p.acks.values():
            for f, _ in a.db_files:
                if f.startswith("../") and link_uri(p.location, f) not in held:
                    return (f"task {a.task} refers to {f}, which no retained checkpoint "
                            "holds; the next checkpoint uploads its files again", a.task)
        acks = [a for a in p.acks.values() if a.deltas or a.unchanged]
        if not acks:
            return None
        last = self.retained[-1].checkpoint_id if self.retained else -1
        for a in acks:
            if a.base_checkpoint < 0 or a.base_checkpoint > last:
                return (f"task {a.task} wrote key groups as changes to checkpoint "
                        f"{a.base_checkpoint}, but the job's last complete checkpoint is "
                        f"{last}; the next checkpoint writes every group whole", a.task)
        previous = self._previous_chains(p)
        for a in acks:
            vertex = p.expected[a.task][0]
            for kg in (*a.deltas, *a.unchanged):
                if (vertex, kg) not in previous:
                    return (f"task {a.task} wrote key group {kg} of {vertex!r} as a change to "
                            "the previous checkpoint, which does not hold it; the next "
                            "checkpoint writes every group whole", a.task)
        return None

    @staticmethod
    def _chains(a: CheckpointAck, vertex: str,
                previous: dict[tuple[str, int], tuple[Link, ...]]
                ) -> tuple[tuple[int, tuple[Link, ...]], ...]:
        """One task's groups as chains, base first (``_missing_chain`` found every chain
        a delta or an unchanged group builds on)."""
        deltas = set(a.deltas)
        out: list[tuple[int, tuple[Link, ...]]] = []
        for kg, o, n, c in a.groups:
            own: Link = (a.file, o, n, c)
            out.append((kg, (*previous[(vertex, kg)], own) if kg in deltas else (own,)))
        out.extend((kg, previous[(vertex, kg)]) for kg in a.unchanged)
        return tuple(sorted(out))

    def on_written(self, checkpoint_id: int, error: str | None = None) -> list[Command]:
        """The metadata of ``checkpoint_id`` was written (``error`` None) or not."""
        p = self.pending
        if p is None or p.checkpoint_id != checkpoint_id:
            return []
        if error is not None:
            p.writing = False
            return self._fail(f"its metadata could not be written: {error}")
        meta = p.metadata if p.metadata is not None else self._metadata(p)
        self.pending = None
        self.latest = meta
        self.completed += 1
        self.outcomes.append(Outcome(meta.checkpoint_id, meta.kind, meta))
        tasks = tuple(p.expected)
        out: list[Command] = [NotifyComplete(checkpoint_id, tasks)]
        if p.kind == CheckpointKind.CHECKPOINT:
            self.consecutive_failures = 0
            # the retained list may have been set or cut by a takeover or a recovery
            dropped = self.shared.sync(self.retained)
            self.retained.append(meta)
            self.shared.register(meta)
            old = self.retained[:-self.config.checkpoints_retained]
            self.retained = self.retained[-self.config.checkpoints_retained:]
            out += self._retire(dropped + old)
        return out

    def _retire(self, old: list[CheckpointMetadata]) -> list[Command]:
        """Delete retired checkpoints, keeping every file a retained one refers to."""
        whole: list[str] = []
        partial: list[str] = []
        files: list[str] = []
        for m in old:
            freed = set(self.shared.release(m))
            if own_files(m) <= freed:
                whole.append(m.location)
                freed -= own_files(m)
            else:
                partial.append(m.location)
            files += sorted(freed)
        out: list[Command] = []
        if whole:
            out.append(Discard(tuple(whole)))
        if partial or files:
            out.append(DiscardFiles(tuple(partial), tuple(files)))
        return out

    # -- failures
    def check(self) -> list[Command]:
        """Fail the pending checkpoint when it ran longer than ``checkpoint_timeout_s``."""
        p = self.pending
        if p is None or p.writing:
            return []
        limit = self.config.checkpoint_timeout_s
        if self.clock.monotonic() - p.started < limit:
            return []
        missing = sorted(t for t in p.expected if t not in p.acks)
        return self._fail(f"it did not complete within checkpoint_timeout_s={limit:g} s; "
                          f"no acknowledgement from {', '.join(missing[:5])}"
                          f"{' and more' if len(missing) > 5 else ''}")

    def abort(self, reason: str) -> list[Command]:
        """Give up the pending checkpoint (the job restarts or stops): it fails without
        counting towards ``tolerable_checkpoint_failures``; no task is told (they go)."""
        p = self.pending
        if p is None:
            return []
        self.pending = None
        self.failed += 1
        self.last_failure = f"checkpoint {p.checkpoint_id} aborted: {reason}"
        self.outcomes.append(Outcome(p.checkpoint_id, p.kind, reason=reason))
        return [Discard((p.location,))] if p.kind == CheckpointKind.CHECKPOINT else []

    def _fail(self, reason: str, task: str = "", forget_uploads: bool = False
              ) -> list[Command]:
        """Fail the pending checkpoint. ``forget_uploads``: the tasks' records of what
        retained checkpoints hold are wrong (a part named a file none holds); any other
        failure leaves the retained checkpoints, and so those records, as they were."""
        p = self.pending
        assert p is not None
        self.pending = None
        self.failed += 1
        self.last_failure = f"{p.kind} {p.checkpoint_id} failed: {reason}"
        self.outcomes.append(Outcome(p.checkpoint_id, p.kind, reason=reason, task=task))
        out: list[Command] = [NotifyAborted(p.checkpoint_id, tuple(p.expected),
                                            forget_uploads)]
        if p.kind == CheckpointKind.CHECKPOINT:
            out.append(Discard((p.location,)))
            self._failed_locations[p.checkpoint_id] = p.location
            while len(self._failed_locations) > _FAILED_REMEMBERED:
                del self._failed_locations[next(iter(self._failed_locations))]
            self.consecutive_failures += 1
            limit = self.config.tolerable_checkpoint_failures
            if self.consecutive_failures > limit:
                out.append(FailJob(
                    f"{self.consecutive_failures} checkpoints failed in a row (more than "
                    f"tolerable_checkpoint_failures={limit}); the last: {self.last_failure}"))
        return out

    # -- restores
    def restored(self, meta: CheckpointMetadata) -> None:
        """The job now runs from ``meta``: it is the checkpoint a failure goes back to until
        a newer one completes, and ids continue after it. The retained list as it is now
        (a takeover's, read from the store) is registered at once: a checkpoint of it that
        a recovery drops before the next one completes is then deleted with its files,
        not left behind as a complete checkpoint no one retains."""
        self.latest = meta
        self.next_id = max(self.next_id, meta.checkpoint_id + 1)
        self.restored_from = meta.location
        self.shared.sync(self.retained)

    # -- what it says
    def take_outcomes(self) -> list[Outcome]:
        out, self.outcomes = self.outcomes, []
        return out

    def stats(self) -> CheckpointStats:
        m = self.latest
        if m is None:
            return CheckpointStats(self.completed, self.failed, last_failure=self.last_failure,
                                   restored_from=self.restored_from)
        return CheckpointStats(
            self.completed, self.failed, m.checkpoint_id, m.location, m.duration_s, m.bytes,
            tuple((t.task, t.alignment_s) for t in m.tasks), self.last_failure,
            self.restored_from)


__all__ = ["CheckpointCoordinator", "Command", "Discard", "DiscardFiles", "FailJob", "NotifyAborted",
           "NotifyComplete", "Outcome", "TriggerTasks", "WriteMetadata", "vertices_of"]
