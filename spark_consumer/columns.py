"""Column names, pure: the lake's bookkeeping columns, the batch's working columns, and the
source and key columns a writer schema declares (CONTRACT.md, "Events" and "Lake").

Not to be confused with `schemas/envelope.py`, which writes the envelope schemas themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Lake bookkeeping columns (CONTRACT.md, "Lake"); source columns may not use these names.
COMMIT_LSN = "_commit_lsn"
TOTAL_ORDER = "_total_order"
OP = "_op"
TS_MS = "_ts_ms"
LAKE_META = (COMMIT_LSN, TOTAL_ORDER, OP, TS_MS)

# Working columns that never reach the lake.
TOPIC, PARTITION, OFFSET, FIRST_SEEN = "_topic", "_partition", "_offset", "_first_seen"
SCHEMA, TABLE, TX_ID, TOAST, OK = "_schema", "_table", "_tx_id", "_unchanged_toast", "_ok"
WORK_META = (TOPIC, PARTITION, OFFSET, FIRST_SEEN, SCHEMA, TABLE, TX_ID, TOAST)
# The event's whole `before` row (lake columns), decoded only for tables that keep a raw
# changelog (lake_options.py; its `after` row is the flat columns); never in a current-state
# table.
BEFORE = "_before"


@dataclass(frozen=True)
class RowField:
    name: str
    avro: Any  # the field's Avro type as written (usually ["null", T])
    pg_type: str | None
    # The PostgreSQL column name, when the producer had to change it to make a valid Avro name
    # (its `pg.name`): `unchanged_toast` lists columns by this name.
    pg_name: str | None = None


def _non_null(branch: Any) -> Any:
    if isinstance(branch, list):
        rest = [b for b in branch if b != "null"]
        return rest[0] if len(rest) == 1 else branch
    return branch


def row_fields(envelope: Mapping[str, Any]) -> tuple[RowField, ...]:
    """The source columns of an Envelope schema: the fields of its `before`/`after` record."""
    fields = {f["name"]: f for f in envelope.get("fields", [])}
    if "before" not in fields or "after" not in fields:
        raise ValueError(
            f"schema {envelope.get('name')!r} is not a change envelope (no before/after fields)"
        )
    record = _non_null(fields["before"]["type"])
    if not isinstance(record, dict) or record.get("type") != "record":
        raise ValueError(f"envelope {envelope.get('name')!r}: before is not a nullable record")
    out = tuple(
        RowField(f["name"], f["type"], f.get("pg.type"), f.get("pg.name")) for f in record["fields"]
    )
    clash = [
        f.name for f in out if f.name in LAKE_META or f.name in WORK_META or f.name in (OK, BEFORE)
    ]
    if clash:
        raise ValueError(f"source column(s) {clash} clash with the consumer's own column names")
    return out


def key_fields(key_schema: Mapping[str, Any]) -> tuple[str, ...]:
    if key_schema.get("type") != "record":
        raise ValueError(f"key schema {key_schema.get('name')!r} is not a record")
    return tuple(f["name"] for f in key_schema["fields"])


def is_transaction_metadata(schema: Mapping[str, Any]) -> bool:
    return (
        schema.get("type") == "record"
        and schema.get("name") in ("TransactionMetadata", "io.walbridge.TransactionMetadata")
        and schema.get("namespace", "io.walbridge") == "io.walbridge"
    )
