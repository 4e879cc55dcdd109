"""``python -m producer run [flags]`` / ``walbridge-producer [run] [flags]``;
``walbridge-producer snapshot schema.table ...`` asks a running producer to read tables.

Exit status:
  0  a clean stop (SIGTERM/SIGINT);
  1  the pipeline stopped on a failure (nothing past the failure was confirmed to PostgreSQL);
  2  a configuration error: a bad or conflicting setting, or one the server cannot honour
     (``--origin none`` before PostgreSQL 16, ``--failover-slot on`` before 17);
  3  the replication slot is lost (missing though Kafka shows it existed, ``wal_status`` lost,
     invalidated, or a failover to a server without it): the error names the slot, the reason
     and the WAL range that can no longer be read. With ``--on-slot-loss resnapshot`` the
     producer starts over with a new slot instead (docs/postgresql-versions.md, "Slot loss and failover").
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Sequence

import psycopg
from confluent_kafka import KafkaException

from producer.config import ProducerConfig, load_config
from producer.errors import ConfigError, ProducerError, SlotLostError
from producer.health import HealthState
from producer.logging_setup import setup_logging
from producer.metrics import Metrics
from producer.pgoutput import DecodeError
from producer.replication import ErrorKind, ReplicationError
from producer.slot_guard import EXIT_SLOT_LOST
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
    try:
        return _run(config, stop, health)
    finally:
        restore()


# With --on-slot-loss resnapshot, a slot lost while streaming is replaced in-process, unless the
# previous replacement is this recent (a slot lost again at once needs a person, not a loop).
RESTART_AFTER_LOSS_MIN_S = 300.0


def _run(config: ProducerConfig, stop: StopFlag, health: HealthState) -> int:
    metrics = Metrics()  # one registry for the process: counters survive a start-over
    last_start_over = -RESTART_AFTER_LOSS_MIN_S
    while True:
        pipeline = None
        try:
            try:
                pipeline = build_pipeline(config, stop, health, metrics)
            except ShutdownRequested:
                return 0  # stopped before streaming: nothing was produced, nothing to confirm
            with contextlib.suppress(ShutdownRequested):
                pipeline.run()
            pipeline.drain()
            return 0
        except SlotLostError as exc:
            now = time.monotonic()
            if (
                exc.while_running
                and config.on_slot_loss == "resnapshot"
                and now - last_start_over >= RESTART_AFTER_LOSS_MIN_S
            ):
                last_start_over = now
                log.error(
                    "replication slot lost while streaming; starting over with a new slot "
                    "(--on-slot-loss resnapshot)",
                    extra={"slot": config.slot, "error": str(exc)},
                )
                continue  # the next start-up finds the loss, logs it and re-snapshots
            health.stopped = str(exc)
            log.error(
                "producer stopped: replication slot lost",
                extra={"slot": config.slot, "error": str(exc), "exit_status": EXIT_SLOT_LOST},
            )
            return EXIT_SLOT_LOST
        except (ConfigError, ReplicationError) as exc:
            if isinstance(exc, ReplicationError) and exc.kind is not ErrorKind.CONFIG:
                return _failed(health, exc)
            health.stopped = str(exc)
            log.error("producer stopped: configuration error", extra={"error": str(exc)})
            return 2
        except (ProducerError, SchemaError, DecodeError, psycopg.Error, KafkaException) as exc:
            return _failed(health, exc)
        finally:
            if pipeline is not None:
                pipeline.close()


def _failed(health: HealthState, exc: Exception) -> int:
    health.stopped = str(exc)
    log.error(
        "producer stopped on a failure", extra={"error": str(exc), "kind": type(exc).__name__}
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
