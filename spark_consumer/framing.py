"""Spark column forms of the Confluent wire framing (`schemas.wire` holds the format): header
parsing stays in the JVM, so bodies never cross to Python."""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from schemas.wire import HEADER_SIZE, MAGIC_BYTE


def magic_col(value: Column) -> Column:
    return F.conv(F.hex(F.substring(value, 1, 1)), 16, 10).cast("int")


def schema_id_col(value: Column) -> Column:
    """The schema id, or null when the value is too short or the magic byte is wrong."""
    framed = (F.length(value) >= HEADER_SIZE) & (magic_col(value) == MAGIC_BYTE)
    return F.when(framed, F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("long"))


def body_col(value: Column) -> Column:
    # substring on binary counts bytes; the length just has to cover any Kafka value.
    return F.substring(value, HEADER_SIZE + 1, 2**31 - 1)
