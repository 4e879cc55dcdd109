"""The whole pipeline on the secure stack, once per suite run: the producer and the consumer CLI
(`python -m spark_consumer run`, Spark's Kafka source over SASL_SSL, its registry client over
TLS with basic auth) each as their own principal, every secret read from a file; the lake ends
equal to PostgreSQL (verify over `sslmode=verify-full`), and no password appears in any log, the
producer's metrics, or the progress table.

The other e2e tests marked `secure_stack` run on the secure stack with
`deploy/local/test tests/e2e --secure-stack` (docs/local-stack.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.e2e.harness import pipeline
from tests.support import security
from tests.support.producer_harness import sql
from tests.support.secure_stack import SecureStack
from tests.support.spark import spark  # noqa: F401

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def secure(shared_secure_stack: SecureStack) -> Iterator[SecureStack]:
    with security.activated(shared_secure_stack.credentials()):
        yield shared_secure_stack


def test_pipeline_with_tls_sasl_acls_and_secret_files(
    spark: SparkSession, secure: SecureStack, tmp_path: Path
) -> None:
    dsn = secure.admin_dsn
    s = f"e2e_sec_{uuid.uuid4().hex[:8]}"
    items = f"{s}.items"
    sql(
        dsn,
        f"CREATE SCHEMA {s}",
        f"CREATE TABLE {items} (id int PRIMARY KEY, v int NOT NULL, note text)",
    )
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir(mode=0o700)

    def as_files(env: dict[str, str]) -> dict[str, str]:
        """Each secret setting as WALBRIDGE_<NAME>_FILE, as Kubernetes mounts them."""
        out = {}
        for name, value in env.items():
            path = secrets_dir / name.lower()
            path.write_text(value + "\n")
            out[f"{name}_FILE"] = str(path)
        return out

    try:
        with pipeline(
            spark, dsn, secure.bootstrap, secure.registry_url, tmp_path, [items], "e2esec"
        ) as p:
            producer_secrets = {"WALBRIDGE_PG_DSN": dsn, **security.producer_env()}
            for name in producer_secrets:
                p.producer.env.pop(name)
            p.producer.env |= as_files(producer_secrets)
            p.start_producer()
            p.sql(
                f"INSERT INTO {items} SELECT g, g, 'n' || g FROM generate_series(1, 500) g",
                f"UPDATE {items} SET v = v + 1 WHERE id % 3 = 0",
                f"DELETE FROM {items} WHERE id % 7 = 0",
            )
            p.wait_published()
            status, metrics = p.producer.http("/metrics")
            assert status == 200

            consumer_secrets = security.consumer_env()
            env = {name: "" for name in consumer_secrets} | as_files(consumer_secrets)
            job = p.consumer_process("--available-now", log_name="consumer", **env)
            assert job.wait(600) == 0, p.log("consumer")
            p.assert_equal()
            progress = p.progress()
            assert progress and progress[-1]["table_versions"]

            p.sql(f"UPDATE {items} SET note = 'again' WHERE id < 50")
            p.wait_published()
            again = p.consumer_process("--available-now", log_name="consumer2", **env)
            assert again.wait(600) == 0, p.log("consumer2")
            p.assert_equal()

            outputs = {
                "producer log": p.producer.log_path.read_text(errors="replace"),
                "producer metrics": metrics,
                "consumer log": p.log("consumer") + p.log("consumer2"),
                "progress table": repr(p.progress()),
                **{
                    f"service log {f.name}": f.read_text(errors="replace")
                    for f in (secure.state / "logs").iterdir()
                },
            }
            assert security.leaks(outputs) == []
    finally:
        sql(dsn, f"DROP SCHEMA {s} CASCADE")
