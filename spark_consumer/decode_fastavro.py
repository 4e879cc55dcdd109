"""The alternative decoder: fastavro inside mapInArrow, producing the same `_env` column.

Kept for the decoder comparison (tests/bench/bench_consumer_decode.py) and selectable with
`--decoder fastavro`. The output type is the one Spark's from_avro derives for the same
schema, so both decoders feed identical downstream plans.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
from fastavro import parse_schema, schemaless_reader
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructField, StructType

from schemas.wire import HEADER_SIZE
from spark_consumer.decode import ENV, with_envelope_from_avro

# What a malformed body makes fastavro raise; anything else is a bug and propagates.
_DECODE_ERRORS = (
    EOFError,
    ValueError,
    IndexError,
    KeyError,
    UnicodeDecodeError,
    TypeError,
    StopIteration,
)


def _plain_uuid(schema: Any) -> Any:
    """Drop logicalType uuid: fastavro would return uuid.UUID, Spark wants the string."""
    if isinstance(schema, dict):
        out = {k: _plain_uuid(v) for k, v in schema.items()}
        if out.get("logicalType") == "uuid":
            out.pop("logicalType")
        return out
    if isinstance(schema, list):
        return [_plain_uuid(s) for s in schema]
    return schema


def with_envelope_fastavro(rows: DataFrame, schema_text: str) -> DataFrame:
    # The output type is taken from from_avro's analysis (no job runs for it).
    env_type = with_envelope_from_avro(rows.limit(0), schema_text).schema[ENV].dataType
    out_schema = StructType([*rows.schema.fields, StructField(ENV, env_type, True)])
    arrow_schema = to_arrow_schema(out_schema)
    value_index = rows.columns.index("value")
    parsed = parse_schema(_plain_uuid(json.loads(schema_text)))
    env_arrow = arrow_schema.field(ENV).type

    def decode(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            envs: list[Any] = []
            for raw in batch.column(value_index).to_pylist():
                try:
                    buf = io.BytesIO(raw)
                    buf.seek(HEADER_SIZE)
                    envs.append(schemaless_reader(buf, parsed, None))
                except _DECODE_ERRORS:
                    envs.append(None)
            cols = [*batch.columns, pa.array(envs, type=env_arrow)]
            yield pa.RecordBatch.from_arrays(cols, schema=arrow_schema)

    return rows.mapInArrow(decode, out_schema)
