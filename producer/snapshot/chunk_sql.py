"""The SQL of one snapshot chunk. Pure: composed with psycopg.sql, never from raw strings.

A keyed table is read in key order with keyset pagination: ``WHERE (k1, k2) > (after)
ORDER BY k1, k2 LIMIT n`` walks the primary key (or replica-identity index) so every chunk
is an index range scan, whatever the table's size, and no OFFSET rescans what came before.
The cursor values are the last row's key text, passed as untyped literals: PostgreSQL gives
them the key columns' types, so any key type with a btree order works (uuid, text, numeric,
composite keys). One row more than the chunk is read to know whether the chunk is the last
without a further query.
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from producer.snapshot.as_of import AsOf


def _columns(names: Sequence[str]) -> sql.Composable:
    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


def chunk_copy(
    schema: str,
    table: str,
    columns: Sequence[str],
    key: Sequence[str],
    after: Sequence[str] | None,
    limit: int,
    as_of: AsOf | None = None,
) -> sql.Composed:
    """``COPY (SELECT columns FROM table [WHERE key > after] ORDER BY key LIMIT limit)
    TO STDOUT``: the next ``limit`` rows after the cursor, in key order; with ``as_of`` only
    rows unchanged since that snapshot (``producer.snapshot.as_of``)."""
    if not key:
        raise ValueError(f"{schema}.{table}: a chunked read needs key columns")
    if after is not None and len(after) != len(key):
        raise ValueError(f"{schema}.{table}: cursor {list(after)} does not match key {list(key)}")
    keys = _columns(key)
    conditions: list[sql.Composable] = []
    if after is not None:
        conditions.append(
            sql.SQL("({}) > ({})").format(keys, sql.SQL(", ").join(sql.Literal(v) for v in after))
        )
    if as_of is not None:
        conditions.append(as_of.predicate(columns))
    where: sql.Composable = sql.SQL("")
    if conditions:
        where = sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions)
    return sql.SQL(
        "COPY (SELECT {columns} FROM {table}{where} ORDER BY {keys} LIMIT {limit}) TO STDOUT"
    ).format(
        columns=_columns(columns),
        table=sql.Identifier(schema, table),
        where=where,
        keys=keys,
        limit=sql.Literal(limit),
    )


def whole_copy(schema: str, table: str, columns: Sequence[str]) -> sql.Composed:
    """``COPY (SELECT columns FROM table) TO STDOUT``: a table without a key, in one read."""
    return sql.SQL("COPY (SELECT {columns} FROM {table}) TO STDOUT").format(
        columns=_columns(columns), table=sql.Identifier(schema, table)
    )


def keys_copy(
    schema: str,
    table: str,
    columns: Sequence[str],
    key: Sequence[str],
    keys: Sequence[Sequence[str]],
) -> sql.Composed:
    """``COPY (SELECT columns FROM table WHERE key IN (keys) ORDER BY key) TO STDOUT``: given
    rows read again (see ``watermarks.Window.toast``)."""
    if not key or not keys:
        raise ValueError(f"{schema}.{table}: reading given rows needs key columns and keys")
    wanted = sql.SQL(", ").join(
        sql.SQL("({})").format(sql.SQL(", ").join(sql.Literal(v) for v in k)) for k in keys
    )
    return sql.SQL(
        "COPY (SELECT {columns} FROM {table} WHERE ({keys}) IN ({wanted}) ORDER BY {keys}) "
        "TO STDOUT"
    ).format(
        columns=_columns(columns),
        table=sql.Identifier(schema, table),
        keys=_columns(key),
        wanted=wanted,
    )
