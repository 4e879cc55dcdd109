"""Registry smoke test through confluent-kafka's SchemaRegistryClient against the ccompat API."""

from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError


def _record(*fields: dict[str, object]) -> Schema:
    return Schema(
        json.dumps(
            {
                "type": "record",
                "name": "Smoke",
                "namespace": "walbridge.smoke",
                "fields": list(fields),
            }
        ),
        "AVRO",
    )


def test_register_fetch_evolve_and_refuse(registry_url: str) -> None:
    client = SchemaRegistryClient({"url": registry_url})
    subject = f"smoke-{uuid.uuid4().hex[:8]}-value"
    client.set_compatibility(subject_name=subject, level="BACKWARD")

    v1 = _record({"name": "id", "type": "long"})
    id1 = client.register_schema(subject, v1)
    fetched = client.get_schema(id1)
    assert json.loads(fetched.schema_str)["fields"] == [{"name": "id", "type": "long"}]

    # Adding a nullable field with a default is BACKWARD compatible: a new version is accepted.
    v2 = _record(
        {"name": "id", "type": "long"},
        {"name": "note", "type": ["null", "string"], "default": None},
    )
    id2 = client.register_schema(subject, v2)
    assert id2 != id1
    assert client.get_latest_version(subject).version == 2

    # Changing a field's type is not: the registry answers HTTP 409.
    v3 = _record({"name": "id", "type": "string"})
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, v3)
    assert refused.value.http_status_code == 409
    assert client.get_latest_version(subject).version == 2
