"""The downstream guide's example (examples/downstream_consumer.py) against the real stack: a
producer publishes multi-table transactions, a key change of a row whose TOASTed column is left
alone (DEFAULT identity: listed in unchanged_toast), deletes and a truncate; the example, run
as a user would run it, prints whole transactions in commit order and ends with tables equal
to PostgreSQL's."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.producer_harness import ROOT, ProducerProcess, Source, query, sql, unique

pytestmark = pytest.mark.integration

BIG = "(SELECT string_agg(md5(i::text), '') FROM generate_series(1, 300) i)"  # 9.6 kB, TOASTed


@pytest.fixture
def tables(pg_dsn: str) -> Iterator[dict[str, str]]:
    t = {name: unique(f"dx_{name}") for name in ("orders", "lines", "audit")}
    sql(
        pg_dsn,
        f"CREATE TABLE {t['orders']} (id int PRIMARY KEY, customer text, total bigint, note text)",
        f"ALTER TABLE {t['orders']} ALTER COLUMN note SET STORAGE EXTERNAL",
        f"CREATE TABLE {t['lines']} (order_id int, n int, qty int, PRIMARY KEY (order_id, n))",
        f"CREATE TABLE {t['audit']} (id serial PRIMARY KEY, msg text)",
    )
    yield t
    sql(pg_dsn, *(f"DROP TABLE IF EXISTS {name}" for name in t.values()))


def transaction(pg_dsn: str, *statements: str) -> None:
    sql(pg_dsn, "BEGIN", *statements, "COMMIT")


def rows(pg_dsn: str, table: str, columns: str) -> list[dict[str, Any]]:
    names = [c.strip() for c in columns.split(",")]
    got = query(pg_dsn, f"SELECT {columns} FROM {table}")
    return sorted(
        (dict(zip(names, r, strict=True)) for r in got),
        key=lambda r: json.dumps(r, default=str, sort_keys=True),
    )


def test_example_prints_whole_transactions_and_ends_equal_to_postgres(
    pg_dsn: str, kafka_bootstrap: str, registry_url: str, tables: dict[str, str]
) -> None:
    orders, lines, audit = tables["orders"], tables["lines"], tables["audit"]
    source = Source.create(pg_dsn, tables.values(), "dx")
    producer = ProducerProcess(source, kafka_bootstrap, registry_url, topic_partitions=3).start()
    try:
        transaction(
            pg_dsn,
            f"INSERT INTO {orders} SELECT g, 'c' || g, 0, {BIG} FROM generate_series(1, 20) g",
            f"INSERT INTO {lines} SELECT o, n, o * n FROM generate_series(1, 20) o,"
            " generate_series(1, 3) n",
            f"INSERT INTO {audit} (msg) VALUES ('loaded')",
        )
        transaction(
            pg_dsn,
            # note is TOASTed and left alone: unchanged_toast under DEFAULT identity
            f"UPDATE {orders} o SET total = (SELECT sum(qty) FROM {lines} WHERE order_id = o.id)",
            f"DELETE FROM {lines} WHERE n = 3 AND order_id % 2 = 0",
        )
        # A key change of a TOASTed row: delete + create, the create's note not resent.
        transaction(pg_dsn, f"UPDATE {orders} SET id = 100 WHERE id = 7")
        transaction(pg_dsn, f"INSERT INTO {audit} (msg) VALUES ('only a table not read')")
        transaction(
            pg_dsn,
            f"TRUNCATE {lines}",
            f"INSERT INTO {lines} VALUES (100, 1, 5)",
            f"UPDATE {orders} SET customer = NULL WHERE id = 3",
        )
        source.wait_confirmed(source.current_lsn())

        table_names = [f"public.{orders}", f"public.{lines}"]
        command = [
            *(sys.executable, "examples/downstream_consumer.py"),
            *("--bootstrap", kafka_bootstrap, "--registry", registry_url),
            *("--prefix", source.prefix, "--group", unique("dx"), "--idle-exit-s", "8"),
            *(arg for t in table_names for arg in ("--table", t)),
        ]
        out = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
        )
        assert out.returncode == 0, out.stderr
        printed = [json.loads(line) for line in out.stdout.splitlines()]
        txs, final = printed[:-1], printed[-1]["final"]
        # Whole transactions, once each, in commit order: the audit-only one is not there.
        assert [t["events"] for t in txs] == [80, 30, 2, 3]
        assert [t["commit_lsn"] for t in txs] == sorted({t["commit_lsn"] for t in txs})
        assert txs[2]["ops"] == "dc"
        assert txs[3]["ops"] == "tcu"
        assert final[f"public.{orders}"] == rows(pg_dsn, orders, "id, customer, total, note")
        assert final[f"public.{lines}"] == rows(pg_dsn, lines, "order_id, n, qty")
        moved = next(r for r in final[f"public.{orders}"] if r["id"] == 100)
        assert len(moved["note"]) == 9600  # taken from the deleted row 7, not null
    finally:
        producer.stop()
        source.drop()
