"""Confluent wire framing: magic byte 0, 4-byte big-endian schema id, schemaless Avro body.

Framed here rather than with confluent-kafka's AvroSerializer: the serializer resolves the
subject and its schema on every call (and runs its rule/transform machinery), while ids are
already known per Relation from ``schemas.registry``; one parsed schema and a fixed 5-byte
header per (schema, id) keep the per-event cost at fastavro's encoding alone.
"""

from __future__ import annotations

import io
import struct
from typing import Any, Final

import fastavro

MAGIC_BYTE: Final = 0
_HEADER: Final = struct.Struct(">bI")
HEADER_SIZE: Final = _HEADER.size  # 5


class FramingError(ValueError):
    """A value that is not Confluent-framed: too short, or a magic byte other than 0."""


def header(schema_id: int) -> bytes:
    return _HEADER.pack(MAGIC_BYTE, schema_id)


def split_frame(message: bytes) -> tuple[int, memoryview]:
    """(schema id, Avro body) of a Confluent-framed message; the body is not copied."""
    if len(message) < HEADER_SIZE:
        raise FramingError(
            f"framed value of {len(message)} bytes is shorter than the {HEADER_SIZE}-byte header"
        )
    magic, schema_id = _HEADER.unpack_from(message)
    if magic != MAGIC_BYTE:
        raise FramingError(f"magic byte {magic} is not {MAGIC_BYTE}")
    return schema_id, memoryview(message)[HEADER_SIZE:]


class AvroEncoder:
    """Encodes records of one schema, already registered under ``schema_id``."""

    __slots__ = ("_header", "_parsed", "_write", "schema_id")

    def __init__(self, schema: dict[str, Any] | str, schema_id: int) -> None:
        self._parsed = fastavro.parse_schema(schema)
        self._header = header(schema_id)
        self._write = fastavro.schemaless_writer
        self.schema_id = schema_id

    def encode(self, record: Any) -> bytes:
        buf = io.BytesIO()
        buf.write(self._header)
        self._write(buf, self._parsed, record)
        return buf.getvalue()


class AvroDecoder:
    """Decodes Confluent-framed records of one known schema (tests, tools)."""

    def __init__(self, schema: dict[str, Any] | str) -> None:
        self._parsed = fastavro.parse_schema(schema)

    def decode(self, message: bytes) -> Any:
        _schema_id, body = split_frame(message)
        return fastavro.schemaless_reader(io.BytesIO(body), self._parsed, None)
