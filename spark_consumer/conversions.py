"""Per-field Avro -> Spark conversion hooks, applied after decoding.

Spark's Avro reader already maps the primitive and logical types (long, int, string, boolean,
double, bytes, decimal, timestamp-micros, local-timestamp-micros, date, uuid) and nullable
unions. Columns whose lossless form is a union or record (settled later with `schemas/`) get a
hook here, keyed by the field's `pg.type`, turning the decoded struct into the lake's type.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pyspark.sql import Column

from spark_consumer.envelope import RowField

FieldHook = Callable[[Column, RowField], Column]


@dataclass(frozen=True)
class FieldConversions:
    by_pg_type: Mapping[str, FieldHook] = field(default_factory=dict)

    def apply(self, col: Column, f: RowField) -> Column:
        hook = self.by_pg_type.get(f.pg_type or "")
        return (hook(col, f) if hook else col).alias(f.name)


DEFAULT_CONVERSIONS = FieldConversions()
