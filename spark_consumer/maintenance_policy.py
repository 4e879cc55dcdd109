"""Pure rules of lake maintenance: when a table is compacted, to what file size, how long
removed files and log entries are kept for the consistent-read promise, and how much of the
consumer's time maintenance may take.

No Spark here: `maintenance.py` reads a table's figures and acts on these answers.

The write-amplification argument, which fixes the numbers below: a batch writes files that
hold its changed rows (plus deletion vectors). Compaction packs only *small* files (below half
the table's target), so a full file is written once and left alone; a small table's target is
itself small (an eighth of the table, at least `MIN_TARGET_BYTES`), so packing the new files
never means rewriting the whole table. Files whose deletion vectors mark more than
`MAX_DELETED_ROWS_RATIO` of their rows are rewritten without them: a file is rewritten only
after a twentieth of it changed. Each changed byte is therefore written by its batch, about
twice more by packing, and at most 1/ratio times by the folding of deletion vectors.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

MIB = 2**20
DEFAULT_TARGET_FILE_BYTES = 128 * MIB
MIN_TARGET_BYTES = 1 * MIB  # below this a file's fixed costs (footer, listing) dominate
# A small table is packed into about this many files: its target is size / this.
SMALL_TABLE_FILES = 8
# Delta's OPTIMIZE rewrites a file whose deletion vector marks more than this share of its
# rows (`spark.databricks.delta.optimize.maxDeletedRowsRatio`; Delta's own default).
MAX_DELETED_ROWS_RATIO = 0.05
DEFAULT_SMALL_FILES_MAX = 32
DEFAULT_RETENTION_S = 7 * 86400.0
DEFAULT_BUDGET = 0.2
# Removed files and log entries are kept this much longer than the window (at most): a table's
# commit comes up to one batch before the progress row that names its version, and a
# concurrent writer's commit in that interval removes files the named version still holds.
MAX_MARGIN_S = 3600.0
MAX_VACUUM_EVERY_S = 3600.0

_DURATION = re.compile(
    r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|secs|second|seconds|m|min|mins|minute|minutes|h|hour|hours|"
    r"d|day|days)?\s*$"
)
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds from '7 days', '36 hours', '90 s', '600' (seconds); a ValueError names the text."""
    m = _DURATION.match(text.lower())
    if not m:
        raise ValueError(f"{text!r} is not a duration like '7 days', '12 hours' or '600 s'")
    unit = (m.group(2) or "s")[0]
    return float(m.group(1)) * _UNIT_S[unit]


def target_file_bytes(table_bytes: int, target: int) -> int:
    """The file size a table is packed to: `target`, smaller for small tables (an eighth of
    the table, not below `MIN_TARGET_BYTES`), so packing new files into a small table does not
    rewrite all of it."""
    return max(MIN_TARGET_BYTES, min(target, table_bytes // SMALL_TABLE_FILES))


def min_file_bytes(target: int) -> int:
    """Files below this are packed (Delta's `optimize.minFileSize`); larger ones are left."""
    return target // 2


def files_needed(table_bytes: int, target: int) -> int:
    return max(1, math.ceil(table_bytes / target_file_bytes(table_bytes, target)))


def compaction_due(files: int, table_bytes: int, target: int, small_files_max: int) -> bool:
    """Whether a table of `files` data files holding `table_bytes` should be compacted: it has
    at least `small_files_max` files more than its size needs. The figures are the ones every
    commit's checksum carries, so the check costs no read of the table."""
    return files - files_needed(table_bytes, target) >= small_files_max


@dataclass(frozen=True)
class Retention:
    """What the consistent-read window `window_s` means for Delta's table properties."""

    window_s: float

    @property
    def margin_s(self) -> float:
        return min(self.window_s, MAX_MARGIN_S)

    @property
    def kept_s(self) -> float:
        """How long removed files and log entries are kept: the window plus the margin."""
        return self.window_s + self.margin_s

    @property
    def interval(self) -> str:
        """As a Delta table property (`delta.deletedFileRetentionDuration`,
        `delta.logRetentionDuration`)."""
        return f"interval {math.ceil(self.kept_s)} seconds"

    @property
    def vacuum_every_s(self) -> float:
        """How often the consumer vacuums a table: a quarter of the window, at most hourly."""
        return max(1.0, min(self.window_s / 4, MAX_VACUUM_EVERY_S))

    def oldest_kept_ms(self, now_ms: int) -> int:
        """Progress rows applied before this (epoch ms) are outside the window."""
        return now_ms - int(self.window_s * 1000)

    def may_vacuum(self, latest_applied_ms: int | None, now_ms: int) -> bool:
        """Whether VACUUM keeps the latest progress row's versions readable: only while that
        row is inside the window. Files its versions reference were live when it was written
        (or removed at most a batch earlier, within the margin), so VACUUM then deletes none
        of them. An idle pipeline's latest row grows old; a VACUUM then could delete files a
        later compaction replaced, and the row readers start from would break."""
        return latest_applied_ms is None or latest_applied_ms >= self.oldest_kept_ms(now_ms)


class Budget:
    """The consumer's time share for maintenance, as a token bucket: each batch earns
    `share` of its wall time; an operation may start while the balance is positive and is
    paid for when it ends (one operation may overspend: later batches repay it). So on average
    maintenance takes at most `share` of the consumer's time, whatever one operation costs."""

    def __init__(self, share: float, cap_s: float = 60.0) -> None:
        self.share = share
        self.cap_s = cap_s  # an idle stretch does not bank unlimited time
        self.balance_s = 0.0

    def earn(self, batch_s: float) -> None:
        self.balance_s = min(self.cap_s, self.balance_s + self.share * batch_s)

    def may_start(self) -> bool:
        return self.share > 0 and self.balance_s > 0

    def spend(self, seconds: float) -> None:
        self.balance_s -= seconds


def small_file_ratio(files: int, small_files: int) -> float:
    return small_files / files if files else 0.0
