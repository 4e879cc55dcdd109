"""Fixed Avro schemas of the event contract (CONTRACT.md, "Events"), and schema naming.

Everything here is a deterministic function of its arguments, so one Relation always gives
the same schema text (``schema_text``) and the registry sees one version per real change.

Logical messages (``pg_logical_emit_message``) go to ``<prefix>.message``: key record
``io.walbridge.MessageKey {prefix string}``; value ``<ns>.Envelope`` shaped like Debezium's
logical-decoding-message events: ``op`` ("m"), ``ts_ms``, ``source``, ``message``
(``io.walbridge.LogicalMessage {prefix string, content bytes}``) and ``transaction``
(null for non-transactional messages).
"""

from __future__ import annotations

import json
from typing import Any, Final

from schemas.type_mapping import avro_name

SOURCE_RECORD: Final = "io.walbridge.postgresql.Source"
TRANSACTION_BLOCK: Final = "io.walbridge.TransactionBlock"
TRANSACTION_KEY: Final = "io.walbridge.TransactionKey"
TRANSACTION_METADATA: Final = "io.walbridge.TransactionMetadata"
DATA_COLLECTION: Final = "io.walbridge.DataCollection"
HEARTBEAT: Final = "io.walbridge.Heartbeat"
MESSAGE_KEY: Final = "io.walbridge.MessageKey"
LOGICAL_MESSAGE: Final = "io.walbridge.LogicalMessage"

Schema = dict[str, Any]


def topic_namespace(topic: str) -> str:
    """The topic as an Avro namespace: each dot-separated part sanitized (CONTRACT.md, "Events")."""
    return ".".join(avro_name(part) for part in topic.split("."))


def schema_text(schema: Schema | str) -> str:
    """Canonical text sent to the registry: compact, key order as built (deterministic)."""
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def _nullable_long(name: str) -> dict[str, Any]:
    return {"name": name, "type": ["null", "long"], "default": None}


def source_schema() -> Schema:
    return {
        "type": "record",
        "name": SOURCE_RECORD,
        "fields": [
            {"name": "version", "type": "string"},
            {"name": "connector", "type": "string"},
            {"name": "name", "type": "string"},
            {"name": "ts_ms", "type": "long"},
            {"name": "snapshot", "type": "string", "default": "false"},
            {"name": "db", "type": "string"},
            {"name": "sequence", "type": ["null", "string"], "default": None},
            {"name": "schema", "type": "string"},
            {"name": "table", "type": "string"},
            _nullable_long("txId"),
            _nullable_long("lsn"),
            _nullable_long("commit_lsn"),
            _nullable_long("xmin"),
        ],
    }


def transaction_block_schema() -> Schema:
    return {
        "type": "record",
        "name": TRANSACTION_BLOCK,
        "fields": [
            {"name": "id", "type": "string"},
            {"name": "total_order", "type": "long"},
            {"name": "data_collection_order", "type": "long"},
        ],
    }


def envelope_schema(topic: str, row: Schema) -> Schema:
    """The Debezium-compatible value envelope around ``row`` (a ``<ns>.Value`` record)."""
    ns = topic_namespace(topic)
    return {
        "type": "record",
        "name": f"{ns}.Envelope",
        "fields": [
            {"name": "before", "type": ["null", row], "default": None},
            {"name": "after", "type": ["null", row["name"]], "default": None},
            {"name": "source", "type": source_schema()},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": ["null", "long"], "default": None},
            {"name": "transaction", "type": ["null", transaction_block_schema()], "default": None},
            {
                "name": "unchanged_toast",
                "type": {"type": "array", "items": "string"},
                "default": [],
            },
        ],
    }


def transaction_key_schema() -> Schema:
    return {"type": "record", "name": TRANSACTION_KEY, "fields": [{"name": "id", "type": "string"}]}


def transaction_metadata_schema() -> Schema:
    data_collection = {
        "type": "record",
        "name": DATA_COLLECTION,
        "fields": [
            {"name": "data_collection", "type": "string"},
            {"name": "event_count", "type": "long"},
        ],
    }
    return {
        "type": "record",
        "name": TRANSACTION_METADATA,
        "fields": [
            {"name": "status", "type": "string"},
            {"name": "id", "type": "string"},
            {"name": "event_count", "type": ["null", "long"], "default": None},
            {
                "name": "data_collections",
                "type": ["null", {"type": "array", "items": data_collection}],
                "default": None,
            },
            {"name": "ts_ms", "type": "long"},
            {"name": "commit_lsn", "type": "long"},
        ],
    }


def heartbeat_schema() -> Schema:
    return {
        "type": "record",
        "name": HEARTBEAT,
        "fields": [{"name": "ts_ms", "type": "long"}, {"name": "lsn", "type": "long"}],
    }


def message_key_schema() -> Schema:
    return {"type": "record", "name": MESSAGE_KEY, "fields": [{"name": "prefix", "type": "string"}]}


def message_envelope_schema(topic: str) -> Schema:
    return {
        "type": "record",
        "name": f"{topic_namespace(topic)}.Envelope",
        "fields": [
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": ["null", "long"], "default": None},
            {"name": "source", "type": source_schema()},
            {
                "name": "message",
                "type": {
                    "type": "record",
                    "name": LOGICAL_MESSAGE,
                    "fields": [
                        {"name": "prefix", "type": "string"},
                        {"name": "content", "type": "bytes"},
                    ],
                },
            },
            {"name": "transaction", "type": ["null", transaction_block_schema()], "default": None},
        ],
    }


def envelope_record(
    row_record: str,
    op: str,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    source: dict[str, Any],
    ts_ms: int | None,
    transaction: dict[str, Any] | None,
    unchanged_toast: list[str],
) -> dict[str, Any]:
    """An Envelope datum for fastavro; ``row_record`` is the Value record's full name.

    The row and transaction unions are given in fastavro's ``(name, datum)`` branch notation:
    otherwise fastavro validates the whole row against each branch to pick one, which costs
    about a third of the encoding time.
    """
    return {
        "before": None if before is None else (row_record, before),
        "after": None if after is None else (row_record, after),
        "source": source,
        "op": op,
        "ts_ms": ts_ms,
        "transaction": None if transaction is None else (TRANSACTION_BLOCK, transaction),
        "unchanged_toast": unchanged_toast,
    }
