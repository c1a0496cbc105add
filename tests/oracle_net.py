"""A job's task cores in one process, delivered like the runtime delivers them, for the
multi-stage oracle (``tests/unit/test_oracle_jobs.py``).

``OracleNet`` builds the cores of any ``StreamJob`` as the JobMaster deploys them (as
``tests.unit.test_drrs_core.DNet`` does) and is the network between them, with the
runtime's ordering and nothing stronger:

* **data**: frames wait per channel; a channel's frames arrive in order (FIFO), channels
  interleave at random (``deliver``: a random prefix of each of a random share of the
  channels, in random channel order);
* **priority path**: messages wait per (sender, receiver) pair, in order within a pair
  (the shell batches them in order, ``PriorityBatch``), and overtake every data frame
  (they are delivered in the same rounds as frames, before them, so a trigger barrier may
  pass records sent long before it; they may also lag behind later frames, as two actor
  calls may);
* **control calls** (``after_send``): what a call produced leaves at once; a call that
  removes output channels (``RemoveOutputChannels``) or stops a task (``StopTask``,
  ``ReleaseSource``) returns only once the receivers took every frame sent on those
  channels (``engine.runtime.task_actor``: ``_settle_in_flight``).

Sources read at random (1-4 records per poll), emit watermarks at random, and stop
``keep_back`` records short of their end while a rescale runs (so a rescale always finds
input). ``LateGate``: a record made *definitely late* by construction: its source holds
before it (a ``SourceGate``) until every non-source task's watermark passed ``threshold``,
so it is late wherever it goes, in every run, whatever the interleaving; records not gated
are never late when their disorder is within the watermark bound.

Every core ever created stays in ``all_cores`` (removed tasks keep their late-record
counts). Seeded: one ``random.Random`` drives every choice.
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from engine.api import StreamJob
from engine.dataflow.deployment import ChannelIds, Deployment, initial_deployment
from engine.dataflow.physical import plan_physical
from engine.io.sinks import Sink, SinkWriter
from engine.io.testing import SourceGate
from engine.task.channel import OutFrame
from engine.task.core import TaskCore
from engine.time.clock import Clock, ManualClock
from engine.wire.messages import Ack, ReleaseSource, RemoveOutputChannels, StopTask
from migration.coordinator import SendControl
from migration.participant import new_task_core
from tests.harness import deploy, make_spec, records_left, wire

# ------------------------------------------------------------------------------- sinks

_MEMORY: dict[str, list[tuple[Any, int]]] = {}
_names = itertools.count()


class MemorySink(Sink):
    """Collects (value, timestamp) in this process in the order written (exact per-key
    order, no files). At-least-once: not for runs that restore from a checkpoint. Task
    specs are deep-copied per task: every copy writes to the same list (by name)."""

    def __init__(self) -> None:
        self.name = f"memory-sink-{next(_names)}"
        _MEMORY[self.name] = []

    def open(self, task_index: int, parallelism: int, clock: Clock) -> SinkWriter:
        return _MemoryWriter(_MEMORY[self.name])

    def results(self) -> list[Any]:
        return [v for v, _ in _MEMORY[self.name]]

    def results_with_timestamps(self) -> list[tuple[Any, int]]:
        return list(_MEMORY[self.name])

    def drop(self) -> None:
        _MEMORY.pop(self.name, None)


class _MemoryWriter(SinkWriter):
    def __init__(self, out: list[tuple[Any, int]]) -> None:
        self.out = out

    def write(self, values: Any, timestamps: Any) -> None:
        self.out.extend(zip(values, timestamps, strict=True))

    def close(self) -> None:
        pass


# ------------------------------------------------------------------------------- gates


@dataclass
class LateGate:
    """Source ``source`` holds before record ``gate.after`` until every non-source task's
    watermark is at least ``threshold`` (then that record is late at every event-time
    operator it or its descendants reach)."""

    source: str
    gate: SourceGate
    threshold: int


# ------------------------------------------------------------------------------- the net


class OracleNet:
    """The cores of ``job``, wired and started like ``JobMaster.start()``; the network
    between them (see the module doc). Satisfies ``tests.harness.Cores``."""

    def __init__(self, job: StreamJob, clock: ManualClock | None = None,
                 gates: Iterable[LateGate] = ()) -> None:
        self.clock = clock or ManualClock()
        self.config = job.config
        self.dep: Deployment = initial_deployment(plan_physical(job.graph()), "j")
        self.ids = ChannelIds()
        self.cores: dict[str, TaskCore] = {}
        self.all_cores: list[TaskCore] = []
        self.gates = list(gates)
        deploy(self)  # the engine's deploy steps (engine.control.steps.DeploySteps)
        self.frames: dict[int, deque[OutFrame]] = {}     # channel -> frames, in order
        self.sender: dict[int, str] = {}                 # channel -> sending task
        self.prio: dict[tuple[str, str], deque[Any]] = {}  # (sender, receiver) -> messages
        self.dropped: list[OutFrame] = []                # frames to tasks that are gone
        self.rounds = 0

    # -- harness.Cores
    def new_core(self, dep: Deployment, vertex: str, index: int, name: str) -> TaskCore:
        core = new_task_core(make_spec(dep, vertex, index, name, self.config), self.clock)
        self.all_cores.append(core)
        return core

    def forget_in_flight(self) -> None:
        """Every task is being replaced (a restore): what was on its way is gone."""
        self.frames.clear()
        self.prio.clear()

    def sources(self) -> list[TaskCore]:
        return [c for c in self.cores.values() if c.is_source]

    def tasks_of(self, vertex: str) -> list[TaskCore]:
        return [self.cores[n] for n in self.dep.tasks[vertex]]

    # -- taking and delivering
    def collect(self) -> None:
        """Take every frame and priority message the cores produced (a frame that lingered
        ``linger_ms`` is flushed by ``flush_due``)."""
        for name, core in self.cores.items():
            core.flush_due()
            out = core.router.outbox
            while out:
                f = out.popleft()
                self.frames.setdefault(f.channel_id, deque()).append(f)
                self.sender[f.channel_id] = name
            while core.priority_out:
                target, msg = core.priority_out.pop(0)
                self.prio.setdefault((name, target), deque()).append(wire(msg))
            core.consumed.clear()  # the shell's acknowledgements: no credits here

    def _deliver_frame(self, f: OutFrame) -> None:
        core = self.cores.get(f.target)
        if core is None:
            self.dropped.append(f)
            return
        core.receive(f.channel_id, f.seq, f.payload)

    def _deliver_prio(self, target: str, msg: Any) -> None:
        core = self.cores.get(target)
        if core is not None:
            assert core.handle(msg) == Ack(), f"{target} refused {msg!r}"

    def deliver(self, rng: random.Random | None = None, p: float = 1.0,
                p_prio: float = 1.0) -> int:
        """Priority messages first (a random prefix of a random share of the pairs), then
        frames (a random prefix of a random share of the channels); everything without
        ``rng``. Returns how many were delivered."""
        self.collect()
        n = 0
        # sorted first: the order the queues were made in may follow an iteration over
        # objects hashed by address (an output router's dirty buffers), not the seed
        pairs = sorted(k for k, q in self.prio.items() if q)
        if rng is not None:
            rng.shuffle(pairs)
        for pair in pairs:
            q = self.prio[pair]
            if rng is not None and rng.random() >= p_prio:
                continue
            for _ in range(len(q) if rng is None else rng.randint(1, len(q))):
                self._deliver_prio(pair[1], q.popleft())
                n += 1
            self.collect()  # a handshake's answer may follow at once
        chans = sorted(c for c, q in self.frames.items() if q)
        if rng is not None:
            rng.shuffle(chans)
        for cid in chans:
            q = self.frames[cid]
            if rng is not None and rng.random() >= p:
                continue
            for _ in range(len(q) if rng is None else rng.randint(1, len(q))):
                self._deliver_frame(q.popleft())
                n += 1
        return n

    def in_flight(self) -> int:
        return sum(len(q) for q in self.frames.values()) + sum(len(q) for q in self.prio.values())

    def step_all(self, rng: random.Random | None = None) -> bool:
        """Step every core (a random number of times in random order with ``rng``; else
        until it can do nothing)."""
        cores = list(self.cores.values())
        did = False
        if rng is None:
            for c in cores:
                while c.step():
                    did = True
            return did
        rng.shuffle(cores)
        for c in cores:
            for _ in range(rng.randint(0, 3)):
                if not c.step():
                    break
                did = True
        return did

    def pump(self) -> None:
        """Step and deliver everything until nothing moves."""
        while True:
            did = self.step_all()
            moved = self.deliver()
            if not did and not moved:
                return

    # -- sources and time
    def open_gates(self) -> None:
        if not self.gates:
            return
        wms = [c.watermark for c in self.cores.values() if not c.is_source]
        low = min(wms) if wms else 0
        for g in self.gates:
            if not g.gate.is_open() and low >= g.threshold:
                g.gate.open()

    def read_sources(self, rng: random.Random, keep_back: int, p: float = 0.6) -> None:
        for src in self.sources():
            if src.status != "running" or src.reader is None:
                continue
            if rng.random() < p and (keep_back == 0 or records_left(src) > keep_back):
                # never into the last keep_back records: poll at most what is left above them
                n = rng.randint(1, 4)
                if keep_back:
                    n = min(n, records_left(src) - keep_back)
                src.poll_source(n)
            if rng.random() < 0.5:
                src.emit_watermark()

    def round(self, rng: random.Random, keep_back: int = 0, p: float = 0.6,
              p_prio: float = 0.6) -> None:
        """One random round: gates, sources, steps, deliveries (``p``, ``p_prio``: see
        ``deliver``)."""
        self.rounds += 1
        self.open_gates()
        self.read_sources(rng, keep_back)
        self.step_all(rng)
        self.deliver(rng, p, p_prio)

    def finish(self, rng: random.Random, p: float = 0.6, p_prio: float = 0.6,
               max_rounds: int = 20000) -> None:
        """Random rounds until every source ended, then everything delivered and done."""
        for _ in range(max_rounds):
            if all(c.status != "running" for c in self.sources()):
                break
            self.round(rng, 0, p, p_prio)
        else:
            raise AssertionError(f"the sources did not end in {max_rounds} rounds (a gate "
                                 f"waits for the watermark): {self.describe()}")
        self.pump()
        stuck = [n for n, c in self.cores.items() if c.status == "running"]
        assert not stuck, f"the job did not finish: {stuck} still run: {self.describe()}"

    def describe(self) -> str:
        return "; ".join(f"{n}: {c.status} wm {c.watermark} {c._describe()}"
                         for n, c in self.cores.items())

    # -- what the shell does after a control call
    def after_send(self, cmd: SendControl) -> None:
        """Frames and priority messages of the call leave; a channel removal or a stop
        returns once the receivers took the frames sent on those channels."""
        self.collect()
        settle: set[int] = set()
        stopped = set()
        for c in cmd.calls:
            if isinstance(c.message, RemoveOutputChannels):
                settle.update(c.message.channel_ids)
            elif isinstance(c.message, (StopTask, ReleaseSource)):
                stopped.add(c.task)
        settle.update(cid for cid, s in self.sender.items() if s in stopped)
        if settle:
            self.settle(settle)

    def settle(self, channels: set[int], max_rounds: int = 5000) -> None:
        for i in range(max_rounds):
            self.collect()
            for cid in channels:
                q = self.frames.get(cid)
                while q:
                    self._deliver_frame(q.popleft())
            waiting = [(core, cid) for core in self.cores.values() for cid in channels
                       if cid in core.inputs and core.inputs[cid].queue]
            if not waiting:
                return
            for core, _ in waiting:
                core.step()
            if i % 8 == 7:  # the receiver may wait for something else first
                self.step_all()
                self.deliver()
        raise AssertionError(f"channels {sorted(channels)} were never taken: {self.describe()}")

    # -- reading results
    def late_records(self, vertex: str | None = None) -> int:
        """Late records counted by every core ever created (of ``vertex``'s operator)."""
        return sum(c.keyed.late_records for c in self.all_cores
                   if c.keyed is not None and (vertex is None or c.spec.vertex == vertex))

    def keyed_state(self, vertex: str) -> dict[int, Any]:
        """Key group -> (tables without empty ones, timers) over the vertex's tasks; every
        group held by exactly one task."""
        out: dict[int, Any] = {}
        for core in self.tasks_of(vertex):
            b = core.backend
            assert b is not None, f"{core.name} is not keyed"
            for kg in b.owned():
                assert kg not in out, f"key group {kg} of {vertex} held twice"
                tables = {name: dict(t.items()) for name, t in b.groups[kg].items() if len(t)}
                out[kg] = (tables, sorted(b.timers.get(kg, ()), key=repr))
        return out
