"""DSN handling: passwords never reach logs; replication=database is added (no services)."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict

from producer.replication import ErrorKind, ReplicationError
from producer.replication.dsn import (
    WALSENDER_OUTPUT_OPTIONS,
    redact_dsn,
    replication_conninfo,
    sql_conninfo,
)
from producer.snapshot.reader import reader_conninfo

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "dsn",
    [
        "host=db user=u password=hunter2 dbname=app",
        "postgresql://u:hunter2@db:5432/app",
        "postgresql://u@db/app?password=hunter2&sslpassword=hunter2",
    ],
)
def test_redact_dsn_hides_passwords(dsn: str) -> None:
    redacted = redact_dsn(dsn)
    assert "hunter2" not in redacted
    assert "***" in redacted
    assert conninfo_to_dict(redacted)["user"] == "u"


def test_unparsable_dsn_does_not_echo_it() -> None:
    with pytest.raises(ReplicationError) as info:
        redact_dsn("host=db password='hunter2")
    assert info.value.kind is ErrorKind.CONFIG
    assert "hunter2" not in str(info.value)


def test_replication_conninfo_adds_database_mode() -> None:
    params = conninfo_to_dict(
        replication_conninfo(
            "host=db dbname=app", application_name="wb", connect_timeout=7
        ).decode()
    )
    assert params == {
        "host": "db",
        "dbname": "app",
        "replication": "database",
        "client_encoding": "UTF8",
        "application_name": "wb",
        "connect_timeout": "7",
        "options": WALSENDER_OUTPUT_OPTIONS,
    }


def test_caller_settings_win() -> None:
    params = conninfo_to_dict(
        replication_conninfo(
            "host=db application_name=mine connect_timeout=3",
            application_name="wb",
            connect_timeout=7,
        ).decode()
    )
    assert (params["application_name"], params["connect_timeout"]) == ("mine", "3")


def test_replication_conninfo_forces_utf8_whatever_the_dsn_says() -> None:
    # pgoutput sends names and text values in the client encoding; the decoder reads UTF-8.
    params = conninfo_to_dict(
        replication_conninfo(
            "host=db client_encoding=LATIN1", application_name="wb", connect_timeout=7
        ).decode()
    )
    assert params["client_encoding"] == "UTF8"


def test_sql_conninfo_drops_replication() -> None:
    params = conninfo_to_dict(
        sql_conninfo("host=db replication=database", application_name="wb", connect_timeout=7)
    )
    assert "replication" not in params


def test_replication_conninfo_appends_pinned_output_options_after_the_callers() -> None:
    params = conninfo_to_dict(
        replication_conninfo(
            "host=db options='-c DateStyle=German -c work_mem=8MB'",
            application_name="wb",
            connect_timeout=7,
        ).decode()
    )
    # libpq applies -c settings in order, so the pinned formats come last and win.
    assert params["options"] == f"-c DateStyle=German -c work_mem=8MB {WALSENDER_OUTPUT_OPTIONS}"


def test_snapshot_reader_flushes_its_watermarks_after_the_callers_options() -> None:
    # Under the caller's synchronous_commit=off a watermark would reach the walsender only at
    # the WAL writer's next flush; the reader's own setting comes last, so it wins.
    params = conninfo_to_dict(
        reader_conninfo("host=db options='-c synchronous_commit=off -c work_mem=8MB'")
    )
    options = params["options"]
    assert options.startswith("-c synchronous_commit=off -c work_mem=8MB ")
    assert options.endswith("-c synchronous_commit=local")
    assert WALSENDER_OUTPUT_OPTIONS in options
    assert params["application_name"] == "walbridge_snapshot"
