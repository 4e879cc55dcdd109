"""Consumer configuration: flags with WALBRIDGE_* environment defaults, checked at start-up."""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

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
    max_pending_records: int = 5_000_000
    max_offsets_per_trigger: int | None = None
    decoder: Decoder = Decoder.FROM_AVRO
    merge_threads: int = 4  # tables merged concurrently within a batch

    @property
    def progress_path(self) -> str:
        return f"{self.lake_path.rstrip('/')}/_walbridge/progress"

    @property
    def pending_path(self) -> str:
        return f"{self.lake_path.rstrip('/')}/_walbridge/pending"

    def table_path(self, schema: str, table: str) -> str:
        return f"{self.lake_path.rstrip('/')}/{schema}/{table}"


@dataclass(frozen=True)
class VerifyConfig:
    pg_dsn: str
    lake_path: str
    publication: str
    tables: tuple[str, ...]  # empty = every table of the publication


def _env_default(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    return value if value else None


def run_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="walbridge-consumer run", allow_abbrev=False)
    e = lambda name: _env_default(env, name)  # noqa: E731
    p.add_argument("--kafka-bootstrap", default=e("WALBRIDGE_KAFKA_BOOTSTRAP"))
    p.add_argument("--schema-registry-url", default=e("WALBRIDGE_SCHEMA_REGISTRY_URL"))
    p.add_argument("--topic-prefix", default=e("WALBRIDGE_TOPIC_PREFIX"))
    p.add_argument("--lake-path", default=e("WALBRIDGE_LAKE_PATH"))
    p.add_argument("--checkpoint-path", default=e("WALBRIDGE_CHECKPOINT_PATH"),
                   help="default: <lake>/_walbridge/checkpoint")
    p.add_argument("--trigger", default=e("WALBRIDGE_TRIGGER"),
                   help=f"processing-time interval, e.g. '10 seconds' (default {DEFAULT_TRIGGER!r})")
    p.add_argument("--available-now", action="store_true",
                   default=_flag(env, "WALBRIDGE_AVAILABLE_NOW"))
    p.add_argument("--quarantine-path", default=e("WALBRIDGE_QUARANTINE_PATH"))
    p.add_argument("--max-pending-age-s", type=float,
                   default=float(e("WALBRIDGE_MAX_PENDING_AGE_S") or 900.0))
    p.add_argument("--max-pending-records", type=int,
                   default=int(e("WALBRIDGE_MAX_PENDING_RECORDS") or 5_000_000))
    p.add_argument("--max-offsets-per-trigger", type=int,
                   default=_int_or_none(e("WALBRIDGE_MAX_OFFSETS_PER_TRIGGER")))
    p.add_argument("--decoder", choices=[d.value for d in Decoder],
                   default=e("WALBRIDGE_DECODER") or Decoder.FROM_AVRO.value)
    p.add_argument("--merge-threads", type=int,
                   default=int(e("WALBRIDGE_MERGE_THREADS") or 4),
                   help="tables merged concurrently within a batch (default 4)")
    return p


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw in ("", "0", "false", "no"):
        return False
    if raw in ("1", "true", "yes"):
        return True
    raise ConfigError(f"{name}={env[name]!r} is not a boolean (use true/false)")


def _int_or_none(raw: str | None) -> int | None:
    return int(raw) if raw else None


def parse_run(argv: Sequence[str], env: Mapping[str, str]) -> ConsumerConfig:
    try:
        ns = run_parser(env).parse_args(list(argv))
    except ValueError as exc:  # a malformed numeric env default
        raise ConfigError(str(exc)) from exc
    missing = [
        flag for flag, value in (
            ("--kafka-bootstrap / WALBRIDGE_KAFKA_BOOTSTRAP", ns.kafka_bootstrap),
            ("--schema-registry-url / WALBRIDGE_SCHEMA_REGISTRY_URL", ns.schema_registry_url),
            ("--topic-prefix / WALBRIDGE_TOPIC_PREFIX", ns.topic_prefix),
            ("--lake-path / WALBRIDGE_LAKE_PATH", ns.lake_path),
        ) if not value
    ]
    if missing:
        raise ConfigError("missing required setting(s): " + ", ".join(missing))
    if ns.available_now and ns.trigger:
        raise ConfigError(
            f"--available-now conflicts with trigger {ns.trigger!r} (flag or WALBRIDGE_TRIGGER)"
        )
    trigger = None if ns.available_now else (ns.trigger or DEFAULT_TRIGGER)
    if trigger is not None and not _TRIGGER.match(trigger.strip()):
        raise ConfigError(f"trigger {trigger!r} is not an interval like '10 seconds'")
    if ns.max_pending_age_s <= 0 or ns.max_pending_records <= 0:
        raise ConfigError("--max-pending-age-s and --max-pending-records must be positive")
    if ns.merge_threads <= 0:
        raise ConfigError("--merge-threads must be positive")
    if ns.max_offsets_per_trigger is not None and ns.max_offsets_per_trigger <= 0:
        raise ConfigError("--max-offsets-per-trigger must be positive")
    lake = ns.lake_path.rstrip("/")
    checkpoint = ns.checkpoint_path or f"{lake}/_walbridge/checkpoint"
    if ns.quarantine_path and _inside(ns.quarantine_path, checkpoint):
        raise ConfigError("the quarantine path must not lie inside the checkpoint directory")
    return ConsumerConfig(
        kafka_bootstrap=ns.kafka_bootstrap,
        schema_registry_url=ns.schema_registry_url,
        topic_prefix=ns.topic_prefix,
        lake_path=lake,
        checkpoint_path=checkpoint,
        trigger=trigger.strip() if trigger else None,
        available_now=ns.available_now,
        quarantine_path=ns.quarantine_path,
        max_pending_age_s=ns.max_pending_age_s,
        max_pending_records=ns.max_pending_records,
        max_offsets_per_trigger=ns.max_offsets_per_trigger,
        decoder=Decoder(ns.decoder),
        merge_threads=ns.merge_threads,
    )


def _inside(path: str, parent: str) -> bool:
    return path.rstrip("/") == parent.rstrip("/") or path.startswith(parent.rstrip("/") + "/")


def verify_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="walbridge-consumer verify", allow_abbrev=False)
    p.add_argument("--pg-dsn", default=_env_default(env, "WALBRIDGE_PG_DSN"))
    p.add_argument("--lake-path", default=_env_default(env, "WALBRIDGE_LAKE_PATH"))
    p.add_argument("--publication", default=_env_default(env, "WALBRIDGE_PUBLICATION"))
    p.add_argument("--tables", default=_env_default(env, "WALBRIDGE_TABLES"),
                   help="comma-separated schema.table; empty = all tables of the publication")
    return p


def parse_verify(argv: Sequence[str], env: Mapping[str, str]) -> VerifyConfig:
    ns = verify_parser(env).parse_args(list(argv))
    missing = [n for n, v in (("--pg-dsn / WALBRIDGE_PG_DSN", ns.pg_dsn),
                              ("--lake-path / WALBRIDGE_LAKE_PATH", ns.lake_path),
                              ("--publication / WALBRIDGE_PUBLICATION", ns.publication)) if not v]
    if missing:
        raise ConfigError("missing required setting(s): " + ", ".join(missing))
    tables = tuple(t.strip() for t in (ns.tables or "").split(",") if t.strip())
    bad = [t for t in tables if t.count(".") != 1]
    if bad:
        raise ConfigError(f"WALBRIDGE_TABLES entries must be schema.table, got {bad}")
    return VerifyConfig(ns.pg_dsn, ns.lake_path.rstrip("/"), ns.publication, tables)
