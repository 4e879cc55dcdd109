"""Row changes -> Debezium-style event records (Avro-ready dicts). Pure, no I/O.

``before`` follows the table's replica identity (CONTRACT.md, "Events"):

- DEFAULT / USING INDEX: the old tuple is key-only ('K'): ``before`` holds the key columns
  (the others null) on delete, and an update that changes the key becomes a delete of the old
  key followed by a create of the new one (so each Kafka key sees its own lifecycle); that
  create carries the old key's row in ``before``, because the columns it lists in
  ``unchanged_toast`` must be taken from there. An update that keeps the key has ``before`` null.
- FULL: the whole old row ('O') on update and delete. When the table has a primary key the
  producer keys FULL tables by it (see pipeline) and splits key changes the same way;
  without one the key is every column and updates stay updates.
- NOTHING (or DEFAULT without a primary key): ``before`` null, null Kafka key (append-only).

Unchanged TOAST columns are listed in ``unchanged_toast`` and are null in ``after``; the
consumer keeps the value it has (null there never means "set to NULL"). Under FULL the old
row carries every value (PostgreSQL detoasts it), so an update's unchanged TOAST values are
copied from ``before`` into ``after`` and not listed: ``after`` is the whole new row, for
readers that know nothing of ``unchanged_toast`` (Flink, Debezium sinks) as for ours.

Rows and keys are produced already Avro-encoded (the record bodies, by the table's compiled
encoders ``RelationCodec.encode_row``/``encode_key``): nothing per event goes through dicts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from producer.pgoutput import UNCHANGED_TOAST, Delete, Insert, TupleData, Update
from schemas.envelope import TRANSACTION_BLOCK
from schemas.relation import RelationCodec
from schemas.row_encoder import KeyEncoder

Row = dict[str, Any]


class RowChange(NamedTuple):
    """A NamedTuple, not a frozen dataclass: one or two are made per event (cheaper to build)."""

    op: str  # c, u, d
    key: bytes | None  # the Key record's Avro body; None: no replica identity (null Kafka key)
    before: bytes | None  # the Value record's Avro body, or None
    after: bytes | None
    unchanged_toast: list[str]


@dataclass(frozen=True)
class TableShape:
    """What event building needs to know about one table (one Relation message)."""

    codec: RelationCodec
    replica_identity: str  # 'd', 'n', 'f', 'i' (pg_class.relreplident)
    key_positions: tuple[int, ...]  # the Kafka key's columns
    split_key_changes: bool  # an update changing these columns -> delete + create

    @property
    def keyed(self) -> bool:
        return self.codec.encode_key is not None

    @classmethod
    def of(cls, codec: RelationCodec, replica_identity: str) -> TableShape:
        positions = tuple(i for i, c in enumerate(codec.columns) if c.is_key)
        # FULL marks every column as identity; a key change is only meaningful for a narrower key.
        split = bool(positions) and (replica_identity != "f" or len(positions) < len(codec.columns))
        return cls(codec, replica_identity, positions, split)


def _key(shape: TableShape, values: TupleData, lsn: int) -> bytes | None:
    encode: KeyEncoder | None = shape.codec.encode_key
    return None if encode is None else encode(values, lsn)


def key_changed(positions: Sequence[int], old: TupleData, new: TupleData) -> bool:
    """Did any key column change? An unchanged-TOAST new value is unchanged by definition."""
    for i in positions:
        new_value = new[i]
        if new_value is UNCHANGED_TOAST:
            continue
        if old[i] != new_value:
            return True
    return False


def with_old_toast(old: TupleData, new: TupleData) -> TupleData:
    """The new row with each unchanged TOAST value taken from the full old row ('O').

    PostgreSQL sends an old tuple of kind 'O' (REPLICA IDENTITY FULL) with every value
    detoasted, so the value it left out of the new tuple is right there: the column did not
    change. A key-only old tuple ('K') has nulls outside the key and must not be used. An old
    value that is itself unchanged-TOAST stays the sentinel (still listed, never invented).
    """
    if UNCHANGED_TOAST not in new:
        return new
    return tuple(o if n is UNCHANGED_TOAST else n for o, n in zip(old, new, strict=True))


def insert_changes(shape: TableShape, message: Insert, lsn: int) -> tuple[RowChange, ...]:
    after, toast, key = shape.codec.encode_row_key(message.new, lsn)
    return (RowChange("c", key, None, after, toast),)


def update_changes(shape: TableShape, message: Update, lsn: int) -> tuple[RowChange, ...]:
    codec = shape.codec
    old = message.old
    new = message.new
    if old is None:
        # Key unchanged (DEFAULT/INDEX), or no identity at all (NOTHING).
        after, toast, key = codec.encode_row_key(new, lsn)
        return (RowChange("u", key, None, after, toast),)
    if message.old_kind == "O":
        new = with_old_toast(old, new)
    after, toast = codec.encode_row(new, lsn)
    before, old_toast, old_key = codec.encode_row_key(old, lsn)
    if shape.split_key_changes and key_changed(shape.key_positions, old, new):
        return (
            RowChange("d", old_key, before, None, old_toast),
            # The create names the row it replaces in ``before``: PostgreSQL does not resend
            # unchanged TOAST values, so a consumer takes them from the old key's row.
            RowChange("c", _key(shape, new, lsn), before, after, toast),
        )
    # The old tuple's key: a TOASTed key column that did not change is 'u' in the new tuple.
    return (RowChange("u", old_key, before if message.old_kind == "O" else None, after, toast),)


def delete_changes(shape: TableShape, message: Delete, lsn: int) -> tuple[RowChange, ...]:
    before, toast, key = shape.codec.encode_row_key(message.old, lsn)
    return (RowChange("d", key, before, None, toast),)


def source_block(
    *,
    version: str,
    prefix: str,
    db: str,
    schema: str,
    table: str,
    ts_ms: int,
    xid: int | None,
    lsn: int | None,
    commit_lsn: int | None,
) -> Row:
    return {
        "version": version,
        "connector": "postgresql",
        "name": prefix,
        "ts_ms": ts_ms,
        "snapshot": "false",
        "db": db,
        "sequence": None,
        "schema": schema,
        "table": table,
        "txId": xid,
        "lsn": lsn,
        "commit_lsn": commit_lsn,
        "xmin": None,
    }


def truncate_envelope(source: Row, transaction: Row | None, ts_ms: int) -> Row:
    return {
        "before": None,
        "after": None,
        "source": source,
        "op": "t",
        "ts_ms": ts_ms,
        "transaction": None if transaction is None else (TRANSACTION_BLOCK, transaction),
        "unchanged_toast": [],
    }


def message_envelope(
    prefix: str, content: bytes, source: Row, transaction: Row | None, ts_ms: int
) -> Row:
    return {
        "op": "m",
        "ts_ms": ts_ms,
        "source": source,
        "message": {"prefix": prefix, "content": content},
        "transaction": None if transaction is None else (TRANSACTION_BLOCK, transaction),
    }
