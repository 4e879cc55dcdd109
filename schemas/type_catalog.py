"""TypeCatalog: what the producer knows about PostgreSQL types, by OID. Pure, no I/O.

Built-in types come from psycopg's type registry. Types learned at run time (enums, domains,
composites, ranges, extension types such as citext/hstore, and their arrays) are added by
``schemas.catalog`` from catalog look-ups on a normal connection, triggered by pgoutput Type
messages. A new Type message for an OID drops the cached entry so it is looked up again
(e.g. an enum that gained a label).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from psycopg.postgres import types as builtin_types
from psycopg.types.range import RangeInfo


class TypeKind(enum.Enum):
    BASE = "b"
    ARRAY = "A"
    ENUM = "e"
    DOMAIN = "d"
    COMPOSITE = "c"
    RANGE = "r"
    OTHER = "p"  # pseudo-types, multiranges...: mapped as unmapped strings


@dataclass(frozen=True)
class Attribute:
    """One field of a composite type."""

    name: str
    type_oid: int
    type_modifier: int


@dataclass(frozen=True)
class PgType:
    oid: int
    namespace: str  # 'pg_catalog' for built-ins
    name: str  # typname, e.g. 'int4', '_int4', 'mood'
    kind: TypeKind
    element_oid: int = 0  # ARRAY
    delimiter: str = ","  # ARRAY: the element separator of its text form (';' for box)
    base_oid: int = 0  # DOMAIN
    base_type_modifier: int = -1  # DOMAIN
    labels: tuple[str, ...] = ()  # ENUM, in sort order
    attributes: tuple[Attribute, ...] = ()  # COMPOSITE
    subtype_oid: int = 0  # RANGE

    @property
    def qualified_name(self) -> str:
        if self.namespace in ("pg_catalog", ""):
            return self.name
        return f"{self.namespace}.{self.name}"

    def dependencies(self) -> tuple[int, ...]:
        """OIDs this type's mapping needs to know as well."""
        deps = [self.element_oid, self.base_oid, self.subtype_oid]
        deps.extend(a.type_oid for a in self.attributes)
        return tuple(oid for oid in deps if oid)


def _builtin_types() -> dict[int, PgType]:
    known: dict[int, PgType] = {}
    for info in builtin_types:
        if isinstance(info, RangeInfo):
            known[info.oid] = PgType(
                info.oid, "pg_catalog", info.name, TypeKind.RANGE, subtype_oid=info.subtype_oid
            )
        elif info.name.endswith("multirange"):
            known[info.oid] = PgType(info.oid, "pg_catalog", info.name, TypeKind.OTHER)
        else:
            known[info.oid] = PgType(info.oid, "pg_catalog", info.name, TypeKind.BASE)
        if info.array_oid:
            known[info.array_oid] = PgType(
                info.array_oid,
                "pg_catalog",
                "_" + info.name,
                TypeKind.ARRAY,
                element_oid=info.oid,
                delimiter=info.delimiter,
            )
    return known


_BUILTINS = _builtin_types()


class TypeCatalog:
    """A cache of PgType by OID; built-ins preloaded. Not thread-safe (one per producer loop)."""

    def __init__(self, learned: Iterable[PgType] = ()) -> None:
        self._types: dict[int, PgType] = dict(_BUILTINS)
        self._learned: set[int] = set()
        for pg_type in learned:
            self.add(pg_type)

    def get(self, oid: int) -> PgType | None:
        return self._types.get(oid)

    def __contains__(self, oid: object) -> bool:
        return oid in self._types

    def __iter__(self) -> Iterator[PgType]:
        return iter(self._types.values())

    def add(self, pg_type: PgType) -> None:
        self._types[pg_type.oid] = pg_type
        self._learned.add(pg_type.oid)

    def forget(self, oid: int) -> bool:
        """Drop a learned type (a Type message announced it anew); built-ins stay.

        Returns True if a look-up is now needed for this OID.
        """
        if oid in _BUILTINS:
            return False
        self._types.pop(oid, None)
        self._learned.discard(oid)
        return True

    def missing(self, oids: Iterable[int]) -> set[int]:
        """The OIDs among ``oids`` and their known dependencies that are not in the cache."""
        todo = list(oids)
        seen: set[int] = set()
        absent: set[int] = set()
        while todo:
            oid = todo.pop()
            if oid in seen:
                continue
            seen.add(oid)
            pg_type = self._types.get(oid)
            if pg_type is None:
                absent.add(oid)
            else:
                todo.extend(pg_type.dependencies())
        return absent
