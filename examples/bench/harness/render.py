"""How benchmarks show their results: numbers, markdown tables, ``results.json``, PNGs.

Why one module: every benchmark writes the same kinds of output into
``examples/bench/out/<name>/`` and prints the same kind of table; one writer keeps the files
alike (JSON indented, non-JSON values as strings, the figure drawn headless).

* ``fmt``: a number or "-" for None. ``md_table``: markdown table lines.
* ``pyplot``: matplotlib's pyplot on the headless Agg backend; ``save_figure``.
* ``write_outputs``: ``results.json``, optionally ``summary.md`` and a PNG, printed paths.

Guarantees: matplotlib is imported only when a figure is drawn; nothing here imports Ray.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from examples.bench.harness import ROOT


def fmt(x: float | None, spec: str = ",.1f") -> str:
    """``x`` formatted with ``spec``; "-" when None."""
    return "-" if x is None else format(x, spec)


def md_table(cols: Sequence[str], rows: Iterable[Sequence[str]],
             left: Iterable[str] = ()) -> list[str]:
    """A markdown table: header, alignment row (columns named in ``left``, and the first,
    left-aligned; the others right-aligned), one line per row."""
    lefts = {cols[0], *left}
    lines = ["| " + " | ".join(cols) + " |",
             "|" + "|".join("---" if c in lefts else "---:" for c in cols) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


def load_range(results: dict[str, Any]) -> str:
    """"a -> b", the load average at the start and the end of the run ('?' before the end)
    from ``results["machine"]`` (``begin``/``finish`` format)."""
    m = results["machine"]
    end = m.get("loadavg_at_end")
    return f"{m['loadavg_at_start'][0]:.1f} -> " + ("?" if end is None else f"{end[0]:.1f}")


def run_line(results: dict[str, Any]) -> str:
    """"Run <date> · `<command>` · <platform>, N CPUs, Python x · load average a -> b ·
    T s": the first line of a papers script's summary (``results["date"]`` set by it)."""
    m = results["machine"]
    return (f"Run {results['date']} · `{results['command']}` · {m['platform']}, "
            f"{m['cpus']} CPUs, Python {m['python']} · load average {load_range(results)} · "
            f"{results.get('total_seconds', 0):.0f} s")


def load_title(results: dict[str, Any]) -> str:
    """"N CPUs, load a -> b" from ``results["machine"]`` (``begin``/``finish`` format)."""
    m = results["machine"]
    end = m.get("loadavg_at_end")
    return (f"{m['cpus']} CPUs, load {m['loadavg_at_start'][0]:.1f}"
            + ("" if end is None else f" -> {end[0]:.1f}"))


def write_outputs(out_dir: str, results: dict[str, Any], *, markdown: str | None = None,
                  png: str | None = None,
                  plot: Callable[[dict[str, Any], str], None] | None = None) -> list[str]:
    """Write ``out_dir/results.json``, ``summary.md`` (when ``markdown``, also printed) and
    ``png`` drawn by ``plot(results, path)``; print and return the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, "results.json")]
    with open(paths[0], "w") as f:
        json.dump(results, f, indent=1, default=str)
    if markdown is not None:
        paths.append(os.path.join(out_dir, "summary.md"))
        with open(paths[-1], "w") as f:
            f.write(markdown)
        print()
        print(markdown)
    if png is not None and plot is not None:
        paths.append(os.path.join(out_dir, png))
        plot(results, paths[-1])
    rel = [os.path.relpath(p, ROOT) for p in paths]
    print("wrote " + ", ".join(rel))
    return rel
