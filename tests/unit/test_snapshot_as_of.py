"""The initial snapshot's boundary (producer.snapshot.as_of): parsing, visibility, the SQL."""

from __future__ import annotations

import pytest

from producer.snapshot.as_of import AsOf
from producer.snapshot.chunk_sql import chunk_copy

EPOCH = 1 << 32  # a snapshot taken after one xid wraparound: its 64-bit ids carry an epoch


def test_parse_and_text_round_trip() -> None:
    snapshot = AsOf.parse("750:760:751,755")
    assert snapshot == AsOf(750, 760, (751, 755))
    assert snapshot.text() == "750:760:751,755"
    assert AsOf.parse("10:10:") == AsOf(10, 10, ())


@pytest.mark.parametrize(
    "text", ["", "1:2", "x:2:", "20:10:", "10:20:25", "10:20:5", f"0:{1 << 31}:"]
)
def test_what_is_not_a_snapshot_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="pg_snapshot"):
        AsOf.parse(text)


@pytest.mark.parametrize(
    ("xid", "visible"),
    [
        (1, True),  # bootstrap
        (2, True),  # frozen
        (749, True),  # finished before the snapshot
        (750, True),  # xmin itself, not in progress: committed
        (751, False),  # in progress at the snapshot
        (754, True),
        (755, False),
        (759, True),
        (760, False),  # xmax: not yet started
        (9000, False),  # long after
    ],
)
def test_visibility(xid: int, visible: bool) -> None:
    assert AsOf(750, 760, (751, 755)).visible(xid) is visible


def test_visibility_across_the_32_bit_wraparound() -> None:
    # The snapshot straddles the point where 32-bit ids wrap: rows show 32-bit xmin values
    # (after 2**32 - 1 the counter goes on at 3: 0-2 are never a transaction's).
    snapshot = AsOf(EPOCH - 5, EPOCH + 6, (EPOCH + 4,))
    assert snapshot.visible((EPOCH - 100) % EPOCH)  # before xmin, before the wrap
    assert snapshot.visible((EPOCH - 1) % EPOCH)
    assert snapshot.visible(3)  # EPOCH + 3, after the wrap, finished
    assert not snapshot.visible((EPOCH + 4) % EPOCH)  # in progress
    assert not snapshot.visible((EPOCH + 6) % EPOCH)  # xmax
    assert not snapshot.visible((EPOCH + 1000) % EPOCH)


def test_the_chunk_reads_only_rows_the_snapshot_sees() -> None:
    snapshot = AsOf(EPOCH + 750, EPOCH + 760, (EPOCH + 755,))
    text = chunk_copy("s", "t", ["id", "v"], ["id"], ("7",), 100, snapshot).as_string(None)
    assert "WHERE (\"id\") > ('7') AND (xmin::text::int8 < 3" in text
    assert "- 750 + 4294967296) % 4294967296)" in text  # the 32-bit xmin, not the epoch's
    assert "NOT IN (755)" in text
    assert 'OR pg_column_toast_chunk_id("v") IS NOT NULL)' in text  # out-of-line values: read
    first = chunk_copy("s", "t", ["id"], ["id"], None, 100, snapshot).as_string(None)
    assert " WHERE (xmin::text::int8 < 3" in first
    plain = chunk_copy("s", "t", ["id"], ["id"], None, 100).as_string(None)
    assert "xmin" not in plain and "WHERE" not in plain
