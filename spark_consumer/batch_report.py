"""What one micro-batch did, as the processor reports it (`BatchProcessor.reports`): plain
data, read by the metrics (`ConsumerMetrics.observe_batch`), the batch's log line and the
benchmarks.

Its own module so that metrics.py, which batch.py imports, needs nothing of batch.py: the two
imported each other before (pyproject.toml's import contracts keep it that way).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spark_consumer import progress


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
