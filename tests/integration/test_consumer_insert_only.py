"""The fast forms of merge.py against the careful full MERGE, on Spark: the insert-only MERGE
(merge.inserts_only_applies), the plain append of keys that start with an insert
(merge._append_applies) and the plain append of a keyless table's rows
(merge._keyless_append_applies).

The same batches go through two consumers, one with the fast forms and one forced onto the
full MERGE; at the end both lakes must hold exactly the same rows (bookkeeping columns
included). The sequences mix what must keep the full MERGE (updates of existing keys, a key
change, a truncate, unchanged TOAST, a key of every column with repeated rows, a producer
replay inside a batch, a key deleted and inserted again) with what may take a fast form, and
replay batches after a crash between a table's commit and the progress row.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from spark_consumer import merge, progress
from spark_consumer.batch import BatchProcessor
from spark_consumer.config import ConsumerConfig
from spark_consumer.writer_schemas import WriterSchemas
from tests.support.event_writer import (
    ColumnSpec,
    EventWriter,
    KafkaRecord,
    TableSpec,
    registry_client,
)
from tests.support.spark import KafkaLog, spark  # noqa: F401

pytestmark = pytest.mark.integration

DEC = {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}
ACC = TableSpec(
    "public",
    "accounts",
    (
        ColumnSpec("id", "long", "int8"),
        ColumnSpec("balance", DEC, "numeric(12,2)"),
        ColumnSpec("doc", "string", "text"),
    ),
    ("id",),
)
# REPLICA IDENTITY FULL without a primary key: the key is every column and may repeat.
PAIRS = TableSpec(
    "public",
    "pairs",
    (ColumnSpec("a", "long", "int8"), ColumnSpec("b", "string", "text")),
    ("a", "b"),
)

# No replica identity: every change is a row, deduplicated by (commit_lsn, total_order).
LOG = TableSpec(
    "public", "log", (ColumnSpec("n", "int", "int4"), ColumnSpec("msg", "string", "text")), ()
)
# Later: n widened to bigint (Avro promotes int to long) and a column added.
LOG_WIDE = TableSpec(
    "public",
    "log",
    (
        ColumnSpec("n", "long", "int8"),
        ColumnSpec("msg", "string", "text"),
        ColumnSpec("extra", "string", "text"),
    ),
    (),
)


def row(i: int, doc: str = "d") -> dict[str, object]:
    return {"id": i, "balance": Decimal(f"{i}.50"), "doc": doc}


def batches(writer: EventWriter) -> list[list[KafkaRecord]]:
    w = writer
    t1 = w.transaction(1, 100)
    for i in range(1, 6):
        t1.insert(ACC, row(i, "X" * 3000 if i == 1 else "d"))
    t1.insert(PAIRS, {"a": 1, "b": "x"}).insert(PAIRS, {"a": 1, "b": "x"})  # the same row twice
    t2 = w.transaction(2, 200).insert(ACC, row(6)).insert(ACC, row(7))
    # Batch 2 (fast form for accounts): t2, plus t1's records again (a producer replay of
    # already-applied events: filtered by the watermark).
    t3 = (
        w.transaction(3, 300)
        .insert(ACC, row(8))
        .update(ACC, {"id": 1, "balance": Decimal("9.00"), "doc": None}, unchanged_toast=["doc"])
        .update(ACC, row(2, "u"))
        .delete(ACC, {"id": 3})
        .insert(ACC, row(30))  # key change 3 -> 30
        .insert(PAIRS, {"a": 2, "b": "y"})
    )
    t4 = w.transaction(4, 400).truncate(ACC).insert(ACC, row(40)).insert(ACC, row(2, "again"))
    t5 = w.transaction(5, 500).insert(ACC, row(50)).insert(ACC, row(51))
    t6 = w.transaction(6, 600).insert(ACC, row(60)).insert(PAIRS, {"a": 1, "b": "x"})
    r5 = t5.records()
    return [
        t1.records(),
        t2.records() + t1.records(),
        t3.records(),
        t4.records(),
        r5 + r5[1:2],  # one insert twice in the batch: duplicates, so the full MERGE
        t6.records(),
    ]


@dataclass
class Consumer:
    processor: BatchProcessor
    lake: str
    writer: EventWriter  # registers in the consumer's (in-process mock) registry

    def tables(self, spark: SparkSession) -> dict[str, list[tuple[object, ...]]]:
        out = {}
        for spec in (ACC, PAIRS, LOG):
            path = Path(self.lake) / spec.schema / spec.table
            if not path.exists():
                continue
            df = spark.read.format("delta").load(str(path))
            out[spec.table] = sorted((tuple(r) for r in df.collect()), key=repr)
        return out


@pytest.fixture()
def consumers(spark: SparkSession, tmp_path: Path) -> Iterator[tuple[Consumer, Consumer]]:
    client = registry_client("mock://insert-only")
    made = []
    for name in ("fast", "careful"):
        cfg = ConsumerConfig(
            kafka_bootstrap="-",
            schema_registry_url="mock://insert-only",
            topic_prefix="io",
            lake_path=str(tmp_path / name / "lake"),
            checkpoint_path=str(tmp_path / name / "cp"),
            trigger=None,
            available_now=True,
            # Tables in a known order: one thread, and one MERGE group (no small table waits
            # for the rewrite group, MergeRunner._merge_groups).
            merge_threads=1,
            lake_rewrite_below_bytes=0,
        )
        made.append(
            Consumer(
                BatchProcessor(spark, cfg, WriterSchemas(client)),
                cfg.lake_path,
                EventWriter(client, "io"),
            )
        )
    yield made[0], made[1]


def crash_before_progress(processor: BatchProcessor, frame: DataFrame, batch_id: int) -> None:
    """Run a batch as a job killed after its table commits, before its progress row."""

    def crash(*args: object) -> None:
        raise RuntimeError("crash before the progress row")

    with pytest.MonkeyPatch.context() as m:
        m.setattr(progress, "append", crash)
        with pytest.raises(RuntimeError, match="crash before the progress row"):
            processor.process(frame, batch_id)


def restarted(processor: BatchProcessor) -> BatchProcessor:
    """The same job restarted: no memory of the crashed run."""
    return BatchProcessor(processor.spark, processor.config, processor.schemas)


def careful_only(m: pytest.MonkeyPatch) -> None:
    m.setattr(merge, "inserts_only_applies", lambda tc: False)
    m.setattr(merge, "_append_applies", lambda session, tc: False)
    m.setattr(merge, "_empty_target_applies", lambda session, tc: False)
    m.setattr(merge, "_keyless_append_applies", lambda session, tc: False)


def test_insert_only_form_gives_the_careful_lake(
    spark: SparkSession,
    consumers: tuple[Consumer, Consumer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fast, careful = consumers
    log = KafkaLog()
    frames = [log.frame(spark, recs) for recs in batches(fast.writer)]

    taken: list[tuple[str, bool]] = []
    decide = merge.inserts_only_applies

    def spy(tc: merge.TableChanges) -> bool:
        taken.append((tc.table, decide(tc)))
        return taken[-1][1]

    monkeypatch.setattr(merge, "inserts_only_applies", spy)
    for batch_id, frame in enumerate(frames):
        fast.processor.process(frame, batch_id)
    with monkeypatch.context() as m:
        careful_only(m)
        for batch_id, frame in enumerate(frames):
            careful.processor.process(frame, batch_id)
    assert fast.tables(spark) == careful.tables(spark)
    # The fast form ran where it may and nowhere else.
    assert taken == [
        ("accounts", True),
        ("pairs", False),  # t1 (pairs: key of every column)
        ("accounts", True),  # t2
        ("accounts", False),
        ("pairs", False),  # t3: update, delete, TOAST
        ("accounts", False),  # t4: truncate
        ("accounts", False),  # t5: an insert came twice
        ("accounts", True),
        ("pairs", False),
    ]  # t6
    acc = {r[0]: r for r in fast.tables(spark)["accounts"]}
    assert sorted(acc) == [2, 40, 50, 51, 60]
    assert [r[:2] for r in fast.tables(spark)["pairs"]] == [(1, "x"), (2, "y")]


def test_replay_after_a_crash_between_two_tables_changes_nothing(
    spark: SparkSession, consumers: tuple[Consumer, Consumer]
) -> None:
    fast, _ = consumers
    log = KafkaLog()
    w = fast.writer
    first = w.transaction(1, 100).insert(ACC, row(1)).insert(PAIRS, {"a": 1, "b": "x"})
    second = (
        w.transaction(2, 200)
        .insert(ACC, row(2))
        .insert(ACC, row(3))
        .insert(PAIRS, {"a": 2, "b": "y"})
    )
    fast.processor.process(log.frame(spark, first.records()), 0)
    frame = log.frame(spark, second.records())
    crash_before_progress(fast.processor, frame, 1)
    after_crash = fast.tables(spark)
    assert [r[0] for r in after_crash["accounts"]] == [1, 2, 3]  # already applied once
    report = restarted(fast.processor).process(frame, 1)
    assert not report.skipped and report.commit_lsn == 200
    assert fast.tables(spark) == after_crash


def new_key_batches(writer: EventWriter) -> list[list[KafkaRecord]]:
    w = writer
    t1 = w.transaction(1, 100)
    for i in range(1, 6):
        t1.insert(ACC, row(i))
    t1.insert(PAIRS, {"a": 1, "b": "x"})
    # Every key starts with an insert: updated, deleted, or changed to another new key after.
    t2 = w.transaction(2, 200).insert(ACC, row(6)).insert(ACC, row(7)).insert(ACC, row(10))
    t3 = (
        w.transaction(3, 300)
        .update(ACC, row(6, "u"))
        .delete(ACC, {"id": 7})
        .delete(ACC, {"id": 10})
        .insert(ACC, row(11))
        .update(ACC, row(11, "moved"))
        .insert(PAIRS, {"a": 2, "b": "y"})
    )
    # A key of the lake (1) is updated: not every key is new.
    t4 = w.transaction(4, 400).insert(ACC, row(12)).update(ACC, row(1, "old key"))
    # Key 2 is deleted and inserted again: its first change is a delete.
    t5 = w.transaction(5, 500).delete(ACC, {"id": 2}).insert(ACC, row(2, "again"))
    # New keys again, every record delivered twice in the batch.
    t6 = w.transaction(6, 600).insert(ACC, row(13)).update(ACC, row(13, "twice"))
    t7 = w.transaction(7, 700).insert(ACC, row(14)).delete(ACC, {"id": 14})
    r6 = t6.records()
    return [
        t1.records(),
        t2.records() + t3.records(),
        t4.records(),
        t5.records(),
        r6 + r6,
        t7.records(),
    ]


def test_new_keys_append_gives_the_careful_lake(
    spark: SparkSession,
    consumers: tuple[Consumer, Consumer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fast, careful = consumers
    spark.catalog.clearCache()  # other tests' caches, if any: the end checks this test's own
    log = KafkaLog()
    frames = [log.frame(spark, recs) for recs in new_key_batches(fast.writer)]

    appended: list[tuple[int, str]] = []
    append = merge._append
    batch = [0]

    def spy(table: object, tc: merge.TableChanges, *args: object) -> None:
        appended.append((batch[0], tc.table))
        append(table, tc, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(merge, "_append", spy)
    for batch_id, frame in enumerate(frames):
        batch[0] = batch_id
        fast.processor.process(frame, batch_id)
    with monkeypatch.context() as m:
        careful_only(m)
        for batch_id, frame in enumerate(frames):
            careful.processor.process(frame, batch_id)
    assert fast.tables(spark) == careful.tables(spark)
    # Appended where every key of the table's share starts with an insert, and nowhere else
    # (pairs only into its empty table: its key is every column). Tables apply on threads.
    assert sorted(appended) == [
        (0, "accounts"),
        (0, "pairs"),
        (1, "accounts"),
        (4, "accounts"),
        (5, "accounts"),
    ]
    acc = {r[0]: r for r in fast.tables(spark)["accounts"]}
    assert sorted(acc) == [1, 2, 3, 4, 5, 6, 11, 12, 13]
    assert (acc[6][2], acc[11][2], acc[1][2], acc[2][2], acc[13][2]) == (
        "u",
        "moved",
        "old key",
        "again",
        "twice",
    )
    # Each batch dropped every cache it made, the collapsed MERGE sources included.
    assert spark._jsparkSession.sharedState().cacheManager().isEmpty()


def test_replay_of_an_appended_batch_takes_the_guarded_merge(
    spark: SparkSession,
    consumers: tuple[Consumer, Consumer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fast, _ = consumers
    log = KafkaLog()
    w = fast.writer
    first = w.transaction(1, 100).insert(ACC, row(1)).insert(PAIRS, {"a": 1, "b": "x"})
    fast.processor.process(log.frame(spark, first.records()), 0)
    second = w.transaction(2, 200).insert(ACC, row(2)).update(ACC, row(2, "u"))
    frame = log.frame(spark, second.records())
    crash_before_progress(fast.processor, frame, 1)
    after_crash = fast.tables(spark)
    assert [(r[0], r[2]) for r in after_crash["accounts"]] == [(1, "d"), (2, "u")]
    # The table moved past the recorded version: the replay must not append again.
    appended: list[str] = []
    monkeypatch.setattr(merge, "_append", lambda table, tc, *a: appended.append(tc.table))
    report = restarted(fast.processor).process(frame, 1)
    assert not report.skipped and report.commit_lsn == 200
    assert appended == []
    assert fast.tables(spark) == after_crash


def test_keyless_append_gives_the_careful_lake(
    spark: SparkSession,
    consumers: tuple[Consumer, Consumer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fast, careful = consumers
    log = KafkaLog()
    w = fast.writer

    def entry(n: int, msg: str = "m", **more: object) -> dict[str, object]:
        return {"n": n, "msg": msg, **more}

    t1 = w.transaction(1, 100).insert(LOG, entry(1)).insert(LOG, entry(1))  # the same row twice
    t2 = w.transaction(2, 200).insert(LOG, entry(2)).insert(ACC, row(1))
    t3 = w.transaction(3, 300).insert(LOG, entry(3)).insert(LOG, entry(3, "again"))
    # Split over two batches: waits in the pending table, then applies with the next batch.
    t4 = w.transaction(4, 400).insert(LOG, entry(4)).insert(LOG, entry(40)).records()
    # The source widened n (int -> long, as Avro promotes) and added a column.
    t5 = w.transaction(5, 500).insert(LOG_WIDE, entry(5, extra="x")).records()
    t6 = w.transaction(6, 600).truncate(LOG).insert(LOG_WIDE, entry(6, extra="y"))
    t7 = w.transaction(7, 700).insert(LOG_WIDE, entry(7, extra="z"))
    r3 = t3.records()
    frames = [
        log.frame(spark, recs)
        for recs in (
            t1.records(),
            t2.records() + t1.records(),  # a replay of applied records: under the watermark
            r3 + r3,  # a producer replay inside the batch
            t4[:2],
            t4[2:] + t5,
            t6.records(),
            t7.records(),
        )
    ]
    taken: list[bool] = []
    decide = merge._keyless_append_applies

    def spy(session: SparkSession, tc: merge.TableChanges) -> bool:
        taken.append(decide(session, tc))
        return taken[-1]

    # Batch by batch: a truncate later on would hide a wrong earlier batch from a final check.
    last = len(frames) - 1
    for batch_id, frame in enumerate(frames):
        with monkeypatch.context() as m:
            m.setattr(merge, "_keyless_append_applies", spy)
            if batch_id == last:
                # Committed its tables, then died before its progress row: the restarted job's
                # replay finds the table moved on and takes the MERGE, which adds nothing.
                crash_before_progress(fast.processor, frame, batch_id)
                restarted(fast.processor).process(frame, batch_id)
            else:
                fast.processor.process(frame, batch_id)
        with monkeypatch.context() as m:
            careful_only(m)
            careful.processor.process(frame, batch_id)
        assert fast.tables(spark) == careful.tables(spark), f"after batch {batch_id}"
    # Appended wherever the table was unchanged since the last batch, and nowhere else (batch
    # 3 holds only the first half of t4: nothing to apply).
    assert taken == [True, True, True, True, False, True, False]
    got = fast.tables(spark)["log"]
    assert [(r[0], r[1], r[-1]) for r in got] == [(6, "m", "y"), (7, "m", "z")]
