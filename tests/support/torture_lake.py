"""What the torture run reads from the lake while it runs and after (tests/support/torture.py):
the invariant in every progress snapshot, and each cycle's recovery time."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from tests.support import lake_reader
from tests.support import torture_checks as tc
from tests.support.torture_options import CycleResult
from tests.support.torture_services import log


def check_progress_snapshots(lake: Path, schema: str, total: int) -> dict[str, Any]:
    """The invariant in every lake state a progress row names (each table VERSION AS OF the
    row's table_versions), read with delta-rs. A (table, version) is summed once."""
    paths = {t: str(lake / schema / t) for t in ("checking", "savings", "history")}
    cache: dict[tuple[str, int], tuple[int, int]] = {}

    def money(table: str, versions: dict[str, int]) -> tuple[int, int]:
        """(sum, rows) of the table in this state."""
        version = versions.get(f"{schema}.{table}")
        if version is None:
            return 0, 0  # not in the lake yet at this point
        key = (table, version)
        if key not in cache:
            column = "delta" if table == "history" else "balance"
            cache[key] = lake_reader.table_totals(paths[table], version, column)
        return cache[key]

    violations: list[str] = []
    if not (lake / "_walbridge" / "progress" / "_delta_log").is_dir():
        return {
            "checked": 0,
            "checked_positions": [],
            "table_versions_read": 0,
            "violations": ["no progress table"],
        }
    rows = lake_reader.progress_rows(str(lake))
    checked: list[int] = []  # positions (in batch order) of the rows whose state was read
    for position, row in enumerate(rows):
        v = row["table_versions"]
        (checking, c_rows), (savings, s_rows), (history, h_rows) = (
            money(t, v) for t in ("checking", "savings", "history")
        )
        sums = tc.Sums(checking, savings, history, c_rows + s_rows + h_rows)
        problem = tc.invariant_violation(sums, total)
        if problem is not None:
            violations.append(f"batch {row['batch_id']} {v}: {problem}")
        checked.append(position)
    return {
        "checked": len(checked),
        "checked_positions": checked,
        "table_versions_read": len(cache),
        "violations": violations,
    }


class RecoveryWatcher(threading.Thread):
    """Times each cycle's recovery: from the fault until the lake's progress reached a
    transaction that committed after the fault struck (at or after the WAL position then)."""

    def __init__(self, lake: Path) -> None:
        super().__init__(daemon=True)
        self.lake = lake
        self.waiting: list[tuple[CycleResult, int, float]] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def expect(self, result: CycleResult, lsn: int, struck: float) -> None:
        with self.lock:
            self.waiting.append((result, lsn, struck))

    def run(self) -> None:
        while not self.stopping.wait(0.5):
            self.poll()

    def poll(self) -> None:
        try:
            applied = lake_reader.latest_commit_lsn(str(self.lake))
        except Exception:  # a log entry being written: read again next time
            return
        if applied is None:
            return
        now = time.monotonic()
        with self.lock:
            for result, _lsn, struck in [w for w in self.waiting if w[1] <= applied]:
                result.recovery_s = round(now - struck, 1)
                log(f"cycle {result.number}: recovered in {result.recovery_s}s")
            self.waiting = [w for w in self.waiting if w[1] > applied]
