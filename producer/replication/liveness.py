"""Is the walsender still there? Pure timing decisions for the replication connection.

A half-open connection (a proxy or a NAT box that holds the TCP session but passes nothing, a
server that froze) sends neither data nor a FIN: libpq would wait on it forever, and TCP
keepalives see nothing wrong while a middlebox acknowledges. So the stream counts the seconds
since it last heard anything from the server (data or a keepalive), like PostgreSQL's own
walreceiver does with ``wal_receiver_timeout``: after half of ``receive_timeout`` of silence it
asks for an answer (a Standby Status Update with replyRequested, which a walsender answers at
once with a keepalive); if the other half passes without a word, the connection is dead and is
dropped and reconnected with backoff.

The second half is measured from the request, not from the last message: a producer that was
busy elsewhere (blocked on Kafka, on the registry) and comes back to a quiet socket asks first
and gives the server its half-timeout to answer, rather than declaring a healthy connection
dead because *it* did not read for a while.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from producer.replication.errors import ErrorKind, ReplicationError


class Verdict(enum.Enum):
    QUIET = "quiet"  # nothing to do yet
    ASK = "ask"  # send a status update with replyRequested now
    DEAD = "dead"  # no answer to the request in time: drop the connection


@dataclass
class Liveness:
    """The silence clock of one connection; ``now`` is always ``time.monotonic()``-like."""

    receive_timeout: float
    last_heard: float
    asked_at: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.receive_timeout) and self.receive_timeout > 0):
            raise ReplicationError(
                ErrorKind.CONFIG,
                f"receive_timeout must be > 0 seconds, got {self.receive_timeout!r}",
            )

    @property
    def half(self) -> float:
        return self.receive_timeout / 2

    def heard(self, now: float) -> None:
        """Anything arrived from the server: it is alive."""
        self.last_heard = now
        self.asked_at = None

    def verdict(self, now: float) -> Verdict:
        """What to do at ``now``, with the socket drained (nothing unread)."""
        if self.asked_at is not None:
            return Verdict.DEAD if now - self.asked_at >= self.half else Verdict.QUIET
        return Verdict.ASK if now - self.last_heard >= self.half else Verdict.QUIET

    def asked(self, now: float) -> None:
        self.asked_at = now

    def next_check(self) -> float:
        """When ``verdict`` may change next (the latest a wait on the socket may last)."""
        if self.asked_at is not None:
            return self.asked_at + self.half
        return self.last_heard + self.half

    def silent_for(self, now: float) -> float:
        return now - self.last_heard
