"""Timers on the state backends: registered and fired per CPU second, and the Python memory
they hold (in-memory backend: every timer; RocksDB: its caches, ``engine.state.rocksdb_timers``).

    python examples/bench/timer_backend.py                # 200,000 timers, ~1 min
    python examples/bench/timer_backend.py --quick        # 50,000 timers
    python examples/bench/timer_backend.py --timers 1000000 --timer-cache-mb 1

What it does, per backend, one process, no Ray, 128 key groups owned by the one backend:

* ``register``: ``--timers`` timers, one per key (``set_current`` then ``register_timer``,
  event time, times spread over 100,000 ms in a scrambled order), as a keyed process
  function registers them;
* ``fire``: ``pop_due_timers`` up to the watermark in ``--steps`` steps (each fires the
  timers due by then, in order), as watermarks advancing do;
* ``churn``: ``--timers`` times register a timer and delete it again (timers a function
  sets and cancels);
* ``memory``: the Python memory (tracemalloc, a second pass with tracing on) the backend
  holds after ``register``, and the RocksDB backend's timer cache.

Rates are timers per CPU second of the calling thread (the machine is shared; wall-clock
rates in the JSON). Writes ``examples/bench/out/timer_backend/results.json``, ``summary.md``
(also printed) and ``timer_backend.png``.
"""

# ruff: noqa: E402  (the repository root goes on sys.path before reflow's imports)
from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time
import tracemalloc
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from engine.state.keyed import EVENT_TIME, KeyedStateBackend
from engine.state.rocksdb import RocksDBKeyedStateBackend
from examples.bench.harness import cli, provenance, render
from examples.bench.harness.render import fmt, md_table

NUM_KEY_GROUPS = 128
SPAN_MS = 100_000
DEFAULTS: dict[str, tuple[Any, Any]] = {"timers": (200_000, 50_000)}
MEMORY, ROCKSDB = "memory", "rocksdb"


def _new(kind: str, root: str, args: argparse.Namespace) -> KeyedStateBackend:
    if kind == MEMORY:
        b = KeyedStateBackend(NUM_KEY_GROUPS)
    else:
        b = RocksDBKeyedStateBackend(NUM_KEY_GROUPS, tempfile.mkdtemp(dir=root), task="bench",
                                     block_cache_bytes=64 << 20, write_buffer_bytes=32 << 20,
                                     timer_cache_bytes=args.timer_cache_mb << 20)
    for kg in range(NUM_KEY_GROUPS):
        b.own(kg)
    return b


def _register(b: KeyedStateBackend, n: int) -> None:
    for i in range(n):
        b.set_current(f"key-{i}", i % NUM_KEY_GROUPS)
        b.register_timer((i * 7919) % SPAN_MS, EVENT_TIME)


def measure(kind: str, root: str, args: argparse.Namespace) -> dict[str, Any]:
    n = args.timers
    clock = time.thread_time
    b = _new(kind, root, args)
    try:
        w0, t0 = time.perf_counter(), clock()
        _register(b, n)
        w1, t1 = time.perf_counter(), clock()
        fired = 0
        step = SPAN_MS // args.steps
        for at in range(step, SPAN_MS + step, step):
            for _ in b.pop_due_timers(at, EVENT_TIME):
                fired += 1
        w2, t2 = time.perf_counter(), clock()
        assert fired == n, (kind, fired, n)
        for i in range(n):
            b.set_current(f"key-{i}", i % NUM_KEY_GROUPS)
            b.register_timer(SPAN_MS + i % 1000, EVENT_TIME)
            b.delete_timer(SPAN_MS + i % 1000, EVENT_TIME)
        w3, t3 = time.perf_counter(), clock()
        assert b.next_timer(EVENT_TIME) is None
    finally:
        b.close()
        shutil.rmtree(getattr(b, "directory", root + "/none"), ignore_errors=True)
    # the memory held, in a second pass with tracing on (tracing slows every allocation)
    b = _new(kind, root, args)
    try:
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        _register(b, n)
        held = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        cache = b.timer_cache_bytes() if isinstance(b, RocksDBKeyedStateBackend) else None
    finally:
        b.close()
        shutil.rmtree(getattr(b, "directory", root + "/none"), ignore_errors=True)
    row = {"backend": kind, "timers": n, "register_per_s": n / (t1 - t0),
           "fire_per_s": n / (t2 - t1), "churn_per_s": n / (t3 - t2),
           "register_per_wall_s": n / (w1 - w0), "fire_per_wall_s": n / (w2 - w1),
           "churn_per_wall_s": n / (w3 - w2), "python_mb": held / 2**20,
           "cache_mb": None if cache is None else cache / 2**20}
    print(f"{kind}: register {row['register_per_s']:,.0f}/CPU s, fire "
          f"{row['fire_per_s']:,.0f}/CPU s, register+delete {row['churn_per_s']:,.0f}/CPU s; "
          f"Python memory after registering {row['python_mb']:.2f} MB", flush=True)
    return row


def markdown(results: dict[str, Any]) -> str:
    rows = results["rows"]
    lines = [f"# Timers on the state backends ({render.load_title(results)})", "",
             f"`{results['command']}`", "",
             f"{rows[0]['timers']:,} timers over {NUM_KEY_GROUPS} key groups, one per key; "
             "timers per CPU second of the calling thread.", "",
             *md_table(["backend", "register /CPU s", "fire /CPU s", "register+delete /CPU s",
                        "Python memory held (MB)", "timer cache, as accounted (MB)"],
                       [[r["backend"], fmt(r["register_per_s"], ",.0f"),
                         fmt(r["fire_per_s"], ",.0f"), fmt(r["churn_per_s"], ",.0f"),
                         fmt(r["python_mb"], ",.2f"), fmt(r["cache_mb"], ",.2f")]
                        for r in rows]), ""]
    mem = next((r for r in rows if r["backend"] == MEMORY), None)
    rocks = next((r for r in rows if r["backend"] == ROCKSDB), None)
    if mem and rocks:
        lines += [f"RocksDB / memory: register {rocks['register_per_s'] / mem['register_per_s']:.2f}x, "
                  f"fire {rocks['fire_per_s'] / mem['fire_per_s']:.2f}x, register+delete "
                  f"{rocks['churn_per_s'] / mem['churn_per_s']:.2f}x; memory held "
                  f"{rocks['python_mb']:.2f} MB against {mem['python_mb']:.1f} MB.", ""]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: str) -> None:
    plt = render.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    rows = results["rows"]
    names = ["register_per_s", "fire_per_s", "churn_per_s"]
    for i, r in enumerate(rows):
        axes[0].bar([x + (i - 0.5) * 0.4 for x in range(len(names))], [r[n] for n in names],
                    0.4, label=r["backend"])
    axes[0].set_xticks(range(len(names)), ["register", "fire", "register+delete"])
    axes[0].set_ylabel("timers / CPU second")
    axes[0].legend(fontsize=8)
    axes[1].bar([r["backend"] for r in rows], [r["python_mb"] for r in rows])
    axes[1].set_ylabel(f"Python memory held by {rows[0]['timers']:,} timers (MB)")
    fig.suptitle(render.load_title(results))
    render.save_figure(fig, path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = cli.parser(__doc__, "timer_backend")
    ap.add_argument("--timers", type=int, help="timers registered (200,000; quick 50,000)")
    ap.add_argument("--steps", type=int, default=100, help="watermark steps firing them (100)")
    ap.add_argument("--timer-cache-mb", type=int, default=4,
                    help="the RocksDB backend's timer cache (4 MB: a 128 MB state_memory_bytes)")
    ap.add_argument("--dir", default=None, help="where RocksDB directories go (a temp dir)")
    args = ap.parse_args(argv)
    cli.fill_defaults(args, DEFAULTS)
    args.out = cli.out_dir(args, "timer_backend")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = provenance.begin(__file__, argv)
    results["config"] = dict(vars(args))
    root = tempfile.mkdtemp(prefix="reflow-timer-bench-", dir=args.dir)
    try:
        results["rows"] = [measure(kind, root, args) for kind in (MEMORY, ROCKSDB)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    provenance.finish(results)
    render.write_outputs(args.out, results, markdown=markdown(results),
                         png="timer_backend.png", plot=plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
