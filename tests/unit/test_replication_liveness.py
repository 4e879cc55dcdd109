"""Silent-connection detection on the replication connection (no services): the pure silence
clock, the stream's ask-then-drop behaviour against a scripted connection, the answer timeout
of walsender commands, and the health reported while PostgreSQL is retried."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from producer.health import POSTGRES, HealthState
from producer.replication import (
    ErrorKind,
    ReconnectPolicy,
    ReplicationConfig,
    ReplicationError,
    ReplicationStream,
    connecting,
)
from producer.replication.connection import WalsenderConnection
from producer.replication.liveness import Liveness, Verdict
from tests.unit.test_replication_stream import (
    SLOT,
    WAIT,
    FakeClock,
    FakeConn,
    keepalive,
    xlogdata,
)

pytestmark = pytest.mark.unit


def reply_requested(frame: bytes) -> bool:
    """The last byte of a Standby Status Update ('r', write, flush, apply, time, reply)."""
    assert frame[:1] == b"r" and len(frame) == 1 + 8 * 4 + 1
    return frame[-1] == 1


# --- the silence clock ---------------------------------------------------------------------------


def test_asks_at_half_the_timeout_and_gives_up_half_a_timeout_after_asking() -> None:
    live = Liveness(10.0, last_heard=100.0)
    assert live.verdict(104.9) is Verdict.QUIET
    assert live.next_check() == 105.0
    assert live.verdict(105.0) is Verdict.ASK
    live.asked(105.0)
    assert live.verdict(109.9) is Verdict.QUIET
    assert live.next_check() == 110.0
    assert live.verdict(110.0) is Verdict.DEAD
    assert live.silent_for(110.0) == 10.0


def test_anything_heard_resets_the_clock_and_the_request() -> None:
    live = Liveness(10.0, last_heard=100.0)
    live.asked(105.0)
    live.heard(107.0)
    assert live.asked_at is None
    assert live.verdict(111.9) is Verdict.QUIET
    assert live.verdict(112.0) is Verdict.ASK


def test_coming_back_late_asks_first_instead_of_declaring_the_connection_dead() -> None:
    """Blocked elsewhere for a minute: the server gets half a timeout to answer the request."""
    live = Liveness(10.0, last_heard=100.0)
    assert live.verdict(160.0) is Verdict.ASK
    live.asked(160.0)
    assert live.verdict(164.0) is Verdict.QUIET


@pytest.mark.parametrize("timeout", [0.0, -1.0, float("inf"), float("nan")])
def test_receive_timeout_must_be_positive_and_finite(timeout: float) -> None:
    with pytest.raises(ReplicationError, match="receive_timeout must be > 0"):
        Liveness(timeout, last_heard=0.0)
    with pytest.raises(ReplicationError, match="receive_timeout must be > 0"):
        ReplicationConfig(slot="s", publication="p", receive_timeout=timeout)


# --- the stream ------------------------------------------------------------------------------------


def silent_stream(
    conns: list[FakeConn], clock: FakeClock, lost: list[ReplicationError], sleeps: list[float]
) -> ReplicationStream:
    config = ReplicationConfig(
        slot=SLOT,
        publication="p",
        status_interval=100.0,  # out of the way: only the liveness requests are sent
        receive_timeout=10.0,
        reconnect=ReconnectPolicy(initial_delay=1, max_delay=4, max_attempts=3),
    )
    pending = list(conns)
    return ReplicationStream(
        config,
        lambda: pending.pop(0),  # type: ignore[arg-type,return-value]
        clock=clock,
        sleep=sleeps.append,
        on_connection_lost=lost.append,
    )


def test_a_silent_connection_is_asked_then_dropped_and_reconnected_with_backoff() -> None:
    clock = FakeClock()
    start = clock.now
    silent = FakeConn([xlogdata(1, 1, b"a")] + [WAIT] * 6, clock)
    fresh = FakeConn([xlogdata(2, 2, b"b")], clock)
    lost: list[ReplicationError] = []
    sleeps: list[float] = []
    stream = silent_stream([silent, fresh], clock, lost, sleeps)
    it = iter(stream)
    next(it)
    assert bytes(next(it)[0]) == b"b"
    # One request for a reply, at half the timeout; no other status update in between.
    assert [reply_requested(f) for f in silent.sent] == [True]
    assert silent.closed and stream.reconnects == 1
    assert sleeps == [1]  # the first backoff delay
    (error,) = lost
    assert error.kind is ErrorKind.CONNECTION and error.retriable
    assert "no message from the server for 10.0 s" in str(error)
    assert "receive timeout 10 s" in str(error)
    # Detected 10 s after the last message (clock.now also moved by the fake waits only).
    assert clock.now - start == pytest.approx(10.0)


def test_an_answer_to_the_request_keeps_the_connection() -> None:
    clock = FakeClock()
    conn = FakeConn(
        [xlogdata(1, 1, b"a"), WAIT, WAIT, keepalive(5, reply=False), WAIT, xlogdata(2, 2, b"b")],
        clock,
    )
    lost: list[ReplicationError] = []
    stream = silent_stream([conn], clock, lost, [])
    it = iter(stream)
    next(it)
    assert bytes(next(it)[0]) == b"b"
    # Asked at 5 s of silence; the keepalive came before the 10 s mark: nothing dropped.
    assert [reply_requested(f) for f in conn.sent] == [True]
    assert lost == [] and stream.reconnects == 0 and not conn.closed


def test_a_deadline_passed_while_busy_elsewhere_reads_the_socket_before_giving_up() -> None:
    """Asked, then the caller held the loop (a Kafka wait) past the deadline: the answer may sit
    unread in the socket, so the stream reads it before calling the connection dead."""
    clock = FakeClock()
    script: list[bytes | str] = [xlogdata(1, 1, b"a"), WAIT, WAIT, WAIT, WAIT]
    script += [keepalive(5, reply=False), WAIT, xlogdata(2, 2, b"b")]
    conn = FakeConn(script, clock)
    lost: list[ReplicationError] = []
    stream = silent_stream([conn], clock, lost, [])
    it = stream.with_idle(6.0)
    next(it)
    assert next(it) is None  # idle at 6 s, after asking at 5 s
    clock.now += 20  # busy elsewhere, far past the deadline
    assert next(it) is None
    change = next(it)
    assert change is not None and bytes(change[0]) == b"b"
    assert 0.0 in conn.waits  # the socket was read without waiting
    assert lost == [] and stream.reconnects == 0


@dataclass
class ScriptedPGconn:
    """A libpq connection whose server never answers (only is_busy/consume_input are asked)."""

    sock: socket.socket
    sent: list[bytes] = field(default_factory=list)
    exec_calls: list[bytes] = field(default_factory=list)

    @property
    def socket(self) -> int:
        return self.sock.fileno()

    def send_query(self, command: bytes) -> None:
        self.sent.append(command)

    def consume_input(self) -> None:
        pass

    def is_busy(self) -> bool:
        return True

    def exec_(self, command: bytes) -> Any:
        self.exec_calls.append(command)
        return None

    error_message = b""


def test_a_walsender_command_without_an_answer_fails_after_the_timeout() -> None:
    left, right = socket.socketpair()
    with left, right:
        pg = ScriptedPGconn(left)
        conn = WalsenderConnection(pg, SLOT, answer_timeout=0.2)  # type: ignore[arg-type]
        started = time.monotonic()
        with pytest.raises(ReplicationError) as caught:
            conn.command(b"IDENTIFY_SYSTEM", lsn=0x10)
        assert 0.2 <= time.monotonic() - started < 5
    error = caught.value
    assert error.kind is ErrorKind.CONNECTION and error.retriable
    assert "IDENTIFY_SYSTEM: no answer from the server within 0.2 s" in str(error)
    assert error.slot == SLOT and error.lsn == 0x10
    assert pg.sent == [b"IDENTIFY_SYSTEM"]


def test_creating_a_slot_may_wait_for_running_transactions_without_a_timeout() -> None:
    left, right = socket.socketpair()
    with left, right:
        pg = ScriptedPGconn(left)
        conn = WalsenderConnection(pg, SLOT, answer_timeout=0.01)  # type: ignore[arg-type]
        with pytest.raises(AttributeError):  # the scripted exec_ answers None: not a result
            conn.command(b'CREATE_REPLICATION_SLOT "s" LOGICAL pgoutput')
    assert pg.exec_calls == [b'CREATE_REPLICATION_SLOT "s" LOGICAL pgoutput']
    assert pg.sent == []


# --- health ------------------------------------------------------------------------------------


def test_health_is_degraded_but_alive_while_postgresql_is_retried() -> None:
    health = HealthState(stall_after_s=60)
    health.streaming = True
    health.last_progress -= 50
    health.unreachable(POSTGRES, "no message from the server for 30.0 s")
    assert health.alive() == (True, "ok")  # retrying counts as progress
    ok, why = health.ready()
    assert not ok
    assert why == "degraded: PostgreSQL unreachable: no message from the server for 30.0 s"
    health.reachable("Kafka")  # another dependency coming back leaves this one reported
    assert not health.ready()[0]
    health.reachable(POSTGRES)
    assert health.ready() == (True, "ok")


# --- connecting ----------------------------------------------------------------------------------


def test_connect_deadline_follows_libpq_per_host_timeouts() -> None:
    assert connecting.connect_deadline_s(b"host=a connect_timeout=10") == 10
    assert connecting.connect_deadline_s(b"host=a,b connect_timeout=10") == 20
    assert connecting.connect_deadline_s(b"host=a connect_timeout=1") == 2  # libpq's minimum
    assert connecting.connect_deadline_s(b"host=a") is None


def test_connecting_to_a_silent_server_times_out_and_lets_other_threads_run() -> None:
    """A server that accepts TCP and never answers: psycopg's blocking connect would hold the
    GIL for the whole timeout (the health endpoint would stop answering)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        port = silent.getsockname()[1]
        ticks: list[float] = []
        done = threading.Event()

        def tick() -> None:
            while not done.is_set():
                ticks.append(time.monotonic())
                time.sleep(0.05)

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        started = time.monotonic()
        try:
            with pytest.raises(ReplicationError) as caught:
                WalsenderConnection.connect(
                    f"host=127.0.0.1 port={port} connect_timeout=2".encode(),
                    slot=SLOT,
                    display="silent",
                )
        finally:
            done.set()
            ticker.join(5)
        elapsed = time.monotonic() - started
    assert caught.value.kind is ErrorKind.CONNECTION
    assert "can't connect to silent" in str(caught.value)
    assert "timeout expired" in str(caught.value)
    assert 2 <= elapsed < 10
    # The other thread ran all along (a GIL-holding connect would leave none in between).
    assert len([t for t in ticks if started + 0.5 < t < started + 1.5]) >= 5
