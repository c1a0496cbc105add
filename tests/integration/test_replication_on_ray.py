"""Replication (Spacker) and per-subscale metrics on a real local Ray cluster, checked
through the job's Prometheus endpoint."""

from __future__ import annotations

import random
import threading
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine import JobConfig
from engine.dataflow.keygroups import key_group_of, uniform_assignment
from engine.errors import RescaleRefused
from engine.io.testing import TestingSink
from migration.coordinator import Phase
from migration.protocols.drrs import plan_subscales
from tests.jobs import (
    Moment,
    check_reports,
    per_key,
    running_sum_job,
    running_sum_reference,
    wait_until,
)

pytestmark = pytest.mark.ray


def _samples(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + "".join(f"[{k}={v}]" for k, v in sorted(s.labels.items())
                                   if k in ("operator", "le"))
            out[key] = out.get(key, 0.0) + s.value
    return out


def test_replicas_are_refreshed_and_a_rebalance_onto_them_keeps_results(ray_cluster):
    rng = random.Random(5)
    records = [(rng.randrange(200), rng.randrange(100)) for _ in range(9000)]
    sink = TestingSink()
    cfg = JobConfig(batch_size=50, linger_ms=2, metrics_port=0, replication="all",
                    replication_period_s=0.3, metrics_poll_interval_s=0.2)
    # 3,000 records: every one of the 200 keys, so every key group, has state
    moment = Moment.at(3000, 1500, len(records))
    h = running_sum_job(records, 2, sink, rate=3000, config=cfg, gates=moment.gates).run()

    def replicate_then_rebalance() -> None:
        with pytest.raises(RescaleRefused, match="policy"):
            h.set_replication("sum", "some")
        with pytest.raises(RescaleRefused, match="not a keyed operator"):
            h.set_replication("src", "all")
        wait_until(lambda: _samples(h.metrics_url).get("reflow_replicas[operator=sum]") == 32,
                   "a replica of every key group", h)
        m = _samples(h.metrics_url)
        assert m["reflow_replicas[operator=sum]"] == 32       # every group has a replica
        assert m["reflow_replication_bytes_total[operator=sum]"] > 0
        # swap half of each task's groups: every destination holds their replicas
        swap = tuple((1 - (kg * 2 // 32)) if kg % 2 else kg * 2 // 32 for kg in range(32))
        report = h.rebalance("sum", swap, protocol="non-disruptive")
        assert report.key_groups_moved == 16 and report.protocol == "non-disruptive"
        assert "adaptive" in report.planning_reason
        check_reports([report])
        m = _samples(h.metrics_url)
        assert m["reflow_rescale_subscale_seconds_count[operator=sum]"] >= 1
        assert m["reflow_rescale_subscales_done[operator=sum]"] == \
            m["reflow_rescale_subscales[operator=sum]"] > 0
        h.set_replication("sum", "none")

    moment.run(h, replicate_then_rebalance, job_timeout=120)
    assert per_key(sink.results()) == per_key(running_sum_reference(records))


def test_a_task_dying_mid_rescale_fails_the_job_with_the_rescale_named(ray_cluster):
    protocol = "drrs"  # the failure path is the JobMaster's, the same for every protocol
    import ray

    from engine.errors import JobFailedError

    records = [(i % 40, 1) for i in range(40000)]
    sink = TestingSink()
    # one key group per subscale, one subscale at a time: the rescale stays long in flight
    cfg = JobConfig(batch_size=50, linger_ms=2, metrics_port=None, metrics_poll_interval_s=0.2,
                    drrs_subscale_bytes=1, drrs_max_subscales=1)
    moment = Moment.at(1000, 2000, len(records))
    h = running_sum_job(records, 2, sink, rate=2000, config=cfg, gates=moment.gates).run()
    errors: list[BaseException] = []

    def rescale() -> None:
        try:
            h.rescale("sum", 6, protocol)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            errors.append(exc)

    def committed() -> bool:
        """The rescale changed the job (new tasks deployed): a failure now fails the job."""
        return not t.is_alive() or any(
            r.operator == "sum" and r.running and r.phase in (Phase.DEPLOY, Phase.SUBSCALES)
            for r in h.metrics().rescales)

    try:
        moment.wait(h)
        moment.start.open()
        t = threading.Thread(target=rescale)
        t.start()
        wait_until(committed, "the rescale of 'sum' to deploy its new tasks", h)
        assert t.is_alive(), f"the rescale ended before a task could die in it: {errors}"
        victim = next(n for n in ray.util.list_named_actors(all_namespaces=True)
                      if isinstance(n, dict) and n["name"].endswith("/sum/0/g0")
                      and h.job_id in n["name"])
        ray.kill(ray.get_actor(victim["name"], namespace=victim["namespace"]))
        t.join(120)
        assert not t.is_alive()
        with pytest.raises(JobFailedError, match="rescale of 'sum'"):
            h.wait(60)
        assert errors and "rescale of 'sum'" in str(errors[0])
    finally:
        moment.release()
        h.stop()


def test_warm_standby_actors_become_the_new_tasks_and_the_pool_refills_after(ray_cluster):
    """Also: drrs subscales respect the byte budget, with sizes asked from the tasks, and
    the operator-wide limit (one at a time here)."""
    rng = random.Random(9)
    records = [(i % 80, rng.randrange(10)) for i in range(30000)]  # 10 s
    sink = TestingSink()
    cfg = JobConfig(batch_size=50, linger_ms=2, metrics_port=None, warm_standby_tasks=2,
                    warm_standby_refill_s=2.0, drrs_subscale_bytes=1, drrs_max_subscales=1)
    moment = Moment.at(2000, 1500, len(records))
    h = running_sum_job(records, 2, sink, rate=3000, config=cfg, gates=moment.gates).run()
    try:
        assert h.status().standby == 2
        moment.wait(h)
        # every key (so every group that will have state) has state
        wait_until(lambda: len({r[0] for r in sink.results()}) == 80, "output for all 80 keys",
                   h)
        moment.start.open()
        report = h.rescale("sum", 4, protocol="drrs")
        check_reports([report])
        assert (report.old_parallelism, report.new_parallelism) == (2, 4)
        # a 1-byte budget: every group moves alone, but empty groups after an empty one
        # share its subscale
        old, new = uniform_assignment(32, 2), uniform_assignment(32, 4)
        sizes = {key_group_of(k, 32): 1000 for k in range(80)}
        plan = plan_subscales("sum", old, new, 2, 4, 4, sizes=sizes, subscale_bytes=1)
        assert len(report.subscales) == len(plan.subscales) > len(
            plan_subscales("sum", old, new, 2, 4, 4).subscales)
        assert "MB of state" in report.planning_reason
        assert "at most 1 at once" in report.planning_reason
        spans = sorted((start, start + dur) for _, start, dur in report.subscales)
        assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:], strict=False)), spans
        assert h.status().standby == 0  # taken by the rescale, not refilled during it
        # the source holds at the moment's end: the job runs until the pool refilled
        wait_until(lambda: h.status().standby == 2, "the warm standby pool to refill", h)
        moment.end.open()
        h.wait(120)
    finally:
        moment.release()
        h.stop()
    assert per_key(sink.results()) == per_key(running_sum_reference(records))
