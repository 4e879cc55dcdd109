"""Open a libpq connection without holding the GIL: PQconnectStart/PQconnectPoll and a select.

psycopg's ``pq.PGconn.connect`` is PQconnectdb, which holds Python's GIL for as long as it
blocks. Against a server that accepts the TCP connection and then says nothing (a half-open
connection, a silent proxy) that is the whole connect_timeout, and every other thread of the
producer stops with it: /healthz and /readyz stop answering, the slot monitor, librdkafka's
delivery callbacks. Polling the connection ourselves waits in ``select``, which lets them run.
"""

from __future__ import annotations

import select
import time

import psycopg
from psycopg import conninfo as pg_conninfo
from psycopg import pq
from psycopg.pq import abc as pq_abc


class ConnectTimeout(Exception):
    """No connection within the deadline (the libpq message is the caller's to word)."""


def connect_deadline_s(conninfo: bytes) -> float | None:
    """libpq's connect_timeout applies to each host of a multi-host DSN in turn: the overall
    bound is that times the hosts (None: no connect_timeout, wait as libpq would)."""
    params = pg_conninfo.conninfo_to_dict(conninfo.decode())
    timeout = int(str(params.get("connect_timeout") or 0))
    if timeout <= 0:
        return None
    hosts = str(params.get("host") or params.get("hostaddr") or "").count(",") + 1
    # libpq treats 1 as 2 seconds (a 1 s timeout could expire before a packet's round trip).
    return max(timeout, 2) * hosts


def connect(conninfo: bytes, deadline_s: float | None) -> pq_abc.PGconn:
    """A connected PGconn, or one whose status is BAD (its error_message says why); raises
    ``ConnectTimeout`` after ``deadline_s`` and psycopg.OperationalError when libpq can't
    even start (out of memory)."""
    pgconn = pq.PGconn.connect_start(conninfo)
    if pgconn.status == pq.ConnStatus.BAD:
        return pgconn
    give_up_at = None if deadline_s is None else time.monotonic() + deadline_s
    # PQconnectPoll's contract: start as if it had returned PGRES_POLLING_WRITING.
    status: int = pq.PollingStatus.WRITING
    while True:
        if status == pq.PollingStatus.OK or status == pq.PollingStatus.FAILED:
            return pgconn
        remaining = None if give_up_at is None else give_up_at - time.monotonic()
        if remaining is not None and remaining <= 0:
            pgconn.finish()
            raise ConnectTimeout(f"timeout expired after {deadline_s:g} s")
        # libpq may move to another socket (the next host, a retry without TLS): ask each time.
        fd = pgconn.socket
        if status == pq.PollingStatus.READING:
            select.select([fd], [], [], remaining)
        else:
            select.select([], [fd], [], remaining)
        try:
            status = pgconn.connect_poll()
        except psycopg.OperationalError:
            return pgconn  # status BAD with libpq's message, as PQconnectdb would leave it
