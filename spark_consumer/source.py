"""The streaming query: Kafka source -> foreachBatch(BatchProcessor)."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from spark_consumer.batch import BatchProcessor
from spark_consumer.config import ConsumerConfig
from spark_consumer.topics import subscribe_pattern


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
    )
    if config.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(config.max_offsets_per_trigger))
    return reader.load()


def start(spark: SparkSession, config: ConsumerConfig,
          processor: BatchProcessor) -> StreamingQuery:
    writer = (
        kafka_stream(spark, config).writeStream.queryName("walbridge-consumer")
        .option("checkpointLocation", config.checkpoint_path)
        .foreachBatch(processor)
    )
    if config.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        assert config.trigger is not None
        writer = writer.trigger(processingTime=config.trigger)
    return writer.start()
