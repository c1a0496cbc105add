"""The JobMaster's registry of checkpoint files shared between checkpoints (sans-IO).

Why: with incremental checkpoints (``JobConfig.incremental_checkpoints``) a checkpoint's
metadata refers to part files that earlier checkpoints wrote (a key group's base and older
deltas: ``engine.state.incremental``). Deleting a retired checkpoint's directory whole
would then delete files a retained checkpoint still needs. This is Flink's
``SharedStateRegistry``: every file a complete checkpoint refers to is counted once per
checkpoint; retiring a checkpoint uncounts its files and returns those no retained
checkpoint refers to any more, which the coordinator then deletes
(``engine.checkpoints.coordinator``: ``Discard`` for a directory none of whose files is
still needed, ``DiscardFiles`` otherwise; ``engine.checkpoints.store.discard_files``).

Guarantees: a file is returned by ``release`` exactly when the last registered checkpoint
that refers to it is released, never while one still does; files are URIs
(``store.link_uri``), so a link ``../chk-3/x.state`` of chk-5 and chk-3's own ``x.state``
are one file. Savepoints are never registered (they refer to their own files only, and
reflow never deletes them).
"""

from __future__ import annotations

from engine.checkpoints.metadata import CheckpointMetadata
from engine.checkpoints.store import link_uri


def files_of(meta: CheckpointMetadata) -> set[str]:
    """Every file (URI) a restore of ``meta`` reads."""
    return {link_uri(meta.location, f) for f in meta.files()}


def own_files(meta: CheckpointMetadata) -> set[str]:
    """The files (URIs) ``meta``'s checkpoint wrote into its own directory."""
    return {link_uri(meta.location, f) for f in meta.files() if not f.startswith("../")}


class SharedFiles:
    """Reference counts of the files the registered (retained) checkpoints refer to."""

    def __init__(self) -> None:
        self._refs: dict[str, int] = {}
        self._registered: dict[str, CheckpointMetadata] = {}  # by location

    def register(self, meta: CheckpointMetadata) -> None:
        """``meta`` completed and is retained: count each of its files once."""
        if meta.location in self._registered:
            return
        self._registered[meta.location] = meta
        for f in files_of(meta):
            self._refs[f] = self._refs.get(f, 0) + 1

    def release(self, meta: CheckpointMetadata) -> list[str]:
        """``meta`` is retired: its files no registered checkpoint refers to any more
        (sorted), which may now be deleted. A checkpoint not registered: []."""
        if self._registered.pop(meta.location, None) is None:
            return []
        freed = []
        for f in files_of(meta):
            n = self._refs[f] - 1
            if n:
                self._refs[f] = n
            else:
                del self._refs[f]
                freed.append(f)
        return sorted(freed)

    def sync(self, retained: list[CheckpointMetadata]) -> list[CheckpointMetadata]:
        """Make the registered checkpoints ``retained``: register those that are not (a
        JobMaster that took the job over set its retained list from the store), and return
        the registered ones ``retained`` no longer holds (recovery dropped checkpoints
        that did not read back), for the caller to ``release`` and delete."""
        for m in retained:
            self.register(m)
        keep = {m.location for m in retained}
        return [m for loc, m in self._registered.items() if loc not in keep]

    def count(self, uri: str) -> int:
        """How many registered checkpoints refer to ``uri``."""
        return self._refs.get(uri, 0)

    def files(self) -> set[str]:
        """Every file a registered checkpoint refers to."""
        return set(self._refs)


__all__ = ["SharedFiles", "files_of", "own_files"]
