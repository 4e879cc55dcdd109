"""Producer configuration: one spec per setting, read from a flag or its WALBRIDGE_* variable.

Fails fast: an unknown WALBRIDGE_* variable, a flag and a variable
that disagree, or settings that contradict each other are errors before any I/O.
Every setting ``x_y`` has the flag ``--x-y`` and the variable ``WALBRIDGE_X_Y``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Final

from producer.errors import ConfigError
from schemas import settings
from schemas.client_config import ClientConfigError, registry_client_config, with_secret_files
from schemas.topics import TopicNameError, check_prefix
from schemas.type_mapping import TIMESTAMPTZ_FORMATS, TIMESTAMPTZ_MICROS

ENV_PREFIX: Final = "WALBRIDGE_"
COMPRESSION_CODECS: Final = ("none", "gzip", "snappy", "lz4", "zstd")
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR")
SNAPSHOT_MODES: Final = ("initial", "initial-only", "never")


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true/false, got {text!r}")


@dataclass(frozen=True)
class ProducerConfig:
    # Settings that may hold a password stay out of repr (and so out of logs and tracebacks).
    pg_dsn: str = field(repr=False)
    kafka_bootstrap: str
    schema_registry_url: str
    publication: str = "walbridge"
    slot: str = "walbridge"
    tables: str = ""  # comma-separated schema.table; empty = all tables
    # A partitioned table is published under its root's name (one topic per parent); false
    # publishes each leaf partition as a table of its own.
    publish_via_partition_root: bool = True
    topic_prefix: str = ""  # empty: the database name
    metrics_port: int = 9464  # 0: no HTTP endpoint
    metrics_host: str = "0.0.0.0"
    create_topics: bool = True
    topic_partitions: int = 3
    topic_replication_factor: int = -1  # -1: the broker's default.replication.factor
    topic_retention_ms: int = 0  # 0: the broker's default
    compression: str = "lz4"
    linger_ms: int = 10
    queue_max_messages: int = 100_000  # librdkafka's local queue bound (back-pressure)
    message_timeout_ms: int = 300_000  # a delivery failing for this long stops the producer
    kafka_config: str = field(
        default="", repr=False
    )  # extra librdkafka settings "k=v,k=v" (TLS, SASL, ...)
    # SchemaRegistryClient settings "k=v,k=v" (basic.auth.user.info, ssl.ca.location, ...)
    schema_registry_config: str = field(default="", repr=False)
    registry_max_attempts: int = 0  # per registry call; 0 = retry an outage forever
    messages: bool = True  # publish pg_logical_emit_message records
    heartbeat_interval_s: float = 10.0  # 0: no heartbeat records
    idle_after_s: float = 1.0  # quiet time after which in-flight state and WAL end are confirmed
    status_interval_s: float = 10.0  # Standby Status Update period (< wal_sender_timeout)
    lag_interval_s: float = 10.0  # slot lag query period
    shutdown_grace_s: float = 30.0  # SIGTERM: flush for at most this long
    log_level: str = "INFO"
    # initial: a new slot snapshots every published table (and tables added later are
    # snapshotted when they appear); initial-only: the same, then stop once the snapshots are
    # in Kafka; never: changes only (signals still snapshot on demand).
    snapshot: str = "initial"
    snapshot_chunk_rows: int = 20_000  # rows per chunk, at most
    snapshot_chunk_bytes: int = 64 * 1024 * 1024  # and about this many bytes (TOASTed rows)
    # timestamp-micros: Avro's timestamp-micros (UTC), typed for Avro readers; zoned-string:
    # Debezium's ZonedTimestamp ISO string, for Debezium-aware sinks (README, "timestamptz").
    timestamptz_format: str = TIMESTAMPTZ_MICROS
    # Kafka transactions: a read_committed reader sees every source transaction once, whatever
    # was killed when. Off: idempotent mode (a crash resends what was not confirmed).
    exactly_once: bool = True
    transactional_id: str = ""  # empty: walbridge.<topic prefix>.<slot>
    # A Kafka transaction is committed once it is this old, or holds this many events or bytes
    # (checked at source commits and every 1024 events; a big source transaction spans
    # several Kafka transactions, and the resume point records how far it got).
    kafka_transaction_max_ms: int = 100
    kafka_transaction_max_events: int = 100_000
    kafka_transaction_max_bytes: int = 64 * 1024 * 1024
    kafka_transaction_timeout_ms: int = 60_000  # the coordinator aborts a transaction this old
    # Testing only: exit at once (status 137, as kill -9) right after the Nth Kafka commit,
    # before the slot is confirmed: the window exactly-once must survive. 0: off.
    fault_exit_after_kafka_commits: int = 0

    def __post_init__(self) -> None:
        for name in ("pg_dsn", "kafka_bootstrap", "schema_registry_url", "publication", "slot"):
            if not getattr(self, name):
                raise ConfigError(f"{name} is required (flag --{_flag(name)} or {env_name(name)})")
        if self.compression not in COMPRESSION_CODECS:
            raise ConfigError(
                f"compression must be one of {COMPRESSION_CODECS}, got {self.compression!r}"
            )
        if self.timestamptz_format not in TIMESTAMPTZ_FORMATS:
            raise ConfigError(
                f"timestamptz_format must be one of {TIMESTAMPTZ_FORMATS}, "
                f"got {self.timestamptz_format!r}"
            )
        if self.snapshot not in SNAPSHOT_MODES:
            raise ConfigError(f"snapshot must be one of {SNAPSHOT_MODES}, got {self.snapshot!r}")
        _at_least("snapshot_chunk_rows", self.snapshot_chunk_rows, 1)
        _at_least("snapshot_chunk_bytes", self.snapshot_chunk_bytes, 1)
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
        for name in ("idle_after_s", "status_interval_s", "lag_interval_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{name} must be > 0 seconds, got {value!r}")
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

    def registry_client_config(self) -> dict[str, str | int]:
        try:
            return registry_client_config(self.schema_registry_config)
        except ClientConfigError as exc:
            raise ConfigError(str(exc)) from None


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
    extra: dict[str, str] = {}
    for number, item in enumerate((part.strip() for part in text.split(",")), 1):
        if not item:
            continue
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            # Its position, not its text: a comma inside a password splits it into such items.
            raise ConfigError(f"kafka_config: item {number} is not key=value")
        if key in RESERVED_KAFKA_KEYS:
            raise ConfigError(f"kafka_config must not set {key!r}: the producer sets it itself")
        extra[key] = value.strip()
    return extra


def _at_least(name: str, value: int, low: int) -> None:
    if value < low:
        raise ConfigError(f"{name} must be >= {low}, got {value}")


def _flag(name: str) -> str:
    return name.replace("_", "-")


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


_FIELDS = {f.name: f for f in fields(ProducerConfig)}
_TRANSACTION_SETTINGS: Final = (
    "transactional_id", "kafka_transaction_max_ms", "kafka_transaction_max_events",
    "kafka_transaction_max_bytes", "kafka_transaction_timeout_ms",
    "fault_exit_after_kafka_commits",
)  # fmt: skip
_PARSERS: Final[dict[str, Callable[[str], Any]]] = {
    "int": int,
    "float": float,
    "bool": _bool,
    "str": str,
}


def _parser_for(name: str) -> Callable[[str], Any]:
    return _PARSERS[str(_FIELDS[name].type)]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="walbridge-producer run",
        description="Stream PostgreSQL changes to Kafka as Avro events. Every flag --x-y can "
        "also be set as WALBRIDGE_X_Y.",
        allow_abbrev=False,
    )
    for name, spec in _FIELDS.items():
        kind = str(spec.type)
        if kind == "bool":
            parser.add_argument(
                f"--{_flag(name)}", dest=name, default=None, action=argparse.BooleanOptionalAction,
                help=f"env {env_name(name)} (default {spec.default})",
            )  # fmt: skip
        else:
            default = "required" if spec.default is MISSING else spec.default
            parser.add_argument(
                f"--{_flag(name)}", dest=name, default=None, type=_parser_for(name),
                help=f"env {env_name(name)} (default {default})",
            )  # fmt: skip
    return parser


def load_config(argv: Sequence[str], env: Mapping[str, str]) -> ProducerConfig:
    """Flags first, then WALBRIDGE_* variables, then defaults; see the module doc for errors."""
    # Every tool's variables are known (one shell carries them all): schemas.settings.
    unknown = settings.unknown(env)
    if unknown:
        raise ConfigError(f"unknown environment variable(s): {', '.join(unknown)}")
    try:
        env = with_secret_files(env)  # WALBRIDGE_<NAME>_FILE: a secret mounted as a file
    except ClientConfigError as exc:
        raise ConfigError(str(exc)) from None
    try:
        flags = vars(build_parser().parse_args(list(argv)))
    except SystemExit as exc:  # argparse already printed the reason (or the --help text)
        if exc.code == 0:
            raise
        # argparse printed the reason; echoing argv could print a DSN or a SASL password.
        raise ConfigError("invalid command line (see above)") from exc
    values: dict[str, Any] = {}
    for name in _FIELDS:
        raw_env = env.get(env_name(name))
        from_env = None
        if raw_env is not None and raw_env != "":
            try:
                from_env = _parser_for(name)(raw_env)
            except ValueError as exc:
                raise ConfigError(f"{env_name(name)}: {exc}") from exc
        from_flag = flags[name]
        if from_flag is not None and from_env is not None and from_flag != from_env:
            secret = name in ("pg_dsn", "kafka_config", "schema_registry_config")
            shown = "***" if secret else f"{from_env!r} vs {from_flag!r}"
            raise ConfigError(f"--{_flag(name)} and {env_name(name)} disagree ({shown}); set one")
        value = from_flag if from_flag is not None else from_env
        if value is not None:
            values[name] = value
    if values.get("exactly_once") is False:
        clashing = [f"--{_flag(n)}" for n in _TRANSACTION_SETTINGS if n in values]
        if clashing:
            raise ConfigError(
                f"{', '.join(clashing)} only apply to Kafka transactions; "
                "they conflict with --no-exactly-once"
            )
    if values.get("create_topics") is False:
        clashing = [
            f"--{_flag(n)}" for n in ("topic_partitions", "topic_replication_factor", "topic_retention_ms")
            if n in values
        ]  # fmt: skip
        if clashing:
            raise ConfigError(
                f"{', '.join(clashing)} only apply when topics are created; "
                "they conflict with --no-create-topics"
            )
    for name in ("pg_dsn", "kafka_bootstrap", "schema_registry_url"):
        if name not in values:
            raise ConfigError(f"{name} is required (flag --{_flag(name)} or {env_name(name)})")
    return ProducerConfig(**values)
