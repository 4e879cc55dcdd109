"""Slot safety while streaming, against fakes (no services): START_REPLICATION refusals become
a slot loss that is never retried, reconnects keep trying for a time bound (a failover), the
slot monitor's metrics and verdict, the guard's reading of a refusal, and multi-host DSNs."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import psycopg
import pytest
from psycopg import conninfo, pq

from producer.lag import LagMonitor
from producer.metrics import Metrics
from producer.replication import (
    ErrorKind,
    ReconnectPolicy,
    ReplicationConfig,
    ReplicationError,
    ReplicationStream,
)
from producer.replication.connection import WalsenderConnection
from producer.replication.dsn import replication_conninfo, sql_conninfo
from producer.replication.setup import SlotState, SystemIdentity
from producer.slot_guard import SlotGuard
from producer.slot_loss import LossReason
from producer.slot_record import SlotRecord

pytestmark = pytest.mark.unit

SLOT = "s"


# --- the walsender's refusal ----------------------------------------------------------------


@dataclass
class FakeResult:
    status: pq.ExecStatus
    sqlstate: str
    error_message: bytes

    def error_field(self, field: pq.DiagnosticField) -> bytes | None:
        return self.sqlstate.encode() if field == pq.DiagnosticField.SQLSTATE else None


@dataclass
class FakePG:
    result: FakeResult
    status: pq.ConnStatus = pq.ConnStatus.OK
    error_message: bytes = b""

    def exec_(self, command: bytes) -> FakeResult:
        return self.result


@pytest.mark.parametrize(
    ("sqlstate", "message", "kind"),
    [
        ("42704", b'ERROR:  replication slot "s" does not exist', ErrorKind.SLOT_LOST),
        (
            "55000",
            b'ERROR:  can no longer get changes from replication slot "s"',
            ErrorKind.SLOT_LOST,
        ),
        ("55006", b'ERROR:  replication slot "s" is active for PID 7', ErrorKind.SLOT_ACTIVE),
        ("42601", b"ERROR:  syntax error", ErrorKind.SERVER),
    ],
)
def test_start_replication_refusals(sqlstate: str, message: bytes, kind: ErrorKind) -> None:
    pg = FakePG(FakeResult(pq.ExecStatus.FATAL_ERROR, sqlstate, message))
    conn = WalsenderConnection(pg, SLOT)  # type: ignore[arg-type]
    with pytest.raises(ReplicationError) as info:
        conn.start_copy_both(b"START_REPLICATION ...", lsn=0x10)
    assert info.value.kind is kind and info.value.sqlstate == sqlstate
    assert message.decode()[8:] in str(info.value) and "slot 's'" in str(info.value)
    assert not info.value.retriable or kind is ErrorKind.SLOT_ACTIVE


# --- the stream's reconnects --------------------------------------------------------------------


class Refusing:
    """A reconnect whose START_REPLICATION fails with ``error``; the first one streams and drops."""

    def __init__(self, error: ReplicationError | None) -> None:
        self.error = error
        self.slot = SLOT
        self.pgconn = self

    def get_copy_data(self, _async: int) -> tuple[int, memoryview]:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    def start_copy_both(self, command: bytes, *, lsn: int) -> None:
        if self.error is not None:
            raise self.error

    def lost(self, detail: str, *, lsn: int | None, cause: Exception | None = None) -> Any:
        return ReplicationError(ErrorKind.CONNECTION, detail, slot=SLOT, lsn=lsn)

    def close(self) -> None:
        pass


def _stream(conns: list[Refusing], policy: ReconnectPolicy, sleeps: list[float]) -> Any:
    now = [1000.0]

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds

    config = ReplicationConfig(slot=SLOT, publication="p", reconnect=policy)
    return ReplicationStream(
        config,
        lambda: conns.pop(0),
        clock=lambda: now[0],
        sleep=sleep,  # type: ignore[arg-type,return-value]
    )


def test_a_slot_lost_on_reconnect_is_raised_at_once_not_retried() -> None:
    gone = ReplicationError(ErrorKind.SLOT_LOST, "gone", slot=SLOT, sqlstate="42704")
    sleeps: list[float] = []
    stream = _stream([Refusing(None), Refusing(gone), Refusing(None)], ReconnectPolicy(), sleeps)
    with pytest.raises(ReplicationError) as info:
        next(iter(stream))
    assert info.value is gone and sleeps == [0.5]


def test_reconnects_keep_trying_until_the_time_bound() -> None:
    down = ReplicationError(ErrorKind.CONNECTION, "no primary", slot=SLOT)
    policy = ReconnectPolicy(initial_delay=0.5, max_delay=5, max_attempts=None, max_elapsed=30)
    sleeps: list[float] = []
    stream = _stream([Refusing(None)] + [Refusing(down) for _ in range(50)], policy, sleeps)
    with pytest.raises(ReplicationError, match="gave up reconnecting after 30 s"):
        next(iter(stream))
    assert sleeps[:5] == [0.5, 1, 2, 4, 5] and 25 < sum(sleeps) <= 30


def test_max_elapsed_must_be_positive() -> None:
    with pytest.raises(ReplicationError, match="max_elapsed"):
        ReconnectPolicy(max_elapsed=0)


# --- the slot monitor ---------------------------------------------------------------------------

ALIVE = SlotState(
    slot_name=SLOT, plugin="pgoutput", slot_type="logical", database="app", active_pid=9,
    confirmed_flush_lsn=0x3000, two_phase=False, wal_status="extended", restart_lsn=0x2000,
    safe_wal_size=4096,
)  # fmt: skip


class FakeSession:
    """Answers the monitor's query: (slot, server WAL position[, publication exists])."""

    def __init__(self, *answers: tuple[Any, ...]) -> None:
        self.answers = list(answers)

    def run(self, work: Any) -> tuple[Any, ...]:
        answer = self.answers.pop(0)
        return answer if len(answer) == 3 else (*answer, True)

    def close(self) -> None:
        pass


def _monitor(*answers: tuple[Any, ...]) -> tuple[LagMonitor, Metrics]:
    metrics = Metrics()
    monitor = LagMonitor("dbname=app", SLOT, 10.0, metrics, "pub")
    monitor._session = FakeSession(*answers)  # type: ignore[assignment]
    return monitor, metrics


def test_monitor_metrics_and_no_loss_while_the_slot_is_healthy() -> None:
    monitor, metrics = _monitor((ALIVE, 0x5000), (replace(ALIVE, safe_wal_size=None), 0x5000))
    monitor.check()
    value = metrics.registry.get_sample_value
    assert value("walbridge_slot_lag_bytes") == 0x2000
    assert value("walbridge_slot_retained_wal_bytes") == 0x3000
    assert value("walbridge_slot_safe_wal_size_bytes") == 4096
    assert value("walbridge_slot_wal_status", {"status": "extended"}) == 1
    assert monitor.loss is None
    monitor.check()
    assert math.isnan(value("walbridge_slot_safe_wal_size_bytes") or 0.0)


def test_monitor_finds_a_slot_invalidated_or_dropped_while_streaming() -> None:
    monitor, _ = _monitor((ALIVE, 0x5000), (replace(ALIVE, wal_status="lost"), 0x9000))
    monitor.check()
    monitor.check()
    assert monitor.loss is not None and monitor.loss.reason is LossReason.WAL_LOST
    assert (monitor.loss.from_lsn, monitor.loss.to_lsn) == (0x3000, 0x9000)
    gone, _ = _monitor((ALIVE, 0x5000), (None, 0x6000))
    gone.check()
    gone.check()
    assert gone.loss is not None and gone.loss.reason is LossReason.MISSING
    assert gone.loss.from_lsn == 0x3000  # the last confirmed position seen


def test_monitor_finds_the_publication_dropped_while_streaming() -> None:
    # PostgreSQL 18's pgoutput skips changes when the publication is gone, without an error.
    monitor, _ = _monitor((ALIVE, 0x5000), (ALIVE, 0x6000, False), (ALIVE, 0x7000, False))
    monitor.check()
    assert monitor.publication_missing_at is None
    monitor.check()
    monitor.check()
    assert monitor.publication_missing_at == 0x6000  # where it was first found missing


# --- the guard's reading of a refusal ---------------------------------------------------------

RECORD = SlotRecord(SLOT, "7311", 1, "app", 0x100, 0, 0x2000, True)


class FakeClient:
    def __init__(self, answer: tuple[SlotState | None, int] | ReplicationError) -> None:
        self.answer = answer
        self.identity = SystemIdentity("7311", 2, 0x7000, "app")

    def observe_slot(self) -> tuple[SlotState | None, int]:
        if isinstance(self.answer, ReplicationError):
            raise self.answer
        return self.answer


def _guard() -> tuple[SlotGuard, Metrics]:
    metrics = Metrics()
    guard = SlotGuard(
        slot=SLOT, resnapshot=False, kafka_conf={}, offsets_topic="db.offsets", sink=None,  # type: ignore[arg-type]
        eot=None, metrics=metrics, on_wait=lambda: None,
    )  # fmt: skip
    guard.record = RECORD
    return guard, metrics


def test_guard_reads_a_refusal_after_a_promotion_as_a_failover_without_the_slot() -> None:
    guard, metrics = _guard()
    refusal = ReplicationError(ErrorKind.SLOT_LOST, "gone", slot=SLOT, sqlstate="42704")
    error = guard.from_stream_error(FakeClient((None, 0x7000)), refusal, 0x3000)  # type: ignore[arg-type]
    assert error is not None and error.while_running
    assert error.loss.reason is LossReason.FAILOVER
    assert "from LSN 0/3000 to 0/7000" in str(error)
    assert (
        metrics.registry.get_sample_value("walbridge_slot_losses_total", {"reason": "failover"})
        == 1
    )


def test_guard_falls_back_on_the_servers_words_and_leaves_other_errors_alone() -> None:
    guard, _ = _guard()
    refusal = ReplicationError(
        ErrorKind.SLOT_LOST, "gone", slot=SLOT, sqlstate="55000",
        server_message="can no longer get changes from replication slot", lsn=0x3000,
    )  # fmt: skip
    no_sql = ReplicationError(ErrorKind.CONNECTION, "no session", slot=SLOT)
    error = guard.from_stream_error(FakeClient(no_sql), refusal, 0x3000)  # type: ignore[arg-type]
    assert error is not None and error.loss.reason is LossReason.INVALIDATED
    assert "can no longer get changes" in str(error)
    healthy = guard.from_stream_error(FakeClient((ALIVE, 0x7000)), refusal, 0x3000)  # type: ignore[arg-type]
    assert healthy is None  # the slot is fine: the caller raises the original error
    other = ReplicationError(ErrorKind.SERVER, "syntax", slot=SLOT)
    assert guard.from_stream_error(FakeClient((None, 0)), other, 0) is None  # type: ignore[arg-type]


# --- multi-host DSNs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dsn",
    [
        "host=a,b port=5432,5433 dbname=app user=u target_session_attrs=primary",
        "postgresql://u:secret@a:5432,b:5433/app?target_session_attrs=primary",
    ],
)
def test_multi_host_dsns_keep_every_host_and_the_primary_requirement(dsn: str) -> None:
    for rendered in (
        replication_conninfo(dsn, application_name="w", connect_timeout=10).decode(),
        sql_conninfo(dsn, application_name="w", connect_timeout=10),
    ):
        params = conninfo.conninfo_to_dict(rendered)
        assert (params["host"], params["port"]) == ("a,b", "5432,5433")
        assert params["target_session_attrs"] == "primary" and params["dbname"] == "app"
