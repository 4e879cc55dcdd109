"""Configuration validation fails fast, before any I/O (no services)."""

from __future__ import annotations

from typing import Any

import pytest

from producer.replication import (
    ErrorKind,
    ReconnectPolicy,
    ReplicationConfig,
    ReplicationError,
    TableName,
)

pytestmark = pytest.mark.unit


def test_defaults_give_proto_1_options() -> None:
    config = ReplicationConfig(slot="s", publication="p")
    assert config.plugin_options() == (("proto_version", "1"), ("publication_names", '"p"'))


def test_all_options_in_order() -> None:
    config = ReplicationConfig(
        slot="s",
        publication='we"ird',
        proto_version=3,
        binary=True,
        messages=True,
        streaming="on",
        two_phase=True,
    )
    assert config.plugin_options() == (
        ("proto_version", "3"),
        ("publication_names", '"we""ird"'),
        ("binary", "true"),
        ("messages", "true"),
        ("streaming", "on"),
        ("two_phase", "on"),
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"proto_version": 0}, "proto_version"),
        ({"proto_version": 5}, "proto_version"),
        ({"streaming": "yes"}, "streaming must be one of"),
        ({"streaming": "on"}, "proto_version >= 2"),
        ({"streaming": "parallel", "proto_version": 3}, "proto_version >= 4"),
        ({"two_phase": True, "proto_version": 2}, "proto_version >= 3"),
        ({"status_interval": 0}, "status_interval"),
        ({"status_interval": float("nan")}, "status_interval"),
        ({"connect_timeout": 0}, "connect_timeout"),
        ({"tables": (TableName("a", "b"), TableName("a", "b"))}, "twice"),
    ],
)
def test_conflicting_or_invalid_settings_fail(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ReplicationError, match=message) as info:
        ReplicationConfig(slot="s", publication="p", **kwargs)
    assert info.value.kind is ErrorKind.CONFIG


def test_hostile_names_fail_in_config() -> None:
    with pytest.raises(ReplicationError) as info:
        ReplicationConfig(slot="s; drop", publication="p")
    assert info.value.kind is ErrorKind.IDENTIFIER
    with pytest.raises(ReplicationError) as info:
        ReplicationConfig(slot="s", publication="p\x00")
    assert info.value.kind is ErrorKind.IDENTIFIER


def test_from_mapping_parses_tables_and_reconnect() -> None:
    config = ReplicationConfig.from_mapping(
        {
            "slot": "s",
            "publication": "p",
            "tables": "public.a, sales.b",
            "reconnect": {"max_attempts": None, "initial_delay": 1.0},
        }
    )
    assert config.tables == (TableName("public", "a"), TableName("sales", "b"))
    assert config.reconnect == ReconnectPolicy(initial_delay=1.0, max_attempts=None)


def test_from_mapping_refuses_unknown_keys() -> None:
    with pytest.raises(ReplicationError, match="unknown replication settings: stremaing"):
        ReplicationConfig.from_mapping({"slot": "s", "publication": "p", "stremaing": "on"})
    with pytest.raises(ReplicationError, match="unknown reconnect settings: tries"):
        ReplicationConfig.from_mapping({"slot": "s", "publication": "p", "reconnect": {"tries": 3}})


def test_backoff_is_exponential_and_capped() -> None:
    policy = ReconnectPolicy(initial_delay=0.5, max_delay=3.0, multiplier=2.0, max_attempts=6)
    assert list(policy.delays()) == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]


def test_backoff_forever_keeps_going() -> None:
    delays = ReconnectPolicy(initial_delay=1, max_delay=4, max_attempts=None).delays()
    assert [next(delays) for _ in range(50)][-1] == 4


def test_backoff_zero_attempts_yields_nothing() -> None:
    assert list(ReconnectPolicy(max_attempts=0).delays()) == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial_delay": -1},
        {"max_delay": 0.1, "initial_delay": 1},
        {"multiplier": 0.5},
        {"max_attempts": -1},
    ],
)
def test_backoff_validation(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ReplicationError) as info:
        ReconnectPolicy(**kwargs)
    assert info.value.kind is ErrorKind.CONFIG


def test_send_status_before_streaming_is_a_no_op() -> None:
    # The producer keeps the walsender alive while it retries the registry during start-up,
    # before any stream exists: that must not fail.
    from producer.replication import ReplicationClient

    client = ReplicationClient(
        "host=127.0.0.1 port=1", ReplicationConfig(slot="s", publication="p")
    )
    client.send_status()  # no connection, no stream: nothing to send, nothing raised
    with pytest.raises(ReplicationError, match="stream"):
        client.confirm(1)
