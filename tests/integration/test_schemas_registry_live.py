"""Registry access against the real registry (Apicurio's Confluent-compatible API here)."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from producer.pgoutput.messages import Column, Relation
from schemas.errors import RegistryUnavailableError, SchemaEvolutionError
from schemas.registry import RegistryConfig, SchemaRegistry, key_subject, value_subject
from schemas.relation import RelationCodec, build_relation_codec
from schemas.type_catalog import TypeCatalog

pytestmark = pytest.mark.integration


def topic(label: str) -> str:
    return f"it{os.getpid()}_{int(time.time())}.public.{label}"


def codec(topic_name: str, *columns: tuple[str, int]) -> RelationCodec:
    cols = (
        Column(1, "id", 20, -1, True),
        *(Column(0, name, oid, -1, False) for name, oid in columns),
    )
    return build_relation_codec(
        Relation(None, 1, "public", "orders", "d", cols), TypeCatalog(), topic_name
    )


def test_registration_is_cached_and_ids_match_the_registry(registry_url: str) -> None:
    name = topic("cache")
    calls: list[tuple[str, str]] = []
    registry = SchemaRegistry(
        RegistryConfig(registry_url), on_call=lambda op, s: calls.append((op, s))
    )
    first = registry.register_relation(codec(name, ("note", 25)))
    for _ in range(20):
        assert registry.register_relation(codec(name, ("note", 25))) == first
    assert [op for op, _ in calls].count("register") == 2
    client = SchemaRegistryClient({"url": registry_url})
    latest = client.get_latest_version(value_subject(name))
    assert latest.schema_id == first.value_id
    assert client.get_latest_version(key_subject(name)).schema_id == first.key_id
    assert client.get_compatibility(value_subject(name)) == "BACKWARD"


def test_add_drop_and_rename_column_register_new_versions(registry_url: str) -> None:
    name = topic("evolve")
    registry = SchemaRegistry(RegistryConfig(registry_url))
    v1 = registry.register_relation(codec(name, ("note", 25)))
    v2 = registry.register_relation(codec(name, ("note", 25), ("qty", 23)))  # add
    v3 = registry.register_relation(codec(name, ("qty", 23)))  # drop
    v4 = registry.register_relation(codec(name, ("quantity", 23)))  # rename = drop + add
    assert len({v1.value_id, v2.value_id, v3.value_id, v4.value_id}) == 4
    assert v1.key_id == v4.key_id
    client = SchemaRegistryClient({"url": registry_url})
    assert len(client.get_versions(value_subject(name))) == 4


def test_incompatible_type_change_is_refused_with_a_clear_error(registry_url: str) -> None:
    name = topic("refuse")
    registry = SchemaRegistry(RegistryConfig(registry_url))
    registry.register_relation(codec(name, ("qty", 20)))  # bigint -> long
    with pytest.raises(SchemaEvolutionError) as info:
        registry.register_relation(codec(name, ("qty", 16)), lsn=4242)  # boolean
    err = info.value
    assert err.subject == value_subject(name) and err.table == "public.orders" and err.lsn == 4242
    assert err.changes == (("qty", "bigint", "boolean"),)
    assert err.registry_message
    assert "'qty': bigint -> boolean" in str(err)


def test_per_subject_compatibility_is_applied(registry_url: str) -> None:
    # Not NONE: Apicurio's ccompat API implements NONE by deleting the subject's rule, so the
    # global rule applies again (Apicurio/apicurio-registry#5251); a real level is kept.
    name = topic("full")
    registry = SchemaRegistry(
        RegistryConfig(registry_url, subject_compatibility={value_subject(name): "FULL"})
    )
    registry.register_relation(codec(name, ("qty", 20)))
    registry.register_relation(
        codec(name, ("qty", 20), ("note", 25))
    )  # nullable, default null: FULL-compatible
    client = SchemaRegistryClient({"url": registry_url})
    assert client.get_compatibility(value_subject(name)) == "FULL"
    assert client.get_compatibility(key_subject(name)) == "BACKWARD"
    with pytest.raises(SchemaEvolutionError):
        registry.register_relation(codec(name, ("qty", 16), ("note", 25)))


def test_unreachable_registry_is_retried_then_reported(registry_url: str) -> None:
    retries: list[Any] = []
    registry = SchemaRegistry(
        RegistryConfig(
            "http://127.0.0.1:9", max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02
        ),
        on_retry=lambda *args: retries.append(args),
    )
    with pytest.raises(RegistryUnavailableError) as info:
        registry.register_relation(codec(topic("down"), ("note", 25)))
    assert info.value.attempts == 3 and len(retries) == 2
