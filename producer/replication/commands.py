"""Text of the walsender commands we send (pure; quoting is done here, see identifiers.py)."""

from __future__ import annotations

from collections.abc import Iterable

from producer.pgoutput import format_lsn
from producer.replication.identifiers import quote_identifier, quote_literal, validate_slot_name

IDENTIFY_SYSTEM = b"IDENTIFY_SYSTEM"


def create_slot_command(slot: str, *, export_snapshot: bool, two_phase: bool) -> bytes:
    """PostgreSQL 15's option-list form of CREATE_REPLICATION_SLOT for a pgoutput slot.

    SNAPSHOT 'export' makes the server return a snapshot name that stays usable (SET TRANSACTION
    SNAPSHOT) until the next command on this connection, for a consistent initial copy.
    """
    options = ["SNAPSHOT 'export'" if export_snapshot else "SNAPSHOT 'nothing'"]
    if two_phase:
        options.append("TWO_PHASE")
    return (
        f"CREATE_REPLICATION_SLOT {quote_identifier(validate_slot_name(slot))} "
        f"LOGICAL pgoutput ({', '.join(options)})"
    ).encode()


def start_replication_command(
    slot: str, start_lsn: int, options: Iterable[tuple[str, str]]
) -> bytes:
    """``START_REPLICATION SLOT "s" LOGICAL 0/0 ("proto_version" '1', ...)``."""
    rendered = ", ".join(f"{quote_identifier(k)} {quote_literal(v)}" for k, v in options)
    command = f"START_REPLICATION SLOT {quote_identifier(validate_slot_name(slot))} LOGICAL {format_lsn(start_lsn)}"
    if rendered:
        command += f" ({rendered})"
    return command.encode()
