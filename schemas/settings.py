"""Every WALBRIDGE_* environment variable, by the tool that owns it: the one list.

One shell can carry all of them (`eval "$(deploy/local/stack env)"`, then the producer and the
consumer), so each tool accepts every name here and refuses any other WALBRIDGE_* name as a
typo. Each tool declares how it parses its own settings; tests check that those declarations
and this list agree (tests/unit/test_settings_list.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from schemas.client_config import SECRET_FILES

PRODUCER: Final = frozenset({
    "WALBRIDGE_PG_DSN", "WALBRIDGE_KAFKA_BOOTSTRAP", "WALBRIDGE_SCHEMA_REGISTRY_URL",
    "WALBRIDGE_PUBLICATION", "WALBRIDGE_SLOT", "WALBRIDGE_TABLES",
    "WALBRIDGE_PUBLISH_VIA_PARTITION_ROOT", "WALBRIDGE_PUBLISH_GENERATED_COLUMNS",
    "WALBRIDGE_TOPIC_PREFIX", "WALBRIDGE_METRICS_PORT",
    "WALBRIDGE_METRICS_HOST", "WALBRIDGE_CREATE_TOPICS", "WALBRIDGE_TOPIC_PARTITIONS",
    "WALBRIDGE_TOPIC_REPLICATION_FACTOR", "WALBRIDGE_TOPIC_RETENTION_MS",
    "WALBRIDGE_COMPRESSION", "WALBRIDGE_LINGER_MS", "WALBRIDGE_QUEUE_MAX_MESSAGES",
    "WALBRIDGE_MESSAGE_TIMEOUT_MS", "WALBRIDGE_KAFKA_CONFIG", "WALBRIDGE_REGISTRY_MAX_ATTEMPTS",
    "WALBRIDGE_MESSAGES", "WALBRIDGE_HEARTBEAT_INTERVAL_S", "WALBRIDGE_IDLE_AFTER_S",
    "WALBRIDGE_STATUS_INTERVAL_S", "WALBRIDGE_LAG_INTERVAL_S", "WALBRIDGE_SHUTDOWN_GRACE_S",
    "WALBRIDGE_LOG_LEVEL", "WALBRIDGE_SNAPSHOT", "WALBRIDGE_SNAPSHOT_CHUNK_ROWS",
    "WALBRIDGE_SNAPSHOT_CHUNK_BYTES", "WALBRIDGE_SNAPSHOT_CHUNK_BUDGET_MS", "WALBRIDGE_SNAPSHOT_WORKERS",
    "WALBRIDGE_TIMESTAMPTZ_FORMAT",
    "WALBRIDGE_SCHEMA_REGISTRY_CONFIG", "WALBRIDGE_EXACTLY_ONCE", "WALBRIDGE_TRANSACTIONAL_ID",
    "WALBRIDGE_KAFKA_TRANSACTION_MAX_MS", "WALBRIDGE_KAFKA_TRANSACTION_MAX_EVENTS",
    "WALBRIDGE_KAFKA_TRANSACTION_MAX_BYTES", "WALBRIDGE_KAFKA_TRANSACTION_TIMEOUT_MS",
    "WALBRIDGE_FAULT_EXIT_AFTER_KAFKA_COMMITS",
    # the slot's safety (issue 39)
    "WALBRIDGE_ON_SLOT_LOSS", "WALBRIDGE_FAILOVER_SLOT", "WALBRIDGE_ORIGIN",
    "WALBRIDGE_RECONNECT_TIMEOUT_S",
    # network timeouts (issue 41)
    "WALBRIDGE_REPLICATION_RECEIVE_TIMEOUT_S", "WALBRIDGE_KAFKA_SOCKET_TIMEOUT_MS",
    "WALBRIDGE_SCHEMA_REGISTRY_TIMEOUT_S",
})  # fmt: skip

CONSUMER: Final = frozenset({
    "WALBRIDGE_KAFKA_BOOTSTRAP", "WALBRIDGE_SCHEMA_REGISTRY_URL", "WALBRIDGE_TOPIC_PREFIX",
    "WALBRIDGE_LAKE_PATH", "WALBRIDGE_CHECKPOINT_PATH", "WALBRIDGE_TRIGGER",
    "WALBRIDGE_AVAILABLE_NOW", "WALBRIDGE_QUARANTINE_PATH", "WALBRIDGE_MAX_PENDING_AGE_S",
    "WALBRIDGE_MAX_PENDING_RECORDS", "WALBRIDGE_MAX_OFFSETS_PER_TRIGGER", "WALBRIDGE_DECODER",
    "WALBRIDGE_MERGE_THREADS", "WALBRIDGE_CONSUMER_METRICS_PORT",
    "WALBRIDGE_KAFKA_CONFIG", "WALBRIDGE_SCHEMA_REGISTRY_CONFIG",
    "WALBRIDGE_LAKE_DELETION_VECTORS",
    "WALBRIDGE_LAKE_REWRITE_BELOW_BYTES",
    "WALBRIDGE_LAKE_TABLES_CONFIG",
    # lake maintenance (issue 40): run, maintain, status
    "WALBRIDGE_LAKE_MAINTENANCE_BUDGET", "WALBRIDGE_LAKE_COMPACTION", "WALBRIDGE_LAKE_VACUUM",
    "WALBRIDGE_LAKE_TARGET_FILE_BYTES", "WALBRIDGE_LAKE_SMALL_FILES_MAX",
    "WALBRIDGE_LAKE_CONSISTENT_READ_RETENTION", "WALBRIDGE_PURGE_DELETION_VECTORS",
    # verify
    "WALBRIDGE_PG_DSN", "WALBRIDGE_PUBLICATION", "WALBRIDGE_TABLES",
    # the Spark session and logging, for run and verify
    "WALBRIDGE_SPARK_MASTER", "WALBRIDGE_SPARK_DRIVER_MEMORY",
    "WALBRIDGE_SPARK_DRIVER_JAVA_OPTIONS", "WALBRIDGE_SPARK_CONNECTOR_VERSION",
    "WALBRIDGE_SPARK_CLASS_ARCHIVE",
    "WALBRIDGE_SPARK_IVY_DIR", "WALBRIDGE_LOG_LEVEL", "WALBRIDGE_HOME",
    "WALBRIDGE_OBJECT_STORE_TIMEOUT_S",
})  # fmt: skip

LOCAL_STACK: Final = frozenset({
    "WALBRIDGE_HOME", "WALBRIDGE_DOWNLOADS", "WALBRIDGE_PG_PORT", "WALBRIDGE_KAFKA_PORT",
    "WALBRIDGE_KAFKA_CONTROLLER_PORT", "WALBRIDGE_REGISTRY_PORT", "WALBRIDGE_KAFKA_HEAP",
    "WALBRIDGE_REGISTRY_HEAP", "WALBRIDGE_STACK_TIMEOUT", "WALBRIDGE_MAVEN_ARGS",
    "WALBRIDGE_JAVA", "WALBRIDGE_PYTHON",
    # `stack up spark s3`; `stack env` prints the bucket for the tools that write to it
    "WALBRIDGE_SPARK_PORT", "WALBRIDGE_SPARK_WORKER_MEMORY", "WALBRIDGE_S3_PORT",
    "WALBRIDGE_S3_BUCKET",
    # `WALBRIDGE_KAFKA_BROKERS=3 stack up`: a three-broker KRaft cluster
    "WALBRIDGE_KAFKA_BROKERS",
    # a fault-injecting proxy in front of the one broker (tests/support/toxiproxy_stack.py)
    "WALBRIDGE_KAFKA_ADVERTISED_PORT",
    # two proxied listeners per broker for the torture run's network faults (toxiproxy_stack.py)
    "WALBRIDGE_KAFKA_PROXIED_PORT",
    # deploy/local/debezium-server (the side-by-side benchmark): a Java 21+ binary
    "WALBRIDGE_DEBEZIUM_JAVA",
    # `WALBRIDGE_STACK_SECURE=1 stack up`: TLS, SASL, ACLs (on topics, ids and groups with the
    # ACL prefix) and the registry's TLS front on WALBRIDGE_REGISTRY_PORT, Apicurio behind it
    "WALBRIDGE_STACK_SECURE", "WALBRIDGE_STACK_ACL_PREFIX", "WALBRIDGE_REGISTRY_INTERNAL_PORT",
    # `WALBRIDGE_PG_VERSION=15|16|17|18 WALBRIDGE_PG_STANDBY=1 stack up`: the major, a standby;
    # `stack env` prints the standby's DSN and the directory of the PostgreSQL client tools
    "WALBRIDGE_PG_VERSION", "WALBRIDGE_PG_STANDBY", "WALBRIDGE_PG_STANDBY_PORT",
    "WALBRIDGE_PG_STANDBY_DSN", "WALBRIDGE_PG_TOOLS",
    # the test suite: the port range its scratch stacks take (tests/support/scratch_stack.py),
    # so that several suites can run side by side
    "WALBRIDGE_HELPER_PORT_BASE",
})  # fmt: skip

# Diagnostics, read where they act rather than declared by a tool: WALBRIDGE_PURE_PYTHON=1 turns
# off the compiled row encoder (schemas.native_encoder), for A/B benchmarks and debugging.
DIAGNOSTIC: Final = frozenset({"WALBRIDGE_PURE_PYTHON"})

# WALBRIDGE_<NAME>_FILE: a secret setting read from a file, for the producer and the consumer.
ALL: Final = PRODUCER | CONSUMER | LOCAL_STACK | DIAGNOSTIC | SECRET_FILES
PREFIX: Final = "WALBRIDGE_"


def unknown(names: Iterable[str]) -> list[str]:
    """The WALBRIDGE_* names among `names` (e.g. an environment's keys) that no tool owns."""
    return sorted(n for n in names if n.startswith(PREFIX) and n not in ALL)
