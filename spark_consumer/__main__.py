"""`python -m spark_consumer run|verify|maintain|status|warm-up` (console script `walbridge-consumer`).

Exit status, as the producer's: 0 after `run --available-now` or a clean stop and after an
equal `verify`, 2 for a configuration error (nothing started), 1 when the consumer stopped on a
failure or `verify` found a difference.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from spark_consumer.config import (
    ConsumerConfig,
    MaintainConfig,
    SparkSettings,
    VerifyConfig,
    parse_maintain,
    parse_run,
    parse_verify,
)
from spark_consumer.errors import ConfigError, ConsumerError
from spark_consumer.metrics import ConsumerMetrics

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger("walbridge.consumer")

USAGE = (
    "usage: walbridge-consumer {run,verify,maintain,status,warm-up} [options]  "
    "(--help after the command for options)"
)
COMMANDS = ("run", "verify", "maintain", "status", "warm-up")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        print(USAGE, file=sys.stderr)
        return 2
    env = os.environ  # read here only; everything below gets its settings
    if args[0] == "warm-up":
        return _warm_up(args[1:], env)
    # Every setting is read and checked before Spark starts.
    try:
        spark_settings = SparkSettings.from_env(env)
        config: ConsumerConfig | VerifyConfig | MaintainConfig
        if args[0] == "run":
            config = parse_run(args[1:], env)
        elif args[0] == "verify":
            config = parse_verify(args[1:], env)
        else:
            config = parse_maintain(args[1:], env, args[0])
    except ConfigError as exc:
        print(f"walbridge-consumer: {exc}", file=sys.stderr)  # "config: ..."
        return 2
    logging.basicConfig(
        level=spark_settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        if isinstance(config, ConsumerConfig):
            return _run(config, env)
        if isinstance(config, MaintainConfig):
            return _maintain(config, env, status_only=args[0] == "status")
        return _verify(config, env)
    except ConsumerError as exc:
        print(f"walbridge-consumer: {exc}", file=sys.stderr)
        return 1


def _warm_up(args: Sequence[str], env: Mapping[str, str]) -> int:
    """Write the driver JVM's class-data archive (spark_consumer/warm_up.py), so that the next
    cold starts map their classes. `--lake-path URL` (or WALBRIDGE_LAKE_PATH): an s3a:// lake
    brings the S3 connector's jars, which the archive's key includes."""
    if args and args[0] in ("-h", "--help"):
        print(_warm_up.__doc__)
        return 0
    lake = env.get("WALBRIDGE_LAKE_PATH", "")
    if len(args) == 2 and args[0] == "--lake-path":
        lake = args[1]
    elif args:
        print("usage: walbridge-consumer warm-up [--lake-path URL]", file=sys.stderr)
        return 2
    try:
        spark_settings = SparkSettings.from_env(env)
    except ConfigError as exc:
        print(f"walbridge-consumer: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=spark_settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from spark_consumer.warm_up import warm_up

    try:
        print(warm_up(env, lake_paths=(lake,) if lake else ()))
    except ConsumerError as exc:
        print(f"walbridge-consumer: {exc}", file=sys.stderr)
        return 1
    return 0


def _run(config: ConsumerConfig, env: Mapping[str, str]) -> int:
    from spark_consumer.batch import BatchProcessor
    from spark_consumer.session import build_session
    from spark_consumer.source import start
    from spark_consumer.writer_schemas import WriterSchemas

    metrics = ConsumerMetrics()
    if config.metrics_port:
        metrics.serve("0.0.0.0", config.metrics_port)
    spark = build_session(
        "walbridge-consumer", env=env, lake_paths=(config.lake_path, config.checkpoint_path)
    )
    processor = BatchProcessor(
        spark,
        config,
        WriterSchemas.from_url(config.schema_registry_url, config.registry_config),
        metrics=metrics,
    )
    from pyspark.errors import StreamingQueryException

    query = start(spark, config, processor)
    try:
        _watch(query, metrics)
    except StreamingQueryException as exc:
        # The batch's ConsumerError arrives wrapped; its message names topic/partition/offset
        # or the transaction.
        print(f"walbridge-consumer: stopped: {exc.getMessage()}", file=sys.stderr)
        return 1
    finally:
        processor.close()
    return 0


def _watch(query: StreamingQuery, metrics: ConsumerMetrics, every_s: int = 5) -> None:
    """Wait for the query to end; meanwhile turn Spark's progress into the Kafka lag and the
    catch-up ETA, logged once per new batch while the job is behind."""
    seen = None
    while not query.awaitTermination(every_s):
        progress = query.lastProgress
        if not progress or progress.get("batchId") == seen:
            continue
        seen = progress.get("batchId")
        state = metrics.observe_progress(progress)
        if state is not None and state.behind:
            log.info(
                "catching up: %d Kafka record(s) behind, %s records/s, ETA %s",
                state.behind,
                f"{state.records_per_s:.0f}" if state.records_per_s else "-",
                f"{state.eta_s:.0f}s" if state.eta_s is not None else "unknown",
            )


def _verify(config: VerifyConfig, env: Mapping[str, str]) -> int:
    from spark_consumer import verify
    from spark_consumer.session import build_session

    spark = build_session("walbridge-verify", env=env, lake_paths=(config.lake_path,))
    diffs = verify.run(config, spark)
    print(verify.report(diffs))
    return 0 if all(d.equal for d in diffs) else 1


def _maintain(config: MaintainConfig, env: Mapping[str, str], status_only: bool) -> int:
    from spark_consumer import maintenance_command
    from spark_consumer.session import build_session

    name = "walbridge-status" if status_only else "walbridge-maintain"
    spark = build_session(name, env=env, lake_paths=(config.lake_path,))
    if not status_only:
        for line in maintenance_command.maintain(spark, config):
            print(line)
    print(maintenance_command.report(*maintenance_command.status(spark, config)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
