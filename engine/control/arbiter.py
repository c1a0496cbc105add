"""What may run together on one job: checkpoints, rescales, changes of logic, replica
refreshes, the final checkpoint of a finished job and recovery, decided from events by one
sans-IO class.

Why one class: these actions exclude each other in specific ways (a checkpoint needs a
dataflow that does not change under it; operators that feed each other rescale one at a
time; a stop-restart needs the job to itself), and the rules used to live in ten fields of
four runtime classes, two of which polled. Here they are one state, fed with events and
answering with decisions; the runtime's shell (``engine.runtime.arbitration``) keeps a
future per waiting ticket and resolves it when a decision for the ticket comes out, so
nothing polls.

Protocol: ``request(action)`` returns the requester's ``Decision`` (``RUN``: granted now,
the action runs until ``finished(ticket)``; ``QUEUE``: wait for a later decision on the
same ticket, or ``withdraw(ticket)``; ``REFUSE``: with the reason, nothing held). Every
other event (``finished``, ``withdraw``, ``gate``, ``rescale_changes``, ``job_running``)
may decide queued tickets; those decisions collect in an outbox the shell drains with
``take_decisions()`` after each call. A queued ticket gets exactly one more decision (RUN
or REFUSE).

The rules (as the JobMaster applied them before, docs/architecture.md "the life of a
checkpoint"):

* Vertex locks. A live rescale (its forward group), a placement (its vertex), a change of
  logic (its vertex and the vertices feeding it) and a replica refresh (its vertex) hold
  their vertices. A request whose vertices are held, or wanted by an earlier queued
  request, queues (first come, first served); a replica refresh never queues: it is
  refused when its vertex is held or wanted (it runs at the next period).
* Live vs exclusive. A live rescale, a placement and a change of logic, once their locks are
  granted, are refused while an exclusive rescale (a stop-restart, or a source's rescale)
  runs; an exclusive rescale queues behind another one and, once first, is refused while
  any of those live actions runs. Replica refreshes ignore exclusive rescales.
* Checkpoints. One at a time (others queue, first come first served). A checkpoint starts
  when every running rescale is quiet (``rescale_changes``: no subscale in flight, no task
  being added or removed; a rescale waiting at ``gate`` counts as quiet) and no stop-
  restart runs; until then it is *wanted*. The stop-restart's own savepoint (``exclusive``)
  does not wait for quiet and does not queue behind a wanted checkpoint (which waits for
  the stop-restart to end: it would wait for ever). A rescale about to start a change asks
  ``gate``: it runs when no checkpoint is running or wanted, else waits (as quiet) until
  the checkpoint finished; a granted gate counts as not quiet until the rescale says
  otherwise, so no checkpoint starts between the grant and the change. When a checkpoint
  finishes, the gated rescales go first, then the next checkpoint is wanted. A checkpoint
  is refused while the job does not run.
* Finish. The final checkpoint of a finished job runs only when no rescale, placement or
  change of logic runs and it does not run already (refused otherwise: the last of those
  to end asks again).
* Recovery. A restart is refused while one runs. Granting it (or ``job_running(False)``)
  refuses the wanted and queued checkpoints, refuses the gated rescales (their shells see
  the restart and give up) and counts every running rescale as quiet (its changes died
  with the tasks).

Guarantees: no decision depends on time; every ticket granted is in ``running`` until
``finished``; ``take_decisions`` returns each decision once, in the order made.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.names import NameEnum


class ActionKind(NameEnum):
    """What a ticket asks to run."""

    CHECKPOINT = "checkpoint"
    RESCALE = "rescale"                      # a live rescale of a forward group
    EXCLUSIVE_RESCALE = "exclusive-rescale"  # a stop-restart or a source's rescale
    PLACEMENT = "placement"
    CHANGE_LOGIC = "change-logic"
    REPLICA_REFRESH = "replica-refresh"
    FINISH = "finish"                        # the final checkpoint of a finished job
    RECOVERY = "recovery"


class Verdict(NameEnum):
    RUN = "run"
    QUEUE = "queue"
    REFUSE = "refuse"


LOCKING = frozenset({ActionKind.RESCALE, ActionKind.PLACEMENT, ActionKind.CHANGE_LOGIC,
                     ActionKind.REPLICA_REFRESH})
LIVE = frozenset({ActionKind.RESCALE, ActionKind.PLACEMENT, ActionKind.CHANGE_LOGIC})


@dataclass(frozen=True)
class Action:
    """One request. ``vertices``: what a locking action holds; ``stop_restart``: an
    exclusive rescale that is a stop-restart (never quiet for checkpoints; a source's
    rescale says when it changes the dataflow); ``exclusive``: the stop-restart's own
    checkpoint; ``label``: how refusals name it (e.g. ``stop-restart``)."""

    kind: ActionKind
    vertices: frozenset[str] = frozenset()
    stop_restart: bool = False
    exclusive: bool = False
    label: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.kind, ActionKind):
            object.__setattr__(self, "kind", ActionKind.parse(self.kind, "action kind"))
        object.__setattr__(self, "vertices", frozenset(self.vertices))
        if (self.kind in LOCKING) != bool(self.vertices):
            raise ValueError(f"a {self.kind} action {'needs' if self.kind in LOCKING else 'holds no'}"
                             f" vertices; got {sorted(self.vertices)}")
        if self.stop_restart and self.kind is not ActionKind.EXCLUSIVE_RESCALE:
            raise ValueError("only an exclusive rescale is a stop-restart")
        if self.exclusive and self.kind is not ActionKind.CHECKPOINT:
            raise ValueError("only a checkpoint is the stop-restart's own")


@dataclass(frozen=True)
class Decision:
    """The decision on ``ticket``: run now, wait, or refused (``reason``)."""

    ticket: int
    action: Action
    verdict: Verdict
    reason: str = ""


@dataclass(frozen=True)
class Running:
    """A granted action (the job's record lists them)."""

    ticket: int
    action: Action


@dataclass
class _Gate:
    ticket: int
    vertex: str


@dataclass
class Arbiter:
    """The arbiter of one job (see the module doc). ``running_job``: whether the job runs
    now (checkpoints are refused otherwise)."""

    running_job: bool = False
    _next: int = 0
    _running: dict[int, Action] = field(default_factory=dict)
    _queue: list[tuple[int, Action]] = field(default_factory=list)  # locks, exclusive, checkpoints
    _wanted: tuple[int, Action] | None = None     # the checkpoint waiting for quiet
    _gates: list[_Gate] = field(default_factory=list)
    _quiet: dict[str, bool] = field(default_factory=dict)  # rescaling vertex -> quiet now
    _outbox: list[Decision] = field(default_factory=list)

    # ---------------------------------------------------------------- reads
    @property
    def running(self) -> tuple[Running, ...]:
        return tuple(Running(t, a) for t, a in sorted(self._running.items()))

    def is_running(self, kind: ActionKind) -> bool:
        return any(a.kind is kind for a in self._running.values())

    @property
    def rescaling(self) -> bool:
        """A rescale, placement or change of logic runs (a finished job's teardown waits)."""
        return any(a.kind in LIVE or a.kind is ActionKind.EXCLUSIVE_RESCALE
                   for a in self._running.values())

    @property
    def finishing(self) -> bool:
        """The final checkpoint of a finished job runs."""
        return self.is_running(ActionKind.FINISH)

    @property
    def restarting(self) -> bool:
        return self.is_running(ActionKind.RECOVERY)

    @property
    def settled(self) -> bool:
        """No checkpoint runs or is wanted: a rescale may start a change."""
        return self._wanted is None and not self.is_running(ActionKind.CHECKPOINT)

    def quiescent(self) -> bool:
        """No rescale has a change of the dataflow in flight (gated ones are quiet)."""
        if any(a.kind is ActionKind.EXCLUSIVE_RESCALE and a.stop_restart
               for a in self._running.values()):
            return False
        gated = {g.vertex for g in self._gates}
        return all(quiet or v in gated for v, quiet in self._quiet.items())

    def take_decisions(self) -> list[Decision]:
        """The decisions made on queued tickets since the last call, in order."""
        out, self._outbox = self._outbox, []
        return out

    # ---------------------------------------------------------------- requests
    def request(self, action: Action) -> Decision:
        """A new ticket for ``action`` and its first decision."""
        self._next += 1
        ticket = self._next
        kind = action.kind
        if kind is ActionKind.CHECKPOINT:
            return self._request_checkpoint(ticket, action)
        if kind is ActionKind.REPLICA_REFRESH:
            if action.vertices & (self._held() | self._wanted_vertices()):
                return Decision(ticket, action, Verdict.REFUSE,
                                f"{', '.join(sorted(action.vertices))} is busy (a rescale or "
                                "a change of logic holds it)")
            return self._grant(ticket, action)
        if kind in LIVE or kind is ActionKind.EXCLUSIVE_RESCALE:
            if self._may_start(action, self._queue):
                return self._start(ticket, action)
            self._queue.append((ticket, action))
            return Decision(ticket, action, Verdict.QUEUE)
        if kind is ActionKind.FINISH:
            if self.rescaling:
                return Decision(ticket, action, Verdict.REFUSE, "a rescale runs")
            if self.finishing:
                return Decision(ticket, action, Verdict.REFUSE, "the job is finishing already")
            return self._grant(ticket, action)
        # recovery
        if self.restarting:
            return Decision(ticket, action, Verdict.REFUSE, "the job restarts already")
        decision = self._grant(ticket, action)
        self._not_running("the job restarts")
        self._quiet = dict.fromkeys(self._quiet, True)
        return decision

    def _request_checkpoint(self, ticket: int, action: Action) -> Decision:
        if not self.running_job:
            return Decision(ticket, action, Verdict.REFUSE, "the job does not run")
        busy = self.is_running(ActionKind.CHECKPOINT)
        if action.exclusive and not busy:
            return self._grant(ticket, action)
        if busy or self._wanted is not None or self._checkpoints_queued():
            self._queue.append((ticket, action))
            return Decision(ticket, action, Verdict.QUEUE)
        if self.quiescent():
            return self._grant(ticket, action)
        self._wanted = (ticket, action)
        return Decision(ticket, action, Verdict.QUEUE)

    def gate(self, vertex: str) -> Decision:
        """The rescale of ``vertex`` is about to start a change of the dataflow: RUN when
        ``settled`` (the vertex counts as changing from now on), else QUEUE (quiet while it
        waits); REFUSE while the job does not run."""
        self._next += 1
        ticket = self._next
        action = Action(ActionKind.RESCALE, frozenset({vertex}))
        if not self.running_job:
            return Decision(ticket, action, Verdict.REFUSE, "the job does not run")
        if self.settled:
            self._quiet[vertex] = False
            return Decision(ticket, action, Verdict.RUN)
        self._gates.append(_Gate(ticket, vertex))
        self._after_quiet_change()
        return Decision(ticket, action, Verdict.QUEUE)

    # ---------------------------------------------------------------- events
    def finished(self, ticket: int) -> None:
        """The granted ``ticket`` ended (done or failed): what it held is free."""
        action = self._running.pop(ticket, None)
        if action is None:
            raise KeyError(f"ticket {ticket} is not running")
        if action.kind is ActionKind.CHECKPOINT:
            self._open_gates()
        self._advance()

    def withdraw(self, ticket: int) -> None:
        """The waiter of ``ticket`` gave up (cancelled): a queued ticket leaves the queue, a
        granted one ends; any other (a gate already passed, a refused ticket) is a no-op."""
        if ticket in self._running:
            self.finished(ticket)
            return
        if self._wanted is not None and self._wanted[0] == ticket:
            self._wanted = None
            self._open_gates()
        self._queue = [(t, a) for t, a in self._queue if t != ticket]
        self._gates = [g for g in self._gates if g.ticket != ticket]
        self._advance()

    def rescale_changes(self, vertex: str, quiet: bool | None) -> None:
        """The rescale of ``vertex`` has no change in flight (``quiet``), has one, or
        ended (None)."""
        if quiet is None:
            self._quiet.pop(vertex, None)
        else:
            self._quiet[vertex] = quiet
        self._after_quiet_change()

    def job_running(self, running: bool) -> None:
        """The job runs (again), or no longer does (checkpoints and gates refused)."""
        self.running_job = running
        if not running:
            self._not_running("the job does not run")

    # ---------------------------------------------------------------- internals
    def _grant(self, ticket: int, action: Action) -> Decision:
        self._running[ticket] = action
        return Decision(ticket, action, Verdict.RUN)

    def _held(self) -> frozenset[str]:
        return frozenset(v for a in self._running.values() for v in a.vertices)

    def _wanted_vertices(self, before: int | None = None) -> frozenset[str]:
        return frozenset(v for t, a in self._queue if before is None or t < before
                         for v in a.vertices)

    def _checkpoints_queued(self) -> bool:
        return any(a.kind is ActionKind.CHECKPOINT for _, a in self._queue)

    def _may_start(self, action: Action, ahead: Iterable[tuple[int, Action]]) -> bool:
        """Whether a lock-taking or exclusive ``action`` may be decided now (its vertices
        free, none of an earlier queued request's; an exclusive one first of its kind)."""
        earlier = list(ahead)
        if action.kind is ActionKind.EXCLUSIVE_RESCALE:
            return not self.is_running(ActionKind.EXCLUSIVE_RESCALE) and not any(
                a.kind is ActionKind.EXCLUSIVE_RESCALE for _, a in earlier)
        taken = self._held() | frozenset(v for _, a in earlier for v in a.vertices)
        return not action.vertices & taken

    def _start(self, ticket: int, action: Action) -> Decision:
        """Decide a lock-taking or exclusive action that reached the front."""
        if action.kind is ActionKind.EXCLUSIVE_RESCALE:
            if any(a.kind in LIVE for a in self._running.values()):
                return Decision(ticket, action, Verdict.REFUSE,
                                f"a live rescale is running; a {action.label or 'stop-restart'} "
                                "needs the job to itself: try again after it")
        elif self.is_running(ActionKind.EXCLUSIVE_RESCALE):
            return Decision(ticket, action, Verdict.REFUSE,
                            "a stop-restart or source rescale is running; try again after it")
        return self._grant(ticket, action)

    def _advance(self) -> None:
        """Decide whatever queued ticket may now be decided, in order."""
        progressed = True
        while progressed:
            progressed = False
            for i, (ticket, action) in enumerate(self._queue):
                if action.kind is ActionKind.CHECKPOINT:
                    if self.is_running(ActionKind.CHECKPOINT) or (
                            self._wanted is not None and not action.exclusive):
                        continue
                    del self._queue[i]
                    self._promote(ticket, action)
                    progressed = True
                    break
                if self._may_start(action, self._queue[:i]):
                    del self._queue[i]
                    self._outbox.append(self._start(ticket, action))
                    progressed = True
                    break
        self._after_quiet_change()

    def _promote(self, ticket: int, action: Action) -> None:
        """The first queued checkpoint: refused, granted, or wanted."""
        if not self.running_job:
            self._outbox.append(Decision(ticket, action, Verdict.REFUSE,
                                         "the job does not run"))
        elif action.exclusive or self.quiescent():
            self._outbox.append(self._grant(ticket, action))
        else:
            self._wanted = (ticket, action)

    def _after_quiet_change(self) -> None:
        if self._wanted is not None and self.quiescent():
            ticket, action = self._wanted
            self._wanted = None
            self._outbox.append(self._grant(ticket, action))

    def _open_gates(self) -> None:
        """No checkpoint runs or is wanted any more: the gated rescales go (each changing
        from now on), before the next checkpoint is wanted."""
        if not self.settled:
            return
        for g in self._gates:
            self._quiet[g.vertex] = False
            self._outbox.append(Decision(g.ticket, Action(ActionKind.RESCALE,
                                                          frozenset({g.vertex})), Verdict.RUN))
        self._gates = []

    def _not_running(self, reason: str) -> None:
        """Checkpoints waiting (wanted or queued) and gated rescales are refused."""
        if self._wanted is not None:
            ticket, action = self._wanted
            self._wanted = None
            self._outbox.append(Decision(ticket, action, Verdict.REFUSE, reason))
        keep = []
        for ticket, action in self._queue:
            if action.kind is ActionKind.CHECKPOINT:
                self._outbox.append(Decision(ticket, action, Verdict.REFUSE, reason))
            else:
                keep.append((ticket, action))
        self._queue = keep
        for g in self._gates:
            self._outbox.append(Decision(g.ticket, Action(ActionKind.RESCALE,
                                                          frozenset({g.vertex})),
                                         Verdict.REFUSE, reason))
        self._gates = []


__all__ = ["Action", "ActionKind", "Arbiter", "Decision", "Running", "Verdict"]
