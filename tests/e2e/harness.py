"""The whole pipeline for one e2e scenario: tables in PostgreSQL, a throw-away publication, slot
and topic prefix, the REAL producer as a subprocess, and the consumer (in-process through its
API, or as `python -m spark_consumer run` subprocess) writing a lake under the test's tmp dir.

The producer helpers come from tests/support/producer_harness.py (no tests there).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from schemas import snapshot_state
from schemas.client_config import parse_pairs, registry_client_config
from schemas.safe_names import lake_table_path
from schemas.topics import snapshot_topic
from spark_consumer import verify
from spark_consumer.batch import BatchProcessor
from spark_consumer.config import ConsumerConfig, VerifyConfig
from spark_consumer.source import start
from spark_consumer.writer_schemas import WriterSchemas
from tests.support import security
from tests.support.producer_harness import ProducerProcess, Source, sql

ROOT = Path(__file__).resolve().parents[2]


def wait_for(
    what: str, check: Callable[[], bool], timeout: float = 120.0, every: float = 1.0
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


class Pipeline:
    def __init__(
        self,
        spark: SparkSession,
        dsn: str,
        kafka: str,
        registry: str,
        tmp: Path,
        tables: list[str],
        name: str,
    ) -> None:
        self.spark = spark
        self.dsn = dsn
        self.kafka = kafka
        self.registry = registry
        self.tmp = tmp
        self.tables = tables
        self.source = Source.create(dsn, tables, name)
        self.prefix = self.source.prefix
        self.lake = str(tmp / "lake")
        self.checkpoint = str(tmp / "checkpoint")
        # Data topics get 3 partitions; the producer creates the transaction topic with one.
        self.producer = ProducerProcess(self.source, kafka, registry, topic_partitions=3)

    def start_producer(self) -> None:
        self.producer.start()

    def sql(self, *statements: str) -> None:
        sql(self.dsn, *statements)

    def wait_published(self, timeout: float = 120.0) -> None:
        """Everything committed so far is in Kafka (the producer confirms only acked LSNs)."""
        self.source.wait_confirmed(self.source.current_lsn(), timeout)

    def wait_snapshots_read(self, timeout: float = 240.0) -> None:
        """The producer is ready and reads no table any more (/readyz stops saying
        "snapshotting"); its records may commit later: see ``wait_snapshot_recorded``."""
        deadline = time.monotonic() + timeout
        while True:
            status, body = self.producer.http("/readyz")
            if status == 200 and "snapshotting" not in body:
                return
            assert time.monotonic() < deadline, self.producer.log()
            time.sleep(0.5)

    def wait_snapshot_recorded(self, table: str, timeout: float = 120.0) -> None:
        """The table's resume record in ``<prefix>.snapshot`` says its snapshot is complete,
        committed in Kafka. The producer writes it only once the last chunk is acknowledged,
        so it can commit after the slot's confirmation (``wait_published``) and after /readyz
        stops saying "snapshotting"; a batch that should see the snapshot end waits for it."""
        cfg = self.config()  # the consumer's Kafka client settings (its principal, if secure)
        conf = {**cfg.kafka_config, "bootstrap.servers": cfg.kafka_bootstrap}
        topic = snapshot_topic(self.prefix)

        def complete() -> bool:
            state = snapshot_state.load(conf, topic).get(table)
            return state is not None and state.complete

        wait_for(f"{table}'s snapshot record to say complete", complete, timeout, every=0.5)

    def config(self, **overrides: Any) -> ConsumerConfig:
        settings: dict[str, Any] = dict(
            kafka_bootstrap=self.kafka,
            schema_registry_url=self.registry,
            topic_prefix=self.prefix,
            lake_path=self.lake,
            checkpoint_path=self.checkpoint,
            trigger=None,
            available_now=True,
        )
        creds = security.active()
        if creds is not None:  # the secure stack's consumer principal
            settings["kafka_config"] = parse_pairs(creds.consumer_kafka, "kafka")
            settings["registry_config"] = registry_client_config(creds.consumer_registry)
        return ConsumerConfig(**{**settings, **overrides})

    def processor(self, **overrides: Any) -> BatchProcessor:
        config = self.config(**overrides)
        schemas = WriterSchemas.from_url(self.registry, config.registry_config)
        return BatchProcessor(self.spark, config, schemas)

    def consume_available(self, timeout: int | None = None, **overrides: Any) -> BatchProcessor:
        """Run a processor until its query ends; with `timeout`, stop it and fail after that
        many seconds (a query's own failure raises from awaitTermination)."""
        proc = self.processor(**overrides)
        query = start(self.spark, proc.config, proc)
        if timeout is None:
            query.awaitTermination()
        elif not query.awaitTermination(timeout):
            query.stop()
            raise TimeoutError(f"the consumer did not finish in {timeout} s")
        return proc

    def verify(self) -> list[verify.TableDiff]:
        return verify.run(
            VerifyConfig(self.dsn, self.lake, self.source.publication, ()), self.spark
        )

    def assert_equal(self) -> None:
        diffs = self.verify()
        assert all(d.equal for d in diffs), verify.report(diffs)
        assert {d.table for d in diffs} == set(self.tables)

    def progress(self) -> list[dict[str, Any]]:
        df = self.spark.read.format("delta").load(f"{self.lake}/_walbridge/progress")
        return [r.asDict() for r in df.orderBy("batch_id").collect()]

    def table(self, name: str, version: int | None = None) -> list[dict[str, Any]]:
        schema, table = name.split(".")
        reader = self.spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return [r.asDict() for r in reader.load(f"{self.lake}/{schema}/{table}").collect()]

    def table_rows(
        self, schema: str, table: str, version: int | None = None
    ) -> list[dict[str, Any]]:
        """A table by its PostgreSQL names, whatever they hold (the lake path rule applies)."""
        reader = self.spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        path = lake_table_path(self.lake, schema, table)
        return [r.asDict() for r in reader.load(path).collect()]

    def consumer_env(self, **extra: str) -> dict[str, str]:
        return (
            {k: v for k, v in os.environ.items() if not k.startswith("WALBRIDGE_")}
            | {
                "WALBRIDGE_KAFKA_BOOTSTRAP": self.kafka,
                "WALBRIDGE_SCHEMA_REGISTRY_URL": self.registry,
                "WALBRIDGE_TOPIC_PREFIX": self.prefix,
                "WALBRIDGE_LAKE_PATH": self.lake,
                "WALBRIDGE_CHECKPOINT_PATH": self.checkpoint,
                "WALBRIDGE_SPARK_DRIVER_MEMORY": "1g",
                # No /metrics server: the default port is one per machine, and another
                # consumer (a second suite, the demo) may hold it.
                "WALBRIDGE_CONSUMER_METRICS_PORT": "0",
            }
            # The test command's Ivy cache (deploy/local/lib/python-env.sh), so the child
            # finds the connector jars already resolved.
            | {k: v for k, v in os.environ.items() if k == "WALBRIDGE_SPARK_IVY_DIR"}
            | security.consumer_env()
            | extra
        )

    def consumer_process(
        self, *args: str, log_name: str = "consumer", **extra: str
    ) -> subprocess.Popen[bytes]:
        log = (self.tmp / f"{log_name}.log").open("ab")
        return subprocess.Popen(
            [sys.executable, "-m", "spark_consumer", "run", *args],
            cwd=ROOT,
            env=self.consumer_env(**extra),
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def log(self, name: str = "consumer") -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        if self.producer.proc is not None:
            self.producer.stop()
        self.source.drop()


@contextmanager
def pipeline(
    spark: SparkSession,
    dsn: str,
    kafka: str,
    registry: str,
    tmp: Path,
    tables: list[str],
    name: str,
) -> Iterator[Pipeline]:
    p = Pipeline(spark, dsn, kafka, registry, tmp, tables, name)
    try:
        yield p
    finally:
        p.close()
