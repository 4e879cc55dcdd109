"""PostgreSQL smoke test: a pgoutput slot read over the real streaming replication protocol.

Uses psycopg's low-level libpq layer directly (no walbridge code), so a failure here points at the
stack, not at the producer.
"""

from __future__ import annotations

import select
import struct
import time
import uuid

import psycopg
from psycopg import pq, sql

PG_EPOCH_OFFSET_US = 946_684_800 * 1_000_000


def _replication_conn(dsn: str) -> pq.PGconn:
    conn = pq.PGconn.connect(psycopg.conninfo.make_conninfo(dsn, replication="database").encode())
    assert conn.status == pq.ConnStatus.OK, conn.get_error_message()
    return conn


def _standby_status(lsn: int) -> bytes:
    now_us = time.time_ns() // 1000 - PG_EPOCH_OFFSET_US
    return b"r" + struct.pack("!QQQqB", lsn, lsn, lsn, now_us, 0)


def test_pgoutput_stream_delivers_an_insert_and_feedback_moves_the_slot(pg_dsn: str) -> None:
    name = f"smoke_{uuid.uuid4().hex[:8]}"
    marker = f"hello-{uuid.uuid4().hex}"
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, note text)").format(sql.Identifier(name))
        )
        admin.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                sql.Identifier(name), sql.Identifier(name)
            )
        )
        admin.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
        try:
            admin.execute(
                sql.SQL("INSERT INTO {} VALUES (1, %s)").format(sql.Identifier(name)), (marker,)
            )
            commit_lsn = admin.execute("SELECT pg_current_wal_lsn() - '0/0'").fetchone()[0]  # type: ignore[index]

            conn = _replication_conn(pg_dsn)
            try:
                start = f"START_REPLICATION SLOT {name} LOGICAL 0/0 (proto_version '1', publication_names '{name}')"
                res = conn.exec_(start.encode())
                assert res.status == pq.ExecStatus.COPY_BOTH, conn.get_error_message()

                tags, insert_payload, last_end = [], b"", 0
                deadline = time.monotonic() + 20
                while b"C" not in tags and time.monotonic() < deadline:
                    nbytes, data = conn.get_copy_data(1)
                    if nbytes == 0:
                        select.select([conn.socket], [], [], 1.0)
                        conn.consume_input()
                        continue
                    assert nbytes > 0, conn.get_error_message()
                    frame = bytes(data)
                    if frame[:1] == b"w":
                        _start, end, _ts = struct.unpack_from("!QQq", frame, 1)
                        payload = frame[25:]
                        tags.append(payload[:1])
                        last_end = max(last_end, end)
                        if payload[:1] == b"I":
                            insert_payload = payload
                assert (
                    tags[:1] == [b"B"] and b"R" in tags and b"I" in tags and tags[-1:] == [b"C"]
                ), tags
                assert marker.encode() in insert_payload

                conn.put_copy_data(_standby_status(last_end))
                conn.flush()
                confirmed = 0
                for _ in range(100):
                    row = admin.execute(
                        "SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = %s",
                        (name,),
                    ).fetchone()
                    confirmed = int(row[0]) if row else 0  # type: ignore[index]
                    if confirmed >= last_end:
                        break
                    time.sleep(0.1)
                assert confirmed >= last_end >= commit_lsn - 1024
            finally:
                conn.finish()
        finally:
            for _ in range(50):  # the walsender may take a moment to release the slot
                try:
                    admin.execute("SELECT pg_drop_replication_slot(%s)", (name,))
                    break
                except psycopg.errors.ObjectInUse:
                    time.sleep(0.1)
            admin.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(name)))
            admin.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(name)))
