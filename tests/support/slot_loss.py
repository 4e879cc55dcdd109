"""Invalidating a replication slot the way production does (no tests in this module): WAL past
``max_slot_wal_keep_size`` while the slot's consumer is stopped, then a checkpoint."""

from __future__ import annotations

from typing import Any

import psycopg

from tests.support.producer_harness import query, unique


def slot_row(dsn: str, slot: str) -> dict[str, Any] | None:
    """The slot's pg_replication_slots row (every column the server has), or None."""
    rows = query(
        dsn, "SELECT to_jsonb(s) FROM pg_replication_slots s WHERE slot_name = %s", (slot,)
    )
    return None if not rows else dict(rows[0][0])


def invalidate(dsn: str, slot: str, rounds: int = 20) -> None:
    """Push the stopped slot past a 1MB max_slot_wal_keep_size until a checkpoint invalidates
    it (wal_status 'lost'); the setting is reset afterwards, whatever happens."""
    filler = unique("filler")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        conn.execute("SELECT pg_reload_conf()")
        try:
            conn.execute(f"CREATE TABLE {filler} (pad text)")
            for _ in range(rounds):
                conn.execute(
                    f"INSERT INTO {filler} SELECT repeat('x', 1000) FROM generate_series(1, 3000)"
                )
                conn.execute("SELECT pg_switch_wal()")
                conn.execute("CHECKPOINT")
                row = slot_row(dsn, slot)
                assert row is not None, f"slot {slot} vanished"
                if row["wal_status"] == "lost":
                    return
            raise AssertionError(f"slot {slot} not invalidated: {slot_row(dsn, slot)}")
        finally:
            conn.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            conn.execute("SELECT pg_reload_conf()")
            conn.execute(f"DROP TABLE IF EXISTS {filler}")
