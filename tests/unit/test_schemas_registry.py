"""Registry access with confluent-kafka's mock:// registry: id caching, evolution, refusals,
outages and configuration checks."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from httpx2 import ConnectError

from producer.pgoutput.messages import Column, Relation
from schemas.errors import RegistryError, RegistryUnavailableError, SchemaEvolutionError
from schemas.registry import (
    RegistryConfig,
    SchemaRegistry,
    column_changes,
    key_subject,
    value_subject,
)
from schemas.relation import RelationCodec, build_relation_codec
from schemas.type_catalog import TypeCatalog

pytestmark = pytest.mark.unit

TOPIC = "db.public.orders"


def codec(*extra: Column, amount_type: int = 1700) -> RelationCodec:
    columns = (Column(1, "id", 20, -1, True), Column(0, "amount", amount_type, -1, False), *extra)
    return build_relation_codec(
        Relation(None, 1, "public", "orders", "d", columns), TypeCatalog(), TOPIC
    )


class FlakyClient:
    """Delegates to a mock registry; fails the first ``failures`` calls, refuses some schemas."""

    def __init__(
        self,
        failures: int = 0,
        failure: Exception | None = None,
        refuse_containing: str | None = None,
    ) -> None:
        self.inner = SchemaRegistryClient.new_client({"url": "mock://unit"})
        self.failures = failures
        self.failure = failure or ConnectError("connection refused")
        self.refuse_containing = refuse_containing
        self.compatibility: dict[str, str] = {}

    def _maybe_fail(self) -> None:
        if self.failures:
            self.failures -= 1
            raise self.failure

    def register_schema(self, subject: str, schema: Any) -> int:
        self._maybe_fail()
        if self.refuse_containing and self.refuse_containing in schema.schema_str:
            raise SchemaRegistryError(
                409, 409, "Schema being registered is incompatible with an earlier schema"
            )
        return int(self.inner.register_schema(subject, schema))

    def set_compatibility(self, subject: str, level: str) -> str:
        self._maybe_fail()
        self.compatibility[subject] = level
        return level

    def get_latest_version(self, subject: str) -> Any:
        return self.inner.get_latest_version(subject)


def registry(
    client: Any, **config: Any
) -> tuple[SchemaRegistry, list[tuple[str, str]], list[float]]:
    calls: list[tuple[str, str]] = []
    sleeps: list[float] = []
    reg = SchemaRegistry(
        RegistryConfig(config.pop("url", "mock://unit"), **config),
        client=client,
        on_call=lambda op, subject: calls.append((op, subject)),
        sleep=sleeps.append,
    )
    return reg, calls, sleeps


def test_ids_are_cached_one_registry_call_per_new_schema() -> None:
    reg, calls, _ = registry(SchemaRegistryClient.new_client({"url": "mock://cache"}))
    first = reg.register_relation(codec())
    for _ in range(100):
        assert reg.register_relation(codec()) == first
    assert first.key_id is not None
    registers = [c for c in calls if c[0] == "register"]
    assert registers == [("register", value_subject(TOPIC)), ("register", key_subject(TOPIC))]
    assert reg.calls == len(calls) == 2


def test_changed_relation_registers_a_new_version() -> None:
    client = SchemaRegistryClient.new_client({"url": "mock://evolve"})
    reg, _, _ = registry(client)
    reg.register_relation(codec())
    reg.register_relation(codec(Column(0, "note", 25, -1, False)))
    assert sorted(client.get_versions(value_subject(TOPIC))) == [1, 2]  # the mock's order varies
    assert client.get_versions(key_subject(TOPIC)) == [1]  # the key did not change


def test_compatibility_is_set_per_subject_with_overrides() -> None:
    client = FlakyClient()
    reg, calls, _ = registry(
        client, url="http://registry:8081", subject_compatibility={value_subject(TOPIC): "FULL"}
    )
    reg.register_relation(codec())
    assert client.compatibility == {value_subject(TOPIC): "FULL", key_subject(TOPIC): "BACKWARD"}
    reg.register_relation(codec(Column(0, "note", 25, -1, False)))
    assert [op for op, _ in calls].count("set_compatibility") == 2  # once per subject


def test_compatibility_left_alone_when_not_managed() -> None:
    client = FlakyClient()
    reg, calls, _ = registry(client, url="http://registry:8081", manage_compatibility=False)
    reg.register_relation(codec())
    assert client.compatibility == {} and all(op == "register" for op, _ in calls)


def test_incompatible_change_names_table_column_types_and_registry_message() -> None:
    client = FlakyClient(refuse_containing='"pg.type":"text"')
    reg, _, _ = registry(client)
    reg.register_relation(codec())
    with pytest.raises(SchemaEvolutionError) as info:
        reg.register_relation(codec(amount_type=25), lsn=99)
    err = info.value
    assert err.table == "public.orders" and err.subject == value_subject(TOPIC) and err.lsn == 99
    assert err.changes == (("amount", "numeric", "text"),)
    assert "incompatible with an earlier schema" in err.registry_message
    text = str(err)
    assert "'amount': numeric -> text" in text and "public.orders" in text and "compatib" in text


def test_other_registry_errors_are_not_retried() -> None:
    client = FlakyClient(failures=1, failure=SchemaRegistryError(422, 42201, "Invalid schema"))
    reg, _, sleeps = registry(client, manage_compatibility=False)
    with pytest.raises(RegistryError, match="Invalid schema"):
        reg.register_relation(codec())
    assert sleeps == []


def test_outage_is_retried_with_exponential_backoff_then_recovers() -> None:
    client = FlakyClient(failures=4)
    retries: list[tuple[str, int, float]] = []
    reg = SchemaRegistry(
        RegistryConfig("http://registry:8081", initial_backoff_s=0.5, max_backoff_s=3.0),
        client=client,  # type: ignore[arg-type]
        on_retry=lambda subject, attempt, delay, error: retries.append((subject, attempt, delay)),
        sleep=lambda s: None,
    )
    ids = reg.register_relation(codec())
    assert ids.value_id >= 1
    assert [r[2] for r in retries] == [0.5, 1.0, 2.0, 3.0]
    assert [r[1] for r in retries] == [1, 2, 3, 4] and reg.retries == 4


def test_http_503_counts_as_an_outage() -> None:
    client = FlakyClient(failures=1, failure=SchemaRegistryError(503, -1, "unavailable"))
    reg, _, sleeps = registry(client, url="http://registry:8081")
    reg.register_relation(codec())
    assert sleeps == [0.5]


def test_outage_gives_up_after_max_attempts() -> None:
    client = FlakyClient(failures=100)
    reg, calls, sleeps = registry(client, max_attempts=3)
    with pytest.raises(RegistryUnavailableError) as info:
        reg.register_relation(codec())
    assert info.value.attempts == 3 and len(calls) == 3 and len(sleeps) == 2


@pytest.mark.parametrize(
    "config",
    [
        {"default_compatibility": "SIDEWAYS"},
        {"subject_compatibility": {"x-value": "backward"}},
        {"max_attempts": -1},
        {"initial_backoff_s": 5.0, "max_backoff_s": 1.0},
        {"client_config": {"url": "http://elsewhere"}},
    ],
)
def test_bad_configuration_fails_fast(config: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RegistryConfig("http://localhost:8080", **config)


def test_column_changes_lists_added_dropped_and_retyped_columns() -> None:
    old = codec(Column(0, "gone", 25, -1, False)).envelope_schema
    new = codec(Column(0, "fresh", 16, -1, False), amount_type=25).envelope_schema
    assert column_changes(old, new) == (
        ("amount", "numeric", "text"),
        ("gone", "text", None),
        ("fresh", None, "boolean"),
    )
    assert column_changes(None, codec().key_schema or {}) == (("id", None, "bigint"),)


def test_mock_url_gives_the_in_memory_registry() -> None:
    reg = SchemaRegistry(RegistryConfig("mock://default"))
    assert reg.register_relation(codec()).value_id >= 1


def test_unsupported_url_scheme_fails_at_start_up() -> None:
    with pytest.raises(ValueError, match="ftp://nowhere"):
        SchemaRegistry(RegistryConfig("ftp://nowhere"))
