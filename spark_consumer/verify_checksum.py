"""The checksums `verify` compares before it reads any row: one canonical text per row, the same
on both sides, hashed into buckets by key. Pure functions and SQL composables; no I/O.

Row text. Each column becomes a field: `N` for NULL, else `<length>:<text>` (length in
characters: PostgreSQL's `length()` on text in a UTF-8 database, Python's `len`). Fields are
concatenated without separators; the length prefix makes the text unambiguous whatever the
values contain. The column texts are `verify_forms`' texts, except where `verify_forms`
compares something other than text:
- float4/float8: the IEEE bits in hex (`float8send` / `struct.pack`), with every NaN as `NaN`
  and both zeros as `0`, so the checksum agrees with the row diff's float equality;
- arrays: the dimensions, `|`, then each element as a field (the element texts the row diff
  compares, without going through two different JSON printers).
The key text is the same concatenation over the key columns; a table without a key uses the
whole row as its key, so duplicate rows land in one bucket and count there (a multiset).

Buckets. bucket = the first `bits` bits of md5(key text); per bucket, the row count and the sum
of the first 60 bits of md5(row text), as an exact integer (numeric in PostgreSQL, a Python int
on the executors). PostgreSQL computes its side in one GROUP BY; Spark computes the lake side
from the Python `lake_text` on the executors. A missing, extra or changed row changes its
bucket's count or sum (two differences cancelling in one sum has probability ~2^-60).
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Sequence
from typing import Any

from psycopg import sql

from spark_consumer import verify_forms as forms
from spark_consumer.verify_forms import FLOATS, ColumnInfo

NULL = "N"
HASH_BITS = 60  # 15 hex digits: a bigint in PostgreSQL, summed as numeric
MIN_BITS = 4  # at least 16 buckets
MAX_BITS = 16  # at most 65,536 buckets: the driver holds two small tuples per bucket
ROWS_PER_BUCKET = 1000  # the bucket count aims at this many rows per bucket (drill cost)


def bucket_bits(estimated_rows: float) -> int:
    """Bits of the bucket number for a table of about `estimated_rows` rows: ~1000 rows per
    bucket, between 16 and 65,536 buckets (beyond that, buckets grow instead: the drill reads
    a few buckets, the aggregate stays small)."""
    if estimated_rows <= ROWS_PER_BUCKET << MIN_BITS:
        return MIN_BITS
    return max(MIN_BITS, min(MAX_BITS, math.ceil(math.log2(estimated_rows / ROWS_PER_BUCKET))))


def field(text: str | None) -> str:
    return NULL if text is None else f"{len(text)}:{text}"


def record(texts: Sequence[str | None]) -> str:
    return "".join(field(t) for t in texts)


def _md5(text: str) -> str:
    return hashlib.md5(text.encode("utf-8"), usedforsecurity=False).hexdigest()


def bucket_of(key_text: str, bits: int) -> int:
    return int(_md5(key_text)[:8], 16) >> (32 - bits)


def row_hash(row_text: str) -> int:
    return int(_md5(row_text)[: HASH_BITS // 4], 16)


def float_text(base: str, v: Any) -> str | None:
    if v is None:
        return None
    f = float(v)
    if math.isnan(f):
        return "NaN"
    if f == 0:
        return "0"
    return struct.pack(">f" if base == "float4" else ">d", f).hex()


def lake_field_text(col: ColumnInfo, row: dict[str, Any]) -> str | None:
    """The lake value of `col` as its checksum text (the same text `pg_field_sql` gives)."""
    if col.base in FLOATS:
        return float_text(col.base, row.get(col.lake))
    if col.element is not None:
        v = row.get(col.lake)
        if v is None:
            return None
        elements = [forms.render_scalar(col.element, e) for e in v]
        dims = forms.array_dims(row.get(col.lake + forms.SHAPE), len(elements))
        return dims + "|" + record(elements)
    text = forms.lake_text(col, row)
    return None if text is None else str(text)


def lake_texts(cols: Sequence[ColumnInfo], row: dict[str, Any]) -> list[str | None]:
    return [lake_field_text(c, row) for c in cols]


def bucket_and_hash(
    texts: Sequence[str | None], key_index: Sequence[int], bits: int
) -> tuple[int, int]:
    """(bucket, row hash) of one row from its field texts; `key_index` = the key columns'
    positions (empty: the whole row is the key)."""
    row_text = record(texts)
    key_text = record([texts[i] for i in key_index]) if key_index else row_text
    return bucket_of(key_text, bits), row_hash(row_text)


# PostgreSQL's side. The field texts are computed once per row in a LATERAL subquery as
# columns f0..fn (synthetic names: no user identifier is spliced anywhere but via Identifier).


def pg_field_sql(col: ColumnInfo) -> sql.Composable:
    c = sql.Identifier(col.name)
    if col.base in FLOATS:
        send = sql.SQL("float4send" if col.base == "float4" else "float8send")
        return sql.SQL(
            "CASE WHEN {0} IS NULL THEN NULL WHEN {0} = 'NaN' THEN 'NaN' WHEN {0} = 0 THEN '0' "
            "ELSE encode({1}({0}), 'hex') END"
        ).format(c, send)
    if col.element is not None:
        return sql.SQL(
            "CASE WHEN {0} IS NULL THEN NULL ELSE coalesce(array_dims({0}), '') || '|' || "
            "(SELECT coalesce(string_agg(coalesce(length({1})::text || ':' || {1}, "
            "'N'), '' ORDER BY n), '') FROM unnest({0}) WITH ORDINALITY AS u(x, n)) END"
        ).format(c, forms.pg_text(sql.Identifier("x"), col.element))
    return forms.pg_expression(col)


def _alias(i: int) -> sql.Identifier:
    return sql.Identifier(f"f{i}")


def pg_fields(cols: Sequence[ColumnInfo]) -> sql.Composable:
    """`(SELECT <field text> AS f0, ...) AS fields`, evaluated per row of the table (the only
    FROM item the column names can refer to); the record expressions name `fields.fN`, so no
    table column can shadow them."""
    return sql.SQL("(SELECT {}) AS fields").format(
        sql.SQL(", ").join(
            sql.SQL("{} AS {}").format(pg_field_sql(c), _alias(i)) for i, c in enumerate(cols)
        )
    )


def _pg_record(indexes: Sequence[int]) -> sql.Composable:
    return sql.SQL(" || ").join(
        sql.SQL("coalesce(length(fields.{0})::text || ':' || fields.{0}, 'N')").format(_alias(i))
        for i in indexes
    )


def pg_bucket_sql(n_cols: int, key_index: Sequence[int], bits: int) -> sql.Composable:
    key = _pg_record(key_index or range(n_cols))
    return sql.SQL("(('x' || substr(md5({}), 1, 8))::bit(32)::bigint >> {})").format(
        key, sql.Literal(32 - bits)
    )


def pg_hash_sql(n_cols: int) -> sql.Composable:
    return sql.SQL("('x' || substr(md5({}), 1, {}))::bit({})::bigint").format(
        _pg_record(range(n_cols)), sql.Literal(HASH_BITS // 4), sql.Literal(HASH_BITS)
    )


def pg_aggregate_sql(
    table: tuple[str, str], cols: Sequence[ColumnInfo], key_index: Sequence[int], bits: int
) -> sql.Composed:
    """One row per non-empty bucket: (bucket, row count, sum of row hashes)."""
    return sql.SQL(
        "SELECT b, count(*), sum(h::numeric) FROM "
        "(SELECT {} AS b, {} AS h FROM {}.{} AS t, LATERAL {}) AS x GROUP BY b"
    ).format(
        pg_bucket_sql(len(cols), key_index, bits),
        pg_hash_sql(len(cols)),
        sql.Identifier(table[0]),
        sql.Identifier(table[1]),
        pg_fields(cols),
    )


def pg_drill_sql(
    table: tuple[str, str], cols: Sequence[ColumnInfo], key_index: Sequence[int], bits: int
) -> sql.Composed:
    """The rows of some buckets (parameter: an array of bucket numbers), in the row diff's
    forms (`verify_forms.pg_expression`)."""
    return sql.SQL("SELECT {} FROM {}.{} AS t WHERE (SELECT {} FROM {}) = ANY(%s)").format(
        sql.SQL(", ").join(forms.pg_expression(c) for c in cols),
        sql.Identifier(table[0]),
        sql.Identifier(table[1]),
        pg_bucket_sql(len(cols), key_index, bits),
        pg_fields(cols),
    )


Sums = dict[int, tuple[int, int]]  # bucket -> (rows, sum of row hashes)


def add_sums(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return a[0] + b[0], a[1] + b[1]


def differing_buckets(pg: Sums, lake: Sums) -> list[int]:
    return sorted(b for b in pg.keys() | lake.keys() if pg.get(b) != lake.get(b))


def drill_batches(
    buckets: Sequence[int], pg: Sums, lake: Sums, batch_rows: int
) -> tuple[list[list[int]], list[int]]:
    """Group differing buckets into batches of at most `batch_rows` rows on either side (by
    the aggregates' counts). A bucket larger than `batch_rows` on its own is not drilled (its
    rows would not fit): it comes back in the second list, for the report."""
    batches: list[list[int]] = []
    too_large: list[int] = []
    current: list[int] = []
    size = 0
    for b in buckets:
        n = max(pg.get(b, (0, 0))[0], lake.get(b, (0, 0))[0])
        if n > batch_rows:
            too_large.append(b)
            continue
        if current and size + n > batch_rows:
            batches.append(current)
            current, size = [], 0
        current.append(b)
        size += n
    if current:
        batches.append(current)
    return batches, too_large
