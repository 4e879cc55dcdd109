"""Which snapshots a consumer batch counts as unfinished (schemas/snapshot_state.py)."""

from __future__ import annotations

from schemas.snapshot_state import DONE, RUNNING, TableState, unfinished_in_batch


def _record(table: str, status: str) -> tuple[bytes, bytes]:
    return table.encode(), TableState(table, status).encode()


def test_a_done_record_in_a_whole_batch_finishes_the_snapshot() -> None:
    got = unfinished_in_batch(frozenset({"s.a"}), [_record("s.a", DONE)], whole=True)
    assert got == (frozenset(), frozenset())


def test_a_done_record_in_a_capped_batch_keeps_it_unfinished() -> None:
    # The cap may have cut the data topics short of the snapshot's last rows.
    records = [_record("s.a", RUNNING), _record("s.a", DONE), _record("s.b", DONE)]
    got = unfinished_in_batch(frozenset(), records, whole=False)
    assert got == (frozenset({"s.a", "s.b"}), frozenset())


def test_a_capped_batch_keeps_what_was_unfinished_and_adds_what_started() -> None:
    got = unfinished_in_batch(frozenset({"s.a"}), [_record("s.b", RUNNING)], whole=False)
    assert got == (frozenset({"s.a", "s.b"}), frozenset())


def test_a_whole_batch_without_a_record_of_an_unfinished_table_asks_the_topic() -> None:
    got = unfinished_in_batch(frozenset({"s.a", "s.b"}), [_record("s.b", RUNNING)], whole=True)
    assert got == (frozenset({"s.a", "s.b"}), frozenset({"s.a"}))


def test_a_tombstone_in_a_whole_batch_finishes_it() -> None:
    got = unfinished_in_batch(frozenset({"s.a"}), [(b"s.a", None)], whole=True)
    assert got == (frozenset(), frozenset())
