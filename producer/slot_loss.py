"""Pure: whether the producer's replication slot is lost, why, and which WAL it can no longer
read. ``producer.slot_guard`` gathers what this module decides from (pg_replication_slots,
IDENTIFY_SYSTEM, the records Kafka holds) and acts on the verdict.

A slot is lost when changes the lake has not received can no longer be decoded from it:
  - it is missing although Kafka shows it existed (a slot record, an exactly-once resume
    point, or snapshot progress under this prefix): dropped, or the server is a promoted
    standby that never had it (PostgreSQL 15/16 do not synchronize slots; 17+ only failover
    slots, on a standby with ``sync_replication_slots``);
  - ``wal_status`` is ``lost``: WAL it still needed was removed (``max_slot_wal_keep_size``);
  - (17+) ``invalidation_reason`` is set (``wal_removed``, ``rows_removed``,
    ``wal_level_insufficient``, 18's ``idle_timeout``), or (16+) ``conflicting`` is true.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from producer.pgoutput import format_lsn
from producer.replication.setup import SlotState, SystemIdentity
from producer.slot_record import SlotRecord


class LossReason(enum.Enum):
    MISSING = "missing"
    FAILOVER = "failover without a synced slot"
    WAL_LOST = "wal_status lost"
    INVALIDATED = "invalidated"


@dataclass(frozen=True)
class Evidence:
    """What Kafka holds of this slot's past, read at start-up."""

    record: SlotRecord | None
    resume_lsn: int | None = None  # the exactly-once resume point's commit LSN
    snapshot_progress: bool = False  # a snapshot record past "pending" under this prefix

    @property
    def existed(self) -> bool:
        return self.record is not None or self.resume_lsn is not None or self.snapshot_progress

    def last_lsn(self) -> int | None:
        """The furthest position Kafka is known to hold (None: nothing known)."""
        known = [
            lsn
            for lsn in (
                self.resume_lsn,
                None if self.record is None else self.record.confirmed_lsn,
                None if self.record is None else self.record.created_lsn or None,
            )
            if lsn is not None
        ]
        return max(known) if known else None


@dataclass(frozen=True)
class SlotLoss:
    slot: str
    reason: LossReason
    detail: str  # what exactly: the invalidation reason, the timelines, ...
    from_lsn: int | None  # the first WAL not delivered is after this (None: unknown)
    to_lsn: int  # the server's WAL position when the loss was found

    @property
    def reason_text(self) -> str:
        return f"{self.reason.value} ({self.detail})"

    def range_text(self) -> str:
        start = "an unknown position" if self.from_lsn is None else format_lsn(self.from_lsn)
        return f"from LSN {start} to {format_lsn(self.to_lsn)}"

    def describe(self) -> str:
        return (
            f"replication slot {self.slot!r} is lost: {self.reason_text}; the changes "
            f"{self.range_text()} can no longer be read from it, so the lake would miss them"
        )


def invalidation(state: SlotState) -> tuple[LossReason, str] | None:
    """Why an existing slot can no longer be streamed from (None: it can)."""
    if state.wal_status == "lost":
        extra = f", invalidation_reason {state.invalidation_reason!r}"
        return LossReason.WAL_LOST, (
            "WAL the slot needed was removed, e.g. past max_slot_wal_keep_size"
            + (extra if state.invalidation_reason else "")
        )
    if state.invalidation_reason:
        return LossReason.INVALIDATED, f"invalidation_reason {state.invalidation_reason!r}"
    if state.conflicting:
        return LossReason.INVALIDATED, "conflicting: invalidated by a conflict with recovery"
    return None


def at_start(
    slot: str,
    state: SlotState | None,
    identity: SystemIdentity,
    evidence: Evidence,
    server_lsn: int,
) -> SlotLoss | None:
    """The verdict at start-up, before anything is created or streamed."""
    if state is not None:
        why = invalidation(state)
        if why is None:
            return None
        known = [x for x in (state.confirmed_flush_lsn, evidence.last_lsn()) if x is not None]
        return SlotLoss(slot, why[0], why[1], max(known) if known else None, server_lsn)
    if not evidence.existed:
        return None  # a new slot: nothing was ever read through this name under this prefix
    return SlotLoss(slot, *_why_missing(identity, evidence), evidence.last_lsn(), server_lsn)


def while_running(
    slot: str,
    state: SlotState | None,
    confirmed_lsn: int,
    server_lsn: int,
    *,
    identity: SystemIdentity | None = None,
    record: SlotRecord | None = None,
) -> SlotLoss | None:
    """The verdict of a check while streaming: the slot existed when streaming began.
    ``identity`` (the server after a reconnect) and ``record`` (the slot's, as of start-up)
    tell a failover or another cluster from a drop."""
    if state is None:
        if identity is not None and record is not None:
            reason, detail = _why_missing(identity, Evidence(record=record))
        else:
            reason, detail = (
                LossReason.MISSING,
                (
                    "the slot was dropped while the producer ran, or the server is not the one "
                    "it was created on"
                ),
            )
        return SlotLoss(slot, reason, detail, confirmed_lsn or None, server_lsn)
    why = invalidation(state)
    if why is None:
        return None
    known = max(confirmed_lsn, state.confirmed_flush_lsn or 0)
    return SlotLoss(slot, why[0], why[1], known or None, server_lsn)


def _why_missing(identity: SystemIdentity, evidence: Evidence) -> tuple[LossReason, str]:
    record = evidence.record
    if record is None:
        held = []
        if evidence.resume_lsn is not None:
            held.append("an exactly-once resume point")
        if evidence.snapshot_progress:
            held.append("snapshot progress")
        return LossReason.MISSING, (
            f"no such slot, but Kafka holds {' and '.join(held)} for it under this topic prefix"
        )
    if record.system_id != identity.system_id:
        return LossReason.MISSING, (
            f"the server is another database cluster (system identifier {identity.system_id}; "
            f"the slot was created on {record.system_id})"
        )
    if identity.timeline != record.timeline:
        return LossReason.FAILOVER, (
            f"the server's timeline moved from {record.timeline} to {identity.timeline} since "
            "the slot was last seen: it was promoted (or recovered) without a copy of the "
            "slot; PostgreSQL synchronizes only failover slots, from version 17, to a standby "
            "with sync_replication_slots = on"
        )
    return LossReason.MISSING, "the slot was dropped"
