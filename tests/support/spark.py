"""A shared SparkSession for the consumer tests, and Kafka-shaped rows for driving batches.

Import the fixture into a test module with `from tests.support.spark import spark  # noqa: F401`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime

import pytest
from pyspark.sql import DataFrame, SparkSession

from spark_consumer.session import build_session
from tests.support.event_writer import KafkaRecord

KAFKA_SCHEMA = (
    "topic string, partition int, offset long, key binary, value binary, timestamp timestamp"
)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = build_session("walbridge-tests", shuffle_partitions=2)
    session.sparkContext.setLogLevel("WARN")
    yield session
    session.stop()


class KafkaLog:
    """Assigns offsets like a broker would (per topic partition), for static batches."""

    def __init__(self) -> None:
        self._next: dict[tuple[str, int], int] = defaultdict(int)

    def rows(
        self, records: Iterable[KafkaRecord], partition_of: Mapping[str, int] | None = None
    ) -> list[tuple[object, ...]]:
        out: list[tuple[object, ...]] = []
        for r in records:
            p = (partition_of or {}).get(r.topic, 0)
            off = self._next[(r.topic, p)]
            self._next[(r.topic, p)] = off + 1
            out.append((r.topic, p, off, r.key, r.value, datetime(2024, 1, 1)))
        return out

    def frame(
        self,
        spark: SparkSession,
        records: Iterable[KafkaRecord],
        partition_of: Mapping[str, int] | None = None,
    ) -> DataFrame:
        return spark.createDataFrame(self.rows(records, partition_of), KAFKA_SCHEMA)
