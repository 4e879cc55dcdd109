"""``python -m producer run [flags]`` / ``walbridge-producer [run] [flags]``;
``walbridge-producer snapshot schema.table ...`` asks a running producer to read tables.

Exit status: 0 after a clean stop (SIGTERM/SIGINT), 2 for a configuration error, 1 when the
pipeline stopped on a failure (nothing past the failure was confirmed to PostgreSQL).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Sequence

import psycopg
from confluent_kafka import KafkaException

from producer.config import load_config
from producer.errors import ConfigError, ProducerError
from producer.health import HealthState
from producer.logging_setup import setup_logging
from producer.metrics import Metrics
from producer.pgoutput import DecodeError
from producer.replication import ReplicationError
from producer.stopping import ShutdownRequested, StopFlag, install_signal_handlers
from producer.wiring import build_pipeline
from schemas.errors import SchemaError

log = logging.getLogger("producer")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "snapshot":
        from producer.snapshot.signal import main as request_snapshot

        return request_snapshot(args[1:])
    if args and args[0] == "run":
        args = args[1:]
    try:
        config = load_config(args, os.environ)
    except ConfigError as exc:
        print(f"walbridge-producer: configuration error: {exc}", file=sys.stderr)
        return 2
    setup_logging(config.log_level)
    stop = StopFlag()
    health = HealthState(stall_after_s=max(120.0, 4 * config.status_interval_s))
    restore = install_signal_handlers(stop)
    pipeline = None
    try:
        try:
            pipeline = build_pipeline(config, stop, health, Metrics())
        except ShutdownRequested:
            return 0  # stopped before streaming: nothing was produced, nothing to confirm
        with contextlib.suppress(ShutdownRequested):
            pipeline.run()
        pipeline.drain()
        return 0
    except (
        ProducerError,
        ReplicationError,
        SchemaError,
        DecodeError,
        psycopg.Error,
        KafkaException,
    ) as exc:
        health.stopped = str(exc)
        log.error(
            "producer stopped on a failure", extra={"error": str(exc), "kind": type(exc).__name__}
        )
        return 1
    finally:
        try:
            if pipeline is not None:
                pipeline.close()
        finally:
            restore()


if __name__ == "__main__":
    sys.exit(main())
