"""What Ray's exceptions mean to a reflow user, and which operator's ``open()`` raised.

Why: Ray reports a failure in its own terms (``RayTaskError`` wrapping the remote error,
``ActorDiedError``, ``GetTimeoutError``); a user of reflow should see reflow's errors
(``engine.errors``), with Ray's kept as the ``__cause__`` for whoever debugs. And a task
whose ``open()`` raises dies inside Ray's actor constructor, where the only trace of the
operator is a traceback; ``open_failure`` finds the operator in it.

Format and guarantees: ``translate`` maps every exception of a call on the JobMaster to a
``ReflowError``: a reflow error raised remotely comes back as itself (unwrapped from any
depth of ``RayTaskError``); an actor error becomes ``JobMasterLost``; a get timeout
``ControlTimeout``; anything else ``InternalError`` (a bug: the remote traceback is kept).
Pure: no Ray calls, only Ray's exception classes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from ray.exceptions import (
    ActorUnavailableError,
    GetTimeoutError,
    RayActorError,
    RayError,
    RayTaskError,
)

from engine.dataflow import graph as g
from engine.errors import (
    ControlPlaneError,
    ControlTimeout,
    FailurePhase,
    InternalError,
    JobFailedError,
    JobMasterLost,
    ReflowError,
    UserFunctionError,
)

# how Ray says an actor's arguments (the job's functions) could not be unpickled
_MISSING_MODULE = re.compile(r"No module named '([\w.]+)'")


def unwrap(exc: BaseException) -> BaseException:
    """The error a remote call raised, through any number of ``RayTaskError`` layers (a
    task's error seen by the JobMaster, then by the driver)."""
    seen = 0
    while isinstance(exc, RayTaskError) and seen < 16:
        cause = getattr(exc, "cause", None)
        if not isinstance(cause, BaseException) or cause is exc:
            break
        exc, seen = cause, seen + 1
    return exc


# Ray's words for a worker its memory monitor killed (its advice is kept for those only)
_OOM_WORDS = ("memory pressure", "low on memory", "OOM kill reason", "OutOfMemoryError")
# where Ray's generic list of causes for a worker that exited unexpectedly begins
_CAUSES = re.compile(r"\s*(Some common causes include|There are some potential root causes)")
_FIELD = re.compile(r"^\t(\w+): (.*)$")


def actor_gone(exc: BaseException | None) -> bool:
    """Whether Ray's ``exc`` from a call on an actor means the actor is gone for good
    (``ActorDiedError`` and the other ``RayActorError``s). ``ActorUnavailableError`` does
    not: Ray raises it while an actor cannot be reached for now (its node's connection is
    broken, it is restarting), and calls may succeed again; a task in that state is
    silent (unresponsive), not dead, until Ray says it died."""
    return isinstance(exc, RayActorError) and not isinstance(exc, ActorUnavailableError)


def actor_death(exc: BaseException | str) -> str:
    """Why an actor died, in a line, from Ray's error (``ActorDiedError``) or its text:
    without the field list (class name, actor id, namespace ...) and, unless Ray's memory
    monitor killed it for memory (then Ray's text and advice are kept whole), without
    Ray's generic list of causes and advice, which would bury the job's own message (a
    worker that exited unexpectedly gets one short hint instead)."""
    text = str(exc).strip()
    if any(w in text for w in _OOM_WORDS):
        return " ".join(line.strip() for line in text.splitlines() if line.strip())
    fields: dict[str, str] = {}
    rest: list[str] = []
    for line in text.splitlines():
        m = _FIELD.match(line)
        if m is not None:
            fields[m.group(1)] = m.group(2)
        elif line.strip() and line.strip() != "The actor died unexpectedly before finishing " \
                "this task.":
            rest.append(line.strip())
    what = " ".join(rest) or "The actor died."
    cut = _CAUSES.search(what)
    if cut is not None:
        what = what[:cut.start()].rstrip() + (
            " The process was killed (a SIGKILL, e.g. the kernel's OOM killer) or crashed: "
            "see the worker's log.")
    where = " on ".join(f"{k} {fields[k]}" if k == "pid" else fields[k]
                        for k in ("pid", "ip") if k in fields)
    return f"{what}{f' ({where})' if where else ''}"


def reflow_error_in(exc: BaseException) -> ReflowError | None:
    """The ``ReflowError`` a remote call raised, or None when it raised something else."""
    inner = unwrap(exc)
    if isinstance(inner, ReflowError) and not isinstance(inner, RayTaskError):
        return inner
    if isinstance(inner, RayTaskError):  # a dual instance: the cause's own class and Ray's
        cause = getattr(inner, "cause", None)
        return cause if isinstance(cause, ReflowError) else None
    return None


def translate(exc: BaseException, *, job: str, call: str, seconds: float = 0.0) -> ReflowError:
    """The ``ReflowError`` to raise for ``exc``, raised by the driver's ``call`` (a handle
    method name) on job ``job``'s JobMaster with a deadline of ``seconds``. Raise the result
    ``from exc`` (a reflow error raised remotely is returned as is; raise it ``from None``)."""
    mine = reflow_error_in(exc)
    if mine is not None:
        return mine
    if isinstance(exc, GetTimeoutError):
        return ControlTimeout(
            f"job {job}: the JobMaster did not answer {call}() within {seconds:g} s; it may be "
            "overloaded or frozen (the job itself may still run): retry, raise "
            "JobConfig.control_timeout_s, or stop the job", job=job, call=call,
            seconds=seconds)
    missing = _MISSING_MODULE.search(str(exc)) if isinstance(exc, RayActorError) else None
    if missing is not None and getattr(exc, "actor_init_failed", False):
        return JobFailedError(
            f"job {job}: Ray's workers cannot import module {missing.group(1)!r}, which the "
            "job's functions come from, so its JobMaster could not start. Ship your code "
            "to the cluster: `ray job submit --working-dir . -- python job.py`, "
            "ray.init(runtime_env={'working_dir': '.'}) before job.run(), or install the "
            "module on every node (pip install -e .)", phase=FailurePhase.DEPLOY,
            cause=f"ModuleNotFoundError: No module named {missing.group(1)!r}")
    if isinstance(exc, RayActorError):
        return JobMasterLost(
            f"job {job}: the JobMaster died (its process or node went away, or it was killed) "
            f"during {call}(); the job is gone with it. If it took checkpoints, resume it from "
            f"the latest: job.run(restore_from='<JobConfig.checkpoint_dir>/{job}'); else "
            f"deploy it again ({type(exc).__name__})", job=job, call=call)
    if isinstance(exc, RayTaskError):
        inner = unwrap(exc)
        return InternalError(
            f"job {job}: the JobMaster raised {type(inner).__name__}: {inner} during {call}(); "
            "this is a bug of reflow: please report it with this error's cause")
    if isinstance(exc, RayError):
        return ControlPlaneError(
            f"job {job}: Ray failed the call {call}() ({type(exc).__name__}: {exc}); check the "
            "Ray cluster, then retry", job=job, call=call)
    return InternalError(f"job {job}: {call}() failed with {type(exc).__name__}: {exc}; this "
                         "is a bug of reflow: please report it with this error's cause")


def _frames(exc: BaseException) -> list[Any]:
    """The frames of ``exc``'s traceback, outermost first (and of its causes after it)."""
    out: list[Any] = []
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        tb: TracebackType | None = e.__traceback__
        while tb is not None:
            out.append(tb.tb_frame)
            tb = tb.tb_next
        e = e.__cause__ or e.__context__
    return out


def user_objects(operators: Sequence[g.OperatorDef]) -> list[tuple[Any, str]]:
    """Every user object of a task's operators with an ``open()``: (object, operator)."""
    out: list[tuple[Any, str]] = []
    for op in operators:
        for obj in (op.fn, op.dead_letter, op.late_sink):
            if obj is not None:
                out.append((obj, op.name))
    return out


_OPENERS = ("open", "open_partition")


def open_failure(exc: BaseException, operators: Sequence[g.OperatorDef], task: str,
                 task_index: int) -> UserFunctionError | None:
    """A ``UserFunctionError`` (phase ``open``) when ``exc`` was raised inside the ``open``
    method of one of ``operators``' user objects (function, sink, dead-letter or late sink)
    or a source's ``open_partition``, naming that operator; None when it was raised elsewhere (an engine bug, a
    key function, ...). The outermost such frame wins: an ``open`` that calls another
    object's ``open`` is named by the object reflow called."""
    if isinstance(exc, UserFunctionError):
        return exc
    objects = user_objects(operators)
    for frame in _frames(exc):
        if frame.f_code.co_name not in _OPENERS:
            continue
        me = frame.f_locals.get("self")
        for obj, operator in objects:
            if me is obj:
                return UserFunctionError(operator, task_index, "", f"{type(exc).__name__}: {exc}",
                                         phase=FailurePhase.OPEN, task=task)
    return None


__all__ = ["actor_death", "actor_gone", "open_failure", "reflow_error_in", "translate", "unwrap", "user_objects"]
