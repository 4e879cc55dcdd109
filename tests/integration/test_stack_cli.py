"""deploy/local/stack's failure messages: each bad situation is named, with a non-zero exit.

These run the script against a throw-away state directory (sharing the real download cache), so
they never disturb the stack the rest of the suite uses.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import STACK, Stack
from tests.support.scratch_stack import download_cache


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def scratch_env(stack: Stack, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WALBRIDGE_")}
    env.update(
        WALBRIDGE_HOME=str(tmp_path / "home"),
        WALBRIDGE_DOWNLOADS=str(download_cache()),
        WALBRIDGE_PG_PORT=str(_free_port()),
        WALBRIDGE_KAFKA_PORT=str(_free_port()),
        WALBRIDGE_KAFKA_CONTROLLER_PORT=str(_free_port()),
        WALBRIDGE_REGISTRY_PORT=str(_free_port()),
    )
    return env


def _stack(
    env: dict[str, str], *args: str, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(STACK), *args], env=env, text=True, capture_output=True, timeout=timeout
    )


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_taken_port_names_the_port_and_its_process(
    scratch_env: dict[str, str], busy_port: int
) -> None:
    scratch_env["WALBRIDGE_REGISTRY_PORT"] = str(busy_port)
    proc = _stack(scratch_env, "up", "registry")
    assert proc.returncode != 0
    assert f"port {busy_port} is already taken" in proc.stderr
    assert f"pid={os.getpid()}" in proc.stderr  # ss names the listening process


def test_missing_java_is_a_clear_error(scratch_env: dict[str, str]) -> None:
    scratch_env["WALBRIDGE_JAVA"] = "/nonexistent/bin/java"
    scratch_env["PATH"] = "/usr/bin:/bin"  # JAVA_HOME/PATH must not rescue it either
    scratch_env.pop("JAVA_HOME", None)
    proc = _stack(scratch_env, "up", "kafka")
    assert proc.returncode != 0
    assert "Java 17 or newer is required" in proc.stderr


def test_maven_failure_names_the_artifact(scratch_env: dict[str, str], tmp_path: Path) -> None:
    scratch_env["WALBRIDGE_DOWNLOADS"] = str(tmp_path / "empty-downloads")
    scratch_env["WALBRIDGE_MAVEN_ARGS"] = (
        "-o"  # offline with an empty local repository: resolution must fail
    )
    proc = _stack(scratch_env, "up", "registry")
    assert proc.returncode != 0
    assert "Maven could not resolve io.apicurio:apicurio-registry-app:" in proc.stderr


def test_service_that_does_not_answer_in_time_quotes_its_log(scratch_env: dict[str, str]) -> None:
    scratch_env["WALBRIDGE_STACK_TIMEOUT"] = "1"  # a JVM and Quarkus need more than a second
    proc = _stack(scratch_env, "up", "registry")
    assert proc.returncode != 0
    log = Path(scratch_env["WALBRIDGE_HOME"]) / "logs" / "registry.log"
    assert "registry did not answer within 1s" in proc.stderr
    assert str(log) in proc.stderr
    quoted = [line[6:] for line in proc.stderr.splitlines() if line.startswith("    | ")]
    if log.stat().st_size:
        assert quoted and quoted[-1] in log.read_text()  # the log's last lines are quoted
    else:
        assert "(still empty)" in proc.stderr
    status = _stack(scratch_env, "status")
    assert "registry   stopped" in status.stdout  # the half-started process was not left behind


def test_env_status_and_idempotent_up(stack: Stack) -> None:
    if not stack.managed:
        pytest.skip("services come from WALBRIDGE_* variables, not from deploy/local/stack")
    first = subprocess.run([str(STACK), "up"], text=True, capture_output=True)
    assert first.returncode == 0, first.stderr
    assert first.stderr.count("already running") == 3
    status = subprocess.run([str(STACK), "status"], text=True, capture_output=True)
    assert status.returncode == 0
    for service in ("postgres", "kafka", "registry"):
        assert f"{service}" in status.stdout and "running" in status.stdout
    env = subprocess.run([str(STACK), "env"], text=True, capture_output=True).stdout
    for key in ("WALBRIDGE_PG_DSN", "WALBRIDGE_KAFKA_BOOTSTRAP", "WALBRIDGE_SCHEMA_REGISTRY_URL"):
        assert f"export {key}=" in env
