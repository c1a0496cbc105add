"""Finding a running job from another process: ``engine.attach``, ``reflow list/status/...``.

Why: a job's JobMaster is a named Ray actor (``<job id>/master`` in the ``reflow``
namespace), so any process connected to the same Ray cluster can reach it by name. What
another process lacks is *which* cluster: a job started by ``python job.py`` runs on a local
Ray that its driver started, whose address nobody else knows, and ``ray.init("auto")``
would pick any cluster found on the machine (other users' included).

So every driver records where its job runs in an *address file*, ``<jobs dir>/<job
id>.json`` (``REFLOW_JOBS_DIR``, default ``~/.reflow/jobs``; format: one JSON object, the
fields of ``JobAddress``): the job id and name, the Ray cluster's GCS address, the
namespace, the metrics URL, the driver's host and pid, and whether the job is detached.
With an explicit Ray address (``--address``, ``RAY_ADDRESS``), or in a process already
connected to Ray, no file is needed: the job is looked up among the cluster's named
actors, which is how a job submitted with ``ray job submit`` is reached from a laptop
(``ray://head:10001`` or the GCS address).

Lifetime of a file: ``JobHandle.stop()`` (``reflow stop``) removes it. An *attached* job
(the default) lives as long as its driver, so its file is dropped once its driver (on this
host) is gone. A *detached* job (``job.run(detached=True)``) outlives its driver, so its
file is kept after the driver exits and dropped only when the job is found ended: its
cluster answers and holds no JobMaster of that id. A cluster that does not answer proves
nothing (a head may be restarting): the file stays, listed as unreachable, until a lookup
finds the job ended or ``reflow stop`` forgets it. This module never prolongs a job.

Guarantees: ``resolve`` returns the id and Ray address of a job whose JobMaster exists,
this process connected to its cluster, or raises ``JobNotFound`` (an unknown name: the
message lists the jobs it knows, names and ids, and what to pass) or
``JobNotRunningError`` (the job was known and has ended; one line). ``listing`` and
``ended`` are pure: the merge of address files and a cluster's actor names that ``reflow
list`` shows, and which files it drops. ``engine.runtime.handle.attach`` turns a resolved
job into a ``JobHandle``: this module does not import the handle, so the runtime's
imports have no cycle.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import ray

from engine.errors import JobNotFound, JobNotRunningError, RayUnavailable
from engine.runtime import local_ray
from engine.runtime.job_master import NAMESPACE

MASTER_SUFFIX = "/master"
ENV_DIR = "REFLOW_JOBS_DIR"
AUTH_MODE = "RAY_AUTH_MODE"


@dataclass(frozen=True)
class JobAddress:
    """Where a job runs: the content of its address file. ``detached``: the job outlives
    its driver (the file is kept after the driver exits)."""

    job_id: str
    name: str
    ray_address: str
    namespace: str
    metrics_url: str
    host: str
    pid: int
    auth_mode: str = ""  # the driver's RAY_AUTH_MODE ("token": clients must send the token)
    detached: bool = False

    def matches(self, job: str) -> bool:
        return job in (self.job_id, self.name)

    @property
    def driver(self) -> str:
        return f"{self.host}:{self.pid}"

    @classmethod
    def from_json(cls, value: object) -> JobAddress:
        """The address in a parsed file; ``ValueError`` for anything else (a file of
        another version keeps only the fields this one knows)."""
        if not isinstance(value, dict):
            raise ValueError(f"an address file holds a JSON object, not {value!r:.80}")
        known = {f.name for f in fields(cls)}
        addr = cls(**{k: v for k, v in value.items() if k in known})
        if not (isinstance(addr.job_id, str) and isinstance(addr.ray_address, str)
                and isinstance(addr.pid, int) and isinstance(addr.detached, bool)):
            raise ValueError(f"not an address file: {value!r:.200}")
        return addr


@dataclass(frozen=True)
class ListedJob:
    """One line of ``reflow list``: a job known from its address file, from its cluster's
    named JobMaster, or both. ``detached``: None when only the cluster knows the job (its
    status says). ``driver``: ``host:pid`` from the address file ("" when none)."""

    job_id: str
    name: str
    ray_address: str
    detached: bool | None
    driver: str = ""
    on_cluster: bool = False  # its JobMaster was seen on the connected cluster


def jobs_dir() -> str:
    """The directory of address files: ``REFLOW_JOBS_DIR``, else ``~/.reflow/jobs``."""
    return os.environ.get(ENV_DIR) or os.path.join(os.path.expanduser("~"), ".reflow", "jobs")


def name_of(job_id: str) -> str:
    """The job name in a job id (``<name>-<8 hex digits>``)."""
    return job_id.rsplit("-", 1)[0]


def record(job_id: str, metrics_url: str, detached: bool = False) -> str | None:
    """Write this driver's address file for ``job_id``; returns its path (None when the
    directory cannot be written: a job never fails over its address file). ``detached``:
    keep the file after this driver exits."""
    addr = JobAddress(job_id, name_of(job_id), ray.get_runtime_context().gcs_address,
                      NAMESPACE, metrics_url, socket.gethostname(), os.getpid(),
                      os.environ.get(AUTH_MODE, ""), bool(detached))
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
    """Remove ``job_id``'s address file (the job was stopped or found ended)."""
    with contextlib.suppress(OSError):
        os.remove(os.path.join(jobs_dir(), f"{job_id}.json"))


def _driver_alive(addr: JobAddress) -> bool:
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
    """The address files of jobs that may run, newest first: a detached job's file, or an
    attached job's whose driver still runs (files of attached jobs whose driver is gone
    from this host are removed)."""
    folder = jobs_dir()
    out: list[tuple[float, JobAddress]] = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(folder):
            if not entry.name.endswith(".json"):
                continue
            try:
                with open(entry.path) as f:
                    addr = JobAddress.from_json(json.load(f))
                mtime = entry.stat().st_mtime
            except (OSError, ValueError, TypeError):
                continue
            if not addr.detached and not _driver_alive(addr):
                with contextlib.suppress(OSError):
                    os.remove(entry.path)
                continue
            out.append((mtime, addr))
    return [a for _, a in sorted(out, key=lambda x: -x[0])]


# ------------------------------------------------------------------ pure: listing, ended

def ended(files: Iterable[JobAddress], cluster_address: str,
          cluster_ids: Iterable[str]) -> list[str]:
    """The ids of the address files on ``cluster_address`` (the cluster that answered)
    whose job has no JobMaster among ``cluster_ids`` there: those jobs ended."""
    alive = set(cluster_ids)
    return sorted({a.job_id for a in files
                   if a.ray_address == cluster_address and a.job_id not in alive})


def listing(files: Sequence[JobAddress], cluster_address: str | None,
            cluster_ids: Iterable[str]) -> list[ListedJob]:
    """``reflow list``'s jobs: every address file not found ended (``ended``) and every
    JobMaster of the cluster at ``cluster_address`` (None: not connected, ``cluster_ids``
    ignored), one entry per job id, files first in their order, then the cluster's others
    by id."""
    where = cluster_address or ""
    ids = sorted(set(cluster_ids)) if cluster_address is not None else []
    gone = set(ended(files, where, ids)) if cluster_address is not None else set()
    out: dict[str, ListedJob] = {}
    for a in files:
        if a.job_id in gone or a.job_id in out:
            continue
        out[a.job_id] = ListedJob(a.job_id, a.name, a.ray_address, a.detached, a.driver,
                                  on_cluster=a.job_id in ids)
    for j in ids:
        if j not in out:
            out[j] = ListedJob(j, name_of(j), where, None, on_cluster=True)
    return list(out.values())


def _named(ids: Iterable[str]) -> str:
    """Jobs for a message: ``name (id)`` each, or "none"."""
    return ", ".join(f"{name_of(j)} ({j})" for j in ids) or "none"


# ------------------------------------------------------------------ the cluster

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
    check_reachable(address)  # also when connected: an address that does not answer says so
    if not ray.is_initialized():
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False,
                 configure_logging=False)


def connected_address() -> str | None:
    """The GCS address of the cluster this process is connected to (None: not connected,
    or a Ray client connection, which does not say)."""
    if not ray.is_initialized():
        return None
    try:
        address = ray.get_runtime_context().gcs_address
    except Exception:  # a ray:// client: no GCS address on this side
        return None
    return address or None


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


def master_of(job_id: str) -> Any:
    """``job_id``'s JobMaster actor on the connected cluster, or None when it has none."""
    try:
        return ray.get_actor(f"{job_id}{MASTER_SUFFIX}", namespace=NAMESPACE)
    except ValueError:
        return None


def master_exists(job_id: str) -> bool:
    """Whether ``job_id``'s JobMaster is a live actor of the connected cluster."""
    return master_of(job_id) is not None


def _ended_error(job_id: str, address: str) -> JobNotRunningError:
    forget(job_id)
    return JobNotRunningError(f"job {job_id} has ended: the Ray cluster at {address} holds no "
                              "JobMaster for it (its address file is removed)")


def resolve(job: str, address: str | None = None) -> tuple[str, str]:
    """``(job id, Ray address)`` of the running job named ``job`` (a job id, or a job name
    when exactly one running job has it), this process connected to that cluster.
    ``address`` (else ``RAY_ADDRESS``, else the cluster this process is connected to): look
    among that cluster's jobs; otherwise among the address files. ``JobNotFound`` for a
    name no job has (or several have), ``JobNotRunningError`` for a recorded job that
    ended (its file is removed)."""
    address = address or local_ray.address_from_env() or connected_address()
    if address is None:
        return _resolve_recorded(job)
    connect(address)
    here = connected_address() or address
    ids = cluster_jobs()
    found = [j for j in ids if j == job] or [j for j in ids if name_of(j) == job]
    if len(found) == 1:
        return found[0], address
    if found:
        raise JobNotFound(f"{len(found)} jobs named {job!r} run on {address}: "
                          f"{', '.join(found)}; pass the job id")
    files = recorded()
    for gone in ended(files, here, ids):
        if any(a.job_id == gone and a.matches(job) for a in files):
            raise _ended_error(gone, address)
    raise JobNotFound(f"no job {job!r} on the Ray cluster at {address} (jobs there: "
                      f"{_named(ids)}); pass one of those names or ids")


def _resolve_recorded(job: str) -> tuple[str, str]:
    known = recorded()
    hits = [a for a in known if a.matches(job)]
    ids = sorted({a.job_id for a in hits})
    if len(ids) > 1:
        raise JobNotFound(f"{len(ids)} running jobs are named {job!r}: {', '.join(ids)}; "
                          "pass the job id")
    if not ids:
        raise JobNotFound(f"no running job {job!r} recorded in {jobs_dir()} (jobs there: "
                          f"{_named(a.job_id for a in known)}); pass one of those names or "
                          "ids, or for a job on a cluster pass --address (or set "
                          "RAY_ADDRESS) to look among its jobs")
    addr = hits[0]
    connect(addr.ray_address, addr.auth_mode)
    if not master_exists(addr.job_id):
        raise _ended_error(addr.job_id, addr.ray_address)
    return addr.job_id, addr.ray_address


__all__ = ["MASTER_SUFFIX", "JobAddress", "JobNotFound", "ListedJob", "cluster_jobs",
           "connected_address", "ended", "forget", "jobs_dir", "listing", "master_exists",
           "master_of", "record", "recorded", "resolve"]
