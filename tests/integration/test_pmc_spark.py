"""PMC on real PySpark (local mode). Spark's start-up alone takes 1-2 min at load 20, so
only the first test (the smallest model, end to end) is in the default run; the second is
slow (the Parquet table's reading and lookup are also unit-tested with pyarrow in
tests/unit/test_assignment.py).

First: ``python -m migration.pmc`` on a small model writes the Parquet table with Spark;
``ProjectedCosts.load`` reads it back, its values equal the same value iteration in this
process, and ``mtm`` looks its partitionings up. Second: both ways of sweeping on Spark (rows
collected to the driver, rows kept on the executors with one Spark job per sweep) equal the
local iteration. Kept small: Spark's start-up dominates.
"""

from __future__ import annotations

import pytest

from migration.assignment import GroupWorkload, uniform
from migration.pmc import main, precompute, spark_session
from migration.sequences import PAPER_TABLE_4, PmcModel, ProjectedCosts, mtm

pytestmark = pytest.mark.spark


def model(gamma: float = 0.5, size: int = 10) -> PmcModel:
    return PmcModel.of(GroupWorkload.even(32, size=size), PAPER_TABLE_4, units=8, balance=0.5,
                       gamma=gamma)


def same_values(table: ProjectedCosts, ref: ProjectedCosts) -> None:
    assert set(table.entries) == set(ref.entries) and table.iterations == ref.iterations
    for p, rows in ref.entries.items():
        got = dict(table.entries[p])
        assert len(got) == len(rows)
        for ends, cost in rows:
            assert got[ends] == pytest.approx(cost, rel=1e-9)


def test_the_command_line_writes_a_table_that_mtm_looks_up(tmp_path, capsys):
    out = str(tmp_path / "cli")
    assert main(["--out", out, "--key-groups", "32", "--units", "8", "--balance", "0.5",
                 "--gamma", "0.5", "--master", "local[2]"]) == 0
    assert "partitionings" in capsys.readouterr().out
    back = ProjectedCosts.load(out)
    same_values(back, ProjectedCosts.compute(model(size=1)))
    only4 = ProjectedCosts.load(out, [4])
    assert set(only4.entries) == {4} and only4.num_key_groups == 32
    plan = mtm(uniform(32, 2), 3, GroupWorkload.even(32), back)
    assert plan.parallelism == 3 and "MTM-aware" in plan.reason
    a = plan.assignment
    ends = tuple(i + 1 for i in range(32) if i == 31 or a[i] != a[i + 1])
    assert back.cost_of(ends) is not None  # the partitioning chosen is one of the table's


@pytest.mark.slow
def test_value_iteration_on_spark_equals_the_local_one_both_ways(tmp_path):
    spark = spark_session("local[2]")
    try:
        on_driver = precompute(spark, model(), str(tmp_path / "a"), tolerance=1e-9)
        # one Spark job per sweep: a short discount and a loose tolerance keep them few
        on_executors = precompute(spark, model(0.2), tolerance=1e-3, collect_limit=0)
    finally:
        spark.stop()
    same_values(on_driver, ProjectedCosts.compute(model(), tolerance=1e-9))
    same_values(on_executors, ProjectedCosts.compute(model(0.2), tolerance=1e-3))
    back = ProjectedCosts.load(str(tmp_path / "a"))
    assert back.model == on_driver.model and back.iterations == on_driver.iterations
    assert {p: dict(r) for p, r in back.entries.items()} == {
        p: dict(r) for p, r in on_driver.entries.items()}
