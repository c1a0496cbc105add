"""NEXMark Q1, Q2, Q5, Q7, Q8 on reflow (examples/nexmark/queries.py) against reference.py,
and the NexmarkSource (examples/nexmark/source.py) it reads.

To keep the Ray part short on a small machine (deployment, one Ray worker process per task,
dominates), every query variant runs in one job at parallelism 1 and Q7/Q8 (tumbling and
sliding) once more in one job at parallelism 4 (sources at 2 or 1), on a seeded input of 5,000
events spanning 5 s of event time with 1 s windows (sliding: 250 ms).
"""

from __future__ import annotations

from collections import Counter

import pytest

from engine import JobConfig, StreamJob
from engine.dataflow.graph import SOURCE
from engine.io.testing import TestingSink
from engine.time.clock import ManualClock
from examples.nexmark import queries
from examples.nexmark.generator import NexmarkConfig, NexmarkGenerator
from examples.nexmark.source import NexmarkSource, kind_of_record

pytestmark = pytest.mark.ray

CFG = JobConfig(batch_size=200, linger_ms=2, metrics_port=None)
CONFIG = NexmarkConfig(seed=11, first_event_rate=1000)
EVENTS = 5000
SOURCE_ = NexmarkSource(CONFIG, event_time=True, num_events=EVENTS, split_events=256)
VARIANTS: dict[str, tuple[str, dict]] = {
    "q1": ("q1", {}),
    "q2": ("q2", {}),
    "q5": ("q5", {"size_ms": 1000, "slide_ms": 250}),
    "q7": ("q7", {"size_ms": 1000}),
    "q7s": ("q7", {"size_ms": 1000, "slide_ms": 250}),
    "q8": ("q8", {"size_ms": 1000}),
    "q8s": ("q8", {"size_ms": 1000, "slide_ms": 250}),
}
#: at parallelism 4: the variants and their source parallelism (fewer actors, quicker deploy)
PARALLEL = {"q7": 2, "q7s": 1, "q8": 2, "q8s": 1}


def run_variants(variants: dict[str, int], parallelism: int) -> dict[str, list]:
    """Runs the variants (name -> source parallelism) in one job; their sorted outputs."""
    job = StreamJob(f"nexmark-p{parallelism}", num_key_groups=32, parallelism=parallelism,
                    config=CFG)
    sinks = {}
    for name, source_parallelism in variants.items():
        query, params = VARIANTS[name]
        sinks[name] = TestingSink()
        queries.build(query, job, SOURCE_, sinks[name], prefix=name, parallelism=parallelism,
                      source_parallelism=source_parallelism, **params)
    job.run().wait(300)
    return {name: queries.sort_results(VARIANTS[name][0], s.results())
            for name, s in sinks.items()}


@pytest.fixture(scope="module")
def expected() -> dict[str, list]:
    return {name: queries.reference_results(q, SOURCE_, **params)
            for name, (q, params) in VARIANTS.items()}


@pytest.fixture(scope="module")
def at_p1(ray_cluster) -> dict[str, list]:
    return run_variants(dict.fromkeys(VARIANTS, 1), 1)


@pytest.fixture(scope="module")
def at_p4(ray_cluster) -> dict[str, list]:
    return run_variants(PARALLEL, 4)


# ------------------------------------------------------------------------- the queries


@pytest.mark.parametrize("name", list(VARIANTS))
def test_query_equals_reference(at_p1, expected, name):
    assert len(expected[name]) >= 5, "the input should give a non-trivial result"
    assert at_p1[name] == expected[name]  # Q1/Q2 in input order, the others sorted


@pytest.mark.parametrize("name", list(PARALLEL))
def test_parallelism_4_equals_parallelism_1(at_p1, at_p4, expected, name):
    assert at_p4[name] == at_p1[name] == expected[name]


def test_operators_are_named_and_keyed_stages_rescalable():
    for query, names in queries.OPERATORS.items():
        job = StreamJob("names", num_key_groups=8)
        queries.build(query, job, SOURCE_, TestingSink())
        ops = {op.name: op for op in job.graph().operators}
        assert set(names) <= set(ops), query
        for name in queries.RESCALABLE[query]:
            assert ops[name].keyed and ops[name].kind != SOURCE


def test_sliding_q7_outputs_one_row_per_window_and_top_bid(expected):
    rows = expected["q7s"]
    starts = {r[0] for r in rows}
    assert all(r[1] - r[0] == 1000 for r in rows) and len(starts) > 15


# ------------------------------------------------------------------------- the source


def _drain(src: NexmarkSource, task: int, p: int, max_records: int = 333) -> list:
    reader = src.open_partition(f"{task}-of-{p}", None, ManualClock())
    out = []
    while (batch := reader.poll(max_records)) is not None:
        assert batch.timestamps == sorted(batch.timestamps)
        out.extend(zip(batch.values, batch.timestamps, strict=True))
    return out


def _events(n: int) -> list[tuple]:
    return NexmarkGenerator(CONFIG).events(0, n).to_events(named=False)


@pytest.mark.parametrize("kinds", [("bids",), ("persons", "auctions"),
                                   ("persons", "auctions", "bids")])
@pytest.mark.parametrize("p,split", [(1, 4096), (3, 256), (4, 1000)])
def test_source_tasks_split_the_stream(kinds, p, split):
    src = NexmarkSource(CONFIG, event_time=True, num_events=EVENTS, kinds=kinds,
                        split_events=split)
    time_field = {"persons": 6, "auctions": 5, "bids": 5}
    want = [(e, e[time_field[kind_of_record(e)]]) for e in _events(EVENTS)
            if kind_of_record(e) in kinds]
    got = [r for t in range(p) for r in _drain(src, t, p)]
    if p == 1:
        assert got == want  # event order, timestamps = date_time
    assert Counter(got) == Counter(want)
    assert sum(src.partition_events(t, p) for t in range(p)) == EVENTS
    assert sum(src.count().values()) == len(want)


def test_source_resumes_at_its_offset():
    src = NexmarkSource(CONFIG, event_time=True, num_events=EVENTS, kinds="bids",
                        split_events=300)
    reader = src.open_partition("1-of-3", None, ManualClock())
    reader.poll(250)
    offset = reader.offset()
    rest = _drain_reader(reader)
    assert _drain_reader(src.open_partition("1-of-3", offset, ManualClock())) == rest
    assert (offset // 300) % 3 == 1  # an event number in one of task 1's blocks


def _drain_reader(reader) -> list:
    out = []
    while (batch := reader.poll(100)) is not None:
        out.extend(batch.values)
    return out


def test_source_open_loop_emits_on_schedule():
    clock = ManualClock(1000.0)
    src = NexmarkSource(CONFIG, event_time=False, num_events=EVENTS, kinds="bids", rate=1000)
    reader = src.open_partition("0-of-1", None, clock)
    first = reader.poll(1000)  # only event 0 (a person) is due
    assert len(first) == 0 and reader.offset() == [1, 1_000_000.0]
    assert reader.seconds_until_ready() == pytest.approx(0.001)
    clock.advance(0.0105)  # events 1..10 are due; 4..10 are bids
    batch = reader.poll(1000)
    assert [v[5] for v in batch.values] == list(range(4, 11))
    assert batch.timestamps == [1_000_000 + n for n in range(4, 11)]  # scheduled times
    clock.advance(100.0)  # a lagging source catches up, in bounded polls
    assert len(reader.poll(50)) == 50


def test_realtime_source_has_event_time_equal_to_the_schedule():
    src = NexmarkSource.realtime(CONFIG, rate=2000, start_time_ms=5_000_000, kinds="bids",
                                 num_events=100)
    assert src.config.first_event_rate == 2000 and src.config.base_time_ms == 5_000_000
    clock = ManualClock(5_000.02)  # 20 ms after event 0 was due: events 0..40
    batch = src.open_partition("0-of-1", None, clock).poll(1000)
    assert batch.timestamps == [v[5] for v in batch.values]
    assert batch.timestamps[-1] == 5_000_020


def test_source_refuses_bad_arguments():
    with pytest.raises(ValueError):
        NexmarkSource(CONFIG, event_time=True, kinds=("people",))
    with pytest.raises(ValueError):
        NexmarkSource(CONFIG, event_time=True, rate=0)
    with pytest.raises(ValueError):
        NexmarkSource(CONFIG, event_time=True, start_time_ms=1)  # no rate
    with pytest.raises(TypeError):
        NexmarkSource(CONFIG)  # event_time must be chosen
