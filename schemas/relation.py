"""Per-Relation schemas and row converters, built once per Relation message (not per row).

``build_relation_codec`` maps every column once, so the per-row work is a single loop of
pre-selected converter functions; schema text depends only on (topic, Relation, catalog).
The decoder's types are used through Protocols (``producer.pgoutput`` is another module's
contract: ``Value(data, binary)``, ``UNCHANGED_TOAST``, ``None`` for NULL).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import fastavro

from schemas.envelope import Schema, envelope_schema, topic_namespace
from schemas.errors import ConversionError
from schemas.row_encoder import (
    CONVERSION_FAILURES,
    KeyEncoder,
    RowEncoder,
    RowKeyEncoder,
    UnsupportedSchema,
    compile_key_encoder,
    compile_row_encoder,
    compile_row_key_encoder,
)
from schemas.type_catalog import TypeCatalog
from schemas.type_mapping import (
    TIMESTAMPTZ_MICROS,
    AvroMapping,
    Convert,
    MappingContext,
    field_names,
    field_schema,
    map_type,
)
from schemas.unchanged_toast import UNCHANGED_TOAST

__all__ = ["CONVERSION_FAILURES", "RelationCodec", "build_relation_codec"]


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
    """The decoder's UNCHANGED_TOAST singleton."""
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
    # The same rows as Avro bytes (the record body, no union branch or header): what the
    # producer sends. Byte-identical to fastavro on convert_row/convert_key's output.
    encode_row: RowEncoder
    encode_key: KeyEncoder | None
    # Both from one tuple in one pass (key None when the table has no replica identity).
    encode_row_key: RowKeyEncoder

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
    key_mappings: Sequence[AvroMapping],
    toast: object,
) -> Callable[..., dict[str, Any]]:
    """``key_mappings``: the Key record's mappings, one per key column (their converters name
    the Key record's own named types in union branches, e.g. ``<ns>.Key_tags``)."""
    positions = [i for i, c in enumerate(columns) if c.is_key]
    plan = tuple(
        (i, columns[i].name, columns[i].field, m.text, m.binary)
        for i, m in zip(positions, key_mappings, strict=True)
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
    timestamptz: str = TIMESTAMPTZ_MICROS,
) -> RelationCodec:
    """Map a Relation's columns once; the catalog must already know every column type
    (``schemas.catalog.ensure_types``), else the column is treated as unmapped.
    ``timestamptz``: one of ``schemas.type_mapping.TIMESTAMPTZ_FORMATS``."""
    toast = default_unchanged_toast() if unchanged_toast is None else unchanged_toast
    table = f"{relation.namespace or 'pg_catalog'}.{relation.name}"
    ns = topic_namespace(topic)
    names = field_names(tuple(c.name for c in relation.columns))

    value_ctx = MappingContext(catalog, ns, timestamptz=timestamptz)
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
    encode_key = None
    if any(c.is_key for c in columns):
        key_ctx = MappingContext(catalog, ns, timestamptz=timestamptz)
        key_cols = [c for c in columns if c.is_key]
        key_maps = [
            map_type(key_ctx, c.type_oid, c.type_modifier, f"Key_{c.field}") for c in key_cols
        ]
        key_schema = _row_schema(f"{ns}.Key", key_cols, key_maps)
        convert_key = _make_key_converter(table, columns, key_maps, toast)
        encode_key = _key_encoder(table, columns, key_maps, key_schema, toast, convert_key)

    if on_unmapped is not None:
        for c in columns:
            if not c.mapped:
                on_unmapped(table, c.name, c.pg_type)

    convert_row = _make_converter(table, columns, mappings, toast)
    encode_row = _row_encoder(table, columns, mappings, value_schema, toast, convert_row)
    return RelationCodec(
        table=table,
        topic=topic,
        relation_id=relation.relation_id,
        columns=columns,
        value_schema=value_schema,
        envelope_schema=envelope_schema(topic, value_schema),
        key_schema=key_schema,
        convert_row=convert_row,
        convert_key=convert_key,
        encode_row=encode_row,
        encode_key=encode_key,
        encode_row_key=_row_key_encoder(
            table, columns, mappings, toast, convert_row, convert_key, encode_row, encode_key
        ),
    )


def _row_key_encoder(
    table: str,
    columns: Sequence[ColumnSchema],
    mappings: Sequence[AvroMapping],
    toast: object,
    convert_row: Callable[..., tuple[dict[str, Any], list[str]]],
    convert_key: Callable[..., dict[str, Any]] | None,
    encode_row: RowEncoder,
    encode_key: KeyEncoder | None,
) -> RowKeyEncoder:
    if convert_key is None or encode_key is None:

        def encode_row_only(
            values: Sequence[Any], lsn: int | None = None
        ) -> tuple[bytes, list[str], bytes | None]:
            return (*encode_row(values, lsn), None)

        return encode_row_only
    spec = [(c.name, m) for c, m in zip(columns, mappings, strict=True)]
    positions = [i for i, c in enumerate(columns) if c.is_key]
    try:
        return compile_row_key_encoder(table, spec, positions, toast, convert_row, convert_key)
    except UnsupportedSchema:
        key = encode_key

        def encode_both(
            values: Sequence[Any], lsn: int | None = None
        ) -> tuple[bytes, list[str], bytes | None]:
            return (*encode_row(values, lsn), key(values, lsn))

        return encode_both


def _row_encoder(
    table: str,
    columns: Sequence[ColumnSchema],
    mappings: Sequence[AvroMapping],
    schema: Schema,
    toast: object,
    convert_row: Callable[..., tuple[dict[str, Any], list[str]]],
) -> RowEncoder:
    spec = [(c.name, m) for c, m in zip(columns, mappings, strict=True)]
    try:
        return compile_row_encoder(table, spec, toast, convert_row)
    except UnsupportedSchema:
        return _fastavro_row_encoder(schema, convert_row)


def _key_encoder(
    table: str,
    columns: Sequence[ColumnSchema],
    key_mappings: Sequence[AvroMapping],
    schema: Schema,
    toast: object,
    convert_key: Callable[..., dict[str, Any]],
) -> KeyEncoder:
    positions = [i for i, c in enumerate(columns) if c.is_key]
    spec = [(i, columns[i].name, m) for i, m in zip(positions, key_mappings, strict=True)]
    try:
        return compile_key_encoder(table, len(columns), spec, toast, convert_key)
    except UnsupportedSchema:
        parsed = fastavro.parse_schema(schema)

        def encode_key(values: Sequence[Any], lsn: int | None = None) -> bytes:
            buf = io.BytesIO()
            fastavro.schemaless_writer(buf, parsed, convert_key(values, lsn))
            return buf.getvalue()

        return encode_key


def _fastavro_row_encoder(
    schema: Schema, convert_row: Callable[..., tuple[dict[str, Any], list[str]]]
) -> RowEncoder:
    """The reference path (converted dict + fastavro), for an Avro shape the compiled encoder
    does not know (none of today's mappings)."""
    parsed = fastavro.parse_schema(schema)

    def encode_row(values: Sequence[Any], lsn: int | None = None) -> tuple[bytes, list[str]]:
        row, unchanged = convert_row(values, lsn)
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, row)
        return buf.getvalue(), unchanged

    return encode_row


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
