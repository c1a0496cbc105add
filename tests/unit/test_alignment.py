"""``engine.task.alignment.BarrierAligner`` stepped by hand, and under random interleavings of
channels delivering barriers and ending (hypothesis, seeds printed on failure)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.task.alignment import Aligned, BarrierAligner
from engine.time.clock import ManualClock


def aligner(*channels: int, clock: ManualClock | None = None) -> BarrierAligner:
    return BarrierAligner((clock or ManualClock()).monotonic, channels)


def test_a_channel_that_delivered_the_barrier_is_blocked_until_every_live_one_did():
    clock = ManualClock()
    a = aligner(1, 2, 3, clock=clock)
    assert a.on_barrier(1, 5) is None
    assert a.is_blocked(1) and not a.is_blocked(2) and a.pending == 5
    clock.advance(0.25)
    assert a.on_barrier(3, 5) is None
    assert a.blocked == {1, 3}
    clock.advance(0.5)
    done = a.on_barrier(2, 5)
    assert done == Aligned(5, 0.75)
    assert a.blocked == frozenset() and a.pending is None


def test_a_single_input_aligns_on_its_barrier_at_once():
    assert aligner(7).on_barrier(7, 1) == Aligned(1, 0.0)


def test_ended_channels_count_as_aligned():
    a = aligner(1, 2)
    assert a.on_barrier(1, 3) is None
    assert a.on_end(2) == Aligned(3, 0.0)        # the last one missing ended
    assert a.channels == {1}
    # an input that ended before the barrier is not waited for
    assert a.on_barrier(1, 4) == Aligned(4, 0.0)


def test_a_trigger_aligns_at_once_without_live_inputs_and_waits_for_live_ones_otherwise():
    assert aligner().trigger(2) == Aligned(2, 0.0)
    a = aligner(1, 2)
    assert a.trigger(2) is None and a.blocked == frozenset()   # a trigger blocks nothing
    assert a.on_barrier(1, 2) is None
    assert a.on_end(2) == Aligned(2, 0.0)


def test_a_newer_barrier_aborts_the_pending_alignment_and_stale_ones_are_ignored():
    a = aligner(1, 2)
    assert a.on_barrier(1, 1) is None
    assert a.on_barrier(2, 2) is None             # 2 subsumes 1: channel 1 is read again
    assert a.pending == 2 and a.blocked == {2} and a.aborted == [1]
    assert a.on_barrier(2, 1) is None             # channel 2's late barrier 1: stale
    assert a.blocked == {2}
    done = a.on_barrier(1, 2)
    assert done is not None and done.barrier_id == 2 and done.aborted == (1,)
    assert a.on_barrier(1, 2) is None and a.blocked == frozenset()  # done ids are stale too
    assert a.aborted == []


def test_abort_unblocks_and_reports_the_id():
    a = aligner(1, 2)
    a.on_barrier(1, 9)
    assert a.abort() == 9 and a.blocked == frozenset() and a.pending is None
    assert a.abort() is None
    assert a.on_barrier(2, 9) is None and a.blocked == frozenset()   # 9 is over


def test_a_channel_added_during_an_alignment_is_waited_for():
    a = aligner(1)
    assert a.trigger(4) is None                   # 1 is live: the trigger does not align
    a.add_channel(2)
    assert a.on_barrier(1, 4) is None
    assert a.on_barrier(2, 4) == Aligned(4, 0.0)


def test_set_channels_follows_a_reconnected_task():
    a = aligner(1, 2, 3)
    a.on_barrier(1, 1)
    assert a.set_channels([1, 4]) is None and a.blocked == {1}
    assert a.set_channels([1]) == Aligned(1, 0.0)
    a.on_barrier(1, 2)
    assert a.remove_channel(1) is None  # 2 aligned already with its only input
    assert a.channels == frozenset()


def test_a_barrier_on_a_channel_that_is_not_live_does_not_block_it():
    a = aligner(1, 2)
    assert a.on_barrier(9, 1) is None
    assert not a.is_blocked(9) and a.pending == 1


# ------------------------------------------------------------------ random interleavings


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), channels=st.integers(1, 5), barriers=st.integers(1, 4))
def test_random_interleavings_align_each_barrier_once_after_every_live_input(
        seed, channels, barriers):
    """Each channel carries barriers 1..n in order and may end after any of them; events of
    different channels interleave at random, and a blocked channel is never read. Every
    barrier aligns exactly once, only when each channel delivered it or had ended, and no
    channel is read past a barrier before it aligned."""
    rng = random.Random(seed)
    print(f"alignment interleaving seed={seed} channels={channels} barriers={barriers}")
    streams: dict[int, list[tuple[str, int]]] = {}
    for c in range(channels):
        n = rng.randint(0, barriers)
        events = [("barrier", b) for b in range(1, n + 1)]
        if n < barriers or rng.random() < 0.5:
            events.append(("end", 0))
        streams[c] = events
    a = aligner(*streams)
    delivered: dict[int, set[int]] = {c: set() for c in streams}
    ended: set[int] = set()
    done: list[int] = []
    while any(streams.values()):
        readable = [c for c, evs in streams.items() if evs and not a.is_blocked(c)]
        assert readable, "a deadlock: every channel with events left is blocked"
        c = rng.choice(readable)
        kind, b = streams[c].pop(0)
        if kind == "barrier":
            # nothing of a later barrier is read before the earlier ones aligned
            assert all(x in done for x in range(1, b)), (c, b, done)
            delivered[c].add(b)
            result = a.on_barrier(c, b)
        else:
            ended.add(c)
            result = a.on_end(c)
        if result is not None:
            bid = result.barrier_id
            assert bid not in done
            assert all(bid in delivered[x] or x in ended for x in streams), (bid, delivered)
            done.append(bid)
    expected = sorted({b for evs in delivered.values() for b in evs})
    assert done == expected
