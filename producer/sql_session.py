"""An ordinary SQL connection next to the replication one, reopened after PostgreSQL restarts."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

from producer.replication.dsn import redact_dsn, sql_conninfo

log = logging.getLogger(__name__)
T = TypeVar("T")


class SqlSession:
    def __init__(self, dsn: str, application_name: str, attempts: int = 10) -> None:
        self._conninfo = sql_conninfo(dsn, application_name=application_name, connect_timeout=10)
        self._redacted = redact_dsn(dsn)
        self._attempts = attempts
        self._conn: psycopg.Connection[Any] | None = None

    def run(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``work(conn)``; a lost connection is reopened with backoff and ``work`` rerun
        (it must be a read-only look-up)."""
        delay = 0.5
        for attempt in range(1, self._attempts + 1):
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = psycopg.connect(self._conninfo, autocommit=True)
                return work(self._conn)
            except psycopg.OperationalError as exc:
                self.close()
                if attempt == self._attempts:
                    raise
                log.warning(
                    "SQL session lost; reconnecting",
                    extra={"dsn": self._redacted, "attempt": attempt, "error": str(exc)},
                )
                time.sleep(delay)
                delay = min(delay * 2, 15.0)
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
