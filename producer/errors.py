"""The producer's error hierarchy: one base class, one subclass per way the pipeline stops.

Each error names what an operator needs to act (topic, table, LSN, setting), in its message
and as attributes. Errors of the replication client and the schemas package are not wrapped:
they already carry the slot, table and LSN involved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from producer.pgoutput import format_lsn

if TYPE_CHECKING:
    from producer.slot_loss import SlotLoss


def _lsn(lsn: int | None) -> str:
    return "unknown" if lsn is None else format_lsn(lsn)


class ProducerError(Exception):
    """Base class of every error raised by the producer's own modules."""


class ConfigError(ProducerError):
    """Invalid, unknown or conflicting configuration, found before any I/O."""


class DeliveryError(ProducerError):
    """Kafka refused or timed out an event: nothing at or after ``commit_lsn`` is confirmed."""

    def __init__(self, topic: str, table: str, commit_lsn: int | None, detail: str) -> None:
        self.topic = topic
        self.table = table
        self.commit_lsn = commit_lsn
        self.detail = detail
        super().__init__(
            f"delivery to topic {topic!r} (table {table}) failed for the transaction "
            f"committed at LSN {_lsn(commit_lsn)}: {detail}; nothing from this transaction "
            f"on is confirmed to PostgreSQL, so a restart resends it"
        )


class TopicError(ProducerError):
    """A topic is missing (with topic creation off) or could not be created."""

    def __init__(self, topic: str, detail: str) -> None:
        self.topic = topic
        self.detail = detail
        super().__init__(f"topic {topic!r}: {detail}")


class StreamStateError(ProducerError):
    """The replication stream broke the order the producer relies on (e.g. a change outside a
    transaction, or a streamed-transaction message while streaming is off)."""

    def __init__(self, detail: str, lsn: int | None) -> None:
        self.detail = detail
        self.lsn = lsn
        super().__init__(f"{detail} (at LSN {_lsn(lsn)})")


class EventError(ProducerError):
    """A change could not be turned into an event (e.g. an unknown relation id)."""

    def __init__(self, table: str, lsn: int | None, detail: str) -> None:
        self.table = table
        self.lsn = lsn
        self.detail = detail
        super().__init__(f"{table} at LSN {_lsn(lsn)}: {detail}")


class SnapshotError(ProducerError):
    """A snapshot chunk could not be read or published; names the table and the chunk's start."""

    def __init__(self, table: str, cursor: tuple[str, ...] | None, detail: str) -> None:
        where = "from its start" if cursor is None else f"after key {list(cursor)}"
        super().__init__(f"snapshot of {table} {where}: {detail}")
        self.table = table


class KafkaTransactionError(ProducerError):
    """A Kafka transaction could not be started, committed or aborted (fenced by another
    producer with the same transactional id, or failed): nothing past the last committed Kafka
    transaction is confirmed to PostgreSQL, so a restart resumes from it."""

    def __init__(self, action: str, transactional_id: str, detail: str, *, fenced: bool) -> None:
        self.action = action
        self.transactional_id = transactional_id
        self.detail = detail
        self.fenced = fenced
        if fenced:
            why = (
                "fenced: another producer with this transactional id took over (same slot, prefix?)"
            )
        elif action == "initialisation":
            why = "nothing was produced"
        else:
            why = "the open transaction's events are discarded"
        super().__init__(
            f"Kafka transaction {action} failed for transactional.id {transactional_id!r}: "
            f"{detail}; {why}; nothing past the last committed Kafka transaction is confirmed "
            "to PostgreSQL, so a restart resumes from it"
        )


class PublicationMissingError(ProducerError):
    """The publication was dropped while the producer streamed. PostgreSQL 18's pgoutput then
    skips the changes with a server-side WARNING instead of failing the stream (15-17 fail it),
    so nothing else would tell: stop, naming it and where the server's WAL was."""

    def __init__(self, publication: str, slot: str, lsn: int) -> None:
        self.publication = publication
        self.lsn = lsn
        super().__init__(
            f"publication {publication!r} no longer exists (found at the server's WAL position "
            f"{format_lsn(lsn)}, slot {slot!r}); changes since it was dropped were not sent. "
            f"Re-create it, restart the producer, and re-read the affected tables "
            f"(walbridge-producer snapshot schema.table ...)"
        )


class SlotLostError(ProducerError):
    """The replication slot is lost (``producer.slot_loss``): what it held can no longer be
    read, and the producer stops rather than go on from wherever a new slot would begin.
    Exit status 3. ``while_running``: found while streaming, not at start-up."""

    def __init__(self, loss: SlotLoss, *, while_running: bool, action: str) -> None:
        self.loss = loss
        self.while_running = while_running
        super().__init__(f"{loss.describe()}. {action}")
