"""Every operation through the real pipeline (PostgreSQL -> producer -> Kafka -> consumer ->
Delta), ending with `verify` == equal: inserts of edge values of many types, updates, deletes,
a key change, an unchanged TOAST value, truncate, ADD COLUMN mid-stream, an insert-only table
without replica identity, and REPLICA IDENTITY FULL."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.e2e.harness import pipeline
from tests.support.spark import spark  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.secure_stack]

BIG = "(SELECT string_agg(md5(i::text), '') FROM generate_series(1, 2000) i)"  # 64 kB, TOASTed


def test_each_operation_ends_equal(
    spark: SparkSession,
    pg_dsn: str,
    kafka_bootstrap: str,
    registry_url: str,
    tmp_path: Path,
) -> None:
    s = f"e2e_ops_{uuid.uuid4().hex[:8]}"
    items, trunc, log, full = f"{s}.items", f"{s}.trunc", f"{s}.log", f"{s}.full_ri"
    from tests.support.producer_harness import sql

    sql(
        pg_dsn,
        f"CREATE SCHEMA {s}",
        f"CREATE TYPE {s}.mood AS ENUM ('sad', 'ok', 'happy')",
        f"""CREATE TABLE {items} (
            id int PRIMARY KEY, name text, doc text, price numeric(10,2), qty int4,
            ratio float8, r4 float4, born date, at timestamp, atz timestamptz, t time,
            iv interval, tags text[], grid int4[], data bytea, js jsonb, u uuid,
            mood {s}.mood, flag boolean, big numeric)""",
        f"CREATE TABLE {trunc} (id bigint PRIMARY KEY, v text)",
        f"CREATE TABLE {log} (msg text, at timestamptz)",
        f"CREATE TABLE {full} (id int PRIMARY KEY, v text, doc text)",
        f"ALTER TABLE {full} REPLICA IDENTITY FULL",
    )
    try:
        with pipeline(
            spark,
            pg_dsn,
            kafka_bootstrap,
            registry_url,
            tmp_path,
            [items, trunc, log, full],
            "e2eops",
        ) as p:
            p.start_producer()
            p.sql(
                f"""INSERT INTO {items} VALUES
                (1, 'plain', 'small', 12.50, 3, 0.1, 1.1, '2024-02-29', '2024-01-02 03:04:05.123',
                 '2024-01-02 03:04:05+02', '12:34:56.5', '1 year 2 mons 3 days 04:05:06.7',
                 ARRAY['a', 'b c', NULL, '"q"'], '{{{{1,2}},{{3,4}}}}', '\\x00ff', '{{"k": [1, 2]}}',
                 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 'happy', true, 123.456000),
                (2, 'edges', NULL, 'NaN', -1, 'Infinity', '-Infinity', 'infinity', '-infinity',
                 'infinity', '24:00:00', '-1 mons +2 days -00:00:01', '{{}}', '[0:1]={{5,6}}', '', 'null',
                 NULL, 'sad', false, 'NaN'),
                (3, 'bc', NULL, -0.01, 0, 'NaN', 0, '0044-03-15 BC', '0044-03-15 12:00:00 BC',
                 '10000-01-01 00:00:00+00', '00:00:00', '0', NULL, NULL, NULL, NULL, NULL, NULL,
                 NULL, 0.000000001)""",
                f"INSERT INTO {items} (id, name, doc) VALUES (4, 'toasty', {BIG}), (5, 'gone', 'x'),"
                f" (6, 'rekey', 'y'), (8, 'moved', {BIG})",
                f"INSERT INTO {trunc} SELECT g, 'v' || g FROM generate_series(1, 20) g",
                f"INSERT INTO {log} VALUES ('one', now()), ('two', '2000-01-01 00:00:00+00')",
                f"INSERT INTO {full} VALUES (1, 'a', 'x'), (2, 'b', {BIG})",
            )
            p.sql(
                f"UPDATE {items} SET qty = 42, price = 1.00 WHERE id = 4",  # doc: unchanged TOAST
                f"UPDATE {items} SET name = 'changed', tags = ARRAY['x'] WHERE id = 1",
                f"DELETE FROM {items} WHERE id = 5",
                f"UPDATE {items} SET id = 60 WHERE id = 6",  # key change: d(6) + c(60)
                # key change of a TOASTed row inserted in the same batch: doc is not resent
                f"UPDATE {items} SET id = 80 WHERE id = 8",
                f"UPDATE {full} SET v = 'b2' WHERE id = 2",
                f"DELETE FROM {full} WHERE id = 1",
            )
            p.wait_published()
            p.consume_available()
            p.assert_equal()
            rows = {r["id"]: r for r in p.table(items)}
            assert set(rows) == {1, 2, 3, 4, 60, 80}
            assert len(rows[80]["doc"]) == 64_000  # carried over from key 8 within the batch
            assert rows[4]["qty"] == 42 and rows[4]["doc"] is not None
            assert len(rows[4]["doc"]) == 64_000  # kept from the insert, never null
            assert rows[2]["price"] is None and rows[2]["price__text"] == "NaN"
            assert rows[2]["t"] == "24:00:00.000000"
            assert rows[1]["grid"] == [1, 2, 3, 4]
            assert rows[1]["grid__shape"]["dims"] == [2, 2]

            # Schema evolution mid-stream, truncate, more changes after it.
            p.sql(
                f"ALTER TABLE {items} ADD COLUMN note text",
                f"UPDATE {items} SET note = 'added' WHERE id = 1",
                f"UPDATE {items} SET id = 40 WHERE id = 4",  # doc now comes from the lake's row 4
                f"INSERT INTO {items} (id, name, note) VALUES (7, 'new', 'n7')",
                f"TRUNCATE {trunc}",
                f"INSERT INTO {trunc} VALUES (100, 'after truncate')",
                f"INSERT INTO {log} VALUES ('three', NULL)",
                # FULL: the events carry doc in `after` (not as unchanged TOAST): no lake row
                # needed, and a key change keeps it too.
                f"UPDATE {full} SET v = 'b3' WHERE id = 2",
                f"UPDATE {full} SET id = 20 WHERE id = 2",
            )
            p.wait_published()
            p.consume_available()
            p.assert_equal()
            assert [r["id"] for r in p.table(trunc)] == [100]
            notes = {r["id"]: r["note"] for r in p.table(items)}
            assert notes[1] == "added" and notes[7] == "n7" and notes[3] is None
            docs = {r["id"]: r["doc"] for r in p.table(items)}
            assert 4 not in docs and len(docs[40]) == 64_000
            assert [(r["id"], r["v"], len(r["doc"])) for r in p.table(full)] == [(20, "b3", 64_000)]
            last = p.progress()[-1]
            assert last["pending_transactions"] == 0
            assert set(last["table_versions"]) == {items, trunc, log, full}
    finally:
        sql(pg_dsn, f"DROP SCHEMA {s} CASCADE")
