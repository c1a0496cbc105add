"""Local recovery: a second copy of a task's checkpoint parts on its node's disk, read
instead of the store when a task is restored on that node (``JobConfig.local_recovery``;
Flink's task-local recovery).

Why: a restore reads every key group of the restored tasks from the checkpoint store. On a
cluster the store is remote (S3, GCS, HDFS) and the read is the restore's longest part;
the task that wrote a part, or a task on the same node, can read a local copy at disk
speed. The store stays the truth: a copy is only ever an alternative source of bytes
whose CRC-32 the checkpoint's metadata gives.

Layout (on each node, under the state root of ``engine.state.backends``)::

    <state root>/local-recovery/<job id>/copies/<pid>-<random>/   one task process's copies
        reflow.lock                       flock'ed while the process keeps copies there
        <sha1 of the part's URI>.state    a copy of the stored part file at that URI

A copy of a part in a store on the local filesystem is a hard link to the stored file (no
bytes are written twice; a copy when the link fails, e.g. across devices); of a part in a
remote store, the bytes written again. Either goes to a temporary name and is moved into
place: a copy is whole or absent.

Guarantees: a read uses a copy only when every key group it takes from it matches its
CRC-32, else it reads the store (``read_refs``); a copy is never the only place of a
checkpoint's bytes. A process keeps the copies of the ``keep`` most recent checkpoints it
wrote (older ones are deleted as new ones arrive); a task actor's copies outlive its
task when the actor is recycled for a restart (``TaskActor.recycle``), so the restarted
task reads what its predecessor wrote; the copies of a process that is gone are readable
on the node until the next task of any job there starts keeping copies, which removes
them (``engine.state.backends.remove_abandoned``).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import os
import uuid
from collections import deque
from collections.abc import Iterable, Sequence

from engine.checkpoints.store import link_or_copy, read_groups
from engine.errors import RestoreError
from engine.state.backends import (
    LOCK_FILE,
    StateConfig,
    path_component,
    remove_abandoned,
    state_root,
)

#: the folder under a node's state root that holds local recovery copies
LOCAL_FOLDER = "local-recovery"

GroupRef = tuple[int, str, int, int, int]  # (key group, URI, offset, length, crc32)


def local_root(config: StateConfig, job_id: str) -> str:
    """The folder of job ``job_id``'s local copies on this node."""
    return os.path.join(state_root(config), LOCAL_FOLDER, path_component(job_id or "job"))


def copy_name(uri: str) -> str:
    """The file name of the copy of the stored part at ``uri``."""
    return hashlib.sha1(uri.encode()).hexdigest() + ".state"


def _local_path(uri: str) -> str | None:
    """The path of ``uri`` when it is on the local filesystem, else None."""
    if "://" not in uri:
        return os.path.abspath(uri)
    if uri.startswith("file://"):
        return uri[len("file://"):]
    return None


class LocalCopies:
    """One process's local copies of the checkpoint parts its tasks wrote (see the module
    doc). Not thread-safe: one task actor calls it from its write thread, one at a time."""

    def __init__(self, root: str, keep: int) -> None:
        """``root``: the job's local folder on this node (``local_root``); ``keep``: how
        many checkpoints' copies to keep (>= 1)."""
        if keep < 1:
            raise ValueError(f"LocalCopies keeps at least 1 checkpoint; got {keep}")
        self.root = root
        self.keep = keep
        self.directory = ""
        self._lock: int | None = None
        self._written: deque[tuple[int, str]] = deque()  # (checkpoint id, path), oldest first

    def _open(self) -> str:
        if not self.directory:
            parent = os.path.join(self.root, "copies")
            # copies of processes that are gone go now, before this one's first copy
            remove_abandoned(os.path.dirname(self.root))
            directory = os.path.join(parent, f"{os.getpid()}-{uuid.uuid4().hex[:12]}")
            os.makedirs(directory, exist_ok=True)
            fd = os.open(os.path.join(directory, LOCK_FILE), os.O_CREAT | os.O_RDWR, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._lock, self.directory = fd, directory
        return self.directory

    def keep_copy(self, checkpoint_id: int, uri: str,
                  groups: Sequence[tuple[int, bytes]]) -> str:
        """Keep a copy of the part just written to the store at ``uri`` (its key groups
        ``groups``, in file order); returns its path. Raises ``OSError`` when the local
        disk refuses (the caller logs it: the checkpoint stands without a copy)."""
        directory = self._open()
        final = os.path.join(directory, copy_name(uri))
        tmp = f"{final}.{uuid.uuid4().hex[:8]}.tmp"
        stored = _local_path(uri)
        linked = False
        if stored is not None:
            with contextlib.suppress(OSError):
                os.link(stored, tmp)
                linked = True
        if not linked:
            with open(tmp, "wb") as out:
                for _, data in groups:
                    out.write(data)
        os.replace(tmp, final)
        self._written.append((checkpoint_id, final))
        self._prune()
        return final

    def keep_file(self, checkpoint_id: int, uri: str, path: str) -> str:
        """Keep ``path``, a local file whose bytes the store holds at ``uri`` (a file of an
        SST-level checkpoint, ``engine.state.sst_checkpoints``), as the copy of ``uri``:
        hard-linked (RocksDB never changes a file it wrote), copied across devices. A
        file several checkpoints share is kept as long as the newest of them. Returns the
        copy's path; ``OSError`` as ``keep_copy``."""
        directory = self._open()
        final = os.path.join(directory, copy_name(uri))
        tmp = f"{final}.{uuid.uuid4().hex[:8]}.tmp"
        link_or_copy(path, tmp)
        os.replace(tmp, final)
        for entry in [e for e in self._written if e[1] == final]:
            self._written.remove(entry)
        self._written.append((checkpoint_id, final))
        self._prune()
        return final

    def _prune(self) -> None:
        ids = sorted({c for c, _ in self._written})
        if len(ids) <= self.keep:
            return
        oldest_kept = ids[-self.keep]
        while self._written and self._written[0][0] < oldest_kept:
            _, path = self._written.popleft()
            with contextlib.suppress(OSError):
                os.remove(path)

    def close(self) -> None:
        """Delete this process's copies (the job ended here)."""
        for _, path in self._written:
            with contextlib.suppress(OSError):
                os.remove(path)
        self._written.clear()
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
        if self.directory:
            with contextlib.suppress(OSError):
                for leftover in os.listdir(self.directory):
                    os.remove(os.path.join(self.directory, leftover))
                os.rmdir(self.directory)
            self.directory = ""


def find_copy(root: str, uri: str) -> str | None:
    """The path of a local copy of the stored part at ``uri`` in any process's folder of
    the job on this node, or None."""
    found = glob.glob(os.path.join(glob.escape(root), "copies", "*", copy_name(uri)))
    return found[0] if found else None


def read_refs(refs: Iterable[GroupRef], root: str | None
              ) -> tuple[list[tuple[int, bytes]], int]:
    """Key groups ``refs`` read and checked (``engine.checkpoints.store.read_groups``),
    each from a local copy under ``root`` when one matches its CRC-32, else from the
    store; and how many bytes came from local copies. ``RestoreError`` as
    ``read_groups`` when the store's file is missing or corrupt too."""
    refs = list(refs)
    if root is None or not refs:
        return read_groups(refs), 0
    out: list[tuple[int, bytes] | None] = [None] * len(refs)
    local_bytes = 0
    by_uri: dict[str, list[int]] = {}
    for i, ref in enumerate(refs):
        by_uri.setdefault(ref[1], []).append(i)
    remote: list[int] = []
    for uri, wanted in by_uri.items():
        path = find_copy(root, uri)
        if path is None:
            remote += wanted
            continue
        try:
            read = read_groups([(kg, path, off, n, crc) for kg, _, off, n, crc in
                                (refs[i] for i in wanted)])
        except RestoreError:  # a copy that does not match: the store has the truth
            remote += wanted
            continue
        for i, (kg, data) in zip(wanted, read, strict=True):
            out[i] = (kg, data)
            local_bytes += len(data)
    if remote:
        for i, got in zip(remote, read_groups([refs[i] for i in remote]), strict=True):
            out[i] = got
    return [g for g in out if g is not None], local_bytes


__all__ = ["LOCAL_FOLDER", "LocalCopies", "copy_name", "find_copy", "local_root", "read_refs"]
