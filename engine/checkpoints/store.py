"""The checkpoint store: checkpoints and savepoints on any ``pyarrow.fs`` filesystem.

Why pyarrow.fs: a local directory needs nothing running, and the same code writes to
``s3://``, ``gs://`` or ``hdfs://`` on a cluster. Tasks write their own parts (a task's
state never goes through the JobMaster); the JobMaster writes the metadata.

Layout of a checkpoint directory (``<checkpoint_dir>/<job id>/chk-<n>``, or a savepoint's
directory)::

    <name>-<crc of the vertex name>-<task index>.state   one task's key groups, concatenated
    _metadata                                            written last (engine.checkpoints.metadata)

With incremental checkpoints a checkpoint's metadata also refers to part files of earlier
``chk-<n>`` directories of the job (``../chk-<n>/<file>``, ``link_uri``). Retention then
deletes such a directory's ``_metadata`` (it is no checkpoint any more) and only its files
no retained checkpoint refers to (``discard_files``); the directory goes once empty.

Guarantees: ``_metadata`` is written to a temporary name and moved into place, so it is
either absent or whole; a directory without it is not a checkpoint (``latest`` skips it,
``read_metadata`` refuses it); a key group read back is checked against its CRC-32. Errors
of the filesystem are raised as ``OSError`` from writes (the caller fails the checkpoint)
and as ``RestoreError`` from reads, naming the path.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import zlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from engine.checkpoints.metadata import METADATA_FILE, CheckpointMetadata
from engine.errors import RestoreError
from engine.state.sst_checkpoints import is_sst

if TYPE_CHECKING:
    from engine.state.sst_checkpoints import DbPlan

_CHECKPOINT_DIR = re.compile(r"^chk-(\d+)$")


def default_root() -> str:
    """Where checkpoints go when ``JobConfig.checkpoint_dir`` is None (one machine only)."""
    return os.path.join(tempfile.gettempdir(), "reflow-checkpoints")


def absolute_location(location: str) -> str:
    """A checkpoint or savepoint location as the driver means it: a URI as it is, a
    relative path made absolute here (the JobMaster and the tasks run in other working
    directories)."""
    return location if "://" in location else os.path.abspath(os.path.expanduser(location))


def join(location: str, *names: str) -> str:
    """``location`` (a path or URI) with ``names`` below it. A URI's query string (an
    S3-compatible store's ``?endpoint_override=...&scheme=http``) stays at the end, where
    ``pyarrow.fs.FileSystem.from_uri`` reads it."""
    base, query = location, ""
    if "://" in location and "?" in location:
        base, query = location.split("?", 1)
        query = "?" + query
    return "/".join([base.rstrip("/"), *names]) + query


def _fs(uri: str) -> tuple[Any, str]:
    """A ``pyarrow.fs.FileSystem`` (typed ``Any``: pyarrow ships no type hints) and the path
    in it for ``uri``."""
    import pyarrow.fs as pafs

    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    return pafs.FileSystem.from_uri(uri)


def part_file_name(vertex: str, index: int) -> str:
    """A task's part file: readable, and unique per vertex whatever its name holds."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", vertex)[:40] or "v"
    return f"{slug}-{zlib.crc32(vertex.encode()):08x}-{index}.state"


def write_task_part(location: str, file: str,
                    groups: Sequence[tuple[int, bytes]]) -> tuple[tuple[int, int, int, int], ...]:
    """Write one task's key groups into ``location``/``file``; returns each group's
    ``(key_group, offset, length, crc32)``. Raises ``OSError`` when the store refuses."""
    fs, path = _fs(join(location, file))
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    index = []
    offset = 0
    with fs.open_output_stream(path) as out:
        for kg, data in groups:
            out.write(data)
            index.append((kg, offset, len(data), zlib.crc32(data)))
            offset += len(data)
    return tuple(index)


def write_file(uri: str, data: bytes) -> None:
    """Write ``data`` as the file at ``uri``. Raises ``OSError`` when the store refuses."""
    fs, path = _fs(uri)
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path) as out:
        out.write(data)


def link_or_copy(src: str, dst: str, link: bool = True) -> None:
    """``dst`` (new) as a hard link to the local file ``src`` when ``link`` (a copy when
    the link fails, e.g. across devices), else as a copy. ``OSError`` as the copy's."""
    if link:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copyfile(src, dst)


def write_db_part(location: str, plan: DbPlan) -> int:
    """Upload the files of a task's DB checkpoint that ``plan`` marks (from its local
    folder into ``location``); returns the bytes uploaded. A store on this machine's
    filesystem gets hard links (the files are immutable), another a copy. Raises
    ``OSError`` when the store refuses or a file's size is not the one planned."""
    written = 0
    for link, size, upload in plan.files:
        if not upload:
            continue
        src = os.path.join(plan.local_dir, link.rsplit("/", 1)[-1])
        fs, path = _fs(join(location, link))
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        if "://" not in location:  # the files but SSTs are rewritten by rocksdict: copies
            link_or_copy(src, path, link=is_sst(link))
        else:
            with open(src, "rb") as f, fs.open_output_stream(path) as out:
                while chunk := f.read(8 << 20):
                    out.write(chunk)
        if fs.get_file_info(path).size != size:
            raise OSError(f"{path}: {size} bytes planned, the store holds another size")
        written += size
    return written


def write_metadata(meta: CheckpointMetadata) -> None:
    """Write ``_metadata`` into ``meta.location``, last and whole: the checkpoint becomes
    visible at once. Raises ``OSError`` when the store refuses."""
    fs, path = _fs(meta.location)
    fs.create_dir(path, recursive=True)
    final = f"{path}/{METADATA_FILE}"
    tmp = f"{path}/.{METADATA_FILE}.inprogress"
    with fs.open_output_stream(tmp) as out:
        out.write(meta.encode())
    fs.move(tmp, final)


def _read(uri: str) -> bytes:
    fs, path = _fs(uri)
    with fs.open_input_stream(path) as f:
        return f.read()


def read_file(uri: str) -> bytes:
    """The whole file at ``uri``; ``RestoreError`` naming it when it cannot be read."""
    try:
        return _read(uri)
    except OSError as exc:
        raise RestoreError(f"cannot read {uri}: {exc}; restore an earlier checkpoint",
                           path=uri, reason="unreadable") from exc


def fetch_file(uri: str, path: str, size: int) -> None:
    """The stored file at ``uri`` as the local file ``path``: for an SST file a hard link
    when the store is on this machine's filesystem (a copy across devices), else a copy
    (rocksdict rewrites its config file when it opens a DB, even read-only, and a link
    would rewrite the store's), downloaded from a remote store. ``RestoreError`` naming
    it when it is missing or not ``size`` bytes long."""
    try:
        if "://" not in uri:
            link_or_copy(os.path.abspath(uri), path, link=is_sst(uri))
        else:
            fs, spath = _fs(uri)
            with fs.open_input_stream(spath) as f, open(path, "wb") as out:
                while chunk := f.read(8 << 20):
                    out.write(chunk)
        got = os.path.getsize(path)
    except OSError as exc:
        raise RestoreError(f"cannot read {uri}: {exc}; restore an earlier checkpoint",
                           path=uri, reason="unreadable") from exc
    if got != size:
        raise RestoreError(f"{uri} is corrupt: {got} bytes where its checkpoint says {size} "
                           "(a truncated or altered file); restore an earlier checkpoint",
                           path=uri, reason="corrupt")


def _has_metadata(location: str) -> bool:
    """Whether ``location`` holds ``_metadata`` (``RestoreError`` when it cannot be read)."""
    import pyarrow.fs as pafs

    try:
        fs, path = _fs(location)
        info = fs.get_file_info(f"{path}/{METADATA_FILE}")
    except (OSError, ValueError) as exc:
        raise RestoreError(f"cannot read {location}: {exc}", path=location,
                           reason="unreadable") from exc
    return bool(info.type == pafs.FileType.File)


def read_metadata(location: str) -> CheckpointMetadata:
    """The checkpoint or savepoint at ``location``; ``RestoreError`` when there is none
    (no such directory, or no ``_metadata``: it never completed), or it is foreign or
    corrupt."""
    if not _has_metadata(location):
        raise RestoreError(
            f"{location} holds no complete checkpoint or savepoint (no {METADATA_FILE}: it "
            "never completed, or it is not a checkpoint directory); give a checkpoint "
            "directory (chk-<n>), a savepoint, or the job's checkpoint directory",
            path=location, reason="incomplete")
    try:
        data = _read(join(location, METADATA_FILE))
    except OSError as exc:
        raise RestoreError(f"cannot read {location}: {exc}", path=location,
                           reason="unreadable") from exc
    return CheckpointMetadata.decode(data, location.rstrip("/"))


def complete_checkpoints(job_dir: str) -> list[str]:
    """The complete checkpoints (``chk-<n>`` with ``_metadata``) in a job's checkpoint
    directory, oldest first; [] when there is none (or no such directory)."""
    import pyarrow.fs as pafs

    try:
        fs, path = _fs(job_dir)
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except (OSError, ValueError):
        return []
    found = []
    for info in infos:
        m = _CHECKPOINT_DIR.match(info.base_name)
        if m is None or info.type != pafs.FileType.Directory:
            continue
        meta = fs.get_file_info(f"{info.path}/{METADATA_FILE}")
        if meta.type == pafs.FileType.File:
            found.append((int(m.group(1)), join(job_dir, info.base_name)))
    return [loc for _, loc in sorted(found)]


def resolve(location: str) -> str:
    """The checkpoint to restore for ``location``: itself when it holds ``_metadata``,
    else the latest complete ``chk-<n>`` inside it (a job's checkpoint directory).
    ``RestoreError`` when there is neither."""
    if _has_metadata(location):
        return location.rstrip("/")
    found = complete_checkpoints(location)
    if not found:
        read_metadata(location)  # raises, saying why
    return found[-1]


def read_groups(refs: Iterable[tuple[int, str, int, int, int]]) -> list[tuple[int, bytes]]:
    """Key groups ``(key_group, file URI, offset, length, crc32)`` read back and checked,
    in the order given; ``RestoreError`` naming the file when one is missing, short or
    corrupt."""
    refs = list(refs)
    by_file: dict[str, list[int]] = {}
    for i, (_, uri, _, _, _) in enumerate(refs):
        by_file.setdefault(uri, []).append(i)
    out: list[bytes] = [b""] * len(refs)
    for uri, wanted in by_file.items():
        try:
            fs, path = _fs(uri)
            with fs.open_input_file(path) as f:
                for i in sorted(wanted, key=lambda w: refs[w][2]):
                    kg, _, offset, length, crc = refs[i]
                    data = f.read_at(length, offset)
                    if len(data) != length or zlib.crc32(data) != crc:
                        raise RestoreError(
                            f"{uri} is corrupt: key group {kg} does not match its checksum "
                            "(a truncated or altered file); restore an earlier checkpoint",
                            path=uri, reason="corrupt")
                    out[i] = data
        except OSError as exc:
            raise RestoreError(f"cannot read {uri}: {exc}; restore an earlier checkpoint",
                               path=uri, reason="unreadable") from exc
    return [(ref[0], data) for ref, data in zip(refs, out, strict=True)]


def link_uri(location: str, file: str) -> str:
    """The URI of ``file`` as a checkpoint at ``location`` names it: below ``location``,
    or ``../chk-<n>/<name>``: in a sibling checkpoint directory (incremental checkpoints)."""
    if file.startswith("../"):
        base, query = location, ""
        if "://" in location and "?" in location:
            base, query = location.split("?", 1)
            query = "?" + query
        return join(base.rstrip("/").rsplit("/", 1)[0] + query, *file[3:].split("/"))
    return join(location, file)


def parent_location(location: str) -> str:
    """The directory holding a checkpoint's ``location`` (the job's checkpoint directory
    for ``chk-<n>``), as a URI with its query string."""
    return link_uri(location, "../")


def directory_name(location: str) -> str:
    """The last component of a checkpoint's ``location`` (``chk-<n>``)."""
    base = location.split("?", 1)[0] if "://" in location else location
    return base.rstrip("/").rsplit("/", 1)[-1]


def discard(location: str) -> None:
    """Delete a checkpoint directory (retention, or a failed checkpoint's parts); a
    directory already gone is not an error."""
    fs, path = _fs(location)
    with contextlib.suppress(FileNotFoundError):
        fs.delete_dir(path)


def discard_files(locations: Iterable[str], files: Iterable[str]) -> None:
    """Retention of incremental checkpoints: the checkpoints at ``locations`` stop being
    checkpoints (their ``_metadata`` is deleted first), the ``files`` (URIs) no retained
    checkpoint refers to are deleted, and each of those directories, and each directory a
    file was deleted from, is removed once it holds nothing. Gone already: not an error."""
    import pyarrow.fs as pafs

    dirs: dict[str, tuple[Any, str]] = {}
    for loc in locations:
        fs, path = _fs(loc)
        with contextlib.suppress(FileNotFoundError):
            fs.delete_file(f"{path}/{METADATA_FILE}")
        dirs[path] = (fs, path)
    for uri in files:
        fs, path = _fs(uri)
        with contextlib.suppress(FileNotFoundError):
            fs.delete_file(path)
        parent = path.rsplit("/", 1)[0]
        dirs.setdefault(parent, (fs, parent))
    for fs, path in sorted(dirs.values(), key=lambda d: -len(d[1])):  # deepest first
        while True:
            try:
                left = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
            except (OSError, ValueError):
                break
            if left:
                break
            with contextlib.suppress(FileNotFoundError, OSError):
                fs.delete_dir(path)
            # a DB folder's last files went: its checkpoint directory may now be empty too
            # (retired long before, when it still held files a retained checkpoint named)
            parent = path.rsplit("/", 1)[0]
            if not _CHECKPOINT_DIR.match(parent.rsplit("/", 1)[-1]) or parent == path:
                break
            path = parent


__all__ = ["complete_checkpoints", "default_root", "directory_name", "discard",
           "discard_files", "fetch_file", "join", "link_or_copy", "link_uri", "parent_location", "part_file_name", "read_groups",
           "read_file", "read_metadata", "resolve", "write_db_part", "write_file", "write_metadata",
           "write_task_part"]
