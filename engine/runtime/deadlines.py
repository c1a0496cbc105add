"""How long each control call may take: the driver's calls on the JobMaster and the
JobMaster's calls on its tasks, all derived from two settings.

Why one place: a deadline of the driver only means something if the JobMaster answers
within a shorter one of its own (a status with a stuck task must still come back in time),
so the pairs are written next to each other. ``c`` below is ``JobConfig.control_timeout_s``,
``T`` is ``JobConfig.rescale_timeout_s``.

Guarantees (each a property of ``Deadlines``):

* ``status``/``metrics``/``set_replication``: the driver waits ``c``; the JobMaster waits
  ``c / 2`` for each task (metrics polls, standby pings, a stuck rescale's description,
  replica drops) and answers with what it has.
* ``wait(timeout)``: the driver asks in slices of ``wait_slice_s`` and waits each slice
  plus ``c``; ``wait()`` with no timeout therefore waits as long as the job runs, but a
  JobMaster that stops answering is noticed within a slice plus ``c``.
* ``rescale``/``rebalance``: the JobMaster bounds each step of a rescale by ``T`` (a
  control call, a wait for reports) and a refusal by ``c`` more (describing and releasing
  the tasks); a rescale as a whole has no bound (it has as many steps as subscales), nor
  its wait for the operator's lock (a refresh of replicas holds it, for at most ``T``;
  another rescale, which runs steps). The driver therefore waits in
  windows of ``rescale_window_s = 2 (T + c)``: after each window it asks the JobMaster
  (within ``c``) how many rescale steps it has run, and gives up with ``ControlTimeout``
  when the JobMaster does not answer or ran no step during the whole window.
* ``stop``: the JobMaster asks each task to stop within ``c``, all tasks within
  ``stop_budget_s``, then kills them; the driver waits ``stop_budget_s + c``.
* ``savepoint``/``stop(savepoint=)``: the JobMaster waits for running subscales (a rescale
  window at most), then ``checkpoint_s`` (``JobConfig.checkpoint_timeout_s``) for the
  savepoint; the driver waits ``savepoint_s``, the sum of both and a stop.
* deploying (``job.run()``): the JobMaster waits at most ``deploy_s = max(T, 60 s)`` for
  the tasks' first answers (starting actors takes seconds each on a small machine); the
  driver waits ``deploy_s + 2 c``.
* a detached job's JobMaster restarted by Ray: the driver asks again calls that change
  nothing (status, wait, metrics) for ``failover_s = deploy_s + 3 c`` (the restart, then
  the takeover's deploy at most).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from engine.dataflow.config import JobConfig
from engine.errors import ConfigError

MIN_DEPLOY_S = 60.0
MIN_STOP_BUDGET_S = 10.0


@dataclass(frozen=True)
class Deadlines:
    """Every control deadline of one job, in seconds (see the module doc)."""

    control_s: float
    rescale_s: float  # may be infinite: rescale steps without a bound, and so the windows
    checkpoint_s: float = 600.0  # JobConfig.checkpoint_timeout_s

    @staticmethod
    def for_ray(seconds: float) -> float | None:
        """``seconds`` as a timeout for ``ray.get``/``ray.wait`` (None: no bound)."""
        return None if math.isinf(seconds) else seconds

    def __post_init__(self) -> None:
        for name, finite in (("control_s", True), ("rescale_s", False)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) \
                    or v <= 0 or (finite and math.isinf(v)):
                raise ConfigError(f"Deadlines: {name} must be a number > 0"
                                  f"{' and finite' if finite else ''}; got {v!r}")

    @classmethod
    def of(cls, config: JobConfig) -> Deadlines:
        return cls(config.control_timeout_s, config.rescale_timeout_s,
                   config.checkpoint_timeout_s)

    @classmethod
    def defaults(cls) -> Deadlines:
        """``JobConfig``'s default deadlines, without building a ``JobConfig`` (whose
        defaults read the environment, e.g. ``REFLOW_TLS_*``, which a client checking on a
        job does not need)."""
        fields = {f.name: f.default for f in dataclasses.fields(JobConfig)}
        return cls(float(fields["control_timeout_s"]),  # type: ignore[arg-type]
                   float(fields["rescale_timeout_s"]),  # type: ignore[arg-type]
                   float(fields["checkpoint_timeout_s"]))  # type: ignore[arg-type]

    @property
    def task_poll_s(self) -> float:
        """The JobMaster's wait for one task (or standby actor) during a driver's call."""
        return self.control_s / 2

    @property
    def wait_slice_s(self) -> float:
        """How long one ``JobMaster.wait`` call may block before the driver asks again."""
        return max(1.0, 2 * self.control_s)

    @property
    def rescale_window_s(self) -> float:
        """The driver's longest wait for the next rescale step of the JobMaster."""
        return 2 * (self.rescale_s + self.control_s)

    @property
    def stop_budget_s(self) -> float:
        """The JobMaster's wait for all tasks to stop before it kills them."""
        return max(MIN_STOP_BUDGET_S, 2 * self.control_s)

    @property
    def stop_s(self) -> float:
        return self.stop_budget_s + self.control_s

    @property
    def savepoint_s(self) -> float:
        """The driver's wait for a savepoint: the checkpoint's own timeout, after running
        subscales finish (a rescale window), plus the stop when it stops the job."""
        return self.checkpoint_s + self.rescale_window_s + self.stop_s

    @property
    def deploy_s(self) -> float:
        """The JobMaster's wait for the tasks' first answers when it deploys the job."""
        return max(self.rescale_s, MIN_DEPLOY_S)

    @property
    def start_s(self) -> float:
        """The driver's wait for ``JobMaster.start`` (``job.run()``)."""
        return self.deploy_s + 2 * self.control_s

    @property
    def failover_s(self) -> float:
        """The driver's wait for a detached job's JobMaster that Ray restarts: the restart,
        then its takeover (a deploy at most), before a call fails with ``JobMasterLost``."""
        return self.start_s + self.control_s


__all__ = ["Deadlines"]
