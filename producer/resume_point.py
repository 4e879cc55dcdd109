"""Where an exactly-once producer resumes: the last source position Kafka has committed.

One record per slot (key: the slot name) in the compacted ``<prefix>.offsets`` topic, written
inside every Kafka transaction that carries events, so it commits or aborts with them. The
slot's confirmed LSN may lag it (a crash between the Kafka commit and the standby status
update); on start-up the producer reads this record with ``read_committed`` and skips what it
covers, so nothing committed is produced twice.

A position is a source transaction's ``commit_lsn`` and how many of its events (by
``total_order``) are in Kafka: a big source transaction may span several Kafka transactions
(bounded memory, no Kafka transaction near its timeout), and pgoutput resends a transaction
with the same events in the same order, so the first ``total_order`` of them are skipped.
The record format is internal (JSON, versioned), not part of the event contract.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from schemas.compacted import read_latest

FORMAT_VERSION: Final = 1


@dataclass(frozen=True)
class ResumePoint:
    commit_lsn: int  # the source transaction the position is in
    total_order: int  # how many of its events Kafka holds
    complete: bool  # all of them, END marker included

    def encode(self) -> bytes:
        doc = {
            "v": FORMAT_VERSION,
            "commit_lsn": self.commit_lsn,
            "total_order": self.total_order,
            "complete": self.complete,
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> ResumePoint:
        try:
            doc = json.loads(raw)
            if doc.get("v") != FORMAT_VERSION:
                raise ValueError("unknown format version")
            return cls(int(doc["commit_lsn"]), int(doc["total_order"]), bool(doc["complete"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"unreadable resume point record {raw[:200]!r}: {exc}") from exc


def load(
    conf: dict[str, Any], topic: str, slot: str, timeout_s: float = 30.0
) -> ResumePoint | None:
    """The slot's last committed position, or None when no exactly-once producer of this slot
    has committed anything under this prefix."""
    raw = read_latest(conf, topic, timeout_s).get(slot.encode())
    return None if raw is None else ResumePoint.decode(raw)
