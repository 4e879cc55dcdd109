"""Writer schemas by id from the registry, fetched once per id (ids are immutable).

The consumer's read side only; registration lives in `schemas/registry.py` (the producer's).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError


class SchemaNotFound(LookupError):
    pass


class WriterSchemas:
    def __init__(self, client: SchemaRegistryClient) -> None:
        self._client = client
        self._text: dict[int, str] = {}

    @classmethod
    def from_url(cls, url: str, client_config: Mapping[str, Any] | None = None) -> WriterSchemas:
        # new_client gives the in-process mock for mock:// URLs (unit tests). client_config:
        # TLS and auth (WALBRIDGE_SCHEMA_REGISTRY_CONFIG).
        return cls(SchemaRegistryClient.new_client({**(client_config or {}), "url": url}))

    def text(self, schema_id: int) -> str:
        """The writer schema's canonical JSON text, as Spark's from_avro wants it."""
        cached = self._text.get(schema_id)
        if cached is not None:
            return cached
        try:
            schema = self._client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            raise SchemaNotFound(f"schema id {schema_id}: {exc}") from exc
        if schema.schema_type not in (None, "AVRO"):
            raise SchemaNotFound(f"schema id {schema_id} is {schema.schema_type}, not AVRO")
        text = schema.schema_str
        assert text is not None
        self._text[schema_id] = text
        return text

    def parsed(self, schema_id: int) -> Any:
        return json.loads(self.text(schema_id))
