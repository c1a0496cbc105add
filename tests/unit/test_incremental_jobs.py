"""The checkpoint oracle with incremental checkpoints, in process, on both state backends.

Why: ``test_oracle_jobs.run_checkpoint_case`` takes checkpoints during a rescale, loses
every task after one of them, restores the last and finishes; the exactly-once sinks must
then hold the reference's output. With ``incremental_checkpoints=True`` the checkpoints
after the first hold deltas, so the restore reads chains (base + deltas) written by
several checkpoints; on RocksDB they are the DB's SST files (``engine.state.sst_checkpoints``),
so the restore reads a DB checkpoint some of whose files an earlier checkpoint wrote. An
example whose restore merged no chain of two or more links, or read no such DB checkpoint,
proves nothing about incremental checkpoints and fails.

Replaying a failure: the printed ``Case`` and ``crash_after`` (hypothesis prints the
example and its seed).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from typing import Any
from unittest import mock

from hypothesis import Phase, given, note, seed, settings
from hypothesis import strategies as st

import engine.operators.chain as chain_module
from engine.checkpoints import snapshot
from engine.checkpoints.store import read_file
from engine.state import backends
from engine.state.keyed import KeyedStateBackend
from engine.state.sst_checkpoints import DbIndex
from tests.unit import test_oracle_jobs as oj

KEYED = ("A", "B")
SETTINGS = {**oj.SETTINGS, "phases": (Phase.explicit, Phase.reuse, Phase.generate)}


@contextlib.contextmanager
def incremental(backend: str) -> Iterator[list[int]]:
    """While open, the oracle's jobs take incremental checkpoints on ``backend``; yields
    the lengths of the chains merged at restores (memory), or, per DB checkpoint a
    restore read (RocksDB: SST-level, ``engine.state.sst_checkpoints``), how many of its
    files an earlier checkpoint wrote (its chain, in a sense: 1 + that number)."""
    merged: list[int] = []
    opened: list[KeyedStateBackend] = []
    make, merge, config = backends.make_keyed_backend, snapshot.merge_chain, oj.JobConfig
    read_db = snapshot.read_db_groups

    def read_db_counted(refs: Any, local_root: str | None = None,
                        scratch: str | None = None) -> list[tuple[int, bytes]]:
        refs = list(refs)
        for uri in {r[1] for r in refs}:
            index = DbIndex.decode(read_file(uri))
            merged.append(1 + sum(f.startswith("../") for f, _ in index.files))
        return read_db(refs, local_root, scratch)

    def made(*args: Any, **kw: Any) -> KeyedStateBackend:
        b = make(*args, **kw)
        opened.append(b)
        return b

    def counted(blobs: Any) -> bytes:
        merged.append(len(blobs))
        return merge(blobs)

    with tempfile.TemporaryDirectory(prefix="reflow-incremental-jobs-") as root:
        extra: dict[str, Any] = {"incremental_checkpoints": True}
        if backend == "rocksdb":
            extra.update(state_backend="rocksdb", state_dir=root, state_memory_bytes=8 << 20)

        def cfg(**kw: Any) -> Any:
            return config(**extra, **kw)

        with mock.patch.object(oj, "JobConfig", cfg), \
                mock.patch.object(chain_module, "make_keyed_backend", made), \
                mock.patch.object(snapshot, "merge_chain", counted), \
                mock.patch.object(snapshot, "read_db_groups", read_db_counted):
            try:
                yield merged
            finally:
                for b in opened:
                    b.close()


def _checkpoint(protocol: str, backend: str, examples: int, hypothesis_seed: int) -> Any:
    @seed(hypothesis_seed)
    @settings(max_examples=examples, **SETTINGS)
    @given(case=oj.cases(protocol=protocol, targets=KEYED, late=False),
           crash_after=st.integers(2, 3))
    def test(case: oj.Case, crash_after: int) -> None:
        note(f"crash_after={crash_after} {case}")
        with incremental(backend) as merged, \
                tempfile.TemporaryDirectory(prefix="reflow-incremental-chk-") as root:
            oj.run_checkpoint_case(case, root, crash_after)
        print(f"incremental-jobs {backend}: chains merged at restore (RocksDB: 1 + files "
              f"of earlier checkpoints per DB checkpoint read): {sorted(merged)}")
        assert any(n >= 2 for n in merged), (
            f"no restore read a chain of deltas or a DB checkpoint sharing files with an "
            f"earlier one ({merged}): the example proves nothing")

    return test


for _i, _p in enumerate(oj.PROTOCOLS):
    _name = _p.replace("-", "_")
    for _j, _b in enumerate(("memory", "rocksdb")):
        globals()[f"test_{_name}_incremental_checkpoint_kill_restore_on_{_b}_is_exact"] = (
            _checkpoint(_p, _b, 1, 20261328 + 10 * _i + _j))
