"""The steady rows job's real task cores in one process, no Ray: CPU per record, per task.

Why: on a shared 2-core machine a Ray run's records per CPU-second move with the load, and
a profiler attached to a task actor sees the event loop and the scheduler as much as the
task. Here the job of ``examples/bench/steady.py`` (rows variant) is deployed as the
JobMaster deploys it (``plan_physical`` + ``initial_deployment`` + ``connect_messages``),
and its ``TaskCore`` objects (the real operator chain, ``OutputRouter``, frame codec,
``InputChannel`` reorder buffers and the ``LatencySink`` writer) are driven as their
actors drive them: the source task polls ``source_poll_records`` records per pass and
flushes what lingers, every frame in its outbox is handed to its target's ``receive``, a
count task steps up to 8 frames per pass, and the frames it consumed are acknowledged
(the list cleared). What is left out is the actors' shell: the event loop, the socket and
its acknowledgement messages, credits, metrics polls.

The CPU of each task is measured apart (``time.thread_time`` around each of its calls),
so ``source_us`` and ``count_us`` are µs of CPU per record of that task; ``cProfile``
(``profile=True``) attributes it to functions.

    python -m examples.bench.harness.inproc --parallelism 1 2 --records 1000000 [--profile]
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import dataclasses
import io
import pstats
import tempfile
import time
from typing import Any

from engine.dataflow.config import JobConfig
from engine.dataflow.deployment import (
    ChannelIds,
    connect_messages,
    initial_deployment,
    start_messages,
)
from engine.dataflow.physical import plan_physical
from engine.io.sinks import LatencySink
from engine.task.core import TaskCore
from engine.task.spec import TaskSpec
from engine.time import SystemClock
from engine.wire.messages import decode_message, encode_message


def _wire(msg: Any) -> Any:
    return decode_message(encode_message(msg))


def build_cores(parallelism: int, records: int, config: JobConfig | None = None,
                ) -> tuple[list[TaskCore], list[TaskCore], JobConfig]:
    """The steady rows job's source and count cores (``config``: the job's, default
    ``JobConfig()``), connected and started."""
    from examples.bench import steady  # the job's own definition

    config = dataclasses.replace(config or JobConfig(), metrics_port=None)
    sink = LatencySink(tempfile.mkdtemp(prefix="reflow-inproc-"))
    job = steady.build(parallelism, 1, steady.source(None, records, None), sink, config)
    dep = initial_deployment(plan_physical(job.graph()), "inproc")
    clock = SystemClock()
    cores: dict[str, TaskCore] = {}
    for v in dep.plan.vertices:
        for i, name in enumerate(dep.tasks[v.name]):
            spec = copy.deepcopy(TaskSpec.of(dep, v.name, i, name, config))
            cores[name] = TaskCore(spec, clock)
    for name, msg in connect_messages(dep, ChannelIds()).items():
        cores[name].handle(_wire(msg))
    starts = start_messages(dep)
    for v in reversed(dep.plan.vertices):
        for name in dep.tasks[v.name]:
            cores[name].handle(_wire(starts[name]))
    sources = [c for c in cores.values() if c.is_source]
    others = [c for c in cores.values() if not c.is_source]
    return sources, others, config


def run(parallelism: int, records: int, profile: bool = False,
        config: JobConfig | None = None) -> dict[str, Any]:
    """Drive the job to its end; CPU µs per record of the source and of the count tasks,
    frames sent, and with ``profile`` the cProfile statistics (text)."""
    sources, counts, config = build_cores(parallelism, records, config)
    by_name = {c.name: c for c in (*sources, *counts)}
    cpu = {c.name: 0.0 for c in by_name.values()}
    frames = 0
    prof = cProfile.Profile() if profile else None
    tt = time.thread_time
    poll = config.source_poll_records
    if prof is not None:
        prof.enable()
    wall = time.perf_counter()
    while any(c.status == "running" for c in by_name.values()):
        for s in sources:
            t = tt()
            s.poll_source(poll)
            s.flush_due()
            cpu[s.name] += tt() - t
        for core in (*sources, *counts):
            out = core.router.outbox
            while out:
                f = out.popleft()
                frames += 1
                target = by_name[f.target]
                t = tt()
                target.receive(f.channel_id, f.seq, f.payload)
                cpu[target.name] += tt() - t
        for c in counts:
            t = tt()
            for _ in range(8):
                if not c.step():
                    break
            c.flush_due()
            c.consumed.clear()
            cpu[c.name] += tt() - t
    wall = time.perf_counter() - wall
    if prof is not None:
        prof.disable()
    src_s = sum(cpu[s.name] for s in sources)
    cnt_s = sum(cpu[c.name] for c in counts)
    result: dict[str, Any] = {
        "parallelism": parallelism, "records": records, "frames": frames,
        "records_at_count_tasks": sum(c.records_in for c in counts),
        "frame_bytes_per_record": sum(s.router.bytes_out for s in sources) / records,
        "source_us": src_s / records * 1e6, "count_us": cnt_s / records * 1e6,
        "total_us": (src_s + cnt_s) / records * 1e6,
        "records_per_cpu_s": records / (src_s + cnt_s), "wall_s": wall}
    if prof is not None:
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(35)
        result["profile"] = text.getvalue()
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parallelism", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)
    for _ in range(args.repeats):
        for p in args.parallelism:
            r = run(p, args.records)
            print(f"p={p}: {r['total_us']:.3f} us/record (source {r['source_us']:.3f}, "
                  f"count {r['count_us']:.3f}), {r['records_per_cpu_s']:,.0f} records per "
                  f"CPU-s, {r['frames']} frames", flush=True)
    if args.profile:
        for p in args.parallelism:
            r = run(p, args.records, profile=True)
            print(f"--- profile p={p}\n{r['profile']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
