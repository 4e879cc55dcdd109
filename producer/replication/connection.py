"""Socket I/O of one walsender connection (libpq through psycopg.pq), with errors mapped.

psycopg 3 has no replication API, so this drives libpq's COPY BOTH mode directly. Everything
above this module works in terms of frames and ReplicationError, never psycopg exceptions.
"""

from __future__ import annotations

import selectors
import time

import psycopg
from psycopg import pq
from psycopg.pq import abc as pq_abc

from producer.replication import connecting
from producer.replication.errors import ErrorKind, ReplicationError

# SQLSTATE classes/codes that mean "the connection went away; try again" rather than a refusal:
# 08 connection exception, 57P01-57P03 admin/crash shutdown or cannot connect now.
_CONNECTION_STATES = ("08", "57P01", "57P02", "57P03")
_OBJECT_IN_USE = "55006"  # "replication slot ... is active for PID n"
# START_REPLICATION's answers for a slot that is gone: 42704 "replication slot ... does not
# exist"; 55000 "can no longer get changes from replication slot ..." (invalidated). 55000 also
# covers other refusals ("... was not created in this database"), which the start-up checks
# rule out before streaming; the producer confirms a loss from pg_replication_slots anyway.
_SLOT_GONE_STATES = ("42704", "55000")
# Commands that legitimately wait on other sessions (creating a slot waits for the transactions
# running at that moment; DROP ... WAIT for the slot's holder): never cut short by the answer
# timeout, whose job is to catch a silent connection, not a slow server.
_UNBOUNDED_COMMANDS = (b"CREATE_REPLICATION_SLOT", b"DROP_REPLICATION_SLOT")

Row = tuple[str | None, ...]


def _text(raw: bytes | None) -> str:
    return raw.decode("utf-8", "replace").strip() if raw else ""


class WalsenderConnection:
    """One libpq connection with ``replication=database``.

    Blocking mode is kept on purpose: like pg_recvlogical we only ever write tiny status
    frames, and reads use ``get_copy_data(async_=1)`` plus a selector, so the loop never
    blocks on a read and the server drains our writes in its own loop.
    """

    def __init__(
        self, pgconn: pq_abc.PGconn, slot: str, answer_timeout: float | None = None
    ) -> None:
        self.pgconn = pgconn
        self.slot = slot
        # Seconds a command may wait for the server's first answer (None: forever): libpq's
        # PQexec would wait on a silent connection without end.
        self.answer_timeout = answer_timeout
        self._selector: selectors.BaseSelector | None = None
        self.closed = False

    @classmethod
    def connect(
        cls,
        conninfo: bytes,
        *,
        slot: str,
        display: str,
        lsn: int | None = None,
        answer_timeout: float | None = None,
    ) -> WalsenderConnection:
        """``display`` is the password-free DSN that error messages show; establishing the
        connection is bounded by the conninfo's connect_timeout, each command's answer by
        ``answer_timeout``."""
        detail = f"can't connect to {display}"
        try:
            pgconn = connecting.connect(conninfo, connecting.connect_deadline_s(conninfo))
        except (psycopg.OperationalError, connecting.ConnectTimeout) as exc:
            raise ReplicationError(
                ErrorKind.CONNECTION, detail, slot=slot, lsn=lsn, server_message=str(exc)
            ) from exc
        if pgconn.status != pq.ConnStatus.OK:
            message = _text(pgconn.error_message)
            pgconn.finish()
            raise ReplicationError(
                ErrorKind.CONNECTION, detail, slot=slot, lsn=lsn, server_message=message
            )
        return cls(pgconn, slot, answer_timeout)

    # --- commands ------------------------------------------------------------------------

    def command(self, command: bytes, *, lsn: int | None = None) -> list[Row]:
        """Run one walsender command to completion and return its rows as text."""
        result = self._exec(command, lsn=lsn)
        if result.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
            raise self.result_error(result, f"{self._verb(command)} failed", lsn=lsn)
        return [
            tuple(
                None if (v := result.get_value(r, c)) is None else v.decode()
                for c in range(result.nfields)
            )
            for r in range(result.ntuples)
        ]

    def start_copy_both(self, command: bytes, *, lsn: int) -> None:
        result = self._exec(command, lsn=lsn)
        if result.status != pq.ExecStatus.COPY_BOTH:
            error = self.result_error(result, "START_REPLICATION failed", lsn=lsn)
            if error.sqlstate in _SLOT_GONE_STATES:
                error = ReplicationError(
                    ErrorKind.SLOT_LOST,
                    "START_REPLICATION failed: the slot is gone or invalidated",
                    slot=self.slot,
                    lsn=lsn,
                    server_message=error.server_message,
                    sqlstate=error.sqlstate,
                )
            raise error
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.pgconn.socket, selectors.EVENT_READ)

    def _exec(self, command: bytes, *, lsn: int | None) -> pq_abc.PGresult:
        timeout = self.answer_timeout
        try:
            if timeout is None or command.startswith(_UNBOUNDED_COMMANDS):
                return self.pgconn.exec_(command)
            return self._exec_within(command, timeout, lsn=lsn)
        except psycopg.OperationalError as exc:
            raise self.lost(f"{self._verb(command)} failed", lsn=lsn, cause=exc) from exc

    def _exec_within(self, command: bytes, timeout: float, *, lsn: int | None) -> pq_abc.PGresult:
        """PQexec with a deadline: send, then read results until the last one (or COPY BOTH,
        after which the connection streams), waiting on the socket at most ``timeout`` s."""
        pgconn = self.pgconn
        pgconn.send_query(command)
        deadline = time.monotonic() + timeout
        last: pq_abc.PGresult | None = None
        with selectors.DefaultSelector() as selector:
            selector.register(pgconn.socket, selectors.EVENT_READ)
            while True:
                pgconn.consume_input()
                while not pgconn.is_busy():
                    result = pgconn.get_result()
                    if result is None:
                        if last is None:
                            raise self.lost(f"{self._verb(command)} returned nothing", lsn=lsn)
                        return last
                    if result.status == pq.ExecStatus.COPY_BOTH:
                        return result
                    last = result
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ReplicationError(
                        ErrorKind.CONNECTION,
                        f"{self._verb(command)}: no answer from the server within {timeout:g} s "
                        "(receive timeout): the connection is silent",
                        slot=self.slot,
                        lsn=lsn,
                    )
                selector.select(remaining)

    @staticmethod
    def _verb(command: bytes) -> str:
        return command.split(b" ", 1)[0].decode("ascii", "replace")

    @property
    def server_version(self) -> int:
        """The server's server_version_num (e.g. 170006), as libpq learnt it at connection."""
        return int(self.pgconn.server_version)

    # --- COPY BOTH -------------------------------------------------------------------------

    def wait_readable(self, timeout: float, *, lsn: int) -> None:
        """Wait for the socket (at most ``timeout`` s), then pull what arrived into libpq."""
        assert self._selector is not None, "wait_readable() before START_REPLICATION"
        if timeout > 0:
            self._selector.select(timeout)
        try:
            self.pgconn.consume_input()
        except psycopg.OperationalError as exc:
            raise self.lost("reading from the server failed", lsn=lsn, cause=exc) from exc

    def send(self, frame: bytes, *, lsn: int) -> None:
        try:
            if self.pgconn.put_copy_data(frame) != 1 or self.pgconn.flush() != 0:
                raise self.lost("sending to the server failed", lsn=lsn)
        except psycopg.OperationalError as exc:
            raise self.lost("sending to the server failed", lsn=lsn, cause=exc) from exc

    def copy_ended(self, *, lsn: int) -> ReplicationError:
        """The server ended COPY (get_copy_data returned -1): say why, as an error to raise."""
        result = self.pgconn.get_result()
        if result is not None and result.status == pq.ExecStatus.FATAL_ERROR:
            return self.result_error(result, "the server ended replication", lsn=lsn)
        # A walsender only ends COPY on its own when it shuts down (CopyDone before exit).
        return self.lost("the server ended replication", lsn=lsn)

    def end_copy(self, *, timeout: float, lsn: int) -> None:
        """Send CopyDone and read until the server confirms, dropping in-flight data: the
        caller's confirmed LSN is already reported, so anything unread is simply re-sent
        on the next start."""
        deadline = time.monotonic() + timeout
        try:
            self.pgconn.put_copy_end()
            self.pgconn.flush()
            while time.monotonic() < deadline:
                n, _ = self.pgconn.get_copy_data(1)
                if n == -1:
                    break
                if n == 0:
                    self.wait_readable(max(0.0, deadline - time.monotonic()), lsn=lsn)
            while self.pgconn.get_result() is not None and time.monotonic() < deadline:
                pass
        except psycopg.OperationalError as exc:
            raise self.lost("ending replication failed", lsn=lsn, cause=exc) from exc

    def close(self) -> None:
        if self._selector is not None:
            self._selector.close()
            self._selector = None
        if not self.closed:
            self.closed = True
            self.pgconn.finish()

    # --- errors ------------------------------------------------------------------------------

    def lost(
        self, detail: str, *, lsn: int | None, cause: Exception | None = None
    ) -> ReplicationError:
        message = _text(self.pgconn.error_message) if not self.closed else ""
        return ReplicationError(
            ErrorKind.CONNECTION,
            detail,
            slot=self.slot,
            lsn=lsn,
            server_message=message or (str(cause) if cause else None),
        )

    def result_error(
        self, result: pq_abc.PGresult, detail: str, *, lsn: int | None
    ) -> ReplicationError:
        sqlstate = _text(result.error_field(pq.DiagnosticField.SQLSTATE))
        message = _text(result.error_message) or _text(self.pgconn.error_message)
        if sqlstate == _OBJECT_IN_USE:
            kind = ErrorKind.SLOT_ACTIVE
        elif sqlstate.startswith(_CONNECTION_STATES) or self.pgconn.status == pq.ConnStatus.BAD:
            kind = ErrorKind.CONNECTION
        else:
            kind = ErrorKind.SERVER
        return ReplicationError(
            kind, detail, slot=self.slot, lsn=lsn, server_message=message, sqlstate=sqlstate
        )
