"""The producer on the secure stack (`WALBRIDGE_STACK_SECURE=1`): PostgreSQL over TLS only with
`sslmode=verify-full` as a least-privilege role, Kafka over SASL_SSL/SCRAM-SHA-512 with ACLs,
the registry behind TLS and basic auth; secrets from files. Every refusal (wrong password,
plaintext to a TLS listener, an untrusted certificate, the consumer's principal writing) stops
the producer with an error naming what was refused, confirms nothing, and loses nothing: the
next good run delivers every change. No password appears in any output.
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.support.producer_harness import (
    ProducerProcess,
    Source,
    TopicReader,
    create_counter_table,
    insert_batches,
    query,
    sql,
    unique,
    update_batches,
    verify_counter_table,
)
from tests.support.secure_stack import SecureStack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def secure(shared_secure_stack: SecureStack) -> SecureStack:
    return shared_secure_stack


def other_ca(directory: Path) -> Path:
    """A CA that signed nothing of the stack's: trusting only it must fail verification."""
    key, pem = directory / "other-ca.key", directory / "other-ca.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=some other CA", "-keyout", str(key), "-out", str(pem)],
        check=True, capture_output=True,
    )  # fmt: skip
    return pem


def pairs(config: dict[str, str], **changes: str) -> str:
    return ",".join(f"{k}={v}" for k, v in (config | changes).items())


def stop_line(log: str) -> str:
    lines = [line for line in log.splitlines() if "producer stopped on a failure" in line]
    assert lines, f"no failure line in:\n{log[-3000:]}"
    return lines[-1]


def test_least_privilege_producer_refusals_and_no_secret_in_output(
    secure: SecureStack, tmp_path: Path
) -> None:
    admin = secure.admin_dsn
    # The topic prefix starts with the stack's ACL prefix ("walbridge"): the principals'
    # grants cover those topics, transactional ids and groups only.
    table = unique("sec")
    create_counter_table(admin, table)
    insert_batches(admin, table, 1, 1, 50)  # read by the initial snapshot
    source = Source.create(admin, [table], "walbridge_sec")
    topic = f"{source.prefix}.public.{table}"

    # The least-privilege role of docs/producer.md: REPLICATION and SELECT on the published table;
    # an administrator created the publication (Source.create, as the admin role).
    role, role_password = unique("walbridge_cdc"), secrets.token_hex(16)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            pgsql.SQL("CREATE ROLE {} LOGIN REPLICATION PASSWORD {}").format(
                pgsql.Identifier(role), pgsql.Literal(role_password)
            )
        )
        conn.execute(
            pgsql.SQL("GRANT SELECT ON public.{} TO {}").format(
                pgsql.Identifier(table), pgsql.Identifier(role)
            )
        )
    assert query(admin, "SELECT rolsuper FROM pg_roles WHERE rolname = %s", (role,)) == [(False,)]
    assert query(admin, "SELECT tableowner FROM pg_tables WHERE tablename = %s", (table,)) != [
        (role,)
    ]
    cdc_dsn = make_conninfo(admin, user=role, password=role_password)
    assert conninfo_to_dict(cdc_dsn)["sslmode"] == "verify-full"

    files = {
        "WALBRIDGE_PG_DSN": cdc_dsn,
        "WALBRIDGE_KAFKA_CONFIG": secure.producer_env["WALBRIDGE_KAFKA_CONFIG"],
        "WALBRIDGE_SCHEMA_REGISTRY_CONFIG": secure.producer_env["WALBRIDGE_SCHEMA_REGISTRY_CONFIG"],
    }
    for name, value in files.items():  # as Kubernetes mounts secrets
        (tmp_path / name).write_text(value + "\n")
        (tmp_path / name).chmod(0o600)

    outputs: list[str] = []

    def producer(**overrides: str) -> ProducerProcess:
        proc = ProducerProcess(source, secure.bootstrap, secure.registry_url, snapshot="initial")
        proc.env.pop("WALBRIDGE_PG_DSN")
        proc.env |= {f"{name}_FILE": str(tmp_path / name) for name in files}
        for name, value in overrides.items():  # a setting given directly replaces its file
            proc.env.pop(f"{name}_FILE")
            proc.env[name] = value
        proc.log_path = tmp_path / f"producer-{len(outputs)}.log"
        return proc

    reader = TopicReader(
        secure.bootstrap,
        secure.registry_url,
        secure.kafka_config("consumer"),
        secure.registry_config("consumer"),
        group="walbridge_reader",
    )

    def good_run(work: Callable[[], None], events: int) -> None:
        """Start, do `work`, wait until the topic holds `events` and all is confirmed, stop."""
        proc = producer().start()
        try:
            work()
            reader.read([topic], expect=events, timeout=180)
            source.wait_confirmed(source.current_lsn(), timeout=180)
            status, metrics = proc.http("/metrics")
            assert status == 200 and "walbridge_events_total" in metrics
            outputs.append(metrics)
            assert proc.stop() == 0, proc.log()
        finally:
            if proc.proc is not None and proc.proc.poll() is None:
                proc.kill()
            outputs.append(proc.log_path.read_text())

    try:
        # The 50 rows read by the initial snapshot (SELECT), then 200 inserts streamed.
        good_run(lambda: insert_batches(admin, table, 51, 2, 100), events=250)

        update_batches(admin, table, 1, 1, 250)  # pending while every refusal runs
        confirmed = source.confirmed_lsn()
        assert confirmed is not None
        kafka = secure.kafka_config("producer")
        registry = secure.registry_config("producer")
        untrusted = str(other_ca(tmp_path))
        wrong_dsn = make_conninfo(cdc_dsn, password="not-" + role_password)
        refusals = {
            "Kafka: wrong password": (
                {"WALBRIDGE_KAFKA_CONFIG": pairs(kafka, **{"sasl.password": "wrong"})},
                "SASL authentication error: Authentication failed",
            ),
            "Kafka: plaintext client to the TLS listener": (
                {"WALBRIDGE_KAFKA_CONFIG": pairs(kafka, **{"security.protocol": "SASL_PLAINTEXT"})},
                "security.protocol in WALBRIDGE_KAFKA_CONFIG matches the listener",
            ),
            "Kafka: untrusted certificate": (
                {"WALBRIDGE_KAFKA_CONFIG": pairs(kafka, **{"ssl.ca.location": untrusted})},
                "certificate verify failed",
            ),
            "Kafka: the consumer's principal writes": (
                {"WALBRIDGE_KAFKA_CONFIG": secure.consumer_env["WALBRIDGE_KAFKA_CONFIG"]},
                # exactly-once (the default) asks for its transactional id first
                "Transactional Id authorization failed",
            ),
            "PostgreSQL: wrong password": (
                {"WALBRIDGE_PG_DSN": wrong_dsn},
                f'password authentication failed for user \\"{role}\\"',
            ),
            "PostgreSQL: plaintext client to the TLS-only server": (
                {"WALBRIDGE_PG_DSN": make_conninfo(cdc_dsn, sslmode="disable")},
                "pg_hba.conf rejects connection",
            ),
            "PostgreSQL: untrusted certificate": (
                {"WALBRIDGE_PG_DSN": make_conninfo(cdc_dsn, sslrootcert=untrusted)},
                "certificate verify failed",
            ),
            "registry: wrong password": (
                {
                    "WALBRIDGE_SCHEMA_REGISTRY_CONFIG": pairs(
                        registry, **{"basic.auth.user.info": "walbridge-producer:wrong"}
                    )
                },
                "HTTP 401",
            ),
            "registry: the consumer's user writes": (
                {
                    "WALBRIDGE_SCHEMA_REGISTRY_CONFIG": secure.consumer_env[
                        "WALBRIDGE_SCHEMA_REGISTRY_CONFIG"
                    ]
                },
                "HTTP 403",
            ),
            "registry: untrusted certificate": (
                {"WALBRIDGE_SCHEMA_REGISTRY_CONFIG": pairs(registry, **{"ssl.ca.location": untrusted})},
                "the registry's TLS certificate is not trusted",
            ),
        }  # fmt: skip
        for case, (overrides, refused) in refusals.items():
            proc = producer(**overrides).start(wait_ready=False)
            assert proc.proc is not None
            status = proc.proc.wait(180)
            log = proc.log_path.read_text()
            outputs.append(log)
            assert status == 1, f"{case}: exit {status}\n{log[-3000:]}"
            assert refused in stop_line(log), f"{case}: {stop_line(log)}"
            assert source.confirmed_lsn() == confirmed, f"{case}: the slot moved"

        good_run(lambda: None, events=500)  # the pending updates: nothing lost while refused
        records = reader.read([topic], expect=None, quiet=5)
        # The snapshot reads the table while the 200 inserts stream, so it holds 50 to 250
        # rows ("r" events; a row may come both ways); then 200 inserts and 250 updates.
        snapshot = {r.value["after"]["id"] for r in records if r.value["op"] == "r"}
        assert set(range(1, 51)) <= snapshot <= set(range(1, 251))
        verify_counter_table(records, admin, table, len(snapshot) + 450)
    finally:
        source.drop()
        sql(admin, f"DROP TABLE IF EXISTS {table}")
        sql(admin, f'DROP ROLE IF EXISTS "{role}"')

    # No secret in the producer's logs (refusals included), its metrics, or the services' logs.
    outputs += [p.read_text(errors="replace") for p in (secure.state / "logs").iterdir()]
    for password in [*secure.passwords(), role_password]:
        assert len(password) >= 16
        leaks = [i for i, text in enumerate(outputs) if password in text]
        assert not leaks, f"a password appears in output(s) {leaks}"


def test_consumer_principal_reads_but_cannot_write(secure: SecureStack) -> None:
    """The consumer's principal directly: a plain (non-idempotent) write to a topic it may
    read is refused by the topic ACL, naming the topic."""
    from confluent_kafka import KafkaError, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"{unique('walbridge_acl')}.public.t"
    admin = AdminClient(secure.kafka_config("producer") | {"bootstrap.servers": secure.bootstrap})
    admin.create_topics([NewTopic(topic, 1)])[topic].result(timeout=60)
    errors: list[KafkaError] = []
    producer = Producer(
        secure.kafka_config("consumer")
        | {"bootstrap.servers": secure.bootstrap, "enable.idempotence": False, "acks": "all"}
    )
    producer.produce(topic, b"v", on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(60) == 0
    assert errors and errors[0] is not None
    assert errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, errors[0]
    reader = TopicReader(
        secure.bootstrap,
        secure.registry_url,
        secure.kafka_config("consumer"),
        secure.registry_config("consumer"),
        group="walbridge_reader",
    )
    assert reader.read([topic], expect=None, timeout=20, quiet=3) == []  # nothing landed
