"""Schema registration through confluent-kafka's SchemaRegistryClient (Confluent REST API only,
so Confluent Schema Registry, Apicurio's ccompat API, Karapace and Redpanda all work).

- Subjects follow TopicNameStrategy: ``<topic>-key`` / ``<topic>-value``.
- Ids are cached by (subject, schema text): one registry call per new schema, none per event.
  ``on_call`` sees every HTTP call (for a metrics counter), ``calls`` counts them.
- Each subject's compatibility level is set once (BACKWARD unless configured per subject).
- HTTP 409 (incompatible) raises ``SchemaEvolutionError`` naming table, columns, old and new
  types and the registry's message; the producer must stop without confirming the LSN.
- Unreachable registry (transport errors, 408/429/5xx): retried with exponential backoff;
  ``on_retry`` and a warning log show each wait. The client's own retries are disabled so
  every attempt is visible here.
"""

from __future__ import annotations

import json
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from schemas.envelope import Schema as AvroSchema
from schemas.envelope import schema_text
from schemas.errors import RegistryError, RegistryUnavailableError, SchemaEvolutionError
from schemas.relation import RelationCodec

try:  # confluent-kafka >= 2.12 ships httpx as 'httpx2' on Python >= 3.10
    from httpx2 import TransportError, UnsupportedProtocol
except ImportError:  # pragma: no cover - older confluent-kafka
    from httpx import TransportError, UnsupportedProtocol  # type: ignore[no-redef]

log = logging.getLogger(__name__)


def _untrusted_certificate(exc: BaseException) -> bool:
    """httpx wraps the ssl module's verification error; look along the cause chain."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


COMPATIBILITY_LEVELS: Final = frozenset(
    {
        "BACKWARD",
        "BACKWARD_TRANSITIVE",
        "FORWARD",
        "FORWARD_TRANSITIVE",
        "FULL",
        "FULL_TRANSITIVE",
        "NONE",
    }
)
_RETRIABLE_STATUS: Final = frozenset({408, 429, 500, 502, 503, 504})
_RESERVED_CLIENT_KEYS: Final = frozenset({"url", "max.retries"})

T = TypeVar("T")
CallHook = Callable[[str, str], None]  # (operation, subject)
RetryHook = Callable[[str, int, float, BaseException], None]  # (subject, attempt, delay s, error)


def key_subject(topic: str) -> str:
    return f"{topic}-key"


def value_subject(topic: str) -> str:
    return f"{topic}-value"


@dataclass(frozen=True)
class RegistryConfig:
    url: str
    default_compatibility: str = "BACKWARD"
    subject_compatibility: Mapping[str, str] = field(default_factory=dict)  # subject -> level
    manage_compatibility: bool = True  # False: leave subject levels to the operator
    max_attempts: int = 10  # per registry call; 0 = retry forever
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    client_config: Mapping[str, Any] = field(default_factory=dict)  # TLS/auth keys of the client

    def __post_init__(self) -> None:
        for where, level in [
            ("default_compatibility", self.default_compatibility),
            *self.subject_compatibility.items(),
        ]:
            if level not in COMPATIBILITY_LEVELS:
                raise ValueError(
                    f"{where}: unknown compatibility level {level!r}, expected one of {sorted(COMPATIBILITY_LEVELS)}"
                )
        if (
            self.max_attempts < 0
            or self.initial_backoff_s < 0
            or self.max_backoff_s < self.initial_backoff_s
        ):
            raise ValueError(
                "registry retry settings: need max_attempts >= 0 and 0 <= initial_backoff_s <= max_backoff_s"
            )
        reserved = _RESERVED_CLIENT_KEYS & set(self.client_config)
        if reserved:
            raise ValueError(
                f"client_config must not set {sorted(reserved)} (set by RegistryConfig)"
            )

    def compatibility_for(self, subject: str) -> str:
        return self.subject_compatibility.get(subject, self.default_compatibility)


@dataclass(frozen=True)
class RegisteredIds:
    key_id: int | None  # None: the table has no replica identity (null Kafka key)
    value_id: int


def _row_field_types(schema: Mapping[str, Any]) -> dict[str, str]:
    """Column -> pg.type of a Value/Key record, or of the Value inside an Envelope."""
    fields = schema.get("fields", [])
    before = next((f for f in fields if f.get("name") == "before"), None)
    if before is not None:
        record = next((t for t in before["type"] if isinstance(t, dict)), {})
        fields = record.get("fields", [])
    return {f.get("pg.name", f["name"]): f.get("pg.type", json.dumps(f["type"])) for f in fields}


def column_changes(
    old: Mapping[str, Any] | None, new: Mapping[str, Any]
) -> tuple[tuple[str, str | None, str | None], ...]:
    """(column, old pg.type, new pg.type) for every column added, dropped or retyped."""
    old_types = _row_field_types(old) if old else {}
    new_types = _row_field_types(new)
    names = list(old_types) + [n for n in new_types if n not in old_types]
    return tuple(
        (name, old_types.get(name), new_types.get(name))
        for name in names
        if old_types.get(name) != new_types.get(name)
    )


class SchemaRegistry:
    """Registers schemas once, caches ids, maps registry failures to ``schemas.errors``."""

    def __init__(
        self,
        config: RegistryConfig,
        client: SchemaRegistryClient | None = None,
        on_call: CallHook | None = None,
        on_retry: RetryHook | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.config = config
        if client is None:
            # new_client: a mock:// URL gives confluent-kafka's in-memory registry (tests, dry runs).
            client = SchemaRegistryClient.new_client(
                {**config.client_config, "url": config.url, "max.retries": 0}
            )
        self._client = client
        # confluent-kafka's mock registry implements no /config endpoint (nor compatibility checks).
        self._manage_compatibility = config.manage_compatibility and not config.url.startswith(
            "mock://"
        )
        self._on_call = on_call
        self._on_retry = on_retry
        self._sleep = sleep
        self._ids: dict[tuple[str, str], int] = {}
        self._configured: set[str] = set()
        self.calls = 0
        self.retries = 0

    def close(self) -> None:
        self._client.__exit__()

    # -- public API ----------------------------------------------------------------------

    def register(
        self, subject: str, schema: AvroSchema, table: str = "", lsn: int | None = None
    ) -> int:
        """The id of ``schema`` under ``subject``, registering it (a new version) if needed."""
        text = schema_text(schema)
        cached = self._ids.get((subject, text))
        if cached is not None:
            return cached
        configured = self._ensure_compatibility(subject)
        try:
            schema_id = self._call(
                "register",
                subject,
                lambda: self._client.register_schema(subject, Schema(text, "AVRO")),
            )
        except SchemaRegistryError as exc:
            if exc.http_status_code == 409:
                raise SchemaEvolutionError(
                    table or subject,
                    subject,
                    self._describe_refusal(subject, schema),
                    str(exc.error_message),
                    lsn,
                ) from exc
            raise RegistryError(
                subject, exc.http_status_code, exc.error_code, str(exc.error_message)
            ) from exc
        self._ids[(subject, text)] = schema_id
        if not configured and not self._ensure_compatibility(subject):
            raise RegistryError(
                subject, 404, -1, "subject still unknown after registering a version"
            )
        return schema_id

    def register_relation(self, codec: RelationCodec, lsn: int | None = None) -> RegisteredIds:
        """Key and value schema ids of a table's codec (the value first: it holds every column)."""
        value_id = self.register(
            value_subject(codec.topic), codec.envelope_schema, codec.table, lsn
        )
        key_id = None
        if codec.key_schema is not None:
            key_id = self.register(key_subject(codec.topic), codec.key_schema, codec.table, lsn)
        return RegisteredIds(key_id, value_id)

    # -- internals -----------------------------------------------------------------------

    def _ensure_compatibility(self, subject: str) -> bool:
        """Set the subject's level once; False if the subject must exist first.

        Apicurio's ccompat API answers 404 to a config change of a subject that has no
        version yet (Confluent's accepts it): then the first version is registered (nothing to
        be compatible with) and the level is set right after it.
        """
        if not self._manage_compatibility or subject in self._configured:
            return True
        level = self.config.compatibility_for(subject)
        try:
            self._call(
                "set_compatibility", subject, lambda: self._client.set_compatibility(subject, level)
            )
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                return False
            raise RegistryError(
                subject,
                exc.http_status_code,
                exc.error_code,
                f"setting compatibility {level}: {exc.error_message}",
            ) from exc
        self._configured.add(subject)
        return True

    def _describe_refusal(
        self, subject: str, new: AvroSchema
    ) -> tuple[tuple[str, str | None, str | None], ...]:
        """What changed against the subject's latest version (best effort: the error matters more)."""
        try:
            latest = self._call(
                "get_latest_version", subject, lambda: self._client.get_latest_version(subject)
            )
            old = (
                json.loads(latest.schema.schema_str)
                if latest.schema and latest.schema.schema_str
                else None
            )
        except (SchemaRegistryError, RegistryUnavailableError, ValueError) as exc:
            log.warning(
                "could not fetch the latest schema of %s to explain a refusal: %s", subject, exc
            )
            old = None
        return column_changes(old, new)

    def _call(self, operation: str, subject: str, request: Callable[[], T]) -> T:
        attempt = 0
        while True:
            attempt += 1
            self.calls += 1
            if self._on_call is not None:
                self._on_call(operation, subject)
            try:
                return request()
            except SchemaRegistryError as exc:
                if exc.http_status_code not in _RETRIABLE_STATUS:
                    raise
                error: BaseException = exc
            except UnsupportedProtocol as exc:  # a configuration error: retrying cannot help
                raise RegistryError(subject, 0, -1, f"{operation}: {exc}") from exc
            except (TransportError, OSError) as exc:
                if _untrusted_certificate(exc):  # configuration, not an outage: don't retry
                    raise RegistryError(
                        subject, 0, -1,
                        f"{operation}: the registry's TLS certificate is not trusted ({exc}); "
                        "check ssl.ca.location in WALBRIDGE_SCHEMA_REGISTRY_CONFIG",
                    ) from exc  # fmt: skip
                error = exc
            if self.config.max_attempts and attempt >= self.config.max_attempts:
                raise RegistryUnavailableError(subject, attempt, f"{operation}: {error}") from error
            delay = min(
                self.config.max_backoff_s, self.config.initial_backoff_s * 2 ** (attempt - 1)
            )
            self.retries += 1
            log.warning(
                "schema registry %s for %s failed (attempt %d): %s; retrying in %.1fs",
                operation,
                subject,
                attempt,
                error,
                delay,
            )
            if self._on_retry is not None:
                self._on_retry(subject, attempt, delay, error)
            self._sleep(delay)
