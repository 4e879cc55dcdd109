"""The producer under network faults injected by Toxiproxy between it and PostgreSQL, Kafka and
the registry (issue 41): latency with jitter, a bandwidth limit, connections reset mid-stream, a
half-open silent connection, and a partition of a few seconds.

Each test runs one producer through every fault on one link, in turn, while a writer commits
small transactions straight to PostgreSQL (the fault is on the producer's side only), and
asserts what the producer did under each fault: rode it out without reconnecting (latency,
bandwidth), reconnected (reset, silence, partition), noticed a silent connection itself within
its stated timeout, and said "degraded" on /readyz while a dependency was unreachable. At the
end a read_committed reader finds every change once: nothing lost, nothing duplicated, and
nothing hung (every wait is bounded).

The consumer's link to Kafka (Spark's Kafka source) gets a partition and a reset while a
streaming query applies a backlog: the batch waits, the query resumes, and every table version
that a progress row names holds whole source transactions only.

The faults are kept short (a partition of 5 s, a silence just past the detection timeout):
the long ones belong to the torture run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from psycopg import sql as pgsql
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from spark_consumer.batch import BatchProcessor
from spark_consumer.config import ConsumerConfig
from spark_consumer.source import start
from spark_consumer.writer_schemas import WriterSchemas
from tests.support.network_faults import fault
from tests.support.producer_harness import (
    ProducerProcess,
    Source,
    TopicReader,
    create_counter_table,
    insert_batches,
    metric,
    sql,
    unique,
    verify_counter_table,
)
from tests.support.spark import spark  # noqa: F401
from tests.support.toxiproxy_client import Proxy, ToxiproxyApi
from tests.support.toxiproxy_stack import ProxiedStack, proxied_stack

pytestmark = pytest.mark.integration

RECEIVE_TIMEOUT_S = 4.0  # the producer's --replication-receive-timeout-s in these tests
KAFKA_SOCKET_TIMEOUT_MS = 4000
REGISTRY_TIMEOUT_S = 2.0
PARTITION_S = 5.0
SHORT_FAULT_S = 3.0
RECOVERY_S = 60.0  # generous: the machine runs at a load of 4-6


@pytest.fixture(scope="module")
def net(
    toxiproxy: ToxiproxyApi,
    pg_dsn: str,
    registry_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ProxiedStack]:
    home = tmp_path_factory.mktemp("netfaults") / "home"
    with proxied_stack(toxiproxy, pg_dsn, registry_url, home) as stack:
        yield stack


@pytest.fixture
def healed(net: ProxiedStack) -> Iterator[ProxiedStack]:
    net.heal()
    yield net
    net.heal()


@pytest.fixture
def table(pg_dsn: str) -> Iterator[str]:
    name = unique("nf")
    create_counter_table(pg_dsn, name)
    yield name
    sql(pg_dsn, f"DROP TABLE IF EXISTS {name}")


@pytest.fixture
def source(pg_dsn: str, table: str) -> Iterator[Source]:
    src = Source.create(pg_dsn, [table], "nf")
    yield src
    src.drop()


class Writer:
    """Commits a transaction of ``rows`` inserts every ``pause`` s, straight to PostgreSQL."""

    def __init__(self, dsn: str, table: str, rows: int = 5, pause: float = 0.05) -> None:
        self.dsn, self.table, self.rows, self.pause = dsn, table, rows, pause
        self.written = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psycopg

        statement = pgsql.SQL(
            "INSERT INTO {} SELECT g, 0, 'p' || g FROM generate_series(%s::int, %s::int) g"
        ).format(pgsql.Identifier(self.table))
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                first = self.written + 1
                conn.execute(statement, (first, first + self.rows - 1))
                self.written += self.rows
                self._stop.wait(self.pause)

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(30)
        return self.written


def producer_through(net: ProxiedStack, source: Source, **settings: object) -> ProducerProcess:
    producer = ProducerProcess(source, net.kafka_bootstrap, net.registry_url, **settings)
    producer.env["WALBRIDGE_PG_DSN"] = net.pg_dsn
    return producer


def readyz_during(producer: ProducerProcess, seconds: float) -> list[tuple[float, int, str]]:
    """/readyz every 0.2 s for ``seconds``: (seconds since the start, status, body)."""
    samples = []
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        try:
            status, body = producer.http("/readyz")
        except OSError as exc:  # the endpoint itself must stay up: record it, the test says
            status, body = 0, f"unanswered: {exc}"
        samples.append((elapsed, status, body.strip()))
        time.sleep(0.2)
    return samples


def wait_until(what: str, check: Callable[[], bool], producer: ProducerProcess) -> float:
    """Seconds until ``check()`` holds (at most RECOVERY_S); the producer must stay up."""
    start = time.monotonic()
    while not check():
        assert producer.proc is not None and producer.proc.poll() is None, producer.log()
        if time.monotonic() - start > RECOVERY_S:
            raise AssertionError(f"{what}: not within {RECOVERY_S}s\n{producer.log()}")
        time.sleep(0.2)
    return time.monotonic() - start


def log_mark(producer: ProducerProcess) -> int:
    return len(producer.log_path.read_text(errors="replace"))


def logged_since(producer: ProducerProcess, mark: int) -> str:
    """What the producer logged after ``log_mark`` (the harness's log() is only the tail)."""
    return producer.log_path.read_text(errors="replace")[mark:]


def events(producer: ProducerProcess) -> float:
    return metric(producer, "walbridge_events_total")


def reconnects(producer: ProducerProcess) -> float:
    return metric(producer, "walbridge_replication_reconnects_total")


def ready(producer: ProducerProcess) -> bool:
    try:
        return producer.http("/readyz")[0] == 200
    except OSError:
        return False


def rides_out(producer: ProducerProcess, proxy: Proxy, kind: str) -> None:
    """Latency and bandwidth: the producer keeps streaming through the fault, nothing reset."""
    before, reconnected = events(producer), reconnects(producer)
    with fault(proxy, kind):
        start = time.monotonic()
        # Events must go through while the fault holds, however slowly: with exactly-once on,
        # one Kafka commit under this latency is several round trips (the flush, EndTxn, the
        # broker's markers to itself through the same proxy, the next AddPartitionsToTxn),
        # 0.2-4.2 s in nine runs here, and the counter does not move meanwhile. So wait for it
        # (bounded) rather than sample it once after a fixed time.
        wait_until(f"events during {kind}", lambda: events(producer) > before, producer)
        time.sleep(max(0.0, SHORT_FAULT_S - (time.monotonic() - start)))
        during = events(producer)
    wait_until(f"events after {kind}", lambda: events(producer) > during, producer)
    assert reconnects(producer) == reconnected, f"{kind} made the producer reconnect"


def degraded_while(
    producer: ProducerProcess,
    proxy: Proxy,
    kind: str,
    seconds: float,
    reason: str,
    during: Callable[[], None] | None = None,
) -> list[tuple[float, int, str]]:
    """Hold the fault for ``seconds`` (running ``during`` first, under it); /readyz must say
    "degraded: <reason>..." meanwhile and be ready again afterwards. Returns the samples
    taken during the fault."""
    with fault(proxy, kind):
        if during is not None:
            during()
        samples = readyz_during(producer, seconds)
    assert all(status != 0 for _, status, _ in samples), samples  # /readyz always answered
    said = [(t, body) for t, status, body in samples if status == 503 and reason in body]
    assert said, f"/readyz never said {reason!r} during {kind}: {samples}\n{producer.log()}"
    wait_until(f"ready after {kind}", lambda: ready(producer), producer)
    return samples


def finish(producer: ProducerProcess, source: Source, writer: Writer, pg_dsn: str) -> int:
    """Stop writing, wait until the producer confirmed all of it, stop it cleanly; returns the
    number of changes written."""
    written = writer.stop()
    source.wait_confirmed(source.current_lsn(), timeout=120)
    assert producer.stop() == 0, producer.log()
    return written


def test_postgresql_faults(
    healed: ProxiedStack, pg_dsn: str, registry_url: str, source: Source, table: str
) -> None:
    producer = producer_through(
        healed, source, replication_receive_timeout_s=RECEIVE_TIMEOUT_S
    ).start()
    pg = healed.pg
    with Writer(pg_dsn, table) as writer:
        wait_until("first events", lambda: events(producer) > 0, producer)
        rides_out(producer, pg, "latency")
        rides_out(producer, pg, "bandwidth")

        # Reset mid-stream: the walsender connection dies under the producer, which reconnects.
        before = reconnects(producer)
        with fault(pg, "reset"):
            wait_until("a reset", lambda: "replication connection lost" in producer.log(), producer)
        wait_until("reconnected after reset", lambda: reconnects(producer) > before, producer)

        # Silent (half-open): the producer must notice by itself, within its receive timeout
        # (toxiproxy closes the connections only when the fault ends, 3 s later than that).
        before = reconnects(producer)
        samples = degraded_while(
            producer, pg, "silent", RECEIVE_TIMEOUT_S + 3.0, "PostgreSQL unreachable"
        )
        noticed = [t for t, _, body in samples if "no message from the server" in body]
        assert noticed, f"the silence was not detected by the producer: {samples}"
        # Detected within the timeout of the last message, which came at the latest when the
        # fault began (+2 s: a sample every 0.2 s on a loaded machine). The fault lasts 3 s
        # longer, so only the producer's own detection can say "no message from the server".
        assert noticed[0] <= RECEIVE_TIMEOUT_S + 2.0, samples
        wait_until("reconnected after silence", lambda: reconnects(producer) > before, producer)

        # Partition: connections closed, new ones refused; back with backoff afterwards.
        before = reconnects(producer)
        degraded_while(producer, pg, "partition", PARTITION_S, "PostgreSQL unreachable")
        wait_until("reconnected after partition", lambda: reconnects(producer) > before, producer)
        wait_until("events after the faults", lambda: events(producer) > 0, producer)
    written = finish(producer, source, writer, pg_dsn)
    records = TopicReader(healed.kafka_bootstrap, registry_url).read_to_end(
        [f"{source.prefix}.public.{table}"]
    )
    assert verify_counter_table(records, pg_dsn, table, written) == 0  # exactly once


def test_kafka_faults(
    healed: ProxiedStack, pg_dsn: str, registry_url: str, source: Source, table: str
) -> None:
    producer = producer_through(
        healed, source, kafka_socket_timeout_ms=KAFKA_SOCKET_TIMEOUT_MS
    ).start()
    kafka = healed.kafka
    with Writer(pg_dsn, table) as writer:
        wait_until("first events", lambda: events(producer) > 0, producer)
        rides_out(producer, kafka, "latency")
        rides_out(producer, kafka, "bandwidth")

        # Reset: librdkafka reports the broken connections and reconnects by itself.
        reported = producer.log().count("retried by librdkafka")
        with fault(kafka, "reset"):
            wait_until(
                "a reset reported",
                lambda: producer.log().count("retried by librdkafka") > reported,
                producer,
            )
        wait_until("ready after reset", lambda: ready(producer), producer)

        # Silent: requests time out after socket.timeout.ms, the Kafka commit is retried and
        # /readyz says so; a partition likewise.
        confirmed = source.confirmed_lsn()
        seconds = KAFKA_SOCKET_TIMEOUT_MS / 1000 + 3.0
        mark = log_mark(producer)
        degraded_while(producer, kafka, "silent", seconds, "Kafka brokers unreachable")
        # librdkafka gave up on the silent connection itself (socket.timeout.ms), before the
        # fault ended and the proxy closed it.
        assert "Timed out" in logged_since(producer, mark), producer.log()
        degraded_while(producer, kafka, "partition", PARTITION_S, "Kafka brokers unreachable")
        wait_until(
            "confirmed past the faults",
            lambda: (source.confirmed_lsn() or 0) > (confirmed or 0),
            producer,
        )
    written = finish(producer, source, writer, pg_dsn)
    records = TopicReader(healed.kafka_bootstrap, registry_url).read_to_end(
        [f"{source.prefix}.public.{table}"]
    )
    assert verify_counter_table(records, pg_dsn, table, written) == 0  # exactly once


def test_registry_faults(
    healed: ProxiedStack,
    pg_dsn: str,
    registry_url: str,
    source: Source,
    table: str,
) -> None:
    """The registry is asked only for schemas it has not seen: each fault holds while a new
    column changes the table's schema, so the producer must register through the fault."""
    producer = producer_through(
        healed, source, schema_registry_timeout_s=REGISTRY_TIMEOUT_S
    ).start()
    registry = healed.registry
    ids = iter(range(1, 1_000_000))

    def change_schema(column: str) -> None:
        sql(pg_dsn, f"ALTER TABLE {table} ADD COLUMN {column} int")
        for _ in range(3):
            n = next(ids)
            sql(pg_dsn, f"INSERT INTO {table} (id, v, pad, {column}) VALUES ({n}, 0, 'p', {n})")

    for kind in ("latency", "bandwidth"):
        before = events(producer)
        with fault(registry, kind):
            change_schema(f"c_{kind}")
            wait_until(
                f"events through {kind}", lambda b=before: events(producer) >= b + 3, producer
            )

    for kind, seconds in (("reset", SHORT_FAULT_S), ("silent", 6.0), ("partition", PARTITION_S)):
        retries, before = metric(producer, "walbridge_registry_retries_total"), events(producer)
        mark = log_mark(producer)
        degraded_while(
            producer,
            registry,
            kind,
            seconds,
            "schema registry unreachable",
            during=lambda kind=kind: change_schema(f"c_{kind}"),  # registering under the fault
        )
        assert metric(producer, "walbridge_registry_retries_total") > retries, kind
        if kind == "silent":  # the client's own timeout ended the request, then a retry
            assert "failed (attempt 1): timed out" in logged_since(producer, mark)
        wait_until(f"events after {kind}", lambda b=before: events(producer) >= b + 3, producer)

    written = next(ids) - 1
    source.wait_confirmed(source.current_lsn(), timeout=120)
    assert producer.stop() == 0, producer.log()
    records = TopicReader(healed.kafka_bootstrap, registry_url).read_to_end(
        [f"{source.prefix}.public.{table}"]
    )
    keys = [
        (r.value["source"]["commit_lsn"], r.value["transaction"]["total_order"]) for r in records
    ]
    assert len(keys) == len(set(keys)) == written  # every insert once
    assert sorted(r.value["after"]["id"] for r in records) == list(range(1, written + 1))


def test_consumer_kafka_faults(
    healed: ProxiedStack,
    pg_dsn: str,
    registry_url: str,
    source: Source,
    table: str,
    spark: SparkSession,
    tmp_path: Path,
) -> None:
    """Spark's Kafka source behind the proxy: a partition, then a reset, while the producer
    (through the same proxy) publishes transactions committed during each fault. The query
    must not fail, must apply them once the fault ends, and every table version a progress
    row names must hold whole source transactions only."""
    rows, per_step = 5, 10
    producer = producer_through(healed, source).start()  # the slot exists once it is ready
    insert_batches(pg_dsn, table, 1, per_step, rows)
    config = ConsumerConfig(
        kafka_bootstrap=healed.kafka_bootstrap,  # the only address the broker gives out
        schema_registry_url=registry_url,
        topic_prefix=source.prefix,
        lake_path=str(tmp_path / "lake"),
        checkpoint_path=str(tmp_path / "checkpoint"),
        trigger="1 seconds",
    )
    processor = BatchProcessor(spark, config, WriterSchemas.from_url(registry_url, {}))
    progress_path = f"{config.lake_path}/_walbridge/progress"
    lake_table = f"{config.lake_path}/public/{table}"

    def applied() -> int:
        try:
            return int(spark.read.format("delta").load(lake_table).count())
        except AnalysisException:  # the table does not exist before the first batch
            return 0

    source.wait_confirmed(source.current_lsn(), timeout=120)
    query = start(spark, config, processor)
    try:
        written = per_step * rows
        # The first batch of a cold JVM is slow (issue 16): a longer bound than the faults'.
        wait_until_query("the backlog applied", lambda: applied() == written, query, 4)
        for step, (kind, seconds) in enumerate((("partition", PARTITION_S), ("reset", 1.5))):
            with fault(healed.kafka, kind):
                # Committed during the fault: Kafka has them only once it ends.
                insert_batches(pg_dsn, table, written + 1, per_step, rows)
                time.sleep(seconds)
            assert query.isActive and query.exception() is None, f"the query failed in {kind}"
            written += per_step * rows
            # It waited, then resumed: what was committed during the fault reaches the lake.
            wait_until_query(
                f"rows after the {kind} ({step})", lambda n=written: applied() == n, query
            )
    finally:
        query.stop()
        producer.stop()
    assert query.exception() is None

    # Every table version a progress row names shows whole transactions: ids 1..5k.
    versions = [
        r["table_versions"][f"public.{table}"]
        for r in spark.read.format("delta").load(progress_path).collect()
        if f"public.{table}" in r["table_versions"]
    ]
    assert len(versions) >= 3, versions  # the backlog, then a batch after each fault
    for version in versions:
        ids = sorted(
            r["id"]
            for r in spark.read.format("delta")
            .option("versionAsOf", version)
            .load(lake_table)
            .select("id")
            .collect()
        )
        assert len(ids) % rows == 0 and ids == list(range(1, len(ids) + 1)), (version, ids)


def wait_until_query(
    what: str, check: Callable[[], bool], query: StreamingQuery, slack: int = 2
) -> None:
    """Until ``check()`` holds, at most ``slack`` x RECOVERY_S; the query must stay up."""
    start_at = time.monotonic()
    while not check():
        assert query.isActive, f"{what}: the query stopped: {query.exception()}"
        if time.monotonic() - start_at > RECOVERY_S * slack:
            raise AssertionError(
                f"{what}: not within {RECOVERY_S * slack}s; query status {query.status}, "
                f"last progress {query.lastProgress}"
            )
        time.sleep(0.5)
