"""NEXMark Q7 and Q8 with state sized by the events' ``extra`` padding (no Ray).

``build_q7(hold_bids=True)`` makes the first stage hold every bid of each window (with its
padding) and pick the top bids when the window fires; ``build_q8(hold_extra=...)`` keeps the
padding of persons/auctions in what the join's windows hold. Both must give the queries'
results unchanged while their state grows with the padding. The keyed stages run here
through ``engine.operators.builtin.KeyedRunner`` as a task drives them (records, then the
watermark and the event-time timers), on generated events with the generator's padding at
several sizes, on the in-memory and the RocksDB backends; their output is compared with
``reference.py`` and with the stages that hold no padding, and their state bytes with the
padding's size (``examples/papers/drrs.py`` sizes the padding from a state target with
``held_padding``: checked here against the state the stages reach).
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import pytest

from engine.dataflow import graph as g
from engine.dataflow.keygroups import key_group_of
from engine.io.testing import TestingSink
from engine.operators.builtin import ErrorPolicy, KeyedRunner
from engine.operators.windows import WindowJoin, WindowOperator
from engine.state.keyed import EVENT_TIME, KeyedStateBackend
from engine.state.rocksdb import RocksDBKeyedStateBackend
from engine.time.clock import ManualClock
from engine.time.event_time import MIN_WATERMARK, Window, sliding_event_time
from examples.nexmark import queries
from examples.nexmark import reference as ref
from examples.nexmark.generator import MAX_AVG_BYTE_SIZE, NexmarkConfig, NexmarkGenerator
from examples.papers import drrs

KG = 128


class Stage:
    """One keyed stage in process: a backend owning every key group, a runner, a watermark."""

    def __init__(self, fn: Any, key_fn: Any, backend: Any, tmp_path, name: str,
                 key_fn_1: Any = None) -> None:
        self.backend = backend
        for kg in range(KG):
            backend.own(kg)
        self.wm = [MIN_WATERMARK]
        self.key_fns = (key_fn, key_fn_1 or key_fn)
        clock = ManualClock(1.0)
        late = TestingSink(str(tmp_path / f"late-{name}")).open(0, 1, clock)
        op = g.OperatorDef(name, "process", fn, 1,
                           inputs=(g.InputDef("a", key_fn), g.InputDef("b", self.key_fns[1], 1)))
        self.runner = KeyedRunner(op, ErrorPolicy(name, 0, None), backend, 0, clock,
                                  lambda: self.wm[0], late)
        self.out: list[tuple[Any, int]] = []
        self.samples: list[int] = []

    def send(self, values: list[Any], ts: list[int], port: int = 0) -> None:
        keys = [self.key_fns[port](v) for v in values]
        out, out_ts = self.runner.process(values, ts, keys, [key_group_of(k, KG) for k in keys],
                                          port)
        self.out += zip(out, out_ts, strict=True)

    def advance(self, wm: int) -> None:
        if wm > self.wm[0]:
            self.wm[0] = wm
            out, out_ts = self.runner.fire_timers(wm, EVENT_TIME)
            self.out += zip(out, out_ts, strict=True)

    def sample(self) -> None:
        """The state's exact encoded bytes: what a migration of every group would move."""
        self.samples.append(sum(len(self.backend.snapshot(kg)) for kg in range(KG)))


def backend_of(kind: str, tmp_path, name: str) -> Any:
    if kind == "memory":
        return KeyedStateBackend(KG)
    return RocksDBKeyedStateBackend(KG, str(tmp_path / f"db-{name}"), task=name,
                                    block_cache_bytes=4 << 20, write_buffer_bytes=4 << 20,
                                    object_cache_bytes=1 << 20)


def events(cfg: NexmarkConfig, n: int) -> Any:
    return NexmarkGenerator(cfg).events(0, n).to_records(named=False)


def run_q7_first_stage(bids: list[tuple], size: int, slide: int, hold: bool, backend: Any,
                       tmp_path, batch: int = 200, sample_from: int | None = None) -> Stage:
    """Q7's first stage over ``bids`` (event time = date_time), the watermark after every
    ``batch`` bids at the last bid's time - 1, then at the end past every window; the state
    is sampled after every batch whose time is at least ``sample_from``."""
    if hold:
        fn = WindowOperator(sliding_event_time(size, slide), "process", queries.q7_top_bids)
        project = queries.q7_project_held
    else:
        fn = WindowOperator(sliding_event_time(size, slide), "aggregate", queries.MaxBids(),
                            queries.q7_partial_result)
        project = queries.q7_project
    st = Stage(fn, queries.price_bucket, backend, tmp_path, f"q7-{hold}")
    for i in range(0, len(bids), batch):
        part = [project(b) for b in bids[i:i + batch]]
        st.send(part, [b[3] for b in part])
        st.advance(part[-1][3] - 1)
        if sample_from is not None and part[-1][3] >= sample_from:
            st.sample()
    st.advance(bids[-1][5] + 2 * size)
    return st


def q7_second_stage(first: list[tuple[Any, int]]) -> list[tuple]:
    """What ``q7-highest-bid`` computes from the first stage's outputs (one window each)."""
    by_start: dict[int, list] = defaultdict(queries.MergeMaxBids().create_accumulator)
    merge = queries.MergeMaxBids()
    for value, _ in first:
        by_start[value[0]] = merge.add(value, by_start[value[0]])
    return sorted(r for start, acc in by_start.items()
                  for r in queries.q7_result(start, Window(start, acc[0]), acc))


def run_q8_join(persons: list[tuple], auctions: list[tuple], size: int, slide: int,
                held: frozenset[str], backend: Any, tmp_path, batch: int = 50,
                sample_from: int | None = None) -> Stage:
    """Q8's join over the events in time order (persons port 0, auctions port 1), the
    watermark after every ``batch`` events; state sampled as ``run_q7_first_stage``."""
    fn = WindowJoin(sliding_event_time(size, slide), queries.q8_join)
    pp = queries.person_id_name_extra if "persons" in held else queries.person_id_name
    ap = queries.auction_seller_extra if "auctions" in held else queries.auction_seller
    st = Stage(fn, queries.first_field, backend, tmp_path, f"q8-{sorted(held)}",
               key_fn_1=queries.first_field if "auctions" in held else queries.identity)
    merged = sorted([(p[6], 0, p) for p in persons] + [(a[5], 1, a) for a in auctions],
                    key=lambda x: (x[0], x[1]))
    for i in range(0, len(merged), batch):
        for t, port, e in merged[i:i + batch]:
            st.send([pp(e) if port == 0 else ap(e)], [t], port)
        st.advance(merged[min(i + batch, len(merged)) - 1][0] - 1)
        if sample_from is not None and merged[min(i + batch, len(merged)) - 1][0] >= sample_from:
            st.sample()
    st.advance(merged[-1][0] + 2 * size)
    return st


def new_users(joined: list[tuple[Any, int]], size: int) -> list[tuple]:
    """What ``q8-new-users`` computes from the join's outputs: one row per person and window."""
    return sorted({(v[0], v[1], t + 1 - size) for v, t in joined}, key=lambda r: (r[2], r[0], r[1]))


# ---------------------------------------------------------------- the results are unchanged


def test_top_bids_of_a_held_window_are_maxbids_ones() -> None:
    rng = random.Random(7)
    w = Window(0, 10)
    for _ in range(200):
        bids = [(rng.randrange(5), rng.randrange(5), rng.choice((1, 2, 3, 3)), t, "x" * t)
                for t in range(rng.randint(1, 12))]
        acc = queries.MaxBids().create_accumulator()
        for b in bids:
            acc = queries.MaxBids().add(b[:4], acc)
        assert queries.q7_top_bids(7, w, bids) == queries.q7_partial_result(7, w, acc)


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@pytest.mark.parametrize("bid_bytes", [100, 2_000])
def test_q7_holding_bids_gives_the_reference_results(tmp_path, backend, bid_bytes) -> None:
    cfg = NexmarkConfig(seed=3, first_event_rate=1_000, avg_bid_byte_size=bid_bytes)
    bids = events(cfg, 6_000).bids
    held = run_q7_first_stage(bids, 1_000, 250, True, backend_of(backend, tmp_path, "h"),
                              tmp_path)
    plain = run_q7_first_stage(bids, 1_000, 250, False, backend_of(backend, tmp_path, "p"),
                               tmp_path)
    assert sorted(held.out, key=repr) == sorted(plain.out, key=repr)
    result = q7_second_stage(held.out)
    assert len(result) >= 20
    assert result == ref.q7_sliding(bids, size_ms=1_000, slide_ms=250)


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@pytest.mark.parametrize("held", [frozenset({"persons"}), frozenset({"persons", "auctions"})])
def test_q8_holding_padding_gives_the_reference_results(tmp_path, backend, held) -> None:
    cfg = NexmarkConfig(seed=5, first_event_rate=1_000, avg_person_byte_size=3_000,
                        avg_auction_byte_size=1_500)
    rec = events(cfg, 20_000)
    st = run_q8_join(rec.persons, rec.auctions, 2_000, 500, held,
                     backend_of(backend, tmp_path, "j"), tmp_path)
    plain = run_q8_join(rec.persons, rec.auctions, 2_000, 500, frozenset(),
                        backend_of(backend, tmp_path, "p"), tmp_path)
    assert sorted(st.out, key=repr) == sorted(plain.out, key=repr)
    result = new_users(st.out, 2_000)
    assert len(result) >= 20
    assert result == ref.q8_sliding(rec.persons, rec.auctions, size_ms=2_000, slide_ms=500)


def test_builders_refuse_what_they_cannot_hold() -> None:
    from engine import StreamJob
    from examples.nexmark.source import NexmarkSource

    job = StreamJob("x", num_key_groups=8, parallelism=1)
    src = NexmarkSource(NexmarkConfig(seed=1), event_time=True, num_events=10)
    with pytest.raises(ValueError, match="hold_bids"):
        queries.build_q7(job, src, TestingSink(), hold_bids=True, partial=queries.MaxBids())
    with pytest.raises(ValueError, match="hold_extra"):
        queries.build_q8(job, src, TestingSink(), hold_extra=("bids",))


# ---------------------------------------------------------------- the state follows the padding


@pytest.mark.parametrize("size", [0, 100, 4_000, 60_000, MAX_AVG_BYTE_SIZE])
def test_padding_follows_the_asked_sizes(size) -> None:
    cfg = NexmarkConfig(seed=2, avg_person_byte_size=size, avg_auction_byte_size=size,
                        avg_bid_byte_size=size)
    rec = events(cfg, 2_000)
    for kind, col in (("persons", 7), ("auctions", 9), ("bids", 6)):
        mean = sum(len(e[col]) for e in getattr(rec, kind)) / len(getattr(rec, kind))
        # the extra fills the event up to about the size (+-20 % each; the event's other
        # fields are < 250 bytes)
        assert 0.95 * size - 250 <= mean <= 1.05 * size + 1, (kind, mean)


@pytest.mark.parametrize("field", ["avg_person_byte_size", "avg_auction_byte_size",
                                   "avg_bid_byte_size"])
def test_padding_beyond_the_pool_is_refused(field) -> None:
    with pytest.raises(ValueError, match=field):
        NexmarkConfig(**{field: MAX_AVG_BYTE_SIZE + 1})


def _steady(samples: list[int]) -> float:
    return sum(samples) / len(samples)


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_q7_held_state_reaches_the_size_drrs_asks_for(tmp_path, backend) -> None:
    rate, size, slide, target_mb = 1_000.0, 2_000, 500, 2.0
    pad = drrs.held_padding("q7", target_mb, rate, size, slide)
    cfg = NexmarkConfig(seed=9, first_event_rate=rate, **pad)
    bids = events(cfg, 8_000).bids  # 8 s: steady from 2.5 s on
    held = run_q7_first_stage(bids, size, slide, True, backend_of(backend, tmp_path, "h"),
                              tmp_path, batch=50, sample_from=3_000)
    plain = run_q7_first_stage(bids, size, slide, False, backend_of(backend, tmp_path, "p"),
                               tmp_path, batch=50, sample_from=3_000)
    mb = _steady(held.samples) / 1e6
    assert 0.8 * target_mb <= mb <= 1.25 * target_mb, mb
    assert _steady(plain.samples) / 1e6 < 0.1 * mb  # a running max holds little


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_q8_held_state_reaches_the_size_drrs_asks_for(tmp_path, backend) -> None:
    rate, size, slide, target_mb = 2_000.0, 2_000, 500, 2.0
    pad = drrs.held_padding("q8", target_mb, rate, size, slide)
    cfg = NexmarkConfig(seed=9, first_event_rate=rate, **pad)
    rec = events(cfg, 20_000)
    st = run_q8_join(rec.persons, rec.auctions, size, slide, frozenset(drrs.Q8_HELD),
                     backend_of(backend, tmp_path, "j"), tmp_path, sample_from=3_000)
    mb = _steady(st.samples) / 1e6
    assert 0.8 * target_mb <= mb <= 1.25 * target_mb, mb
