"""Generated columns, with the real server as the oracle: PostgreSQL 18 publishes a stored
generated column when the publication says ``publish_generated_columns = stored`` or lists it,
and never a virtual one; 15-17 publish none. For each kind of publication, the columns the
snapshot reads (producer.snapshot.catalog.describe) and the ones `verify` compares must be
exactly those of the Relation message pgoutput sends for the table, in its order, with the same
types and key flags. Then through the real producer: a snapshot of existing rows, streamed
inserts and updates, and a snapshot asked for once the stream has named the table, all carry the
stored generated column with PostgreSQL's values and no virtual column.

The table has a dropped column between its live ones, so attnums have a hole, as in real tables.
Cases that need 18 skip on older servers, saying which version ran."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from producer.pgoutput import Decoder, Insert, Relation, Update, Value
from producer.snapshot import catalog
from spark_consumer import verify
from tests.support.producer_harness import (
    ProducerProcess,
    Source,
    TopicReader,
    query,
    sql,
    unique,
)
from tests.support.snapshot_checks import wait_snapshots_done

pytestmark = pytest.mark.integration


def _major(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.info.server_version // 10000


def _needs_18(dsn: str) -> None:
    major = _major(dsn)
    if major < 18:
        pytest.skip(f"PostgreSQL {major} does not publish generated columns (18+ does)")


@dataclass
class Schema:
    dsn: str
    name: str
    major: int

    @property
    def table(self) -> str:
        return f"{self.name}.t"


@pytest.fixture
def schema(pg_dsn: str) -> Iterator[Schema]:
    """A schema with table ``t``: id, a, s = a * 2 STORED, (a dropped column), b, and on 18
    also v = a * 3 VIRTUAL (older servers have no virtual generated columns)."""
    s = Schema(pg_dsn, unique("gencols"), _major(pg_dsn))
    virtual = ", v int GENERATED ALWAYS AS (a * 3) VIRTUAL" if s.major >= 18 else ""
    sql(
        pg_dsn,
        f"CREATE SCHEMA {s.name}",
        f"CREATE TABLE {s.table} (id int PRIMARY KEY, a int NOT NULL,"
        f" s int GENERATED ALWAYS AS (a * 2) STORED, gone int, b varchar(20){virtual})",
        f"ALTER TABLE {s.table} DROP COLUMN gone",
        f"CREATE UNIQUE INDEX t_a ON {s.table} (a)",
    )
    try:
        yield s
    finally:
        sql(pg_dsn, f"DROP SCHEMA {s.name} CASCADE")


# (publication target and options, with {t} the table and {s} the schema; minimum major;
#  the columns pgoutput sends)
CASES = {
    "plain": ("FOR TABLE {t}", 15, ["id", "a", "b"]),
    "column list": ("FOR TABLE {t} (id, b)", 15, ["id", "b"]),
    "stored": (
        "FOR TABLE {t} WITH (publish_generated_columns = stored)",
        18,
        ["id", "a", "s", "b"],
    ),
    "list naming stored": ("FOR TABLE {t} (id, s, b)", 18, ["id", "s", "b"]),
    "stored, list without it": (
        "FOR TABLE {t} (id, b) WITH (publish_generated_columns = stored)",
        18,
        ["id", "b"],
    ),
    "schema, stored": (
        "FOR TABLES IN SCHEMA {s} WITH (publish_generated_columns = stored)",
        18,
        ["id", "a", "s", "b"],
    ),
}
IDENTITIES = {
    "default": "DEFAULT",
    "full": "FULL",
    "index": "USING INDEX t_a",
    "nothing": "NOTHING",
}


def _relation_and_rows(
    dsn: str, slot: str, publication: str, oid: int
) -> tuple[Relation, list[Insert | Update]]:
    """What pgoutput sends through ``slot`` for the table: its Relation and its changes."""
    rows = query(
        dsn,
        "SELECT data FROM pg_logical_slot_peek_binary_changes("
        "%s, NULL, NULL, 'proto_version', '1', 'publication_names', %s)",
        (slot, publication),
    )
    decoder = Decoder()
    messages = [decoder.decode(bytes(r[0])) for r in rows]
    relations = [m for m in messages if isinstance(m, Relation) and m.relation_id == oid]
    changes = [m for m in messages if isinstance(m, Insert | Update) and m.relation_id == oid]
    assert len(relations) == 1, f"{len(relations)} Relation messages for oid {oid}: {messages}"
    return relations[0], changes


def _text(value: Any) -> str | None:
    assert value is None or isinstance(value, Value), value
    return None if value is None else value.data.decode()


# Every case with the default identity; the other identities with 'plain' (every version: the
# generated column is not published) and 'stored' (18: the key flags of a published one).
PARAMS = [(case, "default") for case in CASES] + [
    (case, identity)
    for case in ("plain", "stored")
    for identity in IDENTITIES
    if identity != "default"
]


@pytest.mark.parametrize(("case", "identity"), PARAMS)
def test_snapshot_and_verify_columns_are_the_streamed_relation_columns(
    schema: Schema, case: str, identity: str
) -> None:
    target, since, expected = CASES[case]
    if schema.major < since:
        pytest.skip(f"PostgreSQL {schema.major}: case {case!r} needs {since}+")
    dsn = schema.dsn
    publication, slot = unique("gcpub"), unique("gcslot")
    columns = {"id", "a", "s", "b", "v"} if schema.major >= 18 else {"id", "a", "s", "b"}
    if identity == "full" and schema.major >= 18:
        # 18 refuses UPDATE and DELETE under REPLICA IDENTITY FULL while a generated column is
        # not published ("Replica identity must not contain unpublished generated columns"),
        # and a virtual one never is.
        sql(dsn, f"ALTER TABLE {schema.table} DROP COLUMN v")
        columns.discard("v")
    sql(
        dsn,
        f"ALTER TABLE {schema.table} REPLICA IDENTITY {IDENTITIES[identity]}",
        f"CREATE PUBLICATION {publication} " + target.format(t=schema.table, s=schema.name),
    )
    # Without a replica identity PostgreSQL refuses updates of a published table; 18 refuses
    # them under FULL while a stored generated column is not published.
    refused = identity == "nothing" or (
        identity == "full" and schema.major >= 18 and "s" not in expected
    )
    writes = ["Insert"] if refused else ["Insert", "Update"]
    try:
        sql(dsn, f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
        # The stack runs with synchronous_commit = off, and the peek reads only flushed WAL:
        # these commits wait for the flush, so the peek below sees them.
        with psycopg.connect(dsn, autocommit=True, options="-c synchronous_commit=on") as conn:
            conn.execute(f"INSERT INTO {schema.table} (id, a, b) VALUES (1, 10, 'x')")
            update = f"UPDATE {schema.table} SET a = 11 WHERE id = 1"
            if "Update" in writes:
                conn.execute(update)
            elif identity == "full" and schema.major >= 18:
                with pytest.raises(psycopg.errors.InvalidColumnReference) as refusal:
                    conn.execute(update)
                assert "must not contain unpublished generated columns" in str(refusal.value)
        oid = int(query(dsn, "SELECT %s::regclass::oid", (schema.table,))[0][0])
        relation, changes = _relation_and_rows(dsn, slot, publication, oid)
        sent = [c.name for c in relation.columns]
        assert sent == expected, f"PostgreSQL {schema.major} sent {sent} for {case!r}"

        with psycopg.connect(dsn) as conn:
            table = catalog.describe(conn, publication, schema.table)
            kept, skipped = verify.columns(conn, (schema.name, "t"), publication)
        # The snapshot's Relation equals the stream's: names, order, types, key flags.
        assert table.relation().columns == relation.columns
        assert [c.name for c in kept] == sent
        assert {s.split(" ", 1)[0] for s in skipped} == columns - set(sent)
        if "v" in columns:
            assert "v (virtual generated: never published)" in skipped
        if schema.major < 18:
            assert (
                f"s (stored generated: PostgreSQL {schema.major} does not publish generated "
                "columns (18+ can))" in skipped
            )

        # Values: the stored generated column carries PostgreSQL's a * 2, before and after.
        assert [type(c).__name__ for c in changes] == writes
        after = [dict(zip(sent, map(_text, c.new), strict=True)) for c in changes]
        if "s" in sent:
            assert [row["s"] for row in after] == ["20", "22"][: len(writes)]
        if identity == "full" and len(changes) == 2:
            # The old row of FULL carries the published columns too, s included.
            updated = changes[1]
            assert isinstance(updated, Update) and updated.old is not None
            old = dict(zip(sent, map(_text, updated.old), strict=True))
            assert old.get("s") == ("20" if "s" in sent else None)
    finally:
        sql(
            dsn,
            f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
            f" WHERE slot_name = '{slot}'",
            f"DROP PUBLICATION IF EXISTS {publication}",
        )


def test_verify_names_every_skipped_column_with_its_reason(schema: Schema) -> None:
    """On each version, the reason says why: the version, the publication's setting, the list."""
    publication = unique("gcpub")
    sql(
        schema.dsn,
        f"CREATE PUBLICATION {publication} FOR TABLE {schema.table} (id, s, b)"
        if schema.major >= 18
        else f"CREATE PUBLICATION {publication} FOR TABLE {schema.table}",
    )
    try:
        with psycopg.connect(schema.dsn) as conn:
            kept, skipped = verify.columns(conn, (schema.name, "t"), publication)
    finally:
        sql(schema.dsn, f"DROP PUBLICATION {publication}")
    if schema.major >= 18:
        assert [c.name for c in kept] == ["id", "s", "b"]
        assert skipped == (
            f"a (not in the column list of publication {publication!r})",
            "v (virtual generated: never published)",
        )
    else:
        assert [c.name for c in kept] == ["id", "a", "b"]
        assert skipped == (
            f"s (stored generated: PostgreSQL {schema.major} does not publish generated columns"
            " (18+ can))",
        )


def test_snapshots_and_streamed_changes_carry_the_stored_generated_column(
    schema: Schema, kafka_bootstrap: str, registry_url: str
) -> None:
    """Existing rows (initial snapshot), streamed inserts and updates, then a snapshot asked for
    by signal once the stream has named the table (its route then comes from the stream's
    Relation, and the rows read must fit it)."""
    _needs_18(schema.dsn)
    dsn, t = schema.dsn, schema.table
    sql(dsn, f"INSERT INTO {t} (id, a, b) SELECT g, g, 'b' || g FROM generate_series(1, 500) g")
    source = Source.create(dsn, [t], "gencols")
    sql(dsn, f"ALTER PUBLICATION {source.publication} SET (publish_generated_columns = stored)")
    producer = ProducerProcess(source, kafka_bootstrap, registry_url, snapshot="initial")
    try:
        producer.start()
        wait_snapshots_done(producer, t, timeout=180, runs=1)
        sql(
            dsn,
            f"INSERT INTO {t} (id, a, b) SELECT g, g, 'n' || g FROM generate_series(501, 520) g",
            f"UPDATE {t} SET a = a + 1000 WHERE id % 100 = 0",
        )
        sql(
            dsn,
            "SELECT pg_logical_emit_message(true, 'walbridge.signal', "
            f"'{json.dumps({'snapshot': [t]})}')",
        )
        wait_snapshots_done(producer, t, timeout=180, runs=2)
        source.wait_confirmed(source.current_lsn())
        topic = f"{source.prefix}.{t}"
        records = TopicReader(kafka_bootstrap, registry_url).read_to_end([topic])
    finally:
        producer.stop()
        source.drop()
    events = [r.value for r in records]
    by_op: dict[str, list[dict[str, Any]]] = {}
    for v in events:
        by_op.setdefault(v["op"], []).append(v)
    assert len(by_op.get("c", [])) == 20
    assert len(by_op.get("u", [])) == 5
    # Two snapshots of the whole table: 500 rows, then 520.
    assert len(by_op.get("r", [])) == 500 + 520
    for v in events:
        after = v["after"]
        assert list(after) == ["id", "a", "s", "b"], f"{v['op']} event fields {list(after)}"
        assert after["s"] == after["a"] * 2, f"{v['op']} event {after}"
    updated = {v["after"]["id"]: v["after"] for v in by_op["u"]}
    assert sorted(updated) == [100, 200, 300, 400, 500]
    assert all(row["s"] == (row["id"] + 1000) * 2 for row in updated.values())
    # The second snapshot (committed after every streamed change) reads today's rows:
    # PostgreSQL's own values of s.
    streamed = max(v["source"]["commit_lsn"] for v in by_op["c"] + by_op["u"])
    second = {
        v["after"]["id"]: v["after"]["s"]
        for v in by_op["r"]
        if v["source"]["commit_lsn"] > streamed
    }
    assert second == dict(query(dsn, f"SELECT id, s FROM {t}"))
