"""Reading every lake table as of one progress row, with the retention promise checked: a row
inside the consistent-read window is read at the versions it names; a row outside it (expired
from the progress table, or older than the window the progress table records) is refused with
a message saying so, never read into whatever its versions' remaining files would give.

CONTRACT.md ("Lake", retention) states the promise; maintenance.py keeps it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_consumer.errors import ConsumerError
from spark_consumer.lake_options import CHANGELOG_PREFIX, HISTORY_PREFIX
from spark_consumer.lake_state import read as read_lake
from spark_consumer.maintenance import WINDOW_PROPERTY


class ExpiredReadError(ConsumerError):
    """The progress row asked for is outside the consistent-read retention."""

    kind = "retention"


@dataclass(frozen=True)
class ConsistentRead:
    batch_id: int
    commit_lsn: int
    applied_at_ms: int
    tables: dict[str, DataFrame]  # `schema.table` -> the table at the row's version


def window_s(spark: SparkSession, progress_path: str) -> float | None:
    """The window the lake's maintenance keeps (None: no maintenance has run yet)."""
    value = read_lake(spark, progress_path).properties.get(WINDOW_PROPERTY)
    return float(value) if value else None


def read_at(
    spark: SparkSession,
    lake: str,
    batch_id: int | None,
    table_path: Callable[[str], str],
    now_ms: int | None = None,
) -> ConsistentRead:
    """Every table named by progress row `batch_id` (None: the latest) at its version.
    `table_path` maps a `schema.table` key to its lake path; the layouts' `history:` and
    `changelog:` keys are mapped beside it (`with_layouts`)."""
    table_path = with_layouts(lake, table_path)
    progress_path = f"{lake.rstrip('/')}/_walbridge/progress"
    rows = spark.read.format("delta").load(progress_path)
    bounds = rows.agg(F.min("batch_id"), F.max("batch_id")).first()
    if bounds is None or bounds[1] is None:
        raise ExpiredReadError(f"the progress table at {progress_path} has no row")
    oldest, latest = int(bounds[0]), int(bounds[1])
    wanted = latest if batch_id is None else batch_id
    window = window_s(spark, progress_path)
    kept = f"{window:.0f} s" if window is not None else "the retention"
    row = rows.filter(F.col("batch_id") == F.lit(wanted)).first()
    if row is None:
        why = (
            f"it is older than the consistent-read retention ({kept}) and was expired"
            if wanted < oldest
            else "no such batch was applied"
        )
        raise ExpiredReadError(
            f"progress row batch {wanted} cannot be read at {lake}: {why}; rows "
            f"{oldest}..{latest} remain"
        )
    applied_ms = int(row["applied_at"].timestamp() * 1000)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    # The latest row is never outside: no VACUUM runs while it is older than the window.
    if window is not None and wanted != latest and applied_ms < now_ms - window * 1000:
        raise ExpiredReadError(
            f"progress row batch {wanted} (applied {(now_ms - applied_ms) / 1000:.0f} s ago) is "
            f"outside the consistent-read retention of {kept}: its table versions may have "
            f"been vacuumed; read a row applied within the window (latest: batch {latest})"
        )
    tables = {
        name: spark.read.format("delta").option("versionAsOf", version).load(table_path(name))
        for name, version in dict(row["table_versions"]).items()
    }
    return ConsistentRead(wanted, int(row["commit_lsn"]), applied_ms, tables)


def with_layouts(lake: str, table_path: Callable[[str], str]) -> Callable[[str], str]:
    """`table_path` that also maps the progress row's `history:<name>` and `changelog:<name>`
    keys: to `<lake>/_walbridge/history/...` (or `changelog/`) below the same two name parts as
    the table `<name>` itself (lake_options.history_path, changelog_path)."""
    root = lake.rstrip("/")
    kinds = ((HISTORY_PREFIX, "history"), (CHANGELOG_PREFIX, "changelog"))

    def path(name: str) -> str:
        for prefix, kind in kinds:
            if name.startswith(prefix):
                base = table_path(name[len(prefix) :])
                if not base.startswith(root + "/"):
                    raise ValueError(f"table {name}: its path {base} is not inside {root}")
                return f"{root}/_walbridge/{kind}/{base[len(root) + 1 :]}"
        return table_path(name)

    return path
