"""Lake maintenance on real Spark and Delta (issue 40): a bank-transfer workload of many small
batches through the consumer's batch function, with its compaction and VACUUM between
batches, then `maintain`; and a user's OPTIMIZE committed in the middle of a MERGE.

Batches are static frames of Kafka-shaped records (tests/support/spark.KafkaLog) with the
in-process mock registry: the Delta side, which is what maintenance touches, is the real one.
The oracle is a model of the bank: every account's balance after each transaction, so a read
of all tables at a progress row must give the model at that row's commit LSN exactly (and the
balances' sum, the bank's invariant).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_consumer import consistent_read, delta_conflicts, lake_state, maintenance, merge
from spark_consumer import maintenance_policy as mp
from spark_consumer.batch import BatchProcessor
from spark_consumer.config import ConsumerConfig, MaintainConfig
from spark_consumer.maintenance_command import maintain, status
from spark_consumer.writer_schemas import WriterSchemas
from tests.support.event_writer import ColumnSpec, EventWriter, TableSpec, registry_client
from tests.support.spark import KafkaLog, spark  # noqa: F401

pytestmark = pytest.mark.integration

DEC = {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}
ACC = TableSpec(
    "bank",
    "accounts",
    (ColumnSpec("id", "long", "int8"), ColumnSpec("balance", DEC, "numeric(12,2)")),
    ("id",),
)
ACCOUNTS = 10
OPENING = Decimal("100.00")


@dataclass
class Bank:
    """The consumer under test, its batches, and the model of every state it applied."""

    spark: SparkSession
    config: ConsumerConfig
    processor: BatchProcessor
    writer: EventWriter
    log: KafkaLog = field(default_factory=KafkaLog)
    balances: dict[int, Decimal] = field(default_factory=dict)
    by_lsn: dict[int, dict[int, Decimal]] = field(default_factory=dict)
    batches: int = 0

    @property
    def table(self) -> str:
        return self.config.table_path("bank", "accounts")

    def batch(self) -> None:
        """One transaction in one batch: the opening of every account, then transfers."""
        n = self.batches
        lsn = 1000 * (n + 1)
        tx = self.writer.transaction(n + 1, lsn)
        if n == 0:
            for i in range(1, ACCOUNTS + 1):
                self.balances[i] = OPENING
                tx.insert(ACC, {"id": i, "balance": OPENING})
        else:
            a, b = n % ACCOUNTS + 1, (n * 3 + 1) % ACCOUNTS + 1
            b = b if b != a else a % ACCOUNTS + 1
            amount = Decimal(n % 7 + 1)
            self.balances[a] -= amount
            self.balances[b] += amount
            tx.update(ACC, {"id": a, "balance": self.balances[a]})
            tx.update(ACC, {"id": b, "balance": self.balances[b]})
        self.by_lsn[lsn] = dict(self.balances)
        self.processor.apply(self.log.frame(self.spark, tx.records()), n)
        self.batches += 1

    def read_at(self, batch_id: int | None, **kw: Any) -> consistent_read.ConsistentRead:
        """Every table at the progress row ``batch_id`` (None: the latest)."""
        return consistent_read.read_at(
            self.spark,
            self.config.lake_path,
            batch_id,
            lambda n: self.config.table_path(*n.split(".")),
            **kw,
        )

    def check_every_row(self) -> None:
        for batch_id in range(self.batches):
            self.check_read(self.read_at(batch_id))

    def check_read(self, read: consistent_read.ConsistentRead) -> None:
        got = {r["id"]: r["balance"] for r in read.tables["bank.accounts"].collect()}
        assert sum(got.values()) == ACCOUNTS * OPENING, (read.batch_id, got)
        assert got == self.by_lsn[read.commit_lsn], read.batch_id


def bank(spark: SparkSession, tmp: Path, name: str, **settings: object) -> Bank:
    url = f"mock://maintenance-{name}"
    client = registry_client(url)
    config = ConsumerConfig(
        kafka_bootstrap="-",
        schema_registry_url=url,
        topic_prefix="lm",
        lake_path=str(tmp / "lake"),
        checkpoint_path=str(tmp / "cp"),
        trigger=None,
        available_now=True,
        merge_threads=1,
        **settings,  # type: ignore[arg-type]
    )
    processor = BatchProcessor(spark, config, WriterSchemas(client))
    return Bank(spark, config, processor, EventWriter(client, "lm"))


def data_files(table: str) -> set[str]:
    return {p.name for p in Path(table).glob("*.parquet")} | {
        p.name for p in Path(table).glob("*.bin")
    }


def test_many_batches_compaction_vacuum_and_reads_within_the_window(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Batches for longer than the window plus its margin, with maintenance between them:
    the table's file count stays bounded by the policy, not by the batches; after `maintain`,
    every progress row left reads as the model at its commit LSN, expired rows are refused
    with a message saying why, and files of versions outside the window are gone."""
    window = 20.0  # longer than the time from the last batch to the reads, even under load
    small_files_max = 2
    b = bank(
        spark,
        tmp_path,
        "soak",
        # As much time as the batches: compaction first, VACUUM when its turn and the balance
        # come (every quarter of the window at most, so about every other batch here).
        lake_maintenance_budget=1.0,
        lake_small_files_max=small_files_max,
        lake_consistent_read_retention=window,
    )
    kept = mp.Retention(window).kept_s
    started = time.monotonic()
    files: list[int] = []
    versions: dict[int, int] = {}
    # Longer than the window and its margin, so the first batches' rows and files are outside.
    early_files: set[str] = set()
    while time.monotonic() - started < kept + 10 or b.batches < 8:
        b.batch()
        lake = lake_state.read(spark, b.table)
        files.append(lake.files)
        versions[b.batches - 1] = lake.version
        if b.batches == 2:
            early_files = data_files(b.table)  # before any compaction: removed by the first
    assert b.processor.maintenance.compactions >= 1
    # Each update batch adds a file; compaction packs them once `small_files_max` more than
    # the table needs (one file) are there. Delayed by the budget at most a batch or two, the
    # count stays bounded: it does not grow with the batches.
    needed = mp.files_needed(lake.size, b.config.lake_target_file_bytes)
    assert max(files) <= needed + small_files_max + 4 < b.batches, (files, b.batches)
    assert min(files[len(files) // 2 :]) <= needed + small_files_max, files

    vacuumed_at_ms = int(time.time() * 1000)
    lines = maintain(
        spark,
        MaintainConfig(
            lake_path=b.config.lake_path,
            lake_small_files_max=0,
            lake_consistent_read_retention=window,
        ),
    )
    assert any(line.startswith("bank/accounts: compacted") for line in lines), lines
    assert "_walbridge/progress: old rows expired" in lines

    kept_rows = sorted(
        r["batch_id"] for r in spark.read.format("delta").load(b.config.progress_path).collect()
    )
    expired = sorted(set(range(b.batches)) - set(kept_rows))
    assert kept_rows and expired, (kept_rows, expired)
    assert kept_rows[-1] == b.batches - 1  # the latest row is never expired
    for batch_id in kept_rows:
        b.check_read(b.read_at(batch_id, now_ms=vacuumed_at_ms))
    for batch_id in expired[:1] + expired[-1:]:
        with pytest.raises(
            consistent_read.ExpiredReadError, match="older than the consistent-read retention"
        ):
            b.read_at(batch_id)
    # VACUUM did delete: the first batches' files, removed by an early compaction, are gone,
    # and Delta refuses their version rather than read what is left.
    assert early_files and early_files - data_files(b.table)
    with pytest.raises(
        Exception, match=r"(?i)not found|does not exist|FileNotFound|VersionNotFound|time travel"
    ):
        spark.read.format("delta").option("versionAsOf", versions[0]).load(b.table).collect()
    assert b.processor.maintenance.vacuums >= 1  # the consumer's own, between batches


def test_optimize_committed_inside_a_merge_is_retried_never_applied_twice(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's OPTIMIZE commits while the consumer's MERGE is held in its source (a gate there
    waits for it): whether Delta refuses the MERGE's commit (the consumer then reads the table
    again and retries) or starts the MERGE's transaction after the OPTIMIZE (what Delta 4.0
    did here), the batch is applied exactly once and every progress row reads as the model.
    The retry itself, on Delta's conflict errors, is unit-tested (test_lake_maintenance_policy)."""
    b = bank(spark, tmp_path, "conflict", lake_maintenance_budget=0.0)
    for _ in range(4):  # several small files for OPTIMIZE to pack
        b.batch()
    assert lake_state.read(spark, b.table).files >= 3

    gate = tmp_path / "gate"
    gate.mkdir()
    started, done = str(gate / "started"), str(gate / "done")

    def hold(x: int) -> bool:
        # In a Python worker, inside the MERGE's first Spark job: the first task to get here
        # waits for the OPTIMIZE; every other one (and the retry) passes.
        try:
            os.close(os.open(started, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return True
        deadline = time.time() + 120
        while not os.path.exists(done) and time.time() < deadline:
            time.sleep(0.05)
        return True

    gate_udf = F.udf(hold, "boolean")
    real_merge = merge._merge

    def gated(table: Any, tc: Any, source: Any, *rest: Any) -> None:
        # The gate sits on the source Delta's MERGE reads after starting its transaction
        # (the collapsed source itself is cached and read before, by the append check).
        real_merge(table, tc, source.filter(gate_udf(F.lit(1))), *rest)

    monkeypatch.setattr(merge, "_merge", gated)
    conflicts: list[str] = []
    real = delta_conflicts.is_conflict

    def seen(exc: BaseException) -> bool:
        if real(exc):
            conflicts.append(type(exc).__name__)
        return real(exc)

    monkeypatch.setattr(delta_conflicts, "is_conflict", seen)

    def user_optimize() -> None:
        deadline = time.time() + 120
        while not os.path.exists(started) and time.time() < deadline:
            time.sleep(0.05)
        try:
            DeltaTable.forPath(spark, b.table).optimize().executeCompaction().collect()
        finally:
            Path(done).touch()

    user = threading.Thread(target=user_optimize)
    user.start()
    before = lake_state.read(spark, b.table).version
    b.batch()  # the MERGE of batch 4, held, then refused once and retried
    user.join(130)
    history = DeltaTable.forPath(spark, b.table).history().orderBy("version").collect()
    after = [h["operation"] for h in history if h["version"] > before]
    # One MERGE: applied once, whether Delta made it retry (conflicts) or had it start after
    # the OPTIMIZE's commit (Delta 4.0 was seen to do that here).
    assert after == ["OPTIMIZE", "MERGE"], (after, conflicts)
    b.batch()  # and the next batch applies normally
    read = b.read_at(None)
    b.check_read(read)
    assert read.batch_id == b.batches - 1


def test_retention_properties_and_vacuum_keep_a_named_version(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The retention is Delta's own table properties, which a user's plain VACUUM also reads."""
    b = bank(spark, tmp_path, "props", lake_maintenance_budget=0.0)
    for _ in range(3):
        b.batch()
    retention = mp.Retention(3600.0)
    assert maintenance.vacuum(spark, b.table, retention)
    props = lake_state.read(spark, b.table).properties
    assert props[maintenance.FILE_RETENTION] == "interval 7200 seconds"
    assert props[maintenance.LOG_RETENTION] == "interval 7200 seconds"
    assert not maintenance.set_retention(spark, b.table, retention)  # already set: no commit
    spark.sql(f"VACUUM {maintenance.sql_path(b.table)}").collect()  # a user's, by the property
    for batch_id in range(3):
        b.check_read(b.read_at(batch_id))


def kill_maintain_when(
    b: Bank, moment: Callable[[], bool], *args: str, poll_s: float = 0.02
) -> None:
    """Run `walbridge-consumer maintain` (with ``args``) in its own process group and kill -9
    the group (Python and its JVM) once ``moment()`` is true; it must not have ended first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WALBRIDGE_HELPER")} | {
        "WALBRIDGE_LAKE_PATH": b.config.lake_path
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "spark_consumer", "maintain", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the kill reaches the JVM too
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None and not moment():
            time.sleep(poll_s)
        assert proc.poll() is None, "maintain ended before the kill"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def test_kill_9_during_compaction_then_maintain_again(spark: SparkSession, tmp_path: Path) -> None:
    """`walbridge-consumer maintain` killed (the whole process group: Python and its JVM) once
    its OPTIMIZE has written a file but before it ends; the lake still reads as the model at
    every progress row, and the next `maintain` compacts it."""
    b = bank(spark, tmp_path, "kill", lake_maintenance_budget=0.0)
    for _ in range(6):
        b.batch()
    before = data_files(b.table)
    version = lake_state.read(spark, b.table).version
    # Killed once OPTIMIZE wrote its file, before it finished.
    kill_maintain_when(b, lambda: bool(data_files(b.table) - before), "--lake-small-files-max", "0")
    # The kill may have come before or after OPTIMIZE's commit; either way the lake is whole.
    b.check_every_row()
    lines = maintain(spark, MaintainConfig(lake_path=b.config.lake_path, lake_small_files_max=0))
    assert any(line.startswith("bank/accounts: compacted") for line in lines), lines
    history = DeltaTable.forPath(spark, b.table).history().collect()
    assert "OPTIMIZE" in [h["operation"] for h in history if h["version"] > version]
    assert lake_state.read(spark, b.table).files == 1
    b.batch()  # and the consumer goes on
    b.check_read(b.read_at(None))
    tables, oldest_ms = status(spark, MaintainConfig(lake_path=b.config.lake_path))
    by_name = {t.name: t for t in tables}
    assert set(by_name) == {"bank/accounts", "_walbridge/progress"}
    accounts = by_name["bank/accounts"]
    assert 2 <= accounts.figures.files <= 3  # the compacted file and the last batch's
    assert accounts.last_compaction_ms is not None and accounts.last_vacuum_ms is not None
    assert oldest_ms is not None


def _operations(table: str) -> list[str]:
    """Each commit's operation, in order, straight from the log's JSON (no Spark)."""
    ops = []
    for commit in sorted(Path(table, "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            if '"commitInfo"' in line:
                ops.append(json.loads(line)["commitInfo"]["operation"])
    return ops


def test_kill_9_during_vacuum_then_maintain_again(spark: SparkSession, tmp_path: Path) -> None:
    """`maintain` killed (its whole process group) while its VACUUM of a table is deleting
    files: what a killed writer left behind (files written, never committed: here 2,000 of
    them, a month old, so deleting them takes long enough to be caught) is half deleted, the
    lake still reads as the model at every progress row, and the next `maintain` finishes."""
    b = bank(spark, tmp_path, "kill-vacuum", lake_maintenance_budget=0.0)
    for _ in range(5):
        b.batch()
    junk_dir = Path(b.table)
    month_ago = time.time() - 30 * 86400
    junk = [junk_dir / f"part-{i:05d}-killed-writer.c000.snappy.parquet" for i in range(2_000)]
    for p in junk:
        p.touch()
        os.utime(p, (month_ago, month_ago))

    def left() -> int:
        return sum(
            1 for e in os.scandir(junk_dir) if e.name.endswith("-killed-writer.c000.snappy.parquet")
        )

    kill_maintain_when(b, lambda: left() < len(junk), poll_s=0.01)  # VACUUM started deleting
    remaining = left()
    # Killed inside the VACUUM: it had started deleting (and logged its start), not finished.
    assert 0 < remaining < len(junk), remaining
    ops = _operations(b.table)
    assert ops[-1] == "VACUUM START", ops[-3:]
    b.check_every_row()
    lines = maintain(spark, MaintainConfig(lake_path=b.config.lake_path))
    assert "bank/accounts: vacuumed" in lines, lines
    assert left() == 0
    assert _operations(b.table)[-2:] == ["VACUUM START", "VACUUM END"]
    b.batch()  # and the consumer goes on
    b.check_every_row()
