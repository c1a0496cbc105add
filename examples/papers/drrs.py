"""DRRS (Fig. 10-13, 15): Q7, Q8 and Twitch rescaled 8 -> 12 against fluid, Meces and stop-restart.

"Towards Fine-Grained Scalability for Stateful Stream Processing Systems" (DRRS: decoupled
scaling signals with re-routing, record scheduling, subscale division): its headline
experiments on reflow, one command.

    python examples/papers/drrs.py                  # full: Q7, Q8, Twitch; 15-25 min on 2 CPUs
    python examples/papers/drrs.py --sensitivity    # also the sensitivity grid (+~10 min)
    python examples/papers/drrs.py --quick          # Q7 and Twitch at 2 -> 3, two protocols, a
                                                    # 1-point grid: minutes
    python examples/papers/drrs.py --sensitivity --budget-min 25   # start no run after 25 min
    python examples/papers/drrs.py --jobs q8 --q8-state-mb 1500 --q8-window 40000/5000 \
        --q8-rate 2000 --state-backend rocksdb --state-memory-mb 256 --after 30   # 1.5 GB

On a machine where other Ray clusters run, ``RAY_ADDRESS=local`` gives the script a Ray of
its own (otherwise it joins the most recent one, which its owner may stop).

Parts:

* **Fig. 10/11** (``--jobs``, default ``q7,q8,twitch``): each job's bottleneck operator is
  rescaled ``--from`` -> ``--to`` (8 -> 12, the paper's) at ``--key-groups`` (128): uniform
  ranges move 111 of the 128 groups (``engine.dataflow.keygroups.moved_key_groups``, checked
  and recorded), once per protocol of ``--protocols`` (``drrs``, ``fluid`` -- reflow's
  Megaphone --, ``meces``, ``stop-restart``) and once without rescaling, in one fresh job each
  (``examples/bench/rescale.py``'s scenario, run loop and analysis, imported). Figures per
  run: peak latency (the highest of a record in the scaling period), the scaling time (the
  paper's scaling period: from the request until latency stays within 110 % of the level
  before it, ``rescale.py``'s rule and stability window, shorter than the paper's 100 s) and
  the average latency over a common window, as the paper takes it ("the longest observed
  scaling period among all three methods": drrs, fluid, meces); drrs's change against fluid
  and meces in %, beside the paper's. The jobs: ``q7``/``q8`` are ``rescale.py``'s NEXMark
  scenarios (sliding windows, open-loop source; ``q7-partial-max``/``q8-join`` rescaled);
  ``twitch`` is ``examples/twitch.py``'s job (eight operators), its ``loyalty`` operator
  (keyed by viewer and streamer, state growing with every segment) rescaled, the other keyed
  operators at ``--twitch-others`` (2) tasks; its lines come from ``twitch.generate_lines``
  and are replayed open-loop with event times compressed ``--twitch-speedup`` x, as the paper
  compresses its data set into 1,000 s (``examples.bench.harness.replay``): latency is a
  result's arrival minus the wall time its input was due.
* **State at the paper's scale** (``--q7-state-mb``, ``--q8-state-mb``; default: the
  queries as they are, a few hundred kB of state): the job's windows hold about that many
  MB. Q7's first stage then holds every bid of each window (``build_q7(hold_bids=True)``)
  where it otherwise keeps a running maximum per price bucket and window (a few bids,
  whatever their size), and Q8's join holds the persons with their padding
  (``build_q8(hold_extra=("persons",))``) where it otherwise holds ``(id, name)``: the
  queries' results are unchanged (``tests/unit/test_nexmark_held_state.py``). The size
  comes from the NEXMark generator's ``extra`` padding (``avg_bid_byte_size`` for Q7,
  ``avg_person_byte_size`` for Q8, as the NEXMark spec's generator pads events), computed by
  ``held_padding`` from the target, the rate and the window (an event of a window of size
  S sliding by D is held S^2 / 2D seconds on average, over its S / D windows); the build
  phase lasts at least one window. What the state reached is measured, not computed
  (``measured_state``, the summary's scale column): the bytes the rescale moved
  (``RescaleReport.bytes_moved``, the moved groups' exact encoded bytes) scaled to all key
  groups, and the rescaled operator's tasks' own estimate before the request
  (``metrics_before``: RocksDB's compressed live data and memtables; the in-memory
  backend's sample of each table's first entries, which in Q8's join are old keys whose
  windows have fired, so it undercounts there: 20.6 MB for 103 MB moved-and-scaled in a
  quick run). ``--state-backend rocksdb`` (``--state-memory-mb`` per task,
  ``--state-dir``) runs every job on RocksDB. What holding costs, measured in process
  (the stage's work for all its tasks in one process, no transport): Q8's join at 2,000
  events/s, 40 s / 5 s windows, 1.5 GB: ~0.01 CPU s per second of events on either backend
  (a few large persons a second); Q7's first stage at 3,000 events/s, 10 s / 500 ms: 0.14
  CPU s per second at 500 MB in memory, 0.25 at 1.5 GB on RocksDB (each bid goes into 20
  windows). The transport of the padded events and the moves of the state come on top.
* **Fig. 12/13**, the mechanism breakdown, from the runs' ``RescaleReport``: cumulative
  propagation (``propagation_delay_s``, the mean time from injection at the predecessors to
  the first barrier at the old owner, x the migration units), the units' mean wait from the
  request to their start (``subscales``' start offsets: a proxy of the paper's dependency
  overhead, which the report does not have) and ``suspended_s`` (the longest cumulative time
  a new owner had records waiting and none processable: the longest per task, where the paper
  sums them).
* **Fig. 15**, the sensitivity study (``--sensitivity``): ``rescale.py``'s ``micro`` job
  (generator -> keyed padded count with a 1 ms service time per record -> sink) rescaled
  ``--sens-from`` -> ``--sens-to`` at 128 key groups over a grid of input rates
  (``--sens-rates``), state sizes (``--sens-state-mb``) and Zipf skews (``--sens-skews``; 0 is
  uniform), drrs against fluid (``--sens-protocols``); the figure is the paper's throughput
  deviation: the mean of |sink records/s - input rate| / input rate over the ``--after``
  seconds from the request.

Runs per job: the run without rescaling first, then every protocol once per round
(``--repeats``; the protocols' order rotates by one per round); figures are medians over the
rounds. Every run gets warm standby actors for the tasks it adds (stop-restart: for every
task it redeploys, as Flink redeploys into running slots).

Writes ``results.json``, ``drrs.png`` (bars of peak, average latency and scaling time per job
and protocol; stacked bars of the breakdown; the sensitivity heat maps) and ``summary.md``
(the paper's figures, reflow's, the scale, whether drrs < fluid, meces holds) to ``--out``
(default ``examples/papers/results/drrs/``; ``--quick``: ``results/drrs-quick/``).
"""

# ruff: noqa: E402  (the repository root goes on sys.path before reflow's imports)
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from engine import JobConfig, LatencySink, ReflowError, StreamJob
from engine.dataflow.keygroups import moved_key_groups, uniform_assignment
from examples.bench import rescale
from examples.bench.harness import analysis as an
from examples.bench.harness import cli, provenance, render, run
from examples.bench.harness.render import fmt, md_table
from examples.bench.harness.run import RunStatus
from examples.papers import RESULTS_ROOT

NONE = rescale.NONE
JOBS = ("q7", "q8", "twitch")
PROTOCOLS = ("drrs", "fluid", "meces", "stop-restart")
BASELINES = ("fluid", "meces")  # the paper's Megaphone and Meces
#: the paper's Fig. 10 text: drrs's change vs (Megaphone, Meces), % (None: not given)
PAPER: dict[str, dict[str, tuple[float | None, float | None]]] = {
    "q7": {"peak": (-81.1, -80.3), "avg": (-95.5, -94.2), "time": (-86.0, -82.7)},
    "q8": {"peak": (-76.6, -62.8), "avg": (-93.6, -88.2), "time": (-80.1, -72.8)},
    "twitch": {"peak": (None, None), "avg": (None, None), "time": (-82.2, None)},
}
#: the paper's words where it gives no number (Twitch)
PAPER_TEXT = {("twitch", "peak", "fluid"): "comparable", ("twitch", "avg", "fluid"): "comparable",
              ("twitch", "peak", "meces"): "lower", ("twitch", "avg", "meces"): "lower",
              ("twitch", "time", "meces"): "lower"}
PAPER_JOB = {"q7": {"rate": "20K tps", "state_mb": 800.0, "window": "10 s / 500 ms"},
             "q8": {"rate": "1K tps", "state_mb": 3000.0, "window": "40 s / 5 s"},
             "twitch": {"rate": "~4K events/s (4M in 1,000 s)", "state_mb": 500.0,
                        "window": "-"}}
METRICS = {"peak": ("peak latency", "peak_ms"), "avg": ("average latency", "avg_ms"),
           "time": ("scaling time", "period_s")}
OPERATOR = {"q7": "q7-partial-max", "q8": "q8-join", "twitch": "loyalty"}
PAPER_KEY_GROUPS, PAPER_FROM, PAPER_TO, PAPER_MOVED = 128, 8, 12, 111
RESCALE_TIMEOUT_S = 90.0
#: a rescale step's timeout grows by a second per this many MB of asked state
TIMEOUT_MB_PER_S = 10.0
#: Q8's kinds whose padding the join holds when sized (persons: one key each; an auction's
#: padding would pile up under the hot seller's key)
Q8_HELD = ("persons",)
#: NEXMark's proportions of the event stream (NexmarkConfig's defaults: 1 / 3 / 46 of 50)
KIND_SHARE = {"persons": 1 / 50, "auctions": 3 / 50, "bids": 46 / 50}
#: bytes of a held event beside its padding, minus what the generator's padding leaves out
#: of the asked size: a projected bid (4 ints) is ~25 B and the generator's bid padding is
#: the size - 32; a projected person (id, name) ~20 B, its padding the size - ~160
HELD_BYTES_OFFSET = {"bids": 7, "persons": 140}

DEFAULTS = {
    "jobs": ("q7,q8,twitch", "q7,twitch"), "protocols": (",".join(PROTOCOLS), "drrs,fluid"),
    "from_p": (8, 2), "to_p": (12, 3), "key_groups": (128, 128), "repeats": (1, 1),
    "build": (6.0, 3.0), "baseline": (5.0, 3.0), "after": (12.0, 8.0), "stable": (3, 2),
    "settle_max": (12.0, 8.0),
    "q7_rate": (3000.0, 2000.0), "q8_rate": (6000.0, 5000.0), "twitch_rate": (1000.0, 800.0),
    "twitch_pad_bytes": (2000, 500),
    "q7_window": ("2000/500", "2000/500"), "q8_window": ("8000/2000", "4000/1000"),
    "sens_rates": ("1500,3000", "1500"), "sens_state_mb": ("10,40", "10"),
    "sens_skews": ("0,1.0", "0"), "sens_protocols": ("drrs,fluid", "drrs,fluid"),
    "sens_from": (4, 2), "sens_to": (6, 3), "sens_keys": (5000, 2000),
}


# ---------------------------------------------------------------------- sized NEXMark state

def held_seconds(size_ms: int, slide_ms: int | None) -> float:
    """Seconds an event is held, summed over its windows, on average: a window of size S
    sliding by D holds an event until it fires; the event is in S / D windows that fire
    after S - u, S - u - D, ... (u uniform in [0, D)): S^2 / 2D in all (tumbling: S / 2)."""
    s = size_ms / 1000.0
    d = s if not slide_ms or slide_ms >= size_ms else slide_ms / 1000.0
    return s * s / (2.0 * d)


def held_padding(job: str, state_mb: float, rate: float, size_ms: int,
                 slide_ms: int | None) -> dict[str, int]:
    """The ``NexmarkConfig`` sizes (``avg_bid_byte_size`` for ``q7``,
    ``avg_person_byte_size`` for ``q8``) that make the held windows about ``state_mb`` MB at
    ``rate`` events/s: the state over the events held at once (their rate x
    ``held_seconds``), at least NEXMark's default size, at most the generator's largest."""
    from examples.nexmark.generator import MAX_AVG_BYTE_SIZE, NexmarkConfig

    kind, field = {"q7": ("bids", "avg_bid_byte_size"),
                   "q8": ("persons", "avg_person_byte_size")}[job]
    held = rate * KIND_SHARE[kind] * held_seconds(size_ms, slide_ms)
    per = state_mb * 1e6 / held + HELD_BYTES_OFFSET[kind]
    return {field: int(min(MAX_AVG_BYTE_SIZE,
                           max(getattr(NexmarkConfig, field), round(per))))}


class NexmarkScenario(rescale.Scenario):
    """``rescale.py``'s ``q7``/``q8`` scenario with state sized to ``state_mb``: Q7 holding
    its windows' bids, Q8's join holding the persons' padding (``Q8_HELD``), the generator
    padding the events by ``held_padding``; the build lasts at least one window and slide."""

    def __init__(self, args: argparse.Namespace, *, state_mb: float) -> None:
        super().__init__(args)
        self.state_mb = state_mb
        self.padding = held_padding(self.name, state_mb, args.rate, args.size_ms,
                                    args.slide_ms)
        window_s = (args.size_ms + (args.slide_ms or 0)) / 1000.0
        self.build_s = max(self.build_s, window_s + 2.0)
        self.info.update(build_s=self.build_s, state_mb_asked=state_mb, padding=self.padding,
                         held="bids" if self.name == "q7" else ",".join(Q8_HELD),
                         held_seconds=held_seconds(args.size_ms, args.slide_ms))

    def describe(self) -> str:
        what = ("holding the windows' bids" if self.name == "q7"
                else f"the join holding the {', '.join(Q8_HELD)} with their padding")
        pad = ", ".join(f"{k} {v:,}" for k, v in self.padding.items())
        return f"{super().describe()}; {what} ({pad}) for ~{self.state_mb:,.0f} MB of state"

    def build(self, sink: LatencySink, config: JobConfig, *, full_speed: bool = False,
              num_records: int | None = None) -> StreamJob:
        from examples.nexmark import queries
        from examples.nexmark.generator import NexmarkConfig
        from examples.nexmark.source import NexmarkSource

        a = self.args
        job = StreamJob(f"rescale-{self.name}", num_key_groups=a.key_groups,
                        parallelism=a.from_p, config=config)
        src = NexmarkSource(NexmarkConfig(seed=42, first_event_rate=a.rate, **self.padding),
                            event_time=False, rate=a.rate, split_events=512)
        held: dict[str, Any] = ({"hold_bids": True} if self.name == "q7"
                                else {"hold_extra": Q8_HELD})
        queries.build(self.name, job, src, sink, parallelism=a.from_p, source_parallelism=1,
                      size_ms=a.size_ms, slide_ms=a.slide_ms, **held)
        return job


# ---------------------------------------------------------------------- the Twitch scenario

class TwitchScenario(rescale.Scenario):
    """``examples/twitch.py``'s job as a ``rescale.py`` scenario: ``loyalty`` rescaled
    ``from_p`` -> ``to_p``, the other keyed operators at ``others`` tasks, the generated lines
    replayed open-loop ``speedup`` x faster than their event times (enough of them for the
    whole run); latency against the replay's schedule (``harness.replay``)."""

    def __init__(self, args: argparse.Namespace, *, rate: float, others: int,
                 seconds: float, pad_bytes: int) -> None:
        from examples import twitch

        self.args = args
        self.name = "twitch"
        self.nexmark = False
        self.op = OPERATOR["twitch"]
        self.action = "rescale"
        self.empty_ok = True  # results leave as sessions close: a quiet second can happen
        self.assignment = None
        self.zipf = None
        self.build_s = float(args.build)
        self.others, self.pad_bytes = others, pad_bytes
        self.replay_dir: str | None = None
        self.lines = twitch.generate_lines(int(rate * seconds), seed=7)
        # compressed so that the lines last `seconds` at `rate` on average
        span_ms = twitch.event_time(self.lines[-1]) - twitch.event_time(self.lines[0])
        self.speedup = span_ms / 1000.0 / seconds
        self.info = {"build_s": self.build_s, "lines": len(self.lines),
                     "speedup": self.speedup, "replay_s": seconds,
                     "others_parallelism": others, "loyalty_pad_bytes": pad_bytes}

    def describe(self) -> str:
        a = self.args
        return (f"Twitch (examples/twitch.py, 8 operators), {len(self.lines):,} generated lines "
                f"replayed open-loop {self.speedup:,.0f}x faster than their event times "
                f"(~{a.rate:,.0f} lines/s); {self.op} {a.from_p} -> "
                f"{a.to_p} (+{self.pad_bytes:,} B of state per viewer and streamer), the other "
                f"keyed operators at {self.others}, {a.key_groups} key groups")

    def build(self, sink: LatencySink, config: JobConfig, *, full_speed: bool = False,
              num_records: int | None = None) -> StreamJob:
        from examples import twitch
        from examples.bench.harness.replay import ReplayLatencySink, ReplaySource

        if self.replay_dir:  # the previous run's records and origin
            shutil.rmtree(self.replay_dir, ignore_errors=True)
        src = ReplaySource(self.lines, twitch.event_time, self.speedup)
        self.replay_dir = src.directory
        # the sink writes where the run reads `sink` (a WriteLogLatencySink)
        out = ReplayLatencySink(src, sink.directory)
        a = self.args
        others = {op: self.others for op in ("sessionise", "engagement", "watch_time")}
        return twitch.build(self.lines, out, self.others, key_groups=a.key_groups,
                            config=config, source=src,
                            parallelism_of={**others, self.op: a.from_p},
                            loyalty_pad_bytes=self.pad_bytes)


# ---------------------------------------------------------------------- running

def scenario_args(args: argparse.Namespace, job: str, protocols: Sequence[str]
                  ) -> argparse.Namespace:
    """``rescale.py``'s parsed arguments for ``job`` (the twitch job borrows micro's)."""
    argv = ["--scenario", "micro" if job == "twitch" else job,
            "--from", str(args.from_p), "--to", str(args.to_p),
            "--key-groups", str(args.key_groups), "--protocols", ",".join(protocols),
            "--build", str(args.build), "--baseline", str(args.baseline),
            "--after", str(args.after), "--stable", str(args.stable),
            "--settle-max", str(args.settle_max), "--repeats", str(args.repeats),
            "--rate", str(getattr(args, f"{job}_rate")), "--no-overhead",
            "--no-replication-cost", "--warm-standby", str(max(0, args.to_p - args.from_p)),
            "--out", tempfile.gettempdir(), *backend_argv(args)]
    if job in ("q7", "q8"):
        size, slide = getattr(args, f"{job}_window").split("/")
        argv += ["--size-ms", size, "--slide-ms", slide]
    ns = rescale.parse_args(argv)
    ns.scenario = job
    return ns


def backend_argv(args: argparse.Namespace) -> list[str]:
    """``rescale.py``'s state backend arguments for this script's."""
    argv = ["--state-backend", args.state_backend]
    if args.state_memory_mb:
        argv += ["--state-memory-mb", str(args.state_memory_mb)]
    if args.state_dir:
        argv += ["--state-dir", args.state_dir]
    return argv


def make_scenario(args: argparse.Namespace, job: str, sargs: argparse.Namespace
                  ) -> rescale.Scenario:
    state_mb = getattr(args, f"{job}_state_mb", None)
    if state_mb:
        return NexmarkScenario(sargs, state_mb=state_mb)
    if job != "twitch":
        return rescale.Scenario(sargs)
    # deployment, every phase and the longest rescale expected, with room to spare: the
    # job must not run out of lines (it would finish, and the run fail)
    seconds = 60.0 + args.build + args.settle_max + args.baseline + args.after + 90.0
    return TwitchScenario(sargs, rate=args.twitch_rate, others=args.twitch_others,
                          seconds=seconds, pad_bytes=args.twitch_pad_bytes)


def order(protocols: Sequence[str], repeats: int) -> list[tuple[str, int]]:
    """(protocol, round): the run without rescaling first, then per round every protocol,
    their order rotated by one each round."""
    out: list[tuple[str, int]] = [(NONE, 0)]
    for rnd in range(repeats):
        shift = rnd % len(protocols) if protocols else 0
        out += [(p, rnd) for p in [*protocols[shift:], *protocols[:shift]]]
    return out


def guarded(protocol: str, sc: rescale.Scenario, config: JobConfig, progress: run.Progress,
            k: int, n: int) -> dict[str, Any]:
    """``rescale.run_one``; a ``ReflowError`` it raises (a rescale the JobMaster stopped
    running steps for: ``ControlTimeout``) is recorded as a failed run (its job was stopped
    by the run loop) and the benchmark goes on."""
    try:
        return rescale.run_one(sc, protocol, config, progress, k, n)
    except ReflowError as exc:
        return {"protocol": protocol, "status": RunStatus.FAILED,
                "reason": f"{type(exc).__name__}: {exc}"}


def over_budget(args: argparse.Namespace) -> bool:
    """Whether ``--budget-min`` (from the start of ``main``) is spent: no run starts then;
    the results say what was not run."""
    return (args.budget_min is not None
            and time.monotonic() - args.started > 60.0 * args.budget_min)


def config_for(base: JobConfig, protocol: str, from_p: int, to_p: int,
               state_mb: float | None = None) -> JobConfig:
    """Warm standbys for the tasks the run adds (stop-restart: every task it redeploys);
    ``RESCALE_TIMEOUT_S`` per rescale step, plus a second per ``TIMEOUT_MB_PER_S`` MB of
    asked state."""
    warm = to_p if protocol == "stop-restart" else max(0, to_p - from_p)
    # a step of a rescale that the loaded machine stalls fails the run (recorded) instead
    # of holding the whole benchmark for the engine's 300 s
    return dataclasses.replace(base, warm_standby_tasks=warm,
                               rescale_timeout_s=RESCALE_TIMEOUT_S
                               + (state_mb or 0.0) / TIMEOUT_MB_PER_S)


def run_job(args: argparse.Namespace, job: str, progress: run.Progress, counter: list[int],
            total: int) -> dict[str, Any]:
    """Every run of one job (``rescale.run_one``), summarised."""
    sargs = scenario_args(args, job, args.protocols)
    sc = make_scenario(args, job, sargs)
    base = dataclasses.replace(rescale.job_config(sargs, args.state_backend),
                               drrs_pacing=not args.drrs_no_pacing)
    state_mb = getattr(args, f"{job}_state_mb", None)
    print(f"\n{job}: {sc.describe()}", flush=True)
    runs = []
    for p, rnd in order(args.protocols, args.repeats):
        counter[0] += 1
        if over_budget(args):
            runs.append({"protocol": p, "round": rnd, "status": RunStatus.SKIPPED,
                         "reason": f"not run: the --budget-min {args.budget_min:g} was spent"})
            continue
        r = guarded(p, sc, config_for(base, p, args.from_p, args.to_p, state_mb), progress,
                    counter[0], total)
        r["round"] = rnd
        if r["status"] != RunStatus.OK:
            print(f"\n{job} {p}: {r['status']}: {r.get('reason')}", file=sys.stderr, flush=True)
        runs.append(r)
    if getattr(sc, "replay_dir", None):
        shutil.rmtree(sc.replay_dir, ignore_errors=True)
    out = {"job": job, "operator": sc.op, "description": sc.describe(), "info": sc.info,
           "runs": runs, **analyse_job(runs)}
    out["measured_state"] = measured_state(out, args.key_groups)
    return out


# ---------------------------------------------------------------------- analysis (pure)

def _ok(runs: Sequence[dict[str, Any]], protocol: str) -> list[dict[str, Any]]:
    return [r for r in runs if r["protocol"] == protocol and r["status"] == RunStatus.OK]


def window_mean(run_: dict[str, Any], seconds: float) -> float | None:
    """Count-weighted mean latency of the run's seconds from the request second to
    ``seconds`` after the request (the paper's average over a common window)."""
    rows = [x for x in run_["timeline"] if -0.5 < x["t"] <= seconds - 0.5 and x["count"]
            and x["mean_ms"] is not None]
    n = sum(x["count"] for x in rows)
    return sum(x["mean_ms"] * x["count"] for x in rows) / n if n else None


def breakdown(report: dict[str, Any] | None) -> dict[str, Any]:
    """Fig. 12/13's figures from one ``RescaleReport`` (as ``run.report_dict`` gives it)."""
    if not report:
        return {}
    subs = report.get("subscales") or []
    starts = [s[1] for s in subs]
    return {"units": len(subs),
            "propagation_cum_s": (report.get("propagation_delay_s") or 0.0) * len(subs)
            if subs else None,
            "propagation_mean_s": report.get("propagation_delay_s") if subs else None,
            "unit_wait_mean_s": statistics.mean(starts) if starts else None,
            "suspended_s": report.get("suspended_s") if subs else None,
            "duration_s": report.get("duration_s"),
            "rerouted": report.get("rerouted_records"),
            "key_groups_moved": report.get("key_groups_moved"),
            "bytes_moved": report.get("bytes_moved"),
            "phases": report.get("phases") or []}


def analyse_job(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per protocol the medians over its ok runs of the paper's figures and the
    breakdown; drrs's change against each baseline in %; the common window."""
    live = [r for p in ("drrs", *BASELINES) for r in _ok(runs, p)]
    common = max((r["period"]["seconds"] for r in live), default=None)
    for r in runs:
        if r["status"] == RunStatus.OK:
            r["avg_ms"] = window_mean(r, common) if common else None
            r["breakdown"] = breakdown(r.get("report"))
    per: dict[str, dict[str, Any]] = {}
    for p in dict.fromkeys(r["protocol"] for r in runs):
        ok = _ok(runs, p)
        if not ok:
            continue
        bd = [r["breakdown"] for r in ok]

        def med(xs: Sequence[float | None]) -> float | None:
            return an.spread(xs)["median"]

        per[p] = {"runs": len(ok),
                  "peak_ms": med([r["peak"]["max_ms"] for r in ok]),
                  "avg_ms": med([r["avg_ms"] for r in ok]),
                  "period_s": med([r["period"]["seconds"] for r in ok]),
                  "stabilized": all(r["period"]["stabilized"] for r in ok),
                  "period_mean_ms": med([r["period"]["mean_ms"] for r in ok]),
                  "baseline_ms": med([r["baseline"]["level_ms"] for r in ok]),
                  "state_mb": med([(r.get("metrics_before") or {}).get("state_bytes", 0) / 1e6
                                   for r in ok]),
                  "loadavg_at_end": [r["loadavg_at_end"][0] for r in ok
                                     if r.get("loadavg_at_end")],
                  **{k: med([b.get(k) for b in bd]) for k in
                     ("units", "propagation_cum_s", "propagation_mean_s", "unit_wait_mean_s",
                      "suspended_s", "duration_s", "rerouted", "key_groups_moved",
                      "bytes_moved")}}
    change: dict[str, dict[str, float | None]] = {}
    d = per.get("drrs")
    for b in BASELINES:
        x = per.get(b)
        change[b] = {m: (None if not d or not x or d[f] is None or not x[f]
                         else 100.0 * (d[f] / x[f] - 1.0))
                     for m, (_, f) in METRICS.items()}
    return {"common_window_s": common, "per_protocol": per, "change_pct": change}


def holds(job: str, metric: str, base: str, change: float | None) -> str:
    """Whether reflow's change keeps the paper's direction (drrs below the baseline), and
    for a number how far off it is."""
    if change is None:
        return "not measured"
    paper = PAPER[job][metric][BASELINES.index(base)]
    if paper is None:
        words = PAPER_TEXT.get((job, metric, base), "")
        if words == "comparable":
            return "yes (comparable)" if abs(change) <= 25 else (
                "drrs lower" if change < 0 else "no (drrs higher)")
        return "yes" if change < 0 else "no (equal)" if change == 0 else "no"
    if change >= 0:
        return "no (equal)" if change == 0 else "no"
    return "yes" if abs(change - paper) <= 15 else (
        "yes, smaller gain" if change > paper else "yes, larger gain")


def throughput_deviation(run_: dict[str, Any], rate: float, seconds: float) -> float | None:
    """Mean of |sink records/s - rate| / rate (%) over the whole seconds from the request
    second on, ``seconds`` of them (a second without output counts 100 %)."""
    rows = [x for x in run_["timeline"] if -0.5 < x["t"] <= seconds - 0.5]
    if not rows:
        return None
    return 100.0 * statistics.mean(abs(x["count"] - rate) / rate for x in rows)


# ---------------------------------------------------------------------- sensitivity

def grid(args: argparse.Namespace) -> list[dict[str, Any]]:
    return [{"rate": float(r), "state_mb": float(s), "skew": float(z)}
            for z in cli.comma_list(args.sens_skews) for s in cli.comma_list(args.sens_state_mb)
            for r in cli.comma_list(args.sens_rates)]


def sensitivity(args: argparse.Namespace, progress: run.Progress, counter: list[int],
                total: int) -> dict[str, Any]:
    """Each cell of the grid once per protocol, on ``rescale.py``'s micro job."""
    cells = []
    for cell in grid(args):
        keys = args.sens_keys
        state_bytes = max(1, int(cell["state_mb"] * 1e6 / keys))
        argv = ["--scenario", "micro", "--from", str(args.sens_from), "--to",
                str(args.sens_to), "--key-groups", "128", "--rate", str(cell["rate"]),
                "--keys", str(keys), "--state-bytes", str(state_bytes),
                "--skew", "uniform" if cell["skew"] == 0 else str(cell["skew"]),
                "--service-us", "1000", "--build", str(args.build), "--baseline",
                str(args.baseline), "--after", str(args.after), "--stable", str(args.stable),
                "--settle-max", str(args.settle_max), "--no-overhead",
                "--no-replication-cost", "--out", tempfile.gettempdir(),
                *backend_argv(args)]
        sargs = rescale.parse_args(argv)
        sc = rescale.Scenario(sargs)
        base = rescale.job_config(sargs, args.state_backend)
        out = {**cell, "state_bytes_per_key": state_bytes, "keys": keys,
               "description": sc.describe(), "runs": {}}
        for p in args.sens_protocols:
            counter[0] += 1
            if over_budget(args):
                out["runs"][p] = {"protocol": p, "status": RunStatus.SKIPPED,
                                  "reason": f"not run: the --budget-min {args.budget_min:g} "
                                            "was spent"}
                continue
            r = guarded(p, sc, config_for(base, p, args.sens_from, args.sens_to), progress,
                        counter[0], total)
            if r["status"] == RunStatus.OK:
                r["throughput_deviation_pct"] = throughput_deviation(r, cell["rate"],
                                                                     args.after)
            out["runs"][p] = _slim(r)
        cells.append(out)
    return {"from": args.sens_from, "to": args.sens_to, "protocols": args.sens_protocols,
            "window_s": args.after, "cells": cells}


def _slim(r: dict[str, Any]) -> dict[str, Any]:
    """A sensitivity run as kept in results.json (no per-second timeline)."""
    keep = ("protocol", "status", "reason", "throughput_deviation_pct", "loadavg_at_end")
    out = {k: r[k] for k in keep if k in r}
    if r["status"] == RunStatus.OK:
        out.update(peak_ms=r["peak"]["max_ms"], period_s=r["period"]["seconds"],
                   state_mb=(r.get("metrics_before") or {}).get("state_bytes", 0) / 1e6,
                   duration_s=(r.get("report") or {}).get("duration_s"),
                   counts=[[round(x["t"], 1), x["count"]] for x in r["timeline"]
                           if x["t"] >= -1])
    return out


# ---------------------------------------------------------------------- summary

def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1f} %"


def _paper(job: str, metric: str) -> str:
    vals = []
    for i, b in enumerate(BASELINES):
        v = PAPER[job][metric][i]
        vals.append(f"{v:+.1f} %" if v is not None else PAPER_TEXT.get((job, metric, b), "-"))
    return " / ".join(vals)


def measured_state(j: dict[str, Any], key_groups: int) -> dict[str, float | None]:
    """What a job's state reached, measured (MB, medians over the runs; None: not
    measured): ``moved_mb``, the bytes a rescale moved (the moved groups' exact encoded
    bytes, ``RescaleReport.bytes_moved``); ``state_mb``, the whole operator's at the
    rescale, from them (x key groups / groups moved; key groups hold even shares);
    ``estimate_mb``, the tasks' own estimate before the request (``metrics_before``: the
    in-memory backend samples some entries per table, RocksDB counts its compressed live
    data and memtables)."""
    per = j["per_protocol"].values()
    est = [x["state_mb"] for x in per if x.get("state_mb") is not None]
    moved = [(x["bytes_moved"] / 1e6, x["key_groups_moved"]) for x in per
             if x.get("bytes_moved") and x.get("key_groups_moved")]
    mid = statistics.median([m for m, _ in moved]) if moved else None
    whole = (statistics.median([m * key_groups / g for m, g in moved]) if moved else None)
    return {"state_mb": whole, "moved_mb": mid,
            "estimate_mb": statistics.median(est) if est else None}


def state_text(results: dict[str, Any], j: dict[str, Any]) -> str:
    """The scale column's state: measured (``measured_state``), the size asked, the
    backend, and how far below the paper's it is."""
    c = results["config"]
    paper = PAPER_JOB[j["job"]]["state_mb"]
    m = measured_state(j, c["key_groups"])
    backend = c.get("state_backend", "memory")
    asked = (j.get("info") or {}).get("state_mb_asked")
    est = f"the tasks' estimate {m['estimate_mb']:,.1f} MB" if m["estimate_mb"] is not None \
        else "no estimate"
    if m["state_mb"] is not None:
        state = m["state_mb"]
        how = (f"{m['moved_mb']:,.1f} MB moved by a rescale, {j['planned_moved']}/"
               f"{c['key_groups']} groups; {est}")
    else:
        state, how = m["estimate_mb"] or 0.0, f"{est}; nothing moved"
    how += (f"; asked {asked:,g} MB" if asked else "") + f"; {backend} backend"
    down = (f"{paper / state:,.0f}x less" if paper >= state else
            f"{state / paper:,.1f}x more") if state > 0 else "?"
    return f"state {state:,.1f} MB measured ({how}) (paper ~{paper:,.0f} MB: {down})"


def scale_text(results: dict[str, Any], j: dict[str, Any]) -> str:
    c = results["config"]
    job = j["job"]
    paper = PAPER_JOB[job]
    rate = {"q7": c["q7_rate"], "q8": c["q8_rate"], "twitch": c["twitch_rate"]}[job]
    return (f"{c['from_p']} -> {c['to_p']} tasks (paper 8 -> 12), {j['planned_moved']}/"
            f"{c['key_groups']} groups moved; {rate:,.0f}/s (paper {paper['rate']}); "
            f"{state_text(results, j)}; 2 shared CPUs")


def claims(results: dict[str, Any]) -> list[list[str]]:
    """The summary's rows: paper, reflow, scale, holds."""
    rows = []
    for j in results["jobs"]:
        job, ch = j["job"], j["change_pct"]
        scale = scale_text(results, j)
        for m, (label, _) in METRICS.items():
            verdict = " / ".join(holds(job, m, b, ch[b][m]) for b in BASELINES)
            capped = [p for p in ("drrs", *BASELINES)
                      if p in j["per_protocol"] and not j["per_protocol"][p]["stabilized"]]
            if m == "time" and capped:
                # a period not over by the run's end is its length so far: a lower bound
                verdict += (f" ({', '.join(capped)}: not back to the baseline level by the "
                            "run's end, a lower bound)")
            rows.append([f"Fig. 10 {job.upper()}: {label}, DRRS vs Megaphone / Meces",
                         _paper(job, m),
                         " / ".join(_pct(ch[b][m]) for b in BASELINES) + " (drrs vs fluid / "
                         "meces)", scale, verdict])
        per = j["per_protocol"]
        d, f, me = per.get("drrs"), per.get("fluid"), per.get("meces")
        if d and f and d.get("duration_s") and f.get("duration_s"):
            x = f["duration_s"] / d["duration_s"]
            rows.append([f"§V-B {job.upper()}: Megaphone's migration up to 7.24x DRRS's (Q7)",
                         "7.24x (Q7)", f"fluid {f['duration_s']:.1f} s / drrs "
                         f"{d['duration_s']:.1f} s = {x:.2f}x", scale,
                         "yes" if x > 1 else "no"])
        if d and f and me:
            props = {p: per[p].get("propagation_cum_s") for p in ("drrs", "fluid", "meces")}
            if all(v is not None for v in props.values()):
                lowest = min(props, key=lambda p: props[p])
                rows.append([f"Fig. 12 {job.upper()}: cumulative propagation, Megaphone highest, "
                             "Meces lowest",
                             "Megaphone > DRRS > Meces",
                             ", ".join(f"{p} {v:.2f} s" for p, v in props.items()), scale,
                             ("yes" if props["fluid"] == max(props.values()) and lowest == "meces"
                              else "Megaphone highest" if props["fluid"] == max(props.values())
                              else "no")])
            waits = {p: per[p].get("unit_wait_mean_s") for p in ("drrs", "fluid", "meces")}
            if all(v is not None for v in waits.values()):
                rows.append([f"Fig. 12 {job.upper()}: dependency overhead, Megaphone's "
                             "significantly above", "Megaphone highest",
                             "mean wait of a unit from the request (proxy): "
                             + ", ".join(f"{p} {v:.2f} s" for p, v in waits.items()), scale,
                             "yes" if waits["fluid"] == max(waits.values()) else "no"])
            sus = {p: per[p].get("suspended_s") for p in ("drrs", "fluid", "meces")}
            if all(v is not None for v in sus.values()):
                rows.append([f"Fig. 13 {job.upper()}: suspension, Meces highest, DRRS below it",
                             "Meces highest; DRRS < Meces",
                             "longest per task: " + ", ".join(f"{p} {v:.2f} s"
                                                              for p, v in sus.items()), scale,
                             "yes" if sus["meces"] == max(sus.values()) and
                             sus["drrs"] < sus["meces"] else
                             "DRRS < Meces" if sus["drrs"] < sus["meces"] else "no"])
    sens = results.get("sensitivity")
    if sens:
        wins, n = 0, 0
        for cell in sens["cells"]:
            devs = {p: r.get("throughput_deviation_pct") for p, r in cell["runs"].items()}
            if devs.get("drrs") is not None and all(v is not None for v in devs.values()):
                n += 1
                wins += devs["drrs"] <= min(devs.values())
        rows.append(["Fig. 15: DRRS's throughput deviation the lowest in every cell",
                     "every cell (25 -> 30 tasks, 256 groups, 5-30 GB, 5K-20K tps)",
                     f"drrs lowest in {wins} of {n} cells", _sens_scale(sens),
                     "yes" if n and wins == n else "not in every cell" if wins else "no"])
    return rows


def _sens_scale(sens: dict[str, Any]) -> str:
    cells = sens["cells"]
    rates = sorted({c["rate"] for c in cells})
    mbs = sorted({c["state_mb"] for c in cells})
    return (f"micro {sens['from']} -> {sens['to']} tasks, 128 groups; rates "
            f"{', '.join(f'{r:,.0f}' for r in rates)}/s; state {', '.join(f'{m:g}' for m in mbs)}"
            f" MB (paper 5-30 GB: >100x less); skews {sorted({c['skew'] for c in cells})}")


def _end_load(m: dict[str, Any]) -> str:
    end = m.get("loadavg_at_end")
    return "?" if not end else f"{end[0]:.1f}"


def markdown(results: dict[str, Any]) -> str:
    c = results["config"]
    lines = [f"# DRRS on reflow ({render.load_title(results)})", "",
             render.run_line(results), "",
             *[f"Re-run {u['date']}: "
               + " and ".join([*([", ".join(u["jobs"])] if u["jobs"] else []),
                               *(["the grid"] if u.get("sensitivity") else [])])
               + f" by `{u['command']}` "
               f"(load {u['machine']['loadavg_at_start'][0]:.1f} -> "
               f"{_end_load(u['machine'])}), replacing the first "
               "run's." for u in results.get("updates", [])],
             *([""] if results.get("updates") else []),
             f"Uniform ranges {c['from_p']} -> {c['to_p']} at {c['key_groups']} key groups move "
             f"{results['moved_key_groups']} groups (`moved_key_groups`; the paper: 111 of 128 "
             f"at 8 -> 12). Changes are drrs's against fluid (reflow's Megaphone) and meces, "
             "medians over the rounds: peak = highest latency of a record in the scaling "
             "period; average = mean latency over the common window (the longest scaling "
             "period of drrs, fluid and meces, as the paper takes it); scaling time = the "
             f"scaling period (latency back within 110 % of its level + {c['slack_ms']:g} ms "
             f"for {c['stable']} s; the paper: 100 s).", "",
             *md_table(["paper", "paper's value", "reflow (this machine)", "scale", "holds?"],
                       claims(results), left=["reflow (this machine)", "scale", "holds?"]), ""]
    for j in results["jobs"]:
        lines += [f"## {j['job'].upper()}: {j['description']}", "",
                  f"Common window for the average: {fmt(j['common_window_s'], '.0f')} s.", "",
                  *md_table(["protocol", "runs", "base ms", "peak ms", "avg ms (common)",
                             "period mean ms", "scaling time s", "migration s", "units",
                             "propagation cum. s", "unit wait s", "suspended s", "rerouted",
                             "groups moved", "MB moved", "state MB", "load at end"],
                            [[p, str(x["runs"]), fmt(x["baseline_ms"]), fmt(x["peak_ms"], ",.0f"),
                              fmt(x["avg_ms"]), fmt(x["period_mean_ms"]),
                              fmt(x["period_s"], ".0f") + ("" if x["stabilized"] else "+"),
                              fmt(x["duration_s"], ".2f"), fmt(x["units"], ".0f"),
                              fmt(x["propagation_cum_s"], ".2f"),
                              fmt(x["unit_wait_mean_s"], ".2f"), fmt(x["suspended_s"], ".2f"),
                              fmt(x["rerouted"], ",.0f"), fmt(x["key_groups_moved"], ".0f"),
                              fmt(None if x["bytes_moved"] is None else x["bytes_moved"] / 1e6,
                                  ".1f"), fmt(x["state_mb"], ".1f"),
                              ", ".join(f"{v:.0f}" for v in x["loadavg_at_end"])]
                             for p, x in j["per_protocol"].items()]), ""]
        failed = [r for r in j["runs"] if r["status"] == RunStatus.FAILED]
        for r in failed:
            lines += [f"- {r['protocol']}: {r['status']}: {str(r.get('reason'))[:300]}"]
        if failed:
            lines.append("")
    sens = results.get("sensitivity")
    if sens:
        ps = sens["protocols"]
        lines += ["## Fig. 15: throughput deviation (% of the input rate, mean over "
                  f"{sens['window_s']:g} s from the request)", "", _sens_scale(sens) + ".", "",
                  *md_table(["rate /s", "state MB", "Zipf skew", *[f"{p} %" for p in ps],
                             *[f"{p} peak ms" for p in ps]],
                            [[f"{x['rate']:,.0f}", f"{x['state_mb']:g}", f"{x['skew']:g}",
                              *[fmt(x["runs"].get(p, {}).get("throughput_deviation_pct"))
                                for p in ps],
                              *[fmt(x["runs"].get(p, {}).get("peak_ms"), ",.0f") for p in ps]]
                             for x in sens["cells"]]), ""]
    skipped = [f"{j['job']} {r['protocol']}: {r.get('reason')}" for j in results["jobs"]
               for r in j["runs"] if r["status"] == RunStatus.SKIPPED]
    skipped += [f"sensitivity {c['rate']:g}/s, {c['state_mb']:g} MB, skew {c['skew']:g}, {p}: "
                f"{r.get('reason')}" for c in (sens or {}).get("cells", [])
                for p, r in c["runs"].items() if r["status"] == RunStatus.SKIPPED]
    not_run = [*results.get("not_run", []), *skipped]
    if not_run:
        lines += ["## Not run", "", *[f"- {x}" for x in not_run], ""]
    lines += ["## What is not measured or differs from the paper", "",
              *[f"- {x}" for x in results["caveats"]], ""]
    return "\n".join(lines)


CAVEATS = (
    "The paper's cumulative suspension time sums every instance's suspension; the report "
    "keeps the longest per task (`suspended_s`), shown instead.",
    "The paper's average dependency overhead is not in the report: the table shows the "
    "migration units' mean wait from the request to their start (`subscales` offsets), which "
    "grows with the units' sequential dependency (fluid runs its units one after another).",
    "Cumulative propagation is the report's mean propagation delay x the migration units.",
    "Scaling time uses rescale.py's stability rule (110 % of the level + slack for a few "
    "seconds), not the paper's 100 s; the runs are shorter (seconds, not 300 s of warm-up).",
    "Scale: the state is what the scale column says, measured (without --q7-state-mb / "
    "--q8-state-mb, Q7 and Q8 hold a few hundred kB where the paper has 0.8-3 GB; with them, "
    "the windows hold the padded events); 2 CPUs shared by every task (and by other "
    "developers' jobs: see the load) where the paper gives each task a core; Python.",
    "Twitch: generated lines shaped like the public data set (examples/twitch.py), not the "
    "data set; event times compressed as the paper does, loyalty rescaled.",
)


# ---------------------------------------------------------------------- figure

COLORS = rescale.COLORS


def plot(results: dict[str, Any], path: str) -> None:
    plt = render.pyplot()
    import numpy as np

    jobs = results["jobs"]
    sens = results.get("sensitivity")
    nrows = 2 + (1 if sens else 0)
    fig, axes = plt.subplots(nrows, 3, figsize=(15, 4.2 * nrows), squeeze=False)
    protos = [p for p in (*PROTOCOLS, NONE) if any(p in j["per_protocol"] for j in jobs)]
    x = np.arange(len(jobs))
    w = 0.8 / max(1, len(protos))
    for ax, (m, (label, field)) in zip(axes[0], METRICS.items(), strict=True):
        for i, p in enumerate(protos):
            ys = [j["per_protocol"].get(p, {}).get(field) or 0.0 for j in jobs]
            ax.bar(x + (i - (len(protos) - 1) / 2) * w, ys, w, label=p,
                   color=COLORS.get(p, f"C{i}"))
        ax.set_xticks(x, [j["job"].upper() for j in jobs])
        ax.set_ylabel({"peak": "peak latency (ms, log)", "avg": "average latency (ms, log)",
                       "time": "scaling time (s)"}[m])
        if m != "time":
            ax.set_yscale("log")
        ax.set_title(f"Fig. 10: {label}")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    parts = (("propagation_cum_s", "cumulative propagation"),
             ("unit_wait_mean_s", "unit wait (dependency proxy)"),
             ("suspended_s", "suspension (longest task)"))
    live = [p for p in ("drrs", "fluid", "meces") if p in protos]
    ax = axes[1][0]
    labels, bottoms = [], None
    xs = np.arange(len(jobs) * len(live))
    for k, (field, name) in enumerate(parts):
        ys = np.array([j["per_protocol"].get(p, {}).get(field) or 0.0 for j in jobs
                       for p in live])
        ax.bar(xs, ys, 0.7, bottom=bottoms, label=name, color=f"C{k}")
        bottoms = ys if bottoms is None else bottoms + ys
    labels = [f"{j['job']}\n{p}" for j in jobs for p in live]
    ax.set_xticks(xs, labels, fontsize=7)
    ax.set_ylabel("seconds")
    ax.set_title("Fig. 12/13: mechanism breakdown (stacked)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    ax = axes[1][1]
    for i, p in enumerate(live):
        ys = [j["per_protocol"].get(p, {}).get("duration_s") or 0.0 for j in jobs]
        ax.bar(x + (i - (len(live) - 1) / 2) * (0.8 / max(1, len(live))), ys,
               0.8 / max(1, len(live)), label=p, color=COLORS.get(p, f"C{i}"))
    ax.set_xticks(x, [j["job"].upper() for j in jobs])
    ax.set_ylabel("migration duration (s, the report's)")
    ax.set_title("migration duration")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    ax = axes[1][2]
    for j, ls in zip(jobs, ("-", "--", ":"), strict=False):
        for r in j["runs"]:
            if r["status"] != RunStatus.OK or r["protocol"] not in (*live, "stop-restart"):
                continue
            t = [y["t"] for y in r["timeline"]]
            ax.plot(t, [y["count"] for y in r["timeline"]], ls=ls, lw=1,
                    color=COLORS.get(r["protocol"], "k"),
                    label=f"{j['job']} {r['protocol']}" if r.get("round", 0) == 0 else None)
    ax.axvline(0, color="k", lw=1)
    ax.set_xlim(left=-results["config"]["baseline"] - 1)
    ax.set_xlabel("s since the rescale request")
    ax.set_ylabel("records at sink / s")
    ax.set_title("Fig. 11: throughput")
    ax.legend(fontsize=6, ncol=2)
    if sens:
        _sens_plot(axes[2], sens)
    fig.suptitle(f"DRRS on reflow ({render.load_title(results)})")
    render.save_figure(fig, path)


def _sens_plot(axes: Any, sens: dict[str, Any]) -> None:
    import numpy as np

    cells = sens["cells"]
    rates = sorted({c["rate"] for c in cells})
    mbs = sorted({c["state_mb"] for c in cells})
    skews = sorted({c["skew"] for c in cells})
    ps = sens["protocols"]
    panels = [(p, z) for z in skews for p in ps][:len(axes)]
    vmax = max([r.get("throughput_deviation_pct") or 0.0 for c in cells
                for r in c["runs"].values()] + [1.0])
    for ax, (p, z) in zip(axes, panels, strict=False):
        grid_ = np.full((len(mbs), len(rates)), np.nan)
        for c in cells:
            if c["skew"] == z:
                v = c["runs"].get(p, {}).get("throughput_deviation_pct")
                grid_[mbs.index(c["state_mb"]), rates.index(c["rate"])] = (
                    np.nan if v is None else v)
        im = ax.imshow(grid_, origin="lower", cmap="viridis", vmin=0, vmax=vmax,
                       aspect="auto")
        for (i, k), v in np.ndenumerate(grid_):
            if not np.isnan(v):
                ax.text(k, i, f"{v:.0f}", ha="center", va="center", color="w", fontsize=9)
        ax.set_xticks(range(len(rates)), [f"{r:,.0f}" for r in rates])
        ax.set_yticks(range(len(mbs)), [f"{m:g} MB" for m in mbs])
        ax.set_xlabel("input rate (records/s)")
        ax.set_title(f"Fig. 15: {p}, skew {z:g} (throughput deviation %)", fontsize=9)
        ax.figure.colorbar(im, ax=ax)
    for ax in axes[len(panels):]:
        ax.axis("off")


# ---------------------------------------------------------------------- main

def redraw(path: str, out: str | None, notes: Sequence[str] = ()) -> int:
    """summary.md and drrs.png again from ``path`` (a results.json of this script), with
    ``notes`` added to what was not run."""
    import json

    with open(path) as f:
        results = json.load(f)
    results["caveats"] = list(CAVEATS)  # this version's
    results["not_run"] = [*results.get("not_run", []),
                          *(n for n in notes if n not in results.get("not_run", []))]
    render.write_outputs(out or os.path.dirname(os.path.abspath(path)), results,
                         markdown=markdown(results), png="drrs.png", plot=plot)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = cli.parser(__doc__, "drrs")
    ap.add_argument("--jobs", help="of q7,q8,twitch (all; quick q7,twitch; '' for none)")
    ap.add_argument("--protocols", help="drrs,fluid,meces,stop-restart (quick drrs,fluid)")
    ap.add_argument("--from", dest="from_p", type=int, help="start parallelism (8; quick 2)")
    ap.add_argument("--to", dest="to_p", type=int, help="target parallelism (12; quick 3)")
    ap.add_argument("--key-groups", type=int, help="key groups (128)")
    ap.add_argument("--repeats", type=int, help="rounds of the protocols (1)")
    for dest, text in cli.RESCALE_RUN_HELP.items():
        ap.add_argument("--" + dest.replace("_", "-"), type=int if dest == "stable" else float,
                        help=text)
    ap.add_argument("--settle-max", type=float, help="as rescale.py's (12; quick 8)")
    ap.add_argument("--slack-ms", type=float, default=5.0, help="as rescale.py's")
    ap.add_argument("--q7-rate", type=float, help="Q7 events/s (3,000; quick 2,000)")
    ap.add_argument("--q8-rate", type=float, help="Q8 events/s (6,000; quick 5,000)")
    ap.add_argument("--twitch-rate", type=float, help="Twitch lines/s (1,000; quick 800)")
    ap.add_argument("--q7-window", help="Q7 sliding window size/slide ms (2000/500)")
    ap.add_argument("--q8-window", help="Q8 sliding window size/slide ms (8000/2000)")
    ap.add_argument("--q7-state-mb", type=float,
                    help="size Q7's state to about this many MB: its first stage holds the "
                         "windows' bids, padded by avg_bid_byte_size (default: Q7 as it is, "
                         "a running maximum per window: little state)")
    ap.add_argument("--q8-state-mb", type=float,
                    help="size Q8's state to about this many MB: its join holds the persons "
                         "padded by avg_person_byte_size (default: Q8 as it is, (id, name))")
    ap.add_argument("--state-backend", choices=("memory", "rocksdb"), default="memory",
                    help="JobConfig(state_backend=...) of every job (memory)")
    ap.add_argument("--state-memory-mb", type=int,
                    help="JobConfig(state_memory_bytes=n MB) per RocksDB task (the engine's "
                         "default, 128)")
    ap.add_argument("--state-dir", help="JobConfig(state_dir=...) of RocksDB runs (default: "
                                        "the system's temporary directory)")
    ap.add_argument("--drrs-no-pacing", action="store_true",
                    help="JobConfig(drrs_pacing=False): drrs starts drrs_max_subscales at once "
                         "whatever the idle cores (migration.pacing)")
    ap.add_argument("--twitch-others", type=int, default=2,
                    help="tasks of Twitch's keyed operators other than loyalty (2)")
    ap.add_argument("--twitch-pad-bytes", type=int,
                    help="state padding per (viewer, streamer) pair of loyalty (2,000; quick "
                         "500): the job's own state is a few hundred bytes per pair")
    ap.add_argument("--budget-min", type=float,
                    help="start no run after this many minutes (jobs in --jobs order, then "
                         "the grid); what was not run is listed in the summary")
    ap.add_argument("--update", metavar="RESULTS_JSON",
                    help="run --jobs (and the grid, with --sensitivity) and put them in place "
                         "of theirs in this results.json (a job whose runs the machine "
                         "failed); its command and load are listed in the summary")
    ap.add_argument("--from-results", metavar="RESULTS_JSON",
                    help="run nothing: write summary.md and the PNG again from a results.json "
                         "(to --out, default its folder)")
    ap.add_argument("--note", action="append", default=[],
                    help="with --from-results: a line for the summary's 'Not run' (a run that "
                         "was stopped by hand)")
    ap.add_argument("--sensitivity", action="store_true",
                    help="also the sensitivity grid (always with --quick)")
    ap.add_argument("--sens-rates", help="grid: records/s (1500,3000; quick 1500)")
    ap.add_argument("--sens-state-mb", help="grid: state MB (10,40; quick 10)")
    ap.add_argument("--sens-skews", help="grid: Zipf exponents, 0 = uniform (0,1.0; quick 0)")
    ap.add_argument("--sens-protocols", help="grid: protocols (drrs,fluid)")
    ap.add_argument("--sens-from", type=int, help="grid: start parallelism (4; quick 2)")
    ap.add_argument("--sens-to", type=int, help="grid: target parallelism (6; quick 3)")
    ap.add_argument("--sens-keys", type=int, help="grid: keys (5,000; quick 2,000)")
    args = ap.parse_args(argv)
    cli.fill_defaults(args, DEFAULTS)
    args.jobs = cli.comma_list(args.jobs)
    bad = [j for j in args.jobs if j not in JOBS]
    if bad:
        ap.error(f"--jobs: unknown {bad}; of {', '.join(JOBS)}")
    args.protocols = cli.comma_list(args.protocols)
    args.sens_protocols = cli.comma_list(args.sens_protocols)
    args.sensitivity = args.sensitivity or args.quick
    for job in ("q7", "q8"):
        mb = getattr(args, f"{job}_state_mb")
        if mb is not None and mb <= 0:
            ap.error(f"--{job}-state-mb must be > 0")
    if not args.from_results:
        args.out = args.out or os.path.join(RESULTS_ROOT,
                                            "drrs-quick" if args.quick else "drrs")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_results:
        return redraw(args.from_results, args.out, args.note)
    args.started = time.monotonic()
    results = provenance.begin(__file__, argv, args, omit=("started",))
    moved = len(moved_key_groups(uniform_assignment(args.key_groups, args.from_p),
                                 uniform_assignment(args.key_groups, args.to_p)))
    paper_moved = len(moved_key_groups(uniform_assignment(PAPER_KEY_GROUPS, PAPER_FROM),
                                       uniform_assignment(PAPER_KEY_GROUPS, PAPER_TO)))
    results.update(moved_key_groups=moved, paper_setting_moved_key_groups=paper_moved,
                   caveats=list(CAVEATS), paper=PAPER, paper_jobs=PAPER_JOB)
    print(f"DRRS: uniform ranges {args.from_p} -> {args.to_p} of {args.key_groups} key groups "
          f"move {moved} (at the paper's 8 -> 12 of 128: {paper_moved})", flush=True)
    n_main = len(args.jobs) * (1 + len(args.protocols) * args.repeats)
    n_sens = len(grid(args)) * len(args.sens_protocols) if args.sensitivity else 0
    per_run = 25.0 + args.build + args.settle_max / 2 + args.baseline + args.after + 10.0
    progress = run.Progress((n_main + n_sens) * per_run)
    run.init_ray()
    counter = [0]
    results["jobs"], results["not_run"] = [], []
    results["machine"]["ray"] = run.ray_version()
    try:
        for job in args.jobs:
            if over_budget(args):
                results["not_run"].append(f"{job}: the --budget-min {args.budget_min:g} was "
                                          "spent before it started")
                continue
            j = run_job(args, job, progress, counter, n_main + n_sens)
            j["planned_moved"] = moved
            results["jobs"].append(j)
            if not args.update:  # what is done so far, if killed
                render.write_outputs(args.out, results)
        if args.sensitivity:
            results["sensitivity"] = sensitivity(args, progress, counter, n_main + n_sens)
    finally:
        progress.close()
        run.shutdown_ray()
    provenance.finish(results)
    if args.update:
        results = merged(args.update, results)
    render.write_outputs(args.out, results, markdown=markdown(results), png="drrs.png",
                         plot=plot)
    return 0


def merged(path: str, new: dict[str, Any]) -> dict[str, Any]:
    """``path``'s results with the jobs (and the grid) ``new`` ran in place of theirs, and
    ``new``'s command, date, machine and jobs appended to its ``updates``."""
    import json

    with open(path) as f:
        old = json.load(f)
    fresh = {j["job"]: j for j in new["jobs"]}
    old["jobs"] = [fresh.pop(j["job"], j) for j in old["jobs"]] + list(fresh.values())
    if new.get("sensitivity"):
        old["sensitivity"] = new["sensitivity"]
    old["not_run"] = [x for x in old.get("not_run", [])
                      if x.split(":")[0] not in {j["job"] for j in new["jobs"]}]
    old.setdefault("updates", []).append(
        {"command": new["command"], "date": new["date"], "machine": new["machine"],
         "jobs": [j["job"] for j in new["jobs"]], "total_seconds": new.get("total_seconds"),
         "sensitivity": bool(new.get("sensitivity"))})
    return old


if __name__ == "__main__":
    sys.exit(main())
