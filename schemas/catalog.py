"""Catalog look-ups for learned types, on a normal (non-replication) psycopg connection.

The only I/O of the type mapping: pgoutput's Type message names a type but says nothing
about its labels, base type or fields, so those are read from pg_type & co here and put
into the pure ``TypeCatalog``. Dependencies (an array's element, a domain's base, a
composite's fields, a range's subtype) are followed until everything is known.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import psycopg

from schemas.errors import CatalogError
from schemas.type_catalog import Attribute, PgType, TypeCatalog, TypeKind

_QUERY: Final = """
SELECT t.oid::int8, n.nspname, t.typname, t.typtype::text, t.typcategory::text,
       t.typelem::int8, t.typdelim::text, t.typbasetype::int8, t.typtypmod,
       (SELECT array_agg(e.enumlabel::text ORDER BY e.enumsortorder)
          FROM pg_enum e WHERE e.enumtypid = t.oid),
       (SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_attribute a
          WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped),
       (SELECT array_agg(a.atttypid::int8 ORDER BY a.attnum) FROM pg_attribute a
          WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped),
       (SELECT array_agg(a.atttypmod ORDER BY a.attnum) FROM pg_attribute a
          WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped),
       r.rngsubtype::int8
  FROM pg_type t
  JOIN pg_namespace n ON n.oid = t.typnamespace
  LEFT JOIN pg_range r ON r.rngtypid = t.oid
 WHERE t.oid = ANY(%s::oid[])
"""


def _to_pg_type(row: tuple[Any, ...]) -> PgType:
    (oid, nspname, typname, typtype, category, elem, delim, base, typmod,
     labels, att_names, att_types, att_mods, subtype) = row  # fmt: skip
    if category == "A" and elem:
        return PgType(oid, nspname, typname, TypeKind.ARRAY, element_oid=elem, delimiter=delim)
    if typtype == "e":
        return PgType(oid, nspname, typname, TypeKind.ENUM, labels=tuple(labels or ()))
    if typtype == "d":
        return PgType(
            oid, nspname, typname, TypeKind.DOMAIN, base_oid=base, base_type_modifier=typmod
        )
    if typtype == "c":
        attributes = tuple(
            Attribute(name, type_oid, mod)
            for name, type_oid, mod in zip(
                att_names or (), att_types or (), att_mods or (), strict=True
            )
        )
        return PgType(oid, nspname, typname, TypeKind.COMPOSITE, attributes=attributes)
    if typtype == "r" and subtype:
        return PgType(oid, nspname, typname, TypeKind.RANGE, subtype_oid=subtype)
    if typtype == "b":
        return PgType(oid, nspname, typname, TypeKind.BASE)
    return PgType(oid, nspname, typname, TypeKind.OTHER)


def fetch_types(conn: psycopg.Connection[Any], oids: Iterable[int]) -> list[PgType]:
    """Read the given types from the catalog; raise CatalogError for an OID that is absent."""
    wanted = sorted(set(oids))
    if not wanted:
        return []
    with conn.cursor() as cur:
        cur.execute(_QUERY, (wanted,))
        found = [_to_pg_type(row) for row in cur.fetchall()]
    absent = set(wanted) - {t.oid for t in found}
    if absent:
        oid = min(absent)
        raise CatalogError(oid, "no such type in pg_type (dropped since the change was written?)")
    return found


def ensure_types(catalog: TypeCatalog, conn: psycopg.Connection[Any], oids: Iterable[int]) -> int:
    """Look up every type in ``oids`` (and their dependencies) missing from ``catalog``.

    Returns the number of types learned. One query per dependency level, none when cached.
    """
    learned = 0
    missing = catalog.missing(oids)
    while missing:
        for pg_type in fetch_types(conn, missing):
            catalog.add(pg_type)
            learned += 1
        missing = catalog.missing(missing)
    return learned


def on_type_message(catalog: TypeCatalog, conn: psycopg.Connection[Any], type_oid: int) -> int:
    """A pgoutput Type message arrived: refresh that type (and anything it now needs)."""
    catalog.forget(type_oid)
    return ensure_types(catalog, conn, [type_oid])
