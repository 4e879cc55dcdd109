"""Per-field Avro -> lake conversion, applied after decoding (the lake's column forms).

Spark's Avro reader maps primitive and logical types itself (long, int, string, boolean,
float, double, bytes, decimal, date, timestamp-micros -> TIMESTAMP, local-timestamp-micros ->
TIMESTAMP_NTZ, uuid -> string). The forms `schemas/` chose to stay lossless need a rule:

=====================================  ===================================================
Avro form (schemas/type_mapping.py)    lake columns
=====================================  ===================================================
[logical, string] (numeric(p,s), date,  `c`: the typed value (decimal(p,s), date, timestamp,
timestamp, timestamptz)                 timestamp_ntz), null for the special values;
                                        `c__text`: PostgreSQL's text of a value the typed
                                        column cannot hold (NaN, +-Infinity, BC dates,
                                        years > 9999, +-infinity), else null
string ZonedTimestamp (timestamptz      `c`: timestamp; `c__text`: the string when it is
with --timestamptz-format zoned-string)  not an ISO instant (BC, year > 9999, +-infinity);
                                        arrays of it keep the strings
[time-micros, string] (time)            `c`: string `HH:MM:SS.ffffff` (fixed width, so it
                                        sorts; 24:00:00 fits too). Delta has no TIME type
[string, bytes] (unmapped types)        `c`: the text; `c__bytes`: the binary send format
                                        when the producer ran in binary mode
[array, record {dims, lower_bounds,     `c`: array of the elements in row-major order;
elements}] (contract 3), or the record  `c__shape`: struct {dims, lower_bounds} only when
alone (contract 1-2)                    the array is not one-dimensional from index 1
interval record {months,days,micros}    `c`: that struct (Delta has no interval type)
hstore map, composite record            as decoded (map / struct)
=====================================  ===================================================

A companion column (`__text`, `__bytes`, `__shape`) exists only for the columns whose type
needs it. `FieldConversions.by_pg_type` lets a deployment override a column type's rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

from spark_consumer.columns import RowField

# A hook gives the lake columns of one field by name (its main column named like the field).
FieldHook = Callable[[Column, RowField], Mapping[str, Column]]

TEXT, BYTES, SHAPE = "__text", "__bytes", "__shape"
ZONED_TIMESTAMP = "io.debezium.time.ZonedTimestamp"  # schemas.type_mapping's name for it
# The producer's zoned form of an in-range value; its edge values are PostgreSQL's text.
ISO_INSTANT = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?Z$"


def _branches(avro: Any) -> list[Any]:
    return [b for b in avro if b != "null"] if isinstance(avro, list) else [avro]


def _logical(t: Any) -> str | None:
    return t.get("logicalType") if isinstance(t, dict) else None


def _is_record(t: Any, *fields: str) -> bool:
    return (
        isinstance(t, dict)
        and t.get("type") == "record"
        and [f["name"] for f in t.get("fields", [])] == list(fields)
    )


def _time_text(micros: Column) -> Column:
    """Microseconds since midnight -> 'HH:MM:SS.ffffff' (24:00:00 included)."""
    secs = F.floor(micros / 1_000_000)
    return F.when(
        micros.isNotNull(),
        F.format_string(
            "%02d:%02d:%02d.%06d",
            F.floor(secs / 3600).cast("int"),
            (F.floor(secs / 60) % 60).cast("int"),
            (secs % 60).cast("int"),
            (micros % 1_000_000).cast("int"),
        ),
    )


def _time_or_text(col: Column) -> Column:
    """[time-micros, string]: the string branch holds 24:00:00 as PostgreSQL prints it; pad it
    to the same fixed width as the typed branch."""
    text = col["member1"]
    padded = F.when(text.rlike(r"^\d\d:\d\d:\d\d$"), F.concat(text, F.lit(".000000")))
    return F.coalesce(_time_text(col["member0"]), padded.otherwise(text))


def _kind(f: RowField) -> str:
    """Which rule applies to the field's (non-null) Avro type."""
    branches = _branches(f.avro)
    if len(branches) == 2 and branches[1] == "string":
        if _logical(branches[0]) == "time-micros":
            return "time"
        if _logical(branches[0]) is not None:
            return "typed_or_text"
    if branches == ["string", "bytes"]:
        return "text_or_bytes"
    if (
        len(branches) == 2
        and isinstance(branches[0], dict)
        and branches[0].get("type") == "array"
        and _is_record(branches[1], "dims", "lower_bounds", "elements")
    ):
        return "array_or_shaped"
    if len(branches) == 1:
        b = branches[0]
        if isinstance(b, dict) and b.get("connect.name") == ZONED_TIMESTAMP:
            return "zoned"
        if _logical(b) == "time-micros":
            return "time_plain"
        if _is_record(b, "dims", "lower_bounds", "elements"):
            return "array"
    return "as_is"


def _elements(elements: Column, items: Any) -> Column:
    """Array elements: simple element types as they are; a union element's typed branch
    (e.g. numeric[] -> decimal) would lose NaN, so such elements stay structs."""
    kind = _kind(RowField("element", items, None))
    if kind == "time_plain":
        return F.transform(elements, _time_text)
    if kind == "time":
        return F.transform(elements, _time_or_text)
    return elements


def _shape(record: Column) -> Column:
    """{dims, lower_bounds} of a shaped array record, null when it is one-dimensional from 1."""
    standard = (F.size(record["dims"]) <= 1) & (
        (F.size(record["lower_bounds"]) == 0) | (record["lower_bounds"][0] == 1)
    )
    return F.when(
        record.isNotNull() & ~standard,
        F.struct(record["dims"].alias("dims"), record["lower_bounds"].alias("lower_bounds")),
    )


@dataclass(frozen=True)
class FieldConversions:
    by_pg_type: Mapping[str, FieldHook] = field(default_factory=dict)

    def apply(self, col: Column, f: RowField) -> list[Column]:
        """The lake columns of one source field (the main column first)."""
        hook = self.by_pg_type.get(f.pg_type or "")
        if hook is not None:
            return [c.alias(name) for name, c in hook(col, f).items()]
        kind = _kind(f)
        if kind == "typed_or_text":
            return [col["member0"].alias(f.name), col["member1"].alias(f.name + TEXT)]
        if kind == "zoned":
            # ISO-8601 with Z casts exactly (microseconds kept); PostgreSQL's text of the
            # values a Spark timestamp cannot hold does not, and goes to c__text.
            typed = F.when(col.rlike(ISO_INSTANT), col.try_cast("timestamp"))
            return [typed.alias(f.name), F.when(typed.isNull(), col).alias(f.name + TEXT)]
        if kind == "time":
            return [_time_or_text(col).alias(f.name)]
        if kind == "time_plain":
            return [_time_text(col).alias(f.name)]
        if kind == "text_or_bytes":
            return [col["member0"].alias(f.name), col["member1"].alias(f.name + BYTES)]
        if kind == "array":
            items = _branches(f.avro)[0]["fields"][2]["type"]["items"]
            return [
                _elements(col["elements"], items).alias(f.name),
                _shape(col).alias(f.name + SHAPE),
            ]
        if kind == "array_or_shaped":
            # Spark gives the union as struct<member0: the plain array, member1: the record>.
            items = _branches(f.avro)[0]["items"]
            shaped = col["member1"]
            elements = F.coalesce(col["member0"], shaped["elements"])
            return [_elements(elements, items).alias(f.name), _shape(shaped).alias(f.name + SHAPE)]
        return [col.alias(f.name)]

    def lake_columns(self, fields: tuple[RowField, ...]) -> list[str]:
        """Lake column names of the fields, in order (companions after their column)."""
        out: list[str] = []
        for f in fields:
            hook = self.by_pg_type.get(f.pg_type or "")
            if hook is not None:
                out += list(hook(F.col(f.name), f))
                continue
            kind = _kind(f)
            out.append(f.name)
            if kind in ("typed_or_text", "zoned"):
                out.append(f.name + TEXT)
            elif kind == "text_or_bytes":
                out.append(f.name + BYTES)
            elif kind in ("array", "array_or_shaped"):
                out.append(f.name + SHAPE)
        return out

    def companions(self, fields: tuple[RowField, ...]) -> dict[str, list[str]]:
        """Source column -> its companion lake columns (they follow it for unchanged TOAST)."""
        names = self.lake_columns(fields)
        return {
            f.name: [n for n in names if n != f.name and n.startswith(f.name + "__")]
            for f in fields
        }


DEFAULT_CONVERSIONS = FieldConversions()
