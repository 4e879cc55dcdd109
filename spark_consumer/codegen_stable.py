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

Each expression is written as SQL over a column name and parsed by the JVM in one call: built
from PySpark's Column functions, each took about 25 Py4J round trips (every `F.*` call looks up
the function by reflection first), and a batch builds a few dozen of them. The SQL holds only
a quoted column name and numbers formatted here, never text from outside.
"""

from __future__ import annotations

from decimal import Decimal

from pyspark.sql import Column
from pyspark.sql import functions as F

_DECIMAL = "DECIMAL(20,0)"  # holds every long
_MICROS = "DECIMAL(38,6)"


def sql_name(column: str) -> str:
    """A column name as a SQL identifier (backquoted, backquotes doubled)."""
    return "`" + column.replace("`", "``") + "`"


def _boxed(sql: str) -> str:
    return f"named_struct('v', {sql})"


def _compare(column: str, op: str, value: int) -> Column:
    c = sql_name(column)
    bound = _boxed(f"CAST({int(value)} AS BIGINT)")
    return F.expr(f"CASE WHEN {c} IS NOT NULL THEN {_boxed(c)} {op} {bound} END")


def greater(column: str, value: int) -> Column:
    """`column > value`, null when the column is null (as the plain comparison)."""
    return _compare(column, ">", value)


def at_most(column: str, value: int) -> Column:
    """`column <= value`, null when the column is null."""
    return _compare(column, "<=", value)


def or_value(column: str, value: int) -> Column:
    """`coalesce(column, value)` for a long column."""
    c = sql_name(column)
    return F.expr(
        f"CAST(coalesce(CAST({c} AS {_DECIMAL}), CAST({int(value)} AS {_DECIMAL})) AS BIGINT)"
    )


def long_value_sql(value: int | None, zero: str) -> str:
    """`value` as a long, where the column `zero` holds 0 (a one-row range's `id`): a literal
    alone is folded into the code, `zero + decimal literal` is not."""
    if value is None:
        return "CAST(NULL AS BIGINT)"
    z = sql_name(zero)
    return f"CAST(CAST({z} AS {_DECIMAL}) + CAST({int(value)} AS {_DECIMAL}) AS BIGINT)"


def double_value_sql(value: float | None, zero: str) -> str:
    """`value` (to the microsecond) as a double, as `long_value_sql`."""
    if value is None:
        return "CAST(NULL AS DOUBLE)"
    exact = Decimal(value).quantize(Decimal("0.000001"))
    z = sql_name(zero)
    return f"CAST(CAST({z} AS {_MICROS}) + CAST('{exact:f}' AS {_MICROS}) AS DOUBLE)"
