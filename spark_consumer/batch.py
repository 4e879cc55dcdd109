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

This module is the driver loop: the order of the steps, the plan's limits, the pending state,
the snapshot state and the progress row. The steps with state or size of their own live beside
it: job 1 (batch_framing.py), decoding (batch_decode.py), the MERGEs and what is known of each
lake table between batches (merge_runner.py), and the report (batch_report.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from schemas import snapshot_state
from schemas.topics import message_topic, snapshot_topic
from spark_consumer import (
    batch_cap,
    batch_framing,
    batch_report,
    checkpoints,
    codegen_stable,
    freed_memory,
    kafka_ends,
    offset_log,
    pending,
    pending_redaction,
    progress,
    quarantine,
    transaction_stats,
)
from spark_consumer.batch_decode import BatchDecoder, DecodedTable
from spark_consumer.batch_framing import RECORD_ID_COLUMNS, Framing
from spark_consumer.batch_report import BatchReport
from spark_consumer.cache_level import CACHE
from spark_consumer.column_cache import ColumnCache
from spark_consumer.columns import COMMIT_LSN, FIRST_SEEN, OFFSET, OK, PARTITION, TOPIC
from spark_consumer.config import ConsumerConfig
from spark_consumer.conversions import DEFAULT_CONVERSIONS, FieldConversions
from spark_consumer.delta_version import table_version
from spark_consumer.errors import (
    ConfigError,
    ConsumerError,
    RecordError,
    TransactionError,
    UnknownSchemaError,
)
from spark_consumer.maintenance_runner import Maintainer
from spark_consumer.merge_runner import MergeRunner
from spark_consumer.metrics import ConsumerMetrics
from spark_consumer.reassembly import Plan, check_age, stale
from spark_consumer.union import union_all
from spark_consumer.writer_schemas import WriterSchemas

log = logging.getLogger("walbridge.consumer")

# Up to this many waiting records, the pending save sends their coordinates (topic, partition,
# offset: ~40 bytes each, ~10 MB at most) to every task instead of shuffling the batch. Fixed
# here, apart from the batch cap, so that raising the cap cannot grow the broadcast.
_BROADCAST_PENDING = 250_000
# A batch of more records than this is planned in Spark, a smaller one on the driver
# (transaction_stats.py): Spark's way costs a shuffle and a small job more, the driver's brings
# back a row per (transaction, table).
_SPARK_PLANNING_RECORDS = 100_000


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
        # The last batches' reports (batch_report.keep bounds them), for tests and benchmarks.
        self.reports: list[BatchReport] = []
        self._warm = False  # a batch applied by this process already (its JVM is warm)
        # The progress row of the last batch this process applied: this job is the table's
        # only writer, so it is read from Delta once, at the first batch.
        self._last: progress.Progress | None = None
        # The Kafka end offsets of the last batch whose offsets log entry was read (_planned).
        self._last_planned: tuple[int, batch_cap.Offsets] | None = None
        self.checkpoints = checkpoints.Checkpointer(spark)
        # Expressions every batch builds alike (per writer schema, table key): once per process.
        self._columns = ColumnCache()
        # The batch's two stateful steps, sharing those expressions: decoding, and the MERGEs
        # (which keep each lake table's state between batches).
        self._merges = MergeRunner(spark, config, self._columns)
        self._decoder = BatchDecoder(
            spark, config, schemas, conversions, self._columns, self._merges.lake_table
        )
        # Compaction and VACUUM between batches (issue 40), within the maintenance budget.
        self.maintenance = Maintainer(
            spark,
            config,
            self._merges.lake_table,
            self._merges.forget_table,
            metrics.lake if metrics is not None else None,
        )

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self.apply(batch, batch_id, from_query=True)

    def apply(self, batch: DataFrame, batch_id: int, from_query: bool = False) -> BatchReport:
        """One batch as the query runs it: `process`, then its metrics and the maintenance
        between batches. Tests and benchmarks that hand batches over directly call this with
        ``from_query`` false (there is no offsets log to read the cap from)."""
        try:
            report = self.process(batch, batch_id, from_query=from_query)
        finally:
            freed_memory.release()
        batch_report.keep(self.reports, report)
        if self.metrics is not None:
            self.metrics.observe_batch(report, self.clock_ms())
        self.maintenance.run(report.seconds)  # after the progress row: the batch is visible
        return report

    def close(self) -> None:
        """Let the Delta checkpoint in progress finish (the others wait for the next run)."""
        self.checkpoints.close()

    def process(self, batch: DataFrame, batch_id: int, from_query: bool = False) -> BatchReport:
        """Apply one batch. ``from_query``: the batch comes from the streaming query, whose
        offsets log tells where Spark's Kafka source started and ended it (a batch given
        directly, as tests do, was cut by no cap)."""
        started = time.perf_counter()
        cfg = self.config
        first_steps: dict[str, float] = {}
        before = self._last
        if before is None:  # once per process: the progress table's last row, from Delta
            before = progress.latest(self.spark, cfg.progress_path)
            first_steps["progress read"] = round(time.perf_counter() - started, 3)
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
        framed = batch_framing.framed(self.spark, batch, before, cfg.pending_path).persist(CACHE)
        persisted: list[DataFrame] = [framed]
        try:
            after, report = self._process(framed, persisted, batch_id, before, now_ms, from_query)
        except BaseException:
            self._merges.forget()  # a table may have committed after its state was kept
            raise
        finally:
            for df in persisted:
                df.unpersist()
        self._last = after
        report = replace(
            report, seconds=time.perf_counter() - started, steps=first_steps | report.steps
        )
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
        # A process's first batch runs on a cold JVM (class loading, code generation, the JIT,
        # each table's Delta log): where a restart's time goes, so it is shown at INFO.
        log.log(
            logging.DEBUG if self._warm else logging.INFO,
            "batch %d steps (s): %s",
            batch_id,
            ", ".join(f"{name} {seconds:.2f}" for name, seconds in report.steps.items()),
        )
        self._warm = True
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

    def _process(
        self,
        framed: DataFrame,
        persisted: list[DataFrame],
        batch_id: int,
        before: progress.Progress,
        now_ms: int,
        from_query: bool,
    ) -> tuple[progress.Progress, BatchReport]:
        cfg = self.config
        steps: dict[str, float] = {}
        clock = time.perf_counter()

        def step(name: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            steps[name] = round(now - clock, 3)
            clock = now

        framing = batch_framing.framing(framed, before, cfg.topic_prefix, self.schemas)
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

        tables = self._decoder.decode_tables(raw, framing.topics, persisted)
        marker_df = self._decoder.decode_markers(raw, framing.marker_ids, persisted)
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
        planned = self._planned(batch_id, before) if from_query else None
        snapshotting = self._snapshotting(raw, framing, before, planned)
        step("snapshot state")

        versions, changes_by_table = self._merges.run(plan, tables, before, snapshotting)
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
        # The layouts' history and changelog tables (those that exist) need the same Delta
        # checkpoints (the session's table defaults leave them to us) and compaction as the
        # tables they follow.
        written += [
            path
            for w in plan.tables
            for name, path in self._merges.layout(
                tables[w.topic], w.collection
            ).extra_tables.items()
            if name in versions
        ]
        written += [cfg.progress_path] + ([cfg.pending_path] if pending_version is not None else [])
        if quarantined and cfg.quarantine_path:
            written.append(cfg.quarantine_path)
        self.checkpoints.request(written)
        self.maintenance.request(written, pending_version)
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

    def _planned(self, batch_id: int, before: progress.Progress) -> batch_cap.Planned:
        """Where Spark's Kafka source started and ended this batch, from the offsets log's
        entries for it and the one before (the progress row's offsets, lower or equal, when
        that one is gone). The last entry read is kept: the next batch starts where it ends."""
        path = self.config.checkpoint_path
        text = offset_log.entry(self.spark, path, batch_id)
        if text is None:  # Spark writes it before it runs the batch
            raise ConsumerError(
                f"batch {batch_id} has no entry in the query's offsets log at {path}/offsets: "
                "is --checkpoint-path the query's checkpoint?"
            )
        end = batch_cap.parse_entry(text)
        if self._last_planned is not None and self._last_planned[0] == batch_id - 1:
            start = self._last_planned[1]
        else:
            prior = offset_log.entry(self.spark, path, batch_id - 1)
            start = before.kafka_offsets if prior is None else batch_cap.parse_entry(prior)
        self._last_planned = (batch_id, end)
        return batch_cap.Planned(start, end)

    def _snapshotting(
        self,
        raw: DataFrame,
        framing: Framing,
        before: progress.Progress,
        planned: batch_cap.Planned | None,
    ) -> frozenset[str]:
        """The producer's unfinished snapshots: the last progress row's, updated by this
        batch's records of ``<prefix>.snapshot`` (one per chunk: a few per batch, collected
        only when the batch has any). ``planned``: where the batch started and ended in Kafka
        (None for a batch not from the streaming query: no cap cut it short).

        A table stays unfinished until the lake holds its snapshot's last rows, not only
        until the batch reads the record that says the snapshot is done. Under a cap on
        records per batch, Spark's Kafka source gives each partition a share of the cap in
        proportion to its backlog, so the snapshot topic (a record per chunk) can be read
        batches ahead of the data topics: a batch could read the "done" record while updates
        of rows not yet read, and the snapshot's reads of them, are still to come. So "done"
        takes effect in a batch that read every record Kafka had when Spark planned it: every
        record written before the "done" record is then in it or in an earlier batch. That
        holds when the cap did not cut the batch (batch_cap.py tells from the offsets), or
        when it may have but Kafka has nothing past where the batch ended; and when Spark
        knew every subscribed topic (it finds new ones every few seconds, a small table's
        whole snapshot can be quicker). A table kept unfinished so is checked against the
        topic's latest record by the next such batch (``snapshot_state.unfinished_in_batch``).
        The start of a snapshot can be read late in the same way, so a cut batch also counts
        every snapshot the topic's latest records show unfinished (the topic is small: one
        record per table). The progress row's ``snapshotting`` is this set."""
        cfg = self.config
        topic = snapshot_topic(cfg.topic_prefix)
        seen: list[tuple[bytes, bytes | None]] = []
        if any(t == topic for t, _p, _o in framing.offsets):
            rows = (
                raw.filter(F.col("topic") == topic)
                .select("key", "value", "partition", "offset")
                .orderBy("partition", "offset")
                .collect()
            )
            seen = [
                (bytes(r["key"]), None if r["value"] is None else bytes(r["value"])) for r in rows
            ]
        conf = {**cfg.kafka_config, "bootstrap.servers": cfg.kafka_bootstrap}
        cut = planned is not None and batch_cap.cut_by_cap(
            planned.start, planned.end, cfg.max_offsets_per_trigger
        )
        whole = not cut
        if planned is not None and (seen or before.snapshotting):  # a snapshot may finish
            ends = kafka_ends.committed_ends(conf, cfg.topic_prefix)
            whole = batch_cap.reads_all(planned.end, ends, cut)
        unfinished, to_check = snapshot_state.unfinished_in_batch(before.snapshotting, seen, whole)
        if whole and not to_check:
            return unfinished
        latest = snapshot_state.load(conf, topic)
        if not whole:
            # The start of a snapshot can lag too: a table's first record may lie past what
            # the cap let this batch read of the snapshot topic, its rows not.
            return unfinished | {t for t, s in latest.items() if not s.complete}
        # No record (a tombstone) or a complete one: done.
        return unfinished - {t for t in to_check if t not in latest or latest[t].complete}

    def _save_pending(
        self,
        tables: dict[str, DecodedTable],
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
            pending_redaction.redacted(
                rows.withColumn(FIRST_SEEN, first_seen), self._redactions(tables)
            ),
            append=append,
        )

    def _redactions(
        self, tables: dict[str, DecodedTable]
    ) -> dict[str, dict[int, pending_redaction.Redaction]]:
        """Per data topic whose table leaves columns out, what to empty in each writer schema's
        values before they wait in the pending table (pending_redaction.py)."""
        out: dict[str, dict[int, pending_redaction.Redaction]] = {}
        for topic, t in tables.items():
            opts = self.config.lake_tables_config.of_collection(f"{t.info.schema}.{t.info.table}")
            if opts.columns is None and not opts.except_columns:
                continue
            by_id = {
                i: r
                for i in t.info.value_ids
                if (r := pending_redaction.redaction(self.schemas.parsed(i), opts)) is not None
            }
            if by_id:
                out[topic] = by_id
        return out

    def _reject_decoded(
        self, tables: dict[str, DecodedTable], marker_df: DataFrame, raw: DataFrame, batch_id: int
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
