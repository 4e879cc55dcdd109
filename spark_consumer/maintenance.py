"""Lake maintenance with Delta's own commands: compaction (OPTIMIZE, bin-packing small files;
files whose deletion vectors mark enough rows are rewritten without them), the full fold of
deletion vectors (REORG TABLE ... APPLY (PURGE), on request), VACUUM within the consistent-read
retention, and the expiry of progress rows older than it. The rules (when, what size, how
long) are maintenance_policy.py's; the consumer's between-batch scheduling is
maintenance_runner.py's, the `maintain` and `status` commands maintenance_command.py's.

The retention promise: every table version that a progress row applied within the window
names stays readable. Such a version's files were all live when its row was written (or were
removed at most one batch before, by a concurrent writer), so VACUUM, which removes only files
removed from the table longer ago than `delta.deletedFileRetentionDuration`, leaves them when
that property is the window plus a margin (`Retention.kept_s`); `delta.logRetentionDuration`
is set alike, so the log still reaches back to those versions. A plain `VACUUM` by a user reads
the same property. Each table's properties are set at its first maintenance.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import ExitStack
from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_consumer import lake_state, session_conf
from spark_consumer import maintenance_policy as mp
from spark_consumer.delta_conflicts import retry_on_conflict
from spark_consumer.delta_version import updated_log

log = logging.getLogger("walbridge.consumer")

FILE_RETENTION = "delta.deletedFileRetentionDuration"
LOG_RETENTION = "delta.logRetentionDuration"
# On the progress table: the window its rows are kept for, so a reader knows it
# (consistent_read.py) without the consumer's settings.
WINDOW_PROPERTY = "walbridge.consistentReadRetentionSeconds"
_CONF = "spark.databricks.delta.optimize."
_LISTING_TASKS = "spark.sql.sources.parallelPartitionDiscovery.parallelism"


def sql_path(path: str) -> str:
    """delta.`<path>`, absolute (Delta reads a relative one as a table name)."""
    if "://" not in path and not path.startswith("/"):
        path = os.path.abspath(path)
    return "delta.`" + path.replace("`", "``") + "`"


@dataclass(frozen=True)
class Figures:
    """A table's files in its latest version."""

    files: int
    size: int
    small_files: int  # below half the table's compaction target
    dv_files: int  # with a deletion vector

    @property
    def small_file_ratio(self) -> float:
        return mp.small_file_ratio(self.files, self.small_files)


def figures(spark: SparkSession, path: str, target_cap: int) -> Figures:
    """One small Spark job over the version's file list (the log's add actions)."""
    _log, snapshot = updated_log(spark, path)
    if int(snapshot.version()) == lake_state.NO_TABLE:
        return Figures(0, 0, 0, 0)
    files = DataFrame(snapshot.allFiles().toDF(), spark)
    size = int(snapshot.sizeInBytes())
    small = mp.min_file_bytes(mp.target_file_bytes(size, target_cap))
    row = files.agg(
        F.count(F.lit(1)).alias("files"),
        F.coalesce(F.sum("size"), F.lit(0)).alias("size"),
        F.count(F.when(F.col("size") < small, 1)).alias("small"),
        F.count(F.when(F.col("deletionVector").isNotNull(), 1)).alias("dv"),
    ).first()
    assert row is not None  # an aggregate without grouping has one row
    return Figures(int(row["files"]), int(row["size"]), int(row["small"]), int(row["dv"]))


def compact(spark: SparkSession, path: str, target_cap: int) -> bool:
    """OPTIMIZE the table: files below half its target are packed into files of the target,
    and files whose deletion vectors mark more than `MAX_DELETED_ROWS_RATIO` of their rows are
    rewritten without them. Whether the table exists. A commit conflict with a concurrent
    writer (the consumer's MERGE elsewhere, a user's job) retries from a fresh read."""
    lake = lake_state.read(spark, path)
    if not lake.exists:
        return False
    target = mp.target_file_bytes(lake.size, target_cap)
    settings = {
        "maxFileSize": str(target),
        "minFileSize": str(mp.min_file_bytes(target)),
        "maxDeletedRowsRatio": str(mp.MAX_DELETED_ROWS_RATIO),
    }
    # Session settings: the caller runs nothing else on the session meanwhile (between
    # batches, or the maintain command alone).
    with ExitStack() as stack:
        for key, value in settings.items():
            stack.enter_context(session_conf.changed(spark, _CONF + key, value))
        retry_on_conflict(
            lambda: DeltaTable.forPath(spark, path).optimize().executeCompaction().collect(),
            f"compaction of {path}",
        )
    return True


def purge_deletion_vectors(spark: SparkSession, path: str) -> None:
    """Rewrite every file that has a deletion vector (Delta's REORG ... APPLY (PURGE))."""
    retry_on_conflict(
        lambda: spark.sql(f"REORG TABLE {sql_path(path)} APPLY (PURGE)").collect(),
        f"purge of deletion vectors in {path}",
    )


def set_retention(
    spark: SparkSession, path: str, retention: mp.Retention, progress: bool = False
) -> bool:
    """Give the table the retention properties (and the progress table the window); whether
    that took a commit (none when they are already set)."""
    lake = lake_state.read(spark, path)
    if not lake.exists:
        return False
    wanted = {FILE_RETENTION: retention.interval, LOG_RETENTION: retention.interval}
    if progress:
        wanted[WINDOW_PROPERTY] = str(int(retention.window_s))
    if all(lake.properties.get(k) == v for k, v in wanted.items()):
        return False
    # Keys and values are this module's own text (an interval, digits): no quote in them.
    pairs = ", ".join(f"'{k}' = '{v}'" for k, v in wanted.items())
    retry_on_conflict(
        lambda: spark.sql(f"ALTER TABLE {sql_path(path)} SET TBLPROPERTIES ({pairs})").collect(),
        f"retention properties of {path}",
    )
    return True


def vacuum(spark: SparkSession, path: str, retention: mp.Retention) -> bool:
    """VACUUM with the table's own retention property (set first): files removed from the
    table longer ago than the window plus its margin are deleted, no others."""
    if not lake_state.read(spark, path).exists:
        return False
    set_retention(spark, path, retention)
    # vacuum() without hours uses `delta.deletedFileRetentionDuration`: Delta's safety check
    # (a retention below the table's configured one) then passes for any window. Its listing
    # runs as many tasks as Spark's partition-discovery parallelism (10,000 by default): about
    # 30 s per table on 2 cores; the table's one directory needs a task per core.
    cores = str(max(1, spark.sparkContext.defaultParallelism))
    with session_conf.changed(spark, _LISTING_TASKS, cores):
        retry_on_conflict(
            lambda: DeltaTable.forPath(spark, path).vacuum().collect(), f"VACUUM of {path}"
        )
    return True


def expire_progress(
    spark: SparkSession, path: str, retention: mp.Retention, now_ms: int | None = None
) -> int | None:
    """Delete progress rows applied before the window (never the latest row, from which the
    consumer resumes); the applied_at of the oldest row kept, epoch ms (None: no table)."""
    if not DeltaTable.isDeltaTable(spark, path):
        return None
    set_retention(spark, path, retention, progress=True)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    cutoff = retention.oldest_kept_ms(now_ms)
    table = DeltaTable.forPath(spark, path)
    latest = table.toDF().agg(F.max("batch_id")).first()
    if latest is None or latest[0] is None:
        return None
    old = (F.col("applied_at") < F.timestamp_millis(F.lit(cutoff))) & (
        F.col("batch_id") < F.lit(int(latest[0]))
    )
    retry_on_conflict(lambda: DeltaTable.forPath(spark, path).delete(old), f"expiry in {path}")
    oldest = (
        DeltaTable.forPath(spark, path)
        .toDF()
        .agg(F.min(F.unix_millis(F.col("applied_at"))))
        .first()
    )
    return None if oldest is None or oldest[0] is None else int(oldest[0])


def lake_tables(spark: SparkSession, lake: str, quarantine: str | None = None) -> list[str]:
    """Every Delta table of the lake: `<lake>/<schema>/<table>`, the consumer's own tables
    under `<lake>/_walbridge` (one and three levels down: progress, pending; history and
    changelog tables), and the quarantine table when given. Listed with Hadoop's file system,
    so `s3a://` lakes work as local ones."""
    jvm = spark._jvm
    assert jvm is not None
    fs = jvm.org.apache.hadoop.fs.Path(lake).getFileSystem(spark._jsc.hadoopConfiguration())
    # Listed paths come back qualified (file:/..., s3a://bucket/...): compare qualified forms.
    root = str(fs.makeQualified(jvm.org.apache.hadoop.fs.Path(lake)).toString()).rstrip("/")
    found: list[str] = []
    for pattern in ("*/*/_delta_log", "_walbridge/*/_delta_log", "_walbridge/*/*/*/_delta_log"):
        statuses = fs.globStatus(jvm.org.apache.hadoop.fs.Path(f"{lake}/{pattern}")) or []
        for status in statuses:
            table = str(fs.makeQualified(status.getPath().getParent()).toString())
            if not table.startswith(root + "/"):
                continue  # not below the lake (a symbolic link's target, say)
            name = table[len(root) :].lstrip("/")
            if pattern.startswith("*") and name.startswith("_walbridge/"):
                continue  # the consumer's own: listed by the other patterns
            found.append(f"{lake}/{name}")
    if quarantine and DeltaTable.isDeltaTable(spark, quarantine):
        found.append(quarantine.rstrip("/"))
    return sorted(set(found))


def latest_applied_ms(spark: SparkSession, progress_path: str) -> int | None:
    """applied_at of the latest progress row, epoch ms (None: no progress table or row)."""
    if not DeltaTable.isDeltaTable(spark, progress_path):
        return None
    row = (
        spark.read.format("delta")
        .load(progress_path)
        .agg(F.max(F.unix_millis(F.col("applied_at"))))
        .first()
    )
    return None if row is None or row[0] is None else int(row[0])


def pending_may_vacuum(spark: SparkSession, pending_path: str, named: int | None) -> bool:
    """The pending table's version the latest progress row names must stay readable for a
    restart, whatever its age: VACUUM it only when that version is its latest (or none is
    named). A newer one means a batch failed after saving it; the re-run comes first."""
    if named is None:
        return True
    return lake_state.read(spark, pending_path).version == named
