"""Unit tests of the failure semantics' pure logic (issue 19), without a Ray cluster: the
error classes (tree, fields, pickling), the translation of Ray's exceptions, which
operator's ``open()`` raised, the deadlines, task health, the standby pool, and the
unresponsive-task gauge."""

from __future__ import annotations

import ast
import asyncio
import builtins
import importlib
import inspect
import pickle
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.core import GaugeMetricFamily
from ray.exceptions import ActorDiedError, GetTimeoutError, RayError, RayTaskError

import engine.errors as errors_module
from engine import JobConfig, KeyedProcessFunction, StreamJob
from engine.errors import (
    ConfigError,
    ControlPlaneError,
    ControlTimeout,
    FailurePhase,
    InternalError,
    JobFailedError,
    JobMasterLost,
    ReflowError,
    RescaleRefused,
    UserFunctionError,
    WaitTimeout,
)
from engine.io.sinks import Sink
from engine.io.sources import Source
from engine.io.testing import TestingSink, TestingSource
from engine.observability.metrics import JobCollector, JobMetrics, TaskMetrics
from engine.runtime.deadlines import Deadlines
from engine.runtime.failures import open_failure, reflow_error_in, translate, unwrap
from engine.runtime.handle import _raise
from engine.runtime.health import StandbyPool, TaskHealth
from engine.time.clock import ManualClock
from engine.wire.messages import CodecError, JobStatus, decode_message, encode_message

ERROR_CLASSES = [c for _, c in inspect.getmembers(errors_module, inspect.isclass)
                 if issubclass(c, ReflowError)]


# ------------------------------------------------------------------ the classes


def test_every_error_class_is_in_the_module_docstring_tree():
    assert len(ERROR_CLASSES) >= 17
    doc = errors_module.__doc__ or ""
    missing = [c.__name__ for c in ERROR_CLASSES if f" {c.__name__}\n" not in doc
               and f" {c.__name__} " not in doc]
    assert missing == []


def _exception_classes() -> dict[str, list[str]]:
    """Module -> the exception classes it defines, for every module of engine/, migration/
    and controllers/, read with ``ast``: a class is an exception when one of its bases is
    (a builtin exception, or a class found so, by name; repeated until nothing changes)."""
    root = Path(__file__).resolve().parents[2]
    classes: list[tuple[str, str, list[str]]] = []
    for pkg in ("engine", "migration", "controllers"):
        for path in sorted((root / pkg).rglob("*.py")):
            module = ".".join(path.relative_to(root).with_suffix("").parts)
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    bases = [ast.unparse(b).rpartition(".")[2] for b in node.bases]
                    classes.append((module, node.name, bases))
    known = {n for n, v in vars(builtins).items()
             if isinstance(v, type) and issubclass(v, BaseException)}
    while True:
        found = {name for _, name, bases in classes if known & set(bases)} - known
        if not found:
            break
        known |= found
    out: dict[str, list[str]] = {}
    for module, name, bases in classes:
        if known & set(bases):
            out.setdefault(module, []).append(name)
    return out


def test_every_exception_class_is_defined_in_engine_errors():
    """One documented tree: a module that needs an error imports it from engine.errors
    (the old names stay importable from where they were)."""
    elsewhere = {m: names for m, names in _exception_classes().items() if m != "engine.errors"}
    assert elsewhere == {}, f"exception classes outside engine/errors.py: {elsewhere}"
    assert len(_exception_classes()["engine.errors"]) == len(ERROR_CLASSES)


def test_every_class_in_engine_errors_is_a_reflow_error():
    classes = [c for _, c in inspect.getmembers(errors_module, inspect.isclass)
               if c.__module__ == errors_module.__name__]
    others = [c.__name__ for c in classes if not issubclass(c, ReflowError)]
    assert others == ["FailurePhase"]  # a value errors carry, not an error
    assert ReflowError.__bases__ == (Exception,)
    assert set(errors_module.__all__) == {c.__name__ for c in classes}


@pytest.mark.parametrize("module, name", [
    ("engine.io.testing", "GateError"), ("engine.io.testing", "GateTimeout"),
    ("engine.observability.promplot", "PrometheusError"),
    ("engine.operators.builtin", "UnknownKeyGroupError"),
    ("engine.task.channel", "KeyFunctionError"), ("engine.task.core", "TaskControlError"),
    ("engine.runtime.connections", "DownstreamDied"),
    ("engine.runtime.recovery", "JobRestarted"),
    ("engine.spark", "BridgeError"), ("engine.spark", "SparkQueryFailed"),
    ("engine.spark", "SchemaError"), ("engine.spark.bridge", "BridgeError"),
    ("engine.spark.schema", "SchemaError"),
    ("migration.assignment", "AssignmentError"), ("migration.assignment", "BalanceInfeasible"),
    ("migration.replication", "StaleReplicaError"),
    ("migration.participant", "UnknownSubscaleError"),
])
def test_errors_moved_to_engine_errors_keep_their_old_import_paths(module, name):
    assert getattr(importlib.import_module(module), name) is getattr(errors_module, name)


def test_the_errors_that_were_not_reflow_errors_keep_their_old_bases():
    from engine.errors import BridgeError, SchemaError, SparkQueryFailed

    assert issubclass(BridgeError, RuntimeError) and issubclass(SparkQueryFailed, RuntimeError)
    assert issubclass(SchemaError, ValueError) and issubclass(SchemaError, ConfigError)
    for cls in (BridgeError, SparkQueryFailed, SchemaError):
        assert issubclass(cls, ReflowError)


SAMPLES: list[ReflowError] = [
    UserFunctionError("count", 1, "('a', 1)", "KeyError: 'a'"),
    UserFunctionError("db", 0, "", "OSError: refused", phase="open", task="j/db/0/g0"),
    JobFailedError("task died", operator="sum", task_index=2, task="j/sum/2/g0",
                   phase="deploy", cause="ActorDiedError"),
    RescaleRefused("stuck", operator="sum", phase="hold", tasks=("j/sum/0/g0",)),
    RescaleRefused("plain"),
    ControlTimeout("no answer", job="j", call="status", seconds=2.5),
    JobMasterLost("gone", job="j", call="wait"),
    WaitTimeout("still running", job="j", state="running", seconds=3.0),
    InternalError("a bug"),
    ConfigError("bad"),
    errors_module.BalanceInfeasible("no", parallelism=3, balance=0.1, smallest_balance=0.4),
    errors_module.SparkQueryFailed("spark said no"),
]


@pytest.mark.parametrize("err", SAMPLES, ids=lambda e: type(e).__name__)
def test_errors_cross_processes_with_their_fields(err):
    """Ray pickles a remote error; a class with its own __init__ must still come back."""
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert str(back) == str(err) and back.args == err.args
    assert back.__dict__ == err.__dict__


def test_a_key_function_error_crosses_processes_with_its_record_and_cause():
    err = errors_module.KeyFunctionError(("a", 1), KeyError("a"))
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and str(back) == str(err) == "KeyError: 'a'"
    assert back.record == ("a", 1) and repr(back.cause) == repr(err.cause)


def test_user_function_error_says_what_to_do_for_open_and_for_a_record():
    on_record = UserFunctionError("count", 1, "('a', 1)", "KeyError: 'a'")
    assert on_record.phase == "process" and on_record.record == "('a', 1)"
    assert "dead_letter" in str(on_record) and "('a', 1)" in str(on_record)
    on_open = UserFunctionError("db", 0, "", "OSError: refused", phase="open", task="t")
    assert str(on_open).startswith("open() of operator 'db' (task 0) raised OSError: refused")
    assert "fix open()" in str(on_open) and on_open.task == "t"
    assert on_open.phase is FailurePhase.OPEN and on_record.phase is FailurePhase.PROCESS
    assert isinstance(on_open, JobFailedError)


def test_wait_timeout_is_still_a_timeout_error_and_control_errors_share_a_base():
    assert issubclass(WaitTimeout, TimeoutError)
    assert issubclass(ControlTimeout, ControlPlaneError)
    assert issubclass(JobMasterLost, ControlPlaneError)
    assert not issubclass(ControlTimeout, TimeoutError)  # not mistaken for wait()'s timeout


# ------------------------------------------------------------------ translation


def _task_error(cause: BaseException) -> RayTaskError:
    return RayTaskError("JobMaster.rescale", "Traceback (most recent call last): ...", cause)


def test_a_reflow_error_raised_remotely_comes_back_as_itself_through_any_nesting():
    refused = RescaleRefused("no", operator="sum")
    once = _task_error(refused)
    twice = _task_error(once.as_instanceof_cause())  # a task's error seen by the JobMaster
    for exc in (once, once.as_instanceof_cause(), twice, twice.as_instanceof_cause()):
        assert unwrap(exc) is refused
        assert reflow_error_in(exc) is refused
        assert translate(exc, job="j", call="rescale") is refused


def test_ray_errors_become_reflow_errors_naming_the_job_and_call():
    died = ActorDiedError()
    lost = translate(died, job="j", call="status")
    assert type(lost) is JobMasterLost and (lost.job, lost.call) == ("j", "status")
    assert "deploy it again" in str(lost)
    timeout = translate(GetTimeoutError("slow"), job="j", call="metrics", seconds=2.0)
    assert type(timeout) is ControlTimeout and timeout.seconds == 2.0
    assert "within 2 s" in str(timeout) and "control_timeout_s" in str(timeout)
    bug = translate(_task_error(KeyError("x")), job="j", call="rescale")
    assert type(bug) is InternalError and "KeyError" in str(bug) and "bug" in str(bug)
    other = translate(RayError("raylet gone"), job="j", call="wait")
    assert type(other) is ControlPlaneError and other.call == "wait"
    assert reflow_error_in(died) is None


def test_the_handle_raises_a_remote_error_bare_and_a_translated_one_with_rays_cause():
    refused = RescaleRefused("no")
    with pytest.raises(RescaleRefused) as info:
        _raise(_task_error(refused).as_instanceof_cause(), "j", "rescale", 1.0)
    assert info.value is refused and info.value.__suppress_context__
    died = ActorDiedError()
    with pytest.raises(JobMasterLost) as lost:
        _raise(died, "j", "status", 1.0)
    assert lost.value.__cause__ is died


# ------------------------------------------------------------------ which open() raised


class Boom(Exception):
    pass


class FailingFn(KeyedProcessFunction):
    def __init__(self, helper: Any = None) -> None:
        self.helper = helper

    def open(self, ctx: Any) -> None:
        if self.helper is not None:
            self.helper.open()
        raise Boom("no db")

    def process_element(self, value: Any, ctx: Any) -> Any:
        yield value


class Helper:
    def open(self) -> None:
        raise Boom("helper")


class FailingSource(Source):
    def partitions(self, parallelism: int) -> list[str]:
        return ["topic"]

    def open_partition(self, partition: str, resume: Any, clock: Any) -> Any:
        raise Boom("no topic")


class FailingSink(Sink):
    def open(self, task_index: int, parallelism: int, clock: Any) -> Any:
        raise Boom("read-only")


def _operators(fn: Any, source: Any = None, sink: Any = None,
               dead_letter: Any = None) -> tuple[Any, ...]:
    job = StreamJob("j", num_key_groups=8, parallelism=2)
    (job.source(source or TestingSource([1]), name="src", parallelism=1)
        .key_by(lambda r: r)
        .process(fn, name="fn", dead_letter=dead_letter)
        .sink(sink or TestingSink(), name="out"))
    return job.graph().operators


def _raised_by(call: Any) -> BaseException:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return exc
    raise AssertionError("expected the call to raise")


@pytest.mark.parametrize("which", ["fn", "src", "out", "dead"])
def test_open_failure_names_the_operator_whose_open_raised(which):
    fn, src, sink, dead = FailingFn(), FailingSource(), FailingSink(), FailingSink()
    ops = _operators(fn, src, sink, dead)
    call = {"fn": lambda: fn.open(None), "src": lambda: src.open_partition("topic", None, None),
            "out": lambda: sink.open(0, 1, None), "dead": lambda: dead.open(0, 1, None)}[which]
    err = open_failure(_raised_by(call), ops, "j/x/1/g0", 1)
    assert err is not None
    assert err.operator == {"fn": "fn", "src": "src", "out": "out", "dead": "fn"}[which]
    assert (err.task_index, err.task, err.phase, err.record) == (1, "j/x/1/g0", "open", "")
    assert err.cause.startswith("Boom: ")


def test_open_failure_names_the_object_reflow_called_and_nothing_else():
    fn = FailingFn(helper=Helper())
    ops = _operators(fn)
    err = open_failure(_raised_by(lambda: fn.open(None)), ops, "t", 0)
    assert err is not None and err.operator == "fn" and err.cause == "Boom: helper"
    # raised outside any operator's open(): not a user open() failure
    assert open_failure(_raised_by(lambda: Helper().open()), ops, "t", 0) is None
    assert open_failure(_raised_by(lambda: 1 / 0), ops, "t", 0) is None


# ------------------------------------------------------------------ deadlines


def test_deadlines_derive_from_the_two_settings_and_nest():
    d = Deadlines.of(JobConfig(control_timeout_s=4.0, rescale_timeout_s=30.0))
    assert (d.control_s, d.rescale_s) == (4.0, 30.0)
    assert d.task_poll_s == 2.0 < d.control_s  # the JobMaster answers before the driver gives up
    assert d.rescale_window_s == 68.0 > d.rescale_s + d.task_poll_s + d.control_s
    assert d.stop_s == d.stop_budget_s + d.control_s and d.stop_budget_s >= 2 * d.control_s
    assert d.deploy_s == 60.0 and d.start_s == 68.0  # starting actors needs a floor
    assert Deadlines(1.0, 600.0).deploy_s == 600.0
    assert Deadlines(0.25, 1.0).wait_slice_s == 1.0
    assert JobConfig().control_timeout_s == 5.0


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "5"])
def test_deadlines_refuse_what_is_not_a_positive_finite_number(bad):
    with pytest.raises(ConfigError):
        Deadlines(bad, 1.0)
    with pytest.raises(ConfigError):
        JobConfig(control_timeout_s=bad)


def test_an_unbounded_rescale_timeout_means_unbounded_rescale_windows():
    d = Deadlines(2.0, float("inf"))
    assert d.rescale_window_s == float("inf") and d.for_ray(d.rescale_window_s) is None
    assert d.for_ray(d.control_s) == 2.0 and d.for_ray(d.start_s) is None
    with pytest.raises(ConfigError):
        Deadlines(2.0, float("nan"))


# ------------------------------------------------------------------ task health


def test_task_health_reports_silent_tasks_with_seconds_since_they_last_answered():
    clock = ManualClock()
    h = TaskHealth(clock)
    h.created("a")
    h.created("b")
    clock.advance(2.0)
    h.answered("a")
    assert h.unresponsive() == ()
    clock.advance(3.0)
    h.missed("b")  # never answered: counts from its creation
    h.missed("a")
    assert h.unresponsive() == (("a", 3.0), ("b", 5.0))
    assert h.is_silent("a") and h.since("a") == clock.monotonic() - 3.0
    h.answered("a")
    clock.advance(1.0)
    assert h.unresponsive() == (("b", 6.0),)
    h.forget("b")
    assert h.unresponsive() == () and not h.is_silent("b")


# ------------------------------------------------------------------ standby pool


class FakeActors:
    """Actors as names; ``dead`` ones fail their ping, ``slow`` ones time out."""

    def __init__(self) -> None:
        self.dead: set[str] = set()
        self.slow: set[str] = set()
        self.killed: list[str] = []

    def make(self, name: str) -> str:
        return name

    async def ping(self, actor: str) -> None:
        if actor in self.dead:
            raise ActorDiedError()
        if actor in self.slow:
            raise TimeoutError  # what wait_for raises when the deadline passes

    def kill(self, actor: str) -> None:
        self.killed.append(actor)


def _pool(size: int = 3) -> tuple[StandbyPool, FakeActors]:
    fake = FakeActors()
    pool = StandbyPool("j/standby", size, fake.make, fake.ping, fake.kill, 1.0)
    return pool, fake


def test_the_pool_never_hands_out_a_dead_or_silent_actor():
    pool, fake = _pool(4)
    assert pool.fill() == 4 and pool.names() == [f"j/standby-{i}" for i in range(4)]
    fake.dead.add("j/standby-0")
    fake.slow.add("j/standby-1")
    assert asyncio.run(pool.take()) == "j/standby-2"
    assert fake.killed == ["j/standby-0", "j/standby-1"] and len(pool) == 1
    fake.dead.add("j/standby-3")
    assert asyncio.run(pool.take()) is None and len(pool) == 0
    assert pool.fill() == 4 and pool.names()[0] == "j/standby-4"  # new names, never reused


def test_the_pool_check_drops_dead_actors_and_keeps_ones_still_starting():
    pool, fake = _pool(3)
    pool.fill()
    fake.dead.add("j/standby-1")
    fake.slow.add("j/standby-2")  # maybe still starting: not known dead
    assert asyncio.run(pool.check()) == 1
    assert pool.names() == ["j/standby-0", "j/standby-2"] and len(pool) == 2
    assert fake.killed == ["j/standby-1"] and pool.dropped == ["j/standby-1"]
    assert asyncio.run(pool.check()) == 0
    assert pool.clear() == ["j/standby-0", "j/standby-2"] and len(pool) == 0


# ------------------------------------------------------------------ status, metrics, gauge


def test_job_status_carries_unresponsive_tasks_on_the_wire_and_checks_them():
    st = JobStatus("j", "running", unresponsive=(("j/sum/0/g0", 12.5),))
    assert decode_message(encode_message(st)) == st
    assert decode_message(encode_message(JobStatus("j", "running"))).unresponsive == ()
    with pytest.raises(CodecError):
        JobStatus("j", "running", unresponsive=(("j/sum/0/g0", -1.0),))
    with pytest.raises(ValueError):
        JobMetrics("j", "running", (), (), None, (("t", -2.0),))


def _snapshot(task: str, vertex: str, index: int) -> TaskMetrics:
    return TaskMetrics(task, vertex, index, "running", 0, 0, 0, 0, 0.0, 0.0, 0.0, 0, 0, 0, 0,
                       None, 0)


def test_the_unresponsive_gauge_counts_seconds_up_to_the_scrape_and_zero_for_the_others():
    clock = ManualClock()
    c = JobCollector("j", clock.monotonic)
    c.tasks = {"j/sum/0/g0": _snapshot("j/sum/0/g0", "sum", 0),
               "j/sum/1/g0": _snapshot("j/sum/1/g0", "sum", 1)}
    c.unresponsive = {"j/sum/1/g0": ("sum", 1, clock.monotonic())}
    clock.advance(7.5)
    fam = next(f for f in c.collect() if f.name == "reflow_task_unresponsive_seconds")
    assert isinstance(fam, GaugeMetricFamily)
    values = {s.labels["task"]: s.value for s in fam.samples}
    assert values == {"0": 0.0, "1": 7.5}
    assert all(s.labels["operator"] == "sum" and s.labels["job"] == "j" for s in fam.samples)
