"""Fluent builders producing the logical graph: ``StreamJob``, ``Stream``, ``KeyedStream``.

Every builder call validates at once, so an invalid job fails where it is written, with the
operator named. Counts (parallelism, num_key_groups, lateness) go through
``engine.dataflow.config.check_count``: a bool is never a count. A name given is used as given: an
empty one is refused, never replaced by a generated one (only ``name=None`` generates).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from engine.checkpoints.store import absolute_location
from engine.dataflow import graph as g
from engine.dataflow.config import JobConfig, check_count
from engine.dataflow.keygroups import DEFAULT_NUM_KEY_GROUPS
from engine.errors import JobDefinitionError
from engine.io.sinks import Sink
from engine.io.sources import Source
from engine.operators.functions import KeyedProcessFunction, ReduceFunction
from engine.operators.windows import AggregateFunction, WindowJoin, WindowOperator
from engine.time.event_time import WatermarkStrategy, Window, WindowAssigner

DETACHED_ENV = "REFLOW_DETACHED"  # "1": run() starts the job detached (reflow run --detached)

if TYPE_CHECKING:
    from engine.runtime import JobHandle


class StreamJob:
    """A job under construction. ``run()`` deploys it on Ray and returns a ``JobHandle``."""

    def __init__(
        self,
        name: str,
        num_key_groups: int = DEFAULT_NUM_KEY_GROUPS,
        parallelism: int = 1,
        config: JobConfig | None = None,
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise JobDefinitionError(f"a job needs a non-empty name; got {name!r}")
        if any(c in name for c in "/\\") or not name.isprintable():
            raise JobDefinitionError(
                f"job name {name!r} holds a path separator or a control character; it names "
                "the job's actors, files and checkpoint directory: use letters, digits, "
                "spaces, '.', '_' or '-'")
        num_key_groups = check_count(f"job {name!r}: num_key_groups", num_key_groups,
                                     error=JobDefinitionError)
        parallelism = check_count(f"job {name!r}: default parallelism", parallelism,
                                  error=JobDefinitionError)
        if config is not None and not isinstance(config, JobConfig):
            raise JobDefinitionError(
                f"job {name!r}: config must be an engine.dataflow.config.JobConfig instance; got "
                f"{config!r}"
            )
        self.name = name
        self.num_key_groups = num_key_groups
        self.default_parallelism = parallelism
        self.config = config if config is not None else JobConfig()
        self._ops: list[g.OperatorDef] = []
        self._counter = 0

    # -- building
    def source(
        self, source: Source, name: str | None = None, parallelism: int | None = None,
        watermarks: WatermarkStrategy | None = None,
    ) -> Stream:
        """A source; with ``watermarks`` its tasks emit event-time watermarks."""
        if not isinstance(source, Source):
            raise JobDefinitionError(
                f"source {name or '?'!r}: {type(source).__name__} is not an engine.io.sources.Source"
            )
        if watermarks is not None and not isinstance(watermarks, WatermarkStrategy):
            raise JobDefinitionError(f"source {name or '?'!r}: watermarks must be a WatermarkStrategy")
        op = self._add(g.SOURCE, name, source, _or(parallelism, self.default_parallelism), (),
                       watermarks=watermarks)
        return Stream(self, (op.name,))

    def _auto_name(self, kind: str) -> str:
        taken = {o.name for o in self._ops}
        while True:
            self._counter += 1
            name = f"{kind}-{self._counter}"
            if name not in taken:
                return name

    def _add(
        self,
        kind: str,
        name: str | None,
        fn: Any,
        parallelism: int,
        inputs: tuple[g.InputDef, ...],
        dead_letter: Sink | None = None,
        late_sink: Sink | None = None,
        watermarks: WatermarkStrategy | None = None,
    ) -> g.OperatorDef:
        if name is None:
            name = self._auto_name(kind)
        if any(o.name == name for o in self._ops):
            raise JobDefinitionError(
                f"operator name {name!r} is used twice; give each operator a unique name"
            )
        if dead_letter is not None and not isinstance(dead_letter, Sink):
            raise JobDefinitionError(f"operator {name!r}: dead_letter must be a Sink")
        if late_sink is not None and not isinstance(late_sink, Sink):
            raise JobDefinitionError(f"operator {name!r}: late_sink must be a Sink")
        op = g.OperatorDef(name, kind, fn, parallelism, inputs, dead_letter, late_sink, watermarks)
        if op.keyed and parallelism > self.num_key_groups:
            raise JobDefinitionError(
                f"keyed operator {name!r} has parallelism {parallelism} > num_key_groups "
                f"{self.num_key_groups}; lower it or raise num_key_groups"
            )
        self._ops.append(op)
        return op

    def _parallelism_of(self, names: tuple[str, ...]) -> int:
        ps = {o.parallelism for o in self._ops if o.name in names}
        return ps.pop() if len(ps) == 1 else self.default_parallelism

    def graph(self) -> g.JobGraph:
        """The validated logical graph."""
        return g.JobGraph(self.name, self.num_key_groups, tuple(self._ops))

    def run(self, address: str | None = None, controllers: Iterable[Any] = (),
            restore_from: str | None = None,
            allow_non_restored_state: bool = False,
            detached: bool | None = None) -> JobHandle:
        """Deploy on Ray (``ray.init()`` is called when no cluster is connected) and run
        ``controllers`` (``controllers.base.Controller`` instances) on the job.

        ``restore_from``: start from a savepoint or checkpoint (its directory or URI; a
        job's checkpoint directory ``<checkpoint_dir>/<job id>`` means its latest complete
        checkpoint), at this job's parallelism: keyed state is re-assigned by key group,
        operators are matched by name, sinks commit the savepoint's output. State of an
        operator this job does not have refuses the restore (``RestoreError``) unless
        ``allow_non_restored_state`` drops it.

        ``detached``: the job outlives this process and its JobMaster's (see
        ``engine.runtime.handle.deploy``); None: detached when the environment variable
        ``REFLOW_DETACHED`` is ``1`` (``reflow run --detached``)."""
        graph = self.graph()
        if not any(op.kind == g.SINK for op in graph.operators):
            raise JobDefinitionError(
                f"job {self.name!r} has no sink, so nothing it computes would be kept: end "
                "each branch with .sink(...) (engine.io.sinks, engine.io.testing.TestingSink)")
        if restore_from is not None:
            if not isinstance(restore_from, str) or not restore_from.strip():
                raise JobDefinitionError(
                    f"job {self.name!r}: restore_from={restore_from!r} names no savepoint or "
                    "checkpoint; give its directory or URI, or leave restore_from out")
            restore_from = absolute_location(restore_from)
        from engine.runtime import deploy

        if detached is None:
            detached = os.environ.get(DETACHED_ENV, "") == "1"
        return deploy(graph, self.config, address=address, controllers=tuple(controllers),
                      restore_from=restore_from,
                      allow_non_restored_state=allow_non_restored_state, detached=detached)


def _or(parallelism: int | None, default: int) -> int:
    # ``parallelism=0`` must reach validation, not silently become the default
    return default if parallelism is None else parallelism


def _check_callable(fn: Any, what: str, name: str | None) -> None:
    if not callable(fn):
        raise JobDefinitionError(f"{what} {name or ''!r}: {fn!r} is not callable")


class Stream:
    """The output of one or more operators (more than one after ``union``)."""

    def __init__(self, job: StreamJob, heads: tuple[str, ...]) -> None:
        self._job = job
        self._heads = heads

    def _inputs(self, key_fn: Callable[[Any], Any] | None = None) -> tuple[g.InputDef, ...]:
        return tuple(g.InputDef(h, key_fn) for h in self._heads)

    def _stateless(
        self, kind: str, fn: Any, name: str | None, parallelism: int | None, dead_letter: Sink | None
    ) -> Stream:
        _check_callable(fn, kind, name)
        p = _or(parallelism, self._job._parallelism_of(self._heads))
        op = self._job._add(kind, name, fn, p, self._inputs(), dead_letter)
        return Stream(self._job, (op.name,))

    def map(
        self, fn: Callable[[Any], Any], name: str | None = None, parallelism: int | None = None,
        dead_letter: Sink | None = None,
    ) -> Stream:
        return self._stateless(g.MAP, fn, name, parallelism, dead_letter)

    def flat_map(
        self, fn: Callable[[Any], Iterable[Any]], name: str | None = None,
        parallelism: int | None = None, dead_letter: Sink | None = None,
    ) -> Stream:
        return self._stateless(g.FLAT_MAP, fn, name, parallelism, dead_letter)

    def filter(
        self, fn: Callable[[Any], bool], name: str | None = None, parallelism: int | None = None,
        dead_letter: Sink | None = None,
    ) -> Stream:
        return self._stateless(g.FILTER, fn, name, parallelism, dead_letter)

    def map_batches(
        self, fn: Callable[[Any], Any], batch_format: str = "pyarrow", name: str | None = None,
        parallelism: int | None = None, dead_letter: Sink | None = None,
    ) -> Stream:
        """``fn`` over whole batches (Ray Data's ``map_batches``): it gets a
        ``pyarrow.Table`` (``batch_format="pyarrow"``), a dict of numpy arrays ("numpy") or
        a pandas DataFrame ("pandas", needs pandas) and returns one of those; its output is
        a columnar stream (``engine.columnar.batches``; per-record operators after it see dict
        rows). Records that are not column batches reach it as batches of their dict rows.
        Output rows keep their input's timestamps when ``fn`` returns as many rows, else
        take the batch's latest. A batch whose call raises goes whole to ``dead_letter``
        (each record with the error) or fails the job."""
        from engine.operators.vectorised import MapBatches

        _check_callable(fn, "map_batches", name)
        try:
            spec = MapBatches(fn, batch_format)
        except ValueError as exc:
            raise JobDefinitionError(f"map_batches {name or ''!r}: {exc}") from None
        return self._stateless(g.MAP_BATCHES, spec, name, parallelism, dead_letter)

    def key_by(self, key_fn: Callable[[Any], Any] | str) -> KeyedStream:
        """Partition by ``key_fn(record)``, or by a column (``key_by("user")``: a column of
        a columnar stream, or the field of a dict row): records with equal keys go to the
        same task and share keyed state. A column's key groups are computed a batch at a
        time, with exactly the hash of the per-record path (``engine.columnar.batches``).

        A key is a str, bytes, int, float, bool, None or a tuple of them; keys equal in Python
        (``1``, ``1.0``, ``True``) are one key. A NaN key (a float or numpy float, alone or
        inside a tuple) is refused: NaN never equals itself, so every NaN record would be a key
        of its own and nothing would group. The check runs in the sending task where the key
        is hashed to its key group (``engine.dataflow.keygroups``), which happens only when a key is not
        in the per-task key-group cache, and NaN never enters it: it costs nothing for str,
        bytes and int keys and one comparison per uncached float. A refused key (NaN, or a type
        with no stable hash) fails the job as a key_by error naming the operator before the
        key_by, the task and the record (``InvalidKeyError`` as the cause); map NaN to a real
        key (e.g. None) or filter such records out before ``key_by``.
        """
        if isinstance(key_fn, str):
            from engine.columnar.batches import ColumnKey

            if not key_fn:
                raise JobDefinitionError("key_by(''): a key column needs a name")
            key_fn = ColumnKey(key_fn)
        _check_callable(key_fn, "key_by", None)
        return KeyedStream(self._job, self._heads, key_fn)

    def union(self, *others: Stream) -> Stream:
        heads = list(self._heads)
        for o in others:
            if not isinstance(o, Stream) or o._job is not self._job:
                raise JobDefinitionError("union takes streams of the same job")
            heads.extend(h for h in o._heads if h not in heads)
        return Stream(self._job, tuple(heads))

    def sink(self, sink: Sink, name: str | None = None, parallelism: int | None = None,
             dead_letter: Sink | None = None) -> None:
        """Write the stream to ``sink``. A batch whose write raises is never written again
        (records before the failing one may already be in a non-idempotent sink): with
        ``dead_letter`` every record of the batch goes there as
        ``(operator, task_index, record, error)``; without it the job fails naming the
        operator, the task and the batch's first record."""
        if not isinstance(sink, Sink):
            raise JobDefinitionError(
                f"sink {name or '?'!r}: {type(sink).__name__} is not an engine.io.sinks.Sink"
            )
        p = _or(parallelism, self._job._parallelism_of(self._heads))
        self._job._add(g.SINK, name, sink, p, self._inputs(), dead_letter)


class KeyedStream:
    """A stream partitioned by ``key_fn``; its operators keep state per key."""

    def __init__(self, job: StreamJob, heads: tuple[str, ...], key_fn: Callable[[Any], Any]) -> None:
        self._job = job
        self._heads = heads
        self._key_fn = key_fn

    def _keyed(self, kind: str, fn: Any, name: str | None, parallelism: int | None,
               dead_letter: Sink | None, late_sink: Sink | None = None,
               other: KeyedStream | None = None) -> Stream:
        p = _or(parallelism, self._job.default_parallelism)
        inputs = tuple(g.InputDef(h, self._key_fn, 0) for h in self._heads)
        if other is not None:
            inputs += tuple(g.InputDef(h, other._key_fn, 1) for h in other._heads)
        op = self._job._add(kind, name, fn, p, inputs, dead_letter, late_sink)
        return Stream(self._job, (op.name,))

    def window(self, assigner: WindowAssigner, allowed_lateness_ms: int = 0,
               late_sink: Sink | None = None) -> WindowedStream:
        """Group each key's records into windows (``engine.time.event_time.tumbling_event_time`` etc.).

        Records later than ``allowed_lateness_ms`` after their windows fired are counted and
        go to ``late_sink`` when given."""
        if not isinstance(assigner, WindowAssigner):
            raise JobDefinitionError("window() takes a WindowAssigner from engine.time.event_time")
        allowed_lateness_ms = check_count("window(): allowed_lateness_ms", allowed_lateness_ms,
                                          minimum=0, error=JobDefinitionError)
        return WindowedStream(self, assigner, allowed_lateness_ms, late_sink)

    def window_join(
        self, other: KeyedStream, assigner: WindowAssigner, join_fn: Callable[[Any, Any], Any],
        name: str | None = None, parallelism: int | None = None, late_sink: Sink | None = None,
        allowed_lateness_ms: int = 0,
    ) -> Stream:
        """For every window, ``join_fn(left, right)`` for each pair of records of this
        stream (left) and ``other`` (right) whose keys are equal."""
        if not isinstance(other, KeyedStream) or other._job is not self._job:
            raise JobDefinitionError(f"window_join {name or ''!r}: other must be a keyed stream of this job")
        _check_callable(join_fn, "window_join", name)
        if not isinstance(assigner, WindowAssigner):
            raise JobDefinitionError(f"window_join {name or ''!r}: needs a WindowAssigner")
        allowed_lateness_ms = check_count(f"window_join {name or ''!r}: allowed_lateness_ms",
                                          allowed_lateness_ms, minimum=0,
                                          error=JobDefinitionError)
        return self._keyed(g.PROCESS, WindowJoin(assigner, join_fn, allowed_lateness_ms), name,
                           parallelism, None, late_sink, other)

    def process(
        self, fn: KeyedProcessFunction, name: str | None = None, parallelism: int | None = None,
        dead_letter: Sink | None = None,
    ) -> Stream:
        if not isinstance(fn, KeyedProcessFunction):
            raise JobDefinitionError(
                f"process {name or '?'!r}: {type(fn).__name__} is not a KeyedProcessFunction"
            )
        return self._keyed(g.PROCESS, fn, name, parallelism, dead_letter)

    def reduce(
        self, fn: Callable[[Any, Any], Any], name: str | None = None,
        parallelism: int | None = None, dead_letter: Sink | None = None,
    ) -> Stream:
        """Emit the running reduced value of the key for every input (Flink's ``reduce``)."""
        _check_callable(fn, "reduce", name)
        return self._keyed(g.REDUCE, ReduceFunction(fn), name, parallelism, dead_letter)

    def aggregate(self, *aggregations: Any, name: str | None = None,
                  parallelism: int | None = None) -> Stream:
        """Running aggregations per key, vectorised (``engine.operators.vectorised``): ``Count()``,
        ``Sum(col)``, ``Min(col)``, ``Max(col)``, ``Mean(col)``. For every input record it
        emits a dict row with the key (column named as the key column, or ``key``) and each
        aggregation's value for that key after the record (``count()``, ``sum(col)``, ...),
        as a column batch. Their state is keyed state: every rescale protocol moves it."""
        from engine.errors import ColumnarError
        from engine.operators.vectorised import ColumnAggregate, key_name_of

        try:
            fn = ColumnAggregate(tuple(aggregations), key_name_of(self._key_fn))
        except ColumnarError as exc:
            raise JobDefinitionError(f"aggregate {name or ''!r}: {exc}") from None
        return self._keyed(g.AGGREGATE, fn, name, parallelism, None)


class WindowedStream:
    """A keyed stream grouped into windows; finish it with reduce, aggregate or process."""

    def __init__(self, keyed: KeyedStream, assigner: WindowAssigner, lateness: int,
                 late_sink: Sink | None) -> None:
        self._keyed = keyed
        self._assigner = assigner
        self._lateness = lateness
        self._late_sink = late_sink

    def _op(self, kind: str, fn: Any, window_fn: Any, name: str | None,
            parallelism: int | None) -> Stream:
        op = WindowOperator(self._assigner, kind, fn, window_fn, self._lateness)
        return self._keyed._keyed(g.PROCESS, op, name, parallelism, None, self._late_sink)

    def reduce(self, fn: Callable[[Any, Any], Any], window_fn: Any = None,
               name: str | None = None, parallelism: int | None = None) -> Stream:
        """Reduce each window's records with ``fn``; emit ``window_fn(key, window, result)``
        (or the result) when the window fires."""
        _check_callable(fn, "window reduce", name)
        return self._op("reduce", fn, window_fn, name, parallelism)

    def aggregate(self, agg: Any, *more: Any, window_fn: Any = None,
                  name: str | None = None, parallelism: int | None = None) -> Stream:
        """Aggregate each window's records, in one of two forms.

        ``aggregate(AggregateFunction, window_fn=None)``: per record; emits
        ``window_fn(key, window, result)`` (or the result) when the window fires.

        ``aggregate(Count(), Sum("v"), ...)`` (``engine.operators.vectorised``'s aggregations, on
        event-time windows): vectorised a batch at a time (``engine.operators.window_aggregates``),
        with the same windows, firing and lateness rule; emits per (key, window) a row
        ``{key column, "window_start", "window_end", "count()", "sum(v)", ...}`` as a
        column batch."""
        from engine.operators.vectorised import Aggregation

        if isinstance(agg, Aggregation):
            return self._vectorised((agg, *more), window_fn, name, parallelism)
        if len(more) > 1 or (more and window_fn is not None):
            raise JobDefinitionError(f"aggregate {name or ''!r}: takes one AggregateFunction "
                                     "and a window_fn, or Count(), Sum(col), ... aggregations")
        if not isinstance(agg, AggregateFunction):
            raise JobDefinitionError(f"aggregate {name or ''!r}: needs an AggregateFunction, "
                                     "or Count(), Sum(col), Min(col), Max(col), Mean(col)")
        return self._op("aggregate", agg, more[0] if more else window_fn, name, parallelism)

    def _vectorised(self, aggregations: tuple[Any, ...], window_fn: Any, name: str | None,
                    parallelism: int | None) -> Stream:
        from engine.errors import ColumnarError
        from engine.operators.vectorised import key_name_of
        from engine.operators.window_aggregates import ColumnWindowAggregate

        if window_fn is not None:
            raise JobDefinitionError(f"aggregate {name or ''!r}: vectorised aggregations emit "
                                     "rows of their own; map them after, not with window_fn")
        try:
            fn = ColumnWindowAggregate(self._assigner, aggregations,
                                       key_name_of(self._keyed._key_fn), self._lateness)
        except ColumnarError as exc:
            raise JobDefinitionError(f"aggregate {name or ''!r}: {exc}") from None
        return self._keyed._keyed(g.WINDOW_AGGREGATE, fn, name, parallelism, None,
                                  self._late_sink)

    def process(self, fn: Callable[[Any, Window, list[Any]], Any], name: str | None = None,
                parallelism: int | None = None) -> Stream:
        """Emit ``fn(key, window, elements)`` (an iterable) when each window fires."""
        _check_callable(fn, "window process", name)
        return self._op("process", fn, None, name, parallelism)
