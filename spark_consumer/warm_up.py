"""`walbridge-consumer warm-up`: write the driver JVM's class-data archive (class_archive.py).

A training run loads what a consumer's first batches load (the session with its connectors,
the Kafka source, Avro decoding, a Delta write, MERGE and read), then its JVM writes the
archive as it exits. It needs no Kafka, registry or lake: everything runs on a scratch
directory. The archive is dumped under a temporary name and renamed into place once the JVM
has finished writing it, so a consumer starting meanwhile never maps half a file.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from pyspark import SparkContext
from pyspark.sql import SparkSession

from spark_consumer import class_archive
from spark_consumer.config import SparkSettings
from spark_consumer.errors import ConsumerError
from spark_consumer.session import ARCHIVE_CONF, build_session, walbridge_home

log = logging.getLogger("walbridge.consumer")

# The JVM writes a ~175 MB archive at exit: 45 s on this loaded 2-core machine.
DUMP_TIMEOUT_S = 900.0

_AVRO_SCHEMA = json.dumps(
    {"type": "record", "name": "r", "fields": [{"name": "id", "type": "long"}]}
)


def _train(spark: SparkSession, scratch: Path) -> None:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro, to_avro

    path = str(scratch / "table")
    rows = spark.range(1000).select(
        F.col("id"), (F.col("id") % 7).cast("string").alias("s"), F.current_timestamp().alias("t")
    )
    rows.write.format("delta").save(path)
    changes = rows.where("id % 3 = 0").withColumn("s", F.lit("changed"))
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(changes.alias("c"), "t.id = c.id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    spark.read.format("delta").load(path).groupBy("s").count().collect()
    encoded = spark.range(10).select(to_avro(F.struct("id")).alias("value"))
    encoded.select(from_avro("value", _AVRO_SCHEMA)).collect()
    # The Kafka source's classes: defining the stream connects to nothing.
    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", "127.0.0.1:9")
        .option("subscribePattern", "walbridge-warm-up.*")
        .load()
    )
    assert stream.select(F.col("value").substr(6, 1 << 20).alias("body")).isStreaming


def _stop_jvm(spark: SparkSession) -> None:
    """Stop Spark, then end the driver JVM and wait while it writes the archive: it exits when
    its standard input closes (PySpark's gateway)."""
    spark.stop()
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if proc is None:
        raise ConsumerError("warm-up: the driver JVM was not started by this process")
    if proc.stdin is not None:
        proc.stdin.close()
    proc.wait(timeout=DUMP_TIMEOUT_S)


def _drop_dead_partials(directory: Path) -> None:
    """A warm-up killed while its JVM was dumping leaves its ~180 MB partial file behind."""
    for path in directory.glob("warm-up.*.partial"):
        pid = path.name.split(".")[1]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            path.unlink(missing_ok=True)
        except PermissionError:
            pass  # another user's live process


def warm_up(env: Mapping[str, str], lake_paths: Iterable[str] = ()) -> Path:
    """Write the archive the consumer's sessions will look for; its path."""
    settings = SparkSettings.from_env(env)
    directory = walbridge_home(settings) / class_archive.ARCHIVE_DIR
    directory.mkdir(parents=True, exist_ok=True)
    _drop_dead_partials(directory)
    partial = directory / f"warm-up.{os.getpid()}.partial"
    try:
        with tempfile.TemporaryDirectory(prefix="walbridge-warm-up-") as scratch:
            spark = build_session(
                "walbridge-warm-up", env=env, lake_paths=lake_paths, dump_class_archive=partial
            )
            archive = Path(spark.conf.get(ARCHIVE_CONF) or "")
            _train(spark, Path(scratch))
            _stop_jvm(spark)
        if not partial.is_file():
            raise ConsumerError(
                f"warm-up: the driver JVM wrote no class-data archive at {partial} "
                "(its log says why)"
            )
        class_archive.install(partial, archive)
    finally:
        partial.unlink(missing_ok=True)
    log.info("class-data archive for the driver JVM: %s", archive)
    return archive
