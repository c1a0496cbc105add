"""State backends: how fast a key group crosses from one task to another, and per-record cost.

    python examples/bench/state_backend.py            # 100 MB and 1 GB of state, ~5-10 min
    python examples/bench/state_backend.py --quick    # 50 MB, ~1 min
    python examples/bench/state_backend.py --sizes-mb 200 --groups 8

Parts (``engine.state.keyed`` in memory, ``engine.state.rocksdb`` on disk; the blob format
is ``engine.state.keyed.encode_group``):

* ``crossing``: one task's keyed state of ``--sizes-mb`` MB (encoded) in ``--groups`` key
  groups, each entry an int key and a ``--value-bytes`` random bytes value (incompressible),
  plus, at a tenth of each size, small entries (str key -> ``[count, total]``, ~25 B: the
  per-entry cost dominates). Per key group: ``snapshot(kg)`` at the source task's backend
  and ``install(kg, blob)`` at a fresh target backend, timed apart; MB/s is the blob's
  bytes over the calling thread's CPU seconds (the figure that does not depend on what else
  runs on the machine; RocksDB's background flushes and compactions are not in it;
  wall-clock MB/s beside it), and ``crossing`` over both (nothing paces
  it: no network, one process). Rows for memory -> memory, RocksDB -> RocksDB and both cross-backend
  directions. Target (issue 29): a key group crosses at >= 200 MB/s on both backends.
* ``records``: per-record throughput of ``ValueState`` through ``set_current`` (what a
  keyed process function does): ``--ops`` updates then reads of random keys among the
  ``--ops`` keys written, and the reduce fast path (a table's ``get``/``[]=`` without
  ``set_current``) on those keys (each once) and on Zipf 1.2 keys among 100,000 (the
  steady-state job's: hot keys, which RocksDB's object cache serves), on both backends.

Writes ``examples/bench/out/state_backend/results.json``, ``summary.md`` (also printed) and
``state_backend.png``. One process, no Ray; figures depend on the load (recorded) and the
disk (RocksDB writes without its log; its directory is under ``--dir``).
"""

# ruff: noqa: E402  (the repository root goes on sys.path before reflow's imports)
from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from engine.state.keyed import KeyedStateBackend, ValueState
from engine.state.rocksdb import RocksDBKeyedStateBackend
from examples.bench.harness import cli, provenance, render
from examples.bench.harness.render import fmt, md_table

NUM_KEY_GROUPS = 128
DEFAULTS: dict[str, tuple[Any, Any]] = {"sizes_mb": ("100,1000", "50"), "ops": (200_000, 50_000),
                                        "measured": (4, 2)}
MEMORY, ROCKSDB = "memory", "rocksdb"


class _Backends:
    """Makes backends of either kind; RocksDB ones in fresh directories under ``root``."""

    def __init__(self, root: str, cache_mb: int, write_buffer_mb: int) -> None:
        self.root = root
        self.cache, self.wb = cache_mb << 20, write_buffer_mb << 20
        self.made: list[RocksDBKeyedStateBackend] = []

    def new(self, kind: str) -> KeyedStateBackend:
        if kind == MEMORY:
            return KeyedStateBackend(NUM_KEY_GROUPS)
        b = RocksDBKeyedStateBackend(NUM_KEY_GROUPS, tempfile.mkdtemp(dir=self.root),
                                     task=f"bench[{len(self.made)}]",
                                     block_cache_bytes=self.cache,
                                     write_buffer_bytes=self.wb)
        self.made.append(b)
        return b

    def close(self, b: KeyedStateBackend) -> None:
        if isinstance(b, RocksDBKeyedStateBackend):
            b.close()
            shutil.rmtree(b.directory, ignore_errors=True)


def _fill(b: KeyedStateBackend, groups: list[int], shape: str, total_bytes: int,
          value_bytes: int, rng: random.Random) -> int:
    """Fill ``groups`` of an in-memory backend with ~``total_bytes`` encoded; entries made."""
    if shape == "1 KB values":
        per = value_bytes + 8
        pool = rng.randbytes(value_bytes * 64 + 4096)

        def make(i: int) -> tuple[Any, Any]:
            return i, pool[(i * 7919) % 4096:][:value_bytes]
    else:
        per = 28

        def make(i: int) -> tuple[Any, Any]:
            return f"user-{i:09d}", [i % 1000, i * 0.5]
    n = max(1, total_bytes // per)
    per_group = -(-n // len(groups))
    i = 0
    for kg in groups:
        b.own(kg)
        b.groups[kg]["state"] = dict(make(j) for j in range(i, i + per_group))
        i += per_group
    return i


def crossing(args: argparse.Namespace, mk: _Backends) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    rng = random.Random(1)
    groups = list(range(0, NUM_KEY_GROUPS, NUM_KEY_GROUPS // args.groups))[:args.groups]
    for size_mb in args.sizes_mb:
        for shape, mb in (("1 KB values", size_mb), ("25 B entries", max(1, size_mb // 10))):
            print(f"crossing: {mb} MB of {shape} in {len(groups)} key groups ...", flush=True)
            mem = mk.new(MEMORY)
            entries = _fill(mem, groups, shape, mb << 20, args.value_bytes, rng)
            rocks = mk.new(ROCKSDB)
            for kg in groups:  # the RocksDB source: the same groups, installed
                rocks.install(kg, mem.snapshot(kg))
            sources = {MEMORY: mem, ROCKSDB: rocks}
            measured = groups[:args.measured]
            for src_kind, dst_kind in ((MEMORY, MEMORY), (ROCKSDB, ROCKSDB),
                                       (MEMORY, ROCKSDB), (ROCKSDB, MEMORY)):
                snap_s, inst_s, snap_cpu, inst_cpu, nbytes = [], [], [], [], 0
                for kg in measured:
                    dst = mk.new(dst_kind)
                    gc.collect()
                    t0, c0 = time.perf_counter(), time.thread_time()
                    blob = sources[src_kind].snapshot(kg)
                    t1, c1 = time.perf_counter(), time.thread_time()
                    dst.install(kg, blob)
                    t2, c2 = time.perf_counter(), time.thread_time()
                    snap_s.append(t1 - t0)
                    inst_s.append(t2 - t1)
                    snap_cpu.append(c1 - c0)
                    inst_cpu.append(c2 - c1)
                    nbytes += len(blob)
                    del blob
                    mk.close(dst)
                mbytes = nbytes / 1e6
                row = {"shape": shape, "state_mb": mb, "entries": entries,
                       "group_mb": mbytes / len(measured), "from": src_kind, "to": dst_kind,
                       "groups_measured": len(measured),
                       "snapshot_mb_s": mbytes / sum(snap_s),
                       "install_mb_s": mbytes / sum(inst_s),
                       "crossing_mb_s": mbytes / (sum(snap_s) + sum(inst_s)),
                       "snapshot_mb_cpu_s": mbytes / sum(snap_cpu),
                       "install_mb_cpu_s": mbytes / sum(inst_cpu),
                       "crossing_mb_cpu_s": mbytes / (sum(snap_cpu) + sum(inst_cpu))}
                rows.append(row)
                print(f"  {src_kind} -> {dst_kind}: {row['group_mb']:.1f} MB/group, snapshot "
                      f"{row['snapshot_mb_s']:,.0f} MB/s (CPU {row['snapshot_mb_cpu_s']:,.0f}), "
                      f"install {row['install_mb_s']:,.0f} (CPU {row['install_mb_cpu_s']:,.0f}), "
                      f"crossing {row['crossing_mb_s']:,.0f} MB/s (CPU "
                      f"{row['crossing_mb_cpu_s']:,.0f})", flush=True)
            mk.close(rocks)
            del mem, sources
            gc.collect()
    return rows


def records(args: argparse.Namespace, mk: _Backends) -> list[dict[str, Any]]:
    rows = []
    n = args.ops
    rng = random.Random(2)
    keys = [rng.randrange(1 << 40) for _ in range(n)]
    kgs = [k % NUM_KEY_GROUPS for k in keys]
    order = list(range(n))
    rng.shuffle(order)
    # the steady-state job's keys (examples/bench/steady.py): Zipf 1.2 over 100,000 keys
    import numpy as np

    zrng = np.random.default_rng(2)
    zkeys = [int(x) for x in (zrng.zipf(1.2, size=4 * n) - 1) if x <= 100_000][:n]
    for kind in (MEMORY, ROCKSDB):
        b = mk.new(kind)
        for kg in range(NUM_KEY_GROUPS):
            b.own(kg)
        state = ValueState(b, "count", default=0)
        clock = time.thread_time  # CPU seconds: the machine is shared (wall in the JSON)
        w0, t0 = time.perf_counter(), clock()
        for i in range(n):
            b.set_current(keys[i], kgs[i])
            state.update(i)
        w1, t1 = time.perf_counter(), clock()
        total = 0
        for i in order:
            b.set_current(keys[i], kgs[i])
            total += state.value()
        w2, t2 = time.perf_counter(), clock()
        tables = [b.groups[kg].setdefault("reduce", {}) for kg in range(NUM_KEY_GROUPS)]
        w3, t3 = time.perf_counter(), clock()
        for i in range(n):
            t = tables[kgs[i]]
            t[keys[i]] = t.get(keys[i], 0) + 1
        w4, t4 = time.perf_counter(), clock()
        hot = [b.groups[kg].setdefault("hot", {}) for kg in range(NUM_KEY_GROUPS)]
        t5 = clock()
        for k in zkeys:
            t = hot[k % NUM_KEY_GROUPS]
            t[k] = t.get(k, 0) + 1
        t6 = clock()
        rows.append({"backend": kind, "ops": n, "put_per_s": n / (t1 - t0),
                     "get_per_s": n / (t2 - t1), "reduce_per_s": n / (t4 - t3),
                     "zipf_reduce_per_s": n / (t6 - t5),
                     "put_per_wall_s": n / (w1 - w0), "get_per_wall_s": n / (w2 - w1),
                     "reduce_per_wall_s": n / (w4 - w3)})
        print(f"records: {kind}: put {n / (t1 - t0):,.0f}/CPU s, get {n / (t2 - t1):,.0f}/CPU s, "
              f"reduce path {n / (t4 - t3):,.0f}/CPU s, on Zipf keys "
              f"{n / (t6 - t5):,.0f}/CPU s", flush=True)
        mk.close(b)
    return rows


def markdown(results: dict[str, Any]) -> str:
    lines = [f"# State backends ({render.load_title(results)})", "",
             f"`{results['command']}`", "",
             "## A key group crossing tasks (snapshot at the source, install at the target)",
             "", "MB per CPU second of the calling thread (wall-clock MB/s in brackets: on a shared "
             "machine, the other processes' share of the cores shows there).", "",
             *md_table(["state", "entries", "MB / group", "from -> to", "snapshot MB/s",
                        "install MB/s", "crossing MB/s"],
                       [[f"{r['state_mb']:,} MB {r['shape']}", f"{r['entries']:,}",
                         fmt(r["group_mb"], ",.1f"), f"{r['from']} -> {r['to']}",
                         f"{fmt(r['snapshot_mb_cpu_s'], ',.0f')} ({fmt(r['snapshot_mb_s'], ',.0f')})",
                         f"{fmt(r['install_mb_cpu_s'], ',.0f')} ({fmt(r['install_mb_s'], ',.0f')})",
                         f"**{fmt(r['crossing_mb_cpu_s'], ',.0f')}** "
                         f"({fmt(r['crossing_mb_s'], ',.0f')})"] for r in results["crossing"]]),
             "", "Target: crossing >= 200 MB/s for both backends (issue 29).", "",
             "## Per record", "",
             *md_table(["backend", "ops", "ValueState put /CPU s", "ValueState get /CPU s",
                        "table get+put /CPU s (reduce path)", "reduce path, Zipf keys /CPU s"],
                       [[r["backend"], f"{r['ops']:,}", fmt(r["put_per_s"], ",.0f"),
                         fmt(r["get_per_s"], ",.0f"), fmt(r["reduce_per_s"], ",.0f"),
                         fmt(r.get("zipf_reduce_per_s"), ",.0f")]
                        for r in results["records"]]), ""]
    mem = next((r for r in results["records"] if r["backend"] == MEMORY), None)
    rocks = next((r for r in results["records"] if r["backend"] == ROCKSDB), None)
    if mem and rocks:
        lines += [f"RocksDB / memory: put {rocks['put_per_s'] / mem['put_per_s']:.2f}x, get "
                  f"{rocks['get_per_s'] / mem['get_per_s']:.2f}x, reduce path "
                  f"{rocks['reduce_per_s'] / mem['reduce_per_s']:.2f}x, reduce path on Zipf "
                  f"keys {rocks['zipf_reduce_per_s'] / mem['zipf_reduce_per_s']:.2f}x.", ""]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: str) -> None:
    plt = render.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.4))
    rows = results["crossing"]
    cases = list(dict.fromkeys(f"{r['state_mb']} MB\n{r['shape']}" for r in rows))
    pairs = list(dict.fromkeys(f"{r['from']} -> {r['to']}" for r in rows))
    width = 0.8 / len(pairs)
    for i, p in enumerate(pairs):
        ys = [next((r["crossing_mb_cpu_s"] for r in rows
                    if f"{r['state_mb']} MB\n{r['shape']}" == c
                    and f"{r['from']} -> {r['to']}" == p), 0) for c in cases]
        axes[0].bar([x + (i - (len(pairs) - 1) / 2) * width for x in range(len(cases))], ys,
                    width, label=p)
    axes[0].axhline(200, color="k", ls="--", lw=1, label="target 200 MB/s")
    axes[0].set_xticks(range(len(cases)), cases, fontsize=8)
    axes[0].set_ylabel("key group crossing, MB per CPU second")
    axes[0].set_title("snapshot + install of one key group")
    axes[0].legend(fontsize=8)
    recs = results["records"]
    names = ["put_per_s", "get_per_s", "reduce_per_s", "zipf_reduce_per_s"]
    for i, r in enumerate(recs):
        axes[1].bar([x + (i - 0.5) * 0.4 for x in range(len(names))],
                    [r[n] for n in names], 0.4, label=r["backend"])
    axes[1].set_xticks(range(len(names)), ["ValueState put", "ValueState get",
                                           "reduce path get+put", "reduce path, Zipf keys"])
    axes[1].set_ylabel("records / CPU second")
    axes[1].set_title("per record")
    axes[1].legend(fontsize=8)
    fig.suptitle(render.load_title(results))
    render.save_figure(fig, path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = cli.parser(__doc__, "state_backend")
    ap.add_argument("--sizes-mb", help="state sizes, comma-separated (100,1000; quick 50)")
    ap.add_argument("--groups", type=int, default=16, help="key groups holding the state (16)")
    ap.add_argument("--measured", type=int, help="key groups timed per direction (4; quick 2)")
    ap.add_argument("--value-bytes", type=int, default=1000, help="bytes per value (1000)")
    ap.add_argument("--ops", type=int, help="records per per-record test (200,000; quick 50,000)")
    ap.add_argument("--cache-mb", type=int, default=256, help="RocksDB block cache per task")
    ap.add_argument("--write-buffer-mb", type=int, default=64,
                    help="RocksDB memtables per task")
    ap.add_argument("--dir", default=None, help="where RocksDB directories go (a temp dir)")
    args = ap.parse_args(argv)
    cli.fill_defaults(args, DEFAULTS)
    args.sizes_mb = [int(x) for x in cli.comma_list(args.sizes_mb)]
    args.out = cli.out_dir(args, "state_backend")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = provenance.begin(__file__, argv)
    results["config"] = dict(vars(args))
    root = tempfile.mkdtemp(prefix="reflow-state-bench-", dir=args.dir)
    mk = _Backends(root, args.cache_mb, args.write_buffer_mb)
    try:
        results["records"] = records(args, mk)
        results["crossing"] = crossing(args, mk)
    finally:
        for b in mk.made:
            b.close()
        shutil.rmtree(root, ignore_errors=True)
    results["summary"] = {
        "min_crossing_mb_cpu_s": {k: min(r["crossing_mb_cpu_s"] for r in results["crossing"]
                                         if r["from"] == r["to"] == k)
                                  for k in (MEMORY, ROCKSDB)},
        "median_crossing_mb_cpu_s": {k: statistics.median(
            r["crossing_mb_cpu_s"] for r in results["crossing"] if r["from"] == r["to"] == k)
            for k in (MEMORY, ROCKSDB)}}
    provenance.finish(results)
    render.write_outputs(args.out, results, markdown=markdown(results),
                         png="state_backend.png", plot=plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
