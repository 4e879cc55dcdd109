"""ReplicationClient: set up slot and publication, then stream - the producer's one entry point."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import overload

import psycopg

from producer.replication.config import ReplicationConfig
from producer.replication.connection import WalsenderConnection
from producer.replication.dsn import redact_dsn, replication_conninfo, sql_conninfo
from producer.replication.errors import ErrorKind, ReplicationError
from producer.replication.frames import Keepalive
from producer.replication.setup import (
    PublicationInfo,
    SlotInfo,
    SystemIdentity,
    check_wal_level,
    ensure_publication,
    ensure_slot,
    identify_system,
)
from producer.replication.stream import Change, ReplicationStream

log = logging.getLogger(__name__)


class ReplicationClient:
    """Typical use::

    with ReplicationClient(dsn, config) as client:
        client.open()
        client.ensure_publication()
        slot = client.ensure_slot(export_snapshot=True)  # snapshot valid until stream()
        for payload, wal_start, wal_end in client.stream():
            ...
            client.confirm(commit_end_lsn)  # once Kafka acknowledged the transaction
    """

    def __init__(
        self,
        dsn: str,
        config: ReplicationConfig,
        *,
        on_reconnect: Callable[[int], None] | None = None,
    ) -> None:
        self._dsn = dsn
        self._config = config
        self._on_reconnect = on_reconnect
        self._redacted = redact_dsn(dsn)  # also validates the DSN before any I/O
        self._conninfo = replication_conninfo(
            dsn, application_name=config.application_name, connect_timeout=config.connect_timeout
        )
        self._conn: WalsenderConnection | None = None
        self._identity: SystemIdentity | None = None
        self._stream: ReplicationStream | None = None

    @property
    def config(self) -> ReplicationConfig:
        return self._config

    # --- set-up ----------------------------------------------------------------------------

    def open(self) -> SystemIdentity:
        """Connect the walsender, IDENTIFY_SYSTEM, and refuse a server without wal_level=logical."""
        if self._identity is not None:
            return self._identity
        log.info(
            "connecting for replication", extra={"dsn": self._redacted, "slot": self._config.slot}
        )
        conn = WalsenderConnection.connect(
            self._conninfo, slot=self._config.slot, display=self._redacted
        )
        try:
            check_wal_level(conn)
            self._identity = identify_system(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        log.info(
            "identified system",
            extra={
                "slot": self._config.slot,
                "system_id": self._identity.system_id,
                "timeline": self._identity.timeline,
                "dbname": self._identity.dbname,
            },
        )
        return self._identity

    def ensure_publication(self) -> PublicationInfo:
        with self._session() as session:
            return ensure_publication(session, self._config)

    def ensure_slot(self, *, export_snapshot: bool = False) -> SlotInfo:
        identity = self.open()
        if self._conn is None:
            # The replication connection now belongs to the stream; a slot command there
            # would end streaming, and an exported snapshot would be useless anyway.
            raise ReplicationError(
                ErrorKind.CONFIG,
                "ensure_slot() must run before stream() starts",
                slot=self._config.slot,
            )
        with self._session() as session:
            return ensure_slot(
                self._conn,
                session,
                self._config,
                dbname=identity.dbname,
                export_snapshot=export_snapshot,
            )

    def _session(self) -> psycopg.Connection:
        conninfo = sql_conninfo(
            self._dsn,
            application_name=self._config.application_name,
            connect_timeout=self._config.connect_timeout,
        )
        try:
            return psycopg.connect(conninfo, autocommit=True)
        except psycopg.OperationalError as exc:
            raise ReplicationError(
                ErrorKind.CONNECTION,
                f"can't open a SQL session ({self._redacted})",
                slot=self._config.slot,
                server_message=str(exc),
            ) from exc

    # --- streaming ---------------------------------------------------------------------------

    @overload
    def stream(self, start_lsn: int = 0, *, idle_after: None = None) -> Iterator[Change]: ...
    @overload
    def stream(self, start_lsn: int = 0, *, idle_after: float) -> Iterator[Change | None]: ...

    def stream(
        self, start_lsn: int = 0, *, idle_after: float | None = None
    ) -> Iterator[Change] | Iterator[Change | None]:
        """START_REPLICATION at ``start_lsn`` (0: the slot's confirmed_flush_lsn) and yield
        ``(payload, wal_start, wal_end)``; with ``idle_after``, also ``None`` after that many
        seconds without data. Reconnects resume from the confirmed LSN."""
        if self._stream is not None:
            raise ReplicationError(
                ErrorKind.CONFIG, "stream() was already started", slot=self._config.slot
            )
        self.open()
        self._stream = ReplicationStream(
            self._config,
            self._reconnect,
            start_lsn=start_lsn,
            connection=self._conn,
            on_reconnect=self._on_reconnect,
        )
        self._conn = None  # owned by the stream from now on
        if idle_after is None:
            return iter(self._stream)
        return self._stream.with_idle(idle_after)

    def _reconnect(self) -> WalsenderConnection:
        conn = WalsenderConnection.connect(
            self._conninfo, slot=self._config.slot, display=self._redacted
        )
        log.info(
            "reconnected for replication", extra={"dsn": self._redacted, "slot": self._config.slot}
        )
        return conn

    def _require_stream(self) -> ReplicationStream:
        if self._stream is None:
            raise ReplicationError(
                ErrorKind.CONFIG, "stream() has not been started", slot=self._config.slot
            )
        return self._stream

    def confirm(self, lsn: int) -> None:
        """Report ``lsn`` as flushed downstream; the only thing that advances the slot."""
        self._require_stream().confirm(lsn)

    def idle_sooner(self, seconds: float | None) -> None:
        """See ``ReplicationStream.idle_sooner``; a no-op before ``stream()``."""
        if self._stream is not None:
            self._stream.idle_sooner(seconds)

    def send_status(self) -> None:
        """Send a status update now; nothing to do before ``stream()`` (no walsender session
        yet, e.g. while the producer retries the registry during start-up)."""
        if self._stream is not None:
            self._stream.send_status()

    @property
    def confirmed_lsn(self) -> int:
        return self._require_stream().confirmed_lsn

    @property
    def server_wal_end(self) -> int:
        return self._require_stream().server_wal_end

    @property
    def last_keepalive(self) -> Keepalive | None:
        return self._require_stream().last_keepalive

    @property
    def last_send_time(self) -> int:
        """The server's send time of the last message read (PostgreSQL epoch microseconds)."""
        return self._require_stream().last_send_time

    @property
    def last_keepalive_at(self) -> float | None:
        return self._require_stream().last_keepalive_at

    @property
    def reconnects(self) -> int:
        return self._require_stream().reconnects

    # --- shutdown ----------------------------------------------------------------------------

    def close(self) -> None:
        try:
            if self._stream is not None:
                self._stream.close()
        finally:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> ReplicationClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
