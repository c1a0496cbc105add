"""The steady bench's reference loops do the work they claim: the floor (the rows job's own
work, no engine) counts every record once and ends with the ceiling's keys."""

from __future__ import annotations

from examples.bench import steady


def test_floor_counts_the_same_records_and_keys_as_the_ceiling() -> None:
    floor = steady.measure_floor(20_000, 1000, 128, repeats=1)
    ceiling = steady.measure_ceiling(20_000, repeats=1)
    assert floor["records"] == ceiling["records"] == 20_000
    assert floor["distinct_keys"] == ceiling["distinct_keys"] > 1000
    assert floor["throughput"] > 0
