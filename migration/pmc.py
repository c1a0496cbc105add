"""PMC on Spark: the projected migration costs of every balanced partitioning, by value
iteration as a PySpark job, stored as Parquet for ``assignment="mtm"``.

Why Spark: the expensive part is the transition costs, one optimal matching per pair of
partitionings the MTM connects (the paper's Fig. 9). Each partitioning's row of costs is
independent: Spark computes them in parallel. Value iteration then sweeps until no value
moves by more than the tolerance: on the driver when the rows fit (``collect_limit``),
else with the rows cached on the executors, one Spark job per sweep (broadcast the values,
update every row where it lives, collect one number per partitioning). Local mode by
default (``spark_session``); any master when ``--master`` or ``REFLOW_SPARK_MASTER`` says.

Run it: ``python -m migration.pmc --out DIR`` (``--help`` for the model's options), or
``precompute(spark, model, out)`` from Python. ``ProjectedCosts.load(DIR)`` reads the
result; ``handle.rescale(op, n, assignment="mtm", projected_costs=DIR)`` uses it.

Guarantees: the values equal ``ProjectedCosts.compute`` (the same update, in another
order of summation); the table is written only once value iteration has converged.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import numpy as np

from migration.assignment import GroupWorkload
from migration.sequences import (
    DEFAULT_GAMMA,
    PAPER_TABLE_4,
    PmcModel,
    ProjectedCosts,
    TransitionMatrix,
    bellman,
    iterate,
    transition_row,
    value_iteration,
)


def precompute(spark: Any, model: PmcModel, path: str | None = None, *,
               tolerance: float = 1e-6, max_iterations: int = 10_000,
               slices: int | None = None, collect_limit: int = 20_000_000) -> ProjectedCosts:
    """Compute the projected costs of ``model`` on ``spark`` and, with ``path``, write them
    there (Parquet, see ``migration.sequences``). Returns the table.

    Spark computes every partitioning's row of transition costs in parallel. When all rows
    hold at most ``collect_limit`` costs they are collected and value iteration runs on the
    driver (one Spark job in all); otherwise the rows stay cached on the executors and each
    sweep is a Spark job (broadcast the values, update every row, collect)."""
    sc = spark.sparkContext
    states = model.states()
    shared = sc.broadcast((model, states))
    n = len(states)
    rows = (sc.parallelize(range(n), slices or max(1, min(n, sc.defaultParallelism * 4)))
            .map(lambda i: (i, transition_row(shared.value[0], shared.value[1], i))))
    try:
        if n * n <= collect_limit:
            collected = dict(rows.collect())
            values, iterations = value_iteration([collected[i] for i in range(n)], model.gamma,
                                                 tolerance, max_iterations)
        else:
            values, iterations = _distributed_iteration(sc, rows.cache(), n, model.gamma,
                                                        tolerance, max_iterations)
            rows.unpersist()
    finally:
        shared.unpersist()
    table = ProjectedCosts.of_states(model, states, values.tolist(), iterations)
    if path is not None:
        write(spark, table, path)
    return table


def _distributed_iteration(sc: Any, rows: Any, n: int, gamma: float, tolerance: float,
                           max_iterations: int) -> tuple[np.ndarray, int]:
    """Value iteration with the rows on the executors: one Spark job per sweep."""
    def sweep(values: np.ndarray) -> np.ndarray:
        current = sc.broadcast(values)
        updated = rows.map(lambda r: (r[0], bellman(r[1], current.value, gamma))).collect()
        current.unpersist()
        new = np.zeros(n)
        for i, v in updated:
            new[i] = v
        return new

    return iterate(sweep, n, gamma, tolerance, max_iterations)


def write(spark: Any, table: ProjectedCosts, path: str) -> None:
    """Write ``table`` with Spark (so ``path`` may be any filesystem Spark reaches):
    ``path/costs`` partitioned by parallelism, ``path/meta.parquet`` with the model."""
    rows = [(int(p), [int(e) for e in ends], float(cost))
            for p, r in table.entries.items() for ends, cost in r]
    df = spark.createDataFrame(rows, "parallelism INT, ends ARRAY<INT>, cost DOUBLE")
    df.write.mode("overwrite").partitionBy("parallelism").parquet(f"{path}/costs")
    (spark.createDataFrame([(table.meta_json(),)], "meta STRING").coalesce(1)
     .write.mode("overwrite").parquet(f"{path}/meta.parquet"))


def spark_session(master: str | None = None) -> Any:
    """A SparkSession for the pre-computation: local mode unless ``master`` or
    ``REFLOW_SPARK_MASTER`` names another (the job needs no reflow data source, so not
    ``engine.spark.local_spark``, which belongs to the runtime)."""
    from pyspark.sql import SparkSession

    # the rows are computed by Python functions on the executors: they must run this
    # interpreter (PySpark's default, python3 from PATH, may lack reflow; as local_spark)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder
             .master(master or os.environ.get("REFLOW_SPARK_MASTER") or "local[*]")
             .appName("reflow-pmc").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _parse_mtm(text: str) -> TransitionMatrix:
    d = json.loads(text)
    return TransitionMatrix(tuple(d["parallelisms"]), tuple(tuple(r) for r in d["probabilities"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m migration.pmc",
        description="Pre-compute the projected migration costs (PMC) that "
                    "assignment='mtm' looks up, by value iteration on Spark.")
    ap.add_argument("--out", required=True, help="directory (or Spark URI) to write the table")
    ap.add_argument("--key-groups", type=int, default=128, help="the job's num_key_groups")
    ap.add_argument("--units", type=int, default=32,
                    help="key groups are merged into this many units of consecutive groups "
                         "(cuts fall on unit boundaries; more units, many more partitionings)")
    ap.add_argument("--mtm", type=_parse_mtm, default=PAPER_TABLE_4,
                    help='JSON {"parallelisms": [...], "probabilities": [[...], ...]}; '
                         "default: the paper's Table 4 (2, 3, 4 tasks)")
    ap.add_argument("--balance", type=float, default=0.2, help="θ: load bound of every task")
    ap.add_argument("--gamma", type=float, default=DEFAULT_GAMMA, help="discount γ in [0, 1)")
    ap.add_argument("--loads", help="JSON list, one load per key group (default: even)")
    ap.add_argument("--sizes", help="JSON list, state bytes per key group (default: even)")
    ap.add_argument("--tolerance", type=float, default=1e-6)
    ap.add_argument("--master", help="Spark master (default: local mode, or "
                                     "REFLOW_SPARK_MASTER)")
    args = ap.parse_args(argv)
    m = args.key_groups
    loads = json.loads(args.loads) if args.loads else [1.0] * m
    sizes = json.loads(args.sizes) if args.sizes else [1] * m
    model = PmcModel.of(GroupWorkload(tuple(loads), tuple(sizes)), args.mtm, units=args.units,
                        balance=args.balance, gamma=args.gamma)
    spark = spark_session(args.master)
    try:
        table = precompute(spark, model, args.out, tolerance=args.tolerance)
    finally:
        spark.stop()
    counts = ", ".join(f"{p} tasks: {len(r)}" for p, r in sorted(table.entries.items()))
    print(f"projected costs of {sum(len(r) for r in table.entries.values())} partitionings "
          f"({counts}) after {table.iterations} iterations written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
