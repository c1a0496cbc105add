"""Every error reflow raises on purpose.

Hierarchy::

    ReflowError
    ├── JobDefinitionError      the job graph is invalid (raised at build time, names the operator)
    │   └── ConfigError         a setting (``JobConfig`` field, source/sink parameter) has the
    │       │                   wrong type or value (also a ``ValueError``)
    │       ├── GateError       ... a ``SourceGate`` or a ``TestingSource``'s gates
    │       └── SchemaError     ... a Spark bridge's schema: unparsable, or a type it cannot carry
    ├── InvalidKeyError         a key_by function returned a key that cannot partition records:
    │   │                       NaN (never equal to itself) (also a ``ValueError``)
    │   └── UnhashableKeyError  ... or a type without a stable hash (also a ``TypeError``)
    ├── KeyFunctionError        a key_by function raised (the task fails naming the consumer)
    ├── ColumnarError           records cannot be put in columns, or a columnar operator got a
    │                           column it cannot use (also a ``ValueError``)
    ├── CodecError              a value cannot be encoded/decoded with the declared codecs
    │   └── OutputCodecError    an operator's output record cannot be encoded (names it)
    ├── RescaleRefused          a rescale request is invalid, or failed before anything
    │   │                       changed (names the phase and tasks); the job is untouched
    │   └── ChangeLogicRefused  ... a change of logic, before any task switched
    ├── AssignmentError         the inputs of an assignment function do not fit together
    │   │                       (also a ``ValueError``)
    │   └── BalanceInfeasible   ... no assignment keeps every task within the balance θ
    ├── ControllerError         a controller or one of its decisions is invalid (also a
    │                           ``ValueError``); a running one's bad decision is only recorded
    ├── RescaleTimeout          a rescale phase or control call did not finish within
    │                           ``JobConfig.rescale_timeout_s`` (names the phase and tasks)
    ├── JobRestarted            the job restarted from a checkpoint under a running rescale
    │                           (inside the JobMaster: the rescale runs again once it runs)
    ├── CheckpointFailed        a checkpoint or savepoint did not complete (names the
    │                           checkpoint, the task and the reason); the job goes on
    ├── RestoreError            ``job.run(restore_from=...)`` refused a checkpoint or savepoint:
    │   │                       corrupt, foreign, incomplete, or holding state the job cannot
    │   │                       map (names the path and the reason); nothing was deployed
    │   └── JobRecordUnreadable ... the durable job record (``_job``) a restarted JobMaster
    │                           reads: corrupt, foreign, of another format, or not of this
    │                           job's graph (names the path, the job and the reason)
    ├── StateBackendError       a task's state directory cannot be used: not writable, full,
    │                           or locked by another task (names the path and the task)
    ├── StaleReplicaError       a replica delta does not apply to the replica held (the holder
    │                           drops it; the owner sends a full snapshot)
    ├── JobFailedError          the running job failed (user function error, task died, ...)
    │   └── UserFunctionError   a user function raised (in ``open()`` or on a record); names
    │                           operator, task, phase and record
    ├── JobNotRunningError      the call needs a running job
    ├── JobNotFound             no running job has the name or id given (``reflow status``)
    ├── WaitTimeout             ``JobHandle.wait(timeout)`` returned with the job still
    │                           running (also a ``TimeoutError``)
    ├── GateTimeout             ``SourceGate.wait_reached`` waited past its timeout (also a
    │                           ``TimeoutError``)
    ├── ControlPlaneError       the driver got no answer from the job's JobMaster:
    │   ├── ControlTimeout      ... within the call's deadline (``JobConfig.control_timeout_s``)
    │   ├── JobMasterLost       ... because the JobMaster actor died (Ray's error is the cause)
    │   │   └── JobMasterFailedOver ... a detached job's, during a call that changes the job:
    │   │                       Ray restarts it and it takes the job over; ask again
    │   └── StaleJobMaster      ... because a newer JobMaster (a higher epoch) owns the job: the
    │                           older one may no longer write its record (names both epochs)
    ├── RayUnavailable          Ray could not be started (a local start timed out every
    │                           attempt) or reached at the address given
    ├── InternalError           reflow's runtime raised something it did not mean to (a bug:
    │   │                       report it with the cause's traceback)
    │   └── UnknownKeyGroupError a record reached a task that does not own its key group
    │                           (also a ``RuntimeError``)
    ├── TaskControlError        a task got a spec, message, frame or channel event it cannot
    │                           take (an engine bug or a mis-wired job; also a ``ValueError``)
    ├── UnknownSubscaleError    a barrier or message names a subscale the task was not told
    │                           about (a coordinator bug; also a ``KeyError``)
    ├── SinkCommitError         an exactly-once sink cannot make a pre-committed transaction
    │                           visible: its data is gone (names the sink and the files)
    ├── DataChannelError        a task's direct data connection failed (caught by the task
    │   ├── ConnectionLost      shell, which fails the job naming the receiver): the
    │   ├── FrameRefused        receiver died, or refused a frame (e.g. unknown channel),
    │   ├── FrameTooLarge       or a frame exceeds ``JobConfig.max_frame_bytes``
    │   ├── ConnectionClosed    ... or the sender closed the connection itself (no death)
    │   └── DownstreamDied      ... as the sending task's shell reports it (names the receiver)
    ├── PrometheusError         a Prometheus server refused a query or could not be reached
    ├── BridgeError             a Spark bridge refused data or failed (the reflow job or a
    │                           Spark query failed; also a ``RuntimeError``)
    └── SparkQueryFailed        a reflow source fed by Spark found the Spark side failed;
                                carries Spark's message (also a ``RuntimeError``)

Errors carry structured fields where they exist (operator, task, ``phase``: a
``FailurePhase`` or a rescale's phase, record, the original cause), and every one pickles
with them (it crosses actor boundaries). Messages say what to do.
"""

from __future__ import annotations

from typing import Any

from engine.names import NameEnum


class FailurePhase(NameEnum):
    """What a task was doing when it failed (``JobFailedError.phase``, outside rescales,
    whose phases are ``migration.coordinator.Phase``)."""

    OPEN = "open"        # an operator's open(): the task could not start
    PROCESS = "process"  # processing a record (or a batch, or a timer)
    DEPLOY = "deploy"    # the JobMaster deploying the task (it died or did not answer)


class ReflowError(Exception):
    """Base of every error reflow raises on purpose.

    Errors cross actor boundaries pickled; a subclass with its own ``__init__`` signature
    would not unpickle through ``Exception``'s default (which calls ``cls(*args)`` with the
    message only), so every ``ReflowError`` rebuilds as message plus attributes."""

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (type(self), self.args, dict(self.__dict__))


def _rebuild(cls: type[ReflowError], args: tuple[Any, ...],
             state: dict[str, Any]) -> ReflowError:
    """A ``ReflowError`` from its message and attributes, without calling its ``__init__``."""
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(state)
    return err


class JobDefinitionError(ReflowError):
    """The job graph is invalid. The message names the operator and what to change."""


class ConfigError(JobDefinitionError, ValueError):
    """A setting has the wrong type or value: a ``JobConfig`` field, a source or sink
    parameter, a count. The message names the setting, the value given and what is expected.
    A ``ValueError`` too, for callers that caught the plain ``ValueError`` raised before."""


class GateError(ConfigError):
    """A ``SourceGate``, or the gates given to a ``TestingSource``, are invalid; the message
    says what to change (a ``ValueError`` too, as every ``ConfigError``)."""

    __test__ = False


class SchemaError(ConfigError):
    """A schema declared for a Spark bridge (``SparkSource``, ``OutputLogSink``, the
    ``"reflow"`` data source) cannot be parsed or uses a type the bridges cannot carry; the
    message names the column. A ``ValueError`` too, as before."""


class InvalidKeyError(ReflowError, ValueError):
    """A key_by function returned a key that cannot partition records (NaN: it never equals
    itself, so every NaN record would be a key of its own). Raised where the key is hashed to
    its key group; the task fails naming the record."""


class UnhashableKeyError(InvalidKeyError, TypeError):
    """A key_by function returned a key of a type with no stable hash (a list, a dict, an
    object); a ``TypeError`` too, as before."""


class KeyFunctionError(ReflowError):
    """A key_by function raised on ``record``; ``cause`` is its error. Raised by the output
    router (``engine.task.channel``) and caught by the task, which fails naming the operator
    that consumes the keyed stream."""

    def __init__(self, record: Any, cause: BaseException) -> None:
        self.record = record
        self.cause = cause
        super().__init__(f"{type(cause).__name__}: {cause}")


class ColumnarError(ReflowError, ValueError):
    """Records cannot be put in columns (not dict rows, or fields that do not fit one
    schema), or a columnar operator got a column it cannot use (missing, with nulls, not
    numeric); the message names the column and what to do (``engine.columnar.batches``)."""


class CodecError(ReflowError):
    """A value has no declared codec, or bytes do not decode with the declared codecs."""


class OutputCodecError(CodecError):
    """An operator's output record cannot be encoded for the next task; ``record`` is the
    first one that fails (the task fails naming its operator and that record)."""

    def __init__(self, message: str, record: object = None) -> None:
        super().__init__(message)
        self.record = record


class RescaleRefused(ReflowError):
    """A rescale request was refused; the job keeps running unchanged. The message says why.

    ``operator``, ``phase`` and ``tasks`` are set when the rescale had started and failed
    before it changed anything (e.g. ``tasks`` did not answer in phase ``hold``)."""

    def __init__(self, message: str, *, operator: str = "", phase: str = "",
                 tasks: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.operator = operator
        self.phase = phase
        self.tasks = tuple(tasks)


class AssignmentError(ReflowError, ValueError):
    """The inputs of an assignment function (``migration.assignment``) do not fit together;
    the message says how."""


class BalanceInfeasible(AssignmentError):
    """No contiguous assignment to ``parallelism`` tasks keeps every task within
    ``(1 + balance) · W / parallelism``; ``smallest_balance`` is the least θ that works."""

    def __init__(self, message: str, *, parallelism: int = 0, balance: float = 0.0,
                 smallest_balance: float = 0.0) -> None:
        super().__init__(message)
        self.parallelism = parallelism
        self.balance = balance
        self.smallest_balance = smallest_balance


class ControllerError(ReflowError, ValueError):
    """A controller, or a decision it built, is invalid: ``add_controller`` got something
    that is not a controller (no ``decide``, a bad ``interval_s``, a name already used), or
    a decision has a field of the wrong kind. A running controller's bad decision is logged
    and skipped (``JobHandle.decisions()``), never raised into the job."""


class ChangeLogicRefused(RescaleRefused):
    """A change of logic was refused before any task switched; the job runs on with the old
    function. The message says why: the operator cannot change its logic, the new function
    does not fit it, could not be deserialised or opened on a task (``tasks``), or the job
    is finishing."""


class RescaleTimeout(ReflowError):
    """A rescale phase (or a control call inside it) took longer than
    ``JobConfig.rescale_timeout_s``. ``phase`` and ``tasks`` say where it stood; the job
    fails when state had already moved, else the rescale is refused and the job goes on."""

    def __init__(self, message: str, phase: str = "", tasks: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.phase = phase
        self.tasks = tasks


class JobRestarted(ReflowError):  # noqa: N818 - a signal inside the JobMaster
    """The job restarted from a checkpoint under a running rescale or wait: what it did is
    gone; the rescale tries again once the job runs (``engine.runtime.recovery``). Caught
    inside the JobMaster; never raised to users."""


class CheckpointFailed(ReflowError):
    """A checkpoint or savepoint did not complete; the job goes on (a checkpoint that fails
    more than ``JobConfig.tolerable_checkpoint_failures`` times in a row fails the job).
    ``checkpoint_id``, ``task`` (a task that declined it, '' when none) and ``reason`` say
    which and why."""

    def __init__(self, message: str, *, checkpoint_id: int = -1, task: str = "",
                 reason: str = "") -> None:
        super().__init__(message)
        self.checkpoint_id = checkpoint_id
        self.task = task
        self.reason = reason


class RestoreError(ReflowError):
    """A checkpoint or savepoint cannot be restored: it is incomplete (no metadata), corrupt
    (a checksum does not match), foreign (not a reflow checkpoint, or of another format
    version), or holds state the job cannot take (an operator it does not have, another
    ``num_key_groups``) without ``allow_non_restored_state=True``. ``path`` and ``reason``
    say which and why; nothing was deployed."""

    def __init__(self, message: str, *, path: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.path = path
        self.reason = reason


class JobRecordUnreadable(RestoreError):
    """The durable job record (``<checkpoint dir>/<job id>/_job``) cannot be read back: the
    file is unreadable, corrupt (its checksum or body does not hold), foreign (not a reflow
    job record, or another job's), of another format version, missing a field, or does not
    fit the job's graph. ``path``, ``job`` and ``reason`` say which; the job is never
    started from nothing in its place: restore it from its checkpoints
    (``job.run(restore_from="<checkpoint dir>/<job id>")``)."""

    def __init__(self, message: str, *, path: str = "", reason: str = "",
                 job: str = "") -> None:
        super().__init__(message, path=path, reason=reason)
        self.job = job


class StateBackendError(ReflowError):
    """A task's on-disk state backend (``engine.state.rocksdb``) cannot open or write its
    directory: not writable, full, or held by another open backend (its lock file).
    ``path`` and ``task`` say which."""

    def __init__(self, message: str, *, path: str = "", task: str = "") -> None:
        super().__init__(message)
        self.path = path
        self.task = task


class StaleReplicaError(ReflowError):
    """A delta does not apply to the replica held (its base version is another): the holder
    drops the replica and the owner must send a full snapshot (``migration.replication``)."""


class JobFailedError(ReflowError):
    """The job failed; the message says where and why.

    Structured fields, set where known ('' or -1 otherwise): ``operator``, ``task_index``,
    ``task`` (the task actor's name), ``phase`` (what the job or task was doing, e.g.
    ``open``, ``process``, or a rescale phase), ``record`` (repr of the offending record)
    and ``cause`` (the original error as ``Type: message``)."""

    def __init__(self, message: str, *, operator: str = "", task_index: int = -1,
                 task: str = "", phase: str = "", record: str = "", cause: str = "") -> None:
        super().__init__(message)
        self.operator = operator
        self.task_index = task_index
        self.task = task
        self.phase = phase
        self.record = record
        self.cause = cause


class UserFunctionError(JobFailedError):
    """A user function raised: in ``open()`` (``phase`` "open": the task could not start)
    or while processing a record (``phase`` "process", the default).

    Attributes name the operator, the task index (and task name where known), the phase and
    the offending record (as its repr; '' for ``open``).
    """

    def __init__(self, operator: str, task_index: int, record: str, cause: str, *,
                 phase: str = FailurePhase.PROCESS, task: str = "") -> None:
        phase = FailurePhase.parse(phase, "UserFunctionError phase")
        if phase == FailurePhase.OPEN:
            message = (f"open() of operator {operator!r} (task {task_index}) raised {cause}; "
                       "the task could not start: fix open() (it runs once per task, "
                       "before its first record)")
        else:
            message = (f"user function of operator {operator!r} (task {task_index}) raised "
                       f"{cause} on record {record}; fix the function or give the operator "
                       "a dead_letter sink")
        super().__init__(message, operator=operator, task_index=task_index, task=task,
                         phase=phase, record=record, cause=cause)


class JobNotRunningError(ReflowError):
    """The call needs a running job, and this one has finished, failed or been stopped."""


class JobNotFound(ReflowError):
    """No running job has the name or id given to ``reflow status``/``rescale``/``metrics``
    (``engine.runtime.registry``); the message lists the jobs it knows and what to pass."""


class WaitTimeout(ReflowError, TimeoutError):
    """``JobHandle.wait(timeout)`` returned and the job still runs (``state``): wait again,
    or stop it. A ``TimeoutError`` too, as ``wait`` raised before."""

    def __init__(self, message: str, *, job: str = "", state: str = "",
                 seconds: float | None = None) -> None:
        super().__init__(message)
        self.job = job
        self.state = state
        self.seconds = seconds


class GateTimeout(ReflowError, TimeoutError):
    """``SourceGate.wait_reached`` waited longer than its timeout."""

    __test__ = False


class ControlPlaneError(ReflowError):
    """A call on the ``JobHandle`` got no answer from the job's JobMaster. ``job`` and
    ``call`` (the handle method) say which."""

    def __init__(self, message: str, *, job: str = "", call: str = "") -> None:
        super().__init__(message)
        self.job = job
        self.call = call


class ControlTimeout(ControlPlaneError):
    """The JobMaster did not answer within the call's deadline (``seconds``). It is alive
    but busy or frozen (an overloaded node, a paused process); the job may still run. Retry,
    raise ``JobConfig.control_timeout_s``, or stop the job."""

    def __init__(self, message: str, *, job: str = "", call: str = "",
                 seconds: float = 0.0) -> None:
        super().__init__(message, job=job, call=call)
        self.seconds = seconds


class JobMasterLost(ControlPlaneError):
    """The JobMaster actor died (its process or node went away, or it was killed); the job
    is gone with it. Ray's error is the ``__cause__``. Resume it from its checkpoints
    (``job.run(restore_from="<checkpoint_dir>/<job id>")``), or deploy it again."""


class JobMasterFailedOver(JobMasterLost):
    """A detached job's JobMaster died during a call that changes the job (a rescale, a
    savepoint, a change of logic); Ray restarts it and the new one takes the job over
    (reconciled with its live tasks, or restarted from its latest checkpoint: its
    ``status().last_failure`` says which). What the call asked may or may not have
    happened: look at ``status()`` (and the parallelism in ``metrics()``), then ask again."""


class StaleJobMaster(ControlPlaneError):
    """A newer JobMaster owns the job: it claimed epoch ``newer_epoch`` in the job's record
    store (``engine.checkpoints.job_store``) after this one claimed ``epoch``, so this one
    may no longer write the job's record or act on the job. The JobMaster that gets it stops
    acting (the newer one carries the job on); a driver reconnects to the newer one."""

    def __init__(self, message: str, *, job: str = "", call: str = "", epoch: int = 0,
                 newer_epoch: int = 0) -> None:
        super().__init__(message, job=job, call=call)
        self.epoch = epoch
        self.newer_epoch = newer_epoch


class RayUnavailable(ReflowError):
    """Ray could not be started or reached (``engine.runtime.local_ray.connect``): a local
    start timed out in every attempt (a very busy machine), or the cluster at the address
    given did not answer. Ray's error is the ``__cause__``. Start Ray yourself and pass its
    address, or retry when the machine is less busy."""


class InternalError(ReflowError):
    """reflow's runtime raised an error it did not mean to: a bug. The message and the
    ``__cause__`` carry the original error and its traceback; please report them."""


class UnknownKeyGroupError(InternalError, RuntimeError):
    """A record reached a task that does not own its key group: a routing bug (the task
    fails with this message; it never reaches user code)."""


class TaskControlError(ReflowError, ValueError):
    """A task was given a spec, message, frame or channel event it cannot take (unknown, or
    not for a task of its kind). An engine bug or a mis-wired job: the message names the
    task."""


class UnknownSubscaleError(ReflowError, KeyError):
    """A barrier or message names a subscale this task was not told about (an
    ``ExpectOutgoing`` missing or late): a coordinator bug."""


class SinkCommitError(ReflowError):
    """An exactly-once sink was asked to commit a transaction whose pre-committed data is
    neither pending nor visible any more (deleted by hand, or a directory not shared by
    every task): committing it would lose records silently, so it raises instead."""


class DataChannelError(ReflowError):
    """A direct data connection between two tasks failed (``engine.wire.transport``)."""


class ConnectionLost(DataChannelError):
    """The connection to a receiving task closed with frames unacknowledged."""


class ConnectionClosed(DataChannelError):
    """The sending task closed the connection itself with frames unacknowledged (it
    stopped, or the receiver's name now stands for a new actor): the receiver did not die,
    the sender gave up on those frames (``engine.runtime.connections.ack_failure`` decides
    what that means to the task)."""


class FrameRefused(DataChannelError):
    """The receiving task refused a frame (e.g. a channel it does not have)."""


class FrameTooLarge(DataChannelError):
    """A data frame is longer than ``JobConfig.max_frame_bytes``: the sender refuses to send
    it, and a receiver closes a connection whose length field announces one."""


class DownstreamDied(DataChannelError):  # noqa: N818 - the name says what happened
    """A task this one sends to went away, as the sending task's shell sees it
    (``engine.runtime.connections``): the task fails naming the receiver."""


class PrometheusError(ReflowError):
    """A Prometheus server refused a query or could not be reached
    (``engine.observability.promplot``)."""


class BridgeError(ReflowError, RuntimeError):
    """A Spark bridge refused data or failed (the reflow job or a Spark query failed);
    ``engine.spark``. A ``RuntimeError`` too, as before."""


class SparkQueryFailed(ReflowError, RuntimeError):
    """Raised in a reflow source task when the Spark side failed; carries Spark's message
    (``engine.spark``). A ``RuntimeError`` too, as before."""


__all__ = [
    "AssignmentError",
    "BalanceInfeasible",
    "BridgeError",
    "ChangeLogicRefused",
    "CheckpointFailed",
    "CodecError",
    "ColumnarError",
    "ConfigError",
    "ConnectionClosed",
    "ConnectionLost",
    "ControlPlaneError",
    "ControlTimeout",
    "ControllerError",
    "DataChannelError",
    "DownstreamDied",
    "FailurePhase",
    "FrameRefused",
    "FrameTooLarge",
    "GateError",
    "GateTimeout",
    "InternalError",
    "InvalidKeyError",
    "JobDefinitionError",
    "JobFailedError",
    "JobMasterFailedOver",
    "JobMasterLost",
    "JobNotFound",
    "JobNotRunningError",
    "JobRecordUnreadable",
    "JobRestarted",
    "KeyFunctionError",
    "OutputCodecError",
    "PrometheusError",
    "RayUnavailable",
    "ReflowError",
    "RescaleRefused",
    "RescaleTimeout",
    "RestoreError",
    "SchemaError",
    "SinkCommitError",
    "SparkQueryFailed",
    "StaleJobMaster",
    "StaleReplicaError",
    "StateBackendError",
    "TaskControlError",
    "UnhashableKeyError",
    "UnknownKeyGroupError",
    "UnknownSubscaleError",
    "UserFunctionError",
    "WaitTimeout",
]
