"""py-spy on a job's actor processes, and where their busy samples went.

Why: the steady-state benchmark's question "where does a task's CPU go?" is answered by
sampling the task actors while the job runs at full speed; Ray workers are separate
processes, so py-spy attaches to their pids (``procs.job_actor_pids``).

* ``profile_pids``: start ``py-spy record --format raw`` on each pid for a while.
* ``summarise_raw_profile``: shares of a raw (collapsed-stack) file: busy vs waiting
  samples, self time by line and function, inclusive time by function, and ``CATEGORIES``
  (what the engine was doing, first matching frame wins).

Needs ``py-spy`` on PATH (and ptrace permission); nothing else here runs anything.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any


def profile_pids(targets: dict[str, int], seconds: float, out_dir: str,
                 gil: bool = False) -> dict[str, Any]:
    """Start ``py-spy record --format raw`` on each pid (``--gil``: only the thread holding
    the GIL, i.e. on-CPU Python); returns {label: (Popen, path)}."""
    procs: dict[str, Any] = {}
    for label, pid in targets.items():
        path = os.path.join(out_dir, f"profile-{label}{'-gil' if gil else ''}.txt")
        cmd = ["py-spy", "record", "--pid", str(pid), "--duration", str(int(seconds)),
               "--format", "raw", "-o", path] + (["--gil"] if gil else [])
        procs[label] = (subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE), path)
    return procs


# Leaf frames where a thread waits rather than runs (py-spy's idle filter does not catch
# them inside Ray workers): the asyncio loop's epoll, Ray's main thread in the C++ core
# worker, the GC thread's and the sync-call threads' condition waits.
WAITING_LEAVES = ("EpollSelector.select", "Worker.main_loop", "Condition.wait", "Future.result")

# Where busy samples go, first match wins (substring of any frame of the stack).
CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("TaskActor.metrics (JobMaster poll, packs state samples)", ("TaskActor.metrics",)),
    ("actor call submit: ActorMethod.remote", ("ActorMethod.remote",)),
    ("actor call receive: TaskActor.push + Ray deserialise",
     ("TaskActor.push", "_private/serialization.py")),
    ("frame encode: encode_frame/pack_fast", ("encode_frame",)),
    ("frame decode: decode_frame/unpack_fast", ("decode_frame",)),
    ("source: GeneratorReader.poll", ("_GeneratorReader.poll",)),
    ("key_by + key groups: _emit_keyed", ("_emit_keyed",)),
    ("latency sink: _LatencyWriter.write", ("_LatencyWriter",)),
    ("map to_pair: StatelessRunner", ("StatelessRunner",)),
    ("reduce: KeyedRunner (incl. user fn)", ("KeyedRunner",)),
    ("acks/credits: _ack_consumed/_await_ack/_send_outbox",
     ("_ack_consumed", "_await_ack", "_send_outbox")),
    ("rest of TaskActor._loop/TaskCore", ("engine/runtime", "engine/task.py")),
    ("asyncio event loop itself", ("asyncio/",)),
]


def _function_of(frame: str) -> str:
    """'f (path/x.py:12)' -> 'f (path/x.py)'."""
    head, sep, tail = frame.rpartition(":")
    return f"{head})" if sep and tail.rstrip(")").isdigit() else frame


def summarise_raw_profile(path: str, top: int = 15) -> dict[str, Any]:
    """Sample shares from a py-spy raw (collapsed-stack) file.

    ``total_samples`` counts every thread sample; ``waiting`` those in a known waiting leaf
    or with no Python frame; the rest are ``busy``. Self time by line and by function, and
    inclusive time by function, are shares of busy samples; ``categories`` splits busy
    samples by what the engine was doing."""
    self_line: dict[str, int] = {}
    self_fn: dict[str, int] = {}
    incl_fn: dict[str, int] = {}
    cats: dict[str, int] = {}
    total = waiting = 0
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if not n.strip().isdigit():
                continue
            count = int(n)
            total += count
            stack = stack.strip()
            frames = stack.split(";") if stack else []
            if not frames or frames[-1].split(" (")[0] in WAITING_LEAVES:
                waiting += count
                continue
            self_line[frames[-1]] = self_line.get(frames[-1], 0) + count
            leaf = _function_of(frames[-1])
            self_fn[leaf] = self_fn.get(leaf, 0) + count
            for fn in {_function_of(fr) for fr in frames}:
                incl_fn[fn] = incl_fn.get(fn, 0) + count
            for name, needles in CATEGORIES:
                if any(nd in fr for fr in frames for nd in needles):
                    cats[name] = cats.get(name, 0) + count
                    break
            else:
                cats["other"] = cats.get("other", 0) + count
    busy = total - waiting

    def rows(c: dict[str, int], k: int = top) -> list[dict[str, Any]]:
        return [{"frame": key, "samples": v, "pct": 100.0 * v / busy if busy else 0.0}
                for key, v in sorted(c.items(), key=lambda kv: -kv[1])[:k]]

    return {"total_samples": total, "waiting_samples": waiting, "busy_samples": busy,
            "busy_pct": 100.0 * busy / total if total else 0.0,
            "categories": rows(cats, len(cats)), "self_by_line": rows(self_line),
            "self_by_function": rows(self_fn), "inclusive_by_function": rows(incl_fn)}


def collect_profiles(procs: dict[str, Any], seconds: float) -> dict[str, Any]:
    """Wait for the ``profile_pids`` recorders (``seconds`` + 30 s at most) and summarise
    each file; a recorder that wrote nothing gives ``{"error": its stderr's tail}``."""
    from examples.bench.harness import ROOT

    out: dict[str, Any] = {}
    for label, (proc, path) in procs.items():
        _, err = proc.communicate(timeout=seconds + 30)
        if os.path.exists(path):
            out[label] = summarise_raw_profile(path)
            out[label]["file"] = os.path.relpath(path, ROOT)
        else:
            out[label] = {"error": err.decode(errors="replace")[-500:]}
    return out
