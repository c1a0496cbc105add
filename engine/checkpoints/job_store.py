"""The durable job record in the job's checkpoint directory, fenced by JobMaster epochs.

Why: a JobMaster that dies (its process, its node) is restarted by Ray; the new one must
find the job's state (``engine.checkpoints.durable_record.DurableRecord``) where the
checkpoints are, and the old one, should it still run (a partition, a slow death), must
never overwrite what the new one wrote. pyarrow.fs as in ``engine.checkpoints.store``: a
local directory, or ``s3://``/``gs://``/``hdfs://`` on a cluster.

Layout of a job's directory (``<checkpoint root>/<job id>/``, beside its ``chk-<n>``)::

    _job                     the record (engine.checkpoints.durable_record's format)
    _job.tmp-<epoch>         a record being written by the JobMaster of <epoch>; never
                             read (one left by a dead JobMaster: removed by the next claim)
    _leader/<epoch>          one empty marker per JobMaster epoch that claimed the job
                             (20 digits, so names sort as numbers)
    _leader/.lock            local filesystems only: serializes claims against writes

Who writes: the job's JobMaster, one at a time per epoch. ``claim()`` gives a starting
JobMaster its epoch, one above the highest marker, and creates that marker; from then on
every ``write`` of a lower epoch raises ``StaleJobMaster`` naming both epochs.

Guarantees:

* Atomic write: the record is written whole to ``_job.tmp-<epoch>`` and moved onto
  ``_job`` (a rename on a local filesystem; an object store's copy makes the new object
  visible at once). ``read`` sees the previous record or the new one, never a part; a
  write that fails (the store refuses, a value msgpack cannot carry) leaves the previous
  record as it was. A record is durable against the death of the process that wrote it;
  on a local filesystem a crash of the machine itself may lose the latest write (no
  fsync), as for a checkpoint's ``_metadata``.
* Fencing, local filesystem: markers are created with ``O_CREAT|O_EXCL`` (two claims
  never get the same epoch: the loser takes the next number), and a write's check for a
  newer marker and its move onto ``_job`` hold the same ``flock`` as a claim, so once
  ``claim()`` returned epoch n no write of an epoch below n lands. Across machines this
  needs a filesystem whose ``O_EXCL`` and ``flock`` hold there (a local disk, or NFSv4).
* Fencing, any other filesystem (object stores): check-then-write. A claim lists the
  markers and writes the next one absent; two claims at the same instant may both take
  it (Ray runs one instance of a restarted actor at a time, so this needs a JobMaster
  thought dead that is not). A write checks for a newer marker before its move: a stale
  JobMaster's write racing a claim may land once after it, and its next write raises;
  the new JobMaster's first write, after its claim, replaces it.
* ``read`` returns None only when there is no ``_job``; a record that cannot be read,
  is corrupt, of another format or of another job raises ``JobRecordUnreadable`` naming
  the path, the job and the reason, so a job is never started from nothing in its place.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterator
from typing import Any

from engine.checkpoints.durable_record import DurableRecord, RecordProblem, unreadable
from engine.checkpoints.store import _fs, join
from engine.errors import InternalError, StaleJobMaster

RECORD_FILE = "_job"
LEADER_DIR = "_leader"
LOCK_FILE = ".lock"
_MARKER = re.compile(r"^\d{20}$")
_TEMPORARY = re.compile(rf"^{RECORD_FILE}\.tmp-(\d+)$")


def marker_name(epoch: int) -> str:
    """The marker file of ``epoch`` (20 digits: names sort as the epochs do)."""
    return f"{epoch:020d}"


class JobRecordStore:
    """The record store of the job whose checkpoint directory is ``job_dir`` (a path or a
    URI); ``job_id``: the job's id (None: the last component of ``job_dir``, as the
    layout ``<root>/<job id>`` has it), what errors name and ``read`` checks."""

    def __init__(self, job_dir: str, job_id: str | None = None) -> None:
        import pyarrow.fs as pafs

        self.job_dir = job_dir
        base = job_dir.split("?", 1)[0].rstrip("/")
        self.job_id = job_id if job_id is not None else base.rsplit("/", 1)[-1]
        # one filesystem per store: ``_fs`` builds a new one per URI
        self._fs: Any
        self._fs, self._root = _fs(job_dir)
        self._local = isinstance(self._fs, pafs.LocalFileSystem)
        self._writing = threading.Lock()  # one write at a time per store (the tmp file)

    # ---------------------------------------------------------------- paths
    @property
    def path(self) -> str:
        """Where the record is (``<job_dir>/_job``), as errors name it."""
        return join(self.job_dir, RECORD_FILE)

    def _in_root(self, *names: str) -> str:
        return "/".join([self._root.rstrip("/"), *names])

    # ---------------------------------------------------------------- epochs
    def epochs(self) -> list[int]:
        """The epochs claimed so far, lowest first ([] when none). ``OSError`` when the
        store cannot list them."""
        import pyarrow.fs as pafs

        infos = self._fs.get_file_info(
            pafs.FileSelector(self._in_root(LEADER_DIR), allow_not_found=True))
        return sorted(int(i.base_name) for i in infos
                      if _MARKER.match(i.base_name) and i.type == pafs.FileType.File)

    def fenced(self, epoch: int) -> int | None:
        """The newest epoch above ``epoch`` that claimed the job (the JobMaster of
        ``epoch`` is stale then), or None when ``epoch`` is the newest."""
        claimed = self.epochs()
        return claimed[-1] if claimed and claimed[-1] > epoch else None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The job's claim/write lock on a local filesystem (see the module doc); nothing
        elsewhere."""
        if not self._local:
            yield
            return
        import fcntl

        os.makedirs(self._in_root(LEADER_DIR), exist_ok=True)
        fd = os.open(self._in_root(LEADER_DIR, LOCK_FILE), os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def claim(self) -> int:
        """A new epoch for a starting JobMaster: one above every epoch claimed so far, its
        marker created (exclusively on a local filesystem). Every JobMaster of a lower
        epoch is fenced from now on, and the temporary records they left (a process that
        died between writing one and moving it) are removed. ``OSError`` when the store
        refuses."""
        epoch = self._claim()
        self._drop_temporaries(below=epoch)
        return epoch

    def _claim(self) -> int:
        with self._locked():
            claimed = self.epochs()
            epoch = (claimed[-1] if claimed else 0) + 1
            if self._local:
                return self._claim_local(epoch)
            self._fs.create_dir(self._in_root(LEADER_DIR), recursive=True)
            import pyarrow.fs as pafs

            while self._fs.get_file_info(
                    self._in_root(LEADER_DIR, marker_name(epoch))).type != pafs.FileType.NotFound:
                epoch += 1
            with self._fs.open_output_stream(self._in_root(LEADER_DIR, marker_name(epoch))):
                pass
            return epoch

    def _drop_temporaries(self, below: int) -> None:
        import pyarrow.fs as pafs

        with contextlib.suppress(OSError):
            for info in self._fs.get_file_info(pafs.FileSelector(self._root,
                                                                 allow_not_found=True)):
                m = _TEMPORARY.match(info.base_name)
                if m is not None and int(m.group(1)) < below:
                    self._discard(info.path)

    def _claim_local(self, epoch: int) -> int:
        while True:
            try:
                fd = os.open(self._in_root(LEADER_DIR, marker_name(epoch)),
                             os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                epoch += 1  # another claim took it: markers only grow
                continue
            os.close(fd)
            return epoch

    # ---------------------------------------------------------------- the record
    def _stale(self, rec: DurableRecord) -> StaleJobMaster | None:
        newer = self.fenced(rec.master_epoch)
        if newer is None:
            return None
        return StaleJobMaster(
            f"job {rec.job_id}: the JobMaster of epoch {rec.master_epoch} is stale: a newer "
            f"JobMaster (epoch {newer}) claimed the job in {join(self.job_dir, LEADER_DIR)} "
            f"and owns it now. This one must stop acting on the job (the newer one carries "
            f"it on); a driver reconnects with engine.attach", job=rec.job_id,
            call="write", epoch=rec.master_epoch, newer_epoch=newer)

    def write(self, rec: DurableRecord) -> None:
        """Replace the record with ``rec``, atomically (the module doc). ``StaleJobMaster``
        when a JobMaster of an epoch above ``rec.master_epoch`` claimed the job (nothing
        written); ``CodecError`` when ``rec`` cannot be encoded and ``OSError`` when the
        store refuses (the previous record stays as it was in every case)."""
        if rec.job_id != self.job_id:
            raise InternalError(f"the record store of job {self.job_id} was given the record "
                                f"of job {rec.job_id}")
        data = rec.encode()
        stale = self._stale(rec)
        if stale is not None:
            raise stale
        tmp = self._in_root(f"{RECORD_FILE}.tmp-{rec.master_epoch}")
        with self._writing:
            self._fs.create_dir(self._root, recursive=True)
            try:
                with self._fs.open_output_stream(tmp) as out:
                    out.write(data)
                with self._locked():
                    stale = self._stale(rec)
                    if stale is None:
                        self._fs.move(tmp, self._in_root(RECORD_FILE))
            except BaseException:
                self._discard(tmp)
                raise
            if stale is not None:
                self._discard(tmp)
                raise stale

    def _discard(self, tmp: str) -> None:
        with contextlib.suppress(OSError):
            self._fs.delete_file(tmp)

    def read(self) -> DurableRecord | None:
        """The record, or None when there is none (no ``_job``: the job never wrote one).
        ``JobRecordUnreadable`` naming the path, the job and the reason when it cannot be
        read, is corrupt, of another format, or another job's."""
        import pyarrow.fs as pafs

        try:
            info = self._fs.get_file_info(self._in_root(RECORD_FILE))
            if info.type == pafs.FileType.NotFound:
                return None
            with self._fs.open_input_stream(self._in_root(RECORD_FILE)) as f:
                data = f.read()
        except FileNotFoundError:
            return None  # moved away between the two calls
        except OSError as exc:
            raise unreadable(self.path, self.job_id, RecordProblem.UNREADABLE,
                             f"the store refused to read it ({exc})") from exc
        rec = DurableRecord.decode(data, self.path, self.job_id)
        if rec.job_id != self.job_id:
            raise unreadable(self.path, self.job_id, RecordProblem.FOREIGN,
                             f"it is the record of job {rec.job_id}, not of {self.job_id}")
        return rec


__all__ = ["LEADER_DIR", "RECORD_FILE", "JobRecordStore", "marker_name"]
