"""Validation of what a user gives reflow (issue 19, item 7): counts are integers and never
booleans, names are never silently replaced, every ``JobConfig`` field is type-checked, and
NaN keys are refused where a key is hashed (``engine.dataflow.keygroups``), failing the task with the
operator and the record named. No Ray: task cores are built and stepped by hand.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest

from engine.api import StreamJob
from engine.dataflow import graph as g
from engine.dataflow.config import JobConfig, check_count
from engine.dataflow.deployment import (
    ChannelIds,
    connect_messages,
    initial_deployment,
    start_messages,
)
from engine.dataflow.keygroups import (
    KeyGroupCache,
    key_group_of,
    stable_hash,
    uniform_assignment,
    validate_assignment,
)
from engine.dataflow.physical import plan_physical
from engine.errors import (
    ConfigError,
    InvalidKeyError,
    JobDefinitionError,
    ReflowError,
    RescaleRefused,
    UnhashableKeyError,
)
from engine.io.sinks import ParquetSink
from engine.io.sources import GeneratorSource, ParquetSource
from engine.io.testing import TestingSink, TestingSource
from engine.operators.functions import KeyedProcessFunction
from engine.task.channel import KeyFunctionError, OutputRouter
from engine.task.core import TaskCore
from engine.time.clock import ManualClock
from engine.time.event_time import tumbling_event_time
from engine.wire.messages import Ack, OutputChannel, OutputEdge, TaskFailed
from tests.harness import make_spec
from tests.unit.test_graph import KINDS, one_operator_job

N = 16

class Count(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Any) -> Any:
        yield value


def ident(x: Any) -> Any:
    return x


@pytest.fixture
def src() -> TestingSource:
    return TestingSource([1, 2, 3])


@pytest.fixture
def sink(tmp_path) -> TestingSink:
    return TestingSink(str(tmp_path / "sink"))


# ---------------------------------------------------------------- check_count


@pytest.mark.parametrize("value", [1, 7, np.int64(3), np.int32(2), np.uint8(1)], ids=repr)
def test_check_count_accepts_integers_and_returns_int(value):
    out = check_count("thing", value)
    assert out == value and type(out) is int


@pytest.mark.parametrize("value", [True, False, 2.0, 1.5, "2", None, [2], np.float64(2.0)],
                         ids=repr)
def test_check_count_refuses_what_is_not_an_integer(value):
    with pytest.raises(ConfigError) as info:
        check_count("JobConfig: things", value)
    msg = str(info.value)
    assert "JobConfig: things must be an integer >= 1" in msg
    assert f"got {value!r} ({type(value).__name__})" in msg


def test_check_count_minimum_and_error_class():
    assert check_count("lateness", 0, minimum=0) == 0
    with pytest.raises(ConfigError, match=r"lateness must be an integer >= 0; got -1"):
        check_count("lateness", -1, minimum=0)
    with pytest.raises(RescaleRefused, match=r"operator 'count': parallelism must be an "
                                             r"integer >= 1; got True \(bool\)"):
        check_count("operator 'count': parallelism", True, error=RescaleRefused)


def test_config_error_is_a_reflow_error_and_a_value_error():
    assert issubclass(ConfigError, JobDefinitionError)
    assert issubclass(ConfigError, ReflowError) and issubclass(ConfigError, ValueError)
    assert issubclass(InvalidKeyError, ReflowError) and issubclass(InvalidKeyError, ValueError)
    assert issubclass(UnhashableKeyError, InvalidKeyError)
    assert issubclass(UnhashableKeyError, TypeError)


# ---------------------------------------------------------------- booleans are not counts


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("p", [True, False])
def test_bool_parallelism_is_refused_for_every_operator(kind, p, src, sink):
    with pytest.raises(JobDefinitionError) as info:
        one_operator_job(kind, p, src, sink)
    msg = str(info.value)
    assert "'op'" in msg and "parallelism must be an integer >= 1" in msg and repr(p) in msg


@pytest.mark.parametrize("kwargs,match", [
    (dict(parallelism=True), r"job 'j': default parallelism must be an integer >= 1; got True"),
    (dict(num_key_groups=True), r"job 'j': num_key_groups must be an integer >= 1; got True"),
    (dict(num_key_groups=np.float64(8)), r"num_key_groups must be an integer"),
    (dict(config={"batch_size": 10}), r"config must be an engine.dataflow.config.JobConfig"),
    (dict(config=JobConfig), r"config must be an engine.dataflow.config.JobConfig"),
])
def test_stream_job_refuses_bool_counts_and_wrong_config(kwargs, match):
    with pytest.raises(JobDefinitionError, match=match):
        StreamJob("j", **kwargs)


def test_graph_refuses_bool_counts_directly(src):
    with pytest.raises(JobDefinitionError, match=r"'s': parallelism must be an integer >= 1"):
        g.OperatorDef("s", g.SOURCE, src, True)
    op = g.OperatorDef("s", g.SOURCE, src, 1)
    with pytest.raises(JobDefinitionError, match="num_key_groups must be an integer >= 1"):
        g.JobGraph("j", True, (op,))


def test_with_parallelism_refuses_a_bool(src, sink):
    job = StreamJob("j", num_key_groups=8, parallelism=2)
    job.source(src, name="s").key_by(ident).process(Count(), name="k").sink(sink, name="out")
    graph = job.graph()
    with pytest.raises(JobDefinitionError, match=r"'k': parallelism must be an integer >= 1; "
                                                 r"got True \(bool\)"):
        graph.with_parallelism("k", True)


def test_numpy_integer_counts_are_stored_as_int(src, sink):
    job = StreamJob("j", num_key_groups=np.int64(8), parallelism=np.int64(2))
    job.source(src, name="s", parallelism=np.int32(3)).sink(sink, name="out")
    graph = job.graph()
    assert type(graph.num_key_groups) is int and graph.num_key_groups == 8
    assert type(job.default_parallelism) is int
    assert [type(o.parallelism) for o in graph.operators] == [int, int]
    assert [o.parallelism for o in graph.operators] == [3, 3]


@pytest.mark.parametrize("value", [True, -1, 1.5], ids=repr)
def test_window_lateness_is_a_count(src, value):
    keyed = StreamJob("j").source(src, name="s").key_by(ident)
    with pytest.raises(JobDefinitionError, match="allowed_lateness_ms must be an integer >= 0"):
        keyed.window(tumbling_event_time(10), allowed_lateness_ms=value)
    with pytest.raises(JobDefinitionError, match="allowed_lateness_ms must be an integer >= 0"):
        keyed.window_join(keyed, tumbling_event_time(10), lambda a, b: (a, b), name="jn",
                          allowed_lateness_ms=value)


def test_uniform_assignment_and_validate_assignment_refuse_bools():
    with pytest.raises(ValueError, match="parallelism True"):
        uniform_assignment(8, True)
    with pytest.raises(ValueError, match=r"key groups \[0, 1\] map to task indices"):
        validate_assignment([True, False, 0, 1], 4, 2)
    validate_assignment([0, 1, 0, 1], 4, 2)


# ---------------------------------------------------------------- names


@pytest.mark.parametrize("kind", KINDS)
def test_empty_operator_name_is_refused_not_replaced(kind, src, sink):
    job = StreamJob("j", num_key_groups=8)
    with pytest.raises(JobDefinitionError, match=r"operator name '' must be a non-empty string"):
        if kind == "source":
            job.source(src, name="")
        else:
            s = job.source(src, name="s")
            {
                "map": lambda: s.map(ident, name=""),
                "filter": lambda: s.filter(bool, name=""),
                "flat_map": lambda: s.flat_map(ident, name=""),
                "process": lambda: s.key_by(ident).process(Count(), name=""),
                "reduce": lambda: s.key_by(ident).reduce(max, name=""),
                "sink": lambda: s.sink(sink, name=""),
            }[kind]()
    assert [o.name for o in job._ops] in ([], ["s"])  # nothing added under a made-up name
    job.source(TestingSource([]))  # only name=None generates one
    assert job._ops[-1].name.startswith("source-")


def test_job_graph_refuses_an_empty_job_name(src):
    with pytest.raises(JobDefinitionError, match="a job needs a non-empty name; got ''"):
        g.JobGraph("", 8, (g.OperatorDef("s", g.SOURCE, src, 1),))


# ---------------------------------------------------------------- JobConfig types

# one wrongly typed value per annotation; each field must refuse it
WRONG = {"int": 1.5, "float": "1", "bool": 1, "str": 7, "TLS": "cert.pem"}


def _fields() -> list[dataclasses.Field]:
    return list(dataclasses.fields(JobConfig))


@pytest.mark.parametrize("f", _fields(), ids=lambda f: f.name)
def test_every_job_config_field_is_type_checked(f):
    base = str(f.type).removesuffix(" | None")
    assert base in WRONG, f"JobConfig.{f.name}: no wrong value for {f.type!r} in this test"
    value = WRONG[base]
    with pytest.raises(ConfigError) as info:
        JobConfig(**{f.name: value})
    msg = str(info.value)
    assert msg.startswith(f"JobConfig: {f.name} must be ")
    assert f"got {value!r} ({type(value).__name__})" in msg


def test_batch_size_float_is_refused_naming_field_value_and_expectation():
    with pytest.raises(ConfigError, match=r"^JobConfig: batch_size must be an integer; "
                                          r"got 1\.5 \(float\)$"):
        JobConfig(batch_size=1.5)
    with pytest.raises(ValueError):  # a ValueError too, for callers that caught that
        JobConfig(batch_size=1.5)


@pytest.mark.parametrize("kwargs", [
    dict(batch_size=True), dict(credits=False), dict(source_poll_records=True),
    dict(drrs_max_subscales=True), dict(drrs_subscale_bytes=True), dict(metrics_port=True),
    dict(linger_ms=True), dict(rescale_timeout_s=False),
], ids=lambda kw: next(iter(kw)))
def test_job_config_refuses_bools_for_numbers(kwargs):
    [(name, value)] = kwargs.items()
    with pytest.raises(ConfigError, match=rf"JobConfig: {name} must be .*; got {value} \(bool\)"):
        JobConfig(**kwargs)


@pytest.mark.parametrize("kwargs", [
    dict(live_rescaling=1), dict(batched_matching="yes"), dict(transport=None),
    dict(data_host=0), dict(metrics_host=None), dict(linger_ms=float("nan")),
    dict(replication_hot_fraction=None), dict(metrics_port="8080"),
], ids=lambda kw: next(iter(kw)))
def test_job_config_refuses_wrong_types(kwargs):
    [(name, _)] = kwargs.items()
    with pytest.raises(ConfigError, match=rf"^JobConfig: {name} must be "):
        JobConfig(**kwargs)


def test_job_config_range_errors_give_the_value():
    with pytest.raises(ConfigError, match=r"^JobConfig: batch_size must be >= 1; got 0$"):
        JobConfig(batch_size=0)


def test_job_config_normalises_numbers():
    c = JobConfig(batch_size=np.int64(10), linger_ms=2, drrs_max_subscales=np.int16(3),
                  drrs_subscale_bytes=None, task_num_cpus=np.float32(0.5))
    assert type(c.batch_size) is int and c.batch_size == 10
    assert type(c.linger_ms) is float and c.linger_ms == 2.0
    assert type(c.drrs_max_subscales) is int and c.drrs_max_subscales == 3
    assert c.drrs_subscale_bytes is None
    assert type(c.task_num_cpus) is float and c.task_num_cpus == 0.5
    assert c == JobConfig(batch_size=10, linger_ms=2.0, drrs_max_subscales=3,
                          drrs_subscale_bytes=None, task_num_cpus=0.5)


# ---------------------------------------------------------------- sources and sinks


@pytest.mark.parametrize("rate", [True, 0, -1, float("nan"), float("inf"), "5"], ids=repr)
def test_testing_source_rate_is_a_positive_number(rate):
    with pytest.raises(ConfigError, match=r"TestingSource rate must be a finite number > 0"):
        TestingSource([1], rate=rate)
    assert TestingSource([1], rate=2).rate == 2


@pytest.mark.parametrize("kwargs", [
    dict(rate=True), dict(rate=None, num_records=True), dict(rate=None, num_keys=True),
    dict(rate=None, duration_s=True), dict(rate=None, state_bytes_per_key=True),
    dict(rate=None, seed=True),
], ids=repr)
def test_generator_source_counts_and_rates_refuse_bools_as_config_errors(kwargs):
    with pytest.raises(ConfigError, match="GeneratorSource"):
        GeneratorSource(**kwargs)


def test_parquet_source_and_sink_counts_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="batch_rows must be an int >= 1; got True"):
        ParquetSource(str(tmp_path), batch_rows=True)
    with pytest.raises(ConfigError, match="rows_per_file must be an int >= 1; got True"):
        ParquetSink(str(tmp_path), rows_per_file=True)


# ---------------------------------------------------------------- NaN keys


@pytest.mark.parametrize("key", [math.nan, float("nan"), np.float64("nan"), ("a", math.nan),
                                 (1, (math.nan,))], ids=repr)
def test_nan_keys_are_refused_where_they_are_hashed(key):
    with pytest.raises(InvalidKeyError, match="NaN, which never equals itself"):
        stable_hash(key)
    cache = KeyGroupCache(N)
    with pytest.raises(InvalidKeyError):
        cache.key_groups(["fine", key])
    assert "fine" in cache._cache and len(cache._cache) == 1  # a NaN is never cached


def test_numpy_floats_are_keys_like_python_floats():
    # equal in Python (np.float64(2.0) == 2), so one key: the same hash, whichever a task
    # meets first (the key-group cache treats them as one dict key)
    assert stable_hash(np.float64(2.0)) == stable_hash(2) == stable_hash(2.0)
    assert stable_hash(np.float64(2.5)) == stable_hash(2.5)
    n = 1 << 20  # enough groups that a coincidence of two different hashes is unlikely
    a, b = KeyGroupCache(n), KeyGroupCache(n)
    assert a.key_groups([2, np.float64(2.0)]) == b.key_groups([np.float64(2.0), 2])
    assert key_group_of(np.float64(7.0), n) == key_group_of(7, n)


def test_unhashable_key_is_a_reflow_type_error():
    with pytest.raises(UnhashableKeyError, match="cannot be hashed stably"):
        stable_hash(object())


def test_router_names_the_record_with_a_nan_key():
    router = OutputRouter(10, 0.0, N, {0: lambda r: r["price"]}, now=lambda: 0.0)
    router.connect([OutputEdge(0, "keyed", (OutputChannel(1, "t", 0),), (0,) * N)])
    router.emit([{"price": 1.5}], [0])
    bad = {"price": math.nan, "id": 7}
    with pytest.raises(KeyFunctionError) as info:
        router.emit([{"price": 2.5}, bad, {"price": 3.5}], [0, 0, 0])
    assert info.value.record is bad
    assert isinstance(info.value.cause, InvalidKeyError)


def task_cores(job: StreamJob, clock: ManualClock) -> dict[str, TaskCore]:
    """Every task core of ``job``, connected and started as the JobMaster does."""
    plan = plan_physical(job.graph())
    dep = initial_deployment(plan, "j")
    cores: dict[str, TaskCore] = {}
    for v in plan.vertices:
        for i, name in enumerate(dep.tasks[v.name]):
            cores[name] = TaskCore(make_spec(dep, v.name, i, name, job.config), clock)
    for name, msg in connect_messages(dep, ChannelIds()).items():
        assert cores[name].handle(msg) == Ack()
    starts = start_messages(dep)
    for v in reversed(plan.vertices):
        for name in dep.tasks[v.name]:
            assert cores[name].handle(starts[name]) == Ack()
    return cores


def test_a_nan_key_fails_the_task_naming_operator_and_record(sink):
    records = [(1.0, "a"), (2.0, "b"), (math.nan, "c"), (1.0, "d")]
    job = StreamJob("nan", num_key_groups=N,
                    config=JobConfig(batch_size=5, linger_ms=0, metrics_port=None))
    (job.source(TestingSource(records), name="prices", parallelism=1)
        .key_by(lambda r: r[0])
        .reduce(lambda a, b: b, name="last", parallelism=1)
        .sink(sink, name="out"))
    cores = task_cores(job, ManualClock())
    [src] = [c for c in cores.values() if c.spec.vertex == "prices"]
    src.poll_source(10)
    assert src.status == "failed"
    [f] = [r for r in src.reports if isinstance(r, TaskFailed)]
    assert (f.operator, f.task_index, f.record) == ("key_by after prices", 0, "(nan, 'c')")
    assert "InvalidKeyError" in f.cause and "NaN" in f.cause


def test_a_job_name_with_a_path_separator_is_refused():
    from engine.api import StreamJob
    from engine.errors import JobDefinitionError

    for bad in ("a/b", "a\\b", "tab\there", "  "):
        with pytest.raises(JobDefinitionError):
            StreamJob(bad)
    StreamJob("stock exchange-2.v1_x")


def test_a_job_without_a_sink_or_with_an_empty_restore_from_is_refused_before_deploying():
    from engine.api import StreamJob
    from engine.errors import JobDefinitionError
    from engine.io.testing import TestingSink, TestingSource

    job = StreamJob("nosink")
    job.source(TestingSource([(1, 1)]), name="src").key_by(lambda r: r[0]).reduce(
        lambda a, b: a, name="sum")
    with pytest.raises(JobDefinitionError, match="has no sink"):
        job.run()
    ok = StreamJob("restore")
    ok.source(TestingSource([(1, 1)]), name="src").sink(TestingSink(), name="out")
    for bad in ("", "   "):
        with pytest.raises(JobDefinitionError, match="names no savepoint"):
            ok.run(restore_from=bad)


def test_relative_savepoint_locations_are_made_absolute_on_the_driver(tmp_path, monkeypatch):
    from engine.checkpoints.store import absolute_location
    from engine.errors import ConfigError
    from engine.runtime.handle import _location

    monkeypatch.chdir(tmp_path)
    assert absolute_location("sp/1") == str(tmp_path / "sp" / "1")
    assert absolute_location("s3://b/sp?x=1") == "s3://b/sp?x=1"
    assert _location("sp", "savepoint") == str(tmp_path / "sp")
    with pytest.raises(ConfigError):
        _location("", "stop")


def test_rescale_without_a_parallelism_is_refused_on_the_driver():
    from engine.errors import RescaleRefused
    from engine.runtime.handle import JobHandle

    handle = JobHandle.__new__(JobHandle)  # refused before the JobMaster is asked
    for bad in (None, 2.0, "3", True):
        with pytest.raises(RescaleRefused, match="must be a number of tasks"):
            handle.rescale("sum", bad)  # type: ignore[arg-type]
