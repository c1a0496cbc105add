"""A synthetic job for controller unit tests: operators with known true rates, the metrics
window and the view they would produce at given parallelisms and source rate (pure).

The model: a chain ``src -> op1 -> op2 -> ...``; operator ``k`` serves ``rate`` records per
second per task of useful time and emits ``ratio`` records per record in. Throughput is the
source's demand or the slowest operator's capacity, whichever is lower; the source's
backlog grows by the difference. Each task of an operator gets ``weights[i]`` of its input
(even by default: a skew makes one task busier).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from engine.control.reconfiguration import JobView, OperatorView, RescaleRecord
from engine.dataflow.keygroups import uniform_assignment
from engine.observability.latency import LatencyHistogram
from engine.observability.rates import MetricsWindow, OperatorRates, TaskRates


@dataclass
class Stage:
    name: str
    rate: float          # true processing rate per task (records per useful second)
    ratio: float = 1.0   # records out per record in
    keyed: bool = True
    parallelism: int = 1
    weights: Sequence[float] | None = None  # share of the input per task (None: even)
    state_bytes: int = 0


@dataclass
class Pipeline:
    stages: list[Stage]
    source_rate: float
    num_key_groups: int = 128
    backlog: int = 0
    now: float = 1000.0
    seconds: float = 10.0
    history: list[RescaleRecord] = field(default_factory=list)
    last_rescale_end: float | None = None
    group_load: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    group_bytes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    def _weights(self, s: Stage) -> list[float]:
        w = list(s.weights) if s.weights is not None else [1.0] * s.parallelism
        total = sum(w)
        return [x / total for x in w]

    def throughput(self) -> float:
        """Records/s the source manages to emit."""
        limit = self.source_rate
        factor = 1.0
        for s in self.stages:
            busiest = max(self._weights(s))
            cap = s.rate / busiest  # input at which the busiest task is always busy
            limit = min(limit, cap / factor)
            factor *= s.ratio
        return limit

    def window(self) -> MetricsWindow:
        w = self.seconds
        thr = self.throughput()
        growth = (self.source_rate - thr) * w
        ops: dict[str, OperatorRates] = {
            "src": OperatorRates("src", w, (TaskRates(
                "src/0", "src", 0, w, int(thr * w), int(thr * w), 0.01 * w, 0.0, 0.0, 0, 0, 0,
                self.backlog, int(growth)),))}
        flow = thr
        for s in self.stages:
            tasks = []
            for i, share in enumerate(self._weights(s)):
                rin = flow * share * w
                tasks.append(TaskRates(f"{s.name}/{i}", s.name, i, w, int(rin),
                                       int(rin * s.ratio), rin / s.rate, 0.0, 0.0, 0,
                                       s.state_bytes // s.parallelism,
                                       self.num_key_groups // s.parallelism if s.keyed else 0))
            ops[s.name] = OperatorRates(s.name, w, tuple(tasks))
            flow *= s.ratio
        return MetricsWindow(self.now - w, self.now, ops, LatencyHistogram())

    def view(self, rescaling: frozenset[str] = frozenset()) -> JobView:
        names = ["src"] + [s.name for s in self.stages]
        ops = {"src": OperatorView("src", ("src",), "source", False, 1, self.num_key_groups,
                                   (), (names[1],), ("src/0",))}
        for k, s in enumerate(self.stages):
            outputs = (names[k + 2],) if k + 2 < len(names) else ()
            ops[s.name] = OperatorView(
                s.name, (s.name,), "process" if s.keyed else "map", s.keyed, s.parallelism,
                self.num_key_groups, (names[k],), outputs,
                tuple(f"{s.name}/{i}" for i in range(s.parallelism)),
                uniform_assignment(self.num_key_groups, s.parallelism) if s.keyed else ())
        return JobView("synthetic", self.now, self.num_key_groups, ops, rescaling, False,
                       self.last_rescale_end, tuple(self.history), self.group_load,
                       self.group_bytes)

    def apply(self, decisions: Sequence[object]) -> None:
        """Carry out the Scale decisions (the new tasks share the input evenly) and mark a
        rescale that ended now."""
        from engine.control.reconfiguration import Scale

        for d in decisions:
            if isinstance(d, Scale):
                s = self.stage(d.operator)
                s.parallelism = d.parallelism
                s.weights = None
                self.last_rescale_end = self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def record(operator: str, protocol: str, megabytes: float, disruption_s: float,
           at: float, rate: float = 1000.0, old: int = 2, new: int = 4) -> RescaleRecord:
    """A measured rescale for a synthetic history."""
    return RescaleRecord(operator, protocol, old, new, at, at + 1.0, 16, int(megabytes * 1e6),
                         False, rate, int(rate * disruption_s), 10.0,
                         10.0 + disruption_s * 1000, disruption_s, "test")
