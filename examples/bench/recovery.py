"""Checkpoints and recovery: the cost of checkpoints in steady state, how long a checkpoint
takes by state size, and how long a job takes from a killed task to output flowing again.

    python examples/bench/recovery.py           # 3 x 1.5M records, 20 and 200 MB of state
    python examples/bench/recovery.py --quick   # smoke run: 200k records, 2 and 20 MB
    python examples/bench/recovery.py --state-backend both --state-gb 0.2 --parts recovery
    python examples/bench/recovery.py --parts overhead --overhead-s 120 --repeats 2 \
        --state-gb 0.3 --state-backend both --incremental   # long overhead runs, ~20 min
    python examples/bench/recovery.py --state-backend rocksdb --state-gb 5 --parts recovery \
        --state-memory-mb 64          # the 5 GB scenario (not run here: see the README)

State backend (``--state-backend``): every job runs on ``JobConfig(state_backend=...)``;
``both`` runs each part once per backend, alternated (memory, rocksdb, memory, ...), and
reports them side by side (``results.json``'s ``by_backend``, the printed tables, the PNG).
``--state-gb`` gives the sizes of parts 2 and 3 in GB instead of ``--state-mb``;
``--state-dir`` and ``--state-memory-mb`` set where and with how much memory each RocksDB
task keeps its state; ``--parts`` runs only some parts.

Job: the benchmarks' keyed count (``harness.jobs.keyed_count_job``): GeneratorSource (one
task, uniform keys) -> key_by -> PaddedCount (``--parallelism`` tasks; per key a count and
``state_bytes`` of padding) -> a null sink chained into the count tasks.

1. Overhead: the job at full speed over ``--records`` records (no padding), checkpoints off,
   every 10 s and every 1 s, run in turn ``--repeats`` times. Throughput = records / (run()
   returned -> the first status poll that sees the job finished); the median run per
   setting is reported, and overhead = 1 - throughput(setting) / throughput(off). The
   target is <= 5 % at 10 s. Those runs last seconds; ``--overhead-s S`` (>= 120 for issue
   32's bar) measures on long runs instead (``long_overhead``): a job holding the largest
   state size whose updates touch only ``--hot-pct`` % of the keys
   (``harness.hot_keys.HotKeysSource``), ``--repeats`` pairs of runs alternated without
   and with checkpoints every ``--overhead-interval`` s, each measured for S s after the
   state was built; per run throughput, records per job CPU-second, checkpoints completed
   (bytes, durations) and the load; overhead in both measures and per pair.
   ``--incremental``: ``JobConfig(incremental_checkpoints=True)`` (also for part 3's
   jobs: a recovery then restores an incremental checkpoint). A checkpointing run
   with fewer than ``--min-checkpoints`` (10) makes the measurement invalid (exit 1).
2. Duration by state size: for each ``--state-mb``, keys x padding of that size; once the
   count tasks took every key (the source goes on at full speed, over the same keys: the
   state stops growing, and the savepoint is taken from a busy job), a savepoint is taken (``handle.savepoint``); reported: trigger-to-complete duration, bytes, the
   slowest task's synchronous snapshot and its asynchronous write.
3. Recovery: the largest state again, an open-loop source at ``--rate`` records/s and
   checkpoints every ``--interval`` s; once a checkpoint holding the whole state completed,
   one count task actor is killed. Reported: kill -> the job restarting (failure noticed),
   -> running again (tasks restored), -> the first records processed by the new count tasks
   (output flowing again). Compare with the 15-19 s a Flink stop-with-savepoint + restart
   took on this machine kind. Also the RSS of the count tasks' processes before the kill.
   Once per ``--restart-modes`` (how the restart gets its task processes: all new, the
   live ones reused, plus a warm standby for the dead one, plus local recovery).
4. JobMaster failover (``--parts master``): the same job started detached
   (``job.run(detached=True)``); once a checkpoint holding the whole state completed, the
   JobMaster's process is killed (``ray.kill(..., no_restart=False)``: Ray restarts it, as
   after a crash). Reported: kill -> the new JobMaster answers having taken the job over
   (``status().master_epoch`` 2), -> the first checkpoint it completes (exactly-once output
   committed again), whether it reconciled (no task restarted) and the records the count
   tasks processed while no JobMaster ran (output never stops when it reconciles). Target
   (issue 30): <= 3 s with 200 MB and the tasks alive.

Writes ``examples/bench/out/recovery/results.json`` and ``recovery.png``; quotes the load
average, since the machine is shared (ratios within one run only).
"""

# ruff: noqa: E402  (the repository root goes on sys.path before reflow's imports)
from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from engine import JobConfig
from examples.bench.harness import BenchRunError, cli, jobs, procs, provenance, render, run
from examples.bench.harness import analysis as an
from examples.bench.harness.hot_keys import HotKeysSource

DEFAULTS = {"records": (1_500_000, 200_000), "repeats": (3, 1), "keys": (20_000, 5_000),
            "rate": (20_000.0, 5_000.0), "interval": (10.0, 2.0)}
STATE_MB = ([20, 200], [2, 20])
POLL_S = 0.05
#: long overhead runs: pairs disagreeing by more than this are the load's, not the checkpoints'
NOISE = 0.10
PARTS = ("overhead", "size", "recovery", "master")


def parse_args(argv: list[str] | None) -> Any:
    ap = cli.parser(__doc__, "recovery")
    ap.add_argument("--records", type=int, help="records of each overhead run")
    ap.add_argument("--repeats", type=int, help="runs per checkpoint setting")
    ap.add_argument("--keys", type=int, help="keys holding the state (sizes 2 and 3)")
    ap.add_argument("--state-mb", type=int, nargs="+", help="state sizes of part 2, MB")
    ap.add_argument("--rate", type=float, help="records/s of the recovery run")
    ap.add_argument("--interval", type=float, help="checkpoint interval of the recovery run")
    ap.add_argument("--parallelism", type=int, default=2, help="count tasks (2)")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated parts to run ({','.join(PARTS)}: all)")
    ap.add_argument("--overhead-s", type=float,
                    help="part 1 on long runs: each run measures this many seconds (>= 120 "
                         "for issue 32's bar) of a job holding the largest --state-mb/-gb "
                         "whose updates touch --hot-pct %% of the keys; runs alternate "
                         "without and with checkpoints every --overhead-interval s, "
                         "--repeats pairs (default: the short runs over --records)")
    ap.add_argument("--overhead-interval", type=float, default=10.0,
                    help="checkpoint interval of the long overhead runs, s (10)")
    ap.add_argument("--hot-pct", type=float, default=1.0,
                    help="long overhead runs: %% of the keys updated (1)")
    ap.add_argument("--min-checkpoints", type=int, default=10,
                    help="long overhead runs: checkpoints each checkpointing run must "
                         "complete in its measured window, or the measurement fails (10)")
    ap.add_argument("--warmup", type=float, default=5.0,
                    help="long overhead runs: seconds after the state was built before the "
                         "measured window (5)")
    ap.add_argument("--incremental", action="store_true",
                    help="the overhead and recovery parts' jobs use "
                         "JobConfig(incremental_checkpoints=True) (on RocksDB: SST files)")
    ap.add_argument("--restart-modes", default="reuse",
                    help="part 3: comma-separated ways a restart gets its task processes, "
                         "each one run: 'new' (every task a new actor: JobConfig("
                         "recovery_reuses_processes=False), reflow before 2026-11-28), "
                         "'reuse' (the live tasks' processes: the default), 'standby' "
                         "(reuse, and a warm standby actor for the dead task: "
                         "warm_standby_tasks=1), 'local' (standby and local_recovery=True)")
    cli.add_state_backend(ap)
    args = ap.parse_args(argv)
    cli.fill_defaults(args, DEFAULTS)
    if args.overhead_s is not None:
        if args.overhead_s <= 0 or args.overhead_interval <= 0 or args.warmup < 0:
            ap.error("--overhead-s and --overhead-interval must be > 0, --warmup >= 0")
        if not 0 < args.hot_pct <= 100:
            ap.error("--hot-pct must be in (0, 100]")
        if args.overhead_s / args.overhead_interval < args.min_checkpoints:
            ap.error(f"--overhead-s {args.overhead_s:g} at --overhead-interval "
                     f"{args.overhead_interval:g} s leaves room for fewer than "
                     f"--min-checkpoints {args.min_checkpoints} checkpoints")
    args.restart_modes = cli.comma_list(args.restart_modes)
    if not args.restart_modes or set(args.restart_modes) - set(RESTART_MODES):
        ap.error(f"--restart-modes takes a comma-separated subset of "
                 f"{','.join(RESTART_MODES)}")
    args.parts = cli.comma_list(args.parts)
    if not args.parts or set(args.parts) - set(PARTS):
        ap.error(f"--parts takes a comma-separated subset of {','.join(PARTS)}")
    if args.state_gb:
        args.state_mb = [max(1, round(gb * 1000)) for gb in args.state_gb]
    if args.state_mb is None:
        args.state_mb = STATE_MB[1 if args.quick else 0]
    args.out = cli.out_dir(args, "recovery")
    return args


def config(root: str, interval: float | None, state: dict[str, Any] | None = None
           ) -> JobConfig:
    """The job's configuration; ``state``: its state backend's fields
    (``cli.state_fields``)."""
    return JobConfig(metrics_port=None, checkpoint_interval_s=interval, checkpoint_dir=root,
                     checkpoint_timeout_s=600.0, restart_delay_s=0.0, **(state or {}))


def _until(cond: Any, what: str, timeout: float = 900.0) -> float:
    """Poll ``cond`` every ``POLL_S``; the monotonic time it first held."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise BenchRunError(f"timed out waiting for {what}")
        time.sleep(POLL_S)
    return time.monotonic()


def overhead_fields(args: Any, backend: str) -> dict[str, Any]:
    """The overhead and recovery parts' ``JobConfig`` fields: the backend's, and
    ``--incremental``."""
    return {**cli.state_fields(args, backend),
            **({"incremental_checkpoints": True} if args.incremental else {})}


def overhead(args: Any, root: str, backend: str) -> dict[str, Any]:
    """Part 1: throughput with checkpoints off, every 10 s, every 1 s (with
    ``--overhead-s``: ``long_overhead``)."""
    if args.overhead_s is not None:
        return long_overhead(args, root, backend)
    settings = [("off", None), ("10 s", 10.0), ("1 s", 1.0)]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in settings}
    for rep in range(args.repeats):
        for name, interval in settings:
            source = jobs.generator(rate=None, keys=args.keys, zipf=None,
                                    num_records=args.records)
            job = jobs.keyed_count_job("ckpt-overhead", source, jobs.NullSink(),
                                       parallelism=args.parallelism, key_groups=128,
                                       config=config(root, interval,
                                                     overhead_fields(args, backend)))
            handle = job.run()
            t0 = time.monotonic()
            try:
                t1 = _until(lambda h=handle: h.status().state != "running", "the job's end")
                st = handle.status()
            finally:
                handle.stop()
            if st.state != "finished":
                raise BenchRunError(f"overhead run {name} ended {st.state}: {st.error}")
            thr = args.records / (t1 - t0)
            runs[name].append({"throughput": thr, "seconds": t1 - t0,
                               "checkpoints": st.checkpoints.completed})
            print(f"  [{backend}] overhead rep {rep + 1} {name:>4}: {thr:,.0f} records/s "
                  f"({st.checkpoints.completed} checkpoints)")
    med = {n: an.median(r["throughput"] for r in rs) for n, rs in runs.items()}
    return {"runs": runs, "median_throughput": med,
            "overhead": {n: 1 - med[n] / med["off"] for n in med if n != "off"}}


@dataclass(frozen=True)
class LongRun:
    """One run of the long overhead measurement: ``number`` (1-based, in run order) of
    ``pair``; ``setting`` "off" or "<interval> s" (``interval_s`` None: no checkpoints);
    ``seconds`` the measured window, after the state was built and ``warmup_s``."""

    number: int
    pair: int
    backend: str
    setting: str
    interval_s: float | None
    seconds: float
    warmup_s: float


def long_plan(args: Any, backend: str) -> list[LongRun]:
    """The long overhead runs of one backend, in order: ``--repeats`` pairs, each a run
    without checkpoints then one with (off, ckpt, off, ckpt, ...), so that a drift of the
    machine's load reaches both settings alike."""
    ckpt = f"{args.overhead_interval:g} s"
    return [LongRun(2 * rep + i + 1, rep + 1, backend, name, interval, args.overhead_s,
                    args.warmup)
            for rep in range(args.repeats)
            for i, (name, interval) in enumerate((("off", None),
                                                  (ckpt, args.overhead_interval)))]


def long_source(args: Any) -> HotKeysSource:
    """Every key once with its share of the largest state size, then ``--hot-pct`` % of the
    keys only (``harness.hot_keys``)."""
    mb = max(args.state_mb)
    return HotKeysSource(args.keys, max(1, round(args.keys * args.hot_pct / 100)),
                         max(1, mb * 1_000_000 // args.keys))


def window_figures(samples: list[dict[str, Any]], cpu: dict[str, Any] | None = None
                   ) -> dict[str, Any]:
    """A long run's figures from its samples (each ``{"t"``: the JobMaster's monotonic
    seconds of the metrics, ``"records"``: records taken by the count tasks, ``"completed"``
    and ``"failed"``: checkpoints so far, ``"last_id"``, ``"last_bytes"``,
    ``"last_duration_s"``, ``"load"``: the 1-min load average``}``), the first taken at the
    window's start, the last at its end; ``cpu``: ``procs.RssSampler.cpu()`` over it.

    Throughput = records between the first and the last sample over their ``t``;
    checkpoints = completed ones between them (each new ``last_id`` also listed with its
    duration and bytes); per second: the rates between consecutive distinct samples."""
    first, last = samples[0], samples[-1]
    span = last["t"] - first["t"]
    if span <= 0:
        raise BenchRunError("a long overhead run's samples span no time")
    records = last["records"] - first["records"]
    seen, checkpoints = first["last_id"], []
    for x in samples[1:]:
        if x["last_id"] != seen:
            seen = x["last_id"]
            checkpoints.append({"id": x["last_id"], "duration_s": x["last_duration_s"],
                                "bytes": x["last_bytes"]})
    timeline, prev = [], first
    for x in samples[1:]:
        if x["t"] > prev["t"]:
            timeline.append([round(x["t"] - first["t"], 2),
                             (x["records"] - prev["records"]) / (x["t"] - prev["t"])])
            prev = x
    out: dict[str, Any] = {
        "seconds": span, "records": records, "throughput": records / span,
        "checkpoints": last["completed"] - first["completed"],
        "checkpoints_failed": last["failed"] - first["failed"],
        "checkpoint_list": checkpoints, "per_second": timeline,
        "load_start": first["load"], "load_end": last["load"],
        "load_max": max(x["load"] for x in samples)}
    if cpu:
        out["job_cores"], out["other_cores"] = cpu["job_cores"], cpu["other_cores"]
        out["records_per_cpu_s"] = (records / (cpu["job_cores"] * cpu["span_s"])
                                    if cpu["job_cores"] > 0 else None)
    return out


def long_summary(runs: list[dict[str, Any]], min_checkpoints: int, min_seconds: float
                 ) -> dict[str, Any]:
    """Medians per setting, overhead = 1 - median(ckpt) / median(off) in records/s (and in
    records per CPU-second of the job's processes when measured), each pair's own overhead,
    and the verdict: ``valid`` when every checkpointing run completed at least
    ``min_checkpoints`` checkpoints and none failed, every run without checkpoints
    completed none, and every window lasted ``min_seconds`` (a measurement that did not
    checkpoint as planned must not pass as one); ``inconclusive`` when the pairs disagree by
    more than ``NOISE`` or one shows checkpoints making the job faster by more than
    ``NOISE`` (the machine's load moved more than checkpoints cost); ``met`` when valid,
    conclusive and the overhead in records/s is <= 5 %."""
    settings = list(dict.fromkeys(r["setting"] for r in runs))
    by = {n: [r for r in runs if r["setting"] == n] for n in settings}
    med = {n: an.median(r["throughput"] for r in rs) for n, rs in by.items()}
    out: dict[str, Any] = {"mode": "long", "runs": by, "median_throughput": med,
                           "overhead": {n: 1 - med[n] / med["off"] for n in med if n != "off"}}
    if all(r.get("records_per_cpu_s") for r in runs):
        per_cpu = {n: an.median(r["records_per_cpu_s"] for r in rs) for n, rs in by.items()}
        out["median_records_per_cpu_s"] = per_cpu
        out["overhead_per_cpu_s"] = {n: 1 - per_cpu[n] / per_cpu["off"]
                                     for n in per_cpu if n != "off"}
    pairs: dict[int, dict[str, float]] = {}
    for r in runs:
        pairs.setdefault(r["pair"], {})[r["setting"]] = r["throughput"]
    out["pair_overhead"] = [1 - p[n] / p["off"] for p in pairs.values() for n in p
                            if n != "off" and "off" in p]
    why = [f"run {r['number']} ({r['setting']}): {r['checkpoints']} checkpoints completed, "
           f"{r['checkpoints_failed']} failed"
           for r in runs
           if (r["interval_s"] is None and r["checkpoints"] != 0)
           or (r["interval_s"] is not None and (r["checkpoints"] < min_checkpoints
                                                or r["checkpoints_failed"]))]
    why += [f"run {r['number']} ({r['setting']}): measured {r['seconds']:.1f} s"
            for r in runs if r["seconds"] < min_seconds]
    valid = not why and "off" in by and len(by) > 1
    po = out["pair_overhead"]
    noisy = bool(po) and (max(po) - min(po) > NOISE or min(po) < -NOISE)
    out["verdict"] = {"valid": valid, "why_not": why, "inconclusive": noisy,
                      "met": valid and not noisy
                      and all(v <= 0.05 for v in out["overhead"].values())}
    return out


def _long_sample(handle: Any) -> dict[str, Any]:
    m = handle.metrics()
    cp = handle.status().checkpoints
    return {"t": m.taken_at, "records": sum(t.records_in for t in m.operator("agg")),
            "completed": cp.completed, "failed": cp.failed, "last_id": cp.last_id,
            "last_bytes": cp.last_bytes, "last_duration_s": cp.last_duration_s,
            "load": os.getloadavg()[0]}


def long_run(args: Any, root: str, plan: LongRun) -> dict[str, Any]:
    """One long overhead run: build the state, wait ``warmup_s``, then sample the job every
    second for ``seconds`` (``window_figures``)."""
    source = long_source(args)
    job = jobs.keyed_count_job("ckpt-overhead-long", source, jobs.NullSink(),
                               parallelism=args.parallelism, key_groups=128,
                               config=config(root, plan.interval_s,
                                             overhead_fields(args, plan.backend)))
    t_run = time.monotonic()
    handle = job.run()
    try:
        t_built = _until(lambda: sum(t.records_in for t in handle.metrics().operator("agg"))
                         >= args.keys, "the state built")
        time.sleep(plan.warmup_s)
        pids = procs.wait_for_pids(handle.job_id, args.parallelism + 2)
        sampler = procs.RssSampler(pids, time.monotonic())
        sampler.start()
        samples = [_long_sample(handle)]
        end = time.monotonic() + plan.seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(1.0, left))
            samples.append(_long_sample(handle))
        sampler.stop()
        st = handle.status()
    finally:
        handle.stop()
    if st.state != "running":
        raise BenchRunError(f"long overhead run {plan.number} ended {st.state}: {st.error}")
    res = {**dataclasses.asdict(plan), **window_figures(samples, sampler.cpu()),
           "build_s": t_built - t_run, "rss": procs.memory_summary(sampler.samples, len(pids))}
    print(f"  [{plan.backend}] long run {plan.number} (pair {plan.pair}) {plan.setting:>5}: "
          f"{res['throughput']:,.0f} records/s over {res['seconds']:.0f} s, "
          f"{res['checkpoints']} checkpoints ({res['checkpoints_failed']} failed), "
          f"job {res.get('job_cores', 0):.2f} / other {res.get('other_cores', 0):.2f} cores, "
          f"load {res['load_start']:.1f} -> {res['load_end']:.1f}")
    return res


def long_overhead(args: Any, root: str, backend: str) -> dict[str, Any]:
    """Part 1 on long runs (``--overhead-s``): ``long_plan``'s runs, ``long_summary``."""
    runs = [long_run(args, root, plan) for plan in long_plan(args, backend)]
    out = long_summary(runs, args.min_checkpoints, args.overhead_s * 0.99)
    src = long_source(args)
    out["job"] = {"keys": args.keys, "hot_keys": src.hot_keys, "state_bytes_per_key":
                  src.state_bytes, "state_mb": max(args.state_mb),
                  "incremental": args.incremental, "interval_s": args.overhead_interval,
                  "seconds": args.overhead_s, "warmup_s": args.warmup,
                  "parallelism": args.parallelism}
    v = out["verdict"]
    print(f"  [{backend}] overhead at {args.overhead_interval:g} s: "
          + ", ".join(f"{o * 100:.1f} %" for o in out["overhead"].values())
          + f" (pairs: {', '.join(f'{o * 100:.1f} %' for o in out['pair_overhead'])}); "
          + ("NOT VALID: " + "; ".join(v["why_not"]) if not v["valid"]
             else "inconclusive (the pairs disagree: the load moved)" if v["inconclusive"]
             else "valid"))
    return out


def duration_by_size(args: Any, root: str, backend: str) -> list[dict[str, Any]]:
    """Part 2: a savepoint of each state size."""
    out = []
    for mb in args.state_mb:
        state_bytes = max(1, mb * 1_000_000 // args.keys)
        source = jobs.generator(rate=None, keys=args.keys, zipf=None,
                                state_bytes=state_bytes)  # unbounded: it must not end first
        job = jobs.keyed_count_job("ckpt-size", source, jobs.NullSink(),
                                   parallelism=args.parallelism, key_groups=128,
                                   config=config(root, None, cli.state_fields(args, backend)))
        handle = job.run()
        try:
            _until(lambda h=handle: sum(t.records_in for t in h.metrics().operator("agg"))
                   >= args.keys, "every key's state")
            path = handle.savepoint(os.path.join(root, f"size-{mb}mb-{backend}"))
            cp = handle.status().checkpoints
        finally:
            handle.stop()
        row = {"state_mb": mb, "bytes": cp.last_bytes, "duration_s": cp.last_duration_s,
               "path": path}
        out.append(row)
        print(f"  [{backend}] state {mb} MB: savepoint of {cp.last_bytes / 1e6:,.1f} MB in "
              f"{cp.last_duration_s:.2f} s")
    return out


#: --restart-modes: the JobConfig fields of each way a restart gets its task processes
RESTART_MODES: dict[str, dict[str, Any]] = {
    "new": {"recovery_reuses_processes": False},
    "reuse": {},
    "standby": {"warm_standby_tasks": 1},
    "local": {"warm_standby_tasks": 1, "local_recovery": True},
}


def recovery_time(args: Any, root: str, backend: str) -> dict[str, Any]:
    """Part 3: kill a count task with the largest state; time to output flowing again, once
    per ``--restart-modes`` (the first mode's figures at the top level, all in
    ``modes``)."""
    runs = []
    for mode in args.restart_modes:
        res = _recovery_run(args, os.path.join(root, f"recovery-{mode}"), backend, mode)
        runs.append(res)
    return {**runs[0], "modes": runs}


def _recovery_run(args: Any, root: str, backend: str, mode: str) -> dict[str, Any]:
    import ray

    mb = max(args.state_mb)
    state_bytes = max(1, mb * 1_000_000 // args.keys)
    source = jobs.generator(rate=args.rate, keys=args.keys, zipf=None,
                            state_bytes=state_bytes)
    job = jobs.keyed_count_job("ckpt-recovery", source, jobs.NullSink(),
                               parallelism=args.parallelism, key_groups=128,
                               config=config(root, args.interval,
                                             {**overhead_fields(args, backend),
                                              **RESTART_MODES[mode]}))
    handle = job.run()
    try:
        # a checkpoint taken after every key was seen holds the whole state
        _until(lambda: sum(t.records_in for t in handle.metrics().operator("agg"))
               >= args.keys * 2, "every key's state")
        done = handle.status().checkpoints.completed
        _until(lambda: handle.status().checkpoints.completed > done, "a full checkpoint")
        cp = handle.status().checkpoints
        rss = procs.rss_bytes({n: p for n, p in procs.job_actor_pids(handle.job_id).items()
                               if "/agg/" in n})
        victim = next(n["name"] for n in ray.util.list_named_actors(all_namespaces=True)
                      if isinstance(n, dict) and n["name"].startswith(f"{handle.job_id}/agg/"))
        state_bytes = sum(t.state_bytes for t in handle.metrics().operator("agg"))
        t_kill = time.monotonic()
        ray.kill(ray.get_actor(victim, namespace="reflow"))
        t_noticed = _until(lambda: handle.status().restarts >= 1
                           or handle.status().state == "restarting", "the failure noticed")
        t_running = _until(lambda: handle.status().state == "running"
                           and handle.status().restarts >= 1, "the restart")
        t_flowing = _until(lambda: sum(t.records_in for t in handle.metrics().operator("agg"))
                           > 0 and handle.status().restarts >= 1, "output flowing again")
        st = handle.status()
    finally:
        handle.stop()
    res = {"state_mb": mb, "backend": backend, "mode": mode,
           "checkpoint_bytes": cp.last_bytes, "state_bytes": state_bytes,
           "tasks_rss_mb": sum(rss.values()) / 2**20, "interval_s": args.interval,
           "rate": args.rate, "to_noticed_s": t_noticed - t_kill,
           "to_running_s": t_running - t_kill, "to_output_s": t_flowing - t_kill,
           "restarts": st.restarts, "last_failure": st.last_failure}
    print(f"  [{backend}, {mode}] recovery of {state_bytes / 1e6:,.1f} MB of state from a "
          f"checkpoint that wrote {cp.last_bytes / 1e6:,.1f} MB: noticed after "
          f"{res['to_noticed_s']:.2f} s, running after {res['to_running_s']:.2f} s, output "
          f"flowing after {res['to_output_s']:.2f} s")
    return res


def master_failover(args: Any, root: str, backend: str) -> dict[str, Any]:
    """Part 4: kill a detached job's JobMaster; time to its takeover and next checkpoint."""
    import ray

    mb = max(args.state_mb)
    state_bytes = max(1, mb * 1_000_000 // args.keys)
    source = jobs.generator(rate=args.rate, keys=args.keys, zipf=None,
                            state_bytes=state_bytes)
    interval = min(args.interval, 1.0)  # a checkpoint soon after the takeover shows it
    job = jobs.keyed_count_job("master-failover", source, jobs.NullSink(),
                               parallelism=args.parallelism, key_groups=128,
                               config=config(root, interval, cli.state_fields(args, backend)))
    handle = job.run(detached=True)

    def processed() -> int:
        return sum(t.records_in for t in handle.metrics().operator("agg"))

    try:
        _until(lambda: processed() >= args.keys * 2, "every key's state")
        done = handle.status().checkpoints.completed
        _until(lambda: handle.status().checkpoints.completed > done, "a full checkpoint")
        cp = handle.status().checkpoints
        before = processed()
        t_kill = time.monotonic()
        ray.kill(handle._master, no_restart=False)
        t_took_over = _until(lambda: handle.status().master_epoch >= 2, "the takeover")
        after = processed()
        done = handle.status().checkpoints.completed
        t_checkpoint = _until(lambda: handle.status().checkpoints.completed > done,
                              "a checkpoint of the new JobMaster")
        st = handle.status()
    finally:
        handle.stop()
    res = {"state_mb": mb, "backend": backend, "checkpoint_bytes": cp.last_bytes,
           "to_takeover_s": t_took_over - t_kill, "to_checkpoint_s": t_checkpoint - t_kill,
           "reconciled": st.restarts == 0 and "reconcile" in st.last_failure,
           "records_during_takeover": after - before, "restarts": st.restarts,
           "last_failure": st.last_failure, "interval_s": interval}
    print(f"  [{backend}] JobMaster killed with {cp.last_bytes / 1e6:,.1f} MB of state: taken "
          f"over after {res['to_takeover_s']:.2f} s ({'reconciled' if res['reconciled'] else 'restarted'}, "
          f"{res['records_during_takeover']:,} records processed meanwhile), next checkpoint "
          f"after {res['to_checkpoint_s']:.2f} s")
    return res


def _series(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Backend -> its parts' results (one backend: the top-level keys)."""
    return results.get("by_backend") or {results.get("state_backend", "memory"): results}


def plot(results: dict[str, Any], path: str) -> None:
    """Per part one axis, each backend's figures side by side."""
    plt = render.pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    series = _series(results)
    width = 0.8 / len(series)
    for i, (backend, res) in enumerate(series.items()):
        o = res.get("overhead")
        if o and o.get("mode") == "long":  # per run, its per-second rate over the window
            for r in sorted((r for rs in o["runs"].values() for r in rs),
                            key=lambda r: r["number"]):
                pts = r["per_second"]
                axes[0].plot([t for t, _ in pts], [v for _, v in pts], lw=0.8,
                             ls="-" if r["interval_s"] else ":",
                             label=f"{backend} {r['number']} {r['setting']}")
            axes[0].set_xlabel("s into the measured window")
        elif o:
            med = o["median_throughput"]
            axes[0].bar([j + i * width for j in range(len(med))], list(med.values()), width,
                        label=backend)
            axes[0].set_xticks([j + 0.4 - width / 2 for j in range(len(med))], list(med))
        sizes = res.get("duration_by_size")
        if sizes:
            axes[1].plot([r["bytes"] / 1e6 for r in sizes], [r["duration_s"] for r in sizes],
                         "o-", label=backend)
        recs = (res.get("recovery") or {}).get("modes") or [res["recovery"]] \
            if res.get("recovery") else []
        step = width / max(1, len(recs))
        for k, rec in enumerate(recs):
            axes[2].barh([j + i * width + k * step for j in range(3)],
                         [rec["to_noticed_s"], rec["to_running_s"], rec["to_output_s"]], step,
                         label=f"{backend} {rec.get('mode', '')} "
                               f"({rec['checkpoint_bytes'] / 1e6:,.0f} MB)")
        m = res.get("master")
        if m:
            axes[3].barh([j + i * width for j in range(2)],
                         [m["to_takeover_s"], m["to_checkpoint_s"]], width,
                         label=f"{backend} ({m['checkpoint_bytes'] / 1e6:,.0f} MB, "
                               f"{'reconciled' if m['reconciled'] else 'restarted'})")
    axes[0].set_title("throughput by checkpoint interval")
    axes[0].set_ylabel("records/s")
    axes[1].set_title("savepoint duration by state size")
    axes[1].set_xlabel("MB")
    axes[1].set_ylabel("s")
    axes[2].set_yticks([j + 0.4 - width / 2 for j in range(3)], ["noticed", "running", "output"])
    axes[2].axvspan(15, 19, color="#ddd", label="Flink stop-with-savepoint + restart")
    axes[2].set_title("from a killed task")
    axes[2].set_xlabel("s after the kill")
    axes[3].set_yticks([j + 0.4 - width / 2 for j in range(2)],
                       ["taken over", "next checkpoint"])
    axes[3].axvline(3.0, color="#999", linestyle=":", label="target (issue 30)")
    axes[3].set_title("from a killed JobMaster")
    axes[3].set_xlabel("s after the kill")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        elif not ax.has_data():
            ax.set_title(ax.get_title() + " (not run)")
    fig.suptitle(render.load_title(results), fontsize=8)
    fig.tight_layout()
    render.save_figure(fig, path)


def markdown(results: dict[str, Any]) -> str:
    """The printed tables: per part, one row per backend."""
    series = _series(results)
    lines: list[str] = []
    rows = [[b, n, render.fmt(o["median_throughput"][n], ",.0f"),
             "-" if n == "off" else f"{o['overhead'][n] * 100:.1f} %"]
            for b, res in series.items() if (o := res.get("overhead"))
            for n in o["median_throughput"]]
    if rows:
        lines += [*render.md_table(["backend", "checkpoints", "records/s (median)",
                                    "overhead"], rows), ""]
    rows = [[b, str(r["number"]), r["setting"], f"{r['seconds']:.0f}",
             f"{r['throughput']:,.0f}", render.fmt(r.get("records_per_cpu_s"), ",.0f"),
             f"{r['checkpoints']} ({r['checkpoints_failed']} failed)",
             render.fmt(max((c["bytes"] for c in r["checkpoint_list"]), default=None), ",d"),
             f"{r.get('job_cores', 0):.2f} / {r.get('other_cores', 0):.2f}",
             f"{r['load_start']:.1f} -> {r['load_end']:.1f}"]
            for b, res in series.items() if (o := res.get("overhead")) and o.get("mode") == "long"
            for r in sorted((r for rs in o["runs"].values() for r in rs),
                            key=lambda r: r["number"])]
    if rows:
        lines += [*render.md_table(["backend", "run", "checkpoints", "s", "records/s",
                                    "per job CPU-s", "completed", "largest checkpoint bytes",
                                    "cores job / other", "load"], rows), ""]
        for b, res in series.items():
            o = res.get("overhead") or {}
            if o.get("mode") != "long":
                continue
            v, j = o["verdict"], o["job"]
            per_cpu = "".join(f", {o_ * 100:.1f} % per job CPU-second"
                              for o_ in (o.get("overhead_per_cpu_s") or {}).values())
            lines += [f"{b}: {j['state_mb']} MB over {j['keys']:,} keys, {j['hot_keys']:,} "
                      f"updated, incremental {'on' if j['incremental'] else 'off'}; overhead "
                      + ", ".join(f"{x * 100:.1f} %" for x in o["overhead"].values())
                      + per_cpu + " (pairs: "
                      + ", ".join(f"{x * 100:.1f} %" for x in o["pair_overhead"]) + "); "
                      + ("NOT A VALID MEASUREMENT: " + "; ".join(v["why_not"])
                         if not v["valid"] else "inconclusive: the pairs disagree by more "
                         f"than {NOISE * 100:.0f} points (the load moved)"
                         if v.get("inconclusive") else "target <= 5 % met" if v["met"]
                         else "target <= 5 % not met"), ""]
    rows = [[b, f"{r['state_mb']} MB", f"{r['bytes']:,}", f"{r['duration_s']:.2f}"]
            for b, res in series.items() for r in res.get("duration_by_size") or ()]
    if rows:
        lines += [*render.md_table(["backend", "state", "savepoint bytes", "duration s"],
                                   rows), ""]
    rows = [[b, rec.get("mode", "new"),
             "-" if rec.get("state_bytes") is None else f"{rec['state_bytes'] / 1e6:,.0f} MB",
             f"{rec['checkpoint_bytes'] / 1e6:,.0f} MB",
             f"{rec['to_noticed_s']:.2f}", f"{rec['to_running_s']:.2f}",
             f"{rec['to_output_s']:.2f}", render.fmt(rec.get("tasks_rss_mb"), ",.0f")]
            for b, res in series.items() if (top := res.get("recovery"))
            for rec in top.get("modes") or [top]]
    if rows:
        lines += [*render.md_table(["backend", "restart", "state", "checkpoint written",
                                    "noticed s", "running s", "output flowing s",
                                    "count tasks' RSS MB"], rows), ""]
    rows = [[b, f"{m['checkpoint_bytes'] / 1e6:,.0f} MB", f"{m['to_takeover_s']:.2f}",
             f"{m['to_checkpoint_s']:.2f}", "yes" if m["reconciled"] else "no (restarted)",
             f"{m['records_during_takeover']:,}"]
            for b, res in series.items() if (m := res.get("master"))]
    if rows:
        lines += [*render.md_table(["backend", "checkpoint", "JobMaster killed -> taken over s",
                                    "-> next checkpoint s", "reconciled",
                                    "records processed meanwhile"], rows), ""]
    return "\n".join([*lines, render.load_title(results)]) + "\n"


PART_RUNS = {"overhead": ("1. overhead of checkpoints in steady state", overhead),
             "size": ("2. checkpoint duration by state size", duration_by_size),
             "recovery": ("3. recovery from a killed task", recovery_time),
             "master": ("4. JobMaster failover of a detached job", master_failover)}
PART_KEYS = {"overhead": "overhead", "size": "duration_by_size", "recovery": "recovery",
             "master": "master"}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = provenance.begin(__file__, argv)
    results["machine"]["ray"] = run.ray_version()
    results["config"] = {k: getattr(args, k) for k in
                         ("records", "repeats", "keys", "state_mb", "rate", "interval",
                          "parallelism", "quick", "parts", "state_backend", "state_dir",
                          "state_memory_mb", "overhead_s", "overhead_interval", "hot_pct",
                          "min_checkpoints", "warmup", "incremental")}
    backends = cli.state_backends(args)
    per: dict[str, dict[str, Any]] = {b: {"state_backend": b} for b in backends}
    root = tempfile.mkdtemp(prefix="reflow-bench-recovery-")
    run.init_ray()
    try:
        for part in PARTS:
            if part not in args.parts:
                continue
            title, measure = PART_RUNS[part]
            print(title)
            for b in backends:  # alternated: the machine's drift reaches both
                per[b][PART_KEYS[part]] = measure(args, root, b)
    finally:
        run.shutdown_ray()
    if len(backends) == 1:
        results.update(per[backends[0]])
    else:
        results["by_backend"] = per
    provenance.finish(results)
    render.write_outputs(args.out, results, markdown=markdown(results), png="recovery.png",
                         plot=plot)
    invalid = [b for b, res in per.items()
               if not (res.get("overhead") or {}).get("verdict", {"valid": True})["valid"]]
    if invalid:
        print(f"the long overhead runs of {', '.join(invalid)} are no valid measurement "
              "(see the verdict above)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
