"""Date/time values: pgoutput text or binary -> the Avro form chosen in ``type_mapping``.

In-range values use Avro logical types (``date``, ``time-micros``, ``timestamp-micros``,
``local-timestamp-micros``) given as plain ints, so fastavro writes them without re-deriving
them from ``datetime`` objects. Values that common readers cannot decode (fastavro 1.13 raises
for a date before 0001-01-01 or after 9999-12-31, for ``24:00:00`` and for timestamps outside
those years) and PostgreSQL's ``infinity``/``-infinity`` go to the union's ``string`` branch,
written with fastavro's ``("string", text)`` branch notation, as PostgreSQL's own text.

psycopg's loaders parse the in-range text values; they raise ``DataError`` for BC dates,
infinities and ``24:00:00``, and fold interval months into 30-day days. Those edges are
handled here by hand, each marked with a comment. Text values assume the replication session
runs with ``DateStyle=ISO``, ``IntervalStyle=postgres`` and ``TimeZone=UTC`` (see docs/producer.md).
"""

from __future__ import annotations

import datetime as dt
import re
import struct
from typing import Final

from psycopg import DataError
from psycopg.adapt import Transformer
from psycopg.postgres import types as builtin_types
from psycopg.pq import Format

_TX: Final = Transformer()
_load_date_text = _TX.get_loader(builtin_types["date"].oid, Format.TEXT).load
_load_time_text = _TX.get_loader(builtin_types["time"].oid, Format.TEXT).load
_load_ts_text = _TX.get_loader(builtin_types["timestamp"].oid, Format.TEXT).load
_load_tstz_text = _TX.get_loader(builtin_types["timestamptz"].oid, Format.TEXT).load

US_PER_SECOND: Final = 1_000_000
US_PER_DAY: Final = 86_400 * US_PER_SECOND
# PostgreSQL's binary date/timestamp epoch is 2000-01-01, Avro's is 1970-01-01.
PG_EPOCH_DAYS: Final = 10_957
PG_EPOCH_US: Final = PG_EPOCH_DAYS * US_PER_DAY
_UNIX_ORDINAL: Final = dt.date(1970, 1, 1).toordinal()
# The span fastavro's reader decodes: 0001-01-01 .. 9999-12-31 (as Unix days / micros).
MIN_AVRO_DAYS: Final = 1 - _UNIX_ORDINAL
MAX_AVRO_DAYS: Final = dt.date(9999, 12, 31).toordinal() - _UNIX_ORDINAL
MIN_AVRO_US: Final = MIN_AVRO_DAYS * US_PER_DAY
MAX_AVRO_US: Final = (MAX_AVRO_DAYS + 1) * US_PER_DAY - 1
_INT32_MAX: Final = 2**31 - 1
_INT32_MIN: Final = -(2**31)
_INT64_MAX: Final = 2**63 - 1
_INT64_MIN: Final = -(2**63)
_EPOCH_NAIVE: Final = dt.datetime(1970, 1, 1)
_EPOCH_UTC: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_ONE_US: Final = dt.timedelta(microseconds=1)

_unpack_i32 = struct.Struct("!i").unpack
_unpack_i64 = struct.Struct("!q").unpack
_unpack_timetz = struct.Struct("!qi").unpack
_unpack_interval = struct.Struct("!qii").unpack

Branch = tuple[str, str]  # fastavro's explicit union-branch notation


def _as_string(text: str) -> Branch:
    return ("string", text)


# --- rendering PostgreSQL's text for values Python's datetime cannot hold ------------------


def civil_from_days(unix_days: int) -> tuple[int, int, int]:
    """Proleptic Gregorian (year, month, day) of a Unix day number, for any year.

    Hand-written because ``datetime.date`` stops at years 1..9999 while PostgreSQL's dates
    run from 4714 BC to 5874897 AD (year 0 here is 1 BC, as in astronomical numbering).
    """
    z = unix_days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (1 if month <= 2 else 0)
    return year, month, day


def _render_ymd(unix_days: int) -> tuple[str, str]:
    """(``YYYY-MM-DD``, era suffix) as PostgreSQL's ISO DateStyle prints them."""
    year, month, day = civil_from_days(unix_days)
    if year <= 0:
        return f"{1 - year:04d}-{month:02d}-{day:02d}", " BC"
    return f"{year:04d}-{month:02d}-{day:02d}", ""


def render_time_of_day(us: int) -> str:
    """``HH:MM:SS[.ffffff]`` with trailing fractional zeros trimmed, like PostgreSQL."""
    seconds, frac = divmod(us, US_PER_SECOND)
    hours, rest = divmod(seconds, 3600)
    text = f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"
    if frac:
        text += f".{frac:06d}".rstrip("0")
    return text


def render_date(pg_days: int) -> str:
    """PostgreSQL's text for a binary date (days since 2000-01-01)."""
    if pg_days == _INT32_MAX:
        return "infinity"
    if pg_days == _INT32_MIN:
        return "-infinity"
    ymd, era = _render_ymd(pg_days + PG_EPOCH_DAYS)
    return ymd + era


def render_timestamp(pg_us: int, with_tz: bool) -> str:
    """PostgreSQL's text for a binary timestamp[tz] (micros since 2000-01-01), in UTC."""
    if pg_us == _INT64_MAX:
        return "infinity"
    if pg_us == _INT64_MIN:
        return "-infinity"
    days, us = divmod(pg_us + PG_EPOCH_US, US_PER_DAY)
    ymd, era = _render_ymd(days)
    return f"{ymd} {render_time_of_day(us)}{'+00' if with_tz else ''}{era}"


def render_utc_offset(east_seconds: int) -> str:
    """``+HH[:MM[:SS]]`` as PostgreSQL prints a zone offset."""
    sign = "-" if east_seconds < 0 else "+"
    hours, rest = divmod(abs(east_seconds), 3600)
    minutes, seconds = divmod(rest, 60)
    text = f"{sign}{hours:02d}"
    if minutes or seconds:
        text += f":{minutes:02d}"
    if seconds:
        text += f":{seconds:02d}"
    return text


# --- date ----------------------------------------------------------------------------------


def date_text(data: bytes) -> int | Branch:
    if len(data) == 10:  # YYYY-MM-DD: in Python's range, psycopg parses it
        return _load_date_text(data).toordinal() - _UNIX_ORDINAL
    # BC, year > 9999 and +-infinity: psycopg raises; keep PostgreSQL's own text.
    return _as_string(data.decode())


def date_binary(data: bytes) -> int | Branch:
    (pg_days,) = _unpack_i32(data)
    days = pg_days + PG_EPOCH_DAYS
    if MIN_AVRO_DAYS <= days <= MAX_AVRO_DAYS:
        return days
    return _as_string(render_date(pg_days))


# --- time, timetz --------------------------------------------------------------------------


def time_text(data: bytes) -> int | Branch:
    if data == b"24:00:00":  # valid in PostgreSQL, rejected by psycopg and by Avro readers
        return _as_string("24:00:00")
    t = _load_time_text(data)
    return ((t.hour * 60 + t.minute) * 60 + t.second) * US_PER_SECOND + t.microsecond


def time_binary(data: bytes) -> int | Branch:
    (us,) = _unpack_i64(data)
    if us >= US_PER_DAY:  # 24:00:00, see time_text
        return _as_string(render_time_of_day(us))
    return us


def timetz_text(data: bytes) -> str:
    return data.decode()


def timetz_binary(data: bytes) -> str:
    us, west_seconds = _unpack_timetz(data)  # the wire carries seconds *west* of UTC
    return render_time_of_day(us) + render_utc_offset(-west_seconds)


# --- timestamp, timestamptz ----------------------------------------------------------------


def timestamp_text(data: bytes) -> int | Branch:
    if data[4:5] == b"-" and not data.endswith(b" BC"):
        try:
            return (_load_ts_text(data) - _EPOCH_NAIVE) // _ONE_US
        except DataError:
            pass  # not representable by datetime: fall through to the text form
    # BC, year > 9999, +-infinity: psycopg raises; keep PostgreSQL's own text.
    return _as_string(data.decode())


def timestamp_binary(data: bytes) -> int | Branch:
    (pg_us,) = _unpack_i64(data)
    us = pg_us + PG_EPOCH_US
    if MIN_AVRO_US <= us <= MAX_AVRO_US:
        return us
    return _as_string(render_timestamp(pg_us, with_tz=False))


def timestamptz_text(data: bytes) -> int | Branch:
    if data[4:5] == b"-" and not data.endswith(b" BC"):
        try:
            us = (_load_tstz_text(data) - _EPOCH_UTC) // _ONE_US
        except DataError:
            pass  # beyond datetime's range once shifted to UTC: keep the text
        else:
            if MIN_AVRO_US <= us <= MAX_AVRO_US:
                return us
    return _as_string(data.decode())


def timestamptz_binary(data: bytes) -> int | Branch:
    (pg_us,) = _unpack_i64(data)
    us = pg_us + PG_EPOCH_US
    if MIN_AVRO_US <= us <= MAX_AVRO_US:
        return us
    return _as_string(render_timestamp(pg_us, with_tz=True))


# --- interval ------------------------------------------------------------------------------

# IntervalStyle=postgres: "[N year[s]] [N mon[s]] [N day[s]] [[+-]HH:MM:SS[.f]]".
_INTERVAL_RE: Final = re.compile(
    rb"^(?:([+-]?\d+) years? ?)?(?:([+-]?\d+) mons? ?)?(?:([+-]?\d+) days? ?)?"
    rb"(?:([+-])?(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?)?$"
)


# PostgreSQL 17+'s infinite intervals, as the server itself stores them (and sends them in
# binary): every field at its largest (``infinity``) or smallest (``-infinity``) value.
INTERVAL_INFINITY: Final = {"months": 2**31 - 1, "days": 2**31 - 1, "micros": 2**63 - 1}
INTERVAL_MINUS_INFINITY: Final = {"months": -(2**31), "days": -(2**31), "micros": -(2**63)}


def interval_text(data: bytes) -> dict[str, int]:
    """Hand-parsed: psycopg's loader folds months into 30-day days, which is lossy."""
    if data == b"infinity":
        return dict(INTERVAL_INFINITY)
    if data == b"-infinity":
        return dict(INTERVAL_MINUS_INFINITY)
    m = _INTERVAL_RE.match(data)
    if m is None or not data:
        raise ValueError("not an interval in IntervalStyle 'postgres'")
    years, mons, days, sign, hh, mm, ss, frac = m.groups()
    months = int(years or 0) * 12 + int(mons or 0)
    us = 0
    if hh is not None:
        us = (int(hh) * 3600 + int(mm) * 60 + int(ss)) * US_PER_SECOND
        if frac:
            us += int(frac.ljust(6, b"0"))
        if sign == b"-":
            us = -us
    return {"months": months, "days": int(days or 0), "micros": us}


def interval_binary(data: bytes) -> dict[str, int]:
    us, days, months = _unpack_interval(data)
    return {"months": months, "days": days, "micros": us}


# --- timestamptz as Debezium's ZonedTimestamp (the ``zoned-string`` setting) ---------------


def _zoned(us: int) -> str:
    """ISO-8601 in UTC as Debezium's ``io.debezium.time.ZonedTimestamp`` writes it:
    ``2040-08-22T08:00:00.123456Z``, the fraction without trailing zeros."""
    seconds, frac = divmod(us, US_PER_SECOND)
    text = (_EPOCH_NAIVE + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S")
    if frac:
        text += f".{frac:06d}".rstrip("0")
    return text + "Z"


def timestamptz_zoned_text(data: bytes) -> str:
    value = timestamptz_text(data)
    # Years outside 1..9999 and +-infinity keep PostgreSQL's text, as in the union form.
    return _zoned(value) if isinstance(value, int) else value[1]


def timestamptz_zoned_binary(data: bytes) -> str:
    value = timestamptz_binary(data)
    return _zoned(value) if isinstance(value, int) else value[1]
