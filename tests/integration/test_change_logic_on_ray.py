"""Change of logic on real Ray: the outputs split exactly at the barrier, refusals leave the
old function everywhere, and a controller's ChangeLogic decision is carried out."""

from __future__ import annotations

from typing import Any

import pytest

from controllers.base import ChangeLogic, Controller, NoChange
from engine.dataflow.config import JobConfig
from engine.errors import ChangeLogicRefused
from engine.io.testing import TestingSink
from tests.jobs import Tag, Unloadable, gates_of, moments, per_key, tag_job, wait_until

pytestmark = pytest.mark.ray

RECORDS = 6_000


class SwapOnce(Controller):
    interval_s = 0.2
    window_s = 1.0

    def __init__(self) -> None:
        self.done = False

    def decide(self, metrics: Any, view: Any) -> Any:
        if self.done:
            return NoChange("swapped")
        self.done = True
        return ChangeLogic("tag", Tag("v3"), reason="the test asks")


def _split(results: list[tuple], tag: str) -> int:
    """The first record index tagged ``tag`` (tags must change only there)."""
    by_i = sorted((r[1], r[3]) for r in results)
    first = next(i for i, t in by_i if t == tag)
    return first


def test_the_outputs_split_exactly_at_the_barrier(ray_cluster):
    records = [(i % 17, i) for i in range(RECORDS)]
    plan = moments(RECORDS, [0.3, 0.3], 1_000)
    sink = TestingSink()
    config = JobConfig(batch_size=50, linger_ms=2, metrics_port=None,
                       metrics_poll_interval_s=0.25)
    handle = tag_job(records, 2, sink, rate=3_000, gates=gates_of(plan), config=config).run()
    reports: list[Any] = []
    try:
        def refusals_then_change() -> None:
            with pytest.raises(ChangeLogicRefused, match="sources and sinks"):
                handle.change_logic("src", len)
            with pytest.raises(ChangeLogicRefused, match="KeyedProcessFunction"):
                handle.change_logic("tag", len)
            with pytest.raises(ChangeLogicRefused, match="cannot be loaded in task") as err:
                handle.change_logic("tag", Unloadable("bad"))
            assert err.value.tasks and err.value.phase == "stage"
            with pytest.raises(ChangeLogicRefused, match="serialised"):
                import threading

                handle.change_logic("tag", Tag(threading.Lock()))  # type: ignore[arg-type]
            reports.append(handle.change_logic("tag", Tag("v2")))

        plan[0].act(handle, refusals_then_change)

        def by_controller() -> None:
            handle.add_controller(SwapOnce())
            wait_until(lambda: any(d.kind == "change-logic" and d.outcome == "executed"
                                   for d in handle.decisions()), "the controller's change",
                       handle)

        plan[1].act(handle, by_controller)
        handle.wait(120)
    finally:
        for m in plan:
            m.release()
        handle.stop()
    (report,) = reports
    # version 1 was the refused Unloadable one: every staging takes a version
    assert report.operator == "tag" and report.version == 2 and report.tasks == 2
    results = sink.results()
    assert len(results) == RECORDS
    tags = {r[1]: r[3] for r in results}
    s2, s3 = _split(results, "v2"), _split(results, "v3")
    assert plan[0].start.after <= s2 <= plan[0].end.after, s2
    assert plan[1].start.after <= s3 <= plan[1].end.after, s3
    assert all(tags[i] == ("v1" if i < s2 else "v2" if i < s3 else "v3") for i in tags), \
        "a record saw a function other than the one before or after the barrier"
    for outs in per_key(results).values():  # the count survived both switches
        assert [o[2] for o in sorted(outs, key=lambda o: o[1])] == list(range(1, len(outs) + 1))


def test_a_restart_after_a_change_of_logic_runs_the_new_function(ray_cluster, tmp_path):
    """A task killed after the change (and a checkpoint after it) restarts with the new
    function: before, a restart deployed the user's plan and went back to the old one."""
    import ray

    from tests.jobs import task_actors

    records = [(i % 17, i) for i in range(RECORDS)]
    plan = moments(RECORDS, [0.3, 0.3], 1_000)
    sink = TestingSink(str(tmp_path / "out"))
    config = JobConfig(batch_size=50, linger_ms=2, metrics_port=None,
                       checkpoint_interval_s=0.3, checkpoint_dir=str(tmp_path / "chk"),
                       restart_delay_s=0.1, restart_attempts=3)
    handle = tag_job(records, 2, sink, rate=3_000, gates=gates_of(plan), config=config).run()
    try:
        plan[0].act(handle, lambda: handle.change_logic("tag", Tag("v2")))

        def kill_after_a_checkpoint() -> None:
            done = handle.status().checkpoints.completed
            wait_until(lambda: handle.status().checkpoints.completed > done, "a checkpoint",
                       handle)
            ray.kill(ray.get_actor(task_actors(handle, "tag")[0], namespace="reflow"))
            wait_until(lambda: handle.status().restarts == 1, "the restart", handle)

        plan[1].act(handle, kill_after_a_checkpoint)
        assert handle.wait(120).restarts == 1
    finally:
        for m in plan:
            m.release()
        handle.stop()
    results = sink.results()
    assert len(results) == RECORDS
    tags = {r[1]: r[3] for r in results}
    s2 = _split(results, "v2")
    assert plan[0].start.after <= s2 <= plan[0].end.after, s2
    assert all(tags[i] == ("v1" if i < s2 else "v2") for i in tags), \
        "after the restart a record saw the function from before the change"
    for outs in per_key(results).values():
        assert [o[2] for o in sorted(outs, key=lambda o: o[1])] == list(range(1, len(outs) + 1))
