"""pgoutput timestamps: int64 microseconds since the PostgreSQL epoch, 2000-01-01 UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
# Microseconds between the Unix epoch and the PostgreSQL epoch.
PG_EPOCH_UNIX_MICROS = 946_684_800_000_000


def pg_timestamp_to_datetime(micros: int) -> datetime:
    """Microseconds since 2000-01-01 UTC -> an aware UTC ``datetime``.

    Raises ValueError when the instant lies outside ``datetime``'s years 1..9999
    (including PostgreSQL's ``±infinity`` sentinels, which never occur in commit times).
    """
    try:
        return PG_EPOCH + timedelta(microseconds=micros)
    except OverflowError as exc:
        raise ValueError(f"PostgreSQL timestamp {micros} us is outside datetime's range") from exc


def pg_timestamp_to_unix_micros(micros: int) -> int:
    """Microseconds since the PostgreSQL epoch -> microseconds since the Unix epoch."""
    return micros + PG_EPOCH_UNIX_MICROS
