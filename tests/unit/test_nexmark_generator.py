"""NEXMark generator (examples/nexmark/generator.py), Parquet CLI and reference queries."""

from __future__ import annotations

import pickle
import re
from collections import Counter

import numpy as np
import pyarrow.parquet as pq
import pytest

from examples.nexmark import generate as nexmark_generate
from examples.nexmark import reference as ref
from examples.nexmark.generator import (
    AUCTION_FIELDS,
    AUCTION_ID_LEAD,
    BID_FIELDS,
    CHUNK_SIZE,
    FIRST_NAMES,
    HOT_CHANNELS,
    LAST_NAMES,
    PERSON_FIELDS,
    PERSON_ID_LEAD,
    US_CITIES,
    US_STATES,
    Auction,
    Bid,
    EventBatch,
    NexmarkConfig,
    NexmarkGenerator,
    Person,
)


@pytest.fixture(scope="module")
def batch() -> EventBatch:
    return NexmarkGenerator(NexmarkConfig(seed=7)).events(0, 50_000)


# --- determinism and independence ------------------------------------------------------------


def test_same_seed_same_events_other_seed_different():
    a = NexmarkGenerator(NexmarkConfig(seed=3)).events(0, 12_000)
    b = NexmarkGenerator(NexmarkConfig(seed=3)).events(0, 12_000)
    assert a.equals(b)
    assert a.to_records() == b.to_records()
    c = NexmarkGenerator(NexmarkConfig(seed=4)).events(0, 12_000)
    assert c.to_records().bids != a.to_records().bids
    # ids and kinds do not depend on the seed, the random fields do
    assert np.array_equal(a.auctions.id, c.auctions.id)
    assert not np.array_equal(a.bids.price, c.bids.price)


def test_ranges_generate_independently():
    config = NexmarkConfig(seed=11)
    whole = NexmarkGenerator(config).events(0, 10_000)
    gen = NexmarkGenerator(config)
    halves = EventBatch.concat([gen.events(0, 5_000), gen.events(5_000, 5_000)])
    assert halves.equals(whole)
    assert halves.to_records() == whole.to_records()
    # odd cuts around chunk boundaries, generated out of order by a generator without a cache
    cuts = [0, 1, CHUNK_SIZE - 1, CHUNK_SIZE + 2, 7_777, 10_000]
    gen = NexmarkGenerator(config, cache_chunks=0)
    pieces = [gen.events(lo, hi - lo) for lo, hi in reversed(list(zip(cuts, cuts[1:], strict=False)))]
    assert EventBatch.concat(pieces[::-1]).to_records() == whole.to_records()
    # a range far from 0 equals the same range cut out of a larger one
    far = NexmarkGenerator(config).events(1_000_123, 300).to_events()
    assert far == NexmarkGenerator(config).events(1_000_000, 1_000).to_events()[123:423]
    assert NexmarkGenerator(config).events(77, 0).to_events() == []


def test_generator_and_batches_pickle_compactly():
    gen = NexmarkGenerator(NexmarkConfig(seed=5))
    batch = gen.events(10, 3_000)
    clone = pickle.loads(pickle.dumps(gen))
    assert clone.events(10, 3_000).equals(batch)
    data = pickle.dumps(batch)
    assert len(data) < 1_000_000  # lookup tables and the extra pool travel by reference
    assert pickle.loads(data).to_records() == batch.to_records()


# --- structure: kinds, ids, timestamps ---------------------------------------------------------


def test_exact_proportions_per_50_events(batch):
    kinds = batch.kinds
    rem = np.arange(len(batch)) % 50
    assert np.array_equal(kinds, np.where(rem < 1, 0, np.where(rem < 4, 1, 2)))
    assert np.all(batch.persons.event_number % 50 == 0)
    per_block = np.stack([np.bincount(kinds[i:i + 50], minlength=3)
                          for i in range(0, len(batch), 50)])
    assert (per_block == [1, 3, 46]).all()
    events = batch.to_events()[:100]
    assert [type(e) for e in events[:5]] == [Person, Auction, Auction, Auction, Bid]
    assert isinstance(events[50], Person) and isinstance(events[53], Auction)


def test_custom_proportions():
    config = NexmarkConfig(person_proportion=2, auction_proportion=5, bid_proportion=13)
    b = NexmarkGenerator(config).events(0, 2_000)
    assert (len(b.persons), len(b.auctions), len(b.bids)) == (200, 500, 1300)
    assert config.count_before(2_001) == (201, 500, 1300)
    assert np.array_equal(b.persons.id, 1000 + np.arange(200))
    assert np.array_equal(b.auctions.id, 1000 + np.arange(500))


def test_ids_follow_event_counts(batch):
    n = batch.persons.event_number
    assert np.array_equal(batch.persons.id, 1000 + n // 50)
    assert np.array_equal(batch.persons.id, 1000 + np.arange(len(n)))
    n = batch.auctions.event_number
    assert np.array_equal(batch.auctions.id, 1000 + 3 * (n // 50) + n % 50 - 1)
    assert np.array_equal(batch.auctions.id, 1000 + np.arange(len(n)))
    assert (len(batch.persons), len(batch.auctions), len(batch.bids)) == (1000, 3000, 46_000)


def test_timestamps_spaced_by_rate():
    b = NexmarkGenerator(NexmarkConfig()).events(0, 5_000)  # 10,000 events/s
    assert np.array_equal(b.date_time, np.arange(5_000) // 10)
    assert np.array_equal(b.bids.date_time, b.bids.event_number // 10)
    base = 1_700_000_000_000
    b = NexmarkGenerator(NexmarkConfig(first_event_rate=1_000, base_time_ms=base)).events(0, 3_000)
    assert np.array_equal(b.date_time, base + np.arange(3_000))
    records = b.to_records()
    assert records.person_times == [p.date_time for p in records.persons]
    assert records.bid_times == b.bids.date_time.tolist()
    b = NexmarkGenerator(NexmarkConfig(first_event_rate=3_333)).events(0, 10_000)
    exact = np.arange(10_000) * 1000 / 3_333
    assert np.all(np.abs(b.date_time - exact) < 1)
    assert set(np.diff(b.date_time).tolist()) <= {0, 1}


# --- foreign keys, hot keys, field domains -----------------------------------------------------


def _last_ids_before(b: EventBatch, cols, event_numbers) -> np.ndarray:
    """Highest id of ``cols`` generated at or before each of ``event_numbers`` (-1: none)."""
    ids = np.maximum.accumulate(cols.id)
    pos = np.searchsorted(cols.event_number, event_numbers, side="right") - 1
    return np.where(pos >= 0, ids[np.maximum(pos, 0)], -1)


def test_bids_reference_existing_auctions_and_people(batch):
    last_auction = _last_ids_before(batch, batch.auctions, batch.bids.event_number)
    last_person = _last_ids_before(batch, batch.persons, batch.bids.event_number)
    assert np.all(batch.bids.auction >= 1000) and np.all(batch.bids.bidder >= 1000)
    # the reference allows a small lead of not-yet-created ids
    assert np.all(batch.bids.auction <= last_auction + AUCTION_ID_LEAD)
    assert np.all(batch.bids.bidder <= last_person + PERSON_ID_LEAD)
    assert np.all(batch.bids.auction >= last_auction - 100 - AUCTION_ID_LEAD)
    last_person = _last_ids_before(batch, batch.persons, batch.auctions.event_number)
    assert np.all(batch.auctions.seller <= last_person + PERSON_ID_LEAD)

    strict = NexmarkGenerator(NexmarkConfig(seed=7, strict_foreign_keys=True)).events(0, 50_000)
    last_auction = _last_ids_before(strict, strict.auctions, strict.bids.event_number)
    last_person = _last_ids_before(strict, strict.persons, strict.bids.event_number)
    assert np.all(strict.bids.auction <= last_auction)
    assert np.all(strict.bids.bidder <= last_person)
    assert set(strict.bids.auction.tolist()) <= set(strict.auctions.id.tolist())
    assert set(strict.bids.bidder.tolist()) <= set(strict.persons.id.tolist())
    last_person = _last_ids_before(strict, strict.persons, strict.auctions.event_number)
    assert np.all(strict.auctions.seller <= last_person)


def test_hot_auctions_bidders_and_sellers(batch):
    bids = batch.bids
    hot_auction = np.mean((bids.auction - 1000) % 100 == 0)  # P(hot) = 1 - 1/2
    assert 0.45 < hot_auction < 0.6
    hot_bidder = np.mean((bids.bidder - 1000) % 100 == 1)  # P(hot) = 1 - 1/4
    assert 0.7 < hot_bidder < 0.8
    hot_seller = np.mean((batch.auctions.seller - 1000) % 100 == 0)
    assert 0.7 < hot_seller < 0.8
    counts = sorted(Counter(bids.auction.tolist()).values())
    assert counts[-1] > 20 * counts[len(counts) // 2]  # a hot auction vs the median auction
    uniform = NexmarkGenerator(NexmarkConfig(seed=7, hot_auction_ratio=1)).events(0, 50_000)
    assert np.mean((uniform.bids.auction - 1000) % 100 == 0) < 0.05
    counts = sorted(Counter(uniform.bids.auction.tolist()).values())
    assert counts[-1] < 5 * counts[len(counts) // 2]


def test_field_domains(batch):
    r = batch.to_records()
    for p in r.persons:
        first, last = p.name.split(" ")
        assert first in FIRST_NAMES and last in LAST_NAMES
        assert p.city in US_CITIES and p.state in US_STATES
        assert re.fullmatch(r"\d{4} \d{4} \d{4} \d{4}", p.credit_card)
        user, domain = p.email_address.removesuffix(".com").split("@")
        assert re.fullmatch(r"[a-z ]*", user + domain)
        assert user == user.strip() and domain == domain.strip()  # Java trim()
    sizes = [8 + sum(len(p[i]) for i in (1, 2, 3, 4, 5)) + len(p.extra) for p in r.persons]
    assert 180 < np.mean(sizes) < 220
    for a in r.auctions:
        assert 10 <= a.category <= 14
        assert 100 <= a.initial_bid <= a.reserve <= 2 * 10**8
        assert a.date_time < a.expires <= a.date_time + 2 * 167
        assert len(a.item_name) < 20 and len(a.description) < 100
        assert re.fullmatch(r"[a-z ]*", a.description) and a.description == a.description.strip()
    assert batch.bids.price.min() >= 100 and batch.bids.price.max() <= 10**8
    assert np.median(batch.bids.price) == pytest.approx(10**5, rel=0.2)  # log-uniform 10^2..10^8
    channels = Counter(b.channel for b in r.bids)
    assert sum(channels[c] for c in HOT_CHANNELS) == pytest.approx(len(r.bids) / 2, rel=0.05)
    url_of: dict[str, str] = {}
    for b in r.bids:
        assert b.channel in HOT_CHANNELS or re.fullmatch(r"channel-\d{1,4}", b.channel)
        assert b.url.startswith("https://www.nexmark.com/") and "item.htm?query=1" in b.url
        assert url_of.setdefault(b.channel, b.url) == b.url  # one url per channel
        assert 54 <= len(b.extra) <= 81  # avg_bid_byte_size=100, fixed part 32, +-20 %


def test_columns_materialise_consistently(batch):
    bids = batch.bids.slice(0, 1_000)
    records = bids.to_records(named=False)
    assert [x.decode() for x in bids.extra.tolist()] == [rec[6] for rec in records]
    assert [x.decode() for x in bids.url.tolist()] == [rec[4] for rec in records]
    assert bids.to_arrow().to_pylist()[:3] == [
        dict(zip(BID_FIELDS, rec, strict=True)) for rec in records[:3]]
    assert batch.persons.name.dtype.kind == "S"
    with pytest.raises(ValueError):
        NexmarkConfig(first_event_rate=0)


# --- generate.py ----------------------------------------------------------------------------


def test_generate_cli_writes_three_parquet_files(tmp_path, capsys):
    out = tmp_path / "nexmark"
    args = ["--events", "1000", "--seed", "5", "--output", str(out), "--rate", "1000",
            "--batch", "300"]
    assert nexmark_generate.main(args) == 0
    assert "20 person, 60 auction, 920 bid" in capsys.readouterr().out
    tables = {k: pq.read_table(out / f"{k}.parquet") for k in ("person", "auction", "bid")}
    assert tables["person"].column_names == list(PERSON_FIELDS) == [
        "id", "name", "email_address", "credit_card", "city", "state", "date_time", "extra"]
    assert tables["auction"].column_names == list(AUCTION_FIELDS) == [
        "id", "item_name", "description", "initial_bid", "reserve", "date_time", "expires",
        "seller", "category", "extra"]
    assert tables["bid"].column_names == list(BID_FIELDS) == [
        "auction", "bidder", "price", "channel", "url", "date_time", "extra"]
    assert str(tables["auction"].schema.field("expires").type) == "int64"
    assert str(tables["bid"].schema.field("date_time").type) == "int64"
    expected = NexmarkGenerator(NexmarkConfig(seed=5, first_event_rate=1000)).events(0, 1000)
    records = expected.to_records()
    assert [tuple(r.values()) for r in tables["person"].to_pylist()] == records.persons
    assert [tuple(r.values()) for r in tables["auction"].to_pylist()] == records.auctions
    assert [tuple(r.values()) for r in tables["bid"].to_pylist()] == records.bids


# --- reference queries ----------------------------------------------------------------------


def _bid(auction, price, t, bidder=1):
    return Bid(auction, bidder, price, "Google", "https://u", t, "")


def test_window_assignment():
    assert ref.window_starts(12_345, 10_000, 2_000) == [4_000, 6_000, 8_000, 10_000, 12_000]
    assert ref.window_starts(9_999, 10_000) == [0]
    assert ref.window_starts(10_000, 10_000) == [10_000]
    assert ref.window_starts(-1, 10_000) == [-10_000]
    assert ref.window_starts(5, 10, 5, offset_ms=2) == [-3, 2]
    assert ref.window_starts(3, 2, 5) == []  # hopping windows with gaps


def test_q1_q2():
    bids = [_bid(1107, 100, 5, bidder=7), _bid(1000, 250, 6), _bid(1230, 3, 7)]
    assert ref.q1(bids) == [(1107, 7, 0.908 * 100, 5), (1000, 1, 0.908 * 250, 6),
                            (1230, 1, 0.908 * 3, 7)]
    assert ref.q1(bids)[0][2] == pytest.approx(90.8)
    assert ref.q2(bids) == [(1107, 100), (1230, 3)]  # 1107 = 9 * 123, 1230 = 10 * 123
    assert ref.q2(bids, modulus=10) == [(1000, 250), (1230, 3)]


def test_q5_hot_items():
    bids = [_bid(1, 1, 0), _bid(2, 1, 1_000), _bid(2, 1, 2_500), _bid(1, 1, 3_000),
            _bid(2, 1, 3_500), _bid(3, 1, 5_000)]
    assert ref.q5(bids, size_ms=4_000, slide_ms=2_000) == [
        (-2_000, 2_000, 1, 1), (-2_000, 2_000, 2, 1),  # tie: both kept
        (0, 4_000, 2, 3),
        (2_000, 6_000, 2, 2),
        (4_000, 8_000, 3, 1)]
    # timestamps passed separately override date_time
    moved = ref.q5(bids, timestamps=[0] * 6, size_ms=4_000, slide_ms=2_000)
    assert moved == [(-2_000, 2_000, 2, 3), (0, 4_000, 2, 3)]
    # default: 10 s windows sliding by 2 s, so one bid is in 5 windows
    assert [r[:2] for r in ref.q5([_bid(9, 1, 1_000)])] == [
        (-8_000, 2_000), (-6_000, 4_000), (-4_000, 6_000), (-2_000, 8_000), (0, 10_000)]


def test_q7_highest_bid():
    bids = [Bid(1, 11, 100, "c", "u", 1_000, ""), Bid(2, 12, 300, "c", "u", 2_000, ""),
            Bid(3, 13, 300, "c", "u", 9_999, ""), Bid(4, 14, 50, "c", "u", 10_000, ""),
            Bid(6, 16, 300, "c", "u", 10_000, ""), Bid(5, 15, 20, "c", "u", 15_000, "")]
    assert ref.q7(bids) == [
        (0, 10_000, 2, 12, 300, 2_000), (0, 10_000, 3, 13, 300, 9_999),
        (10_000, 20_000, 6, 16, 300, 10_000)]  # t = window end belongs to the next window only
    bids = [Bid(1, 11, 10, "c", "u", 0, ""), Bid(2, 12, 30, "c", "u", 1_000, ""),
            Bid(3, 13, 20, "c", "u", 3_000, ""), Bid(4, 14, 5, "c", "u", 4_500, "")]
    assert ref.q7_sliding(bids, size_ms=4_000, slide_ms=2_000) == [
        (-2_000, 2_000, 2, 12, 30, 1_000), (0, 4_000, 2, 12, 30, 1_000),
        (2_000, 6_000, 3, 13, 20, 3_000), (4_000, 8_000, 4, 14, 5, 4_500)]
    assert ref.q7_sliding(bids, size_ms=4_000, slide_ms=4_000) == ref.q7(bids, size_ms=4_000)


def test_q8_new_users():
    persons = [Person(1, "A", "", "", "", "", 1_000, ""), Person(2, "B", "", "", "", "", 9_000, ""),
               Person(3, "C", "", "", "", "", 12_000, "")]

    def auction(seller, t):
        return Auction(500 + t, "", "", 1, 1, t, t + 1, seller, 10, "")

    auctions = [auction(1, 5_000), auction(2, 11_000), auction(3, 19_999), auction(3, 15_000),
                auction(99, 1_000)]
    assert ref.q8(persons, auctions) == [(1, "A", 0), (3, "C", 10_000)]
    assert ref.q8_sliding(persons, auctions, size_ms=10_000, slide_ms=5_000) == [
        (1, "A", 0), (2, "B", 5_000), (3, "C", 10_000)]
    # separate timestamps: all auctions at t=0 -> people registered in [0, 10 s) with an auction
    assert ref.q8(persons, auctions, auction_times=[0] * 5) == [(1, "A", 0), (2, "B", 0)]
    assert ref.q8(persons, auctions, person_times=[10_000] * 3) == [(2, "B", 10_000),
                                                                    (3, "C", 10_000)]


def test_reference_queries_on_generated_events():
    b = NexmarkGenerator(NexmarkConfig(seed=1, first_event_rate=2_000)).events(0, 60_000)
    r = b.to_records()
    hot = ref.q5(r.bids)
    assert hot and all(count >= 1 for *_, count in hot)
    assert np.mean([(a - 1000) % 100 == 0 for _, _, a, _ in hot]) > 0.8  # hot auctions win
    top = ref.q7(r.bids)
    assert {w for w, *_ in top} == set(range(0, 30_000, 10_000))
    assert all(price == max(x.price for x in r.bids if w <= x.date_time < w + 10_000)
               for w, _, _, _, price, _ in top)
    assert ref.q8(r.persons, r.auctions)  # hot sellers are recently registered people
    assert len(ref.q2(r.bids)) == sum(1 for x in r.bids if x.auction % 123 == 0)
