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
    SlotState,
    SystemIdentity,
    check_wal_level,
    ensure_publication,
    ensure_slot,
    identify_system,
    observe_slot,
    warn_unless_standbys_wait,
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
        on_connection_lost: Callable[[ReplicationError], None] | None = None,
    ) -> None:
        self._dsn = dsn
        self._config = config
        self._on_reconnect = on_reconnect
        self._on_connection_lost = on_connection_lost
        self._redacted = redact_dsn(dsn)  # also validates the DSN before any I/O
        self._conninfo = replication_conninfo(
            dsn, application_name=config.application_name, connect_timeout=config.connect_timeout
        )
        self._conn: WalsenderConnection | None = None
        self._identity: SystemIdentity | None = None
        self._server_version = 0
        self._failover = False
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
            self._conninfo,
            slot=self._config.slot,
            display=self._redacted,
            answer_timeout=self._config.receive_timeout,
        )
        try:
            check_wal_level(conn)
            self._identity = identify_system(conn)
            self._server_version = conn.server_version
            # Settings this server cannot honour are refused before anything is created.
            self._failover = self._config.failover_for(self._server_version)
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
                "server_version": self._server_version,
            },
        )
        return self._identity

    @property
    def identity(self) -> SystemIdentity:
        """IDENTIFY_SYSTEM's answer, from the last (re)connection."""
        if self._identity is None:
            raise ReplicationError(
                ErrorKind.CONFIG, "open() has not been called", slot=self._config.slot
            )
        return self._identity

    @property
    def server_version(self) -> int:
        """server_version_num of the server ``open`` connected to (0 before)."""
        return self._server_version

    @property
    def failover(self) -> bool:
        """Whether a slot created by this client is a failover slot (17+, not switched off)."""
        return self._failover

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
            slot = ensure_slot(
                self._conn,
                session,
                self._config,
                dbname=identity.dbname,
                failover=self._failover,
                export_snapshot=export_snapshot,
            )
        if slot.failover and not export_snapshot:
            # (An exported snapshot lives until the next command on this connection.)
            warn_unless_standbys_wait(self._conn, self._config.slot)
        return slot

    def observe_slot(self) -> tuple[SlotState | None, int]:
        """The slot as pg_replication_slots shows it now (None: missing) and the server's WAL
        position, over a SQL session of its own."""
        with self._session() as session:
            try:
                return observe_slot(session, self._config.slot)
            except psycopg.Error as exc:
                raise self._server_error("can't read pg_replication_slots", exc) from exc

    def drop_slot(self) -> None:
        """Drop the configured slot if it exists (what is left of a lost slot, before a new one
        is created); refused by the server while a process streams from it."""
        with self._session() as session:
            try:
                session.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                    " WHERE slot_name = %s",
                    (self._config.slot,),
                )
            except psycopg.Error as exc:
                raise self._server_error("can't drop the lost slot", exc) from exc
        log.warning("dropped the lost replication slot", extra={"slot": self._config.slot})

    def _server_error(self, detail: str, exc: psycopg.Error) -> ReplicationError:
        """A SQL session's failure as the client reports every server refusal."""
        return ReplicationError(
            ErrorKind.SERVER,
            detail,
            slot=self._config.slot,
            server_message=str(exc),
            sqlstate=exc.sqlstate,
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
            on_connection_lost=self._on_connection_lost,
        )
        self._conn = None  # owned by the stream from now on
        if idle_after is None:
            return iter(self._stream)
        return self._stream.with_idle(idle_after)

    def _reconnect(self) -> WalsenderConnection:
        conn = WalsenderConnection.connect(
            self._conninfo,
            slot=self._config.slot,
            display=self._redacted,
            answer_timeout=self._config.receive_timeout,
        )
        try:
            identity = identify_system(conn)
        except BaseException:
            conn.close()
            raise
        self._note_identity(identity)
        log.info(
            "reconnected for replication",
            extra={
                "dsn": self._redacted,
                "slot": self._config.slot,
                "timeline": identity.timeline,
                "server_version": conn.server_version,
            },
        )
        return conn

    def _note_identity(self, identity: SystemIdentity) -> None:
        """After a reconnect: a new timeline means the server was promoted (a failover, or a
        recovery to a point in time); another system identifier, another cluster altogether.
        Streaming goes on only if the slot is there (START_REPLICATION says otherwise), but
        the operator should know the server changed under the producer."""
        before = self._identity
        self._identity = identity
        if before is None:
            return
        if identity.system_id != before.system_id:
            log.warning(
                "reconnected to another database cluster (system identifier changed)",
                extra={
                    "slot": self._config.slot,
                    "system_id_before": before.system_id,
                    "system_id": identity.system_id,
                    "timeline": identity.timeline,
                },
            )
        elif identity.timeline != before.timeline:
            log.warning(
                "reconnected on a new timeline: the server was promoted (failover) or recovered",
                extra={
                    "slot": self._config.slot,
                    "timeline_before": before.timeline,
                    "timeline": identity.timeline,
                },
            )

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
