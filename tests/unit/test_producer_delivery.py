"""The delivery tracker: confirm a transaction's end LSN only when it and all before it are acked."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from producer.delivery import DeliveryTracker

pytestmark = pytest.mark.unit


def test_confirms_in_fifo_order_only() -> None:
    tracker = DeliveryTracker()
    first, second = tracker.open(100), tracker.open(200)
    for ticket in (first, first, second):
        tracker.sent(ticket)
    tracker.close(first, 150)
    tracker.close(second, 250)
    tracker.acked(second)
    assert tracker.confirmable() is None  # the second is done, the first is not
    tracker.acked(first)
    assert tracker.confirmable() is None
    tracker.acked(first)
    assert tracker.confirmable() == 250  # both pop at once; the highest end LSN wins
    assert tracker.last_confirmed is second
    assert tracker.in_flight == 0


def test_open_transaction_blocks_even_when_acked() -> None:
    tracker = DeliveryTracker()
    ticket = tracker.open(100)
    tracker.sent(ticket)
    tracker.acked(ticket)
    assert tracker.confirmable() is None  # more events may still come before Commit
    tracker.close(ticket, 120)
    assert tracker.confirmable() == 120


def test_empty_transaction_confirms_after_earlier_ones() -> None:
    tracker = DeliveryTracker()
    busy, empty = tracker.open(100), tracker.open(200)
    tracker.sent(busy)
    tracker.close(busy, 110)
    tracker.close(empty, 210)
    assert tracker.confirmable() is None
    tracker.acked(busy)
    assert tracker.confirmable() == 210


def test_failure_blocks_forever() -> None:
    tracker = DeliveryTracker()
    bad, later = tracker.open(100), tracker.open(200)
    tracker.sent(bad)
    tracker.sent(bad)
    tracker.close(bad, 110)
    tracker.close(later, 210)
    tracker.acked(bad)
    tracker.fail(bad, "timed out")
    assert tracker.failed is bad and bad.failure == "timed out"
    assert tracker.confirmable() is None
    assert tracker.in_flight == 2


def test_abandoned_transaction_drains_without_lsn() -> None:
    tracker = DeliveryTracker()
    first, abandoned = tracker.open(100), tracker.open(200)
    tracker.close(first, 110)
    tracker.sent(abandoned)
    tracker.close(abandoned, None)
    assert tracker.confirmable() == 110
    tracker.acked(abandoned)
    assert tracker.confirmable() is None
    assert tracker.in_flight == 0


def test_misuse_raises() -> None:
    tracker = DeliveryTracker()
    ticket = tracker.open(1)
    with pytest.raises(ValueError, match="more acknowledgements"):
        tracker.acked(ticket)
    tracker.close(ticket, 2)
    with pytest.raises(ValueError, match="closed twice"):
        tracker.close(ticket, 2)


@given(st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=20), st.randoms())
def test_never_confirms_past_an_unacked_event(sizes: list[int], rnd: object) -> None:
    import random

    assert isinstance(rnd, random.Random)
    tracker = DeliveryTracker()
    tickets = []
    for i, n in enumerate(sizes):
        ticket = tracker.open(i * 10)
        for _ in range(n):
            tracker.sent(ticket)
        tracker.close(ticket, i * 10 + 5)
        tickets.append(ticket)
    acks = [i for i, n in enumerate(sizes) for _ in range(n)]
    rnd.shuffle(acks)
    confirmed = -1
    for i in acks:
        tracker.acked(tickets[i])
        lsn = tracker.confirmable()
        if lsn is not None:
            assert lsn > confirmed
            confirmed = lsn
        # Every transaction at or before the confirmed one is fully acknowledged.
        for j, ticket in enumerate(tickets):
            if j * 10 + 5 <= confirmed:
                assert ticket.outstanding == 0
    final = tracker.confirmable()
    assert max(confirmed, final or -1) == (len(sizes) - 1) * 10 + 5
