"""LSN text form and PostgreSQL-epoch timestamps."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from producer.pgoutput import (
    PG_EPOCH,
    format_lsn,
    parse_lsn,
    pg_timestamp_to_datetime,
    pg_timestamp_to_unix_micros,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "lsn"),
    [("0/0", 0), ("0/16B3748", 0x16B3748), ("1/0", 1 << 32), ("FFFFFFFF/FFFFFFFF", 2**64 - 1)],
)
def test_lsn_text_form(text: str, lsn: int) -> None:
    assert parse_lsn(text) == lsn
    assert format_lsn(lsn) == text


def test_parse_lsn_accepts_lower_case_and_padding_as_postgres_does() -> None:
    assert parse_lsn("0/016b3748") == 0x16B3748
    assert parse_lsn(" A/B ") == (0xA << 32) | 0xB


@pytest.mark.parametrize(
    "text", ["", "0", "0/", "/1", "0/1/2", "G/1", "123456789/0", "0x1/2", "-1/0"]
)
def test_parse_lsn_rejects_malformed_text(text: str) -> None:
    with pytest.raises(ValueError, match="LSN"):
        parse_lsn(text)


@pytest.mark.parametrize("lsn", [-1, 2**64])
def test_format_lsn_rejects_out_of_range(lsn: int) -> None:
    with pytest.raises(ValueError, match="LSN"):
        format_lsn(lsn)


@given(st.integers(0, 2**64 - 1))
def test_lsn_round_trip(lsn: int) -> None:
    assert parse_lsn(format_lsn(lsn)) == lsn


def test_pg_timestamps_are_microseconds_since_2000_utc() -> None:
    assert datetime(2000, 1, 1, tzinfo=UTC) == PG_EPOCH
    assert pg_timestamp_to_datetime(0) == PG_EPOCH
    # the constant is what PostgreSQL computes for this instant
    moment = pg_timestamp_to_datetime(773_156_096_123_456)
    assert moment == datetime(2024, 7, 1, 13, 34, 56, 123456, tzinfo=UTC)
    assert moment.tzinfo is UTC
    assert pg_timestamp_to_datetime(-1) == datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    assert pg_timestamp_to_unix_micros(0) == 946_684_800_000_000


@pytest.mark.parametrize("micros", [2**63 - 1, -(2**63)])
def test_pg_timestamp_outside_datetime_range_is_a_value_error(micros: int) -> None:
    with pytest.raises(ValueError, match=str(micros)):
        pg_timestamp_to_datetime(micros)
