"""The consumer's link to the object store under network faults (issue 41): Toxiproxy between
`python -m spark_consumer run` and the local stack's S3-compatible store (s3proxy, `stack up
s3`), with the lake and the checkpoint on `s3a://`.

A bank of accounts takes transfers (each transaction moves money between two accounts, so the
total never changes) while the consumer's link to the store gets latency with jitter, resets, a
silent half-open connection held past the consumer's stated timeout
(WALBRIDGE_OBJECT_STORE_TIMEOUT_S), and a partition. Under each fault the consumer must neither
exit nor hang: S3A retries with backoff, and once the fault ends the lake catches up with what
was written meanwhile. At the end every table version a progress row names shows whole
transactions only (the bank's total, read by delta-rs straight from the store, past the proxy),
and the last one equals PostgreSQL.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import TableNotFoundError

from tests.conftest import Stack
from tests.support.bank_transfers import bank_table, stack_cli, transfers
from tests.support.lake_reader import s3_options, table_totals
from tests.support.network_faults import fault
from tests.support.producer_harness import ProducerProcess, Source, query, sql, unique
from tests.support.scratch_stack import free_block
from tests.support.torture_services import ConsumerProcess
from tests.support.toxiproxy_client import Proxy, ToxiproxyApi

pytestmark = pytest.mark.integration

ACCOUNTS = 200
OPENING = 1_000
STORE_TIMEOUT_S = 15.0  # the consumer's WALBRIDGE_OBJECT_STORE_TIMEOUT_S here: S3A's floor
RECOVERY_S = 240.0  # a batch on a cold JVM through S3A at this machine's load, with margin


@pytest.fixture(scope="module")
def store(stack: Stack) -> Iterator[dict[str, str]]:
    """The stack's S3-compatible store (started if needed, and then stopped) and its variables."""
    running = re.search(r"^s3\s+running\b", stack_cli("status").stdout, re.MULTILINE)
    up = stack_cli("up", "s3")
    if up.returncode != 0:
        pytest.fail(f"deploy/local/stack up s3 failed:\n{up.stderr}", pytrace=False)
    env = dict(re.findall(r"^export (\w+)='([^']*)'$", stack_cli("env").stdout, re.MULTILINE))
    try:
        yield {k: v for k, v in env.items() if k.startswith("AWS_") or k == "WALBRIDGE_S3_BUCKET"}
    finally:
        if not running:
            stack_cli("down", "s3")


@pytest.fixture
def store_proxy(toxiproxy: ToxiproxyApi, store: dict[str, str]) -> Iterator[Proxy]:
    endpoint = store["AWS_ENDPOINT_URL"].removeprefix("http://").rstrip("/")
    proxy = toxiproxy.create_proxy("object-store", f"127.0.0.1:{free_block(1)}", endpoint)
    try:
        yield proxy
    finally:
        proxy.delete()


@pytest.fixture
def bank(pg_dsn: str) -> Iterator[str]:
    with bank_table(pg_dsn, "nfs3", ACCOUNTS, OPENING) as name:
        yield name


class Consumer(ConsumerProcess):
    """`python -m spark_consumer run` (started at once), its output in ``log_path``; ``env``
    points it at the store through the proxy."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        super().__init__(env, log_path)
        self.start()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def batches(self) -> int:
        return len(re.findall(r"batch \d+: applied", self.log()))

    def check_alive(self, during: str) -> None:
        code = self.proc.poll() if self.proc is not None else None
        assert self.alive(), f"the consumer exited ({code}) {during}:\n{self.log()[-6000:]}"

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float = RECOVERY_S) -> float:
        started = time.monotonic()
        while not check():
            self.check_alive(f"waiting for {what}")
            if time.monotonic() - started > timeout:
                raise AssertionError(f"{what}: not within {timeout}s\n{self.log()[-6000:]}")
            time.sleep(0.5)
        return time.monotonic() - started


def test_consumer_object_store_faults(
    store: dict[str, str],
    store_proxy: Proxy,
    pg_dsn: str,
    kafka_bootstrap: str,
    registry_url: str,
    bank: str,
    tmp_path: Path,
) -> None:
    bucket = store["WALBRIDGE_S3_BUCKET"]
    run = unique("run")
    source = Source.create(pg_dsn, [bank], "nfs3")
    producer = ProducerProcess(source, kafka_bootstrap, registry_url)
    # delta-rs reads the store directly, past the proxy, with the same standard variables.
    direct = s3_options(store)
    lake = f"s3://{bucket}/{run}/lake"

    def select(statement: str, path: str, version: int | None = None) -> list[dict[str, Any]]:
        """delta-rs's SQL (it reads deletion vectors; its plain pyarrow reader does not)."""
        t = DeltaTable(f"{lake}/{path}", storage_options=direct, version=version)
        return pa.table(QueryBuilder().register("t", t).execute(statement).read_all()).to_pylist()

    def notes() -> set[str]:
        try:
            return {str(r["note"]) for r in select("SELECT DISTINCT note FROM t", f"public/{bank}")}
        except TableNotFoundError:
            return set()

    consumer: Consumer | None = None
    try:
        producer.start()
        sql(pg_dsn, f"UPDATE {bank} SET note = 'counted'")  # the opening rows, as changes
        base = {k: v for k, v in os.environ.items() if not k.startswith(("WALBRIDGE_", "AWS_"))}
        env = (
            base
            | store
            | {
                "AWS_ENDPOINT_URL": f"http://127.0.0.1:{store_proxy.port}",  # through the proxy
                "WALBRIDGE_KAFKA_BOOTSTRAP": kafka_bootstrap,
                "WALBRIDGE_SCHEMA_REGISTRY_URL": registry_url,
                "WALBRIDGE_TOPIC_PREFIX": source.prefix,
                "WALBRIDGE_LAKE_PATH": f"s3a://{bucket}/{run}/lake",
                "WALBRIDGE_CHECKPOINT_PATH": f"s3a://{bucket}/{run}/checkpoint",
                "WALBRIDGE_SPARK_DRIVER_MEMORY": "1g",
                "WALBRIDGE_CONSUMER_METRICS_PORT": "0",
                "WALBRIDGE_TRIGGER": "1 seconds",
                "WALBRIDGE_OBJECT_STORE_TIMEOUT_S": str(STORE_TIMEOUT_S),
            }
            # The test command's Ivy cache, as in tests/e2e/test_e2e_cluster_s3.py.
            | {k: v for k, v in os.environ.items() if k == "WALBRIDGE_SPARK_IVY_DIR"}
        )
        consumer = Consumer(env, tmp_path / "consumer.log")
        # The table commits before the batch's progress row (and its log line): wait for both,
        # or the first fault's count of batches starts one short.
        consumer.wait_for(
            "the opening rows",
            lambda: consumer.batches() >= 1 and "counted" in notes(),
            RECOVERY_S * 2,
        )

        for step, (kind, held_s) in enumerate(
            (
                ("latency", 10.0),
                ("reset", 3.0),
                ("silent", STORE_TIMEOUT_S + 7.0),  # past the consumer's stated timeout
                ("partition", 5.0),
            )
        ):
            before = consumer.batches()
            with fault(store_proxy, kind):
                # Committed during the fault: the consumer must write them through it, or after.
                transfers(pg_dsn, bank, ACCOUNTS, 20, seed=step)
                deadline = time.monotonic() + held_s
                while time.monotonic() < deadline:
                    consumer.check_alive(f"during {kind}")
                    time.sleep(0.5)
            consumer.check_alive(f"after {kind}")
            last_note = f"t{step}.19"
            # The table commits before the batch's progress row: wait for both.
            waited = consumer.wait_for(
                f"the transfers after {kind}",
                lambda n=last_note, b=before: consumer.batches() > b and n in notes(),
            )
            print(f"{kind}: held {held_s:.0f}s, caught up {waited:.1f}s after it ended")

    finally:
        if consumer is not None:
            consumer.stop()
        producer.stop()
        source.drop()

    # Every table version a progress row names holds whole transactions: the bank's total.
    key = f"public.{bank}"
    versions = sorted(
        {
            named[key]
            for row in select("SELECT table_versions FROM t", "_walbridge/progress")
            # a map column: a list of (key, value) pairs in pyarrow
            if key in (named := dict(row["table_versions"] or []))
        }
    )
    assert len(versions) >= 5, versions  # the opening rows, then at least one per fault
    for version in versions:
        totals = table_totals(f"{lake}/public/{bank}", version, "balance", direct)
        assert totals == (ACCOUNTS * OPENING, ACCOUNTS), version
    # The last version equals PostgreSQL, row by row.
    in_lake = select("SELECT id, balance, note FROM t ORDER BY id", f"public/{bank}")
    in_pg = query(pg_dsn, f"SELECT id, balance, note FROM {bank} ORDER BY id")
    assert [(r["id"], r["balance"], r["note"]) for r in in_lake] == in_pg
