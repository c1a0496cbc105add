"""The Spacker replication sweep's scenario (issue 32 item 7): replicas saved nothing
because the sweep touched every key about twice a second, so every replica's delta held
every key. The sweep now gives every key its state first (``FilledGenerator``) and then
touches few keys per second. Pure parts, no Ray; never a measured value."""

from __future__ import annotations

import pytest

from engine import GeneratorSource
from engine.time.clock import ManualClock
from examples.papers import spacker as sp


def _drain(reader, n: int = 1000) -> list:
    out = []
    while (b := reader.poll(n)) is not None and len(b):
        out += b.values
    return out


def test_the_fill_gives_every_key_its_state_once_then_the_stream_follows():
    clock = ManualClock()
    src = sp.FilledGenerator(GeneratorSource(rate=10.0, num_keys=10, state_bytes_per_key=64,
                                             seed=1))
    assert src.partitions(2) == ["0-of-2", "1-of-2"]
    r = src.open_partition("1-of-2", None, clock)
    assert r.backlog() is None and r.offset() == ["fill", 0]
    first = r.poll(3)
    assert first.values == [(1, -1, 64), (3, -1, 64), (5, -1, 64)]
    assert r.offset() == ["fill", 3]
    assert r.poll(10).values == [(7, -1, 64), (9, -1, 64)]  # filled: the stream opens now
    assert r.offset()[0] == "gen"
    clock.advance(1.0)  # 5 records/s per partition: ~5 due
    stream = _drain(r)
    assert 4 <= len(stream) <= 6 and all(v[1] >= 0 and v[2] == 64 for v in stream)
    # resumed in either phase, it goes on where it was
    again = src.open_partition("1-of-2", ["fill", 3], clock)
    assert again.poll(10).values == [(7, -1, 64), (9, -1, 64)]
    later = src.open_partition("1-of-2", r.offset(), clock)
    assert later.offset() == r.offset()


def test_the_replication_sweep_runs_few_keys_per_second_over_filled_state():
    args = sp.parse_args([])
    ph = sp.sweep_phase("replication", args)
    assert (ph.keys, ph.state_bytes, ph.rate) == (16_000, 2_000, 1_000.0)
    assert ph.rebalance and ph.from_p == ph.to_p
    # ~6 % of the keys touched per second (the paper's micro-benchmark: 2 %); the phase it
    # ran before touched 85 % (3,000 rec/s over 1,600 keys)
    assert sp.access_ratio(ph.rate, ph.keys) == pytest.approx(0.0606, abs=1e-3)
    assert sp.access_ratio(3_000.0, 1_600) == pytest.approx(0.847, abs=1e-3)
    quick = sp.sweep_phase("replication", sp.parse_args(["--quick", "--replication-rate",
                                                          "250"]))
    assert (quick.keys, quick.rate) == (8_000, 250.0)
    assert sp.sweep_phase("progressiveness", args).keys == 1_600  # the others unchanged
    assert args.wrap_source is None
    assert isinstance(sp.filled_source(GeneratorSource(rate=1.0), ph), sp.FilledGenerator)
