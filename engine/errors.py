"""Every error reflow raises on purpose.

Hierarchy::

    ReflowError
    ├── JobDefinitionError      the job graph is invalid (raised at build time, names the operator)
    ├── CodecError              a value cannot be encoded/decoded with the declared codecs
    ├── RescaleRefused          a rescale request is invalid; the job is untouched
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


class CodecError(ReflowError):
    """A value has no declared codec, or bytes do not decode with the declared codecs."""


class RescaleRefused(ReflowError):
    """A rescale request was refused; the job keeps running unchanged. The message says why."""


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
