"""Hostile identifiers through the real producer: a schema with a space and `…`, a table named
like an SQL injection, columns that are no Avro names, and two tables that would share a topic
(refused at start-up, naming both). The events carry the original names in `source`; the Avro
fields keep them in `pg.name` (CONTRACT.md, "Names")."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from schemas.safe_names import name_part
from schemas.topics import table_topic
from tests.support.producer_harness import ProducerProcess, Source, TopicReader, sql

pytestmark = pytest.mark.integration

TABLE = 'Wé"ird`; DROP TABLE x; --'
COLUMNS = ("Id`x", "sp ace", "select", "ÜnïCode", "a.b")


def ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def test_hostile_names_are_published_under_safe_topics_with_original_names(
    pg_dsn: str, kafka_bootstrap: str, registry_url: str
) -> None:
    schema = f"Hostile Sch_… {uuid.uuid4().hex[:6]}"
    qualified = f"{ident(schema)}.{ident(TABLE)}"
    sql(
        pg_dsn,
        f"CREATE SCHEMA {ident(schema)}",
        f"CREATE TABLE {qualified} ({ident(COLUMNS[0])} int PRIMARY KEY, {ident(COLUMNS[1])} text,"
        f" {ident(COLUMNS[2])} int, {ident(COLUMNS[3])} text, {ident(COLUMNS[4])} numeric(6,2))",
    )
    source = Source.create(pg_dsn, [qualified], "hostile")
    # WALBRIDGE_TABLES in PostgreSQL's quoting, with "" for the quote in the table name.
    producer = ProducerProcess(
        source, kafka_bootstrap, registry_url, tables=f"{ident(schema)}.{ident(TABLE)}"
    ).start()
    try:
        sql(pg_dsn, f"INSERT INTO {qualified} VALUES (1, 'x y', 2, 'ü', 1.25)")
        topic = table_topic(source.prefix, schema, TABLE)
        assert topic == f"{source.prefix}.{name_part(schema)}.{name_part(TABLE)}"
        records = TopicReader(kafka_bootstrap, registry_url).read([topic], expect=1)
        assert len(records) == 1
        value = records[0].value
        assert value["source"]["schema"] == schema
        assert value["source"]["table"] == TABLE
        assert value["after"] == {"Id_x": 1, "sp_ace": "x y", "select": 2, "_n_Code": "ü",
                                  "a_b": pytest.approx(1.25)}  # fmt: skip
        assert records[0].key == {"Id_x": 1}
        # The original column names are recoverable from the registered schema.
        client = SchemaRegistryClient({"url": registry_url})
        envelope = json.loads(client.get_latest_version(f"{topic}-value").schema.schema_str)
        row = next(f for f in envelope["fields"] if f["name"] == "before")["type"][1]
        names = {f["name"]: f.get("pg.name", f["name"]) for f in row["fields"]}
        assert names == dict(
            zip(("Id_x", "sp_ace", "select", "_n_Code", "a_b"), COLUMNS, strict=True)
        )
    finally:
        producer.stop()
        source.drop()
        sql(pg_dsn, f"DROP SCHEMA {ident(schema)} CASCADE")


def test_two_tables_that_would_share_a_topic_stop_the_producer_at_start_up(
    pg_dsn: str, kafka_bootstrap: str, registry_url: str
) -> None:
    schema = f"clash_{uuid.uuid4().hex[:6]}"
    dotted = "a.b"
    twin = name_part(dotted)  # a plain name equal to the dotted one's topic part
    sql(
        pg_dsn,
        f"CREATE SCHEMA {schema}",
        f'CREATE TABLE {schema}."{dotted}" (id int PRIMARY KEY)',
        f"CREATE TABLE {schema}.{twin} (id int PRIMARY KEY)",
    )
    source = Source.create(pg_dsn, [f'{schema}."{dotted}"', f"{schema}.{twin}"], "clash")
    producer = ProducerProcess(source, kafka_bootstrap, registry_url)
    try:
        producer.start(wait_ready=False)
        assert producer.proc is not None
        deadline = time.monotonic() + 60
        while producer.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert producer.proc.returncode not in (None, 0), producer.log()
        log = producer.log()
        assert "map to the same Kafka topic" in log, log
        assert f"{source.prefix}.{schema}.{twin}" in log
        assert "'a.b'" in log and f"'{twin}'" in log
    finally:
        if producer.proc is not None and producer.proc.poll() is None:
            producer.stop()
        source.drop()
        sql(pg_dsn, f"DROP SCHEMA {schema} CASCADE")
