"""Unchanged TOAST values across a primary-key change.

PostgreSQL does not resend an unchanged TOASTed value, not even when the row's key changes. The
producer turns a key change into d(old key) + c(new key) and gives the create a ``before``: the
replaced row's key. That create lists the value in ``unchanged_toast``, and the new key has no
row in the lake to keep it from, so it is taken from the old key instead: from the latest
earlier change of the old key in this batch that carried it, else from the lake's row of the
old key (which the batch's delete has not removed yet: this runs before the MERGE).

Chains of key changes inside one batch (A -> B -> C) resolve one hop per pass; a value that
cannot be found stays listed, and the MERGE's check then stops with an error naming the key.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_consumer.columns import COMMIT_LSN, OP, TOAST, TOTAL_ORDER

MOVED_FROM_PREFIX = "_from_"  # per key column: the replaced row's key (creates after a key change)
MAX_PASSES = 4


def moved_from_columns(key: tuple[str, ...]) -> list[str]:
    return [MOVED_FROM_PREFIX + k for k in key]


def _order(prefix: str = "") -> Column:
    return F.struct(F.col(prefix + COMMIT_LSN), F.col(prefix + TOTAL_ORDER))


def resolve_moved_toast(
    changes: DataFrame, lake: DataFrame, key: tuple[str, ...], toast_cols: list[str]
) -> DataFrame:
    """``changes`` with the unchanged-TOAST columns of key-change creates filled in and removed
    from their ``unchanged_toast`` lists, wherever the old key's value can be found."""
    from_cols = moved_from_columns(key)
    if not toast_cols or not all(c in changes.columns for c in from_cols):
        return changes
    moved_cond = (
        (F.col(OP) == "c")
        & F.col(from_cols[0]).isNotNull()
        & F.exists(F.col(TOAST), lambda x: x.isin(*toast_cols))
    )
    waiting = changes.filter(moved_cond).count()
    for _ in range(MAX_PASSES):
        if waiting == 0:
            break
        # A pass reads its input four times (the moved creates, the rest, the carriers, and
        # through the join), so without a cut the plan of pass k holds 4^k copies of the
        # batch's: a catch-up batch with chains of key changes (the torture run's renumbered
        # accounts) ran the driver's heap out while analysing pass 3. A local checkpoint
        # computes each pass once (the count below and the next pass read its rows) and starts
        # the next pass's plan from them. It lives in the executors' block stores, not in
        # reliable storage: an executor lost during the batch fails the batch, which then runs
        # again from Kafka.
        changes = _resolve_one_hop(changes, lake, key, toast_cols, moved_cond).localCheckpoint()
        still = changes.filter(moved_cond).count()
        if still == waiting:  # nothing more can be found; the MERGE's check names what is left
            break
        waiting = still
    return changes


def _resolve_one_hop(
    changes: DataFrame,
    lake: DataFrame,
    key: tuple[str, ...],
    toast_cols: list[str],
    moved_cond: Column,
) -> DataFrame:
    from_cols = moved_from_columns(key)
    moved = changes.filter(moved_cond)
    rest = changes.filter(~moved_cond)

    # Who may hold the value: earlier changes of the old key in this batch that carried it (not
    # deletes), and the lake's row of the old key, older than anything in the batch.
    carriers = changes.filter(F.col(OP) != "d").select(
        *[F.col(k).alias(f"_c_{k}") for k in key],
        F.col(COMMIT_LSN).alias("_c_lsn"),
        F.col(TOTAL_ORDER).alias("_c_order"),
        *[F.col(c).alias(f"_c_v_{c}") for c in toast_cols],
        *[(~F.array_contains(F.col(TOAST), c)).alias(f"_c_has_{c}") for c in toast_cols],
    )
    # A column the lake does not have yet (added at the source in this batch) holds nothing there.
    in_lake = set(lake.columns)
    lake_rows = lake.select(
        *[F.col(k).alias(f"_c_{k}") for k in key],
        F.lit(-1).cast("long").alias("_c_lsn"),
        F.lit(-1).cast("long").alias("_c_order"),
        *[
            (F.col(c) if c in in_lake else F.lit(None))
            .cast(changes.schema[c].dataType)
            .alias(f"_c_v_{c}")
            for c in toast_cols
        ],
        *[F.lit(c in in_lake).alias(f"_c_has_{c}") for c in toast_cols],
    )
    candidates = carriers.unionByName(lake_rows)

    ids = moved.select(
        F.col(COMMIT_LSN).alias("_m_lsn"), F.col(TOTAL_ORDER).alias("_m_order"), *from_cols
    )
    earlier = (F.col("_c_lsn") < F.col("_m_lsn")) | (
        (F.col("_c_lsn") == F.col("_m_lsn")) & (F.col("_c_order") < F.col("_m_order"))
    )
    on = [F.col(f) == F.col(f"_c_{k}") for f, k in zip(from_cols, key, strict=True)]
    joined = ids.join(candidates, on, "inner").filter(earlier)
    aggs = []
    for c in toast_cols:
        when_has = F.when(F.col(f"_c_has_{c}"), F.struct(F.col("_c_lsn"), F.col("_c_order")))
        # max_by skips candidates whose ordering value is null: those that did not carry c.
        aggs.append(F.max_by(F.struct(F.col(f"_c_v_{c}").alias("v")), when_has).alias(f"_r_{c}"))
        aggs.append(F.max(F.col(f"_c_has_{c}").cast("int")).alias(f"_r_has_{c}"))
    found = joined.groupBy("_m_lsn", "_m_order").agg(*aggs)

    filled = moved.join(
        found,
        (F.col(COMMIT_LSN) == F.col("_m_lsn")) & (F.col(TOTAL_ORDER) == F.col("_m_order")),
        "left",
    )
    toast = F.col(TOAST)
    exprs: dict[str, Column] = {}
    for c in toast_cols:
        resolved = F.array_contains(toast, c) & (F.coalesce(F.col(f"_r_has_{c}"), F.lit(0)) == 1)
        exprs[c] = F.when(resolved, F.col(f"_r_{c}")["v"]).otherwise(F.col(c))
        toast = F.when(resolved, F.array_remove(toast, c)).otherwise(toast)
    exprs[TOAST] = toast
    filled = filled.withColumns(exprs).select(*changes.columns)
    # Resolved creates no longer qualify as moved-with-TOAST, so the next pass skips them; a
    # create whose old key had no carrier keeps its list (and the MERGE check names it).
    return rest.unionByName(filled)
