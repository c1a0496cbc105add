"""The shared harness of reflow's benchmarks (``examples/bench/*.py``).

Why: every benchmark deploys jobs, runs them through the same phases, reads the same sink
files, judges them by the same rules and writes the same kinds of output; one copy of each
keeps the benchmarks comparable and each script down to what it alone measures.

* ``analysis``: pure numbers from per-second latency rows (scaling period, peaks, dip, gaps,
  percentiles, ratios); ``balance``: per-key-group loads and load-evening assignments.
* ``jobs``: the benchmark jobs' parts (``PaddedCount``, the keyed count pipeline, sinks that
  also log their write times, the generator's key sequence) and reading a ``LatencySink``.
* ``run``: Ray start-up, the progress line, the rescale run loop (deploy, build state,
  baseline, request, after), polling a job to its end, metrics and report snapshots.
* ``procs``, ``profile``: CPU/RSS of a job's actor processes; py-spy on them.
* ``stalls``: per-second stall evidence of a half-load run (in-worker probes, run-queue
  waits); ``hot_keys``: a source that builds keyed state, then updates a hot share of it.
* ``replay``: a timestamped data set replayed open-loop with compressed event times, and a
  latency sink measuring against that schedule (the DRRS paper's Twitch workload).
* ``render``: number formatting, markdown tables, ``results.json`` / ``summary.md`` / PNG.
* ``cli``: the arguments every benchmark shares and their (full, quick) defaults.
* ``provenance``: the command, the code (commit, dirty, hash) and the machine of a run.

Guarantees: importing the package, ``analysis``, ``balance``, ``render`` or ``cli`` starts
nothing and does not import Ray; only ``run`` and ``procs`` talk to Ray.
"""

from __future__ import annotations

import os

from engine import ReflowError

#: the repository root (``examples/bench/harness/`` is three levels below it)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
#: where benchmarks write unless told otherwise (``examples/bench/out/<name>/``)
OUT_ROOT = os.path.join(ROOT, "examples", "bench", "out")


class BenchError(ReflowError, ValueError):
    """A benchmark was given an input it cannot work with; the message names the input and
    what to pass instead. A ``ValueError`` too, as argument checks are."""


class BenchRunError(ReflowError):
    """A benchmark run could not complete (its job failed or never finished, an external
    system it drives failed); the message names the run and what went wrong. The other
    runs of the benchmark are not affected."""
