"""Controllers on real Ray: an autoscaled job under the oracle, bad controllers, the
decisions' log and counters.

The source's rate steps on events (``tests.jobs.SteppedSource``: a gate per step): the
test raises the rate, waits until the controller has carried out a scale-up, lowers it,
waits for a scale-down, then lets the input end; no step waits on wall time. Per key the
outputs must equal the reference; a run in which the controller scaled neither up nor
down fails.
"""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controllers.base import Controller, NoChange, Scale
from controllers.cost_aware import CostAwareDS2
from controllers.ds2 import DS2
from engine.dataflow.config import JobConfig
from engine.errors import ControllerError
from engine.io.testing import SourceGate, TestingSink
from tests.jobs import (
    SteppedSource,
    per_key,
    running_sum_job,
    service_sum_job,
    stepped_reference,
    wait_until,
)

pytestmark = pytest.mark.ray

FAST = JobConfig(batch_size=50, linger_ms=2, metrics_port=None, metrics_poll_interval_s=0.25)
SERVICE_US = 2_000  # 500 records/s per task of ``sum``


def wait_for_decision(handle: Any, direction: str, policy: str) -> None:
    """Until the controller carried out a scale ``direction``; a failure lists its last
    decisions (what it saw and why it did not act)."""
    try:
        wait_until(lambda: executed(handle, direction), f"{policy} to scale {direction}", handle)
    except AssertionError as exc:
        last = "\n".join(map(str, handle.decisions()[-15:])) if \
            handle.status().state == "running" else "(job ended)"
        raise AssertionError(f"{exc}; its last decisions:\n{last}") from None


def executed(handle: Any, direction: str) -> list[Any]:
    """Scale decisions carried out, ``direction`` "up" or "down" (DS2's reasons say which)."""
    return [d for d in handle.decisions() if d.kind == "scale" and d.outcome == "executed"
            and f": {direction} " in d.reason]


@pytest.mark.parametrize("policy", ["ds2", pytest.param("cost-aware", marks=pytest.mark.slow)])
def test_an_autoscaled_job_matches_the_run_without_rescaling(ray_cluster, policy):
    up, down, end = SourceGate(0), SourceGate(0), SourceGate(0)
    source = SteppedSource([100, 900, 100, 100], [up, down, end], tail=300)
    knobs: dict[str, Any] = dict(interval_s=0.5, window_s=2.0, min_window_s=1.0,
                                 stabilisation_s=1.0, scale_down_delay_s=1.0,
                                 max_parallelism=4)
    # the cost-aware policy weighs what the machine's load makes a migration cost; here it
    # must act both ways, so no pay-off is asked of a scale-down
    ctl = DS2(**knobs) if policy == "ds2" else CostAwareDS2(payback=0, catch_up_s=300, **knobs)
    sink = TestingSink()
    handle = service_sum_job(source, sink, SERVICE_US, FAST).run(controllers=[ctl])
    try:
        up.open()  # 100 -> 900 records/s: one task serves 500
        wait_for_decision(handle, "up", policy)
        down.open()  # back to 100 records/s
        wait_for_decision(handle, "down", policy)
        end.open()
        decisions = handle.decisions()
        wait_until(lambda: handle.rescale_history(), "the rescales' costs", handle)
        history = handle.rescale_history()
        handle.wait(180)
    finally:
        for g in (up, down, end):
            g.open()
        handle.stop()
    print(f"{policy} decisions:\n" + "\n".join(map(str, decisions)))
    ups = [d for d in decisions if d.outcome == "executed" and ": up " in d.reason]
    downs = [d for d in decisions if d.outcome == "executed" and ": down " in d.reason]
    assert ups and downs, "the controller did not rescale both ways: nothing was tested"
    assert all(d.controller == ctl.name for d in decisions)
    assert not [d for d in decisions if d.outcome in ("error", "failed")], decisions
    print("\n".join(map(repr, history)))
    assert history[0].by == f"controller {ctl.name}" and history[0].input_rate > 0
    results = sink.results()
    want = stepped_reference(len(results))
    got_k, want_k = per_key(results), per_key(want)
    assert set(got_k) == set(want_k)
    for k in want_k:
        assert got_k[k] == want_k[k], f"key {k}: outputs differ"


class Unruly(Controller):
    """Raises, then returns junk, then asks for the impossible, then for one real rescale
    (its target planned by ssm from the tasks' loads when it runs)."""

    interval_s = 0.2
    window_s = 1.0

    def __init__(self) -> None:
        self.calls = 0

    def decide(self, metrics, view):
        self.calls += 1
        step = self.calls
        if step == 1:
            raise RuntimeError("a bug in the policy")
        if step == 2:
            return "scale up please"
        if step == 3:
            return [Scale("nope", 2, reason="no such operator"),
                    Scale("sum", 999, reason="beyond the key groups")]
        if step == 4:
            return Scale("sum", 2, assignment="ssm", balance=1.0, reason="a real one")
        return NoChange("done")


def test_a_bad_controller_is_recorded_and_the_job_runs_on(ray_cluster):
    records = [(i % 7, 1) for i in range(6_000)]
    hold = SourceGate(3_000)
    sink = TestingSink()
    config = JobConfig(batch_size=50, linger_ms=2, metrics_poll_interval_s=0.25)
    job = running_sum_job(records, 1, sink, rate=2_000, config=config, gates=[hold])
    handle = job.run(controllers=[Unruly()])
    try:
        wait_until(lambda: any(d.outcome == "executed" for d in handle.decisions()),
                   "the real rescale", handle)
        with pytest.raises(ControllerError, match="runs already"):
            handle.add_controller(Unruly())
        handle.remove_controller("Unruly")
        with pytest.raises(ControllerError, match="no controller named"):
            handle.remove_controller("Unruly")
        decisions = handle.decisions()
        text = urllib.request.urlopen(handle.metrics_url, timeout=10).read().decode()
        hold.open()
        handle.wait(120)
    finally:
        hold.open()
        handle.stop()
    print("\n".join(map(str, decisions)))
    kinds = [(d.kind, d.outcome) for d in decisions]
    assert kinds[:2] == [("invalid", "error"), ("invalid", "error")]
    assert "decide raised RuntimeError: a bug in the policy" in decisions[0].detail
    assert "not a decision" in decisions[1].detail
    refused = {d.operator: d.detail for d in decisions if d.outcome == "refused"}
    assert "no operator 'nope'" in refused["nope"]
    assert "exceeds the number of key groups" in refused["sum"]
    assert ("scale", "executed") in kinds
    [real] = [d for d in decisions if d.outcome == "executed"]
    assert "assignment ssm" in real.decision and "ssm assignment predicted" in real.detail
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    counted = {(s.labels["kind"], s.labels["outcome"]): s.value
               for s in fams["reflow_controller_decisions"].samples
               if s.name.endswith("_total")}
    assert counted[("invalid", "error")] == 2
    assert counted[("scale", "refused")] == 2
    assert counted[("scale", "executed")] == 1
    assert "reflow_useful_seconds" in fams
    got = per_key(sink.results())
    assert {k: v[-1][1] for k, v in got.items()} == {k: records.count((k, 1)) for k in range(7)}


def test_job_run_refuses_what_is_no_controller_before_deploying(ray_cluster):
    job = running_sum_job([(1, 1)], 1, TestingSink(), config=FAST)
    with pytest.raises(ControllerError, match="no decide"):
        job.run(controllers=[object()])
    with pytest.raises(ControllerError, match="runs already"):
        job.run(controllers=[DS2(), DS2()])
