"""The secure local stack (`WALBRIDGE_STACK_SECURE=1 deploy/local/stack up`) for tests (no tests
in this module): started in a throw-away state directory on free ports, with helpers for its
credentials. Both the integration tests and the secure e2e run use it."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from schemas.client_config import parse_pairs
from tests.conftest import ROOT
from tests.support.scratch_stack import ScratchStack, free_block
from tests.support.security import Credentials


@dataclass(frozen=True)
class SecureStack:
    stack: ScratchStack
    producer_env: dict[str, str]  # `stack env producer`
    consumer_env: dict[str, str]  # `stack env consumer`

    @property
    def state(self) -> Path:
        return self.stack.home / "secure"

    @property
    def ca(self) -> Path:
        return self.state / "tls" / "ca.pem"

    @property
    def admin_dsn(self) -> str:
        return self.producer_env["WALBRIDGE_PG_DSN"]

    @property
    def bootstrap(self) -> str:
        return self.producer_env["WALBRIDGE_KAFKA_BOOTSTRAP"]

    @property
    def registry_url(self) -> str:
        return self.producer_env["WALBRIDGE_SCHEMA_REGISTRY_URL"]

    def kafka_config(self, who: str) -> dict[str, str]:
        env = self.producer_env if who == "producer" else self.consumer_env
        return parse_pairs(env["WALBRIDGE_KAFKA_CONFIG"], "kafka")

    def registry_config(self, who: str) -> dict[str, str]:
        env = self.producer_env if who == "producer" else self.consumer_env
        return parse_pairs(env["WALBRIDGE_SCHEMA_REGISTRY_CONFIG"], "registry")

    def passwords(self) -> list[str]:
        """Every secret the stack made (PostgreSQL, Kafka users, keystore, registry users)."""
        return [p.read_text().strip() for p in sorted((self.state / "secrets").iterdir())]

    def credentials(self) -> Credentials:
        """For tests.support.security.activated: the harnesses then use them."""
        return Credentials(
            producer_kafka=self.producer_env["WALBRIDGE_KAFKA_CONFIG"],
            producer_registry=self.producer_env["WALBRIDGE_SCHEMA_REGISTRY_CONFIG"],
            consumer_kafka=self.consumer_env["WALBRIDGE_KAFKA_CONFIG"],
            consumer_registry=self.consumer_env["WALBRIDGE_SCHEMA_REGISTRY_CONFIG"],
            passwords=tuple(self.passwords()),
        )


@contextmanager
def secure_stack(**ports: str) -> Iterator[SecureStack]:
    """Started in a state directory under the session's WALBRIDGE_HOME (not pytest's tmp_path:
    the `postgres` user must be able to reach its data directory), removed afterwards."""
    session_home = Path(os.environ.get("WALBRIDGE_HOME", ROOT / ".walbridge"))
    home = session_home / "scratch" / f"secure-{uuid.uuid4().hex[:8]}"
    home.mkdir(parents=True)
    base = free_block(5)
    stack = ScratchStack(
        home,
        **{
            "WALBRIDGE_STACK_SECURE": "1",
            "WALBRIDGE_PG_PORT": str(base),
            "WALBRIDGE_KAFKA_PORT": str(base + 1),
            "WALBRIDGE_KAFKA_CONTROLLER_PORT": str(base + 2),
            "WALBRIDGE_REGISTRY_PORT": str(base + 3),
            "WALBRIDGE_REGISTRY_INTERNAL_PORT": str(base + 4),
            "WALBRIDGE_KAFKA_HEAP": "512m",
            **ports,
        },
    )
    try:
        stack.up()
        yield SecureStack(stack, stack.exports("producer"), stack.exports("consumer"))
    finally:
        stack.down()
        shutil.rmtree(home, ignore_errors=True)
