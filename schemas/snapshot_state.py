"""Where a snapshot resumes: one record per table in the compacted ``<prefix>.snapshot`` topic.

Kafka, not the source database: the producer needs no write access to PostgreSQL, and the
record is only written once everything it covers is acknowledged by Kafka (the chunk's
transaction is confirmed), so after kill -9 the snapshot resumes from the last chunk Kafka
holds, and only rows already sent can be sent again (as ``r`` events, which every reader
dedups by key). The record format is internal (JSON, versioned), not part of the event
contract; it lives here because the consumer reads it too: a table whose snapshot is not done
may see updates of rows its snapshot has not delivered yet (``unfinished``).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Final

from schemas.compacted import read_latest

log = logging.getLogger(__name__)

FORMAT_VERSION: Final = 1
PENDING: Final = "pending"  # asked for, no chunk published yet
RUNNING: Final = "running"
DONE: Final = "done"


@dataclass(frozen=True)
class TableState:
    table: str  # schema.table
    status: str
    cursor: tuple[str, ...] | None = None  # the last published row's key text
    rows: int = 0  # rows published (after the watermark dedup)
    chunks: int = 0
    requested_lsn: int = 0  # the signal (or slot creation) that asked for it
    started_ms: int = 0
    # Keys (text) of rows a published chunk dropped and that are still to be read again: their
    # change in the chunk's window kept an unchanged TOAST value PostgreSQL did not send, so
    # until they are read again no event holds that value. Kept here so a restart reads them.
    rereads: tuple[tuple[str, ...], ...] = ()
    # The snapshot's first chunk starts with a ``t`` event even though the table has a key:
    # a snapshot that replaces what readers hold (after a lost slot, whose window may hide
    # deletes no event will ever carry), not one that completes it.
    truncate: bool = False
    # A new slot's initial snapshot: the exported snapshot of its consistent point
    # (``pg_snapshot`` text, see producer.snapshot.as_of); chunks read only rows unchanged
    # since, the stream carries the rest. None: read rows as they are (watermarks alone).
    as_of: str | None = None

    @property
    def complete(self) -> bool:
        """Every row delivered whole: done, and nothing left to read again."""
        return self.status == DONE and not self.rereads

    def with_rereads(self, rereads: tuple[tuple[str, ...], ...]) -> TableState:
        return replace(self, rereads=rereads)

    def advanced(self, cursor: tuple[str, ...] | None, rows: int, done: bool) -> TableState:
        return replace(
            self,
            status=DONE if done else RUNNING,
            cursor=cursor if cursor is not None else self.cursor,
            rows=self.rows + rows,
            chunks=self.chunks + 1,
        )

    def encode(self) -> bytes:
        doc = asdict(self)
        doc["cursor"] = None if self.cursor is None else list(self.cursor)
        if self.rereads:
            doc["rereads"] = [list(k) for k in self.rereads]
        else:
            del doc["rereads"]  # written only when there are some (older readers don't know it)
        if not self.truncate:
            del doc["truncate"]  # likewise, written only when set
        if self.as_of is None:
            del doc["as_of"]
        doc["v"] = FORMAT_VERSION
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> TableState:
        doc = json.loads(raw)
        if doc.pop("v", None) != FORMAT_VERSION:
            raise ValueError(f"snapshot state record of an unknown format: {raw[:200]!r}")
        cursor = doc.get("cursor")
        doc["cursor"] = None if cursor is None else tuple(cursor)
        doc["rereads"] = tuple(tuple(k) for k in doc.get("rereads", ()))
        return cls(**doc)


def requested(table: str, lsn: int, *, truncate: bool = False) -> TableState:
    return TableState(
        table, PENDING, requested_lsn=lsn, started_ms=time.time_ns() // 1_000_000,
        truncate=truncate,
    )  # fmt: skip


def load(conf: dict[str, Any], topic: str, timeout_s: float = 30.0) -> dict[str, TableState]:
    """Every table's latest record (the topic read from its start to its end)."""
    return {
        key.decode(): TableState.decode(value)
        for key, value in read_latest(conf, topic, timeout_s).items()
        if value is not None  # a tombstone: the table's state was removed
    }


def follow(before: frozenset[str], records: list[tuple[bytes, bytes | None]]) -> frozenset[str]:
    """The tables being snapshotted after ``records`` (key, value; in offset order) of the
    snapshot topic, given those being snapshotted before them."""
    out = set(before)
    for key, value in records:
        table = key.decode()
        if value is None or TableState.decode(value).complete:
            out.discard(table)
        else:
            out.add(table)
    return frozenset(out)


def unfinished_in_batch(
    before: frozenset[str], records: list[tuple[bytes, bytes | None]], whole: bool
) -> tuple[frozenset[str], frozenset[str]]:
    """A consumer batch's unfinished snapshots, and those to check against the topic's latest
    records: (unfinished, to_check).

    ``records``: the batch's records of the snapshot topic; ``whole``: the batch read every
    record Kafka had (no cap cut it short). A snapshot counts as finished only in a whole
    batch: a capped one may have read the "done" record ahead of the snapshot's last rows
    (the consumer's batch.py says why). A table unfinished before and not named in a whole
    batch may have had its "done" read by an earlier, capped batch: to check."""
    mentioned = {key.decode() for key, _value in records}
    if not whole:  # what follow() would say is a subset of this
        return before | mentioned, frozenset()
    return follow(before, records), frozenset(t for t in before if t not in mentioned)
