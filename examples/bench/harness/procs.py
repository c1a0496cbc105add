"""CPU and memory of a job's actor processes, sampled from the driver.

Why: a benchmark's figures on a shared two-core machine mean little without knowing how
much CPU the job itself used against everything else, and whether its memory grows; the
job's task actors and JobMaster are separate processes, found through Ray's state API.

* ``job_actor_pids`` / ``wait_for_pids``: actor name -> pid of a job's ALIVE actors (names
  start with ``<job_id>/``).
* ``RssSampler``: a thread summing their RSS every second; ``cpu()`` the average cores used
  by each, by the job and by the rest of the machine over the sampled span.
* ``memory_summary``: start/end/max/min of the summed RSS, growth after a warm-up.

Linux only for CPU (``/proc``); RSS through psutil when installed, ``/proc`` otherwise. A
process that is gone reads as None, never as an error.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any


def _rss_bytes(pid: int) -> int | None:
    try:
        import psutil  # type: ignore[import-not-found]

        return int(psutil.Process(pid).memory_info().rss) or None
    except ImportError:
        pass
    except Exception:
        return None
    try:
        with open(f"/proc/{pid}/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return rss or None  # a zombie (killed actor not yet reaped) reports 0
    except (OSError, ValueError, IndexError):
        return None


def job_actor_pids(job_id: str) -> dict[str, int]:
    """Actor name -> pid of every ALIVE actor of this job (task actors and JobMaster)."""
    import ray
    from ray.util.state import list_actors

    out: dict[str, int] = {}
    # the GCS address of the cluster this driver is connected to (other Ray instances may
    # run on the same machine, so auto-discovery would be ambiguous)
    address = ray.get_runtime_context().gcs_address
    for a in list_actors(address=address, filters=[("state", "=", "ALIVE")], limit=10_000,
                         raise_on_missing_output=False):
        name = getattr(a, "name", None) or ""
        pid = getattr(a, "pid", None)
        if name.startswith(job_id + "/") and pid:
            out[name] = int(pid)
    return out


def wait_for_pids(job_id: str, expected: int, timeout: float = 10.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    pids: dict[str, int] = {}
    while time.monotonic() < deadline:
        try:
            pids = job_actor_pids(job_id)
        except Exception as exc:  # state API unavailable
            print(f"  (could not list actors: {exc})")
            return {}
        if len(pids) >= expected:
            break
        time.sleep(0.2)
    return pids


def _cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (Linux /proc), None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _machine_busy_seconds() -> float | None:
    """CPU seconds all cores spent not idle since boot (/proc/stat)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # minus idle, iowait
    except (OSError, ValueError, IndexError):
        return None


class RssSampler(threading.Thread):
    """Sums the RSS of the given pids every ``interval`` s until stopped; also notes the
    CPU time of those pids and of the whole machine, to tell how much CPU other processes
    (Ray daemons, the driver, anything else running) took meanwhile."""

    def __init__(self, pids: dict[str, int], t0: float, interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.t0 = t0
        self.interval = interval
        self.samples: list[dict[str, Any]] = []
        # (epoch seconds, CPU seconds of all the job's actors so far), while all live
        self.cpu_samples: list[tuple[float, float]] = []
        self._halt = threading.Event()
        self._cpu0 = {n: _cpu_seconds(p) for n, p in pids.items()}
        self._cpu_last = dict(self._cpu0)
        self._busy0 = _machine_busy_seconds()
        self._busy_last = self._busy0
        self._wall0 = time.monotonic()
        self._wall_last = self._wall0

    def run(self) -> None:
        while not self._halt.is_set():
            per = {n: _rss_bytes(p) for n, p in self.pids.items()}
            alive = {n: v for n, v in per.items() if v is not None}
            if alive:
                self.samples.append({
                    "t": round(time.monotonic() - self.t0, 3),
                    "rss_bytes": sum(alive.values()),
                    "processes": len(alive),
                    "per_actor": alive,
                })
                # CPU counters only while every actor lives (a killed one loses its count)
                if len(alive) == len(self.pids):
                    self._cpu_last = {n: _cpu_seconds(p) for n, p in self.pids.items()}
                    self._busy_last = _machine_busy_seconds()
                    self._wall_last = time.monotonic()
                    if all(v is not None for v in self._cpu_last.values()):
                        self.cpu_samples.append((time.time(), sum(self._cpu_last.values())))
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)

    def cpu(self) -> dict[str, Any]:
        """Average cores used over the sampled span: by each actor, by the job, by the
        whole machine, and by everything else."""
        wall = self._wall_last - self._wall0
        if wall <= 0 or self._busy0 is None or self._busy_last is None:
            return {}
        per = {n: (self._cpu_last[n] - self._cpu0[n]) / wall for n in self.pids
               if self._cpu_last.get(n) is not None and self._cpu0.get(n) is not None}
        job = sum(per.values())
        machine = (self._busy_last - self._busy0) / wall
        return {"span_s": wall, "job_cores": job, "machine_cores": machine,
                "other_cores": machine - job, "per_actor_cores": per}


def memory_summary(samples: list[dict[str, Any]], full_processes: int,
                   warmup_s: float | None = None) -> dict[str, Any]:
    """start/end/max/min of the summed RSS (MB); with ``warmup_s``, also the growth from the
    first sample after the warm-up to the end, over the second half of the run, and a
    least-squares slope after the warm-up."""
    # only samples in which every process of the job was still alive (the tail of a run,
    # while actors are being killed, would look like a drop)
    s = [x for x in samples if x["processes"] == full_processes] or samples
    if not s:
        return {"samples": 0}
    mb = [x["rss_bytes"] / 2**20 for x in s]
    out: dict[str, Any] = {"samples": len(s), "start_mb": mb[0], "end_mb": mb[-1],
                           "max_mb": max(mb), "min_mb": min(mb), "growth_mb": mb[-1] - mb[0]}
    if warmup_s is None:
        return out
    post = [(x["t"], m) for x, m in zip(s, mb, strict=True) if x["t"] >= warmup_s]
    if len(post) >= 2:
        n = len(post)
        mt = sum(t for t, _ in post) / n
        mm = sum(m for _, m in post) / n
        var = sum((t - mt) ** 2 for t, _ in post)
        slope = sum((t - mt) * (m - mm) for t, m in post) / var if var else 0.0
        half = [(t, m) for t, m in post if t >= s[-1]["t"] / 2]
        out.update({
            "after_warmup_start_mb": post[0][1],
            "after_warmup_growth_mb": post[-1][1] - post[0][1],
            "after_warmup_slope_mb_per_min": slope * 60.0,
            "second_half_growth_mb": half[-1][1] - half[0][1] if len(half) >= 2 else None,
            "second_half_seconds": half[-1][0] - half[0][0] if len(half) >= 2 else None,
        })
    return out


def rss_bytes(pids: dict[str, int]) -> dict[str, int]:
    """Name -> RSS in bytes of each of ``pids`` that is alive, read once."""
    out = {n: _rss_bytes(p) for n, p in pids.items()}
    return {n: v for n, v in out.items() if v is not None}


class JobRss(threading.Thread):
    """The summed RSS of a job's live actors (task actors and JobMaster) every
    ``interval`` s, the actors looked up again every ``refresh`` s (a rescale or a restart
    replaces them); ``summary()``: the peak total, the peak of one process, and the
    samples' count. Unlike ``RssSampler`` it follows actors that come and go."""

    def __init__(self, job_id: str, interval: float = 1.0, refresh: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.job_id = job_id
        self.interval = interval
        self.refresh = refresh
        self.peak_total = 0
        self.peak_process = 0
        self.samples = 0
        self._halt = threading.Event()

    def run(self) -> None:
        pids: dict[str, int] = {}
        looked = 0.0
        while not self._halt.is_set():
            now = time.monotonic()
            if now - looked >= self.refresh:
                with contextlib.suppress(Exception):  # the state API is busy: keep the last
                    pids = job_actor_pids(self.job_id)
                looked = now
            rss = rss_bytes(pids)
            if rss:
                self.samples += 1
                self.peak_total = max(self.peak_total, sum(rss.values()))
                self.peak_process = max(self.peak_process, max(rss.values()))
            self._halt.wait(self.interval)

    def stop(self) -> dict[str, Any]:
        """Stop sampling; the summary (MB)."""
        self._halt.set()
        self.join(timeout=10)
        return {"peak_total_mb": self.peak_total / 2**20,
                "peak_process_mb": self.peak_process / 2**20, "samples": self.samples}
