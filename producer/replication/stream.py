"""The streaming loop: yield pgoutput payloads, report the confirmed LSN, survive disconnects."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator

import psycopg

from producer.pgoutput import format_lsn
from producer.replication.commands import start_replication_command
from producer.replication.config import ReplicationConfig
from producer.replication.connection import WalsenderConnection
from producer.replication.errors import ErrorKind, ReplicationError
from producer.replication.frames import (
    KEEPALIVE_TAG,
    XLOGDATA_HEADER,
    XLOGDATA_PAYLOAD_OFFSET,
    XLOGDATA_TAG,
    Keepalive,
    encode_standby_status,
    now_pg_micros,
    parse_keepalive,
    split_xlogdata,
)
from producer.replication.liveness import Liveness, Verdict

log = logging.getLogger(__name__)

Change = tuple[memoryview, int, int]  # (pgoutput payload, wal_start, wal_end)
_END_COPY_TIMEOUT = 5.0


class ReplicationStream:
    """Iterate to receive ``(payload, wal_start, wal_end)``; call ``confirm`` as events become
    durable downstream. After a reconnect the server resends everything after the confirmed
    LSN, starting at a transaction boundary: ``on_reconnect`` tells the consumer to drop any
    partial transaction (and decoder) state."""

    def __init__(
        self,
        config: ReplicationConfig,
        connect: Callable[[], WalsenderConnection],
        *,
        start_lsn: int = 0,
        connection: WalsenderConnection | None = None,
        on_reconnect: Callable[[int], None] | None = None,
        on_connection_lost: Callable[[ReplicationError], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._config = config
        self._connect = connect
        self._start_lsn = start_lsn
        self._conn = connection
        self._on_reconnect = on_reconnect
        # Called when the connection is lost and after each failed attempt, before the backoff
        # wait: the producer's health says why it is not streaming.
        self._on_connection_lost = on_connection_lost
        self._clock = clock
        self._sleep = sleep
        self._confirmed = 0
        self._server_wal_end = 0
        # The server's send time of the last message handed out (its clock, PostgreSQL epoch
        # microseconds; 0: none yet): how far behind the stream reads (snapshot pacing).
        self.last_send_time = 0
        self._last_keepalive: Keepalive | None = None
        self._last_keepalive_at: float | None = None
        self._next_status_at = 0.0
        self._streaming = False
        self._closed = False
        self._idle_sooner: float | None = None
        self.reconnects = 0

    # --- what the producer reads and sets ----------------------------------------------------

    @property
    def confirmed_lsn(self) -> int:
        return self._confirmed

    @property
    def server_wal_end(self) -> int:
        """Highest WAL position the server reported (XLogData or keepalive). When no
        transaction is in flight the producer may confirm this to let the slot advance."""
        return self._server_wal_end

    @property
    def last_keepalive(self) -> Keepalive | None:
        return self._last_keepalive

    @property
    def last_keepalive_at(self) -> float | None:
        """Local ``time.monotonic()`` when the last keepalive arrived."""
        return self._last_keepalive_at

    def confirm(self, lsn: int) -> None:
        """Report ``lsn`` as written, flushed and applied from the next status update on.
        Only ever moves forward: confirming less than before is a no-op."""
        if lsn < 0:
            raise ReplicationError(
                ErrorKind.CONFIG, f"can't confirm negative LSN {lsn}", slot=self._config.slot
            )
        if lsn > self._confirmed:
            self._confirmed = lsn

    def send_status(self, *, reply_requested: bool = False) -> None:
        """Send a Standby Status Update now (also resets the periodic timer)."""
        if self._conn is None or not self._streaming:
            return
        self._conn.send(
            encode_standby_status(
                self._confirmed, now_pg_micros(), reply_requested=reply_requested
            ),
            lsn=self._confirmed,
        )
        self._next_status_at = self._clock() + self._config.status_interval

    def idle_sooner(self, seconds: float | None) -> None:
        """Until called with None, yield the idle ``None`` after ``seconds`` without data
        instead of ``with_idle``'s ``idle_after`` (when that is longer). For a consumer with
        work pending on a quiet stream: the producer asks for it while Kafka acknowledgements
        are outstanding, so the last transaction before a pause is confirmed within
        milliseconds rather than after ``idle_after``. No effect without ``with_idle``."""
        if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
            raise ReplicationError(
                ErrorKind.CONFIG,
                f"idle_sooner must be > 0 seconds or None, got {seconds!r}",
                slot=self._config.slot,
            )
        self._idle_sooner = seconds

    # --- iteration -----------------------------------------------------------------------

    def __iter__(self) -> Iterator[Change]:
        """Changes only; waits on an idle server indefinitely (status updates continue)."""
        return self._run(None)  # type: ignore[return-value]  # no idle_after: never yields None

    def with_idle(self, idle_after: float) -> Iterator[Change | None]:
        """Changes, plus ``None`` after each ``idle_after`` seconds without one, so the caller
        gets control on a quiet server (to confirm ``server_wal_end``, flush, or stop)."""
        if not (math.isfinite(idle_after) and idle_after > 0):
            raise ReplicationError(
                ErrorKind.CONFIG,
                f"idle_after must be > 0 seconds, got {idle_after!r}",
                slot=self._config.slot,
            )
        return self._run(idle_after)

    def _run(self, idle_after: float | None) -> Iterator[Change | None]:
        while not self._closed:
            try:
                if not self._streaming:
                    self._start()
                yield from self._receive(math.inf if idle_after is None else idle_after)
            except ReplicationError as exc:
                if not exc.retriable or self._closed:
                    raise
                self._reconnect(exc)

    def _resume_lsn(self) -> int:
        return max(self._confirmed, self._start_lsn)

    def _start(self) -> None:
        if self._conn is None:
            self._conn = self._connect()
        lsn = self._resume_lsn()
        command = start_replication_command(self._config.slot, lsn, self._config.plugin_options())
        self._conn.start_copy_both(command, lsn=lsn)
        self._streaming = True
        self._next_status_at = self._clock() + self._config.status_interval
        log.info(
            "replication started",
            extra={
                "slot": self._config.slot,
                "lsn": format_lsn(lsn),
                "options": dict(self._config.plugin_options()),
            },
        )

    def _receive(self, idle_after: float) -> Iterator[Change | None]:
        conn = self._conn
        assert conn is not None
        get_copy_data = conn.pgconn.get_copy_data
        unpack_header = XLOGDATA_HEADER.unpack_from
        clock = self._clock
        last_data_at = clock()
        # Data and keepalives both prove the server is there; the hot path only stores a clock
        # value it reads anyway, the silence check runs where the loop would wait.
        heard_at = last_data_at
        live = Liveness(self._config.receive_timeout, last_heard=heard_at)
        drained_at = last_data_at  # when the socket was last read into libpq
        while not self._closed:
            try:
                n, frame = get_copy_data(1)
            except psycopg.OperationalError as exc:
                raise conn.lost("receiving data failed", lsn=self._confirmed, cause=exc) from exc
            if n > 0:
                tag = frame[0]
                if tag == XLOGDATA_TAG:
                    # split_xlogdata inlined (a call less per message)
                    if n < XLOGDATA_PAYLOAD_OFFSET:
                        try:
                            split_xlogdata(frame)  # raises the short-frame error
                        except ReplicationError as exc:
                            raise self._protocol_error(exc.detail) from exc
                    wal_start, wal_end, self.last_send_time = unpack_header(frame, 1)
                    if wal_end > self._server_wal_end:
                        self._server_wal_end = wal_end
                    yield frame[XLOGDATA_PAYLOAD_OFFSET:], wal_start, wal_end
                    # A stream that never drains must still report on time; a clock read
                    # is ~1% of the per-message cost, cheaper than being timed out.
                    last_data_at = heard_at = clock()
                    if last_data_at >= self._next_status_at:
                        self.send_status()
                elif tag == KEEPALIVE_TAG:
                    try:
                        keepalive = parse_keepalive(frame)
                    except ReplicationError as exc:
                        raise self._protocol_error(exc.detail) from exc
                    self._on_keepalive(keepalive)
                    heard_at = clock()
                else:
                    raise self._protocol_error(f"unknown CopyData tag {bytes(frame[:1])!r}")
            elif n == 0:
                # libpq's buffer is drained: the only place we wait on the socket.
                now = clock()
                if heard_at > live.last_heard:
                    live.heard(heard_at)
                verdict = live.verdict(now)
                if verdict is Verdict.DEAD:
                    if drained_at < live.next_check():
                        # Busy elsewhere past the deadline: read what the socket holds first.
                        conn.wait_readable(0.0, lsn=self._confirmed)
                        drained_at = clock()
                        continue
                    raise self._silent_error(live.silent_for(now))
                if verdict is Verdict.ASK:
                    self.send_status(reply_requested=True)
                    live.asked(now)
                    now = clock()
                elif now >= self._next_status_at:
                    self.send_status()
                    now = clock()
                wait = idle_after
                if self._idle_sooner is not None and self._idle_sooner < wait:
                    wait = self._idle_sooner  # only shortens a finite idle_after (with_idle)
                idle_at = last_data_at + wait
                if now >= idle_at:
                    last_data_at = now
                    yield None
                    continue
                timeout = min(self._next_status_at, idle_at, live.next_check()) - now
                conn.wait_readable(timeout, lsn=self._confirmed)
                drained_at = clock()
            else:
                raise conn.copy_ended(lsn=self._confirmed)

    def _on_keepalive(self, keepalive: Keepalive) -> None:
        self._last_keepalive = keepalive
        self._last_keepalive_at = self._clock()
        self.last_send_time = keepalive.send_time
        if keepalive.wal_end > self._server_wal_end:
            self._server_wal_end = keepalive.wal_end
        if keepalive.reply_requested:
            # The server is about to time us out (wal_sender_timeout): answer at once.
            self.send_status()

    def _silent_error(self, silent_s: float) -> ReplicationError:
        """Retriable: the connection is dropped and reconnected with backoff."""
        return ReplicationError(
            ErrorKind.CONNECTION,
            f"no message from the server for {silent_s:.1f} s, none after asking for one "
            f"(receive timeout {self._config.receive_timeout:g} s): the connection is silent",
            slot=self._config.slot,
            lsn=self._confirmed,
        )

    def _protocol_error(self, detail: str) -> ReplicationError:
        return ReplicationError(
            ErrorKind.PROTOCOL, detail, slot=self._config.slot, lsn=self._confirmed
        )

    # --- resilience ----------------------------------------------------------------------------

    def _drop_connection(self) -> None:
        self._streaming = False
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _reconnect(self, cause: ReplicationError) -> None:
        self._drop_connection()
        policy = self._config.reconnect
        last = cause
        give_up_at = None if policy.max_elapsed is None else self._clock() + policy.max_elapsed
        limit = f"{policy.max_attempts} attempts"
        for attempt, delay in enumerate(policy.delays(), start=1):
            if give_up_at is not None and self._clock() + delay > give_up_at:
                limit = f"{policy.max_elapsed:g} s"
                break
            if self._on_connection_lost is not None:
                self._on_connection_lost(last)
            log.warning(
                "replication connection lost; reconnecting",
                extra={
                    "slot": self._config.slot,
                    "lsn": format_lsn(self._resume_lsn()),
                    "attempt": attempt,
                    "max_attempts": policy.max_attempts,
                    "delay_s": delay,
                    "error": str(last),
                },
            )
            self._sleep(delay)
            if self._closed:
                return
            try:
                self._start()
            except ReplicationError as exc:
                # The terminated walsender may still hold the slot for a moment.
                if not (exc.retriable or exc.kind is ErrorKind.SLOT_ACTIVE):
                    self._drop_connection()
                    raise
                self._drop_connection()
                last = exc
                continue
            self.reconnects += 1
            if self._on_reconnect is not None:
                self._on_reconnect(self._resume_lsn())
            return
        raise ReplicationError(
            ErrorKind.CONNECTION,
            f"gave up reconnecting after {limit}",
            slot=self._config.slot,
            lsn=self._resume_lsn(),
            server_message=last.server_message,
            sqlstate=last.sqlstate,
        ) from last

    def close(self) -> None:
        """Report the confirmed LSN one last time, end COPY (CopyDone), drain, disconnect."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._conn is not None and self._streaming:
                self.send_status()
                self._conn.end_copy(timeout=_END_COPY_TIMEOUT, lsn=self._confirmed)
        except ReplicationError as exc:
            if not exc.retriable:
                raise
            # Already disconnected: nothing left to end. The slot keeps the last confirmed
            # LSN it received, so the next start resends anything after it.
            log.warning(
                "connection was already lost while closing",
                extra={
                    "slot": self._config.slot,
                    "lsn": format_lsn(self._confirmed),
                    "error": str(exc),
                },
            )
        finally:
            self._drop_connection()
