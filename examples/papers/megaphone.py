"""Megaphone: all-at-once vs fluid vs batched migration, overhead vs bins, memory (Fig. 5-19).

"Megaphone: latency-conscious state migration for distributed streaming dataflows"
(Hoffmann et al., VLDB 2019), rerun on reflow's ``fluid`` and ``batched`` protocols (the
paper's own strategies, ``migration.protocols.megaphone``) and its all-at-once baseline.

    python examples/papers/megaphone.py            # full: 15-25 min on 2 shared CPUs
    python examples/papers/megaphone.py --quick    # 5-15 min (8 job deployments)
    python examples/papers/megaphone.py --parts nexmark,bins   # some parts only
    python examples/papers/megaphone.py --from-results results.json  # redraw only

Like every benchmark it joins a Ray cluster that ``ray start`` recorded on this machine;
``RAY_ADDRESS=local`` makes it start its own (the full run was made so).

The strategies (``STRATEGIES``: a reflow protocol and ``JobConfig`` fields each):

* ``all-at-once`` (the paper's single configuration update moving every bin at once):
  ``pause-resume``, every moving key group in one step, the old owners aligned on the
  step's barrier, the new owners reading nothing after it until the state is in. That is
  Megaphone's all-at-once in timely dataflow: a stateful operator processes a timestamp
  only once its input frontier, which includes the state channel, has passed it, so after
  the update's time the receiving workers process nothing until the migrated state
  arrived; with the paper's migration every task sends or receives. ``--one-step-batched``
  adds the other one-step reading to the NEXMark part: ``batched`` with
  ``batched_step_size`` = the key groups, whose new owners set aside only the records of
  the groups still in flight (a job of its own: its ``JobConfig`` differs).
* ``fluid``: ``fluid``, one key group per step, steps in sequence (the paper's fluid).
* ``batched``: ``batched`` with ``batched_matching``: steps in which every task sends and
  receives at most one group, the paper's batched strategy (its harness builds each step as a
  maximum bipartite matching of the moving bins' (old, new) workers).

reflow's bins are key groups (``--key-groups``). The migration is the paper's (§5): at a
fixed parallelism (``--parallelism``, 4: the paper's four workers per process), half of the
groups of half of the tasks move to the other half (25 % of the state; ``half_move``), by
``handle.rebalance``, then back to the balanced assignment. The paper reports the second
migration; both move the same groups and state, so the medians here are over both (the
second's alone are in the tables and ``results.json``): two samples per round on a noisy
machine. One job per configuration runs every strategy's pair of migrations in turn,
``--gap`` seconds apart, ``--repeats`` rounds (the order rotates per round,
``rescale.run_order``; in the sweep all-at-once runs last in the first round,
``SWEEP_ORDER``): deploying a job takes 10-60 s on this shared machine, a migration a few. Per migration: its duration
(``RescaleReport.duration_s``) and its maximum latency, the highest record latency from the
request until the per-second mean latency is back within ``--tolerance`` x the job's level
before the first migration + ``--slack-ms`` for ``--stable`` seconds
(``harness.analysis.scaling_period``, as ``rescale.py`` judges a rescale).

Parts (``--parts``, default all):

* ``nexmark`` (Fig. 5-12): the Q7 and Q8 scenarios of ``examples/bench/rescale.py``
  (sliding windows, open-loop ``NexmarkSource``; ``rescale.Scenario``), the window operator
  (``q7-partial-max``, ``q8-join``) migrated by each strategy; per-second latency
  percentiles of the window results over time, one panel per strategy (the paper's
  timelines). Q8's window is longer (``--q8-size-ms``) for more state.
* ``bins`` (Fig. 13-15): the key-count job (``rescale.py``'s micro job: a uniform key
  domain, a count per key) in steady state at ``--bins`` key groups (16 ... 4096) and
  without live-rescaling support (``JobConfig(live_rescaling=False)``, the paper's "native"
  timely operator) at the smallest: latency percentiles over ``--steady-s`` seconds at
  ``--rate`` (the paper's ccdf and table) and records per CPU-second of the job's processes
  (the throughput a core gives; full-speed runs would cost a deployment each); overhead =
  against the smallest bin count.
* ``sweep`` (Fig. 16-19): the key-count job migrated by each strategy as the bins vary
  (``--sweep-bins`` at ``--keys`` keys, Fig. 16), as the key domain varies
  (``--sweep-keys`` at ``--sweep-fixed-bins``, Fig. 17) and, with ``--proportional``, both
  together at ``--keys-per-bin`` (Fig. 18); every job's processes are sampled for their RSS
  four times a second (``harness.procs.RssSampler``); Fig. 19 is drawn from the job with
  the largest state.

Writes ``results.json``, ``megaphone.png`` (the paper's figures: timelines, ccdf, latency
vs duration, memory) and ``summary.md`` (the paper's claim beside reflow's measurement, the
scale, whether it holds) to ``--out`` (default ``examples/papers/results/megaphone/``;
``--quick``: ``.../megaphone-quick/``).
"""

# ruff: noqa: E402  (the repository root goes on sys.path before reflow's imports)
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import time
from collections.abc import Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from engine import JobConfig, RescaleRefused
from engine.dataflow.keygroups import moved_key_groups, uniform_assignment
from examples.bench import rescale
from examples.bench.harness import analysis as an
from examples.bench.harness import cli, jobs, procs, provenance, render, run
from examples.bench.harness.render import fmt, md_table
from examples.bench.harness.run import RunStatus
from examples.papers import RESULTS_ROOT

#: strategy -> (reflow protocol, JobConfig fields; ``ALL_GROUPS`` stands for the key groups)
ALL_GROUPS = -1
STRATEGIES: dict[str, tuple[str, dict[str, Any]]] = {
    "all-at-once": ("pause-resume", {}),
    "batched": ("batched", {"batched_matching": True}),
    "fluid": ("fluid", {}),
    "one-step batched": ("batched", {"batched_step_size": ALL_GROUPS,
                                     "batched_matching": False}),
}
MAIN = ("all-at-once", "batched", "fluid")  # the paper's three
COLORS = {"all-at-once": "tab:red", "batched": "tab:olive", "fluid": "tab:green",
          "one-step batched": "tab:orange", "native": "0.3"}
PARTS = ("nexmark", "bins", "sweep")
QUERIES = ("q7", "q8")
#: the paper's bin count where it holds bins constant (§5.1, Fig. 19)
PAPER_BINS = 4096
#: the paper reports the second migration (back to balanced); both move the same groups
REPORTED = "back"
#: the sweep's order within a round: all-at-once last, so that an RSS rise it shows comes
#: on top of the high-water mark fluid's and batched's migrations left (freed memory stays
#: in a Python process)
SWEEP_ORDER = ("fluid", "batched", "all-at-once")

# (full, quick)
DEFAULTS: dict[str, tuple[Any, Any]] = {
    "repeats": (1, 1), "parallelism": (4, 2), "gap": (4.0, 4.0), "stable": (2, 2),
    # nexmark
    "nx_rate": (8_000.0, 4_000.0), "nx_build": (6.0, 4.0), "nx_baseline": (5.0, 3.0),
    "q8_size_ms": (6_000, 4_000), "q8_slide_ms": (500, 500),
    # bins
    "bins": ("16,256,4096", "16,4096"), "rate": (3_000.0, 2_000.0),
    "steady_s": (8.0, 5.0),
    # sweep
    "keys": (4_000, 2_000), "state_bytes": (25_000, 20_000),
    "sweep_bins": ("16,64,256", "16,64"), "sweep_keys": ("4000,8000", "1000,2000"),
    "sweep_fixed_bins": (64, 64), "proportional": (False, False), "keys_per_bin": (62, 31),
    "sweep_rate": (3_000.0, 2_000.0), "sweep_build": (4.0, 3.0), "sweep_baseline": (4.0, 3.0),
    "coverage": (0.95, 0.9),
}


# ---------------------------------------------------------------------- the migration

def half_move(key_groups: int, parallelism: int) -> tuple[int, ...]:
    """The paper's migration: from uniform ranges, the second half of the groups of each task
    ``t < parallelism // 2`` moves to task ``t + parallelism // 2`` (25 % of the groups at an
    even parallelism); the parallelism stays."""
    old = list(uniform_assignment(key_groups, parallelism))
    half = parallelism // 2
    if half < 1:
        raise ValueError("half_move needs at least 2 tasks")
    new = list(old)
    for t in range(half):
        mine = [kg for kg, owner in enumerate(old) if owner == t]
        for kg in mine[len(mine) // 2:]:
            new[kg] = t + half
    return tuple(new)


def protocol_of(strategy: str) -> str:
    return STRATEGIES[strategy][0]


def job_groups(strategies: Sequence[str]) -> list[tuple[dict[str, Any], list[str]]]:
    """The strategies grouped by the ``JobConfig`` fields they need: strategies whose fields
    do not conflict share a job (``fluid`` and ``all-at-once`` need none)."""
    groups: list[tuple[dict[str, Any], list[str]]] = []
    for s in strategies:
        fields = STRATEGIES[s][1]
        for g_fields, members in groups:
            if all(g_fields.get(k, v) == v for k, v in fields.items()):
                g_fields.update(fields)
                members.append(s)
                break
        else:
            groups.append((dict(fields), [s]))
    return groups


def job_config(base: JobConfig, fields: dict[str, Any], key_groups: int) -> JobConfig:
    """``base`` with a group's ``JobConfig`` fields (``ALL_GROUPS``: the key groups)."""
    return dataclasses.replace(base, **{k: key_groups if v == ALL_GROUPS else v
                                        for k, v in fields.items()})


class MoveScenario(rescale.Scenario):
    """A ``rescale.Scenario`` at a fixed parallelism whose target is the paper's migration
    (``half_move``), and whose jobs' processes are sampled for their RSS and CPU four
    times a second once deployed (``rss``: the sampler of the last job run, ``rss_epoch``
    its start in epoch seconds)."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.balanced = uniform_assignment(args.key_groups, args.from_p)
        self.skewed = half_move(args.key_groups, args.from_p)
        self.moved = len(moved_key_groups(self.balanced, self.skewed))
        self.rss: procs.RssSampler | None = None
        self.rss_epoch = 0.0

    def build(self, sink: Any, config: JobConfig, **kwargs: Any) -> Any:
        job = super().build(sink, config, **kwargs)
        deploy = job.run

        def run_and_sample() -> Any:
            handle = deploy()
            pids = procs.job_actor_pids(handle.job_id)  # run() returns once all are up
            self.rss_epoch, t0 = time.time(), time.monotonic()
            self.rss = procs.RssSampler(pids, t0, interval=0.25)
            self.rss.start()
            return handle

        job.run = run_and_sample  # type: ignore[method-assign]
        return job

    def stop_sampling(self) -> procs.RssSampler | None:
        s, self.rss = self.rss, None
        if s is not None:
            s.stop()
        return s


def scenario_args(scenario: str, *, parallelism: int, key_groups: int, rate: float,
                  build: float, baseline: float, stable: int, extra: Sequence[str] = ()
                  ) -> argparse.Namespace:
    """``rescale.py``'s arguments for one of its scenarios at a fixed parallelism (no warm
    standbys: a rebalance adds no task; no overhead or replication measurement)."""
    argv = ["--scenario", scenario, "--from", str(parallelism), "--to", str(parallelism),
            "--key-groups", str(key_groups), "--rate", str(rate), "--build", str(build),
            "--baseline", str(baseline), "--after", "0", "--stable", str(stable),
            "--warm-standby", "0", "--repeats", "1", "--no-overhead",
            "--no-replication-cost", "--settle-max", "20", *extra]
    return rescale.parse_args(argv)


def _short(actor: str) -> str:
    """``<job>/agg/0/...`` -> ``agg/0``; the JobMaster -> ``master``."""
    parts = actor.split("/")
    if len(parts) >= 3 and parts[2].isdigit():
        return f"{parts[1]}/{parts[2]}"
    return "master" if "master" in actor.lower() else "/".join(parts[1:]) or actor


def rss_series(sampler: procs.RssSampler | None, epoch: float) -> dict[str, Any] | None:
    """A sampler's RSS (MB per process and in total; ``t``: seconds since ``epoch``)."""
    if sampler is None or not sampler.samples:
        return None
    samples = sampler.samples
    names = sorted({n for s in samples for n in s["per_actor"]})
    return {"epoch": epoch, "t": [round(s["t"], 3) for s in samples],
            "total_mb": [round(s["rss_bytes"] / 2**20, 2) for s in samples],
            "per_process_mb": {_short(n): [round(s["per_actor"].get(n, 0) / 2**20, 2)
                                           for s in samples] for n in names}}


def memory_figures(series: dict[str, Any] | None, op: str, start: float, done: float
                   ) -> dict[str, Any]:
    """From an RSS series, for a migration from ``start`` to ``done`` (seconds on the
    series' clock): per process its level before (the median of the samples in the 3 s
    before ``start``), its peak from ``start`` to 1 s after ``done`` and the rise; the
    largest rise among ``op``'s tasks (the paper's "additional memory during the
    migration") and the sum of their rises."""
    if not series:
        return {}
    t = series["t"]
    out: dict[str, Any] = {"per_process": {}}
    for name, mb in series["per_process_mb"].items():
        before = [m for x, m in zip(t, mb, strict=True) if start - 3.0 <= x < start and m]
        during = [m for x, m in zip(t, mb, strict=True) if start <= x <= done + 1.0 and m]
        if not before or not during:
            continue
        level = an.median(before)
        out["per_process"][name] = {"level_mb": level, "peak_mb": max(during),
                                    "rise_mb": max(during) - level}
    ops = {n: v for n, v in out["per_process"].items() if n.startswith(op + "/")}
    if ops:
        worst = max(ops, key=lambda n: ops[n]["rise_mb"])
        out.update(max_rise_process=worst, max_rise_mb=ops[worst]["rise_mb"],
                   total_rise_mb=sum(v["rise_mb"] for v in ops.values()))
    return out


def judge(migrations: list[dict[str, Any]], rows: dict[int, dict[str, Any]],
          level: float | None, ended: float, a: argparse.Namespace, empty_ok: bool,
          series: dict[str, Any] | None, op: str) -> None:
    """Adds each migration's figures: ``duration_s``, the scaling period until the next
    request (or ``ended``) against the job's ``level``, ``max_latency_ms`` and
    ``peak_p99_ms`` in it, and its ``memory`` (``memory_figures``)."""
    for i, m in enumerate(migrations):
        rep = m.get("report")
        if not rep:
            continue
        nxt = migrations[i + 1]["requested_at"] if i + 1 < len(migrations) else ended
        period = an.scaling_period(rows, int(m["requested_at"]), int(rep["completed_at"]),
                                   level, int(nxt), tolerance=a.tolerance,
                                   stable_s=a.stable, slack_ms=a.slack_ms, empty_ok=empty_ok)
        pk = an.peaks(an.window(rows, period.start, period.end))
        m.update(duration_s=rep["duration_s"], period=period.as_dict(),
                 max_latency_ms=pk["max_ms"], peak_p99_ms=pk["p99_ms"])
        if series:
            e = series["epoch"]
            m["memory"] = memory_figures(series, op, m["requested_at"] - e,
                                         rep["completed_at"] - e)


def migration_job(sc: MoveScenario, strategies: Sequence[str], fields: dict[str, Any],
                  rounds: int, gap_s: float, progress: run.Progress, label: str
                  ) -> dict[str, Any]:
    """One job (``run.rescale_run``: deploy, build, settle, baseline) whose request runs,
    per round and strategy in ``rescale.run_order``'s order, the paper's migration out and
    back (``gap_s`` after each); every migration's figures (``judge``), the job's
    per-second timeline and its RSS series."""
    a = sc.args
    config = job_config(rescale.job_config(a), fields, a.key_groups)
    order = rescale.run_order(list(strategies), rounds, with_none=False)
    migrations: list[dict[str, Any]] = []

    def request(handle: Any) -> Any:
        report = None
        for s, rnd in order:
            for direction, target in (("out", sc.skewed), (REPORTED, sc.balanced)):
                progress.step(f"{label}: {s} {direction}", gap_s + 2.0)
                m: dict[str, Any] = {"strategy": s, "round": rnd, "direction": direction,
                                     "protocol": protocol_of(s), "requested_at": time.time()}
                migrations.append(m)
                try:
                    report = handle.rebalance(sc.op, target, protocol=protocol_of(s))
                    m["report"] = _report(run.report_dict(report))
                    m["status"] = str(RunStatus.OK)
                except RescaleRefused as exc:
                    m.update(status=str(RunStatus.SKIPPED), reason=f"RescaleRefused: {exc}")
                m["returned_at"] = time.time()
                time.sleep(gap_s)
        return report

    sink = jobs.WriteLogLatencySink()
    try:
        r = run.rescale_run(sc.build(sink, config), op=sc.op, request=request,
                            build_s=sc.build_s, baseline_s=a.baseline, after_s=0.0,
                            progress=progress, label=label, what="migrations",
                            settled=run.settle_check(sink, a.rate), settle_max_s=a.settle_max)
        sampler = sc.stop_sampling()
        rows = an.histogram_rows(jobs.latency_seconds(sink))
    finally:
        sc.stop_sampling()
        shutil.rmtree(sink.directory, ignore_errors=True)
    out: dict[str, Any] = {"status": str(r["status"]), "reason": r.get("reason"),
                           "config_fields": fields, "migrations": migrations,
                           "metrics_before": r.get("metrics_before")}
    if "started_at" not in r:  # a failed request: rescale_run returned early
        r.update(started_at=sc.rss_epoch, requested_at=migrations[0]["requested_at"]
                 if migrations else time.time(), ended_at=time.time())
    req0 = r["requested_at"]
    base = an.window(rows, int(req0 - a.baseline), int(req0))
    level = an.level(base)
    series = rss_series(sampler, sc.rss_epoch)
    out["baseline_max_ms"] = an.peaks(base)["max_ms"]
    judge(migrations, rows, level, r["ended_at"], a, sc.empty_ok, series, sc.op)
    out.update(level_ms=level, baseline_mean_ms=an.weighted_mean(base),
               started_at=r["started_at"], ended_at=r["ended_at"], rss_series=series,
               timeline=[{k: x.get(k) for k in ("second", "count", "mean_ms", "p50_ms",
                                                  "p99_ms", "max_ms")}
                         for x in an.dense(rows, int(r["started_at"]) + 1, int(r["ended_at"]))],
               loadavg_at_end=os.getloadavg()[0])
    bad = [m for m in migrations if m.get("status") != RunStatus.OK]
    if bad:
        print(f"  {label}: {len(bad)} migration(s) not ok: {bad[0].get('reason')}",
              file=sys.stderr, flush=True)
    return out


def _report(rep: dict[str, Any]) -> dict[str, Any]:
    return {k: rep.get(k) for k in ("protocol", "duration_s", "suspended_s", "bytes_moved",
                                    "key_groups_moved", "completed_at", "planning_reason",
                                    "phases")}


def strategy_medians(migrations: Sequence[dict[str, Any]], direction: str | None = None
                     ) -> dict[str, dict[str, Any]]:
    """Per strategy, over its ok migrations in ``direction`` (None: both, out and back;
    they move the same groups): the medians of the duration, the maximum latency, the peak
    p99, MB moved and the largest memory rise of one task."""
    out: dict[str, dict[str, Any]] = {}
    for s in dict.fromkeys(m["strategy"] for m in migrations):
        ok = [m for m in migrations if m["strategy"] == s
              and direction in (None, m["direction"])
              and m.get("status") == RunStatus.OK and m.get("duration_s") is not None]

        def med(key: str, sub: str | None = None, ok: list[dict[str, Any]] = ok
                ) -> float | None:
            vals = [(m.get(sub) or {}).get(key) if sub else m.get(key) for m in ok]
            return an.median(v for v in vals if v is not None)

        out[s] = {"migrations": len(ok), "duration_s": med("duration_s"),
                  "max_latency_ms": med("max_latency_ms"), "peak_p99_ms": med("peak_p99_ms"),
                  "mb_moved": an.median(m["report"]["bytes_moved"] / 1e6 for m in ok),
                  "memory_rise_mb": med("max_rise_mb", "memory"),
                  "failed": [m.get("reason") for m in migrations if m["strategy"] == s
                             and m.get("status") != RunStatus.OK]}
    return out


# ---------------------------------------------------------------------- parts

def nexmark_part(args: argparse.Namespace, progress: run.Progress) -> dict[str, Any]:
    """Fig. 5-12: Q7 and Q8, the window operator migrated by each strategy."""
    strategies = [*MAIN, *(["one-step batched"] if args.one_step_batched else [])]
    out: dict[str, Any] = {}
    for q in QUERIES:
        extra = (["--size-ms", str(args.q8_size_ms), "--slide-ms", str(args.q8_slide_ms)]
                 if q == "q8" else [])
        a = scenario_args(q, parallelism=args.parallelism, key_groups=args.nx_key_groups,
                          rate=args.nx_rate, build=args.nx_build, baseline=args.nx_baseline,
                          stable=args.stable, extra=extra)
        _tolerance(a, args)
        sc = MoveScenario(a)
        print(f"NEXMark {q.upper()}: {sc.op} at {a.from_p} tasks, {sc.moved} of "
              f"{a.key_groups} key groups move", flush=True)
        jobs_ = [migration_job(sc, members, fields, args.repeats, args.gap, progress,
                               f"{q} job {i + 1}")
                 for i, (fields, members) in enumerate(job_groups(strategies))]
        for j in jobs_:
            j["rss_series"] = None  # not drawn for NEXMark
        migrations = [m for j in jobs_ for m in j["migrations"]]
        out[q] = {"operator": sc.op, "rate": a.rate, "size_ms": a.size_ms,
                  "slide_ms": a.slide_ms, "key_groups": a.key_groups,
                  "parallelism": a.from_p, "moved": sc.moved, "jobs": jobs_,
                  "medians": strategy_medians(migrations),
                  "medians_back": strategy_medians(migrations, REPORTED),
                  "state_mb": an.median((j.get("metrics_before") or {}).get("state_bytes", 0)
                                        / 1e6 for j in jobs_ if j.get("metrics_before"))}
    return out


def _tolerance(a: argparse.Namespace, args: argparse.Namespace) -> None:
    a.tolerance, a.slack_ms = args.tolerance, args.slack_ms


def _micro_args(args: argparse.Namespace, *, key_groups: int, keys: int, rate: float,
                build: float, baseline: float, coverage: float | None = None
                ) -> argparse.Namespace:
    extra = ["--keys", str(keys), "--state-bytes", str(args.state_bytes), "--skew", "uniform",
             "--service-us", "0"]
    if coverage:
        extra += ["--coverage", str(coverage)]
    a = scenario_args("micro", parallelism=args.parallelism, key_groups=key_groups,
                      rate=rate, build=build, baseline=baseline, stable=args.stable,
                      extra=extra)
    _tolerance(a, args)
    return a


def qkey(q: float) -> str:
    """0.99 -> "p99_ms" (``harness.analysis.latency_stats``'s keys)."""
    return "p" + f"{q * 100:g}".replace(".", "") + "_ms"


#: the quantiles of the ccdf (Fig. 13-15) and of its table
CCDF_QUANTILES = (0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9995, 0.9999)
TABLE_QUANTILES = (0.5, 0.9, 0.99, 0.999, 0.9999)


def steady_run(sc: MoveScenario, config: JobConfig, progress: run.Progress, label: str,
               steady_s: float) -> dict[str, Any]:
    """The job at its rate without a migration (``run.rescale_run`` without a request):
    latency percentiles over the ``steady_s`` seconds after it settled, and records at the
    sink per CPU-second of the job's processes over them."""
    a = sc.args
    sink = jobs.WriteLogLatencySink()
    try:
        r = run.rescale_run(sc.build(sink, config), op=sc.op, request=None,
                            build_s=a.build, baseline_s=steady_s, after_s=0.0,
                            progress=progress, label=label,
                            settled=run.settle_check(sink, a.rate), settle_max_s=a.settle_max)
        sampler = sc.stop_sampling()
        if r["status"] != RunStatus.OK:
            return {"status": str(r["status"]), "reason": r.get("reason")}
        hi = int(r["requested_at"])
        lo = int(hi - steady_s)
        per_s = jobs.latency_seconds(sink)
        stats = an.latency_stats(an.merged(per_s, lo, hi), CCDF_QUANTILES)
        dense = an.dense(an.histogram_rows(per_s), lo, hi)
        per_cpu = (an.records_per_cpu_second(dense, sampler.cpu_samples)
                   if sampler is not None else None)
        return {"status": str(RunStatus.OK), **stats,
                "records_per_s": stats["count"] / max(1, hi - lo),
                "records_per_cpu_s": per_cpu and per_cpu["records_per_cpu_s"],
                "cores": per_cpu and per_cpu["cores"]}
    finally:
        sc.stop_sampling()
        shutil.rmtree(sink.directory, ignore_errors=True)


def bins_part(args: argparse.Namespace, progress: run.Progress) -> dict[str, Any]:
    """Fig. 13-15: steady-state latency at ``--rate`` and records per CPU-second per bin
    count, and without live-rescaling support at the smallest ("native")."""
    bins = [int(x) for x in cli.comma_list(args.bins)]
    configs = [(f"{b} bins", b, True) for b in bins] + [(f"native ({bins[0]} bins)", bins[0],
                                                         False)]
    names = [c[0] for c in configs]
    rows: list[dict[str, Any]] = []
    for k, (name, rnd) in enumerate(rescale.run_order(names, args.repeats, with_none=False), 1):
        _, b, live = configs[names.index(name)]
        a = _micro_args(args, key_groups=b, keys=args.keys, rate=args.rate, build=3.0,
                        baseline=args.steady_s)
        sc = MoveScenario(a)
        cfg = dataclasses.replace(rescale.job_config(a), live_rescaling=live)
        print(f"  bins: {name} (round {rnd + 1})", flush=True)
        lat = steady_run(sc, cfg, progress, f"bins {k}: {name}", args.steady_s)
        rows.append({"config": name, "bins": b, "live_rescaling": live, "round": rnd,
                     **lat, "loadavg_at_end": os.getloadavg()[0]})
    med: dict[str, dict[str, Any]] = {}
    for name, b, live in configs:
        ok = [r for r in rows if r["config"] == name and r["status"] == RunStatus.OK]

        def m(key: str, ok: list[dict[str, Any]] = ok) -> float | None:
            return an.median(r[key] for r in ok if r.get(key) is not None)

        med[name] = {"bins": b, "live_rescaling": live, "runs": len(ok),
                     **{qkey(q): m(qkey(q)) for q in CCDF_QUANTILES},
                     "mean_ms": m("mean_ms"), "max_ms": m("max_ms"),
                     "records_per_s": m("records_per_s"),
                     "records_per_cpu_s": m("records_per_cpu_s"), "cores": m("cores")}
    base = med[configs[0][0]]
    for x in med.values():
        x["p99_over_smallest"] = an.ratio(x["p99_ms"], base["p99_ms"])
        x["p50_over_smallest"] = an.ratio(x["p50_ms"], base["p50_ms"])
        x["per_cpu_over_smallest"] = an.ratio(x["records_per_cpu_s"],
                                              base["records_per_cpu_s"])
    return {"rate": args.rate, "keys": args.keys, "parallelism": args.parallelism,
            "runs": rows, "medians": med}


def sweep_points(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The (bins, keys) points of Fig. 16-18, each once with the figures it serves (a point
    shared by two figures runs once)."""
    pts: dict[tuple[int, int], set[str]] = {}
    for b in (int(x) for x in cli.comma_list(args.sweep_bins)):
        pts.setdefault((b, args.keys), set()).add("fig16")
    for n in (int(x) for x in cli.comma_list(args.sweep_keys)):
        pts.setdefault((args.sweep_fixed_bins, n), set()).add("fig17")
    if args.proportional:
        for b in (int(x) for x in cli.comma_list(args.sweep_bins)):
            pts.setdefault((b, b * args.keys_per_bin), set()).add("fig18")
    return [{"bins": b, "keys": n, "figures": sorted(f)} for (b, n), f in pts.items()]


def sweep_part(args: argparse.Namespace, progress: run.Progress) -> dict[str, Any]:
    """Fig. 16-19: per (bins, keys) point one job, every strategy's migrations: duration,
    maximum latency, per-process RSS."""
    points = sweep_points(args)
    (fields, members), = job_groups(SWEEP_ORDER)
    for i, p in enumerate(points, 1):
        a = _micro_args(args, key_groups=p["bins"], keys=p["keys"], rate=args.sweep_rate,
                        build=args.sweep_build, baseline=args.sweep_baseline,
                        coverage=args.coverage)
        sc = MoveScenario(a)
        label = f"sweep {i}/{len(points)} ({p['bins']} bins, {p['keys']:,} keys)"
        print(f"{label}: {sc.moved} groups move, ~{sc.info['expected_state_mb']:.0f} MB of "
              f"state built in {sc.build_s:.0f} s", flush=True)
        job = migration_job(sc, members, fields, args.repeats, args.gap, progress, label)
        p.update(moved=sc.moved, state_mb=sc.info["expected_state_mb"], build_s=sc.build_s,
                 job=job, medians=strategy_medians(job["migrations"]),
                 medians_back=strategy_medians(job["migrations"], REPORTED))
    biggest = max(points, key=lambda p: (p["state_mb"], p["bins"]))
    for p in points:  # the RSS series is drawn for the largest state only
        if p is not biggest:
            p["job"]["rss_series"] = None
    return {"rate": args.sweep_rate, "state_bytes": args.state_bytes,
            "parallelism": args.parallelism, "points": points,
            "memory_point": {"bins": biggest["bins"], "keys": biggest["keys"]}}


# ---------------------------------------------------------------------- the summary

def _m(d: dict[str, Any], strategy: str, field: str) -> float | None:
    return (d.get(strategy) or {}).get(field)


def _order_verdict(values: dict[str, float | None], order: Sequence[str]) -> str:
    """"yes" when ``values`` strictly increase along ``order``, "partly" when the ends do,
    else "no" (or "n/a" when one is missing)."""
    xs = [values.get(s) for s in order]
    if any(x is None for x in xs):
        return "n/a (a run failed)"
    if all(a < b for a, b in zip(xs, xs[1:], strict=False)):
        return "yes"
    return "partly (ends ordered)" if xs[0] < xs[-1] else "no"


def _fig_points(sweep: dict[str, Any], fig: str) -> list[dict[str, Any]]:
    return [p for p in sweep["points"] if fig in p["figures"]]


def claims(results: dict[str, Any]) -> list[list[str]]:
    """The summary table's rows: the paper's claim, reflow's value, the scale, holds?"""
    rows: list[list[str]] = []
    cfg = results["config"]
    nx = results.get("nexmark")
    if nx:
        q7, q8 = nx.get("q7"), nx.get("q8")
        if q7:
            med = q7["medians"]
            peaks = {s: _m(med, s, "max_latency_ms") for s in MAIN}
            ok = [v for v in peaks.values() if v is not None]
            noise = an.median(j.get("baseline_max_ms") for j in q7["jobs"]
                              if j.get("baseline_max_ms") is not None)
            rows.append(["Fig. 11: Q7 keeps minimal state; no distinction between all-at-once "
                         "and batched",
                         "max latency " + ", ".join(f"{s} {fmt(v, ',.0f')} ms"
                                                    for s, v in peaks.items())
                         + f"; the highest before any migration {fmt(noise, ',.0f')} ms "
                           f"({fmt(q7['state_mb'], '.2f')} MB of window state)",
                         _nx_scale(q7),
                         "n/a" if not ok or noise is None else
                         "yes (every strategy within 2x the pre-migration maximum)"
                         if max(ok) <= 2 * noise else
                         "no (a strategy rose above 2x the pre-migration maximum)"])
        if q8:
            med = q8["medians"]
            aao, bat, flu = (_m(med, s, "max_latency_ms") for s in MAIN)
            rows.append(["Fig. 12: Q8 (large windowed state): all-at-once's latency spike "
                         "well above batched's",
                         f"max latency all-at-once {fmt(aao, ',.0f')} ms, batched "
                         f"{fmt(bat, ',.0f')} ms ({fmt(an.ratio(aao, bat), '.1f')}x), fluid "
                         f"{fmt(flu, ',.0f')} ms; {fmt(q8['state_mb'], '.1f')} MB of state",
                         _nx_scale(q8),
                         "n/a" if aao is None or bat is None else
                         ("yes" if aao > 2 * bat else "ordering yes, < 2x" if aao > bat
                          else "no")
                         + ("" if (q8["state_mb"] or 0) >= 10 else
                            f" (not comparable: {fmt(q8['state_mb'], '.1f')} MB of state "
                            "where the paper's Q8 holds GBs; the key-count rows below test "
                            "large state)")])
    bins = results.get("bins")
    if bins:
        med = bins["medians"]
        live = [m for m in med.values() if m["live_rescaling"]]
        p99 = [m["p99_over_smallest"] for m in live if m["p99_over_smallest"] is not None]
        cpu = [m["per_cpu_over_smallest"] for m in live
               if m["per_cpu_over_smallest"] is not None]
        flat_to = max((m["bins"] for m in live if m["p99_over_smallest"] is not None
                       and m["p99_over_smallest"] <= 1.5
                       and (m["per_cpu_over_smallest"] or 1) >= 0.8), default=None)
        native = next((m for m in med.values() if not m["live_rescaling"]), None)
        smallest = live[0] if live else None
        rows.append(["Fig. 13-15: latency a small constant factor above native for small "
                     "bin counts, largely indistinguishable up to 4096 bins (the count the "
                     "paper then holds fixed), rising beyond",
                     f"p99 / {live[0]['bins'] if live else '-'} bins: "
                     f"{fmt(min(p99) if p99 else None, '.2f')}-"
                     f"{fmt(max(p99) if p99 else None, '.2f')}x, records per CPU-second "
                     f"{fmt(min(cpu) if cpu else None, '.2f')}-"
                     f"{fmt(max(cpu) if cpu else None, '.2f')}x up to "
                     f"{live[-1]['bins'] if live else '-'} bins; native (no live rescaling) "
                     f"p99 {fmt(native and native['p99_ms'], '.1f')} ms vs "
                     f"{fmt(smallest and smallest['p99_ms'], '.1f')} ms",
                     f"{bins['keys']:,} keys, {bins['rate']:,.0f} records/s, "
                     f"{bins['parallelism']} tasks (paper: up to billions of keys, millions "
                     "of records/s, 16 workers)",
                     "n/a" if flat_to is None else
                     f"yes: flat up to {flat_to} bins (p99 within 1.5x, records per "
                     "CPU-second within 0.8x)" if flat_to >= min(PAPER_BINS, live[-1]["bins"])
                     else f"flat up to {flat_to} bins only"])
    sweep = results.get("sweep")
    if sweep:
        scale = (f"{cfg['parallelism']} tasks, {sweep['state_bytes']:,} B per key, "
                 f"{sweep['rate']:,.0f} records/s (paper: 4 x 4 workers, 8 B per key, up to "
                 "billions of keys, GBs of state)")
        base = next((p for p in sweep["points"] if p["bins"] == cfg["sweep_fixed_bins"]
                     and p["keys"] == cfg["keys"]), None) or sweep["points"][0]
        med = base["medians"]
        lat = {s: _m(med, s, "max_latency_ms") for s in MAIN}
        dur = {s: _m(med, s, "duration_s") for s in MAIN}
        rows.append(["§5.3: max latency fluid < batched < all-at-once",
                     ", ".join(f"{s} {fmt(lat[s], ',.0f')} ms" for s in MAIN)
                     + f" ({base['bins']} bins, {base['keys']:,} keys, "
                       f"{base['state_mb']:.0f} MB)",
                     scale, _order_verdict(lat, ("fluid", "batched", "all-at-once"))])
        rows.append(["§5.3: duration all-at-once < batched < fluid",
                     ", ".join(f"{s} {fmt(dur[s], '.2f')} s" for s in MAIN),
                     scale, _order_verdict(dur, ("all-at-once", "batched", "fluid"))])
        pts = sorted(_fig_points(sweep, "fig16"), key=lambda p: p["bins"])
        if len(pts) >= 2:
            lo, hi = pts[0], pts[-1]
            cells, verdicts = [], []
            for s in ("fluid", "batched"):
                a_, b_ = _m(lo["medians"], s, "max_latency_ms"), _m(hi["medians"], s,
                                                                     "max_latency_ms")
                d0, d1 = _m(lo["medians"], s, "duration_s"), _m(hi["medians"], s,
                                                                 "duration_s")
                cells.append(f"{s}: max {fmt(a_, ',.0f')} -> {fmt(b_, ',.0f')} ms, duration "
                             f"{fmt(d0, '.1f')} -> {fmt(d1, '.1f')} s")
                verdicts.append(None if a_ is None or b_ is None else b_ < a_)
            aao = [_m(p["medians"], "all-at-once", "max_latency_ms") for p in pts]
            aao_ok = [x for x in aao if x is not None]
            cells.append("all-at-once max " + ", ".join(fmt(x, ',.0f') for x in aao) + " ms")
            rows.append(["Fig. 16: more bins lower fluid's and batched's max latency "
                         "without lengthening the migration; all-at-once stays clustered",
                         "; ".join(cells) + f" ({lo['bins']} -> {hi['bins']} bins, "
                                            f"{lo['keys']:,} keys)", scale,
                         "n/a" if None in verdicts else
                         "yes (latency)" if all(verdicts) else
                         "partly" if any(verdicts) else "no"])
            if aao_ok:
                rows[-1][1] += (f"; all-at-once spread {max(aao_ok) / max(min(aao_ok), 1e-9):.1f}x")
        pts = sorted(_fig_points(sweep, "fig17"), key=lambda p: p["keys"])
        if len(pts) >= 2:
            grow_l = {s: (_m(pts[0]["medians"], s, "max_latency_ms"),
                          _m(pts[-1]["medians"], s, "max_latency_ms")) for s in MAIN}
            grow_d = {s: (_m(pts[0]["medians"], s, "duration_s"),
                          _m(pts[-1]["medians"], s, "duration_s")) for s in MAIN}
            top = all(_highest(p["medians"], "max_latency_ms") == "all-at-once" for p in pts)
            rows.append(["Fig. 17: as the key domain grows, durations and max latencies grow; "
                         "all-at-once has the highest latency at every size",
                         "; ".join(f"{s}: max {fmt(grow_l[s][0], ',.0f')} -> "
                                   f"{fmt(grow_l[s][1], ',.0f')} ms, duration "
                                   f"{fmt(grow_d[s][0], '.1f')} -> {fmt(grow_d[s][1], '.1f')} s"
                                   for s in MAIN)
                         + f" ({pts[0]['keys']:,} -> {pts[-1]['keys']:,} keys, "
                           f"{pts[0]['bins']} bins)", scale,
                         _grow_verdict(grow_l, grow_d, top)])
        pts = sorted(_fig_points(sweep, "fig18"), key=lambda p: p["bins"])
        if len(pts) >= 2:
            cells = []
            flat = []
            for s in ("fluid", "batched"):
                xs = [_m(p["medians"], s, "max_latency_ms") for p in pts]
                cells.append(f"{s} max " + ", ".join(fmt(x, ',.0f') for x in xs) + " ms")
                ok = [x for x in xs if x is not None]
                flat.append(bool(ok) and max(ok) <= 2 * min(ok))
            xs = [_m(p["medians"], "all-at-once", "max_latency_ms") for p in pts]
            cells.append("all-at-once max " + ", ".join(fmt(x, ',.0f') for x in xs) + " ms")
            rows.append(["Fig. 18: at fixed keys per bin fluid's and batched's max latency "
                         "stays flat while all-at-once's grows",
                         "; ".join(cells) + f" ({pts[0]['bins']}-{pts[-1]['bins']} bins, "
                                            f"{cfg['keys_per_bin']} keys per bin)", scale,
                         "yes" if all(flat) else "no"])
        mp = _memory_point(sweep)
        big = {s: _m(mp["medians"], s, "max_latency_ms") for s in MAIN}
        r_f, r_b = an.ratio(big["all-at-once"], big["fluid"]), an.ratio(big["all-at-once"],
                                                                         big["batched"])
        rows.append(["Fig. 1: with large state (1 billion keys, 8 GB) all-at-once's max "
                     "latency is orders of magnitude above fluid's and batched's",
                     ", ".join(f"{s} {fmt(big[s], ',.0f')} ms" for s in MAIN)
                     + f": all-at-once / fluid {fmt(r_f, '.1f')}x, / batched "
                       f"{fmt(r_b, '.1f')}x ({mp['keys']:,} keys, {mp['state_mb']:.0f} MB, "
                       f"{mp['bins']} bins)",
                     f"{scale}; {8000 / max(mp['state_mb'], 1e-9):.0f}x less state than "
                     "the paper's 8 GB",
                     "n/a" if r_f is None or r_b is None else
                     "yes" if min(r_f, r_b) >= 10 else
                     f"ordering yes, {min(r_f, r_b):.1f}x (not orders of magnitude)"
                     if min(r_f, r_b) > 1 else "no"])
        rise = {s: _m(mp["medians"], s, "memory_rise_mb") for s in MAIN}
        rows.append(["Fig. 19: all-at-once allocates significant extra memory during the "
                     "migration; fluid and batched stay near their steady level",
                     "largest rise of one task's RSS over its level: "
                     + ", ".join(f"{s} {fmt(rise[s], '.1f')} MB" for s in MAIN)
                     + f" ({mp['state_mb']:.0f} MB of state, {mp['bins']} bins)", scale,
                     _memory_verdict(rise)])
    return rows


def _nx_scale(q: dict[str, Any]) -> str:
    return (f"{q['rate']:,.0f} events/s, sliding {q['size_ms']}/{q['slide_ms']} ms, "
            f"{q['parallelism']} tasks, {q['key_groups']} bins, {q['moved']} move (paper: "
            "millions of events/s, 16 workers, 4096 bins, hours-long windows time-dilated)")


def _highest(med: dict[str, Any], field: str) -> str | None:
    vals = {s: _m(med, s, field) for s in MAIN if _m(med, s, field) is not None}
    return max(vals, key=lambda s: vals[s]) if vals else None


def _grow_verdict(lat: dict[str, tuple[Any, Any]], dur: dict[str, tuple[Any, Any]],
                  top: bool) -> str:
    pairs = [*lat.values(), *dur.values()]
    if any(a is None or b is None for a, b in pairs):
        return "n/a (a run failed)"
    grows = sum(b > a for a, b in pairs)
    head = ("yes" if grows == len(pairs) else f"{grows} of {len(pairs)} grow")
    return head + ("; all-at-once highest at every size" if top else
                   "; all-at-once not the highest at every size")


def _memory_verdict(rise: dict[str, float | None]) -> str:
    a, b, f = (rise.get(s) for s in MAIN)
    if a is None or b is None or f is None:
        return "n/a"
    if a > 2 * max(b, f, 1.0):
        return "yes"
    return "ordering yes, small" if a > max(b, f) else "no"


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    c = results["config"]
    lines = [f"# Megaphone: all-at-once vs fluid vs batched on reflow "
             f"({render.load_title(results)})", "",
             render.run_line(results) + f" · {c['repeats']} round(s) per job, "
             "medians", "",
             "Strategies: *all-at-once* = reflow's `pause-resume` (every moving key group in "
             "one step; the new owners read nothing after the step's barrier until the state "
             "is in, as a timely operator waits for its frontier, which includes the state "
             "channel, to pass the update's time); *fluid* = `fluid` (one key group per "
             "step); *batched* = `batched` with `batched_matching` (each step a matching: "
             "every task sends and receives at most one group, as Megaphone's harness builds "
             "its batches). Bins are key groups. The migration is the paper's: half of the "
             "groups of half of the tasks move to the other half (25 % of the state) at a "
             "fixed parallelism, then back (the paper reports the second; both move the same "
             "groups, so the medians are over both, the second's alone in the NEXMark "
             "tables). Max latency: the highest record latency from "
             "the request until the per-second mean latency is back at the job's level; "
             "duration: the migration's (`RescaleReport.duration_s`). The paper's figures "
             "are plots (the seed text lost most of its numbers); the claims are its text's.",
             "",
             *md_table(["paper", "reflow (this machine)", "scale", "holds?"], claims(results),
                       left=["reflow (this machine)", "scale", "holds?"]), ""]
    busy = max(m["loadavg_at_start"][0], m.get("loadavg_at_end", [0])[0])
    if busy > 2 * (m["cpus"] or 1):
        lines += [f"The machine was shared and overloaded during the run (load average up to "
                  f"{busy:.0f} on {m['cpus']} CPUs): latencies of hundreds of ms and their "
                  "spread come from processes waiting for a core as much as from the "
                  "migrations; an ordering that holds here holds despite that noise, one "
                  "that does not may not fail on a quiet machine.", ""]
    sweep = results.get("sweep")
    steps = [(p["bins"], p["moved"], _m(p["medians"], "fluid", "duration_s"))
             for p in sorted(_fig_points(sweep, "fig16"), key=lambda p: p["bins"])] \
        if sweep else []
    steps = [(b, n, d) for b, n, d in steps if d and n]
    if steps:
        lines += ["Why more bins do not help fluid here: every step of reflow's fluid is an "
                  "aligned barrier round between the tasks, so its duration grows with the "
                  "groups moved (" + ", ".join(f"{b} bins: {n} steps in {d:.1f} s, "
                                              f"{1e3 * d / n:.0f} ms a step"
                                              for b, n, d in steps)
                  + "), and a longer migration on a loaded machine meets more of its stalls; "
                  "Megaphone's steps are timestamps of one dataflow, nearly free, so there "
                  "the duration stays and only the step's size shrinks.", ""]
    nx = results.get("nexmark")
    if nx:
        lines += ["## Fig. 5-12: NEXMark timelines", ""]
        for q, d in nx.items():
            lvl = ", ".join(fmt(j.get("level_ms"), ".1f") for j in d["jobs"])
            lines += [f"{q.upper()}: `{d['operator']}` at {d['parallelism']} tasks, "
                      f"{d['rate']:,.0f} events/s, sliding {d['size_ms']}/{d['slide_ms']} ms, "
                      f"{d['moved']} of {d['key_groups']} key groups move, "
                      f"{fmt(d['state_mb'], '.2f')} MB of operator state; latency level "
                      f"before the first migration {lvl} ms.", "",
                      *_strategy_table(d["medians"], d["medians_back"]), ""]
    bins = results.get("bins")
    if bins:
        lines += [f"## Fig. 13-15: overhead vs bins (key-count job, {bins['keys']:,} keys, "
                  f"{bins['rate']:,.0f} records/s, {bins['parallelism']} tasks)", "",
                  *md_table(["config", "runs", *(f"p{q * 100:g} ms" for q in TABLE_QUANTILES),
                             "max ms", "p99 / smallest", "records per CPU-s",
                             "per CPU-s / smallest", "cores"],
                            [[name, str(mm["runs"]),
                              *(fmt(mm[qkey(q)], '.1f') for q in TABLE_QUANTILES),
                              fmt(mm["max_ms"], ".0f"), fmt(mm["p99_over_smallest"], ".2f"),
                              fmt(mm["records_per_cpu_s"], ",.0f"),
                              fmt(mm["per_cpu_over_smallest"], ".2f"), fmt(mm["cores"], ".2f")]
                             for name, mm in bins["medians"].items()]), ""]
    sweep = results.get("sweep")
    if sweep:
        lines += ["## Fig. 16-19: max latency vs duration as bins and keys vary "
                  f"({sweep['state_bytes']:,} B per key, {sweep['rate']:,.0f} records/s)", "",
                  *md_table(["bins", "keys", "state MB", "moved", "figures", "strategy",
                             "max latency ms", "peak p99 ms", "duration s", "MB moved",
                             "task RSS rise MB", "level ms"],
                            [[str(p["bins"]), f"{p['keys']:,}", f"{p['state_mb']:.0f}",
                              str(p["moved"]), ", ".join(p["figures"]), s,
                              fmt(mm["max_latency_ms"], ",.0f"), fmt(mm["peak_p99_ms"], ",.0f"),
                              fmt(mm["duration_s"], ".2f"), fmt(mm["mb_moved"], ".1f"),
                              fmt(mm["memory_rise_mb"], ".1f"),
                              fmt(p["job"].get("level_ms"), ".1f")]
                             for p in sweep["points"] for s, mm in p["medians"].items()]), ""]
    failed = [(where, f"{mg.get('strategy')} {mg.get('direction')}", mg.get("reason"))
              for where, job in _all_jobs(results) for mg in job["migrations"]
              if mg.get("status") != RunStatus.OK]
    failed += [(where, "job", job.get("reason")) for where, job in _all_jobs(results)
               if job.get("status") != RunStatus.OK]
    failed += [("bins", r["config"], r.get("reason")) for r in (bins or {}).get("runs", [])
               if r.get("status") != RunStatus.OK]
    if failed:
        lines += ["Failed or skipped: " + "; ".join(f"{w} {s}: {why}" for w, s, why in failed),
                  ""]
    lines += ["Differences from the paper: reflow is Python on Ray with one process per task "
              "on 2 shared CPUs (the paper: Rust timely dataflow, 4 machines x 4 workers, "
              "millions of records/s); the state is orders of magnitude smaller (MBs, not "
              "GBs); the key-count job keeps padding per key (`--state-bytes`) so that a few "
              "thousand keys make MBs of state where the paper has up to billions of 8-byte "
              "counts; NEXMark windows are seconds long where the paper time-dilates "
              "hours-long ones; reflow's fluid and batched new owners set aside only the "
              "records of the groups in flight, where a timely operator waits for its whole "
              "frontier; one job runs every strategy's migrations in turn (a deployment costs "
              "10-60 s here), the paper one job per run.", ""]
    return "\n".join(lines)


def _all_jobs(results: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = [(f"nexmark {q}", j) for q, d in (results.get("nexmark") or {}).items()
           for j in d["jobs"]]
    out += [(f"sweep {p['bins']} bins/{p['keys']} keys", p["job"])
            for p in (results.get("sweep") or {}).get("points", [])]
    return out


def _strategy_table(med: dict[str, dict[str, Any]], back: dict[str, dict[str, Any]]
                    ) -> list[str]:
    return md_table(["strategy", "migrations", "max latency ms", "peak p99 ms", "duration s",
                     "MB moved", "back only: max ms", "back only: duration s"],
                    [[s, str(mm["migrations"]), fmt(mm["max_latency_ms"], ",.0f"),
                      fmt(mm["peak_p99_ms"], ",.0f"), fmt(mm["duration_s"], ".2f"),
                      fmt(mm["mb_moved"], ".2f"),
                      fmt((back.get(s) or {}).get("max_latency_ms"), ",.0f"),
                      fmt((back.get(s) or {}).get("duration_s"), ".2f")]
                     for s, mm in med.items()])


# ---------------------------------------------------------------------- the figure

def _pair(job: dict[str, Any], strategy: str) -> list[dict[str, Any]]:
    """The first round's two migrations of ``strategy`` in ``job`` (out, back)."""
    return [m for m in job["migrations"] if m["strategy"] == strategy and m["round"] == 0]


def _segment(job: dict[str, Any], pair: list[dict[str, Any]], gap: float
             ) -> tuple[float, list[dict[str, Any]]]:
    """(t0: the first migration's request, the job's timeline rows from 3 s before it to
    ``gap`` s after the last request)."""
    t0 = pair[0]["requested_at"]
    t1 = pair[-1]["requested_at"] + gap
    return t0, [x for x in job["timeline"] if t0 - 3 <= x["second"] + 0.5 <= t1]


def _shade(ax: Any, pair: list[dict[str, Any]], t0: float, color: str) -> None:
    for m in pair:
        rep = m.get("report") or {}
        if rep.get("completed_at"):
            ax.axvspan(m["requested_at"] - t0, rep["completed_at"] - t0, color=color,
                       alpha=0.15)
        ax.axvline(m["requested_at"] - t0, color="k", lw=0.8)


def plot(results: dict[str, Any], path: str) -> None:
    plt = render.pyplot()
    nx = results.get("nexmark") or {}
    gap = float(results["config"].get("gap") or 5.0)
    strategies = list(dict.fromkeys(m["strategy"] for d in nx.values() for j in d["jobs"]
                                    for m in j["migrations"]))
    ncols = max(3, len(strategies))
    sweep = results.get("sweep")
    rows = len(nx) + 2 + (1 if sweep else 0)
    fig = plt.figure(figsize=(4.6 * ncols, 4.0 * rows))
    grid = fig.add_gridspec(rows, ncols)
    _plot_nexmark(fig, grid, nx, strategies, gap)
    if results.get("bins"):
        _plot_bins(fig, grid, len(nx), results["bins"])
    if sweep:
        _plot_sweep(fig, grid, len(nx), sweep, gap)
        _plot_keycount(fig, grid, len(nx) + 2, sweep, gap)
    fig.suptitle(f"Megaphone on reflow ({render.load_title(results)})")
    fig.tight_layout(rect=(0, 0, 1, 0.985))  # room for the title (save_figure leaves none)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _timeline_panel(ax: Any, job: dict[str, Any] | None, s: str, gap: float, title: str
                    ) -> None:
    """One strategy's pair of migrations in ``job``: per-second max, p99 and p50 latency
    (log), the migrations shaded (the paper's timelines)."""
    ax.set_title(title, fontsize=10)
    if job is None or not _pair(job, s):
        ax.text(0.5, 0.5, "no run", ha="center", transform=ax.transAxes)
        return
    pair = _pair(job, s)
    t0, tl = _segment(job, pair, gap)
    t = [x["second"] + 0.5 - t0 for x in tl]
    for field, style in (("max_ms", "-"), ("p99_ms", "--"), ("p50_ms", ":")):
        ax.plot(t, [x[field] if x[field] is not None else float("nan") for x in tl],
                ls=style, color=COLORS.get(s, "k"), label=field[:-3])
    _shade(ax, pair, t0, COLORS.get(s, "k"))
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the first migration (out, then back)")
    ax.set_ylabel("latency ms (per second)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")


def _same_ylim(axes: list[Any]) -> None:
    lims = [a.get_ylim() for a in axes if a.has_data()]
    for a in axes:
        if lims:
            a.set_ylim(min(x for x, _ in lims), max(y for _, y in lims))


def _plot_nexmark(fig: Any, grid: Any, nx: dict[str, Any], strategies: list[str],
                  gap: float) -> None:
    for i, (q, d) in enumerate(nx.items()):
        axes = []
        for j, s in enumerate(strategies):
            ax = fig.add_subplot(grid[i, j])
            job = next((jb for jb in d["jobs"] if _pair(jb, s)), None)
            _timeline_panel(ax, job, s, gap, f"{q.upper()}: {s}")
            axes.append(ax)
        _same_ylim(axes)


def _plot_keycount(fig: Any, grid: Any, row: int, sweep: dict[str, Any], gap: float) -> None:
    """Fig. 1: the key-count job with the largest state, one panel per strategy."""
    mp = _memory_point(sweep)
    axes = []
    for j, s in enumerate(MAIN):
        ax = fig.add_subplot(grid[row, j])
        _timeline_panel(ax, mp["job"], s, gap, f"Fig. 1 (key count, {mp['keys']:,} keys, "
                                               f"{mp['state_mb']:.0f} MB): {s}")
        axes.append(ax)
    _same_ylim(axes)


def _memory_point(sweep: dict[str, Any]) -> dict[str, Any]:
    return next(p for p in sweep["points"] if p["bins"] == sweep["memory_point"]["bins"]
                and p["keys"] == sweep["memory_point"]["keys"])


def _plot_bins(fig: Any, grid: Any, row: int, bins: dict[str, Any]) -> None:
    ax = fig.add_subplot(grid[row, 0])
    for name, mm in bins["medians"].items():
        pts = [(mm[qkey(q)], 1 - q) for q in CCDF_QUANTILES if mm[qkey(q)]]
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker=".",
                ls="--" if not mm["live_rescaling"] else "-",
                color=COLORS["native"] if not mm["live_rescaling"] else None, label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("latency ms")
    ax.set_ylabel("ccdf (share of records above)")
    ax.set_title(f"Fig. 13-15: latency ccdf per bin count ({bins['rate']:,.0f} rec/s)",
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax = fig.add_subplot(grid[row, 1])
    live = [mm for mm in bins["medians"].values() if mm["live_rescaling"]]
    bx = [mm["bins"] for mm in live]
    for field, label in (("p99_over_smallest", "p99 latency"),
                         ("p50_over_smallest", "p50 latency"),
                         ("per_cpu_over_smallest", "records per CPU-second")):
        ax.plot(bx, [mm[field] if mm[field] is not None else float("nan") for mm in live],
                marker="o", label=label)
    ax.axhline(1.0, color="0.5", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bins (key groups)")
    ax.set_ylabel(f"relative to {bx[0] if bx else '-'} bins")
    ax.set_title("overhead vs bins", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _plot_sweep(fig: Any, grid: Any, row: int, sweep: dict[str, Any], gap: float) -> None:
    markers = "os^Dvp*"
    for col, r_, fig_id, title, key in ((2, 0, "fig16", "Fig. 16: bins vary", "bins"),
                                        (0, 1, "fig17", "Fig. 17: keys vary", "keys"),
                                        (1, 1, "fig18", "Fig. 18: keys per bin fixed",
                                         "bins")):
        pts = sorted(_fig_points(sweep, fig_id), key=lambda p, k=key: p[k])
        if not pts:
            continue
        ax = fig.add_subplot(grid[row + r_, col])
        for s in MAIN:
            xs = [_m(p["medians"], s, "duration_s") for p in pts]
            ys = [_m(p["medians"], s, "max_latency_ms") for p in pts]
            ax.plot([x if x is not None else float("nan") for x in xs],
                    [y if y is not None else float("nan") for y in ys],
                    color=COLORS[s], lw=1, label=s)
            for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
                if x is not None and y is not None:
                    ax.scatter([x], [y], color=COLORS[s], marker=markers[i % len(markers)],
                               s=36, zorder=3)
        for i, p in enumerate(pts):
            ax.scatter([], [], color="0.3", marker=markers[i % len(markers)],
                       label=f"{p['bins']} bins, {p['keys']:,} keys")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("migration duration s")
        ax.set_ylabel("max latency ms")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    mp = next(p for p in sweep["points"] if p["bins"] == sweep["memory_point"]["bins"]
              and p["keys"] == sweep["memory_point"]["keys"])
    ax = fig.add_subplot(grid[row + 1, 2])
    ser = mp["job"].get("rss_series")
    if ser:
        for s in MAIN:
            pair = _pair(mp["job"], s)
            if not pair:
                continue
            name = next((mg["memory"].get("max_rise_process") for mg in pair
                         if (mg.get("memory") or {}).get("max_rise_process")), None)
            if name is None:
                continue
            t0 = pair[0]["requested_at"] - ser["epoch"]
            t1 = pair[-1]["requested_at"] - ser["epoch"] + gap
            seg = [(x - t0, y) for x, y in zip(ser["t"], ser["per_process_mb"][name],
                                               strict=True) if t0 - 3 <= x <= t1]
            ax.plot([x for x, _ in seg], [y for _, y in seg], color=COLORS[s],
                    label=f"{s} ({name})")
        ax.axvline(0, color="k", lw=1)
    ax.set_xlabel("seconds since the strategy's first migration")
    ax.set_ylabel("RSS MB (the task whose RSS rose most)")
    ax.set_title(f"Fig. 19: memory per process ({mp['bins']} bins, {mp['keys']:,} keys, "
                 f"{mp['state_mb']:.0f} MB)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


# ---------------------------------------------------------------------- main

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = cli.parser(__doc__, "megaphone")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"of {','.join(PARTS)}")
    ap.add_argument("--repeats", type=int,
                    help="rounds per job: every strategy's pair of migrations once each (1)")
    ap.add_argument("--parallelism", type=int, help="tasks of the migrated operator (4; quick 2)")
    ap.add_argument("--gap", type=float, help="seconds after each migration (4)")
    ap.add_argument("--stable", type=int, help="stability window of a migration's period (2)")
    ap.add_argument("--tolerance", type=float, default=1.10,
                    help="stable: per-second mean <= this x the job's level (+ slack)")
    ap.add_argument("--slack-ms", type=float, default=5.0, help="added to the stability limit")
    ap.add_argument("--from-results", metavar="RESULTS_JSON",
                    help="run nothing: write summary.md and the PNG again from a results.json "
                         "(into --out, default its folder)")
    ap.add_argument("--one-step-batched", action="store_true",
                    help="NEXMark: also batched with a single step (a job of its own)")
    g = ap.add_argument_group("nexmark (Fig. 5-12)")
    g.add_argument("--nx-rate", type=float, help="events/s (8,000; quick 4,000)")
    g.add_argument("--nx-key-groups", type=int, default=128, help="bins (128)")
    g.add_argument("--nx-build", type=float, help="seconds before the baseline")
    g.add_argument("--nx-baseline", type=float, help="baseline seconds")
    g.add_argument("--q8-size-ms", type=int, help="Q8's window (6,000 ms; quick 4,000)")
    g.add_argument("--q8-slide-ms", type=int, help="Q8's slide (500 ms)")
    g = ap.add_argument_group("bins (Fig. 13-15)")
    g.add_argument("--bins", help="bin counts (16,256,4096; quick 16,4096)")
    g.add_argument("--rate", type=float, help="records/s (3,000; quick 2,000)")
    g.add_argument("--steady-s", type=float, help="seconds of steady latency per run (8; quick 5)")
    g = ap.add_argument_group("sweep (Fig. 16-19)")
    g.add_argument("--keys", type=int, help="key domain of Fig. 13-16 (4,000; quick 2,000)")
    g.add_argument("--state-bytes", type=int, help="padding per key (25,000; quick 20,000)")
    g.add_argument("--sweep-bins", help="bins of Fig. 16 (16,64,256; quick 16,64)")
    g.add_argument("--sweep-keys", help="key domains of Fig. 17 (4000,8000; quick 1000,2000)")
    g.add_argument("--sweep-fixed-bins", type=int, help="bins of Fig. 17 (64)")
    g.add_argument("--proportional", action="store_true", default=None,
                   help="also Fig. 18: keys and bins grow together (--keys-per-bin)")
    g.add_argument("--keys-per-bin", type=int, help="keys per bin of Fig. 18 (62)")
    g.add_argument("--sweep-rate", type=float, help="records/s (3,000; quick 2,000)")
    g.add_argument("--sweep-build", type=float, help="build seconds, at least")
    g.add_argument("--sweep-baseline", type=float, help="baseline seconds")
    g.add_argument("--coverage", type=float, help="build until this share of the keys was seen")
    args = ap.parse_args(argv)
    cli.fill_defaults(args, DEFAULTS)
    args.parts = cli.comma_list(args.parts)
    bad = set(args.parts) - set(PARTS)
    if bad:
        ap.error(f"unknown parts {sorted(bad)}; choose from {','.join(PARTS)}")
    if args.parallelism < 2 or args.parallelism % 2:
        ap.error("--parallelism must be even and >= 2 (half of the tasks send to the other half)")
    args.out = args.out or os.path.join(RESULTS_ROOT,
                                        "megaphone-quick" if args.quick else "megaphone")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_results:
        import json

        with open(args.from_results) as f:
            results = json.load(f)
        out = args.out if "--out" in (argv or sys.argv) else os.path.dirname(
            os.path.abspath(args.from_results))
        render.write_outputs(out, results, markdown=markdown(results), png="megaphone.png",
                             plot=plot)
        return 0
    results = provenance.begin(__file__, argv, args)
    results["strategies"] = {s: {"protocol": p, "job_config": f} for s, (p, f) in
                             STRATEGIES.items()}
    run.init_ray()
    results["machine"]["ray"] = run.ray_version()
    progress = run.Progress(0.0)
    try:
        if "nexmark" in args.parts:
            print("Fig. 5-12: NEXMark timelines ...", flush=True)
            results["nexmark"] = nexmark_part(args, progress)
        if "bins" in args.parts:
            print("Fig. 13-15: overhead vs bins ...", flush=True)
            results["bins"] = bins_part(args, progress)
        if "sweep" in args.parts:
            print("Fig. 16-19: bins, keys, memory ...", flush=True)
            results["sweep"] = sweep_part(args, progress)
    finally:
        progress.close()
        run.shutdown_ray()
    provenance.finish(results)
    render.write_outputs(args.out, results, markdown=markdown(results), png="megaphone.png",
                         plot=plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
