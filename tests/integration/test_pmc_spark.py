"""PMC on real PySpark (local mode): the projected costs computed by value iteration on
Spark equal the same iteration in this process, both ways of sweeping (rows collected to
the driver, rows kept on the executors), and the Parquet table Spark writes reads back
with ``ProjectedCosts.load`` and serves ``mtm``. Kept small: Spark's start-up dominates."""

from __future__ import annotations

import pytest

from migration.assignment import GroupWorkload, uniform
from migration.pmc import main, precompute, spark_session
from migration.sequences import PAPER_TABLE_4, PmcModel, ProjectedCosts, mtm

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark():
    session = spark_session("local[2]")
    yield session
    session.stop()


def model(gamma: float = 0.5) -> PmcModel:
    return PmcModel.of(GroupWorkload.even(32, size=10), PAPER_TABLE_4, units=8, balance=0.5,
                       gamma=gamma)


def test_value_iteration_on_spark_equals_the_local_one_and_round_trips(spark, tmp_path):
    local = ProjectedCosts.compute(model(), tolerance=1e-9)
    on_driver = precompute(spark, model(), str(tmp_path / "a"), tolerance=1e-9)
    # one Spark job per sweep: a short discount and a loose tolerance keep them few
    local_short = ProjectedCosts.compute(model(0.2), tolerance=1e-3)
    on_executors = precompute(spark, model(0.2), tolerance=1e-3, collect_limit=0)
    for table, ref in ((on_driver, local), (on_executors, local_short)):
        assert set(table.entries) == {2, 3, 4} and table.iterations == ref.iterations
        for p, rows in ref.entries.items():
            got = dict(table.entries[p])
            assert len(got) == len(rows)
            for ends, cost in rows:
                assert got[ends] == pytest.approx(cost, rel=1e-9)
    back = ProjectedCosts.load(str(tmp_path / "a"))
    assert back.model == local.model and back.iterations == on_driver.iterations
    assert {p: dict(r) for p, r in back.entries.items()} == {
        p: dict(r) for p, r in on_driver.entries.items()}
    plan = mtm(uniform(32, 2), 3, GroupWorkload.even(32, size=10), back)
    assert plan.parallelism == 3 and "MTM-aware" in plan.reason


def test_the_command_line_writes_a_table(spark, tmp_path, capsys):
    out = str(tmp_path / "cli")
    assert main(["--out", out, "--key-groups", "32", "--units", "8", "--balance", "0.5",
                 "--gamma", "0.5", "--master", "local[2]"]) == 0
    assert "partitionings" in capsys.readouterr().out
    table = ProjectedCosts.load(out, [4])
    assert set(table.entries) == {4} and table.num_key_groups == 32
