"""Per-Relation schemas and row converters, built once per Relation message (not per row).

``build_relation_codec`` maps every column once, so the per-row work is a single loop of
pre-selected converter functions; schema text depends only on (topic, Relation, catalog).
The decoder's types are used through Protocols (``producer.pgoutput`` is another module's
contract: ``Value(data, binary)``, ``UNCHANGED_TOAST``, ``None`` for NULL).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from psycopg import Error as PsycopgError

from schemas.envelope import Schema, envelope_schema, topic_namespace
from schemas.errors import ConversionError
from schemas.type_catalog import TypeCatalog
from schemas.type_mapping import (
    AvroMapping,
    Convert,
    MappingContext,
    field_names,
    field_schema,
    map_type,
)

# What a broken value can raise from a converter (parsers, struct, psycopg, Decimal).
CONVERSION_FAILURES = (
    ValueError,
    TypeError,
    LookupError,
    ArithmeticError,
    struct.error,
    PsycopgError,
)


class ColumnLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def type_oid(self) -> int: ...
    @property
    def type_modifier(self) -> int: ...
    @property
    def is_key(self) -> bool: ...


class RelationLike(Protocol):
    @property
    def relation_id(self) -> int: ...
    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def columns(self) -> Sequence[ColumnLike]: ...


class ValueLike(Protocol):
    """A sent column value; tuples hold ValueLike, None (NULL) or the UNCHANGED_TOAST sentinel
    (typed ``Any`` in the converters' signatures: the hot loop tells them apart itself)."""

    @property
    def data(self) -> bytes: ...
    @property
    def binary(self) -> bool: ...


UnmappedHook = Callable[[str, str, str], None]  # (table, column, pg.type)


def default_unchanged_toast() -> object:
    """The decoder's UNCHANGED_TOAST singleton (imported late: it is another module's contract)."""
    from producer.pgoutput.tuples import UNCHANGED_TOAST

    return UNCHANGED_TOAST


@dataclass(frozen=True)
class ColumnSchema:
    name: str  # the PostgreSQL column name
    field: str  # the Avro field name (sanitized)
    pg_type: str
    type_oid: int
    type_modifier: int
    is_key: bool
    mapped: bool


@dataclass(frozen=True)
class RelationCodec:
    """Schemas and converters of one table, as described by one Relation message."""

    table: str  # "schema.table"
    topic: str
    relation_id: int
    columns: tuple[ColumnSchema, ...]
    value_schema: Schema  # the <ns>.Value row record
    envelope_schema: Schema
    key_schema: Schema | None  # None: no replica identity, append-only (null Kafka key)
    convert_row: Callable[..., tuple[dict[str, Any], list[str]]]
    convert_key: Callable[..., dict[str, Any]] | None

    def column_types(self) -> dict[str, str]:
        return {c.name: c.pg_type for c in self.columns}


def _row_schema(
    name: str, columns: Sequence[ColumnSchema], mappings: Sequence[AvroMapping]
) -> Schema:
    return {
        "type": "record",
        "name": name,
        "fields": [
            field_schema(c.name, c.field, m) for c, m in zip(columns, mappings, strict=True)
        ],
    }


def _make_converter(
    table: str,
    columns: Sequence[ColumnSchema],
    mappings: Sequence[AvroMapping],
    toast: object,
) -> Callable[..., tuple[dict[str, Any], list[str]]]:
    plan: tuple[tuple[str, str, Convert, Convert], ...] = tuple(
        (c.name, c.field, m.text, m.binary) for c, m in zip(columns, mappings, strict=True)
    )
    width = len(plan)

    def convert_row(
        values: Sequence[Any], lsn: int | None = None
    ) -> tuple[dict[str, Any], list[str]]:
        """One tuple -> (Avro row dict, names of unchanged TOAST columns)."""
        if len(values) != width:
            raise ConversionError(
                table,
                "*",
                "row",
                b"",
                False,
                f"tuple has {len(values)} columns, relation has {width}",
                lsn,
            )
        row: dict[str, Any] = {}
        unchanged: list[str] = []
        for (name, field, text, binary), value in zip(plan, values):  # noqa: B905 (checked above)
            if value is None:
                row[field] = None
            elif value is toast:
                row[field] = None  # a placeholder only: the column is listed in unchanged_toast
                unchanged.append(name)
            else:
                try:
                    row[field] = binary(value.data) if value.binary else text(value.data)
                except CONVERSION_FAILURES as exc:
                    raise _conversion_error(table, name, columns, value, exc, lsn) from exc
        return row, unchanged

    return convert_row


def _conversion_error(
    table: str,
    name: str,
    columns: Sequence[ColumnSchema],
    value: Any,
    exc: Exception,
    lsn: int | None,
) -> ConversionError:
    pg_type = next(c.pg_type for c in columns if c.name == name)
    return ConversionError(
        table, name, pg_type, value.data, value.binary, f"{type(exc).__name__}: {exc}", lsn
    )


def _make_key_converter(
    table: str,
    columns: Sequence[ColumnSchema],
    mappings: Sequence[AvroMapping],
    toast: object,
) -> Callable[..., dict[str, Any]]:
    plan = tuple(
        (i, c.name, c.field, m.text, m.binary)
        for i, (c, m) in enumerate(zip(columns, mappings, strict=True))
        if c.is_key
    )

    def convert_key(values: Sequence[Any], lsn: int | None = None) -> dict[str, Any]:
        """The replica-identity columns of a full-width tuple (new row or old key/row)."""
        key: dict[str, Any] = {}
        for i, name, field, text, binary in plan:
            value = values[i]
            if value is None:
                key[field] = None
            elif value is toast:
                pg_type = columns[i].pg_type
                raise ConversionError(
                    table,
                    name,
                    pg_type,
                    b"",
                    False,
                    "key column is an unchanged TOAST value; take the key from the old tuple",
                    lsn,
                )
            else:
                try:
                    key[field] = binary(value.data) if value.binary else text(value.data)
                except CONVERSION_FAILURES as exc:
                    raise _conversion_error(table, name, columns, value, exc, lsn) from exc
        return key

    return convert_key


def build_relation_codec(
    relation: RelationLike,
    catalog: TypeCatalog,
    topic: str,
    on_unmapped: UnmappedHook | None = None,
    unchanged_toast: object | None = None,
) -> RelationCodec:
    """Map a Relation's columns once; the catalog must already know every column type
    (``schemas.catalog.ensure_types``), else the column is treated as unmapped."""
    toast = default_unchanged_toast() if unchanged_toast is None else unchanged_toast
    table = f"{relation.namespace or 'pg_catalog'}.{relation.name}"
    ns = topic_namespace(topic)
    names = field_names(tuple(c.name for c in relation.columns))

    value_ctx = MappingContext(catalog, ns)
    mappings = [
        map_type(value_ctx, c.type_oid, c.type_modifier, f"Value_{field}")
        for c, field in zip(relation.columns, names, strict=True)
    ]
    columns = tuple(
        ColumnSchema(c.name, field, m.pg_type, c.type_oid, c.type_modifier, c.is_key, m.mapped)
        for c, field, m in zip(relation.columns, names, mappings, strict=True)
    )
    value_schema = _row_schema(f"{ns}.Value", columns, mappings)

    key_schema: Schema | None = None
    convert_key = None
    if any(c.is_key for c in columns):
        key_ctx = MappingContext(catalog, ns)
        key_cols = [c for c in columns if c.is_key]
        key_maps = [
            map_type(key_ctx, c.type_oid, c.type_modifier, f"Key_{c.field}") for c in key_cols
        ]
        key_schema = _row_schema(f"{ns}.Key", key_cols, key_maps)
        convert_key = _make_key_converter(table, columns, mappings, toast)

    if on_unmapped is not None:
        for c in columns:
            if not c.mapped:
                on_unmapped(table, c.name, c.pg_type)

    return RelationCodec(
        table=table,
        topic=topic,
        relation_id=relation.relation_id,
        columns=columns,
        value_schema=value_schema,
        envelope_schema=envelope_schema(topic, value_schema),
        key_schema=key_schema,
        convert_row=_make_converter(table, columns, mappings, toast),
        convert_key=convert_key,
    )


class UnmappedColumnLog:
    """An ``on_unmapped`` hook that reports each (table, column, type) once per process."""

    def __init__(self, report: Callable[[str], None]) -> None:
        self._report = report
        self._seen: set[tuple[str, str, str]] = set()

    def __call__(self, table: str, column: str, pg_type: str) -> None:
        if (table, column, pg_type) not in self._seen:
            self._seen.add((table, column, pg_type))
            self._report(
                f"column {table}.{column} has type {pg_type} with no Avro mapping: sent as a string/bytes"
            )
