"""Snapshots through the real producer, checked in Kafka: rows that exist before the slot reach
Kafka as ``r`` events while writes go on, a table added to a running pipeline is read with its
hot rows changing under the chunks (the watermark dedup drops some rows and the result is still
exact), and kill -9 in the middle of a snapshot resumes from the last chunk Kafka holds.

The check replays every event of the table in (commit_lsn, total_order) order, as any reader
of the contract would, and compares the result with PostgreSQL row by row."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, Consumer
from psycopg import sql as psycopg_sql

from producer.snapshot.as_of import AsOf
from tests.conftest import ABSENT_STANDBY
from tests.support.producer_harness import (
    ProducerProcess,
    Source,
    metric,
    query,
    sql,
    unique,
)
from tests.support.snapshot_checks import (
    Writer,
    assert_read_by_workers,
    assert_resumed,
    assert_same,
    assert_topic_equals_source,
    assert_worker_sessions,
    create_table,
    read_all,
    wait_gone,
    wait_past_first_chunks,
    wait_snapshots_done,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def table(pg_dsn: str) -> Iterator[str]:
    name = unique("snap")
    yield name
    sql(pg_dsn, f"DROP TABLE IF EXISTS {name}")


def test_initial_snapshot_with_concurrent_writes_is_exact(
    pg_dsn: str, kafka_bootstrap: str, registry_url: str, table: str
) -> None:
    rows = 60_000
    create_table(pg_dsn, table, rows)
    source = Source.create(pg_dsn, [table], "snapi")
    # Windows of 2,000 rows, split between two snapshot workers (1,000 rows each).
    producer = ProducerProcess(
        source, kafka_bootstrap, registry_url, snapshot="initial", snapshot_chunk_rows=2000,
        snapshot_workers=2,
    )  # fmt: skip
    try:
        with Writer(pg_dsn, table, rows) as writer:
            producer.start()
            wait_snapshots_done(producer, f"public.{table}")
        assert writer.transactions > 20, "the writes did not overlap the snapshot"
        assert_read_by_workers(producer, 2)
        source.wait_confirmed(source.current_lsn())
        topic = f"{source.prefix}.public.{table}"
        records = read_all(kafka_bootstrap, registry_url, topic)
        reads = [r.value for r in records if r.value["op"] == "r"]
        assert len(reads) >= rows * 0.9
        assert {v["source"]["snapshot"] for v in reads} == {"true", "last"}
        assert sum(v["source"]["snapshot"] == "last" for v in reads) == 1
        assert all(
            r.value["source"]["snapshot"] == "false" for r in records if r.value["op"] != "r"
        )
        assert_same(records, topic, pg_dsn, table)
        assert metric(producer, "walbridge_snapshot_rows_total") == len(reads)
    finally:
        producer.stop()
        source.drop()


def _key_of(event: dict[str, Any]) -> int:
    image = event["after"] if event["after"] is not None else event["before"]
    return int(image["id"])


def test_initial_snapshot_sends_no_row_twice_across_the_slot_boundary(
    pg_dsn: str, kafka_bootstrap: str, registry_url: str, table: str
) -> None:
    """Rows written after the slot's consistent point reach Kafka only through the stream:
    no ``r`` for a key the stream published, and a changelog reader (Flink SQL's
    debezium-avro-confluent: ``r`` and ``c`` are inserts) never sees an insert of a key it
    already holds. Nothing is lost either: replayed in commit order, the events are the table."""
    rows = 20_000
    create_table(pg_dsn, table, rows)
    source = Source.create(pg_dsn, [table], "snapb")
    # Two snapshot workers, 1,000 rows each per window: their reads import the window's
    # snapshot and keep the slot's boundary.
    producer = ProducerProcess(
        source, kafka_bootstrap, registry_url, snapshot="initial", snapshot_chunk_rows=2000,
        snapshot_workers=2,
    )  # fmt: skip
    try:
        # Writes before the slot exists, while it is created, and all through the snapshot.
        with Writer(pg_dsn, table, rows, per_second=40) as writer:
            time.sleep(1)
            producer.start()
            wait_snapshots_done(producer, f"public.{table}")
        assert writer.transactions > 20, "the writes did not overlap the snapshot"
        assert_read_by_workers(producer, 2)
        assert "initial snapshot bounded by the slot's consistent point" in producer.log()
        source.wait_confirmed(source.current_lsn())
        topic = f"{source.prefix}.public.{table}"
        records = read_all(kafka_bootstrap, registry_url, topic)
        events = sorted(
            (r.value for r in records),
            key=lambda v: (v["source"]["commit_lsn"], v["transaction"]["total_order"]),
        )
        # A row's r is its state at the slot's consistent point: no streamed change of it may
        # come before its r in commit order (changes after it are the row's later life).
        read_at = {_key_of(v): i for i, v in enumerate(events) if v["op"] == "r"}
        streamed = [(i, _key_of(v)) for i, v in enumerate(events) if v["op"] != "r"]
        # Read whatever their xmin: rows with a value stored out of line, whose later updates
        # may leave it unsent (producer.snapshot.as_of).
        toasted = {_key_of(v) for v in events if v["op"] == "r" and len(v["after"]["pad"]) > 2000}
        assert len(read_at) >= rows * 0.5, "the snapshot read too few rows to tell anything"
        assert len(streamed) > 20
        twice = sorted(
            {k for i, k in streamed if k in read_at and i < read_at[k] and k not in toasted}
        )
        assert not twice, f"{len(twice)} rows streamed, then read again, e.g. {twice[:10]}"
        present: set[int] = set()
        for v in events:
            key = _key_of(v)
            if v["op"] in ("r", "c"):
                assert key not in present or key in toasted, f"an insert of {key}, present: {v}"
                present.add(key)
            elif v["op"] == "d":
                present.discard(key)
        assert_same(records, topic, pg_dsn, table)
    finally:
        producer.stop()
        source.drop()


def test_the_boundary_sql_agrees_with_its_reference(pg_dsn: str) -> None:
    """The chunk's predicate, run by PostgreSQL on 32-bit xmin values, says what
    ``AsOf.visible`` says, around a 32-bit wraparound too."""
    epoch = 1 << 32
    cases = [
        AsOf(750, 760, (751, 755)),
        AsOf(epoch - 5, epoch + 6, (epoch + 4, epoch - 2)),
        AsOf(3 * epoch + 100, 3 * epoch + 100, ()),
    ]
    for snapshot in cases:
        xids = sorted(
            {1, 2, 3, 700, 749, 750, 751, 754, 755, 759, 760, 9000, epoch - 6, epoch - 1}
            | {(x + d) % epoch for x in (snapshot.xmin, snapshot.xmax) for d in (-1, 0, 1, 5)}
            | {x % epoch for x in snapshot.xip}
        )
        values = psycopg_sql.SQL(", ").join(psycopg_sql.SQL("({}::int8)").format(x) for x in xids)
        query_text = psycopg_sql.SQL("SELECT xmin, {} FROM (VALUES {}) AS t(xmin)").format(
            snapshot.predicate(), values
        )
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            got = dict(conn.execute(query_text).fetchall())
        want = {x: snapshot.visible(x) for x in xids}
        assert got == want, snapshot


def first_timestamp_ms(bootstrap: str, topic: str, key: str | None = None) -> int:
    """The producer's timestamp (CreateTime, set at produce) of the topic's first record, or
    of its first record with this key."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("ts"),
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None or message.error() is not None:
                continue
            if key is None or message.key() == key.encode():
                kind, ms = message.timestamp()
                assert kind == TIMESTAMP_CREATE_TIME
                return int(ms)
        raise AssertionError(f"no record{'' if key is None else ' of ' + key} in {topic}")
    finally:
        consumer.close()


def test_table_added_while_running_is_snapshotted_and_the_watermarks_drop_changed_rows(
    pg_dsn: str, kafka_bootstrap: str, registry_url: str, table: str
) -> None:
    other = unique("snapother")
    sql(pg_dsn, f"CREATE TABLE {other} (id int PRIMARY KEY)")
    rows = 40_000
    create_table(pg_dsn, table, rows)
    source = Source.create(pg_dsn, [other], "snapadd")
    # Chunks of 10,000 rows (the budget keeps streamed changes from shrinking them): the two
    # that hold the hot range are each read in some 10-20 ms between their watermarks, and at
    # 200 transactions/s about 3.5 hot updates per transaction land in them. With 500-row
    # chunks read in a few milliseconds each (watermarks flushed at once, snapshot pacing),
    # 2 runs in 5 saw no update land inside a window.
    # Each window split between two snapshot workers: a hot row changed in either half is
    # dropped by the window's one high watermark.
    producer = ProducerProcess(
        source, kafka_bootstrap, registry_url, snapshot="initial",
        snapshot_chunk_rows=10_000, snapshot_chunk_budget_ms=1000, snapshot_workers=2,
    )  # fmt: skip
    try:
        producer.start()
        with Writer(pg_dsn, table, rows, hot=range(1, 20_000, 25), per_second=200):
            sql(pg_dsn, f"ALTER PUBLICATION {source.publication} ADD TABLE {table}")
            wait_snapshots_done(producer, f"public.{table}")
        source.wait_confirmed(source.current_lsn())
        assert "table added to the publication; snapshot queued" in producer.log_path.read_text()
        # The table's snapshot record (what makes the consumer list it in `snapshotting`) was
        # produced before its first streamed event, in the same Kafka transaction: no reader
        # takes the streamed rows alone for the whole table.
        record_ms = first_timestamp_ms(
            kafka_bootstrap, f"{source.prefix}.snapshot", f"public.{table}"
        )
        event_ms = first_timestamp_ms(kafka_bootstrap, f"{source.prefix}.public.{table}")
        assert record_ms <= event_ms, f"snapshot record at {record_ms}, first event at {event_ms}"
        dropped = metric(producer, "walbridge_snapshot_rows_dropped_total")
        assert dropped > 0, "no chunk row changed between its watermarks: the test proves nothing"
        assert_read_by_workers(producer, 2)
        topic = f"{source.prefix}.public.{table}"
        records = read_all(kafka_bootstrap, registry_url, topic)
        assert_same(records, topic, pg_dsn, table)
    finally:
        producer.stop()
        source.drop()
        sql(pg_dsn, f"DROP TABLE IF EXISTS {other}")


def test_a_commit_waiting_for_a_synchronous_standby_is_seen_by_the_chunk_read(
    pg_dsn: str, kafka_bootstrap: str, registry_url: str, table: str
) -> None:
    """A commit waiting for a synchronous standby is in the stream (its commit record is
    written) but not visible yet. A read taken then would not see it, and publishing that
    read at the high watermark would put the old row after the streamed update and undo it
    downstream (it did, before the fix). The low watermark's commit now waits for the standby
    as well, so the chunk is read once the update is visible."""
    rows = 1000
    create_table(pg_dsn, table, rows)
    source = Source.create(pg_dsn, [table], "snaphid")
    producer = ProducerProcess(source, kafka_bootstrap, registry_url, snapshot="never")
    local = "-c synchronous_commit=local"  # sessions that must not wait
    updates: list[threading.Thread] = []

    def update() -> None:
        with psycopg.connect(pg_dsn, autocommit=True, options="-c synchronous_commit=on") as c:
            c.execute(f"UPDATE {table} SET v = 42 WHERE id = 7")

    def waiting_for_standby(admin: psycopg.Connection[Any]) -> bool:
        return bool(
            admin.execute("SELECT 1 FROM pg_stat_activity WHERE wait_event = 'SyncRep'").fetchall()
        )

    try:
        producer.start()
        with psycopg.connect(pg_dsn, autocommit=True, options=local) as admin:
            admin.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{ABSENT_STANDBY}'")
            admin.execute("SELECT pg_reload_conf()")
            # The checkpointer applies the setting a moment after the reload: an update that
            # did not wait is simply done again (same value) until one waits.
            deadline = time.monotonic() + 30
            while not waiting_for_standby(admin):
                assert time.monotonic() < deadline, "no update waited for the standby"
                if not updates or not updates[-1].is_alive():
                    updates.append(threading.Thread(target=update, daemon=True))
                    updates[-1].start()
                time.sleep(0.1)
            # Committed in the WAL and the commit log, waiting for the standby: invisible.
            assert query(pg_dsn, f"SELECT v FROM {table} WHERE id = 7") == [(0,)]
            admin.execute(
                "SELECT pg_logical_emit_message(true, 'walbridge.signal', %s)",
                (json.dumps({"snapshot": [f"public.{table}"]}),),
            )
            time.sleep(3)  # the producer takes the signal; its low watermark waits too
            topic = f"{source.prefix}.public.{table}"
            records = read_all(kafka_bootstrap, registry_url, topic)
            assert [r.value["after"]["v"] for r in records] == [42], "only the update streamed"
            assert "snapshotting" in producer.http("/readyz")[1], producer.log()
            admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
            admin.execute("SELECT pg_reload_conf()")  # releases the waiting commits
        wait_snapshots_done(producer, f"public.{table}")
        source.wait_confirmed(source.current_lsn())
        records = read_all(kafka_bootstrap, registry_url, topic)
        assert sum(r.value["op"] == "r" for r in records) == rows
        assert_same(records, topic, pg_dsn, table)
        # Not read while the update was invisible (a read that had missed it would have been
        # found out and read again: LowMark.missed, in the unit tests).
        rereads = [line for line in producer.log().splitlines() if "read again" in line]
        assert metric(producer, "walbridge_snapshot_chunks_reread_total") <= 1, rereads
    finally:
        try:
            with psycopg.connect(pg_dsn, autocommit=True, options=local) as admin:
                admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
                admin.execute("SELECT pg_reload_conf()")
        finally:
            for t in updates:
                t.join(30)
            producer.stop()
            source.drop()


def test_signal_and_kill_during_snapshot_resume_from_the_last_chunk(
    pg_dsn: str, kafka_bootstrap: str, registry_url: str, table: str
) -> None:
    rows = 120_000
    create_table(pg_dsn, table, rows)
    source = Source.create(pg_dsn, [table], "snapk")
    # 60 windows of 2,000 rows, each split between two snapshot worker processes: the kill
    # below must come before the snapshot ends, and takes the workers with the producer.
    settings = {"snapshot": "never", "snapshot_chunk_rows": 2000, "snapshot_workers": 2}
    producer = ProducerProcess(source, kafka_bootstrap, registry_url, **settings)
    try:
        producer.start()
        with Writer(pg_dsn, table, rows) as writer:
            # The CLI sends the signal (pg_logical_emit_message(true, 'walbridge.signal', ...)).
            asked = subprocess.run(
                [sys.executable, "-m", "producer", "snapshot", f"public.{table}"],
                env={**os.environ, "WALBRIDGE_PG_DSN": pg_dsn},
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert asked.returncode == 0, asked.stderr
            assert f"snapshot requested for public.{table}" in asked.stdout
            # Killed once Kafka holds a resume record past the first chunks.
            wait_past_first_chunks(source, kafka_bootstrap, table, producer)
            assert producer.proc is not None
            workers = assert_worker_sessions(producer.proc.pid, 2)
            producer.kill()  # kill -9 in the middle of the snapshot
            wait_gone(workers)  # they watch their parent: their sessions go with them
            before_restart = writer.transactions
            producer = ProducerProcess(source, kafka_bootstrap, registry_url, **settings)
            producer.start()
            wait_snapshots_done(producer, f"public.{table}")
            assert writer.transactions > before_restart
        # Resumed from the last chunk Kafka holds, not restarted from the table's start.
        assert_resumed(producer)
        assert_read_by_workers(producer, 2)
        assert_topic_equals_source(source, kafka_bootstrap, registry_url, pg_dsn, table)
    finally:
        producer.stop()
        source.drop()


def test_a_snapshot_worker_killed_stops_the_snapshot_naming_the_chunk_and_a_restart_resumes(
    pg_dsn: str, kafka_bootstrap: str, registry_url: str, table: str
) -> None:
    rows = 120_000
    create_table(pg_dsn, table, rows)
    source = Source.create(pg_dsn, [table], "snapw")
    settings = {"snapshot": "initial", "snapshot_chunk_rows": 2000, "snapshot_workers": 2}
    producer = ProducerProcess(source, kafka_bootstrap, registry_url, **settings)
    try:
        producer.start()
        assert producer.proc is not None
        wait_past_first_chunks(source, kafka_bootstrap, table, producer)
        workers = assert_worker_sessions(producer.proc.pid, 2)
        os.kill(workers[0], signal.SIGKILL)
        # The next chunk's read fails: the producer stops with an error naming the table and
        # the chunk (its cursor), instead of going on without that worker's range.
        assert producer.proc.wait(120) != 0
        text = producer.log_path.read_text()
        assert "a snapshot worker process died" in text, producer.log()
        assert f"public.{table}" in text, producer.log()
        # No worker (nor its session) is left behind; a restart resumes, ends equal to the source.
        wait_gone(workers)
        producer = ProducerProcess(source, kafka_bootstrap, registry_url, **settings)
        producer.start()
        wait_snapshots_done(producer, f"public.{table}")
        assert_resumed(producer)
        assert_topic_equals_source(source, kafka_bootstrap, registry_url, pg_dsn, table)
    finally:
        producer.stop()
        source.drop()


def test_table_without_a_key_keeps_equal_rows_exact(
    pg_dsn: str, kafka_bootstrap: str, registry_url: str, table: str
) -> None:
    """A table without a key is read whole and matched by whole rows: two equal rows in the
    table and an equal insert committed inside the window that the read did not see (its
    transaction was running when the read took its snapshot, and commits while the read's
    COPY runs) end as three rows. Equal rows inserted all along the snapshot too: the rows the
    events say equal PostgreSQL's, duplicates counted."""
    sql(
        pg_dsn,
        f"CREATE TABLE {table} (v int NOT NULL, pad text)",
        f"INSERT INTO {table} SELECT g % 1000, 'p' || (g % 1000) FROM generate_series(1, 100000) g",
        f"INSERT INTO {table} VALUES (-1, 'dup'), (-1, 'dup')",
        f"ANALYZE {table}",
    )
    source = Source.create(pg_dsn, [table], "snapnk")
    producer = ProducerProcess(
        source, kafka_bootstrap, registry_url, snapshot="never", snapshot_workers=2
    )
    inserter = psycopg.connect(pg_dsn)
    try:
        producer.start()  # creates the slot (which waits for running transactions)
        inserter.execute(f"INSERT INTO {table} VALUES (-1, 'dup')")  # running, not committed
        signal = json.dumps({"snapshot": [f"public.{table}"]})
        sql(pg_dsn, f"SELECT pg_logical_emit_message(true, 'walbridge.signal', '{signal}')")
        # The read runs: a COPY, or the read's transaction (the reader's, or a worker's that
        # imported it) waiting between statements with its snapshot taken. The workers' COPYs
        # of this table take some 50 ms each, which a poll can miss on a loaded machine; the
        # reader's transaction lasts the whole read.
        copying = (
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
            "'walbridge_snapshot' AND ((state = 'active' AND query LIKE 'COPY%') OR "
            "(state = 'idle in transaction' AND backend_xmin IS NOT NULL))"
        )
        deadline = time.monotonic() + 120
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            while conn.execute(copying).fetchone() == (0,):
                assert time.monotonic() < deadline, producer.log()
                time.sleep(0.005)
            inserter.commit()  # after the low watermark and the read's snapshot
            while '"snapshot done"' not in producer.log_path.read_text():
                assert time.monotonic() < deadline, producer.log()
                conn.execute(f"INSERT INTO {table} VALUES (-1, 'dup'), (7, 'p7')")
                time.sleep(0.01)
        wait_snapshots_done(producer, f"public.{table}")
        source.wait_confirmed(source.current_lsn())
        topic = f"{source.prefix}.public.{table}"
        records = read_all(kafka_bootstrap, registry_url, topic)
        events: dict[tuple[int, int], dict[str, Any]] = {}
        for r in records:
            events[(r.value["source"]["commit_lsn"], r.value["transaction"]["total_order"])] = (
                r.value
            )
        rows: Counter[tuple[int, str]] = Counter()
        for _, v in sorted(events.items()):
            if v["op"] == "t":
                rows.clear()
            elif v["op"] in ("c", "r"):
                rows[(v["after"]["v"], v["after"]["pad"])] += 1
            else:
                raise AssertionError(f"unexpected {v['op']} event (inserts only): {v}")
        expected = Counter(query(pg_dsn, f"SELECT v, pad FROM {table}"))
        assert rows == expected, (rows - expected, expected - rows)
        assert expected[(-1, "dup")] >= 3
        reads = [v for v in events.values() if v["op"] == "r"]
        assert sum(v["after"]["v"] == -1 for v in reads) == 2  # not the insert the read missed
        # That insert committed inside the window: before the high watermark the rows take.
        read_at = {v["source"]["commit_lsn"] for v in reads}
        assert len(read_at) == 1
        first_insert = min(v["source"]["commit_lsn"] for v in events.values() if v["op"] == "c")
        assert first_insert < read_at.pop(), "the insert did not commit inside the window"
        assert metric(producer, "walbridge_snapshot_rows_dropped_total") == 0
        # Read by both workers, a range of heap blocks each (the table has some 500 blocks).
        body = producer.http("/metrics")[1]
        ranges = {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in body.splitlines()
            if line.startswith("walbridge_snapshot_worker_ranges_total{")
        }
        assert ranges == {
            f'walbridge_snapshot_worker_ranges_total{{kind="block",table="public.{table}"}}': 2.0
        }, producer.log()
    finally:
        inserter.close()
        producer.stop()
        source.drop()
