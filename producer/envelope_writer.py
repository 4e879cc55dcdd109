"""Avro binary encoding of the value envelope around pre-encoded row records.

Hand-written on purpose (profiled): fastavro's schemaless_writer spends about half of an
envelope's encoding time on the parts that are the same for every event of a table or a
transaction (the 13-field ``source`` record, the transaction id, the union branches). Here
those parts are encoded once per table and transaction, the rows come already encoded by the
table's compiled row encoder (``RelationCodec.encode_row``), and per event only a few varints
and the ``unchanged_toast`` strings are written. The layout is checked against the envelope
schema built by ``schemas.envelope`` when a writer is made, so a change there fails loudly
instead of producing bytes that no longer match the registered schema; unit tests compare
the output with fastavro's byte for byte.
"""

from __future__ import annotations

from typing import Any, Final

from schemas.avro_binary import SMALL_LONGS as _SMALL
from schemas.avro_binary import VARINT_LAST as _LAST
from schemas.avro_binary import VARINT_MID as _MID
from schemas.avro_binary import long_bytes, string_bytes
from schemas.envelope import Schema
from schemas.wire import header

__all__ = ["TableEnvelopeWriter", "TransactionBytes", "long_bytes", "string_bytes"]

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

    __slots__ = (
        "_header", "_images", "_mid", "_ops", "_source_head", "_source_mid", "_ts", "_ts_ms", "_tx"
    )  # fmt: skip

    def __init__(
        self, envelope: Schema, schema_id: int, *, version: str, prefix: str, db: str,
        schema: str, table: str, snapshot: str = "false",
    ) -> None:  # fmt: skip
        _check_layout(envelope)
        self._header = header(schema_id)
        self._source_head = (
            string_bytes(version) + string_bytes("postgresql") + string_bytes(prefix)
        )
        # snapshot ("false" when streaming; "true", "last" for snapshot reads), db, sequence
        # null, schema, table
        self._source_mid = (
            string_bytes(snapshot)
            + string_bytes(db)
            + _NULL
            + string_bytes(schema)
            + string_bytes(table)
        )
        self._tx: TransactionBytes | None = None
        self._mid = b""  # source fields up to txId, for self._tx
        self._ops: dict[str, bytes] = {}  # op -> commit_lsn, xmin, op (for self._tx)
        self._ts_ms: int | None = None  # the last ts_ms, and its encoding in self._ts
        self._ts = b""
        # op -> encode_image's pieces for self._tx and self._ts_ms (cleared when either changes)
        self._images: dict[str, tuple[bytes, bytes, bytes]] = {}

    def _enter(self, tx: TransactionBytes) -> None:
        self._tx = tx
        self._mid = self._source_head + tx.ts_ms + self._source_mid + tx.tx_id
        self._ops = {}
        self._images = {}

    def _sync(self, tx: TransactionBytes, ts_ms: int) -> None:
        """Caches for a new transaction or millisecond (many events in a row share both)."""
        if tx is not self._tx:
            self._enter(tx)
        if ts_ms != self._ts_ms:
            self._ts_ms = ts_ms
            self._ts = _SECOND + long_bytes(ts_ms)
            self._images = {}

    def encode(
        self,
        op: str,
        before: bytes | None,
        after: bytes | None,
        tx: TransactionBytes,
        lsn: int,
        ts_ms: int,
        total_order: int,
        data_collection_order: int,
        unchanged_toast: list[str],
    ) -> bytes:
        """``before``/``after``: row record bodies (``RelationCodec.encode_row``) or None."""
        if tx is not self._tx or ts_ms != self._ts_ms:
            self._sync(tx, ts_ms)
        tail = self._ops.get(op)
        if tail is None:
            tail = self._ops[op] = tx.commit_lsn + _NULL + string_bytes(op)
        if unchanged_toast:
            toast = b"".join(
                [long_bytes(len(unchanged_toast)), *map(string_bytes, unchanged_toast), b"\x00"]
            )
        else:
            toast = _EMPTY_ARRAY  # an array ends with a zero-length block
        return b"".join(
            (
                self._header,
                _NULL if before is None else _SECOND + before,
                _NULL if after is None else _SECOND + after,
                self._mid,
                _SECOND + long_bytes(lsn),
                tail,
                self._ts,
                tx.block_head,
                _SMALL[total_order] if total_order < 8192 else long_bytes(total_order),
                _SMALL[data_collection_order]
                if data_collection_order < 8192
                else long_bytes(data_collection_order),
                toast,
            )
        )

    def encode_image(
        self,
        op: str,
        row: bytes,
        tx: TransactionBytes,
        lsn: int,
        ts_ms: int,
        total_order: int,
        data_collection_order: int,
        unchanged_toast: list[str],
    ) -> bytes:
        """``encode`` of an event with one row image, byte for byte: ``row`` is ``before``
        for "d" and ``after`` otherwise. The producer's fast path (inserts, updates with an
        unchanged key, deletes): the parts that only change with the transaction, the op or
        the millisecond are joined once into three pieces (``_image_pieces``), so an event is
        one join of eight parts instead of eleven, with fewer tests."""
        if tx is not self._tx or ts_ms != self._ts_ms:
            self._sync(tx, ts_ms)
        pieces = self._images.get(op)
        if pieces is None:
            pieces = self._image_pieces(op, tx)
        lead, mid, post = pieces
        n = lsn << 1  # zig-zag of a non-negative long
        return b"".join(
            (
                lead,
                row,
                mid,
                # long_bytes(lsn) inlined for LSNs of 2**27 to 2**41 (128 MiB to 2 TiB of WAL:
                # three 14-bit table pieces), a call less per event
                _MID[n & 0x3FFF] + _MID[(n >> 14) & 0x3FFF] + _LAST[n >> 28]
                if 0x10000000 <= n < 0x40000000000
                else long_bytes(lsn),
                post,
                _SMALL[total_order] if total_order < 8192 else long_bytes(total_order),
                _SMALL[data_collection_order]
                if data_collection_order < 8192
                else long_bytes(data_collection_order),
                b"".join(
                    [long_bytes(len(unchanged_toast)), *map(string_bytes, unchanged_toast), b"\x00"]
                )
                if unchanged_toast
                else _EMPTY_ARRAY,
            )
        )

    def image_parts(
        self, op: str, tx: TransactionBytes, lsn: int, ts_ms: int
    ) -> tuple[bytes, bytes, bytes]:
        """``encode_image``'s events of one op, transaction, LSN and millisecond without
        unchanged TOAST columns, as ``lead + row + middle + long_bytes(total_order) +
        long_bytes(data_collection_order) + tail``: (lead, middle, tail). For a run of
        snapshot rows (one join per row, the shared parts built once)."""
        if tx is not self._tx or ts_ms != self._ts_ms:
            self._sync(tx, ts_ms)
        pieces = self._images.get(op)
        if pieces is None:
            pieces = self._image_pieces(op, tx)
        lead, mid, post = pieces
        return lead, mid + long_bytes(lsn) + post, _EMPTY_ARRAY

    def _image_pieces(self, op: str, tx: TransactionBytes) -> tuple[bytes, bytes, bytes]:
        """(header + the union branches up to the row, the fields after the row up to the
        ``lsn`` union branch, the fields after the lsn up to the transaction block's id) for
        the current transaction and millisecond: ``encode``'s parts, joined."""
        tail = self._ops.get(op)
        if tail is None:
            tail = self._ops[op] = tx.commit_lsn + _NULL + string_bytes(op)
        if op == "d":  # before = the row, after = null
            lead, mid = self._header + _SECOND, _NULL + self._mid + _SECOND
        else:  # before = null, after = the row
            lead, mid = self._header + _NULL + _SECOND, self._mid + _SECOND
        pieces = self._images[op] = (lead, mid, tail + self._ts + tx.block_head)
        return pieces


class TransactionBytes:
    """The per-transaction parts of every envelope, encoded once per transaction."""

    __slots__ = ("block_head", "commit_lsn", "ts_ms", "tx_id")

    def __init__(self, xid: int, commit_lsn: int, commit_ts_ms: int, transaction_id: str) -> None:
        self.ts_ms = long_bytes(commit_ts_ms)
        self.tx_id = _SECOND + long_bytes(xid)
        self.commit_lsn = _SECOND + long_bytes(commit_lsn)
        self.block_head = _SECOND + string_bytes(transaction_id)
