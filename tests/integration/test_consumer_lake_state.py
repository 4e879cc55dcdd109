"""One read of a Delta table's log gives what a batch asks of it (spark_consumer.lake_state),
checked against Delta's own public API on a real table."""

from __future__ import annotations

from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from spark_consumer import lake_state
from tests.support.spark import spark  # noqa: F401


def test_state_matches_deltas_own_answers(spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    missing = lake_state.read(spark, path)
    assert (missing.exists, missing.version, missing.files) == (False, lake_state.NO_TABLE, 0)

    (
        DeltaTable.createIfNotExists(spark)
        .location(path)
        .addColumn("id", "long", nullable=False)
        .addColumn("note", "string", comment="PostgreSQL column n%27ote")
        .property("walbridge.key", "id")
        .execute()
    )
    created = lake_state.read(spark, path)
    assert created.exists and created.version == 0 and created.files == 0
    assert created.properties["walbridge.key"] == "id"
    assert created.columns == ["id", "note"]
    assert created.schema["note"].metadata == {"comment": "PostgreSQL column n%27ote"}

    spark.createDataFrame([(1, "a"), (2, "b")], "id long, note string").write.format("delta").mode(
        "append"
    ).save(path)
    spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS (extra int)")
    after = lake_state.read(spark, path)
    history = DeltaTable.forPath(spark, path).history(1).collect()[0]
    assert after.version == history["version"] == 2
    assert after.files == len(spark.read.format("delta").load(path).inputFiles()) >= 1
    assert after.columns == ["id", "note", "extra"]
    # SHOW TBLPROPERTIES adds the protocol versions, which are not table properties.
    shown = {
        r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()
    }
    assert after.properties["walbridge.key"] == "id"
    assert all(shown[k] == v for k, v in after.properties.items())
