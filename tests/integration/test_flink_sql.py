"""Flink SQL reads our table topics as a downstream team would: a Kafka table with the
``debezium-avro-confluent`` format and a primary key, from the earliest offset. Its materialized
result must equal the PostgreSQL table after inserts, updates, deletes and a key change.

Flink is the real thing (its distribution from PyPI plus the Kafka and registry-Avro connectors
from Maven Central, installed by ``deploy/local/flink-sql``); the query runs in a local mini
cluster and ends at the topic's latest offset.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.producer_harness import ROOT, ProducerProcess, Source, query, sql, unique

pytestmark = pytest.mark.integration

FLINK_SQL = ROOT / "deploy" / "local" / "flink-sql"
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

# How each column is declared in Flink SQL, next to its PostgreSQL type (docs/downstream-tools.md, "Flink SQL").
COLUMNS = (
    ("id", "int", "INT"),
    ("code", "text NOT NULL", "STRING"),
    ("qty", "int", "INT"),
    ("price", "numeric(10,2)", "DECIMAL(10, 2)"),
    ("ratio", "double precision", "DOUBLE"),
    ("day", "date", "DATE"),
    ("at", "timestamptz", "BIGINT"),
    ("flag", "boolean", "BOOLEAN"),
    ("raw", "bytea", "BYTES"),
    ("tags", "text[]", "ARRAY<STRING>"),  # one dimension from 1: a plain Avro array
    ("small", "int2", "INT"),
    ("f4", "real", "FLOAT"),
    ("clock", "time", "BIGINT"),  # micros since midnight
    ("span", "interval", "ROW<months INT, days INT, micros BIGINT>"),
)
# docs/downstream-tools.md's way to get a Flink timestamp out of a timestamptz column.
COMPUTED = "at_ltz AS TO_TIMESTAMP_LTZ(`at` / 1000, 3)"


@pytest.fixture(scope="module")
def flink() -> Path:
    proc = subprocess.run([str(FLINK_SQL), "install"], capture_output=True, text=True)
    assert proc.returncode == 0, f"installing Flink failed:\n{proc.stderr}"
    return FLINK_SQL


def _pg_rows(dsn: str, table: str) -> list[list[Any]]:
    """PostgreSQL's rows in the JSON forms the Flink runner prints."""
    # an interval as its three parts (psycopg folds months into days)
    span = (
        "CASE WHEN span IS NULL THEN NULL ELSE ARRAY["
        "(extract(year FROM span) * 12 + extract(month FROM span))::int8,"
        " extract(day FROM span)::int8,"
        " ((extract(hour FROM span) * 3600 + extract(minute FROM span) * 60) * 1000000"
        " + extract(microseconds FROM span))::int8] END"
    )
    names = ", ".join(span if c == "span" else f'"{c}"' for c, _, _ in COLUMNS)
    out = []
    for row in query(dsn, f"SELECT {names} FROM {table}"):
        id_, code, qty, price, ratio, day, at, flag, raw, tags, small, f4, clock, span = row
        out.append([
            id_, code, qty, None if price is None else f"{price:.2f}", ratio,
            None if day is None else day.isoformat(),
            None if at is None else (at - EPOCH) // dt.timedelta(microseconds=1),
            flag, None if raw is None else bytes(raw).hex(), tags, small, f4,
            None if clock is None else (
                (clock.hour * 3600 + clock.minute * 60 + clock.second) * 10**6 + clock.microsecond
            ),
            None if span is None else list(span),
            None if at is None else _instant_text(at),
        ])  # fmt: skip
    return sorted(out, key=lambda r: r[0])


def _instant_text(at: dt.datetime) -> str:
    """Java's Instant.toString of the value at millisecond precision (the computed column)."""
    ms = at.astimezone(dt.UTC).microsecond // 1000
    return at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S") + (f".{ms:03d}Z" if ms else "Z")


def _changes(dsn: str, table: str) -> None:
    t = table
    sql(
        dsn,
        f"INSERT INTO {t} SELECT g, 'c' || g, g, g * 1.25, g / 3.0, DATE '2024-02-28' + g,"
        f" TIMESTAMPTZ '2040-08-22 10:00:00.123456+02' + g * INTERVAL '1 hour',"
        f" g % 2 = 0, decode(lpad(to_hex(g), 4, '0'), 'hex'),"
        f" CASE WHEN g % 3 = 0 THEN '{{}}' ELSE ARRAY['t' || g, NULL, 'x y'] END,"
        f" g - 20, g / 8.0, TIME '13:14:15.123456' + g * INTERVAL '1 minute',"
        f" make_interval(years => 1, months => g, days => -g, secs => g * 1.5)"
        f" FROM generate_series(1, 40) g",
        f"UPDATE {t} SET qty = qty * 10, price = NULL WHERE id % 5 = 0",
        f"DELETE FROM {t} WHERE id % 7 = 0",
        # a key change (a delete of 3 and a create of 103), with other columns changed too
        f"UPDATE {t} SET id = 103, code = 'moved' WHERE id = 3",
        f"UPDATE {t} SET id = id + 1000 WHERE id BETWEEN 10 AND 12",
        f"INSERT INTO {t} (id, code) VALUES (41, 'x')",
        f"UPDATE {t} SET tags = tags || ARRAY['more'] WHERE id % 4 = 0",
    )
    # several changes of one row in one transaction, and a delete then re-insert of a key
    with psycopg.connect(dsn) as conn:
        conn.execute(f"UPDATE {t} SET qty = 1 WHERE id = 1")
        conn.execute(f"UPDATE {t} SET qty = 2, flag = NULL WHERE id = 1")
        conn.execute(f"DELETE FROM {t} WHERE id = 2")
        conn.execute(f"INSERT INTO {t} (id, code, qty) VALUES (2, 'again', 22)")


@pytest.fixture(scope="module")
def topic(pg_dsn: str, kafka_bootstrap: str, registry_url: str) -> Iterator[str]:
    table = unique("flink")
    columns = ", ".join(f'"{c}" {pg}' for c, pg, _ in COLUMNS)
    # Flink's Debezium formats need the whole old row on updates: REPLICA IDENTITY FULL.
    sql(
        pg_dsn,
        f"CREATE TABLE {table} ({columns}, PRIMARY KEY (id))",
        f"ALTER TABLE {table} REPLICA IDENTITY FULL",
    )
    source = Source.create(pg_dsn, [table], "fl")
    producer = ProducerProcess(source, kafka_bootstrap, registry_url).start()
    try:
        _changes(pg_dsn, table)
        source.wait_confirmed(source.current_lsn())
        yield f"{source.prefix}.public.{table}"
    finally:
        producer.stop()
        source.drop()
    sql(pg_dsn, f"DROP TABLE {table}")


def test_flink_materializes_the_postgresql_table(
    flink: Path, topic: str, pg_dsn: str, kafka_bootstrap: str, registry_url: str, tmp_path: Path
) -> None:
    columns = ",\n  ".join([*(f"`{c}` {flink_type}" for c, _, flink_type in COLUMNS), COMPUTED])
    script = tmp_path / "materialize.sql"
    script.write_text(
        f"""
CREATE TABLE source_table (
  {columns},
  PRIMARY KEY (id) NOT ENFORCED
) WITH (
  'connector' = 'kafka',
  'topic' = '{topic}',
  'properties.bootstrap.servers' = '{kafka_bootstrap}',
  'properties.isolation.level' = 'read_committed',
  'scan.startup.mode' = 'earliest-offset',
  'scan.bounded.mode' = 'latest-offset',
  'format' = 'debezium-avro-confluent',
  'debezium-avro-confluent.url' = '{registry_url}'
);
SELECT * FROM source_table;
"""
    )
    proc = subprocess.run([str(flink), str(script)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"Flink failed:\n{proc.stderr[-4000:]}"
    flink_rows = sorted((json.loads(line) for line in proc.stdout.splitlines()), key=lambda r: r[0])
    expected = _pg_rows(pg_dsn, topic.rsplit(".", 1)[1])
    assert len(expected) == 36  # 41 rows, 5 deleted (2 was deleted and inserted again)
    assert flink_rows == expected
