"""A detached job's JobMaster keeps its record durable and takes the job over after a loss.

Why: a detached job outlives its driver, so it must outlive its JobMaster's process too.
Ray restarts the JobMaster actor (``max_restarts=-1``) with the arguments it was created
with (the job graph as the user built it); everything that changed since (the
deployment after rescales, changed functions, the checkpoint pointer and counter, the
history of rescales and decisions, the controllers) comes from the durable record that
``RecordKeeper`` writes to the checkpoint store (``engine.checkpoints.job_store``).

``RecordKeeper``: the JobMaster calls ``changed()`` after each change of its record; one
writer task writes the newest record in a thread (coalescing changes made meanwhile), so
the actor's loop never waits on the store. Each JobMaster first ``claim``s an epoch; a
write by a JobMaster whose epoch was overtaken raises ``StaleJobMaster`` into
``on_fenced`` (the old JobMaster stops acting), so two JobMasters never both write.
A write that fails for another reason is logged and tried again ``RETRY_S`` later.

``takeover``: the steps of a JobMaster that took a job over (Ray restarted it, or another
JobMaster was fenced): claim, read the record (``JobRecordUnreadable`` fails the job: it
is never started from nothing), ask every recorded task how it is
(``engine.control.failover`` decides from the answers), then reconcile or restart through
the port. Guarantees: leftover actors of the job that the decision does not keep are
killed before anything is deployed; the decision and its reason are logged and kept in
the job's ``last_failure``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol

import ray

from engine.control.failover import FailoverDecision, TaskAnswer
from engine.errors import StaleJobMaster
from engine.wire.messages import DescribeTask, decode_message, encode_message

log = logging.getLogger(__name__)

NAMESPACE = "reflow"
RETRY_S = 1.0  # a failed write of the record is tried again after this long


class RecordStore(Protocol):
    """The durable store ``RecordKeeper`` writes to (``engine.checkpoints.job_store``)."""

    def claim(self) -> int: ...

    def write(self, rec: Any) -> None: ...

    def fenced(self, epoch: int) -> int | None: ...


class RecordKeeper:
    """The durable job record of one JobMaster (see the module doc)."""

    def __init__(self, store: RecordStore, snapshot: Callable[[int], Any],
                 on_fenced: Callable[[StaleJobMaster], None]) -> None:
        """``snapshot(epoch)``: the durable record of the job now, for this epoch."""
        self.store = store
        self.snapshot = snapshot
        self.on_fenced = on_fenced
        self.epoch = 0
        self.writes = 0
        self.fenced: StaleJobMaster | None = None
        self._dirty = False
        self._writer: asyncio.Task[None] | None = None
        self._written = asyncio.Event()

    async def claim(self) -> int:
        """This JobMaster's epoch, one above every JobMaster's before it."""
        self.epoch = await asyncio.to_thread(self.store.claim)
        return self.epoch

    def changed(self) -> None:
        """The record changed: it is written soon (after the claim; never after fencing)."""
        if self.epoch == 0 or self.fenced is not None:
            return
        self._dirty = True
        if self._writer is None or self._writer.done():
            with contextlib.suppress(RuntimeError):  # no running loop: the next change
                self._writer = asyncio.get_running_loop().create_task(self._write_all())

    def write_now(self) -> None:
        """Write the record before returning (the caller's loop waits on the store): for a
        change a takeover must know of before anything acts on it, e.g. a rescale granted,
        whose tasks a reconciling JobMaster would otherwise leave half-way. A write that
        fails is logged and left to the writer task."""
        if self.epoch == 0 or self.fenced is not None:
            return
        try:
            self.store.write(self.snapshot(self.epoch))
            self.writes += 1
        except StaleJobMaster as exc:
            self.fenced = exc
            self.on_fenced(exc)
        except Exception as exc:  # noqa: BLE001 - the store may be down: the writer retries
            log.warning("the job record could not be written ahead (%s: %s)",
                        type(exc).__name__, exc)
            self.changed()

    async def flush(self) -> None:
        """Until every change made before this call is written (or fencing stopped it)."""
        self.changed()
        while self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)

    async def lease(self, interval: float, job_id: str) -> None:
        """Every ``interval`` seconds, look whether a newer JobMaster claimed the job (a
        JobMaster that writes nothing would not learn it otherwise); fenced, it calls
        ``on_fenced`` and returns."""
        while self.fenced is None:
            await asyncio.sleep(interval)
            try:
                newer = await asyncio.to_thread(self.store.fenced, self.epoch)
            except OSError as exc:
                log.warning("job %s: cannot read the JobMaster claims (%s)", job_id, exc)
                continue
            if newer is not None and self.fenced is None:
                self.fenced = StaleJobMaster(
                    f"job {job_id}: the JobMaster of epoch {newer} took the job over from "
                    f"this one (epoch {self.epoch}); talk to it: engine.attach({job_id!r})",
                    job=job_id, call="lease", epoch=self.epoch, newer_epoch=newer)
                self.on_fenced(self.fenced)

    async def _write_all(self) -> None:
        while self._dirty and self.fenced is None:
            self._dirty = False
            try:
                rec = self.snapshot(self.epoch)
                await asyncio.to_thread(self.store.write, rec)
                self.writes += 1
            except StaleJobMaster as exc:
                self.fenced = exc
                self.on_fenced(exc)
                return
            except Exception as exc:  # noqa: BLE001 - the store may be down: try again
                log.warning("the job record could not be written (%s: %s); retried in "
                            "%g s", type(exc).__name__, exc, RETRY_S)
                asyncio.get_running_loop().call_later(RETRY_S, self.changed)
                return


def _status_answer(status: str) -> TaskAnswer:
    if status == "finished":
        return TaskAnswer.FINISHED
    if status in ("failed", "stopped"):
        return TaskAnswer.FAILED
    return TaskAnswer.RUNNING


async def ask_tasks(names: list[str], seconds: float, job_id: str = ""
                    ) -> tuple[dict[str, Any], dict[str, TaskAnswer]]:
    """The actors of tasks ``names`` found by name, and what each said of itself within
    ``seconds`` (``TaskAnswer.MISSING``: no such actor, it died, or no answer in time).
    With ``job_id``, a task whose actor has another name (a recycled or standby actor
    that became the task: ``TaskActor.recycle``) is found by asking the job's other
    actors which task they run."""
    handles: dict[str, Any] = {}
    for name in names:
        with contextlib.suppress(ValueError):
            handles[name] = ray.get_actor(name, namespace=NAMESPACE)
    if job_id and len(handles) < len(names):
        await _find_renamed(job_id, names, handles, seconds)
    answers = {n: TaskAnswer.MISSING for n in names}

    async def ask(name: str) -> None:
        reply = decode_message(await handles[name].control.remote(
            encode_message(DescribeTask())))
        answers[name] = _status_answer(reply.status)

    if handles:
        futs = [asyncio.ensure_future(ask(n)) for n in handles]
        done, pending = await asyncio.wait(futs, timeout=seconds)
        for f in pending:
            f.cancel()
        for f in done:
            f.exception()  # retrieved: a dead task stays MISSING
    return handles, answers


async def _find_renamed(job_id: str, names: list[str], handles: dict[str, Any],
                        seconds: float) -> None:
    """Add to ``handles`` the tasks of ``names`` run by actors of job ``job_id`` named
    otherwise (each asked its task's name; one that does not answer in ``seconds`` is
    left out)."""
    wanted = set(names) - set(handles)
    others = []
    for entry in ray.util.list_named_actors(all_namespaces=True):
        name = entry["name"]
        if (entry["namespace"] == NAMESPACE and name.startswith(f"{job_id}/")
                and name not in handles and "/master" not in name):
            with contextlib.suppress(ValueError):
                others.append(ray.get_actor(name, namespace=NAMESPACE))
    if not others:
        return
    futs = [asyncio.ensure_future(_await(h.task_name.remote())) for h in others]
    done, pending = await asyncio.wait(futs, timeout=seconds)
    for f in pending:
        f.cancel()
    for handle, fut in zip(others, futs, strict=True):
        if fut in done and fut.exception() is None and fut.result() in wanted:
            handles[fut.result()] = handle


async def _await(ref: Any) -> Any:
    return await ref


def kill_job_actors(job_id: str, keep: Collection[str] = (),
                    masters: bool = False, keep_ids: Collection[Any] = ()) -> list[str]:
    """Kill every named actor of job ``job_id`` (``<job id>/...`` in reflow's namespace)
    but those in ``keep`` or with an actor id in ``keep_ids`` and, unless ``masters``, its
    JobMasters; the names killed (a detached job's actors outlive a JobMaster that died:
    only a JobMaster or this ends them)."""
    killed = []
    for entry in ray.util.list_named_actors(all_namespaces=True):
        name, namespace = entry["name"], entry["namespace"]
        if (namespace != NAMESPACE or not name.startswith(f"{job_id}/") or name in keep
                or ("/master" in name and not masters)):
            continue
        with contextlib.suppress(Exception):
            actor = ray.get_actor(name, namespace=NAMESPACE)
            if actor._actor_id in keep_ids:
                continue
            ray.kill(actor)
            killed.append(name)
    return killed


async def kill_leftovers(job_id: str, keep: Mapping[str, Any], seconds: float) -> list[str]:
    """``kill_job_actors`` but the JobMasters and ``keep``, then wait (at most ``seconds``)
    until the names are free for the actors that replace them; the names killed."""
    # an actor that runs a task under another name (recycled) is kept by its identity
    killed = kill_job_actors(job_id, keep, keep_ids={h._actor_id for h in keep.values()})
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    for name in killed:
        while loop.time() < end:
            try:
                ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:
                break
            await asyncio.sleep(0.05)  # Ray frees a killed actor's name asynchronously
    return killed


def describe(decision: FailoverDecision, epoch: int) -> str:
    """One line for the log and the job's ``last_failure``."""
    return (f"JobMaster failover (epoch {epoch}): {decision.path}: {decision.reason}")


__all__ = ["RecordKeeper", "ask_tasks", "describe", "kill_job_actors", "kill_leftovers"]
