"""A relative lake path (`--lake-path lake`): the consumer's SQL statements on a lake table
(the deletion-vector mode check at a process's first batch, ADD COLUMNS) name it
delta.`<path>`, which Delta takes for a path only when it is absolute; a relative one parsed as a
table name and failed the batch (INVALID_ATTRIBUTE_NAME_SYNTAX: found by the torture run, whose
lake path was `.walbridge/torture/...`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark_consumer import lake_state
from spark_consumer.errors import ApplyError
from spark_consumer.merge_target import check_deletion_vectors
from tests.support.spark import spark  # noqa: F401


def test_a_relative_lake_path_works_in_the_consumers_sql(
    spark: SparkSession, tmp_path: Path
) -> None:
    target = tmp_path / ".lake" / "public" / "t"
    spark.range(3).write.format("delta").option("delta.enableDeletionVectors", "true").save(
        str(target)
    )
    # Relative to the working directory the test (and Spark's JVM) started in.
    relative = os.path.relpath(target)
    assert not os.path.isabs(relative)
    lake = lake_state.read(spark, relative)  # the table's log, read through the relative path
    assert lake.exists
    check_deletion_vectors("public.t", lake, wanted=True)
    with pytest.raises(ApplyError, match="enableDeletionVectors=true") as info:
        check_deletion_vectors("public.t", lake, wanted=False)
    # The command it proposes names the table by an absolute path (a relative one parsed as a
    # table name: INVALID_ATTRIBUTE_NAME_SYNTAX).
    assert f"delta.`{target}`" in str(info.value)
