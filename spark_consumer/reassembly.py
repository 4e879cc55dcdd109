"""Transaction reassembly: which source transactions a batch may apply.

A transaction is complete when its END marker is present and, for every table collection in
the marker's `data_collections`, exactly that many distinct data events (by commit_lsn,
total_order) have arrived. A batch applies the prefix of commit order made of complete
transactions, up to (not including) the first transaction whose END is present but whose
events are not all here yet. Everything later waits.

Why the prefix is safe: the transaction topic has one partition and markers are published
in commit order, so when a batch holds T's END it also holds (or held) the END of every
transaction committed before T. Data events without an END belong to transactions committed
after every END seen, unless the producer broke the contract (reported as an error).

The Spark side computes a per-transaction summary; the decisions are pure (`plan`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_consumer import envelope as E
from spark_consumer.errors import TransactionError


@dataclass(frozen=True)
class TxSummary:
    """One pending or blocking transaction, for error messages and logs."""

    tx_id: str
    commit_lsn: int
    has_end: bool
    missing: tuple[str, ...]  # "<collection>: <seen> of <expected>"
    first_seen_ms: int  # when the consumer first read any of its records (epoch ms)


@dataclass(frozen=True)
class Plan:
    watermark_before: int  # commit_lsn applied before this batch (-1: nothing yet)
    watermark_after: int   # commit_lsn applied after this batch
    applied_transactions: int
    pending_transactions: int
    oldest_pending: TxSummary | None


def per_transaction(events: DataFrame, marker_rows: DataFrame, watermark: int,
                    message_collection: str) -> DataFrame:
    """Summary per transaction above the watermark: tx id, commit_lsn, has_end, complete,
    first_seen, missing (descriptions of collections whose counts differ)."""
    ev = (events.filter(F.col(E.COMMIT_LSN) > watermark)
          .dropDuplicates([E.COMMIT_LSN, E.TOTAL_ORDER]))
    seen = ev.groupBy(E.TX_ID, F.concat_ws(".", E.SCHEMA, E.TABLE).alias("coll")).agg(
        F.count(F.lit(1)).alias("n_seen"),
        F.min(E.FIRST_SEEN).alias("seen_first"),
        F.max(E.COMMIT_LSN).alias("seen_lsn"),
    )
    ends = (marker_rows.filter((F.col("_status") == "END") & (F.col(E.COMMIT_LSN) > watermark))
            .dropDuplicates([E.TX_ID]))
    expected = (
        ends.select(E.TX_ID, F.explode_outer("_data_collections").alias("dc"))
        .select(E.TX_ID, F.col("dc.data_collection").alias("coll"),
                F.col("dc.event_count").alias("n_expected"))
        .filter(F.col("coll").isNotNull() & (F.col("coll") != message_collection))
    )
    colls = expected.join(seen, [E.TX_ID, "coll"], "full_outer").withColumn(
        "match", F.coalesce("n_expected", F.lit(0)) == F.coalesce("n_seen", F.lit(0))
    )
    by_tx = colls.groupBy(E.TX_ID).agg(
        F.min(F.col("match").cast("int")).alias("all_match"),
        F.collect_list(F.when(~F.col("match"), F.format_string(
            "%s: %d of %d events", "coll", F.coalesce("n_seen", F.lit(0)),
            F.coalesce("n_expected", F.lit(0))))).alias("missing"),
        F.min("seen_first").alias("seen_first"),
        F.max("seen_lsn").alias("seen_lsn"),
    )
    end_info = ends.select(E.TX_ID, F.col(E.COMMIT_LSN).alias("end_lsn"),
                           F.col(E.FIRST_SEEN).alias("end_first"))
    return (
        by_tx.join(end_info, E.TX_ID, "full_outer")
        .select(
            E.TX_ID,
            F.coalesce("end_lsn", "seen_lsn").alias(E.COMMIT_LSN),
            F.col("end_lsn").isNotNull().alias("has_end"),
            (F.col("end_lsn").isNotNull() & (F.coalesce("all_match", F.lit(1)) == 1))
            .alias("complete"),
            F.least("end_first", "seen_first").alias(E.FIRST_SEEN),
            F.coalesce("missing", F.array().cast("array<string>")).alias("missing"),
        )
    )


def _summary(row: object) -> TxSummary:
    r = row.asDict()  # type: ignore[attr-defined]
    return TxSummary(r[E.TX_ID], r[E.COMMIT_LSN], r["has_end"],
                     tuple(r["missing"] or ()) or (("END marker not seen yet",)
                                                    if not r["has_end"] else ()),
                     r[E.FIRST_SEEN])


def plan_batch(summary: DataFrame, watermark: int) -> tuple[Plan, list[TxSummary]]:
    """Run the few small aggregations over the summary and decide (pure `decide`).

    Returns the plan and the oldest pending transactions (up to 5) for messages.
    """
    first = summary.agg(
        F.min(F.when(F.col("has_end") & ~F.col("complete"), F.col(E.COMMIT_LSN))).alias("cut"),
    ).first()
    cutoff = first["cut"] if first else None
    applicable = F.col("complete") & (F.lit(True) if cutoff is None
                                      else F.col(E.COMMIT_LSN) < cutoff)
    agg = summary.agg(
        F.max(F.when(applicable, F.col(E.COMMIT_LSN))).alias("w_after"),
        F.sum(applicable.cast("int")).alias("n_applied"),
    ).first()
    w_after = agg["w_after"] if agg and agg["w_after"] is not None else watermark
    orphans = (summary.filter(~F.col("has_end") & (F.col(E.COMMIT_LSN) <= w_after))
               .orderBy(E.COMMIT_LSN).limit(5).collect())
    if orphans:
        raise TransactionError(
            "data events without an END marker although later transactions ended "
            "(is the transaction topic single-partition, and are markers published?): "
            + "; ".join(f"tx {o[E.TX_ID]} at commit_lsn {o[E.COMMIT_LSN]}" for o in orphans)
        )
    pend = summary.filter(F.col(E.COMMIT_LSN) > w_after)
    counts = pend.agg(F.count(F.lit(1)).alias("n")).first()
    oldest = [_summary(r) for r in pend.orderBy(E.FIRST_SEEN, E.COMMIT_LSN).limit(5).collect()]
    plan = Plan(
        watermark_before=watermark,
        watermark_after=w_after,
        applied_transactions=int(agg["n_applied"] or 0) if agg else 0,
        pending_transactions=int(counts["n"]) if counts else 0,
        oldest_pending=oldest[0] if oldest else None,
    )
    return plan, oldest


def check_age(oldest: list[TxSummary], now_ms: int, max_age_s: float) -> None:
    """An incomplete transaction older than the limit stops the job, naming it."""
    stale = [t for t in oldest if (now_ms - t.first_seen_ms) / 1000 > max_age_s]
    if stale:
        raise TransactionError(
            f"transaction(s) incomplete for more than {max_age_s:.0f}s: "
            + "; ".join(f"tx {t.tx_id} (commit_lsn {t.commit_lsn}, first seen "
                        f"{(now_ms - t.first_seen_ms) / 1000:.0f}s ago): {', '.join(t.missing)}" for t in stale)
        )
