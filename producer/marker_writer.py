"""Avro binary encoding of the BEGIN/END transaction markers and their keys.

Hand-written on purpose (profiled): every source transaction costs two markers, each a key and
a value, and a one-change transaction has three records in all. With fastavro's
``schemaless_writer`` the four marker encodings cost more than the row event itself. Here the
parts that are the same for the whole transaction (its id, commit timestamp and commit LSN)
come already encoded from the transaction's ``TransactionBytes``, and the data collection
names are encoded once per name. The layout is checked against ``schemas.envelope``'s marker
schemas when a writer is made, so a change there fails loudly; unit tests compare the output
with fastavro's byte for byte.
"""

from __future__ import annotations

from typing import Final

from producer.envelope_writer import TransactionBytes
from schemas.avro_binary import long_bytes, string_bytes
from schemas.envelope import Schema, transaction_key_schema, transaction_metadata_schema
from schemas.wire import header

KEY_FIELDS: Final = ("id",)
MARKER_FIELDS: Final = (
    "status", "id", "event_count", "data_collections", "ts_ms", "commit_lsn",
)  # fmt: skip
DATA_COLLECTION_FIELDS: Final = ("data_collection", "event_count")

_BEGIN: Final = string_bytes("BEGIN")
_END: Final = string_bytes("END")
_NULL: Final = b"\x00"  # union branch 0 ("null")
_SECOND: Final = b"\x02"  # union branch 1
_ARRAY_END: Final = b"\x00"  # an array ends with a zero-length block


def _names(record: Schema) -> tuple[str, ...]:
    return tuple(f["name"] for f in record["fields"])


def check_marker_layout(key: Schema, value: Schema) -> None:
    """Raise unless the marker schemas are the ones this writer encodes."""
    fields = {f["name"]: f["type"] for f in value["fields"]}
    collections = fields.get("data_collections")
    if (
        _names(key) != KEY_FIELDS
        or _names(value) != MARKER_FIELDS
        or fields["event_count"] != ["null", "long"]
        or not isinstance(collections, list)
        or collections[0] != "null"
        or _names(collections[1]["items"]) != DATA_COLLECTION_FIELDS
    ):
        raise ValueError("unexpected transaction marker layout in schemas.envelope")


class MarkerWriter:
    """Encodes the markers (Confluent headers included) under their registered schema ids."""

    __slots__ = ("_key_header", "_names", "_value_header")

    def __init__(self, key_schema_id: int, value_schema_id: int) -> None:
        check_marker_layout(transaction_key_schema(), transaction_metadata_schema())
        self._key_header = header(key_schema_id)
        self._value_header = header(value_schema_id)
        self._names: dict[str, bytes] = {}  # data collection -> its Avro string

    def key(self, tx: TransactionBytes) -> bytes:
        # block_head is the transaction block's union branch and then the id, as an Avro
        # string: the key record is that string alone.
        return self._key_header + tx.block_head[1:]

    def begin(self, tx: TransactionBytes) -> bytes:
        return b"".join(
            (
                self._value_header, _BEGIN, tx.block_head[1:], _NULL, _NULL, tx.ts_ms,
                tx.commit_lsn[1:],
            )
        )  # fmt: skip

    def end(self, tx: TransactionBytes, event_count: int, collections: dict[str, int]) -> bytes:
        """``collections``: data collection -> its event count, in first-event order."""
        names = self._names
        parts = [
            self._value_header, _END, tx.block_head[1:], _SECOND, long_bytes(event_count),
            _SECOND, long_bytes(len(collections)),
        ]  # fmt: skip
        for name, count in collections.items():
            encoded = names.get(name)
            if encoded is None:
                encoded = names[name] = string_bytes(name)
            parts.append(encoded)
            parts.append(long_bytes(count))
        if collections:
            parts.append(_ARRAY_END)
        parts.append(tx.ts_ms)
        parts.append(tx.commit_lsn[1:])
        return b"".join(parts)
