"""The task actor writes every checkpoint part off its event loop, with its local copies
(``engine.runtime.task_actor.TaskActor._persist_snapshots``).

Why: an SST-level checkpoint (RocksDB, incremental: ``engine.state.sst_checkpoints``) has
no key-group blobs (``groups`` empty), its state is its DB's files (``db``). The actor took
"no groups" for "nothing to write" and persisted it inline: the upload of hundreds of MB
blocked the actor's loop (its data, control calls and pings), and without the local copies,
so local recovery kept nothing. Driven without Ray: the actor's method on a stand-in whose
``persist`` records where and with what it ran.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from types import SimpleNamespace
from typing import Any

import pytest

import engine.runtime.task_actor as ta
from engine.checkpoints.snapshot import TaskSnapshot
from engine.state.sst_checkpoints import DbPlan

PLAN = DbPlan("/nowhere", "x.db", 8, (("x.db/000010.sst", 10, True),), ((0, ("v",)),))


def _run(snaps: list[TaskSnapshot], monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    calls: list[tuple[Any, ...]] = []

    def recording_persist(snap: TaskSnapshot, clock: Any, local: Any = None) -> str:
        calls.append((snap.checkpoint_id, local, threading.get_ident()))
        return f"ack {snap.checkpoint_id}"

    monkeypatch.setattr(ta, "persist", recording_persist)
    reports: list[Any] = []
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    actor = SimpleNamespace(core=SimpleNamespace(snapshots=list(snaps), report=reports.append),
                            clock=None, _local="local copies", _generation=0,
                            _persist_pool=pool, _send_reports=lambda: None)
    actor._report_snapshot = lambda s: ta.TaskActor._report_snapshot(actor, s)  # type: ignore[arg-type]
    actor._written = lambda *a: ta.TaskActor._written(actor, *a)  # type: ignore[arg-type]

    async def main() -> int:
        ta.TaskActor._persist_snapshots(actor)  # type: ignore[arg-type]
        loop_thread = threading.get_ident()
        while len(reports) < len(snaps):
            await asyncio.sleep(0)  # the executor's callbacks come through the loop
        return loop_thread

    try:
        loop_thread = asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        pool.shutdown()
    return [(cid, local, tid == loop_thread) for cid, local, tid in calls]


def test_an_sst_checkpoint_is_written_off_the_loop_with_the_local_copies(monkeypatch):
    got = _run([TaskSnapshot("t", "v", 0, 5, "/store/chk-5", db=PLAN)], monkeypatch)
    assert got == [(5, "local copies", False)]


def test_a_declined_sst_checkpoint_goes_to_the_writer_to_drop_its_folder(monkeypatch):
    got = _run([TaskSnapshot("t", "v", 0, 6, "/store/chk-6", declined="no", db=PLAN)],
               monkeypatch)
    assert got == [(6, "local copies", False)]


def test_a_part_with_nothing_to_write_is_reported_at_once_on_the_loop(monkeypatch):
    got = _run([TaskSnapshot("t", "v", 0, 7, "/store/chk-7")], monkeypatch)
    assert got == [(7, None, True)]
