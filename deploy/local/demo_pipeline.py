"""The walbridge demo: PostgreSQL -> producer -> Kafka -> Spark consumer -> Delta Lake, then verify.

Run through `deploy/local/demo` (which brings the stack up and exports the WALBRIDGE_* variables).
Each run gets its own topic prefix, slot and lake directory, so runs never see each other's events.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from confluent_kafka.admin import AdminClient
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent.parent
SCHEMA = "demo_shop"
TABLES = ("customers", "products", "orders", "order_items")


def say(message: str) -> None:
    print(f"demo: {message}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def create_schema(conn: psycopg.Connection) -> None:
    ident = sql.Identifier(SCHEMA)
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(ident))
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
    conn.execute(f"SET search_path = {SCHEMA}")  # a constant, not user input
    conn.execute("CREATE TYPE tier AS ENUM ('bronze', 'silver', 'gold')")
    conn.execute(
        """CREATE TABLE customers (
             id bigint PRIMARY KEY, name text NOT NULL, email text, tier tier NOT NULL DEFAULT 'bronze',
             balance numeric(12,2) NOT NULL DEFAULT 0, created_at timestamptz NOT NULL DEFAULT now())"""
    )
    conn.execute(
        """CREATE TABLE products (
             sku text PRIMARY KEY, title text NOT NULL, price numeric(10,2) NOT NULL,
             tags text[], attributes jsonb, description text)"""
    )
    # Keep the long description out of line, so updates that don't touch it send "unchanged TOAST".
    conn.execute("ALTER TABLE products ALTER COLUMN description SET STORAGE EXTERNAL")
    conn.execute(
        """CREATE TABLE orders (
             id bigint PRIMARY KEY, customer_id bigint NOT NULL REFERENCES customers,
             placed_at timestamptz NOT NULL, status text NOT NULL, total numeric(12,2) NOT NULL)"""
    )
    conn.execute(
        """CREATE TABLE order_items (
             order_id bigint REFERENCES orders ON DELETE CASCADE, line_no int, sku text NOT NULL,
             qty int NOT NULL, PRIMARY KEY (order_id, line_no))"""
    )
    conn.execute("RESET search_path")


def workload(conn: psycopg.Connection) -> dict[str, int]:
    """Realistic changes: multi-table transactions, updates, deletes, a key change, TOAST, an ADD COLUMN."""
    conn.execute(f"SET search_path = {SCHEMA}")
    counts = {"transactions": 0}

    def tx() -> psycopg.Transaction:
        counts["transactions"] += 1
        return conn.transaction()

    with tx():
        conn.execute(
            """INSERT INTO customers (id, name, email, tier, balance)
               SELECT i, 'customer ' || i, 'c' || i || '@example.com',
                      (ARRAY['bronze','silver','gold'])[1 + i % 3]::tier, 100 * i
               FROM generate_series(1, 200) i"""
        )
        conn.execute(
            """INSERT INTO products (sku, title, price, tags, attributes, description)
               SELECT 'SKU-' || i, 'product ' || i, 9.99 + i, ARRAY['demo', 'batch-' || (i % 4)],
                      jsonb_build_object('weight_g', i * 10, 'fragile', i % 2 = 0),
                      -- ~8 kB of incompressible text: stored in the TOAST table
                      (SELECT string_agg(md5(i::text || ':' || g::text), '') FROM generate_series(1, 250) g)
               FROM generate_series(1, 50) i"""
        )
    # Orders: each one a transaction over three tables (order, its items, the customer's balance).
    for order_id in range(1, 301):
        customer = 1 + order_id % 200
        with tx():
            conn.execute(
                "INSERT INTO orders VALUES (%s, %s, now(), 'placed', 0)", (order_id, customer)
            )
            conn.execute(
                """INSERT INTO order_items SELECT %s, n, 'SKU-' || (1 + (%s * n) %% 50), n FROM generate_series(1, 3) n""",
                (order_id, order_id),
            )
            conn.execute(
                """UPDATE orders o SET total = (SELECT sum(p.price * i.qty) FROM order_items i
                   JOIN products p ON p.sku = i.sku WHERE i.order_id = o.id) WHERE o.id = %s""",
                (order_id,),
            )
            conn.execute(
                "UPDATE customers SET balance = balance - (SELECT total FROM orders WHERE id = %s) WHERE id = %s",
                (order_id, customer),
            )
    with tx():  # updates that leave the TOASTed description untouched
        conn.execute("UPDATE products SET price = price * 1.10 WHERE sku LIKE 'SKU-1%'")
    with tx():  # a primary-key change: the lake must delete the old key and insert the new one
        conn.execute("UPDATE products SET sku = 'SKU-1-RENAMED' WHERE sku = 'SKU-1'")
    with tx():
        conn.execute("UPDATE orders SET status = 'shipped' WHERE id % 3 = 0")
    with tx():  # cancelled orders disappear with their items
        conn.execute("DELETE FROM orders WHERE id % 10 = 0")
    # A schema change half way through: new events carry a new schema version.
    with tx():
        conn.execute("ALTER TABLE customers ADD COLUMN loyalty_points integer")
    for batch in range(5):
        with tx():
            conn.execute(
                "UPDATE customers SET loyalty_points = %s * 10 + id %% 7 WHERE id %% 5 = %s",
                (batch, batch),
            )
    with tx():
        conn.execute(
            "DELETE FROM customers WHERE id > 195 AND NOT EXISTS (SELECT 1 FROM orders WHERE customer_id = customers.id)"
        )
    conn.execute("RESET search_path")
    return counts


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(
                f"demo: the producer exited early (status {proc.returncode}); see its log"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"demo: {url} did not answer 200 within {timeout_s:.0f}s")


def wait_confirmed(
    conn: psycopg.Connection, slot: str, target_lsn: str, proc: subprocess.Popen[bytes]
) -> float:
    """Wait until the producer has confirmed everything up to target_lsn (all events acked by Kafka)."""
    start = time.monotonic()
    while True:
        if proc.poll() is not None:
            raise SystemExit(
                f"demo: the producer exited (status {proc.returncode}) before catching up"
            )
        row = conn.execute(
            "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
            (target_lsn, slot),
        ).fetchone()
        if row and row[0]:
            return time.monotonic() - start
        if time.monotonic() - start > 300:
            raise SystemExit(f"demo: slot {slot} did not reach {target_lsn} within 300s")
        time.sleep(0.5)


@contextmanager
def producer_process(env: dict[str, str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "producer", "run"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()


def topic_counts(bootstrap: str, prefix: str) -> dict[str, int]:
    """Records a read_committed reader finds per topic: read to the end, not offsets, which
    also number the markers of Kafka transactions (the producer's exactly-once mode)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = sorted(t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix + "."))
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "walbridge-demo-counter",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    counts = dict.fromkeys(topics, 0)
    try:
        metadata = consumer.list_topics(timeout=10)
        parts = [
            TopicPartition(topic, partition, OFFSET_BEGINNING)
            for topic in topics
            for partition in metadata.topics[topic].partitions
        ]
        consumer.assign(parts)
        waiting = {(tp.topic, tp.partition) for tp in parts}
        deadline = time.monotonic() + 120
        while waiting and time.monotonic() < deadline:
            for message in consumer.consume(10_000, 1.0):
                error = message.error()
                if error is None:
                    counts[message.topic() or ""] += 1
                elif error.code() == KafkaError._PARTITION_EOF:
                    waiting.discard((message.topic(), message.partition()))
    finally:
        consumer.close()
    return counts


def drop_old_demo_slots(conn: psycopg.Connection) -> None:
    # Earlier demo runs leave inactive slots behind; they would hold WAL forever.
    conn.execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
        " WHERE slot_name LIKE 'walbridge\\_demo\\_%' AND NOT active"
    )
    for (name,) in conn.execute(
        "SELECT pubname FROM pg_publication WHERE pubname LIKE 'walbridge\\_demo\\_%'"
    ).fetchall():
        conn.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(name)))


def main() -> int:
    dsn = os.environ["WALBRIDGE_PG_DSN"]
    bootstrap = os.environ["WALBRIDGE_KAFKA_BOOTSTRAP"]
    home = Path(os.environ.get("WALBRIDGE_HOME", ROOT / ".walbridge"))
    run_id = time.strftime("%Y%m%d_%H%M%S")
    prefix = f"demo_{run_id}"
    slot = f"walbridge_demo_{run_id}"
    work = home / "demo" / run_id
    lake = work / "lake"
    work.mkdir(parents=True, exist_ok=True)
    metrics_port = free_port()
    tables = ",".join(f"{SCHEMA}.{t}" for t in TABLES)
    env = {
        **os.environ,
        "WALBRIDGE_PUBLICATION": slot,
        "WALBRIDGE_SLOT": slot,
        "WALBRIDGE_TABLES": tables,
        "WALBRIDGE_TOPIC_PREFIX": prefix,
        "WALBRIDGE_METRICS_PORT": str(metrics_port),
        "WALBRIDGE_LAKE_PATH": str(lake),
        "WALBRIDGE_CHECKPOINT_PATH": str(work / "checkpoint"),
    }

    with psycopg.connect(dsn, autocommit=True) as conn:
        drop_old_demo_slots(conn)
        say(f"creating the sample schema {SCHEMA} ({', '.join(TABLES)})")
        create_schema(conn)

        producer_log = work / "producer.log"
        say(f"starting the producer (slot {slot}, topic prefix {prefix}, log {producer_log})")
        with producer_process(env, producer_log) as producer:
            wait_http(f"http://127.0.0.1:{metrics_port}/readyz", 120, producer)
            say("producer is ready; running the workload")
            started = time.monotonic()
            counts = workload(conn)
            # The insert position, not pg_current_wal_lsn(): the local cluster commits with
            # synchronous_commit off, so the write position can still be before the last
            # commits, and the demo stopped the producer with them unpublished (a run here
            # published 1 of the 200 changes after the ADD COLUMN; verify then differed).
            target = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]  # type: ignore[index]
            say(
                f"{counts['transactions']} transactions committed in {time.monotonic() - started:.1f}s; waiting for Kafka to acknowledge up to {target}"
            )
            waited = wait_confirmed(conn, slot, str(target), producer)
            say(
                f"every change is in Kafka ({waited:.1f}s after the last commit); metrics: http://127.0.0.1:{metrics_port}/metrics"
            )
            with urllib.request.urlopen(
                f"http://127.0.0.1:{metrics_port}/metrics", timeout=5
            ) as response:
                metrics = response.read().decode()
            (work / "producer-metrics.txt").write_text(metrics)

    for topic, n in topic_counts(bootstrap, prefix).items():
        say(f"  {topic:<45} {n:>6} records")

    say(f"running the Spark consumer once over what is in Kafka (lake {lake})")
    consumer_log = work / "consumer.log"
    with consumer_log.open("wb") as log:
        status = subprocess.call(
            [sys.executable, "-m", "spark_consumer", "run", "--available-now"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    if status != 0:
        print(
            (consumer_log.read_text(errors="replace").splitlines() or [""])[-40:], file=sys.stderr
        )
        raise SystemExit(f"demo: the consumer failed (status {status}); log {consumer_log}")

    say("comparing PostgreSQL with the Delta tables (spark_consumer verify)")
    verify = subprocess.run(
        [sys.executable, "-m", "spark_consumer", "verify"], env=env, text=True, capture_output=True
    )
    (work / "verify.txt").write_text(verify.stdout + verify.stderr)
    print(verify.stdout.strip())
    if verify.returncode != 0:
        print(verify.stderr[-4000:], file=sys.stderr)
        raise SystemExit(
            f"demo: verify found differences (status {verify.returncode}); see {work / 'verify.txt'}"
        )

    say("done: the lake equals the source.")
    say("where to look:")
    say(f"  Delta tables     {lake}/{SCHEMA}/<table>")
    say(
        f"  progress table   {lake}/_walbridge/progress  (commit_lsn reached, table versions, Kafka offsets per batch)"
    )
    say(f"  logs             {producer_log}, {consumer_log}")
    say(f"  producer metrics {work / 'producer-metrics.txt'}")
    say("  stop the stack   deploy/local/stack down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
