"""The Spark bridge's spool: every chunk a Spark micro-batch put into a lane, on disk until
a complete reflow checkpoint covers it.

Why: Spark commits a micro-batch once its ``foreachBatch`` (or stream writer) returns, and
never sends it again. The bridge returns once reflow's readers took the batch, which may
be after the last complete reflow checkpoint. When the driver dies (with the bridge, the
Spark query and the job), a restore to that checkpoint needs those rows again: the new
bridge reads them from the spool. Spark's commit then implies "durable on reflow's side",
as Flink's Kafka source relies on Kafka's log.

Format: one directory per source (``SparkSource(spool_dir=...)``), one subdirectory per
lane ``lane-<i>-of-<n>``, one file per chunk ``<lane seq:012d>.chunk`` holding the msgpack
list ``[seq, stream, batch, partition, chunk, rows, skip, put_ms, arrow ipc]``. A file is
written under a temporary name, fsynced and renamed, so it is whole or absent.

Guarantees: a chunk is in the spool before a reader can be handed it; ``drop`` removes
the chunks a complete checkpoint covers (the lane's order); ``load`` returns a lane's
chunks in lane order. Only the bridge actor writes its spool (one bridge per source name).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from typing import Any

from engine.wire.codec import pack_exact, unpack_exact

SUFFIX = ".chunk"


class ChunkSpool:
    """The spool of one ``SparkSource`` in ``directory`` (see the module doc)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def _lane(self, lane: int, lanes: int) -> str:
        return os.path.join(self.directory, f"lane-{lane:05d}-of-{lanes:05d}")

    def _path(self, lane: int, lanes: int, seq: int) -> str:
        return os.path.join(self._lane(lane, lanes), f"{seq:012d}{SUFFIX}")

    def write(self, lane: int, lanes: int, entry: list[Any]) -> None:
        """Make chunk ``entry`` (``[seq, stream, batch, part, chunk, rows, skip, put_ms,
        ipc]``) of lane ``lane`` durable."""
        path = self._path(lane, lanes, int(entry[0]))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(pack_exact(entry))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def drop(self, lane: int, lanes: int, seq: int) -> None:
        """Chunk ``seq`` of the lane is covered by a complete checkpoint: delete it."""
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._path(lane, lanes, seq))

    def load(self, lane: int, lanes: int) -> list[list[Any]]:
        """The lane's spooled chunks in lane order (half-written files are skipped)."""
        d = self._lane(lane, lanes)
        if not os.path.isdir(d):
            return []
        out = []
        for name in sorted(n for n in os.listdir(d) if n.endswith(SUFFIX)):
            with open(os.path.join(d, name), "rb") as f:
                out.append(list(unpack_exact(f.read())))
        return out

    def clear(self) -> None:
        """Delete every spooled chunk (a fresh start of the source)."""
        if os.path.isdir(self.directory):
            for name in os.listdir(self.directory):
                if name.startswith("lane-"):
                    shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)

    def size(self) -> tuple[int, int]:
        """(chunks, bytes) spooled now."""
        chunks = size = 0
        if os.path.isdir(self.directory):
            for root, _, files in os.walk(self.directory):
                for n in files:
                    if n.endswith(SUFFIX):
                        chunks += 1
                        size += os.path.getsize(os.path.join(root, n))
        return chunks, size
