"""Every error reflow raises on purpose.

Hierarchy::

    ReflowError
    ├── JobDefinitionError      the job graph is invalid (raised at build time, names the operator)
    │   └── ConfigError         a setting (``JobConfig`` field, source/sink parameter) has the
    │                           wrong type or value (also a ``ValueError``)
    ├── InvalidKeyError         a key_by function returned a key that cannot partition records:
    │   │                       NaN (never equal to itself) (also a ``ValueError``)
    │   └── UnhashableKeyError  ... or a type without a stable hash (also a ``TypeError``)
    ├── CodecError              a value cannot be encoded/decoded with the declared codecs
    ├── RescaleRefused          a rescale request is invalid; the job is untouched
    ├── RescaleTimeout          a rescale phase or control call did not finish within
    │                           ``JobConfig.rescale_timeout_s`` (names the phase and tasks)
    ├── JobFailedError          the running job failed (user function error, task died, ...)
    │   └── UserFunctionError   a user function raised; names operator, task and record
    ├── JobNotRunningError      the call needs a running job
    └── DataChannelError        a task's direct data connection failed (caught by the task
        ├── ConnectionLost      shell, which fails the job naming the receiver): the
        └── FrameRefused        receiver died, or refused a frame (e.g. unknown channel)
"""

from __future__ import annotations


class ReflowError(Exception):
    """Base of every error reflow raises on purpose."""


class JobDefinitionError(ReflowError):
    """The job graph is invalid. The message names the operator and what to change."""


class ConfigError(JobDefinitionError, ValueError):
    """A setting has the wrong type or value: a ``JobConfig`` field, a source or sink
    parameter, a count. The message names the setting, the value given and what is expected.
    A ``ValueError`` too, for callers that caught the plain ``ValueError`` raised before."""


class InvalidKeyError(ReflowError, ValueError):
    """A key_by function returned a key that cannot partition records (NaN: it never equals
    itself, so every NaN record would be a key of its own). Raised where the key is hashed to
    its key group; the task fails naming the record."""


class UnhashableKeyError(InvalidKeyError, TypeError):
    """A key_by function returned a key of a type with no stable hash (a list, a dict, an
    object); a ``TypeError`` too, as before."""


class CodecError(ReflowError):
    """A value has no declared codec, or bytes do not decode with the declared codecs."""


class RescaleRefused(ReflowError):
    """A rescale request was refused; the job keeps running unchanged. The message says why."""


class RescaleTimeout(ReflowError):
    """A rescale phase (or a control call inside it) took longer than
    ``JobConfig.rescale_timeout_s``. ``phase`` and ``tasks`` say where it stood; the job
    fails when state had already moved, else the rescale is refused and the job goes on."""

    def __init__(self, message: str, phase: str = "", tasks: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.phase = phase
        self.tasks = tasks


class JobFailedError(ReflowError):
    """The job failed; the message says where and why."""


class UserFunctionError(JobFailedError):
    """A user function raised while processing a record.

    Attributes name the operator, the task index and the offending record (as its repr).
    """

    def __init__(self, operator: str, task_index: int, record: str, cause: str) -> None:
        self.operator = operator
        self.task_index = task_index
        self.record = record
        self.cause = cause
        super().__init__(
            f"user function of operator {operator!r} (task {task_index}) raised {cause} "
            f"on record {record}; fix the function or give the operator a dead_letter sink"
        )


class JobNotRunningError(ReflowError):
    """The call needs a running job, and this one has finished, failed or been stopped."""


class DataChannelError(ReflowError):
    """A direct data connection between two tasks failed (``engine.transport``)."""


class ConnectionLost(DataChannelError):
    """The connection to a receiving task closed with frames unacknowledged."""


class FrameRefused(DataChannelError):
    """The receiving task refused a frame (e.g. a channel it does not have)."""
