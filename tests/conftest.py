"""Session-wide fixtures: the real local stack, started once per test session when needed.

If WALBRIDGE_PG_DSN, WALBRIDGE_KAFKA_BOOTSTRAP and WALBRIDGE_SCHEMA_REGISTRY_URL are all set, the
tests use those services and never start or stop anything. Otherwise the first test that needs a
service runs `deploy/local/stack up`, and the session stops at the end only the services it started.
Unit tests (tests/unit) never touch the stack.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

if TYPE_CHECKING:
    from tests.support.secure_stack import SecureStack
    from tests.support.toxiproxy_client import ToxiproxyApi

# Property tests check what is generated, not how fast: Hypothesis's default 200 ms deadline per
# example fails them on a loaded 2-core machine (the suite shares it with Kafka, PostgreSQL and
# Spark), where one example can wait that long for a core.
settings.register_profile("walbridge", deadline=None)
settings.load_profile("walbridge")

ROOT = Path(__file__).resolve().parent.parent
STACK = ROOT / "deploy" / "local" / "stack"
ENV_KEYS = ("WALBRIDGE_PG_DSN", "WALBRIDGE_KAFKA_BOOTSTRAP", "WALBRIDGE_SCHEMA_REGISTRY_URL")


@dataclass(frozen=True)
class Stack:
    pg_dsn: str
    kafka_bootstrap: str
    registry_url: str
    managed: bool  # True when this test session started (some of) the services itself

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run `deploy/local/stack <args>` (outage tests stop and start single services)."""
        if not self.managed:
            pytest.fail(
                "this test stops and starts services, so it needs the stack started by the tests"
            )
        return subprocess.run([str(STACK), *args], check=True, text=True, capture_output=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--secure-stack",
        action="store_true",
        help="run against a secure stack (WALBRIDGE_STACK_SECURE=1: TLS, SASL, ACLs, auth) that "
        "the session starts on free ports in its own state directory; only the tests marked "
        "secure_stack run",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The directory decides the kind, so a forgotten marker can't put a service test among unit tests.
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT).parts
        if len(parts) > 1 and parts[0] == "tests" and parts[1] in ("unit", "integration", "e2e"):
            item.add_marker(getattr(pytest.mark, parts[1]))
    if config.getoption("--secure-stack"):
        # Tests that stop services or speak plaintext Kafka themselves are not marked.
        keep = [i for i in items if i.get_closest_marker("secure_stack")]
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep


def _running_services() -> set[str]:
    out = subprocess.run([str(STACK), "status"], text=True, capture_output=True).stdout
    return {m.group(1) for m in re.finditer(r"^(\w+)\s+running\b", out, re.MULTILINE)}


def _stack_env() -> dict[str, str]:
    out = subprocess.run([str(STACK), "env"], check=True, text=True, capture_output=True).stdout
    return dict(re.findall(r"^export (\w+)='([^']*)'$", out, re.MULTILINE))


@pytest.fixture(scope="session")
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    if request.config.getoption("--secure-stack"):
        from tests.support import security
        from tests.support.secure_stack import secure_stack

        with secure_stack() as secure, security.activated(secure.credentials()):
            yield Stack(secure.admin_dsn, secure.bootstrap, secure.registry_url, managed=False)
        return
    if all(os.environ.get(k) for k in ENV_KEYS):
        yield Stack(
            os.environ["WALBRIDGE_PG_DSN"],
            os.environ["WALBRIDGE_KAFKA_BOOTSTRAP"],
            os.environ["WALBRIDGE_SCHEMA_REGISTRY_URL"],
            managed=False,
        )
        return
    before = _running_services()
    proc = subprocess.run([str(STACK), "up"], text=True, capture_output=True)
    if proc.returncode != 0:
        pytest.fail(f"deploy/local/stack up failed:\n{proc.stderr}", pytrace=False)
    env = _stack_env()
    try:
        yield Stack(env[ENV_KEYS[0]], env[ENV_KEYS[1]], env[ENV_KEYS[2]], managed=True)
    finally:
        started = [s for s in ("postgres", "kafka", "registry") if s not in before]
        if started:
            subprocess.run([str(STACK), "down", *started], text=True, capture_output=True)


@pytest.fixture(scope="session")
def shared_secure_stack() -> Iterator[SecureStack]:
    """One secure stack (TLS, SASL, ACLs) for every test module that needs its own: starting one
    costs 1.5-2 minutes here. The tests on it name their tables, topics and slots uniquely, and
    none stops a service. Here, not in tests/support: a session fixture imported into two test
    modules would be two fixtures, each starting a stack."""
    from tests.support.secure_stack import secure_stack

    with secure_stack() as secure:
        yield secure


# The synchronous standby a snapshot test names so that commits wait (one that never comes).
ABSENT_STANDBY = "walbridge_absent"


@pytest.fixture(scope="session")
def pg_dsn(stack: Stack) -> str:
    _forget_absent_standby(stack.pg_dsn)
    return stack.pg_dsn


def _forget_absent_standby(dsn: str) -> None:
    """A run killed in the middle of that test leaves the setting in postgresql.auto.conf, and
    every later commit would wait for the standby: reset it (only that value)."""
    import psycopg

    local = "-c synchronous_commit=local"
    with psycopg.connect(dsn, autocommit=True, options=local) as conn:
        row = conn.execute("SELECT current_setting('synchronous_standby_names')").fetchone()
        if row is not None and row[0] == ABSENT_STANDBY:
            conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
            conn.execute("SELECT pg_reload_conf()")


@pytest.fixture(scope="session")
def kafka_bootstrap(stack: Stack) -> str:
    return stack.kafka_bootstrap


@pytest.fixture(scope="session")
def registry_url(stack: Stack) -> str:
    return stack.registry_url


@pytest.fixture(scope="session")
def toxiproxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToxiproxyApi]:
    """One Toxiproxy server per session (built on first use): the network-fault tests."""
    from tests.support.toxiproxy_server import toxiproxy_server

    with toxiproxy_server(tmp_path_factory.mktemp("toxiproxy")) as api:
        yield api
