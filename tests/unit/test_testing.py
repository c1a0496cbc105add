"""The source gate of ``engine.io.testing``: a test acts after record k of a source without
sleeping. Readers are driven by hand on a ``ManualClock``; the cross-process case runs the
reader in a plain child Python process (no Ray)."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.io.testing import GateError, GateTimeout, SourceGate, TestingSource
from engine.time.clock import ManualClock

ROOT = Path(__file__).resolve().parents[2]


def drain(reader, max_records: int = 7, limit: int = 10_000) -> tuple[list, str]:
    """Poll until the reader ends ("end") or holds (an empty batch: "held")."""
    out: list = []
    for _ in range(limit):
        batch = reader.poll(max_records)
        if batch is None:
            return out, "end"
        if not batch.values:
            return out, "held"
        out += batch.values
    raise AssertionError("the reader neither ended nor held")


def test_the_source_holds_after_k_records_until_the_gate_opens():
    gate = SourceGate(after=30)
    reader = TestingSource(range(100), gate=gate).open_partition("0-of-1", None, ManualClock())
    assert not gate.reached()
    got, how = drain(reader)
    assert (got, how) == (list(range(30)), "held")
    assert reader.offset() == 30
    assert gate.reached()
    gate.wait_reached(timeout=0)  # already reached: returns without waiting
    # held: empty batches and a hint to come back later, never a busy loop
    for _ in range(3):
        assert reader.poll(10).values == []
        assert reader.seconds_until_ready() > 0
    gate.open()
    rest, how = drain(reader)
    assert (rest, how) == (list(range(30, 100)), "end")


def test_tasks_of_a_parallel_source_emit_exactly_the_first_k_records_together():
    gate = SourceGate(after=10)
    src = TestingSource(range(40), gate=gate)
    readers = [src.open_partition(f"{i}-of-3", None, ManualClock()) for i in range(3)]
    emitted = []
    for i, r in enumerate(readers):
        got, how = drain(r)
        assert how == "held"
        emitted += got
        assert gate.reached() == (i == 2), "reached only once every task holds"
    assert sorted(emitted) == list(range(10))
    gate.open()
    for r in readers:
        got, how = drain(r)
        assert how == "end"
        emitted += got
    assert sorted(emitted) == list(range(40))


def test_a_reader_reopened_from_its_offset_holds_at_the_same_record():
    gate = SourceGate(after=12)
    src = TestingSource(range(50), gate=gate)
    first = src.open_partition("0-of-2", None, ManualClock())
    got = first.poll(4).values
    assert got == [0, 2, 4, 6]
    # stop-restart: a new reader at the snapshot offset resumes right after it
    second = src.open_partition("0-of-2", first.offset(), ManualClock())
    rest, how = drain(second)
    assert (rest, how) == ([8, 10], "held")
    assert second.offset() == 6
    gate.open()
    third = src.open_partition("0-of-2", second.offset(), ManualClock())
    tail, how = drain(third)
    assert (tail, how) == (list(range(12, 50, 2)), "end")


def test_a_gate_at_the_end_keeps_the_source_from_ending_until_open():
    gate = SourceGate(after=5)
    reader = TestingSource(range(5), gate=gate).open_partition("0-of-1", None, ManualClock())
    assert drain(reader) == ([0, 1, 2, 3, 4], "held")
    assert reader.poll(10) is not None, "the source must not end while held"
    gate.open()
    assert reader.poll(10) is None


def test_several_gates_hold_in_order_and_gates_at_one_record_all_report_reached():
    a, b, c = SourceGate(after=10), SourceGate(after=25), SourceGate(after=25)
    reader = TestingSource(range(40), gate=[c, a, b]).open_partition("0-of-1", None, ManualClock())
    assert drain(reader) == (list(range(10)), "held")
    assert a.reached() and not b.reached() and not c.reached()
    b.open()  # opening a later gate first does not release the earlier one
    assert drain(reader) == ([], "held")
    a.open()
    assert drain(reader) == (list(range(10, 25)), "held")
    assert c.reached()
    c.open()
    assert drain(reader) == (list(range(25, 40)), "end")


def test_a_gate_at_zero_holds_before_the_first_record():
    gate = SourceGate(after=0)
    reader = TestingSource(["x", "y"], gate=gate).open_partition("0-of-1", None, ManualClock())
    assert drain(reader) == ([], "held") and gate.reached()
    gate.open()
    assert drain(reader) == (["x", "y"], "end")


def test_the_rate_still_throttles_a_gated_source():
    clock = ManualClock()
    gate = SourceGate(after=60)
    reader = TestingSource(range(100), rate=100.0, gate=gate).open_partition("0-of-1", None, clock)
    got, polls = [], 0
    while len(got) < 60:
        batch = reader.poll(1000).values
        assert len(batch) <= 5  # bursts of at most 50 ms of the rate
        got += batch
        polls += 1
        clock.advance(0.1)
    assert got == list(range(60)) and polls >= 12
    assert reader.poll(1000).values == [] and gate.reached()


def test_waiting_for_an_unreached_gate_times_out_with_a_clear_error():
    gate = SourceGate(after=3)
    with pytest.raises(GateTimeout, match=r"did not reach the gate after record 3.*status"):
        gate.wait_reached(timeout=0)
    assert isinstance(GateTimeout("x"), TimeoutError)


def test_invalid_gates_are_refused_saying_what_to_change():
    for bad in (-1, True, 2.5, "3"):
        with pytest.raises(GateError, match="int >= 0"):
            SourceGate(after=bad)
    with pytest.raises(GateError, match="past the end of the source's 4 records"):
        TestingSource(range(4), gate=SourceGate(after=5))
    with pytest.raises(GateError, match="SourceGate or a sequence"):
        TestingSource(range(4), gate=[3])


def test_the_gate_signals_across_processes(tmp_path):
    """The source task is another process: it sees the test's ``open`` and the test sees
    its ``reached``, through the gate's directory only."""
    gate = SourceGate(after=4, directory=str(tmp_path / "gate"))
    blob = tmp_path / "source.pkl"
    blob.write_bytes(pickle.dumps(TestingSource(range(10), gate=gate)))
    child = textwrap.dedent(f"""
        import pickle, sys
        from engine.time.clock import ManualClock
        src = pickle.loads(open({str(blob)!r}, "rb").read())
        reader = src.open_partition("0-of-1", int(sys.argv[1]), ManualClock())
        out = []
        while True:
            batch = reader.poll(3)
            if batch is None or not batch.values:
                break
            out += batch.values
        print(out, "end" if batch is None else "held", reader.offset())
    """)

    def run_child(offset: int) -> str:
        proc = subprocess.run([sys.executable, "-c", child, str(offset)], cwd=ROOT,
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    assert run_child(0) == "[0, 1, 2, 3] held 4"
    assert gate.reached()
    gate.open()
    assert run_child(4) == "[4, 5, 6, 7, 8, 9] end 10"
