"""The correctness oracle (DESIGN.md §10) for DRRS live rescaling, property-tested.

Hypothesis draws the job (running sum, multi-state keyed process, event-time sliding
windows, processing-time windows), the start parallelism and a sequence of actions —
scale-out, scale-in, a random rebalance, and a request that supersedes one still running —
each at a random moment, with parallelism up to 12. Per key the outputs equal the run
without rescaling; the final state equals the reference; every record is accounted for.
Hypothesis prints the falsifying example and a reproduction blob; REFLOW_ORACLE_EXAMPLES
runs more examples (the slow variant runs 25).
"""

from __future__ import annotations

import os
import random
import threading
import time

import pytest
from hypothesis import HealthCheck, given, note, seed, settings
from hypothesis import strategies as st

from engine.errors import RescaleRefused
from engine.testing import TestingSink
from tests.jobs import (
    disordered,
    per_key,
    processing_window_job,
    profile_job,
    profile_reference,
    running_sum_job,
    running_sum_reference,
    sliding_sums_reference,
    windowed_sum_job,
)

pytestmark = pytest.mark.ray

EXAMPLES = int(os.environ.get("REFLOW_ORACLE_EXAMPLES", "5"))
KEY_GROUPS = 32

rescales = st.tuples(st.just("rescale"), st.floats(0.05, 0.6), st.integers(1, 12))
rebalances = st.tuples(st.just("rebalance"), st.floats(0.05, 0.6), st.integers(1, 6))
supersedes = st.tuples(st.just("supersede"), st.floats(0.05, 0.6), st.integers(1, 12))
action = st.one_of(rescales, rebalances)
# Superseding requests: a rare hang remains (a subscale after superseded requests on the
# event-time window job never started; see the open DRRS issue), so CI runs them only in
# the slow variant.
any_action = st.one_of(rescales, rebalances, supersedes)


def _act(handle, op: str, kind: str, arg: int, rng: random.Random) -> list:
    """Carry out one action; returns the reports (a refused request returns none)."""
    try:
        if kind == "rescale":
            return [handle.rescale(op, arg)]
        if kind == "rebalance":
            assignment = [rng.randrange(arg) for _ in range(KEY_GROUPS)]
            assignment[rng.randrange(KEY_GROUPS)] = arg - 1  # parallelism = arg
            return [handle.rebalance(op, assignment)]
        # supersede: a second request while the first is running
        reports: list = []
        first = threading.Thread(target=lambda: reports.append(handle.rescale(op, arg)))
        first.start()
        time.sleep(0.05)
        reports.append(handle.rescale(op, max(1, 12 - arg)))
        first.join()
        return reports
    except RescaleRefused as exc:  # the job may be finishing: that is a valid refusal
        assert "finishing" in str(exc) or "not running" in str(exc), exc
        return []


def _drive(handle, op: str, actions, rng: random.Random) -> list:
    reports = []
    for kind, delay, arg in actions:
        time.sleep(delay)
        if handle.status().state != "running":
            break
        reports += _act(handle, op, kind, arg, rng)
    return reports


@seed(20261123)
@settings(max_examples=EXAMPLES, deadline=None, print_blob=True,
          suppress_health_check=list(HealthCheck))
@given(kind=st.sampled_from(["sum", "profile", "window", "ptwindow"]),
       start_p=st.integers(1, 4), actions=st.lists(action, min_size=1, max_size=3),
       data_seed=st.integers(0, 2**16))
def test_drrs_matches_no_rescale_run(ray_cluster, kind, start_p, actions, data_seed):
    _check(kind, start_p, actions, data_seed)


@pytest.mark.slow
@settings(max_examples=max(EXAMPLES, 25), deadline=None, print_blob=True,
          suppress_health_check=list(HealthCheck))
@given(kind=st.sampled_from(["sum", "profile", "window", "ptwindow"]),
       start_p=st.integers(1, 4), actions=st.lists(any_action, min_size=1, max_size=3),
       data_seed=st.integers(0, 2**16))
def test_drrs_with_superseding_requests(ray_cluster, kind, start_p, actions, data_seed):
    _check(kind, start_p, actions, data_seed)


def _check(kind, start_p, actions, data_seed):
    note(f"kind={kind} start_p={start_p} actions={actions} data_seed={data_seed}")
    rng = random.Random(data_seed)
    sink = TestingSink()
    if kind == "window":
        records = disordered(12000, data_seed)
        handle = windowed_sum_job(records, start_p, sink, rate=2000).run()
        op = "win"
    else:
        records = [(rng.randrange(60), rng.randrange(100)) for _ in range(12000)]
        make, op = {"sum": (running_sum_job, "sum"), "profile": (profile_job, "profile"),
                    "ptwindow": (processing_window_job, "ptwin")}[kind]
        handle = make(records, start_p, sink, rate=2000).run()
    reports = _drive(handle, op, actions, rng)
    handle.wait(240)
    results = sink.results()
    note(f"reports={[(r.old_parallelism, r.new_parallelism, r.key_groups_moved) for r in reports]}")

    if kind == "window":
        got: dict = {}
        for k, s, e, v in results:
            assert (k, s, e) not in got, f"window {(k, s, e)} fired twice"
            got[(k, s, e)] = v
        assert got == sliding_sums_reference(records)
        return
    if kind == "ptwindow":
        seen = set()
        counts: dict = {}
        for k, start, n in results:
            assert (k, start) not in seen, f"processing-time window {(k, start)} fired twice"
            seen.add((k, start))
            counts[k] = counts.get(k, 0) + n
        expected: dict = {}
        for k, _ in records:
            expected[k] = expected.get(k, 0) + 1
        assert counts == expected  # every record counted exactly once
        return
    reference = running_sum_reference(records) if kind == "sum" else profile_reference(records)
    got_k, want_k = per_key(results), per_key(reference)
    assert set(got_k) == set(want_k)
    for k in want_k:
        assert got_k[k] == want_k[k], f"key {k}: outputs differ"
    assert {k: v[-1] for k, v in got_k.items()} == {k: v[-1] for k, v in want_k.items()}
