"""Columns the lake tables config leaves out (`columns` / `except_columns`, lake_options.py)
never reach the pending table either.

The pending table (pending.py) keeps the raw Kafka records of transactions not yet applied,
so their bodies hold every column the producer sent. For a table with left-out columns, each
such record's value is decoded with its writer schema, every left-out field of its `before`
and `after` rows is replaced by null (or, where the writer schema does not allow null, by a
zero of its type that any Avro reader decodes), and the record is encoded again with the same
schema and header. What the batch later reads back decodes as before, with those fields
empty; the apply drops them before any write anyway (lake_layouts.Layout.narrow).

Written by hand with fastavro, in `mapInArrow`: Spark's `to_avro` would have to rebuild the
exact writer schema (enums, fixed, logical types) from a Catalyst struct, while fastavro
writes the schema it read with. Only records of tables with left-out columns pay for it; the
pending table holds the batch's unfinished transactions, not the whole batch.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from schemas.wire import HEADER_SIZE, split_frame
from spark_consumer.lake_options import TableOptions

_ROW_SIDES = ("before", "after")
_UUID_ZERO = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class Redaction:
    """One writer schema's fields to empty: the parsed schema and, per row field left out,
    the value that replaces it."""

    schema: Any  # fastavro's parsed schema
    empties: Mapping[str, Any]


def zero(avro_type: Any, named: Mapping[str, Any]) -> Any:
    """A value of the (parsed) Avro type: null where the type allows it, else the type's zero,
    one every reader decodes (a uuid string that parses, a decimal of no bytes is 0).
    `named`: the schema's named types by full name (a later use of one is its name)."""
    if isinstance(avro_type, list):
        return None if "null" in avro_type else zero(avro_type[0], named)
    if isinstance(avro_type, str):
        if avro_type in _PRIMITIVE_ZEROS:
            return _PRIMITIVE_ZEROS[avro_type]
        return zero(named[avro_type], named)
    kind = avro_type["type"]
    if avro_type.get("logicalType") == "uuid":
        return _UUID_ZERO
    if kind == "record":
        return {f["name"]: zero(f["type"], named) for f in avro_type["fields"]}
    if kind == "enum":
        return avro_type["symbols"][0]
    if kind == "array":
        return []
    if kind == "map":
        return {}
    if kind == "fixed":
        return b"\0" * avro_type["size"]
    return zero(kind, named)


_PRIMITIVE_ZEROS: dict[str, Any] = {
    "null": None,
    "boolean": False,
    "int": 0,
    "long": 0,
    "float": 0.0,
    "double": 0.0,
    "bytes": b"",
    "string": "",
}


def _row_record(envelope: Any) -> Any:
    """The row record of an envelope schema (`before`/`after` are unions of null and it)."""
    for field in envelope["fields"]:
        if field["name"] in _ROW_SIDES:
            for branch in field["type"]:
                if isinstance(branch, dict) and branch.get("type") == "record":
                    return branch
    return None


def redaction(schema_json: Any, opts: TableOptions) -> Redaction | None:
    """What to empty in the values of one writer schema; None when it keeps every field."""
    named: dict[str, Any] = {}
    schema = parse_schema(schema_json, named_schemas=named)
    row = _row_record(schema)
    if row is None:
        return None
    empties = {
        f["name"]: zero(f["type"], named) for f in row["fields"] if not opts.keeps(f["name"])
    }
    return Redaction(schema, empties) if empties else None


def redact(value: bytes, redactions: Mapping[int, Redaction], where: str = "") -> bytes:
    """The value with its schema's left-out fields emptied (unchanged when none are).
    `where` names the record in an error (its topic, partition and offset)."""
    schema_id, body = split_frame(value)
    r = redactions.get(schema_id)
    if r is None:
        return value
    # Only records that decoded (the batch's usable ones) wait, so this read succeeds; if it
    # ever does not, the batch stops here naming the record rather than keeping its values.
    try:
        record = schemaless_reader(io.BytesIO(body), r.schema, None)
    except (EOFError, ValueError, IndexError, KeyError, TypeError) as exc:
        raise ValueError(
            f"record {where} (writer schema {schema_id}) cannot be re-encoded without its "
            f"left-out columns: {exc!r}"
        ) from exc
    if not isinstance(record, dict):
        raise ValueError(f"record {where} (writer schema {schema_id}) is not an envelope")
    for side in _ROW_SIDES:
        row = record.get(side)
        if row is not None:
            row.update(r.empties)
    out = io.BytesIO()
    out.write(value[:HEADER_SIZE])
    schemaless_writer(out, r.schema, record)
    return out.getvalue()


def redacted(rows: DataFrame, by_topic: Mapping[str, Mapping[int, Redaction]]) -> DataFrame:
    """`rows` (pending.RAW_SCHEMA) with the values of the given topics redacted."""
    if not by_topic:
        return rows
    topics = list(by_topic)
    mine = F.col("topic").isin(topics)
    schema = rows.schema

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            topic = batch.column("topic").to_pylist()
            partition = batch.column("partition").to_pylist()
            offset = batch.column("offset").to_pylist()
            value = batch.column("value").to_pylist()
            out = [
                v if v is None else redact(v, by_topic[t], f"{t}[{p}]@{o}")
                for t, p, o, v in zip(topic, partition, offset, value, strict=True)
            ]
            i = batch.schema.get_field_index("value")
            yield batch.set_column(i, batch.schema.field(i), pa.array(out, pa.binary()))

    return rows.filter(~mine).unionByName(rows.filter(mine).mapInArrow(run, schema))
