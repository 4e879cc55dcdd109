"""PostgreSQL type -> Avro type, as an OID-keyed table of small functions. Pure, no I/O.

Each function gives an ``AvroMapping``: the (non-null) Avro type, the ``pg.type`` text
recorded on the field, and the text/binary value converters for that type. Field wrapping
(``["null", ...]``, default null) happens in ``schemas.row_schema``.

Lossless representation choices (every value must decode with common Avro readers, e.g.
fastavro, which rejects dates/timestamps outside years 1..9999 and a time of 24:00:00):

==========================  ===========================================================
PostgreSQL                  Avro
==========================  ===========================================================
bool                        boolean
int2, int4                  int
int8, oid                   long
float4 / float8             float / double (NaN, +-Infinity, -0.0 are native IEEE values)
numeric(p,s)                union [decimal(p,s) bytes, string]; the string branch holds
                            ``NaN``/``Infinity``/``-Infinity``. Negative scale s<0 maps to
                            decimal(p-s, 0); s>p maps to decimal(s, s) (Avro needs 0<=s<=p)
numeric (no typmod)         string, PostgreSQL's canonical text (plain notation, scale kept)
money                       string, PostgreSQL's text (binary mode: '$' and 2 digits assumed)
char/bpchar/varchar/text/   string
name/"char"/citext
bytea                       bytes
uuid                        string with logicalType uuid
json, jsonb, xml            string (jsonb as PostgreSQL prints it)
date                        union [int date, string]: BC, year > 9999, +-infinity -> string
time                        union [long time-micros, string]: 24:00:00 -> string
timetz                      string, PostgreSQL's text (e.g. ``12:00:00+05:30``)
timestamp                   union [long local-timestamp-micros, string] (BC, > 9999, +-infinity
                            -> PostgreSQL's text)
timestamptz                 union [long timestamp-micros (UTC), string] (same edge values;
                            the text is in UTC, e.g. ``0044-03-15 12:00:00+00 BC``); with the
                            ``zoned-string`` setting, Debezium's ZonedTimestamp: a string
                            ``2040-08-22T08:00:00.123456Z`` (edge values: PostgreSQL's text)
interval                    record io.walbridge.pg.Interval {months int, days int, micros long}
inet, cidr, macaddr(8),     string, PostgreSQL's text
bit, varbit, tsvector,
tsquery, geometric types,
ranges, pg_lsn
hstore                      map of nullable string
enum                        string; the labels in the type's ``pg.enum.labels`` property.
                            Not an Avro enum, so adding a label stays a compatible change
domain                      the base type's mapping; ``pg.type`` names the domain
composite                   record of nullable fields (``pg.type`` on each field)
array (any of the above)    union [array<nullable element>, record {dims: array<int>,
                            lower_bounds: array<int>, elements: array<nullable element>}]:
                            one-dimensional arrays indexed from 1 (and the empty array) are
                            plain Avro arrays, which Debezium's readers and Flink expect; the
                            record (row-major elements) only where a plain array would lose
                            the dimensions or PostgreSQL's lower bounds
anything else               union [string, bytes] (text mode: PostgreSQL's text; binary
                            mode: the raw send format), field tagged ``pg.unmapped: true``
==========================  ===========================================================
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Final

from psycopg.postgres import types as builtin_types

from schemas import pg_containers, pg_datetime, pg_render, pg_scalars
from schemas.type_catalog import PgType, TypeCatalog, TypeKind

Convert = Callable[[bytes], Any]
AvroType = Any  # JSON-able Avro schema fragment: str | dict | list

INTERVAL_RECORD: Final = "io.walbridge.pg.Interval"
# How timestamptz is written (the producer's --timestamptz-format).
TIMESTAMPTZ_MICROS: Final = "timestamp-micros"
TIMESTAMPTZ_ZONED: Final = "zoned-string"
TIMESTAMPTZ_FORMATS: Final = (TIMESTAMPTZ_MICROS, TIMESTAMPTZ_ZONED)
ZONED_TIMESTAMP: Final = "io.debezium.time.ZonedTimestamp"


@dataclass(frozen=True)
class AvroMapping:
    avro: AvroType  # never includes "null"; a list is a union of the non-null branches
    pg_type: str
    text: Convert
    binary: Convert
    mapped: bool = True
    # Arrays only: the element's mapping and the text delimiter, for the compiled row
    # encoder's direct paths (schemas.row_encoder); the converters above stay the reference.
    element: AvroMapping | None = None
    delimiter: bytes = b","


@dataclass
class MappingContext:
    """State of one schema build: the catalog, and the named types already defined in it.

    Avro allows a named type to be defined once per schema; later uses refer to its name.
    """

    catalog: TypeCatalog
    namespace: str
    defined: set[str] = field(default_factory=set)
    timestamptz: str = TIMESTAMPTZ_MICROS

    def named(self, fullname: str, definition: dict[str, Any]) -> AvroType:
        if fullname in self.defined:
            return fullname
        self.defined.add(fullname)
        return definition


_NAME_BAD: Final = re.compile(r"[^A-Za-z0-9_]")


def avro_name(text: str) -> str:
    """A valid Avro name part: [A-Za-z_][A-Za-z0-9_]*."""
    name = _NAME_BAD.sub("_", text) or "_"
    return "_" + name if name[0].isdigit() else name


def field_names(names: tuple[str, ...]) -> tuple[str, ...]:
    """Avro field names for PostgreSQL column/attribute names: sanitized, collisions suffixed."""
    taken: set[str] = set()
    out: list[str] = []
    for name in names:
        candidate = avro_name(name)
        base, n = candidate, 2
        while candidate in taken:
            candidate, n = f"{base}_{n}", n + 1
        taken.add(candidate)
        out.append(candidate)
    return tuple(out)


def nullable(avro: AvroType) -> list[Any]:
    """``["null", ...branches]``: unions cannot nest, so a union's branches are spliced in."""
    return ["null", *avro] if isinstance(avro, list) else ["null", avro]


def _branch(record_name: str, convert: Convert) -> Convert:
    """Wrap a record converter's result as fastavro's ``(name, datum)`` union-branch notation.

    Record values always sit in a union (every field is nullable); without the branch name
    fastavro validates the whole datum against each branch to choose one, which made an
    array column cost 5x a scalar column in the benchmark.
    """

    def convert_branch(data: bytes) -> tuple[str, Any]:
        return (record_name, convert(data))

    return convert_branch


# --- pg.type text (PostgreSQL's format_type) -----------------------------------------------

_DISPLAY: Final = {
    "int2": "smallint", "int4": "integer", "int8": "bigint", "float4": "real",
    "float8": "double precision", "bool": "boolean", "varchar": "character varying",
    "bpchar": "character", "varbit": "bit varying",
    "time": "time without time zone", "timetz": "time with time zone",
    "timestamp": "timestamp without time zone", "timestamptz": "timestamp with time zone",
}  # fmt: skip


def numeric_typmod(type_modifier: int) -> tuple[int, int] | None:
    """(precision, scale) of a numeric typmod, or None when unbounded; scale may be < 0."""
    if type_modifier < 4:
        return None
    packed = type_modifier - 4
    return (packed >> 16) & 0xFFFF, ((packed & 0x7FF) ^ 1024) - 1024


def format_pg_type(pg_type: PgType, type_modifier: int) -> str:
    name = pg_type.name
    if pg_type.namespace not in ("pg_catalog", ""):
        return pg_type.qualified_name
    display = _DISPLAY.get(name, name)
    if type_modifier < 0:
        return display
    if name == "numeric":
        ps = numeric_typmod(type_modifier)
        return f"numeric({ps[0]},{ps[1]})" if ps else display
    if name in ("varchar", "bpchar"):
        return f"{display}({type_modifier - 4})"
    if name in ("bit", "varbit"):
        return f"{display}({type_modifier})"
    if name in ("time", "timetz", "timestamp", "timestamptz"):
        head, _, tail = display.partition(" ")
        return f"{head}({type_modifier}) {tail}"
    if name == "interval" and type_modifier & 0xFFFF != 0xFFFF:
        return f"interval({type_modifier & 0xFFFF})"
    return display


# --- the OID-keyed table -------------------------------------------------------------------

MapFn = Callable[[MappingContext, PgType, int, str], AvroMapping]


def _simple(avro: AvroType, text: Convert, binary: Convert) -> MapFn:
    def map_fn(ctx: MappingContext, pg_type: PgType, type_modifier: int, path: str) -> AvroMapping:
        return AvroMapping(avro, format_pg_type(pg_type, type_modifier), text, binary)

    return map_fn


_decode = pg_scalars.decode_text
STRING_SAME_BYTES: Final = _simple("string", _decode, _decode)  # binary form = text bytes


def _string_rendered(binary: Convert) -> MapFn:
    return _simple("string", _decode, binary)


def _map_numeric(
    ctx: MappingContext, pg_type: PgType, type_modifier: int, path: str
) -> AvroMapping:
    pg_name = format_pg_type(pg_type, type_modifier)
    ps = numeric_typmod(type_modifier)
    if ps is None:
        return AvroMapping("string", pg_name, _decode, pg_scalars.numeric_unbounded_binary)
    precision, scale = ps
    if scale < 0:  # numeric(5,-2) holds up to 7 integer digits
        precision, scale = precision - scale, 0
    precision = max(precision, scale)
    decimal = {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale}
    return AvroMapping(
        [decimal, "string"],
        pg_name,
        pg_scalars.numeric_bounded_text(scale),
        pg_scalars.numeric_bounded_binary(scale),
    )


def _map_interval(
    ctx: MappingContext, pg_type: PgType, type_modifier: int, path: str
) -> AvroMapping:
    record = {
        "type": "record",
        "name": INTERVAL_RECORD,
        "fields": [
            {"name": "months", "type": "int"},
            {"name": "days", "type": "int"},
            {"name": "micros", "type": "long"},
        ],
    }
    return AvroMapping(
        ctx.named(INTERVAL_RECORD, record),
        format_pg_type(pg_type, type_modifier),
        _branch(INTERVAL_RECORD, pg_datetime.interval_text),
        _branch(INTERVAL_RECORD, pg_datetime.interval_binary),
    )


def _logical(base: str, logical: str) -> dict[str, str]:
    return {"type": base, "logicalType": logical}


def _map_timestamptz(
    ctx: MappingContext, pg_type: PgType, type_modifier: int, path: str
) -> AvroMapping:
    pg_name = format_pg_type(pg_type, type_modifier)
    if ctx.timestamptz == TIMESTAMPTZ_ZONED:
        # connect.name: what Kafka Connect's Avro converter turns into the Connect schema name,
        # so Debezium-aware sinks see the semantic type they know.
        return AvroMapping(
            {"type": "string", "connect.name": ZONED_TIMESTAMP},
            pg_name,
            pg_datetime.timestamptz_zoned_text,
            pg_datetime.timestamptz_zoned_binary,
        )
    return AvroMapping(
        [_logical("long", "timestamp-micros"), "string"],
        pg_name,
        pg_datetime.timestamptz_text,
        pg_datetime.timestamptz_binary,
    )


_BY_NAME: Final[dict[str, MapFn]] = {
    "bool": _simple("boolean", pg_scalars.bool_text, pg_scalars.bool_binary),
    "int2": _simple("int", pg_scalars.int_text, pg_scalars.int2_binary),
    "int4": _simple("int", pg_scalars.int_text, pg_scalars.int4_binary),
    "int8": _simple("long", pg_scalars.int_text, pg_scalars.int8_binary),
    "oid": _simple("long", pg_scalars.int_text, pg_scalars.oid_binary),
    "float4": _simple("float", pg_scalars.float_text, pg_scalars.float4_binary),
    "float8": _simple("double", pg_scalars.float_text, pg_scalars.float8_binary),
    "numeric": _map_numeric,
    "money": _string_rendered(pg_scalars.money_binary),
    '"char"': STRING_SAME_BYTES,
    "bpchar": STRING_SAME_BYTES,
    "varchar": STRING_SAME_BYTES,
    "text": STRING_SAME_BYTES,
    "name": STRING_SAME_BYTES,
    "bytea": _simple("bytes", pg_scalars.bytea_text, pg_scalars.raw_bytes),
    "uuid": _simple(_logical("string", "uuid"), _decode, pg_scalars.uuid_binary),
    "json": STRING_SAME_BYTES,
    "jsonb": _string_rendered(pg_scalars.jsonb_binary),
    "xml": STRING_SAME_BYTES,
    "date": _simple(
        [_logical("int", "date"), "string"], pg_datetime.date_text, pg_datetime.date_binary
    ),
    "time": _simple(
        [_logical("long", "time-micros"), "string"], pg_datetime.time_text, pg_datetime.time_binary
    ),
    "timetz": _simple("string", pg_datetime.timetz_text, pg_datetime.timetz_binary),
    "timestamp": _simple(
        [_logical("long", "local-timestamp-micros"), "string"],
        pg_datetime.timestamp_text,
        pg_datetime.timestamp_binary,
    ),
    "timestamptz": _map_timestamptz,
    "interval": _map_interval,
    "inet": _string_rendered(pg_render.inet_binary),
    "cidr": _string_rendered(pg_render.cidr_binary),
    "macaddr": _string_rendered(pg_render.macaddr_binary),
    "macaddr8": _string_rendered(pg_render.macaddr_binary),
    "bit": _string_rendered(pg_render.bits_binary),
    "varbit": _string_rendered(pg_render.bits_binary),
    "tsvector": _string_rendered(pg_render.tsvector_binary),
    "tsquery": _string_rendered(pg_render.tsquery_binary),
    "point": _string_rendered(pg_render.point_binary),
    "line": _string_rendered(pg_render.line_binary),
    "lseg": _string_rendered(pg_render.lseg_binary),
    "box": _string_rendered(pg_render.box_binary),
    "path": _string_rendered(pg_render.path_binary),
    "polygon": _string_rendered(pg_render.polygon_binary),
    "circle": _string_rendered(pg_render.circle_binary),
    "pg_lsn": _string_rendered(pg_render.pg_lsn_binary),
}

# The table itself: built-in OID -> mapping function (OIDs from psycopg's registry).
BUILTIN_MAPPINGS: Final[dict[int, MapFn]] = {
    builtin_types[name].oid: fn for name, fn in _BY_NAME.items()
}
for _range_name, _subtype in (
    ("int4range", "int4"), ("int8range", "int8"), ("numrange", "numeric"),
    ("tsrange", "timestamp"), ("tstzrange", "timestamptz"), ("daterange", "date"),
):  # fmt: skip
    BUILTIN_MAPPINGS[builtin_types[_range_name].oid] = _string_rendered(
        pg_render.range_binary(pg_render.RANGE_ELEMENT_TEXT[_subtype])
    )

# Extension types, found by name because their OIDs differ per database.
EXTENSION_MAPPINGS: Final[dict[str, MapFn]] = {
    "citext": STRING_SAME_BYTES,
    "hstore": _simple(
        {"type": "map", "values": ["null", "string"]},
        pg_containers.hstore_text,
        pg_containers.hstore_binary,
    ),
}


def _raw(data: bytes) -> bytes:
    return data


def unmapped(pg_name: str) -> AvroMapping:
    """No mapping known: PostgreSQL's text in text mode, the raw send format in binary mode."""
    return AvroMapping(["string", "bytes"], pg_name, _decode, _raw, mapped=False)


def _binary_unsupported(pg_name: str) -> Convert:
    def convert(data: bytes) -> Any:
        raise ValueError(f"no binary renderer for {pg_name}; use text mode for this type")

    return convert


# --- learned kinds -------------------------------------------------------------------------


def _reference(avro: AvroType) -> AvroType:
    """The same type with each named type given by its name: a name is defined only once per
    schema, so a second use of an element type must refer to it."""
    if isinstance(avro, list):
        return [_reference(branch) for branch in avro]
    if isinstance(avro, dict) and avro.get("type") in ("record", "enum", "fixed"):
        return avro["name"]
    return avro


def _array_value(record_name: str, convert: Convert) -> Convert:
    """A plain list for one-dimensional arrays from index 1 and the empty array (PostgreSQL's
    empty array has no dimensions), else the shaped record in fastavro's branch notation."""

    def convert_array(data: bytes) -> Any:
        value = convert(data)
        if len(value["dims"]) <= 1 and value["lower_bounds"] in ([], [1]):
            return value["elements"]
        return (record_name, value)

    return convert_array


def _map_array(ctx: MappingContext, pg_type: PgType, type_modifier: int, path: str) -> AvroMapping:
    element = map_type(ctx, pg_type.element_oid, type_modifier, path + "_element")
    name = f"{ctx.namespace}.{path}"
    plain = {"type": "array", "items": nullable(element.avro)}
    record = {
        "type": "record",
        "name": name,
        "fields": [
            {"name": "dims", "type": {"type": "array", "items": "int"}},
            {"name": "lower_bounds", "type": {"type": "array", "items": "int"}},
            {
                "name": "elements",
                "type": {"type": "array", "items": nullable(_reference(element.avro))},
            },
        ],
    }
    delimiter = pg_type.delimiter.encode()
    return AvroMapping(
        [plain, ctx.named(name, record)],
        element.pg_type + "[]",
        _array_value(name, pg_containers.array_text(element.text, delimiter)),
        _array_value(name, pg_containers.array_binary(element.binary)),
        element.mapped,
        element=element,
        delimiter=delimiter,
    )


def _map_enum(ctx: MappingContext, pg_type: PgType, type_modifier: int, path: str) -> AvroMapping:
    avro = {"type": "string", "pg.enum.labels": list(pg_type.labels)}
    return AvroMapping(avro, pg_type.qualified_name, _decode, _decode)


def _map_domain(ctx: MappingContext, pg_type: PgType, type_modifier: int, path: str) -> AvroMapping:
    base = map_type(ctx, pg_type.base_oid, pg_type.base_type_modifier, path)
    return replace(base, pg_type=pg_type.qualified_name)


def _map_composite(
    ctx: MappingContext, pg_type: PgType, type_modifier: int, path: str
) -> AvroMapping:
    names = field_names(tuple(a.name for a in pg_type.attributes))
    fields: list[dict[str, Any]] = []
    text: list[Convert] = []
    binary: list[Convert] = []
    for attr, name in zip(pg_type.attributes, names, strict=True):
        sub = map_type(ctx, attr.type_oid, attr.type_modifier, f"{path}_{name}")
        fields.append(field_schema(attr.name, name, sub))
        text.append(sub.text)
        binary.append(sub.binary)
    fullname = f"{ctx.namespace}.{path}"
    record = {
        "type": "record",
        "name": fullname,
        "pg.type": pg_type.qualified_name,
        "fields": fields,
    }
    return AvroMapping(
        ctx.named(fullname, record),
        pg_type.qualified_name,
        _branch(fullname, pg_containers.composite_text(names, tuple(text))),
        _branch(fullname, pg_containers.composite_binary(names, tuple(binary))),
    )


def _map_range(ctx: MappingContext, pg_type: PgType, type_modifier: int, path: str) -> AvroMapping:
    subtype = ctx.catalog.get(pg_type.subtype_oid)
    element_text = pg_render.RANGE_ELEMENT_TEXT.get(subtype.name if subtype else "")
    binary = (
        pg_render.range_binary(element_text)
        if element_text is not None
        else _binary_unsupported(pg_type.qualified_name)
    )
    return AvroMapping("string", pg_type.qualified_name, _decode, binary)


_BY_KIND: Final[dict[TypeKind, MapFn]] = {
    TypeKind.ARRAY: _map_array,
    TypeKind.ENUM: _map_enum,
    TypeKind.DOMAIN: _map_domain,
    TypeKind.COMPOSITE: _map_composite,
    TypeKind.RANGE: _map_range,
}


def map_type(ctx: MappingContext, type_oid: int, type_modifier: int, path: str) -> AvroMapping:
    """The Avro mapping of one column (or element/attribute); ``path`` names nested records."""
    builtin = BUILTIN_MAPPINGS.get(type_oid)
    pg_type = ctx.catalog.get(type_oid)
    if pg_type is None:
        return unmapped(f"oid:{type_oid}")
    if builtin is not None:
        return builtin(ctx, pg_type, type_modifier, path)
    by_kind = _BY_KIND.get(pg_type.kind)
    if by_kind is not None:
        return by_kind(ctx, pg_type, type_modifier, path)
    extension = EXTENSION_MAPPINGS.get(pg_type.name) if pg_type.kind is TypeKind.BASE else None
    if extension is not None:
        mapping = extension(ctx, pg_type, type_modifier, path)
        return replace(mapping, pg_type=pg_type.qualified_name)
    return unmapped(format_pg_type(pg_type, type_modifier))


def field_schema(pg_name: str, avro_field: str, mapping: AvroMapping) -> dict[str, Any]:
    """One nullable record field, default null, tagged with its PostgreSQL type."""
    schema: dict[str, Any] = {
        "name": avro_field,
        "type": nullable(mapping.avro),
        "default": None,
        "pg.type": mapping.pg_type,
    }
    if avro_field != pg_name:
        schema["pg.name"] = pg_name
    if not mapping.mapped:
        schema["pg.unmapped"] = True
    return schema
