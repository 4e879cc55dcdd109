"""What a snapshot reads, from the catalog: the published tables, their columns exactly as
pgoutput describes them (so the Relation built here gives the same schemas as the stream's:
the publication's column list, and on PostgreSQL 18 its stored generated columns when it
publishes them, by the rule in schemas.published_columns), the key to walk them by, and the
planner's row estimate for progress."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from producer.pgoutput import Column, Relation
from schemas import published_columns
from schemas.publication_catalog import publication_columns
from schemas.published_columns import Attribute

_TABLES = """
SELECT c.oid, n.nspname::text, c.relname::text, c.relreplident::text
  FROM pg_publication_tables pt
  JOIN pg_namespace n ON n.nspname = pt.schemaname
  JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
 WHERE pt.pubname = %s
 ORDER BY 2, 3
"""
# Every live column with what decides whether pgoutput sends it (schemas.published_columns).
_COLUMNS = """
SELECT a.attnum::int, a.attname::text, a.atttypid::int8, a.atttypmod, a.attgenerated::text
  FROM pg_attribute a
 WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attnum
"""
# Index columns in index order (the chunk's ORDER BY then matches the index).
_INDEX_COLUMNS = """
SELECT a.attname::text
  FROM pg_index i
  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
 WHERE i.indrelid = %s AND (CASE WHEN %s THEN i.indisprimary ELSE i.indisreplident END)
 ORDER BY array_position(i.indkey::int2[], a.attnum)
"""
_ESTIMATE = """
SELECT CASE WHEN c.relkind = 'p' THEN (
         SELECT coalesce(sum(greatest(l.reltuples, 0)), 0)
           FROM pg_partition_tree(c.oid) t JOIN pg_class l ON l.oid = t.relid
          WHERE t.isleaf)
       ELSE greatest(c.reltuples, 0) END::int8
  FROM pg_class c
 WHERE c.oid = %s
"""


@dataclass(frozen=True)
class SnapshotTable:
    oid: int
    schema: str
    name: str
    replica_identity: str  # pg_class.relreplident: d, n, f, i
    columns: tuple[Column, ...]  # as pgoutput's Relation message lists them
    chunk_key: tuple[str, ...]  # walked in this order; () = no usable key: read whole

    @property
    def collection(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def relation(self) -> Relation:
        """The Relation message pgoutput would send for the table (its first change)."""
        return Relation(
            xid=None,
            relation_id=self.oid,
            namespace=self.schema,
            name=self.name,
            replica_identity=self.replica_identity,  # type: ignore[arg-type]
            columns=self.columns,
        )


class CatalogLocked(Exception):
    """A published table is locked (ACCESS EXCLUSIVE: DDL, VACUUM FULL, LOCK TABLE). Since
    PostgreSQL 16, pg_publication_tables opens every table to list its columns, so it waits
    for such a lock; the streaming thread must not, and asks again later."""


def _published_rows(
    conn: psycopg.Connection[Any], publication: str, lock_wait_ms: int | None
) -> list[Any]:
    if lock_wait_ms is None:
        return conn.execute(_TABLES, (publication,)).fetchall()
    try:
        with conn.transaction():
            conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(lock_wait_ms))
            return conn.execute(_TABLES, (publication,)).fetchall()
    except psycopg.errors.LockNotAvailable as exc:
        # Not an OperationalError to the session: the connection is fine, the table is busy.
        raise CatalogLocked(str(exc)) from None


def published(
    conn: psycopg.Connection[Any], publication: str, lock_wait_ms: int | None = None
) -> dict[str, int]:
    """``schema.table`` -> oid of every table the publication sends (roots when it publishes
    via the partition root: pg_publication_tables lists what pgoutput names). With
    ``lock_wait_ms``, CatalogLocked when a published table stays locked that long."""
    rows = _published_rows(conn, publication, lock_wait_ms)
    return {f"{schema}.{name}": int(oid) for oid, schema, name, _ident in rows}


def describe(
    conn: psycopg.Connection[Any],
    publication: str,
    collection: str,
    lock_wait_ms: int | None = None,
) -> SnapshotTable:
    """One published table, as the snapshot reads it; KeyError when it is not published,
    CatalogLocked as for ``published``."""
    rows = {
        f"{s}.{n}": (int(oid), s, n, ident)
        for oid, s, n, ident in _published_rows(conn, publication, lock_wait_ms)
    }
    oid, schema, name, ident = rows[collection]
    identity: tuple[str, ...] = ()
    if ident in ("d", "i"):
        identity = tuple(r[0] for r in conn.execute(_INDEX_COLUMNS, (oid, ident == "d")))
    primary = tuple(r[0] for r in conn.execute(_INDEX_COLUMNS, (oid, True)))
    attributes = conn.execute(_COLUMNS, (oid,)).fetchall()
    types = {attnum: (int(type_oid), int(typmod)) for attnum, _, type_oid, typmod, _ in attributes}
    # The same rule verify applies: a published stored generated column (18+) is read like any
    # other, so the rows read here have exactly the stream's Relation columns.
    chosen = published_columns.select(
        collection,
        (Attribute(attnum, attname, gen) for attnum, attname, _, _, gen in attributes),
        publication_columns(conn, publication, oid),
    )
    columns = tuple(
        Column(
            flags=1 if (ident == "f" or a.name in identity) else 0,
            name=a.name,
            type_oid=types[a.attnum][0],
            type_modifier=types[a.attnum][1],
            is_key=ident == "f" or a.name in identity,
        )
        for a in chosen.published
    )
    # The chunk key: the identity key (what events are keyed by), or with FULL the primary
    # key the events are keyed by (producer.tables); none: the table is read whole.
    chunk_key = identity if ident in ("d", "i") else primary if ident == "f" else ()
    names = {c.name for c in columns}
    if any(k not in names for k in chunk_key):
        chunk_key = ()  # a column list without the key: no key order to resume by
    return SnapshotTable(oid, schema, name, ident, columns, chunk_key)


def estimate_rows(conn: psycopg.Connection[Any], oid: int) -> int:
    """The planner's row count (``reltuples``, summed over partitions): progress and ETA."""
    row = conn.execute(_ESTIMATE, (oid,)).fetchone()
    return int(row[0]) if row else 0
