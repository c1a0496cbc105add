"""Unit tests of the DRRS ablation without Ray: ``RescaleRequest.without`` switches off each of
DRRS's three mechanisms (``migration.protocols.drrs.DrrsMechanism``): decoupled trigger/
confirm barriers, record scheduling, subscale division.

Each switch changes what the data plane does (stepped by hand on task cores with
``tests.unit.test_drrs_core.DNet``, whose coordinator is the engine's own through
``tests/harness.py``), and every switch and every combination keeps the live oracle
(DESIGN §10: per key the outputs and the final state of the run without rescaling): on the
running-sum job with random interleavings, and on the multi-stage event-time jobs of
``tests.unit.test_oracle_jobs`` (hypothesis; seeds and cases printed)."""

from __future__ import annotations

import dataclasses
import itertools
import random
import types
from typing import Any

import pytest
from hypothesis import given, note, seed, settings

from engine.dataflow.config import JobConfig
from engine.dataflow.keygroups import moved_key_groups, uniform_assignment
from engine.errors import RescaleRefused
from engine.io.testing import TestingSink
from engine.wire.messages import (
    Ack,
    ConfirmBarrier,
    MigrateState,
    PullState,
    SubscaleTriggered,
    TriggerBarrier,
)
from migration.coordinator import RescaleRequest, subscale_calls
from migration.plan import Subscale
from migration.protocols import PROTOCOLS, PlanRequest, RescaleProtocol
from migration.protocols.drrs import (
    DRRS,
    DrrsMechanism,
    describe_without,
    drrs_without,
    parse_without,
)
from migration.requests import validate_request
from migration.scheduling import SubscaleScheduler
from tests import harness
from tests.harness import wire
from tests.unit import test_oracle_jobs as oracle_jobs
from tests.unit.test_drrs_core import (
    S0,
    TWO_SRC,
    A,
    DNet,
    N,
    a,
    b,
    dk,
    drrs_job,
    key_in,
    per_key,
    reduce_state,
    running_sum_reference,
)

DB = DrrsMechanism.DECOUPLED_BARRIERS
RS = DrrsMechanism.RECORD_SCHEDULING
SD = DrrsMechanism.SUBSCALE_DIVISION
#: every non-empty set of switches
COMBINATIONS = [frozenset(c) for n in (1, 2, 3) for c in itertools.combinations(DrrsMechanism, n)]


def _ids(without: frozenset[DrrsMechanism]) -> str:
    return "+".join(sorted(str(m) for m in without))


@pytest.fixture
def sink(tmp_path: Any) -> TestingSink:
    return TestingSink(str(tmp_path / "out"))


# ====================================================================== the request


def test_without_parses_names_and_only_goes_with_drrs():
    r = RescaleRequest("sum", 3, "drrs", without=["record-scheduling"])
    assert r.without == frozenset({RS})
    assert RescaleRequest("sum", 3, "drrs", without="subscale-division").without == {SD}
    assert RescaleRequest("sum", 3, "drrs").without == frozenset()
    with pytest.raises(ValueError, match="unknown DRRS mechanism 'recordscheduling'"):
        RescaleRequest("sum", 3, "drrs", without=["recordscheduling"])
    with pytest.raises(ValueError, match="protocol 'fluid' has none of them"):
        RescaleRequest("sum", 3, "fluid", without=[DB])
    assert describe_without([SD, DB]) == "without decoupled barriers, subscale division"


def test_the_handle_refuses_without_for_another_protocol(clock, sink):
    net = DNet(drrs_job([(a, 1)], sink), clock)
    with pytest.raises(RescaleRefused, match="has none of them"):
        validate_request(net.plan, "sum", 3, "meces", without=("record-scheduling",))
    with pytest.raises(RescaleRefused, match="unknown DRRS mechanism"):
        validate_request(net.plan, "sum", 3, "drrs", without=("barriers",))
    req = validate_request(net.plan, "sum", 3, "drrs", without=("decoupled-barriers",))
    assert req.without == {DB} and req.protocol == RescaleProtocol.DRRS


def test_the_variants_are_specs_of_drrs_never_registered():
    assert drrs_without(frozenset()) is DRRS and len(PROTOCOLS) == 7
    assert all(not p.without for p in PROTOCOLS.values())
    spec = drrs_without(frozenset({DB}))
    assert spec.name == RescaleProtocol.DRRS and spec.coupled and not spec.trigger
    assert spec.reroutes and spec.schedule_records and spec.divided
    spec = drrs_without(frozenset({RS, SD}))
    assert spec.trigger and not spec.schedule_records and not spec.divided
    assert spec.without == {"record-scheduling", "subscale-division"}
    assert drrs_without(parse_without(["record-scheduling", "subscale-division"])) is spec


# ====================================================================== subscale division


def _request(old: tuple[int, ...], new: tuple[int, ...], **kw: Any) -> PlanRequest:
    return PlanRequest("sum", old, new, max(old) + 1, max(new) + 1, **kw)


def test_without_subscale_division_the_plan_has_one_subscale_per_pair():
    old, new = uniform_assignment(N, 1), uniform_assignment(N, 2)
    req = _request(old, new, subscale_size=2, subscale_bytes=10)
    divided = DRRS.planner(req)
    undivided = drrs_without(frozenset({SD})).planner(req)
    assert len(divided.subscales) == 4  # 8 groups, 2 per subscale
    [one] = undivided.subscales
    assert one.key_groups == tuple(moved_key_groups(old, new)) and (one.old, one.new) == (0, 1)
    assert "one subscale per (old, new) pair with all its groups" in undivided.reason
    old, new = uniform_assignment(N, 2), uniform_assignment(N, 3)
    pairs = {(s.old, s.new) for s in DRRS.planner(_request(old, new, subscale_size=1)).subscales}
    undivided = drrs_without(frozenset({SD})).planner(_request(old, new, subscale_size=1))
    assert sorted((s.old, s.new) for s in undivided.subscales) == sorted(pairs)


def _plan(subs: list[Subscale]) -> Any:
    """Subscales as the scheduler sees a plan (in priority order)."""
    return types.SimpleNamespace(subscales=tuple(subs))


def test_the_unbounded_scheduler_starts_every_subscale_at_once():
    subs = [Subscale(i, 0, 1 + i % 2, (i,)) for i in range(6)]
    owned = {0: 6, 1: 0, 2: 0}
    assert len(SubscaleScheduler(_plan(subs), owned, 2).next_batch()) == 2
    sched = SubscaleScheduler(_plan(subs), owned, len(subs), None, bounded=False)
    assert [s.subscale_id for s in sched.next_batch()] == list(range(6))


def test_the_acyclic_scheduler_never_runs_a_cycle_of_pairs():
    subs = [Subscale(0, 0, 1, (1,)), Subscale(1, 1, 2, (2,)), Subscale(2, 2, 0, (3,)),
            Subscale(3, 1, 0, (4,))]
    owned = {0: 5, 1: 5, 2: 5}
    free = SubscaleScheduler(_plan(subs), owned, 9, bounded=False)
    assert len(free.next_batch()) == 4
    sched = SubscaleScheduler(_plan(subs), owned, 9, bounded=False, acyclic=True)
    first = sched.next_batch()
    assert [s.subscale_id for s in first] == [0, 1]  # 2 -> 0 and 1 -> 0 would close a cycle
    sched.complete(0)
    assert [s.subscale_id for s in sched.next_batch()] == [2, 3]  # 1 -> 2 -> 0, 1 -> 0: no cycle
    assert sched.next_batch() == []


# ====================================================================== decoupled barriers


def _start(net: DNet, sub: Subscale, without: frozenset[DrrsMechanism]) -> int:
    """The coordinator's calls that start ``sub`` for drrs ``without``; the re-route id."""
    names = net.dep.tasks["sum"]
    expect, inject = subscale_calls(sub, names, net.dep, "sum", net.ids, drrs_without(without),
                                    {})
    for c in [*expect, *inject]:
        assert net.cores[c.task].handle(wire(c.message)) == Ack()
    return net.ids.get(-1 - sub.subscale_id, names[sub.old], names[sub.new])


@pytest.mark.parametrize("without", [frozenset(), frozenset({DB})], ids=["drrs", "coupled"])
def test_without_decoupled_barriers_no_state_moves_before_every_confirm(clock, sink, without):
    """Two predecessors: drrs migrates on the priority trigger (or the first confirm);
    without decoupled barriers there is no trigger and nothing moves until the second
    confirm is in; then the confirms go to the new owner, which pulls as drrs does."""
    recs = [(a, 1), (a, 2), (b, 3), (b, 4)]
    net = DNet(drrs_job(recs, sink, src_p=2), clock)
    u0, u1, s, d = net["src/0"], net["src/1"], net["sum/0"], net["sum/1"]
    u0.poll_source(2)
    u1.poll_source(2)
    net.pump()
    rcid = _start(net, S0, without)
    triggers = net.take_prio(TriggerBarrier)
    assert len(triggers) == (0 if without else 2)
    net.deliver()
    assert s.step()  # the first confirm
    out = s.migration.old_role.subscales[0]
    assert len(out.confirms) == 1
    moved = net.take_prio(MigrateState)
    if without:
        assert moved == [] and net.take_prio(SubscaleTriggered) == []
        assert not out.migrated and A in s.backend.groups
        assert [f for f in net.frames_to("sum/1") if f[0] == rcid] == []  # nothing forwarded
        assert s.step()  # the second confirm: now the state moves, the confirms follow
        [(to, ms)] = net.take_prio(MigrateState)
        assert to == d.name and ms.key_group == A and A not in s.backend.groups
        fwd = [fr.event for cid, fr in net.frames_to("sum/1") if cid == rcid]
        assert sorted(e.direct_channel for e in fwd if isinstance(e, ConfirmBarrier)) == sorted(
            d.migration.new_role.subscales[0].direct_channels)
        moved = [(to, ms)]
    else:
        assert [m.key_group for _, m in moved] == [A] and out.migrated
    net.prio.extend(moved)
    net.pump()
    assert [r.role for r in s.reports] == ["old"] and [r.role for r in d.reports] == ["new"]
    assert s.reports[0].rerouted == 0
    assert reduce_state(d)[a] == (a, 3) and a not in reduce_state(s)


def test_without_decoupled_barriers_the_old_owner_keeps_processing_until_aligned(clock, sink):
    """Records of the moving group that reach the old owner on a channel whose confirm has
    not come yet are processed there (the state has not left), never re-routed."""
    net = DNet(drrs_job(TWO_SRC, sink, src_p=2), clock)
    u0, u1, s = net["src/0"], net["src/1"], net["sum/0"]
    u0.poll_source(2)
    u1.poll_source(2)
    net.collect()
    _start(net, S0, frozenset({DB}))
    u0.poll_source(10)
    u0.router.flush_all()
    net.deliver()
    net.run("sum/0")
    assert s.router.rerouted == 0
    net.run_sources()
    totals = {k: sum(v for kk, v in TWO_SRC if kk == k) for k, _ in TWO_SRC}
    assert {k: max(v for _, v in rs) for k, rs in per_key(sink.results()).items()} == totals


# ====================================================================== record scheduling


@pytest.mark.parametrize("without", [frozenset(), frozenset({RS})], ids=["drrs", "unscheduled"])
def test_without_record_scheduling_a_waiting_record_blocks_its_channel(clock, sink, without):
    """The state of A is held back. drrs sets A's records aside and processes the record of
    group D behind them on the same channel; without record scheduling the channel stops at
    the first record of A and D's record waits too."""
    recs = [(a, 1), (a, 2), (dk, 5), (dk, 7)]
    net = DNet(drrs_job(recs, sink), clock)
    src, d = net["src/0"], net["sum/1"]
    _start(net, S0, without)
    net.deliver_prio(TriggerBarrier)
    [state] = net.take_prio(MigrateState)
    src.poll_source(4)
    net.deliver()
    net.run("sum/1")
    c_ud = net.cid("src/0", "sum/1")
    nr = d.migration.new_role
    if without:
        assert nr.aside_count == 0 and d._heads[c_ud].pos == 0
        assert sink.results() == []
    else:
        assert nr.aside_count == 2
        assert sink.results() == [(dk, 5), (dk, 12)]
    net.prio.append(state)
    net.pump()
    assert per_key(sink.results()) == per_key(running_sum_reference(recs))
    assert [r.role for r in d.reports] == ["new"] and nr.aside_count == 0


@pytest.mark.parametrize("without", [frozenset(), frozenset({RS})], ids=["drrs", "unscheduled"])
def test_without_record_scheduling_pulls_ignore_the_waiting_records(clock, sink, without):
    """A subscale of groups 2, 3, 4, 6 (3 pushed first: its state is the smallest); a record
    of group 6 waits at the new owner when the notice comes: drrs pulls 6 next, without
    record scheduling the subscale's order decides (2)."""
    big = [(key_in(g, i), 1) for g in (2, 4, 6) for i in range(3)]  # 3 keys: larger state
    recs = [*big, (key_in(3), 1), (key_in(6), 5)]
    net = DNet(drrs_job(recs, sink), clock)
    src, s, d = net["src/0"], net["sum/0"], net["sum/1"]
    src.poll_source(len(recs) - 1)
    net.pump()
    net.auto_pull = False
    _start(net, Subscale(0, 0, 1, (2, 3, 4, 6)), without)
    net.take_prio(TriggerBarrier)
    assert s.handle(TriggerBarrier(0)) == Ack()
    notice = net.take_prio(SubscaleTriggered)
    [(_, pushed)] = net.take_prio(MigrateState)
    assert pushed.key_group == 3
    src.poll_source(1)  # group 6's record goes straight to the new owner
    net.deliver()
    net.run("sum/1")
    assert d.migration.new_role.aside_count == (0 if without else 1)
    for _, m in notice:
        assert d.handle(m) == Ack()
    assert d.handle(pushed) == Ack()
    [(_, pull)] = net.take_prio(PullState)
    assert pull.key_group == (2 if without else 6)
    assert s.handle(pull) == Ack()
    net.auto_pull = True
    net.pump()
    net.run_sources()
    assert per_key(sink.results()) == per_key(running_sum_reference(recs))


# ====================================================================== the oracle


def ablated_rescale(net: DNet, new: tuple[int, ...], rng: random.Random,
                    without: frozenset[DrrsMechanism], *, size: int = 2, limit: int = 2,
                    at_once: int | None = None) -> tuple[Any, Any]:
    """``DNet.drrs`` with ``without``: the engine's coordinator (``tests.harness.rescale``)
    over random interleavings. Returns the coordinator and its report."""
    net.auto_pull = False
    cfg = dataclasses.replace(net.config, drrs_subscale_size=size,
                              drrs_max_subscales_per_task=limit)
    request = RescaleRequest("sum", max(new) + 1, "drrs", tuple(new), without=without)
    coord, report, _ = harness.rescale(
        net, request, lambda: net._random_round(rng, 12), config=cfg,
        after_send=net._settle, max_subscales=at_once or 10**6)
    net.seen_reports.clear()
    return coord, report


def _running_sum_oracle(clock: Any, sink: Any, without: frozenset[DrrsMechanism], seed_: int,
                        change: str, src_p: int) -> Any:
    rng = random.Random(f"ablation-{_ids(without)}-{change}-{seed_}")
    print(f"drrs ablation oracle: without={_ids(without)} change={change} src_p={src_p} "
          f"seed={seed_}")
    records = [(rng.randrange(24), rng.randrange(100)) for _ in range(240)]
    cfg = JobConfig(batch_size=rng.choice([1, 4]), linger_ms=0, metrics_port=None,
                    drrs_set_aside_cap=rng.choice([1, 3, 200]))
    start_p = 3 if change == "in" else 2
    net = DNet(drrs_job(records, sink, sum_p=start_p, src_p=src_p, config=cfg), clock)
    for _ in range(12):
        for u in net.sources():
            u.poll_source(rng.randint(1, 6))
        net._random_round(rng, 10**9)
    if change == "out":
        new = uniform_assignment(N, 3)
    elif change == "in":
        new = uniform_assignment(N, 2)
    else:  # a swap: pairs 0 -> 1 and 1 -> 0, a cycle
        new = tuple(1 - t if kg in (1, 2, 6, 9, 13) else t
                    for kg, t in enumerate(uniform_assignment(N, 2)))
    old = net.dep.assignments["sum"]
    coord, report = ablated_rescale(net, new, rng, without, limit=rng.choice([1, 2]),
                                    at_once=rng.choice([None, 1, 2]))
    plan = coord.plan
    assert plan.moved and sorted(plan.moved) == moved_key_groups(old, new)
    assert report.key_groups_moved == len(plan.moved)
    assert report.without == tuple(sorted(str(m) for m in without))
    assert describe_without(without) in plan.reason
    assert describe_without(without) in report.planning_reason
    assert str(report).startswith(f"drrs without {', '.join(report.without)} rescale")
    net.run_sources()
    out = sink.results()
    assert len(out) == len(records)
    if src_p == 1:
        assert per_key(out) == per_key(running_sum_reference(records))
    totals = {k: sum(v for kk, v in records if kk == k) for k, _ in records}
    assert {k: max(v for _, v in rs) for k, rs in per_key(out).items()} == totals
    final: dict[Any, Any] = {}
    for i in range(max(new) + 1):
        core = net[f"sum/{i}"]
        assert core.backend.owned() == [kg for kg in range(N) if new[kg] == i]
        assert not core.migration.active and core.migration.new_role.aside_count == 0
        final.update(reduce_state(core))
    assert final == {k: (k, t) for k, t in totals.items()}
    return coord, report


@pytest.mark.parametrize("change", ["out", "in", "swap"])
@pytest.mark.parametrize("without", COMBINATIONS, ids=_ids)
def test_each_switch_and_combination_keeps_the_running_sums(clock, tmp_path, without, change):
    for seed_ in range(2):
        sink = TestingSink(str(tmp_path / f"out-{seed_}"))
        _running_sum_oracle(clock, sink, without, seed_, change, src_p=1 + seed_)


def test_without_subscale_division_every_pair_moves_at_once(clock, sink):
    coord, report = _running_sum_oracle(clock, sink, frozenset({SD}), 0, "out", 1)
    plan = coord.plan
    assert len(plan.subscales) == len({(s.old, s.new) for s in plan.subscales})
    starts = {start for _, start, _ in report.subscales}
    assert len(starts) == 1  # every subscale started in the one batch
    assert "every one at once" in report.planning_reason


def test_a_run_that_moved_nothing_fails(clock, sink):
    net = DNet(drrs_job([(a, 1), (b, 2)], sink), clock)
    coord, _ = ablated_rescale(net, uniform_assignment(N, 2), random.Random(0),
                               frozenset({DB}))
    with pytest.raises(AssertionError):
        assert coord.plan.moved, "the rescale moved nothing"


#: the multi-stage, event-time oracle of tests/unit/test_oracle_jobs.py with a drawn switch
#: set (a fixed hypothesis seed, printed; the Case replays one example)
ORACLE_SEED = 20261128


@pytest.mark.parametrize("without", COMBINATIONS, ids=_ids)
def test_the_multi_stage_oracle_holds_without_each_mechanism(without):
    print(f"drrs ablation multi-stage oracle: without={_ids(without)} "
          f"hypothesis seed={ORACLE_SEED}")

    @seed(ORACLE_SEED + COMBINATIONS.index(without))
    @settings(max_examples=4, **oracle_jobs.SETTINGS)
    @given(case=oracle_jobs.cases(protocol="drrs", targets=("A", "B")))
    def check(case: Any) -> None:
        note(f"without={_ids(without)} {case}")
        print(f"  case: {case}")
        made: list[RescaleRequest] = []

        def request(*args: Any, **kw: Any) -> RescaleRequest:
            made.append(RescaleRequest(*args, **kw, without=without))
            return made[-1]

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(oracle_jobs, "RescaleRequest", request)
            oracle_jobs.run_case(case)
        assert made and all(r.without == without for r in made)

    check()
