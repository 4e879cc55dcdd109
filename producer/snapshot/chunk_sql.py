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
    limit: int | None,
    as_of: AsOf | None = None,
    upto: Sequence[str] | None = None,
) -> sql.Composed:
    """``COPY (SELECT columns FROM table [WHERE key > after [AND key <= upto]] ORDER BY key
    [LIMIT limit]) TO STDOUT``: the next ``limit`` rows after the cursor (or every row up to
    ``upto``: a snapshot worker's range), in key order; with ``as_of`` only rows unchanged
    since that snapshot (``producer.snapshot.as_of``)."""
    where = _range_where(schema, table, columns, key, after, as_of, upto)
    limited: sql.Composable = sql.SQL("")
    if limit is not None:
        limited = sql.SQL(" LIMIT {}").format(sql.Literal(limit))
    return sql.SQL(
        "COPY (SELECT {columns} FROM {table}{where} ORDER BY {keys}{limited}) TO STDOUT"
    ).format(
        columns=_columns(columns),
        table=sql.Identifier(schema, table),
        where=where,
        keys=_columns(key),
        limited=limited,
    )


def _key_literals(values: Sequence[str]) -> sql.Composable:
    return sql.SQL(", ").join(sql.Literal(v) for v in values)


def _range_where(
    schema: str,
    table: str,
    columns: Sequence[str],
    key: Sequence[str],
    after: Sequence[str] | None,
    as_of: AsOf | None,
    upto: Sequence[str] | None = None,
) -> sql.Composable:
    if not key:
        raise ValueError(f"{schema}.{table}: a chunked read needs key columns")
    for bound in (after, upto):
        if bound is not None and len(bound) != len(key):
            raise ValueError(
                f"{schema}.{table}: cursor {list(bound)} does not match key {list(key)}"
            )
    keys = _columns(key)
    conditions: list[sql.Composable] = []
    if after is not None:
        conditions.append(sql.SQL("({}) > ({})").format(keys, _key_literals(after)))
    if upto is not None:
        conditions.append(sql.SQL("({}) <= ({})").format(keys, _key_literals(upto)))
    if as_of is not None:
        conditions.append(as_of.predicate(columns))
    if not conditions:
        return sql.SQL("")
    return sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions)


def range_marks(
    schema: str,
    table: str,
    columns: Sequence[str],
    key: Sequence[str],
    after: Sequence[str] | None,
    limit: int,
    step: int,
    as_of: AsOf | None = None,
) -> sql.Composed:
    """The keys (as text) that split the next ``limit`` rows after the cursor into ranges of
    ``step`` rows, for the snapshot workers: ``(n, key...)`` of the rows numbered n = step,
    2 step, ... and ``limit``, and of row ``limit + 1`` if there is one (the chunk is not the
    table's last). The key index alone is walked (with ``as_of``, the rows' ``xmin`` too)."""
    where = _range_where(schema, table, columns, key, after, as_of)
    keys = _columns(key)
    texts = sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(k)) for k in key)
    return sql.SQL(
        "SELECT walbridge_n, {texts} FROM (SELECT row_number() OVER (ORDER BY {keys}) AS walbridge_n, "
        "{keys} "
        "FROM {table}{where} ORDER BY {keys} LIMIT {more}) AS numbered "
        "WHERE walbridge_n % {step} = 0 OR walbridge_n >= {limit} ORDER BY walbridge_n"
    ).format(
        texts=texts,
        keys=keys,
        table=sql.Identifier(schema, table),
        where=where,
        more=sql.Literal(limit + 1),
        limit=sql.Literal(limit),
        step=sql.Literal(step),
    )


def whole_copy(schema: str, table: str, columns: Sequence[str]) -> sql.Composed:
    """``COPY (SELECT columns FROM table) TO STDOUT``: a table without a key, in one read."""
    return sql.SQL("COPY (SELECT {columns} FROM {table}) TO STDOUT").format(
        columns=_columns(columns), table=sql.Identifier(schema, table)
    )


def block_copy(
    schema: str, table: str, columns: Sequence[str], first: int, end: int | None
) -> sql.Composed:
    """``COPY (SELECT columns FROM table WHERE ctid >= '(first,0)' [AND ctid < '(end,0)'])
    TO STDOUT``: a table without a key's heap blocks ``[first, end)`` (a TID range scan: only
    those blocks are read), for a snapshot worker."""
    if first < 0 or (end is not None and end <= first):
        raise ValueError(f"{schema}.{table}: bad block range [{first}, {end})")
    where = sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({first},0)"))
    if end is not None:
        where += sql.SQL(" AND ctid < {}::tid").format(sql.Literal(f"({end},0)"))
    return sql.SQL("COPY (SELECT {columns} FROM {table} WHERE {where}) TO STDOUT").format(
        columns=_columns(columns), table=sql.Identifier(schema, table), where=where
    )


# The table's heap blocks now (pg_class.relpages is only the last VACUUM's or ANALYZE's count);
# a partitioned table's own heap is empty: its partitions are then read as one range.
RELATION_BLOCKS = "SELECT pg_relation_size(%s::oid) / current_setting('block_size')::bigint"


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
