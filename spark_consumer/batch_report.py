"""What one micro-batch did, as the processor reports it (`BatchProcessor.reports`): plain
data, read by the metrics (`ConsumerMetrics.observe_batch`), the batch's log line and the
benchmarks.

Its own module so that metrics.py, which batch.py imports, needs nothing of batch.py: the two
imported each other before (pyproject.toml's import contracts keep it that way).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from spark_consumer import progress

# How many reports a processor keeps: a consumer runs for months at up to a batch a second, so
# the list is bounded (tests and benchmarks read the last few hundred at most).
REPORTS_KEPT: Final = 1000


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


def keep(reports: list[BatchReport], report: BatchReport, kept: int = REPORTS_KEPT) -> None:
    """Append ``report``; once ``reports`` holds twice ``kept``, drop all but the newest
    ``kept`` (one deletion per ``kept`` appends, so keeping costs O(1) per batch)."""
    reports.append(report)
    if len(reports) >= 2 * kept:
        del reports[:-kept]
