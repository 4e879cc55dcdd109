"""One micro-batch, end to end (the foreachBatch function).

raw Kafka rows (+ pending rows, when there are any) -> framing check and offsets (job 1)
-> decode per (topic, writer schema id), cached -> one summary aggregation (job 2)
-> reassembly plan (on the driver for a small batch; a large one's completeness is decided in
job 2 and its tables' work in a small job 3, transaction_stats.py) -> one guarded MERGE per
touched table (insert-only when the table's share is nothing but distinct inserts of a unique
key, see merge.inserts_only_applies) -> pending state (only when something waits) -> progress
row.

The fixed cost of a batch is kept to these few Spark jobs plus the MERGEs: everything the
driver needs to decide comes back from jobs 1 and 2 (and 3) as small rows. Every step is idempotent
per batch id, so a re-run after a crash converges.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from functools import partial

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from schemas import snapshot_state
from schemas.topics import TopicKind, classify, message_topic, snapshot_topic, transaction_topic
from spark_consumer import (
    checkpoints,
    codegen_stable,
    freed_memory,
    lake_state,
    merge,
    pending,
    progress,
    quarantine,
    transaction_stats,
)
from spark_consumer.cache_level import CACHE
from spark_consumer.column_cache import ColumnCache
from spark_consumer.columns import (
    COMMIT_LSN,
    FIRST_SEEN,
    OFFSET,
    OK,
    PARTITION,
    TOPIC,
    key_fields,
    row_fields,
)
from spark_consumer.config import ConsumerConfig, Decoder
from spark_consumer.conversions import DEFAULT_CONVERSIONS, FieldConversions
from spark_consumer.decode import ENV, envelope_column, event_columns, marker_columns
from spark_consumer.decode_fastavro import with_envelope_fastavro
from spark_consumer.delta_version import table_version
from spark_consumer.errors import ConfigError, RecordError, TransactionError, UnknownSchemaError
from spark_consumer.framing import schema_id_col
from spark_consumer.metrics import ConsumerMetrics
from spark_consumer.reassembly import Plan, TableWork, check_age, stale
from spark_consumer.union import union_all
from spark_consumer.writer_schemas import SchemaNotFound, WriterSchemas

log = logging.getLogger("walbridge.consumer")

RECORD_ID_COLUMNS = ["topic", "partition", "offset"]

# Up to this many waiting records, the pending save sends their coordinates (topic, partition,
# offset: ~40 bytes each, ~10 MB at most) to every task instead of shuffling the batch. Fixed
# here, apart from the batch cap, so that raising the cap cannot grow the broadcast.
_BROADCAST_PENDING = 250_000
# A batch of more records than this is planned in Spark, a smaller one on the driver
# (transaction_stats.py): Spark's way costs a shuffle and a small job more, the driver's brings
# back a row per (transaction, table).
_SPARK_PLANNING_RECORDS = 100_000


@dataclass(frozen=True)
class BatchReport:
    batch_id: int
    skipped: bool = False
    commit_lsn: int = progress.NO_LSN
    commit_ts_ms: int | None = None  # source commit time of the last applied transaction
    applied_transactions: int = 0
    changes_by_table: dict[str, int] = field(default_factory=dict)
    table_versions: dict[str, int] = field(default_factory=dict)
    pending_transactions: int = 0
    pending_records: int = 0
    pending_oldest_age_s: float | None = None
    quarantined: int = 0
    seconds: float = 0.0
    steps: dict[str, float] = field(default_factory=dict)  # seconds per step, for tuning


@dataclass(frozen=True)
class _TopicInfo:
    topic: str
    schema: str
    table: str
    value_ids: tuple[int, ...]
    key_ids: tuple[int, ...]


@dataclass(frozen=True)
class _Framing:
    """What job 1 tells: data topics, marker schema ids, offsets and undecodable records."""

    topics: list[_TopicInfo]
    marker_ids: list[int]
    offsets: list[tuple[str, int, int]]
    reject: Column | None  # reason per row when some rows are undecodable, else None
    records: int  # in the batch, waiting ones included
    # Some record read from Kafka by this batch lies below where the last progress row says
    # Kafka reading had got to: read before, so it may also wait in the pending state.
    rereads: bool = False


@dataclass(frozen=True)
class _Table:
    info: _TopicInfo
    events: DataFrame  # decoded, cached
    columns: tuple[str, ...]
    key: tuple[str, ...] | None  # None: not known yet (no key schema, no table)
    # Every key of the batch leaves out some source column of every writer schema: a primary
    # key or unique index. A key of all columns (REPLICA IDENTITY FULL without a primary key)
    # may repeat at the source.
    unique_key: bool = False
    # Lake column -> PostgreSQL column name, where the producer had to change the name.
    pg_names: Mapping[str, str] = field(default_factory=dict)


class BatchProcessor:
    def __init__(
        self,
        spark: SparkSession,
        config: ConsumerConfig,
        schemas: WriterSchemas,
        conversions: FieldConversions = DEFAULT_CONVERSIONS,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        metrics: ConsumerMetrics | None = None,
    ) -> None:
        self.spark = spark
        self.config = config
        self.schemas = schemas
        self.conversions = conversions
        self.clock_ms = clock_ms
        self.metrics = metrics
        self.reports: list[BatchReport] = []
        # The progress row of the last batch this process applied: this job is the table's
        # only writer, so it is read from Delta once, at the first batch.
        self._last: progress.Progress | None = None
        # Tables whose deletion-vector mode was checked against the setting (once per process:
        # this job is their only writer). Tables are applied from several threads; a second
        # check of the same table is merely redundant.
        self._mode_checked: set[str] = set()
        # Per lake path: the table as this job's last commit to it left it, and the handle it
        # used (this job is the only writer, so neither changes behind its back). Filled by
        # the first read of a table's log, dropped whole when a batch fails.
        self._lake: dict[str, merge.Applied | lake_state.LakeTable] = {}
        self.checkpoints = checkpoints.Checkpointer(spark)
        # Expressions every batch builds alike (per writer schema, table key): once per process.
        self._columns = ColumnCache()

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        try:
            report = self.process(batch, batch_id)
        finally:
            freed_memory.release()
        self.reports.append(report)
        if self.metrics is not None:
            self.metrics.observe_batch(report, self.clock_ms())

    def close(self) -> None:
        """Let the Delta checkpoint in progress finish (the others wait for the next run)."""
        self.checkpoints.close()

    def _decode(self, raw: DataFrame, topic: str, vid: int) -> DataFrame:
        """The records of `topic` written with schema `vid`, with their decoded envelope."""
        rows = raw.filter(
            self._columns.get(
                ("records-of", topic, vid),
                lambda: (F.col("topic") == topic) & (F.col("_vid") == vid),
            )
        )
        text = self.schemas.text(vid)
        if self.config.decoder is Decoder.FASTAVRO:
            return with_envelope_fastavro(rows, text)
        return rows.withColumn(
            ENV, self._columns.get(("envelope", vid), lambda: envelope_column(text))
        )

    def process(self, batch: DataFrame, batch_id: int) -> BatchReport:
        started = time.perf_counter()
        cfg = self.config
        before = self._last or progress.latest(self.spark, cfg.progress_path)
        self._last = before
        if before.batch_id >= batch_id:
            self._check_replay(batch, batch_id, before)
            log.info(
                "batch %d already applied (progress has batch %d); skipping",
                batch_id,
                before.batch_id,
            )
            return BatchReport(batch_id, skipped=True, commit_lsn=before.commit_lsn)
        now_ms = self.clock_ms()
        framed = self._framed(batch, before).persist(CACHE)
        persisted: list[DataFrame] = [framed]
        try:
            after, report = self._process(framed, persisted, batch_id, before, now_ms)
        except BaseException:
            self._lake.clear()  # a table may have committed after its state was kept
            raise
        finally:
            for df in persisted:
                df.unpersist()
        self._last = after
        report = replace(report, seconds=time.perf_counter() - started)
        log.info(
            "batch %d: applied %d transaction(s) up to commit_lsn %d (%s); pending %d "
            "transaction(s), %d record(s), oldest %s; quarantined %d; %.1fs",
            batch_id,
            report.applied_transactions,
            report.commit_lsn,
            ", ".join(f"{t}: {n}" for t, n in report.changes_by_table.items()) or "no changes",
            report.pending_transactions,
            report.pending_records,
            f"{report.pending_oldest_age_s:.1f}s"
            if report.pending_oldest_age_s is not None
            else "-",
            report.quarantined,
            report.seconds,
        )
        return report

    def _check_replay(self, batch: DataFrame, batch_id: int, before: progress.Progress) -> None:
        """A batch the progress table has is skipped as a replay (Spark re-runs the batch a
        crash interrupted, with the offsets it logged). That is right only if the lake has read
        every record in it. A checkpoint restored from an older copy numbers its next batches
        as the lake's last ones but plans them anew: records past what the lake read would be
        skipped for good. One job, on replays only (a restart after a crash): it reads the
        batch from Kafka again, for the offsets of the records themselves (Spark's logged end
        offsets also count offsets without a record, such as Kafka's transaction markers)."""
        rows = batch.groupBy("topic", "partition").agg(F.max("offset").alias("last")).collect()
        beyond = progress.unread(
            before.kafka_offsets, [(r["topic"], r["partition"], r["last"]) for r in rows]
        )
        if not beyond:
            return
        topic, partition, last, next_read = beyond[0]
        had = f"up to offset {next_read - 1}" if next_read else "nothing from it"
        raise ConfigError(
            f"batch {batch_id} is one the lake at {self.config.lake_path} applied (its progress "
            f"reached batch {before.batch_id}, commit_lsn {before.commit_lsn}), but Spark's "
            f"checkpoint now gives it records the lake never read: {topic}[{partition}] "
            f"offsets {next_read}..{last}, where the lake had read {had}"
            + (f" (and {len(beyond) - 1} more partition(s))" if len(beyond) > 1 else "")
            + f". The checkpoint at {self.config.checkpoint_path} is older than the lake "
            "(restored from a copy?): skipping the batch would lose those records. Restore "
            "the checkpoint that goes with this lake, or use a new lake path."
        )

    # -- steps ----------------------------------------------------------------------------

    def _framed(self, batch: DataFrame, before: progress.Progress) -> DataFrame:
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
            # a shuffle of the whole batch, payloads and all; `_framing` checks it instead.
            old = pending.load(self.spark, self.config.pending_path, before.pending_version)
            rows = rows.unionByName(old)
        # The Kafka source gives one partition per topic partition, and every table's decode
        # below scans the whole cached batch: tables x partitions tasks, 90k tiny tasks for a
        # batch touching 300 tables. One partition per core keeps every core busy and makes
        # that tables x cores.
        rows = rows.coalesce(self.spark.sparkContext.defaultParallelism)
        return rows.withColumn("_vid", schema_id_col("value")).withColumn(
            "_kid", schema_id_col("key")
        )

    def _framing(self, framed: DataFrame, before: progress.Progress) -> _Framing:
        """Job 1: per topic partition and schema ids: the highest offset, the lowest offset
        read from Kafka (the waiting records have a first-seen time), and whether a key is not
        Confluent-framed. Classifies topics and fetches writer schemas."""
        prefix = self.config.topic_prefix
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
            elif not self._known(r["_vid"]):
                unknown_vids.add(r["_vid"])
            else:
                vids.add(r["_vid"])
            if kind is TopicKind.DATA:
                unframed |= bool(r["bad_key"])
                if r["_kid"] is not None:
                    (kids if self._known(r["_kid"]) else unknown_kids).add(r["_kid"])
        infos: list[_TopicInfo] = []
        marker_ids: list[int] = []
        for topic, (vids, kids) in sorted(by_topic.items()):
            if classify(prefix, topic) is TopicKind.TRANSACTION:
                marker_ids = sorted(vids)
                continue
            schema, _, table = topic[len(prefix) + 1 :].partition(".")
            infos.append(_TopicInfo(topic, schema, table, tuple(sorted(vids)), tuple(sorted(kids))))
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
        return _Framing(
            infos,
            marker_ids,
            [(t, p, o) for (t, p), o in sorted(offsets.items())],
            reject,
            sum(r["records"] for r in rows),
            rereads,
        )

    def _known(self, schema_id: int) -> bool:
        try:
            self.schemas.text(schema_id)
        except SchemaNotFound:
            return False
        return True

    def _reject(self, rows: DataFrame, batch_id: int, app_id: str = quarantine.FRAMING) -> int:
        """Quarantine the rows (with `_reason`), or stop naming the first. Returns how many."""
        first = rows.orderBy(*RECORD_ID_COLUMNS).limit(1).collect()
        if not first:
            return 0
        if self.config.quarantine_path:
            rows = rows.persist(CACHE)
            try:
                n = rows.count()
                quarantine.write(rows, self.config.quarantine_path, batch_id, app_id)
            finally:
                rows.unpersist()
            log.warning(
                "batch %d: %d undecodable record(s) quarantined to %s (first: %s[%d]@%d: %s)",
                batch_id,
                n,
                self.config.quarantine_path,
                first[0]["topic"],
                first[0]["partition"],
                first[0]["offset"],
                first[0]["_reason"],
            )
            return n
        r = first[0]
        cls = UnknownSchemaError if "unknown" in r["_reason"] else RecordError
        raise cls(r["topic"], r["partition"], r["offset"], r["_reason"])

    def _decode_tables(
        self, raw: DataFrame, infos: list[_TopicInfo], persisted: list[DataFrame]
    ) -> dict[str, _Table]:
        """One from_avro pass per writer schema id; versions of a table unioned by name.

        Building a table's frames is a few dozen Py4J calls, each analysed in the JVM: about a
        tenth of a second per table, which a batch touching hundreds of tables paid one table
        after the other. The tables are built on the MERGE threads instead (the JVM analyses
        queries side by side); `persist` only marks a frame, nothing runs here."""
        threads = max(1, min(self.config.merge_threads, len(infos)))
        with ThreadPoolExecutor(max_workers=threads) as pool:
            futures = [pool.submit(self._decode_table, raw, info) for info in infos]
        out: dict[str, _Table] = {}
        failed: BaseException | None = None
        for future in futures:  # every cache a table marked is dropped with the batch's
            try:
                table = future.result()
            except BaseException as exc:  # re-raised below, once the others are kept
                failed = failed or exc
                continue
            persisted.append(table.events)
            out[table.info.topic] = table
        if failed is not None:
            raise failed
        return out

    def _decode_table(self, raw: DataFrame, info: _TopicInfo) -> _Table:
        frames: list[DataFrame] = []
        columns: list[str] = []
        key = self._key(info, self.config.table_path(info.schema, info.table))
        keys = [key_fields(self.schemas.parsed(k)) for k in info.key_ids] or [key or ()]
        unique = True
        pg_names: dict[str, str] = {}
        for vid in info.value_ids:
            fields = row_fields(self.schemas.parsed(vid))
            pg_names |= {f.name: f.pg_name for f in fields if f.pg_name}
            names = {f.name for f in fields}
            unique &= all(bool(k) and set(k) < names for k in keys)
            select = self._columns.get(
                ("events", vid, key), partial(event_columns, fields, self.conversions, key or ())
            )
            frames.append(self._decode(raw, info.topic, vid).select(*select))
            columns += [c for c in self.conversions.lake_columns(fields) if c not in columns]
        df = union_all(frames, allow_missing=True)
        return _Table(info, df.persist(CACHE), tuple(columns), key, unique, pg_names)

    def _decode_markers(
        self, raw: DataFrame, marker_ids: list[int], persisted: list[DataFrame]
    ) -> DataFrame:
        topic = transaction_topic(self.config.topic_prefix)
        select = self._columns.get("markers", marker_columns)
        frames = [self._decode(raw, topic, vid).select(*select) for vid in marker_ids]
        df = (
            union_all(frames)
            if frames
            # An empty RDD has no partitions: no task, no Python worker.
            else self.spark.createDataFrame(self.spark.sparkContext.emptyRDD(), _MARKER_SCHEMA)
        )
        df = df.persist(CACHE)
        persisted.append(df)
        return df

    def _process(
        self,
        framed: DataFrame,
        persisted: list[DataFrame],
        batch_id: int,
        before: progress.Progress,
        now_ms: int,
    ) -> tuple[progress.Progress, BatchReport]:
        cfg = self.config
        steps: dict[str, float] = {}
        clock = time.perf_counter()

        def step(name: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            steps[name] = round(now - clock, 3)
            clock = now

        framing = self._framing(framed, before)
        raw = framed
        if framing.rereads and before.pending_version is not None:
            # Kafka was read again from further back than the last batch got to (Spark's
            # checkpoint was replaced by an older copy, say): a record may be here twice. The
            # waiting copy is kept: it knows when the record was first seen, and an append of
            # the pending state adds only records read now.
            log.warning(
                "batch %d re-reads Kafka records an earlier batch read (or a topic was "
                "re-created); keeping the waiting copy of each",
                batch_id,
            )
            waiting = framed.filter(F.col(FIRST_SEEN).isNotNull())
            read_now = framed.filter(F.col(FIRST_SEEN).isNull()).join(
                waiting.select(*RECORD_ID_COLUMNS), RECORD_ID_COLUMNS, "left_anti"
            )
            raw = waiting.unionByName(read_now).persist(CACHE)
            persisted.append(raw)
        step("framing")
        quarantined = 0
        if framing.reject is not None:
            quarantined = self._reject(
                raw.withColumn("_reason", framing.reject).filter(F.col("_reason").isNotNull()),
                batch_id,
            )
            raw = raw.filter(framing.reject.isNull())

        tables = self._decode_tables(raw, framing.topics, persisted)
        marker_df = self._decode_markers(raw, framing.marker_ids, persisted)
        with transaction_stats.summary_settings(framed.sparkSession):
            stats = transaction_stats.collect(
                [(t.events, t.key[0] if t.key else None) for t in tables.values()],
                marker_df,
                before.commit_lsn,
                message_topic(cfg.topic_prefix),
                now_ms,
                self._columns,
                in_spark=framing.records > _SPARK_PLANNING_RECORDS,
            )
        persisted.extend(stats.frames)
        step("decode+summary")
        if stats.bad:
            quarantined += self._reject_decoded(tables, marker_df, raw, batch_id)
            step("reject")

        with transaction_stats.summary_settings(framed.sparkSession):
            plan = stats.plan(before.commit_lsn)
        if (
            stale(plan.pending, now_ms, cfg.max_pending_age_s)
            or plan.pending_records > cfg.max_pending_records
        ):
            plan = replace(plan, pending=stats.describe(plan.pending))  # for the messages
        check_age(plan.pending, now_ms, cfg.max_pending_age_s)
        if plan.pending_records > cfg.max_pending_records:
            oldest = plan.oldest_pending
            raise TransactionError(
                f"{plan.pending_records} records of incomplete transactions wait (limit "
                f"{cfg.max_pending_records}); oldest: "
                + (f"tx {oldest.tx_id} ({', '.join(oldest.missing)})" if oldest else "-")
            )

        step("plan")
        # Tables whose snapshot the producer has not finished: an update of a row their
        # snapshot has not delivered yet is expected there (the snapshot row follows).
        snapshotting = self._snapshotting(raw, framing, before)
        step("snapshot state")

        # Tables are independent Delta logs: their MERGEs run side by side. A MERGE of a few
        # rows is mostly fixed latency (planning, several small jobs, the commit), so on a
        # small machine threads cut a multi-table batch to about its slowest table.
        versions = dict(before.table_versions)
        changes_by_table: dict[str, int] = {}
        for works, rewrite in self._merge_groups(plan.tables, tables):
            # In this order: the pool waits for its MERGEs before the setting is put back.
            with (
                merge.rewriting(self.spark) if rewrite else nullcontext(),
                ThreadPoolExecutor(max_workers=max(1, min(cfg.merge_threads, len(works)))) as pool,
            ):
                futures = {
                    w.collection: pool.submit(
                        self._apply,
                        tables[w.topic],
                        w,
                        plan,
                        before.table_versions.get(w.collection),
                        w.collection in snapshotting,
                    )
                    for w in works
                }
                for work in works:
                    version = futures[work.collection].result()
                    if version is not None:
                        versions[work.collection] = version
                        changes_by_table[work.collection] = work.events
        step("merge")

        pending_version = self._save_pending(
            tables, marker_df, raw, plan, now_ms, before.pending_version
        )
        step("pending")
        oldest_age = (
            (now_ms - plan.oldest_pending.first_seen_ms) / 1000 if plan.oldest_pending else None
        )
        after = progress.Progress(
            batch_id=batch_id,
            commit_lsn=plan.watermark_after,
            table_versions=versions,
            kafka_offsets=progress.merge_offsets(before.kafka_offsets, framing.offsets),
            pending_version=pending_version,
            snapshotting=snapshotting,
        )
        progress.append(
            self.spark,
            cfg.progress_path,
            batch_id,
            after,
            plan.applied_transactions,
            plan.pending_transactions,
            oldest_age,
            sorted(snapshotting),
            before.batch_id >= 0,  # a progress row was read or written: the table exists
        )
        step("progress")
        written = [
            cfg.table_path(tables[w.topic].info.schema, tables[w.topic].info.table)
            for w in plan.tables
        ]
        written += [cfg.progress_path] + ([cfg.pending_path] if pending_version is not None else [])
        if quarantined and cfg.quarantine_path:
            written.append(cfg.quarantine_path)
        self.checkpoints.request(written)
        return after, BatchReport(
            batch_id=batch_id,
            commit_lsn=plan.watermark_after,
            commit_ts_ms=plan.commit_ts_ms,
            applied_transactions=plan.applied_transactions,
            changes_by_table=changes_by_table,
            table_versions=versions,
            pending_transactions=plan.pending_transactions,
            pending_records=plan.pending_records,
            pending_oldest_age_s=oldest_age,
            quarantined=quarantined,
            steps=steps,
        )

    def _merge_groups(
        self, works: tuple[TableWork, ...], tables: dict[str, _Table]
    ) -> list[tuple[tuple[TableWork, ...], bool]]:
        """The tables' MERGEs in the order they run, as (tables, rewrite): first those that
        write deletion vectors or never would (a table without them, only inserts, no key),
        then the small tables whose MERGE would write them but rewrites the files it touches
        instead (`merge.rewriting`: a session setting, so the two kinds cannot run side by
        side, and a table waits in the second group only when it gains from it)."""
        below = self.config.lake_rewrite_below_bytes
        # Keyless tables are appended to (a truncate is a DELETE, which the setting leaves be);
        # distinct inserts may take the insert-only MERGE, which marks no row.
        may_mark = [w for w in works if tables[w.topic].key and not w.only_distinct_inserts]
        if not (below and self.config.lake_deletion_vectors and may_mark):
            return [(works, False)]
        paths = [
            self.config.table_path(tables[w.topic].info.schema, tables[w.topic].info.table)
            for w in may_mark
        ]
        # The first batch reads each table's log here (on threads, as the MERGEs would).
        with ThreadPoolExecutor(
            max_workers=max(1, min(self.config.merge_threads, len(may_mark)))
        ) as pool:
            lakes = pool.map(self._lake_table, paths)
            small = {
                w.collection
                for w, lake in zip(may_mark, lakes, strict=True)
                if merge.rewrites(lake, below)
            }
        groups = (
            (tuple(w for w in works if w.collection not in small), False),
            (tuple(w for w in works if w.collection in small), True),
        )
        return [(group, rewrite) for group, rewrite in groups if group]

    def _apply(
        self,
        table: _Table,
        work: TableWork,
        plan: Plan,
        recorded_version: int | None,
        snapshotting: bool,
    ) -> int | None:
        """MERGE one table's share of the applied transactions; its Delta version, or None
        when there was nothing to do (truncates of a table the lake never had).
        `recorded_version`: the table's version in the last progress row."""
        info = table.info
        path = self.config.table_path(info.schema, info.table)
        key = table.key
        if key is None:
            if work.only_truncates:
                return None
            key = ()  # no key schema and no table yet: the source table has no replica identity
        known = self._lake.get(path)
        lake = self._lake_table(path)
        if path not in self._mode_checked:
            merge.check_deletion_vectors(
                f"{info.schema}.{info.table}", lake, self.config.lake_deletion_vectors
            )
            self._mode_checked.add(path)
        lo, hi = plan.watermark_before, plan.watermark_after
        changes = table.events.filter(
            codegen_stable.greater(COMMIT_LSN, lo)
            & codegen_stable.at_most(COMMIT_LSN, hi)
            & self._columns.get("usable", transaction_stats.usable)
        ).drop(OK)
        tc = merge.TableChanges(
            info.schema,
            info.table,
            path,
            key,
            table.columns,
            changes,
            truncate=work.truncate,
            toast_columns=work.toast_columns,
            key_min=work.key_min,
            key_max=work.key_max,
            only_distinct_inserts=work.only_distinct_inserts,
            unique_key=table.unique_key,
            recorded_version=recorded_version,
            snapshotting=snapshotting,
            pg_names=table.pg_names,
            deletion_vectors=self.config.lake_deletion_vectors,
            lake=lake,
            handle=known.handle if isinstance(known, merge.Applied) else None,
            commit_lsns=(lo, hi),
            cache=self._columns,
        )
        applied = merge.apply(self.spark, tc)
        self._lake[path] = applied
        return applied.version

    def _lake_table(self, path: str) -> lake_state.LakeTable:
        known = self._lake.get(path)
        if isinstance(known, merge.Applied):
            return known.lake
        if known is None:
            known = self._lake[path] = lake_state.read(self.spark, path)
        return known

    def _snapshotting(
        self, raw: DataFrame, framing: _Framing, before: progress.Progress
    ) -> frozenset[str]:
        """The producer's unfinished snapshots: the last progress row's, updated by this
        batch's records of ``<prefix>.snapshot`` (one per chunk: a few per batch, collected
        only when the batch has any)."""
        topic = snapshot_topic(self.config.topic_prefix)
        if not any(t == topic for t, _p, _o in framing.offsets):
            return before.snapshotting
        rows = (
            raw.filter(F.col("topic") == topic)
            .select("key", "value", "partition", "offset")
            .orderBy("partition", "offset")
            .collect()
        )
        return snapshot_state.follow(
            before.snapshotting,
            [(bytes(r["key"]), None if r["value"] is None else bytes(r["value"])) for r in rows],
        )

    def _save_pending(
        self,
        tables: dict[str, _Table],
        marker_df: DataFrame,
        raw: DataFrame,
        plan: Plan,
        now_ms: int,
        pending_before: int | None,
    ) -> int | None:
        """Records of later transactions wait in the pending table; None when none wait.

        When the batch applied nothing, every record that waited still waits: only this
        batch's records are appended. So a source transaction larger than a batch (5M rows
        read over many capped batches) writes each record once, not once per batch."""
        if not plan.pending_transactions:
            return None
        # Append only onto the very version this batch read: after a crash that wrote a newer
        # one, overwrite (the replay rebuilds the state from the version read).
        append = (
            plan.applied_transactions == 0
            and pending_before is not None
            and table_version(self.spark, self.config.pending_path) == pending_before
        )
        later = codegen_stable.greater(COMMIT_LSN, plan.watermark_after)
        coords = [
            F.col(TOPIC).alias("topic"),
            F.col(PARTITION).alias("partition"),
            F.col(OFFSET).alias("offset"),
        ]
        waiting = union_all(
            [
                t.events.filter(transaction_stats.usable() & later).select(*coords)
                for t in tables.values()
            ]
            + [marker_df.filter(F.col(OK) & later).select(*coords)],
        )
        if plan.pending_records <= _BROADCAST_PENDING:
            # Spark cannot know that so few rows wait (their frames are cached whole), so it
            # shuffled the whole batch, payloads and all, to join them: ~0.8 s per catch-up batch.
            waiting = F.broadcast(waiting)
        rows = raw.join(waiting, RECORD_ID_COLUMNS, "left_semi")
        if append:
            rows = rows.filter(F.col(FIRST_SEEN).isNull())  # read by this batch, not before
        first_seen = codegen_stable.or_value(FIRST_SEEN, now_ms)  # null: read now
        return pending.save(
            self.spark,
            self.config.pending_path,
            rows.withColumn(FIRST_SEEN, first_seen),
            append=append,
        )

    def _key(self, info: _TopicInfo, path: str) -> tuple[str, ...] | None:
        if info.key_ids:
            # The newest key schema of the batch names the replica identity columns.
            return key_fields(self.schemas.parsed(max(info.key_ids)))
        return merge.stored_key(self._lake_table(path))

    def _reject_decoded(
        self, tables: dict[str, _Table], marker_df: DataFrame, raw: DataFrame, batch_id: int
    ) -> int:
        """Bodies that did not decode, and data events outside any transaction: stop, or
        quarantine them (the plan then leaves them out, as `transaction_stats.usable` does)."""
        coords = [
            F.col(TOPIC).alias("topic"),
            F.col(PARTITION).alias("partition"),
            F.col(OFFSET).alias("offset"),
        ]
        bad = union_all(
            [
                t.events.filter(transaction_stats.bad_reason().isNotNull()).select(
                    *coords, transaction_stats.bad_reason().alias("_reason")
                )
                for t in tables.values()
            ]
            + [
                marker_df.filter(~F.col(OK)).select(
                    *coords, F.lit(transaction_stats.NOT_DECODED).alias("_reason")
                )
            ],
        )
        return self._reject(
            raw.join(bad, RECORD_ID_COLUMNS, "inner"), batch_id, quarantine.DECODING
        )


_MARKER_SCHEMA = (
    "_topic string, _partition int, _offset long, _first_seen long, _status string, "
    "_tx_id string, _commit_lsn long, _ts_ms long, _event_count long, "
    "_data_collections array<struct<data_collection:string,event_count:long>>, _ok boolean"
)
