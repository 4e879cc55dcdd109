"""Validated configuration of the replication client; every mistake fails before any I/O."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from producer.replication.errors import ErrorKind, ReplicationError
from producer.replication.identifiers import (
    TableName,
    quote_identifier,
    validate_identifier,
    validate_slot_name,
)

# pgoutput's option values; PostgreSQL 15 knows 1-3 and streaming 'on', 16+ adds 4 and 'parallel'.
PROTO_VERSIONS = (1, 2, 3, 4)
STREAMING_MODES = ("off", "on", "parallel")
# --failover-slot: auto = a failover slot where the server has them (17+).
FAILOVER_SLOT_MODES = ("auto", "on", "off")
# pgoutput's origin option (16+): none = only changes made on this server, not those applied
# by logical replication from another node (bidirectional set-ups); any = all of them.
ORIGINS = ("any", "none")
# The first server_version_num of each feature the client may use.
ORIGIN_MIN_VERSION = 160000
FAILOVER_MIN_VERSION = 170000


def _config_error(detail: str) -> ReplicationError:
    return ReplicationError(ErrorKind.CONFIG, detail)


@dataclass(frozen=True)
class ReconnectPolicy:
    """Exponential backoff between reconnect attempts; ``max_attempts=None`` retries forever,
    or, with ``max_elapsed``, until that many seconds have passed since the connection was lost
    (a failover leaves no primary for seconds to tens of seconds: a time bound says what an
    operator means better than a count of attempts whose delays grow)."""

    initial_delay: float = 0.5
    max_delay: float = 30.0
    multiplier: float = 2.0
    max_attempts: int | None = 10
    max_elapsed: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.initial_delay) and self.initial_delay >= 0):
            raise _config_error(f"initial_delay must be >= 0 seconds, got {self.initial_delay!r}")
        if not (math.isfinite(self.max_delay) and self.max_delay >= self.initial_delay):
            raise _config_error(
                f"max_delay ({self.max_delay!r}) must be >= initial_delay ({self.initial_delay!r})"
            )
        if not (math.isfinite(self.multiplier) and self.multiplier >= 1):
            raise _config_error(f"multiplier must be >= 1, got {self.multiplier!r}")
        if self.max_attempts is not None and self.max_attempts < 0:
            raise _config_error(f"max_attempts must be >= 0 or None, got {self.max_attempts!r}")
        if self.max_elapsed is not None and not (
            math.isfinite(self.max_elapsed) and self.max_elapsed > 0
        ):
            raise _config_error(
                f"max_elapsed must be > 0 seconds or None, got {self.max_elapsed!r}"
            )

    def delays(self) -> Iterator[float]:
        """The wait before each attempt: initial, initial*m, ... capped at max_delay."""
        delay = self.initial_delay
        attempt = 0
        while self.max_attempts is None or attempt < self.max_attempts:
            yield delay
            attempt += 1
            # A zero start cannot grow by multiplying: retry at once, then wait max_delay.
            delay = min(self.max_delay, delay * self.multiplier if delay else self.max_delay)


@dataclass(frozen=True)
class ReplicationConfig:
    slot: str
    publication: str
    # Publication set-up: an empty table list means FOR ALL TABLES when it must be created.
    tables: tuple[TableName, ...] = ()
    # Partitioned tables arrive under the root's name (one topic and lake table per parent).
    publish_via_partition_root: bool = True
    # A created publication also sends stored generated columns (PostgreSQL 18+).
    publish_generated_columns: bool = False
    create_publication: bool = True
    create_slot: bool = True
    # START_REPLICATION options for pgoutput.
    proto_version: int = 1
    binary: bool = False
    messages: bool = False
    streaming: str = "off"
    two_phase: bool = False
    origin: str = "any"
    # Whether a slot this client creates is a failover slot (resolved against the server's
    # version by ``failover_for``).
    failover_slot: str = "off"
    # Standby Status Updates are sent at least this often, also when idle (seconds). Keep it
    # well below the server's wal_sender_timeout (60 s by default).
    status_interval: float = 10.0
    # Silence (no data, no keepalive) after which the connection counts as dead, like the
    # walreceiver's wal_receiver_timeout: at half of it the client asks the server for an
    # answer, at the end it reconnects (producer.replication.liveness). Also bounds how long a
    # walsender command may wait for its answer. Seconds.
    receive_timeout: float = 30.0
    reconnect: ReconnectPolicy = field(default_factory=ReconnectPolicy)
    application_name: str = "walbridge"
    connect_timeout: int = 10

    def __post_init__(self) -> None:
        validate_slot_name(self.slot)
        validate_identifier(self.publication, "publication name")
        validate_identifier(self.application_name, "application_name")
        if not all(isinstance(t, TableName) for t in self.tables):
            raise _config_error(f"tables must be TableName values, got {self.tables!r}")
        if len(set(self.tables)) != len(self.tables):
            raise _config_error(f"tables lists a table twice: {[str(t) for t in self.tables]}")
        if self.proto_version not in PROTO_VERSIONS:
            raise _config_error(
                f"proto_version must be one of {PROTO_VERSIONS}, got {self.proto_version!r}"
            )
        if self.streaming not in STREAMING_MODES:
            raise _config_error(
                f"streaming must be one of {STREAMING_MODES}, got {self.streaming!r}"
            )
        if self.streaming == "on" and self.proto_version < 2:
            raise _config_error("streaming 'on' needs proto_version >= 2")
        if self.streaming == "parallel" and self.proto_version < 4:
            raise _config_error("streaming 'parallel' needs proto_version >= 4")
        if self.two_phase and self.proto_version < 3:
            raise _config_error("two_phase needs proto_version >= 3")
        if self.origin not in ORIGINS:
            raise _config_error(f"origin must be one of {ORIGINS}, got {self.origin!r}")
        if self.failover_slot not in FAILOVER_SLOT_MODES:
            raise _config_error(
                f"failover_slot must be one of {FAILOVER_SLOT_MODES}, got {self.failover_slot!r}"
            )
        if not (math.isfinite(self.status_interval) and self.status_interval > 0):
            raise _config_error(
                f"status_interval must be > 0 seconds, got {self.status_interval!r}"
            )
        if not (math.isfinite(self.receive_timeout) and self.receive_timeout > 0):
            raise _config_error(
                f"receive_timeout must be > 0 seconds, got {self.receive_timeout!r}"
            )
        if self.connect_timeout < 1:
            raise _config_error(
                f"connect_timeout must be >= 1 second, got {self.connect_timeout!r}"
            )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ReplicationConfig:
        """Build from plain settings (e.g. parsed flags); unknown keys are an error, not ignored.

        ``tables`` may be a comma-separated ``schema.table`` string, ``reconnect`` a mapping.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise _config_error(f"unknown replication settings: {', '.join(unknown)}")
        kwargs = dict(values)
        tables = kwargs.get("tables")
        if isinstance(tables, str):
            kwargs["tables"] = TableName.parse_list(tables)
        elif tables is not None:
            kwargs["tables"] = tuple(
                t if isinstance(t, TableName) else TableName.parse(t) for t in tables
            )
        reconnect = kwargs.get("reconnect")
        if isinstance(reconnect, Mapping):
            reconnect_known = {f.name for f in dataclasses.fields(ReconnectPolicy)}
            bad = sorted(set(reconnect) - reconnect_known)
            if bad:
                raise _config_error(f"unknown reconnect settings: {', '.join(bad)}")
            kwargs["reconnect"] = ReconnectPolicy(**reconnect)
        return cls(**kwargs)

    def plugin_options(self) -> tuple[tuple[str, str], ...]:
        """pgoutput options for START_REPLICATION, only the ones that differ from the default
        (so a PostgreSQL that predates an option still accepts a config that doesn't use it)."""
        options: list[tuple[str, str]] = [
            ("proto_version", str(self.proto_version)),
            # A comma-separated list of names, each parsed like an SQL identifier.
            ("publication_names", quote_identifier(self.publication)),
        ]
        if self.binary:
            options.append(("binary", "true"))
        if self.messages:
            options.append(("messages", "true"))
        if self.streaming != "off":
            options.append(("streaming", self.streaming))
        if self.two_phase:
            options.append(("two_phase", "on"))
        if self.origin != "any":
            options.append(("origin", self.origin))
        return tuple(options)

    def failover_for(self, server_version: int) -> bool:
        """Whether slots are created with FAILOVER on a server of ``server_version``
        (server_version_num); refuses settings that server cannot honour, naming its version,
        before anything is created or streamed."""
        major = server_version // 10000
        if self.origin != "any" and server_version < ORIGIN_MIN_VERSION:
            raise ReplicationError(
                ErrorKind.CONFIG,
                f"origin {self.origin!r} needs PostgreSQL 16 or later; the server is "
                f"PostgreSQL {major} (its pgoutput rejects the option): use origin 'any'",
                slot=self.slot,
            )
        if self.failover_slot == "on" and server_version < FAILOVER_MIN_VERSION:
            raise ReplicationError(
                ErrorKind.CONFIG,
                f"failover slots need PostgreSQL 17 or later; the server is PostgreSQL {major}: "
                "use --failover-slot auto or off (a failover then loses the slot, see "
                "docs/postgresql-versions.md, 'Slot loss and failover')",
                slot=self.slot,
            )
        return self.failover_slot != "off" and server_version >= FAILOVER_MIN_VERSION
