"""Consumer configuration: flags or their WALBRIDGE_* variables, checked at start-up.

Fails fast, like the producer's: an unknown WALBRIDGE_* variable, a flag and a variable that
disagree, and settings that contradict each other are errors before Spark starts.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final

from schemas import settings
from schemas.client_config import (
    ClientConfigError,
    java_kafka_options,
    parse_pairs,
    registry_client_config,
    with_secret_files,
)
from schemas.safe_names import lake_table_path
from schemas.table_list import TableListError, parse_table_list
from spark_consumer.errors import ConfigError


class Decoder(Enum):
    FROM_AVRO = "from_avro"
    FASTAVRO = "fastavro"


# Spark's processingTime accepts "<number> <unit>"; checking here turns a typo into a start-up
# error instead of a failure deep in the streaming engine.
_TRIGGER = re.compile(
    r"^\d+(\.\d+)?\s*(ms|millisecond|milliseconds|s|second|seconds|minute|minutes|hour|hours)$"
)

DEFAULT_TRIGGER = "10 seconds"
# A batch reads at most this many Kafka records (Spark's maxOffsetsPerTrigger), so the first
# batch after an outage does not try to swallow the backlog: on 2 cores about 3-6 s of work,
# and the per-transaction summary that reaches the driver stays bounded (a TPC-B-shaped
# backlog is ~7 records per transaction: ~36k transactions per batch). 0: no cap.
DEFAULT_MAX_OFFSETS_PER_TRIGGER = 250_000
# Records of incomplete transactions wait in a Delta table on disk, not in memory; the limit
# guards disk and the re-read cost. It must let one huge source transaction (5M rows, spread
# over many capped batches) through with the defaults.
DEFAULT_MAX_PENDING_RECORDS = 20_000_000
DEFAULT_METRICS_PORT = 9465


@dataclass(frozen=True)
class ConsumerConfig:
    kafka_bootstrap: str
    schema_registry_url: str
    topic_prefix: str
    lake_path: str
    checkpoint_path: str
    trigger: str | None  # None with available_now
    available_now: bool = False
    quarantine_path: str | None = None
    max_pending_age_s: float = 900.0
    max_pending_records: int = DEFAULT_MAX_PENDING_RECORDS
    max_offsets_per_trigger: int | None = DEFAULT_MAX_OFFSETS_PER_TRIGGER  # None: no cap
    decoder: Decoder = Decoder.FROM_AVRO
    merge_threads: int = 4  # tables merged concurrently within a batch
    metrics_port: int = 0  # 0: no HTTP endpoint (the command line's default is 9465)
    # WALBRIDGE_KAFKA_CONFIG (librdkafka keys: the AdminClient's) and WALBRIDGE_SCHEMA_REGISTRY_CONFIG;
    # out of repr, since they may hold passwords.
    kafka_config: Mapping[str, str] = field(default_factory=dict, repr=False)
    registry_config: Mapping[str, str | int] = field(default_factory=dict, repr=False)

    @property
    def spark_kafka_options(self) -> dict[str, str]:
        """The Kafka settings as Spark's Kafka source options (`kafka.` + the Java client's key)."""
        return {f"kafka.{k}": v for k, v in java_kafka_options(self.kafka_config).items()}

    # Tables are created with deletion vectors (MERGE marks replaced rows instead of rewriting
    # their files); False writes plain Parquet + log tables that every Delta reader opens.
    lake_deletion_vectors: bool = True

    @property
    def progress_path(self) -> str:
        return f"{self.lake_path.rstrip('/')}/_walbridge/progress"

    @property
    def pending_path(self) -> str:
        return f"{self.lake_path.rstrip('/')}/_walbridge/pending"

    def table_path(self, schema: str, table: str) -> str:
        """Never outside the lake: the names pass through `safe_names` (the topic's parts,
        already safe, come back unchanged)."""
        return lake_table_path(self.lake_path, schema, table)


@dataclass(frozen=True)
class VerifyConfig:
    pg_dsn: str
    lake_path: str
    publication: str
    tables: tuple[tuple[str, str], ...]  # (schema, table); empty = every table of the publication


# Every setting of `run` and `verify`: flag destination -> its WALBRIDGE_* variable.
RUN_ENV: Final = {
    "kafka_bootstrap": "WALBRIDGE_KAFKA_BOOTSTRAP",
    "schema_registry_url": "WALBRIDGE_SCHEMA_REGISTRY_URL",
    "topic_prefix": "WALBRIDGE_TOPIC_PREFIX",
    "lake_path": "WALBRIDGE_LAKE_PATH",
    "checkpoint_path": "WALBRIDGE_CHECKPOINT_PATH",
    "trigger": "WALBRIDGE_TRIGGER",
    "available_now": "WALBRIDGE_AVAILABLE_NOW",
    "quarantine_path": "WALBRIDGE_QUARANTINE_PATH",
    "max_pending_age_s": "WALBRIDGE_MAX_PENDING_AGE_S",
    "max_pending_records": "WALBRIDGE_MAX_PENDING_RECORDS",
    "max_offsets_per_trigger": "WALBRIDGE_MAX_OFFSETS_PER_TRIGGER",
    "decoder": "WALBRIDGE_DECODER",
    "merge_threads": "WALBRIDGE_MERGE_THREADS",
    "metrics_port": "WALBRIDGE_CONSUMER_METRICS_PORT",
    "kafka_config": "WALBRIDGE_KAFKA_CONFIG",
    "schema_registry_config": "WALBRIDGE_SCHEMA_REGISTRY_CONFIG",
    "lake_deletion_vectors": "WALBRIDGE_LAKE_DELETION_VECTORS",
}
VERIFY_ENV: Final = {
    "pg_dsn": "WALBRIDGE_PG_DSN",
    "lake_path": "WALBRIDGE_LAKE_PATH",
    "publication": "WALBRIDGE_PUBLICATION",
    "tables": "WALBRIDGE_TABLES",
}


def _checked_env(env: Mapping[str, str]) -> dict[str, str]:
    # Every tool's variables are known (one shell carries them all): schemas.settings.
    unknown = settings.unknown(env)
    if unknown:
        raise ConfigError(f"unknown environment variable(s): {', '.join(unknown)}")
    try:
        return with_secret_files(env)  # WALBRIDGE_<NAME>_FILE: a secret mounted as a file
    except ClientConfigError as exc:
        raise ConfigError(str(exc)) from None


def run_parser() -> argparse.ArgumentParser:
    """Flags default to None, so `_merged` can tell a flag from its variable."""
    p = argparse.ArgumentParser(
        prog="walbridge-consumer run",
        allow_abbrev=False,
        description="Every flag --x-y can also be set as WALBRIDGE_X_Y.",
    )
    p.add_argument("--kafka-bootstrap")
    p.add_argument("--schema-registry-url")
    p.add_argument("--kafka-config", help="librdkafka security settings k=v,k=v (TLS, SASL)")
    p.add_argument(
        "--schema-registry-config", help="SchemaRegistryClient settings k=v,k=v (TLS, auth)"
    )
    p.add_argument("--topic-prefix")
    p.add_argument("--lake-path")
    p.add_argument("--checkpoint-path", help="default: <lake>/_walbridge/checkpoint")
    p.add_argument(
        "--trigger",
        help=f"processing-time interval, e.g. '10 seconds' (default {DEFAULT_TRIGGER!r})",
    )
    p.add_argument("--available-now", action="store_const", const=True)
    p.add_argument("--quarantine-path")
    p.add_argument("--max-pending-age-s", type=float, help="default 900")
    p.add_argument("--max-pending-records", type=int, help=f"default {DEFAULT_MAX_PENDING_RECORDS}")
    p.add_argument(
        "--max-offsets-per-trigger",
        type=int,
        help=f"Kafka records per batch at most (default "
        f"{DEFAULT_MAX_OFFSETS_PER_TRIGGER}; 0: no cap)",
    )
    p.add_argument(
        "--decoder", choices=[d.value for d in Decoder], help=f"default {Decoder.FROM_AVRO.value}"
    )
    p.add_argument(
        "--merge-threads", type=int, help="tables merged concurrently within a batch (default 4)"
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        help=f"Prometheus /metrics port (default {DEFAULT_METRICS_PORT}; 0: off)",
    )
    p.add_argument(
        "--lake-deletion-vectors",
        type=_flag,
        metavar="true|false",
        help="create lake tables with deletion vectors (default true); false: tables that "
        "readers without the deletionVectors feature open (MERGE rewrites touched files)",
    )
    return p


def _flag(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise ValueError("not a boolean (use true/false)")


_PARSE_ENV: Final[dict[str, Callable[[str], Any]]] = {
    "available_now": _flag,
    "max_pending_age_s": float,
    "max_pending_records": int,
    "max_offsets_per_trigger": int,
    "merge_threads": int,
    "metrics_port": int,
    "lake_deletion_vectors": _flag,
}

# May hold a password: never echoed.
_SECRET: Final = frozenset({"pg_dsn", "kafka_config", "schema_registry_config"})


def _merged(
    ns: argparse.Namespace, env: Mapping[str, str], names: Mapping[str, str]
) -> dict[str, Any]:
    """Flag, else variable, per setting; a flag and a variable that disagree are an error
    (which one was meant is a guess this tool does not make)."""
    out: dict[str, Any] = {}
    for dest, var in names.items():
        flag = getattr(ns, dest)
        raw = env.get(var, "")
        from_env: Any = None
        if raw != "":
            try:
                from_env = _PARSE_ENV.get(dest, str)(raw)
            except ValueError as exc:
                shown = "***" if dest in _SECRET else repr(raw)
                raise ConfigError(f"{var}={shown}: {exc}") from exc
        if flag is not None and from_env is not None and flag != from_env:
            shown = "***" if dest in _SECRET else f"{flag!r} vs {from_env!r}"
            raise ConfigError(f"--{dest.replace('_', '-')} and {var} disagree ({shown}); set one")
        out[dest] = flag if flag is not None else from_env
    return out


def _parse_args(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    try:
        return parser.parse_args(list(argv))
    except SystemExit as exc:
        if exc.code == 0:  # --help
            raise
        # argparse printed the reason; echoing argv could print a DSN with its password.
        raise ConfigError("invalid command line (see above)") from exc


def parse_run(argv: Sequence[str], env: Mapping[str, str]) -> ConsumerConfig:
    v = _merged(_parse_args(run_parser(), argv), _checked_env(env), RUN_ENV)
    missing = [
        f"--{dest.replace('_', '-')} / {RUN_ENV[dest]}"
        for dest in ("kafka_bootstrap", "schema_registry_url", "topic_prefix", "lake_path")
        if not v[dest]
    ]
    if missing:
        raise ConfigError("missing required setting(s): " + ", ".join(missing))
    available_now = bool(v["available_now"])
    if available_now and v["trigger"]:
        raise ConfigError(
            f"--available-now conflicts with trigger {v['trigger']!r} (flag or WALBRIDGE_TRIGGER)"
        )
    trigger = None if available_now else (v["trigger"] or DEFAULT_TRIGGER)
    if trigger is not None and not _TRIGGER.match(trigger.strip()):
        raise ConfigError(f"trigger {trigger!r} is not an interval like '10 seconds'")
    max_age = 900.0 if v["max_pending_age_s"] is None else v["max_pending_age_s"]
    max_records = (
        DEFAULT_MAX_PENDING_RECORDS
        if v["max_pending_records"] is None
        else v["max_pending_records"]
    )
    merge_threads = 4 if v["merge_threads"] is None else v["merge_threads"]
    if not (math.isfinite(max_age) and max_age > 0) or max_records <= 0:
        raise ConfigError("--max-pending-age-s and --max-pending-records must be positive")
    if merge_threads <= 0:
        raise ConfigError("--merge-threads must be positive")
    cap = (
        DEFAULT_MAX_OFFSETS_PER_TRIGGER
        if v["max_offsets_per_trigger"] is None
        else v["max_offsets_per_trigger"]
    )
    if cap < 0:
        raise ConfigError("--max-offsets-per-trigger must be positive, or 0 for no cap")
    metrics_port = DEFAULT_METRICS_PORT if v["metrics_port"] is None else v["metrics_port"]
    if not 0 <= metrics_port <= 65535:
        raise ConfigError(f"--metrics-port must be 0-65535, got {metrics_port}")
    try:
        decoder = Decoder(v["decoder"] or Decoder.FROM_AVRO.value)
    except ValueError as exc:
        raise ConfigError(
            f"decoder {v['decoder']!r} is not one of {[d.value for d in Decoder]}"
        ) from exc
    try:
        kafka_config = parse_pairs(v["kafka_config"] or "", "WALBRIDGE_KAFKA_CONFIG")
        java_kafka_options(kafka_config)  # every key must translate for Spark: fail now
        registry_config = registry_client_config(v["schema_registry_config"] or "")
    except ClientConfigError as exc:
        raise ConfigError(str(exc)) from None
    lake = v["lake_path"].rstrip("/")
    checkpoint = v["checkpoint_path"] or f"{lake}/_walbridge/checkpoint"
    if v["quarantine_path"] and _inside(v["quarantine_path"], checkpoint):
        raise ConfigError("the quarantine path must not lie inside the checkpoint directory")
    return ConsumerConfig(
        kafka_bootstrap=v["kafka_bootstrap"],
        schema_registry_url=v["schema_registry_url"],
        topic_prefix=v["topic_prefix"],
        lake_path=lake,
        checkpoint_path=checkpoint,
        trigger=trigger.strip() if trigger else None,
        available_now=available_now,
        quarantine_path=v["quarantine_path"],
        max_pending_age_s=max_age,
        max_pending_records=max_records,
        max_offsets_per_trigger=cap or None,
        decoder=decoder,
        merge_threads=merge_threads,
        metrics_port=metrics_port,
        kafka_config=kafka_config,
        registry_config=registry_config,
        lake_deletion_vectors=(
            True if v["lake_deletion_vectors"] is None else v["lake_deletion_vectors"]
        ),
    )


def _inside(path: str, parent: str) -> bool:
    return path.rstrip("/") == parent.rstrip("/") or path.startswith(parent.rstrip("/") + "/")


def verify_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="walbridge-consumer verify",
        allow_abbrev=False,
        description="Every flag --x-y can also be set as WALBRIDGE_X_Y.",
    )
    p.add_argument("--pg-dsn")
    p.add_argument("--lake-path")
    p.add_argument("--publication")
    p.add_argument(
        "--tables", help="comma-separated schema.table; empty = all tables of the publication"
    )
    return p


def parse_verify(argv: Sequence[str], env: Mapping[str, str]) -> VerifyConfig:
    v = _merged(_parse_args(verify_parser(), argv), _checked_env(env), VERIFY_ENV)
    missing = [
        f"--{dest.replace('_', '-')} / {VERIFY_ENV[dest]}"
        for dest in ("pg_dsn", "lake_path", "publication")
        if not v[dest]
    ]
    if missing:
        raise ConfigError("missing required setting(s): " + ", ".join(missing))
    try:
        tables = parse_table_list(v["tables"] or "")
    except TableListError as exc:
        raise ConfigError(f"WALBRIDGE_TABLES: {exc}") from exc
    return VerifyConfig(v["pg_dsn"], v["lake_path"].rstrip("/"), v["publication"], tables)
