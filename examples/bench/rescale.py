"""One rescale scenario, run once per protocol and once without rescaling: latency timeline,
scaling period, disruption figures and ratios measured within the one run.

    python examples/bench/rescale.py                          # micro, every protocol, ~10 min
    python examples/bench/rescale.py --quick                  # small smoke run, ~6 min (own folder: <scenario>-quick)
    python examples/bench/rescale.py --scenario skew --protocols drrs,stop-restart
    reflow bench rescale --scenario q7 --quick                # the same through the CLI
    python examples/bench/rescale.py --protocols drrs,stop-restart --state-backend both \
        --state-gb 0.5 --no-overhead --no-replication-cost    # both backends, 0.5 GB
    python examples/bench/rescale.py --protocols drrs,stop-restart --state-backend rocksdb \
        --state-gb 5 --state-memory-mb 64 --no-overhead --no-replication-cost
        # the 5 GB scenario (issue 29; not run on the shared machine: see the README)

State backend (``--state-backend``, ``harness.cli.add_state_backend``): every job runs on
``JobConfig(state_backend=...)``; ``both`` runs every run once per backend, alternated
(none on memory, none on RocksDB, drrs on memory, drrs on RocksDB, ...), and reports them
side by side: per backend its medians and ratios (``results.json``'s ``by_backend``), a
table of both, the runs labelled with their backend, RocksDB's lines dashed in the PNG.
``--state-gb`` sets the padding per key to that size over ``--keys`` keys (it overrides
``--state-bytes``) and builds state until 99 % of the keys were seen (``--coverage 0.99``
unless given). ``--state-dir`` and ``--state-memory-mb`` set where and with how much
memory (block cache and write buffers) each RocksDB task keeps its state. Every run
records the peak RSS of the job's processes (``rss``: ``harness.procs.JobRss``).

Scenarios (``--scenario``; one fresh job per run, every run the same job and timing):

* ``micro``: GeneratorSource (open loop, ``--rate`` records/s, ``--keys`` keys, ``--skew``
  uniform or a Zipf exponent) -> key_by -> ``PaddedCount`` (per key a count and
  ``--state-bytes`` bytes of padding: ~200 MB at the defaults) -> sink (chained into the
  aggregator); ``agg`` rescaled ``--from`` -> ``--to`` (8 -> 12), ``--key-groups`` (128).
  Every aggregator task spends ``--service-us`` (1,000; quick 300) per record, slept: a
  task serves at most 1,000 records/s without using a core, so 8 tasks run at ~60 % and
  12 at ~40 % of their capacity. That is the papers' setting, one core per task with the
  rescaled operator the bottleneck; on this machine's two cores, shared by every task, a
  CPU-bound run (``--service-us 0``) gains no capacity from a scale-out.
* ``micro-in``: the same, scaled in (12 -> 8).
* ``source``: the same job with the *source* rescaled: a GeneratorSource of ``--partitions``
  (8) partitions read by ``--from`` -> ``--to`` (2 -> 4; quick 1 -> 2) source tasks, the
  aggregator at ``--agg-p`` (4; quick 2) tasks. Protocols: ``drrs`` stands for any live
  one (a source's live rescale hands its partitions over: report protocol "handover") and
  ``stop-restart``; the default runs both.
* ``skew``: the same job on Zipf keys (exponent 1.0), ``agg`` *rebalanced* (same
  parallelism unless ``--to`` says otherwise) to an assignment that evens the per-key-group
  load; the loads are counted on the generator's deterministic key sequence up to the request
  (``harness.balance.balanced_assignment``).
* ``q7`` / ``q8``: NEXMark Q7 (highest bid) and Q8 (new users) with sliding event-time
  windows (``--size-ms``/``--slide-ms``, 2 s / 500 ms), an open-loop NexmarkSource whose
  timestamps are the scheduled emission times; the window operator (``q7-partial-max``,
  ``q8-join``) is rescaled 4 -> 6. Latency is that of the window results (arrival - window end).

``--assignment`` (``uniform``, ``consistent-hashing``, ``ssm``; with ``--balance`` θ) chooses
the target of a rescale by that strategy (``migration.assignment``), and the ``skew``
scenario's rebalance by it instead of the precomputed target; ``examples/bench/assignment.py``
compares uniform and ssm this way.

Per run: deploy, build state (``--build`` s; with ``--coverage`` c at least until the
generator has emitted enough records for a share c of the keys, computed exactly from its
key sequence), settle (until no backlog of the build is left, at the sources or in the
per-second mean latency: ``harness.analysis.settled_run``, at most ``--settle-max`` s), baseline
(``--baseline`` s), then the request
(``handle.rescale``/``handle.rebalance`` block until done; the ``none`` run only notes the
time), then ``--after`` s more. From the sink's per-second latency histograms and the write
times of every sink writer (``harness.jobs.WriteLogLatencySink``):

* baseline: the ``--baseline`` whole seconds before the request second: mean, p50, p99, max,
  records/s and the *level*, the median of the per-second means (a noisy second of a shared
  machine does not move it);
* scaling period (examples/bench/README.md, "How a run is judged"): from the request second
  until the per-second mean latency stays within ``--tolerance`` (1.1) x the baseline level
  + ``--slack-ms`` (5 ms: per-second means of 5-10 ms jitter by more than 10 % here; 0
  gives the strict rule) for ``--stable`` seconds, the window starting no earlier than the
  completion second; capped at the end of the run (shown with '+'); its limit is
  ``period.limit_ms``;
* settle: the same rule against max(baseline level, level of the last ``--stable`` s), i.e.
  until latency reaches its *new* level (12 tasks on 2 cores may be slower than 8); ``tail``:
  the latency of those last seconds;
* peak (max, highest per-second p99 and mean) and mean/p50/p99 over the scaling period;
* throughput dip: lowest per-second sink records/s in the scaling period / baseline records/s;
* longest gap without any sink output from the request to the end of the period;
* from the RescaleReport: duration_s, suspended_s, propagation_delay_s, bytes and key groups
  moved, rerouted records, subscales, phases, and ``planning_reason`` when the protocol sets it.

Rounds: ``--repeats`` (2; quick 1) rounds, each running every protocol once with the run
without rescaling before each of them (none, drrs, none, pause-resume, ...; the protocols'
order rotates by one per round), so the machine's load drift reaches the baseline runs as
it reaches the protocols; every figure and ratio is the median over the rounds (ranges in
``results.json``'s ``medians`` and in the summary). Every run gets the same warm standby
actors (``--warm-standby``, default the target parallelism): live protocols take the tasks
they add from them, stop-restart redeploys every task into them, as Flink redeploys into
running task slots.

Protocols: every name in ``migration.protocols.PROTOCOLS`` (``--protocols a,b`` to choose);
one the engine refuses (``RescaleRefused``) is recorded as skipped with the reason. A run whose
job fails is recorded as failed and the others go on. Also (``--overhead``, default on) the
steady-state cost of rescaling support: the micro job at full speed over ``--overhead-records``
records with the defaults, with ``JobConfig(live_rescaling=False)`` and without metrics
(no endpoint, no metrics polls), alternated; and
(``--replication-cost``, default on except ``--quick``) what keeping replicas costs: the micro
job at its rate once per ``JobConfig(replication=)`` policy, bytes and CPU from its
Prometheus endpoint.

Frames: every run uses ``JobConfig(linger_ms=--linger-ms)``, 15 ms by default rather than
the engine's 5 ms, and ``--transport`` (the engine's default, tcp). A channel sends one frame
per linger at 5,000 records/s over 8-12 channels, so the frame rate grows with the
parallelism, not the load. With ``--transport ray`` each frame is an actor call costing
~1.3 ms of CPU over both ends on this machine: at 5 ms, 8 tasks then keep 1.8 of the 2 cores
busy and 12 tasks saturate them; at 15 ms 8 tasks use ~1.3 cores. Over the TCP transport
the same 8-task job at 15 ms uses 0.6-0.7 cores. ``--linger-ms 5`` gives the engine default.

DRRS against stop-restart alone, as the former ``rescale_drrs.py`` ran it (no service time,
the engine's linger, cold actor starts, state built for 99 % of the keys, the strict
stability rule, mean latencies drawn too)::

    python examples/bench/rescale.py --protocols drrs,stop-restart --no-baseline-run \\
        --service-us 0 --linger-ms 5 --warm-standby 0 --coverage 0.99 --build 10 \\
        --baseline 10 --after 30 --slack-ms 0 --no-overhead --no-replication-cost --plot-mean

Writes ``examples/bench/out/rescale/<scenario>/results.json``, ``summary.md`` (also printed)
and ``timeline.png``. The machine is shared and noisy: compare ratios within one run.
"""

# ruff: noqa: E402  (the repository root goes on sys.path before reflow's imports)
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import urllib.request
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from engine import JobConfig, LatencySink, StreamJob
from engine.names import JobState
from examples.bench.harness import analysis as an
from examples.bench.harness import balance, cli, jobs, provenance, render, run
from examples.bench.harness.render import fmt, md_table
from examples.bench.harness.run import RunStatus
from migration.protocols import PROTOCOLS

NONE = "none"  # the run without a rescale
SCENARIOS = ("micro", "micro-in", "skew", "source", "q7", "q8")
COLORS = {NONE: "0.45", "drrs": "tab:blue", "stop-restart": "tab:red",
          "pause-resume": "tab:orange", "fluid": "tab:green", "batched": "tab:olive",
          "non-disruptive": "tab:purple", "meces": "tab:brown"}

# scenario defaults: (full, quick)
DEFAULTS: dict[str, dict[str, tuple[Any, Any]]] = {
    "micro": {"rate": (5000.0, 2000.0), "keys": (20_000, 2_000), "skew": ("uniform", "uniform"),
              "from_p": (8, 1), "to_p": (12, 2), "service_us": (1000.0, 300.0)},
    "micro-in": {"rate": (5000.0, 2000.0), "keys": (20_000, 2_000),
                 "skew": ("uniform", "uniform"), "from_p": (12, 2), "to_p": (8, 1),
                 "service_us": (1000.0, 300.0)},
    "skew": {"rate": (5000.0, 2000.0), "keys": (20_000, 2_000), "skew": ("1.0", "1.0"),
             "from_p": (8, 2), "to_p": (None, None), "service_us": (0.0, 0.0)},
    "source": {"rate": (5000.0, 2000.0), "keys": (20_000, 2_000),
               "skew": ("uniform", "uniform"), "from_p": (2, 1), "to_p": (4, 2),
               "service_us": (0.0, 0.0), "partitions": (8, 4), "agg_p": (4, 2)},
    "q7": {"rate": (10_000.0, 5_000.0), "from_p": (4, 1), "to_p": (6, 2)},
    "q8": {"rate": (20_000.0, 10_000.0), "from_p": (4, 1), "to_p": (6, 2)},
}
TIMING = {"build": (12.0, 2.0), "baseline": (8.0, 3.0), "after": (12.0, 5.0), "repeats": (2, 1),
          "stable": (5, 2), "overhead_records": (600_000, 300_000), "overhead_repeats": (2, 1),
          "replication_seconds": (15.0, 5.0)}
REPLICATION_POLICIES = ("none", "hot", "all")
REPLICATION_WAIT_S = 60.0  # the longest wait past --replication-seconds for a first refresh
RESCALE_GUESS_S = 8.0  # for the progress estimate only
# a channel sends one frame per linger when its records are few: as Ray actor calls (~1.3 ms
# of CPU over both ends here), at the engine's 5 ms 12 aggregator tasks' frames alone kept
# both cores busy (see the module docstring)
LINGER_MS = 15.0


def parse_skew(text: str) -> float | None:
    """``--skew``: None for "uniform", else the Zipf exponent."""
    if text == "uniform":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--skew is 'uniform' or a Zipf exponent; got {text!r}") from None


# ------------------------------------------------------------------------------ the scenario


class Scenario:
    """What one scenario runs: the job, the operator, the rescale request, the build time."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.name = args.scenario
        self.nexmark = self.name in ("q7", "q8")
        self.op = {"q7": "q7-partial-max", "q8": "q8-join", "source": "gen"}.get(self.name,
                                                                                "agg")
        self.action = "rebalance" if self.name == "skew" else "rescale"
        self.empty_ok = self.nexmark  # window results are sparse
        self.assignment: tuple[int, ...] | None = None
        self.build_s = float(args.build)
        self.info: dict[str, Any] = {"build_s": self.build_s}
        if self.nexmark:
            return
        self.zipf = parse_skew(args.skew)
        coverage = args.coverage if self.zipf is None else None  # Zipf tails take ages
        horizon = args.build + args.baseline
        keys = jobs.generator_keys(int(args.rate * max(horizon, 120.0 if coverage else 0.0)),
                                   keys=args.keys, zipf=self.zipf)
        if coverage:
            need = an.records_to_cover(keys, coverage) or 0
            self.build_s = max(self.build_s, need / args.rate)
            self.info.update(coverage=coverage, coverage_records=need, build_s=self.build_s)
        n_build = int(args.rate * self.build_s)
        n_request = int(args.rate * (self.build_s + args.baseline))
        if keys.size < n_request:
            keys = jobs.generator_keys(n_request, keys=args.keys, zipf=self.zipf)
        import numpy as np

        distinct = int(np.unique(keys[:n_build]).size)
        self.info.update(build_records=n_build, keys_built=distinct,
                         expected_state_mb=distinct * args.state_bytes / 1e6)
        if self.action == "rebalance":
            seen = keys[:n_request]
            t = balance.rebalance_target(seen, args.keys, args.key_groups, args.from_p,
                                         args.to_p)
            self.assignment = t["assignment"]
            self.info.update(group_loads_records=t["group_loads"], load_records=int(seen.size),
                             imbalance_before=t["imbalance_before"],
                             imbalance_after=t["imbalance_after"],
                             planned_groups_moved=t["planned_groups_moved"],
                             assignment=list(self.assignment))

    def describe(self) -> str:
        a = self.args
        if self.nexmark:
            return (f"NEXMark {self.name.upper()} sliding {a.size_ms}/{a.slide_ms} ms, "
                    f"{a.rate:,.0f} events/s; {self.op} {a.from_p} -> {a.to_p}")
        skew = "uniform" if self.zipf is None else f"Zipf {self.zipf:g}"
        what = (f"rebalance {self.op} at {a.from_p} -> {a.to_p} tasks (load imbalance "
                f"{self.info['imbalance_before']:.2f} -> {self.info['imbalance_after']:.2f}, "
                f"{self.info['planned_groups_moved']} groups planned)"
                if self.action == "rebalance" else f"{self.op} {a.from_p} -> {a.to_p}")
        if self.name == "source":
            what = (f"source {self.op} ({a.partitions} partitions) {a.from_p} -> {a.to_p} "
                    f"tasks, agg at {a.agg_p}")
        service = (f", {a.service_us:,.0f} us per record per task" if a.service_us
                   else ", CPU-bound")
        return (f"{a.keys:,} keys ({skew}) x {a.state_bytes:,} B (~"
                f"{self.info['expected_state_mb']:,.0f} MB built), {a.rate:,.0f} records/s"
                f"{service}, {a.key_groups} key groups; {what}")

    def build(self, sink: LatencySink, config: JobConfig, *, full_speed: bool = False,
              num_records: int | None = None) -> StreamJob:
        a = self.args
        if self.nexmark:
            from examples.nexmark import queries
            from examples.nexmark.generator import NexmarkConfig
            from examples.nexmark.source import NexmarkSource

            job = StreamJob(f"rescale-{self.name}", num_key_groups=a.key_groups,
                            parallelism=a.from_p, config=config)
            src = NexmarkSource(NexmarkConfig(seed=42, first_event_rate=a.rate), event_time=False,
                                rate=a.rate, split_events=512)
            queries.build(self.name, job, src, sink, parallelism=a.from_p, source_parallelism=1,
                          size_ms=a.size_ms, slide_ms=a.slide_ms)
            return job
        source = self.name == "source"
        src = jobs.generator(rate=None if full_speed else a.rate, keys=a.keys, zipf=self.zipf,
                             state_bytes=a.state_bytes, num_records=num_records,
                             partitions=a.partitions if source else None)
        # at full speed (the overhead measurement) the tasks' CPU is what is measured
        service = 0.0 if full_speed else a.service_us
        return jobs.keyed_count_job(f"rescale-{self.name}", src, sink,
                                    parallelism=a.agg_p if source else a.from_p,
                                    key_groups=a.key_groups, config=config,
                                    function=jobs.PaddedCount(service),
                                    source_parallelism=a.from_p if source else 1)

    def request(self, handle: Any, protocol: str) -> Any:
        strategy, theta = self.args.assignment, self.args.balance
        if strategy is not None and self.action == "rebalance":
            return handle.rebalance(self.op, strategy, protocol=protocol, balance=theta)
        if self.assignment is not None:
            return handle.rebalance(self.op, self.assignment, protocol=protocol)
        return handle.rescale(self.op, self.args.to_p, protocol=protocol, assignment=strategy,
                              balance=theta)


# ------------------------------------------------------------------------------ one run


def run_order(protocols: list[str], repeats: int, with_none: bool) -> list[tuple[str, int]]:
    """(protocol, round) in the order they run: per round every protocol once, the run
    without rescaling before each (alternated, so drift of the machine's load reaches the
    baseline runs as it reaches the protocols), the protocols' order rotated by one each
    round (no protocol always runs first)."""
    out: list[tuple[str, int]] = []
    for rnd in range(repeats):
        shift = rnd % len(protocols) if protocols else 0
        for p in protocols[shift:] + protocols[:shift]:
            if with_none and p in PROTOCOLS:
                out.append((NONE, rnd))
            out.append((p, rnd))
        if with_none and not any(p in PROTOCOLS for p in protocols):
            out.append((NONE, rnd))
    return out


def run_one(sc: Scenario, protocol: str, config: JobConfig, progress: run.Progress,
            k: int, n: int) -> dict[str, Any]:
    a = sc.args
    sink = jobs.WriteLogLatencySink()
    request = None if protocol == NONE else (lambda h: sc.request(h, protocol))
    backend = str(config.state_backend)
    try:
        out = {"protocol": protocol, "backend": backend, **run.rescale_run(
            sc.build(sink, config), op=sc.op, request=request, build_s=sc.build_s,
            baseline_s=a.baseline, after_s=a.after, progress=progress,
            label=f"run {k}/{n} {protocol} [{backend}]",
            what=f"{sc.action} {sc.op} ({protocol})",
            guess_s=RESCALE_GUESS_S, settle_max_s=a.settle_max,
            settled=run.settle_check(sink, a.rate), sample_rss=True)}
        if out["status"] == RunStatus.OK:
            rep = out.get("report")
            if rep and rep["protocol"] != protocol:
                out["note"] = f"the report names protocol {rep['protocol']!r}"
            out.update(analyse(sc, sink, out))
    finally:
        shutil.rmtree(sink.directory, ignore_errors=True)
    return out


def analyse(sc: Scenario, sink: jobs.WriteLogLatencySink, r: dict[str, Any]) -> dict[str, Any]:
    """The run's figures (see the module docstring) from its sink and its times."""
    a = sc.args
    per_s = jobs.latency_seconds(sink)
    rows = an.histogram_rows(per_s)
    requested = r["requested_at"]
    completed = r["report"]["completed_at"] if r.get("report") else requested
    m = an.measure(rows, requested, completed, r["ended_at"], baseline_s=a.baseline,
                   stable_s=a.stable, tolerance=a.tolerance, slack_ms=a.slack_ms,
                   empty_ok=sc.empty_ok)
    base, per = m["baseline"], m["period"]
    base.update(an.latency_stats(an.merged(per_s, base["from_second"], base["to_second"])))
    per.update(an.latency_stats(an.merged(per_s, per["start"], per["end"])))
    end_s = int(r["ended_at"])
    m["tail"] = {"from_second": end_s - a.stable, "to_second": end_s,
                 **an.latency_stats(an.merged(per_s, end_s - a.stable, end_s))}
    segments = sink.segments()
    base["longest_gap"] = an.longest_gap(segments, requested - a.baseline, requested)
    m["longest_gap"] = an.longest_gap(segments, requested, max(float(per["end"]), completed))
    # whole seconds from the first after the job started to the last before it ended
    m["timeline"] = [{**row, "t": row["second"] + 0.5 - requested}
                     for row in an.dense(rows, int(r["started_at"]) + 1, end_s)]
    m["loadavg_at_end"] = os.getloadavg()
    return m


# ------------------------------------------------------------------------------ steady state


#: the steady-state overhead runs: name -> JobConfig fields (the default first)
OVERHEAD_CONFIGS = {
    "default": {},
    "no live rescaling": {"live_rescaling": False},
    "no metrics": {"metrics_port": None, "metrics_poll_interval_s": 3600.0},
}


def overhead(sc: Scenario, progress: run.Progress) -> dict[str, Any]:
    """Full-speed throughput of the micro job with the defaults, without live-rescaling
    support, and without metrics (no endpoint, no metrics polls of the tasks), the three
    alternated ``--overhead-repeats`` times; the overhead of each feature is the default's
    median against the median without it."""
    a = sc.args
    if sc.nexmark:
        return {"skipped": "measured on the micro job only"}
    rows: list[dict[str, Any]] = []
    for rep in range(a.overhead_repeats):
        for name, fields in OVERHEAD_CONFIGS.items():
            progress.step(f"overhead {rep + 1}/{a.overhead_repeats}: {name}",
                          4.0 + a.overhead_records / 150_000)
            sink = LatencySink()
            handle = sc.build(sink, JobConfig(transport=a.transport, **fields,
                                              **cli.state_fields(a, a.backends[0])),
                              full_speed=True, num_records=a.overhead_records).run()
            try:
                span, state = run.wait_finished(handle, 0.05, 600.0 + a.overhead_records / 1e3)
            finally:
                handle.stop()
            if span is None or state != JobState.FINISHED:
                return {"skipped": f"the job ended {state}: {handle.status().error}"}
            rows.append({"config": name, "live_rescaling": fields.get("live_rescaling", True),
                         "repeat": rep, "seconds": span,
                         "records_per_s": a.overhead_records / span,
                         "records_at_sink": sink.summary()["count"],
                         "loadavg_at_end": os.getloadavg()[0]})
    med = {name: an.median(r["records_per_s"] for r in rows if r["config"] == name)
           for name in OVERHEAD_CONFIGS}
    on, off, quiet = med["default"], med["no live rescaling"], med["no metrics"]
    return {"records": a.overhead_records, "parallelism": a.from_p, "runs": rows,
            "records_per_s_live": on, "records_per_s_without": off,
            "records_per_s_without_metrics": quiet,
            "ratio_live_over_without": an.ratio(on, off),
            "overhead_pct": None if not off or on is None else 100.0 * (1.0 - on / off),
            "metrics_overhead_pct": (None if not quiet or on is None
                                     else 100.0 * (1.0 - on / quiet))}


def replication_cost(sc: Scenario, progress: run.Progress) -> dict[str, Any]:
    """Steady-state cost of keeping replicas (Spacker's replication knob): the micro job at
    its rate, once per ``JobConfig(replication=...)`` policy for the same time; bytes copied
    and the owners' CPU seconds spent on refreshes, read from the job's Prometheus
    endpoint, and the sink's mean latency against the run without replicas."""
    a = sc.args
    if sc.nexmark:
        return {"skipped": "measured on the micro job only"}
    if a.from_p < 2:
        return {"skipped": "a replica lives on a task other than the owner: --from must be >= 2"}
    secs = a.replication_seconds
    rows: list[dict[str, Any]] = []
    for policy in REPLICATION_POLICIES:
        progress.step(f"replication cost: {policy}, {secs:g} s", secs + 5.0)
        sink = LatencySink()
        cfg = JobConfig(replication=policy, replication_period_s=a.replication_period,
                        linger_ms=a.linger_ms, transport=a.transport,
                        **cli.state_fields(a, a.backends[0]))
        handle = sc.build(sink, cfg).run()
        try:
            t0 = time.monotonic()
            time.sleep(secs)
            got = _replication(handle.metrics_url)
            # on a loaded machine the first refresh can come after `secs`: wait for it
            # (at most REPLICATION_WAIT_S more) and count the time actually measured
            while (policy != "none" and not got["reflow_replication_bytes_total"]
                   and time.monotonic() - t0 < secs + REPLICATION_WAIT_S):
                time.sleep(1.0)
                got = _replication(handle.metrics_url)
            elapsed = time.monotonic() - t0
            st = handle.status()
        finally:
            handle.stop()
        if not JobState(st.state).active:
            return {"skipped": f"the job ended {st.state}: {st.error}"}
        summ = sink.summary()
        rows.append({"policy": policy, "seconds": round(elapsed, 2),
                     "replication_bytes": got["reflow_replication_bytes_total"],
                     "replication_cpu_s": got["reflow_replication_cpu_seconds_total"],
                     "replicated_key_groups": int(got["reflow_replicas"]),
                     "mb_per_s": got["reflow_replication_bytes_total"] / 1e6 / elapsed,
                     "cpu_fraction": got["reflow_replication_cpu_seconds_total"] / elapsed,
                     "mean_ms": summ["mean_ms"], "records_at_sink": summ["count"]})
    base = rows[0]["mean_ms"]
    for r in rows:
        r["mean_over_none"] = an.ratio(r["mean_ms"], base)
    return {"period_s": a.replication_period, "seconds": secs, "runs": rows}


def _replication(metrics_url: str) -> dict[str, float]:
    """The job's replication bytes and CPU seconds so far and the key groups that have a
    replica now, from its Prometheus endpoint."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    got = {"reflow_replication_bytes_total": 0.0, "reflow_replication_cpu_seconds_total": 0.0,
           "reflow_replicas": 0.0}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name in got:
                got[smp.name] += smp.value
    return got


# ------------------------------------------------------------------------------ summary


def _capped(flags: dict[str, str], key: str, part: str, runs: dict[str, dict[str, Any]]) -> None:
    capped = [p for p, r in runs.items() if not r[part]["stabilized"]]
    if capped:
        flags[key] = f"{' and '.join(capped)} capped at the end of the run"


#: figures of a run whose medians over the rounds stand for its protocol
FIGURES = {"peak_ms": ("peak", "max_ms"), "peak_p99_ms": ("peak", "p99_ms"),
           "period_mean_ms": ("period", "mean_ms"), "period_s": ("period", "seconds"),
           "settle_s": ("settle", "seconds"), "baseline_mean_ms": ("baseline", "mean_ms"),
           "post_request_mean_ms": ("post_request", "mean_ms"),
           "rss_peak_mb": ("rss", "peak_total_mb")}
#: what ``summarise`` adds, kept per backend (``by_backend``) when a run used several
SUMMARY_KEYS = ("medians", "ratios", "ratio_notes", "no_rescale_mean_ms")


def medians(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per protocol (and ``none``): each figure's median over its ok runs, with range."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in results["runs"]:
        if r["status"] == RunStatus.OK:
            by.setdefault(r["protocol"], []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for p, runs in by.items():
        row: dict[str, Any] = {"runs": len(runs)}
        for name, (part, field) in FIGURES.items():
            row[name] = an.spread((r.get(part) or {}).get(field) for r in runs)
        row["migration_s"] = an.spread((r.get("report") or {}).get("duration_s") for r in runs)
        row["stabilized_all"] = all(r["period"].get("stabilized", True) for r in runs)
        row["loadavg_at_end"] = [r["loadavg_at_end"][0] for r in runs if r.get("loadavg_at_end")]
        out[p] = row
    return out


def summarise(results: dict[str, Any]) -> None:
    """Adds ``medians`` (per protocol, over the rounds), ``ratios`` (of those medians,
    within this run), ``ratio_notes`` and ``no_rescale_mean_ms``."""
    med = results["medians"] = medians(results)

    def m(p: str, f: str) -> float | None:
        return med[p][f]["median"] if p in med else None

    none_mean = m(NONE, "post_request_mean_ms")
    ratios: dict[str, Any] = {}
    flags: dict[str, str] = {}
    for p in med:
        if p == NONE:
            continue
        ref = none_mean if none_mean is not None else m(p, "baseline_mean_ms")
        ratios[f"{p} scaling-period mean / no-rescale mean"] = an.ratio(
            m(p, "period_mean_ms"), ref)
        # the same runs before their request: immune to the drift between runs on a shared
        # machine, but it compares against the old parallelism's latency
        ratios[f"{p} scaling-period mean / its own baseline mean"] = an.ratio(
            m(p, "period_mean_ms"), m(p, "baseline_mean_ms"))
    for p in med:
        if "drrs" not in med or p in (NONE, "drrs"):
            continue
        ratios[f"drrs peak / {p} peak"] = an.ratio(m("drrs", "peak_ms"), m(p, "peak_ms"))
        ratios[f"drrs peak p99 / {p} peak p99"] = an.ratio(m("drrs", "peak_p99_ms"),
                                                            m(p, "peak_p99_ms"))
        for f, name in (("period_s", "scaling period"), ("settle_s", "settle")):
            key = f"drrs {name} / {p} {name}"
            ratios[key] = an.ratio(m("drrs", f), m(p, f))
            capped = [q for q in ("drrs", p) if not med[q]["stabilized_all"]]
            if capped and f == "period_s":
                flags[key] = f"{' and '.join(capped)} capped at the end of a run"
        ratios[f"drrs scaling-period mean / {p} scaling-period mean"] = an.ratio(
            m("drrs", "period_mean_ms"), m(p, "period_mean_ms"))
        ratios[f"drrs migration duration / {p} migration duration"] = an.ratio(
            m("drrs", "migration_s"), m(p, "migration_s"))
    results["ratios"] = ratios
    results["ratio_notes"] = flags
    results["no_rescale_mean_ms"] = none_mean


def summarise_backends(results: dict[str, Any], backends: list[str]) -> None:
    """``summarise``; with several backends, once per backend over its runs, each kept in
    ``by_backend[backend]`` (the ratios compare protocols on one backend)."""
    if len(backends) < 2:
        summarise(results)
        return
    results["by_backend"] = {}
    for b in backends:
        sub = {**results, "runs": [r for r in results["runs"] if r.get("backend") == b]}
        summarise(sub)
        results["by_backend"][b] = {k: sub[k] for k in SUMMARY_KEYS}


def _views(results: dict[str, Any]) -> list[tuple[str | None, dict[str, Any]]]:
    """(backend, results with that backend's summary) for each backend; (None, results)
    when the run used one."""
    by = results.get("by_backend")
    if not by:
        return [(None, results)]
    return [(b, {**results, **v}) for b, v in by.items()]


def backends_table(results: dict[str, Any]) -> list[str]:
    """Per protocol, each backend's medians side by side."""
    views = _views(results)
    cols = ["protocol"] + [f"{b}: {what}" for b, _ in views for what in
                           ("period mean ms", "peak ms", "migration s", "peak RSS MB")]
    protocols = list(dict.fromkeys(p for _, v in views for p in v["medians"]))
    rows = []
    for p in protocols:
        row = [p]
        for _, v in views:
            m = v["medians"].get(p)
            row += ["-"] * 4 if m is None else [
                fmt(m["period_mean_ms"]["median"], ".1f"), fmt(m["peak_ms"]["median"], ",.0f"),
                fmt(m["migration_s"]["median"], ".2f"), fmt(m["rss_peak_mb"]["median"], ",.0f")]
        rows.append(row)
    return md_table(cols, rows)


def medians_table(results: dict[str, Any]) -> list[str]:
    def cell(sp: dict[str, Any], spec: str) -> str:
        if sp["median"] is None:
            return "-"
        if sp["n"] < 2:
            return fmt(sp["median"], spec)
        return f"{fmt(sp['median'], spec)} ({fmt(sp['min'], spec)}-{fmt(sp['max'], spec)})"

    cols = ["protocol", "runs", "peak ms", "peak p99 ms", "period mean ms", "scaling period s",
            "migration s", "base mean ms", "load at end"]
    rows = [[p, str(r["runs"]), cell(r["peak_ms"], ",.0f"), cell(r["peak_p99_ms"], ",.0f"),
             cell(r["period_mean_ms"], ".1f"), cell(r["period_s"], ".0f"),
             cell(r["migration_s"], ".2f"), cell(r["baseline_mean_ms"], ".1f"),
             ", ".join(f"{x:.1f}" for x in r["loadavg_at_end"])]
            for p, r in results["medians"].items()]
    return md_table(cols, rows)


def _notes(r: dict[str, Any], planned: int | None) -> str:
    rep = r.get("report") or {}
    notes = [] if r["period"]["stabilized"] else ["period capped at end of run"]
    if rep.get("planning_reason"):
        notes.append(f"planning: {rep['planning_reason']}")
    if r.get("note"):
        notes.append(r["note"])
    if rep and planned is not None and rep["key_groups_moved"] != planned:
        notes.append(f"moved {rep['key_groups_moved']} of the {planned} groups the "
                     "assignment moves")
    if rep.get("superseded"):
        notes.append("superseded")
    return "; ".join(notes)


def _seconds(part: dict[str, Any]) -> str:
    return f"{part['seconds']}" + ("" if part["stabilized"] else "+")


def _label(r: dict[str, Any]) -> str:
    backend = f" [{r['backend']}]" if r.get("backend") else ""
    return f"{r['protocol']} #{r.get('round', 0) + 1}{backend}"


def run_tables(results: dict[str, Any]) -> list[str]:
    """The main table (one row per run) and the detail table (the ok runs)."""
    cols = ["run", "base ms", "peak ms", "peak p99 ms", "period mean ms", "scaling period s",
            "settle s", "migration s", "suspended s", "propagation s", "MB moved",
            "groups moved", "thrpt dip", "longest gap s", "notes"]
    planned = results["scenario"].get("planned_groups_moved")
    rows, detail = [], []
    for r in results["runs"]:
        if r["status"] != RunStatus.OK:
            rows.append([_label(r), *[""] * (len(cols) - 2),
                         f"{r['status']}: {r.get('reason', '')[:160]}"])
            continue
        rep = r.get("report") or {}
        rows.append([
            _label(r), fmt(r["baseline"]["level_ms"]), fmt(r["peak"]["max_ms"], ",.0f"),
            fmt(r["peak"]["p99_ms"], ",.0f"), fmt(r["period"]["mean_ms"]),
            _seconds(r["period"]), _seconds(r["settle"]), fmt(rep.get("duration_s"), ".2f"),
            fmt(rep.get("suspended_s"), ".2f"), fmt(rep.get("propagation_delay_s"), ".3f"),
            fmt(None if not rep else rep["bytes_moved"] / 1e6),
            "-" if not rep else str(rep["key_groups_moved"]), fmt(r["dip"]["ratio"], ".2f"),
            fmt(r["longest_gap"]["gap_s"], ".2f"), _notes(r, planned)])
        detail.append([
            _label(r), fmt(r["baseline"]["p50_ms"]), fmt(r["baseline"]["p99_ms"]),
            fmt(r["period"]["p99_ms"]), fmt(r["tail"]["mean_ms"]),
            fmt(r.get("metrics_before", {}).get("state_bytes", 0) / 1e6),
            f"{rep.get('rerouted_records', 0):,}", str(len(rep.get("subscales", ()))),
            ", ".join(f"{ph} {t:.2f}s" for ph, t in rep.get("phases", ()))])
    dcols = ["run", "base p50 ms", "base p99 ms", "period p99 ms", "new level ms",
             "state MB", "rerouted", "subscales", "phases"]
    return (md_table(cols, rows, left=["notes"]) + ["", "Detail:", ""]
            + md_table(dcols, detail, left=["phases"]))


def _overhead_text(o: dict[str, Any]) -> str:
    return (f"Steady-state overhead of rescaling support (micro job at full speed, "
            f"{o['records']:,} records, parallelism {o['parallelism']}, median of "
            f"{len(o['runs']) // len(OVERHEAD_CONFIGS)} alternated): {fmt(o['records_per_s_live'], ',.0f')} records/s with "
            f"live rescaling vs {fmt(o['records_per_s_without'], ',.0f')} without "
            f"(`live_rescaling=False`): ratio {fmt(o['ratio_live_over_without'], '.3f')}, "
            f"overhead {fmt(o['overhead_pct'], '.1f')} %; of metrics: "
            f"{fmt(o.get('records_per_s_without_metrics'), ',.0f')} records/s without the "
            f"endpoint and the tasks' metrics polls, overhead "
            f"{fmt(o.get('metrics_overhead_pct'), '.1f')} %.")


def _replication_text(rc: dict[str, Any]) -> str:
    parts = [f"`{r['policy']}` {r.get('replicated_key_groups', 0)} key groups replicated, "
             f"{fmt(r['mb_per_s'], ',.1f')} MB/s copied, "
             f"{fmt(100.0 * r['cpu_fraction'], '.1f')} % of a core, mean latency "
             f"{fmt(r['mean_ms'])} ms ({fmt(r['mean_over_none'], '.2f')}x)"
             for r in rc["runs"]]
    return (f"Replication cost in steady state (micro job at its rate, {rc['seconds']:g} s "
            f"per policy, refreshed every {rc['period_s']:g} s): " + "; ".join(parts) + ".")


# the table legend, one paragraph
LEGEND = """
Columns: latency in ms at the sink; *base*: median per-second mean before the request;
*scaling period*: until the per-second mean stays within {tolerance:g} x base + {slack_ms:g}
ms for {stable_s} s ('+': not reached before the end of the run, capped); *settle*: the same
against max(base, final level); *thrpt dip*: lowest per-second sink records/s in the scaling
period / baseline records/s; *longest gap*: longest time without sink output from the
request to the end of the period; *new level*: mean of the last {stable_s} s.
""".strip().replace("\n", " ")


def markdown(results: dict[str, Any]) -> str:
    c = results["config"]
    views = _views(results)
    lines = [f"### rescale benchmark: `{c['scenario']}`" + (" (quick)" if c["quick"] else ""), "",
             results["scenario"]["description"] + ".", ""]
    for b, v in views:
        on = "" if b is None else f" on the {b} state backend"
        lines += [f"Medians over {c.get('repeats', 1)} alternated round(s){on} (range):", "",
                  *medians_table(v), ""]
    if len(views) > 1:
        lines += ["Side by side (medians):", "", *backends_table(results), ""]
    lines += ["Every run:", "", *run_tables(results)]
    for b, v in views:
        on = "" if b is None else f", {b} state backend"
        lines += ["", f"Ratios (this run's medians{on}):", ""]
        for k, x in v["ratios"].items():
            note = v["ratio_notes"].get(k)
            lines.append(f"- {k}: {fmt(x, '.3f')}" + (f" ({note})" if note else ""))
    for key, title, text in (
            ("overhead", "Steady-state overhead of rescaling support", _overhead_text),
            ("replication_cost", "Replication cost", _replication_text)):
        d = results.get(key)
        if d:
            lines += ["", f"{title}: skipped ({d['skipped']})." if "skipped" in d else text(d)]
    lines += ["", LEGEND.format(**c) + f" Total {results['total_seconds']:.0f} s, "
              f"{render.load_title(results)}.", ""]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: str) -> None:
    """Per-second p99 latency per run (log; shaded: its scaling period; with ``--plot-mean``
    also its mean, dashed, and its baseline level), request and completions marked, sink
    throughput below."""
    plt = render.pyplot()
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(12, 8), sharex=True,
                                  gridspec_kw={"height_ratios": [3, 1]})
    nan = float("nan")
    means = results["config"].get("plot_mean")
    runs = [r for r in results["runs"] if r["status"] == RunStatus.OK]
    others = sorted({r["protocol"] for r in runs} - set(COLORS))
    for i, r in enumerate(runs):  # one colour per protocol, whatever the round
        col = COLORS.get(r["protocol"]) or f"C{others.index(r['protocol']) % 10}"
        rows = r["timeline"]
        t = [x["t"] for x in rows]
        first = r.get("round", 0) == 0
        rocks = r.get("backend") == "rocksdb" and results.get("by_backend")
        name = r["protocol"] + (f" [{r['backend']}]" if results.get("by_backend") else "")
        ax.plot(t, [nan if x["p99_ms"] is None else x["p99_ms"] for x in rows], color=col,
                marker="x" if rocks else ".", lw=1.4, ls="-." if rocks else "-",
                label=(name + (" p99" if means else "")) if first else None)
        if means:
            ax.plot(t, [nan if x["mean_ms"] is None else x["mean_ms"] for x in rows], color=col,
                    ls="--", lw=1.0, label=f"{r['protocol']} mean")
            if r["baseline"]["level_ms"]:
                ax.axhline(r["baseline"]["level_ms"], color=col, lw=0.7, alpha=0.6)
        ax2.plot(t, [x["count"] for x in rows], color=col, lw=1.2, ls="-." if rocks else "-",
                 label=name if first else None)
        p = r["period"]
        ax.axvspan(p["start"] - r["requested_at"], p["end"] - r["requested_at"], color=col,
                   alpha=0.06)
        rep = r.get("report")
        if rep:
            done = rep["completed_at"] - r["requested_at"]
            for a_ in (ax, ax2):
                a_.axvline(done, color=col, ls=":", lw=1.5)
            ax.annotate(f"{_label(r)} done {rep['duration_s']:.1f} s", (done, 0.97 - 0.04 * i),
                        xycoords=("data", "axes fraction"), fontsize=8, color=col, va="top")
    for a_ in (ax, ax2):
        a_.axvline(0, color="k", lw=1.5)
    # from the baseline on: the job's start-up (its first seconds' latency) would take the
    # y-axis and leave the rescale a flat line at the bottom
    baseline_s = float(results["config"].get("baseline") or 0.0)
    if runs and baseline_s:
        ax.set_xlim(left=-baseline_s - 1.0)
        shown = [x["p99_ms"] for r in runs for x in r["timeline"]
                 if x["p99_ms"] is not None and x["t"] >= -baseline_s - 1.0]
        if shown:
            ax.set_ylim(bottom=max(min(shown) / 2, 0.1), top=max(shown) * 2)
    ax.annotate("rescale request", (0, 0.02), xycoords=("data", "axes fraction"), fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("latency per wall second, ms (log)")
    ax.legend(fontsize=8, ncol=2 if means else 1)
    ax2.set_ylabel("records at sink / s")
    ax2.set_xlabel("seconds since the rescale request (dotted: completion; shaded: scaling "
                   "period)")
    fig.suptitle(f"reflow rescale — {results['config']['scenario']}: "
                 f"{results['scenario']['description']}\n{render.load_title(results)}", fontsize=9)
    render.save_figure(fig, path)


# ------------------------------------------------------------------------------ main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = cli.parser(__doc__, "rescale/<scenario>")
    ap.add_argument("--scenario", choices=SCENARIOS, default="micro")
    ap.add_argument("--protocols", default=None,
                    help=f"comma-separated (default: every one of {','.join(PROTOCOLS)}); the "
                         f"run without rescaling ('{NONE}') is added unless --no-baseline-run")
    ap.add_argument("--no-baseline-run", action="store_true", help="skip the run without rescaling")
    ap.add_argument("--rate", type=float, help="records (NEXMark: events) per second")
    ap.add_argument("--keys", type=int, help="micro/skew: number of keys")
    ap.add_argument("--skew", help="micro/skew: 'uniform' or a Zipf exponent")
    ap.add_argument("--state-bytes", type=int, default=10_000, help="padding bytes per key")
    ap.add_argument("--linger-ms", type=float, default=LINGER_MS,
                    help="JobConfig(linger_ms=n): how long a channel holds records before "
                         f"sending a frame ({LINGER_MS:g}; the engine's default is "
                         f"{JobConfig().linger_ms:g}: see the module docstring)")
    ap.add_argument("--transport", choices=("tcp", "ray"), default=JobConfig.transport,
                    help="JobConfig(transport=...): data frames over direct sockets (tcp, "
                         "the default) or as one Ray actor call each (ray)")
    ap.add_argument("--service-us", type=float,
                    help="micro/skew: per-record service time of each aggregator task, "
                         "slept (a task serves at most 1e6/n records/s without using a "
                         "core): micro and micro-in 1000 (quick 300), skew 0; 0 makes the "
                         "run CPU-bound")
    ap.add_argument("--from", dest="from_p", type=int, help="start parallelism")
    ap.add_argument("--to", dest="to_p", type=int, help="target parallelism")
    ap.add_argument("--partitions", type=int,
                    help="source scenario: the generator's partitions (8; quick 4)")
    ap.add_argument("--agg-p", type=int,
                    help="source scenario: the aggregator's parallelism (4; quick 2)")
    ap.add_argument("--assignment", help="how the rescale chooses its target assignment "
                                         "(migration.assignment: uniform, consistent-hashing, "
                                         "ssm); default: uniform ranges, and the skew "
                                         "scenario's precomputed balanced target")
    ap.add_argument("--balance", type=float, help="θ for --assignment ssm (default 0.2)")
    ap.add_argument("--size-ms", type=int, default=2000, help="q7/q8 window size")
    ap.add_argument("--slide-ms", type=int, default=500, help="q7/q8 window slide")
    cli.add_rescale_run(ap, TIMING, coverage=None)
    ap.add_argument("--warm-standby", type=int,
                    help="JobConfig(warm_standby_tasks=n), the same for every run: new tasks "
                         "come from n idle actors started with the job (not refilled within "
                         "a run); default: the target parallelism, as many tasks as "
                         "stop-restart redeploys, so it redeploys into warm actors as Flink "
                         "redeploys into running task slots (0: cold actor starts)")
    ap.add_argument("--repeats", type=int,
                    help="rounds of runs (2; quick 1): each round runs every protocol once, "
                         "the run without rescaling alternating with them (none, drrs, none, "
                         "pause-resume, ...); figures are the medians over the rounds")
    ap.add_argument("--set-aside-cap", type=int, default=200,
                    help="JobConfig(drrs_set_aside_cap=n): records a task sets aside")
    ap.add_argument("--max-subscales", type=int, default=2,
                    help="JobConfig(drrs_max_subscales_per_task=n)")
    ap.add_argument("--max-subscales-total", type=int,
                    help="JobConfig(drrs_max_subscales=n): subscales of the operator at once "
                         "(default: as many as the cluster's CPUs)")
    ap.add_argument("--subscale-size", type=int, default=4,
                    help="JobConfig(drrs_subscale_size=n): key groups per subscale")
    ap.add_argument("--subscale-bytes", type=int, default=JobConfig.drrs_subscale_bytes,
                    help="JobConfig(drrs_subscale_bytes=n): state per subscale (0: no budget)")
    ap.add_argument("--max-chunk-bytes", type=int, default=JobConfig.drrs_max_chunk_bytes,
                    help="JobConfig(drrs_max_chunk_bytes=n): state a drrs new owner may have "
                         "in flight beyond one group when the machine has idle cores "
                         "(0: one group at a time)")
    ap.add_argument("--overhead", dest="overhead", action="store_true", default=True,
                    help="measure the steady-state overhead (default: on)")
    ap.add_argument("--no-overhead", dest="overhead", action="store_false")
    ap.add_argument("--replication-cost", dest="replication_cost", action="store_true",
                    default=None, help="measure what keeping replicas costs in steady state "
                                       "(default: on; micro jobs only)")
    ap.add_argument("--no-replication-cost", dest="replication_cost", action="store_false")
    ap.add_argument("--replication-seconds", type=float,
                    help="seconds per replication policy (15; quick 5)")
    ap.add_argument("--replication-period", type=float, default=JobConfig.replication_period_s,
                    help="JobConfig(replication_period_s=...) for that measurement")
    ap.add_argument("--overhead-records", type=int)
    ap.add_argument("--overhead-repeats", type=int)
    ap.add_argument("--plot-mean", action="store_true",
                    help="also draw each run's per-second mean latency and baseline level")
    cli.add_state_backend(ap)
    args = ap.parse_args(argv)
    args.backends = cli.state_backends(args)
    if args.state_gb:
        if len(args.state_gb) != 1:
            ap.error("--state-gb takes one size here")
        if args.coverage is None:
            args.coverage = 0.99  # the whole size is built
    if args.state_gb and args.scenario in ("q7", "q8"):
        ap.error("--state-gb sizes the generator's keyed state: not for q7/q8")
    cli.fill_defaults(args, {  # what the scenario leaves open (q7/q8 have no keys)
        "key_groups": (128, 128), "service_us": (0.0, 0.0), "keys": (20_000, 20_000),
        "skew": ("uniform", "uniform"), "replication_cost": (True, False),
        "partitions": (8, 4), "agg_p": (4, 2),
    } | DEFAULTS[args.scenario] | TIMING)
    if args.state_gb:
        args.state_bytes = max(1, int(args.state_gb[0] * 1e9 / args.keys))
    if args.to_p is None:
        args.to_p = args.from_p
    if args.warm_standby is None:
        args.warm_standby = args.to_p
    every = ["drrs", "stop-restart"] if args.scenario == "source" else map(str, PROTOCOLS)
    args.protocols = [p for p in cli.comma_list(args.protocols) or every if p != NONE]
    # a quick run has a folder of its own: it never overwrites a full run's results
    args.out = cli.out_dir(args, "rescale", args.scenario + ("-quick" if args.quick else ""))
    if args.scenario in ("micro", "micro-in", "skew", "source"):
        parse_skew(args.skew)
    if not 1 <= args.from_p <= args.key_groups or not 1 <= args.to_p <= args.key_groups:
        ap.error("parallelism must be between 1 and --key-groups")
    return args


def job_config(args: argparse.Namespace, backend: str = "memory") -> JobConfig:
    """The ``JobConfig`` of every rescale run on ``backend`` (from the parsed arguments)."""
    return JobConfig(**cli.state_fields(args, backend),
                     warm_standby_tasks=args.warm_standby, warm_standby_refill_s=3600.0,
                     linger_ms=args.linger_ms, transport=args.transport,
                     drrs_set_aside_cap=args.set_aside_cap,
                     drrs_max_subscales_per_task=args.max_subscales,
                     drrs_max_subscales=args.max_subscales_total,
                     drrs_subscale_size=args.subscale_size,
                     drrs_subscale_bytes=args.subscale_bytes or None,
                     drrs_max_chunk_bytes=args.max_chunk_bytes)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = provenance.begin(__file__, argv)
    sc = Scenario(args)
    configs = {b: job_config(args, b) for b in args.backends}
    config = configs[args.backends[0]]
    names = run_order(args.protocols, args.repeats, not args.no_baseline_run)
    print(f"rescale benchmark '{args.scenario}': {sc.describe()}", flush=True)
    print(f"runs: {', '.join(p for p, _ in names)}; per run build {sc.build_s:g} s, baseline "
          f"{args.baseline:g} s, after {args.after:g} s", flush=True)
    per_run = 5.0 + sc.build_s + args.baseline + args.after
    planned = len(args.backends) * sum(per_run + (RESCALE_GUESS_S if p != NONE else 0.0)
                                       for p, _ in names if p == NONE or p in PROTOCOLS)
    if args.overhead and not sc.nexmark:
        planned += len(OVERHEAD_CONFIGS) * args.overhead_repeats * (4.0 + args.overhead_records / 150_000)
    if args.replication_cost and not sc.nexmark:
        planned += len(REPLICATION_POLICIES) * (args.replication_seconds + 5.0)
    results.update({
        "config": dict(vars(args)) | {
            "stable_s": args.stable, "seed": jobs.SEED,
            "job_config": {k: getattr(config, k) for k in config.__dataclass_fields__}},
        "scenario": {"name": args.scenario, "operator": sc.op, "action": sc.action,
                     "description": sc.describe(), **sc.info},
        "definitions": {
            "latency": "sink arrival - record timestamp (GeneratorSource: scheduled emission "
                       "time; NEXMark window results: window end), ms, per wall second",
            "baseline": "the `baseline` whole seconds before the request second; level_ms: the "
                        "median of their per-second means",
            "scaling_period": "[request second, first second s >= completion second from which "
                              "`stable_s` seconds all have mean <= tolerance x baseline level + "
                              "slack_ms), capped at the end of the run (stabilized false)",
            "settle": "as scaling_period, against max(baseline level, level of the last "
                      "`stable_s` seconds)",
            "tail": "merged histogram of the last `stable_s` whole seconds of the run (the "
                    "post-rescale level)",
            "peak": "max_ms: highest latency of a record in the scaling period; p99_ms: "
                    "highest per-second p99 in it; mean_ms: highest per-second mean",
            "dip": "lowest records/s at the sink in a second of the scaling period / baseline "
                   "records/s (a second without output counts 0)",
            "longest_gap": "longest time without any sink write overlapping [request, max(end "
                           "of scaling period, completion)] (50 ms resolution)",
            "no_rescale_mean": "the `none` run's mean latency from its (virtual) request to "
                               "its end",
        },
        "protocols_available": list(PROTOCOLS),
        "runs": [],
    })
    results["machine"]["ray"] = run.ray_version()
    progress = run.Progress(planned)
    run.init_ray()
    try:
        for k, (p, rnd) in enumerate(names, 1):
            if p != NONE and p not in PROTOCOLS:
                if rnd == 0:
                    results["runs"].append({
                        "protocol": p, "round": rnd, "status": RunStatus.SKIPPED,
                        "reason": f"not in migration.protocols.PROTOCOLS "
                                  f"({', '.join(PROTOCOLS)})"})
                continue
            for b in args.backends:  # alternated, so drift reaches both backends alike
                r = run_one(sc, p, configs[b], progress, k, len(names))
                r["round"] = rnd
                results["runs"].append(r)
                if r["status"] != RunStatus.OK:
                    print(f"\n{p} [{b}]: {r['status']}: {r.get('reason')}", file=sys.stderr,
                          flush=True)
        if args.overhead:
            results["overhead"] = overhead(sc, progress)
        if args.replication_cost:
            results["replication_cost"] = replication_cost(sc, progress)
    finally:
        progress.close()
        run.shutdown_ray()
    provenance.finish(results)
    summarise_backends(results, args.backends)
    render.write_outputs(args.out, results, markdown=markdown(results), png="timeline.png",
                         plot=plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
