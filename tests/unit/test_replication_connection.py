"""How server answers become ReplicationError kinds (retry or refuse), with libpq faked."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from psycopg import pq

from producer.replication import ErrorKind
from producer.replication.connection import WalsenderConnection

pytestmark = pytest.mark.unit


@dataclass
class FakeResult:
    sqlstate: bytes | None
    error_message: bytes

    def error_field(self, field: pq.DiagnosticField) -> bytes | None:
        assert field == pq.DiagnosticField.SQLSTATE
        return self.sqlstate


@dataclass
class FakePGconn:
    status: pq.ConnStatus = pq.ConnStatus.OK
    error_message: bytes = b""


@pytest.mark.parametrize(
    ("sqlstate", "status", "kind"),
    [
        (b"55006", pq.ConnStatus.OK, ErrorKind.SLOT_ACTIVE),  # slot active for another PID
        (b"57P01", pq.ConnStatus.OK, ErrorKind.CONNECTION),  # terminated by administrator
        (b"08006", pq.ConnStatus.OK, ErrorKind.CONNECTION),  # connection failure
        (b"42704", pq.ConnStatus.OK, ErrorKind.SERVER),  # e.g. slot does not exist
        (None, pq.ConnStatus.BAD, ErrorKind.CONNECTION),  # no SQLSTATE, socket gone
        (None, pq.ConnStatus.OK, ErrorKind.SERVER),
    ],
)
def test_result_error_kind_decides_retry(
    sqlstate: bytes | None, status: pq.ConnStatus, kind: ErrorKind
) -> None:
    conn = WalsenderConnection(FakePGconn(status), "s")  # type: ignore[arg-type]
    result = FakeResult(sqlstate, b"ERROR:  what the server said\n")
    error = conn.result_error(result, "START_REPLICATION failed", lsn=0x10)  # type: ignore[arg-type]
    assert error.kind is kind
    assert error.retriable is (kind is ErrorKind.CONNECTION)
    assert error.sqlstate == (sqlstate.decode() if sqlstate else None)
    assert str(error) == (
        f"{kind.value}: START_REPLICATION failed (slot 's', lsn 0/10);"
        " server said: ERROR:  what the server said"
    )
