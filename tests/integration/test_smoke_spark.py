"""Spark smoke test: Kafka source + Delta MERGE with jars resolved from Maven Central."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession

from spark_consumer.config import SparkSettings
from spark_consumer.session import build_session


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = build_session("walbridge-smoke")
    yield session


def test_kafka_batch_read_then_delta_merge(
    spark: SparkSession, kafka_bootstrap: str, tmp_path: Path
) -> None:
    from delta.tables import DeltaTable

    topic = f"smoke.spark.{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(30)
    producer = Producer(
        {"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True, "acks": "all"}
    )
    for i in range(10):
        producer.produce(topic, key=str(i).encode(), value=f"v{i}".encode())
    assert producer.flush(30) == 0

    rows = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka_bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        .load()
        .selectExpr("CAST(CAST(key AS STRING) AS INT) AS id", "CAST(value AS STRING) AS value")
    )
    assert rows.count() == 10

    path = str(tmp_path / "delta")
    spark.createDataFrame([(1, "old"), (99, "untouched")], "id INT, value STRING").write.format(
        "delta"
    ).save(path)
    target = DeltaTable.forPath(spark, path)
    (
        target.alias("t")
        .merge(rows.alias("s"), "t.id = s.id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    result = {r.id: r.value for r in spark.read.format("delta").load(path).collect()}
    assert result == {**{i: f"v{i}" for i in range(10)}, 99: "untouched"}
    assert target.history().count() == 2


def test_shuffle_partitions_default_to_the_cores(spark: SparkSession) -> None:
    # The test session may have set its own value; build_session must replace any earlier one
    # (Spark's own default is 200 whatever the cores).
    before = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "7")
    try:
        session = build_session("walbridge-smoke")  # getOrCreate: the same session
        assert int(session.conf.get("spark.sql.shuffle.partitions")) == (
            session.sparkContext.defaultParallelism
        )
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)


def test_the_driver_jvm_runs_the_configured_collector(spark: SparkSession) -> None:
    """WALBRIDGE_SPARK_DRIVER_JAVA_OPTIONS (default: the parallel collector) reaches the JVM
    the session started (`local[...]`: it runs the executors too)."""
    if SparkSettings.from_env(os.environ).driver_java_options != "-XX:+UseParallelGC":
        pytest.skip("WALBRIDGE_SPARK_DRIVER_JAVA_OPTIONS is set to something else here")
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    beans = jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    names = {beans.get(i).getName() for i in range(beans.size())}
    assert names == {"PS Scavenge", "PS MarkSweep"}, names
