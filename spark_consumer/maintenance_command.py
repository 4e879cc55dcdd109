"""`walbridge-consumer maintain` (compaction, expiry of old progress rows and VACUUM of every
lake table, once, for users who schedule it as its own job) and `walbridge-consumer status`
(each table's files, bytes, small-file share, last compaction and VACUUM, and the oldest
consistent read the lake still promises).

`maintain` may run while the consumer runs: Delta's commit conflicts between them are retried
(delta_conflicts.py) on both sides. Its compaction changes session settings of its own
process only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_consumer import maintenance, progress
from spark_consumer import maintenance_policy as mp
from spark_consumer.config import MaintainConfig
from spark_consumer.lake_state import read as read_lake


@dataclass(frozen=True)
class TableStatus:
    name: str  # the path below the lake
    figures: maintenance.Figures
    last_compaction_ms: int | None  # Delta's history: OPTIMIZE or REORG, by anyone
    last_vacuum_ms: int | None


def _name(config: MaintainConfig, path: str) -> str:
    return path[len(config.lake_path) :].lstrip("/") or path


def maintain(spark: SparkSession, config: MaintainConfig) -> list[str]:
    """Maintain every table once; one line per table saying what was done."""
    retention = mp.Retention(config.lake_consistent_read_retention)
    progress_path = f"{config.lake_path}/_walbridge/progress"
    pending_path = f"{config.lake_path}/_walbridge/pending"
    named = progress.latest(spark, progress_path).pending_version
    latest_ms = maintenance.latest_applied_ms(spark, progress_path)
    may_vacuum = retention.may_vacuum(latest_ms, int(time.time() * 1000))
    lines = []
    for path in maintenance.lake_tables(spark, config.lake_path, config.quarantine_path):
        done = []
        lake = read_lake(spark, path)
        if config.lake_compaction and (
            config.lake_small_files_max == 0
            or mp.compaction_due(
                lake.files, lake.size, config.lake_target_file_bytes, config.lake_small_files_max
            )
        ):
            maintenance.compact(spark, path, config.lake_target_file_bytes)
            done.append("compacted")
        if config.purge_deletion_vectors and read_lake(spark, path).deletion_vectors:
            maintenance.purge_deletion_vectors(spark, path)
            done.append("deletion vectors purged")
        if config.lake_vacuum and not may_vacuum:
            done.append("not vacuumed (the latest progress row is older than the window)")
        elif config.lake_vacuum:
            if path == pending_path and not maintenance.pending_may_vacuum(spark, path, named):
                done.append("not vacuumed (a batch is to be re-run)")
            else:
                maintenance.vacuum(spark, path, retention)
                done.append("vacuumed")
        lines.append(f"{_name(config, path)}: {', '.join(done) or 'nothing due'}")
    # Last: a row kept now is inside the window at every VACUUM above, so its versions are all
    # still readable when this returns (a row expired first could be kept and yet vacuumed
    # away by a VACUUM that came later in a long pass).
    if maintenance.expire_progress(spark, progress_path, retention) is not None:
        lines.append("_walbridge/progress: old rows expired")
    return lines


def _last(spark: SparkSession, path: str, operations: tuple[str, ...]) -> int | None:
    history = DeltaTable.forPath(spark, path).history()
    row = (
        history.filter(F.col("operation").isin(*operations))
        .agg(F.max(F.unix_millis(F.col("timestamp"))))
        .first()
    )
    return None if row is None or row[0] is None else int(row[0])


def status(spark: SparkSession, config: MaintainConfig) -> tuple[list[TableStatus], int | None]:
    """Each table's figures, and the applied_at (epoch ms) of the oldest progress row inside
    the window (None: no progress row)."""
    tables = [
        TableStatus(
            _name(config, path),
            maintenance.figures(spark, path, config.lake_target_file_bytes),
            _last(spark, path, ("OPTIMIZE", "REORG")),
            _last(spark, path, ("VACUUM END",)),
        )
        for path in maintenance.lake_tables(spark, config.lake_path, config.quarantine_path)
    ]
    progress_path = f"{config.lake_path}/_walbridge/progress"
    if not DeltaTable.isDeltaTable(spark, progress_path):
        return tables, None
    cutoff = mp.Retention(config.lake_consistent_read_retention).oldest_kept_ms(
        int(time.time() * 1000)
    )
    row = (
        spark.read.format("delta")
        .load(progress_path)
        .select(F.unix_millis(F.col("applied_at")).alias("ms"))
        .filter(F.col("ms") >= F.lit(cutoff))
        .agg(F.min("ms"))
        .first()
    )
    return tables, None if row is None or row[0] is None else int(row[0])


def _when(ms: int | None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000)) if ms else "never"


def report(tables: list[TableStatus], oldest_ms: int | None) -> str:
    head = f"{'table':<40} {'files':>7} {'bytes':>14} {'small':>6} {'DV files':>8}  "
    head += f"{'last compaction':<21} last VACUUM"
    out = [head]
    for t in tables:
        f = t.figures
        out.append(
            f"{t.name:<40} {f.files:>7} {f.size:>14} {f.small_file_ratio:>6.0%} {f.dv_files:>8}"
            f"  {_when(t.last_compaction_ms):<21} {_when(t.last_vacuum_ms)}"
        )
    out.append(f"oldest consistent read available: {_when(oldest_ms) if oldest_ms else 'none'}")
    return "\n".join(out)
