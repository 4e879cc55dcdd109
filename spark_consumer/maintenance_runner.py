"""The consumer's maintenance between batches: after a batch's progress row is written, the
tables it wrote are checked for compaction (from the figures its commits left, no read), and
compaction or VACUUM runs while the budget allows (`--lake-maintenance-budget`: a share of the
consumer's time, maintenance_policy.Budget). Never inside a batch: a batch's freshness is not
delayed, the next one starts later by what the budget allows.

Between batches nothing else writes through this session, so the session settings OPTIMIZE
needs are safe to change, and this job's own writes never conflict with its maintenance. After
a table is compacted, the state the MERGEs kept of it is dropped (`forget`): its version moved.
A failed operation loses nothing (Delta commits atomically; files of an interrupted OPTIMIZE
are never referenced and go with a later VACUUM): it is logged and tried again later.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from pyspark.sql import SparkSession

from spark_consumer import lake_state, maintenance
from spark_consumer import maintenance_policy as mp
from spark_consumer.config import ConsumerConfig
from spark_consumer.lake_metrics import LakeMetrics

log = logging.getLogger("walbridge.consumer")


class Maintainer:
    def __init__(
        self,
        spark: SparkSession,
        config: ConsumerConfig,
        lake_of: Callable[[str], lake_state.LakeTable],
        forget: Callable[[str], None],
        metrics: LakeMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.spark = spark
        self.config = config
        self.budget = mp.Budget(config.lake_maintenance_budget)
        self.retention = mp.Retention(config.lake_consistent_read_retention)
        self._lake_of = lake_of  # a data table's state as the MERGEs left it (no read)
        self._forget = forget
        self._metrics = metrics
        self._clock = clock
        self._compact: dict[str, None] = {}  # due, in the order found
        self._first_seen: dict[str, float] = {}
        self._last_vacuum: dict[str, float] = {}
        self._pending_named: int | None = None
        self._latest_row_ms: int | None = None
        self.compactions = 0  # by this process (tests, logs)
        self.vacuums = 0

    @property
    def enabled(self) -> bool:
        cfg = self.config
        return cfg.lake_maintenance_budget > 0 and (cfg.lake_compaction or cfg.lake_vacuum)

    def request(self, written: Iterable[str], pending_named: int | None) -> None:
        """The tables a batch wrote (after its progress row), and the pending version it
        named: queue those whose file count calls for compaction."""
        self._pending_named = pending_named
        now = self._clock()
        self._latest_row_ms = int(now * 1000)  # the batch's progress row: just written
        if not self.enabled:
            return
        own = f"{self.config.lake_path}/_walbridge/"
        for path in written:
            self._first_seen.setdefault(path, now)
            # The consumer's own tables (and the quarantine) are not MERGEd: the MERGEs keep
            # no state of them, so their log is read (once per batch that wrote them).
            mine = path.startswith(own) or path == self.config.quarantine_path
            lake = lake_state.read(self.spark, path) if mine else self._lake_of(path)
            if self._metrics is not None:
                self._metrics.observe_table(self._label(path), lake.files, lake.size)
            if self.config.lake_compaction and mp.compaction_due(
                lake.files,
                lake.size,
                self.config.lake_target_file_bytes,
                self.config.lake_small_files_max,
            ):
                self._compact[path] = None

    def run(self, batch_seconds: float) -> None:
        """Earn the batch's share of time, then do what is due while the balance lasts."""
        if not self.enabled:
            return
        self.budget.earn(batch_seconds)
        vacuumed: set[str] = set()  # once per table between two batches, however short the cadence
        while self.budget.may_start():
            job = self._next(vacuumed)
            if job is None:
                return
            kind, path = job
            if kind == "vacuum":
                vacuumed.add(path)
            started = time.perf_counter()
            try:
                self._do(kind, path)
            except Exception as exc:  # loses nothing: the table is as its last commit left it
                log.warning(
                    "lake maintenance: %s of %s failed (tried again later): %s", kind, path, exc
                )
                if kind == "vacuum":
                    self._last_vacuum[path] = self._clock()  # not again at once
            finally:
                spent = time.perf_counter() - started
                self.budget.spend(spent)
                if self._metrics is not None:
                    self._metrics.maintenance_seconds.inc(spent)

    def _next(self, vacuumed: set[str]) -> tuple[str, str] | None:
        if self._compact:
            path = next(iter(self._compact))
            del self._compact[path]
            return "compaction", path
        if not self.config.lake_vacuum:
            return None
        now = self._clock()
        every = self.retention.vacuum_every_s
        for path, seen in self._first_seen.items():
            if path not in vacuumed and now - self._last_vacuum.get(path, seen) >= every:
                return "vacuum", path
        return None

    def _do(self, kind: str, path: str) -> None:
        label = self._label(path)
        if kind == "compaction":
            if maintenance.compact(self.spark, path, self.config.lake_target_file_bytes):
                self.compactions += 1
                self._forget(path)
                log.info("lake maintenance: compacted %s", label)
                if self._metrics is not None:
                    self._metrics.last_compaction.labels(label).set(self._clock())
                    self._observe_figures(path, label)
            return
        self._last_vacuum[path] = self._clock()
        if not self.retention.may_vacuum(self._latest_row_ms, int(self._clock() * 1000)):
            return  # a batch longer than the window: its row is already outside it
        if path == self.config.pending_path and not maintenance.pending_may_vacuum(
            self.spark, path, self._pending_named
        ):
            return
        if path == self.config.progress_path:
            oldest_ms = maintenance.expire_progress(self.spark, path, self.retention)
            if oldest_ms is not None and self._metrics is not None:
                cutoff_ms = self.retention.oldest_kept_ms(int(self._clock() * 1000))
                self._metrics.oldest_consistent_read.set(max(oldest_ms, cutoff_ms) / 1000)
        if maintenance.vacuum(self.spark, path, self.retention):
            self.vacuums += 1
            self._forget(path)  # the retention properties may have taken a commit
            log.info("lake maintenance: vacuumed %s", label)
            if self._metrics is not None:
                self._metrics.last_vacuum.labels(label).set(self._clock())
                self._observe_figures(path, label)

    def _observe_figures(self, path: str, label: str) -> None:
        assert self._metrics is not None
        f = maintenance.figures(self.spark, path, self.config.lake_target_file_bytes)
        self._metrics.observe_table(label, f.files, f.size)
        self._metrics.small_file_ratio.labels(label).set(f.small_file_ratio)

    def _label(self, path: str) -> str:
        return path[len(self.config.lake_path) :].lstrip("/") or path
