"""The whole pipeline from the images: the producer image streams a table's changes to the local
stack's Kafka, the consumer image (Spark local[2] inside the container, connector jars from the
image, no Maven at start-up) applies them to a lake on a mounted directory, its `verify`
command finds the lake equal to PostgreSQL, and delta-rs on the host reads the same rows.

Both images are built here for real (deploy/container/build --base debian): about two minutes
for the producer's and seven for the consumer's on two cores.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from tests.support.containers import (
    build_image,
    logs,
    podman,
    run_detached,
    wait_exit,
    wait_ready,
)
from tests.support.producer_harness import Source, free_port, query, sql, unique

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def images() -> tuple[str, str]:
    return build_image("producer"), build_image("consumer")


@pytest.fixture
def table(pg_dsn: str) -> Iterator[str]:
    name = unique("imgpipe")
    sql(
        pg_dsn,
        f"CREATE TABLE {name} (id int PRIMARY KEY, amount numeric(12, 2) NOT NULL, "
        "note text, at timestamptz NOT NULL DEFAULT now())",
    )
    yield name
    sql(pg_dsn, f"DROP TABLE IF EXISTS {name}")


@pytest.fixture
def source(pg_dsn: str, table: str) -> Iterator[Source]:
    src = Source.create(pg_dsn, [table], "imgpipe")
    yield src
    src.drop()


def test_images_run_the_pipeline_into_a_lake(
    images: tuple[str, str],
    pg_dsn: str,
    kafka_bootstrap: str,
    registry_url: str,
    source: Source,
    table: str,
    tmp_path: Path,
) -> None:
    producer_image, consumer_image = images
    producer = unique("walbridge-producer")
    consumer = unique("walbridge-consumer")
    verifier = unique("walbridge-verify")
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o777)  # the consumer runs as uid 10001
    port = free_port()
    common = {
        "WALBRIDGE_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "WALBRIDGE_SCHEMA_REGISTRY_URL": registry_url,
        "WALBRIDGE_TOPIC_PREFIX": source.prefix,
    }
    try:
        run_detached(
            producer_image,
            producer,
            common
            | {
                "WALBRIDGE_PG_DSN": pg_dsn,
                "WALBRIDGE_PUBLICATION": source.publication,
                "WALBRIDGE_SLOT": source.slot,
                "WALBRIDGE_METRICS_PORT": str(port),
                "WALBRIDGE_IDLE_AFTER_S": "0.5",
                "WALBRIDGE_SNAPSHOT": "never",  # counts exact streamed events
            },
        )
        # Changes committed before the producer creates its slot are not in the slot.
        wait_ready(producer, port)
        sql(
            pg_dsn,
            f"INSERT INTO {table} (id, amount, note) "
            "SELECT g, g * 1.25, 'row ' || g FROM generate_series(1, 2000) g",
            f"UPDATE {table} SET amount = amount + 100, note = NULL WHERE id % 7 = 0",
            f"DELETE FROM {table} WHERE id % 11 = 0",
            f"INSERT INTO {table} (id, amount, note) VALUES (5001, 0.01, 'last')",
        )
        source.wait_confirmed(source.current_lsn(), timeout=180)

        lake = {
            "WALBRIDGE_LAKE_PATH": "/data/lake",
            "WALBRIDGE_CHECKPOINT_PATH": "/data/checkpoint",
            "WALBRIDGE_SPARK_DRIVER_MEMORY": "1g",
            # Spark binds to the host's loopback (the container shares the host's network).
            "SPARK_LOCAL_IP": "127.0.0.1",
        }
        run_detached(
            consumer_image,
            consumer,
            common | lake,
            "walbridge-consumer",
            "run",
            "--available-now",
            "--metrics-port",
            "0",
            mounts=(f"{data}:/data",),
        )
        assert wait_exit(consumer, timeout=900) == 0, logs(consumer)
        # The connector jars came from the image: the manifest its build wrote
        # (spark_consumer/jar_manifest.py) named them, so Ivy did not even run, and nothing
        # was fetched.
        output = podman("logs", consumer)
        assert "downloading" not in output.stdout + output.stderr, logs(consumer)
        assert "resolution report" not in output.stdout + output.stderr, logs(consumer)

        run_detached(
            consumer_image,
            verifier,
            {"WALBRIDGE_PG_DSN": pg_dsn, "WALBRIDGE_PUBLICATION": source.publication} | lake,
            "walbridge-consumer",
            "verify",
            mounts=(f"{data}:/data",),
        )
        assert wait_exit(verifier, timeout=900) == 0, (
            logs(verifier) + "\nconsumer:\n" + logs(consumer)
        )

        # An independent reader on the host sees the same rows as PostgreSQL.
        # Through delta-rs's query engine: its plain pyarrow reader refuses the deletion vectors
        # that the consumer's MERGEs write.
        result = (
            QueryBuilder()
            .register("t", DeltaTable(str(data / "lake" / "public" / table)))
            .execute("SELECT id, amount, note FROM t")
            .read_all()
        )
        rows = pa.table(result).to_pylist()
        live = sorted((r["id"], str(r["amount"]), r["note"]) for r in rows if not r.get("_deleted"))
        expected = [
            (i, str(a), n)
            for i, a, n in query(pg_dsn, f"SELECT id, amount, note FROM {table} ORDER BY id")
        ]
        assert live == expected
    finally:
        for name in (producer, consumer, verifier):
            podman("rm", "--force", "--time", "30", name)
