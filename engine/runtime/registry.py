"""Finding a running job from another process: ``reflow status JOB``, ``reflow rescale``.

Why: a job's JobMaster is a named Ray actor (``<job id>/master`` in the ``reflow``
namespace), so any process connected to the same Ray cluster can reach it by name. What
another process lacks is *which* cluster: a job started by ``python job.py`` runs on a local
Ray that its driver started, whose address nobody else knows, and ``ray.init("auto")``
would pick any cluster found on the machine (other users' included).

So every driver records where its job runs in an *address file*, ``<jobs dir>/<job
id>.json`` (``REFLOW_JOBS_DIR``, default ``~/.reflow/jobs``): the job id and name, the Ray
cluster's GCS address, the namespace, the metrics URL, the driver's host and pid. ``stop()``
removes it; a file whose driver (on this host) is gone is skipped and removed when read.
With an explicit Ray address (``--address``, ``RAY_ADDRESS``) no file is needed: the job is
looked up among the cluster's named actors, which is how a job submitted with ``ray job
submit`` is reached from a laptop (``ray://head:10001`` or the GCS address).

Lifetime: the JobMaster is not detached. A job lives as long as its driver (the script,
or the entrypoint of a Ray job submission), as in Flink's attached mode; this module never
prolongs it.

Guarantees: ``resolve`` returns the id and Ray address of a running or finished job or
raises ``JobNotFound`` (a ``ReflowError``) saying which jobs it knows and what to pass
(``engine.runtime.handle.find`` turns it into a ``JobHandle``: this module does not import
the handle, so the runtime's imports have no cycle).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from dataclasses import asdict, dataclass

import ray

from engine.errors import JobNotFound, RayUnavailable
from engine.runtime import local_ray
from engine.runtime.job_master import NAMESPACE

MASTER_SUFFIX = "/master"
ENV_DIR = "REFLOW_JOBS_DIR"
AUTH_MODE = "RAY_AUTH_MODE"


@dataclass(frozen=True)
class JobAddress:
    """Where a job runs: the content of its address file."""

    job_id: str
    name: str
    ray_address: str
    namespace: str
    metrics_url: str
    host: str
    pid: int
    auth_mode: str = ""  # the driver's RAY_AUTH_MODE ("token": clients must send the token)

    def matches(self, job: str) -> bool:
        return job in (self.job_id, self.name)


def jobs_dir() -> str:
    """The directory of address files: ``REFLOW_JOBS_DIR``, else ``~/.reflow/jobs``."""
    return os.environ.get(ENV_DIR) or os.path.join(os.path.expanduser("~"), ".reflow", "jobs")


def name_of(job_id: str) -> str:
    """The job name in a job id (``<name>-<8 hex digits>``)."""
    return job_id.rsplit("-", 1)[0]


def record(job_id: str, metrics_url: str) -> str | None:
    """Write this driver's address file for ``job_id``; returns its path (None when the
    directory cannot be written: a job never fails over its address file)."""
    addr = JobAddress(job_id, name_of(job_id), ray.get_runtime_context().gcs_address,
                      NAMESPACE, metrics_url, socket.gethostname(), os.getpid(),
                      os.environ.get(AUTH_MODE, ""))
    path = os.path.join(jobs_dir(), f"{job_id}.json")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(asdict(addr), f)
        os.replace(tmp, path)
    except OSError:
        return None
    return path


def forget(job_id: str) -> None:
    """Remove ``job_id``'s address file (the job was stopped)."""
    with contextlib.suppress(OSError):
        os.remove(os.path.join(jobs_dir(), f"{job_id}.json"))


def _alive(addr: JobAddress) -> bool:
    if addr.host != socket.gethostname():
        return True  # another host's driver: only the cluster can tell
    try:
        os.kill(addr.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recorded() -> list[JobAddress]:
    """The address files of jobs whose drivers still run, newest first; files of drivers
    gone from this host are removed."""
    folder = jobs_dir()
    out: list[tuple[float, JobAddress]] = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(folder):
            if not entry.name.endswith(".json"):
                continue
            try:
                with open(entry.path) as f:
                    addr = JobAddress(**json.load(f))
                mtime = entry.stat().st_mtime
            except (OSError, ValueError, TypeError):
                continue
            if not _alive(addr):
                with contextlib.suppress(OSError):
                    os.remove(entry.path)
                continue
            out.append((mtime, addr))
    return [a for _, a in sorted(out, key=lambda x: -x[0])]


def connect(address: str, auth_mode: str = "") -> None:
    """Connect this process to the Ray cluster at ``address`` (once). ``auth_mode``: the
    cluster's ``RAY_AUTH_MODE`` when this process has none set (Ray sends its token, from
    ``RAY_AUTH_TOKEN`` or ``~/.ray/auth_token``, only in token mode, and never turns it on
    by itself for an explicit address)."""
    if auth_mode and not os.environ.get(AUTH_MODE):
        os.environ[AUTH_MODE] = auth_mode
        # Ray read the variable when it was imported; make it read it again (what ray.init
        # does itself when it turns token mode on for a cluster it starts)
        from ray._raylet import Config  # type: ignore[attr-defined]  # not in ray's stub

        Config.initialize("")
    if not ray.is_initialized():
        check_reachable(address)
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False,
                 configure_logging=False)


#: how long ``check_reachable`` waits for a Ray address to accept a connection
REACH_TIMEOUT_S = 5.0


def check_reachable(address: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """``RayUnavailable`` at once when nothing listens at ``address`` (``host:port`` or
    ``ray://host:port``); Ray itself would retry for minutes, printing its warnings. Other
    forms (``auto``, ``local``) are left to Ray."""
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or "/" in hostport:
        return
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)),
                                      timeout=timeout_s):
            pass
    except OSError as exc:
        raise RayUnavailable(
            f"no Ray cluster answers at {address} ({exc}); pass the address of a running "
            "cluster's head (GCS host:port, or ray://host:10001), or leave --address out "
            "to look in this machine's job files") from exc


def cluster_jobs() -> list[str]:
    """The ids of the jobs whose JobMaster lives on the connected cluster."""
    names = ray.util.list_named_actors(all_namespaces=True)
    return sorted(n["name"][:-len(MASTER_SUFFIX)] for n in names
                  if n["namespace"] == NAMESPACE and n["name"].endswith(MASTER_SUFFIX))


def resolve(job: str, address: str | None = None) -> tuple[str, str]:
    """``(job id, Ray address)`` of the running job named ``job`` (a job id, or a job name
    when exactly one running job has it), this process connected to that cluster.
    ``address`` (else ``RAY_ADDRESS``): look among that cluster's jobs; otherwise among the
    address files. ``JobNotFound`` otherwise."""
    address = address or local_ray.address_from_env()
    if address is None:
        known = recorded()
        hits = [a for a in known if a.matches(job)]
        ids = sorted({a.job_id for a in hits})
        if len(ids) == 1:
            connect(hits[0].ray_address, hits[0].auth_mode)
            return ids[0], hits[0].ray_address
        listing = ", ".join(a.job_id for a in known) or "none"
        if ids:
            raise JobNotFound(f"{len(ids)} running jobs are named {job!r}: {', '.join(ids)}; "
                              "pass the job id")
        raise JobNotFound(f"no running job {job!r} recorded in {jobs_dir()} (jobs there: "
                          f"{listing}); for a job on a cluster pass --address (or set "
                          "RAY_ADDRESS) to look among its jobs")
    connect(address)
    ids = cluster_jobs()
    found = [j for j in ids if j == job] or [j for j in ids if name_of(j) == job]
    if len(found) == 1:
        return found[0], address
    if found:
        raise JobNotFound(f"{len(found)} jobs named {job!r} run on {address}: "
                          f"{', '.join(found)}; pass the job id")
    raise JobNotFound(f"no job {job!r} on the Ray cluster at {address} (jobs there: "
                      f"{', '.join(ids) or 'none'})")


__all__ = ["MASTER_SUFFIX", "JobAddress", "JobNotFound", "cluster_jobs", "forget", "jobs_dir",
           "record", "recorded", "resolve"]
