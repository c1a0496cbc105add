"""A stateless operator rescaled live (``StatelessRescale``), and forward edges kept.

The engine's coordinator runs through ``tests/harness.py`` on task cores in this process
under seeded random interleavings (the source reads, cores step in random amounts, frames
arrive late and out of order). The job: ``src`` (one task) -> ``map`` (rebalance: another
parallelism) -> key_by -> a running count ``sum`` -> sink, and an event-time variant with
out-of-order timestamps, bounded-out-of-orderness watermarks and tumbling windows. The
oracle: per key the outputs of the run without rescaling, no record lost or twice, no
record late; and the rescales ran (task counts changed; an example without one fails).

Forward edges: a forward partner of a keyed operator is refused (rescale the keyed root;
it follows), and ``PhysicalPlan.rescaled``/``Deployment.with_vertex`` never change one side
alone; rescales of forward groups are tested in test_forward_group_rescale.py.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.api import StreamJob
from engine.checkpoints.metadata import CheckpointKind
from engine.dataflow.config import JobConfig
from engine.dataflow.physical import FORWARD, REBALANCE, plan_physical
from engine.errors import RescaleRefused
from engine.io.testing import TestingSink, TestingSource
from engine.time.clock import ManualClock
from engine.time.event_time import WatermarkStrategy, tumbling_event_time
from engine.wire.messages import (
    AddInputs,
    AddOutputChannels,
    RemoveOutputChannels,
    StopTask,
)
from migration.coordinator import (
    STATELESS,
    RescaleContext,
    RescaleRequest,
    SendControl,
    StatelessRescale,
    StopRestartRescale,
    SubscaleIds,
    coordinator_for,
)
from migration.protocols import LIVE, LiveMechanism, protocol_used
from migration.requests import check_forward_edges, validate_request
from tests import harness
from tests.harness import records_left
from tests.unit.test_drrs_core import DNet, per_key

N = 16
CFG = JobConfig(batch_size=4, linger_ms=0, metrics_port=None)
MAX_ROUNDS = 20_000
WINDOW = 50
BOUND = 50  # watermark = max timestamp - BOUND - 1; timestamps jitter by less than that


# ---------------------------------------------------------------------- jobs and references


def records(n: int, seed: int) -> list[tuple[int, int, int]]:
    """Record i is ``(key, 1, i)``."""
    rng = random.Random(seed)
    return [(rng.randrange(7), 1, i) for i in range(n)]


def timestamp(r: tuple[int, int, int]) -> int:
    """Out of order by up to 40 ms, never late against ``BOUND``: record i has
    ``10 i <= ts < 10 i + 41``, so the watermark after record j (at most ``10 j + 40 -
    BOUND - 1``) is below the timestamp of every later record."""
    return r[2] * 10 + (r[2] * 7919) % 41


def counting_job(recs: list[Any], sink: TestingSink, map_p: int, *, windowed: bool = False,
                 chained_sink: TestingSink | None = None) -> StreamJob:
    """src (1 task) -> map (``map_p`` tasks: a rebalance edge) -> key_by -> count -> sink;
    with ``windowed``, tumbling event-time windows count instead; ``chained_sink``: the
    map's tasks also write every record they see (a sink chained into them, whose
    uncommitted output a scale-in hands over)."""
    j = StreamJob("stateless-rescale", num_key_groups=N, config=CFG)
    src = j.source(TestingSource(recs, timestamp_fn=timestamp if windowed else None),
                   name="src", parallelism=1,
                   watermarks=WatermarkStrategy(BOUND) if windowed else None)
    mapped = src.map(lambda r: (r[0], r[1], r[2]), name="map", parallelism=map_p)
    if chained_sink is not None:
        mapped.sink(chained_sink, name="seen", parallelism=map_p)
    keyed = mapped.key_by(lambda r: r[0])
    if windowed:
        (keyed.window(tumbling_event_time(WINDOW))
            .reduce(lambda a, b: (a[0], a[1] + b[1], a[2] + b[2]), name="sum", parallelism=2,
                    window_fn=lambda k, w, r: [(k, w.start, r[1], r[2])])
            .sink(sink, name="out"))
    else:
        keyed.reduce(lambda a, b: (a[0], a[1] + b[1], a[2] + b[2]), name="sum",
                     parallelism=2).sink(sink, name="out")
    return j


def check_counts(results: list[Any], recs: list[Any], where: str) -> None:
    """The running count's outputs per key: ``(k, 1, .), (k, 2, .), ...`` as without
    rescaling (a key's records reach ``sum`` over several map tasks, so their order may
    differ, but the counts may not), and the last sum of record ids is every id once."""
    want = per_key(recs)
    got = per_key(results)
    assert set(got) == set(want), where
    for k, outs in got.items():
        assert [o[1] for o in outs] == list(range(1, len(want[k]) + 1)), f"key {k}; {where}"
        assert outs[-1][2] == sum(r[2] for r in want[k]), f"key {k}: ids lost or twice; {where}"


def check_windows(results: list[Any], recs: list[Any], net: DNet, where: str) -> None:
    """Every (key, window) fires once with the count and id sum of the run without
    rescaling; no record was late."""
    want: dict[tuple[int, int], tuple[int, int]] = {}
    for r in recs:
        w = timestamp(r) // WINDOW * WINDOW
        n, s = want.get((r[0], w), (0, 0))
        want[(r[0], w)] = (n + 1, s + r[2])
    got: dict[tuple[int, int], tuple[int, int]] = {}
    for k, w, n, s in results:
        assert (k, w) not in got, f"window {(k, w)} fired twice; {where}"
        got[(k, w)] = (n, s)
    assert sum(c.keyed.late_records for c in net.cores.values() if c.keyed) == 0, where
    assert got == want, where


# ---------------------------------------------------------------------- driving the rescale


def progress(net: DNet, rng: random.Random, watermarks: bool, keep_back: int = 12) -> None:
    """One random round (test_drrs_core's), plus a source watermark now and then."""
    net._random_round(rng, keep_back)
    if watermarks and rng.random() < 0.5:
        for s in net.sources():
            s.emit_watermark()


def settle(net: DNet, cmd: SendControl) -> None:
    """What the task actor's shell does after a control call: the frames the call made
    leave at once; a call that removed channels, or stopped a task, answers once the
    receivers took every frame sent on them (``_settle_in_flight``). Meanwhile the rest of
    the net goes on (cores step, other frames arrive)."""
    net.collect()
    chans = {cid for c in cmd.calls if isinstance(c.message, RemoveOutputChannels)
             for cid in c.message.channel_ids}
    for c in cmd.calls:
        if isinstance(c.message, StopTask):
            chans |= net.cores[c.task].router.channel_ids()
    if not chans:
        return
    for _ in range(MAX_ROUNDS):
        net.collect()
        mine = [f for f in net.frames if f.channel_id in chans]
        net.frames = [f for f in net.frames if f.channel_id not in chans]
        for f in mine:
            net.cores[f.target].receive(f.channel_id, f.seq, f.payload)
        waiting = False
        for core in net.cores.values():
            ins = chans & set(core.inputs)
            while any(core.inputs[c].queue for c in ins) and core.step():
                pass
            waiting = waiting or any(core.inputs[c].queue or core.inputs[c].pending
                                     for c in ins)
        net.collect()
        if not waiting and not any(f.channel_id in chans for f in net.frames):
            return
        net.deliver_prio()
        net.deliver()
    raise AssertionError(f"channels {sorted(chans)} never settled")


def rescale_map(net: DNet, p: int, rng: random.Random, watermarks: bool,
                protocol: str = "drrs", before_change: Any = None) -> Any:
    old = len(net.dep.tasks["map"])
    coord, report, done = harness.rescale(
        net, RescaleRequest("map", p, protocol), lambda: progress(net, rng, watermarks),
        after_send=lambda cmd: settle(net, cmd), before_change=before_change)
    assert isinstance(coord, StatelessRescale)
    assert report.protocol == STATELESS and report.requested_protocol == protocol
    assert (report.old_parallelism, report.new_parallelism) == (old, p)
    assert len(net.dep.tasks["map"]) == p == len([n for n in net.cores if "/map/" in n])
    assert report.key_groups_moved == report.bytes_moved == 0
    return report, done


def finish(net: DNet, watermarks: bool) -> None:
    while any(c.status == "running" for c in net.sources()):
        for c in net.sources():
            c.poll_source(7)
            if watermarks:
                c.emit_watermark()
        net.pump()
    net.pump()


def run(seed: int, map_p: int, steps: list[int], windowed: bool, protocol: str = "drrs",
        checkpoint_between: bool = False, tmp: Any = None) -> None:
    where = (f"seed={seed} map_p={map_p} steps={steps} windowed={windowed} "
             f"protocol={protocol} checkpoint_between={checkpoint_between}")
    print(f"stateless rescale: {where}")
    rng = random.Random(seed)
    recs = records(300, seed)
    sink = TestingSink(str(tmp.mktemp("out")))
    net = DNet(counting_job(recs, sink, map_p, windowed=windowed), ManualClock())
    sum_tasks = net.dep.tasks["sum"]
    checkpoints = (harness.Checkpoints(net, str(tmp.mktemp("ckpt")),
                                       lambda: progress(net, rng, windowed))
                   if checkpoint_between else None)
    reports = []
    for p in steps:
        for _ in range(rng.randint(1, 15)):
            progress(net, rng, windowed)
        before = (None if checkpoints is None else
                  lambda: checkpoints.take(CheckpointKind.CHECKPOINT))
        reports.append(rescale_map(net, p, rng, windowed, protocol, before)[0])
    finish(net, windowed)
    # the rescales ran: an example that changed no task count tests nothing
    assert [(r.old_parallelism, r.new_parallelism) for r in reports] == list(
        zip([map_p, *steps[:-1]], steps, strict=True)), where
    assert any(r.old_parallelism != r.new_parallelism for r in reports), where
    assert net.dep.tasks["sum"] == sum_tasks, f"the keyed operator was redeployed; {where}"
    if windowed:
        check_windows(sink.results(), recs, net, where)
    else:
        check_counts(sink.results(), recs, where)


# ---------------------------------------------------------------------- the oracle


steps_st = st.lists(st.integers(1, 4), min_size=1, max_size=3)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), map_p=st.integers(2, 3), steps=steps_st,
       windowed=st.booleans(), protocol=st.sampled_from(sorted(LIVE)))
def test_a_stateless_operator_rescaled_live_gives_the_results_of_a_run_without(
        tmp_path_factory: pytest.TempPathFactory, seed: int, map_p: int, steps: list[int],
        windowed: bool, protocol: str) -> None:
    changes, prev = [], map_p
    for p in steps:  # every step changes the parallelism
        if p != prev:
            changes.append(p)
            prev = p
    run(seed, map_p, changes or [map_p + 1], windowed, protocol, tmp=tmp_path_factory)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("windowed", [False, True])
def test_scale_out_then_in_with_checkpoints_where_the_runtime_takes_them(
        tmp_path_factory: pytest.TempPathFactory, seed: int, windowed: bool) -> None:
    """A checkpoint at the point where the runtime's executor waits for one (before the
    first change of each rescale) completes, and the results stay exact."""
    run(seed, 2, [4, 1], windowed, checkpoint_between=True, tmp=tmp_path_factory)


def test_an_example_without_a_rescale_fails_the_oracle(tmp_path_factory):
    with pytest.raises(AssertionError):
        run(5, 2, [2], False, tmp=tmp_path_factory)  # same parallelism: nothing changed


def test_the_oracle_catches_a_lost_record():
    recs = records(40, 9)
    out, acc = [], {}
    for k, v, i in recs[:-1]:  # the last record lost
        n, s = acc.get(k, (0, 0))
        acc[k] = (n + v, s + i)
        out.append((k, *acc[k]))
    with pytest.raises(AssertionError):
        check_counts(out, recs, "lost")


# ---------------------------------------------------------------------- step by step


def test_scale_out_wires_receivers_first_and_predecessors_last(tmp_path):
    """The new tasks' receivers add the inputs before the new tasks start, and the
    predecessors add their channels last; the new tasks then get records at once."""
    sink = TestingSink(str(tmp_path / "out"))
    net = DNet(counting_job(records(200, 3), sink, 2), ManualClock())
    rng = random.Random(3)
    for _ in range(5):
        progress(net, rng, False)
    order: list[str] = []

    def watch(cmd: SendControl) -> None:
        for c in cmd.calls:
            order.append(type(c.message).__name__)
        settle(net, cmd)

    _, report, _ = harness.rescale(net, RescaleRequest("map", 3, "drrs"),
                                   lambda: progress(net, rng, False), after_send=watch)
    assert order.index("AddInputs") < order.index("Start") < order.index("AddOutputChannels")
    new = net["map/2"]
    assert new.status == "running" and new.name.endswith("/g1")
    src = net["src/0"]
    while records_left(src) > 12:
        src.poll_source(4)
        net.pump()
    assert new.records_in > 0, "the new task got records as soon as it was wired"
    assert [p for p, _ in report.phases] == ["hold", "deploy", "release"]


def test_scale_in_drains_the_removed_tasks_and_ends_their_channels(tmp_path):
    """Records queued at a removed task are processed before it ends its outputs; its
    channels to the receivers end with EndOfStream (they stop holding the watermark)."""
    sink = TestingSink(str(tmp_path / "out"))
    recs = records(120, 4)
    net = DNet(counting_job(recs, sink, 3), ManualClock())
    src = net["src/0"]
    for _ in range(10):
        src.poll_source(4)  # one batch per map task in turn (round robin per batch)
    net.collect()  # frames to every map task, none delivered yet
    assert any(f.target == net.name("map/2") for f in net.frames)
    gone = net["map/2"]
    gone_name = gone.name
    receivers = [net["sum/0"], net["sum/1"]]
    cids = [net.cid("map/2", "sum/0", 1), net.cid("map/2", "sum/1", 1)]
    stops: list[Any] = []

    def watch(cmd: SendControl) -> None:
        if any(isinstance(c.message, StopTask) for c in cmd.calls):
            stops.append(gone.records_in)
        settle(net, cmd)

    harness.rescale(net, RescaleRequest("map", 2, "fluid"), lambda: net.pump(),
                    after_send=watch)
    assert gone_name not in net.cores and len(net.dep.tasks["map"]) == 2
    assert stops and stops[0] > 0, "the removed task processed what was sent to it"
    net.pump()
    for r, cid in zip(receivers, cids, strict=True):
        assert r.inputs[cid].ended
        assert cid not in r.tracker.live
    finish(net, False)
    check_counts(sink.results(), recs, "scale-in step by step")


def test_a_removed_tasks_chained_sink_output_is_adopted(tmp_path_factory):
    """With checkpoints, what a removed task's chained sink wrote and no checkpoint
    committed is handed over to a task that stays (``remove_tasks_steps``) and committed by
    its next checkpoint: every record shows once."""
    seen = TestingSink(str(tmp_path_factory.mktemp("seen")))
    recs = records(90, 5)
    cfg = dataclasses.replace(CFG, checkpoint_interval_s=3600.0,
                              checkpoint_dir=str(tmp_path_factory.mktemp("ckpt")))
    j = StreamJob("chained-sink", num_key_groups=N, config=cfg)
    (j.source(TestingSource(recs), name="src", parallelism=1)
        .map(lambda r: r, name="map", parallelism=3).sink(seen, name="seen"))
    net = DNet(j, ManualClock())
    assert [op.name for op in net.plan.vertex("map").operators] == ["map", "seen"]
    rng = random.Random(5)
    checkpoints = harness.Checkpoints(net, cfg.checkpoint_dir, lambda: progress(net, rng, False))
    for _ in range(6):
        progress(net, rng, False)
    checkpoints.take()
    for _ in range(6):
        progress(net, rng, False)
    gone = [net.cores[n] for n in net.dep.tasks["map"][1:]]
    assert any(c.records_in for c in gone), "the removed tasks wrote something"
    harness.rescale(net, RescaleRequest("map", 1, "drrs"), lambda: progress(net, rng, False),
                    after_send=lambda cmd: settle(net, cmd))
    assert net.cores[net.dep.tasks["map"][0]].checkpoints._adopted, "the transactions were adopted"
    finish(net, False)
    checkpoints.take()  # the final checkpoint commits the rest
    assert sorted(seen.results()) == sorted(recs)


CHANGING = (AddInputs, AddOutputChannels, RemoveOutputChannels, StopTask)


def test_no_checkpoint_may_start_while_tasks_are_added_or_removed(tmp_path):
    """Every call that changes the dataflow runs in a phase that is not quiet for
    checkpoints (``DataflowChanges``), and the first of each change is one the executor
    gates on a pending checkpoint."""
    sink = TestingSink(str(tmp_path / "out"))
    net = DNet(counting_job(records(100, 6), sink, 2), ManualClock())
    rng = random.Random(6)
    for p in (4, 1):
        ctx = RescaleContext("j", net.dep, net.config, net.ids, SubscaleIds())
        coord = coordinator_for(RescaleRequest("map", p, "drrs"), ctx, net.clock)
        assert isinstance(coord, StatelessRescale)
        ex = harness.InProcessExecutor(net, lambda: progress(net, rng, False))
        seen: list[bool] = []

        def watch(cmd: SendControl, coord: Any = coord, ex: Any = ex,
                  seen: list[bool] = seen) -> None:
            if any(isinstance(c.message, CHANGING) for c in cmd.calls):
                seen.append(ex.changes.quiet(coord.phase))
            settle(net, cmd)

        ex.after_send = watch
        gated: list[str] = []
        ex.before_change = lambda gated=gated, coord=coord: gated.append(str(coord.phase))
        ex.run(coord)
        assert seen and not any(seen)
        assert gated, "the executor gates the first change on checkpoints"
        assert ex.changes.quiet(coord.phase)


def test_stop_restart_stays_available_for_a_stateless_operator(tmp_path):
    sink = TestingSink(str(tmp_path / "out"))
    recs = records(150, 7)
    net = DNet(counting_job(recs, sink, 2), ManualClock())
    rng = random.Random(7)
    for _ in range(8):
        progress(net, rng, False)
    coord, report, _ = harness.rescale(net, RescaleRequest("map", 3, "stop-restart"),
                                       lambda: progress(net, rng, False),
                                       after_send=lambda cmd: settle(net, cmd))
    assert isinstance(coord, StopRestartRescale)
    assert report.protocol == "stop-restart" and len(net.dep.tasks["map"]) == 3
    finish(net, False)
    check_counts(sink.results(), recs, "stop-restart")


def test_a_stateless_rescale_is_refused_once_the_operators_input_ended(tmp_path):
    sink = TestingSink(str(tmp_path / "out"))
    net = DNet(counting_job(records(30, 8), sink, 2), ManualClock())
    finish(net, False)
    with pytest.raises(RescaleRefused, match="has ended"):
        harness.rescale(net, RescaleRequest("map", 3, "drrs"), lambda: net.pump())
    assert len(net.dep.tasks["map"]) == 2


# ---------------------------------------------------------------------- what runs


def test_protocol_used_names_what_runs():
    assert protocol_used("drrs", keyed=True, source=False) == "drrs"
    assert protocol_used("fluid", keyed=False, source=False) == LiveMechanism.STATELESS
    assert protocol_used("pause-resume", keyed=False, source=True) == LiveMechanism.HANDOVER
    for keyed in (False, True):
        for source in (False, True):
            assert protocol_used("stop-restart", keyed=keyed, source=source) == "stop-restart"
    with pytest.raises(ValueError, match="unknown protocol"):
        protocol_used("teleport", keyed=False, source=False)


def test_the_report_says_what_ran_and_what_was_asked(tmp_path):
    sink = TestingSink(str(tmp_path / "out"))
    net = DNet(counting_job(records(60, 9), sink, 2), ManualClock())
    report, _ = rescale_map(net, 3, random.Random(9), False, "pause-resume")
    assert "stateless rescale of 'map' 2 -> 3" in str(report)
    assert "asked for pause-resume" in str(report)


# ---------------------------------------------------------------------- forward edges


def forward_job() -> StreamJob:
    """stock_exchange's shape: ``match`` (keyed) feeds ``trades`` by a forward edge (equal
    parallelism, not chained: ``match`` has two consumers) and the union."""
    j = StreamJob("fwd", num_key_groups=N, parallelism=2, config=CFG)
    matched = (j.source(TestingSource([]), name="src", parallelism=1)
               .key_by(lambda r: r).reduce(lambda a, b: a, name="match"))
    bars = (matched.filter(lambda r: True, name="trades")
            .key_by(lambda r: r).reduce(lambda a, b: b, name="bars"))
    matched.union(bars).sink(TestingSink(), name="sink", parallelism=1)
    return j


def test_a_rescale_across_a_forward_edge_takes_the_partner_or_names_the_root():
    """stock_exchange's shape: ``match`` rescales with ``trades``; ``trades`` asked alone
    is refused naming the edge and the keyed root to rescale instead."""
    plan = plan_physical(forward_job().graph())
    edge = next(e for e in plan.edges if e.src == "match" and e.dst == "trades")
    assert edge.partitioning == FORWARD
    for p in (1, 3):
        assert check_forward_edges(plan, "match", p) == ("trades",)
        for protocol in ("drrs", "stop-restart", "fluid"):
            assert validate_request(plan, "match", p, protocol).parallelism == p
            with pytest.raises(RescaleRefused, match="'match' -> 'trades' is a forward edge") \
                    as exc:
                validate_request(plan, "trades", p, protocol)
            assert "rescale 'match'; its forward partner 'trades' rescales with it" in str(
                exc.value)
    for vertex in ("match", "trades"):  # a rebalance at the same parallelism is fine
        assert check_forward_edges(plan, vertex, 2) == ()
    req = validate_request(plan, "match", None, "drrs", tuple([1] * N))
    assert req.parallelism == 2 and req.assignment == tuple([1] * N)
    assert validate_request(plan, "bars", 3, "drrs").parallelism == 3  # a keyed edge: fine


def test_rescaled_raises_instead_of_turning_a_forward_edge_into_rebalance():
    plan = plan_physical(forward_job().graph())
    with pytest.raises(RescaleRefused, match="'match' -> 'trades' is a forward edge"):
        plan.rescaled("trades", 3)
    with pytest.raises(RescaleRefused, match="forward edge"):
        plan.with_parallelism({"match": 3})
    both = plan.with_parallelism({"match": 3, "trades": 3})  # both sides together: still forward
    assert {(e.src, e.dst): e.partitioning for e in both.edges}[("match", "trades")] == FORWARD
    assert plan.rescaled("bars", 4).vertex("bars").parallelism == 4


def test_a_stateless_operator_on_rebalance_edges_passes_validation():
    plan = plan_physical(counting_job([], TestingSink(), 2).graph())
    assert {(e.src, e.dst): e.partitioning for e in plan.edges}[("src", "map")] == REBALANCE
    req = validate_request(plan, "map", 4, "drrs")
    assert req.protocol == "drrs"  # never silently changed: what runs is protocol_used
    with pytest.raises(RescaleRefused, match="not keyed"):
        validate_request(plan, "map", 2, "drrs", tuple([0] * N))
    with pytest.raises(RescaleRefused, match="no operator 'nope'"):
        validate_request(plan, "nope", 2, "drrs")
    with pytest.raises(RescaleRefused, match="chained behind 'sum'"):
        validate_request(plan, "out", 2, "drrs")
    with pytest.raises(RescaleRefused, match="live rescaling"):
        validate_request(plan, "map", 3, "drrs", live_rescaling=False)


def test_a_deployment_never_converts_a_forward_edge():
    from engine.dataflow.deployment import initial_deployment

    dep = initial_deployment(plan_physical(forward_job().graph()), "j")
    with pytest.raises(RescaleRefused, match="forward edge"):
        dep.with_vertex("trades", ("a", "b", "c"))
