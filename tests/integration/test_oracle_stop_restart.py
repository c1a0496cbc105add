"""The correctness oracle (DESIGN.md §10) for stop-restart rescaling, property-tested.

Random jobs (running sum, multi-state keyed process) and random sequences of scale-out and
scale-in at random moments: per key, the outputs equal the run without rescaling, and the
final state equals the reference. Hypothesis prints the falsifying plan and its seed
(``print_blob``); set REFLOW_ORACLE_EXAMPLES to run more examples (the slow variant).
"""

from __future__ import annotations

import os
import random
import time

import pytest
from hypothesis import HealthCheck, given, note, seed, settings
from hypothesis import strategies as st

from engine.testing import TestingSink
from tests.jobs import (
    per_key,
    profile_job,
    profile_reference,
    running_sum_job,
    running_sum_reference,
)

pytestmark = pytest.mark.ray

EXAMPLES = int(os.environ.get("REFLOW_ORACLE_EXAMPLES", "3"))

plans = st.lists(
    st.tuples(st.floats(min_value=0.05, max_value=0.8), st.integers(min_value=1, max_value=6)),
    min_size=1, max_size=3,
)


def _run(kind: str, records: list[tuple[int, int]], start_p: int, plan: list[tuple[float, int]]):
    sink = TestingSink()
    rate = 2500.0
    make = running_sum_job if kind == "sum" else profile_job
    op = "sum" if kind == "sum" else "profile"
    handle = make(records, start_p, sink, rate=rate).run()
    reports = []
    for delay, p in plan:
        time.sleep(delay)
        if handle.status().state != "running":
            break
        reports.append(handle.rescale(op, p, protocol="stop-restart"))
    handle.wait(180)
    return sink.results(), reports


@seed(20261122)
@settings(max_examples=EXAMPLES, deadline=None, print_blob=True,
          suppress_health_check=list(HealthCheck))
@given(kind=st.sampled_from(["sum", "profile"]), start_p=st.integers(1, 4), plan=plans,
       data_seed=st.integers(0, 2**16))
def test_stop_restart_matches_no_rescale_run(ray_cluster, kind, start_p, plan, data_seed):
    rng = random.Random(data_seed)
    records = [(rng.randrange(50), rng.randrange(100)) for _ in range(4000)]
    note(f"kind={kind} start_p={start_p} plan={plan} data_seed={data_seed}")
    results, reports = _run(kind, records, start_p, plan)
    reference = running_sum_reference(records) if kind == "sum" else profile_reference(records)
    got, want = per_key(results), per_key(reference)
    assert set(got) == set(want), "keys differ"
    for k in want:
        assert got[k] == want[k], f"key {k}: outputs differ after rescales {reports}"
    # final state: the last output of each key is its final aggregate
    assert {k: v[-1] for k, v in got.items()} == {k: v[-1] for k, v in want.items()}
