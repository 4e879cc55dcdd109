"""Which LSN may be confirmed to PostgreSQL, given Kafka's delivery reports. Pure, no I/O.

A FIFO of transactions in decode (= commit) order, each with its count of events not yet
acknowledged. The slot may advance to a transaction's ``end_lsn`` only once it and every
earlier transaction are fully acknowledged, so a crash can never skip an unacknowledged event.
A failed delivery blocks the FIFO for good: nothing at or after it is ever confirmable.
"""

from __future__ import annotations

from collections import deque


class Ticket:
    """Delivery state of one transaction (mutable on purpose: updated per acknowledgement).

    ``end_lsn`` None after ``close``: an abandoned transaction (the stream reconnected mid-way
    and will resend it); it is drained without confirming anything.
    """

    __slots__ = (
        "closed", "commit_lsn", "commit_ts_ms", "end_lsn", "failure", "outstanding", "produced"
    )  # fmt: skip

    def __init__(self, commit_lsn: int | None, commit_ts_ms: int | None = None) -> None:
        self.commit_lsn = commit_lsn
        self.commit_ts_ms = commit_ts_ms
        self.end_lsn: int | None = None
        self.outstanding = 0
        self.produced = 0
        self.closed = False
        self.failure: str | None = None


class DeliveryTracker:
    def __init__(self) -> None:
        self._fifo: deque[Ticket] = deque()
        self.failed: Ticket | None = None
        self.last_confirmed: Ticket | None = None  # the ticket behind the last confirmable LSN

    def open(self, commit_lsn: int | None, commit_ts_ms: int | None = None) -> Ticket:
        """Start tracking a transaction (before producing its first event)."""
        ticket = Ticket(commit_lsn, commit_ts_ms)
        self._fifo.append(ticket)
        return ticket

    @staticmethod
    def sent(ticket: Ticket) -> None:
        """One more event of ``ticket`` was handed to Kafka."""
        ticket.outstanding += 1
        ticket.produced += 1

    @staticmethod
    def acked(ticket: Ticket) -> None:
        ticket.outstanding -= 1
        if ticket.outstanding < 0:
            raise ValueError("more acknowledgements than events sent")

    def fail(self, ticket: Ticket, detail: str) -> None:
        """A delivery of ``ticket`` failed: the ticket never completes, the first failure is kept."""
        ticket.failure = detail
        if self.failed is None:
            self.failed = ticket

    @staticmethod
    def close(ticket: Ticket, end_lsn: int | None) -> None:
        """All events of the transaction were produced; ``end_lsn`` is what to confirm (None:
        abandoned, confirm nothing for it)."""
        if ticket.closed:
            raise ValueError("ticket closed twice")
        ticket.end_lsn = end_lsn
        ticket.closed = True

    def confirmable(self) -> int | None:
        """Pop every complete transaction at the head of the FIFO; the highest ``end_lsn``
        among them, or None if the head is still incomplete (or nothing to pop has an LSN)."""
        fifo = self._fifo
        lsn: int | None = None
        while fifo:
            head = fifo[0]
            if not head.closed or head.outstanding or head.failure is not None:
                break
            fifo.popleft()
            if head.end_lsn is not None and (lsn is None or head.end_lsn > lsn):
                lsn = head.end_lsn
                self.last_confirmed = head
        return lsn

    @property
    def in_flight(self) -> int:
        """Transactions still tracked (open, or closed with unacknowledged events)."""
        return len(self._fifo)

    @property
    def outstanding_events(self) -> int:
        return sum(t.outstanding for t in self._fifo)
