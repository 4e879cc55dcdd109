"""The consumer on a real distributed engine with the lake on object storage: the local stack's
Spark standalone cluster (a master and two one-core workers, `deploy/local/stack up spark`) and
its S3-compatible store (s3proxy, `deploy/local/stack up s3`), configured from the variables
`stack env` prints and nothing else. A bank of accounts takes transfers (each transaction moves
money between two accounts, so the total never changes); the consumer applies them in capped
batches with `s3a://` lake and checkpoint paths, a worker (and the executor on it) is stopped
while batches remain, the job finishes on the other worker, `verify` finds the lake equal to
PostgreSQL, and delta-rs reads the same total straight from the store.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from tests.conftest import Stack
from tests.support.bank_transfers import bank_table, stack_cli, transfers
from tests.support.lake_reader import s3_options
from tests.support.producer_harness import ProducerProcess, Source, query, sql, unique

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ACCOUNTS = 500
OPENING = 1_000
TRANSFERS = 1_200
CLUSTER = ("spark-master", "spark-worker-1", "spark-worker-2", "s3")


@pytest.fixture(scope="module")
def cluster(stack: Stack) -> Iterator[dict[str, str]]:
    """The cluster and the store, started if needed (and then stopped), with their variables.
    The test stops a worker: one that ran before the module is started again afterwards, one the
    module started is only stopped (starting it again just to stop it cost a JVM start)."""
    running = set(re.findall(r"^([\w-]+)\s+running\b", stack_cli("status").stdout, re.MULTILINE))
    up = stack_cli("up", "spark", "s3")
    if up.returncode != 0:
        pytest.fail(f"deploy/local/stack up spark s3 failed:\n{up.stderr}", pytrace=False)
    env = dict(re.findall(r"^export (\w+)='([^']*)'$", stack_cli("env").stdout, re.MULTILINE))
    try:
        wanted = ("WALBRIDGE_SPARK_MASTER", "WALBRIDGE_S3_BUCKET")
        yield {k: v for k, v in env.items() if k.startswith("AWS_") or k in wanted}
    finally:
        started = [s for s in CLUSTER if s not in running]
        if started:
            stack_cli("down", *started)
        if "spark-worker-2" in running:
            stack_cli("up", "spark-worker-2")


@pytest.fixture
def bank(pg_dsn: str) -> Iterator[str]:
    with bank_table(pg_dsn, "s3bank", ACCOUNTS, OPENING) as name:
        yield name


def test_consumer_on_the_cluster_with_the_lake_on_s3_survives_a_lost_worker(
    cluster: dict[str, str],
    pg_dsn: str,
    kafka_bootstrap: str,
    registry_url: str,
    bank: str,
    tmp_path: Path,
) -> None:
    bucket = cluster["WALBRIDGE_S3_BUCKET"]
    run = unique("run")
    lake = f"s3a://{bucket}/{run}/lake"
    source = Source.create(pg_dsn, [bank], "s3bank")
    producer = ProducerProcess(source, kafka_bootstrap, registry_url, topic_partitions=3)
    try:
        producer.start()
        # The opening balances were committed before the slot: snapshot them as changes.
        sql(pg_dsn, f"UPDATE {bank} SET note = 'counted'")
        transfers(pg_dsn, bank, ACCOUNTS, TRANSFERS, seed=3)
        source.wait_confirmed(source.current_lsn(), timeout=300)
        assert producer.stop() == 0, producer.log()

        base = {k: v for k, v in os.environ.items() if not k.startswith(("WALBRIDGE_", "AWS_"))}
        env = (
            base
            | cluster
            | {
                "WALBRIDGE_KAFKA_BOOTSTRAP": kafka_bootstrap,
                "WALBRIDGE_SCHEMA_REGISTRY_URL": registry_url,
                "WALBRIDGE_TOPIC_PREFIX": source.prefix,
                "WALBRIDGE_LAKE_PATH": lake,
                "WALBRIDGE_CHECKPOINT_PATH": f"s3a://{bucket}/{run}/checkpoint",
                "WALBRIDGE_SPARK_DRIVER_MEMORY": "1g",
                # The workers listen on loopback; the driver must be reachable there too.
                "SPARK_LOCAL_IP": "127.0.0.1",
                # Many batches, so that some remain when the worker goes.
                "WALBRIDGE_MAX_OFFSETS_PER_TRIGGER": "1000",
            }
            # The test command's Ivy cache (deploy/local/lib/python-env.sh), as in
            # tests/e2e/harness.py: without it a fresh clone's consumer resolved and downloaded
            # the connector jars (617 MB with the S3A ones) into its own .walbridge/ivy2.
            | {k: v for k, v in os.environ.items() if k == "WALBRIDGE_SPARK_IVY_DIR"}
        )
        log_path = tmp_path / "consumer.log"
        with log_path.open("wb") as log:
            consumer = subprocess.Popen(
                [sys.executable, "-m", "spark_consumer", "run", "--available-now",
                 "--metrics-port", "0"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
            try:
                deadline = time.monotonic() + 900
                while "batch 1: applied" not in log_path.read_text(errors="replace"):
                    assert consumer.poll() is None, log_path.read_text(errors="replace")[-6000:]
                    assert time.monotonic() < deadline, log_path.read_text(errors="replace")[-6000:]
                    time.sleep(0.5)
                # Stopping the worker kills its executor: the tasks on it are lost mid-batch.
                lost = stack_cli("down", "spark-worker-2")
                assert lost.returncode == 0, lost.stderr
                assert consumer.poll() is None, "the consumer finished before the worker was lost"
                code = consumer.wait(timeout=1200)
            finally:
                if consumer.poll() is None:
                    consumer.kill()
                    consumer.wait(30)
        output = log_path.read_text(errors="replace")
        assert code == 0, output[-6000:]
        batches = [int(b) for b in re.findall(r"batch (\d+): applied", output)]
        assert max(batches) >= 3, output[-6000:]  # batches ran after the loss
        assert re.search(r"[Ll]ost executor|Executor .* (removed|lost)|worker lost", output), (
            output[-6000:]
        )

        verified = subprocess.run(
            [sys.executable, "-m", "spark_consumer", "verify"],
            cwd=ROOT,
            env=env | {"WALBRIDGE_PG_DSN": pg_dsn, "WALBRIDGE_PUBLICATION": source.publication},
            text=True,
            capture_output=True,
            timeout=900,
        )
        assert verified.returncode == 0, verified.stdout[-4000:] + verified.stderr[-4000:]

        # delta-rs reads the store with the same standard variables (its own S3 client).
        options = s3_options(cluster)
        table = DeltaTable(f"s3://{bucket}/{run}/lake/public/{bank}", storage_options=options)
        result = (
            QueryBuilder()
            .register("t", table)
            .execute("SELECT count(*) AS n, sum(balance) AS total FROM t")
            .read_all()
        )
        (row,) = pa.table(result).to_pylist()
        assert row == {"n": ACCOUNTS, "total": ACCOUNTS * OPENING}
        pg_total = query(pg_dsn, f"SELECT sum(balance) FROM {bank}")[0][0]
        assert pg_total == ACCOUNTS * OPENING
    finally:
        if producer.proc is not None and producer.proc.poll() is None:
            producer.stop()
        source.drop()
