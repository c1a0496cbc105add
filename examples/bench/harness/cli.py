"""The command-line arguments benchmarks share, and their (full, quick) defaults.

Why: ``--quick``, ``--out`` and the rescale run's phases and stability rule mean the same in
every benchmark; declaring them once keeps their names, meaning and help text alike.

A *defaults table* maps an argument's dest to ``(full, quick)``; ``fill_defaults`` sets
every argument still None from it, so an explicit value always wins over ``--quick``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

from examples.bench.harness import OUT_ROOT, ROOT

Defaults = Mapping[str, tuple[Any, Any]]

#: the rescale run's phases and stability rule: (dest, flag help)
RESCALE_RUN_HELP = {
    "build": "seconds of state building from deployment, at least",
    "baseline": "baseline seconds before the request",
    "after": "seconds after the request returned",
    "stable": "stability window of the scaling period, s",
}


def parser(doc: str, name: str, prog: str | None = None) -> argparse.ArgumentParser:
    """A parser described by ``doc``'s first line, with ``--quick`` and ``--out`` (default
    ``examples/bench/out/<name>``)."""
    ap = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a small, short smoke run")
    ap.add_argument("--out", help=f"output directory (default "
                                  f"{os.path.relpath(os.path.join(OUT_ROOT, name), ROOT)})")
    return ap


def _both(defaults: Defaults, dest: str) -> str:
    full, quick = defaults[dest]
    return f" ({full:g}; quick {quick:g})"


def add_rescale_run(ap: argparse.ArgumentParser, defaults: Defaults, *,
                    coverage: float | None, key_groups: str = "128") -> None:
    """``--build``, ``--baseline``, ``--after``, ``--stable`` (defaults from ``defaults``),
    ``--coverage`` (default ``coverage``; None: off), ``--tolerance``, ``--slack-ms``,
    ``--key-groups`` (its default described by ``key_groups``) and ``--settle-max``."""
    for dest, text in RESCALE_RUN_HELP.items():
        ap.add_argument("--" + dest, type=int if dest == "stable" else float,
                        help=text + _both(defaults, dest))
    ap.add_argument("--coverage", type=float, default=coverage,
                    help="build state until this share of the keys was seen (uniform keys), "
                         "and at least --build s" + ("" if coverage is None else
                                                     f" (default {coverage:g})"))
    ap.add_argument("--tolerance", type=float, default=1.10,
                    help="stable: per-second mean <= this x the baseline level (+ slack)")
    ap.add_argument("--slack-ms", type=float, default=5.0,
                    help="added to the stability limit (absorbs per-second jitter; 0: strict)")
    ap.add_argument("--key-groups", type=int, help=f"key groups ({key_groups})")
    ap.add_argument("--settle-max", type=float, default=30.0,
                    help="after --build, wait until no backlog of the build is left (the "
                         "sources hold at most 0.2 s of input due and unread, and the last "
                         "3 s each have a mean latency within 1.25x the lowest since the "
                         "build + 5 ms) for at most this many seconds before the baseline "
                         "(default 30; 0: do not wait)")


def fill_defaults(args: argparse.Namespace, defaults: Defaults) -> None:
    """Every attribute named in ``defaults`` that is None gets its full or quick default."""
    q = 1 if getattr(args, "quick", False) else 0
    for dest, pair in defaults.items():
        if getattr(args, dest, None) is None:
            setattr(args, dest, pair[q])


def comma_list(text: str | None) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``; None -> ``[]``."""
    return [x.strip() for x in (text or "").split(",") if x.strip()]


def out_dir(args: argparse.Namespace, *parts: str) -> str:
    """``args.out``, or ``examples/bench/out/<parts...>``."""
    return args.out or os.path.join(OUT_ROOT, *parts)


#: ``--state-backend``'s choices: one backend, or "both" (every run once per backend,
#: alternated, reported side by side)
STATE_BACKENDS = ("memory", "rocksdb")
BOTH = "both"


def add_state_backend(ap: argparse.ArgumentParser) -> None:
    """``--state-backend {memory,rocksdb,both}`` (default memory), ``--state-dir`` and
    ``--state-memory-mb`` (``JobConfig.state_dir``/``state_memory_bytes`` of a RocksDB
    run), and ``--state-gb`` (the state's size in GB, where the benchmark takes one)."""
    ap.add_argument("--state-backend", choices=(*STATE_BACKENDS, BOTH), default="memory",
                    help="JobConfig(state_backend=...) of every job; 'both': each run once "
                         "per backend, alternated, side by side in the results (memory)")
    ap.add_argument("--state-gb", type=float, nargs="+",
                    help="logical keyed state in GB (decimal); overrides the benchmark's own "
                         "size option")
    ap.add_argument("--state-dir", help="JobConfig(state_dir=...) of RocksDB runs (default: "
                                        "the system's temporary directory)")
    ap.add_argument("--state-memory-mb", type=int,
                    help="JobConfig(state_memory_bytes=n MB) per RocksDB task (default: the "
                         "engine's, 128)")


def state_backends(args: argparse.Namespace) -> list[str]:
    """The backends ``--state-backend`` asks for, in the order runs alternate."""
    return list(STATE_BACKENDS) if args.state_backend == BOTH else [args.state_backend]


def state_fields(args: argparse.Namespace, backend: str) -> dict[str, Any]:
    """``JobConfig`` fields for a run on ``backend`` (from ``add_state_backend``'s args)."""
    out: dict[str, Any] = {"state_backend": backend}
    if backend == "rocksdb":
        if args.state_dir:
            out["state_dir"] = args.state_dir
        if args.state_memory_mb:
            out["state_memory_bytes"] = args.state_memory_mb << 20
    return out
