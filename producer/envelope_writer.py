"""Avro binary encoding of the value envelope, with the row records encoded by fastavro.

Hand-written on purpose (profiled): fastavro's schemaless_writer spends about half of an
envelope's encoding time on the parts that are the same for every event of a table or a
transaction (the 13-field ``source`` record, the transaction id, the union branches). Here
those parts are encoded once, and per event only the row (by fastavro), a few varints and the
``unchanged_toast`` strings are written. The layout is checked against the envelope schema
built by ``schemas.envelope`` when a writer is made, so a change there fails loudly instead
of producing bytes that no longer match the registered schema; unit tests compare the output
with fastavro's byte for byte.
"""

from __future__ import annotations

import io
from typing import Any, Final

import fastavro

from schemas.envelope import Schema
from schemas.wire import header

ENVELOPE_FIELDS: Final = (
    "before", "after", "source", "op", "ts_ms", "transaction", "unchanged_toast",
)  # fmt: skip
SOURCE_FIELDS: Final = (
    "version", "connector", "name", "ts_ms", "snapshot", "db", "sequence", "schema", "table",
    "txId", "lsn", "commit_lsn", "xmin",
)  # fmt: skip
TRANSACTION_FIELDS: Final = ("id", "total_order", "data_collection_order")

_NULL: Final = b"\x00"  # union branch 0 ("null")
_SECOND: Final = b"\x02"  # union branch 1, zig-zag encoded
_EMPTY_ARRAY: Final = b"\x00"


def _long_bytes(value: int) -> bytes:
    """Avro ``long``: zig-zag, then base-128 varint (little-endian groups)."""
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# Event positions and string lengths are mostly small: look them up instead of encoding.
_SMALL: Final = tuple(_long_bytes(i) for i in range(1 << 14))


def long_bytes(value: int) -> bytes:
    if 0 <= value < 16384:
        return _SMALL[value]
    return _long_bytes(value)


def string_bytes(text: str) -> bytes:
    data = text.encode()
    return long_bytes(len(data)) + data


def _field_names(record: Any) -> tuple[str, ...]:
    return tuple(f["name"] for f in record["fields"])


def _check_layout(envelope: Schema) -> Schema:
    """The row record schema, after checking the envelope is the one this writer encodes."""
    fields = {f["name"]: f for f in envelope["fields"]}
    if _field_names(envelope) != ENVELOPE_FIELDS:
        raise ValueError(f"unexpected envelope fields {_field_names(envelope)}")
    source = fields["source"]["type"]
    block = fields["transaction"]["type"]
    if _field_names(source) != SOURCE_FIELDS or not (
        isinstance(block, list)
        and block[0] == "null"
        and _field_names(block[1]) == TRANSACTION_FIELDS
    ):
        raise ValueError("unexpected source/transaction layout in the envelope schema")
    before = fields["before"]["type"]
    if not (isinstance(before, list) and before[0] == "null" and isinstance(before[1], dict)):
        raise ValueError("unexpected before/after union in the envelope schema")
    row: Schema = before[1]
    return row


class TableEnvelopeWriter:
    """Encodes one table's envelopes (Confluent header included) under a registered schema id."""

    __slots__ = ("_header", "_row", "_source_head", "_source_mid")

    def __init__(
        self, envelope: Schema, schema_id: int, *, version: str, prefix: str, db: str,
        schema: str, table: str,
    ) -> None:  # fmt: skip
        self._row = fastavro.parse_schema(_check_layout(envelope))
        self._header = header(schema_id)
        self._source_head = (
            string_bytes(version) + string_bytes("postgresql") + string_bytes(prefix)
        )
        # snapshot "false", db, sequence null, schema, table
        self._source_mid = (
            string_bytes("false")
            + string_bytes(db)
            + _NULL
            + string_bytes(schema)
            + string_bytes(table)
        )

    def _row_bytes(self, row: dict[str, Any] | None) -> bytes:
        if row is None:
            return _NULL
        buf = io.BytesIO()
        buf.write(_SECOND)
        fastavro.schemaless_writer(buf, self._row, row)
        return buf.getvalue()

    def encode(
        self,
        op: str,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        tx: TransactionBytes,
        lsn: int,
        ts_ms: int,
        total_order: int,
        data_collection_order: int,
        unchanged_toast: list[str],
    ) -> bytes:
        parts = [
            self._header,
            self._row_bytes(before),
            self._row_bytes(after),
            self._source_head,
            tx.ts_ms,
            self._source_mid,
            tx.tx_id,
            _SECOND + long_bytes(lsn),
            tx.commit_lsn,
            _NULL,  # xmin
            string_bytes(op),
            _SECOND + long_bytes(ts_ms),
            tx.block_head,
            long_bytes(total_order),
            long_bytes(data_collection_order),
        ]
        if unchanged_toast:
            parts.append(long_bytes(len(unchanged_toast)))
            parts.extend(string_bytes(name) for name in unchanged_toast)
        parts.append(_EMPTY_ARRAY)  # an array ends with a zero-length block
        return b"".join(parts)


class TransactionBytes:
    """The per-transaction parts of every envelope, encoded once per transaction."""

    __slots__ = ("block_head", "commit_lsn", "ts_ms", "tx_id")

    def __init__(self, xid: int, commit_lsn: int, commit_ts_ms: int, transaction_id: str) -> None:
        self.ts_ms = long_bytes(commit_ts_ms)
        self.tx_id = _SECOND + long_bytes(xid)
        self.commit_lsn = _SECOND + long_bytes(commit_lsn)
        self.block_head = _SECOND + string_bytes(transaction_id)
