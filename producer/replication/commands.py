"""Text of the walsender commands we send (pure; quoting is done here, see identifiers.py)."""

from __future__ import annotations

from collections.abc import Iterable

from producer.pgoutput import format_lsn
from producer.replication.identifiers import quote_identifier, quote_literal, validate_slot_name

IDENTIFY_SYSTEM = b"IDENTIFY_SYSTEM"


def create_slot_command(
    slot: str, *, export_snapshot: bool, two_phase: bool, failover: bool = False
) -> bytes:
    """The option-list form of CREATE_REPLICATION_SLOT (PostgreSQL 15+) for a pgoutput slot.

    SNAPSHOT 'export' makes the server return a snapshot name that stays usable (SET TRANSACTION
    SNAPSHOT) until the next command on this connection, for a consistent initial copy.
    FAILOVER (PostgreSQL 17+) marks the slot for synchronization to standbys that run
    ``sync_replication_slots``, so it survives a promotion; older servers reject the option,
    so it is only sent when asked for.
    """
    options = ["SNAPSHOT 'export'" if export_snapshot else "SNAPSHOT 'nothing'"]
    if two_phase:
        options.append("TWO_PHASE")
    if failover:
        options.append("FAILOVER")
    return (
        f"CREATE_REPLICATION_SLOT {quote_identifier(validate_slot_name(slot))} "
        f"LOGICAL pgoutput ({', '.join(options)})"
    ).encode()


def alter_slot_failover_command(slot: str) -> bytes:
    """``ALTER_REPLICATION_SLOT "s" (FAILOVER true)`` (PostgreSQL 17+): an existing slot becomes
    a failover slot."""
    return f"ALTER_REPLICATION_SLOT {quote_identifier(validate_slot_name(slot))} (FAILOVER true)".encode()


def start_replication_command(
    slot: str, start_lsn: int, options: Iterable[tuple[str, str]]
) -> bytes:
    """``START_REPLICATION SLOT "s" LOGICAL 0/0 ("proto_version" '1', ...)``."""
    rendered = ", ".join(f"{quote_identifier(k)} {quote_literal(v)}" for k, v in options)
    command = f"START_REPLICATION SLOT {quote_identifier(validate_slot_name(slot))} LOGICAL {format_lsn(start_lsn)}"
    if rendered:
        command += f" ({rendered})"
    return command.encode()
