"""Job 1 of a batch: the records read from Kafka (and the waiting ones, when some wait) with
their Confluent schema ids, and one aggregation over them that tells the driver what it needs
before anything is decoded: each topic partition's highest offset, whether Kafka was read again
below where the last batch got to, the data topics with their writer schema ids, the marker
schema ids, and, when some records cannot be decoded, an expression naming why.

Apart from batch.py because it is a step of its own with a small result (`Framing`): a few
rows per topic partition come back to the driver, which classifies topics and looks up writer
schemas without touching the lake.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from schemas.topics import TopicKind, classify, snapshot_topic, transaction_topic
from spark_consumer import pending, progress
from spark_consumer.columns import FIRST_SEEN
from spark_consumer.errors import ConfigError
from spark_consumer.framing import schema_id_col
from spark_consumer.writer_schemas import SchemaNotFound, WriterSchemas

RECORD_ID_COLUMNS = ["topic", "partition", "offset"]


@dataclass(frozen=True)
class TopicInfo:
    topic: str
    schema: str
    table: str
    value_ids: tuple[int, ...]
    key_ids: tuple[int, ...]


@dataclass(frozen=True)
class Framing:
    """What job 1 tells: data topics, marker schema ids, offsets and undecodable records."""

    topics: list[TopicInfo]
    marker_ids: list[int]
    offsets: list[tuple[str, int, int]]
    reject: Column | None  # reason per row when some rows are undecodable, else None
    records: int  # in the batch, waiting ones included
    # Some record read from Kafka by this batch lies below where the last progress row says
    # Kafka reading had got to: read before, so it may also wait in the pending state.
    rereads: bool = False


def framed(
    spark: SparkSession, batch: DataFrame, before: progress.Progress, pending_path: str
) -> DataFrame:
    """The batch's records (and the waiting ones) with their value and key schema ids."""
    # First seen now: null here, the clock filled in where it is needed (summary, pending
    # save), so the clock does not end up in this stage's generated code (codegen_stable.py).
    rows = batch.select(
        *RECORD_ID_COLUMNS,
        "key",
        "value",
        "timestamp",
        F.lit(None).cast("long").alias(FIRST_SEEN),
    )
    if before.pending_version is not None:  # None: nothing waited after the last batch
        # No de-duplication here: a batch reads Kafka from where the last one stopped, so
        # its records and the waiting ones never share coordinates. Making sure of it cost
        # a shuffle of the whole batch, payloads and all; `framing` checks it instead.
        old = pending.load(spark, pending_path, before.pending_version)
        rows = rows.unionByName(old)
    # The Kafka source gives one partition per topic partition, and every table's decode
    # below scans the whole cached batch: tables x partitions tasks, 90k tiny tasks for a
    # batch touching 300 tables. One partition per core keeps every core busy and makes
    # that tables x cores.
    rows = rows.coalesce(spark.sparkContext.defaultParallelism)
    return rows.withColumn("_vid", schema_id_col("value")).withColumn("_kid", schema_id_col("key"))


def framing(
    framed: DataFrame, before: progress.Progress, prefix: str, schemas: WriterSchemas
) -> Framing:
    """Job 1: per topic partition and schema ids: the highest offset, the lowest offset
    read from Kafka (the waiting records have a first-seen time), and whether a key is not
    Confluent-framed. Classifies topics and fetches writer schemas."""
    rows = (
        framed.groupBy("topic", "partition", "_vid", "_kid")
        .agg(
            F.max("offset").alias("max_offset"),
            F.min(F.when(F.col(FIRST_SEEN).isNull(), F.col("offset"))).alias("min_read"),
            F.count(F.lit(1)).alias("records"),
            F.max(F.col("key").isNotNull() & F.col("_kid").isNull()).alias("bad_key"),
        )
        .collect()
    )
    rereads = any(
        r["min_read"] is not None
        and r["min_read"] < before.kafka_offsets.get(r["topic"], {}).get(str(r["partition"]), 0)
        for r in rows
    )
    offsets: dict[tuple[str, int], int] = {}
    unknown_vids: set[int] = set()
    unknown_kids: set[int] = set()
    unframed = False
    by_topic: dict[str, tuple[set[int], set[int]]] = {}
    for r in rows:
        tp = (r["topic"], r["partition"])
        offsets[tp] = max(offsets.get(tp, -1), r["max_offset"])
        kind = classify(prefix, r["topic"])
        if kind is TopicKind.TRANSACTION and r["partition"] != 0:
            raise ConfigError(
                f"topic {r['topic']!r} has a partition {r['partition']}: the transaction "
                "topic must have exactly one partition (markers must stay in commit order)"
            )
        if kind in (
            TopicKind.HEARTBEAT,
            TopicKind.MESSAGE,
            TopicKind.SNAPSHOT,
            TopicKind.OFFSETS,
        ):
            continue
        vids, kids = by_topic.setdefault(r["topic"], (set(), set()))
        if r["_vid"] is None:
            unframed = True
        elif not _known(schemas, r["_vid"]):
            unknown_vids.add(r["_vid"])
        else:
            vids.add(r["_vid"])
        if kind is TopicKind.DATA:
            unframed |= bool(r["bad_key"])
            if r["_kid"] is not None:
                (kids if _known(schemas, r["_kid"]) else unknown_kids).add(r["_kid"])
    infos: list[TopicInfo] = []
    marker_ids: list[int] = []
    for topic, (vids, kids) in sorted(by_topic.items()):
        if classify(prefix, topic) is TopicKind.TRANSACTION:
            marker_ids = sorted(vids)
            continue
        schema, _, table = topic[len(prefix) + 1 :].partition(".")
        infos.append(TopicInfo(topic, schema, table, tuple(sorted(vids)), tuple(sorted(kids))))
    reject = None
    if unframed or unknown_vids or unknown_kids:
        uv, uk = sorted(unknown_vids) or [-1], sorted(unknown_kids) or [-1]
        tx_topic = F.col("topic") == transaction_topic(prefix)
        reject = (
            # The producer's snapshot records are JSON (internal), never Avro.
            F.when(F.col("topic") == snapshot_topic(prefix), F.lit(None))
            .when(F.col("_vid").isNull(), "value is not Confluent-framed Avro")
            .when(F.col("_vid").isin(uv), F.format_string("unknown value schema id %d", "_vid"))
            .when(
                ~tx_topic & F.col("key").isNotNull() & F.col("_kid").isNull(),
                "key is not Confluent-framed Avro",
            )
            .when(
                ~tx_topic & F.col("_kid").isin(uk),
                F.format_string("unknown key schema id %d", "_kid"),
            )
        )
    return Framing(
        infos,
        marker_ids,
        [(t, p, o) for (t, p), o in sorted(offsets.items())],
        reject,
        sum(r["records"] for r in rows),
        rereads,
    )


def _known(schemas: WriterSchemas, schema_id: int) -> bool:
    try:
        schemas.text(schema_id)
    except SchemaNotFound:
        return False
    return True
