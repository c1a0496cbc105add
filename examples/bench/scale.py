"""The scale scenario: a keyed job with GBs of state on RocksDB, its memory and its exact output.

    python examples/bench/scale.py                  # 5 GB on RocksDB, 4 -> 6 with drrs, ~10-15 min
    python examples/bench/scale.py --quick          # 0.2 GB, ~1-2 min
    python examples/bench/scale.py --state-gb 2 --parallelism 8 --to 12 --checkpoint-interval 30

Issue 29's first target: a keyed job with 5 GB of logical state runs on the RocksDB backend
with its task processes at <= 3 GB RSS in total, and its output is exact. The job
(``harness.jobs.keyed_count_job``): a bounded GeneratorSource (one task, unpaced or at ``--rate``, uniform
keys) of ``--records`` records over ``--keys`` keys -> key_by -> ``PaddedCount`` (per key a
count and ``state_gb / keys`` random bytes of padding, which RocksDB cannot compress,
made on the key's first record) at
``--parallelism`` tasks -> ``TestingSink`` (chained). The default record count gives every
key ``--visits`` records on average, so all but ``e^-visits`` of the keys are seen and the
state reaches ``(1 - e^-visits) x --state-gb``.

Once the count tasks have taken ``--rescale-at`` of the records, the count operator is
rescaled to ``--to`` tasks with ``--protocol`` (0: no rescale; then no state moves and the
verdict says so). With ``--checkpoint-interval`` the job checkpoints (incremental with
``--incremental``) and the sink commits exactly once.

Measured: the records' throughput; every second the RSS of the job's processes, split into
the count tasks, every task process (count, source) and the JobMaster; the logical state
(the tasks' ``state_bytes``) and the RocksDB directories' size on disk; the rescale's report
(seconds, bytes moved, MB/s); the checkpoints completed. Verdict: per key, the sink's
outputs are exactly ``(key, 1), (key, 2), ... (key, c)`` in order, ``c`` the key's count in
the generator's sequence (``harness.jobs.generator_keys``), and the rescale moved state.

Writes ``examples/bench/out/scale/results.json``, ``summary.md`` and ``scale.png`` (RSS
and records over time). The page cache that holds RocksDB's files is not in any RSS.
"""

# ruff: noqa: E402  (the repository root goes on sys.path before reflow's imports)
from __future__ import annotations

import contextlib
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from engine import JobConfig
from engine.io.testing import TestingSink
from engine.names import JobState
from examples.bench.harness import cli, jobs, procs, provenance, render, run
from examples.bench.harness.render import fmt, md_table

OP = "agg"
#: (full, quick)
DEFAULTS: dict[str, tuple[Any, Any]] = {
    "state_gb": (5.0, 0.2), "keys": (200_000, 20_000), "parallelism": (4, 2), "to": (6, 3),
}
RSS_TARGET_MB = 3 * 1024  # issue 29: the task processes at <= 3 GB in total


class RssTimeline(threading.Thread):
    """Every ``interval`` s, the RSS of a job's live actors grouped as the count tasks
    (vertex ``op``), every task process (anything but the JobMaster) and the JobMaster;
    actors looked up again every ``refresh`` s (a rescale adds and removes some)."""

    def __init__(self, job_id: str, op: str, t0: float, interval: float = 1.0,
                 refresh: float = 3.0) -> None:
        super().__init__(daemon=True)
        self.job_id, self.op, self.t0 = job_id, op, t0
        self.interval, self.refresh = interval, refresh
        self.samples: list[dict[str, float]] = []
        self._halt = threading.Event()

    def _group(self, name: str) -> str:
        rest = name[len(self.job_id) + 1:]
        if rest == "master":
            return "master"
        return "op" if rest.split("/", 1)[0] == self.op else "other"

    def run(self) -> None:
        pids: dict[str, int] = {}
        looked = -math.inf
        while not self._halt.is_set():
            now = time.monotonic()
            if now - looked >= self.refresh:
                with contextlib.suppress(Exception):  # the state API is busy: keep the last
                    pids = procs.job_actor_pids(self.job_id)
                looked = now
            rss = procs.rss_bytes(pids)
            if rss:
                by = {"op": 0, "other": 0, "master": 0}
                for name, b in rss.items():
                    by[self._group(name)] += b
                self.samples.append({"t": round(time.time() - self.t0, 2),
                                     "op_mb": by["op"] / 2**20,
                                     "tasks_mb": (by["op"] + by["other"]) / 2**20,
                                     "total_mb": sum(by.values()) / 2**20,
                                     "processes": len(rss),
                                     "largest_mb": max(rss.values()) / 2**20})
            self._halt.wait(self.interval)

    def stop(self) -> dict[str, Any]:
        self._halt.set()
        self.join(timeout=10)
        peak = {k: max((s[k] for s in self.samples), default=0.0)
                for k in ("op_mb", "tasks_mb", "total_mb", "largest_mb")}
        return {"peak": peak, "samples": self.samples}


def dir_bytes(path: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(dirpath, f))
    return total


def check_output(values: list[Any], expected: dict[int, int]) -> dict[str, Any]:
    """Per key, ``values`` (the sink's ``(key, count)`` records in per-key order) must be
    ``(key, 1) ... (key, expected[key])``; the first few violations are listed."""
    seen: dict[int, int] = {}
    bad: list[str] = []
    for key, n in values:
        last = seen.get(key, 0)
        if n != last + 1 and len(bad) < 5:
            bad.append(f"key {key}: {n} after {last}")
        seen[key] = n
    for key, c in expected.items():
        if seen.get(key, 0) != c and len(bad) < 10:
            bad.append(f"key {key}: last count {seen.get(key, 0)}, expected {c}")
    extra = set(seen) - set(expected)
    if extra:
        bad.append(f"{len(extra)} keys the generator never emitted")
    return {"exact": not bad and len(values) == sum(expected.values()),
            "records_out": len(values), "records_expected": sum(expected.values()),
            "keys_out": len(seen), "problems": bad}


def expected_counts(records: int, keys: int) -> dict[int, int]:
    import numpy as np

    seq = jobs.generator_keys(records, keys=keys, zipf=None)
    counts = np.bincount(seq)
    return {int(k): int(c) for k, c in enumerate(counts) if c}


def run_scale(args: Any) -> dict[str, Any]:
    bytes_per_key = int(args.state_gb * 1e9 / args.keys)
    records = args.records or int(args.keys * args.visits)
    state_dir = args.state_dir or tempfile.mkdtemp(prefix="reflow-scale-")
    sink_dir = tempfile.mkdtemp(prefix="reflow-scale-sink-")
    fields = cli.state_fields(args, "rocksdb") | {"state_dir": state_dir}
    config = JobConfig(**fields, warm_standby_tasks=0,
                       checkpoint_interval_s=args.checkpoint_interval or None,
                       incremental_checkpoints=args.incremental)
    source = jobs.generator(rate=args.rate, keys=args.keys, zipf=None, state_bytes=bytes_per_key,
                            num_records=records)
    sink = TestingSink(sink_dir)
    job = jobs.keyed_count_job("scale", source, sink, parallelism=args.parallelism,
                               key_groups=args.key_groups, config=config,
                               function=jobs.PaddedCount(random_padding=True))
    out: dict[str, Any] = {"records": records, "bytes_per_key": bytes_per_key,
                           "state_dir": state_dir}
    print(f"scale: {records:,} records over {args.keys:,} keys x {bytes_per_key:,} B "
          f"(~{args.state_gb:g} GB) on RocksDB, {OP} at {args.parallelism}"
          + (f" -> {args.to} ({args.protocol})" if args.to else ""), flush=True)
    expected = expected_counts(records, args.keys)
    t0 = time.time()
    handle = job.run()
    rss = RssTimeline(handle.job_id, OP, t0)
    rss.start()
    timeline: list[dict[str, float]] = []
    last_metrics: dict[str, Any] = {}
    report = None
    rescaled_at = None
    rescale: threading.Thread | None = None
    outcome: dict[str, Any] = {}

    def ask() -> None:  # in a thread: the metrics go on being sampled meanwhile
        try:
            outcome["report"] = handle.rescale(OP, args.to, protocol=args.protocol)
        except Exception as exc:  # noqa: BLE001 - recorded, the verdict fails
            outcome["error"] = f"{type(exc).__name__}: {exc}"

    try:
        while True:
            st = handle.status()
            if not JobState(st.state).active:
                break
            try:
                m = run.op_metrics(handle, OP)
            except Exception:  # noqa: BLE001 - the job is ending
                m = None
            if m is not None:
                last_metrics = m
                timeline.append({"t": round(time.time() - t0, 2),
                                 "records_in": m["records_in"],
                                 "state_mb": m["state_bytes"] / 1e6,
                                 "disk_mb": dir_bytes(state_dir) / 1e6})
                print(f"  {time.time() - t0:6.0f} s: {m['records_in']:,} records in, "
                      f"{m['state_bytes'] / 1e9:.2f} GB of state, "
                      f"RSS {rss.samples[-1]['tasks_mb'] if rss.samples else 0:,.0f} MB "
                      f"(task processes)", flush=True)
                if (args.to and rescale is None
                        and m["records_in"] >= args.rescale_at * records):
                    out["state_before_rescale_bytes"] = m["state_bytes"]
                    rescaled_at = time.time() - t0
                    print(f"  rescale {OP} {args.parallelism} -> {args.to} ({args.protocol})",
                          flush=True)
                    rescale = threading.Thread(target=ask, daemon=True)
                    rescale.start()
            if rescale is not None and not rescale.is_alive() and report is None:
                report = outcome.get("report")
                if report is not None:
                    out["rescale_done_at"] = time.time() - t0
                    print(f"  done in {report.duration_s:.1f} s: "
                          f"{report.bytes_moved / 1e6:,.0f} MB moved", flush=True)
            time.sleep(args.poll)
        ended = time.time() - t0
        final = handle.status()
        if rescale is not None:
            rescale.join(timeout=60)
            report = outcome.get("report", report)
            if "error" in outcome:
                out["rescale_error"] = outcome["error"]
    finally:
        peak = rss.stop()
        with contextlib.suppress(Exception):  # a finished job has nothing to stop
            handle.stop()
    out.update(status=str(final.state), error=final.error, seconds=round(ended, 1),
               records_per_s=records / ended, rss=peak, timeline=timeline,
               state_bytes=last_metrics.get("state_bytes"), rescaled_at=rescaled_at,
               checkpoints=run.report_dict(final.checkpoints))
    if report is not None:
        r = run.report_dict(report)
        r["mb_per_s"] = report.bytes_moved / 1e6 / report.duration_s if report.duration_s else None
        out["report"] = r
    out["verdict"] = check_output(sink.results(), expected)
    out["verdict"]["moved_state"] = bool(report is not None and report.bytes_moved > 0)
    shutil.rmtree(sink_dir, ignore_errors=True)
    if not args.state_dir:
        shutil.rmtree(state_dir, ignore_errors=True)
    return out


def summary(results: dict[str, Any]) -> str:
    c, r = results["config"], results["run"]
    v, peak = r["verdict"], r["rss"]["peak"]
    lines = [f"### scale scenario{' (quick)' if c['quick'] else ''}", "",
             f"`{results['command']}`; {render.load_title(results)}.", ""]
    rows = [["job", r["status"]],
            ["records", f"{r['records']:,} over {c['keys']:,} keys in {r['seconds']:.0f} s "
                        f"({r['records_per_s']:,.0f}/s)"],
            ["logical state (keys seen x padding)",
             f"{v['keys_out'] * r['bytes_per_key'] / 1e9:.2f} GB"],
            ["RocksDB's estimate, last sample (compressed; random padding)",
             f"{(r['state_bytes'] or 0) / 1e9:.2f} GB"],
            ["RocksDB directories on disk, largest sample",
             f"{max((x['disk_mb'] for x in r['timeline']), default=0) / 1e3:.2f} GB"],
            ["RSS peak: count tasks", f"{peak['op_mb']:,.0f} MB"],
            ["RSS peak: task processes (target <= 3 GB)", f"{peak['tasks_mb']:,.0f} MB"],
            ["RSS peak: all job processes (+ JobMaster)", f"{peak['total_mb']:,.0f} MB"],
            ["largest process", f"{peak['largest_mb']:,.0f} MB"]]
    rep = r.get("report")
    if rep:
        rows.append(["rescale", f"{c['parallelism']} -> {c['to']} ({c['protocol']}) at "
                                f"{r['rescaled_at']:.0f} s: {rep['duration_s']:.1f} s, "
                                f"{rep['bytes_moved'] / 1e6:,.0f} MB moved "
                                f"({fmt(rep['mb_per_s'])} MB/s), "
                                f"{rep['key_groups_moved']} key groups"])
    if r.get("rescale_error"):
        rows.append(["rescale failed", r["rescale_error"][:200]])
    rows.append(["exact output", f"{v['exact']} ({v['records_out']:,} of "
                                 f"{v['records_expected']:,} records)"
                 + ("" if not v["problems"] else "; " + "; ".join(v["problems"][:3]))])
    lines += md_table(["what", "measured"], rows)
    ok = v["exact"] and (v["moved_state"] or not c["to"]) and r["status"] == "finished"
    lines += ["", f"**Verdict: {'PASS' if ok else 'FAIL'}**"
              + ("" if c["to"] else " (no rescale was asked: nothing moved)")
              + f"; task processes {'within' if peak['tasks_mb'] <= RSS_TARGET_MB else 'above'}"
                f" 3 GB."]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: str) -> None:
    plt = render.pyplot()
    r = results["run"]
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    s = r["rss"]["samples"]
    t = [x["t"] for x in s]
    for key, label in (("total_mb", "all job processes"), ("tasks_mb", "task processes"),
                       ("op_mb", "count tasks")):
        a1.plot(t, [x[key] for x in s], label=label)
    a1.axhline(RSS_TARGET_MB, color="0.5", ls=":", label="3 GB")
    a1.set_ylabel("RSS, MB")
    a1.legend(fontsize=8)
    tl = r["timeline"]
    a2.plot([x["t"] for x in tl], [x["state_mb"] / 1e3 for x in tl],
            label="RocksDB's estimate (live data + memtables)")
    a2.plot([x["t"] for x in tl], [x["disk_mb"] / 1e3 for x in tl], label="RocksDB on disk")
    a2.set_ylabel("GB")
    a2.set_xlabel("seconds from deployment")
    a2.legend(fontsize=8)
    if r.get("rescaled_at") is not None:
        for a in (a1, a2):
            a.axvline(r["rescaled_at"], color="tab:red", ls="--")
    fig.suptitle(f"reflow scale scenario: {results['config']['state_gb']:g} GB on RocksDB\n"
                 f"{render.load_title(results)}", fontsize=9)
    render.save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser(__doc__, "scale")
    ap.add_argument("--state-gb", type=float, help="logical keyed state, GB (5; quick 0.2)")
    ap.add_argument("--state-dir", help="JobConfig(state_dir=...): where the RocksDB tasks "
                                        "keep their state (default: a temporary directory)")
    ap.add_argument("--state-memory-mb", type=int, default=64,
                    help="JobConfig(state_memory_bytes=n MB) per task (64)")
    ap.add_argument("--keys", type=int, help="keys (200,000; quick 20,000)")
    ap.add_argument("--visits", type=float, default=6.0,
                    help="records per key on average when --records is not given (6)")
    ap.add_argument("--records", type=int, help="records (default keys x visits)")
    ap.add_argument("--parallelism", type=int, help="the count operator's tasks (4; quick 2)")
    ap.add_argument("--to", type=int, help="rescale the count operator to this many tasks "
                                           "(6; quick 3; 0: no rescale)")
    ap.add_argument("--protocol", default="drrs")
    ap.add_argument("--rescale-at", type=float, default=0.5,
                    help="rescale once this share of the records was taken (0.5)")
    ap.add_argument("--rate", type=float, help="records/s of the source (default: unpaced)")
    ap.add_argument("--key-groups", type=int, default=128)
    ap.add_argument("--checkpoint-interval", type=float, default=0.0,
                    help="seconds between checkpoints (0: none)")
    ap.add_argument("--incremental", action="store_true")
    ap.add_argument("--poll", type=float, default=2.0, help="seconds between metrics polls")
    args = ap.parse_args(argv)
    cli.fill_defaults(args, DEFAULTS)
    out = cli.out_dir(args, "scale" + ("-quick" if args.quick else ""))
    results = provenance.begin(__file__, argv)
    results["config"] = {k: getattr(args, k) for k in (
        "quick", "state_gb", "keys", "visits", "records", "parallelism", "to", "protocol",
        "rescale_at", "rate", "key_groups", "checkpoint_interval", "incremental", "state_memory_mb")}
    run.init_ray()
    try:
        results["run"] = run_scale(args)
    finally:
        run.shutdown_ray()
    provenance.finish(results)
    render.write_outputs(out, results, markdown=summary(results), png="scale.png", plot=plot)
    v = results["run"]["verdict"]
    return 0 if v["exact"] and (v["moved_state"] or not args.to) else 1


if __name__ == "__main__":
    sys.exit(main())
