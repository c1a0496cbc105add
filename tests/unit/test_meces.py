"""Unit tests of ``protocol="meces"`` without Ray: its planner and flags
(``migration.protocols.meces``), fetch-on-demand at the new owner and the background
migration of the rest (``migration.participant``), and the oracle (per key the outputs and
final state of the run without rescaling) over random interleavings, stepped by hand with
``tests.unit.test_drrs_core.DNet`` (which runs the engine's own coordinator). The other
suites that enumerate ``migration.protocols.LIVE`` run meces as well."""

from __future__ import annotations

import random
from typing import Any

import pytest

from engine.dataflow.config import JobConfig
from engine.dataflow.keygroups import moved_key_groups, uniform_assignment
from engine.wire.messages import (
    Ack,
    ConfirmBarrier,
    MigrateState,
    PullState,
    SubscaleTriggered,
    TriggerBarrier,
)
from migration.participant import NewOwnerRole
from migration.plan import Subscale
from migration.planning import Planning
from migration.protocols import PROTOCOLS, PlanRequest, ProtocolSpec, RescaleProtocol, make_plan
from migration.protocols.meces import MECES, plan_meces
from tests.unit.test_drrs_core import (
    DNet,
    N,
    drrs_job,
    key_in,
    per_key,
    reduce_state,
    running_sum_reference,
)

# ====================================================================== planner and flags


def _request(old: tuple[int, ...], new: tuple[int, ...], **kw: Any) -> PlanRequest:
    return PlanRequest("sum", old, new, max(old) + 1, max(new) + 1, **kw)


def test_meces_is_registered_live_with_fetch_on_demand_and_no_trigger():
    spec = PROTOCOLS[RescaleProtocol.MECES]
    assert spec is MECES and spec.live and spec.fetch_on_demand and spec.reroutes
    assert not spec.trigger and not spec.aligned and not spec.block_aligned
    assert not spec.pause_new_owner and not spec.concurrent  # one step, every pair at once
    assert RescaleProtocol.parse("meces", "protocol") is RescaleProtocol.MECES
    assert not spec.needs_profiles(None, 1000)


def test_a_spec_takes_exactly_one_of_trigger_fetch_on_demand_and_aligned():
    kw = dict(live=True, block_aligned=False, pause_new_owner=False, concurrent=False,
              planner=plan_meces)
    with pytest.raises(ValueError, match="exactly one"):
        ProtocolSpec(RescaleProtocol.MECES, trigger=True, aligned=False, fetch_on_demand=True,
                     **kw)
    with pytest.raises(ValueError, match="exactly one"):
        ProtocolSpec(RescaleProtocol.MECES, trigger=False, aligned=True, fetch_on_demand=True,
                     **kw)
    assert not PROTOCOLS[RescaleProtocol.DRRS].fetch_on_demand
    assert PROTOCOLS[RescaleProtocol.DRRS].reroutes
    assert not PROTOCOLS[RescaleProtocol.FLUID].reroutes


def test_plan_moves_every_group_in_one_step_with_one_subscale_per_pair():
    old, new = uniform_assignment(N, 2), uniform_assignment(N, 3)
    plan = make_plan("meces", _request(old, new, first_id=7, subscale_size=1))
    assert plan.protocol == "meces" and len(plan.steps) == 1
    pairs = [(s.old, s.new) for s in plan.subscales]
    assert pairs == sorted(set(pairs))  # one subscale per pair: no division by size
    assert [s.subscale_id for s in plan.subscales] == list(range(7, 7 + len(pairs)))
    assert sorted(plan.moved) == moved_key_groups(old, new)
    for s in plan.subscales:
        assert list(s.key_groups) == sorted(s.key_groups)
    assert "at once" in plan.reason and "fetched" in plan.reason


@pytest.mark.parametrize("seed", range(10))
def test_plan_covers_every_moved_group_once_for_random_assignments(seed):
    rng = random.Random(seed)
    old = tuple(rng.randrange(3) for _ in range(N))
    new = tuple(rng.randrange(4) for _ in range(N))
    plan = plan_meces(_request(old, new))
    assert sorted(plan.moved) == moved_key_groups(old, new)
    assert len(plan.subscales) == len({(old[kg], new[kg]) for kg in plan.moved})
    assert len(plan.steps) == (1 if plan.moved else 0)


def test_plan_follows_a_planning_order_and_moves_nothing_when_nothing_changes():
    from migration.planning import GroupProfile

    old, new = uniform_assignment(N, 2), uniform_assignment(N, 4)
    profiles = {kg: GroupProfile(kg, float(kg), 10 * kg) for kg in range(N)}
    plan = plan_meces(_request(old, new, profiles=profiles, planning=Planning(chunk_size=2)))
    assert sorted(plan.order) == sorted(plan.moved) and len(plan.steps) == 1
    same = plan_meces(_request(old, old))
    assert same.steps == () and same.moved == ()


# ====================================================================== fetch on demand


K2, K3, K4, K5, K5B = key_in(2), key_in(3), key_in(4), key_in(5), key_in(5, 1)
FIRST = [(K2, 1), (K3, 1), (K4, 1), (K5, 1), (K5B, 1)]  # group 5 holds the most state
MOVING = Subscale(0, 0, 1, (2, 3, 4, 5))                  # sum/0 -> sum/1


@pytest.fixture
def clock():
    from engine.time.clock import ManualClock

    return ManualClock()


@pytest.fixture
def sink(tmp_path):
    from engine.io.testing import TestingSink

    return TestingSink(str(tmp_path / "out"))


def _started(clock: Any, sink: Any, before: list, after: list) -> DNet:
    """FIRST processed at sum/0; ``before`` sent to sum/0 (delivered, not processed); the
    meces subscale started (no trigger); nothing of ``after`` sent yet."""
    net = DNet(drrs_job(FIRST + before + after, sink), clock)
    net.auto_pull = False
    src = net["src/0"]
    src.poll_source(len(FIRST))
    net.pump()
    if before:
        src.poll_source(len(before))
        net.deliver()
    net.start_subscale(MOVING, trigger=False, protocol="meces")
    assert src.priority_out == []  # no trigger barrier: meces has one synchronization
    assert net.take_prio(TriggerBarrier) == []
    return net


def test_a_record_of_a_group_not_moved_yet_makes_the_new_owner_fetch_that_group_first(
        clock, sink):
    before = [(K4, 7)]                 # in sum/0's input, sent before the routing switch
    after = [(K4, 10), (K5, 20)]
    net = _started(clock, sink, before, after)
    src, s, d = net["src/0"], net["sum/0"], net["sum/1"]
    src.poll_source(1)                 # (K4, 10) straight to the new owner
    net.deliver()
    net.run("sum/1")
    # the record finds group 4's state missing: fetched at once, the record set aside
    assert net.take_prio(PullState) == [(s.name, PullState(0, 4))]
    assert d.migration.new_role.aside_count == 1
    assert any("fetched [4]" in line for line in d.migration.describe())
    assert net.take_prio(SubscaleTriggered) == []  # sum/0 has not started yet
    # the fetch reaches sum/0 before its first confirm: it starts with the fetched group
    assert s.handle(PullState(0, 4)) == Ack()
    [(_, triggered)] = net.take_prio(SubscaleTriggered)
    [(_, pushed)] = net.take_prio(MigrateState)
    assert triggered.pushed == pushed.key_group == 4
    assert 4 not in s.backend.groups and {2, 3, 5} <= set(s.backend.groups)
    assert d.handle(triggered) == Ack()
    assert net.take_prio(PullState) == []          # the fetch is in flight: no pull beside
    assert d.handle(pushed) == Ack()
    # the rest in the background, one at a time, the smaller states first (5 is last)
    [(_, background)] = net.take_prio(PullState)
    assert background.key_group in (2, 3)
    # a record of group 5 meanwhile: fetched at once, beside the background pull
    src.poll_source(1)
    net.deliver()
    net.run("sum/1")
    assert net.take_prio(PullState) == [(s.name, PullState(0, 5))]
    for pull in (background, PullState(0, 5)):
        assert s.handle(pull) == Ack()
    # the record of group 4 sent before the switch follows the state (re-routed), the
    # state never goes back
    net.run("sum/0")
    assert s.router.rerouted == 1
    net.auto_pull = True
    net.pump()
    net.run_sources()
    assert set(net.subscale_reports()[0]) == {"old", "new"}
    assert per_key(sink.results()) == per_key(running_sum_reference(FIRST + before + after))
    assert [r for r in sink.results() if r[0] == K4] == [(K4, 1), (K4, 8), (K4, 18)]
    assert set(d.backend.owned()) >= {2, 3, 4, 5} and not set(s.backend.owned()) & {2, 3, 4, 5}
    assert reduce_state(d)[K5] == (K5, 21)


def test_the_first_confirm_starts_the_background_migration_and_a_stale_fetch_is_ignored(
        clock, sink):
    after = [(K2, 5), (K3, 6)]
    net = _started(clock, sink, [], after)
    src, s, d = net["src/0"], net["sum/0"], net["sum/1"]
    net.deliver()                      # the confirm barrier to sum/0
    net.run("sum/0")                   # sum/0 meets it: starts, sends the smallest group
    [(_, triggered)] = net.take_prio(SubscaleTriggered)
    [(_, pushed)] = net.take_prio(MigrateState)
    assert triggered.pushed == pushed.key_group != 5
    first = pushed.key_group
    # a record of the pushed group reaches the new owner before the notice: it fetches
    # the group too; the old owner, which sent it already, ignores the fetch
    src.poll_source(2)
    net.deliver()
    net.run("sum/1")
    fetches = net.take_prio(PullState)
    assert (s.name, PullState(0, first)) in fetches
    for _, f in fetches:
        assert s.handle(f) == Ack()
    shipped = net.take_prio(MigrateState)
    assert first not in [m.key_group for _, m in shipped]  # shipped once
    assert d.handle(triggered) == Ack() and d.handle(pushed) == Ack()
    for _, m in shipped:
        assert d.handle(m) == Ack()
    net.auto_pull = True
    net.pump()
    net.run_sources()
    assert per_key(sink.results()) == per_key(running_sum_reference(FIRST + after))
    reports = net.subscale_reports()[0]
    assert reports["old"].bytes == reports["new"].bytes > 0


def test_direct_records_wait_for_their_confirm_even_with_the_state_in(clock, sink):
    """The order-preserving part: a fetched group's direct records are processed only once
    their predecessor's confirm came back through the old owner, behind the re-routed ones
    (Meces itself would process them at once: the execution-order caveat)."""
    before = [(K4, 7)]
    after = [(K4, 10)]
    net = _started(clock, sink, before, after)
    src, s, d = net["src/0"], net["sum/0"], net["sum/1"]
    src.poll_source(1)
    net.deliver()
    net.run("sum/1")
    [(_, fetch)] = net.take_prio(PullState)
    assert s.handle(fetch) == Ack()
    for _, m in net.take_prio(SubscaleTriggered) + net.take_prio(MigrateState):
        assert d.handle(m) == Ack()
    net.run("sum/1")
    assert 4 in d.backend.groups and d.migration.new_role.aside_count == 1
    assert [r for r in sink.results() if r[0] == K4] == [(K4, 1)]  # (K4, 10) still waits
    net.run("sum/0")                   # (K4, 7) re-routed, the confirm forwarded behind it
    rcid = net.ids.get(-1, s.name, d.name)
    [(cid, fr)] = [x for x in net.frames_to("sum/1") if x[0] == rcid]
    assert list(fr.values) == [(K4, 7)] and isinstance(fr.event, ConfirmBarrier)
    net.auto_pull = True
    net.pump()
    net.run_sources()
    assert [r for r in sink.results() if r[0] == K4] == [(K4, 1), (K4, 8), (K4, 18)]


def test_the_new_owner_role_fetches_each_group_once_and_only_for_meces():
    nr = NewOwnerRole(cap=10)
    nr.expect(0, (2, 3), (11,), 99, True, "old", 0, fetch_on_demand=True)
    nr.expect(1, (6,), (11,), 98, True, "old", 0)
    assert nr.fetch(2) == (0, "old") and nr.fetch(2) is None
    assert nr.fetch(6) is None         # a drrs subscale pulls after the trigger only
    assert nr.fetch(7) is None         # not incoming
    nr.on_triggered(0, {2: 5, 3: 5}, pushed=-1)
    assert nr.next_pull(0) is None     # the fetch of group 2 is in flight
    nr.on_state(0, 2, 5, 0)
    assert nr.next_pull(0) == 3 and nr.fetch(3) is None


# ====================================================================== the oracle


def _meces_run(clock: Any, sink: Any, monkeypatch: Any, seed: int, new_p: int,
               start_p: int = 2, src_p: int = 1) -> tuple[Any, int]:
    """A meces rescale of the running sum at a random moment, random interleavings; the
    outputs per key and the final state equal the run without rescaling. Returns the plan
    and how many fetches the new owners sent."""
    rng = random.Random(f"meces-{seed}")
    print(f"meces oracle: seed={seed} {start_p} -> {new_p} src_p={src_p}")
    fetches = []
    fetch = NewOwnerRole.fetch

    def counting(self: NewOwnerRole, kg: int) -> Any:
        got = fetch(self, kg)
        if got is not None:
            fetches.append(kg)
        return got

    monkeypatch.setattr(NewOwnerRole, "fetch", counting)
    records = [(rng.randrange(24), rng.randrange(100)) for _ in range(240)]
    cfg = JobConfig(batch_size=4, linger_ms=0, metrics_port=None,
                    drrs_set_aside_cap=rng.choice([1, 3, 200]))
    net = DNet(drrs_job(records, sink, sum_p=start_p, src_p=src_p, config=cfg), clock)
    for _ in range(12):
        for u in net.sources():
            u.poll_source(rng.randint(1, 6))
        net._random_round(rng, 10**9)
    new = uniform_assignment(N, new_p)
    plan, reports = net.drrs("sum", new, rng, protocol="meces")
    net.run_sources()
    out = sink.results()
    assert len(out) == len(records)
    if src_p == 1:
        assert per_key(out) == per_key(running_sum_reference(records))
    final: dict[Any, Any] = {}
    for i in range(max(new) + 1):
        core = net[f"sum/{i}"]
        assert core.backend.owned() == [kg for kg in range(N) if new[kg] == i]
        final.update(reduce_state(core))
    assert final == {k: (k, sum(v for kk, v in records if kk == k)) for k, _ in records}
    assert sorted(reports) == [s.subscale_id for s in plan.subscales]
    return plan, len(fetches)


def _moved_and_fetched(plan: Any, fetches: int) -> None:
    assert plan.moved, "the rescale moved nothing"
    assert fetches > 0, "no group was fetched on demand"


@pytest.mark.parametrize("seed", range(6))
def test_meces_rescales_equal_the_run_without_and_fetch_on_demand(clock, sink, monkeypatch,
                                                                   seed):
    new_p, start_p, src_p = [(3, 2, 1), (2, 3, 1), (4, 2, 2)][seed % 3]
    plan, fetches = _meces_run(clock, sink, monkeypatch, seed, new_p, start_p, src_p)
    _moved_and_fetched(plan, fetches)


def test_a_run_that_moved_nothing_fails(clock, sink, monkeypatch):
    plan, fetches = _meces_run(clock, sink, monkeypatch, 0, 2, 2)  # 2 -> 2: nothing moves
    with pytest.raises(AssertionError, match="moved nothing"):
        _moved_and_fetched(plan, fetches)
