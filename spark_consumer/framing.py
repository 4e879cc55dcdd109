"""Spark column forms of the Confluent wire framing (`schemas.wire` holds the format): header
parsing stays in the JVM, so bodies never cross to Python.

Written as SQL over a column name, parsed in one Py4J call: the same expressions built from
Column functions took about 30 round trips each (codegen_stable.py says why that matters)."""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from schemas.wire import HEADER_SIZE, MAGIC_BYTE
from spark_consumer.codegen_stable import sql_name


def schema_id_col(column: str) -> Column:
    """The schema id of the binary `column`, or null when it is too short or its magic byte
    is wrong."""
    v = sql_name(column)
    magic = f"CAST(conv(hex(substring({v}, 1, 1)), 16, 10) AS INT)"
    return F.expr(
        f"CASE WHEN length({v}) >= {HEADER_SIZE} AND {magic} = {MAGIC_BYTE} "
        f"THEN CAST(conv(hex(substring({v}, 2, 4)), 16, 10) AS BIGINT) END"
    )


def body_col(column: str) -> Column:
    # substring on binary counts bytes; the length just has to cover any Kafka value.
    return F.expr(f"substring({sql_name(column)}, {HEADER_SIZE + 1}, {2**31 - 1})")
