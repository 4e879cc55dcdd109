"""union_all: the union by name of many frames, built as a balanced tree."""

from __future__ import annotations

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

from spark_consumer.union import union_all
from tests.support.spark import spark  # noqa: F401

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8])
def test_every_row_of_every_frame_once_matched_by_name(spark: SparkSession, n: int) -> None:
    frames = [
        # Columns in two orders: matched by name, not position.
        spark.createDataFrame([(i, f"t{i}"), (i, f"u{i}")], "k long, v string")
        if i % 2
        else spark.createDataFrame([(f"t{i}", i), (f"u{i}", i)], "v string, k long")
        for i in range(n)
    ]
    rows = sorted((r["k"], r["v"]) for r in union_all(frames).collect())
    assert rows == sorted((i, f"{p}{i}") for i in range(n) for p in "tu")


def test_missing_columns_are_null_when_allowed(spark: SparkSession) -> None:
    a = spark.createDataFrame([(1, "x")], "k long, v string")
    b = spark.createDataFrame([(2,)], "k long")
    c = spark.createDataFrame([(3, 3.5)], "k long, w double")
    rows = union_all([a, b, c], allow_missing=True).orderBy("k").collect()
    assert [(r["k"], r["v"], r["w"]) for r in rows] == [
        (1, "x", None),
        (2, None, None),
        (3, None, 3.5),
    ]


def test_missing_columns_are_an_error_by_default(spark: SparkSession) -> None:
    a = spark.createDataFrame([(1, "x")], "k long, v string")
    b = spark.createDataFrame([(2,)], "k long")
    with pytest.raises(AnalysisException, match='Cannot resolve column name "v"'):
        union_all([a, b])


def test_no_frame_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one"):
        union_all([])
