"""Failures through the real pipeline: the consumer job SIGKILLed mid-stream and restarted from
its checkpoint converges to PostgreSQL, its history and changelog tables (issue 43) included;
replaying an applied batch changes nothing; a poison record stops the job naming its
coordinates, or goes to quarantine when configured."""

from __future__ import annotations

import itertools
import re
import signal
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from schemas.topics import table_topic
from tests.e2e.harness import Pipeline, pipeline, wait_for
from tests.support.producer_harness import TopicReader, sql
from tests.support.spark import spark  # noqa: F401

pytestmark = pytest.mark.e2e


def churn(dsn: str, table: str, count: int) -> None:
    """Small transactions: inserts, updates and deletes over 50 keys."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(count):
            k = i % 50
            with conn.transaction():
                conn.execute(
                    f"INSERT INTO {table} VALUES (%s, %s, 'n') ON CONFLICT (id) "
                    "DO UPDATE SET v = excluded.v, note = 'u'",
                    (k, i),
                )
                if i % 7 == 0:
                    conn.execute(f"DELETE FROM {table} WHERE id = %s", ((k + 25) % 50,))
            time.sleep(0.05)


@pytest.mark.secure_stack
def test_killed_job_converges_and_replay_is_a_no_op(
    spark: SparkSession,
    pg_dsn: str,
    kafka_bootstrap: str,
    registry_url: str,
    tmp_path: Path,
) -> None:
    s = f"e2e_crash_{uuid.uuid4().hex[:8]}"
    table = f"{s}.t"
    sql(
        pg_dsn, f"CREATE SCHEMA {s}", f"CREATE TABLE {table} (id int PRIMARY KEY, v int, note text)"
    )
    # The table's history and changelog are written by the same batches, so the kill lands
    # in their writes too (the window between them and the progress row included).
    layouts = tmp_path / "lake-tables.toml"
    layouts.write_text(f'[tables."{table}"]\nhistory = true\nchangelog = true\n')
    env = {"WALBRIDGE_LAKE_TABLES_CONFIG": str(layouts)}
    try:
        with pipeline(
            spark, pg_dsn, kafka_bootstrap, registry_url, tmp_path, [table], "e2ecrash"
        ) as p:
            p.start_producer()
            worker = threading.Thread(target=churn, args=(pg_dsn, table, 600))
            worker.start()
            job = p.consumer_process("--trigger", "1 seconds", log_name="run1", **env)
            try:
                wait_for(
                    "two applied batches",
                    lambda: (
                        len(re.findall(r"batch \d+: applied [1-9]", p.log("run1"))) >= 2
                        or job.poll() is not None
                    ),
                    timeout=300,
                )
                assert job.poll() is None, p.log("run1")
                # Batches take seconds here; shortly after one ends the next is under way.
                time.sleep(1.5)
                job.send_signal(signal.SIGKILL)
                job.wait(30)
            finally:
                if job.poll() is None:
                    job.kill()
            worker.join()
            p.wait_published()

            again = p.consumer_process("--available-now", log_name="run2", **env)
            assert again.wait(600) == 0, p.log("run2")
            p.assert_equal()
            last = p.progress()[-1]
            check_layouts_after_the_kill(spark, p, s, last)

            # Replay: forget that Spark committed the last batch; it runs again, is skipped.
            commits = Path(p.checkpoint, "commits")
            replayed = max((f.name for f in commits.iterdir() if f.name.isdigit()), key=int)
            (commits / replayed).unlink()
            (commits / f".{replayed}.crc").unlink(missing_ok=True)  # Hadoop's checksum file
            third = p.consumer_process("--available-now", log_name="run3", **env)
            assert third.wait(600) == 0, p.log("run3")
            assert f"batch {replayed} already applied" in p.log("run3")
            assert p.progress()[-1] == last
            p.assert_equal()
    finally:
        sql(pg_dsn, f"DROP SCHEMA {s} CASCADE")


def check_layouts_after_the_kill(
    spark: SparkSession, p: Pipeline, s: str, last: dict[str, object]
) -> None:
    """The changelog holds every data event of the topic exactly once, with its row; the
    history's open versions are the source's rows, and each key's versions follow one another
    without gap or overlap."""
    versions = last["table_versions"]
    assert isinstance(versions, dict)
    events = [
        r.value
        for r in TopicReader(p.kafka, p.registry).read_to_end([table_topic(p.prefix, s, "t")])
        if r.value is not None and r.value["op"] in ("c", "r", "u", "d")
    ]

    def image(row: dict[str, object] | None) -> tuple[object, ...] | None:
        return None if row is None else (row["id"], row.get("v"), row.get("note"))

    want = sorted(
        (
            e["source"]["commit_lsn"],
            e["transaction"]["total_order"],
            e["op"],
            image(e["after"]),
        )
        for e in events
    )
    changelog = (
        spark.read.format("delta")
        .option("versionAsOf", versions[f"changelog:{s}.t"])
        .load(f"{p.lake}/_walbridge/changelog/{s}/t")
        .collect()
    )
    got = sorted(
        (
            r["commit_lsn"],
            r["total_order"],
            r["op"],
            None if r["after"] is None else image(r["after"].asDict()),
        )
        for r in changelog
    )
    assert len(got) == len(want) > 600  # the churn's 600 upserts, its deletes besides
    assert got == want

    history = (
        spark.read.format("delta")
        .option("versionAsOf", versions[f"history:{s}.t"])
        .load(f"{p.lake}/_walbridge/history/{s}/t")
        .collect()
    )
    current = sorted((r["id"], r["v"], r["note"]) for r in history if r["__is_current"])
    live = sorted((r["id"], r["v"], r["note"]) for r in p.table(f"{s}.t"))  # == the source
    assert current == live
    by_key: dict[int, list[tuple[int, int | None]]] = {}
    for r in history:
        by_key.setdefault(r["id"], []).append((r["__valid_from_lsn"], r["__valid_to_lsn"]))
    for key, spans in by_key.items():
        spans.sort()
        for (_, to), (nxt, _) in itertools.pairwise(spans):
            assert to is not None and to <= nxt, (key, spans)
        assert all(to is not None for _, to in spans[:-1]), (key, spans)
        assert (spans[-1][1] is None) == (key in {row[0] for row in live}), (key, spans)


def test_poison_record_stops_then_quarantine_lets_it_pass(
    spark: SparkSession,
    pg_dsn: str,
    kafka_bootstrap: str,
    registry_url: str,
    tmp_path: Path,
) -> None:
    s = f"e2e_poison_{uuid.uuid4().hex[:8]}"
    table = f"{s}.t"
    sql(pg_dsn, f"CREATE SCHEMA {s}", f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
    try:
        with pipeline(
            spark, pg_dsn, kafka_bootstrap, registry_url, tmp_path, [table], "e2epoison"
        ) as p:
            p.start_producer()
            p.sql(f"INSERT INTO {table} VALUES (1, 'a'), (2, 'b')")
            p.wait_published()
            topic = f"{p.prefix}.{table}"
            producer = Producer({"bootstrap.servers": kafka_bootstrap})
            producer.produce(topic, value=b"not avro", partition=1)
            assert producer.flush(30) == 0
            p.sql(
                f"UPDATE {table} SET v = 'b2' WHERE id = 2", f"INSERT INTO {table} VALUES (3, 'c')"
            )
            p.wait_published()

            job = p.consumer_process("--available-now", log_name="stop")
            assert job.wait(600) == 1, p.log("stop")
            assert re.search(
                rf"value is not Confluent-framed Avro \(topic '{re.escape(topic)}', "
                r"partition 1, offset \d+\)",
                p.log("stop"),
            ), p.log("stop")
            assert not Path(p.lake, s, "t").exists()  # nothing half-applied

            quarantine = str(tmp_path / "quarantine")
            p.consume_available(quarantine_path=quarantine)
            p.assert_equal()
            q = spark.read.format("delta").load(quarantine).collect()
            assert [(r["topic"], r["partition"], r["value"]) for r in q] == [
                (topic, 1, b"not avro")
            ]
    finally:
        sql(pg_dsn, f"DROP SCHEMA {s} CASCADE")
