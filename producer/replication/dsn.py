"""Connection strings: the replication variant of a DSN, and a log-safe rendering of it."""

from __future__ import annotations

from psycopg import conninfo
from psycopg.errors import ProgrammingError

from producer.replication.errors import ErrorKind, ReplicationError

_SECRET_KEYS = frozenset({"password", "sslpassword"})

# Output settings that pgoutput's text values depend on (they are produced by the walsender's own
# output functions): the value converters in schemas/ parse exactly these formats, and text and
# binary mode must agree (timestamptz text in UTC). Appended after the caller's options so they win.
WALSENDER_OUTPUT_OPTIONS = "-c DateStyle=ISO -c IntervalStyle=postgres -c TimeZone=UTC -c bytea_output=hex -c extra_float_digits=3"


def _parse(dsn: str) -> dict[str, str]:
    try:
        return {k: str(v) for k, v in conninfo.conninfo_to_dict(dsn).items()}
    except ProgrammingError as exc:
        # libpq's own message may quote the DSN (and the password) verbatim; don't repeat it.
        raise ReplicationError(ErrorKind.CONFIG, "can't parse the PostgreSQL DSN") from exc


def redact_dsn(dsn: str) -> str:
    """The DSN with passwords replaced by ``***`` (URI and key=value forms alike)."""
    params = _parse(dsn)
    return conninfo.make_conninfo(
        "", **{k: ("***" if k in _SECRET_KEYS else v) for k, v in params.items()}
    )


def replication_conninfo(dsn: str, *, application_name: str, connect_timeout: int) -> bytes:
    """The DSN for a walsender connection in database mode (logical decoding needs a database);
    the caller's application_name / connect_timeout win when already set.

    client_encoding is forced to UTF8: pgoutput converts names and text values to the client
    encoding, and the decoder (names) and value converters (text) read UTF-8. A DSN or
    PGCLIENTENCODING asking for another encoding would otherwise garble both. The output formats
    of text values are pinned too (WALSENDER_OUTPUT_OPTIONS).
    """
    params = _parse(dsn)
    params["replication"] = "database"
    params["client_encoding"] = "UTF8"
    params["options"] = f"{params.get('options', '')} {WALSENDER_OUTPUT_OPTIONS}".strip()
    params.setdefault("application_name", application_name)
    params.setdefault("connect_timeout", str(connect_timeout))
    return conninfo.make_conninfo("", **params).encode()


def sql_conninfo(dsn: str, *, application_name: str, connect_timeout: int) -> str:
    """The DSN for an ordinary SQL session next to the replication one (catalog checks)."""
    params = _parse(dsn)
    params.pop("replication", None)
    params.setdefault("application_name", application_name)
    params.setdefault("connect_timeout", str(connect_timeout))
    return conninfo.make_conninfo("", **params)
