"""What the real PostgreSQL sends over START_REPLICATION, read by the replication client and
decoded by producer.pgoutput. The server is the oracle: catalog OIDs, LSNs and row values are
checked against what SQL reports. Each test uses its own slot, publication and tables and drops
them afterwards (a forgotten slot holds WAL forever)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from producer.pgoutput import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Decoder,
    Delete,
    Insert,
    Message,
    Origin,
    PgOutputMessage,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
    Value,
    parse_lsn,
)
from producer.replication import ReplicationClient, ReplicationConfig, TableName

pytestmark = pytest.mark.integration

TIMEOUT = 30.0


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


@dataclass
class Env:
    """One test's private slot/publication/schema on the shared PostgreSQL."""

    dsn: str
    sql: psycopg.Connection
    slot: str
    publication: str
    schema: str

    def table(self, name: str) -> TableName:
        return TableName(self.schema, name)

    def qualified(self, name: str) -> str:
        return f"{self.schema}.{name}"

    def oid(self, name: str) -> int:
        row = self.sql.execute("SELECT %s::regclass::oid", (self.qualified(name),)).fetchone()
        assert row is not None
        return int(row[0])

    def capture(
        self,
        write: Callable[[psycopg.Connection], None],
        until: Callable[[list[PgOutputMessage]], bool],
        *,
        tables: tuple[str, ...],
        dsn_options: str | None = None,
        **config: Any,
    ) -> list[PgOutputMessage]:
        """Create publication + slot, run ``write`` on a fresh session, then stream and decode
        until ``until(messages)`` holds; fails (listing what arrived) after TIMEOUT."""
        cfg = ReplicationConfig(
            slot=self.slot,
            publication=self.publication,
            tables=tuple(self.table(t) for t in tables),
            status_interval=1.0,
            **config,
        )
        dsn = make_conninfo(self.dsn, options=dsn_options) if dsn_options else self.dsn
        messages: list[PgOutputMessage] = []
        with ReplicationClient(dsn, cfg) as client:
            client.open()
            client.ensure_publication()
            client.ensure_slot()
            with psycopg.connect(self.dsn, autocommit=True) as writer:
                write(writer)
            decoder = Decoder()
            deadline = time.monotonic() + TIMEOUT
            for item in client.stream(idle_after=0.2):
                if item is not None:
                    messages.append(decoder.decode(item[0]))
                if until(messages):
                    return messages
                if time.monotonic() > deadline:
                    pytest.fail(f"timed out; received {[type(m).__name__ for m in messages]}")
        raise AssertionError("the stream ended")


@pytest.fixture
def env(pg_dsn: str) -> Iterator[Env]:
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        e = Env(pg_dsn, admin, unique("t_slot"), unique("t_pub"), unique("t_schema"))
        admin.execute(f"CREATE SCHEMA {e.schema}")
        try:
            yield e
        finally:
            admin.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                " WHERE slot_name = %s",
                (e.slot,),
            )
            admin.execute(f'DROP PUBLICATION IF EXISTS "{e.publication}"')
            admin.execute(f"DROP SCHEMA {e.schema} CASCADE")


def kinds(messages: list[PgOutputMessage]) -> list[str]:
    return [type(m).__name__ for m in messages]


def count(cls: type) -> Callable[[list[PgOutputMessage]], bool]:
    return lambda ms: any(isinstance(m, cls) for m in ms)


def n_of(cls: type, n: int) -> Callable[[list[PgOutputMessage]], bool]:
    return lambda ms: sum(isinstance(m, cls) for m in ms) >= n


def text(value: object) -> str:
    assert isinstance(value, Value), value
    assert not value.binary
    return value.data.decode()


def of(messages: list[PgOutputMessage], cls: type) -> list[Any]:
    return [m for m in messages if isinstance(m, cls)]


# --- protocol 1 ----------------------------------------------------------------------------


def test_proto1_plain_insert_update_delete(env: Env) -> None:
    env.sql.execute(
        f"CREATE TABLE {env.qualified('items')} (id int PRIMARY KEY, name text, price numeric(12,2))"
    )

    def write(db: psycopg.Connection) -> None:
        with db.transaction():
            db.execute(
                f"INSERT INTO {env.qualified('items')} VALUES (1, 'one', 1.50), (2, NULL, 2)"
            )
            db.execute(f"UPDATE {env.qualified('items')} SET name = 'uno' WHERE id = 1")
            db.execute(f"DELETE FROM {env.qualified('items')} WHERE id = 2")
            db.execute("SELECT pg_logical_emit_message(true, 'ignored', 'no messages option')")

    ms = env.capture(write, count(Commit), tables=("items",))
    assert kinds(ms) == ["Begin", "Relation", "Insert", "Insert", "Update", "Delete", "Commit"]
    begin, rel, ins1, ins2, upd, dele, commit = ms
    assert isinstance(begin, Begin) and isinstance(commit, Commit)
    assert begin.final_lsn == commit.commit_lsn and commit.end_lsn > commit.commit_lsn
    assert begin.xid is not None and begin.xid > 0
    assert isinstance(rel, Relation)
    assert (rel.relation_id, rel.namespace, rel.name) == (env.oid("items"), env.schema, "items")
    assert [(c.name, c.type_oid, c.is_key) for c in rel.columns] == [
        ("id", 23, True),
        ("name", 25, False),
        ("price", 1700, False),
    ]
    assert rel.columns[2].type_modifier == ((12 << 16) | 2) + 4  # numeric(12,2) typmod
    assert isinstance(ins1, Insert) and ins1.xid is None and ins1.relation_id == rel.relation_id
    assert [text(v) for v in ins1.new] == ["1", "one", "1.50"]
    assert isinstance(ins2, Insert) and ins2.new[1] is None and text(ins2.new[2]) == "2.00"
    assert isinstance(upd, Update) and upd.old_kind is None and upd.old is None
    assert [text(v) for v in upd.new] == ["1", "uno", "1.50"]
    assert isinstance(dele, Delete) and dele.old_kind == "K"
    assert dele.old is not None and text(dele.old[0]) == "2" and dele.old[1:] == (None, None)


def test_proto1_binary_values(env: Env) -> None:
    env.sql.execute(f"CREATE TABLE {env.qualified('b')} (id int8 PRIMARY KEY, flag bool, t text)")

    def write(db: psycopg.Connection) -> None:
        db.execute(f"INSERT INTO {env.qualified('b')} VALUES (258, true, 'é')")

    ms = env.capture(write, count(Commit), tables=("b",), binary=True)
    (ins,) = of(ms, Insert)
    assert ins.new == (
        Value((258).to_bytes(8, "big"), True),
        Value(b"\x01", True),
        Value("é".encode(), True),
    )


def test_proto1_logical_messages_transactional_and_not(env: Env) -> None:
    env.sql.execute(f"CREATE TABLE {env.qualified('m')} (id int PRIMARY KEY)")
    lsns: dict[str, int] = {}

    def write(db: psycopg.Connection) -> None:
        row = db.execute(
            "SELECT pg_logical_emit_message(false, 'wb.nontx', 'now')::text"
        ).fetchone()
        assert row is not None
        lsns["nontx"] = parse_lsn(row[0])
        with db.transaction():
            db.execute(f"INSERT INTO {env.qualified('m')} VALUES (1)")
            row = db.execute(
                "SELECT pg_logical_emit_message(true, 'wb.tx', '\\x00ff'::bytea)::text"
            ).fetchone()
            assert row is not None
            lsns["tx"] = parse_lsn(row[0])

    ms = env.capture(write, count(Commit), tables=("m",), messages=True)
    assert kinds(ms) == ["Message", "Begin", "Relation", "Insert", "Message", "Commit"]
    nontx, tx = of(ms, Message)
    assert (nontx.transactional, nontx.prefix, nontx.content, nontx.xid) == (
        False,
        "wb.nontx",
        b"now",
        None,
    )
    assert (tx.transactional, tx.prefix, tx.content, tx.xid) == (True, "wb.tx", b"\x00\xff", None)
    # Both sides name the message by its record's end LSN.
    assert (nontx.lsn, tx.lsn) == (lsns["nontx"], lsns["tx"])
    assert nontx.lsn < tx.lsn


# --- protocol 2: streaming of large in-progress transactions ---------------------------------

STREAMING = {"proto_version": 2, "streaming": "on"}
# The walsender decodes, so its session needs the smallest decoding memory (64kB) to stream.
SMALL_DECODING_MEMORY = "-c logical_decoding_work_mem=64kB"
BIG_INSERT = "INSERT INTO {t} SELECT g, repeat('x', 200) FROM generate_series({a}, {b}) g"


def test_proto2_streamed_commit(env: Env) -> None:
    t = env.qualified("s")
    env.sql.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, pad text)")

    def write(db: psycopg.Connection) -> None:
        with db.transaction():
            db.execute(BIG_INSERT.format(t=t, a=1, b=3000))

    ms = env.capture(
        write, count(StreamCommit), tables=("s",), dsn_options=SMALL_DECODING_MEMORY, **STREAMING
    )
    starts = of(ms, StreamStart)
    (commit,) = of(ms, StreamCommit)
    assert len(starts) >= 2, "64kB of decoding memory should split 600kB into several segments"
    assert starts[0].first_segment and not any(s.first_segment for s in starts[1:])
    assert {s.xid for s in starts} == {commit.xid}
    assert len(of(ms, StreamStop)) == len(starts)
    inserts = of(ms, Insert)
    assert len(inserts) == 3000 and {i.xid for i in inserts} == {commit.xid}
    assert of(ms, Relation)[0].xid == commit.xid
    assert not of(ms, Begin) and not of(ms, Commit)
    assert commit.end_lsn > commit.commit_lsn


def test_proto2_streamed_transaction_rolled_back(env: Env) -> None:
    if env.sql.info.server_version >= 180000:
        # 18 does not stream a transaction it already knows to be rolled back (the walsender
        # decodes after the ROLLBACK here), so no StreamAbort comes; a subtransaction's
        # StreamAbort is still parsed in test_proto2_rolled_back_subtransaction.
        pytest.skip("PostgreSQL 18+ skips streaming a transaction known to be rolled back")
    t = env.qualified("s")
    env.sql.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, pad text)")

    def write(db: psycopg.Connection) -> None:
        db.execute("BEGIN")
        db.execute(BIG_INSERT.format(t=t, a=1, b=3000))
        db.execute("ROLLBACK")

    ms = env.capture(
        write, count(StreamAbort), tables=("s",), dsn_options=SMALL_DECODING_MEMORY, **STREAMING
    )
    (abort,) = of(ms, StreamAbort)
    assert abort.subxid == abort.xid == of(ms, StreamStart)[0].xid
    assert not of(ms, StreamCommit)


def test_proto2_rolled_back_subtransaction(env: Env) -> None:
    t = env.qualified("s")
    env.sql.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, pad text)")

    def write(db: psycopg.Connection) -> None:
        with db.transaction():
            db.execute(BIG_INSERT.format(t=t, a=1, b=1000))
            db.execute("SAVEPOINT sp")
            db.execute(BIG_INSERT.format(t=t, a=1001, b=3000))
            db.execute("ROLLBACK TO SAVEPOINT sp")
            db.execute(BIG_INSERT.format(t=t, a=5001, b=5010))

    ms = env.capture(
        write, count(StreamCommit), tables=("s",), dsn_options=SMALL_DECODING_MEMORY, **STREAMING
    )
    (commit,) = of(ms, StreamCommit)
    aborts = of(ms, StreamAbort)
    assert len(aborts) == 1
    assert aborts[0].xid == commit.xid and aborts[0].subxid != commit.xid
    assert kinds(ms).index("StreamAbort") < kinds(ms).index("StreamCommit")
    # Inside a stream each change carries its own (sub)transaction's xid, which is how a
    # consumer drops the rolled-back subtransaction's rows.
    ids_by_xid: dict[int | None, set[int]] = {}
    for insert in of(ms, Insert):
        ids_by_xid.setdefault(insert.xid, set()).add(int(text(insert.new[0])))
    # ROLLBACK TO re-opens the savepoint, so the last rows belong to a third, committed xid.
    (later,) = set(ids_by_xid) - {commit.xid, aborts[0].subxid}
    assert ids_by_xid[commit.xid] == set(range(1, 1001))
    assert ids_by_xid[aborts[0].subxid] <= set(range(1001, 3001))
    assert ids_by_xid[later] == set(range(5001, 5011))


# --- protocol 3: two-phase commit -----------------------------------------------------------


def test_proto3_prepare_then_commit_and_rollback_prepared(env: Env) -> None:
    t = env.qualified("tp")
    env.sql.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    gid_ok, gid_no = unique("gid"), unique("gid")

    def write(db: psycopg.Connection) -> None:
        for gid, value in ((gid_ok, 1), (gid_no, 2)):
            db.execute("BEGIN")
            db.execute(f"INSERT INTO {t} VALUES ({value})")
            db.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
        db.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid_ok)))
        db.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid_no)))

    ms = env.capture(
        write, count(RollbackPrepared), tables=("tp",), proto_version=3, two_phase=True
    )
    assert kinds(ms) == [
        "BeginPrepare", "Relation", "Insert", "Prepare",
        "BeginPrepare", "Insert", "Prepare",
        "CommitPrepared", "RollbackPrepared",
    ]  # fmt: skip
    (bp1, bp2) = of(ms, BeginPrepare)
    (p1, p2) = of(ms, Prepare)
    (cp,) = of(ms, CommitPrepared)
    (rp,) = of(ms, RollbackPrepared)
    assert (bp1.gid, p1.gid, cp.gid) == (gid_ok, gid_ok, gid_ok)
    assert (bp2.gid, p2.gid, rp.gid) == (gid_no, gid_no, gid_no)
    assert bp1.xid == p1.xid == cp.xid and bp2.xid == p2.xid == rp.xid
    assert bp1.prepare_lsn == p1.prepare_lsn and bp1.end_lsn == p1.end_lsn
    assert rp.prepare_end_lsn == p2.end_lsn
    assert [text(i.new[0]) for i in of(ms, Insert)] == ["1", "2"]


# --- TRUNCATE, Type, Origin ------------------------------------------------------------------


def test_truncate_cascade_restart_identity(env: Env) -> None:
    parent, child = env.qualified("parent"), env.qualified("child")
    env.sql.execute(f"CREATE TABLE {parent} (id serial PRIMARY KEY)")
    env.sql.execute(f"CREATE TABLE {child} (id int PRIMARY KEY, parent_id int REFERENCES {parent})")

    def write(db: psycopg.Connection) -> None:
        db.execute(f"INSERT INTO {parent} DEFAULT VALUES")
        db.execute(f"TRUNCATE {parent} RESTART IDENTITY CASCADE")

    ms = env.capture(write, count(Truncate), tables=("parent", "child"))
    (trunc,) = of(ms, Truncate)
    assert trunc.cascade and trunc.restart_identity and trunc.xid is None
    assert set(trunc.relation_ids) == {env.oid("parent"), env.oid("child")}
    assert {r.relation_id for r in of(ms, Relation)} >= set(trunc.relation_ids)


def test_type_messages_for_enum_and_domain(env: Env) -> None:
    s = env.schema
    env.sql.execute(f"CREATE TYPE {s}.mood AS ENUM ('sad', 'ok', 'happy')")
    env.sql.execute(f"CREATE DOMAIN {s}.positive AS int4 CHECK (VALUE > 0)")
    env.sql.execute(f"CREATE TABLE {s}.typed (id int PRIMARY KEY, m {s}.mood, p {s}.positive)")
    oids: dict[str, int] = dict(
        env.sql.execute(
            "SELECT typname, oid FROM pg_type WHERE typnamespace = %s::regnamespace", (s,)
        ).fetchall()
    )

    def write(db: psycopg.Connection) -> None:
        db.execute(f"INSERT INTO {s}.typed VALUES (1, 'happy', 7)")

    ms = env.capture(write, count(Commit), tables=("typed",))
    assert kinds(ms) == ["Begin", "Type", "Type", "Relation", "Insert", "Commit"]
    types = {t.type_oid: t for t in of(ms, Type)}
    assert types[oids["mood"]] == Type(None, oids["mood"], s, "mood")
    # A domain arrives under its own OID but with its base type's name (pg_catalog -> '').
    assert types[oids["positive"]] == Type(None, oids["positive"], "", "int4")
    (rel,) = of(ms, Relation)
    assert [c.type_oid for c in rel.columns] == [23, oids["mood"], oids["positive"]]
    assert [text(v) for v in of(ms, Insert)[0].new] == ["1", "happy", "7"]


def test_origin_message(env: Env) -> None:
    t = env.qualified("o")
    env.sql.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    origin = unique("origin")
    env.sql.execute("SELECT pg_replication_origin_create(%s)", (origin,))

    def write(db: psycopg.Connection) -> None:
        db.execute("SELECT pg_replication_origin_session_setup(%s)", (origin,))
        try:
            with db.transaction():
                db.execute("SELECT pg_replication_origin_xact_setup('0/ABCDEF', now())")
                db.execute(f"INSERT INTO {t} VALUES (1)")
        finally:
            db.execute("SELECT pg_replication_origin_session_reset()")

    try:
        ms = env.capture(write, count(Commit), tables=("o",))
    finally:
        env.sql.execute("SELECT pg_replication_origin_drop(%s)", (origin,))
    assert kinds(ms) == ["Begin", "Origin", "Relation", "Insert", "Commit"]
    assert of(ms, Origin) == [Origin(0xABCDEF, origin)]


# --- REPLICA IDENTITY x key update x unchanged TOAST ------------------------------------------

BIG = "0123456789abcdef" * 256  # 4 kB, stored out of line and uncompressed (STORAGE EXTERNAL)


@pytest.mark.parametrize("identity", ["DEFAULT", "FULL", "USING INDEX", "NOTHING"])
def test_replica_identity_key_update_and_unchanged_toast(env: Env, identity: str) -> None:
    t = env.qualified("ri")
    env.sql.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, k int NOT NULL, big text, v text)")
    env.sql.execute(f"CREATE UNIQUE INDEX ri_k ON {t} (k)")
    env.sql.execute(f"ALTER TABLE {t} ALTER COLUMN big SET STORAGE EXTERNAL")
    clause = "USING INDEX ri_k" if identity == "USING INDEX" else identity
    env.sql.execute(f"ALTER TABLE {t} REPLICA IDENTITY {clause}")
    key_column = "k" if identity == "USING INDEX" else "id"
    refused: list[Exception] = []

    def write(db: psycopg.Connection) -> None:
        db.execute(f"INSERT INTO {t} VALUES (1, 10, %s, 'a')", (BIG,))
        try:
            # Changes the replica-identity key but neither big (TOASTed) nor v.
            db.execute(f"UPDATE {t} SET {key_column} = {key_column} + 1")
            db.execute(f"DELETE FROM {t}")
        except psycopg.errors.ObjectNotInPrerequisiteState as exc:
            refused.append(exc)  # REPLICA IDENTITY NOTHING: the server refuses the change
        db.execute(f"INSERT INTO {t} VALUES (100, 100, 'end', 'end')")

    ms = env.capture(write, n_of(Commit, 2 if identity == "NOTHING" else 4), tables=("ri",))
    # The value really lives in the TOAST table, so "unchanged" below is the TOAST case.
    toast_pages = env.sql.execute(
        "SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE oid = %s::regclass", (t,)
    ).fetchone()
    assert toast_pages is not None and toast_pages[0] > 0

    rel = of(ms, Relation)[0]
    expected_identity = {"DEFAULT": "d", "FULL": "f", "USING INDEX": "i", "NOTHING": "n"}[identity]
    assert rel.replica_identity == expected_identity
    keys = [c.name for c in rel.columns if c.is_key]
    assert (
        keys == {"d": ["id"], "f": ["id", "k", "big", "v"], "i": ["k"], "n": []}[expected_identity]
    )
    insert = of(ms, Insert)[0]
    assert text(insert.new[2]) == BIG  # a new row carries the whole value

    if identity == "NOTHING":
        assert len(refused) == 1 and "replica identity" in str(refused[0])
        assert not of(ms, Update) and not of(ms, Delete)
        return
    assert not refused
    (update,) = of(ms, Update)
    (delete,) = of(ms, Delete)
    new_id, new_k = ("1", "11") if identity == "USING INDEX" else ("2", "10")
    assert text(update.new[0]) == new_id and text(update.new[1]) == new_k
    assert update.new[2] is UNCHANGED_TOAST  # not sent: neither null nor a real-looking value
    assert text(update.new[3]) == "a"
    if identity == "FULL":
        # The whole old row, with the TOASTed value inlined by the server.
        assert update.old_kind == "O" and update.old is not None
        assert [text(v) for v in update.old] == ["1", "10", BIG, "a"]
        assert delete.old_kind == "O" and delete.old is not None
        assert [text(v) for v in delete.old] == [new_id, new_k, BIG, "a"]
    else:
        # Only the old key columns; every other column is null in a 'K' tuple.
        key_index = 1 if identity == "USING INDEX" else 0
        old_key = "10" if identity == "USING INDEX" else "1"
        assert update.old_kind == "K" and update.old is not None
        assert text(update.old[key_index]) == old_key
        assert [v for i, v in enumerate(update.old) if i != key_index] == [None, None, None]
        assert delete.old_kind == "K" and delete.old is not None
        assert text(delete.old[key_index]) == (new_k if identity == "USING INDEX" else new_id)
