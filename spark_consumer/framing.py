"""Confluent wire format: magic byte 0, 4-byte big-endian schema id, then the Avro body."""

from __future__ import annotations

import struct

from pyspark.sql import Column
from pyspark.sql import functions as F

MAGIC = 0
HEADER_SIZE = 5
_HEADER = struct.Struct(">bI")


class FramingError(ValueError):
    pass


def split_frame(data: bytes) -> tuple[int, memoryview]:
    """Schema id and Avro body of one framed value (used by the fastavro path and tests)."""
    if len(data) < HEADER_SIZE:
        raise FramingError(f"framed value of {len(data)} bytes is shorter than the 5-byte header")
    magic, schema_id = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise FramingError(f"magic byte {magic} is not {MAGIC}")
    return schema_id, memoryview(data)[HEADER_SIZE:]


# Spark column forms of the same: header parsing stays in the JVM so bodies never cross to Python.
def magic_col(value: Column) -> Column:
    return F.conv(F.hex(F.substring(value, 1, 1)), 16, 10).cast("int")


def schema_id_col(value: Column) -> Column:
    """The schema id, or null when the value is too short or the magic byte is wrong."""
    framed = (F.length(value) >= HEADER_SIZE) & (magic_col(value) == MAGIC)
    return F.when(framed, F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("long"))


def body_col(value: Column) -> Column:
    # substring on binary counts bytes; the length just has to cover any Kafka value.
    return F.substring(value, HEADER_SIZE + 1, 2**31 - 1)
