"""The credentials of the secure stack the tests run against, when they do (no tests here).

`deploy/local/test --secure-stack` (see tests/conftest.py) and the secure e2e test activate it;
the producer harness, the topic reader and the e2e pipeline then pass each principal's settings
(`WALBRIDGE_KAFKA_CONFIG`, `WALBRIDGE_SCHEMA_REGISTRY_CONFIG`) and name their topics and groups
under the stack's ACL prefix. With nothing active, everything runs in plaintext as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

ACL_PREFIX = "walbridge"  # deploy/local/stack's default WALBRIDGE_STACK_ACL_PREFIX


@dataclass(frozen=True)
class Credentials:
    producer_kafka: str  # k=v lists, as `stack env producer|consumer` exports them
    producer_registry: str
    consumer_kafka: str
    consumer_registry: str
    passwords: tuple[str, ...]  # to look for in outputs: none may appear


_active: Credentials | None = None


def active() -> Credentials | None:
    return _active


@contextmanager
def activated(credentials: Credentials) -> Iterator[Credentials]:
    global _active
    previous, _active = _active, credentials
    try:
        yield credentials
    finally:
        _active = previous


def under_acl_prefix(name: str) -> str:
    """A topic prefix or group the secure stack's ACLs cover (unchanged in plaintext)."""
    if _active is None or name.startswith(ACL_PREFIX):
        return name
    return f"{ACL_PREFIX}_{name}"


def producer_env() -> dict[str, str]:
    if _active is None:
        return {}
    return {
        "WALBRIDGE_KAFKA_CONFIG": _active.producer_kafka,
        "WALBRIDGE_SCHEMA_REGISTRY_CONFIG": _active.producer_registry,
    }


def consumer_env() -> dict[str, str]:
    if _active is None:
        return {}
    return {
        "WALBRIDGE_KAFKA_CONFIG": _active.consumer_kafka,
        "WALBRIDGE_SCHEMA_REGISTRY_CONFIG": _active.consumer_registry,
    }


def leaks(texts: dict[str, str]) -> list[str]:
    """The names of the texts that contain a password of the active stack."""
    if _active is None:
        return []
    return [name for name, text in texts.items() if any(p in text for p in _active.passwords)]
