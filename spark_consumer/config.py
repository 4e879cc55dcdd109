"""Consumer configuration: every setting declared once, read from a flag or its variable.

Fails fast, like the producer's (the same loader, schemas.settings_loader): unknown variables,
a flag and a variable that disagree, malformed values and settings that contradict each other
are ConfigErrors before Spark starts, exit status 2.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

from schemas.client_config import java_kafka_options, parse_pairs, registry_client_config
from schemas.safe_names import lake_table_path
from schemas.settings_loader import SettingsError, read_settings, setting
from schemas.table_list import TableListError, parse_table_list
from spark_consumer import maintenance_policy as mp
from spark_consumer.errors import ConfigError
from spark_consumer.lake_options import LakeOptions
from spark_consumer.lake_options import load as load_lake_options
from spark_consumer.object_store import DEFAULT_SOCKET_TIMEOUT_S, MIN_SOCKET_TIMEOUT_S


class Decoder(Enum):
    FROM_AVRO = "from_avro"
    FASTAVRO = "fastavro"


# Spark's processingTime accepts "<number> <unit>"; checking here turns a typo into a start-up
# error instead of a failure deep in the streaming engine.
_TRIGGER = re.compile(
    r"^\d+(\.\d+)?\s*(ms|millisecond|milliseconds|s|second|seconds|minute|minutes|hour|hours)$"
)

# A batch starts at most this often. Commit -> visible in the lake is about half the interval
# plus a batch's time, so freshness within seconds needs a short one (issue 16 item 4; with
# "10 seconds" the median alone was over 5 s). A trigger with no new record runs no batch.
DEFAULT_TRIGGER = "1 second"
# A batch reads at most this many Kafka records (Spark's maxOffsetsPerTrigger), so the first
# batch after an outage does not try to swallow the backlog. A TPC-B-shaped backlog is ~7
# records per transaction: ~145k transactions and 14-29 s of work per batch on 2 cores, one
# row per transaction reaching the driver (a large batch is planned in Spark). A batch's fixed
# costs (its jobs, each table's MERGE and commit) are paid per batch: over a 1M-transaction
# backlog, 250k records a batch applied 20.9k changes/s, 500k 28.9k and 1M 35.6k. 0: no cap.
DEFAULT_MAX_OFFSETS_PER_TRIGGER = 1_000_000
# Records of incomplete transactions wait in a Delta table on disk, not in memory; the limit
# guards disk and the re-read cost. It must let one huge source transaction (5M rows, spread
# over many capped batches) through with the defaults.
DEFAULT_MAX_PENDING_RECORDS = 20_000_000
DEFAULT_MERGE_THREADS = 4
# Below this size a table's MERGE rewrites the files it touches rather than writing deletion
# vectors: one batch updating and deleting a few rows in each of 100 small tables took 0.90 s
# per table with deletion vectors and 0.70 s by rewriting (bench_consumer_tables.py). But a
# rewrite writes the whole file for a few changed rows: at 8 MiB, a 7.6 MB table was rewritten
# by every batch, 584 MB of files after 78 batches (issue 40). 0 (deletion vectors always, and
# compaction folds them) keeps a batch's bytes tied to the rows it changed.
DEFAULT_LAKE_REWRITE_BELOW_BYTES = 0
DEFAULT_METRICS_PORT = 9465
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR")


def _decoder(text: str) -> Decoder:
    try:
        return Decoder(text)
    except ValueError:
        raise ValueError(f"{text!r} is not one of {[d.value for d in Decoder]}") from None


def _kafka_config(text: str) -> dict[str, str]:
    pairs = parse_pairs(text, "WALBRIDGE_KAFKA_CONFIG")
    java_kafka_options(pairs)  # every key must translate for Spark's Kafka source: fail now
    return pairs


def _tables(text: str) -> tuple[tuple[str, str], ...]:
    try:
        return parse_table_list(text)
    except TableListError as exc:
        raise ValueError(str(exc)) from None


@dataclass(frozen=True)
class ConsumerConfig:
    kafka_bootstrap: str = setting(help="Kafka bootstrap servers, host:port,...")
    schema_registry_url: str = setting(help="Confluent-compatible Schema Registry URL")
    topic_prefix: str = setting(help="the producer's topic prefix")
    lake_path: str = setting(help="root of the Delta lake (a path or s3a:// URL)")
    checkpoint_path: str = setting("", help='"" = <lake>/_walbridge/checkpoint')
    trigger: str | None = setting(
        None, help=f"processing-time interval, e.g. '10 seconds' (unset: {DEFAULT_TRIGGER!r})"
    )
    available_now: bool = setting(
        False, help="apply what Kafka holds now, then stop (instead of a trigger)"
    )
    quarantine_path: str | None = setting(
        None, help="Delta table for undecodable records (unset: stop on them)"
    )
    max_pending_age_s: float = setting(
        900.0, help="an incomplete transaction older than this stops the consumer"
    )
    max_pending_records: int = setting(
        DEFAULT_MAX_PENDING_RECORDS, help="records of incomplete transactions kept, at most"
    )
    max_offsets_per_trigger: int = setting(
        DEFAULT_MAX_OFFSETS_PER_TRIGGER, help="Kafka records per batch at most (0: no cap)"
    )
    decoder: Decoder = setting(
        Decoder.FROM_AVRO, help=f"one of {[d.value for d in Decoder]}", parse=_decoder
    )
    merge_threads: int = setting(
        DEFAULT_MERGE_THREADS, help="tables merged concurrently within a batch"
    )
    metrics_port: int = setting(
        DEFAULT_METRICS_PORT,
        env="WALBRIDGE_CONSUMER_METRICS_PORT",
        help="Prometheus /metrics port (0: none)",
    )
    # librdkafka keys (the AdminClient's, and translated for Spark's Kafka source).
    kafka_config: Mapping[str, str] = setting(
        default_factory=dict,
        help="librdkafka security settings k=v,k=v (TLS, SASL)",
        secret=True,
        parse=_kafka_config,
    )
    registry_config: Mapping[str, str | int] = setting(
        default_factory=dict,
        flag="schema-registry-config",
        env="WALBRIDGE_SCHEMA_REGISTRY_CONFIG",
        help="SchemaRegistryClient settings k=v,k=v (TLS, auth)",
        secret=True,
        parse=registry_client_config,
    )
    # Tables are created with deletion vectors (MERGE marks replaced rows instead of rewriting
    # their files); False writes plain Parquet + log tables that every Delta reader opens.
    lake_deletion_vectors: bool = setting(
        True,
        help="create lake tables with deletion vectors; false: tables that readers without "
        "the deletionVectors feature open (MERGE rewrites touched files)",
    )
    # A MERGE with deletion vectors runs several more small Spark jobs than one that rewrites
    # the files it touches; for a table of a few MB the rewrite is the cheaper of the two.
    lake_rewrite_below_bytes: int = setting(
        DEFAULT_LAKE_REWRITE_BELOW_BYTES,
        help="a table with deletion vectors but smaller than this (bytes of data files) is "
        "MERGEd by rewriting the files it touches (0: always deletion vectors)",
    )

    # Per-table lake options (history, changelog, soft deletes, change data feed, columns):
    # read and checked at start-up, lake_options.py.
    lake_tables_config: LakeOptions = setting(
        default_factory=LakeOptions,
        help='TOML file of per-table lake options, docs/lake-layouts.md ("" = none)',
        parse=load_lake_options,
    )

    # Lake maintenance (issue 40; maintenance.py), declared alike for `maintain`.
    lake_maintenance_budget: float = setting(
        mp.DEFAULT_BUDGET,
        help="share of the consumer's time (0-1) that compaction and VACUUM between batches "
        "may take on average (0: none in the consumer; run `walbridge-consumer maintain`)",
    )
    lake_compaction: bool = setting(True, help="compact small files (Delta OPTIMIZE)")
    lake_vacuum: bool = setting(True, help="VACUUM files older than the consistent-read retention")
    lake_target_file_bytes: int = setting(
        mp.DEFAULT_TARGET_FILE_BYTES,
        help="file size compaction packs to (small tables: an eighth of the table, >= 1 MiB)",
    )
    lake_small_files_max: int = setting(
        mp.DEFAULT_SMALL_FILES_MAX,
        help="a table is compacted once it has this many files more than its size needs",
    )
    lake_consistent_read_retention: float = setting(
        mp.DEFAULT_RETENTION_S,
        help="every table version a progress row this recent names stays readable "
        "('7 days', '12 hours', seconds)",
        parse=mp.parse_duration,
    )

    def __post_init__(self) -> None:
        _check_maintenance(self)
        # Normal forms, so every reader of the config sees the same values however it was built.
        lake = self.lake_path.rstrip("/")
        object.__setattr__(self, "lake_path", lake)
        object.__setattr__(
            self, "checkpoint_path", self.checkpoint_path or f"{lake}/_walbridge/checkpoint"
        )
        if self.available_now and self.trigger:
            raise ConfigError(
                f"--available-now conflicts with trigger {self.trigger!r} "
                "(flag or WALBRIDGE_TRIGGER)"
            )
        if not self.available_now:
            trigger = (self.trigger or DEFAULT_TRIGGER).strip()
            if not _TRIGGER.match(trigger):
                raise ConfigError(f"trigger {trigger!r} is not an interval like '10 seconds'")
            object.__setattr__(self, "trigger", trigger)
        if not (math.isfinite(self.max_pending_age_s) and self.max_pending_age_s > 0):
            raise ConfigError("--max-pending-age-s must be positive")
        if self.max_pending_records <= 0:
            raise ConfigError("--max-pending-records must be positive")
        if self.lake_rewrite_below_bytes < 0:
            raise ConfigError("--lake-rewrite-below-bytes must be 0 or more")
        if self.merge_threads <= 0:
            raise ConfigError("--merge-threads must be positive")
        if self.max_offsets_per_trigger < 0:
            raise ConfigError("--max-offsets-per-trigger must be positive, or 0 for no cap")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"--metrics-port must be 0-65535, got {self.metrics_port}")
        if self.quarantine_path and _inside(self.quarantine_path, self.checkpoint_path):
            raise ConfigError("the quarantine path must not lie inside the checkpoint directory")

    @property
    def spark_kafka_options(self) -> dict[str, str]:
        """The Kafka settings as Spark's Kafka source options (`kafka.` + the Java client's key)."""
        return {f"kafka.{k}": v for k, v in java_kafka_options(self.kafka_config).items()}

    @property
    def progress_path(self) -> str:
        return f"{self.lake_path}/_walbridge/progress"

    @property
    def pending_path(self) -> str:
        return f"{self.lake_path}/_walbridge/pending"

    def table_path(self, schema: str, table: str) -> str:
        """Never outside the lake: the names pass through `safe_names` (the topic's parts,
        already safe, come back unchanged)."""
        return lake_table_path(self.lake_path, schema, table)


@dataclass(frozen=True)
class VerifyConfig:
    pg_dsn: str = setting(help="libpq connection string of the source database", secret=True)
    lake_path: str = setting(help="root of the Delta lake (a path or s3a:// URL)")
    publication: str = setting(help="the producer's publication")
    tables: tuple[tuple[str, str], ...] = setting(
        (),
        help='tables to compare, schema.table,... ("" = every table of the publication)',
        parse=_tables,
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "lake_path", self.lake_path.rstrip("/"))


@dataclass(frozen=True)
class MaintainConfig:
    """`walbridge-consumer maintain` (compaction and VACUUM of every lake table, once) and
    `walbridge-consumer status` (the lake's files and retention, printed)."""

    lake_path: str = setting(help="root of the Delta lake (a path or s3a:// URL)")
    quarantine_path: str | None = setting(None, help="the consumer's quarantine table, if any")
    lake_compaction: bool = setting(True, help="compact small files (Delta OPTIMIZE)")
    lake_vacuum: bool = setting(True, help="VACUUM files older than the consistent-read retention")
    lake_target_file_bytes: int = setting(
        mp.DEFAULT_TARGET_FILE_BYTES,
        help="file size compaction packs to (small tables: an eighth of the table, >= 1 MiB)",
    )
    lake_small_files_max: int = setting(
        mp.DEFAULT_SMALL_FILES_MAX,
        help="a table is compacted once it has this many files more than its size needs "
        "(maintain: 0 compacts every table with small files)",
    )
    lake_consistent_read_retention: float = setting(
        mp.DEFAULT_RETENTION_S,
        help="every table version a progress row this recent names stays readable "
        "('7 days', '12 hours', seconds)",
        parse=mp.parse_duration,
    )
    purge_deletion_vectors: bool = setting(
        False,
        help="also rewrite every file that has a deletion vector (REORG TABLE ... APPLY "
        "(PURGE)): costly, for readers that must see files without them",
    )

    def __post_init__(self) -> None:
        _check_maintenance(self)
        object.__setattr__(self, "lake_path", self.lake_path.rstrip("/"))


def _check_maintenance(cfg: ConsumerConfig | MaintainConfig) -> None:
    budget = getattr(cfg, "lake_maintenance_budget", 0.0)
    if not (math.isfinite(budget) and 0 <= budget <= 1):
        raise ConfigError(f"--lake-maintenance-budget must be between 0 and 1, got {budget}")
    if cfg.lake_target_file_bytes < mp.MIN_TARGET_BYTES:
        raise ConfigError(
            f"--lake-target-file-bytes must be at least {mp.MIN_TARGET_BYTES}, "
            f"got {cfg.lake_target_file_bytes}"
        )
    if cfg.lake_small_files_max < 0:
        raise ConfigError("--lake-small-files-max must be 0 or more")
    retention = cfg.lake_consistent_read_retention
    if not (math.isfinite(retention) and retention > 0):
        raise ConfigError(f"--lake-consistent-read-retention must be positive, got {retention}")


@dataclass(frozen=True)
class SparkSettings:
    """The Spark session's settings and the log level, for `run` and `verify` (variables only:
    they are deployment facts, set once per pod, not per command)."""

    master: str = setting("local[2]", env="WALBRIDGE_SPARK_MASTER", help="Spark master URL")
    driver_memory: str = setting(
        "2g", env="WALBRIDGE_SPARK_DRIVER_MEMORY", help="spark.driver.memory"
    )
    # The parallel collector: on `local[2]` the driver's JVM also runs the executors, and G1's
    # concurrent work competed with the tasks for the two cores. A 300k-transaction catch-up
    # (bench_consumer_catchup.py, two pairs of runs in alternating order) took 57.9 and 53.7 s
    # against 63.8 and 56.5 s with G1: 5-9 % less.
    driver_java_options: str = setting(
        "-XX:+UseParallelGC",
        env="WALBRIDGE_SPARK_DRIVER_JAVA_OPTIONS",
        help="spark.driver.defaultJavaOptions of a local[...] driver JVM this process starts "
        '("" = none)',
    )
    # A cold driver JVM maps the classes of a previous run from a class-data archive
    # (class_archive.py, written by `walbridge-consumer warm-up`) instead of loading them from
    # the jars again: a cold start's session and first Delta write and read took 0.71-0.74 of the
    # time without it (interleaved runs, bench_session_start.py --compare class-archive).
    class_archive: bool = setting(
        True,
        env="WALBRIDGE_SPARK_CLASS_ARCHIVE",
        help="map the driver JVM's class-data archive when `warm-up` has written one",
    )
    connector_version: str = setting(
        "",
        env="WALBRIDGE_SPARK_CONNECTOR_VERSION",
        help='Spark Kafka/Avro connector version ("" = the .0 release of pyspark\'s line)',
    )
    home: str = setting(
        "",
        env="WALBRIDGE_HOME",
        help='state directory for caches ("" = .walbridge/ in the checkout)',
    )
    ivy_dir: str = setting(
        "",
        env="WALBRIDGE_SPARK_IVY_DIR",
        help='ivy cache of the connector jars ("" = ivy2/ in the state directory)',
    )
    log_level: str = setting("INFO", help=f"one of {LOG_LEVELS}")
    # S3A's own default is 200 s: a silent object store connection (a half-open link, a frozen
    # store) held a batch that long before S3A dropped it and retried (object_store.py).
    object_store_timeout_s: float = setting(
        DEFAULT_SOCKET_TIMEOUT_S,
        env="WALBRIDGE_OBJECT_STORE_TIMEOUT_S",
        help="silence on an s3a:// connection before it is dropped and the request retried "
        "(fs.s3a.connection.timeout)",
    )

    def __post_init__(self) -> None:
        if self.object_store_timeout_s < MIN_SOCKET_TIMEOUT_S:
            raise ConfigError(
                f"WALBRIDGE_OBJECT_STORE_TIMEOUT_S must be at least {MIN_SOCKET_TIMEOUT_S:g} "
                f"(S3A's floor: it raises lower values to that), got {self.object_store_timeout_s:g}"
            )
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"log_level must be one of {LOG_LEVELS}, got {self.log_level!r}")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SparkSettings:
        return cls(**_read(cls, [], env, "walbridge-consumer"))


def _read(cls: type, argv: Sequence[str], env: Mapping[str, str], prog: str) -> dict[str, Any]:
    try:
        return read_settings(cls, argv, env, prog=prog, description=cls.__doc__ or "")
    except SettingsError as exc:
        raise ConfigError(str(exc)) from None


def parse_run(argv: Sequence[str], env: Mapping[str, str]) -> ConsumerConfig:
    """Flags, else WALBRIDGE_* variables, else defaults (schemas.settings_loader's rules)."""
    config = ConsumerConfig(**_read(ConsumerConfig, argv, env, "walbridge-consumer run"))
    known = _tables(env.get("WALBRIDGE_TABLES", "")) if env.get("WALBRIDGE_TABLES") else None
    if known is not None:  # the tables are known: the lake options may name only those
        config.lake_tables_config.check_known(known)
    return config


def parse_verify(argv: Sequence[str], env: Mapping[str, str]) -> VerifyConfig:
    return VerifyConfig(**_read(VerifyConfig, argv, env, "walbridge-consumer verify"))


def parse_maintain(
    argv: Sequence[str], env: Mapping[str, str], command: str = "maintain"
) -> MaintainConfig:
    return MaintainConfig(**_read(MaintainConfig, argv, env, f"walbridge-consumer {command}"))


def _inside(path: str, parent: str) -> bool:
    return path.rstrip("/") == parent.rstrip("/") or path.startswith(parent.rstrip("/") + "/")
