"""Checkpoints and recovery: the cost of checkpoints in steady state, how long a checkpoint
takes by state size, and how long a job takes from a killed task to output flowing again.

    python examples/bench/recovery.py           # 3 x 1.5M records, 20 and 200 MB of state
    python examples/bench/recovery.py --quick   # smoke run: 200k records, 2 and 20 MB
    python examples/bench/recovery.py --state-backend both --state-gb 0.2 --parts recovery
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
   target is <= 5 % at 10 s.
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

import os
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from engine import JobConfig
from examples.bench.harness import BenchRunError, cli, jobs, procs, provenance, render, run
from examples.bench.harness import analysis as an

DEFAULTS = {"records": (1_500_000, 200_000), "repeats": (3, 1), "keys": (20_000, 5_000),
            "rate": (20_000.0, 5_000.0), "interval": (10.0, 2.0)}
STATE_MB = ([20, 200], [2, 20])
POLL_S = 0.05
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
    cli.add_state_backend(ap)
    args = ap.parse_args(argv)
    cli.fill_defaults(args, DEFAULTS)
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


def overhead(args: Any, root: str, backend: str) -> dict[str, Any]:
    """Part 1: throughput with checkpoints off, every 10 s, every 1 s."""
    settings = [("off", None), ("10 s", 10.0), ("1 s", 1.0)]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in settings}
    for rep in range(args.repeats):
        for name, interval in settings:
            source = jobs.generator(rate=None, keys=args.keys, zipf=None,
                                    num_records=args.records)
            job = jobs.keyed_count_job("ckpt-overhead", source, jobs.NullSink(),
                                       parallelism=args.parallelism, key_groups=128,
                                       config=config(root, interval,
                                                     cli.state_fields(args, backend)))
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


def recovery_time(args: Any, root: str, backend: str) -> dict[str, Any]:
    """Part 3: kill a count task with the largest state; time to output flowing again."""
    import ray

    mb = max(args.state_mb)
    state_bytes = max(1, mb * 1_000_000 // args.keys)
    source = jobs.generator(rate=args.rate, keys=args.keys, zipf=None,
                            state_bytes=state_bytes)
    job = jobs.keyed_count_job("ckpt-recovery", source, jobs.NullSink(),
                               parallelism=args.parallelism, key_groups=128,
                               config=config(root, args.interval,
                                             cli.state_fields(args, backend)))
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
    res = {"state_mb": mb, "backend": backend, "checkpoint_bytes": cp.last_bytes,
           "tasks_rss_mb": sum(rss.values()) / 2**20, "interval_s": args.interval,
           "rate": args.rate, "to_noticed_s": t_noticed - t_kill,
           "to_running_s": t_running - t_kill, "to_output_s": t_flowing - t_kill,
           "restarts": st.restarts, "last_failure": st.last_failure}
    print(f"  [{backend}] recovery with {cp.last_bytes / 1e6:,.1f} MB: noticed after "
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
        if o:
            med = o["median_throughput"]
            axes[0].bar([j + i * width for j in range(len(med))], list(med.values()), width,
                        label=backend)
            axes[0].set_xticks([j + 0.4 - width / 2 for j in range(len(med))], list(med))
        sizes = res.get("duration_by_size")
        if sizes:
            axes[1].plot([r["bytes"] / 1e6 for r in sizes], [r["duration_s"] for r in sizes],
                         "o-", label=backend)
        rec = res.get("recovery")
        if rec:
            axes[2].barh([j + i * width for j in range(3)],
                         [rec["to_noticed_s"], rec["to_running_s"], rec["to_output_s"]], width,
                         label=f"{backend} ({rec['checkpoint_bytes'] / 1e6:,.0f} MB)")
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
    rows = [[b, f"{r['state_mb']} MB", f"{r['bytes']:,}", f"{r['duration_s']:.2f}"]
            for b, res in series.items() for r in res.get("duration_by_size") or ()]
    if rows:
        lines += [*render.md_table(["backend", "state", "savepoint bytes", "duration s"],
                                   rows), ""]
    rows = [[b, f"{rec['checkpoint_bytes'] / 1e6:,.0f} MB", f"{rec['to_noticed_s']:.2f}",
             f"{rec['to_running_s']:.2f}", f"{rec['to_output_s']:.2f}",
             render.fmt(rec.get("tasks_rss_mb"), ",.0f")]
            for b, res in series.items() if (rec := res.get("recovery"))]
    if rows:
        lines += [*render.md_table(["backend", "checkpoint", "noticed s", "running s",
                                    "output flowing s", "count tasks' RSS MB"], rows), ""]
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
                          "state_memory_mb")}
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
