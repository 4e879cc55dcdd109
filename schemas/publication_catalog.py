"""Catalog reads behind ``schemas/published_columns.py``: what a publication says about one
table's columns (its column list, and on PostgreSQL 18 ``publish_generated_columns``). Shared
by the producer's snapshot and `verify`, so both ask the catalog the same question."""

from __future__ import annotations

from typing import Any, Final

import psycopg

from schemas.errors import SchemaError
from schemas.published_columns import GENERATED_COLUMNS_SINCE, PublicationColumns

# pg_publication.pubgencols exists from 18 on ('n' none, 's' stored). The column list is the
# table's own pg_publication_rel row, as pgoutput looks it up for the relation it names (the
# partition root under publish_via_partition_root: PostgreSQL refuses a column list on a
# partitioned table otherwise). FOR ALL TABLES and FOR TABLES IN SCHEMA have no such row, and
# no list. Two fixed statements rather than one assembled from pieces.
_SINCE_18: Final = """
SELECT p.pubgencols = 's', r.prattrs::int2[]
  FROM pg_publication p
  LEFT JOIN pg_publication_rel r ON r.prpubid = p.oid AND r.prrelid = %s
 WHERE p.pubname = %s
"""
_BEFORE_18: Final = """
SELECT false, r.prattrs::int2[]
  FROM pg_publication p
  LEFT JOIN pg_publication_rel r ON r.prpubid = p.oid AND r.prrelid = %s
 WHERE p.pubname = %s
"""


class PublicationNotFound(SchemaError):
    def __init__(self, publication: str) -> None:
        self.publication = publication
        super().__init__(f"publication {publication!r} does not exist")


def server_major(conn: psycopg.Connection[Any]) -> int:
    return conn.info.server_version // 10000


def publication_columns(
    conn: psycopg.Connection[Any], publication: str, relid: int
) -> PublicationColumns:
    """What ``publication`` says about the columns of the table ``relid`` (the oid of the name
    pg_publication_tables lists)."""
    major = server_major(conn)
    statement = _SINCE_18 if major >= GENERATED_COLUMNS_SINCE else _BEFORE_18
    row = conn.execute(statement, (relid, publication)).fetchone()
    if row is None:
        raise PublicationNotFound(publication)
    stored, attnums = row
    return PublicationColumns(
        publication=publication,
        server_major=major,
        column_list=None if attnums is None else frozenset(int(n) for n in attnums),
        publish_stored_generated=bool(stored),
    )
