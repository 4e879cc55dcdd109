"""The producer image, built here for real (deploy/container/build), run with podman against the
local stack: it streams changes to Kafka, answers its probes and its HEALTHCHECK, stops cleanly on
SIGTERM (`podman stop`) with the slot confirmed, and holds neither Java nor Spark nor root.

The build takes about two minutes on two cores (a Debian base by debootstrap, then the image).
"""

from __future__ import annotations

import json
import os
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.support.containers import ROOT, build_image, podman, run_options
from tests.support.producer_harness import (
    Source,
    TopicReader,
    create_counter_table,
    free_port,
    insert_batches,
    sql,
    unique,
    verify_counter_table,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def producer_image() -> str:
    return build_image("producer")


@pytest.fixture
def table(pg_dsn: str) -> Iterator[str]:
    name = unique("image")
    create_counter_table(pg_dsn, name)
    yield name
    sql(pg_dsn, f"DROP TABLE IF EXISTS {name}")


@pytest.fixture
def source(pg_dsn: str, table: str) -> Iterator[Source]:
    src = Source.create(pg_dsn, [table], "image")
    yield src
    src.drop()


def http(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_producer_image_streams_to_the_local_stack(
    producer_image: str,
    pg_dsn: str,
    kafka_bootstrap: str,
    registry_url: str,
    source: Source,
    table: str,
) -> None:
    port = free_port()
    name = unique("walbridge-producer")
    # Values travel in podman's environment (`--env NAME`), so the DSN is not on a command line.
    settings = {
        "WALBRIDGE_PG_DSN": pg_dsn,
        "WALBRIDGE_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "WALBRIDGE_SCHEMA_REGISTRY_URL": registry_url,
        "WALBRIDGE_PUBLICATION": source.publication,
        "WALBRIDGE_SLOT": source.slot,
        "WALBRIDGE_TOPIC_PREFIX": source.prefix,
        "WALBRIDGE_METRICS_PORT": str(port),
        "WALBRIDGE_IDLE_AFTER_S": "0.5",
        "WALBRIDGE_SNAPSHOT": "never",  # counts exact streamed events
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("WALBRIDGE_")} | settings
    env_args = [arg for key in settings for arg in ("--env", key)]
    # The stack listens on loopback only: the container shares the host's network.
    started = podman(
        "run", "--detach", "--name", name, "--network", "host", *run_options(), *env_args,
        producer_image, env=env,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if http(port, "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            state = podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
            assert state == "running", podman("logs", name).stderr[-4000:]
            assert time.monotonic() < deadline, podman("logs", name).stderr[-4000:]
            time.sleep(0.5)
        assert http(port, "/healthz")[0] == 200
        health = podman("healthcheck", "run", name)
        assert health.returncode == 0, health.stdout + health.stderr

        insert_batches(pg_dsn, table, 1, 5, 200)
        records = TopicReader(kafka_bootstrap, registry_url).read(
            [f"{source.prefix}.public.{table}"], expect=1000, timeout=120
        )
        verify_counter_table(records, pg_dsn, table, 1000)
        end = source.current_lsn()
        source.wait_confirmed(end, timeout=60)
        status, metrics = http(port, "/metrics")
        assert status == 200 and "walbridge_events_total" in metrics

        stopped = podman("stop", "--time", "60", name, timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        code = podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
        logs = podman("logs", name)
        assert code == "0", logs.stderr[-4000:]
        confirmed = source.confirmed_lsn()
        assert confirmed is not None and confirmed >= end
        # Structured logs, and no password in them.
        output = logs.stdout + logs.stderr
        lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
        assert any(line.get("slot") == source.slot for line in lines), output[-2000:]
        assert "walbridge-local" not in logs.stdout + logs.stderr
    finally:
        podman("rm", "--force", "--time", "10", name)


def test_producer_image_is_slim_and_unprivileged(producer_image: str) -> None:
    probe = podman(
        "run", "--rm", "--network", "host", *run_options(), "--entrypoint", "sh", producer_image,
        "-c",
        "id -u; command -v java || echo no-java; "
        "python3 -c 'import pyspark' 2>/dev/null && echo pyspark || echo no-pyspark; "
        "python3 -c 'import producer, confluent_kafka, psycopg; print(\"imports-ok\")'",
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["10001", "no-java", "no-pyspark", "imports-ok"], probe.stdout
    inspect = podman("image", "inspect", producer_image)
    assert inspect.returncode == 0, inspect.stderr
    image = json.loads(inspect.stdout)[0]
    config = image["Config"]
    assert config["User"] == "10001:10001"
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert config["Labels"]["org.opencontainers.image.version"] == version
    assert len(config["Labels"]["org.opencontainers.image.revision"]) == 40
    assert "healthz" in " ".join(image["Healthcheck"]["Test"])
