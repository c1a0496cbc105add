"""A task's part of checkpoints and of exactly-once output: ``CheckpointParticipant``.

Why apart from the core: aligning checkpoint barriers, assembling the task's snapshot and
the two-phase commit of its sinks are one protocol with its own state (the barriers
pending, the transactions waiting for a checkpoint to complete, the source positions to
confirm); the task core (``engine.task.core``) only stores, schedules and processes. As
with migration (``engine.task.migration_hooks``), the two meet at narrow interfaces: the
core hands the participant its control messages (``handlers``) and its checkpoint barriers
and channel changes (``on_barrier``, ``on_end``, ``set_channels``); the participant acts on
the task only through ``CheckpointHost`` and the task's operator chain and output router.
This is Flink's ``SubtaskCheckpointCoordinator``.

Format. Takes ``TriggerCheckpoint`` (a source, or a task whose inputs all ended),
``CheckpointBarrier`` events, ``CheckpointComplete``/``CheckpointAborted`` from the
JobMaster, ``CommitTransactions`` (a restore) and ``AdoptTransactions`` (a removed peer's
output). Produces ``snapshots`` (``TaskSnapshot``, for the shell to write:
``engine.checkpoints.snapshot.persist``) and forwards the barrier downstream.

Guarantees (Flink's aligned barriers, ``engine.task.alignment``):

* a source snapshots at ``TriggerCheckpoint`` and sends the barrier; another task snapshots
  once every live input delivered it (or ended): its key groups with their timers, its
  sinks' ``pre_commit`` transactions, then forwards the barrier;
* a transaction is committed only once a checkpoint that holds it completed, together with
  those of earlier checkpoints (a failed checkpoint's wait for the next complete one); a
  source's readers learn the newest position a completed checkpoint holds;
* with checkpoints on, a task at the end of its input keeps its writers open: what they
  wrote since the last checkpoint is committed by the job's final checkpoint, not at close;
  a task removed by a scale-in hands its uncommitted output over (``hand_over``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from engine.checkpoints.snapshot import TaskSnapshot
from engine.checkpoints.store import directory_name, parent_location, part_file_name
from engine.dataflow import graph as g
from engine.errors import CodecError
from engine.io.sources import PartitionedReader
from engine.operators.chain import OperatorChain
from engine.state.incremental import ChainRecord, take_incremental
from engine.state.keyed import KeyedStateBackend
from engine.state.sst_checkpoints import DbPlan, SstRecord
from engine.task.alignment import Aligned, BarrierAligner
from engine.task.channel import OutputRouter
from engine.task.reply import ACK, Reply
from engine.task.spec import CREATED, FAILED, FINISHED, RUNNING, TaskSpec, TaskStatus
from engine.time.clock import Clock
from engine.wire.codec import pack_exact
from engine.wire.messages import (
    AdoptTransactions,
    CheckpointAborted,
    CheckpointBarrier,
    CheckpointComplete,
    CommitTransactions,
    TriggerCheckpoint,
)

Transactions = tuple[tuple[str, Any], ...]  # (sink writer, transaction)


class CheckpointHost(Protocol):
    """What the checkpoint participant may use of its task, and all it may (``TaskCore``)."""

    @property
    def status(self) -> TaskStatus: ...

    @property
    def reader(self) -> PartitionedReader | None:
        """A source task's reader (None before ``Start`` and for other tasks)."""

    @property
    def migrating(self) -> bool:
        """Key groups are moving through the task (a rescale's subscale runs here)."""

    def fail(self, operator: str, record: str, cause: str, permanent: bool = False) -> None:
        """Fail the task and report why."""

    def quiesce(self) -> None:
        """A stop-with-savepoint's barrier passed: read and fire nothing more until
        ``Resume``."""


def unencodable_state(backend: KeyedStateBackend, operator: str, exc: CodecError) -> str:
    """What a checkpoint of ``operator``'s keyed state could not encode, and what to do."""
    for kg in backend.owned():
        for name, table in backend.groups.get(kg, {}).items():
            for key, value in table.items():
                try:
                    pack_exact([key, value])
                except CodecError as err:
                    return (f"keyed state {name!r} of operator {operator!r} holds a value "
                            f"that cannot be encoded for a checkpoint (key {key!r:.60}, "
                            f"{type(value).__name__}: {err}); keep msgpack types (int, "
                            "float, str, bytes, bool, None, list, tuple, dict) in state, or "
                            "declare a codec for the type (engine.wire.codec.register_codec / "
                            "register_dataclass)")
    return (f"keyed state of operator {operator!r} cannot be encoded for a checkpoint: {exc}; "
            "declare a codec for its types (engine.wire.codec.register_codec)")


class CheckpointParticipant:
    """One task's checkpoints and two-phase commit (see the module doc). ``aligner``: the
    alignment of checkpoint barriers over the task's live inputs (the core does not read a
    channel it blocks); ``snapshots``: the task's parts of checkpoints, for the shell."""

    def __init__(self, host: CheckpointHost, spec: TaskSpec, chain: OperatorChain,
                 router: OutputRouter, clock: Clock) -> None:
        self.host = host
        self.spec = spec  # name, vertex, index, operators[0]: a change of logic keeps them
        self.chain = chain
        self.router = router
        self.clock = clock
        self.aligner = BarrierAligner(clock.monotonic)
        self.is_blocked: Callable[[int], bool] = self.aligner.is_blocked
        self.snapshots: list[TaskSnapshot] = []
        self._barriers: dict[int, CheckpointBarrier] = {}  # pending: location, stop
        self._pending_txns: dict[int, Transactions] = {}
        self._pending_sources: dict[int, dict[str, Any]] = {}  # until CheckpointComplete
        self._adopted: list[tuple[str, Any]] = []  # a removed peer's, for the next checkpoint
        #: exactly-once sinks keep their output invisible until a checkpoint commits it
        self.two_phase = spec.config.checkpointing
        self.writers_open = True
        #: incremental checkpoints: the chains this task wrote (None: every group whole),
        #: or, on a backend with files of its own (RocksDB), the SST files it uploaded
        self.chains: ChainRecord | None = None
        self.ssts: SstRecord | None = None
        if spec.config.incremental_checkpoints and chain.backend is not None:
            if chain.backend.has_files:
                self.ssts = SstRecord()
            else:
                chain.backend.enable_incremental()
                self.chains = ChainRecord()
        if self.two_phase:
            chain.begin_transactions()

    def handlers(self) -> dict[type, Callable[[Any], Reply]]:
        """The control messages this participant takes, by type."""
        return {TriggerCheckpoint: self._trigger, CheckpointComplete: self._complete,
                CheckpointAborted: self._aborted, CommitTransactions: self._commit_restored,
                AdoptTransactions: self._adopt}

    # ------------------------------------------------------------ events from the core
    def on_barrier(self, channel_id: int, barrier: CheckpointBarrier) -> None:
        """A checkpoint barrier arrived on ``channel_id``."""
        self._barriers.setdefault(barrier.checkpoint_id, barrier)
        self._on_aligned(self.aligner.on_barrier(channel_id, barrier.checkpoint_id))

    def on_end(self, channel_id: int) -> None:
        """An input ended: it counts as aligned, a pending checkpoint may complete."""
        self._on_aligned(self.aligner.on_end(channel_id))

    def set_channels(self, live: Iterable[int]) -> None:
        """The task's live inputs changed."""
        self._on_aligned(self.aligner.set_channels(live))

    # ------------------------------------------------------------ control messages
    def _trigger(self, msg: TriggerCheckpoint) -> Reply:
        status = self.host.status
        barrier = CheckpointBarrier(msg.checkpoint_id, msg.location, msg.stop, msg.savepoint)
        if status not in (RUNNING, FINISHED):
            if status == CREATED:
                self.snapshots.append(TaskSnapshot(
                    self.spec.task_name, self.spec.vertex, self.spec.task_index,
                    msg.checkpoint_id, msg.location, declined="the task has not started"))
        elif self.spec.operators[0].kind == g.SOURCE:
            if self.aligner.trigger(msg.checkpoint_id) is not None:
                self._snapshot(barrier, 0.0)
        else:
            self._barriers.setdefault(msg.checkpoint_id, barrier)
            self._on_aligned(self.aligner.trigger(msg.checkpoint_id))
        return ACK

    def _complete(self, msg: CheckpointComplete) -> Reply:
        if self.host.status != FAILED:
            self._commit(msg.checkpoint_id)
        b = self.chain.backend
        if self.chains is not None and b is not None:
            self.chains.completed(msg.checkpoint_id, b.whole_groups())
        if self.ssts is not None:
            self.ssts.completed(msg.checkpoint_id)
        return ACK

    def _aborted(self, msg: CheckpointAborted) -> Reply:
        if self.chains is not None:
            self.chains.aborted(msg.checkpoint_id)
        if self.ssts is not None:
            self.ssts.aborted(msg.checkpoint_id, msg.forget_uploads)
        if self.aligner.pending == msg.checkpoint_id:
            self.aligner.abort()
        self._barriers.pop(msg.checkpoint_id, None)
        return ACK

    def _commit_restored(self, msg: CommitTransactions) -> Reply:
        self._commit_transactions(msg.transactions)
        return ACK

    def _adopt(self, msg: AdoptTransactions) -> Reply:
        self._adopted.extend(msg.transactions)
        return ACK

    # ------------------------------------------------------------ the snapshot
    def _on_aligned(self, aligned: Aligned | None) -> None:
        """Every live input delivered the barrier (or ended): take the snapshot."""
        if aligned is None:
            return
        for gone in aligned.aborted:
            self._barriers.pop(gone, None)
        self._snapshot(self._barriers.pop(aligned.barrier_id), aligned.alignment_s)

    def _snapshot(self, barrier: CheckpointBarrier, alignment_s: float) -> None:
        """This task's part of the checkpoint, at the cut: key groups and timers, the
        source's position, the sinks' transactions; then the barrier goes downstream (a
        finished task's outputs have ended: nothing follows there)."""
        cid, started, spec = barrier.checkpoint_id, self.clock.monotonic(), self.spec

        def declined(reason: str) -> TaskSnapshot:
            return TaskSnapshot(spec.task_name, spec.vertex, spec.task_index, cid,
                                barrier.location, declined=reason)

        if self.host.migrating:  # the JobMaster never lets the two overlap: a bug
            self.snapshots.append(declined("key groups are moving through this task (a "
                                           "rescale's subscale is running)"))
            return
        b = self.chain.backend
        deltas: tuple[int, ...] = ()
        unchanged: tuple[int, ...] = ()
        base = -1
        db: DbPlan | None = None
        try:
            if b is None:
                groups: tuple[tuple[int, bytes], ...] = ()
            elif self.ssts is not None and not barrier.savepoint:
                files = b.checkpoint_files(f"chk-{cid}")
                if files is None:  # state held outside the DB: whole blobs this time
                    groups = tuple((kg, b.snapshot(kg)) for kg in b.owned())
                    # which may leave no retained checkpoint naming the files uploaded
                    self.ssts.aborted(cid)
                else:
                    groups = ()
                    db = self.ssts.plan(cid, parent_location(barrier.location),
                                        directory_name(barrier.location),
                                        part_file_name(spec.vertex, spec.task_index),
                                        b.num_key_groups, files)
            elif self.chains is not None and not barrier.savepoint:
                groups, deltas, unchanged = take_incremental(b, self.chains, cid)
                base = self.chains.base_checkpoint
            else:
                groups = tuple((kg, b.snapshot(kg)) for kg in b.owned())
        except CodecError as exc:  # the user's state: a restart would fail the same way
            assert b is not None
            op = spec.operators[0].name
            self.host.fail(op, "", unencodable_state(b, op, exc), permanent=True)
            return
        reader = self.host.reader
        source = reader.offsets() if reader is not None else None
        try:
            if self.two_phase and self.writers_open:
                txns = (*self._adopted, *self.chain.pre_commit(cid))
                self._adopted = []
            else:  # no checkpoints (a savepoint of such a job): written means visible
                self.chain.flush()
                txns = ()
        except Exception as exc:  # a sink's pre_commit raised: the checkpoint fails
            self.snapshots.append(TaskSnapshot(  # with the DB checkpoint, for the shell to drop
                spec.task_name, spec.vertex, spec.task_index, cid, barrier.location,
                declined=f"a sink's pre_commit raised {type(exc).__name__}: {exc}", db=db))
            return
        if txns:
            self._pending_txns[cid] = txns
        if source and self.two_phase:
            self._pending_sources[cid] = source
        if self.host.status == RUNNING:
            self.router.broadcast(CheckpointBarrier(cid, barrier.location, barrier.stop,
                                                    barrier.savepoint))
        if barrier.stop:  # stop-with-savepoint: nothing more after the barrier
            self.host.quiesce()
        self.snapshots.append(TaskSnapshot(
            spec.task_name, spec.vertex, spec.task_index, cid, barrier.location, groups,
            source, txns, alignment_s, self.clock.monotonic() - started, deltas=deltas,
            unchanged=unchanged, base_checkpoint=base, db=db))

    # ------------------------------------------------------------ two-phase commit
    def _commit(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is complete: commit its transactions and those of
        earlier ones (a failed checkpoint's transactions wait for the next complete one);
        the source's readers learn the newest positions it holds."""
        done = sorted(c for c in self._pending_sources if c <= checkpoint_id)
        reader = self.host.reader
        if done and reader is not None:
            reader.committed(self._pending_sources[done[-1]])
        for c in done:
            del self._pending_sources[c]
        due = sorted(c for c in self._pending_txns if c <= checkpoint_id)
        if not due:
            return
        by_writer: dict[str, list[Any]] = {}
        for c in due:
            for writer, txn in self._pending_txns.pop(c):
                by_writer.setdefault(writer, []).append(txn)
        self._commit_transactions(by_writer.items())

    def _commit_transactions(self, items: Iterable[tuple[str, Any]]) -> None:
        for writer, txns in items:
            try:
                self.chain.commit(writer, list(txns))
            except Exception as exc:  # the output would never become visible: fail
                self.host.fail(writer, "", f"commit of a checkpoint's output raised "
                               f"{type(exc).__name__}: {exc}")
                return

    def hand_over(self) -> Transactions:
        """A scale-in removes this task: its sinks' output that no checkpoint committed yet
        (pending, adopted, and written since the last barrier, pre-committed now) goes to a
        task that stays, whose next checkpoint commits it."""
        if not (self.two_phase and self.writers_open):
            return ()
        out = [t for c in sorted(self._pending_txns) for t in self._pending_txns[c]]
        self._pending_txns.clear()
        out += self._adopted
        self._adopted = []
        out += self.chain.pre_commit(self.aligner.last_seen or 0)
        return tuple(out)

    def close_writers(self) -> None:
        """Close the sinks' writers (once)."""
        if self.writers_open:
            self.writers_open = False
            self.chain.close()
