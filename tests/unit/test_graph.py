"""Build-time validation of jobs: engine.api builders, engine.dataflow.graph, engine.config.

Nothing here deploys: ``StreamJob.run()`` is never called.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import pytest

from engine.api import KeyedStream, Stream, StreamJob
from engine.dataflow import graph as g
from engine.dataflow.config import JobConfig
from engine.errors import JobDefinitionError, ReflowError
from engine.io.testing import TestingSink, TestingSource
from engine.operators.functions import KeyedProcessFunction, ReduceFunction


class Count(KeyedProcessFunction):
    def process_element(self, value, ctx):
        yield value


def ident(x):
    return x


def key_fn(x):
    return x % 3


@pytest.fixture
def sink(tmp_path):
    return TestingSink(directory=str(tmp_path / "sink"))


@pytest.fixture
def src():
    return TestingSource([1, 2, 3])


@contextlib.contextmanager
def raises_naming(name: str, *more: str):
    """Expect JobDefinitionError whose message contains repr(name) and every one of ``more``."""
    with pytest.raises(JobDefinitionError) as info:
        yield info
    msg = str(info.value)
    assert repr(name) in msg, f"{msg!r} does not name operator {name!r}"
    for part in more:
        assert part in msg, f"{msg!r} lacks {part!r}"


# ---------------------------------------------------------------- a valid job


def test_valid_pipeline_graph(src, sink):
    job = StreamJob("wc", num_key_groups=16, parallelism=2)
    s = job.source(src, name="src", parallelism=3)
    assert isinstance(s, Stream)
    words = s.map(ident, name="m").filter(bool, name="f").flat_map(lambda x: [x], name="fm")
    keyed = words.key_by(key_fn)
    assert isinstance(keyed, KeyedStream)
    counts = keyed.process(Count(), name="count")
    counts.key_by(key_fn).reduce(lambda a, b: a + b, name="sum").sink(sink, name="out")

    graph = job.graph()
    assert isinstance(graph, g.JobGraph)
    assert graph.name == "wc" and graph.num_key_groups == 16
    assert [o.name for o in graph.operators] == ["src", "m", "f", "fm", "count", "sum", "out"]
    assert [o.kind for o in graph.operators] == [
        g.SOURCE, g.MAP, g.FILTER, g.FLAT_MAP, g.PROCESS, g.REDUCE, g.SINK,
    ]
    assert [o.parallelism for o in graph.operators] == [3, 3, 3, 3, 2, 2, 2]
    assert graph.operator("src").fn is src
    assert graph.operator("src").inputs == ()
    assert graph.operator("m").inputs == (g.InputDef("src"),)
    assert graph.operator("count").inputs == (g.InputDef("fm", key_fn),)
    assert graph.operator("count").keyed and not graph.operator("m").keyed
    assert graph.operator("out").fn is sink
    red = graph.operator("sum")
    assert isinstance(red.fn, ReduceFunction) and red.fn.fn(2, 3) == 5
    assert [o.name for o in graph.consumers("fm")] == ["count"]
    assert graph.consumers("out") == []


def test_graph_is_immutable(src, sink):
    job = StreamJob("j")
    job.source(src, name="s").sink(sink, name="k")
    graph = job.graph()
    with pytest.raises(dataclasses.FrozenInstanceError):
        graph.num_key_groups = 4  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        graph.operators[0].parallelism = 9  # type: ignore[misc]


def test_unknown_operator_lookup_lists_operators(src, sink):
    job = StreamJob("j")
    job.source(src, name="s").sink(sink, name="k")
    with raises_naming("nope", "'j'", "s, k"):
        job.graph().operator("nope")


def test_errors_are_reflow_errors():
    assert issubclass(JobDefinitionError, ReflowError)


# ---------------------------------------------------------------- names


def test_duplicate_names_via_builder(src, sink):
    job = StreamJob("j")
    s = job.source(src, name="dup")
    with raises_naming("dup", "used twice"):
        s.map(ident, name="dup")
    with raises_naming("dup", "used twice"):
        job.source(TestingSource([]), name="dup")
    with raises_naming("dup", "used twice"):
        s.key_by(key_fn).process(Count(), name="dup")
    with raises_naming("dup", "used twice"):
        s.sink(sink, name="dup")
    # failed calls add nothing
    assert [o.name for o in job.graph().operators] == ["dup"]


def test_duplicate_names_in_job_graph(src):
    a = g.OperatorDef("x", g.SOURCE, src, 1)
    b = g.OperatorDef("x", g.MAP, ident, 1, (g.InputDef("x"),))
    with raises_naming("x", "used twice"):
        g.JobGraph("j", 8, (a, b))


def test_default_naming(src, sink):
    job = StreamJob("j")
    (
        job.source(src)
        .map(ident)
        .filter(bool, name="explicit")
        .flat_map(lambda x: [x])
        .key_by(key_fn)
        .process(Count())
        .key_by(key_fn)
        .reduce(max)
        .sink(sink)
    )
    names = [o.name for o in job.graph().operators]
    assert names == [
        "source-1", "map-2", "explicit", "flat_map-3", "process-4", "reduce-5", "sink-6",
    ]


def test_default_name_avoids_explicit_names(src):
    job = StreamJob("j")
    job.source(src, name="map-1").map(ident)
    names = [o.name for o in job.graph().operators]
    assert len(set(names)) == 2 and names[0] == "map-1"


@pytest.mark.parametrize("bad", ["a/b", "/"])
def test_operator_name_without_slash(src, bad):
    with raises_naming(bad, "without '/'"):
        StreamJob("j").source(src, name=bad)
    with raises_naming(bad, "without '/'"):
        StreamJob("j").source(src, name="s").map(ident, name=bad)


def test_operator_def_name_must_be_nonempty(src):
    with raises_naming("", "non-empty"):
        g.OperatorDef("", g.SOURCE, src, 1)


# ---------------------------------------------------------------- parallelism


BAD_PARALLELISM = [-1, -5, 2.5, "2", 1.0, True, False]  # a bool is not a count


def one_operator_job(kind: str, p: Any, src: Any, sink: Any) -> StreamJob:
    """A job whose operator ``op`` is of ``kind`` at parallelism ``p`` (a source, or after
    one)."""
    job = StreamJob("j", num_key_groups=8)
    if kind == "source":
        job.source(src, name="op", parallelism=p)
        return job
    s = job.source(src, name="s")
    if kind == "map":
        s.map(ident, name="op", parallelism=p)
    elif kind == "filter":
        s.filter(bool, name="op", parallelism=p)
    elif kind == "flat_map":
        s.flat_map(ident, name="op", parallelism=p)
    elif kind == "process":
        s.key_by(key_fn).process(Count(), name="op", parallelism=p)
    elif kind == "reduce":
        s.key_by(key_fn).reduce(max, name="op", parallelism=p)
    elif kind == "sink":
        s.sink(sink, name="op", parallelism=p)
    else:  # pragma: no cover
        raise AssertionError(kind)
    return job


KINDS = ["source", "map", "filter", "flat_map", "process", "reduce", "sink"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("p", BAD_PARALLELISM, ids=repr)
def test_bad_parallelism_raises_naming_operator(kind, p, src, sink):
    with raises_naming("op", "parallelism"):
        one_operator_job(kind, p, src, sink)


@pytest.mark.parametrize("kind", KINDS)
def test_zero_parallelism_raises_naming_operator(kind, src, sink):
    with raises_naming("op", "parallelism"):
        one_operator_job(kind, 0, src, sink)


def test_operator_def_rejects_bad_parallelism_directly(src):
    for p in (0, -1, 1.5, None, True):
        with raises_naming("s", "integer >= 1"):
            g.OperatorDef("s", g.SOURCE, src, p)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["process", "reduce"])
def test_keyed_parallelism_above_num_key_groups(kind, src, sink):
    with raises_naming("op", "num_key_groups 8"):
        one_operator_job(kind, 9, src, sink)
    one_operator_job(kind, 8, src, sink)  # equal is fine


def test_keyed_op_with_job_default_above_num_key_groups(src):
    job = StreamJob("j", num_key_groups=4, parallelism=6)
    s = job.source(src, name="s", parallelism=1)
    with raises_naming("agg", "parallelism 6 > num_key_groups 4"):
        s.key_by(key_fn).process(Count(), name="agg")
    # stateless operators may exceed the number of key groups
    s.map(ident, name="m", parallelism=6)


def test_job_graph_checks_keyed_parallelism(src):
    ops = (
        g.OperatorDef("s", g.SOURCE, src, 1),
        g.OperatorDef("k", g.PROCESS, Count(), 5, (g.InputDef("s", key_fn),)),
    )
    with raises_naming("k", "num_key_groups 4"):
        g.JobGraph("j", 4, ops)
    assert g.JobGraph("j", 5, ops).operator("k").parallelism == 5


def test_parallelism_inheritance(src, sink):
    job = StreamJob("j", parallelism=2)
    s = job.source(src, name="s", parallelism=3)
    m = s.map(ident, name="m")
    m.filter(bool, name="f").sink(sink, name="out")
    k = m.key_by(key_fn).process(Count(), name="k")
    k.map(ident, name="after_k")
    k.key_by(key_fn).process(Count(), name="k4", parallelism=4).map(ident, name="after_k4")
    s.map(ident, name="explicit", parallelism=5)
    p = {o.name: o.parallelism for o in job.graph().operators}
    assert p == {
        "s": 3, "m": 3, "f": 3, "out": 3,  # stateless ops inherit from their input
        "k": 2,  # keyed ops get the job default
        "after_k": 2, "k4": 4, "after_k4": 4, "explicit": 5,
    }


def test_source_defaults_to_job_parallelism(src):
    job = StreamJob("j", parallelism=4)
    job.source(src, name="s")
    assert job.graph().operator("s").parallelism == 4


# ---------------------------------------------------------------- union


def test_union_merges_heads(src, sink):
    job = StreamJob("j", parallelism=7)
    a = job.source(src, name="a", parallelism=2)
    b = job.source(TestingSource([4]), name="b", parallelism=2)
    c = job.source(TestingSource([5]), name="c", parallelism=3)
    u = a.union(b, a)  # a repeated: no duplicate input
    assert u._heads == ("a", "b")
    u.map(ident, name="ab")
    a.union(b, c).map(ident, name="abc")
    a.union(c).key_by(key_fn).process(Count(), name="keyed")
    u.sink(sink, name="out")
    graph = job.graph()
    ab = graph.operator("ab")
    assert ab.inputs == (g.InputDef("a"), g.InputDef("b"))
    assert ab.parallelism == 2  # same parallelism on every head: inherited
    abc = graph.operator("abc")
    assert [i.upstream for i in abc.inputs] == ["a", "b", "c"]
    assert abc.parallelism == 7  # different parallelisms: the job default
    keyed = graph.operator("keyed")
    assert keyed.inputs == (g.InputDef("a", key_fn), g.InputDef("c", key_fn))
    assert [i.upstream for i in graph.operator("out").inputs] == ["a", "b"]
    assert sorted(o.name for o in graph.consumers("a")) == ["ab", "abc", "keyed", "out"]


def test_union_refuses_foreign_streams(src):
    j1, j2 = StreamJob("j1"), StreamJob("j2")
    a = j1.source(src, name="a")
    b = j2.source(src, name="b")
    with pytest.raises(JobDefinitionError, match="same job"):
        a.union(b)
    with pytest.raises(JobDefinitionError, match="same job"):
        a.union("not a stream")  # type: ignore[arg-type]


# ---------------------------------------------------------------- wrong objects


def test_unknown_upstream(src):
    ops = (
        g.OperatorDef("s", g.SOURCE, src, 1),
        g.OperatorDef("m", g.MAP, ident, 1, (g.InputDef("ghost"),)),
    )
    with raises_naming("m", "unknown operator 'ghost'"):
        g.JobGraph("j", 8, ops)


def test_upstream_must_come_earlier(src):
    ops = (
        g.OperatorDef("m", g.MAP, ident, 1, (g.InputDef("s"),)),
        g.OperatorDef("s", g.SOURCE, src, 1),
    )
    with raises_naming("m", "unknown operator 's'"):
        g.JobGraph("j", 8, ops)


def test_reading_from_a_sink(src, sink):
    ops = (
        g.OperatorDef("s", g.SOURCE, src, 1),
        g.OperatorDef("out", g.SINK, sink, 1, (g.InputDef("s"),)),
        g.OperatorDef("m", g.MAP, ident, 1, (g.InputDef("out"),)),
    )
    with raises_naming("m", "sink 'out'"):
        g.JobGraph("j", 8, ops)


def test_sink_returns_nothing_to_chain_on(src, sink):
    job = StreamJob("j")
    assert job.source(src, name="s").sink(sink, name="out") is None


def test_job_without_source():
    with pytest.raises(JobDefinitionError, match="job 'empty' has no source"):
        StreamJob("empty").graph()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(name="s", kind=g.SOURCE, inputs=(g.InputDef("x"),)), "cannot have inputs"),
        (dict(name="m", kind=g.MAP), "has no input"),
        (dict(name="k", kind=g.PROCESS, inputs=(g.InputDef("x"),)), "key_by"),
        (dict(name="r", kind=g.REDUCE, inputs=(g.InputDef("x", key_fn), g.InputDef("y"))),
         "key_by"),
        (dict(name="w", kind="window", inputs=(g.InputDef("x"),)), "unknown kind 'window'"),
    ],
)
def test_operator_def_invariants(kwargs, match):
    with raises_naming(kwargs["name"], match):
        g.OperatorDef(fn=ident, parallelism=1, **kwargs)


def test_process_requires_keyed_process_function(src):
    job = StreamJob("j")
    keyed = job.source(src, name="s").key_by(key_fn)
    with raises_naming("proc", "not a KeyedProcessFunction"):
        keyed.process(lambda v, ctx: [v], name="proc")  # type: ignore[arg-type]
    with raises_naming("proc", "not a KeyedProcessFunction"):
        keyed.process(Count, name="proc")  # the class, not an instance


@pytest.mark.parametrize("method", ["map", "flat_map", "filter"])
def test_non_callable_stateless_fn(src, method):
    job = StreamJob("j")
    s = job.source(src, name="s")
    with raises_naming("op", "is not callable"):
        getattr(s, method)(42, name="op")


def test_non_callable_reduce_and_key_fn(src):
    job = StreamJob("j")
    s = job.source(src, name="s")
    with raises_naming("r", "is not callable"):
        s.key_by(key_fn).reduce("sum", name="r")  # type: ignore[arg-type]
    with pytest.raises(JobDefinitionError, match="key_by.*is not callable"):
        s.key_by(42)  # a str is a column name (engine.columnar.batches)  # type: ignore[arg-type]


def test_non_source_object(sink):
    job = StreamJob("j")
    with raises_naming("src", "list is not an engine.io.sources.Source"):
        job.source([1, 2, 3], name="src")  # type: ignore[arg-type]
    with raises_naming("src", "TestingSink is not an engine.io.sources.Source"):
        job.source(sink, name="src")  # type: ignore[arg-type]
    with raises_naming("src", "is not an engine.io.sources.Source"):
        job.source(TestingSource, name="src")  # the class, not an instance


def test_non_sink_object(src):
    job = StreamJob("j")
    s = job.source(src, name="s")
    with raises_naming("out", "TestingSource is not an engine.io.sinks.Sink"):
        s.sink(src, name="out")  # type: ignore[arg-type]
    with raises_naming("out", "is not an engine.io.sinks.Sink"):
        s.sink(print, name="out")  # type: ignore[arg-type]


def test_dead_letter_must_be_a_sink(src, sink):
    job = StreamJob("j")
    s = job.source(src, name="s")
    with raises_naming("m", "dead_letter must be a Sink"):
        s.map(ident, name="m", dead_letter=src)  # type: ignore[arg-type]
    with raises_naming("p", "dead_letter must be a Sink"):
        s.key_by(key_fn).process(Count(), name="p", dead_letter="dlq")  # type: ignore[arg-type]
    s.map(ident, name="ok", dead_letter=sink)
    assert job.graph().operator("ok").dead_letter is sink


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(name=""), "non-empty name"),
        (dict(name=None), "non-empty name"),
        (dict(name="j", num_key_groups=0), "num_key_groups"),
        (dict(name="j", num_key_groups=1.5), "num_key_groups"),
        (dict(name="j", parallelism=0), "parallelism"),
        (dict(name="j", parallelism=-2), "parallelism"),
        (dict(name="j", parallelism=True), "parallelism must be an integer >= 1; got True"),
        (dict(name="j", num_key_groups=True), "num_key_groups must be an integer >= 1; got True"),
    ],
)
def test_stream_job_validation(kwargs, match):
    with pytest.raises(JobDefinitionError, match=match):
        StreamJob(**kwargs)


def test_job_graph_num_key_groups_validation(src):
    with pytest.raises(JobDefinitionError, match="num_key_groups must be an integer >= 1"):
        g.JobGraph("j", 0, (g.OperatorDef("s", g.SOURCE, src, 1),))


# ---------------------------------------------------------------- with_parallelism


def _keyed_graph(src, sink) -> g.JobGraph:
    job = StreamJob("j", num_key_groups=8, parallelism=2)
    s = job.source(src, name="s")
    s.key_by(key_fn).process(Count(), name="k").sink(sink, name="out")
    return job.graph()


def test_with_parallelism(src, sink):
    graph = _keyed_graph(src, sink)
    new = graph.with_parallelism("k", 6)
    assert new is not graph
    assert new.operator("k").parallelism == 6
    assert graph.operator("k").parallelism == 2  # original untouched
    for name in ("s", "out"):
        assert new.operator(name) is graph.operator(name)
    old_k, new_k = graph.operator("k"), new.operator("k")
    assert (new_k.kind, new_k.fn, new_k.inputs) == (old_k.kind, old_k.fn, old_k.inputs)
    assert new.name == graph.name and new.num_key_groups == graph.num_key_groups
    assert [o.name for o in new.operators] == [o.name for o in graph.operators]
    assert graph.with_parallelism("s", 5).operator("s").parallelism == 5


def test_with_parallelism_validates_again(src, sink):
    graph = _keyed_graph(src, sink)
    with raises_naming("k", "num_key_groups 8"):
        graph.with_parallelism("k", 9)
    with raises_naming("k", "integer >= 1"):
        graph.with_parallelism("k", 0)
    with raises_naming("out", "integer >= 1"):
        graph.with_parallelism("out", -1)


def test_with_parallelism_unknown_operator(src, sink):
    graph = _keyed_graph(src, sink)
    with raises_naming("nope"):
        graph.with_parallelism("nope", 3)


# ---------------------------------------------------------------- JobConfig


def test_job_config_defaults_are_valid():
    c = JobConfig()
    assert c.batch_size == 1000 and c.credits == 4 and c.metrics_host == "127.0.0.1"
    assert StreamJob("j").config == JobConfig()
    custom = JobConfig(batch_size=10)
    assert StreamJob("j", config=custom).config is custom


@pytest.mark.parametrize(
    "field,value",
    [
        ("batch_size", 0),
        ("batch_size", -1),
        ("linger_ms", -0.1),
        ("credits", 0),
        ("latency_marker_interval_ms", 0),
        ("metrics_port", -1),
        ("metrics_port", 65536),
        ("metrics_poll_interval_s", 0),
        ("task_num_cpus", -0.5),
        ("source_poll_records", 0),
        ("timer_check_interval_ms", 0),
        ("drrs_max_subscales_per_task", 0),
        ("drrs_max_subscales", 0),
    ],
)
def test_job_config_validation(field, value):
    with pytest.raises(JobDefinitionError, match=f"JobConfig: {field} must"):
        JobConfig(**{field: value})


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(batch_size=1),
        dict(linger_ms=0),
        dict(credits=1),
        dict(metrics_port=None),
        dict(metrics_port=65535),
        dict(metrics_port=0),
        dict(task_num_cpus=0),
        dict(task_num_cpus=0.25),
        dict(drrs_max_subscales=1),
        dict(drrs_max_subscales=None),
    ],
)
def test_job_config_edge_values_accepted(kwargs):
    c = JobConfig(**kwargs)
    for k, v in kwargs.items():
        assert getattr(c, k) == v


def test_job_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        JobConfig().batch_size = 5  # type: ignore[misc]
