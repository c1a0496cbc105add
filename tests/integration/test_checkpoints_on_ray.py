"""Checkpoints, recovery and savepoints on a real local Ray cluster.

The oracle with faults (docs/architecture.md): hypothesis draws a job, a live protocol and a
sequence of actions at moments of the input (``tests.jobs.Moment``): rescales, kills of a
random task actor, kills in the middle of a running rescale (its subscales). After every
recovery the exactly-once sink's committed output (``engine.io.testing.TestingSink``) equals
the run without failure per key: nothing lost, nothing twice. An example in which no task
was killed fails. Around it: savepoints restored at another parallelism, torn and foreign
checkpoints, an unwritable store, a bounded source beside an unbounded one (FLIP-147), and
a lost JobMaster resumed from its checkpoints.

Every wait acts on an event (a gate reached, a status), with generous timeouts.
"""

from __future__ import annotations

import os
import random
import tempfile
import threading
from typing import Any

import pytest
import ray
from hypothesis import HealthCheck, Phase, example, given, note, seed, settings
from hypothesis import strategies as st

from engine import JobConfig, StreamJob
from engine.errors import CheckpointFailed, JobFailedError, JobMasterFailedOver, RestoreError
from engine.io.sinks import Sink, SinkWriter
from engine.io.testing import SourceGate, TestingSink, TestingSource
from tests.jobs import (
    Moment,
    columnar_agg_job,
    columnar_agg_reference,
    columnar_agg_rows,
    columnar_window_job,
    columnar_window_reference,
    columnar_window_rows,
    disordered,
    moments,
    per_key,
    profile_job,
    profile_reference,
    running_sum_job,
    running_sum_reference,
    task_actors,
    wait_until,
)

pytestmark = pytest.mark.ray

EXAMPLES = int(os.environ.get("REFLOW_ORACLE_EXAMPLES", "1"))
LIVE_PROTOCOLS = ["drrs", "pause-resume", "fluid", "batched", "non-disruptive", "meces"]
RECORDS = 6000  # at 2,000 records/s: a 3 s job, longer with restarts
MARGIN = 600


def checkpointed(root: str, **extra: Any) -> JobConfig:
    fields = dict(batch_size=50, linger_ms=2, metrics_port=None, checkpoint_interval_s=0.3,
                  checkpoint_dir=root, restart_delay_s=0.1, restart_attempts=10)
    fields.update(extra)
    return JobConfig(**fields)


def kill(name: str) -> None:
    ray.kill(ray.get_actor(name, namespace="reflow"))


# ------------------------------------------------------------------ the oracle with faults

actions_st = st.lists(st.one_of(
    st.tuples(st.just("rescale"), st.floats(0.05, 0.25), st.integers(1, 6)),
    st.tuples(st.just("kill"), st.floats(0.05, 0.25), st.sampled_from(["src", "sum"])),
    st.tuples(st.just("kill-mid-rescale"), st.floats(0.05, 0.25), st.integers(1, 6)),
), min_size=1, max_size=3)

# the JobMaster's faults (a detached job: Ray restarts it and it takes the job over)
MASTER_FAULTS = ("master", "master-mid-rescale", "master-mid-checkpoint")
master_actions_st = st.lists(st.one_of(
    st.tuples(st.just("master"), st.floats(0.05, 0.25), st.just(0)),
    st.tuples(st.just("master-mid-rescale"), st.floats(0.05, 0.25), st.integers(1, 6)),
    st.tuples(st.just("master-mid-checkpoint"), st.floats(0.05, 0.25), st.just(0)),
    st.tuples(st.just("kill"), st.floats(0.05, 0.25), st.sampled_from(["src", "sum"])),
    st.tuples(st.just("rescale"), st.floats(0.05, 0.25), st.integers(1, 6)),
), min_size=1, max_size=3)


def _check(kind: str, protocol: str, start_p: int, actions: list, data_seed: int,
           hypothesis_seed: int) -> None:
    example_ = (f"protocol={protocol} hypothesis seed={hypothesis_seed} kind={kind} "
                f"start_p={start_p} actions={actions} data_seed={data_seed}")
    note(example_)
    print(f"oracle with faults: {example_}")
    rng = random.Random(data_seed)
    records: list[Any] = (disordered(RECORDS, data_seed) if kind == "cwindow" else
                          [(rng.randrange(50), rng.randrange(100)) for _ in range(RECORDS)])
    plan = moments(RECORDS, [f for _, f, _ in actions], MARGIN)
    gates = [g for m in plan for g in m.gates]
    sink = TestingSink()
    cfg = checkpointed(tempfile.mkdtemp(prefix="reflow-ckpt-"))
    make, op = {"sum": (running_sum_job, "sum"), "profile": (profile_job, "profile"),
                "cwindow": (columnar_window_job, "cwin"),
                "columnar": (columnar_agg_job, "agg")}[kind]
    detached = any(a[0] in MASTER_FAULTS for a in actions)
    handle = make(records, start_p, sink, rate=2000, gates=gates,
                  config=cfg).run(detached=detached)
    kills, reports, takeovers = 0, [], 0
    try:
        for (what, _, arg), moment in zip(actions, plan, strict=True):
            moment.wait(handle)
            # a checkpoint before the action, so that a kill goes back to one taken meanwhile
            done = handle.status().checkpoints.completed
            wait_until(lambda d=done: handle.status().checkpoints.completed > d,
                       "a checkpoint", handle)
            moment.start.open()
            try:
                if what == "rescale":
                    reports.append(handle.rescale(op, arg, protocol))
                elif what == "kill":
                    victims = task_actors(handle, arg if arg == "src" else op)
                    kill(rng.choice(victims))
                    kills += 1
                    restarts = kills
                    wait_until(lambda r=restarts: handle.status().restarts >= r,
                               "the restart", handle)
                elif what in MASTER_FAULTS:
                    takeovers += 1
                    reports.append(_crash_master(handle, what, op, arg, protocol, takeovers))
                    kills = max(kills, handle.status().restarts)
                else:
                    kills += 1
                    reports.append(_kill_during_rescale(handle, op, arg, protocol, rng, kills))
            finally:
                moment.end.open()
        st_ = handle.wait(240)
    finally:
        for m in plan:
            m.release()
        handle.stop()
    note(f"restarts={st_.restarts} checkpoints={st_.checkpoints} "
         f"JobMaster epoch={st_.master_epoch} last failure: {st_.last_failure}")
    if takeovers:
        assert st_.master_epoch == takeovers + 1, f"{takeovers} JobMaster crashes but epoch " \
            f"{st_.master_epoch}; {example_}"
    if kills:
        assert st_.restarts >= kills, f"{kills} kills but {st_.restarts} restarts; {example_}"
    elif not takeovers:
        assert reports, f"neither a fault nor a rescale: nothing was tested; {example_}"
    results = sink.results()
    if kind == "cwindow":  # each window fires once, per key in the order of their ends
        results = columnar_window_rows(results)
        reference = columnar_window_reference(records)
    elif kind == "columnar":
        results = columnar_agg_rows(results)
        reference = columnar_agg_reference(records)
    else:
        reference = (running_sum_reference if kind == "sum" else profile_reference)(records)
    got, want = per_key(results), per_key(reference)
    assert set(got) == set(want), example_
    for k in want:
        assert got[k] == want[k], f"key {k}: outputs differ; {example_}"


def _kill_during_rescale(handle: Any, op: str, parallelism: int, protocol: str,
                         rng: random.Random, kills: int) -> Any:
    """Start a rescale, kill a task of ``op`` once it runs (tasks deployed or subscales
    running), and return the rescale's report: it runs again after the restart."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(handle.rescale(op, parallelism, protocol)))
    t.start()
    wait_until(lambda: not t.is_alive() or any(r.operator == op and r.running
                                               for r in handle.metrics().rescales),
               f"the rescale of {op!r} to run", handle)
    victims = task_actors(handle, op)
    if victims:
        kill(rng.choice(victims))
    else:  # the rescale was between generations: the source then
        kill(task_actors(handle, "src")[0])
    wait_until(lambda: handle.status().restarts >= kills, "the restart", handle)
    t.join(300)
    assert not t.is_alive() and out, "the rescale did not come back after the restart"
    return out[0]


def _crash_master(handle: Any, what: str, op: str, parallelism: int, protocol: str,
                  takeovers: int) -> Any:
    """Kill the JobMaster's process (Ray restarts it: a crash, not a stop) alone, during a
    rescale of ``op`` to ``parallelism`` or during a savepoint, and wait for the takeover
    (the JobMaster's epoch is ``takeovers + 1``). Returns the rescale's report or the
    error the interrupted call raised (``JobMasterFailedOver``), or None."""
    out: list[Any] = []

    def call(f: Any) -> None:
        try:
            out.append(f())
        except JobMasterFailedOver as exc:  # the call's JobMaster died under it
            out.append(exc)

    t, restarts = None, handle.status().restarts
    if what == "master-mid-rescale":
        t = threading.Thread(target=call, args=(lambda: handle.rescale(op, parallelism,
                                                                       protocol),))
        t.start()
        wait_until(lambda: not t.is_alive() or any(r.operator == op and r.running
                                                   for r in handle.metrics().rescales),
                   f"the rescale of {op!r} to run", handle)
    elif what == "master-mid-checkpoint":
        t = threading.Thread(target=call, args=(lambda: handle.savepoint(),))
        t.start()
    ray.kill(handle._master, no_restart=False)
    if t is not None:
        t.join(300)
        assert not t.is_alive() and out, f"the call cut short by {what} did not return"
    epoch = takeovers + 1
    wait_until(lambda: handle.status().master_epoch == epoch
               and f"failover (epoch {epoch})" in handle.status().last_failure,
               f"the takeover after {what}", handle)
    if ": restart:" in handle.status().last_failure:  # every task from the checkpoint
        wait_until(lambda: handle.status().restarts > restarts, "the restart", handle)
    return out[0] if out else None


def _oracle(hypothesis_seed: int, examples: int):
    @example(kind="sum", protocol="drrs", start_p=2,
             actions=[("kill-mid-rescale", 0.2, 4)], data_seed=11)
    # the vectorised window aggregates (state and one timer per key group and window end;
    # allowed lateness keeps fired windows): every window fires once, with the values of
    # the run without faults, across a kill and a kill during a live rescale
    @example(kind="cwindow", protocol="drrs", start_p=2,
             actions=[("kill", 0.25, "sum"), ("kill-mid-rescale", 0.55, 3)], data_seed=4242)
    # the vectorised running aggregates (integer keys: dense state tables, restored and
    # migrated through their key groups' views): the same outputs as without faults
    @example(kind="columnar", protocol="non-disruptive", start_p=2,
             actions=[("kill", 0.2, "sum"), ("kill-mid-rescale", 0.5, 3)], data_seed=77)
    @seed(hypothesis_seed)
    @settings(max_examples=examples, deadline=None, print_blob=True,
              suppress_health_check=list(HealthCheck))
    @given(kind=st.sampled_from(["sum", "profile", "cwindow", "columnar"]),
           protocol=st.sampled_from(LIVE_PROTOCOLS),
           start_p=st.integers(1, 3), actions=actions_st, data_seed=st.integers(0, 2**16))
    def test(ray_cluster, kind, protocol, start_p, actions, data_seed):
        if not any(a[0].startswith("kill") for a in actions):
            actions = [*actions[:2], ("kill", 0.1, "sum")]  # every example has a fault
        _check(kind, protocol, start_p, actions, data_seed, hypothesis_seed)

    return test


def _master_oracle(hypothesis_seed: int, examples: int):
    # every fault of the JobMaster once, then drawn ones beside task kills and rescales
    # a reconciled JobMaster rescales with the lost one's channels; then one lost mid-rescale
    @example(kind="sum", protocol="drrs", start_p=2,
             actions=[("master", 0.15, 0), ("rescale", 0.15, 3),
                      ("master-mid-rescale", 0.15, 1)], data_seed=5)
    @example(kind="profile", protocol="fluid", start_p=1,
             actions=[("master-mid-checkpoint", 0.2, 0), ("kill", 0.3, "sum")],
             data_seed=6)
    @seed(hypothesis_seed)
    @settings(max_examples=examples, deadline=None, print_blob=True,
              suppress_health_check=list(HealthCheck))
    @given(kind=st.sampled_from(["sum", "profile"]), protocol=st.sampled_from(LIVE_PROTOCOLS),
           start_p=st.integers(1, 3), actions=master_actions_st,
           data_seed=st.integers(0, 2**16))
    def test(ray_cluster, kind, protocol, start_p, actions, data_seed):
        if not any(a[0] in MASTER_FAULTS for a in actions):
            actions = [*actions[:2], ("master", 0.1, 0)]  # every example loses its JobMaster
        _check(kind, protocol, start_p, actions, data_seed, hypothesis_seed)

    return test


test_killed_tasks_recover_exactly_during_live_rescales = _oracle(20261125, EXAMPLES)
test_killed_tasks_recover_exactly_during_live_rescales_many = pytest.mark.slow(
    _oracle(20261126, max(EXAMPLES, 15)))
test_a_lost_jobmaster_is_taken_over_exactly = _master_oracle(20261128, EXAMPLES)
test_a_lost_jobmaster_is_taken_over_exactly_many = pytest.mark.slow(
    _master_oracle(20261129, max(EXAMPLES, 10)))


# ------------------------------------------------------------------ savepoints


def test_a_savepoint_restores_exactly_at_another_parallelism(ray_cluster, tmp_path):
    records = [(i % 60, i % 9) for i in range(5000)]
    sink = TestingSink(str(tmp_path / "out"))
    gate = SourceGate(2000)
    cfg = checkpointed(str(tmp_path / "chk"))
    first = running_sum_job(records, 2, sink, rate=4000, gates=[gate], config=cfg)
    h = first.run()
    try:
        gate.wait_reached()
        plain = h.savepoint(str(tmp_path / "sp-plain"))  # the job goes on
        assert os.path.isfile(os.path.join(plain, "_metadata"))
        assert h.status().state == "running"
        gate.open()
        path = h.stop(savepoint=str(tmp_path / "sp"))
    finally:
        gate.open()
        h.stop()
    assert path == str(tmp_path / "sp") and os.path.isfile(os.path.join(path, "_metadata"))
    partial = len(sink.results())
    assert 2000 <= partial < len(records)
    # the same job at sum parallelism 3, from the savepoint: keys re-assigned by key group
    second = running_sum_job(records, 3, sink, rate=4000, config=cfg)
    h2 = second.run(restore_from=path)
    try:
        st_ = h2.wait(180)
        assert st_.checkpoints.restored_from == path
    finally:
        h2.stop()
    assert per_key(sink.results()) == per_key(running_sum_reference(records))


@pytest.mark.parametrize("restored_p", [3, 1])
def test_stop_with_savepoint_then_restore_into_another_parquet_directory(ray_cluster, tmp_path,
                                                                        restored_p):
    """Issue 32's round trip: checkpoints every 0.5 s, a savepoint mid-run, a stop with
    savepoint, then a new job at another parallelism restored from it that writes into
    another directory. The savepoint's pending output is published where it was written
    (before, the restored job's commit found no file, its tasks failed while it was being
    deployed, the failure was dropped and the job ran for ever); the rows of both runs
    together are every running sum once."""
    import glob

    import pyarrow.parquet as pq

    from engine.io.sinks import ParquetSink

    records = [(i % 50, i % 7 + 1) for i in range(6000)]
    first_out, second_out = str(tmp_path / "first"), str(tmp_path / "second")
    mid, stop = SourceGate(1500), SourceGate(3000)
    cfg = checkpointed(str(tmp_path / "chk"), checkpoint_interval_s=0.5)

    def job(p: int, out: str, gates: Any) -> StreamJob:
        return running_sum_job(records, p, ParquetSink(out, schema=["key", "total"],
                                                       rows_per_file=300),
                               rate=3000, gates=gates, config=cfg)

    h = job(2, first_out, [mid, stop]).run()
    try:
        mid.wait_reached()
        h.savepoint(str(tmp_path / "sp-mid"))
        mid.open()
        stop.wait_reached()
        path = h.stop(savepoint=str(tmp_path / "sp"))
    finally:
        mid.open()
        stop.open()
        h.stop()
    h2 = job(restored_p, second_out, None).run(restore_from=path)
    try:
        st_ = h2.wait(180)
    finally:
        h2.stop()
    assert st_.state == "finished" and st_.checkpoints.restored_from == path
    rows = []
    for f in glob.glob(f"{first_out}/*.parquet") + glob.glob(f"{second_out}/*.parquet"):
        rows += zip(*pq.read_table(f).to_pydict().values(), strict=True)
    assert glob.glob(f"{second_out}/*.parquet"), "the restored job wrote nothing"
    assert sorted(rows) == sorted(running_sum_reference(records)), "rows lost or twice"


class RefusingCommits(Sink):
    """An exactly-once sink whose every pre-commit is one transaction and whose commit
    raises when ``refuse``: a job restored with it fails as its tasks are deployed."""

    exactly_once = True

    def __init__(self, refuse: bool) -> None:
        self.refuse = refuse

    def open(self, task_index: int, parallelism: int, clock: Any) -> SinkWriter:
        return _RefusingWriter(self.refuse)


class _RefusingWriter(SinkWriter):
    def __init__(self, refuse: bool) -> None:
        self.refuse = refuse

    def write(self, values: Any, timestamps: Any) -> None:
        pass

    def pre_commit(self, checkpoint_id: int) -> Any:
        return checkpoint_id

    def commit(self, transactions: Any) -> None:
        if self.refuse and any(t is not None for t in transactions):
            raise OSError("the store refuses the restored output")


def test_a_task_that_fails_while_the_job_is_restored_fails_the_job(ray_cluster, tmp_path):
    """A task that fails while it is being deployed (here: its sink refuses to commit the
    restored savepoint's output) fails the job; the restart strategy restarts it, then
    gives up. Before, a failure reported during the deploy was dropped, and the job ran
    for ever with failed tasks."""
    records = [(i % 20, 1) for i in range(3000)]
    stop = SourceGate(1000)
    cfg = checkpointed(str(tmp_path / "chk"), restart_attempts=1)

    def job(refuse: bool, gates: Any) -> StreamJob:
        return running_sum_job(records, 2, RefusingCommits(refuse), rate=3000, gates=gates,
                               config=cfg)

    h = job(False, [stop]).run()
    try:
        stop.wait_reached()
        path = h.stop(savepoint=str(tmp_path / "sp"))
    finally:
        stop.open()
        h.stop()
    h2 = job(True, None).run(restore_from=path)
    try:
        with pytest.raises(JobFailedError, match="refuses the restored output"):
            h2.wait(120)
        assert h2.status().state == "failed"
    finally:
        h2.stop()


def test_an_at_least_once_sink_is_named_at_run_and_in_the_status(ray_cluster, tmp_path,
                                                                   caplog):
    """A job that checkpoints with a sink that cannot do two-phase commit: ``job.run()``
    logs a warning naming the sink operator and what a restart does to it, and
    ``status().sinks`` gives every sink's guarantee (the exactly-once one too)."""
    import logging

    from engine.io.sinks import LatencySink

    job = StreamJob("guarantees", config=checkpointed(str(tmp_path / "chk")))
    (job.source(TestingSource(list(range(50))), name="src")
        .map(lambda x: x, name="same", dead_letter=LatencySink())
        .sink(TestingSink(str(tmp_path / "out")), name="out"))
    with caplog.at_level(logging.WARNING, logger="engine.runtime.handle"):
        h = job.run()
    try:
        st_ = h.wait(120)
    finally:
        h.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("sink 'same' (dead_letter) (LatencySink) is at-least-once" in w
               and "writes the records after that checkpoint again" in w
               for w in warnings), warnings
    assert not any("'out'" in w for w in warnings), "the exactly-once sink was warned about"
    assert [(s.operator, s.role, s.guarantee) for s in st_.sinks] == [
        ("same", "dead_letter", "at-least-once"), ("out", "sink", "exactly-once")]


def test_a_parquet_sink_writes_every_output_once_across_a_killed_task(ray_cluster, tmp_path):
    """ParquetSink's two-phase commit on Ray: a sum task (and its sink writer, chained to
    it) is killed while records flow after a checkpoint; the files it had pending are
    dropped, the job goes back to the checkpoint, and the committed files hold every
    running sum once."""
    import pyarrow.parquet as pq

    from engine.io.sinks import ParquetSink

    records = [(i % 40, i % 7 + 1) for i in range(RECORDS)]
    out = str(tmp_path / "parquet")
    moment = Moment.at(2500, 1500, RECORDS)
    cfg = checkpointed(str(tmp_path / "chk"), checkpoint_interval_s=1.0)
    h = running_sum_job(records, 2, ParquetSink(out, schema=["key", "total"], rows_per_file=200),
                        rate=2000, gates=list(moment.gates), config=cfg).run()
    try:
        moment.wait(h)
        done = h.status().checkpoints.completed
        wait_until(lambda: h.status().checkpoints.completed > done, "a checkpoint", h)
        moment.start.open()  # records flow past the checkpoint: the kill finds them pending
        kill(task_actors(h, "sum")[0])
        wait_until(lambda: h.status().restarts >= 1, "the restart", h)
        moment.end.open()
        st_ = h.wait(240)
    finally:
        moment.release()
        h.stop()
    assert st_.restarts >= 1, "no restart: the kill tested nothing"
    got = sorted(zip(*pq.read_table(out).to_pydict().values(), strict=True))
    assert got == sorted(running_sum_reference(records)), "outputs lost or written twice"


# slow (a minute or two at load 20): run with -m slow
@pytest.mark.slow
def test_restore_from_uses_the_last_complete_checkpoint_and_refuses_bad_ones(ray_cluster,
                                                                             tmp_path):
    records = [(i % 30, 1) for i in range(4000)]
    sink = TestingSink(str(tmp_path / "out"))
    gate = SourceGate(1500)
    cfg = checkpointed(str(tmp_path / "chk"))
    h = running_sum_job(records, 2, sink, rate=4000, gates=[gate], config=cfg).run()
    try:
        gate.wait_reached()
        done = h.status().checkpoints.completed
        wait_until(lambda: h.status().checkpoints.completed >= done + 2, "two checkpoints", h)
        job_dir = os.path.dirname(h.status().checkpoints.last_path)
    finally:
        h.stop()  # uncommitted output is never visible
    from engine.checkpoints.store import complete_checkpoints

    complete = complete_checkpoints(job_dir)
    assert len(complete) >= 2
    # the newest is torn (its metadata lost): the one before it is used
    os.remove(os.path.join(complete[-1], "_metadata"))
    with pytest.raises(RestoreError, match="no complete checkpoint") as err:
        running_sum_job(records, 2, sink, config=cfg).run(restore_from=complete[-1])
    assert err.value.reason == "incomplete"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "_metadata").write_bytes(b"not a checkpoint at all")
    with pytest.raises(RestoreError, match="not a reflow checkpoint"):
        running_sum_job(records, 2, sink, config=cfg).run(restore_from=str(foreign))
    renamed = StreamJob("running-sum", num_key_groups=32, parallelism=2, config=cfg)
    (renamed.source(TestingSource(records), name="src", parallelism=1).key_by(lambda r: r[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]), name="total").sink(sink, name="out"))
    with pytest.raises(RestoreError, match="keyed state of operator 'sum'"):
        renamed.run(restore_from=job_dir)
    first = per_key(sink.results())  # what the first run committed (up to complete[-1])
    resumed = TestingSink(str(tmp_path / "out-resumed"))
    h2 = running_sum_job(records, 2, resumed, config=cfg).run(restore_from=job_dir)
    try:
        assert h2.wait(180).checkpoints.restored_from == complete[-2]
    finally:
        h2.stop()
    # Restored from the checkpoint before the newest, the job replays from that one's
    # positions: per key, it emits exactly the reference's outputs after them (a suffix, in
    # order, to the end), and, with what the first run committed, nothing is missing. (The
    # first run's commits after complete[-2] are emitted again: a sink's commits are not
    # rolled back when an older checkpoint is chosen, in Flink neither.)
    reference = per_key(running_sum_reference(records))
    again = per_key(resumed.results())
    assert set(again) == set(reference)
    for key, outputs in reference.items():
        assert again[key] == outputs[len(outputs) - len(again[key]):], key
        assert set(first.get(key, [])) | set(again[key]) == set(outputs), key


# ------------------------------------------------------------------ faults of the store


# slow (a minute or two at load 20): run with -m slow
@pytest.mark.slow
def test_an_unwritable_store_fails_checkpoints_the_job_goes_on_then_fails(ray_cluster,
                                                                         tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("checkpoints cannot go below a file")
    records = [(i % 30, 1) for i in range(3000)]
    gate = SourceGate(500)
    cfg = checkpointed(str(blocker / "chk"), tolerable_checkpoint_failures=2,
                       restart_strategy="none")
    h = running_sum_job(records, 2, TestingSink(), rate=4000, gates=[gate],
                        config=cfg).run()
    try:
        gate.wait_reached()
        wait_until(lambda: h.status().checkpoints.failed >= 1, "a failed checkpoint", h)
        st_ = h.status()
        assert st_.state == "running" and st_.checkpoints.completed == 0
        assert "could not be written" in st_.checkpoints.last_failure
        with pytest.raises(CheckpointFailed, match="could not be written"):
            h.savepoint(str(blocker / "sp"))
        with pytest.raises(JobFailedError, match="tolerable_checkpoint_failures=2"):
            h.wait(120)
    finally:
        gate.open()
        h.stop()


# ------------------------------------------------------------------ finished tasks (FLIP-147)


# slow (a minute or two at load 20): run with -m slow
@pytest.mark.slow
def test_a_job_with_a_finished_source_keeps_rescaling_and_checkpointing(ray_cluster, tmp_path):
    bounded = [(i % 20, 1) for i in range(300)]
    unbounded = [(i % 20, 2) for i in range(4000)]
    gate = SourceGate(1000)
    sink = TestingSink(str(tmp_path / "out"))
    cfg = checkpointed(str(tmp_path / "chk"))
    job = StreamJob("union", num_key_groups=32, parallelism=2, config=cfg)
    short = job.source(TestingSource(bounded), name="bounded")
    long = job.source(TestingSource(unbounded, rate=4000, gate=gate), name="unbounded")
    (short.union(long).key_by(lambda r: r[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]), name="sum").sink(sink, name="out"))
    h = job.run()
    try:
        gate.wait_reached()
        wait_until(lambda: any(t.vertex == "bounded" and t.status == "finished"
                               for t in h.metrics().tasks), "the bounded source to end", h)
        done = h.status().checkpoints.completed
        report = h.rescale("sum", 3)
        assert report.new_parallelism == 3 and not report.cut_short
        wait_until(lambda: h.status().checkpoints.completed > done + 1,
                   "checkpoints after the end of one source", h)
        gate.open()
        st_ = h.wait(180)
    finally:
        gate.open()
        h.stop()
    assert st_.state == "finished"
    totals = {k: v for k, v in running_sum_reference(bounded + unbounded)}
    got = {k: max(v for _, v in rs) for k, rs in per_key(sink.results()).items()}
    assert got == totals
    assert len(sink.results()) == len(bounded) + len(unbounded)  # nothing twice


# ------------------------------------------------------------------ a lost JobMaster


# slow (a minute or two at load 20): run with -m slow
@pytest.mark.slow
def test_a_lost_jobmaster_is_resumed_from_its_latest_checkpoint(ray_cluster, tmp_path):
    records = [(i % 40, i % 5) for i in range(5000)]
    sink = TestingSink(str(tmp_path / "out"))
    moment = Moment.at(2000, 0, len(records))
    cfg = checkpointed(str(tmp_path / "chk"))
    h = running_sum_job(records, 2, sink, rate=4000, gates=moment.gates, config=cfg).run()
    try:
        moment.wait(h)
        done = h.status().checkpoints.completed
        wait_until(lambda: h.status().checkpoints.completed > done, "a checkpoint", h)
        ray.kill(h._master)  # its task actors go with it (Ray fate-shares them)
    finally:
        moment.release()
    job_dir = os.path.join(str(tmp_path / "chk"), h.job_id)
    h2 = running_sum_job(records, 2, sink, rate=4000, config=cfg).run(restore_from=job_dir)
    try:
        assert h2.wait(180).state == "finished"
    finally:
        h2.stop()
    assert per_key(sink.results()) == per_key(running_sum_reference(records))


def test_a_corrupt_latest_checkpoint_falls_back_to_the_newest_readable_one(ray_cluster,
                                                                         tmp_path):
    """Issue 32 item 3: bytes flipped in a part file of the latest complete checkpoint, then
    a task killed: recovery tries that checkpoint, finds a group that does not read back
    whole, and restores from the newest older retained one instead (saying so in the
    status); the output is exact. Before, every restart attempt used the corrupt one."""
    import glob

    records = [(i % 30, i % 5 + 1) for i in range(4000)]
    sink = TestingSink(str(tmp_path / "out"))
    moment = Moment.at(1500, 1000, len(records))
    # 3 s between checkpoints: the corruption and the kill happen right after one completed,
    # before the next can replace it as the latest
    cfg = checkpointed(str(tmp_path / "chk"), checkpoint_interval_s=3.0, checkpoints_retained=5)
    h = running_sum_job(records, 2, sink, rate=2000, gates=list(moment.gates),
                        config=cfg).run()
    try:
        moment.wait(h)
        done = h.status().checkpoints.completed
        wait_until(lambda: h.status().checkpoints.completed >= done + 2, "two checkpoints", h)
        latest = h.status().checkpoints.last_path
        parts = sorted(glob.glob(os.path.join(latest, "*.state")))
        assert parts, f"no part files in {latest}"
        with open(parts[-1], "r+b") as f:  # flip the bytes of the part that has state
            data = bytearray(f.read())
            for i in range(len(data)):
                data[i] ^= 0xFF
            f.seek(0)
            f.write(data)
        kill(task_actors(h, "sum")[0])
        wait_until(lambda: h.status().restarts >= 1, "the restart", h)
        moment.start.open()
        moment.end.open()
        st_ = h.wait(180)
    finally:
        moment.release()
        h.stop()
    assert st_.state == "finished" and st_.restarts >= 1
    assert "did not read back whole" in st_.last_failure, st_.last_failure
    assert per_key(sink.results()) == per_key(running_sum_reference(records))


# ------------------------------------------------------------------ incremental checkpoints


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@example(kind="sum", protocol="drrs", start_p=2,
         actions=[("kill", 0.2, "sum"), ("kill-mid-rescale", 0.5, 3)], data_seed=11)
# the vectorised window aggregates: their tables and timers are in the deltas too
@example(kind="cwindow", protocol="drrs", start_p=2,
         actions=[("kill", 0.25, "sum"), ("kill-mid-rescale", 0.55, 3)], data_seed=4242)
@settings(phases=[Phase.explicit], deadline=None, print_blob=True,
          suppress_health_check=list(HealthCheck))
@given(kind=st.just("sum"), protocol=st.sampled_from(LIVE_PROTOCOLS), start_p=st.just(2),
       actions=actions_st, data_seed=st.integers(0, 2**16))
def test_the_oracle_with_incremental_checkpoints_is_exact_on_both_backends(
        ray_cluster, tmp_path, backend, kind, protocol, start_p, actions, data_seed):
    """The oracle with faults (a kill, then a kill during a live rescale) on a job whose
    checkpoints are incremental (``JobConfig.incremental_checkpoints``): the restores read
    key groups as chains of a full blob and deltas written by several checkpoints (memory)
    or out of the DB's SST files, some written by earlier checkpoints (RocksDB), and the
    output is the run's without faults. The retained checkpoints must hold such chains or
    shared files (else the example proved nothing about them), and every file they refer
    to exists.
    With local recovery on: the restarted tasks read their chains' links from the node's
    copies (``engine.checkpoints.local``) where they have them, the store for the rest."""
    import sys
    from unittest import mock

    from engine.checkpoints.shared import files_of
    from engine.checkpoints.store import complete_checkpoints, read_metadata

    roots: list[str] = []
    plain = checkpointed

    def incremental(root: str, **extra: Any) -> JobConfig:
        roots.append(root)
        return plain(root, incremental_checkpoints=True, state_backend=backend,
                     state_dir=str(tmp_path / "state"), local_recovery=True, **extra)

    with mock.patch.object(sys.modules[__name__], "checkpointed", incremental):
        _check(kind, protocol, start_p, actions, data_seed, 0)
    root = roots[-1]
    metas = [read_metadata(loc) for job in os.listdir(root)
             for loc in complete_checkpoints(os.path.join(root, job))]
    assert metas, f"no checkpoint retained under {root}"
    if backend == "rocksdb":  # SST-level: files shared with an earlier checkpoint
        shared = [f for m in metas for t in m.tasks for f, _ in t.db_files
                  if f.startswith("../")]
        assert shared, "no retained checkpoint names an SST file of an earlier one"
    else:
        chains = [len(links) for m in metas for t in m.tasks for _, links in t.chains]
        assert any(n >= 2 for n in chains), (
            f"no retained checkpoint holds a delta chain ({backend}): {chains}")
    for m in metas:
        missing = [f for f in files_of(m) if not os.path.exists(f)]
        assert not missing, f"{m.location} refers to deleted files {missing}"
