"""The replication client against the real PostgreSQL: slot and publication set-up, refusals,
confirm moving confirmed_flush_lsn, clean shutdown and reconnecting after the server kills the
walsender. pg_replication_slots / pg_publication are the oracle."""

from __future__ import annotations

import itertools
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
    Begin,
    Commit,
    Decoder,
    Insert,
    PgOutputMessage,
    Relation,
    Value,
    parse_lsn,
)
from producer.replication import (
    ErrorKind,
    ReconnectPolicy,
    ReplicationClient,
    ReplicationConfig,
    ReplicationError,
    TableName,
)

pytestmark = pytest.mark.integration

TIMEOUT = 30.0


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


@dataclass
class Env:
    dsn: str
    admin: psycopg.Connection
    slot: str
    publication: str
    schema: str

    def config(self, *tables: str, **overrides: Any) -> ReplicationConfig:
        settings: dict[str, Any] = {
            "slot": self.slot,
            "publication": self.publication,
            "tables": tuple(TableName(self.schema, t) for t in tables),
            "status_interval": 0.5,
            "reconnect": ReconnectPolicy(initial_delay=0.2, max_delay=1.0, max_attempts=20),
        }
        settings.update(overrides)
        return ReplicationConfig(**settings)

    def write(self, statement: str | sql.Composed | sql.SQL) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as db:
            db.execute(statement)

    def slot_row(self) -> tuple[bool, int | None, int | None]:
        """(active, active_pid, confirmed_flush_lsn) from pg_replication_slots."""
        row = self.admin.execute(
            "SELECT active, active_pid, confirmed_flush_lsn::text FROM pg_replication_slots"
            " WHERE slot_name = %s",
            (self.slot,),
        ).fetchone()
        assert row is not None, f"slot {self.slot} does not exist"
        return bool(row[0]), row[1], parse_lsn(row[2]) if row[2] else None

    def wait_for(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while not condition():
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {what}")
            time.sleep(0.1)


@pytest.fixture
def env(pg_dsn: str) -> Iterator[Env]:
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        e = Env(pg_dsn, admin, unique("c_slot"), unique("c_pub"), unique("c_schema"))
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(e.schema)))
        admin.execute(
            sql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(sql.Identifier(e.schema, "t"))
        )
        try:
            yield e
        finally:
            # Terminate a walsender a failed test may have left, so the slot can be dropped.
            admin.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
                " WHERE slot_name = %s AND active_pid IS NOT NULL",
                (e.slot,),
            )
            e.wait_for(
                lambda: (
                    not admin.execute(
                        "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active",
                        (e.slot,),
                    ).fetchone()
                ),
                "the slot to be released",
            )
            admin.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                " WHERE slot_name = %s",
                (e.slot,),
            )
            admin.execute(
                sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(e.publication))
            )
            admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(e.schema)))


def insert(env: Env, *ids: int) -> None:
    table = sql.Identifier(env.schema, "t")
    env.write(
        sql.SQL("INSERT INTO {} VALUES {}").format(
            table, sql.SQL(", ").join(sql.SQL("({})").format(sql.Literal(i)) for i in ids)
        )
    )


def read_until_commit(stream: Iterator[Any], decoder: Decoder) -> list[PgOutputMessage]:
    """Decode one whole transaction (Begin..Commit) from the stream."""
    messages: list[PgOutputMessage] = []
    deadline = time.monotonic() + TIMEOUT
    for item in stream:
        if item is not None:
            messages.append(decoder.decode(item[0]))
            if isinstance(messages[-1], Commit):
                return messages
        if time.monotonic() > deadline:
            break
    pytest.fail(f"no Commit within {TIMEOUT}s; got {[type(m).__name__ for m in messages]}")


def inserted_ids(messages: list[PgOutputMessage]) -> list[int]:
    return [int(m.new[0].data) for m in messages if isinstance(m, Insert)]  # type: ignore[union-attr]


def set_up(env: Env, client: ReplicationClient) -> None:
    client.open()
    client.ensure_publication()
    client.ensure_slot()


# --- slot -----------------------------------------------------------------------------------


def test_slot_created_with_exported_snapshot_then_reused(env: Env) -> None:
    insert(env, 1, 2)
    with ReplicationClient(env.dsn, env.config("t")) as client:
        identity = client.open()
        assert identity.dbname == env.admin.info.dbname
        client.ensure_publication()
        slot = client.ensure_slot(export_snapshot=True)
        assert slot.created and slot.snapshot_name
        assert slot.consistent_point is not None
        assert env.slot_row()[2] == slot.consistent_point
        insert(env, 3)  # after the slot: streamed, so not in the snapshot
        with psycopg.connect(env.dsn) as snap:
            snap.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            snap.execute(
                sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(slot.snapshot_name))
            )
            (rows,) = snap.execute(
                sql.SQL("SELECT array_agg(id ORDER BY id) FROM {}").format(
                    sql.Identifier(env.schema, "t")
                )
            ).fetchone() or (None,)
        assert rows == [1, 2]
        messages = read_until_commit(client.stream(idle_after=0.2), Decoder())
        assert inserted_ids(messages) == [3]  # snapshot + stream = every row exactly once

    with ReplicationClient(env.dsn, env.config("t")) as again:
        again.open()
        reused = again.ensure_slot(export_snapshot=True)
        assert not reused.created and reused.snapshot_name is None
        assert reused.confirmed_flush_lsn == slot.consistent_point  # nothing confirmed yet


def test_refuses_slot_active_in_another_process(env: Env) -> None:
    with ReplicationClient(env.dsn, env.config("t")) as first:
        set_up(env, first)
        stream = first.stream(idle_after=0.2)
        assert next(stream) is None  # streaming, idle
        _, pid, _ = env.slot_row()
        assert pid is not None
        with ReplicationClient(env.dsn, env.config("t")) as second:
            second.open()
            with pytest.raises(ReplicationError) as info:
                second.ensure_slot()
            assert info.value.kind is ErrorKind.SLOT_ACTIVE
            assert f"pid {pid}" in str(info.value) and env.slot in str(info.value)
            # Skipping the check, the server itself refuses START_REPLICATION.
            with pytest.raises(ReplicationError) as info:
                next(second.stream())
            assert info.value.kind is ErrorKind.SLOT_ACTIVE
            assert f"PID {pid}" in (info.value.server_message or "")


def test_ensure_slot_after_stream_started_is_a_clear_error(env: Env) -> None:
    with ReplicationClient(env.dsn, env.config("t")) as client:
        set_up(env, client)
        stream = client.stream(idle_after=0.2)
        assert next(stream) is None
        with pytest.raises(ReplicationError, match="before stream") as info:
            client.ensure_slot()
        assert info.value.kind is ErrorKind.CONFIG
        assert next(stream) is None  # streaming goes on


def test_refuses_slot_of_another_plugin(env: Env) -> None:
    env.admin.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (env.slot,))
    with ReplicationClient(env.dsn, env.config("t")) as client:
        client.open()
        with pytest.raises(ReplicationError) as info:
            client.ensure_slot()
    assert info.value.kind is ErrorKind.SLOT_MISMATCH
    assert "test_decoding" in str(info.value)


# --- publication ------------------------------------------------------------------------------


def test_hostile_names_are_quoted_end_to_end(env: Env) -> None:
    table = 'we"ird tab; DROP TABLE x; --'
    publication = 'pub "x"; DROP'
    env.admin.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(sql.Identifier(env.schema, table))
    )
    config = env.config(table, publication=publication)
    try:
        with ReplicationClient(env.dsn, config) as client:
            set_up(env, client)
            (pub,) = env.admin.execute(
                "SELECT pubname FROM pg_publication WHERE pubname = %s", (publication,)
            ).fetchone() or (None,)
            assert pub == publication
            env.write(
                sql.SQL("INSERT INTO {} VALUES (7)").format(sql.Identifier(env.schema, table))
            )
            messages = read_until_commit(client.stream(idle_after=0.2), Decoder())
        (rel,) = [m for m in messages if isinstance(m, Relation)]
        assert (rel.namespace, rel.name) == (env.schema, table)
        assert inserted_ids(messages) == [7]
    finally:
        env.admin.execute(
            sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(publication))
        )


def test_names_and_text_arrive_as_utf8_whatever_the_dsn_encoding(env: Env) -> None:
    # pgoutput converts to the client encoding; a LATIN1 DSN must not reach the walsender.
    table = "tablé"
    env.admin.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(
            sql.Identifier(env.schema, table)
        )
    )
    latin1 = make_conninfo(env.dsn, client_encoding="LATIN1")
    with ReplicationClient(latin1, env.config(table)) as client:
        set_up(env, client)
        env.write(
            sql.SQL("INSERT INTO {} VALUES (1, 'é€')").format(sql.Identifier(env.schema, table))
        )
        messages = read_until_commit(client.stream(idle_after=0.2), Decoder())
    (rel,) = [m for m in messages if isinstance(m, Relation)]
    (ins,) = [m for m in messages if isinstance(m, Insert)]
    assert rel.name == table
    assert isinstance(ins.new[1], Value) and ins.new[1].data == "é€".encode()


def test_text_values_use_pinned_output_formats_whatever_the_dsn_says(env: Env) -> None:
    # The value converters parse ISO dates, postgres-style intervals and UTC timestamps; a DSN
    # asking for other output styles must not change what the walsender sends.
    table = "styles"
    env.admin.execute(
        sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, d date, ts timestamptz, iv interval, b bytea)"
        ).format(sql.Identifier(env.schema, table))
    )
    styled = make_conninfo(
        env.dsn,
        options="-c DateStyle=SQL,DMY -c TimeZone=Asia/Tokyo -c IntervalStyle=iso_8601 -c bytea_output=escape",
    )
    with ReplicationClient(styled, env.config(table)) as client:
        set_up(env, client)
        env.write(
            sql.SQL(
                "INSERT INTO {} VALUES (1, '2024-03-05', '2024-03-05 12:00:00+00',"
                " '1 year 2 mons 3 days 04:05:06', '\\x00ff')"
            ).format(sql.Identifier(env.schema, table))
        )
        messages = read_until_commit(client.stream(idle_after=0.2), Decoder())
    (ins,) = [m for m in messages if isinstance(m, Insert)]
    values = [v.data.decode() for v in ins.new[1:]]  # type: ignore[union-attr]
    assert values == [
        "2024-03-05",
        "2024-03-05 12:00:00+00",
        "1 year 2 mons 3 days 04:05:06",
        "\\x00ff",
    ]


def test_publication_for_all_tables_then_reused(env: Env) -> None:
    with ReplicationClient(env.dsn, env.config(publish_via_partition_root=True)) as client:
        created = client.ensure_publication()
        reused = client.ensure_publication()
    assert created.created and created.all_tables and created.publish_via_partition_root
    assert not reused.created and reused.all_tables
    assert TableName(env.schema, "t") in created.tables


@pytest.mark.parametrize("via_root", [False, True])
def test_publication_of_a_partitioned_table_is_accepted_either_way(
    env: Env, via_root: bool
) -> None:
    # pg_publication_tables lists the leaves without publish_via_partition_root, the root
    # with it; both publish the configured root's changes.
    env.admin.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY) PARTITION BY RANGE (id)").format(
            sql.Identifier(env.schema, "parted")
        )
    )
    env.admin.execute(
        sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM (0) TO (100)").format(
            sql.Identifier(env.schema, "leaf"), sql.Identifier(env.schema, "parted")
        )
    )
    config = env.config("parted", publish_via_partition_root=via_root)
    with ReplicationClient(env.dsn, config) as client:
        created = client.ensure_publication()
        reused = client.ensure_publication()
    assert created.created and not reused.created
    assert created.tables == (TableName(env.schema, "parted" if via_root else "leaf"),)
    # A configured leaf is published through its root, too.
    leaf = env.config("leaf", publish_via_partition_root=via_root)
    with ReplicationClient(env.dsn, leaf) as client:
        assert not client.ensure_publication().created


@pytest.mark.parametrize("via_root", [False, True])
def test_existing_publication_of_partitions_with_the_other_setting_is_refused(
    env: Env, via_root: bool
) -> None:
    # With partitions in it, the setting decides under which names changes arrive (root or
    # leaves): a publication that says otherwise is refused with the statement that fixes it.
    env.admin.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY) PARTITION BY HASH (id)").format(
            sql.Identifier(env.schema, "hashed")
        )
    )
    env.admin.execute(
        sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES WITH (MODULUS 2, REMAINDER 0)").format(
            sql.Identifier(env.schema, "hashed_0"), sql.Identifier(env.schema, "hashed")
        )
    )
    env.admin.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (publish_via_partition_root = {})").format(
            sql.Identifier(env.publication),
            sql.Identifier(env.schema, "hashed"),
            sql.Literal(not via_root),
        )
    )
    with (
        ReplicationClient(
            env.dsn, env.config("hashed", publish_via_partition_root=via_root)
        ) as client,
        pytest.raises(ReplicationError, match=r"ALTER PUBLICATION .* SET") as info,
    ):
        client.ensure_publication()
    assert info.value.kind is ErrorKind.PUBLICATION
    assert f"publish_via_partition_root = {str(via_root).lower()}" in str(info.value)


@pytest.mark.parametrize("via_root", [False, True])
def test_existing_publication_without_partitions_is_accepted_whatever_its_setting(
    env: Env, via_root: bool
) -> None:
    env.admin.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (publish_via_partition_root = {})").format(
            sql.Identifier(env.publication), sql.Identifier(env.schema, "t"), sql.Literal(via_root)
        )
    )
    with ReplicationClient(env.dsn, env.config("t")) as client:
        info = client.ensure_publication()
    assert not info.created and not info.publishes_partitions
    assert info.publish_via_partition_root is via_root


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"tables": (TableName("public", "not_in_it"),)}, "does not include public.not_in_it"),
    ],
)
def test_existing_publication_that_differs_is_refused(
    env: Env, overrides: dict[str, Any], message: str
) -> None:
    env.admin.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
            sql.Identifier(env.publication), sql.Identifier(env.schema, "t")
        )
    )
    with (
        ReplicationClient(env.dsn, env.config("t", **overrides)) as client,
        pytest.raises(ReplicationError, match=message) as info,
    ):
        client.ensure_publication()
    assert info.value.kind is ErrorKind.PUBLICATION


def test_missing_table_reported_with_server_message(env: Env) -> None:
    with (
        ReplicationClient(env.dsn, env.config("no_such_table")) as client,
        pytest.raises(ReplicationError) as info,
    ):
        client.ensure_publication()
    assert info.value.kind is ErrorKind.PUBLICATION
    assert "does not exist" in (info.value.server_message or "")


def test_stream_error_names_slot_lsn_and_server_message(env: Env) -> None:
    # No publication: pgoutput fails when it meets the first change, before PostgreSQL 18.
    # 18 skips the change with a WARNING instead (the producer's slot monitor checks that the
    # publication exists: test_producer_pg_features.py).
    with psycopg.connect(env.dsn) as conn:
        major = conn.info.server_version // 10000
    if major >= 18:
        with ReplicationClient(env.dsn, env.config("t")) as client:
            client.open()
            client.ensure_slot()
            insert(env, 1)
            stream = client.stream(idle_after=0.3)
            seen = [item for item in itertools.islice(stream, 20) if item is not None]
        assert seen == [], "PostgreSQL 18 sent a change of a missing publication"
        return
    with ReplicationClient(env.dsn, env.config("t")) as client:
        client.open()
        client.ensure_slot()
        insert(env, 1)
        with pytest.raises(ReplicationError) as info:
            for _ in client.stream():
                pass
    error = info.value
    assert error.kind is ErrorKind.SERVER and not error.retriable
    assert error.slot == env.slot and error.lsn is not None
    assert f'publication "{env.publication}" does not exist' in (error.server_message or "")
    assert f"slot '{env.slot}'" in str(error) and "lsn 0/0" in str(error)


# --- streaming: confirm, close, reconnect --------------------------------------------------------


def test_confirm_moves_confirmed_flush_lsn_and_nothing_else_does(env: Env) -> None:
    with ReplicationClient(env.dsn, env.config("t")) as client:
        set_up(env, client)
        _, _, created_at = env.slot_row()
        insert(env, 1)
        stream = client.stream(idle_after=0.2)
        commit = read_until_commit(stream, Decoder())[-1]
        assert isinstance(commit, Commit)
        # Several status updates and idle periods later, without confirm(): unchanged.
        for _ in range(6):
            assert next(stream) is None
        assert client.server_wal_end >= commit.end_lsn
        assert env.slot_row()[2] == created_at
        client.confirm(commit.end_lsn)

        def reported() -> bool:
            assert next(stream) is None  # keep the loop running: it sends the periodic update
            return env.slot_row()[2] == commit.end_lsn

        env.wait_for(reported, "a periodic status update to move confirmed_flush_lsn")
        assert client.confirmed_lsn == commit.end_lsn


def test_keepalives_asking_for_a_reply_keep_the_walsender_alive(env: Env) -> None:
    # With a 2 s wal_sender_timeout and no periodic update for an hour, only the replies to
    # the server's reply-requested keepalives keep the connection from timing out.
    dsn = make_conninfo(env.dsn, options="-c wal_sender_timeout=2s")
    with ReplicationClient(dsn, env.config("t", status_interval=3600.0)) as client:
        set_up(env, client)
        stream = client.stream(idle_after=0.2)
        assert next(stream) is None
        _, pid, _ = env.slot_row()
        deadline = time.monotonic() + 6.0  # three timeouts' worth
        while time.monotonic() < deadline:
            assert next(stream) is None
        assert client.last_keepalive is not None
        assert client.reconnects == 0
        assert env.slot_row()[:2] == (True, pid)


def test_close_ends_copy_and_reports_final_position(env: Env) -> None:
    client = ReplicationClient(env.dsn, env.config("t", status_interval=3600.0))
    set_up(env, client)
    insert(env, 1)
    stream = client.stream(idle_after=0.2)
    commit = read_until_commit(stream, Decoder())[-1]
    assert isinstance(commit, Commit)
    client.confirm(commit.end_lsn)  # the hour-long interval means only close() can report it
    client.close()
    assert list(stream) == []
    env.wait_for(lambda: not env.slot_row()[0], "the slot to be released")
    assert env.slot_row()[2] == commit.end_lsn


def test_reconnects_after_walsender_is_terminated_and_resumes_from_confirmed(env: Env) -> None:
    resumed: list[int] = []
    with ReplicationClient(env.dsn, env.config("t"), on_reconnect=resumed.append) as client:
        set_up(env, client)
        decoder = Decoder()
        stream = client.stream(idle_after=0.2)
        insert(env, 1)
        first = read_until_commit(stream, decoder)
        client.confirm(first[-1].end_lsn)  # type: ignore[union-attr]
        client.send_status()
        env.wait_for(lambda: env.slot_row()[2] == client.confirmed_lsn, "the confirm to arrive")
        insert(env, 2)
        second = read_until_commit(stream, decoder)  # received, never confirmed
        assert inserted_ids(second) == [2]

        _, pid, _ = env.slot_row()
        (terminated,) = env.admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() or (
            False,
        )
        assert terminated
        insert(env, 3)

        decoder = Decoder()  # what on_reconnect tells a producer to do: start clean
        again = read_until_commit(stream, decoder)
        then = read_until_commit(stream, decoder)
        assert client.reconnects == 1 and resumed == [first[-1].end_lsn]  # type: ignore[union-attr]
        # The unconfirmed transaction comes again, the confirmed one does not.
        assert inserted_ids(again) == [2] and inserted_ids(then) == [3]
        assert isinstance(again[0], Begin) and isinstance(second[0], Begin)
        assert again[0].final_lsn == second[0].final_lsn
        _, new_pid, _ = env.slot_row()
        assert new_pid not in (None, pid)


def test_connect_failure_names_slot_and_hides_password(env: Env) -> None:
    bad = make_conninfo(env.dsn, password="wrong-secret-123", user="no_such_user_x")
    with ReplicationClient(bad, env.config("t")) as client, pytest.raises(ReplicationError) as info:
        client.open()
    error = info.value
    assert error.kind is ErrorKind.CONNECTION and error.retriable
    assert "no_such_user_x" in (error.server_message or "")
    assert env.slot in str(error) and "wrong-secret-123" not in str(error)
    assert "password=***" in str(error)
