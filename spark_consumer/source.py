"""The streaming query: Kafka source -> foreachBatch(BatchProcessor)."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from schemas.topics import subscribe_pattern, transaction_topic
from spark_consumer import offset_log, progress
from spark_consumer.batch import BatchProcessor
from spark_consumer.config import ConsumerConfig
from spark_consumer.errors import ConfigError

FETCH_MAX_WAIT_MS = 10  # see kafka_stream

# Spark writes the query's offsets and commits, and Delta its checksum files, through Spark's
# CheckpointFileManager. The default one goes through Hadoop's FileContext, whose rename asks
# for the link status of both paths; Hadoop's local file system, without its native library,
# gets that by running `readlink` in a child process. A JVM profile of the freshness benchmark
# found the batch's thread spending 0.16 s per batch in those spawns (Spark's walCommit and
# commitOffsets phases were little else). The FileSystem-based manager renames with the
# FileSystem API (`File.renameTo`, an atomic replace on a POSIX file system), no child process:
# used only when the checkpoint and the lake are local paths; object stores keep Spark's choice.
CHECKPOINT_FILE_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"
FILE_SYSTEM_MANAGER = (
    "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager"
)


def local_path(path: str) -> bool:
    """A path on this machine's file system: no scheme, or `file:`."""
    scheme, sep, _rest = path.partition(":")
    return not sep or scheme.lower() == "file"


def check_transaction_topic(config: ConsumerConfig, timeout_s: float = 30.0) -> None:
    """Reassembly relies on markers in commit order: the transaction topic must have exactly
    one partition. A topic not created yet is fine (batches check partitions again)."""
    from confluent_kafka.admin import AdminClient

    topic = transaction_topic(config.topic_prefix)
    # All topics, not just this one: asking for a missing topic can auto-create it.
    admin = AdminClient({**config.kafka_config, "bootstrap.servers": config.kafka_bootstrap})
    meta = admin.list_topics(timeout=timeout_s)
    info = meta.topics.get(topic)
    if info is None or info.error is not None:
        return
    if len(info.partitions) != 1:
        raise ConfigError(
            f"topic {topic!r} has {len(info.partitions)} partitions; the transaction topic must "
            "have exactly one (markers must stay in commit order). Recreate it with one "
            "partition before the producer starts."
        )


def kafka_stream(spark: SparkSession, config: ConsumerConfig) -> DataFrame:
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", config.kafka_bootstrap)
        .option("subscribePattern", subscribe_pattern(config.topic_prefix))
        # Only records of committed Kafka transactions; the producer may use them.
        .option("kafka.isolation.level", "read_committed")
        .option("startingOffsets", "earliest")
        # A topic deleted and re-created must stop the job rather than skip data silently.
        .option("failOnDataLoss", "true")
        # New table topics appear while running; look for them often.
        .option("kafka.metadata.max.age.ms", "5000")
        # A batch reads each partition up to its end, where the producer's last Kafka
        # transaction leaves a commit marker: the consumer skips it and fetches again from
        # the log's end, which the broker holds open for fetch.max.wait.ms (500 ms by default)
        # before answering "nothing". That wait came once per partition read to its end, one
        # partition after the other within a task: 3.1 of a catch-up's last batch's 4.0 s of
        # framing. Nothing else waits on an empty fetch here (the source finds offsets by
        # metadata, not by polling), so a short wait costs nothing.
        .option("kafka.fetch.max.wait.ms", str(FETCH_MAX_WAIT_MS))
    )
    # TLS and SASL settings (WALBRIDGE_KAFKA_CONFIG), as the Java client's `kafka.*` options.
    reader = reader.options(**config.spark_kafka_options)
    if config.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(config.max_offsets_per_trigger))
    return reader.load()


def check_checkpoint(spark: SparkSession, config: ConsumerConfig) -> None:
    """Refuse a new checkpoint for a lake that has applied batches. Spark would number batches
    from 0 again and read Kafka from the earliest offset, and a batch whose number the progress
    table already has is taken for a replay and skipped: every new record in such a batch would
    be lost to the lake, silently."""
    if offset_log.has_entries(spark, config.checkpoint_path):
        return
    last = progress.latest(spark, config.progress_path)
    if last.batch_id < 0:
        return
    raise ConfigError(
        f"the lake at {config.lake_path} has applied batches up to {last.batch_id} (commit_lsn "
        f"{last.commit_lsn}), but the checkpoint at {config.checkpoint_path} has no Kafka "
        "offsets: a new checkpoint numbers batches from 0 again, and batches the progress table "
        "already has would be skipped as replays. Restore the checkpoint (or point "
        "--checkpoint-path at it), or start over with a new lake path."
    )


def start(spark: SparkSession, config: ConsumerConfig, processor: BatchProcessor) -> StreamingQuery:
    check_transaction_topic(config)
    check_checkpoint(spark, config)
    if local_path(config.checkpoint_path) and local_path(config.lake_path):
        spark.conf.set(CHECKPOINT_FILE_MANAGER, FILE_SYSTEM_MANAGER)
    writer = (
        kafka_stream(spark, config)
        .writeStream.queryName("walbridge-consumer")
        .option("checkpointLocation", config.checkpoint_path)
        .foreachBatch(processor)
    )
    if config.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        assert config.trigger is not None
        writer = writer.trigger(processingTime=config.trigger)
    return writer.start()
