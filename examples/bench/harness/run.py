"""Running benchmark jobs on Ray: start-up, progress, the rescale run loop, polling to the end.

Why one module: every rescale benchmark runs a job through the same phases — deploy, build
state, baseline, the request, a span after it — and must treat a refused request, a failed
job and a job that stopped on its own the same way, or their figures stop being comparable.

* ``init_ray``: connect to (or start) Ray in reflow's namespace with the repository root on
  the workers' path, so they import ``examples.bench.*`` by name.
* ``Progress``: one status line on stderr (phase, elapsed, an estimate of what is left).
* ``rescale_run``: the run loop. Its result dict: ``status`` (``ok``, ``skipped`` when the
  engine refused the request, ``failed`` when the job failed), ``reason``, ``job_id``,
  ``started_at``, ``requested_at``, ``returned_at``, ``ended_at`` (epoch seconds),
  ``report`` (``report_dict``; absent for the run without a request), ``metrics_before``
  and ``metrics_after`` (``op_metrics``).
* ``wait_finished``: poll the JobMaster's status (no task is asked) until the job ends.

Guarantees: every job started here is stopped before the function returns or raises; a
refused or failed request is recorded in the result, never raised.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from engine import JobFailedError, RescaleRefused, StreamJob
from engine.names import JobState, NameEnum
from examples.bench.harness import ROOT, jobs, procs
from examples.bench.harness import analysis as an

DEPLOY_GUESS_S = 4.0  # for the progress estimate only


class RunStatus(NameEnum):
    """How one benchmark run ended (``status`` in ``results.json``)."""

    OK = "ok"
    SKIPPED = "skipped"  # the engine refused the request (RescaleRefused) or it does not apply
    FAILED = "failed"  # the job failed, or ended before the run was over


def init_ray(*, address: str | None = None, log_to_driver: bool = True,
             **kwargs: Any) -> None:
    """Connect to Ray (``ray.init``) unless connected. Locally (no ``RAY_ADDRESS``, not a
    submitted job) a new local Ray is started, never the cluster another process recorded
    with ``ray start`` or ``ray.cluster_utils.Cluster`` (a benchmark that joined one died
    with it, and shared its cores with it), and the workers get the repository root on
    their ``PYTHONPATH``; under ``ray job submit --working-dir .`` the working directory
    already is on it. ``RAY_ADDRESS`` names a cluster to use; so does ``address`` (a
    ``ray.cluster_utils.Cluster`` the script started itself), whose workers also get the
    repository root on their ``PYTHONPATH``."""
    import ray

    from engine.runtime import NAMESPACE, local_ray

    if ray.is_initialized():
        return
    if not local_ray.submitted() or address is not None:
        path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
        kwargs.setdefault("runtime_env", {"env_vars": {"PYTHONPATH": path}})
        if address is None:
            address = local_ray.LOCAL
    local_ray.connect(address, namespace=NAMESPACE, log_to_driver=log_to_driver,
                      configure_logging=False, **kwargs)
    if os.environ.get("RAY_ADDRESS") == local_ray.LOCAL:
        # Ray's state API (harness.procs) takes RAY_ADDRESS over its address argument, and
        # "local" names no cluster there (several on one machine: it refuses to guess)
        os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address


def shutdown_ray() -> None:
    import ray

    ray.shutdown()


def ray_version() -> str:
    import ray

    return str(ray.__version__)


class Progress:
    """One status line on stderr: the step, elapsed time and an estimate of what is left
    (from the planned seconds of every step). Rewritten in place every second on a
    terminal; one line per step otherwise (logs, CI)."""

    def __init__(self, planned_s: float) -> None:
        self.planned = planned_s
        self.t0 = time.monotonic()
        self.done_planned = 0.0  # planned seconds of finished steps
        self.step_planned = 0.0
        self.step_t0 = self.t0
        self.label = "starting"
        self.tty = sys.stderr.isatty()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def step(self, label: str, planned_s: float) -> None:
        """A new step begins, planned to take ``planned_s`` seconds."""
        self.done_planned += self.step_planned
        self.step_planned, self.step_t0, self.label = planned_s, time.monotonic(), label
        if self.tty:
            self._draw()
        else:
            el = time.monotonic() - self.t0
            left = max(0.0, self.planned - self.done_planned)
            print(f"[{self._fmt(el)} elapsed, ~{self._fmt(left)} left] {label}",
                  file=sys.stderr, flush=True)

    @staticmethod
    def _fmt(s: float) -> str:
        return f"{int(s) // 60}:{int(s) % 60:02d}"

    def _draw(self) -> None:
        now = time.monotonic()
        in_step = min(now - self.step_t0, self.step_planned)
        frac = min(1.0, (self.done_planned + in_step) / self.planned) if self.planned else 0.0
        left = max(0.0, self.planned - self.done_planned - in_step)
        bar = "#" * int(frac * 24) + "-" * (24 - int(frac * 24))
        line = (f"\r[{bar}] {frac:4.0%} {self._fmt(now - self.t0)} elapsed, ~{self._fmt(left)} "
                f"left | {self.label}")
        sys.stderr.write(line[:160].ljust(100))
        sys.stderr.flush()

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            if self.tty:
                self._draw()

    def close(self) -> None:
        self._stop.set()
        if self.tty:
            self.done_planned += self.step_planned
            self.step_planned = 0.0
            self._draw()
            sys.stderr.write("\n")
            sys.stderr.flush()


def op_metrics(handle: Any, op: str) -> dict[str, Any]:
    """State bytes, tasks, key groups and records in of operator ``op``, from one metrics
    call (every task packs its state samples: not free, so once per phase)."""
    ts = [t for t in handle.metrics().tasks if t.vertex == op]
    return {"state_bytes": sum(t.state_bytes for t in ts), "tasks": len(ts),
            "key_groups": sum(t.key_groups for t in ts),
            "records_in": sum(t.records_in for t in ts)}


def report_dict(report: Any) -> dict[str, Any]:
    """A ``RescaleReport`` as a JSON-ready dict (tuples become lists; ``planning_reason``
    always present)."""
    out: dict[str, Any] = {}
    for f in getattr(report, "__dataclass_fields__", None) or {}:
        v = getattr(report, f)
        if isinstance(v, tuple):
            v = [list(x) if isinstance(x, tuple) else x for x in v]
        out[f] = v
    out["planning_reason"] = getattr(report, "planning_reason", None)
    return out


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


def settle_check(sink: Any, rate: float) -> Callable[[Any, float], bool]:
    """``rescale_run``'s ``settled`` for a job writing to the latency ``sink`` at ``rate``
    records/s: ``analysis.settled_run`` on the sink's per-second rows since the second
    after the build ended."""
    def check(handle: Any, built: float) -> bool:
        rows = an.histogram_rows(jobs.latency_seconds(sink))
        return an.settled_run(handle, rows, int(built) + 1, int(time.time()), rate)
    return check


def rescale_run(job: StreamJob, *, op: str, request: Callable[[Any], Any] | None,
                build_s: float, baseline_s: float, after_s: float, progress: Progress,
                label: str, what: str = "rescale", guess_s: float = 8.0,
                settled: Callable[[Any, float], bool] | None = None,
                settle_max_s: float = 0.0, sample_rss: bool = False) -> dict[str, Any]:
    """Deploy ``job``; let it build state for ``build_s`` (from deployment); then, with
    ``settled`` and ``settle_max_s > 0``, wait until ``settled(handle, build_end)`` (checked every second; no backlog
    of the build left) for at most ``settle_max_s``; run a ``baseline_s``
    baseline; then ``request(handle)`` (a blocking ``handle.rescale`` or
    ``handle.rebalance`` returning its report; None: only the time is noted, the run
    without a rescale) and ``after_s`` more seconds from its return; stop the job. ``what``
    and ``guess_s`` describe the request to ``progress``. The result has ``settle_s`` (the
    wait) and ``settled`` (False: the cap ended it); with ``sample_rss``, ``rss``: the peak
    RSS of the job's actors over the run (``procs.JobRss``); see the module docstring for
    the rest."""
    out: dict[str, Any] = {"status": RunStatus.OK}
    progress.step(f"{label}: deploy", DEPLOY_GUESS_S)
    handle = job.run()
    started = time.time()
    sampler = None
    if sample_rss:
        sampler = procs.JobRss(handle.job_id)
        sampler.start()
    report = None
    requested = returned = ended = started
    try:
        progress.step(f"{label}: build state {build_s:.0f} s", build_s)
        _sleep_until(started + build_s)
        built = time.time()
        if settled is not None and settle_max_s > 0:
            progress.step(f"{label}: settle (at most {settle_max_s:g} s)", settle_max_s / 4)
            while not (ok := settled(handle, built)) and time.time() < built + settle_max_s:
                time.sleep(1.0)
            out.update(settle_s=round(time.time() - built, 1), settled=ok)
        out["metrics_before"] = op_metrics(handle, op)
        progress.step(f"{label}: baseline {baseline_s:g} s", baseline_s)
        time.sleep(baseline_s)
        requested = time.time()
        if request is not None:
            progress.step(f"{label}: {what}", guess_s)
            try:
                report = request(handle)
            except RescaleRefused as exc:
                out.update(status=RunStatus.SKIPPED, reason=f"RescaleRefused: {exc}")
                return out
            except JobFailedError as exc:
                out.update(status=RunStatus.FAILED, reason=f"{type(exc).__name__}: {exc}")
                return out
        returned = time.time()
        progress.step(f"{label}: after {after_s:g} s", after_s)
        _sleep_until(returned + after_s)
        ended = time.time()
        st = handle.status()
        if st.state != JobState.RUNNING:
            out.update(status=RunStatus.FAILED,
                       reason=f"job {st.state} after the request: {st.error}")
            return out
        out["metrics_after"] = op_metrics(handle, op)
    finally:
        if sampler is not None:
            out["rss"] = sampler.stop()
        progress.step(f"{label}: stop", 1.0)
        handle.stop()
    out.update(job_id=handle.job_id, started_at=started, requested_at=requested,
               returned_at=returned, ended_at=ended)
    if report is not None:
        out["report"] = report_dict(report)
    return out


def wait_finished(handle: Any, poll_s: float, timeout_s: float, since: float | None = None
                  ) -> tuple[float | None, JobState]:
    """Poll the JobMaster's status (cheap: no task is asked) every ``poll_s`` until the job
    leaves ``created``/``running`` or ``timeout_s`` passed (both from ``since``, a
    ``time.monotonic()`` value; default now); returns (seconds from ``since`` to the first
    poll that saw it end, or None on timeout; the last state seen)."""
    t0 = time.monotonic() if since is None else since
    deadline = t0 + timeout_s
    state = JobState.RUNNING
    while time.monotonic() < deadline:
        state = JobState(handle.status().state)
        now = time.monotonic()
        if not state.active:
            return now - t0, state
        time.sleep(poll_s)
    return None, state
