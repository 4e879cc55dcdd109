"""A bank of accounts and money transfers between them, for tests whose oracle is the total
(no tests in this module): every transfer moves money from one account to another in one
transaction, so a lake state showing part of a transaction shows a wrong total. Also the local
stack's command line, for tests that start an extra service (`stack up s3`, `spark`).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql as pgsql

from tests.conftest import STACK
from tests.support.producer_harness import unique


def stack_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`deploy/local/stack ARGS...`, its output captured."""
    return subprocess.run([str(STACK), *args], text=True, capture_output=True, timeout=600)


@contextmanager
def bank_table(dsn: str, prefix: str, accounts: int, opening: int) -> Iterator[str]:
    """A new table of ``accounts`` rows (id, balance, note) of ``opening`` each, noted 'opened',
    named from ``prefix``; dropped afterwards."""
    name = unique(prefix)
    table = pgsql.Identifier(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            pgsql.SQL(
                "CREATE TABLE {} (id int PRIMARY KEY, balance bigint NOT NULL, note text)"
            ).format(table)
        )
        conn.execute(
            pgsql.SQL("INSERT INTO {} SELECT g, %s, 'opened' FROM generate_series(1, %s) g").format(
                table
            ),
            (opening, accounts),
        )
    try:
        yield name
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP TABLE IF EXISTS {}").format(table))


def transfers(dsn: str, table: str, accounts: int, count: int, seed: int) -> None:
    """``count`` transactions, each moving 1-50 between two accounts drawn from ``seed``; the
    two rows' note becomes ``t<seed>.<i>`` (the last one tells a reader the run got through)."""
    move = pgsql.SQL(
        "UPDATE {t} SET balance = balance + CASE WHEN id = %(a)s THEN -%(x)s ELSE %(x)s END, "
        "note = %(n)s WHERE id IN (%(a)s, %(b)s)"
    ).format(t=pgsql.Identifier(table))
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(count):
            a = (i * 7919 + seed) % accounts + 1
            b = (i * 104729 + seed * 31) % accounts + 1
            if a == b:
                b = a % accounts + 1
            with conn.transaction():
                conn.execute(move, {"a": a, "b": b, "x": i % 50 + 1, "n": f"t{seed}.{i}"})
