"""What Kafka remembers of the producer's replication slot, so a lost slot is never taken for a
new one (pure: the record and its encoding; reading and writing it is ``producer.slot_guard``'s).

One record per slot in the compacted ``<prefix>.offsets`` topic (beside the exactly-once resume
point, whose key is the bare slot name), keyed ``slot:<name>``: slot names are lower-case
letters, digits and underscores, so the two keys never meet. It is written, and acknowledged
by Kafka, right after the slot is created and before anything is streamed from it, and again at
every start (the position and timeline seen then). PostgreSQL alone cannot say that a slot is
missing rather than never made: after a failover to a server without it, or after someone
dropped it, the server simply has no such slot.

The format is internal (JSON, versioned), not part of the event contract.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Final

FORMAT_VERSION: Final = 1
KEY_PREFIX: Final = "slot:"


def record_key(slot: str) -> bytes:
    return f"{KEY_PREFIX}{slot}".encode()


@dataclass(frozen=True)
class SlotRecord:
    slot: str
    system_id: str  # IDENTIFY_SYSTEM's systemid: which cluster the slot lives in
    timeline: int  # the server's timeline when last seen (a promotion moves it)
    database: str
    created_lsn: int  # the slot's consistent point at creation (0: predates the record)
    created_ms: int  # when it was created (or first recorded), Unix milliseconds
    confirmed_lsn: int | None  # the slot's confirmed_flush_lsn when last seen
    failover: bool | None  # a failover slot (17+); None: the server has none

    def seen(self, *, timeline: int, confirmed_lsn: int | None) -> SlotRecord:
        """The record after a start that found the slot alive."""
        keep = self.confirmed_lsn if confirmed_lsn is None else confirmed_lsn
        return SlotRecord(
            self.slot, self.system_id, timeline, self.database, self.created_lsn,
            self.created_ms, keep, self.failover,
        )  # fmt: skip

    def encode(self) -> bytes:
        return json.dumps({"v": FORMAT_VERSION, **asdict(self)}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> SlotRecord:
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict) or doc.get("v") != FORMAT_VERSION:
                raise ValueError("unknown format version")
            confirmed = doc["confirmed_lsn"]
            failover = doc["failover"]
            return cls(
                slot=str(doc["slot"]),
                system_id=str(doc["system_id"]),
                timeline=int(doc["timeline"]),
                database=str(doc["database"]),
                created_lsn=int(doc["created_lsn"]),
                created_ms=int(doc["created_ms"]),
                confirmed_lsn=None if confirmed is None else int(confirmed),
                failover=None if failover is None else bool(failover),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"unreadable slot record {raw[:200]!r}: {exc}") from exc
