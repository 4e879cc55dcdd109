"""Start-up stays lean: the slow registry client is imported by ``producer.wiring`` in a thread
(overlapping PostgreSQL's set-up), never by importing the producer's modules."""

from __future__ import annotations

import subprocess
import sys

import pytest

from producer.config import load_config
from producer.health import HealthState
from producer.metrics import Metrics
from producer.stopping import StopFlag
from producer.wiring import open_registry

pytestmark = pytest.mark.unit

ENV = {
    "WALBRIDGE_PG_DSN": "host=localhost dbname=db",
    "WALBRIDGE_KAFKA_BOOTSTRAP": "localhost:9092",
    "WALBRIDGE_SCHEMA_REGISTRY_URL": "mock://startup",
}


def test_importing_the_producer_leaves_the_registry_client_out() -> None:
    probe = (
        "import sys, producer.__main__; "
        "print(sorted(m for m in sys.modules if m.startswith(("
        "'confluent_kafka.schema_registry', 'schemas.registry', 'authlib', 'httpx'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True
    ).stdout
    assert out.strip() == "[]"


def test_open_registry_gives_the_configured_client() -> None:
    """What setup used to build inline: the configured URL and attempts, subject levels left
    to the operator, and registry calls counted in the producer's metrics."""
    config = load_config([], ENV | {"WALBRIDGE_REGISTRY_MAX_ATTEMPTS": "3"})
    metrics = Metrics()
    registry = open_registry(config, metrics, HealthState(stall_after_s=120.0), StopFlag().check)
    assert registry.config.url == "mock://startup"
    assert registry.config.max_attempts == 3
    assert registry.config.manage_compatibility is False
    registry.register("t-value", {"type": "record", "name": "R", "fields": []})
    calls = metrics.registry.get_sample_value(
        "walbridge_registry_calls_total", {"operation": "register"}
    )
    assert calls is not None and calls >= 1
