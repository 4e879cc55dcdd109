"""This batch's numbers (LSN bounds, the clock) in Spark expressions, kept out of generated code.

Spark writes an integer literal into the Java source it generates for a query, and it caches
compiled classes by their source. A filter on this batch's watermark therefore made every batch
generate and compile its hot stages again, and the JVM's JIT compile their loops again. Over six
consecutive 500k-change batches into one lake on a warm JVM, batches 2-6 each compiled 13
classes, used 5-7 s of JIT compiler CPU and took 10-12 s; with the values below, 4 classes (two
one-row queries), 3-6 s, and 8-10 s.

Struct and decimal literals reach the generated code by reference instead, so the code stays the
same from batch to batch. The optimizer folds neither back into an integer literal: it does
unwrap `cast(long column as decimal) > decimal literal` into a long comparison, which is why
comparisons use one-field structs. tests/integration/test_consumer_codegen.py pins both down.
"""

from __future__ import annotations

from decimal import Decimal

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import DecimalType

_FIELD = "v"
_DECIMAL = DecimalType(20, 0)  # holds every long
_MICROS = DecimalType(38, 6)


def _boxed(value: Column) -> Column:
    return F.struct(value.alias(_FIELD))


def greater(column: Column, value: int) -> Column:
    """`column > value`, null when the column is null (as the plain comparison)."""
    return F.when(column.isNotNull(), _boxed(column) > _boxed(F.lit(value).cast("long")))


def at_most(column: Column, value: int) -> Column:
    """`column <= value`, null when the column is null."""
    return F.when(column.isNotNull(), _boxed(column) <= _boxed(F.lit(value).cast("long")))


def or_value(column: Column, value: int) -> Column:
    """`coalesce(column, value)` for a long column."""
    return F.coalesce(column.cast(_DECIMAL), F.lit(Decimal(value)).cast(_DECIMAL)).cast("long")


def long_value(value: int | None, zero: Column) -> Column:
    """`value` as a long, where `zero` is a column that holds 0 (a one-row range's `id`): a
    literal alone is folded into the code, `zero + decimal literal` is not."""
    if value is None:
        return F.lit(None).cast("long")
    return (zero.cast(_DECIMAL) + F.lit(Decimal(value)).cast(_DECIMAL)).cast("long")


def double_value(value: float | None, zero: Column) -> Column:
    """`value` (to the microsecond) as a double, as `long_value`."""
    if value is None:
        return F.lit(None).cast("double")
    exact = Decimal(value).quantize(Decimal("0.000001"))
    return (zero.cast(_MICROS) + F.lit(exact).cast(_MICROS)).cast("double")
