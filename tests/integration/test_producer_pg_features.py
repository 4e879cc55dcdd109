"""What the producer does with features of later PostgreSQL majors (issue 39): failover slots
(17+), the origin filter (16+), and the refusals of a server that lacks them. Each test needs
a major and skips, saying so, only on a server below it; the refusals run on a PostgreSQL 15
of the version matrix."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest

from tests.support.pg_versions import pg_dsn_of, server_major  # noqa: F401
from tests.support.producer_harness import (
    ProducerProcess,
    Source,
    TopicReader,
    create_counter_table,
    insert_batches,
    query,
    sql,
    unique,
)

pytestmark = pytest.mark.integration


def _needs(dsn: str, major: int, feature: str) -> None:
    have = server_major(dsn)
    if have < major:
        pytest.skip(f"{feature} needs PostgreSQL {major}+; the server is PostgreSQL {have}")


@pytest.fixture
def table(pg_dsn: str) -> Iterator[str]:
    name = unique("pgfeat")
    create_counter_table(pg_dsn, name)
    yield name
    sql(pg_dsn, f"DROP TABLE IF EXISTS {name}")


def _sources(dsn: str, table: str, n: int) -> Iterator[list[Source]]:
    sources = [Source.create(dsn, [table], f"feat{i}") for i in range(n)]
    try:
        yield sources
    finally:
        for s in sources:
            s.drop()


@pytest.fixture
def source(pg_dsn: str, table: str) -> Iterator[Source]:
    yield from (s[0] for s in _sources(pg_dsn, table, 1))


def _failover(source: Source) -> bool | None:
    rows = query(
        source.dsn, "SELECT failover FROM pg_replication_slots WHERE slot_name = %s", (source.slot,)
    )
    assert rows, f"no slot {source.slot}"
    return rows[0][0]  # type: ignore[no-any-return]


def test_slot_is_created_as_a_failover_slot_on_17_plus(
    pg_dsn: str, kafka_bootstrap: str, registry_url: str, source: Source
) -> None:
    _needs(pg_dsn, 17, "failover slots")
    producer = ProducerProcess(source, kafka_bootstrap, registry_url).start()
    try:
        assert _failover(source) is True
    finally:
        assert producer.stop() == 0, producer.log()
    assert '"failover": true' in producer.log()
    # The session's server has no standby, so nothing makes the primary wait for one.
    assert "synchronized_standby_slots empty" in producer.log()


def test_existing_slot_without_failover_is_warned_about_or_altered(
    pg_dsn: str, kafka_bootstrap: str, registry_url: str, source: Source
) -> None:
    _needs(pg_dsn, 17, "failover slots")
    sql(pg_dsn, f"SELECT pg_create_logical_replication_slot('{source.slot}', 'pgoutput')")
    auto = ProducerProcess(source, kafka_bootstrap, registry_url).start()
    assert auto.stop() == 0, auto.log()
    # The log is JSON lines: the command's quotes are escaped.
    assert f'ALTER_REPLICATION_SLOT \\"{source.slot}\\" (FAILOVER true)' in auto.log()
    assert _failover(source) is False  # auto only warns
    on = ProducerProcess(source, kafka_bootstrap, registry_url, failover_slot="on").start()
    assert on.stop() == 0, on.log()
    assert _failover(source) is True


@pytest.fixture
def two_sources(pg_dsn: str, table: str) -> Iterator[list[Source]]:
    yield from _sources(pg_dsn, table, 2)


def test_origin_none_leaves_out_changes_applied_under_a_replication_origin(
    pg_dsn: str, kafka_bootstrap: str, registry_url: str, table: str, two_sources: list[Source]
) -> None:
    _needs(pg_dsn, 16, "the origin option")
    origin = unique("peer")
    local_only, every = two_sources
    producers = [
        ProducerProcess(local_only, kafka_bootstrap, registry_url, origin="none").start(),
        ProducerProcess(every, kafka_bootstrap, registry_url, origin="any").start(),
    ]
    try:
        insert_batches(pg_dsn, table, 1, 1, 3)  # made here

        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_replication_origin_create(%s)", (origin,))
            try:
                # As a logical replication apply worker does: changes "from another node".
                conn.execute("SELECT pg_replication_origin_session_setup(%s)", (origin,))
                conn.execute(f"INSERT INTO {table} SELECT g, 0, 'o' FROM generate_series(10, 14) g")
                conn.execute("SELECT pg_replication_origin_session_reset()")
            finally:
                conn.execute("SELECT pg_replication_origin_drop(%s)", (origin,))
        insert_batches(pg_dsn, table, 20, 1, 2)  # made here again
        end = local_only.current_lsn()
        for s in two_sources:
            s.wait_confirmed(end)
    finally:
        for p in producers:
            assert p.stop() == 0, p.log()
    reader = TopicReader(kafka_bootstrap, registry_url)

    def ids(s: Source) -> list[int]:
        records = reader.read_to_end([f"{s.prefix}.public.{table}"])
        return sorted(r.key["id"] for r in records)

    assert ids(local_only) == [1, 2, 3, 20, 21]
    assert ids(every) == [1, 2, 3, 10, 11, 12, 13, 14, 20, 21]


def test_settings_a_server_cannot_honour_are_refused_naming_its_version(
    pg_dsn_of: Callable[[int], str],
    kafka_bootstrap: str,
    registry_url: str,
) -> None:
    dsn = pg_dsn_of(15)
    name = unique("pg15feat")
    create_counter_table(dsn, name)
    source = Source.create(dsn, [name], "feat15")
    try:
        for setting, text in (
            ({"origin": "none"}, "origin 'none' needs PostgreSQL 16 or later; the server is "
             "PostgreSQL 15"),
            ({"failover_slot": "on"}, "failover slots need PostgreSQL 17 or later; the server "
             "is PostgreSQL 15"),
        ):  # fmt: skip
            producer = ProducerProcess(source, kafka_bootstrap, registry_url, **setting)
            producer.start(wait_ready=False)
            assert producer.proc is not None
            assert producer.proc.wait(120) == 2, producer.log()
            assert text in producer.log()
            assert source.confirmed_lsn() is None  # no slot was created
        auto = ProducerProcess(source, kafka_bootstrap, registry_url).start()  # auto: no FAILOVER
        assert auto.stop() == 0, auto.log()
        assert '"failover": false' in auto.log()
    finally:
        source.drop()
        sql(dsn, f"DROP TABLE IF EXISTS {name}")


def test_a_publication_dropped_while_streaming_stops_the_producer(
    pg_dsn: str, kafka_bootstrap: str, registry_url: str, source: Source, table: str
) -> None:
    """15-17 fail the stream at the next change; 18's pgoutput skips changes with a server-side
    WARNING instead, so the producer's own check must stop it (exit 1, naming the publication),
    never stream on as if nothing were missing."""
    producer = ProducerProcess(source, kafka_bootstrap, registry_url, lag_interval_s=1).start()
    try:
        insert_batches(pg_dsn, table, 1, 5, 10)
        source.wait_confirmed(source.current_lsn())
        sql(pg_dsn, f"DROP PUBLICATION {source.publication}")
        insert_batches(pg_dsn, table, 1000, 5, 10)
        assert producer.proc is not None
        code = producer.proc.wait(60)
    finally:
        if producer.proc is not None and producer.proc.poll() is None:
            producer.kill()
    assert code == 1, producer.log()
    if server_major(pg_dsn) >= 18:
        assert f"publication '{source.publication}' no longer exists" in producer.log()
    else:
        assert "does not exist" in producer.log() and source.publication in producer.log()
