"""Unchanged TOAST values carried across primary-key changes (spark_consumer.key_change_toast), on Spark."""

from __future__ import annotations

from pyspark.sql import SparkSession

from spark_consumer.key_change_toast import resolve_moved_toast
from tests.support.spark import spark  # noqa: F401

CHANGES = (
    "id long, small int, big string, _commit_lsn long, _total_order long, _op string,"
    " _ts_ms long, _unchanged_toast array<string>, _from_id long"
)
LAKE = (
    "id long, small int, big string, _commit_lsn long, _total_order long, _op string, _ts_ms long"
)


def test_values_come_from_the_old_key_in_the_batch_or_the_lake(spark: SparkSession) -> None:
    lake = spark.createDataFrame([(1, 0, "L1", 5, 1, "c", 0), (7, 0, "L7", 5, 2, "c", 0)], LAKE)
    changes = spark.createDataFrame(
        [
            # 1 -> 2: the value is in the lake only
            (1, None, None, 10, 1, "d", 0, [], None),
            (2, 1, None, 10, 2, "c", 0, ["big"], 1),
            # 3 is inserted, updated without its value, then moved to 4: the insert carried it
            (3, 1, "X3", 11, 1, "c", 0, [], None),
            (3, 2, None, 12, 1, "u", 0, ["big"], None),
            (3, None, None, 13, 1, "d", 0, [], None),
            (4, 2, None, 13, 2, "c", 0, ["big"], 3),
            # 7 -> 8 -> 9 in one batch: two hops
            (7, None, None, 14, 1, "d", 0, [], None),
            (8, 1, None, 14, 2, "c", 0, ["big"], 7),
            (8, None, None, 15, 1, "d", 0, [], None),
            (9, 1, None, 15, 2, "c", 0, ["big"], 8),
            # 99 is nowhere: the create keeps its list, and the MERGE's check will name it
            (20, 1, None, 16, 1, "c", 0, ["big"], 99),
        ],
        CHANGES,
    )
    out = resolve_moved_toast(changes, lake, ("id",), ["big"])
    rows = {(r.id, r._op): (r.big, list(r._unchanged_toast)) for r in out.collect()}
    assert rows[(2, "c")] == ("L1", [])
    assert rows[(4, "c")] == ("X3", [])
    assert rows[(3, "u")] == (None, ["big"])  # an update of an existing key is the MERGE's job
    assert rows[(8, "c")] == ("L7", [])
    assert rows[(9, "c")] == ("L7", [])
    assert rows[(20, "c")] == (None, ["big"])
    assert out.count() == changes.count()


def test_without_moved_columns_nothing_changes(spark: SparkSession) -> None:
    changes = spark.createDataFrame([(1, 1, None, 1, 1, "u", 0, ["big"], None)], CHANGES).drop(
        "_from_id"
    )
    lake = spark.createDataFrame([(1, 0, "L1", 0, 1, "c", 0)], LAKE)
    assert resolve_moved_toast(changes, lake, ("id",), ["big"]).collect() == changes.collect()


def test_a_chain_of_key_changes_keeps_the_plan_small(spark: SparkSession) -> None:
    # 1 -> 2 -> 3 -> 4 -> 5 in one batch: one hop per pass, MAX_PASSES passes. Each pass reads
    # its input four times, so without a cut between passes the plan held 4^4 copies of the
    # batch (a catch-up batch of the torture run ran the driver's heap out analysing it).
    lake = spark.createDataFrame([(1, 0, "L1", 5, 1, "c", 0)], LAKE)
    rows = []
    for k in range(1, 5):
        rows.append((k, None, None, 10 + k, 1, "d", 0, [], None))
        rows.append((k + 1, 1, None, 10 + k, 2, "c", 0, ["big"], k))
    changes = spark.createDataFrame(rows, CHANGES)
    out = resolve_moved_toast(changes, lake, ("id",), ["big"])
    got = {r.id: (r.big, list(r._unchanged_toast)) for r in out.filter("_op = 'c'").collect()}
    assert got == {k: ("L1", []) for k in range(2, 6)}
    leaves = out._jdf.queryExecution().analyzed().collectLeaves().size()
    assert leaves <= 2, f"the resolved changes' plan has {leaves} leaves"
