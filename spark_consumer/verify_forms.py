"""How `verify` compares one column exactly: PostgreSQL's own text on one side, the lake value
rendered to that text on the other. Pure functions; no I/O.

PostgreSQL is queried with `DateStyle=ISO`, `TimeZone=UTC`, `extra_float_digits=1`, so its text
is canonical. Per column the SQL expression (`pg_expression`) is the column cast to text,
except where the text is not a function of the lake value alone:
- float4/float8 compare as IEEE values (PostgreSQL and Python print them differently);
- interval compares as "months,days,micros" (the lake keeps those three fields);
- arrays compare as "<array_dims>|<JSON list of element texts>" (row-major, lower bounds kept).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from psycopg import sql

from spark_consumer.conversions import BYTES, SHAPE, TEXT


@dataclass(frozen=True)
class ColumnInfo:
    """A PostgreSQL column as the catalog describes it (domains resolved to their base)."""

    name: str  # PostgreSQL's name
    lake: str  # the lake column (the Avro field name: sanitized)
    base: str  # base type name, e.g. "numeric", "timestamptz", "int4"
    element: str | None = None  # element base type name of an array


FLOATS = ("float4", "float8")

# PostgreSQL 17+'s infinite intervals are kept in the lake as the server stores them: every
# field at its largest or smallest value (schemas.pg_datetime.INTERVAL_INFINITY).
_INTERVAL_SQL = (
    "CASE WHEN {c} IS NULL THEN NULL WHEN isfinite({c}) THEN "
    "(extract(year from {c})*12 + extract(month from {c}))::bigint || ',' || "
    "extract(day from {c})::bigint || ',' || "
    "((extract(hour from {c})*3600 + extract(minute from {c})*60)*1000000"
    " + extract(microseconds from {c}))::bigint "
    "WHEN {c} > interval '0' THEN '2147483647,2147483647,9223372036854775807' "
    "ELSE '-2147483648,-2147483648,-9223372036854775808' END"
)


def pg_expression(col: ColumnInfo) -> sql.Composable:
    c = sql.Identifier(col.name)
    if col.base in FLOATS:
        return c
    if col.base == "interval":
        return sql.SQL(_INTERVAL_SQL.replace("{c}", "{0}")).format(c)
    if col.element is not None:
        return sql.SQL(
            "CASE WHEN {0} IS NULL THEN NULL ELSE coalesce(array_dims({0}), '') || '|' || "
            "(SELECT coalesce(json_agg({1} ORDER BY n), '[]') "
            "FROM unnest({0}) WITH ORDINALITY AS u(x, n))::text END"
        ).format(c, pg_text(sql.Identifier("x"), col.element))
    return pg_text(c, col.base)


def pg_text(value: sql.Composable, base: str) -> sql.Composable:
    """The value's text as the stream carries it. A cast to text drops the blanks that pad a
    char(n) value, but pgoutput sends the type's output, padded, and so the lake holds it:
    concat() renders with the output function (and gives '' for NULL, hence the CASE)."""
    if base == "bpchar":
        return sql.SQL("CASE WHEN {0} IS NULL THEN NULL ELSE concat({0}) END").format(value)
    return sql.SQL("{0}::text").format(value)


def _fraction(micros: int) -> str:
    return f".{micros:06d}".rstrip("0") if micros else ""


def _timestamp(v: datetime) -> str:
    return (
        f"{v.year:04d}-{v.month:02d}-{v.day:02d} {v.hour:02d}:{v.minute:02d}:{v.second:02d}"
        + _fraction(v.microsecond)
    )


def render_scalar(base: str, v: Any) -> str | None:
    """PostgreSQL's text of a lake value of a column of base type `base`."""
    if v is None:
        return None
    if hasattr(v, "asDict"):  # a struct comes back from Spark as a Row
        v = v.asDict()
    if base == "bool":
        return "true" if v else "false"  # bool::text, unlike bool's output function
    if isinstance(v, Decimal):
        return format(v, "f")
    if base == "date" and isinstance(v, date):
        return f"{v.year:04d}-{v.month:02d}-{v.day:02d}"
    if base == "timestamp" and isinstance(v, datetime):
        return _timestamp(v)
    if base == "timestamptz" and isinstance(v, datetime):
        # PySpark hands TIMESTAMP values over as naive local times of this process.
        return _timestamp(v.astimezone(UTC)) + "+00"
    if base == "timestamptz" and isinstance(v, str) and v.endswith("Z") and "T" in v:
        return v.replace("T", " ")[:-1] + "+00"  # an array element in the zoned-string form
    if base == "time" and isinstance(v, str):
        whole, _, frac = v.partition(".")
        return whole + ("." + frac.rstrip("0") if frac.rstrip("0") else "")
    if base == "bytea" and isinstance(v, bytes | bytearray):
        return "\\x" + bytes(v).hex()
    if isinstance(v, dict) and base == "interval":
        return f"{v['months']},{v['days']},{v['micros']}"
    if isinstance(v, dict) and set(v) == {"member0", "member1"}:  # an element kept as a union
        return render_scalar(base, v["member0"]) if v["member0"] is not None else v["member1"]
    return str(v)


def array_dims(shape: Any, n: int) -> str:
    if shape is None:
        return f"[1:{n}]" if n else ""
    return "".join(
        f"[{lb}:{lb + d - 1}]" for d, lb in zip(shape["dims"], shape["lower_bounds"], strict=True)
    )


def lake_text(col: ColumnInfo, row: dict[str, Any]) -> Any:
    """The lake side of the comparison, from the lake row (with its companion columns)."""
    v = row.get(col.lake)
    if col.base in FLOATS:
        return _float(col.base, v)
    if col.element is not None:
        if v is None:
            return None
        elements = [render_scalar(col.element, e) for e in v]
        return array_dims(row.get(col.lake + SHAPE), len(elements)) + "|" + json.dumps(elements)
    if v is None:
        special = row.get(col.lake + TEXT)
        if special is not None:
            return special
        raw = row.get(col.lake + BYTES)
        return None if raw is None else "\\x" + bytes(raw).hex()
    return render_scalar(col.base, v)


def _float(base: str, v: Any) -> Any:
    if v is None:
        return None
    f = float(v)
    if math.isnan(f):
        return "NaN"  # NaN != NaN: compare a marker instead
    if base == "float4":
        return struct.unpack("f", struct.pack("f", f))[0]
    return f


def pg_value(col: ColumnInfo, v: Any) -> Any:
    """PostgreSQL's side: text, except floats (IEEE values) and arrays (normalized JSON)."""
    if col.base in FLOATS:
        return _float(col.base, v)
    if col.element is not None and isinstance(v, str):
        dims, _, elements = v.partition("|")
        return dims + "|" + json.dumps(json.loads(elements))
    return v
