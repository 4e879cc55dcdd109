"""Validate and quote names for the replication protocol.

Replication commands (CREATE_REPLICATION_SLOT, START_REPLICATION) go through the walsender's
own grammar, which has no bind parameters, so identifiers and option literals must be quoted
here. SQL on ordinary connections uses psycopg.sql instead; these validators run there too so
that a hostile name fails before reaching any server.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from producer.replication.errors import ErrorKind, ReplicationError
from schemas.table_list import TableListError, format_table, parse_table, parse_table_list

# PostgreSQL truncates identifiers to NAMEDATALEN - 1 bytes; a silently truncated name would
# refer to a different object, so longer names are refused.
MAX_IDENTIFIER_BYTES = 63
# ReplicationSlotValidateName(): lower-case letters, digits and underscores only.
_SLOT_NAME = re.compile(r"[a-z0-9_]{1,63}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def validate_slot_name(name: str) -> str:
    if not _SLOT_NAME.fullmatch(name):
        raise ReplicationError(
            ErrorKind.IDENTIFIER,
            f"invalid slot name {name!r}: use 1-63 characters from a-z, 0-9 and _",
        )
    return name


def validate_identifier(name: str, what: str = "identifier") -> str:
    """Accept any name PostgreSQL would store unchanged; refuse empty, over-long, control chars."""
    if not name:
        raise ReplicationError(ErrorKind.IDENTIFIER, f"empty {what}")
    if len(name.encode("utf-8")) > MAX_IDENTIFIER_BYTES:
        raise ReplicationError(
            ErrorKind.IDENTIFIER,
            f"{what} {name!r} is longer than {MAX_IDENTIFIER_BYTES} bytes and would be truncated",
        )
    if _CONTROL.search(name):
        raise ReplicationError(ErrorKind.IDENTIFIER, f"{what} {name!r} contains control characters")
    return name


def quote_identifier(name: str) -> str:
    """``my"pub`` -> ``"my""pub"`` (the walsender scanner's only escape in quoted names)."""
    validate_identifier(name)
    return '"' + name.replace('"', '""') + '"'


def quote_literal(value: str) -> str:
    """``it's`` -> ``'it''s'``; the replication scanner knows no backslash escapes."""
    if "\x00" in value:
        raise ReplicationError(ErrorKind.IDENTIFIER, f"literal {value!r} contains a NUL byte")
    return "'" + value.replace("'", "''") + "'"


@dataclass(frozen=True)
class TableName:
    schema: str
    name: str

    def __post_init__(self) -> None:
        validate_identifier(self.schema, "schema name")
        validate_identifier(self.name, "table name")

    @classmethod
    def parse(cls, text: str) -> TableName:
        """``'public.orders'`` -> ``TableName('public', 'orders')``; the schema is required;
        PostgreSQL-quoted names as in WALBRIDGE_TABLES (``schemas.table_list``)."""
        try:
            return cls(*parse_table(text))
        except TableListError as exc:
            raise ReplicationError(ErrorKind.IDENTIFIER, str(exc)) from exc

    @classmethod
    def parse_list(cls, text: str) -> tuple[TableName, ...]:
        """WALBRIDGE_TABLES: ``'public.orders, "My Schema"."a.b"'``."""
        try:
            return tuple(cls(s, t) for s, t in parse_table_list(text))
        except TableListError as exc:
            raise ReplicationError(ErrorKind.IDENTIFIER, str(exc)) from exc

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}"

    def quoted(self) -> str:
        """The WALBRIDGE_TABLES form, quoted where a name needs it."""
        return format_table(self.schema, self.name)
