"""One micro-batch, end to end (the foreachBatch function).

raw Kafka rows + pending rows -> framing check -> decode per (topic, writer schema id)
-> reassembly plan -> MERGE per table -> pending state -> progress row.
Every step is idempotent per batch id, so a re-run after a crash converges.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import reduce

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_consumer import envelope as E
from spark_consumer import merge, pending, progress, quarantine
from spark_consumer.config import ConsumerConfig, Decoder
from spark_consumer.conversions import DEFAULT_CONVERSIONS, FieldConversions
from spark_consumer.decode import markers, table_events, with_envelope_from_avro
from spark_consumer.decode_fastavro import with_envelope_fastavro
from spark_consumer.errors import RecordError, TransactionError, UnknownSchemaError
from spark_consumer.framing import schema_id_col
from spark_consumer.reassembly import check_age, per_transaction, plan_batch
from spark_consumer.registry import SchemaNotFound, WriterSchemas
from spark_consumer.topics import TopicKind, classify

log = logging.getLogger("walbridge.consumer")

COORDS = ["topic", "partition", "offset"]


@dataclass(frozen=True)
class BatchReport:
    batch_id: int
    skipped: bool = False
    commit_lsn: int = progress.NO_LSN
    applied_transactions: int = 0
    changes_by_table: dict[str, int] = field(default_factory=dict)
    table_versions: dict[str, int] = field(default_factory=dict)
    pending_transactions: int = 0
    pending_records: int = 0
    pending_oldest_age_s: float | None = None
    quarantined: int = 0


@dataclass(frozen=True)
class _TopicInfo:
    topic: str
    schema: str
    table: str
    value_ids: tuple[int, ...]
    key_ids: tuple[int, ...]


class BatchProcessor:
    def __init__(self, spark: SparkSession, config: ConsumerConfig, schemas: WriterSchemas,
                 conversions: FieldConversions = DEFAULT_CONVERSIONS,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> None:
        self.spark = spark
        self.config = config
        self.schemas = schemas
        self.conversions = conversions
        self.clock_ms = clock_ms
        self.reports: list[BatchReport] = []

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self.reports.append(self.process(batch, batch_id))

    def _decode(self, rows: DataFrame, schema_text: str) -> DataFrame:
        if self.config.decoder is Decoder.FASTAVRO:
            return with_envelope_fastavro(rows, schema_text)
        return with_envelope_from_avro(rows, schema_text)

    # -- steps ----------------------------------------------------------------------------

    def _framed(self, batch: DataFrame, before: progress.Progress, now_ms: int) -> DataFrame:
        new = batch.select(*COORDS, "key", "value", "timestamp",
                           F.lit(now_ms).cast("long").alias(E.FIRST_SEEN))
        old = pending.load(self.spark, self.config.pending_path, before.pending_version)
        both = new.unionByName(old).dropDuplicates(COORDS)
        return (both.withColumn("_vid", schema_id_col(F.col("value")))
                .withColumn("_kid", schema_id_col(F.col("key"))))

    def _topics(self, raw: DataFrame) -> tuple[list[_TopicInfo], list[int], Column]:
        """Classify topics, fetch writer schemas; returns data topics, marker value ids and the
        condition selecting records that cannot be decoded (unframed or unknown schema id)."""
        prefix = self.config.topic_prefix
        ids = raw.groupBy("topic", "_vid", "_kid").agg(F.count(F.lit(1))).collect()
        unknown_vids: set[int] = set()
        unknown_kids: set[int] = set()
        by_topic: dict[str, tuple[set[int], set[int]]] = {}
        for r in ids:
            kind = classify(prefix, r["topic"])
            if kind in (TopicKind.HEARTBEAT, TopicKind.MESSAGE):
                continue
            vids, kids = by_topic.setdefault(r["topic"], (set(), set()))
            for sid, known, unknown in ((r["_vid"], vids, unknown_vids),
                                        (r["_kid"] if kind is TopicKind.DATA else None,
                                         kids, unknown_kids)):
                if sid is None:
                    continue
                try:
                    self.schemas.text(sid)
                    known.add(sid)
                except SchemaNotFound:
                    unknown.add(sid)
        infos: list[_TopicInfo] = []
        marker_ids: list[int] = []
        for topic, (vids, kids) in sorted(by_topic.items()):
            if classify(prefix, topic) is TopicKind.TRANSACTION:
                marker_ids = sorted(vids)
                continue
            schema, _, table = topic[len(prefix) + 1:].partition(".")
            infos.append(_TopicInfo(topic, schema, table, tuple(sorted(vids)),
                                    tuple(sorted(kids))))
        bad = (F.col("_vid").isNull()
               | F.col("_vid").isin(sorted(unknown_vids) or [-1])
               | F.col("_kid").isin(sorted(unknown_kids) or [-1])
               | (F.col("key").isNotNull() & F.col("_kid").isNull()
                  & ~F.col("topic").endswith(".transaction")))
        reason = (F.when(F.col("_vid").isNull(), "value is not Confluent-framed Avro")
                  .when(F.col("_vid").isin(sorted(unknown_vids) or [-1]),
                        F.format_string("unknown value schema id %d", "_vid"))
                  .when(F.col("_kid").isNull(), "key is not Confluent-framed Avro")
                  .otherwise(F.format_string("unknown key schema id %d", "_kid")))
        return infos, marker_ids, F.when(bad, reason)

    def _reject(self, rows: DataFrame, batch_id: int) -> int:
        """Quarantine the rows, or stop naming the first of them. Returns how many."""
        first = rows.orderBy(*COORDS).limit(1).collect()
        if not first:
            return 0
        if self.config.quarantine_path:
            n = rows.count()
            quarantine.write(rows, self.config.quarantine_path, batch_id)
            log.warning("batch %d: %d undecodable record(s) quarantined to %s (first: %s[%d]@%d: %s)",
                        batch_id, n, self.config.quarantine_path, first[0]["topic"],
                        first[0]["partition"], first[0]["offset"], first[0]["_reason"])
            return n
        r = first[0]
        cls = UnknownSchemaError if "unknown" in r["_reason"] else RecordError
        raise cls(r["topic"], r["partition"], r["offset"], r["_reason"])

    def process(self, batch: DataFrame, batch_id: int) -> BatchReport:
        cfg = self.config
        before = progress.latest(self.spark, cfg.progress_path)
        if before.batch_id >= batch_id:
            log.info("batch %d already applied (progress has batch %d); skipping",
                     batch_id, before.batch_id)
            return BatchReport(batch_id, skipped=True, commit_lsn=before.commit_lsn)
        now_ms = self.clock_ms()
        offsets = [(r["topic"], r["partition"], r["o"]) for r in
                   batch.groupBy("topic", "partition").agg(F.max("offset").alias("o")).collect()]
        framed = self._framed(batch, before, now_ms).persist(StorageLevel.MEMORY_AND_DISK)
        persisted: list[DataFrame] = [framed]
        try:
            return self._process(framed, persisted, batch_id, before, now_ms, offsets)
        finally:
            for df in persisted:
                df.unpersist()

    def _process(self, framed: DataFrame, persisted: list[DataFrame], batch_id: int,
                 before: progress.Progress, now_ms: int,
                 offsets: list[tuple[str, int, int]]) -> BatchReport:
        cfg = self.config
        infos, marker_ids, reason = self._topics(framed)
        quarantined = self._reject(framed.withColumn("_reason", reason)
                                   .filter(F.col("_reason").isNotNull()), batch_id)
        raw = framed.filter(reason.isNull()) if quarantined else framed

        # Decode: one pass per writer schema id; versions of a table are unioned by name.
        tables: dict[str, tuple[_TopicInfo, DataFrame, tuple[str, ...]]] = {}
        for info in infos:
            frames: list[DataFrame] = []
            columns: list[str] = []
            for vid in info.value_ids:
                fields = E.row_fields(self.schemas.parsed(vid))
                columns += [f.name for f in fields if f.name not in columns]
                rows = raw.filter((F.col("topic") == info.topic) & (F.col("_vid") == vid))
                frames.append(table_events(self._decode(rows, self.schemas.text(vid)), fields,
                                           self.conversions))
            df = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)
            df = df.persist(StorageLevel.MEMORY_AND_DISK)
            persisted.append(df)
            tables[info.topic] = (info, df, tuple(columns))
        marker_frames = [
            markers(self._decode(raw.filter((F.col("topic") == f"{cfg.topic_prefix}.transaction")
                                            & (F.col("_vid") == vid)), self.schemas.text(vid)))
            for vid in marker_ids
        ]
        marker_df = (reduce(DataFrame.unionByName, marker_frames) if marker_frames
                     else self.spark.createDataFrame([], _MARKER_SCHEMA))
        marker_df = marker_df.persist(StorageLevel.MEMORY_AND_DISK)
        persisted.append(marker_df)

        meta_cols = [E.TOPIC, E.PARTITION, E.OFFSET, E.FIRST_SEEN, E.SCHEMA, E.TABLE, E.TX_ID,
                     E.COMMIT_LSN, E.TOTAL_ORDER, E.OP, E.OK]
        meta = reduce(DataFrame.unionByName,
                      [df.select(*meta_cols) for _, df, _ in tables.values()],
                      self.spark.createDataFrame([], _META_SCHEMA))
        quarantined += self._check_decoded(meta, marker_df, framed, batch_id)
        meta = meta.filter(_valid())
        marker_ok = marker_df.filter(F.col(E.OK))

        summary = per_transaction(meta, marker_ok, before.commit_lsn,
                                  f"{cfg.topic_prefix}.message")
        summary = summary.persist(StorageLevel.MEMORY_AND_DISK)
        persisted.append(summary)
        plan, oldest = plan_batch(summary, before.commit_lsn)
        check_age(oldest, now_ms, cfg.max_pending_age_s)
        lo, hi = plan.watermark_before, plan.watermark_after
        in_range = (F.col(E.COMMIT_LSN) > lo) & (F.col(E.COMMIT_LSN) <= hi)

        # Apply each table touched by the applicable transactions.
        counts = {(r[E.SCHEMA], r[E.TABLE], r[E.TOPIC]): r["n"] for r in
                  meta.filter(in_range).groupBy(E.SCHEMA, E.TABLE, E.TOPIC)
                  .agg(F.count(F.lit(1)).alias("n")).collect()}
        versions = dict(before.table_versions)
        changes_by_table: dict[str, int] = {}
        for (schema, table, topic), n in sorted(counts.items()):
            info, df, table_columns = tables[topic]
            path = cfg.table_path(schema, table)
            key = self._key(info, path)
            changes = df.filter(in_range & _valid()).drop(E.OK)
            if key is None:  # only truncates for a table the lake never had: nothing to do
                continue
            tc = merge.TableChanges(schema, table, path, key, table_columns, changes)
            versions[tc.name] = merge.apply(self.spark, tc)
            changes_by_table[tc.name] = n

        # Records of later transactions wait in the pending table.
        waiting = (meta.filter(F.col(E.COMMIT_LSN) > hi).select(E.TOPIC, E.PARTITION, E.OFFSET)
                   .unionByName(marker_ok.filter(F.col(E.COMMIT_LSN) > hi)
                                .select(E.TOPIC, E.PARTITION, E.OFFSET))
                   .toDF(*COORDS))
        waiting_rows = raw.join(waiting, COORDS, "left_semi")
        pending_version = pending.save(self.spark, cfg.pending_path, waiting_rows)
        pending_records = self.spark.read.format("delta").load(cfg.pending_path).count()
        if pending_records > cfg.max_pending_records:
            raise TransactionError(
                f"{pending_records} records of incomplete transactions wait (limit "
                f"{cfg.max_pending_records}); oldest: "
                + (f"tx {oldest[0].tx_id} ({', '.join(oldest[0].missing)})" if oldest else "-"))
        oldest_age = ((now_ms - plan.oldest_pending.first_seen_ms) / 1000
                      if plan.oldest_pending else None)
        after = progress.Progress(
            batch_id=batch_id, commit_lsn=hi, table_versions=versions,
            kafka_offsets=progress.merge_offsets(before.kafka_offsets, offsets),
            pending_version=pending_version,
        )
        progress.append(self.spark, cfg.progress_path, batch_id, after,
                        plan.applied_transactions, plan.pending_transactions, oldest_age)
        report = BatchReport(
            batch_id=batch_id, commit_lsn=hi, applied_transactions=plan.applied_transactions,
            changes_by_table=changes_by_table, table_versions=versions,
            pending_transactions=plan.pending_transactions, pending_records=pending_records,
            pending_oldest_age_s=oldest_age, quarantined=quarantined,
        )
        log.info(
            "batch %d: applied %d transaction(s) up to commit_lsn %d (%s); pending %d "
            "transaction(s), %d record(s), oldest %s; quarantined %d",
            batch_id, plan.applied_transactions, hi,
            ", ".join(f"{t}: {n}" for t, n in changes_by_table.items()) or "no changes",
            plan.pending_transactions, pending_records,
            f"{oldest_age:.1f}s" if oldest_age is not None else "-", quarantined,
        )
        return report

    def _key(self, info: _TopicInfo, path: str) -> tuple[str, ...] | None:
        if info.key_ids:
            # The newest key schema of the batch names the replica identity columns.
            return E.key_fields(self.schemas.parsed(max(info.key_ids)))
        stored = merge.stored_key(self.spark, path)
        return stored if stored is not None else ()

    def _check_decoded(self, meta: DataFrame, marker_df: DataFrame, framed: DataFrame,
                       batch_id: int) -> int:
        """Bodies that did not decode, and data events outside any transaction."""
        bad = (
            meta.filter(~F.col(E.OK) | F.col(E.TX_ID).isNull() | F.col(E.COMMIT_LSN).isNull())
            .select(E.TOPIC, E.PARTITION, E.OFFSET,
                    F.when(~F.col(E.OK), "Avro body does not decode with its writer schema")
                    .otherwise("data event without transaction block or commit_lsn")
                    .alias("_reason"))
            .unionByName(marker_df.filter(~F.col(E.OK)).select(
                E.TOPIC, E.PARTITION, E.OFFSET,
                F.lit("Avro body does not decode with its writer schema").alias("_reason")))
            .toDF(*COORDS, "_reason")
        )
        if not bad.limit(1).collect():
            return 0
        rows = framed.join(bad, COORDS, "inner")
        n = self._reject(rows, batch_id)
        # Quarantined records are excluded from reassembly by the OK filters that follow;
        # an event outside any transaction is excluded the same way.
        return n


# Decoded, and inside a transaction (anything else was rejected or quarantined above).
def _valid() -> Column:
    return F.col(E.OK) & F.col(E.TX_ID).isNotNull() & F.col(E.COMMIT_LSN).isNotNull()

_META_SCHEMA = (
    "_topic string, _partition int, _offset long, _first_seen long, _schema string, "
    "_table string, _tx_id string, _commit_lsn long, _total_order long, _op string, _ok boolean"
)
_MARKER_SCHEMA = (
    "_topic string, _partition int, _offset long, _first_seen long, _status string, "
    "_tx_id string, _commit_lsn long, _event_count long, "
    "_data_collections array<struct<data_collection:string,event_count:long>>, _ok boolean"
)
