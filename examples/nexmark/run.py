"""Run one NEXMark query on reflow, print a summary and check its whole output against reference.py.

    python examples/nexmark/run.py --query q7 --events 200000 --rate 20000 --parallelism 2
    python examples/nexmark/run.py --query q7 --sliding --size-ms 10000 --slide-ms 2000
    python examples/nexmark/run.py --query q8 --events 50000 --parallelism 4 --key-groups 64
    ray job submit --working-dir . -- python examples/nexmark/run.py --query q5 --events 100000

Queries: q1, q2, q5, q7, q8 (``examples/nexmark/queries.py``). The source is a bounded
``NexmarkSource`` of ``--events`` events with record timestamps = the events' ``date_time``.

* ``--rate R``: open loop at R events/s; record timestamps are the scheduled emission times
  (anchored when the source task starts), so windows are over wall-clock time and the latency
  of a result is sink arrival - window end (Q1/Q2: - the bid's scheduled time). With
  ``--check`` as well, event time = the schedule fixed when the job is built
  (``NexmarkSource.realtime``, event 0 due ``--lead-s`` later) so that the reference can
  compute the same windows. Without ``--rate`` the source runs at full speed and event time is
  the data's ``date_time`` advancing at ``--event-rate`` events/s (default 1,000: the default
  100,000 events span 100 s of event time, ten 10-second windows, not one); then the
  windowed queries' sink latency is meaningless and only the engine's latency markers (source
  -> sink, queueing only) are printed.
* Windows: Q5 ``--size-ms`` (10,000) / ``--slide-ms`` (2,000); Q7 and Q8 tumbling
  ``--size-ms`` windows, sliding with ``--sliding`` (slide ``--slide-ms``, default 2,000).
* State: ``--hold`` makes Q7's first stage hold every bid of its windows
  (``build_q7(hold_bids=True)``) and Q8's join hold the persons' and auctions' padding
  (``build_q8(hold_extra=...)``); ``--person-bytes``/``--auction-bytes``/``--bid-bytes`` set
  the generator's ``avg_*_byte_size`` (the ``extra`` padding). The results are the same;
  ``--check`` checks it.
* The verdict (always, unless ``--no-check``): every output is collected
  (``engine.io.testing.TestingSink``, files on this machine) and the whole of it compared with
  ``reference.py`` run on the same events (sorted where the reference sorts; Q1/Q2 as
  multisets at parallelism > 1); prints ``result: OK`` with how many results and windows it
  checked, or ``result: MISMATCH`` with what differs and exits 1. A run whose reference has
  no result at all is a mismatch too (it would check nothing). ``--no-check`` (e.g. a long
  open-loop run, whose outputs would fill the disk) prints ``result: not checked``.

Prints records in/out, throughput (events / time from deployment to the end of the job) and
latency percentiles (``engine.io.sinks.LatencySink``, plus the marker latency from the job
metrics).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from engine import JobConfig, LatencySink, StreamJob, TestingSink  # noqa: E402
from examples.nexmark import queries  # noqa: E402
from examples.nexmark.generator import NexmarkConfig  # noqa: E402
from examples.nexmark.source import NexmarkSource  # noqa: E402

QUERIES = ("q1", "q2", "q5", "q7", "q8")
WINDOWED = ("q5", "q7", "q8")


def init_ray() -> None:
    """Connect to Ray. Locally (no ``RAY_ADDRESS``, not a submitted job) a cluster is started
    with the repo root on the workers' ``PYTHONPATH`` so they can import ``examples.nexmark``;
    under ``ray job submit --working-dir .`` the working directory already is on it."""
    import ray

    from engine.runtime import NAMESPACE, local_ray

    if ray.is_initialized():
        return
    if local_ray.submitted():
        local_ray.connect(namespace=NAMESPACE, log_to_driver=True, configure_logging=False)
    else:
        path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
        local_ray.connect(namespace=NAMESPACE, log_to_driver=True, configure_logging=False,
                          runtime_env={"env_vars": {"PYTHONPATH": path}})


def window_params(args: argparse.Namespace) -> dict[str, int]:
    if args.query == "q5":
        return {"size_ms": args.size_ms or 10_000, "slide_ms": args.slide_ms or 2_000}
    if args.query in ("q7", "q8"):
        size = args.size_ms or 10_000
        return {"size_ms": size, "slide_ms": (args.slide_ms or 2_000) if args.sliding else size}
    return {}


def sizes(args: argparse.Namespace) -> dict[str, int]:
    """The generator's ``avg_*_byte_size`` the arguments set (the others: its defaults)."""
    return {f"avg_{kind}_byte_size": getattr(args, f"{kind}_bytes")
            for kind in ("person", "auction", "bid")
            if getattr(args, f"{kind}_bytes") is not None}


def hold_params(args: argparse.Namespace) -> dict[str, object]:
    """``build_q7``/``build_q8``'s holding arguments for ``--hold``."""
    if not args.hold:
        return {}
    return ({"hold_bids": True} if args.query == "q7"
            else {"hold_extra": ("persons", "auctions")})


def make_source(args: argparse.Namespace) -> NexmarkSource:
    if args.rate and not args.no_check:
        # the reference must know the record timestamps: event time = the schedule, fixed now
        config = NexmarkConfig(seed=args.seed, **sizes(args))
        return NexmarkSource.realtime(config, rate=args.rate, num_events=args.events,
                                      lead_s=args.lead_s, split_events=args.split_events)
    if args.rate:
        # timestamps = scheduled emission times, anchored when the source task starts
        config = NexmarkConfig(seed=args.seed, first_event_rate=args.rate, **sizes(args))
        return NexmarkSource(config, event_time=False, rate=args.rate, num_events=args.events,
                             split_events=args.split_events)
    # full speed: Q1/Q2 do not need event time, so their timestamps are the poll time and the
    # sink latency stays meaningful; the windowed queries need the events' date_time
    config = NexmarkConfig(seed=args.seed, first_event_rate=args.event_rate, **sizes(args))
    return NexmarkSource(config, event_time=args.query in WINDOWED, num_events=args.events,
                         split_events=args.split_events)


class MetricsPoller(threading.Thread):
    """Keeps the last ``JobHandle.metrics()`` snapshot of every task (finished tasks leave
    the job's snapshots, so the last one seen is kept)."""

    def __init__(self, handle, interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.handle = handle
        self.interval = interval
        self.tasks: dict[str, object] = {}
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval)

    def poll(self) -> None:
        try:
            m = self.handle.metrics()
        except Exception:  # the job ended meanwhile
            return
        for t in m.tasks:
            self.tasks[t.task] = t

    def stop(self) -> None:
        self._stop.set()


def marker_latency(tasks) -> dict[str, float] | None:
    from engine.observability import LatencyHistogram

    h = LatencyHistogram()
    for t in tasks:
        h.merge(LatencyHistogram.from_wire(t.latency))
    if h.count == 0:
        return None
    return {"p50_ms": h.quantile(0.5), "p99_ms": h.quantile(0.99), "max_ms": h.max}


def windows_of(query: str, results: list) -> int:
    """How many windows ``results`` (in the reference's form) cover (0 for Q1/Q2)."""
    if query == "q8":
        return len({r[2] for r in results})
    if query in WINDOWED:
        return len({r[0] for r in results})
    return 0


def compare(query: str, got: list, expected: list, parallelism: int) -> tuple[bool, str]:
    """Whether the whole output ``got`` equals the reference's ``expected``, and what was
    checked or what differs. An empty reference fails: the run would check nothing."""
    if not expected:
        return False, ("the reference has no result for these events (raise --events, or "
                       "lower --event-rate or the window size): nothing would be checked")
    if query in ("q1", "q2") and parallelism > 1:
        ok = Counter(got) == Counter(expected)
    else:
        ok = got == expected
    if ok:
        w = windows_of(query, expected)
        return True, (f"all {len(got):,} results equal the reference"
                      + (f" ({w:,} windows)" if w else ""))
    g, e = Counter(got), Counter(expected)
    missing, extra = list((e - g).elements()), list((g - e).elements())
    return False, (f"{len(got):,} results vs {len(expected):,} expected; {len(missing)} missing "
                   f"(e.g. {missing[:3]}), {len(extra)} unexpected (e.g. {extra[:3]})")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--query", required=True, choices=QUERIES)
    ap.add_argument("--events", type=int, default=100_000, help="events (all kinds)")
    ap.add_argument("--rate", type=float, default=None,
                    help="open-loop events/s with event time = wall clock (default: full speed)")
    ap.add_argument("--event-rate", type=float, default=1_000.0,
                    help="event-time events/s of the data at full speed (first_event_rate; "
                         "default 1000: 100,000 events span 100 s, ten 10-second windows)")
    ap.add_argument("--parallelism", type=int, default=2, help="of the query's operators")
    ap.add_argument("--source-parallelism", type=int, default=1,
                    help="source tasks (more than one makes an open-loop source bursty per "
                         "task; see examples/nexmark/source.py)")
    ap.add_argument("--key-groups", type=int, default=128)
    ap.add_argument("--sliding", action="store_true", help="Q7/Q8: sliding windows")
    ap.add_argument("--size-ms", type=int, default=None)
    ap.add_argument("--slide-ms", type=int, default=None)
    ap.add_argument("--buckets", type=int, default=queries.Q7_BUCKETS, help="Q7 price buckets")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--split-events", type=int, default=4096,
                    help="block size of the source's task split")
    ap.add_argument("--lead-s", type=float, default=10.0,
                    help="with --rate: event 0 is due this long after the job is built")
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--linger-ms", type=float, default=5.0)
    ap.add_argument("--timeout", type=float, default=3600.0, help="give up after (s)")
    ap.add_argument("--hold", action="store_true",
                    help="Q7: hold the windows' bids; Q8: the join holds the events' padding")
    for kind in ("person", "auction", "bid"):
        ap.add_argument(f"--{kind}-bytes", type=int,
                        help=f"NexmarkConfig(avg_{kind}_byte_size=n): the {kind}s' padding")
    ap.add_argument("--check", action="store_true",
                    help="compare the whole output with reference.py (the default)")
    ap.add_argument("--no-check", action="store_true",
                    help="do not collect and check the output (long open-loop runs)")
    args = ap.parse_args(argv)
    if args.check and args.no_check:
        ap.error("--check and --no-check exclude each other")
    if args.events < 1:
        ap.error("--events must be >= 1")
    if args.sliding and args.query not in ("q7", "q8"):
        ap.error("--sliding applies to q7 and q8 (q5 always slides)")
    if args.hold and args.query not in ("q7", "q8"):
        ap.error("--hold applies to q7 and q8")

    params = window_params(args)
    source = make_source(args)
    latency = LatencySink()
    collect = None if args.no_check else TestingSink()
    sinks = [latency] + ([collect] if collect is not None else [])
    job = StreamJob(f"nexmark-{args.query}", num_key_groups=args.key_groups,
                    parallelism=args.parallelism,
                    config=JobConfig(batch_size=args.batch_size, linger_ms=args.linger_ms))
    extra = {"buckets": args.buckets} if args.query == "q7" else {}
    extra.update(hold_params(args))
    queries.build(args.query, job, source, sinks, parallelism=args.parallelism,
                  source_parallelism=args.source_parallelism, **params, **extra)

    init_ray()
    started = time.time()
    handle = job.run()
    deployed = time.time()
    windows = " ".join(f"{k}={v}" for k, v in params.items())
    print(f"job {handle.job_id} running ({args.query}{' sliding' if args.sliding else ''}"
          f"{' ' + windows if windows else ''}, parallelism {args.parallelism}); "
          f"metrics at {handle.metrics_url}")
    poller = MetricsPoller(handle)
    poller.start()
    try:
        handle.wait(args.timeout)
    finally:
        poller.stop()
        handle.stop()
    ended = time.time()
    records_in = sum(source.with_kinds(k).count()[k] for k in
                     (("persons", "auctions") if args.query == "q8" else ("bids",)))
    s = latency.summary()
    first_due = deployed
    if source.start_time_ms is not None:  # --rate --check: event 0 was due at a fixed time
        first_due = max(deployed, source.start_time_ms / 1000.0)
        if deployed > source.start_time_ms / 1000.0:
            print(f"note: the job was deployed {deployed - source.start_time_ms / 1000.0:.1f} s "
                  "after event 0 was due (raise --lead-s); latency includes the catch-up")
    busy = max(1e-9, ended - first_due)
    print(f"events:          {args.events:,} ({records_in:,} {args.query} input records)")
    print(f"records out:     {s['count']:,}")
    print(f"deploy:          {deployed - started:.1f} s")
    print(f"throughput:      {args.events / busy:,.0f} events/s over {busy:.1f} s"
          + (f" (open loop at {args.rate:,.0f} events/s)" if args.rate else " (full speed)"))
    if source.rate or not source.event_time:
        print(f"latency (ms):    p50 {_fmt(s['p50_ms'])}  p99 {_fmt(s['p99_ms'])}  "
              f"max {_fmt(s['max_ms'])}   (sink arrival - "
              f"{'window end' if args.query in WINDOWED else 'scheduled/poll time'})")
    else:
        print("latency (ms):    - (full speed: event time is not wall-clock time; use --rate)")
    markers = marker_latency(poller.tasks.values())
    if markers:
        print(f"marker latency:  p50 {_fmt(markers['p50_ms'])}  p99 {_fmt(markers['p99_ms'])}  "
              f"max {_fmt(markers['max_ms'])} ms (source -> sink, queueing only)")
    if collect is None:
        print("result: not checked (--no-check)")
        return 0
    got = queries.sort_results(args.query, collect.results())
    expected = queries.reference_results(args.query, source, **params)
    ok, detail = compare(args.query, got, expected, args.parallelism)
    print(f"result: OK ({detail})" if ok else f"result: MISMATCH ({detail})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
