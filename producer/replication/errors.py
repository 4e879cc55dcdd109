"""The replication client's one error type: a kind, plus the slot, LSN and server text involved."""

from __future__ import annotations

import enum

from producer.pgoutput import format_lsn


class ErrorKind(enum.Enum):
    CONFIG = "config"  # invalid or conflicting configuration, found before any I/O
    IDENTIFIER = "identifier"  # a slot/publication/table name we refuse to send to the server
    CONNECTION = "connection"  # connecting failed or the connection was lost (retriable)
    SERVER = "server"  # the server rejected a command
    PROTOCOL = "protocol"  # the server sent a frame we cannot parse
    WAL_LEVEL = "wal_level"  # wal_level is not 'logical'
    SLOT_ACTIVE = "slot_active"  # another process streams from the slot
    SLOT_MISMATCH = "slot_mismatch"  # the slot is not a pgoutput logical slot of this database
    # The slot is gone or invalidated (dropped, not synced to a promoted standby, WAL removed,
    # a recovery conflict): never retriable, what it held can no longer be read.
    SLOT_LOST = "slot_lost"
    PUBLICATION = "publication"  # the publication is missing pieces or configured differently


class ReplicationError(Exception):
    """Every failure of the replication client.

    The message always names the slot and the LSN (when one is known) and quotes what the
    server said, so one log line is enough to act on.
    """

    def __init__(
        self,
        kind: ErrorKind,
        detail: str,
        *,
        slot: str | None = None,
        lsn: int | None = None,
        server_message: str | None = None,
        sqlstate: str | None = None,
    ) -> None:
        self.kind = kind
        self.detail = detail
        self.slot = slot
        self.lsn = lsn
        self.server_message = server_message
        self.sqlstate = sqlstate or None
        super().__init__(self._render())

    @property
    def retriable(self) -> bool:
        """True when reconnecting may help: the connection dropped, nothing was refused."""
        return self.kind is ErrorKind.CONNECTION

    def _render(self) -> str:
        where = []
        if self.slot is not None:
            where.append(f"slot {self.slot!r}")
        if self.lsn is not None:
            where.append(f"lsn {format_lsn(self.lsn)}")
        text = f"{self.kind.value}: {self.detail}"
        if where:
            text += f" ({', '.join(where)})"
        if self.server_message:
            text += f"; server said: {self.server_message}"
        return text
