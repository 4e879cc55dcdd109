"""Hostile identifiers through the whole pipeline, as a new user would try them (issue 20):
schema `Hostile Sch_…`, a table named `Wé"ird`; DROP TABLE x; --` whose columns are no Avro
names (`Id`x`, `sp ace`, `select`, `ÜnïCode`, `a.b`, and `new`col)` added while streaming), an
unchanged TOAST value in the column `sp ace`, and a keyless table named `../../escape`. Producer
(WALBRIDGE_TABLES in PostgreSQL's quoting; an initial snapshot, and an incremental one asked for
by the quoted name) -> Kafka -> Spark -> Delta; `verify` (narrowed by the same quoted list) finds
the lake equal, and nothing is written outside the lake directory."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from schemas.safe_names import lake_table_path, name_part
from schemas.table_list import format_table
from schemas.topics import table_topic
from spark_consumer import verify
from spark_consumer.config import VerifyConfig
from tests.e2e.harness import Pipeline, pipeline
from tests.support.producer_harness import sql
from tests.support.spark import spark  # noqa: F401

pytestmark = pytest.mark.e2e

TABLE = 'Wé"ird`; DROP TABLE x; --'
ESCAPE = "../../escape"


def wait_snapshots_done(p: Pipeline, started: bool = False, timeout: float = 240) -> None:
    """Until /readyz no longer says `snapshotting` (``started``: after it said so once, or a
    `snapshot done` line is in the log)."""
    deadline = time.monotonic() + timeout
    seen = not started
    while True:
        status, body = p.producer.http("/readyz")
        busy = "snapshotting" in body
        seen = (
            seen
            or busy
            or p.producer.log_path.read_text(errors="replace").count("snapshot done") >= 3
        )
        if status == 200 and seen and not busy:
            return
        assert time.monotonic() < deadline, p.producer.log()
        time.sleep(0.5)


def ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def test_hostile_identifiers_end_to_end(
    spark: SparkSession,
    pg_dsn: str,
    kafka_bootstrap: str,
    registry_url: str,
    tmp_path: Path,
) -> None:
    schema = f"Hostile Sch_… {uuid.uuid4().hex[:6]}"
    weird = f"{ident(schema)}.{ident(TABLE)}"
    escape = f"{ident(schema)}.{ident(ESCAPE)}"
    big = "toasted " * 4000  # stored out of line (EXTERNAL): later updates leave it unsent
    sql(
        pg_dsn,
        f"CREATE SCHEMA {ident(schema)}",
        f'CREATE TABLE {weird} ("Id`x" int PRIMARY KEY, "sp ace" text, "select" int,'
        ' "ÜnïCode" text, "a.b" numeric(8,2))',
        f'ALTER TABLE {weird} ALTER COLUMN "sp ace" SET STORAGE EXTERNAL',
        f'CREATE TABLE {escape} ("v a l" text, n int)',
    )
    # The lake is a directory of its own, so `../..` would land in tmp_path if it escaped.
    lake_parent = tmp_path / "run"
    lake_parent.mkdir()
    try:
        with pipeline(
            spark, pg_dsn, kafka_bootstrap, registry_url, lake_parent, [weird, escape], "e2ehost"
        ) as p:
            listed = f"{format_table(schema, TABLE)}, {format_table(schema, ESCAPE)}"
            assert '""' in listed and '"../../escape"' in listed  # quoted where needed
            p.producer.env["WALBRIDGE_TABLES"] = listed
            # Rows from before the slot: read by the initial snapshot (chunked by the key).
            p.producer.env["WALBRIDGE_SNAPSHOT"] = "initial"
            p.producer.env["WALBRIDGE_SNAPSHOT_CHUNK_ROWS"] = "7"
            p.sql(
                f"INSERT INTO {weird} SELECT g, CASE WHEN g = 1 THEN '{big}' ELSE 's ' || g END,"
                " g * 10, 'Ü' || g, g / 4.0 FROM generate_series(1, 30) g",
                f"INSERT INTO {escape} SELECT 'x/' || g, g FROM generate_series(1, 5) g",
            )
            p.start_producer()
            wait_snapshots_done(p)
            p.sql(
                f"INSERT INTO {weird} SELECT g, 's ' || g, g * 10, 'Ü' || g, g / 4.0"
                " FROM generate_series(31, 40) g",
                f"INSERT INTO {escape} VALUES ('dup', 1), ('dup', 1)",
            )
            p.sql(
                # Row 1 keeps its TOASTed "sp ace" unsent: the event lists it in unchanged_toast
                # under its PostgreSQL name; the lake column is `sp_ace`.
                f'UPDATE {weird} SET "select" = -1 WHERE "Id`x" = 1',
                f'UPDATE {weird} SET "ÜnïCode" = NULL, "a.b" = 99.99 WHERE "Id`x" = 2',
                f'DELETE FROM {weird} WHERE "Id`x" BETWEEN 30 AND 35',
                f'UPDATE {weird} SET "Id`x" = 100 WHERE "Id`x" = 3',  # a key change
            )
            p.wait_published()
            p.consume_available()

            # A column added while streaming, with a name that is no Avro name either.
            p.sql(
                f'ALTER TABLE {weird} ADD COLUMN "new`col)" text',
                f'UPDATE {weird} SET "new`col)" = \'added \' || "Id`x" WHERE "Id`x" % 2 = 0',
                f'UPDATE {weird} SET "select" = -2 WHERE "Id`x" = 1',  # TOAST unsent again
                f"INSERT INTO {weird} VALUES (200, 'late', 1, 'ï', 0.5, 'new)')",
            )
            p.wait_published()
            # An incremental snapshot asked for by the quoted name (the snapshot command).
            request = subprocess.run(
                [sys.executable, "-m", "producer", "snapshot", format_table(schema, TABLE)],
                env={**p.producer.env},
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert request.returncode == 0, request.stderr
            wait_snapshots_done(p, started=True)
            p.wait_published()
            p.consume_available()

            diffs = verify.run(
                VerifyConfig(p.dsn, p.lake, p.source.publication, ((schema, TABLE),)), spark
            )
            assert [d.table for d in diffs] == [format_table(schema, TABLE)]
            diffs = p.verify()
            assert all(d.equal for d in diffs), verify.report(diffs)
            assert {d.table for d in diffs} == {
                format_table(schema, TABLE),
                format_table(schema, ESCAPE),
            }

            # The topics are legal Kafka names built by the documented rule.
            from confluent_kafka.admin import AdminClient

            topics = set(
                AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=30).topics
            )
            assert table_topic(p.prefix, schema, TABLE) in topics
            assert table_topic(p.prefix, schema, ESCAPE) in topics

            # Lake: two levels below the lake, nothing written beside it.
            lake = Path(p.lake)
            assert {d.name for d in (lake / name_part(schema)).iterdir()} == {
                name_part(TABLE),
                name_part(ESCAPE),
            }
            assert sorted(x.name for x in lake_parent.iterdir()) == ["checkpoint", "lake"]
            assert not (tmp_path / "escape").exists()

            rows = {r["Id_x"]: r for r in p.table_rows(schema, TABLE)}
            assert rows[1]["sp_ace"] == big and rows[1]["select"] == -2
            assert rows[100]["a_b"] is not None and 3 not in rows
            assert rows[2]["new_col_"] == "added 2" and rows[200]["new_col_"] == "new)"
            # Each renamed column names its PostgreSQL column in its comment, also one added by
            # ALTER TABLE later (new`col)).
            fields = spark.read.format("delta").load(lake_table_path(p.lake, schema, TABLE)).schema
            comments = {f.name: f.metadata.get("comment") for f in fields}
            assert comments["sp_ace"] == "PostgreSQL column sp ace"
            assert comments["Id_x"] == "PostgreSQL column Id`x"
            assert comments["_n_Code"] == "PostgreSQL column ÜnïCode"
            assert comments["new_col_"] == "PostgreSQL column new`col)"
            assert comments["select"] is None  # a valid name keeps no comment
            # Progress names tables by their original names.
            versions = p.progress()[-1]["table_versions"]
            assert f"{schema}.{TABLE}" in versions and f"{schema}.{ESCAPE}" in versions
    finally:
        sql(pg_dsn, f"DROP SCHEMA {ident(schema)} CASCADE")
