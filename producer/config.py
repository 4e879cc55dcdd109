"""Producer configuration: every setting declared once, read from a flag or its variable.

Fails fast, before any I/O: the loader's errors (schemas.settings_loader: unknown variables, a
flag and a variable that disagree, malformed values, missing required settings), invalid values
and settings that contradict each other are ConfigErrors, exit status 2.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from producer.errors import ConfigError
from schemas.client_config import ClientConfigError, parse_pairs, registry_client_config
from schemas.settings_loader import SettingsError, read_settings, setting
from schemas.topics import TopicNameError, check_prefix
from schemas.type_mapping import TIMESTAMPTZ_FORMATS, TIMESTAMPTZ_MICROS

# The default of --snapshot-workers is the number of cores, at most this. bench_snapshot.py
# measured the workers' CPU at about twice the main thread's per row (8.8-13.6 against
# 4.7-6.0 µs), so two to three workers keep the producer's own thread (it frames and produces
# every row) busy, and a fourth covers ranges of unequal cost; past that the main thread is the
# bound, and each worker costs a session on the source and some 50 MB (docs/snapshots.md).
MAX_DEFAULT_SNAPSHOT_WORKERS: Final = 4


def default_snapshot_workers() -> int:
    return max(1, min(os.cpu_count() or 1, MAX_DEFAULT_SNAPSHOT_WORKERS))


COMPRESSION_CODECS: Final = ("none", "gzip", "snappy", "lz4", "zstd")
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR")
SNAPSHOT_MODES: Final = ("initial", "initial-only", "never")
ON_SLOT_LOSS: Final = ("stop", "resnapshot")
FAILOVER_SLOT_MODES: Final = ("auto", "on", "off")
ORIGINS: Final = ("any", "none")


@dataclass(frozen=True)
class ProducerConfig:
    # Secrets (a DSN, Kafka and registry settings that may hold passwords) stay out of repr,
    # and so out of logs and tracebacks.
    pg_dsn: str = setting(help="libpq connection string of the source database", secret=True)
    kafka_bootstrap: str = setting(help="Kafka bootstrap servers, host:port,...")
    schema_registry_url: str = setting(help="Confluent-compatible Schema Registry URL")
    publication: str = setting("walbridge", help="publication to stream (created if missing)")
    slot: str = setting("walbridge", help="logical replication slot (created if missing)")
    tables: str = setting(
        "", help='tables of a created publication, schema.table,... ("" = all tables)'
    )
    publish_via_partition_root: bool = setting(
        True,
        help="a created publication publishes a partitioned table under its root's name (one "
        "topic per parent); false: each leaf partition as a table of its own",
    )
    publish_generated_columns: bool = setting(
        False,
        help="a created publication also sends stored generated columns "
        "(publish_generated_columns = stored; PostgreSQL 18+); an existing one must say so too",
    )
    topic_prefix: str = setting("", help='topic name prefix ("" = the database name)')
    metrics_port: int = setting(9464, help="port of /metrics, /healthz, /readyz (0: none)")
    metrics_host: str = setting("0.0.0.0", help="address the metrics endpoint listens on")
    create_topics: bool = setting(True, help="create missing topics with the settings below")
    topic_partitions: int = setting(3, help="partitions of a created table topic")
    topic_replication_factor: int = setting(
        -1, help="replication factor of created topics (-1: the broker's default)"
    )
    topic_retention_ms: int = setting(0, help="retention.ms of created topics (0: the broker's)")
    compression: str = setting("lz4", help=f"Kafka compression, one of {COMPRESSION_CODECS}")
    linger_ms: int = setting(10, help="librdkafka linger.ms")
    queue_max_messages: int = setting(
        100_000, help="librdkafka's local queue bound (back-pressure)"
    )
    kafka_socket_timeout_ms: int = setting(
        30_000,
        help="librdkafka socket.timeout.ms: a broker request unanswered this long (a silent "
        "connection) is failed, the connection dropped and the request retried on a new one "
        "(socket.timeout.ms in --kafka-config, when given, wins)",
    )
    message_timeout_ms: int = setting(
        300_000, help="a delivery failing for this long stops the producer"
    )
    kafka_config: str = setting(
        "",
        help="extra librdkafka settings k=v,k=v (TLS, SASL, ...)",
        secret=True,
    )
    schema_registry_config: str = setting(
        "",
        help="SchemaRegistryClient settings k=v,k=v (basic.auth.user.info, ssl.ca.location, ...)",
        secret=True,
    )
    schema_registry_timeout_s: float = setting(
        10.0,
        help="seconds a registry request may take before it is retried with backoff (a silent "
        "registry would otherwise hold the producer forever; the timeout key of "
        "--schema-registry-config, when given, wins)",
    )
    registry_max_attempts: int = setting(
        0, help="attempts per registry call (0: retry an outage forever)"
    )
    messages: bool = setting(True, help="publish pg_logical_emit_message records")
    heartbeat_interval_s: float = setting(10.0, help="heartbeat record period (0: none)")
    idle_after_s: float = setting(
        1.0, help="quiet time after which in-flight state and the WAL end are confirmed"
    )
    replication_receive_timeout_s: float = setting(
        30.0,
        help="silence on the replication connection (no data, no keepalive) after which it "
        "counts as dead and is reconnected with backoff; at half of it the producer asks the "
        "server for a keepalive. Also bounds each replication command's answer",
    )
    status_interval_s: float = setting(
        10.0, help="Standby Status Update period (below wal_sender_timeout)"
    )
    lag_interval_s: float = setting(
        10.0, help="slot lag and health query period (wal_status, loss checks)"
    )
    on_slot_loss: str = setting(
        "stop",
        help="when the slot is lost (missing though Kafka shows it existed, wal_status lost, "
        "invalidated): stop, exit status 3, naming the WAL range that can't be read; "
        "resnapshot: log it, create a new slot and snapshot every published table again",
    )
    failover_slot: str = setting(
        "auto",
        help="create the slot as a failover slot (PostgreSQL 17+) so a promoted standby has it: "
        "auto (on where the server has them), on (17+ required), off",
    )
    origin: str = setting(
        "any",
        help="pgoutput origin (PostgreSQL 16+): none leaves out changes applied by logical "
        "replication from another node (bidirectional set-ups); any publishes them all",
    )
    reconnect_timeout_s: float = setting(
        300.0,
        help="keep reconnecting to PostgreSQL this long after the connection is lost (a "
        "failover leaves no primary for a while); 0: forever",
    )
    shutdown_grace_s: float = setting(30.0, help="on SIGTERM, flush for at most this long")
    log_level: str = setting("INFO", help=f"one of {LOG_LEVELS}")
    snapshot: str = setting(
        "initial",
        help="initial: a new slot snapshots every published table, and tables added later are "
        "snapshotted when they appear; initial-only: the same, then stop once the snapshots "
        "are in Kafka; never: changes only (signals still snapshot on demand)",
    )
    snapshot_chunk_rows: int = setting(20_000, help="rows per snapshot chunk, at most")
    snapshot_chunk_bytes: int = setting(
        64 * 1024 * 1024, help="bytes per snapshot chunk, about (TOASTed rows make smaller chunks)"
    )
    snapshot_chunk_budget_ms: int = setting(
        5,
        help="while changes stream, a snapshot chunk is sized to about this much publishing "
        "time (streamed changes wait behind it)",
    )
    snapshot_workers: int = setting(
        0,
        help="processes that read and encode snapshot chunks in parallel, one SQL connection "
        f"each; 0: the number of cores, at most {MAX_DEFAULT_SNAPSHOT_WORKERS}",
    )
    timestamptz_format: str = setting(
        TIMESTAMPTZ_MICROS,
        help="timestamp-micros: Avro's timestamp-micros (UTC), typed for Avro readers; "
        "zoned-string: Debezium's ZonedTimestamp ISO string (docs/downstream-tools.md, 'timestamptz')",
    )
    exactly_once: bool = setting(
        True,
        help="Kafka transactions: a read_committed reader sees every source transaction once, "
        "whatever was killed when; false: idempotent mode (a crash resends what was not "
        "confirmed)",
    )
    transactional_id: str = setting("", help='"" = walbridge.<topic prefix>.<slot>')
    # A Kafka transaction is committed once it is this old, or holds this many events or bytes
    # (checked at source commits and every 1024 events; a big source transaction spans
    # several Kafka transactions, and the resume point records how far it got).
    kafka_transaction_max_ms: int = setting(100, help="commit a Kafka transaction this old (ms)")
    kafka_transaction_max_events: int = setting(
        100_000, help="commit a Kafka transaction holding this many events"
    )
    kafka_transaction_max_bytes: int = setting(
        64 * 1024 * 1024, help="commit a Kafka transaction holding this many bytes"
    )
    kafka_transaction_timeout_ms: int = setting(
        60_000, help="the coordinator aborts a transaction this old"
    )
    # Exits at once (status 137, as kill -9) right after the Nth Kafka commit, before the slot
    # is confirmed: the window exactly-once must survive.
    fault_exit_after_kafka_commits: int = setting(0, help="testing only (0: off)")

    def __post_init__(self) -> None:
        for name in ("pg_dsn", "kafka_bootstrap", "schema_registry_url", "publication", "slot"):
            if not getattr(self, name):
                raise ConfigError(f"{name} must not be empty")
        if self.compression not in COMPRESSION_CODECS:
            raise ConfigError(
                f"compression must be one of {COMPRESSION_CODECS}, got {self.compression!r}"
            )
        if self.timestamptz_format not in TIMESTAMPTZ_FORMATS:
            raise ConfigError(
                f"timestamptz_format must be one of {TIMESTAMPTZ_FORMATS}, "
                f"got {self.timestamptz_format!r}"
            )
        for name, allowed in (
            ("on_slot_loss", ON_SLOT_LOSS),
            ("failover_slot", FAILOVER_SLOT_MODES),
            ("origin", ORIGINS),
        ):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not (math.isfinite(self.reconnect_timeout_s) and self.reconnect_timeout_s >= 0):
            raise ConfigError(
                f"reconnect_timeout_s must be >= 0 seconds, got {self.reconnect_timeout_s!r}"
            )
        if self.snapshot not in SNAPSHOT_MODES:
            raise ConfigError(f"snapshot must be one of {SNAPSHOT_MODES}, got {self.snapshot!r}")
        _at_least("snapshot_chunk_rows", self.snapshot_chunk_rows, 1)
        _at_least("snapshot_chunk_bytes", self.snapshot_chunk_bytes, 1)
        _at_least("snapshot_chunk_budget_ms", self.snapshot_chunk_budget_ms, 1)
        _at_least("snapshot_workers", self.snapshot_workers, 0)
        _at_least("kafka_transaction_max_ms", self.kafka_transaction_max_ms, 1)
        _at_least("kafka_transaction_max_events", self.kafka_transaction_max_events, 1)
        _at_least("kafka_transaction_max_bytes", self.kafka_transaction_max_bytes, 1)
        _at_least("kafka_transaction_timeout_ms", self.kafka_transaction_timeout_ms, 1000)
        _at_least("fault_exit_after_kafka_commits", self.fault_exit_after_kafka_commits, 0)
        if self.kafka_transaction_max_ms * 10 > self.kafka_transaction_timeout_ms:
            raise ConfigError(
                f"kafka_transaction_max_ms ({self.kafka_transaction_max_ms}) must be at most a "
                f"tenth of kafka_transaction_timeout_ms ({self.kafka_transaction_timeout_ms}): "
                "a commit (with its flush) must finish well inside the coordinator's timeout"
            )
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"log_level must be one of {LOG_LEVELS}, got {self.log_level!r}")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port must be 0-65535, got {self.metrics_port}")
        _at_least("topic_partitions", self.topic_partitions, 1)
        _at_least("linger_ms", self.linger_ms, 0)
        _at_least("queue_max_messages", self.queue_max_messages, 1)
        _at_least("message_timeout_ms", self.message_timeout_ms, 0)
        _at_least("registry_max_attempts", self.registry_max_attempts, 0)
        _at_least("topic_retention_ms", self.topic_retention_ms, -1)
        if self.topic_replication_factor == 0 or self.topic_replication_factor < -1:
            raise ConfigError(
                f"topic_replication_factor must be >= 1 or -1 (broker default), got {self.topic_replication_factor}"
            )
        for name in ("heartbeat_interval_s", "shutdown_grace_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name} must be >= 0 seconds, got {value!r}")
        _at_least("kafka_socket_timeout_ms", self.kafka_socket_timeout_ms, 10)
        for name in (
            "idle_after_s", "status_interval_s", "lag_interval_s", "replication_receive_timeout_s",
            "schema_registry_timeout_s",
        ):  # fmt: skip
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{name} must be > 0 seconds, got {value!r}")
        if self.replication_receive_timeout_s <= self.idle_after_s:
            raise ConfigError(
                f"replication_receive_timeout_s ({self.replication_receive_timeout_s}) must "
                f"exceed idle_after_s ({self.idle_after_s}): an idle stream is not a dead one"
            )
        if self.idle_after_s > self.status_interval_s:
            raise ConfigError(
                f"idle_after_s ({self.idle_after_s}) must not exceed status_interval_s ({self.status_interval_s})"
            )
        parse_kafka_config(self.kafka_config)
        if self.topic_prefix:
            try:
                check_prefix(self.topic_prefix)
            except TopicNameError as exc:
                raise ConfigError(str(exc)) from exc
        self.registry_client_config()

    def librdkafka_extra(self) -> dict[str, str]:
        return parse_kafka_config(self.kafka_config)

    def kafka_client(self) -> dict[str, str]:
        """What every Kafka client of the producer needs: the extra settings and the brokers."""
        return {**self.librdkafka_extra(), "bootstrap.servers": self.kafka_bootstrap}

    def registry_client_config(self) -> dict[str, str | int | float]:
        try:
            given = registry_client_config(self.schema_registry_config)
        except ClientConfigError as exc:
            raise ConfigError(str(exc)) from None
        return {"timeout": self.schema_registry_timeout_s, **given}


# Settings whose librdkafka keys the producer sets itself: overriding them would break the
# delivery guarantee or the partitioning contract.
RESERVED_KAFKA_KEYS: Final = frozenset(
    {
        "enable.idempotence", "acks", "request.required.acks", "partitioner",
        "max.in.flight.requests.per.connection", "max.in.flight", "retries",
        "message.send.max.retries", "bootstrap.servers", "on_delivery", "error_cb",
        "enable.gapless.guarantee", "transactional.id", "transaction.timeout.ms",
    }
)  # fmt: skip


def parse_kafka_config(text: str) -> dict[str, str]:
    try:
        extra = parse_pairs(text, "kafka_config")
    except ClientConfigError as exc:
        raise ConfigError(str(exc)) from None
    for key in extra:
        if key in RESERVED_KAFKA_KEYS:
            raise ConfigError(f"kafka_config must not set {key!r}: the producer sets it itself")
    return extra


def _at_least(name: str, value: int, low: int) -> None:
    if value < low:
        raise ConfigError(f"{name} must be >= {low}, got {value}")


_TRANSACTION_SETTINGS: Final = (
    "transactional_id", "kafka_transaction_max_ms", "kafka_transaction_max_events",
    "kafka_transaction_max_bytes", "kafka_transaction_timeout_ms",
    "fault_exit_after_kafka_commits",
)  # fmt: skip
_TOPIC_SETTINGS: Final = ("topic_partitions", "topic_replication_factor", "topic_retention_ms")


def load_config(argv: Sequence[str], env: Mapping[str, str]) -> ProducerConfig:
    """Flags, else WALBRIDGE_* variables, else defaults (schemas.settings_loader's rules)."""
    try:
        given = read_settings(
            ProducerConfig, argv, env, prog="walbridge-producer run",
            description="Stream PostgreSQL changes to Kafka as Avro events.",
        )  # fmt: skip
    except SettingsError as exc:
        raise ConfigError(str(exc)) from None
    _refuse_inapplicable(given)
    return ProducerConfig(**given)


def _refuse_inapplicable(given: Mapping[str, Any]) -> None:
    """Settings given for a feature that is switched off are a mistake worth stopping for."""
    for switch, dependants, meaning in (
        ("exactly_once", _TRANSACTION_SETTINGS, "only apply to Kafka transactions"),
        ("create_topics", _TOPIC_SETTINGS, "only apply when topics are created"),
    ):
        if given.get(switch) is False:
            clashing = [f"--{n.replace('_', '-')}" for n in dependants if n in given]
            if clashing:
                raise ConfigError(
                    f"{', '.join(clashing)} {meaning}; they conflict with "
                    f"--no-{switch.replace('_', '-')}"
                )
