"""The streaming loop against a scripted fake connection (no services): keepalive replies,
periodic status updates, confirm semantics, reconnect with backoff, clean close."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg
import pytest

from producer.replication import (
    ErrorKind,
    ReconnectPolicy,
    ReplicationConfig,
    ReplicationError,
    ReplicationStream,
)
from producer.replication.connection import WalsenderConnection

pytestmark = pytest.mark.unit

SLOT = "s"
WAIT = "wait"  # script step: get_copy_data returns 0 (libpq buffer drained)
END = "end"  # script step: the server ended COPY
LOST = "lost"  # script step: get_copy_data raises (connection dropped)


def xlogdata(wal_start: int, wal_end: int, payload: bytes) -> bytes:
    return b"w" + struct.pack("!QQq", wal_start, wal_end, 0) + payload


def keepalive(wal_end: int, reply: bool) -> bytes:
    return b"k" + struct.pack("!QqB", wal_end, 0, int(reply))


def status_flush_lsn(frame: bytes) -> int:
    assert frame[:1] == b"r"
    write, flush, apply = struct.unpack_from("!QQQ", frame, 1)
    assert write == flush == apply
    return int(flush)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakePGconn:
    script: list[bytes | str]
    clock: FakeClock
    wait_advances: float = 0.0

    def get_copy_data(self, async_: int) -> tuple[int, memoryview]:
        assert async_ == 1
        if not self.script:
            raise AssertionError("the loop read past the end of the script")
        step = self.script.pop(0)
        if step == WAIT:
            return 0, memoryview(b"")
        if step == END:
            return -1, memoryview(b"")
        if step == LOST:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        assert isinstance(step, bytes)
        return len(step), memoryview(step)


@dataclass
class FakeConn:
    """Stands in for WalsenderConnection; records what the stream sends."""

    script: list[bytes | str]
    clock: FakeClock
    sent: list[bytes] = field(default_factory=list)
    starts: list[bytes] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    start_error: ReplicationError | None = None
    ended: bool = False
    closed: bool = False

    def __post_init__(self) -> None:
        self.pgconn = FakePGconn(self.script, self.clock)
        self.slot = SLOT

    def start_copy_both(self, command: bytes, *, lsn: int) -> None:
        self.starts.append(command)
        if self.start_error is not None:
            raise self.start_error

    def wait_readable(self, timeout: float, *, lsn: int) -> None:
        self.waits.append(timeout)
        self.clock.now += timeout  # nothing arrived within the timeout

    def send(self, frame: bytes, *, lsn: int) -> None:
        self.sent.append(frame)

    def copy_ended(self, *, lsn: int) -> ReplicationError:
        return ReplicationError(
            ErrorKind.SERVER,
            "the server ended replication",
            slot=SLOT,
            lsn=lsn,
            server_message='ERROR:  replication slot "s" was dropped',
        )

    def lost(
        self, detail: str, *, lsn: int | None, cause: Exception | None = None
    ) -> ReplicationError:
        return ReplicationError(
            ErrorKind.CONNECTION, detail, slot=SLOT, lsn=lsn, server_message=str(cause)
        )

    def end_copy(self, *, timeout: float, lsn: int) -> None:
        self.ended = True

    def close(self) -> None:
        self.closed = True


def make_stream(
    conns: list[FakeConn],
    clock: FakeClock,
    *,
    interval: float = 10.0,
    policy: ReconnectPolicy | None = None,
    on_reconnect: Callable[[int], None] | None = None,
    sleeps: list[float] | None = None,
) -> ReplicationStream:
    config = ReplicationConfig(
        slot=SLOT,
        publication="p",
        status_interval=interval,
        reconnect=policy or ReconnectPolicy(initial_delay=1, max_delay=4, max_attempts=3),
    )
    pending = list(conns)

    def connect() -> WalsenderConnection:
        conn = pending.pop(0)
        return conn  # type: ignore[return-value]

    return ReplicationStream(
        config,
        connect,
        clock=clock,
        sleep=(sleeps.append if sleeps is not None else lambda _s: None),
        on_reconnect=on_reconnect,
    )


def test_yields_payload_views_with_positions() -> None:
    clock = FakeClock()
    conn = FakeConn([xlogdata(10, 11, b"B..."), xlogdata(12, 13, b"C...")], clock)
    stream = make_stream([conn], clock)
    it = iter(stream)
    payload, start, end = next(it)
    assert (bytes(payload), start, end) == (b"B...", 10, 11)
    assert isinstance(payload, memoryview)
    assert next(it)[1:] == (12, 13)
    assert stream.server_wal_end == 13
    assert conn.starts == [
        b'START_REPLICATION SLOT "s" LOGICAL 0/0 ("proto_version" \'1\', "publication_names" \'"p"\')'
    ]


def test_keepalive_requesting_reply_is_answered_at_once_with_confirmed_lsn() -> None:
    clock = FakeClock()
    conn = FakeConn(
        [
            xlogdata(5, 5, b"x"),
            keepalive(0x99, reply=False),
            keepalive(0x100, reply=True),
            xlogdata(7, 7, b"y"),
        ],
        clock,
    )
    stream = make_stream([conn], clock)
    it = iter(stream)
    next(it)
    stream.confirm(5)
    next(it)  # consumes both keepalives on the way to the next XLogData
    assert [status_flush_lsn(f) for f in conn.sent] == [5]  # one reply, for the 'reply' keepalive
    assert stream.server_wal_end == 0x100
    assert stream.last_keepalive is not None and stream.last_keepalive.wal_end == 0x100
    assert stream.last_keepalive_at == clock.now


def test_periodic_status_when_idle_never_advances_on_its_own() -> None:
    clock = FakeClock()
    conn = FakeConn([keepalive(0x500, reply=False), WAIT, WAIT, WAIT, xlogdata(1, 1, b"z")], clock)
    stream = make_stream([conn], clock, interval=2.0)
    next(iter(stream))
    # Each drained buffer waits exactly until the next status is due, then reports.
    assert conn.waits == [2.0, 2.0, 2.0]
    assert [status_flush_lsn(f) for f in conn.sent] == [0, 0]
    assert stream.confirmed_lsn == 0  # wal_end 0x500 seen, but only confirm() may move it


def test_confirm_is_monotonic_and_reported() -> None:
    clock = FakeClock()
    conn = FakeConn([xlogdata(1, 1, b"a"), keepalive(9, reply=True), xlogdata(2, 2, b"b")], clock)
    stream = make_stream([conn], clock)
    it = iter(stream)
    next(it)
    stream.confirm(40)
    stream.confirm(30)  # going back is a no-op
    assert stream.confirmed_lsn == 40
    next(it)
    assert status_flush_lsn(conn.sent[-1]) == 40
    with pytest.raises(ReplicationError):
        stream.confirm(-1)


def test_busy_stream_still_reports_on_time() -> None:
    clock = FakeClock()
    frames: list[bytes | str] = [xlogdata(i, i, b"p") for i in range(1, 1001)]
    conn = FakeConn(frames, clock)
    stream = make_stream([conn], clock, interval=1.0)
    it = iter(stream)
    for _ in range(600):
        next(it)
        clock.now += 0.01  # 6 s of a stream that never drains
    assert 4 <= len(conn.sent) <= 6  # once per simulated second, no more


def test_reconnect_resumes_from_confirmed_lsn_with_backoff() -> None:
    clock = FakeClock()
    first = FakeConn([xlogdata(0x10, 0x10, b"a"), LOST], clock)
    refused = FakeConn(
        [], clock, start_error=ReplicationError(ErrorKind.SLOT_ACTIVE, "active", slot=SLOT)
    )
    second = FakeConn([xlogdata(0x20, 0x20, b"b")], clock)
    sleeps: list[float] = []
    resumed: list[int] = []
    stream = make_stream(
        [first, refused, second], clock, sleeps=sleeps, on_reconnect=resumed.append
    )
    it = iter(stream)
    next(it)
    stream.confirm(0x18)
    assert bytes(next(it)[0]) == b"b"
    assert first.closed and refused.closed
    assert sleeps == [1, 2]  # the walsender still held the slot once: backed off and retried
    assert second.starts[0].startswith(b'START_REPLICATION SLOT "s" LOGICAL 0/18 ')
    assert resumed == [0x18]
    assert stream.reconnects == 1


def test_reconnect_gives_up_after_max_attempts_naming_slot_and_lsn() -> None:
    clock = FakeClock()
    lost = ReplicationError(
        ErrorKind.CONNECTION, "can't connect", slot=SLOT, server_message="refused"
    )
    conns = [FakeConn([LOST], clock)] + [FakeConn([], clock, start_error=lost) for _ in range(3)]
    sleeps: list[float] = []
    stream = make_stream(conns, clock, sleeps=sleeps)
    stream.confirm(0x1_0000_0000)
    with pytest.raises(ReplicationError) as info:
        next(iter(stream))
    assert info.value.kind is ErrorKind.CONNECTION
    assert sleeps == [1, 2, 4]
    assert "gave up reconnecting after 3 attempts" in str(info.value)
    assert "slot 's'" in str(info.value) and "lsn 1/0" in str(info.value)
    assert "refused" in str(info.value)


def test_non_retriable_errors_are_raised_not_retried() -> None:
    clock = FakeClock()
    conn = FakeConn([END], clock)
    sleeps: list[float] = []
    stream = make_stream([conn], clock, sleeps=sleeps)
    with pytest.raises(ReplicationError) as info:
        next(iter(stream))
    assert info.value.kind is ErrorKind.SERVER
    assert "was dropped" in str(info.value)
    assert sleeps == []


def test_unknown_frame_is_a_protocol_error() -> None:
    clock = FakeClock()
    stream = make_stream([FakeConn([b"zzz"], clock)], clock)
    with pytest.raises(ReplicationError) as info:
        next(iter(stream))
    assert info.value.kind is ErrorKind.PROTOCOL


def test_close_reports_final_position_then_ends_copy() -> None:
    clock = FakeClock()
    conn = FakeConn([xlogdata(1, 1, b"a")], clock)
    stream = make_stream([conn], clock)
    it = iter(stream)
    next(it)
    stream.confirm(0x77)
    stream.close()
    assert status_flush_lsn(conn.sent[-1]) == 0x77
    assert conn.ended and conn.closed
    assert list(it) == []  # the iterator ends after close()


def test_with_idle_yields_none_when_quiet_and_keeps_reporting() -> None:
    clock = FakeClock()
    conn = FakeConn(
        [
            xlogdata(1, 1, b"a"),
            keepalive(0x40, reply=False),
            WAIT,
            WAIT,
            WAIT,
            WAIT,
            xlogdata(2, 2, b"b"),
        ],
        clock,
    )
    stream = make_stream([conn], clock, interval=10.0)
    it = stream.with_idle(3.0)
    assert next(it) is not None
    assert next(it) is None  # 3 s without data (keepalives don't count)
    assert stream.server_wal_end == 0x40
    stream.confirm(stream.server_wal_end)  # what a producer with nothing in flight may do
    assert next(it) is None
    item = next(it)
    assert item is not None and bytes(item[0]) == b"b"
    # Waited 3 s, went idle, waited 3 s, idle again: the socket wait is bounded by idle_after.
    assert conn.waits == [3.0, 3.0]


def test_with_idle_rejects_non_positive() -> None:
    clock = FakeClock()
    with pytest.raises(ReplicationError):
        make_stream([FakeConn([], clock)], clock).with_idle(0)


@pytest.mark.parametrize("frame", [b"w" + b"\x00" * 10, b"k" + b"\x00" * 3])
def test_truncated_frames_name_slot_and_lsn(frame: bytes) -> None:
    clock = FakeClock()
    stream = make_stream([FakeConn([frame], clock)], clock)
    stream.confirm(0x2A)
    with pytest.raises(ReplicationError) as info:
        next(iter(stream))
    assert info.value.kind is ErrorKind.PROTOCOL
    assert "slot 's'" in str(info.value) and "lsn 0/2A" in str(info.value)
