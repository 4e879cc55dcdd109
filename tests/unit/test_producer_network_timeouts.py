"""The producer's network timeouts as settings (no services): defaults, validation, and where
each one ends up (the replication client, librdkafka, the registry client)."""

from __future__ import annotations

import pytest

from producer.config import load_config
from producer.errors import ConfigError
from producer.kafka_sink import producer_settings
from producer.wiring import _replication_config

pytestmark = pytest.mark.unit

BASE = {
    "WALBRIDGE_PG_DSN": "postgresql://u:secret@h/db",
    "WALBRIDGE_KAFKA_BOOTSTRAP": "127.0.0.1:1",
    "WALBRIDGE_SCHEMA_REGISTRY_URL": "http://r",
}


def test_defaults_reach_each_client() -> None:
    cfg = load_config([], BASE)
    assert cfg.replication_receive_timeout_s == 30.0
    assert _replication_config(cfg).receive_timeout == 30.0
    assert producer_settings(cfg)["socket.timeout.ms"] == 30_000
    assert producer_settings(cfg, "walbridge.x")["socket.timeout.ms"] == 30_000
    assert cfg.registry_client_config()["timeout"] == 10.0


def test_flags_and_variables_set_them() -> None:
    cfg = load_config(
        ["--replication-receive-timeout-s", "6", "--kafka-socket-timeout-ms", "5000"],
        BASE | {"WALBRIDGE_SCHEMA_REGISTRY_TIMEOUT_S": "2.5"},
    )
    assert _replication_config(cfg).receive_timeout == 6.0
    assert producer_settings(cfg)["socket.timeout.ms"] == 5000
    assert cfg.registry_client_config()["timeout"] == 2.5


def test_the_clients_own_keys_win() -> None:
    cfg = load_config(
        [],
        BASE
        | {
            "WALBRIDGE_KAFKA_CONFIG": "socket.timeout.ms=7000",
            "WALBRIDGE_SCHEMA_REGISTRY_CONFIG": "timeout=3",
        },
    )
    assert producer_settings(cfg)["socket.timeout.ms"] == "7000"
    assert cfg.registry_client_config()["timeout"] == 3


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("WALBRIDGE_REPLICATION_RECEIVE_TIMEOUT_S", "0", "replication_receive_timeout_s must be > 0"),
        ("WALBRIDGE_REPLICATION_RECEIVE_TIMEOUT_S", "inf", "replication_receive_timeout_s must be > 0"),
        ("WALBRIDGE_REPLICATION_RECEIVE_TIMEOUT_S", "0.5", "must exceed idle_after_s"),
        ("WALBRIDGE_SCHEMA_REGISTRY_TIMEOUT_S", "-1", "schema_registry_timeout_s must be > 0"),
        ("WALBRIDGE_KAFKA_SOCKET_TIMEOUT_MS", "5", "kafka_socket_timeout_ms must be >= 10"),
    ],
)  # fmt: skip
def test_bad_timeouts_are_refused_naming_the_setting(
    variable: str, value: str, message: str
) -> None:
    env = BASE | {variable: value}
    if "idle_after" in message:
        env |= {"WALBRIDGE_IDLE_AFTER_S": "1"}
    with pytest.raises(ConfigError, match=message):
        load_config([], env)
